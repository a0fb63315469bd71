//! `/debug/authorize`: would ztunnel let this connection in, and why? Runs the authorization
//! evaluator over the served resources.
//!
//! - `source`: a SPIFFE identity (`spiffe://td/ns/x/sa/y`), an IP (a mesh workload's IP means
//!   its identity over HBONE; any other IP is plaintext), or `plaintext`;
//! - `destination`: a workload uid, an IP, or `ns/name`;
//! - `port`: the destination port.

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
use crate::discovery::names::{ip_bytes, ip_from_bytes};
use crate::pb::security::Authorization;
use crate::pb::workload::{Address, TunnelProtocol, Workload, address};

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
        .filter_map(|r| match Address::decode(&r.value()[..]).ok()?.r#type {
            Some(address::Type::Workload(w)) => Some(w),
            _ => None,
        })
}

fn has_ip(w: &Workload, ip: &IpAddr) -> bool {
    let bytes = ip_bytes(ip);
    w.addresses.contains(&bytes)
}

/// Finds the destination workload by uid, IP or `ns/name`.
fn destination(snapshot: &Snapshot, key: &str) -> Option<Workload> {
    if let Ok(ip) = key.parse::<IpAddr>() {
        return workloads(snapshot).find(|w| has_ip(w, &ip));
    }
    if let Some(w) = workloads(snapshot).find(|w| w.uid == key) {
        return Some(w);
    }
    let (namespace, name) = key.split_once('/')?;
    workloads(snapshot).find(|w| w.namespace == namespace && w.name == name)
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
            Json(json!({"error": format!("no workload {destination_text:?} (a uid, an IP, or ns/name)")})),
        )
            .into_response();
    };
    let policies: Vec<Authorization> = snapshot
        .authorizations
        .values()
        .filter_map(|r| Authorization::decode(&r.value()[..]).ok())
        .collect();
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
    let decision = evaluate(&refs, &target, &connection);
    let mut considered: Vec<String> = policies
        .iter()
        .filter(|p| applies_to(p, &target))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    considered.sort();
    Json(json!({
        "allowed": decision.allowed,
        "decision": if decision.allowed { "ALLOW" } else { "DENY" },
        "reason": decision.reason.to_string(),
        "policy": decision.policy,
        "rule": decision.rule,
        "considered": considered,
        "source": {
            "identity": identity.map(|i| format!("spiffe://{}", i.principal())),
            "ip": source_ip.to_string(),
        },
        "destination": {"uid": target.uid, "ip": destination_ip.to_string(), "port": port},
    }))
    .into_response()
}
