//! Status conditions ambientd writes on the objects it reads, as istiod does (docs/authorization.md
//! and docs/conversion.md, "Status: `istio.io/WaypointBound`"): `ZtunnelAccepted` on
//! AuthorizationPolicies, `istio.io/WaypointBound` on Services, ServiceEntries and WorkloadEntries.
//!
//! This module only says *what* each object's condition should be. The index keeps the result
//! per object in its snapshot ([`crate::discovery::Snapshot::statuses`]), recomputed with the
//! object's resources, so a waypoint change re-evaluates exactly the objects bound to it. The
//! writer (`src/kube/status.rs`) compares it with what the object carries and patches only the
//! differences; it adds `observedGeneration` and `lastTransitionTime`.

use crate::discovery::convert::authorization::{AuthorizationPolicy, PolicyTargetRef};
use crate::discovery::convert::service::{INGRESS_USE_WAYPOINT, parse_bool};
use crate::discovery::convert::waypoint::{self, Bind, BindError, Binding};
use crate::discovery::model::Labels;
use crate::discovery::model::visibility::Visibility;
use crate::discovery::store::{Key, Store};

/// The condition type istiod writes on Services, ServiceEntries (and here WorkloadEntries).
pub const WAYPOINT_BOUND: &str = "istio.io/WaypointBound";
/// The reason of a true `WaypointBound`.
pub const WAYPOINT_ACCEPTED: &str = "WaypointAccepted";
/// The condition type istiod writes on an AuthorizationPolicy with `targetRef(s)`: whether it
/// binds to a waypoint.
pub const WAYPOINT_POLICY_ACCEPTED: &str = "WaypointAccepted";
/// The GatewayClass controller of waypoints.
const MESH_CONTROLLER: &str = "istio.io/mesh-controller";
/// The condition type naming a ServiceEntry's resolved visibility, when
/// meshConfig.serviceEntryVisibility is configured.
pub const VISIBILITY_APPLIED: &str = "istio.io/VisibilityApplied";

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
pub enum StatusKind {
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
    pub const ALL: [StatusKind; 6] = [
        StatusKind::AuthorizationPolicy,
        StatusKind::Service,
        StatusKind::ServiceEntry,
        StatusKind::WorkloadEntry,
        StatusKind::ServiceEntryVisibility,
        StatusKind::WaypointPolicy,
    ];

    /// The condition type this one is.
    pub fn condition_type(self) -> &'static str {
        match self {
            StatusKind::AuthorizationPolicy => {
                crate::discovery::convert::authorization::ZTUNNEL_ACCEPTED
            }
            StatusKind::ServiceEntryVisibility => VISIBILITY_APPLIED,
            StatusKind::WaypointPolicy => WAYPOINT_POLICY_ACCEPTED,
            StatusKind::Service | StatusKind::ServiceEntry | StatusKind::WorkloadEntry => {
                WAYPOINT_BOUND
            }
        }
    }

    /// The Kubernetes kind name of the object that carries it.
    pub fn as_str(self) -> &'static str {
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
pub struct StatusTarget {
    pub kind: StatusKind,
    pub namespace: Box<str>,
    pub name: Box<str>,
}

