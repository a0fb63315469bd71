//! One kind's watch loop: kube-runtime's watcher, backed off, turned into index events.

use std::collections::{HashMap, HashSet};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event as WatchEvent};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::kinds::{Reduced, WatchedKind, WatchedObject, object_ref, reduce};
use super::{
    ClusterHealth, DiscoverySelectors, ErrorReason, Message, READ_GRACE, Recorded, Retry,
    Selection, classify,
};
use crate::discovery::model::{Event, Kind, Labels, Object};
use crate::kube::not_served;

/// The Namespace watcher's extra duty: track labels and publish the selected namespaces.
pub(super) struct NamespaceSelection {
    pub selectors: DiscoverySelectors,
    /// `None` when nothing filters (no discovery selectors).
    pub publish: Option<tokio_watch::Sender<Selection>>,
    pub labels: HashMap<String, Labels>,
    /// Nothing is published before the first list is complete.
    pub listed: bool,
}

impl NamespaceSelection {
    /// The Namespace list is complete: the selection can be published.
    fn list_complete(&mut self) {
        self.listed = true;
        self.publish(false);
    }

    fn observe(&mut self, event: &Event) {
        match event {
            Event::Reset(_, objects) => {
                self.labels = objects
                    .iter()
                    .filter_map(|o| match o {
                        Object::Namespace(ns) => Some((ns.name.clone(), ns.labels.clone())),
                        _ => None,
                    })
                    .collect();
            }
            Event::Apply(Object::Namespace(ns)) => {
                self.labels.insert(ns.name.clone(), ns.labels.clone());
            }
            Event::Delete(reference) => {
                self.labels.remove(&reference.name);
            }
            _ => return,
        }
        if self.listed {
            self.publish(matches!(event, Event::Delete(_)));
        }
    }

    fn publish(&self, deleted_only: bool) {
        let Some(publish) = &self.publish else { return };
        let selected: HashSet<String> = self
            .labels
            .iter()
            .filter(|(_, labels)| self.selectors.selects(labels))
            .map(|(name, _)| name.clone())
            .collect();
        publish.send_if_modified(|current| {
            let changed = current.0.as_deref() != Some(&selected);
            if !changed {
                return false;
            }
            let first = current.0.is_none();
            let added = current
                .0
                .as_ref()
                .map_or(selected.len(), |old| selected.difference(old).count());
            *current = Selection(Some(Arc::new(selected.clone())));
            // A deleted namespace takes its objects with it: no re-list for that (istiod
            // doesn't notify on deletes either).
            if deleted_only {
                return false;
            }
            if !first {
                info!(
                    selected = selected.len(),
                    added, "discovery selection changed; namespaced kinds re-list"
                );
            }
            true
        });
    }
}

pub(super) struct KindWatch {
    /// Watch responses that broke off where kube's client resumes quietly.
    pub broken: mpsc::UnboundedReceiver<super::observe::BrokenWatch>,
    pub watched: WatchedKind,
    pub client: kube::Client,
    pub out: mpsc::Sender<(Kind, Message)>,
    pub retry: Retry,
    /// Each watch's `timeoutSeconds`.
    pub watch_timeout: u32,
    pub health: Arc<ClusterHealth>,
    pub shutdown: CancellationToken,
    /// The selected namespaces, for namespaced kinds when discovery selectors are set.
    pub filter: Option<tokio_watch::Receiver<Selection>>,
    /// Set on the Namespace watcher.
    pub selector: Option<NamespaceSelection>,
    /// A list has been streamed as `Apply`s already: later lists are buffered into `Reset`s.
    pub streamed: bool,
}

/// After a retry's backoff, how long without a new error before the watch counts as
/// re-established (a resumed watch says nothing until something changes).
const SETTLED: Duration = Duration::from_secs(2);

/// Why the inner loop stopped.
enum Stop {
    Shutdown,
    Restart,
}

impl KindWatch {
    pub async fn run(mut self) {
        loop {
            let selection = match &mut self.filter {
                Some(rx) => {
                    let ready = tokio::select! {
                        _ = self.shutdown.cancelled() => return,
                        ready = rx.wait_for(|s| s.0.is_some()) => ready.map(|s| s.clone()),
                    };
                    match ready {
                        Ok(selection) => Some(selection),
                        Err(_) => return,
                    }
                }
                None => None,
            };
            match self.watch(selection).await {
                Stop::Shutdown => return,
                Stop::Restart => continue,
            }
        }
    }

