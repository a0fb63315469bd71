//! The Kubernetes source: kube-runtime watchers over every kind ambientd reads, feeding the
//! index the same [`Event`]s as the manifests source.
//!
//! Each kind has one task running `kube::runtime::watcher` with the kind's `ApiResource` over
//! [`kinds::WatchedObject`]s (a leaner `DynamicObject`: the object's JSON text, without
//! `managedFields`). Objects are reduced on arrival through the same decoders as manifests
//! ([`kinds::reduce`]); no full object is kept. A re-list is buffered from `Init` to `InitDone`
//! and sent as one `Reset(kind, objects)`, so it is the truth and swaps state in one step; later
//! changes are `Apply`/`Delete`.
//!
//! - **Readiness:** the first list of each kind streams into the index as `Apply`s while it
//!   is read (nothing is published before `Synced`, so it need not be atomic), gated so kinds
//!   arrive in [`Kind::ALL`] order (containers before contents, as the manifests source loads
//!   them). `Synced` follows once every kind is listed.
//! - **Missing CRDs:** any 404 on list (a real API server's is plain text, see
//!   [`crate::kube::not_served`]) means the kind is not installed: one warning, a
//!   `Reset(kind, [])` (it counts as listed, so readiness is not held), a fresh list every few
//!   seconds, and one line when the CRD appears and the kind is listed.
//! - **Errors and outages:** the watcher backs off (kube's `default_backoff` unless
//!   [`ClusterConfig::retry`] says otherwise), resumes from its last resourceVersion, and
//!   re-lists after a 410. Nothing is sent meanwhile, so the index keeps serving its last
//!   snapshot; each kind logs once when it starts failing and once when it recovers, and
//!   [`ClusterHealth`] records it (since when, the last error, why: [`ErrorReason`]), which
//!   the metrics and `/debug/syncz` show.
//! - **Hangs:** each watch asks the API server to end it after
//!   [`ClusterConfig::watch_timeout`]; the client gives up on any response (a list, a watch)
//!   that goes that long plus [`READ_GRACE`] without a byte, which counts as an error and is
//!   retried like one.
//! - **Discovery selectors:** objects of namespaced kinds outside the selected namespaces are
//!   dropped on arrival. When the set of selected namespaces changes, the namespaced watchers
//!   re-list, and their `Reset`s bring the index to the new selection.
//!
//! The `istio.io/rev` revision filter is the index's (see `Settings::revision`), not ours.

mod health;
pub mod kinds;
mod observe;
pub mod selector;
mod watch;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::utils::Backoff;
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};

use crate::discovery::model::{Event, Kind};

pub(crate) use health::classify;
pub use health::{ClusterHealth, ErrorReason, KindHealth};
pub use kinds::{WatchedKind, watched_kinds};
pub use selector::{DiscoverySelectors, LabelSelector, MeshSettings};

/// Events from watchers queued before they wait for the coordinator.
const WATCH_BUFFER: usize = 1024;

/// How much longer than the watch timeout a response may go without a byte before the client
/// gives it up. Shorter than kube-runtime's own idle margin (5 s), so a silent watch surfaces
/// as an error (counted, shown) rather than a quiet reconnect.
pub const READ_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("loading kubeconfig")]
    KubeconfigContext(#[source] kube::config::KubeconfigError),
    #[error(
        "no Kubernetes configuration: not in a cluster and no kubeconfig \
         (use --kubeconfig, KUBECONFIG, or --manifests DIR)"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// How watch errors are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// kube-runtime's `default_backoff`: 0.8 s doubling to 30 s, with jitter.
    KubeDefault,
    /// Exponential without jitter, from `initial` doubling to `max` (tests use this).
    Exponential { initial: Duration, max: Duration },
}

impl Retry {
    /// How often a kind that is not served (its CRD missing) is listed again, so it is picked
    /// up soon after its CRD is installed. A 404 costs the API server next to nothing.
    fn missing_poll(self) -> Duration {
        match self {
            Retry::KubeDefault => Duration::from_secs(5),
            Retry::Exponential { max, .. } => max,
        }
    }

