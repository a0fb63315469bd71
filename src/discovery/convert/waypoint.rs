//! Waypoints (docs/conversion.md, "Waypoints"): which waypoint an object is bound to through
//! `istio.io/use-waypoint` on itself or its namespace. Which Gateways are ready waypoints is
//! `model::waypoint`.

use crate::discovery::model::waypoint::{
    Bind, GATEWAY_NAME_LABEL, MANAGED_LABEL, USE_WAYPOINT, USE_WAYPOINT_NAMESPACE,
};
use crate::discovery::model::{Key, Labels};
use crate::discovery::store::Store;
use crate::pb::workload::{ApplicationTunnel, GatewayAddress};

/// The outcome of resolving an object's waypoint, with the reason when it failed: what the
/// `istio.io/WaypointBound` condition reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Binding {
    /// No waypoint asked for (no label, or `none`), or a silent miss (a workload inheriting a
    /// service-only waypoint from its namespace).
    Unbound,
    /// Bound to the waypoint `key`.
    Bound { key: Key, address: GatewayAddress },
    /// A waypoint was asked for and cannot be used.
    Failed(BindError),
}

impl Binding {
    /// The waypoint bound to, if any.
    pub(crate) fn key(&self) -> Option<&Key> {
        match self {
            Binding::Bound { key, .. } => Some(key),
            Binding::Unbound | Binding::Failed(_) => None,
        }
    }

    pub(crate) fn into_address(self) -> Option<GatewayAddress> {
        match self {
            Binding::Bound { address, .. } => Some(address),
            Binding::Unbound | Binding::Failed(_) => None,
        }
    }
}

/// Why a requested waypoint is not used (istiod's binding status reasons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BindError {
    /// No ready waypoint by that name (a Gateway without status addresses counts as missing).
    NotReady(Key),
    /// The waypoint's allowedRoutes do not admit the object's namespace.
    AttachmentDenied(Key),
    /// The waypoint does not take this kind of traffic (`istio.io/waypoint-for`).
    UnsupportedTrafficType(Key, Bind),
    /// A ServiceEntry of NAMESPACE visibility asked for a waypoint of another namespace.
    CrossNamespaceForbidden(Key),
}

/// The waypoint side of a workload (Pod, WorkloadEntry, ServiceEntry endpoint), as istiod's
/// `computeWaypoint`: an instance of a ready waypoint (its [`GATEWAY_NAME_LABEL`] names a
/// waypoint of its own namespace) uses none and carries that waypoint's inbound binding as its
/// application tunnel; any other workload binds per [`binding`], with no application tunnel.
pub(crate) fn workload_binding(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    reads: &mut Vec<Key>,
) -> (Binding, Option<ApplicationTunnel>) {
    if let Some(gateway) = labels.get(GATEWAY_NAME_LABEL) {
        let key = (namespace.to_string(), gateway.to_string());
        let instance = store.waypoints().get(&key).map(|w| w.binding);
        reads.push(key);
        if let Some(binding) = instance {
            return (Binding::Unbound, binding);
        }
    }
    (
        binding(store, namespace, labels, Bind::Workload, reads),
        None,
    )
}

/// The waypoint an object uses: its own `istio.io/use-waypoint` label (`none` opts out), else its
/// namespace's. A name that is not a ready waypoint, a waypoint that does not admit the object's
/// namespace, or one of the wrong traffic type gives no waypoint, with the reason: there is no
/// fallback. Every waypoint consulted is pushed to `reads`, so a change to it re-evaluates this
/// object.
pub(crate) fn binding(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    bind: Bind,
    reads: &mut Vec<Key>,
) -> Binding {
    match requested(store, namespace, labels) {
        Some((key, own)) => bind_key(store, namespace, &key, bind, own, reads),
        None => Binding::Unbound,
    }
}

/// [`binding`] for a Service or ServiceEntry. With `local_only` (a ServiceEntry of NAMESPACE
/// visibility) a waypoint of another namespace is refused before it is looked up: it would let
/// traffic and configuration leave the namespace.
pub(crate) fn service_binding(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    local_only: bool,
    reads: &mut Vec<Key>,
) -> Binding {
    match requested(store, namespace, labels) {
        Some((key, _)) if local_only && key.0 != namespace => {
            Binding::Failed(BindError::CrossNamespaceForbidden(key))
        }
        Some((key, own)) => bind_key(store, namespace, &key, Bind::Service, own, reads),
        None => Binding::Unbound,
    }
}

