//! `/debug/authorize`: would ztunnel let this connection in, and why? Runs the authorization
//! evaluator over the served resources.
//!
//! - `source`: a SPIFFE identity (`spiffe://td/ns/x/sa/y`), an IP (a mesh workload's IP means
//!   its identity over HBONE; any other IP is plaintext), or `plaintext`;
//! - `destination`: a workload (uid, IP, or `ns/name`) or a Service (`ns/name`, `ns/hostname`,
//!   a hostname, or a VIP). People ask "may A call service B": for a Service the answer is
//!   explained for each workload behind it, on the port the Service's port maps to there. When
//!   the Service has a waypoint, the caller reaches the waypoint, which enforces the policies
//!   that target it (not evaluated here); the ztunnel in front of each workload then sees the
//!   waypoint's identity, so that is the source explained;
//! - `port`: the destination port (for a Service, one of its ports).

use std::net::IpAddr;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prost::Message;
use serde::Deserialize;
use serde_json::json;

use crate::debug::DebugState;
use crate::discovery::Snapshot;
use crate::discovery::evaluator::{Connection, Identity, applies_to, evaluate};
use crate::discovery::names::{self, ip_bytes, ip_from_bytes};
use crate::pb::security::Authorization;
use crate::pb::workload::{Address, Service, TunnelProtocol, Workload, address};

#[derive(Debug, Deserialize)]
pub struct ExplainQuery {
    pub source: Option<String>,
    pub destination: Option<String>,
    pub port: Option<String>,
}

fn bad(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

fn workloads(snapshot: &Snapshot) -> impl Iterator<Item = Workload> + '_ {
    snapshot
        .addresses
        .values()
        .filter(|r| !r.is_service())
        .filter_map(|r| match Address::decode(r.value()).ok()?.r#type {
            Some(address::Type::Workload(w)) => Some(w),
            _ => None,
        })
}

fn has_ip(w: &Workload, ip: &IpAddr) -> bool {
    let bytes = ip_bytes(ip);
    w.addresses.contains(&bytes)
}

fn services(snapshot: &Snapshot) -> impl Iterator<Item = Service> + '_ {
    snapshot
        .addresses
        .values()
        .filter(|r| r.is_service())
        .filter_map(|r| match Address::decode(r.value()).ok()?.r#type {
            Some(address::Type::Service(s)) => Some(s),
            _ => None,
        })
}

/// A Service's resource name and key in workloads' `services` maps: `ns/hostname`.
fn service_key(service: &Service) -> String {
    names::service_key(&service.namespace, &service.hostname)
}

/// The workloads among the names an index lookup gives, decoded, in name order.
fn workloads_named(snapshot: &Snapshot, names: Vec<String>) -> Vec<Workload> {
    let mut found: Vec<Workload> = names
        .iter()
        .filter_map(|name| snapshot.addresses.get(name.as_str()))
        .filter(|r| !r.is_service())
        .filter_map(|r| match Address::decode(r.value()).ok()?.r#type {
            Some(address::Type::Workload(w)) => Some(w),
            _ => None,
        })
        .collect();
    found.sort_by(|a, b| a.uid.cmp(&b.uid));
    found
}

/// What `destination` names.
enum Destination {
    Workload(Box<Workload>),
    Service(Box<Service>),
}

/// Finds the destination: a workload by IP, uid or `ns/name`, else a Service by VIP,
/// `ns/name`, `ns/hostname` or hostname.
fn destination(snapshot: &Snapshot, key: &str) -> Option<Destination> {
    let workload = |w: Workload| Destination::Workload(Box::new(w));
    let service = |s: Service| Destination::Service(Box::new(s));
    if let Ok(ip) = key.parse::<IpAddr>() {
        let bytes = ip_bytes(&ip);
        return workloads(snapshot)
            .find(|w| has_ip(w, &ip))
            .map(workload)
            .or_else(|| {
                services(snapshot)
                    .find(|s| s.addresses.iter().any(|a| a.address == bytes))
                    .map(service)
            });
    }
    if let Some(w) = workloads(snapshot).find(|w| w.uid == key) {
        return Some(workload(w));
    }
    match key.split_once('/') {
        Some((namespace, name)) => workloads(snapshot)
            .find(|w| w.namespace == namespace && w.name == name)
            .map(workload)
            .or_else(|| {
                services(snapshot)
                    .find(|s| s.namespace == namespace && (s.name == name || s.hostname == name))
                    .map(service)
            }),
        None => services(snapshot).find(|s| s.hostname == key).map(service),
    }
}

