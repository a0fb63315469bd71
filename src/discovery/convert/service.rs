//! Kubernetes Service -> `istio.workload.Service`, per docs/conversion.md, "Service → Service",
//! and the pieces
//! ServiceEntries share with it (traffic distribution, waypoints).

use crate::discovery::convert::waypoint::{self};
use crate::discovery::model::Key;
use crate::discovery::model::waypoint::Bind;
use crate::discovery::model::{IpFamily, Labels, Protocol, Service, ServicePort, TargetPort};
use crate::discovery::names::{ip_bytes, service_hostname};
use crate::discovery::settings::Settings;
use crate::discovery::store::Store;
use crate::pb::workload::{
    self, AppProtocol, GatewayAddress, IpFamilies, LoadBalancing, NetworkAddress, Port,
    WeightedWaypoint,
    load_balancing::{HealthPolicy, Mode, Scope},
};

const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";
const CANARY_LABEL: &str = "istio.io/use-waypoint-canary";
const CANARY_NAMESPACE_LABEL: &str = "istio.io/use-waypoint-canary-namespace";
const CANARY_WEIGHT_ANNOTATION: &str = "istio.io/use-waypoint-canary-weight";
pub(crate) const INGRESS_USE_WAYPOINT: &str = "istio.io/ingress-use-waypoint";

/// Builds the Service resource, or `None` for `type: ExternalName`. Waypoints consulted are
/// pushed to `reads`.
pub(crate) fn build(
    settings: &Settings,
    store: &Store,
    svc: &Service,
    reads: &mut Vec<Key>,
) -> Option<workload::Service> {
    if svc.external_name {
        return None;
    }
    let network = store.network(settings);
    let namespace_annotations = store
        .namespaces()
        .get(&svc.namespace)
        .map(|n| &n.annotations);
    let (waypoint, weighted_waypoints, ingress_use_waypoint) = waypoints(
        store,
        &svc.namespace,
        &svc.labels,
        &svc.annotations,
        false,
        reads,
    );
    Some(workload::Service {
        name: svc.name.clone(),
        namespace: svc.namespace.clone(),
        hostname: service_hostname(&svc.name, &svc.namespace, &settings.domain),
        addresses: svc
            .cluster_ips
            .iter()
            .map(|ip| NetworkAddress {
                network: network.to_string(),
                address: ip_bytes(ip),
                length: None,
            })
            .collect(),
        ports: svc.ports.iter().map(service_port).collect(),
        waypoint,
        weighted_waypoints,
        ingress_use_waypoint,
        load_balancing: load_balancing(svc, namespace_annotations),
        ip_families: ip_families(&svc.ip_families) as i32,
        canonical: true,
        ..Default::default()
    })
}

fn service_port(port: &ServicePort) -> Port {
    Port {
        service_port: u32::from(port.port),
        target_port: match port.target_port {
            TargetPort::Number(n) => u32::from(n),
            // Resolved per workload; istiod sends 0 on the Service.
            TargetPort::Name(_) => 0,
        },
        app_protocol: app_protocol(port) as i32,
    }
}

/// istiod's `ConvertProtocol` followed by the workload API mapping: UDP is UNKNOWN;
/// `appProtocol` wins over the port name; the name's part before the first `-` is parsed
/// case-insensitively; well-known ports with an unrecognised name are TCP.
pub(crate) fn app_protocol(port: &ServicePort) -> AppProtocol {
    if port.protocol == Protocol::Udp {
        return AppProtocol::Unknown;
    }
    let name = match port.app_protocol.as_deref() {
        Some("kubernetes.io/h2c") => return AppProtocol::Http2,
        Some("kubernetes.io/ws") => return AppProtocol::Http11,
        Some("kubernetes.io/wss") => return AppProtocol::Tls,
        Some(app_protocol) => app_protocol,
        None => port.name.as_str(),
    };
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("grpc-web") {
        return AppProtocol::Unknown;
    }
    let prefix = lower.split('-').next().unwrap_or_default();
    match prefix {
        "http" => AppProtocol::Http11,
        "http2" => AppProtocol::Http2,
        "grpc" => AppProtocol::Grpc,
        "https" | "tls" => AppProtocol::Tls,
        "tcp" => AppProtocol::Tcp,
        // Recognised by istiod but with no workload API equivalent.
        "udp" | "mongo" | "redis" | "mysql" | "http_proxy" => AppProtocol::Unknown,
        _ if matches!(port.port, 25 | 53 | 3306 | 27017) => AppProtocol::Tcp,
        _ => AppProtocol::Unknown,
    }
}

/// Traffic distribution preference, from istiod's `GetTrafficDistribution`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Distribution {
    SameZone,
    SameNode,
}

fn distribution_from_spec(value: Option<&str>) -> Option<Distribution> {
    match value? {
        "PreferClose" | "PreferSameZone" => Some(Distribution::SameZone),
        "PreferSameNode" => Some(Distribution::SameNode),
        _ => None,
    }
}

/// The traffic distribution named by the `networking.istio.io/traffic-distribution`
/// annotation (case-insensitive); unknown values mean none.
pub(crate) fn distribution_from_annotation(annotations: &Labels) -> Option<Distribution> {
    let value = annotations.get(TRAFFIC_DISTRIBUTION_ANNOTATION)?;
    match value.to_ascii_lowercase().as_str() {
        "preferclose" | "prefersamezone" => Some(Distribution::SameZone),
        "prefersamenode" => Some(Distribution::SameNode),
        _ => None,
    }
}