    async fn send(&mut self, event: Event) -> bool {
        if let Some(selector) = &mut self.selector {
            selector.observe(&event);
        }
        self.out
            .send((self.watched.kind, Message::Event(event)))
            .await
            .is_ok()
    }

    /// Tells the coordinator the kind is fully listed.
    async fn listed(&mut self) -> bool {
        if let Some(selector) = &mut self.selector {
            selector.list_complete();
        }
        self.out
            .send((self.watched.kind, Message::Listed))
            .await
            .is_ok()
    }

    /// One watcher, from its first list until the selection changes or a 404 calls for a
    /// fresh list.
    async fn watch(&mut self, selection: Option<Selection>) -> Stop {
        let kind = self.watched.kind;
        let api: Api<WatchedObject> = Api::all_with(self.client.clone(), &self.watched.resource);
        let mut config = watcher::Config::default().timeout(self.watch_timeout);
        if let Some(fields) = self.watched.field_selector {
            config = config.fields(fields);
        }
        let (backoff, progress) = Recorded::new(self.retry);
        let stream = kube::runtime::watcher(api, config).backoff(backoff);
        let mut settled_at: Option<Instant> = None;
        let mut stream = pin!(stream);
        let mut listing: Option<Vec<Object>> = None;
        let mut streaming = false;
        let mut streamed_count = 0usize;
        let admits = |object: &Object| match &selection {
            None => true,
            Some(selection) => selection.admits(&object.object_ref().namespace),
        };
        loop {
            let shutdown = &self.shutdown;
            let filter = &mut self.filter;
            let item = tokio::select! {
                _ = shutdown.cancelled() => return Stop::Shutdown,
                changed = async {
                    match filter {
                        Some(rx) => rx.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if changed.is_err() {
                        return Stop::Shutdown;
                    }
                    return Stop::Restart;
                }
                _ = async {
                    match settled_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    settled_at = None;
                    self.recovered(false);
                    continue;
                }
                Some(broken) = self.broken.recv() => {
                    // kube resumes the watch at once: no backoff to wait out.
                    settled_at = Some(Instant::now() + self.failed(broken.reason, broken.error));
                    continue;
                }
                item = stream.next() => item,
            };
            let Some(item) = item else {
                // The watcher never ends on its own; start a fresh one if it does.
                return Stop::Restart;
            };
            let event = match item {
                Ok(event) => event,
                Err(error) => {
                    if matches!(error, watcher::Error::InitialListFailed(_)) && not_served(&error) {
                        if !self.missing(&error).await {
                            return Stop::Shutdown;
                        }
                        // Look again later with a fresh watcher (its backoff would grow to
                        // its maximum while the kind stays absent).
                        let poll = self.retry.missing_poll();
                        tokio::select! {
                            _ = self.shutdown.cancelled() => return Stop::Shutdown,
                            _ = tokio::time::sleep(poll) => return Stop::Restart,
                        }
                    }
                    if not_served(&error) {
                        // Listed, then the watch is refused: the CRD was deleted. A fresh
                        // list finds it missing (above).
                        debug!(%error, "no longer served; re-listing");
                        return Stop::Restart;
                    }
                    if matches!(&error, watcher::Error::WatchError(status) if status.code == 410) {
                        // Routine: our resourceVersion left the API server's history (after a
                        // long disconnection, or a compaction). The watcher re-lists now.
                        info!("resourceVersion expired (410 Gone); re-listing");
                        self.health.relisting(kind);
                        continue;
                    }
                    let settle = self.failed(classify(&error), error.to_string());
                    settled_at = Some(Instant::now() + progress.last_delay() + settle);
                    continue;
                }
            };
            // `Init` comes before every list attempt, failing or not: only what follows it
            // shows that the watch works again.
            if !matches!(event, WatchEvent::Init) {
                settled_at = None;
                self.recovered(true);
                progress.progressed();
            }
            match event {
                WatchEvent::Init => {
                    // The very first list goes out as it arrives; any later one (a re-list,
                    // or a first list that was interrupted) is the truth and is swapped in
                    // whole.
                    streaming = !self.streamed;
                    self.streamed = true;
                    streamed_count = 0;
                    listing = Some(Vec::new());
                }
                WatchEvent::InitApply(object) => {
                    let Some(buffer) = &mut listing else { continue };
                    match reduce(&self.watched, object) {
                        Reduced::Object(object) if admits(&object) => {
                            if streaming {
                                streamed_count += 1;
                                if !self.send(Event::Apply(object)).await {
                                    return Stop::Shutdown;
                                }
                            } else {
                                buffer.push(object);
                            }
                        }
                        Reduced::Object(_) => {}
                        Reduced::Invalid(_, error) => {
                            warn!(%error, "skipping invalid object");
                        }
                    }
                }
                WatchEvent::InitDone => {
                    let objects = listing.take().unwrap_or_default();
                    let count = if streaming {
                        streamed_count
                    } else {
                        objects.len()
                    };
                    let (first, was_missing) = {
                        let h = self.health.kind(kind);
                        (!h.synced, h.missing)
                    };
                    self.health.update(kind, |h| {
                        h.synced = true;
                        h.missing = false;
                        h.lists += 1;
                    });
                    if was_missing {
                        info!(
                            objects = count,
                            "the kind is now served (CRD installed); watching"
                        );
                    } else if first {
                        info!(objects = count, "listed");
                    } else {
                        info!(
                            objects = count,
                            "re-listed; the list replaces what was held"
                        );
                    }
                    if !streaming && !self.send(Event::Reset(kind, objects)).await {
                        return Stop::Shutdown;
                    }
                    streaming = false;
                    if !self.listed().await {
                        return Stop::Shutdown;
                    }
                }
                WatchEvent::Apply(object) => {
                    let event = match reduce(&self.watched, object) {
                        Reduced::Object(object) if admits(&object) => Event::Apply(object),
                        Reduced::Object(_) => continue,
                        Reduced::Invalid(reference, error) => {
                            warn!(%error, "invalid object; treated as absent");
                            Event::Delete(reference)
                        }
                    };
                    if !self.send(event).await {
                        return Stop::Shutdown;
                    }
                }
                WatchEvent::Delete(object) => {
                    let reference = object_ref(&self.watched, &object);
                    if !self.send(Event::Delete(reference)).await {
                        return Stop::Shutdown;
                    }
                }
            }
        }
    }

    /// Records a watch error (logged once per failure); returns how long after its retry the
    /// watch must stay quiet to count as working again. After a hang, that is a whole watch
    /// period without another timeout.
    fn failed(&self, reason: ErrorReason, text: String) -> Duration {
        let kind = self.watched.kind;
        let was_failing = self.health.kind(kind).failing;
        self.health.error(kind, reason, text.clone());
        if !was_failing {
            warn!(
                error = text,
                %reason,
                "watch failing; serving the last snapshot, retrying with backoff"
            );
        } else {
            debug!(error = text, %reason, "watch still failing");
        }
        if reason == ErrorReason::Timeout {
            Duration::from_secs(u64::from(self.watch_timeout)) + READ_GRACE + SETTLED
        } else {
            SETTLED
        }
    }

    /// The watch works again (`progress`: it delivered something).
    fn recovered(&self, progress: bool) {
        if self.health.recovered(self.watched.kind, progress) {
            info!("watch recovered");
        }
    }

    /// The kind is not served (its CRD is missing): it is empty until it appears. Warns and
    /// sends the empty `Reset` once per absence (one log line per transition, however often
    /// the list is retried). Returns false when the index is gone.
    async fn missing(&mut self, error: &watcher::Error) -> bool {
        let kind = self.watched.kind;
        let already = self.health.kind(kind).missing;
        self.health.recovered(kind, false);
        self.health.update(kind, |h| {
            h.missing = true;
            h.synced = true;
        });
        if already {
            debug!(%error, "still not served");
            return true;
        }
        let what = if self.watched.crd {
            "its CRD is not installed"
        } else {
            "the API server does not serve it"
        };
        warn!(
            resource = %format!("{}.{}", self.watched.resource.plural, self.watched.resource.group),
            "{what}: treating it as empty; it is picked up when it appears"
        );
        self.streamed = true;
        self.send(Event::Reset(kind, Vec::new())).await && self.listed().await
    }
}