    pub(crate) fn backoff(self) -> Box<dyn Backoff> {
        match self {
            Retry::KubeDefault => Box::new(kube::runtime::watcher::DefaultBackoff::default()),
            Retry::Exponential { initial, max } => Box::new(Exponential {
                initial,
                max,
                current: None,
            }),
        }
    }
}

/// A watcher's backoff that remembers the delay it last chose (so the watch loop knows when
/// a retry that produced no new error has succeeded) and resets only on progress.
///
/// kube-runtime's `StreamBackoff` resets its backoff on every `Ok` item, and the watcher
/// yields `Init` before each list attempt, so a list that keeps failing (a kind the caller may
/// not list, an unreachable server) would be retried at the first delay forever. Here the
/// reset is ignored; the owner calls [`BackoffHandle::progressed`] when the watch really
/// moved (a list completed, an object changed), and the next delay starts over.
pub(crate) struct Recorded {
    inner: Box<dyn Backoff>,
    shared: Arc<Mutex<BackoffState>>,
}

#[derive(Debug, Default)]
struct BackoffState {
    last: Option<Duration>,
    progressed: bool,
}

/// The watch loop's side of a [`Recorded`] backoff.
#[derive(Clone, Debug)]
pub(crate) struct BackoffHandle(Arc<Mutex<BackoffState>>);

impl BackoffHandle {
    fn lock(&self) -> std::sync::MutexGuard<'_, BackoffState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The delay chosen after the latest error (zero before any).
    pub(crate) fn last_delay(&self) -> Duration {
        self.lock().last.unwrap_or_default()
    }

    /// The watch made progress: the next error backs off from the first delay again.
    pub(crate) fn progressed(&self) {
        self.lock().progressed = true;
    }
}

impl Recorded {
    pub(crate) fn new(retry: Retry) -> (Self, BackoffHandle) {
        let shared = Arc::new(Mutex::new(BackoffState::default()));
        (
            Recorded {
                inner: retry.backoff(),
                shared: shared.clone(),
            },
            BackoffHandle(shared),
        )
    }
}

impl Iterator for Recorded {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let mut state = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if std::mem::take(&mut state.progressed) {
            self.inner.reset();
        }
        let next = self.inner.next();
        state.last = next;
        next
    }
}

impl Backoff for Recorded {
    /// Ignored: see the type's comment; [`BackoffHandle::progressed`] resets instead.
    fn reset(&mut self) {}
}

struct Exponential {
    initial: Duration,
    max: Duration,
    current: Option<Duration>,
}

impl Iterator for Exponential {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let next = match self.current {
            None => self.initial,
            Some(current) => (current * 2).min(self.max),
        };
        self.current = Some(next);
        Some(next)
    }
}

impl Backoff for Exponential {
    fn reset(&mut self) {
        self.current = None;
    }
}

/// Where the cluster is and what to read from it.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// A kubeconfig file; `None` infers (`KUBECONFIG`, `~/.kube/config`, then in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; `None` is the current context.
    pub context: Option<String>,
    pub discovery_selectors: DiscoverySelectors,
    pub retry: Retry,
    /// The `timeoutSeconds` of each watch (whole seconds, at least 1): the API server ends a
    /// watch after this long and the watcher resumes it. Plus [`READ_GRACE`], it is also how
    /// long any request of this client may go without receiving a byte (a hung list or watch).
    pub watch_timeout: Duration,
}

/// kube-runtime's default watch timeout.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(290);

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            kubeconfig: None,
            context: None,
            discovery_selectors: DiscoverySelectors::default(),
            retry: Retry::KubeDefault,
            watch_timeout: DEFAULT_WATCH_TIMEOUT,
        }
    }
}

impl ClusterConfig {
    /// The Kubernetes client this config names.
    pub async fn client(&self) -> Result<kube::Client, ClusterError> {
        self.client_observing(&observe::WatchBreaks::default())
            .await
    }

