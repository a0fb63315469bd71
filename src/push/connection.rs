//! One delta ADS stream: its task, what it holds per type, and how it ends.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{debug, info, warn};

use crate::discovery::Snapshot;
use crate::discovery::names::{PerType, TypeKind};
use crate::metrics::{Metrics, TypeLabel, VersionLabel};
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::xds::{DeltaDiscoveryRequest, Node};
use crate::push::indexer::Snapshots;
use crate::push::known::{KnownVersions, Received};
use crate::push::outbound::{Outbound, Slot};
use crate::push::registry::{ClientView, Handle, Pending, TypeStatus};
use crate::push::response::Outgoing;
use crate::push::server::Inbound;
use crate::push::subscription::{
    Delta, MAX_SUBSCRIBED_NAMES, RequestKind, TypeState, classify, initial_names, split,
    too_many_names,
};

/// Who is on the other end, from the node in the first request.
#[derive(Clone, Debug, Default)]
pub struct ProxyInfo {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub node_name: String,
    /// Metadata `CLUSTER_ID` (present when ztunnel sets `ISTIO_META_CLUSTER_ID`).
    pub cluster_id: String,
    /// Metadata `ISTIO_VERSION`, when sent.
    pub version: String,
}

impl ProxyInfo {
    /// The proxy's id as istiod has it: the third `~` segment of the node id
    /// (`ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`), else `<NAME>.<NAMESPACE>` from the
    /// metadata when the node id is not in that form.
    pub fn proxy_id(&self) -> String {
        let parts: Vec<&str> = self.id.split('~').collect();
        match parts.as_slice() {
            [_, _, id, _] if !id.is_empty() => (*id).to_string(),
            _ => format!("{}.{}", self.name, self.namespace),
        }
    }

