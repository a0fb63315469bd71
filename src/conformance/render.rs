//! Decoded protos rendered in the fixture's value encodings (see the header's "Value encodings"),
//! in a *minimal* form: every field at its proto3 default (0, false, "", empty list or map, unset
//! message, first enum value) is left out, so "unlisted means default" is simply "absent" on both
//! sides of a comparison. A message that is set but empty renders as `{}`; a oneof holding
//! `google.protobuf.Empty` renders as `{"presence": {}}`.

use std::net::IpAddr;

use crate::pb::security::{
    self, Action, Authorization, Match, ServiceAccountMatch, StringMatch, string_match::MatchType,
};
use crate::pb::workload::{
    AppProtocol, ApplicationTunnel, Extension, GatewayAddress, IpFamilies, LoadBalancing,
    NetworkAddress, NetworkMode, Port, PortList, Service, TunnelProtocol, WeightedWaypoint,
    Workload, WorkloadStatus, WorkloadType, application_tunnel, gateway_address::Destination,
    load_balancing, service,
};
use serde_json::{Map, Value, json};

/// Builds a JSON object, leaving out proto3 defaults.
#[derive(Default)]
struct Obj(Map<String, Value>);

impl Obj {
    fn str(mut self, key: &str, value: &str) -> Self {
        if !value.is_empty() {
            self.0.insert(key.into(), json!(value));
        }
        self
    }

    fn num(mut self, key: &str, value: u32) -> Self {
        if value != 0 {
            self.0.insert(key.into(), json!(value));
        }
        self
    }

    fn flag(mut self, key: &str, value: bool) -> Self {
        if value {
            self.0.insert(key.into(), json!(true));
        }
        self
    }

    /// An enum by name; left out when its value is 0 (the first enum value).
    fn enumeration(mut self, key: &str, raw: i32, name: String) -> Self {
        if raw != 0 {
            self.0.insert(key.into(), json!(name));
        }
        self
    }

    fn list(mut self, key: &str, items: Vec<Value>) -> Self {
        if !items.is_empty() {
            self.0.insert(key.into(), Value::Array(items));
        }
        self
    }

    fn message(mut self, key: &str, value: Option<Value>) -> Self {
        if let Some(value) = value {
            self.0.insert(key.into(), value);
        }
        self
    }

