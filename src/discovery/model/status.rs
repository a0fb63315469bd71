//! The status conditions ambientd writes, as data: which condition on which object, and what
//! it should say. Conversion (`convert::conditions`, `convert::authorization`) decides them; the
//! snapshot carries them; the writer in `src/kube/status_writer.rs` patches them.

use crate::discovery::model::kinds::Key;

/// The condition type istiod writes on an AuthorizationPolicy sent to ztunnel.
pub(crate) const ZTUNNEL_ACCEPTED: &str = "ZtunnelAccepted";
/// The condition type istiod writes on Services, ServiceEntries (and here WorkloadEntries).
pub(crate) const WAYPOINT_BOUND: &str = "istio.io/WaypointBound";
/// The reason of a true `WaypointBound`.
pub(crate) const WAYPOINT_ACCEPTED: &str = "WaypointAccepted";
/// The condition type istiod writes on an AuthorizationPolicy with `targetRef(s)`: whether it
/// binds to a waypoint.
pub(crate) const WAYPOINT_POLICY_ACCEPTED: &str = "WaypointAccepted";
/// The condition type naming a ServiceEntry's resolved visibility, when
/// meshConfig.serviceEntryVisibility is configured.
pub(crate) const VISIBILITY_APPLIED: &str = "istio.io/VisibilityApplied";

/// One condition as istiod computes it: type, status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusCondition {
    /// [`WAYPOINT_BOUND`] or `ZtunnelAccepted`.
    pub condition_type: &'static str,
    /// The condition's status (`"True"` / `"False"` on the object).
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The conditions ambientd writes: each is one condition type on the objects of one kind,
/// kept and written independently of the others (a ServiceEntry can carry two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum StatusKind {
    AuthorizationPolicy,
    Service,
    ServiceEntry,
    WorkloadEntry,
    /// `istio.io/VisibilityApplied` on a ServiceEntry.
    ServiceEntryVisibility,
    /// `WaypointAccepted` on an AuthorizationPolicy with `targetRef(s)`.
    WaypointPolicy,
}

impl StatusKind {
    pub(crate) const ALL: [StatusKind; 6] = [
        StatusKind::AuthorizationPolicy,
        StatusKind::Service,
        StatusKind::ServiceEntry,
        StatusKind::WorkloadEntry,
        StatusKind::ServiceEntryVisibility,
        StatusKind::WaypointPolicy,
    ];

    /// The condition type this one is.
    pub(crate) fn condition_type(self) -> &'static str {
        match self {
            StatusKind::AuthorizationPolicy => ZTUNNEL_ACCEPTED,
            StatusKind::ServiceEntryVisibility => VISIBILITY_APPLIED,
            StatusKind::WaypointPolicy => WAYPOINT_POLICY_ACCEPTED,
            StatusKind::Service | StatusKind::ServiceEntry | StatusKind::WorkloadEntry => {
                WAYPOINT_BOUND
            }
        }
    }

    /// The Kubernetes kind name of the object that carries it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StatusKind::AuthorizationPolicy | StatusKind::WaypointPolicy => "AuthorizationPolicy",
            StatusKind::Service => "Service",
            StatusKind::ServiceEntry | StatusKind::ServiceEntryVisibility => "ServiceEntry",
            StatusKind::WorkloadEntry => "WorkloadEntry",
        }
    }
}

/// An object that may carry a condition.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct StatusTarget {
    pub(crate) kind: StatusKind,
    pub(crate) namespace: Box<str>,
    pub(crate) name: Box<str>,
}

impl StatusTarget {
    pub(crate) fn new(kind: StatusKind, key: &Key) -> Self {
        StatusTarget {
            kind,
            namespace: key.0.as_str().into(),
            name: key.1.as_str().into(),
        }
    }
}

impl std::fmt::Display for StatusTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// What ambientd wants on one existing object: its condition, or `None` when the object must
/// not carry ambientd's condition type (any left from before is removed), with the
/// `metadata.generation` it was computed from (the condition's `observedGeneration`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredStatus {
    pub generation: i64,
    /// Boxed: most objects want none, and the snapshot holds one of these per object.
    pub condition: Option<Box<StatusCondition>>,
}

/// `ZtunnelAccepted` of one AuthorizationPolicy: whether (and how completely) it is
/// sent to ztunnel; the reason is `Accepted` or `UnsupportedValue`.
pub(crate) type PolicyStatus = StatusCondition;