    /// The client, with its watch responses observed for breaks kube does not report.
    async fn client_observing(
        &self,
        breaks: &observe::WatchBreaks,
    ) -> Result<kube::Client, ClusterError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file =
                    Kubeconfig::read_from(path).map_err(|source| ClusterError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|source| ClusterError::Kubeconfig {
                        path: path.clone(),
                        source,
                    })?
            }
            (None, Some(_)) => kube::Config::from_kubeconfig(&options)
                .await
                .map_err(ClusterError::KubeconfigContext)?,
            (None, None) => kube::Config::infer().await.map_err(ClusterError::Infer)?,
        };
        let mut config = config;
        config.read_timeout = Some(self.watch_seconds_duration() + READ_GRACE);
        // The timeout counts from each request, not from when its pooled connection went idle.
        config.reset_reader_on_write = true;
        Ok(kube::client::ClientBuilder::try_from(config)
            .map_err(ClusterError::Client)?
            .with_layer(breaks)
            .build())
    }

    /// The watch timeout in whole seconds (at least 1), as sent.
    pub(crate) fn watch_seconds(&self) -> u32 {
        self.watch_timeout.as_secs().clamp(1, u64::from(u32::MAX)) as u32
    }

    fn watch_seconds_duration(&self) -> Duration {
        Duration::from_secs(u64::from(self.watch_seconds()))
    }
}

/// Which namespaces pass the discovery selectors; `None` until Namespaces are first listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection(Option<Arc<HashSet<String>>>);

impl Selection {
    fn admits(&self, namespace: &str) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(namespace))
    }
}

/// A connected Kubernetes source, ready to run.
pub struct ClusterSource {
    /// Shared with the other users of the API server (writers, the CA's TokenReview).
    client: kube::Client,
    /// The watchers' own client, whose watch responses are observed (`breaks`): another
    /// user's watch of the same resource must not count as the source's.
    watch_client: kube::Client,
    config: ClusterConfig,
    kinds: Vec<WatchedKind>,
    health: Arc<ClusterHealth>,
    /// Watch responses that break off, as the watchers' client observes them.
    breaks: observe::WatchBreaks,
}

impl std::fmt::Debug for ClusterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSource")
            .field("config", &self.config)
            .finish()
    }
}

impl ClusterSource {
    /// Builds the client from `config` (kubeconfig or in-cluster). Nothing is contacted yet.
    pub async fn connect(config: ClusterConfig) -> Result<Self, ClusterError> {
        let client = config.client().await?;
        let breaks = observe::WatchBreaks::default();
        let watch_client = config.client_observing(&breaks).await?;
        Ok(ClusterSource {
            watch_client,
            breaks,
            ..Self::new(client, config)
        })
    }

    /// A source over an existing client (tests, embedders). Watches that break off in a way
    /// kube's client does not report (an EOF mid-stream) are resumed but not counted: only
    /// the watchers' client that [`ClusterSource::connect`] builds observes them.
    pub fn new(client: kube::Client, config: ClusterConfig) -> Self {
        ClusterSource {
            watch_client: client.clone(),
            client,
            config,
            kinds: watched_kinds(),
            health: Arc::new(ClusterHealth::default()),
            breaks: observe::WatchBreaks::default(),
        }
    }