    fn map(mut self, key: &str, map: Map<String, Value>) -> Self {
        if !map.is_empty() {
            self.0.insert(key.into(), Value::Object(map));
        }
        self
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

/// The name of a known enum value, or `UNKNOWN_ENUM_VALUE(n)` so a mismatch shows the number.
fn enum_name<E>(raw: i32, name: impl Fn(&E) -> &'static str) -> String
where
    E: TryFrom<i32>,
{
    E::try_from(raw).map_or_else(
        |_| format!("UNKNOWN_ENUM_VALUE({raw})"),
        |e| name(&e).into(),
    )
}

/// Raw network-order bytes as an IP string (or a visible marker when the length is wrong).
pub(super) fn ip(raw: &[u8]) -> String {
    match raw.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(raw).expect("4 bytes")).to_string(),
        16 => IpAddr::from(<[u8; 16]>::try_from(raw).expect("16 bytes")).to_string(),
        0 => String::new(),
        n => format!("<{n} bytes: {raw:02x?}>"),
    }
}

/// `"<network>/<ip>"`, or `"<network>/<ip>/<length>"` when `length` is set.
fn network_address(a: &NetworkAddress) -> String {
    match a.length {
        Some(length) => format!("{}/{}/{length}", a.network, ip(&a.address)),
        None => format!("{}/{}", a.network, ip(&a.address)),
    }
}

fn gateway_address(g: &GatewayAddress) -> Value {
    let obj = match &g.destination {
        Some(Destination::Hostname(h)) => Obj::default().message(
            "hostname",
            Some(
                Obj::default()
                    .str("namespace", &h.namespace)
                    .str("hostname", &h.hostname)
                    .done(),
            ),
        ),
        Some(Destination::Address(a)) => {
            Obj::default().message("address", Some(json!(network_address(a))))
        }
        None => Obj::default(),
    };
    obj.num("hbone_mtls_port", g.hbone_mtls_port).done()
}

fn extensions(list: &[Extension]) -> Vec<Value> {
    list.iter()
        .map(|e| {
            Obj::default()
                .str("name", &e.name)
                .message(
                    "config",
                    e.config.as_ref().map(|c| json!({"type_url": c.type_url})),
                )
                .done()
        })
        .collect()
}

/// `Workload.services`: `{"<ns>/<hostname>": {ports: {<service_port>: <target_port>}}}`. A port
/// carrying an app_protocol (which the map encoding cannot show) renders as an object, so that it
/// never silently matches; so does a repeated service port.
fn services_map(services: &std::collections::BTreeMap<String, PortList>) -> Map<String, Value> {
    services
        .iter()
        .map(|(key, list)| {
            let mut ports = Map::new();
            for p in &list.ports {
                let value = if p.app_protocol == 0 {
                    json!(p.target_port)
                } else {
                    json!({"target_port": p.target_port, "app_protocol": app_protocol(p.app_protocol)})
                };
                let mut port_key = p.service_port.to_string();
                while ports.contains_key(&port_key) {
                    port_key.push_str(" (repeated)");
                }
                ports.insert(port_key, value);
            }
            (key.clone(), Obj::default().map("ports", ports).done())
        })
        .collect()
}

fn app_protocol(raw: i32) -> String {
    enum_name(raw, AppProtocol::as_str_name)
}

pub(super) fn workload(w: &Workload) -> Value {
    Obj::default()
        .str("uid", &w.uid)
        .str("name", &w.name)
        .str("namespace", &w.namespace)
        .list(
            "addresses",
            w.addresses.iter().map(|a| json!(ip(a))).collect(),
        )
        .str("hostname", &w.hostname)
        .str("network", &w.network)
        .enumeration(
            "tunnel_protocol",
            w.tunnel_protocol,
            enum_name(w.tunnel_protocol, TunnelProtocol::as_str_name),
        )
        .str("trust_domain", &w.trust_domain)
        .str("service_account", &w.service_account)
        .message("waypoint", w.waypoint.as_ref().map(gateway_address))
        .message(
            "network_gateway",
            w.network_gateway.as_ref().map(gateway_address),
        )
        .str("node", &w.node)
        .str("canonical_name", &w.canonical_name)
        .str("canonical_revision", &w.canonical_revision)
        .enumeration(
            "workload_type",
            w.workload_type,
            enum_name(w.workload_type, WorkloadType::as_str_name),
        )
        .str("workload_name", &w.workload_name)
        .flag("native_tunnel", w.native_tunnel)
        .message(
            "application_tunnel",
            w.application_tunnel.as_ref().map(application_tunnel),
        )
        .map("services", services_map(&w.services))
        .list(
            "authorization_policies",
            w.authorization_policies.iter().map(|p| json!(p)).collect(),
        )
        .enumeration(
            "status",
            w.status,
            enum_name(w.status, WorkloadStatus::as_str_name),
        )
        .str("cluster_id", &w.cluster_id)
        .message(
            "locality",
            w.locality.as_ref().map(|l| {
                Obj::default()
                    .str("region", &l.region)
                    .str("zone", &l.zone)
                    .str("subzone", &l.subzone)
                    .done()
            }),
        )
        .enumeration(
            "network_mode",
            w.network_mode,
            enum_name(w.network_mode, NetworkMode::as_str_name),
        )
        .list("extensions", extensions(&w.extensions))
        .message(
            "capacity",
            w.capacity
                .as_ref()
                .map(|c| Obj::default().num("value", c.value).done()),
        )
        .done()
}

fn application_tunnel(t: &ApplicationTunnel) -> Value {
    Obj::default()
        .enumeration(
            "protocol",
            t.protocol,
            enum_name(t.protocol, application_tunnel::Protocol::as_str_name),
        )
        .num("port", t.port)
        .done()
}

fn service_port(p: &Port) -> Value {
    Obj::default()
        .num("service_port", p.service_port)
        .num("target_port", p.target_port)
        .enumeration("app_protocol", p.app_protocol, app_protocol(p.app_protocol))
        .done()
}

fn load_balancing(lb: &LoadBalancing) -> Value {
    Obj::default()
        .list(
            "routing_preference",
            lb.routing_preference
                .iter()
                .map(|s| json!(enum_name(*s, load_balancing::Scope::as_str_name)))
                .collect(),
        )
        .enumeration(
            "mode",
            lb.mode,
            enum_name(lb.mode, load_balancing::Mode::as_str_name),
        )
        .enumeration(
            "health_policy",
            lb.health_policy,
            enum_name(lb.health_policy, load_balancing::HealthPolicy::as_str_name),
        )
        .done()
}

fn weighted_waypoint(w: &WeightedWaypoint) -> Value {
    Obj::default()
        .message("destination", w.destination.as_ref().map(gateway_address))
        .num("weight", w.weight)
        .done()
}

pub(super) fn service(s: &Service) -> Value {
    Obj::default()
        .str("name", &s.name)
        .str("namespace", &s.namespace)
        .str("hostname", &s.hostname)
        .list(
            "addresses",
            s.addresses
                .iter()
                .map(|a| json!(network_address(a)))
                .collect(),
        )
        .list("ports", s.ports.iter().map(service_port).collect())
        .list(
            "subject_alt_names",
            s.subject_alt_names.iter().map(|n| json!(n)).collect(),
        )
        .message("waypoint", s.waypoint.as_ref().map(gateway_address))
        .message(
            "load_balancing",
            s.load_balancing.as_ref().map(load_balancing),
        )
        .enumeration(
            "ip_families",
            s.ip_families,
            enum_name(s.ip_families, IpFamilies::as_str_name),
        )
        .list("extensions", extensions(&s.extensions))
        .flag("canonical", s.canonical)
        .flag("ingress_use_waypoint", s.ingress_use_waypoint)
        .list(
            "weighted_waypoints",
            s.weighted_waypoints.iter().map(weighted_waypoint).collect(),
        )
        .enumeration(
            "visibility",
            s.visibility,
            enum_name(s.visibility, service::Visibility::as_str_name),
        )
        .done()
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

fn string_matches(list: &[StringMatch]) -> Vec<Value> {
    list.iter().map(string_match).collect()
}

fn service_accounts(list: &[ServiceAccountMatch]) -> Vec<Value> {
    list.iter()
        .map(|s| {
            Obj::default()
                .str("namespace", &s.namespace)
                .str("serviceAccount", &s.service_account)
                .done()
        })
        .collect()
}

/// `security.Address` as `"<ip>/<length>"`.
fn cidrs(list: &[security::Address]) -> Vec<Value> {
    list.iter()
        .map(|a| json!(format!("{}/{}", ip(&a.address), a.length)))
        .collect()
}

fn ports(list: &[u32]) -> Vec<Value> {
    list.iter().map(|p| json!(p)).collect()
}

fn authorization_match(m: &Match) -> Value {
    Obj::default()
        .list("namespaces", string_matches(&m.namespaces))
        .list("not_namespaces", string_matches(&m.not_namespaces))
        .list("service_accounts", service_accounts(&m.service_accounts))
        .list(
            "not_service_accounts",
            service_accounts(&m.not_service_accounts),
        )
        .list("principals", string_matches(&m.principals))
        .list("not_principals", string_matches(&m.not_principals))
        .list("source_ips", cidrs(&m.source_ips))
        .list("not_source_ips", cidrs(&m.not_source_ips))
        .list("destination_ips", cidrs(&m.destination_ips))
        .list("not_destination_ips", cidrs(&m.not_destination_ips))
        .list("destination_ports", ports(&m.destination_ports))
        .list("not_destination_ports", ports(&m.not_destination_ports))
        .list("extensions", extensions(&m.extensions))
        .done()
}

/// Our proto's `rules[].clauses[].matches[]` in the fixture's istio Go naming
/// `groups[].rules[].matches[]` (same field numbers, so the same bytes on the wire).
pub(super) fn authorization(a: &Authorization) -> Value {
    let groups = a
        .rules
        .iter()
        .map(|rule| {
            let clauses = rule
                .clauses
                .iter()
                .map(|clause| {
                    Obj::default()
                        .list(
                            "matches",
                            clause.matches.iter().map(authorization_match).collect(),
                        )
                        .done()
                })
                .collect();
            Obj::default().list("rules", clauses).done()
        })
        .collect();
    Obj::default()
        .str("name", &a.name)
        .str("namespace", &a.namespace)
        .enumeration(
            "scope",
            a.scope,
            enum_name(a.scope, security::Scope::as_str_name),
        )
        .enumeration("action", a.action, enum_name(a.action, Action::as_str_name))
        .list("groups", groups)
        .flag("dry_run", a.dry_run)
        .list("extensions", extensions(&a.extensions))
        .done()
}
