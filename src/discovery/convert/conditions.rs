//! Status conditions ambientd writes on the objects it reads, as istiod does (docs/authorization.md
//! and docs/conversion.md, "Status: `istio.io/WaypointBound`"): `ZtunnelAccepted` on
//! AuthorizationPolicies, `istio.io/WaypointBound` on Services, ServiceEntries and WorkloadEntries.
//!
//! This module only says *what* each object's condition should be. The index keeps the result
//! per object in its snapshot ([`crate::discovery::Snapshot::statuses`]), recomputed with the
//! object's resources, so a waypoint change re-evaluates exactly the objects bound to it. The
//! writer (`src/kube/status_writer.rs`) compares it with what the object carries and patches only the
//! differences; it adds `observedGeneration` and `lastTransitionTime`.

use crate::discovery::convert::service::{INGRESS_USE_WAYPOINT, parse_bool};
use crate::discovery::convert::waypoint::{self, BindError, Binding};
use crate::discovery::convert::waypoint_authorization;
use crate::discovery::model::Key;
use crate::discovery::model::Labels;
use crate::discovery::model::authorization::{AuthorizationPolicy, PolicyAction, PolicyTargetRef};
use crate::discovery::model::status::{
    StatusCondition, VISIBILITY_APPLIED, WAYPOINT_ACCEPTED, WAYPOINT_BOUND,
    WAYPOINT_POLICY_ACCEPTED,
};
use crate::discovery::model::visibility::Visibility;
use crate::discovery::model::waypoint::Bind;
use crate::discovery::store::Store;

/// The GatewayClass controller of waypoints.
const MESH_CONTROLLER: &str = "istio.io/mesh-controller";

/// `istio.io/WaypointBound` of a Service or ServiceEntry with these labels: true naming the
/// waypoint (and how ingress uses it), false with the reason a requested waypoint is not used,
/// none when no waypoint is asked for. Waypoints consulted are pushed to `reads`. `local_only`:
/// a ServiceEntry of NAMESPACE visibility, refused a waypoint of another namespace.
pub(crate) fn service_waypoint_bound(
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
pub(crate) fn visibility_applied(store: &Store, namespace: &str) -> Option<StatusCondition> {
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
pub(crate) fn waypoint_policy_accepted(
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
    let (status, reason, message) = if status {
        expressed(policy, reason, message)
    } else {
        (status, reason, message)
    };
    Some(StatusCondition {
        condition_type: WAYPOINT_POLICY_ACCEPTED,
        status,
        reason,
        message,
    })
}

/// Kubernetes caps `Condition.message` at 32768 bytes.
const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// How many invalid values the message names before summarising.
const MAX_INVALID_LISTED: usize = 5;
const MORE_RESTRICTIVE: &str = "This will be more restrictive than requested.";

/// A bound policy's condition, with what its waypoint cannot express in full (istiod's
/// `WaypointAccepted` says nothing of it; this follows `ZtunnelAccepted`'s wording). A policy
/// the waypoint does not enforce at all (AUDIT, dry-run) is False with reason `Invalid`; one it
/// enforces more strictly than written (unsupported conditions, invalid values, CUSTOM and
/// unknown actions) is True with istiod's `PartiallyInvalid`; HTTP attributes, which only
/// HTTP ports can match, are named without changing the reason.
fn expressed(
    policy: &AuthorizationPolicy,
    reason: String,
    binding: String,
) -> (bool, String, String) {
    let join = |parts: Vec<String>| {
        let mut message = if binding.is_empty() {
            parts.join(" ")
        } else {
            format!("{binding}. {}", parts.join(" "))
        };
        if message.len() > MAX_MESSAGE_BYTES {
            let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        message
    };
    let action = waypoint_authorization::action_note(policy);
    if let Some((false, note)) = action {
        return (false, "Invalid".to_string(), join(vec![note]));
    }
    let allow = policy.action == PolicyAction::Allow;
    let found = waypoint_authorization::unexpressed(policy);
    let partial = action.is_some() || !found.unsupported.is_empty() || !found.invalid.is_empty();
    let mut parts: Vec<String> = action.into_iter().map(|(_, note)| note).collect();
    if !found.unsupported.is_empty() {
        let effect = if allow {
            "Within an ALLOW policy, rules using them are omitted."
        } else {
            "Within a DENY policy, they are left out of their rules, which then match more requests."
        };
        parts.push(format!(
            "The waypoint does not support these conditions (found: {}). {effect} {MORE_RESTRICTIVE}",
            listed(&found.unsupported)
        ));
    }
    if !found.invalid.is_empty() {
        let mut values = found.invalid[..found.invalid.len().min(MAX_INVALID_LISTED)].join(", ");
        if found.invalid.len() > MAX_INVALID_LISTED {
            values.push_str(&format!(
                ", and {} more",
                found.invalid.len() - MAX_INVALID_LISTED
            ));
        }
        let effect = if allow {
            "Within an ALLOW policy, a rule with an invalid value is omitted."
        } else {
            "Within a DENY policy, a field or condition with an invalid value is left out of its rule."
        };
        parts.push(format!(
            "The waypoint cannot use invalid values (found: {values}). {effect} {MORE_RESTRICTIVE}"
        ));
    }
    if !found.http_only.is_empty() {
        let effect = if allow {
            "on TCP ports, rules using them are omitted."
        } else {
            "on TCP ports, they are left out of their rules, which then match more connections."
        };
        parts.push(format!(
            "HTTP attributes apply only to HTTP ports (found: {}); {effect}",
            listed(&found.http_only)
        ));
    }
    if parts.is_empty() {
        return (true, reason, binding);
    }
    let reason = if partial {
        "PartiallyInvalid".to_string()
    } else {
        reason
    };
    (true, reason, join(parts))
}

fn listed(names: &std::collections::BTreeSet<String>) -> String {
    names
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
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
            if store.waypoints().contains_key(&key) {
                (true, "Accepted", format!("bound to {named}"))
            } else {
                (false, "TargetNotFound", "not bound".to_string())
            }
        }
        "Service" => service_bound(
            "Service",
            store.services().get(&key).map(|s| &s.labels),
            false,
            reads,
        ),
        "ServiceEntry" => service_bound(
            "ServiceEntry",
            store.service_entries().get(&key).map(|se| &se.labels),
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
        "GatewayClass" => match store.gateway_classes().get(&target.name) {
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
pub(crate) fn workload_waypoint_bound(
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
pub(crate) fn waypoint_bound(binding: &Binding, ingress: Option<bool>) -> Option<StatusCondition> {
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
