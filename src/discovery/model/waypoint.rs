//! Waypoints as data: the labels and annotations that bind objects to them, and a ready
//! waypoint derived from a Gateway (with its GatewayClass). Which waypoint an object is bound
//! to is `convert::waypoint`.

use std::net::IpAddr;

use crate::discovery::model::kinds::{AllowedNamespaces, Gateway, GatewayClass, Listener};
use crate::discovery::model::labels::Labels;
use crate::discovery::names::ip_bytes;
use crate::pb::workload::{
    ApplicationTunnel, GatewayAddress, NamespacedHostname, NetworkAddress,
    application_tunnel::Protocol as TunnelProtocol, gateway_address::Destination,
};

pub(crate) const USE_WAYPOINT: &str = "istio.io/use-waypoint";
pub(crate) const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
pub(crate) const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
pub(crate) const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
pub(crate) const INBOUND_BINDING: &str = "ambient.istio.io/waypoint-inbound-binding";
pub(crate) const MANAGED_LABEL: &str = "gateway.istio.io/managed";
/// HBONE port of every waypoint; istiod hard-codes it.
pub(crate) const HBONE_PORT: u32 = 15008;

/// Which traffic a waypoint takes (`istio.io/waypoint-for`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TrafficType {
    Service,
    Workload,
    All,
    None,
}

impl TrafficType {
    /// istiod keeps the label's text as the traffic type and binds only on `service`,
    /// `workload` or `all`: any other value (a typo, an empty string) takes nothing, like `none`.
    pub(crate) fn parse(value: &str) -> Self {
        match value {
            "service" => TrafficType::Service,
            "workload" => TrafficType::Workload,
            "all" => TrafficType::All,
            _ => TrafficType::None,
        }
    }

    pub(crate) fn admits(self, bind: Bind) -> bool {
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
pub(crate) enum Bind {
    Service,
    Workload,
}

/// A Gateway with a status address: ready to be used as a waypoint.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Waypoint {
    pub(crate) address: GatewayAddress,
    pub(crate) traffic: TrafficType,
    pub(crate) allowed: AllowedNamespaces,
    /// From the inbound-binding annotation: the application tunnel of its instance pods.
    pub(crate) binding: Option<ApplicationTunnel>,
}

impl Waypoint {
    /// Derives the waypoint of a Gateway, or `None` while it has no usable status address.
    pub(crate) fn from_gateway(
        gw: &Gateway,
        class: Option<&GatewayClass>,
        network: &str,
    ) -> Option<Self> {
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
    pub(crate) fn admits(
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
pub(crate) fn parse_binding(text: &str) -> Option<ApplicationTunnel> {
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
pub(crate) fn go_parse_u32(text: &str) -> u32 {
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