    /// The client, shared with other users of the API server (the CA's TokenReview).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub fn health(&self) -> Arc<ClusterHealth> {
        self.health.clone()
    }

    /// Runs every watcher until `shutdown` or until the event receiver goes away.
    pub async fn run(self, events: mpsc::Sender<Event>, shutdown: CancellationToken) {
        let ClusterSource {
            watch_client: client,
            config,
            kinds,
            health,
            breaks,
            ..
        } = self;
        info!(
            discovery_selectors = %config.discovery_selectors,
            kinds = kinds.len(),
            "watching the cluster"
        );
        let (selection_tx, selection_rx) = tokio_watch::channel(Selection::default());
        let filtering = !config.discovery_selectors.is_empty();
        let (watch_tx, watch_rx) = mpsc::channel(WATCH_BUFFER);
        let mut tasks = JoinSet::new();
        let mut selection_tx = Some(selection_tx);
        let mut expected: Vec<Kind> = Vec::new();
        for watched in kinds {
            expected.push(watched.kind);
            let kind = watched.kind;
            let is_namespace = kind == Kind::Namespace;
            let broken = breaks.register(&watched.resource);
            let task = watch::KindWatch {
                broken,
                watched,
                client: client.clone(),
                out: watch_tx.clone(),
                retry: config.retry,
                watch_timeout: config.watch_seconds(),
                health: health.clone(),
                shutdown: shutdown.clone(),
                filter: (filtering && !is_namespace && kind.namespaced())
                    .then(|| selection_rx.clone()),
                selector: is_namespace.then(|| watch::NamespaceSelection {
                    selectors: config.discovery_selectors.clone(),
                    publish: filtering.then(|| selection_tx.take()).flatten(),
                    labels: Default::default(),
                    listed: false,
                }),
                streamed: false,
            };
            let span = info_span!("watch", %kind);
            tasks.spawn(task.run().instrument(span));
        }
        drop(watch_tx);
        let coordinate = coordinate(watch_rx, events, expected);
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = coordinate => {}
        }
        tasks.shutdown().await;
    }
}

/// What a watcher tells the coordinator.
#[allow(clippy::large_enum_variant)] // short-lived, moved straight on
#[derive(Debug)]
pub(crate) enum Message {
    Event(Event),
    /// The kind's list is complete (or the kind is not served): its events so far are the
    /// whole kind.
    Listed,
}