/// The waypoint key asked for, and whether the object's own label asked (else its namespace's).
fn requested(store: &Store, namespace: &str, labels: &Labels) -> Option<(Key, bool)> {
    let own = labels.get(USE_WAYPOINT).map(|name| (name, labels, true));
    let inherited = || {
        let ns_labels = store.namespace_labels(namespace)?;
        ns_labels
            .get(USE_WAYPOINT)
            .map(|name| (name, ns_labels, false))
    };
    let (name, source, is_own) = own.or_else(inherited)?;
    if name == "none" {
        return None;
    }
    let waypoint_namespace = source
        .get(USE_WAYPOINT_NAMESPACE)
        .unwrap_or(namespace)
        .to_string();
    Some(((waypoint_namespace, name.to_string()), is_own))
}

/// Resolves a specific waypoint key for an object in `namespace`.
pub(crate) fn resolve_key(
    store: &Store,
    namespace: &str,
    key: &Key,
    bind: Bind,
    reads: &mut Vec<Key>,
) -> Option<GatewayAddress> {
    bind_key(store, namespace, key, bind, true, reads).into_address()
}

/// Checks, in istiod's order, that the waypoint exists, admits the namespace and takes the
/// traffic. A workload whose namespace (not its own label) names a waypoint of the wrong
/// traffic type is silently unbound; anything else that fails is reported.
fn bind_key(
    store: &Store,
    namespace: &str,
    key: &Key,
    bind: Bind,
    own: bool,
    reads: &mut Vec<Key>,
) -> Binding {
    reads.push(key.clone());
    let Some(waypoint) = store.waypoints().get(key) else {
        return Binding::Failed(BindError::NotReady(key.clone()));
    };
    if !waypoint.admits(&key.0, namespace, store.namespace_labels(namespace)) {
        return Binding::Failed(BindError::AttachmentDenied(key.clone()));
    }
    if waypoint.traffic.admits(bind) {
        Binding::Bound {
            key: key.clone(),
            address: waypoint.address.clone(),
        }
    } else if bind == Bind::Service || own {
        Binding::Failed(BindError::UnsupportedTrafficType(key.clone(), bind))
    } else {
        Binding::Unbound
    }
}