impl StatusTarget {
    pub fn new(kind: StatusKind, key: &Key) -> Self {
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

/// `istio.io/WaypointBound` of a Service or ServiceEntry with these labels: true naming the
/// waypoint (and how ingress uses it), false with the reason a requested waypoint is not used,
/// none when no waypoint is asked for. Waypoints consulted are pushed to `reads`. `local_only`:
/// a ServiceEntry of NAMESPACE visibility, refused a waypoint of another namespace.
pub fn service_waypoint_bound(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    local_only: bool,
    reads: &mut Vec<Key>,
) -> Option<StatusCondition> {
    if waypoint::never_uses_waypoint(labels) {
        return None;
    }
    let binding = waypoint::service_binding(store, namespace, labels, local_only, reads);
    let ingress = labels
        .get(INGRESS_USE_WAYPOINT)
        .or_else(|| store.namespace_labels(namespace)?.get(INGRESS_USE_WAYPOINT))
        .map(parse_bool);
    waypoint_bound(&binding, ingress)
}

/// `istio.io/VisibilityApplied` of a ServiceEntry in `namespace`: true, with the resolved
/// visibility as the reason (`Public` or `Namespace`), when meshConfig.serviceEntryVisibility
/// is configured. None otherwise, and none for visibility NONE (istiod publishes nothing for
/// such an entry, so it has no status to report: Istio documents this as a known limitation).
pub fn visibility_applied(store: &Store, namespace: &str) -> Option<StatusCondition> {
    let visibility = store.entry_visibility(namespace)?;
    if visibility == Visibility::None {
        return None;
    }
    Some(StatusCondition {
        condition_type: VISIBILITY_APPLIED,
        status: true,
        reason: visibility.as_reason().to_string(),
        message: format!(
            "ServiceEntry visibility resolved to {} by meshConfig.serviceEntryVisibility",
            visibility.as_reason()
        ),
    })
}

/// `WaypointAccepted` of an AuthorizationPolicy with `targetRef(s)` (istiod's
/// `WaypointPolicyStatusCollection`, flattened as its `flattenConditions`): for each target,
/// whether it binds to a waypoint; none for a policy without targets. Waypoints consulted are
/// pushed to `reads`.
pub fn waypoint_policy_accepted(
    root_namespace: &str,
    store: &Store,
    policy: &AuthorizationPolicy,
    reads: &mut Vec<Key>,
) -> Option<StatusCondition> {
    if policy.target_refs.is_empty() {
        return None;
    }
    let bindings: Vec<PolicyBinding> = policy
        .target_refs
        .iter()
        .map(|target| policy_binding(root_namespace, store, policy, target, reads))
        .collect();
    let (status, reason, message) = match &bindings[..] {
        [one] => (one.bound, one.reason.clone(), one.message.clone()),
        many => {
            let unbound: Vec<&str> = many
                .iter()
                .filter(|b| !b.bound)
                .map(|b| b.ancestor.as_str())
                .collect();
            let any_bound = unbound.len() < many.len();
            let reason = match (any_bound, unbound.is_empty()) {
                (true, true) => "Accepted",
                (true, false) => "PartiallyInvalid",
                (false, _) => "Invalid",
            };
            let message = if unbound.is_empty() {
                String::new()
            } else {
                format!("Invalid targetRefs: {}", unbound.join(", "))
            };
            (any_bound, reason.to_string(), message)
        }
    };
    Some(StatusCondition {
        condition_type: WAYPOINT_POLICY_ACCEPTED,
        status,
        reason,
        message,
    })
}

/// One target's binding, as istiod's `PolicyBindingStatus`.
struct PolicyBinding {
    /// `<Kind>.<group, or core>:<namespace>/<name>`.
    ancestor: String,
    reason: String,
    message: String,
    bound: bool,
}

fn policy_binding(
    root_namespace: &str,
    store: &Store,
    policy: &AuthorizationPolicy,
    target: &PolicyTargetRef,
    reads: &mut Vec<Key>,
) -> PolicyBinding {
    let namespace = if target.namespace.is_empty() {
        policy.namespace.as_str()
    } else {
        target.namespace.as_str()
    };
    let key = (namespace.to_string(), target.name.clone());
    let named = format!("{namespace}/{}", target.name);
    let service_bound = |kind: &str, labels: Option<&Labels>, local_only: bool, reads: &mut _| {
        let Some(labels) = labels else {
            return (
                false,
                "TargetNotFound",
                format!("{kind} {named} was not found"),
            );
        };
        let binding = if waypoint::never_uses_waypoint(labels) {
            Binding::Unbound
        } else {
            waypoint::service_binding(store, namespace, labels, local_only, reads)
        };
        match binding {
            Binding::Bound { key: wp, .. } => {
                (true, "Accepted", format!("bound to {}/{}", wp.0, wp.1))
            }
            _ => (
                false,
                "AncestorNotBound",
                format!("{kind} {named} is not bound to a waypoint"),
            ),
        }
    };
    let (bound, reason, message) = match target.kind.as_str() {
        "Gateway" => {
            reads.push(key.clone());
            if store.waypoints.contains_key(&key) {
                (true, "Accepted", format!("bound to {named}"))
            } else {
                (false, "TargetNotFound", "not bound".to_string())
            }
        }
        "Service" => service_bound(
            "Service",
            store.services.get(&key).map(|s| &s.labels),
            false,
            reads,
        ),
        "ServiceEntry" => service_bound(
            "ServiceEntry",
            store.service_entries.get(&key).map(|se| &se.labels),
            store.entries_namespace_local(namespace),
            reads,
        ),
        "GatewayClass" if policy.namespace != root_namespace => (
            false,
            "Invalid",
            format!(
                "AuthorizationPolicy must be in the root namespace `{root_namespace}` when \
                 referencing a GatewayClass"
            ),
        ),
        "GatewayClass" => match store.gateway_classes.get(&target.name) {
            None => (false, "TargetNotFound", "not bound".to_string()),
            Some(class) if class.controller_name != MESH_CONTROLLER => (
                false,
                "Invalid",
                format!("GatewayClass must use controller name `{MESH_CONTROLLER}` for waypoints"),
            ),
            Some(_) => (true, "Accepted", format!("bound to {}", target.name)),
        },
        _ => (false, "unknown", "not bound".to_string()),
    };
    let group = if target.group.is_empty() {
        "core"
    } else {
        target.group.as_str()
    };
    PolicyBinding {
        ancestor: format!("{}.{group}:{named}", target.kind),
        reason: reason.to_string(),
        message,
        bound,
    }
}

/// `istio.io/WaypointBound` of a WorkloadEntry: as for a service, with workload traffic (a
/// service-only waypoint inherited from the namespace is no error, only no waypoint).
pub fn workload_waypoint_bound(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    reads: &mut Vec<Key>,
) -> Option<StatusCondition> {
    let (binding, _) = waypoint::workload_binding(store, namespace, labels, reads);
    waypoint_bound(&binding, None)
}

/// The condition for a binding outcome. `ingress` is the parsed `istio.io/ingress-use-waypoint`
/// label (the object's, else its namespace's), when present.
pub fn waypoint_bound(binding: &Binding, ingress: Option<bool>) -> Option<StatusCondition> {
    let (status, reason, message) = match binding {
        Binding::Unbound => return None,
        Binding::Bound { key, .. } => {
            let mut message = format!("Successfully attached to waypoint {}/{}", key.0, key.1);
            match ingress {
                Some(true) => message.push_str(". Ingress traffic will traverse the waypoint"),
                Some(false) => message.push_str(
                    ". Ingress traffic is not using the waypoint, set the \
                     istio.io/ingress-use-waypoint label to true if desired.",
                ),
                None => {}
            }
            (true, WAYPOINT_ACCEPTED, message)
        }
        Binding::Failed(BindError::NotReady(key)) => (
            false,
            "WaypointIsNotReady",
            format!("waypoint {:?} is not ready", resource_name(key)),
        ),
        Binding::Failed(BindError::AttachmentDenied(key)) => (
            false,
            "AttachmentDenied",
            format!(
                "we are not permitted to attach to waypoint {:?} (missing allowedRoutes?)",
                resource_name(key)
            ),
        ),
        Binding::Failed(BindError::CrossNamespaceForbidden(key)) => (
            false,
            "CrossNamespaceWaypointForbidden",
            format!(
                "cannot bind to waypoint {:?} in another namespace: cross-namespace waypoint \
                 binding is not permitted for a ServiceEntry with NAMESPACE visibility",
                resource_name(key)
            ),
        ),
        Binding::Failed(BindError::UnsupportedTrafficType(key, bind)) => (
            false,
            "UnsupportedTrafficType",
            format!(
                "attempting to bind to traffic type {:?} which the waypoint {:?} does not support",
                match bind {
                    Bind::Service => "service",
                    Bind::Workload => "workload",
                },
                resource_name(key)
            ),
        ),
    };
    Some(StatusCondition {
        condition_type: WAYPOINT_BOUND,
        status,
        reason: reason.to_string(),
        message,
    })
}

/// A waypoint as istiod names it in messages: `<namespace>/<name>`.
fn resource_name(key: &Key) -> String {
    format!("{}/{}", key.0, key.1)
}
