//! The delta ADS service (`DeltaAggregatedResources`) and one task per connected proxy.
//!
//! A connection waits for the first snapshot, answers each type's initial request (even with
//! nothing to send: ztunnel is not ready until it has ACKed every type), answers on-demand
//! subscriptions, and follows new snapshots. It sends one response per type per step; while the
//! client is slow, newer snapshots supersede older ones instead of queueing.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::discovery::Snapshot;
use crate::discovery::names::TypeKind;
use crate::metrics::{Metrics, TypeLabel, VersionLabel};
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::xds::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use crate::pb::xds::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Node,
};
use crate::push::indexer::Snapshots;
use crate::push::registry::{ClientView, Handle, Registry, TypeStatus};
use crate::push::subscription::{Delta, RequestKind, TypeState, classify};

/// Responses buffered per stream before the connection waits for the client to read.
const OUTBOUND_BUFFER: usize = 4;

/// The ADS service: hands each stream to its own connection task.
#[derive(Clone)]
pub struct AdsServer {
    snapshots: Snapshots,
    next_id: Arc<AtomicU64>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    max_stream_age: Option<Duration>,
    idle_timeout: Option<Duration>,
}

impl AdsServer {
    pub fn new(snapshots: Snapshots, registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        AdsServer {
            snapshots,
            next_id: Arc::new(AtomicU64::new(1)),
            registry,
            metrics,
            max_stream_age: None,
            idle_timeout: None,
        }
    }

    /// Drops a stream whose proxy has not read a waiting response for `idle`; `None` never.
    pub fn with_idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle_timeout = idle.filter(|i| !i.is_zero());
        self
    }

    /// Ends each stream after about `age` (±10 %, so proxies do not all return at once), so that
    /// proxies reconnect and spread over the replicas. With content-hash versions a reconnect
    /// re-sends nothing unchanged. `None`: streams live as long as the proxy keeps them.
    pub fn with_max_stream_age(mut self, age: Option<Duration>) -> Self {
        self.max_stream_age = age.filter(|a| !a.is_zero());
        self
    }

    /// The tonic service, without compression (ztunnel supports none).
    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<Self> {
        AggregatedDiscoveryServiceServer::new(self).max_decoding_message_size(64 * 1024 * 1024)
    }
}

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "ambientd serves only delta xDS: use DeltaAggregatedResources \
             (StreamAggregatedResources, state of the world, is not supported)",
        ))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
        let connection = Connection {
            id,
            snapshots: self.snapshots.clone(),
            outbound: tx,
            types: BTreeMap::new(),
            proxy: None,
            sent: 0,
            status: self.registry.register(id, peer.clone()),
            metrics: self.metrics.clone(),
            expires: self.max_stream_age.map(|age| jittered(age, id)),
            idle_timeout: self.idle_timeout,
        };
        let span = info_span!("xds", id, peer);
        tokio::spawn(connection.run(request.into_inner()).instrument(span));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// `age` ±10 %, spread by connection id so that streams opened together end apart.
fn jittered(age: Duration, id: u64) -> Duration {
    let spread = xxhash_rust::xxh64::xxh64(&id.to_le_bytes(), 0) % 2001; // 0..=2000
    let factor = 0.9 + spread as f64 / 10_000.0; // 0.9..=1.1
    age.mul_f64(factor)
}

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

/// Why a connection ended early.
enum End {
    /// The client went away; nothing to report.
    Closed,
    /// The stream reached its maximum age: it ends with OK, and ztunnel reconnects at once.
    Expired,
    /// The proxy read nothing for this long while a response waited.
    Idle(Duration),
    /// A protocol error, reported to the client as a gRPC status.
    Error(Status),
}

/// One stream's state. Owned by its task; nothing else touches it.
struct Connection {
    id: u64,
    snapshots: Snapshots,
    outbound: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
    types: BTreeMap<TypeKind, TypeState>,
    proxy: Option<ProxyInfo>,
    sent: u64,
    /// This connection's entry in the registry (removed when the task ends).
    status: Handle,
    metrics: Arc<Metrics>,
    /// When this stream ends so the proxy reconnects (maybe to another replica).
    expires: Option<Duration>,
    /// How long a response may wait for the proxy to read before the stream is dropped.
    idle_timeout: Option<Duration>,
}

