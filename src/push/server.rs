//! The delta ADS service (`DeltaAggregatedResources`) and one task per connected proxy; and
//! istiod's debug over xDS on `StreamAggregatedResources` ([`DebugResponder`]).
//!
//! A connection waits for the first snapshot, answers each type's initial request (even with
//! nothing to send: ztunnel is not ready until it has ACKed every type), answers on-demand
//! subscriptions, and follows new snapshots. It sends one response per type per step; while the
//! client is slow, newer snapshots supersede older ones instead of queueing.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, info_span};

use crate::discovery::names::PerType;
use crate::metrics::Metrics;
use crate::pb::xds::aggregated_discovery_service_server::AggregatedDiscoveryService;
use crate::pb::xds::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use crate::push::indexer::Snapshots;
use crate::push::known::{KnownVersions, Received};
use crate::push::outbound::Responses;
use crate::push::registry::Registry;

use crate::push::connection::Connection;
pub use crate::push::connection::ProxyInfo;
use crate::push::waypoint::WaypointConnection;
use crate::push::waypoint::configs::WaypointConfigs;
use crate::waypoint::{WaypointProxy, WaypointSettings};

/// ztunnel's maximum decoding message size (200 MiB: istio/ztunnel `src/xds/client.rs`). A response
/// whose resources exceed half of it is split in several, so that framing and a growing state never
/// reach the limit. ztunnel counts itself ready at the first ACK of each type, so a split initial
/// response briefly makes it ready on part of the state; at ~400 B per workload this takes some
/// 250,000 workloads, so in practice it does not happen.
pub const MAX_RESPONSE_BYTES: usize = 100 * 1024 * 1024;

pub use crate::push::listener::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, grpc_server, listen};

/// The ADS service: hands each stream to its own connection task.
#[derive(Clone)]
pub struct AdsServer {
    snapshots: Snapshots,
    next_id: Arc<AtomicU64>,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    max_stream_age: Option<Duration>,
    idle_timeout: Option<Duration>,
    removal_grace: Duration,
    max_response_bytes: usize,
    scope_to_node: bool,
    shutdown: CancellationToken,
    request_budget: crate::push::route::RequestBudget,
    debug: Option<Arc<dyn DebugResponder>>,
    waypoints: Arc<WaypointConfigs>,
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
            removal_grace: Duration::ZERO,
            max_response_bytes: MAX_RESPONSE_BYTES,
            scope_to_node: false,
            shutdown: CancellationToken::new(),
            request_budget: crate::push::route::RequestBudget::new(
                crate::push::route::REQUEST_BUDGET_BYTES,
            ),
            debug: None,
            waypoints: Arc::new(WaypointConfigs::new(WaypointSettings::default())),
        }
    }

    /// The waypoint configs to serve from (built with the mesh's trust domain, DNS domain
    /// and root namespace), shared with the other port's server; the default settings' own
    /// otherwise.
    pub fn with_waypoint_configs(mut self, configs: Arc<WaypointConfigs>) -> Self {
        self.waypoints = configs;
        self
    }

    /// The waypoint configs this server shares between a waypoint's streams.
    pub fn waypoint_configs(&self) -> Arc<WaypointConfigs> {
        self.waypoints.clone()
    }

    /// How many bytes of large requests all streams may be reading and decoding at once
    /// (default [`crate::push::route::REQUEST_BUDGET_BYTES`]).
    pub fn with_request_budget(mut self, bytes: usize) -> Self {
        self.request_budget = crate::push::route::RequestBudget::new(bytes);
        self
    }

    /// The shared budget for large requests.
    pub fn request_budget(&self) -> crate::push::route::RequestBudget {
        self.request_budget.clone()
    }

    /// Node-scoped mode: a proxy that names its node (metadata `NODE_NAME`) gets its node's
    /// workloads, the services they are part of, the waypoints those use and the waypoints' own
    /// workloads, plus whatever it asks for on demand; Authorization stays complete. Meant for
    /// ztunnel with `XDS_ON_DEMAND=true`: a wildcard ztunnel never asks for what it lacks.
    pub fn with_scope_to_node(mut self, scope: bool) -> Self {
        self.scope_to_node = scope;
        self
    }

    /// Ends every stream (with `Unavailable`, as at the maximum age) when `shutdown` fires, so that the
    /// server's graceful shutdown is not held open by streams that never end on their own.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Splits responses whose resources exceed `bytes` (default [`MAX_RESPONSE_BYTES`]).
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes.max(1);
        self
    }

    /// Drops a stream whose proxy, while changes wait for it, has neither read the queued
    /// response nor acknowledged the last one for `idle`; `None` never.
    pub fn with_idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle_timeout = idle.filter(|i| !i.is_zero());
        self
    }

    /// A reconnecting wildcard proxy's names that this replica lacks are removed only if they
    /// still do not exist `grace` later (zero: with the first response), so a proxy that moves
    /// to a replica a few events behind the one it left does not lose what was just created.
    pub fn with_reconnect_removal_grace(mut self, grace: Duration) -> Self {
        self.removal_grace = grace;
        self
    }

    /// Ends each stream after about `age` (±10 %, so proxies do not all return at once), so that
    /// proxies reconnect and spread over the replicas. With content-hash versions a reconnect
    /// re-sends nothing unchanged. `None`: streams live as long as the proxy keeps them.
    pub fn with_max_stream_age(mut self, age: Option<Duration>) -> Self {
        self.max_stream_age = age.filter(|a| !a.is_zero());
        self
    }

    /// Serves istiod's debug types over state-of-the-world ADS with `debug`; without it,
    /// `StreamAggregatedResources` answers `Unimplemented`.
    pub fn with_debug(mut self, debug: Arc<dyn DebugResponder>) -> Self {
        self.debug = Some(debug);
        self
    }

    /// The tonic service, without compression (ztunnel supports none), framing responses
    /// itself ([`crate::push::route`]).
    pub fn into_service(self) -> crate::push::route::AdsService {
        crate::push::route::AdsService::new(self)
    }
}

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;

