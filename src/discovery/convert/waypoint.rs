//! Waypoints (docs/conversion.md, "Waypoints"): which Gateways are ready waypoints, and which
//! waypoint an object is bound to through `istio.io/use-waypoint` on itself or its namespace.

use std::net::IpAddr;

use crate::discovery::model::{AllowedNamespaces, Gateway, GatewayClass, Labels, Listener};
use crate::discovery::names::ip_bytes;
use crate::discovery::store::{Key, Store};
use crate::pb::workload::{
    ApplicationTunnel, GatewayAddress, NamespacedHostname, NetworkAddress,
    application_tunnel::Protocol as TunnelProtocol, gateway_address::Destination,
};

pub const USE_WAYPOINT: &str = "istio.io/use-waypoint";
pub const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
pub const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
pub const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
pub const INBOUND_BINDING: &str = "ambient.istio.io/waypoint-inbound-binding";
pub const MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// HBONE port of every waypoint; istiod hard-codes it.
pub const HBONE_PORT: u32 = 15008;

/// Which traffic a waypoint takes (`istio.io/waypoint-for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficType {
    Service,
    Workload,
    All,
    None,
}

impl TrafficType {
    /// istiod keeps the label's text as the traffic type and binds only on `service`,
    /// `workload` or `all`: any other value (a typo, an empty string) takes nothing, like `none`.
    fn parse(value: &str) -> Self {
        match value {
            "service" => TrafficType::Service,
            "workload" => TrafficType::Workload,
            "all" => TrafficType::All,
            _ => TrafficType::None,
        }
    }

    fn admits(self, bind: Bind) -> bool {
        matches!(
            (self, bind),
            (TrafficType::All, _)
                | (TrafficType::Service, Bind::Service)
                | (TrafficType::Workload, Bind::Workload)
        )
    }
}

/// What kind of object is binding: services and workloads accept different traffic types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    Service,
    Workload,
}

/// A Gateway with a status address: ready to be used as a waypoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Waypoint {
    pub address: GatewayAddress,
    pub traffic: TrafficType,
    pub allowed: AllowedNamespaces,
    /// From the inbound-binding annotation: the application tunnel of its instance pods.
    pub binding: Option<ApplicationTunnel>,
}

impl Waypoint {
    /// Derives the waypoint of a Gateway, or `None` while it has no usable status address.
    pub fn from_gateway(gw: &Gateway, class: Option<&GatewayClass>, network: &str) -> Option<Self> {
        let hostname = gw.addresses.iter().find(|(kind, _)| kind == "Hostname");
        let destination = match hostname {
            Some((_, host)) => Destination::Hostname(NamespacedHostname {
                namespace: gw.namespace.clone(),
                hostname: host.clone(),
            }),
            None => {
                let ip = gw
                    .addresses
                    .iter()
                    .filter(|(kind, _)| kind == "IPAddress")
                    .find_map(|(_, value)| value.parse::<IpAddr>().ok())?;
                Destination::Address(NetworkAddress {
                    network: network.to_string(),
                    address: ip_bytes(&ip),
                    length: None,
                })
            }
        };
        let traffic = gw
            .labels
            .get(WAYPOINT_FOR)
            .or_else(|| class.and_then(|c| c.labels.get(WAYPOINT_FOR)))
            .map_or(TrafficType::Service, TrafficType::parse);
        let binding_text = gw
            .annotations
            .get(INBOUND_BINDING)
            .or_else(|| class.and_then(|c| c.annotations.get(INBOUND_BINDING)));
        let binding = binding_text.and_then(parse_binding);
        // allowedRoutes from the listener the inbound binding uses (istiod's
        // `findBoundListener`: by port when the binding has one, else a PROXY binding's
        // `istio.io/PROXY` listener), else the HBONE listener.
        let bound = |l: &&Listener| match &binding {
            Some(b) if b.port != 0 => u32::from(l.port) == b.port,
            Some(b) if b.protocol == TunnelProtocol::Proxy as i32 => l.protocol == "istio.io/PROXY",
            _ => false,
        };
        let listener = gw.listeners.iter().find(bound).or_else(|| {
            gw.listeners
                .iter()
                .find(|l| l.protocol == "HBONE" && u32::from(l.port) == HBONE_PORT)
        });
        let allowed = listener
            .and_then(|l| l.allowed.clone())
            .unwrap_or(AllowedNamespaces::Same);
        Some(Waypoint {
            address: GatewayAddress {
                destination: Some(destination),
                hbone_mtls_port: HBONE_PORT,
            },
            traffic,
            allowed,
            binding,
        })
    }