impl Connection {
    async fn run(mut self, mut inbound: Streaming<DeltaDiscoveryRequest>) {
        let Some(mut snapshot) = self.wait_ready().await else {
            return;
        };
        let version = VersionLabel {
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        self.metrics.xds_clients.get_or_create(&version).inc();
        let expiry = tokio::time::sleep(self.expires.unwrap_or(Duration::MAX));
        tokio::pin!(expiry);
        let end = loop {
            tokio::select! {
                _ = &mut expiry, if self.expires.is_some() => break End::Expired,
                message = inbound.message() => match message {
                    Ok(Some(request)) => {
                        if let Err(end) = self.on_request(&snapshot, request).await {
                            break end;
                        }
                    }
                    Ok(None) => break End::Closed,
                    Err(status) => {
                        debug!(%status, "stream error");
                        break End::Closed;
                    }
                },
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        break End::Error(Status::unavailable("ambientd is shutting down"));
                    }
                    let latest = self.snapshots.borrow_and_update().clone();
                    if let Some(latest) = latest {
                        snapshot = latest;
                        if let Err(end) = self.on_snapshot(&snapshot).await {
                            break end;
                        }
                    }
                }
            }
        };
        self.metrics.xds_clients.get_or_create(&version).dec();
        let proxy = self.proxy.as_ref().map(|p| p.id.as_str()).unwrap_or("");
        match end {
            End::Closed => info!(proxy, "proxy disconnected"),
            End::Expired => info!(
                proxy,
                "stream reached its maximum age; the proxy reconnects"
            ),
            End::Idle(idle) => {
                warn!(
                    proxy,
                    ?idle,
                    "dropping stream: the proxy has not read a response for the idle timeout"
                );
            }
            End::Error(status) => {
                warn!(proxy, %status, "closing stream");
                let _ = self.outbound.send(Err(status)).await;
            }
        }
    }

    /// Holds the stream until the first snapshot exists. `None` if the server shuts down.
    async fn wait_ready(&mut self) -> Option<Arc<Snapshot>> {
        let ready = self.snapshots.wait_for(Option::is_some).await.ok()?;
        ready.clone()
    }

    async fn on_request(
        &mut self,
        snapshot: &Arc<Snapshot>,
        request: DeltaDiscoveryRequest,
    ) -> Result<(), End> {
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
                let mut state = TypeState::new(kind, &request);
                debug!(
                    %kind,
                    wildcard = state.subscription.wildcard,
                    names = state.subscription.names.len(),
                    known = request.initial_resource_versions.len(),
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
        let Some(state) = self.types.get_mut(&kind) else {
            return Ok(());
        };
        debug!(%kind, subscribe = ?request.resource_names_subscribe, unsubscribe = ?request.resource_names_unsubscribe, "subscription change");
        let started = Instant::now();
        match state.on_subscribe(
            snapshot,
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
        ) {
            Some(delta) => {
                self.metrics
                    .push_triggers
                    .get_or_create(&TypeLabel::named("request"))
                    .inc();
                self.send_timed(kind, snapshot, delta, started).await
            }
            None => {
                self.publish_status(kind);
                Ok(())
            }
        }
    }

    async fn on_snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Result<(), End> {
        let kinds: Vec<TypeKind> = self.types.keys().copied().collect();
        let mut pushed = false;
        for kind in kinds {
            let started = Instant::now();
            let Some(state) = self.types.get_mut(&kind) else {
                continue;
            };
            let delta = state.on_snapshot(snapshot);
            if delta.is_empty() {
                self.publish_status(kind);
            } else {
                pushed = true;
                self.send_timed(kind, snapshot, delta, started).await?;
            }
        }
        if pushed {
            self.metrics
                .push_triggers
                .get_or_create(&TypeLabel::named("ambient"))
                .inc();
            if let Some(published) = snapshot.published_at {
                self.metrics.record_convergence(published.elapsed());
            }
        }
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
            let entry = s.types.entry(kind).or_insert_with(|| TypeStatus {
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
        self.send_timed(kind, snapshot, delta, Instant::now()).await
    }

    async fn send_timed(
        &mut self,
        kind: TypeKind,
        snapshot: &Snapshot,
        delta: Delta,
        started: Instant,
    ) -> Result<(), End> {
        self.sent += 1;
        let nonce = format!("{}-{}-{}", snapshot.generation, self.id, self.sent);
        if let Some(state) = self.types.get_mut(&kind) {
            state.last_nonce = nonce.clone();
        }
        debug!(
            %kind,
            nonce,
            resources = delta.resources.len(),
            removed = delta.removed.len(),
            "push"
        );
        let response = DeltaDiscoveryResponse {
            system_version_info: snapshot.generation.to_string(),
            type_url: kind.type_url().to_string(),
            nonce,
            removed_resources: delta.removed,
            resources: delta
                .resources
                .iter()
                .map(|r| crate::pb::xds::Resource {
                    name: r.name.clone(),
                    version: r.version.clone(),
                    aliases: r.aliases.clone(),
                    resource: Some(r.any()),
                    ttl: None,
                    cache_control: None,
                })
                .collect(),
        };
        let bytes: usize = response
            .resources
            .iter()
            .map(|r| r.resource.as_ref().map_or(0, |a| a.value.len()))
            .sum();
        self.publish_status(kind);
        // A proxy that reads nothing for the idle timeout is dropped: its buffers stay bounded
        // and it reconnects (or not) on its own.
        let sent = match self.idle_timeout {
            Some(idle) => {
                match tokio::time::timeout(idle, self.outbound.send(Ok(response))).await {
                    Ok(sent) => sent,
                    Err(_) => return Err(End::Idle(idle)),
                }
            }
            None => self.outbound.send(Ok(response)).await,
        };
        sent.map_err(|_| End::Closed)?;
        self.metrics.record_push(kind, started.elapsed(), bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ages_are_spread_within_ten_percent() {
        let age = Duration::from_secs(1800);
        let ages: Vec<Duration> = (0..1000).map(|id| jittered(age, id)).collect();
        assert!(
            ages.iter()
                .all(|a| *a >= age.mul_f64(0.9) && *a <= age.mul_f64(1.1))
        );
        // 2,001 possible values for 1,000 streams: most differ, and they cover the range.
        let distinct: std::collections::BTreeSet<_> = ages.iter().collect();
        assert!(distinct.len() > 600, "spread: {} distinct", distinct.len());
        let (low, high) = (ages.iter().min().unwrap(), ages.iter().max().unwrap());
        assert!(
            *low < age.mul_f64(0.92) && *high > age.mul_f64(1.08),
            "{low:?}..{high:?}"
        );
    }
}