/// The type URLs of istiod's debug over xDS: `istio.io/debug` (a debug endpoint named by the
/// resource name), `istio.io/debug/syncz` and `istio.io/debug/config_dump`.
pub const DEBUG_TYPE: &str = "istio.io/debug";

/// Who opened a stream on the TLS port, as the 15012 guard authenticated them: a request
/// extension, absent on the plaintext port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedCaller {
    /// `spiffe://<td>/ns/<ns>/sa/<sa>`.
    pub identity: String,
    pub namespace: String,
}

/// Answers istiod's debug requests over state-of-the-world ADS (`istioctl proxy-status`,
/// `istioctl version`, `istioctl x internal-debug`).
#[tonic::async_trait]
pub trait DebugResponder: Send + Sync + 'static {
    /// The response to one request of a [`DEBUG_TYPE`] type, or why it is refused.
    async fn respond(
        &self,
        caller: Option<&VerifiedCaller>,
        request: &DiscoveryRequest,
    ) -> Result<DiscoveryResponse, Status>;
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = SotwStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    /// State of the world serves only istiod's debug types: each request (not its ACK) gets
    /// one response; any other type ends the stream with `Unimplemented`.
    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let Some(debug) = self.debug.clone() else {
            return Err(Status::unimplemented(NOT_DEBUG));
        };
        let caller = request.extensions().get::<VerifiedCaller>().cloned();
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            let mut nonce = 0u64;
            while let Some(request) = requests.next().await {
                let request = match request {
                    Ok(request) => request,
                    Err(_) => return,
                };
                if !request.type_url.starts_with(DEBUG_TYPE) {
                    let _ = tx.send(Err(Status::unimplemented(NOT_DEBUG))).await;
                    return;
                }
                // An ACK (or a NACK) of a response already sent.
                if !request.response_nonce.is_empty() {
                    continue;
                }
                nonce += 1;
                let response = debug.respond(caller.as_ref(), &request).await.map(|mut r| {
                    r.type_url = request.type_url.clone();
                    r.nonce = format!("{nonce:x}");
                    r
                });
                let failed = response.is_err();
                if tx.send(response).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let peer = request.remote_addr();
        let inbound = request.into_inner().map(|item| {
            item.map(|mut request| {
                let known = std::mem::take(&mut request.initial_resource_versions);
                (request, KnownVersions::from_map(known))
            })
            .map_err(Inbound::Transport)
        });
        // Only reached through the generated server: `route` serves this method itself,
        // writing the framed responses as they are.
        let responses = self.open(peer, inbound).map(|frame| {
            let frame = frame?;
            DeltaDiscoveryResponse::decode(frame.slice(5..))
                .map_err(|e| Status::internal(format!("re-decoding a response: {e}")))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Why a state-of-the-world request is refused.
const NOT_DEBUG: &str = "ambientd serves delta xDS: use DeltaAggregatedResources \
     (StreamAggregatedResources, state of the world, serves only istio.io/debug types)";

type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

/// A request as a connection reads it: decoded, or why not.
pub enum Inbound {
    /// The stream broke (the proxy went away): nothing to answer.
    Transport(Status),
    /// The proxy sent something that is not a request: answered with this status.
    Invalid(Status),
}

impl AdsServer {
    /// Starts the connection task for one stream of requests; returns its responses.
    pub fn open<S>(&self, peer: Option<std::net::SocketAddr>, inbound: S) -> Responses
    where
        S: Stream<Item = Result<Received, Inbound>> + Send + Unpin + 'static,
    {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let peer = peer.map(|a| a.to_string()).unwrap_or_default();
        let (connection, responses) = self.connection(id, peer.clone());
        let span = info_span!("xds", id, peer);
        let waypoints = self.waypoints.clone();
        // The first request's node says who is calling: a waypoint's Envoy gets its own
        // connection task; everyone else (ztunnel) the usual one. Each task is boxed so
        // that this future stays the size of one pointer while the stream lives.
        // Only pointers are held across the first await (the stream, the connection, the
        // first request are boxed): every idle stream's task keeps this future for its life.
        let mut connection = Box::new(connection);
        let mut inbound = Box::new(inbound);
        let task = async move {
            let first = inbound.next().await.map(Box::new);
            let waypoint = match first.as_deref() {
                Some(Ok((request, _))) => request
                    .node
                    .as_ref()
                    .filter(|node| WaypointProxy::is_waypoint(node))
                    .map(WaypointProxy::from_node),
                _ => None,
            };
            match waypoint {
                Some(Ok(proxy)) => {
                    let Some(Ok(first)) = first.map(|f| *f) else {
                        return;
                    };
                    let waypoint = waypoint_connection(*connection, proxy, waypoints);
                    Box::pin(Box::new(waypoint).run(first, inbound)).await;
                }
                Some(Err(why)) => connection.outbound.end_with(Status::invalid_argument(why)),
                None => {
                    connection.first = first;
                    Box::pin(connection.run(inbound)).await;
                }
            }
        };
        tokio::spawn(task.instrument(span));
        responses
    }
}

/// A waypoint's connection, taking over a stream's outbound queue and registry entry.
fn waypoint_connection(
    connection: Connection,
    proxy: WaypointProxy,
    configs: Arc<WaypointConfigs>,
) -> WaypointConnection {
    WaypointConnection {
        id: connection.id,
        snapshots: connection.snapshots,
        configs,
        outbound: connection.outbound,
        status: connection.status,
        metrics: connection.metrics,
        shutdown: connection.shutdown,
        expires: connection.expires,
        proxy,
        latest: None,
        config: None,
        entry: None,
        types: Default::default(),
        synced: Default::default(),
        dirty: Default::default(),
        sent: 0,
        eds_after_cds: Default::default(),
    }
}

impl AdsServer {
    fn connection(&self, id: u64, peer: String) -> (Connection, Responses) {
        let (outbound, responses) = crate::push::outbound::queue();
        let connection = Connection {
            id,
            snapshots: self.snapshots.clone(),
            latest: None,
            dirty: BTreeSet::new(),
            pushed: false,
            outbound,
            first: None,
            types: PerType::new(),
            proxy: None,
            sent: 0,
            status: self.registry.register(id, peer),
            metrics: self.metrics.clone(),
            expires: self.max_stream_age.map(|age| jittered(age, id)),
            idle_timeout: self.idle_timeout,
            max_response_bytes: self.max_response_bytes,
            removal_grace: self.removal_grace,
            scope_to_node: self.scope_to_node,
            shutdown: self.shutdown.clone(),
        };
        (connection, responses)
    }
}

/// `age` ±10 %, spread by connection id so that streams opened together end apart.
fn jittered(age: Duration, id: u64) -> Duration {
    let spread = xxhash_rust::xxh64::xxh64(&id.to_le_bytes(), 0) % 2001; // 0..=2000
    let factor = 0.9 + spread as f64 / 10_000.0; // 0.9..=1.1
    age.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_id_is_the_third_segment_of_the_node_id_as_istiod_parses_it() {
        let proxy = |id: &str| ProxyInfo {
            id: id.into(),
            name: "ztunnel-x7k2p".into(),
            namespace: "istio-system".into(),
            node_name: String::new(),
            cluster_id: String::new(),
            version: String::new(),
        };
        let node = "ztunnel~10.244.1.2~zt-abc.kube-system~kube-system.svc.cluster.local";
        assert_eq!(proxy(node).proxy_id(), "zt-abc.kube-system");
        // Not istiod's four-part form: the metadata names the pod.
        assert_eq!(proxy("ztunnel").proxy_id(), "ztunnel-x7k2p.istio-system");
        assert_eq!(proxy("a~b~~d").proxy_id(), "ztunnel-x7k2p.istio-system");
    }

    /// An idle stream's task holds its `run` future for the stream's life: the request and
    /// push handlers are boxed so that their state is not part of it, and so is the connection
    /// itself (an async fn keeps its arguments twice).
    #[tokio::test]
    async fn an_idle_connection_task_is_small() {
        let (_publish, snapshots) = tokio::sync::watch::channel(None);
        let ads = AdsServer::new(
            snapshots,
            Arc::new(Registry::default()),
            Arc::new(Metrics::new()),
        );
        let (connection, _responses) = ads.connection(1, String::new());
        let inbound = crate::push::route::Requests::new(tonic::body::Body::empty());
        let task = Box::new(connection).run(inbound);
        let size = std::mem::size_of_val(&task);
        eprintln!("connection task: {size} B");
        assert!(size < 1536, "the connection task's future is {size} B");
    }

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
