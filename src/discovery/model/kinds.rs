//! The reduced Kubernetes and Istio objects (all but Pods and policies, which have modules of
//! their own): only the fields a conversion needs, with the API server's defaults applied.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::discovery::model::labels::Labels;

/// The label on the system namespace (and on east-west Gateways) that names a network.
pub(crate) const NETWORK_LABEL: &str = "topology.istio.io/network";

/// `(namespace, name)`: how stored objects of one kind are keyed.
pub(crate) type Key = (String, String);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub name: String,
    pub labels: Labels,
}

/// Transport protocol of a port; anything but TCP is kept only to be ignored correctly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

/// A Service port's `targetPort`: a number, or the name of a container port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    Number(u16),
    Name(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServicePort {
    pub name: String,
    pub port: u16,
    pub target_port: TargetPort,
    pub protocol: Protocol,
    pub app_protocol: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    pub name: String,
    pub namespace: String,
    /// `metadata.generation` (0 when unset): the `observedGeneration` of its status condition.
    pub generation: i64,
    pub labels: Labels,
    pub annotations: Labels,
    /// `spec.type: ExternalName`; such services produce nothing.
    pub external_name: bool,
    /// `spec.clusterIPs` (or `[clusterIP]`), without `None`: empty for a headless service.
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    /// `spec.selector`; empty selects nothing.
    pub selector: Labels,
    /// `spec.internalTrafficPolicy: Local`.
    pub internal_traffic_local: bool,
    pub traffic_distribution: Option<String>,
    pub publish_not_ready_addresses: bool,
    /// `spec.ipFamilies`, defaulted from the cluster IPs.
    pub ip_families: Vec<IpFamily>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamily {
    V4,
    V6,
}

/// `discovery.k8s.io/v1` EndpointSlice: only slices labelled `kubernetes.io/service-name` matter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointSlice {
    pub name: String,
    pub namespace: String,
    /// The `kubernetes.io/service-name` label.
    pub service_name: Option<String>,
    /// `FQDN` slices are ignored.
    pub fqdn: bool,
    pub endpoints: Vec<SliceEndpoint>,
    pub ports: Vec<SlicePort>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceEndpoint {
    /// Empty for an FQDN slice, and when any address is not an IP (istiod skips such an
    /// endpoint, not the slice).
    pub addresses: Vec<IpAddr>,
    /// `conditions.ready`; unset counts as ready.
    pub ready: Option<bool>,
    pub target_ref: Option<TargetRef>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TargetRef {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlicePort {
    pub name: Option<String>,
    pub port: Option<u16>,
    pub protocol: Protocol,
}

/// `networking.istio.io` ServiceEntry resolution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Resolution {
    #[default]
    None,
    Static,
    Dns,
    DnsRoundRobin,
    DynamicDns,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceEntryPort {
    pub name: String,
    pub number: u16,
    /// `targetPort`, unset as `None`.
    pub target_port: Option<u16>,
    pub protocol: String,
}

/// A ServiceEntry endpoint (or the spec of a WorkloadEntry: the same shape).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoint {
    /// An IP, or a hostname.
    pub address: String,
    /// Port name -> number.
    pub ports: BTreeMap<String, u16>,
    pub labels: Labels,
    pub network: String,
    pub locality: String,
    pub weight: u32,
    pub service_account: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceEntry {
    pub name: String,
    pub namespace: String,
    /// `metadata.generation` (0 when unset): the `observedGeneration` of its status condition.
    pub generation: i64,
    pub labels: Labels,
    pub annotations: Labels,
    /// `metadata.creationTimestamp` (RFC 3339): the oldest wins hostname conflicts.
    pub created: String,
    pub hosts: Vec<String>,
    /// `spec.addresses` as written: IPs or CIDRs.
    pub addresses: Vec<String>,
    pub ports: Vec<ServiceEntryPort>,
    pub resolution: Resolution,
    pub endpoints: Vec<Endpoint>,
    pub workload_selector: Option<Labels>,
    pub subject_alt_names: Vec<String>,
    /// `status.addresses`: `(host, ip)` auto-allocated by istiod's allocator.
    pub allocated: Vec<(String, IpAddr)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadEntry {
    pub name: String,
    pub namespace: String,
    /// `metadata.generation` (0 when unset): the `observedGeneration` of its status condition.
    pub generation: i64,
    /// `merge(spec.labels, metadata.labels)`, metadata winning.
    pub labels: Labels,
    pub annotations: Labels,
    pub endpoint: Endpoint,
    /// `metadata.labels["istio.io/rev"]`: istiod's revision filter reads the object's own
    /// labels, never `spec.labels`.
    pub revision: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GatewayClass {
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// `spec.controllerName` (`istio.io/mesh-controller` for waypoints).
    pub controller_name: String,
}

/// Which namespaces a listener admits routes (and waypoint bindings) from.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum AllowedNamespaces {
    /// Also what an unknown `from` value means (istiod's default case).
    #[default]
    Same,
    All,
    /// Namespaces whose labels match the selector.
    Selector(NamespaceSelector),
}

/// A `metav1.LabelSelector` as Go's `LabelSelectorAsSelector` reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum NamespaceSelector {
    /// No selector (`labels.Nothing()`), or one Go rejects (an unknown operator, `In`/`NotIn`
    /// without values, `Exists`/`DoesNotExist` with some): admits no namespace.
    #[default]
    Nothing,
    /// `matchLabels` and `matchExpressions`, all required; both empty (`{}`) admits every
    /// namespace.
    Match {
        labels: Labels,
        expressions: Vec<LabelRequirement>,
    },
}

impl NamespaceSelector {
    /// A selector of `matchLabels` only.
    #[cfg(test)]
    pub(crate) fn labels(labels: Labels) -> Self {
        NamespaceSelector::Match {
            labels,
            expressions: Vec::new(),
        }
    }

    pub(crate) fn matches(&self, labels: &Labels) -> bool {
        match self {
            NamespaceSelector::Nothing => false,
            NamespaceSelector::Match {
                labels: wanted,
                expressions,
            } => {
                wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
                    && expressions.iter().all(|e| e.matches(labels))
            }
        }
    }
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: LabelOperator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl LabelRequirement {
    pub(crate) fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        let listed = value.is_some_and(|v| self.values.iter().any(|w| w == v));
        match self.operator {
            LabelOperator::In => listed,
            // An absent label is not in the set.
            LabelOperator::NotIn => !listed,
            LabelOperator::Exists => value.is_some(),
            LabelOperator::DoesNotExist => value.is_none(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listener {
    pub name: String,
    pub port: u16,
    pub protocol: String,
    /// `allowedRoutes.namespaces`; `None` when unset (which means Same).
    pub allowed: Option<AllowedNamespaces>,
}

/// A `gateway.networking.k8s.io` Gateway (waypoints are Gateways).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gateway {
    pub name: String,
    pub namespace: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub class_name: String,
    pub listeners: Vec<Listener>,
    /// `status.addresses` as `(type, value)`; empty until the gateway is ready.
    pub addresses: Vec<(String, String)>,
}

/// Whether a non-empty `selector` is a subset of `labels`.
pub(crate) fn selects(selector: &Labels, labels: &Labels) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}