/// Services and ServiceEntries that are themselves waypoints or east-west gateways never use
/// one.
pub(crate) fn never_uses_waypoint(labels: &Labels) -> bool {
    labels
        .get(MANAGED_LABEL)
        .is_some_and(|v| v == "istio.io-mesh-controller" || v == "istio.io-eastwest-controller")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::waypoint::*;
    use crate::discovery::model::{AllowedNamespaces, Gateway, GatewayClass, Listener};
    use crate::pb::workload::application_tunnel::Protocol as TunnelProtocol;

    fn ready(gateway_labels: Labels, class_labels: Labels) -> Waypoint {
        let gw = Gateway {
            name: "wp".into(),
            namespace: "demo".into(),
            labels: gateway_labels,
            addresses: vec![("IPAddress".into(), "10.9.0.1".into())],
            ..Default::default()
        };
        let class = GatewayClass {
            name: "istio-waypoint".into(),
            labels: class_labels,
            ..Default::default()
        };
        Waypoint::from_gateway(&gw, Some(&class), "").expect("ready")
    }

    #[test]
    fn selector_admits_per_label_selector_as_selector() {
        use crate::discovery::model::{LabelOperator, LabelRequirement, NamespaceSelector};
        let requirement = |key: &str, operator, values: &[&str]| LabelRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        let with = |expressions| NamespaceSelector::Match {
            labels: Labels::new(),
            expressions,
        };
        let team_x = Labels::from([("team", "x")]);
        let team_y = Labels::from([("team", "y")]);
        let none = Labels::new();
        // (selector, admits team=x, team=y, no labels)
        let table = [
            (NamespaceSelector::Nothing, [false, false, false]),
            (NamespaceSelector::labels(Labels::new()), [true, true, true]),
            (
                NamespaceSelector::labels(team_x.clone()),
                [true, false, false],
            ),
            (
                with(vec![requirement("team", LabelOperator::In, &["x", "z"])]),
                [true, false, false],
            ),
            (
                with(vec![requirement("team", LabelOperator::NotIn, &["x"])]),
                [false, true, true],
            ),
            (
                with(vec![requirement("team", LabelOperator::Exists, &[])]),
                [true, true, false],
            ),
            (
                with(vec![requirement("team", LabelOperator::DoesNotExist, &[])]),
                [false, false, true],
            ),
            (
                NamespaceSelector::Match {
                    labels: team_x.clone(),
                    expressions: vec![requirement("team", LabelOperator::NotIn, &["x"])],
                },
                [false, false, false],
            ),
        ];
        for (selector, want) in table {
            let wp = Waypoint {
                allowed: AllowedNamespaces::Selector(selector.clone()),
                ..ready(Labels::new(), Labels::new())
            };
            let got = [&team_x, &team_y, &none].map(|l| wp.admits("demo", "other", Some(l)));
            assert_eq!(got, want, "{selector:?}");
            // A namespace we do not know has no labels.
            assert_eq!(wp.admits("demo", "other", None), want[2], "{selector:?}");
        }
    }

    #[test]
    fn unknown_waypoint_for_value_binds_nothing() {
        // (gateway label, class label, traffic type)
        let table = [
            (None, None, TrafficType::Service),
            (None, Some("workload"), TrafficType::Workload),
            (Some("all"), Some("workload"), TrafficType::All),
            // istiod keeps the text: an unknown value is not the `service` default.
            (Some("bogus"), None, TrafficType::None),
            (None, Some("bogus"), TrafficType::None),
            // The Gateway's own label wins, even when it is unknown or empty.
            (Some("Service"), Some("service"), TrafficType::None),
            (Some(""), Some("all"), TrafficType::None),
        ];
        for (on_gateway, on_class, want) in table {
            let label = |v: Option<&str>| {
                v.map(|v| Labels::from([(WAYPOINT_FOR, v)]))
                    .unwrap_or_default()
            };
            let wp = ready(label(on_gateway), label(on_class));
            assert_eq!(
                wp.traffic, want,
                "gateway={on_gateway:?} class={on_class:?}"
            );
            if want == TrafficType::None {
                assert!(!wp.traffic.admits(Bind::Service));
                assert!(!wp.traffic.admits(Bind::Workload));
            }
        }
    }

    /// istiod's `TestMakeAllowedRoutes`: which listener's allowedRoutes a waypoint uses.
    #[test]
    fn allowed_routes_come_from_the_bound_listener_else_the_hbone_one() {
        let listener = |port: u16, protocol: &str, allowed: Option<AllowedNamespaces>| Listener {
            name: format!("l{port}"),
            port,
            protocol: protocol.into(),
            allowed,
        };
        let listeners = vec![
            listener(15089, "istio.io/PROXY", Some(AllowedNamespaces::Same)),
            listener(15088, "istio.io/PROXY", Some(AllowedNamespaces::All)),
            listener(15008, "HBONE", Some(AllowedNamespaces::All)),
        ];
        let with_binding = |binding: Option<&str>, listeners: Vec<Listener>| {
            let gw = Gateway {
                name: "wp".into(),
                namespace: "demo".into(),
                annotations: binding
                    .map(|b| Labels::from([(INBOUND_BINDING, b)]))
                    .unwrap_or_default(),
                listeners,
                addresses: vec![("IPAddress".into(), "10.9.0.1".into())],
                ..Default::default()
            };
            Waypoint::from_gateway(&gw, None, "")
                .expect("ready")
                .allowed
        };
        // A port picks that port's listener, whatever comes first.
        assert_eq!(
            with_binding(Some("PROXY/15088"), listeners.clone()),
            AllowedNamespaces::All
        );
        // A PROXY binding without a port picks the first istio.io/PROXY listener.
        assert_eq!(
            with_binding(Some("PROXY"), listeners.clone()),
            AllowedNamespaces::Same
        );
        // NONE without a port binds no listener: the HBONE one decides.
        assert_eq!(
            with_binding(Some("NONE"), listeners.clone()),
            AllowedNamespaces::All
        );
        // No binding: the HBONE listener; none at all: Same.
        assert_eq!(with_binding(None, listeners), AllowedNamespaces::All);
        assert_eq!(with_binding(None, Vec::new()), AllowedNamespaces::Same);
    }

    #[test]
    fn inbound_bindings_parse_as_istiod_does() {
        let tunnel = |protocol: TunnelProtocol, port| {
            Some(ApplicationTunnel {
                protocol: protocol as i32,
                port,
            })
        };
        let table = [
            ("PROXY", tunnel(TunnelProtocol::Proxy, 0)),
            ("PROXY/15088", tunnel(TunnelProtocol::Proxy, 15088)),
            // NONE is a binding too: the instance pods get a NONE application tunnel.
            ("NONE", tunnel(TunnelProtocol::None, 0)),
            ("NONE/8080", tunnel(TunnelProtocol::None, 8080)),
            ("proxy", None),
            ("HBONE", None),
            // istiod keeps a binding whose port does not parse: 0, or the maximum.
            ("PROXY/port", tunnel(TunnelProtocol::Proxy, 0)),
            ("PROXY/", tunnel(TunnelProtocol::Proxy, 0)),
            ("PROXY/+15088", tunnel(TunnelProtocol::Proxy, 0)),
            ("PROXY/015088", tunnel(TunnelProtocol::Proxy, 15088)),
            ("PROXY/4294967296", tunnel(TunnelProtocol::Proxy, u32::MAX)),
            ("PROXY/1/2", None),
            ("", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_binding(text), want, "{text:?}");
        }
    }
}
