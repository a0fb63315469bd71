//! What a leader-only writer's own watch has listed (the root ConfigMaps' Namespaces and
//! ConfigMaps, the IP auto-allocator's ServiceEntries and Namespaces): each object reduced to
//! what the writer reads, by key. A re-list is buffered and replaces them whole.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use crate::kube::cluster::BackoffHandle;
use crate::kube::not_served;

use crate::discovery::model::Labels;

#[derive(Debug)]
pub(crate) struct Listed<V> {
    /// key -> reduced object
    pub current: BTreeMap<String, V>,
    relisting: Option<BTreeMap<String, V>>,
    /// The first list is complete.
    pub listed: bool,
    /// What is wrong with the watch now, so that the log follows transitions, not retries.
    trouble: Option<Trouble>,
    /// The watcher's backoff, told when the watch makes progress.
    progress: Option<BackoffHandle>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trouble {
    /// The API server answers 404: the kind's CRD is not installed.
    NotServed,
    /// Any other error; the watcher retries with backoff.
    Failing,
}

impl<V> Default for Listed<V> {
    fn default() -> Self {
        Listed {
            current: BTreeMap::new(),
            relisting: None,
            listed: false,
            trouble: None,
            progress: None,
        }
    }
}

impl<V> Listed<V> {
    /// Follows a watcher whose backoff is `progress`'s [`Recorded`](crate::kube::cluster::Recorded).
    pub fn with_backoff(progress: BackoffHandle) -> Self {
        Listed {
            progress: Some(progress),
            ..Listed::default()
        }
    }

    /// Whether the kind is not served (its CRD is not installed): nothing will be listed.
    pub fn unavailable(&self) -> bool {
        self.trouble == Some(Trouble::NotServed)
    }

    /// Applies one watch event. `reduce` gives an object's key and what is kept of it (`None`:
    /// nothing, and an earlier value under the key is dropped). Errors are logged as met while
    /// watching `what`, once when they start and once when they end.
    pub fn apply<K>(
        &mut self,
        event: Result<watcher::Event<K>, watcher::Error>,
        reduce: impl Fn(&K) -> (String, Option<V>),
        what: &str,
    ) {
        let event = match event {
            // `Init` comes before every list attempt, failing or not: only what follows it
            // shows that the watch works again.
            Ok(watcher::Event::Init) => watcher::Event::Init,
            Ok(event) => {
                match self.trouble.take() {
                    Some(Trouble::NotServed) => info!("{what}: now served (CRD installed)"),
                    Some(Trouble::Failing) => info!("watching {what} recovered"),
                    None => {}
                }
                if let Some(progress) = &self.progress {
                    progress.progressed();
                }
                event
            }
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                // Routine: the resourceVersion left the API server's history; the watcher
                // re-lists, and the re-list replaces what is held.
                debug!("watching {what}: resourceVersion expired (410 Gone); re-listing");
                return;
            }
            Err(error) => {
                let trouble = if not_served(&error) {
                    Trouble::NotServed
                } else {
                    Trouble::Failing
                };
                if self.trouble == Some(trouble) {
                    debug!(%error, "watching {what}: still failing");
                } else if trouble == Trouble::NotServed {
                    warn!("{what}: not served (CRD not installed); waiting for it");
                } else {
                    warn!(%error, "watching {what} failing; retrying with backoff");
                }
                self.trouble = Some(trouble);
                return;
            }
        };
        match event {
            watcher::Event::Init => self.relisting = Some(BTreeMap::new()),
            watcher::Event::InitApply(object) => {
                if let (Some(list), (key, Some(value))) = (&mut self.relisting, reduce(&object)) {
                    list.insert(key, value);
                }
            }
            watcher::Event::InitDone => {
                self.current = self.relisting.take().unwrap_or_default();
                self.listed = true;
            }
            watcher::Event::Apply(object) => match reduce(&object) {
                (key, Some(value)) => {
                    self.current.insert(key, value);
                }
                (key, None) => {
                    self.current.remove(&key);
                }
            },
            watcher::Event::Delete(object) => {
                self.current.remove(&reduce(&object).0);
            }
        }
    }
}

/// A Namespace as followed: its labels, and whether it is terminating.
pub(crate) fn namespace_entry(ns: &Namespace) -> (String, Option<(Labels, bool)>) {
    let name = ns.metadata.name.clone().unwrap_or_default();
    let labels = ns.metadata.labels.clone().unwrap_or_default();
    let terminating = ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    (name, Some((labels.into_iter().collect(), terminating)))
}
