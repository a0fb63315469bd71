//! Kubernetes Service -> `istio.workload.Service`, per conversion.md §1.2.

use crate::discovery::index::{Objects, Settings};
use crate::discovery::model::{IpFamily, Labels, Protocol, Service, ServicePort, TargetPort};
use crate::discovery::names::{ip_bytes, service_hostname};
use crate::pb::workload::{
    self, AppProtocol, IpFamilies, LoadBalancing, NetworkAddress, Port,
    load_balancing::{HealthPolicy, Mode, Scope},
};

const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";

/// Builds the Service resource, or `None` for `type: ExternalName`.
pub fn build(settings: &Settings, objects: &Objects, svc: &Service) -> Option<workload::Service> {
    if svc.external_name {
        return None;
    }
    let network = objects.network(settings);
    let namespace_annotations = objects
        .namespaces
        .get(&svc.namespace)
        .map(|n| &n.annotations);
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
pub fn app_protocol(port: &ServicePort) -> AppProtocol {
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
enum Distribution {
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

fn distribution_from_annotation(annotations: &Labels) -> Option<Distribution> {
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

fn failover(distribution: Distribution) -> LoadBalancing {
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
