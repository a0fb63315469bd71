//! A `networking.istio.io` DestinationRule, reduced to the traffic policy a waypoint applies to
//! the clusters of a Service bound to it (docs/waypoint.md, "DestinationRule"). Which rule
//! applies, and what it becomes in Envoy, is `crate::waypoint::destination_rule` and
//! `crate::waypoint::traffic_policy`; the index only stores rules and hands them on.

use std::cmp::Ordering;
use std::time::Duration;

use crate::discovery::model::labels::Labels;

/// A DestinationRule: its host, scope and traffic policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DestinationRule {
    pub name: String,
    pub namespace: String,
    /// The `istio.io/rev` label, if any.
    pub revision: Option<String>,
    /// `metadata.creationTimestamp` as written (RFC 3339, UTC). `None` sorts as oldest, as
    /// Go's zero time does.
    pub creation: Option<String>,
    /// `spec.host` as written (a short name is resolved against the rule's namespace when
    /// matched).
    pub host: String,
    /// `spec.exportTo` as written (`*`, `.`, `~` or namespaces); empty: the default (`*`).
    pub export_to: Vec<String>,
    /// `spec.workloadSelector.matchLabels`: `None` without one. A rule with a selector is for
    /// the selected sidecars' outbound traffic and never applies at a waypoint.
    pub workload_selector: Option<Labels>,
    /// Boxed: a rule is otherwise the largest [`crate::discovery::Object`] by far.
    pub traffic_policy: Option<Box<TrafficPolicy>>,
    pub subsets: Vec<Subset>,
}

impl DestinationRule {
    /// istiod's order among rules for the same host (`sortConfigBySelectorAndCreationTime`):
    /// oldest first, then by name and namespace. The first top-level policy wins a merge.
    pub(crate) fn age_order(&self, other: &Self) -> Ordering {
        (&self.creation, &self.name, &self.namespace).cmp(&(
            &other.creation,
            &other.name,
            &other.namespace,
        ))
    }
}

/// A named subset: the endpoints with these labels, with its own policy on top of the rule's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subset {
    pub name: String,
    pub labels: Labels,
    pub traffic_policy: Option<TrafficPolicy>,
}

/// `trafficPolicy`: each part is `None` when not written (Envoy's or istiod's default then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrafficPolicy {
    pub load_balancer: Option<LoadBalancer>,
    pub connection_pool: Option<ConnectionPool>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTls>,
    /// `portLevelSettings`, in order; always empty inside a port-level policy.
    pub port_level: Vec<PortTrafficPolicy>,
}

/// One `portLevelSettings` entry: replaces the top-level policy for that service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortTrafficPolicy {
    pub port: u32,
    pub policy: TrafficPolicy,
}

/// `loadBalancer`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadBalancer {
    /// `simple`; `None` when `consistentHash` (or nothing) is set.
    pub simple: Option<SimpleLb>,
    pub consistent_hash: Option<ConsistentHash>,
    /// Slow start for round robin and least request.
    pub warmup: Option<Warmup>,
}

/// `loadBalancer.warmup`, or the deprecated `warmupDurationSecs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Warmup {
    pub duration: Duration,
    /// From `warmupDurationSecs`: the window alone, without istiod's aggression (1.0) and
    /// minimum weight (10 %).
    pub window_only: bool,
}

/// `loadBalancer.simple`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SimpleLb {
    /// `UNSPECIFIED`: istiod's default, least request.
    #[default]
    Unspecified,
    /// `LEAST_CONN` (deprecated) and `LEAST_REQUEST`.
    LeastRequest,
    Random,
    /// `PASSTHROUGH`: to the original destination, no load balancing.
    Passthrough,
    RoundRobin,
}

/// `loadBalancer.consistentHash`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsistentHash {
    pub key: HashKey,
    pub algorithm: HashAlgorithm,
}

/// What a consistent hash hashes (read so a route can use it; the cluster needs only the
/// algorithm).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HashKey {
    #[default]
    None,
    Header(String),
    Cookie {
        name: String,
        path: String,
        ttl: Option<Duration>,
    },
    SourceIp,
    QueryParameter(String),
}

/// The hashing algorithm of a consistent hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlgorithm {
    /// `ringHash`, with its `minimumRingSize` (0: Envoy's default).
    RingHash { minimum_ring_size: u64 },
    /// `maglev`, with its `tableSize` (0: Envoy's default).
    Maglev { table_size: u64 },
    /// Neither: a ring hash with the deprecated `minimumRingSize` (0: 1024, as istiod).
    Default { minimum_ring_size: u64 },
}

impl Default for HashAlgorithm {
    fn default() -> Self {
        HashAlgorithm::Default {
            minimum_ring_size: 0,
        }
    }
}

/// `connectionPool`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionPool {
    pub tcp: Option<TcpSettings>,
    pub http: Option<HttpSettings>,
}

/// `connectionPool.tcp`. Zero counts mean "not set", as istiod reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpSettings {
    pub max_connections: u32,
    pub connect_timeout: Option<Duration>,
    pub tcp_keepalive: Option<TcpKeepalive>,
    pub max_connection_duration: Option<Duration>,
    pub idle_timeout: Option<Duration>,
}

/// `connectionPool.tcp.tcpKeepalive`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TcpKeepalive {
    pub probes: u32,
    pub time: Option<Duration>,
    pub interval: Option<Duration>,
}

/// `connectionPool.http`. Zero counts mean "not set", as istiod reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HttpSettings {
    pub http1_max_pending_requests: u32,
    pub http2_max_requests: u32,
    pub max_requests_per_connection: u32,
    pub max_retries: u32,
    pub max_concurrent_streams: u32,
    pub idle_timeout: Option<Duration>,
    pub h2_upgrade_policy: H2UpgradePolicy,
    pub use_client_protocol: bool,
}

/// `connectionPool.http.h2UpgradePolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum H2UpgradePolicy {
    /// `DEFAULT`: the mesh's (`DO_NOT_UPGRADE`).
    #[default]
    Default,
    DoNotUpgrade,
    Upgrade,
}

/// `outlierDetection`. Counts are `None` when not written (`UInt32Value` in the API).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutlierDetection {
    pub consecutive_5xx_errors: Option<u32>,
    pub consecutive_gateway_errors: Option<u32>,
    pub interval: Option<Duration>,
    pub base_ejection_time: Option<Duration>,
    pub max_ejection_percent: u32,
    pub min_health_percent: u32,
    pub split_external_local_origin_errors: bool,
    pub consecutive_local_origin_failures: Option<u32>,
}

/// `tls` (ClientTLSSettings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTls {
    pub mode: TlsMode,
    pub client_certificate: String,
    pub private_key: String,
    pub ca_certificates: String,
    pub credential_name: String,
    pub subject_alt_names: Vec<String>,
    pub sni: String,
    pub insecure_skip_verify: bool,
}

/// `tls.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsMode {
    #[default]
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}