/// Forwards watcher events to the index. Until every kind is listed, a kind's events are
/// forwarded only once every kind before it in [`Kind::ALL`] is listed (containers before
/// contents, as the manifests source loads them); the rest wait in order. The first list of
/// a kind is streamed as `Apply`s (nothing is published before `Synced`, so it need not be
/// atomic), so the index builds while the big kinds are still being read. When every kind is
/// listed, `Synced` follows.
async fn coordinate(
    mut from_watchers: mpsc::Receiver<(Kind, Message)>,
    events: mpsc::Sender<Event>,
    expected: Vec<Kind>,
) {
    let order: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| expected.contains(k))
        .collect();
    let mut listed: HashSet<Kind> = HashSet::new();
    let mut waiting: BTreeMap<Kind, Vec<Event>> = BTreeMap::new();
    let mut objects = 0usize;
    // Kinds at positions below `open` may send; `order[open]` is the first not yet listed.
    let open_for = |listed: &HashSet<Kind>| {
        order
            .iter()
            .position(|k| !listed.contains(k))
            .unwrap_or(order.len())
    };
    let mut synced = order.is_empty();
    if synced {
        let _ = events.send(Event::Synced).await;
    }
    while let Some((kind, message)) = from_watchers.recv().await {
        if synced {
            if let Message::Event(event) = message
                && events.send(event).await.is_err()
            {
                return;
            }
            continue;
        }
        let open = open_for(&listed);
        let position = order.iter().position(|k| *k == kind).unwrap_or(0);
        match message {
            Message::Event(event) => {
                objects += match &event {
                    Event::Reset(_, o) => o.len(),
                    Event::Apply(_) => 1,
                    _ => 0,
                };
                if position <= open {
                    if events.send(event).await.is_err() {
                        return;
                    }
                } else {
                    waiting.entry(kind).or_default().push(event);
                }
            }
            Message::Listed => {
                listed.insert(kind);
                let now_open = open_for(&listed);
                // Flush, in order, the kinds this opened.
                for k in order.iter().take((now_open + 1).min(order.len())) {
                    for event in waiting.remove(k).unwrap_or_default() {
                        if events.send(event).await.is_err() {
                            return;
                        }
                    }
                }
                if now_open == order.len() {
                    if events.send(Event::Synced).await.is_err() {
                        return;
                    }
                    info!(objects, "every kind listed; cluster source synced");
                    synced = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::{Namespace, Node, Object, PodFields};

    fn pod(name: &str) -> Event {
        Event::Apply(Object::Pod(
            PodFields {
                name: name.into(),
                namespace: "demo".into(),
                ..PodFields::default()
            }
            .into(),
        ))
    }

    fn names(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                Event::Apply(o) => o.object_ref().to_string(),
                Event::Reset(kind, objects) => format!("reset {kind} {}", objects.len()),
                Event::Delete(r) => format!("delete {r}"),
                Event::Synced => "synced".into(),
                Event::Visibility(_) => "visibility".into(),
            })
            .collect()
    }

    #[tokio::test]
    async fn kinds_reach_the_index_in_order_and_synced_comes_last() {
        let (tx, rx) = mpsc::channel(64);
        let (out, mut index) = mpsc::channel(64);
        let kinds = vec![Kind::Namespace, Kind::Node, Kind::Pod];
        let coordinator = tokio::spawn(coordinate(rx, out, kinds));
        let send = |kind, message| {
            let tx = tx.clone();
            async move { tx.send((kind, message)).await.unwrap() }
        };
        // Pods list first, while Namespaces and Nodes are still listing: they wait.
        send(Kind::Pod, Message::Event(pod("a"))).await;
        send(Kind::Pod, Message::Listed).await;
        let namespace = Object::Namespace(Namespace {
            name: "demo".into(),
            ..Namespace::default()
        });
        send(Kind::Namespace, Message::Event(Event::Apply(namespace))).await;
        send(Kind::Namespace, Message::Listed).await;
        send(
            Kind::Node,
            Message::Event(Event::Reset(Kind::Node, Vec::new())),
        )
        .await;
        // A later change waits behind the first lists too.
        send(Kind::Pod, Message::Event(pod("b"))).await;
        let node = Object::Node(Node {
            name: "n".into(),
            ..Node::default()
        });
        send(Kind::Node, Message::Event(Event::Apply(node))).await;
        send(Kind::Node, Message::Listed).await;
        send(Kind::Pod, Message::Event(pod("c"))).await;
        drop(tx);
        coordinator.await.unwrap();
        let mut events = Vec::new();
        while let Some(event) = index.recv().await {
            events.push(event);
        }
        assert_eq!(
            names(&events),
            vec![
                "Namespace demo",
                "reset Node 0",
                "Node n",
                "Pod demo/a",
                "Pod demo/b",
                "synced",
                "Pod demo/c",
            ]
        );
    }

    #[test]
    fn watch_errors_are_classified_by_status_and_cause() {
        use kube::runtime::watcher::Error as W;
        let api = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                ..Default::default()
            }))
        };
        assert_eq!(
            classify(&W::InitialListFailed(api(500))),
            ErrorReason::ServerError
        );
        assert_eq!(
            classify(&W::WatchStartFailed(api(429))),
            ErrorReason::Throttled
        );
        assert_eq!(
            classify(&W::WatchStartFailed(api(403))),
            ErrorReason::Forbidden
        );
        let timed_out = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "deadline has elapsed",
        ));
        assert_eq!(
            classify(&W::WatchFailed(kube::Error::ReadEvents(timed_out))),
            ErrorReason::Timeout
        );
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert_eq!(
            classify(&W::WatchFailed(kube::Error::ReadEvents(reset))),
            ErrorReason::Connection
        );
        assert_eq!(classify(&W::NoResourceVersion), ErrorReason::Decode);
    }

    #[test]
    fn exponential_retry_doubles_to_its_cap_and_resets() {
        let mut backoff = Retry::Exponential {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(350),
        }
        .backoff();
        let delays: Vec<u128> = backoff.by_ref().take(4).map(|d| d.as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 350, 350]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(100)));
    }
}