/// The workloads behind a Service (those whose `services` map names it), from the index's
/// members of the Service.
fn backends(snapshot: &Snapshot, service: &Service) -> Vec<Workload> {
    workloads_named(snapshot, snapshot.lookup_addresses(&service_key(service)))
}

/// The port a connection to `service`'s `port` reaches on `workload`: the workload's own
/// mapping (a named target port resolved for it), else the Service's numeric target port,
/// else the same port.
fn target_port(service: &Service, workload: &Workload, port: u16) -> u16 {
    let mapped = |ports: &[crate::pb::workload::Port]| {
        ports
            .iter()
            .find(|p| p.service_port == u32::from(port) && p.target_port != 0)
            .and_then(|p| u16::try_from(p.target_port).ok())
    };
    workload
        .services
        .get(&service_key(service))
        .and_then(|list| mapped(&list.ports))
        .or_else(|| mapped(&service.ports))
        .unwrap_or(port)
}

fn identity_of(w: &Workload, trust_domain: &str) -> Identity {
    Identity {
        trust_domain: if w.trust_domain.is_empty() {
            trust_domain.to_string()
        } else {
            w.trust_domain.clone()
        },
        namespace: w.namespace.clone(),
        service_account: w.service_account.clone(),
    }
}

/// The source identity and IP.
fn source(
    snapshot: &Snapshot,
    text: &str,
    trust_domain: &str,
) -> Result<(Option<Identity>, IpAddr), String> {
    let unspecified = IpAddr::from([0, 0, 0, 0]);
    if text == "plaintext" {
        return Ok((None, unspecified));
    }
    if let Some(rest) = text.strip_prefix("spiffe://") {
        let parts: Vec<&str> = rest.split('/').collect();
        return match parts.as_slice() {
            [td, "ns", ns, "sa", sa] => Ok((
                Some(Identity {
                    trust_domain: td.to_string(),
                    namespace: ns.to_string(),
                    service_account: sa.to_string(),
                }),
                unspecified,
            )),
            _ => Err(format!(
                "source {text:?}: expected spiffe://<td>/ns/<ns>/sa/<sa>"
            )),
        };
    }
    let ip: IpAddr = text
        .parse()
        .map_err(|_| format!("source {text:?}: expected a SPIFFE identity, an IP, or plaintext"))?;
    let workload = workloads(snapshot).find(|w| has_ip(w, &ip));
    let identity = workload
        .filter(|w| w.tunnel_protocol == TunnelProtocol::Hbone as i32)
        .map(|w| identity_of(&w, trust_domain));
    Ok((identity, ip))
}