    /// Whether objects in `namespace` may bind to this waypoint (in `waypoint_namespace`).
    pub fn admits(
        &self,
        waypoint_namespace: &str,
        namespace: &str,
        labels: Option<&Labels>,
    ) -> bool {
        match &self.allowed {
            AllowedNamespaces::All => true,
            AllowedNamespaces::Same => waypoint_namespace == namespace,
            // An unknown namespace has no labels, as istiod reads it.
            AllowedNamespaces::Selector(selector) => {
                selector.matches(labels.unwrap_or(&Labels::new()))
            }
        }
    }
}

/// `<protocol>` or `<protocol>/<port>`, the protocol `PROXY` or `NONE`, as istiod's
/// `makeInboundBinding`: a `NONE` binding is still sent to the waypoint's own pods, as an
/// application tunnel with protocol NONE. Another protocol, or more than one `/`, is no
/// binding. A port Go's `ParseUint(port, 10, 32)` rejects only logs a warning in istiod and
/// keeps what it returned: 0 for a malformed number, the maximum for one out of range.
fn parse_binding(text: &str) -> Option<ApplicationTunnel> {
    let (protocol, port) = match text.split_once('/') {
        Some((_, port)) if port.contains('/') => return None,
        Some((protocol, port)) => (protocol, go_parse_u32(port)),
        None => (text, 0),
    };
    let protocol = match protocol {
        "PROXY" => TunnelProtocol::Proxy,
        "NONE" => TunnelProtocol::None,
        _ => return None,
    };
    Some(ApplicationTunnel {
        protocol: protocol as i32,
        port,
    })
}

/// Go's `strconv.ParseUint(text, 10, 32)` value, errors included: decimal digits only (no
/// sign); a syntax error gives 0, an out-of-range number `u32::MAX`.
fn go_parse_u32(text: &str) -> u32 {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return 0;
    }
    let digits = text.trim_start_matches('0');
    if digits.len() > 10 {
        return u32::MAX;
    }
    digits
        .parse::<u64>()
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The waypoint an object uses: its own `istio.io/use-waypoint` label (`none` opts out), else its
/// namespace's. A name that is not a ready waypoint, a waypoint that does not admit the object's
/// namespace, or one of the wrong traffic type gives no waypoint: there is no fallback. Every
/// waypoint consulted is pushed to `reads`, so a change to it re-evaluates this object.
pub fn resolve(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    bind: Bind,
    reads: &mut Vec<Key>,
) -> Option<GatewayAddress> {
    binding(store, namespace, labels, bind, reads).into_address()
}

/// The outcome of resolving an object's waypoint, with the reason when it failed: what the
/// `istio.io/WaypointBound` condition reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Binding {
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
    pub fn key(&self) -> Option<&Key> {
        match self {
            Binding::Bound { key, .. } => Some(key),
            Binding::Unbound | Binding::Failed(_) => None,
        }
    }

    pub fn into_address(self) -> Option<GatewayAddress> {
        match self {
            Binding::Bound { address, .. } => Some(address),
            Binding::Unbound | Binding::Failed(_) => None,
        }
    }
}

/// Why a requested waypoint is not used (istiod's binding status reasons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BindError {
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
pub fn workload_binding(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    reads: &mut Vec<Key>,
) -> (Binding, Option<ApplicationTunnel>) {
    if let Some(gateway) = labels.get(GATEWAY_NAME_LABEL) {
        let key = (namespace.to_string(), gateway.to_string());
        let instance = store.waypoints.get(&key).map(|w| w.binding);
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

/// [`resolve`], keeping the reason a requested waypoint was not used.
pub fn binding(
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
pub fn service_binding(
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

/// The `(namespace, name)` an object's labels (or its namespace's) point at.
pub fn binding_key(store: &Store, namespace: &str, labels: &Labels) -> Option<Key> {
    requested(store, namespace, labels).map(|(key, _)| key)
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
pub fn resolve_key(
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
    let Some(waypoint) = store.waypoints.get(key) else {
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
pub fn never_uses_waypoint(labels: &Labels) -> bool {
    labels
        .get(MANAGED_LABEL)
        .is_some_and(|v| v == "istio.io-mesh-controller" || v == "istio.io-eastwest-controller")
}

#[cfg(test)]
mod tests {
    use super::*;

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
