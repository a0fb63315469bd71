//! What a leader-only writer's own watch has listed (the root ConfigMaps' Namespaces and
//! ConfigMaps, the IP auto-allocator's ServiceEntries and Namespaces): each object reduced to
//! what the writer reads, by key. A re-list is buffered and replaces them whole.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher;
use tracing::warn;

use crate::discovery::model::Labels;

#[derive(Debug)]
pub(crate) struct Listed<V> {
    /// key -> reduced object
    pub current: BTreeMap<String, V>,
    relisting: Option<BTreeMap<String, V>>,
    /// The first list is complete.
    pub listed: bool,
}

impl<V> Default for Listed<V> {
    fn default() -> Self {
        Listed {
            current: BTreeMap::new(),
            relisting: None,
            listed: false,
        }
    }
}

impl<V> Listed<V> {
    /// Applies one watch event. `reduce` gives an object's key and what is kept of it (`None`:
    /// nothing, and an earlier value under the key is dropped); an error is logged as met
    /// while watching `what`.
    pub fn apply<K>(
        &mut self,
        event: Result<watcher::Event<K>, watcher::Error>,
        reduce: impl Fn(&K) -> (String, Option<V>),
        what: &str,
    ) {
        match event {
            Ok(watcher::Event::Init) => self.relisting = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(object)) => {
                if let (Some(list), (key, Some(value))) = (&mut self.relisting, reduce(&object)) {
                    list.insert(key, value);
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.current = self.relisting.take().unwrap_or_default();
                self.listed = true;
            }
            Ok(watcher::Event::Apply(object)) => match reduce(&object) {
                (key, Some(value)) => {
                    self.current.insert(key, value);
                }
                (key, None) => {
                    self.current.remove(&key);
                }
            },
            Ok(watcher::Event::Delete(object)) => {
                self.current.remove(&reduce(&object).0);
            }
            Err(error) => warn!(%error, "watching {what}"),
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