pub async fn authorize(State(state): State<DebugState>, Query(q): Query<ExplainQuery>) -> Response {
    let Some(snapshot) = state.snapshots.borrow().clone() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response();
    };
    let (Some(source_text), Some(destination_text), Some(port_text)) =
        (q.source, q.destination, q.port)
    else {
        return bad("source, destination and port are required".into());
    };
    let Ok(port) = port_text.parse::<u16>() else {
        return bad(format!("port {port_text:?} is not a port number"));
    };
    let (identity, source_ip) = match source(&snapshot, &source_text, &state.settings.trust_domain)
    {
        Ok(source) => source,
        Err(message) => return bad(message),
    };
    let Some(target) = destination(&snapshot, &destination_text) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!(
                "no workload or service {destination_text:?} (a workload uid, IP or ns/name; \
                 a service ns/name, ns/hostname, hostname or VIP)"
            )})),
        )
            .into_response();
    };
    let policies: Vec<Authorization> = snapshot
        .authorizations
        .values()
        .filter_map(|r| Authorization::decode(r.value()).ok())
        .collect();
    let source_json = |identity: &Option<Identity>, ip: IpAddr| {
        json!({
            "identity": identity.as_ref().map(|i| format!("spiffe://{}", i.principal())),
            "ip": ip.to_string(),
        })
    };
    let service = match target {
        Destination::Workload(target) => {
            let mut answer = explain(&policies, &target, &identity, source_ip, port);
            answer["source"] = source_json(&identity, source_ip);
            return Json(answer).into_response();
        }
        Destination::Service(service) => service,
    };
    if !service.ports.is_empty()
        && !service
            .ports
            .iter()
            .any(|p| p.service_port == u32::from(port))
    {
        let ports: Vec<u32> = service.ports.iter().map(|p| p.service_port).collect();
        return bad(format!(
            "service {} has no port {port} (its ports: {ports:?})",
            service_key(&service)
        ));
    }
    // Through a waypoint, the workloads' ztunnels see the waypoint's identity.
    // The waypoint's lookup key (`ns/hostname` or `network/ip`), as the index keeps it.
    let waypoint_key = snapshot
        .addresses
        .get(service_key(&service).as_str())
        .and_then(|r| r.waypoint());
    let (hop_identity, hop_ip, waypoint) = match waypoint_key {
        Some(key) => {
            let pods = workloads_named(&snapshot, snapshot.lookup_addresses(&key));
            let first = pods.first();
            let identity = first.map(|w| identity_of(w, &state.settings.trust_domain));
            let ip = first
                .and_then(|w| w.addresses.first())
                .and_then(|a| ip_from_bytes(a))
                .unwrap_or(IpAddr::from([0, 0, 0, 0]));
            let note = if first.is_some() {
                "the caller reaches the waypoint, which enforces the policies that target it or \
                 this service (not evaluated here); each workload's ztunnel then sees the \
                 waypoint's identity"
            } else {
                "the waypoint has no workloads in the mesh: nothing can reach this service \
                 through it; each workload is explained for an unidentified caller"
            };
            let described = json!({
                "address": key.as_str(),
                "identity": identity.as_ref().map(|i| format!("spiffe://{}", i.principal())),
                "workloads": pods.iter().map(|w| w.uid.clone()).collect::<Vec<_>>(),
                "note": note,
            });
            (identity, ip, Some(described))
        }
        None => (identity.clone(), source_ip, None),
    };
    let answers: Vec<serde_json::Value> = backends(&snapshot, &service)
        .iter()
        .map(|w| {
            let to = target_port(&service, w, port);
            explain(&policies, w, &hop_identity, hop_ip, to)
        })
        .collect();
    let allowed = answers.iter().filter(|a| a["allowed"] == true).count();
    let decision = match (allowed, answers.len()) {
        (_, 0) => "DENY",
        (a, n) if a == n => "ALLOW",
        (0, _) => "DENY",
        _ => "MIXED",
    };
    let reason = match (allowed, answers.len()) {
        (_, 0) => "no workloads behind the service".to_string(),
        (a, n) => format!("{a} of {n} workloads allow it"),
    };
    Json(json!({
        "allowed": !answers.is_empty() && allowed == answers.len(),
        "decision": decision,
        "reason": reason,
        "source": source_json(&identity, source_ip),
        "destination": {
            "service": service_key(&service),
            "port": port,
        },
        "waypoint": waypoint,
        "workloads": answers,
    }))
    .into_response()
}

/// ztunnel's decision for one connection to `target`, with the policy and rule that decided
/// and the policies it considered.
fn explain(
    policies: &[Authorization],
    target: &Workload,
    identity: &Option<Identity>,
    source_ip: IpAddr,
    port: u16,
) -> serde_json::Value {
    let refs: Vec<&Authorization> = policies.iter().collect();
    let destination_ip = target
        .addresses
        .first()
        .and_then(|a| ip_from_bytes(a))
        .unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let connection = Connection {
        source_identity: identity.clone(),
        source_ip,
        destination_ip,
        destination_port: port,
    };
    let decision = evaluate(&refs, target, &connection);
    let mut considered: Vec<String> = policies
        .iter()
        .filter(|p| applies_to(p, target))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    considered.sort();
    json!({
        "allowed": decision.allowed,
        "decision": if decision.allowed { "ALLOW" } else { "DENY" },
        "reason": decision.reason.to_string(),
        "policy": decision.policy,
        "rule": decision.rule,
        "considered": considered,
        "destination": {"uid": target.uid, "ip": destination_ip.to_string(), "port": port},
    })
}
