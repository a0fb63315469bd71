//! The reduced input objects the index reads: only the fields a conversion needs.
//!
//! Sources (manifests or Kubernetes watches) reduce every object to these types right away and
//! apply the API server's defaults, so the index never sees an unset `targetPort` or
//! `serviceAccountName`. A full Pod costs tens of kilobytes; a [`Pod`] here costs a few hundred
//! bytes.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// Labels or annotations.
pub type Labels = BTreeMap<String, String>;

/// The kinds of object the index understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Node,
    Pod,
    Service,
}

impl Kind {
    /// Every kind, in the order a full load applies them (containers before contents).
    pub const ALL: [Kind; 4] = [Kind::Namespace, Kind::Node, Kind::Service, Kind::Pod];

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(self) -> bool {
        matches!(self, Kind::Pod | Kind::Service)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Identifies one object: its kind, namespace (empty when cluster-scoped) and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: Kind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectRef {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// A reduced object of any kind the index reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Namespace(Namespace),
    Node(Node),
    Pod(Pod),
    Service(Service),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Object::Namespace(_) => Kind::Namespace,
            Object::Node(_) => Kind::Node,
            Object::Pod(_) => Kind::Pod,
            Object::Service(_) => Kind::Service,
        }
    }

    pub fn object_ref(&self) -> ObjectRef {
        match self {
            Object::Namespace(n) => ObjectRef::new(Kind::Namespace, "", &n.name),
            Object::Node(n) => ObjectRef::new(Kind::Node, "", &n.name),
            Object::Pod(p) => ObjectRef::new(Kind::Pod, &p.namespace, &p.name),
            Object::Service(s) => ObjectRef::new(Kind::Service, &s.namespace, &s.name),
        }
    }
}

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

/// The controller owner of a pod (`ownerReferences[controller=true]`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// Transport protocol of a port; anything but TCP is kept only to be ignored correctly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

/// A named container port (`spec.containers[*].ports`, plus native sidecar init containers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerPort {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub generate_name: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub owner: Option<Owner>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `status.phase`; the API server starts every pod as `Pending`.
    pub phase: String,
    /// Condition `Ready` is `True`.
    pub ready: bool,
    /// `status.podIPs`, falling back to `status.podIP`, in order.
    pub ips: Vec<IpAddr>,
    /// `spec.serviceAccountName`, defaulted to `default`.
    pub service_account: String,
    pub node_name: String,
    pub host_network: bool,
    /// Named ports of containers and native sidecar init containers, in declaration order.
    pub ports: Vec<ContainerPort>,
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

/// Whether a non-empty `selector` is a subset of `labels`.
pub fn selects(selector: &Labels, labels: &Labels) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What a source tells the index. Both sources (manifests and Kubernetes) speak only this.
// Events are moved once from source to index, never stored in bulk: boxing buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Create or replace one object.
    Apply(Object),
    /// Remove one object.
    Delete(ObjectRef),
    /// The complete current set of one kind (a full list or relist): anything else is gone.
    Reset(Kind, Vec<Object>),
    /// The source has delivered its first full list of every kind.
    Synced,
}