/// `internalTrafficPolicy: Local` wins; else traffic distribution (field, Service annotation,
/// Namespace annotation); `publishNotReadyAddresses` adds ALLOW_ALL health policy.
fn load_balancing(svc: &Service, namespace_annotations: Option<&Labels>) -> Option<LoadBalancing> {
    let mut lb = if svc.internal_traffic_local {
        Some(LoadBalancing {
            routing_preference: vec![Scope::Node as i32],
            mode: Mode::Strict as i32,
            health_policy: 0,
        })
    } else {
        let distribution = distribution_from_spec(svc.traffic_distribution.as_deref())
            .or_else(|| distribution_from_annotation(&svc.annotations))
            .or_else(|| namespace_annotations.and_then(distribution_from_annotation));
        distribution.map(failover)
    };
    if svc.publish_not_ready_addresses {
        lb.get_or_insert_with(LoadBalancing::default).health_policy = HealthPolicy::AllowAll as i32;
    }
    lb
}

/// The FAILOVER load balancing of a traffic distribution.
pub(crate) fn failover(distribution: Distribution) -> LoadBalancing {
    let scopes: &[Scope] = match distribution {
        Distribution::SameZone => &[Scope::Network, Scope::Region, Scope::Zone],
        Distribution::SameNode => &[
            Scope::Network,
            Scope::Region,
            Scope::Zone,
            Scope::Subzone,
            Scope::Node,
        ],
    };
    LoadBalancing {
        routing_preference: scopes.iter().map(|s| *s as i32).collect(),
        mode: Mode::Failover as i32,
        health_policy: 0,
    }
}

fn ip_families(families: &[IpFamily]) -> IpFamilies {
    match families {
        [IpFamily::V4] => IpFamilies::Ipv4Only,
        [IpFamily::V6] => IpFamilies::Ipv6Only,
        [_, _] => IpFamilies::Dual,
        _ => IpFamilies::Automatic,
    }
}

/// A service's waypoint, its weighted canary split, and `ingress_use_waypoint` (docs/conversion.md,
/// "Service → Service" and "Waypoints").
///
/// The canary (`istio.io/use-waypoint-canary[-namespace]` on the Service or its Namespace, with
/// the weight annotation 0..=100, absent = 0) is used only when the primary resolved, the canary
/// resolves, differs from it, and the weight is valid; otherwise the primary alone.
/// `ingress_use_waypoint` is read from the Service, else its Namespace, and only when a waypoint
/// resolved. `local_only` (a ServiceEntry of NAMESPACE visibility) refuses a primary or a
/// canary in another namespace.
pub(crate) fn waypoints(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    annotations: &Labels,
    local_only: bool,
    reads: &mut Vec<Key>,
) -> (Option<GatewayAddress>, Vec<WeightedWaypoint>, bool) {
    if waypoint::never_uses_waypoint(labels) {
        return (None, Vec::new(), false);
    }
    let binding = waypoint::service_binding(store, namespace, labels, local_only, reads);
    let Some(primary) = binding.into_address() else {
        return (None, Vec::new(), false);
    };
    let weighted = canary(store, namespace, labels, annotations, &primary, reads)
        .filter(|(key, ..)| !local_only || key.0 == namespace)
        .map(|(_, canary, weight)| {
            vec![
                WeightedWaypoint {
                    destination: Some(primary.clone()),
                    weight: 100 - weight,
                },
                WeightedWaypoint {
                    destination: Some(canary),
                    weight,
                },
            ]
        })
        .unwrap_or_default();
    let ingress = labels
        .get(INGRESS_USE_WAYPOINT)
        .or_else(|| store.namespace_labels(namespace)?.get(INGRESS_USE_WAYPOINT))
        .is_some_and(parse_bool);
    (Some(primary), weighted, ingress)
}

fn canary(
    store: &Store,
    namespace: &str,
    labels: &Labels,
    annotations: &Labels,
    primary: &GatewayAddress,
    reads: &mut Vec<Key>,
) -> Option<(Key, GatewayAddress, u32)> {
    // The canary of the Service, else of its Namespace ("a service (or namespace)"), in the
    // namespace its own label names, else the service's. The weight is the Service's
    // annotation, else the Namespace's, else 0 (Istio: "Defaults to 0"); one that is not an
    // integer 0..=100 leaves the primary alone.
    let ns = store.namespaces().get(namespace);
    let from = if labels.get(CANARY_LABEL).is_some() {
        labels
    } else {
        &ns?.labels
    };
    let name = from.get(CANARY_LABEL)?;
    let canary_namespace = from
        .get(CANARY_NAMESPACE_LABEL)
        .unwrap_or(namespace)
        .to_string();
    let weight = match annotations
        .get(CANARY_WEIGHT_ANNOTATION)
        .or_else(|| ns?.annotations.get(CANARY_WEIGHT_ANNOTATION))
    {
        Some(text) => text.parse::<u32>().ok().filter(|w| *w <= 100)?,
        None => 0,
    };
    let key = (canary_namespace, name.to_string());
    let canary = waypoint::resolve_key(store, namespace, &key, Bind::Service, reads)?;
    (canary != *primary).then_some((key, canary, weight))
}

/// Go's `strconv.ParseBool` truths.
pub(crate) fn parse_bool(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}