    fn from_node(node: &Node) -> Self {
        let meta = |key: &str| {
            node.metadata
                .as_ref()
                .and_then(|m| m.fields.get(key))
                .and_then(|v| match &v.kind {
                    Some(ValueKind::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default()
        };
        ProxyInfo {
            id: node.id.clone(),
            name: meta("NAME"),
            namespace: meta("NAMESPACE"),
            node_name: meta("NODE_NAME"),
            cluster_id: meta("CLUSTER_ID"),
            version: meta("ISTIO_VERSION"),
        }
    }
}

/// How long an ending stream waits for its proxy to read the responses queued before its status.
const DRAIN: Duration = Duration::from_secs(5);
/// How long it then waits for the proxy to close its side of the stream.
const FLUSH: Duration = Duration::from_secs(1);

/// How a stream the server ends by choice (its maximum age, or shutdown) closes: as grpc-go's
/// server closes streams on a connection it is draining. ztunnel then reconnects after 10 ms
/// with a debug-level log; an OK status would make every ztunnel warn "XDS client complete".
fn closing() -> Status {
    Status::unavailable("transport is closing")
}

/// Why a connection ended early.
pub(super) enum End {
    /// The client went away; nothing to report.
    Closed,
    /// The stream reached its maximum age: it ends with [`closing`], and ztunnel reconnects.
    Expired,
    /// ambientd is shutting down: the stream ends with [`closing`] and the connection gets GOAWAY, so
    /// ztunnel reconnects, to another replica.
    Shutdown,
    /// The proxy read or acknowledged nothing for this long while changes waited.
    Idle(Duration),
    /// A protocol error, reported to the client as a gRPC status.
    Error(Status),
}

/// One stream's state. Owned by its task; nothing else touches it.
pub(super) struct Connection {
    pub(super) id: u64,
    pub(super) snapshots: Snapshots,
    /// The newest snapshot seen (what on-demand requests are answered from).
    pub(super) latest: Option<Arc<Snapshot>>,
    /// Types not yet brought up to date with `latest`: computed and sent only when the outbound
    /// queue has room, so a slow proxy coalesces every change into one response per type.
    pub(super) dirty: BTreeSet<TypeKind>,
    /// Whether anything was sent for `latest` (for the convergence metric).
    pub(super) pushed: bool,
    pub(super) outbound: Outbound,
    /// The stream's first request, read before this task started (to tell a waypoint from a
    /// ztunnel): handled first. Boxed, so an idle task holds a pointer.
    pub(super) first: Option<Box<Result<Received, Inbound>>>,
    pub(super) types: PerType<TypeState>,
    pub(super) proxy: Option<ProxyInfo>,
    pub(super) sent: u64,
    /// This connection's entry in the registry (removed when the task ends).
    pub(super) status: Handle,
    pub(super) metrics: Arc<Metrics>,
    /// When this stream ends so the proxy reconnects (maybe to another replica).
    pub(super) expires: Option<Duration>,
    /// How long a response may wait for the proxy to read before the stream is dropped.
    pub(super) idle_timeout: Option<Duration>,
    pub(super) max_response_bytes: usize,
    /// How long a reconnecting wildcard proxy keeps names this replica lacks before they are
    /// removed (`--reconnect-removal-grace`; see `TypeState::hold_removals`).
    pub(super) removal_grace: Duration,
    pub(super) scope_to_node: bool,
    pub(super) shutdown: CancellationToken,
}

impl Connection {
    /// Boxed: an async fn keeps its arguments twice (as given and as moved into its body), and
    /// the task holds this future for the stream's life.
    pub(super) async fn run<S>(mut self: Box<Self>, mut inbound: S)
    where
        S: Stream<Item = Result<Received, Inbound>> + Unpin,
    {
        let Some(snapshot) = Box::pin(self.wait_ready()).await else {
            return;
        };
        self.latest = Some(snapshot);
        let version = VersionLabel {
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        self.metrics.xds_clients.get_or_create(&version).inc();
        let expiry = tokio::time::sleep(self.expires.unwrap_or(Duration::MAX));
        tokio::pin!(expiry);
        // Since when something has waited for the proxy ([`Connection::stalled`]) with no
        // progress, and how many pieces the encoder had taken then. Progress: a response goes
        // into the outbound queue, the proxy answers one, or it reads a piece (a slow initial
        // sync, in a storm, is progress however long it takes).
        let mut waiting_since: Option<tokio::time::Instant> = None;
        let mut taken_since = 0;
        // The request read before this task started, then the stream.
        let early = match self.first.take().map(|first| *first) {
            None => None,
            Some(Ok((request, known))) => Box::pin(self.on_request(request, known)).await.err(),
            Some(Err(Inbound::Transport(status))) => {
                debug!(%status, "stream error");
                Some(End::Closed)
            }
            Some(Err(Inbound::Invalid(status))) => Some(End::Error(status)),
        };
        let end = if let Some(end) = early {
            end
        } else {
            loop {
                if !self.stalled() {
                    waiting_since = None;
                } else if waiting_since.is_none() {
                    waiting_since = Some(tokio::time::Instant::now());
                    taken_since = self.outbound.taken();
                }
                let idle_deadline = self.idle_timeout.zip(waiting_since).map(|(i, w)| w + i);
                let removals_due: Option<tokio::time::Instant> = self
                    .types
                    .iter()
                    .filter_map(|(_, s)| s.removals_due_at())
                    .min()
                    .map(Into::into);
                // One timer for both deadlines: each `Sleep` would sit in every idle
                // connection's task.
                let timer = match (idle_deadline, removals_due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let outbound = self.outbound.clone();
                tokio::select! {
                    biased;
                    _ = self.shutdown.cancelled() => break End::Shutdown,
                    _ = &mut expiry, if self.expires.is_some() => break End::Expired,
                    _ = tokio::time::sleep_until(timer.unwrap_or_else(tokio::time::Instant::now)),
                        if timer.is_some() => {
                        let now = tokio::time::Instant::now();
                        if idle_deadline.is_some_and(|at| at <= now) {
                            if self.outbound.taken() != taken_since {
                                // The proxy read meanwhile: wait afresh.
                                waiting_since = None;
                            } else if self.stalled() {
                                break End::Idle(self.idle_timeout.unwrap_or_default());
                            }
                        }
                        if removals_due.is_some_and(|at| at <= now) {
                            let now = std::time::Instant::now();
                            let kinds: Vec<TypeKind> = self.types.keys().collect();
                            for kind in kinds {
                                if let Some(state) = self.types.get_mut(&kind)
                                    && state.removals_due_at().is_some_and(|at| at <= now)
                                {
                                    state.removals_woken();
                                    self.dirty.insert(kind);
                                }
                            }
                        }
                    }
                    message = inbound.next() => match message {
                        Some(Ok((request, known))) => {
                            let answered = self.answered();
                            // Boxed (as `push_dirty` below): awaited inline, their state would
                            // sit in every idle connection's task.
                            if let Err(end) = Box::pin(self.on_request(request, known)).await {
                                break end;
                            }
                            // An answer (ACK or NACK) shows the proxy reads its responses.
                            if self.answered() > answered {
                                waiting_since = None;
                            }
                        }
                        None => break End::Closed,
                        Some(Err(Inbound::Transport(status))) => {
                            debug!(%status, "stream error");
                            break End::Closed;
                        }
                        Some(Err(Inbound::Invalid(status))) => break End::Error(status),
                    },
                    changed = self.snapshots.changed() => {
                        if changed.is_err() {
                            // The index task ended: ambientd is shutting down.
                            break End::Shutdown;
                        }
                        let latest = self.snapshots.borrow_and_update().clone();
                        if let Some(latest) = latest {
                            for state in self.types.values_mut() {
                                state.note(&latest);
                            }
                            self.latest = Some(latest);
                            self.pushed = false;
                            self.dirty = self.types.keys().collect();
                            self.publish_pending();
                        }
                    }
                    slot = outbound.reserve(), if self.can_push() => match slot {
                        Ok(slot) => {
                            waiting_since = None;
                            if let Err(end) = Box::pin(self.push_dirty(slot)).await {
                                break end;
                            }
                        }
                        Err(_) => break End::Closed,
                    },
                }
            }
        };
        self.metrics.xds_clients.get_or_create(&version).dec();
        let proxy = self.proxy.as_ref().map(|p| p.id.as_str()).unwrap_or("");
        match end {
            End::Closed => info!(proxy, "proxy disconnected"),
            End::Expired => {
                info!(
                    proxy,
                    "stream reached its maximum age; the proxy reconnects"
                );
                self.outbound.end_with(closing());
            }
            End::Shutdown => {
                info!(proxy, "shutting down: ending the stream");
                self.outbound.end_with(closing());
            }
            End::Idle(idle) => {
                // What HTTP/2 has not taken yet is freed now, not when the connection goes.
                self.outbound.abandon();
                warn!(
                    proxy,
                    ?idle,
                    "dropping stream: changes waited the idle timeout for the proxy to read or acknowledge a response"
                );
            }
            End::Error(status) => {
                warn!(proxy, %status, "closing stream");
                self.outbound.end_with(status);
            }
        }
        // The request stream stays open until the response's end has gone out. Dropping it
        // makes h2 reset the stream, which discards frames not yet written, the status among
        // them. So: wait for the encoder to take the end (a proxy that reads nothing gets a few
        // seconds), then for the proxy to close its side, as ztunnel does on seeing the status
        // (one that does not gets a second).
        let drained = self.outbound.drained();
        drop(self);
        if tokio::time::timeout(DRAIN, drained.wait()).await.is_ok() {
            let _ = tokio::time::timeout(FLUSH, async { while inbound.next().await.is_some() {} })
                .await;
        }
    }

    /// The first dirty type (Address before Authorization) with fewer than
    /// [`PUSH_WINDOW`](crate::push::subscription::PUSH_WINDOW) responses awaiting the proxy's
    /// answer. A type with a full window stays dirty: its changes coalesce here, so the
    /// proxy's HTTP/2 buffers (hyper lets a stream queue up to 400 KiB) never fill with
    /// responses that later ones supersede, and the next response, once an ACK comes,
    /// carries only the latest version of each changed resource.
    fn next_pushable(&self) -> Option<TypeKind> {
        self.dirty
            .iter()
            .copied()
            .find(|kind| self.types.get(kind).is_none_or(|s| !s.in_flight.is_full()))
    }

    /// Whether something waits for the proxy: changes not yet sent, a response in the outbound
    /// queue, or a response not yet answered (ztunnel and Envoy answer each at once). A proxy
    /// that reads nothing would otherwise hold the rest of its responses (at 10k pods an
    /// initial sync is about 4.5 MB) for as long as no change comes; after the idle timeout
    /// without progress it is dropped.
    fn stalled(&self) -> bool {
        !self.dirty.is_empty()
            || self.outbound.queued() > 0
            || self
                .types
                .iter()
                .any(|(_, state)| !state.in_flight.is_empty())
    }

    /// Responses the proxy has answered (ACK or NACK), about: those sent less those awaiting
    /// an answer.
    fn answered(&self) -> u64 {
        let unanswered: usize = self.types.iter().map(|(_, s)| s.in_flight.len()).sum();
        self.sent.saturating_sub(unanswered as u64)
    }

    fn can_push(&self) -> bool {
        self.next_pushable().is_some()
    }

    /// Holds the stream until the first snapshot exists. `None` if the server shuts down.
    async fn wait_ready(&mut self) -> Option<Arc<Snapshot>> {
        let shutdown = self.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => None,
            ready = self.snapshots.wait_for(Option::is_some) => ready.ok()?.clone(),
        }
    }

    /// The newest snapshot (always set once `run` is past `wait_ready`).
    fn snapshot(&self) -> Arc<Snapshot> {
        self.latest.clone().expect("a snapshot before any request")
    }

    /// What this connection holds back for its proxy, for the debug views.
    fn publish_pending(&self) {
        let latest = self.latest.as_deref();
        let changed_names = self
            .dirty
            .iter()
            .filter_map(|kind| self.types.get(kind))
            .map(|state| latest.map_or(0, |l| state.changed_names(l)))
            .sum();
        let pending = Pending {
            queued_responses: self.outbound.queued(),
            queued_bytes: self.outbound.queued_bytes(),
            changed_names,
        };
        self.status.update(|s| s.pending = pending);
    }
    async fn on_request(
        &mut self,
        request: DeltaDiscoveryRequest,
        known: KnownVersions,
    ) -> Result<(), End> {
        let snapshot = &self.snapshot();
        if self.proxy.is_none()
            && let Some(node) = &request.node
        {
            let proxy = ProxyInfo::from_node(node);
            info!(
                proxy = proxy.id,
                node = proxy.node_name,
                namespace = proxy.namespace,
                "proxy connected"
            );
            let connection_id = format!("{}.{}-{}", proxy.name, proxy.namespace, self.id);
            let info = proxy.clone();
            self.status.update(|s| {
                s.connection_id = connection_id;
                s.proxy = Some(info);
            });
            self.proxy = Some(proxy);
        }
        // A request naming one of our nonces (ACK, NACK, or an ACK gone stale) answers that
        // response and every earlier one: their places in the push window are free.
        if let Some(state) =
            TypeKind::from_type_url(&request.type_url).and_then(|kind| self.types.get_mut(&kind))
        {
            state.in_flight.answered(&request.response_nonce);
        }
        let last_nonce = TypeKind::from_type_url(&request.type_url)
            .and_then(|kind| self.types.get(&kind))
            .map(|state| state.last_nonce.as_str());
        match classify(&request, last_nonce) {
            RequestKind::UnknownType(type_url) => {
                Err(End::Error(Status::invalid_argument(format!(
                    "unknown type URL {type_url:?}: ambientd serves {} and {}",
                    TypeKind::Address.type_url(),
                    TypeKind::Authorization.type_url()
                ))))
            }
            RequestKind::Initial(kind) => {
                let known_count = known.len();
                let names = initial_names(&request, known_count);
                if names > MAX_SUBSCRIBED_NAMES {
                    return Err(self.too_many_names(kind, names));
                }
                let mut state = TypeState::with_known(kind, &request, known);
                state.hold_removals(self.removal_grace);
                if let Some(proxy) = &self.proxy {
                    if self.scope_to_node {
                        state.scope_to_node(&proxy.node_name);
                    } else {
                        state.on_demand_from(&proxy.node_name);
                    }
                }
                debug!(
                    %kind,
                    wildcard = state.subscription.wildcard,
                    node_scope = state.node(),
                    names = state.subscription.names.len(),
                    known = known_count,
                    "initial request"
                );
                let delta = state.initial(snapshot);
                self.types.insert(kind, state);
                // Always answer the initial request, even with nothing in it.
                self.send(kind, snapshot, delta).await
            }
            RequestKind::Ack(kind) => {
                debug!(%kind, nonce = request.response_nonce, "ack");
                let nonce = request.response_nonce.clone();
                self.status.update(|s| {
                    if let Some(t) = s.types.get_mut(&kind) {
                        t.acked_nonce = nonce;
                        t.acked_at = Some(SystemTime::now());
                        t.last_error = None;
                    }
                });
                self.subscribe(kind, snapshot, &request).await
            }
            RequestKind::Stale(kind) => {
                // The request itself is ignored, as istiod ignores requests with stale nonces
                // (its response was still answered above).
                debug!(%kind, nonce = request.response_nonce, "stale nonce ignored");
                self.metrics
                    .expired_nonce
                    .get_or_create(&TypeLabel::of(kind))
                    .inc();
                Ok(())
            }
            RequestKind::Nack { kind, message } => {
                let proxy = self.proxy.as_ref().map(|p| p.id.as_str()).unwrap_or("");
                warn!(proxy, %kind, nonce = request.response_nonce, error = message, "proxy rejected resources (NACK); not re-sending them");
                self.metrics
                    .rejects
                    .get_or_create(&TypeLabel::of(kind))
                    .inc();
                self.status.update(|s| {
                    if let Some(t) = s.types.get_mut(&kind) {
                        t.last_error = Some(message);
                    }
                });
                Ok(())
            }
            RequestKind::Subscribe(kind) => self.subscribe(kind, snapshot, &request).await,
        }
    }

    async fn subscribe(
        &mut self,
        kind: TypeKind,
        snapshot: &Arc<Snapshot>,
        request: &DeltaDiscoveryRequest,
    ) -> Result<(), End> {
        if request.resource_names_subscribe.is_empty()
            && request.resource_names_unsubscribe.is_empty()
        {
            return Ok(());
        }
        let Some(state) = self.types.get(&kind) else {
            return Ok(());
        };
        let would_hold = state
            .subscription
            .would_hold(&request.resource_names_subscribe);
        if would_hold > MAX_SUBSCRIBED_NAMES {
            return Err(self.too_many_names(kind, would_hold));
        }
        let Some(state) = self.types.get_mut(&kind) else {
            return Ok(());
        };
        debug!(%kind, subscribe = ?request.resource_names_subscribe, unsubscribe = ?request.resource_names_unsubscribe, "subscription change");
        let started = Instant::now();
        let delta = state.on_subscribe(
            snapshot,
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
        );
        self.metrics
            .push_triggers
            .get_or_create(&TypeLabel::named("request"))
            .inc();
        self.send_timed(kind, snapshot, delta, started, None).await
    }

    /// Ends the stream: a request would subscribe it to more than [`MAX_SUBSCRIBED_NAMES`].
    fn too_many_names(&self, kind: TypeKind, would_hold: usize) -> End {
        self.metrics.record_xds_refused("subscribed_names");
        End::Error(Status::resource_exhausted(too_many_names(
            kind.type_url(),
            would_hold,
        )))
    }

    /// Brings dirty types up to date with the newest snapshot, Address first; `slot` is room
    /// for one response. A type that needs nothing is cleaned without using it; after one
    /// response the rest wait for the next slot, by which time newer snapshots may have come.
    async fn push_dirty(&mut self, slot: Slot) -> Result<(), End> {
        let snapshot = self.snapshot();
        let mut slot = Some(slot);
        while slot.is_some() {
            let Some(kind) = self.next_pushable() else {
                break;
            };
            self.dirty.remove(&kind);
            let started = Instant::now();
            let Some(state) = self.types.get_mut(&kind) else {
                continue;
            };
            let delta = state.on_snapshot(&snapshot);
            if delta.is_empty() {
                self.publish_status(kind);
            } else {
                self.pushed = true;
                self.send_timed(kind, &snapshot, delta, started, slot.take())
                    .await?;
            }
        }
        if self.dirty.is_empty() && self.pushed {
            self.pushed = false;
            self.metrics
                .push_triggers
                .get_or_create(&TypeLabel::named("ambient"))
                .inc();
            if let Some(published) = snapshot.published_at {
                self.metrics.record_convergence(published.elapsed());
            }
        }
        self.publish_pending();
        Ok(())
    }
    /// Copies one type's sync state into the registry, for the debug views.
    fn publish_status(&self, kind: TypeKind) {
        let Some(state) = self.types.get(&kind) else {
            return;
        };
        let view = match state.synced() {
            Some(snapshot) if state.subscription.wildcard => ClientView::Snapshot(snapshot.clone()),
            _ => ClientView::Held(
                state
                    .held()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
        };
        let wildcard = state.subscription.wildcard;
        let names: Vec<String> = state.subscription.names.iter().cloned().collect();
        let nonce = state.last_nonce.clone();
        self.status.update(|s| {
            let entry = s.types.get_or_insert_with(kind, || TypeStatus {
                wildcard,
                names: Vec::new(),
                sent_nonce: String::new(),
                sent_at: None,
                acked_nonce: String::new(),
                acked_at: None,
                last_error: None,
                view: None,
            });
            entry.wildcard = wildcard;
            entry.names = names;
            if entry.sent_nonce != nonce {
                entry.sent_nonce = nonce;
                entry.sent_at = Some(SystemTime::now());
            }
            entry.view = Some(view);
        });
    }

    async fn send(&mut self, kind: TypeKind, snapshot: &Snapshot, delta: Delta) -> Result<(), End> {
        self.send_timed(kind, snapshot, delta, Instant::now(), None)
            .await
    }

    /// Room in the outbound queue, waiting at most the idle timeout for the proxy to read.
    async fn reserve(&self) -> Result<Slot, End> {
        let reserve = self.outbound.reserve();
        let slot = match self.idle_timeout {
            Some(idle) => match tokio::time::timeout(idle, reserve).await {
                Ok(slot) => slot,
                Err(_) => return Err(End::Idle(idle)),
            },
            None => reserve.await,
        };
        slot.map_err(|_| End::Closed)
    }

    /// Sends one type's delta (split if large), using `slot` for the first response if given.
    async fn send_timed(
        &mut self,
        kind: TypeKind,
        snapshot: &Snapshot,
        delta: Delta,
        started: Instant,
        mut slot: Option<Slot>,
    ) -> Result<(), End> {
        let parts = split(delta, self.max_response_bytes);
        let count = parts.len();
        for (i, part) in parts.into_iter().enumerate() {
            self.sent += 1;
            let nonce = format!("{:x}", self.sent);
            debug!(
                %kind,
                nonce,
                generation = snapshot.generation,
                resources = part.resources.len(),
                removed = part.removed.len(),
                part = i + 1,
                of = count,
                "push"
            );
            let frame = Outgoing {
                type_url: kind.type_url(),
                nonce: &nonce,
                resources: &part.resources,
                removed: &part.removed,
            }
            .pieces();
            let bytes: usize = part.resources.iter().map(|r| r.value_len()).sum();
            if let Some(state) = self.types.get_mut(&kind) {
                state.last_nonce = nonce;
                state.in_flight.sent(self.sent);
            }
            self.publish_status(kind);
            // A proxy that reads nothing for the idle timeout is dropped: its buffers stay
            // bounded and it reconnects (or not) on its own.
            let room = match slot.take() {
                Some(slot) => slot,
                None => self.reserve().await?,
            };
            room.send(frame);
            self.metrics.record_push(kind, started.elapsed(), bytes);
        }
        Ok(())
    }
}
