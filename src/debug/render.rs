//! Resources as JSON for people: proto field names in camelCase, enums by name, IPs as
//! strings (istiod's `/debug/ambientz` and `config_dump` habits). [`any`] wraps one as
//! protojson writes a `google.protobuf.Any`, for `config_dump`.

use crate::discovery::names::{TypeKind, ip_from_bytes};

use prost::Message;
use serde_json::{Map, Value, json};

use crate::discovery::Resource;
use crate::pb::security::{self, Authorization, StringMatch, string_match::MatchType};
use crate::pb::workload::{
    Address, GatewayAddress, LoadBalancing, NetworkAddress, Service, Workload, address,
    gateway_address::Destination,
};

/// Raw address bytes as text.
pub fn ip(bytes: &[u8]) -> String {
    match ip_from_bytes(bytes) {
        Some(ip) => ip.to_string(),
        None => format!("<{} bytes>", bytes.len()),
    }
}

/// Drops empty strings, empty lists/maps, `false` and `null`, as protojson omits defaults.
fn compact(map: Map<String, Value>) -> Value {
    Value::Object(
        map.into_iter()
            .filter(|(_, v)| match v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                Value::Number(_) => true,
            })
            .collect(),
    )
}

fn obj(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn network_address(a: &NetworkAddress) -> String {
    match a.length {
        Some(len) => format!("{}/{}/{len}", a.network, ip(&a.address)),
        None => format!("{}/{}", a.network, ip(&a.address)),
    }
}

fn gateway(g: &Option<GatewayAddress>) -> Value {
    let Some(g) = g else { return Value::Null };
    let destination = match &g.destination {
        Some(Destination::Hostname(h)) => {
            json!({"hostname": {"namespace": h.namespace, "hostname": h.hostname}})
        }
        Some(Destination::Address(a)) => json!({"address": network_address(a)}),
        None => json!({}),
    };
    let mut map = obj(destination);
    map.insert("hboneMtlsPort".into(), json!(g.hbone_mtls_port));
    Value::Object(map)
}

/// A proto enum value by its proto name (`HOST_NETWORK`), or the number if unknown.
macro_rules! enum_name {
    ($enum:ty, $value:expr) => {
        match <$enum>::try_from($value) {
            Ok(e) => json!(e.as_str_name()),
            Err(_) => json!($value),
        }
    };
}

fn load_balancing(lb: &Option<LoadBalancing>) -> Value {
    let Some(lb) = lb else { return Value::Null };
    use crate::pb::workload::load_balancing::{HealthPolicy, Mode, Scope};
    json!({
        "routingPreference": lb.routing_preference.iter().map(|s| enum_name!(Scope, *s)).collect::<Vec<_>>(),
        "mode": enum_name!(Mode, lb.mode),
        "healthPolicy": enum_name!(HealthPolicy, lb.health_policy),
    })
}

pub fn workload(w: &Workload) -> Value {
    use crate::pb::workload::{NetworkMode, TunnelProtocol, WorkloadStatus, WorkloadType};
    let services: Map<String, Value> = w
        .services
        .iter()
        .map(|(k, ports)| {
            let ports: Map<String, Value> = ports
                .ports
                .iter()
                .map(|p| (p.service_port.to_string(), json!(p.target_port)))
                .collect();
            (k.clone(), Value::Object(ports))
        })
        .collect();
    let map = obj(json!({
        "uid": w.uid,
        "name": w.name,
        "namespace": w.namespace,
        "addresses": w.addresses.iter().map(|a| ip(a)).collect::<Vec<_>>(),
        "hostname": w.hostname,
        "network": w.network,
        "tunnelProtocol": enum_name!(TunnelProtocol, w.tunnel_protocol),
        "trustDomain": w.trust_domain,
        "serviceAccount": w.service_account,
        "waypoint": gateway(&w.waypoint),
        "node": w.node,
        "canonicalName": w.canonical_name,
        "canonicalRevision": w.canonical_revision,
        "workloadType": enum_name!(WorkloadType, w.workload_type),
        "workloadName": w.workload_name,
        "nativeTunnel": w.native_tunnel,
        "applicationTunnel": w.application_tunnel.as_ref().map(|t| json!({"protocol": t.protocol, "port": t.port})),
        "services": services,
        "authorizationPolicies": w.authorization_policies,
        "status": enum_name!(WorkloadStatus, w.status),
        "clusterId": w.cluster_id,
        "locality": w.locality.as_ref().map(|l| json!({"region": l.region, "zone": l.zone, "subzone": l.subzone})),
        "networkMode": enum_name!(NetworkMode, w.network_mode),
        "capacity": w.capacity.as_ref().map(|c| c.value),
    }));
    compact(map)
}

pub fn service(s: &Service) -> Value {
    use crate::pb::workload::{AppProtocol, IpFamilies};
    let map = obj(json!({
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "addresses": s.addresses.iter().map(network_address).collect::<Vec<_>>(),
        "ports": s.ports.iter().map(|p| json!({
            "servicePort": p.service_port,
            "targetPort": p.target_port,
            "appProtocol": enum_name!(AppProtocol, p.app_protocol),
        })).collect::<Vec<_>>(),
        "subjectAltNames": s.subject_alt_names,
        "waypoint": gateway(&s.waypoint),
        "weightedWaypoints": s.weighted_waypoints.iter().map(|w| json!({"destination": gateway(&w.destination), "weight": w.weight})).collect::<Vec<_>>(),
        "loadBalancing": load_balancing(&s.load_balancing),
        "ipFamilies": enum_name!(IpFamilies, s.ip_families),
        "canonical": s.canonical,
        "ingressUseWaypoint": s.ingress_use_waypoint,
        "visibility": enum_name!(crate::pb::workload::service::Visibility, s.visibility),
    }));
    compact(map)
}

fn string_match(m: &StringMatch) -> Value {
    match &m.match_type {
        Some(MatchType::Exact(s)) => json!({"exact": s}),
        Some(MatchType::Prefix(s)) => json!({"prefix": s}),
        Some(MatchType::Suffix(s)) => json!({"suffix": s}),
        Some(MatchType::Presence(_)) => json!({"presence": {}}),
        None => json!({}),
    }
}

fn addresses(list: &[security::Address]) -> Vec<String> {
    list.iter()
        .map(|a| format!("{}/{}", ip(&a.address), a.length))
        .collect()
}

pub fn authorization(a: &Authorization) -> Value {
    use crate::pb::security::{Action, Scope};
    let strings = |l: &[StringMatch]| l.iter().map(string_match).collect::<Vec<_>>();
    let accounts = |l: &[security::ServiceAccountMatch]| {
        l.iter()
            .map(|s| json!({"namespace": s.namespace, "serviceAccount": s.service_account}))
            .collect::<Vec<_>>()
    };
    let rules: Vec<Value> = a
        .rules
        .iter()
        .map(|rule| {
            let clauses: Vec<Value> = rule
                .clauses
                .iter()
                .map(|clause| {
                    let matches: Vec<Value> = clause
                        .matches
                        .iter()
                        .map(|m| {
                            compact(obj(json!({
                                "namespaces": strings(&m.namespaces),
                                "notNamespaces": strings(&m.not_namespaces),
                                "serviceAccounts": accounts(&m.service_accounts),
                                "notServiceAccounts": accounts(&m.not_service_accounts),
                                "principals": strings(&m.principals),
                                "notPrincipals": strings(&m.not_principals),
                                "sourceIps": addresses(&m.source_ips),
                                "notSourceIps": addresses(&m.not_source_ips),
                                "destinationIps": addresses(&m.destination_ips),
                                "notDestinationIps": addresses(&m.not_destination_ips),
                                "destinationPorts": m.destination_ports,
                                "notDestinationPorts": m.not_destination_ports,
                            })))
                        })
                        .collect();
                    json!({"matches": matches})
                })
                .collect();
            json!({"clauses": clauses})
        })
        .collect();
    json!({
        "name": a.name,
        "namespace": a.namespace,
        "scope": enum_name!(Scope, a.scope),
        "action": enum_name!(Action, a.action),
        "rules": rules,
        "dryRun": a.dry_run,
    })
}

/// A decoded Address resource (workload or service) as JSON.
pub fn address(resource: &Resource) -> Value {
    match Address::decode(resource.value()).map(|a| a.r#type) {
        Ok(Some(address::Type::Workload(w))) => workload(&w),
        Ok(Some(address::Type::Service(s))) => service(&s),
        Ok(None) => json!({}),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// A decoded resource of either type as JSON.
pub fn resource(resource: &Resource) -> Value {
    if resource.kind == TypeKind::Authorization.into() {
        match Authorization::decode(resource.value()) {
            Ok(a) => authorization(&a),
            Err(e) => json!({"error": e.to_string()}),
        }
    } else {
        address(resource)
    }
}

/// A resource as protojson writes it inside a `google.protobuf.Any`: `@type` then the message's
/// fields. An Address is the oneof it holds (`{"@type": ..., "workload": {...}}` or
/// `"service"`); an Authorization its own fields. IPs stay text, unlike protojson's base64.
pub fn any(resource: &Resource) -> Value {
    let mut map = Map::new();
    map.insert("@type".into(), json!(resource.kind.type_url()));
    if resource.kind == TypeKind::Authorization.into() {
        match Authorization::decode(resource.value()) {
            Ok(a) => map.extend(obj(authorization(&a))),
            Err(e) => {
                map.insert("error".into(), json!(e.to_string()));
            }
        }
    } else {
        match Address::decode(resource.value()).map(|a| a.r#type) {
            Ok(Some(address::Type::Workload(w))) => {
                map.insert("workload".into(), workload(&w));
            }
            Ok(Some(address::Type::Service(s))) => {
                map.insert("service".into(), service(&s));
            }
            Ok(None) => {}
            Err(e) => {
                map.insert("error".into(), json!(e.to_string()));
            }
        }
    }
    Value::Object(map)
}

/// A waypoint's Envoy resource as a summary (ambientd has no protojson for Envoy's types):
/// `@type`, name and version, and per type what a reader looks for: a listener's address and
/// chains, a cluster's discovery type and EDS name, an assignment's endpoints.
pub fn envoy(resource: &Resource) -> Value {
    use crate::discovery::ResourceType;
    use crate::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use crate::pb::envoy::config::core::v3::{Address as EnvoyAddress, address as envoy_address};
    use crate::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
    use crate::pb::envoy::config::listener::v3::{Listener, listener};

    fn address(a: Option<&EnvoyAddress>) -> Value {
        match a.and_then(|a| a.address.as_ref()) {
            Some(envoy_address::Address::SocketAddress(s)) => {
                let port = match s.port_specifier {
                    Some(crate::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => p,
                    _ => 0,
                };
                json!(format!("{}:{port}", s.address))
            }
            Some(envoy_address::Address::EnvoyInternalAddress(i)) => {
                let listener = match &i.address_name_specifier {
                    Some(crate::pb::envoy::config::core::v3::envoy_internal_address::AddressNameSpecifier::ServerListenerName(l)) => l.as_str(),
                    None => "",
                };
                if i.endpoint_id.is_empty() {
                    json!(format!("internal:{listener}"))
                } else {
                    json!(format!("internal:{listener};{}", i.endpoint_id))
                }
            }
            _ => Value::Null,
        }
    }
    let mut map = Map::new();
    map.insert("@type".into(), json!(resource.type_url()));
    map.insert("name".into(), json!(resource.name.as_str()));
    map.insert("version".into(), json!(resource.version.to_string()));
    let summary = match resource.kind() {
        ResourceType::Listener => Listener::decode(resource.value()).map(|l| {
            json!({
                "address": address(l.address.as_ref()),
                "internal": matches!(l.listener_specifier, Some(listener::ListenerSpecifier::InternalListener(_))),
                "filterChains": l.filter_chains.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
                "listenerFilters": l.listener_filters.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            })
        }),
        ResourceType::Cluster => Cluster::decode(resource.value()).map(|c| {
            let kind = match c.cluster_discovery_type {
                Some(cluster::ClusterDiscoveryType::Type(t)) => cluster::DiscoveryType::try_from(t)
                    .map(|t| t.as_str_name())
                    .unwrap_or("UNKNOWN"),
                _ => "",
            };
            json!({
                "type": kind,
                "edsServiceName": c.eds_cluster_config.as_ref().map(|e| e.service_name.as_str()),
                "lbPolicy": cluster::LbPolicy::try_from(c.lb_policy).map(|p| p.as_str_name()).unwrap_or("UNKNOWN"),
            })
        }),
        ResourceType::ClusterLoadAssignment => {
            ClusterLoadAssignment::decode(resource.value()).map(|a| {
                let endpoints: Vec<Value> = a
                    .endpoints
                    .iter()
                    .flat_map(|l| l.lb_endpoints.iter())
                    .map(|e| match &e.host_identifier {
                        Some(lb_endpoint::HostIdentifier::Endpoint(e)) => address(e.address.as_ref()),
                        _ => Value::Null,
                    })
                    .collect();
                json!({"clusterName": a.cluster_name, "endpoints": endpoints})
            })
        }
        _ => Ok(json!({})),
    };
    match summary {
        Ok(summary) => map.extend(obj(summary)),
        Err(e) => {
            map.insert("error".into(), json!(e.to_string()));
        }
    }
    Value::Object(map)
}
