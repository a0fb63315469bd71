//! The status istiod writes on a managed waypoint Gateway and on GatewayClass
//! `istio-waypoint` (istio/istio `pilot/pkg/config/kube/gateway/conversion.go`), from istio/istio
//! `pilot/pkg/config/kube/gateway/{gateway_collection.go,conversion.go}`
//! (`reportGatewayStatus`, `buildListener`), `gatewaycommon/context.go`
//! (`ResolveGatewayInstances`), `gatewaycommon/conversion.go` (`SetProgrammedCondition`,
//! `ReportListenerCondition`, `GenerateGatewaySupportedKinds`) and
//! `gatewaycommon/gatewayclass.go`. Pure: the controller writes what this returns.
//!
//! As in istiod, the new status starts from the object's current one: conditions of other
//! types and fields not computed here are kept, a condition keeps its place and, while its
//! status holds, its `lastTransitionTime`; addresses once written are never cleared.
//!
//! Left out: listener conflicts (two listeners on one port; istiod marks them Conflicted),
//! listener TLS (a Gateway's HTTPS or TLS listener counts as served, and TLS listeners list
//! only TLSRoute), `allowedRoutes`, ListenerSets, and the hint istiod gives when the Service
//! has endpoints on other ports (a managed waypoint's Service serves every listener port).
//! `attachedRoutes` is 0: ambientd does not count routes whose parent is a waypoint Gateway.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::render::{CONTROLLER_NAME, GatewayInfo, ListenerInfo, deployment_name};

/// What the controller knows of the waypoint's Service `<name>.<ns>.svc.<domain>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceState {
    pub exists: bool,
    /// Its ClusterIPs (all families).
    pub cluster_ips: Vec<String>,
    /// Whether it has ready endpoints: without them the Gateway gets no address.
    pub has_instances: bool,
}

/// The Gateway annotation that narrows `status.addresses` to `IPAddress` or `Hostname`; the
/// waypoint class reports both.
pub const ADDRESS_TYPE_ANNOTATION: &str = "networking.istio.io/address-type";
/// The only listener a waypoint expects.
const WAYPOINT_PORT: u16 = 15008;
const WAYPOINT_PROTOCOL: &str = "HBONE";
/// Listener protocols istiod can serve; a listener with another is invalid.
const SUPPORTED_PROTOCOLS: [&str; 5] = ["HTTP", "HTTPS", "TLS", "TCP", "HBONE"];
const NO_ERRORS: &str = "No errors found";

/// One condition as decided, before it is merged into the current ones.
pub(crate) struct Condition {
    kind: &'static str,
    status: bool,
    reason: &'static str,
    message: String,
}

impl Condition {
    pub(crate) fn new(
        kind: &'static str,
        status: bool,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Condition {
            kind,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// The Gateway's whole `status` object (addresses, conditions, listeners) as istiod writes
/// it: addresses the ClusterIPs as `IPAddress` then the hostname as `Hostname`, once the
/// Service has ready endpoints; conditions Accepted, Programmed (with the Service it is
/// assigned to, or why not) and ResolvedRefs; one entry per listener, where one that is not
/// 15008/HBONE is not Accepted (`UnsupportedProtocol`). `now` (RFC 3339) is the
/// `lastTransitionTime` of a condition that is new or changed status; `previous` is the
/// Gateway's current status.
pub fn gateway_status(
    gateway: &GatewayInfo,
    service: &ServiceState,
    domain: &str,
    now: &str,
    previous: Option<&Value>,
) -> Value {
    let hostname = format!(
        "{}.{}.svc.{domain}",
        deployment_name(gateway),
        gateway.namespace
    );
    let resolved = resolve(&hostname, service, &gateway.listeners);
    let mut status = previous
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let generation = gateway.generation;

    let listeners = listener_statuses(gateway, status.get("listeners"), now);
    status.insert("listeners".into(), listeners);

    let conditions = vec![
        accepted(&gateway.listeners),
        programmed(&resolved),
        Condition::new(
            "ResolvedRefs",
            true,
            "ResolvedRefs",
            "All references resolved",
        ),
    ];
    let merged = merge_conditions(status.get("conditions"), conditions, generation, now);
    status.insert("conditions".into(), merged);

    let addresses = addresses(gateway, &resolved);
    if !addresses.is_empty() {
        status.insert("addresses".into(), Value::Array(addresses));
    }
    Value::Object(status)
}

/// What istiod's `ResolveGatewayInstances` finds for the one Service, per listener port.
struct Resolved {
    /// `<hostname>:<port>` for each port with instances, sorted.
    internal: Vec<String>,
    /// The Service's addresses when any port has instances, sorted.
    ips: Vec<String>,
    /// Why a port is not served, sorted.
    warnings: Vec<String>,
    /// False when the Service is missing; otherwise the address may just not be ready yet.
    usable: bool,
}

fn resolve(hostname: &str, service: &ServiceState, listeners: &[ListenerInfo]) -> Resolved {
    let mut resolved = Resolved {
        internal: Vec::new(),
        ips: Vec::new(),
        warnings: Vec::new(),
        usable: true,
    };
    if !service.exists {
        resolved
            .warnings
            .push(format!("hostname \"{hostname}\" not found"));
        resolved.usable = false;
        return resolved;
    }
    let ports: BTreeSet<u16> = listeners.iter().map(|l| l.port).collect();
    let mut internal = BTreeSet::new();
    let mut ips = BTreeSet::new();
    for port in ports {
        if service.has_instances {
            internal.insert(format!("{hostname}:{port}"));
            ips.extend(
                service
                    .cluster_ips
                    .iter()
                    .filter(|ip| !ip.is_empty() && ip.as_str() != "None")
                    .cloned(),
            );
        } else {
            resolved
                .warnings
                .push(format!("no instances found for hostname \"{hostname}\""));
        }
    }
    resolved.internal = internal.into_iter().collect();
    resolved.ips = ips.into_iter().collect();
    resolved.warnings.sort();
    resolved
}

/// Accepted, unless listeners are invalid (a protocol istiod does not know): the Gateway
/// stays Accepted while any listener is valid, and says `ListenersNotValid` either way.
fn accepted(listeners: &[ListenerInfo]) -> Condition {
    let total = listeners.len();
    let valid = listeners
        .iter()
        .filter(|l| SUPPORTED_PROTOCOLS.contains(&l.protocol.as_str()))
        .count();
    if total > 0 && valid == 0 {
        Condition::new(
            "Accepted",
            false,
            "ListenersNotValid",
            "None of the Gateway's listeners are valid",
        )
    } else if valid < total {
        Condition::new(
            "Accepted",
            true,
            "ListenersNotValid",
            "One or more of the Gateway's listeners are invalid",
        )
    } else {
        Condition::new("Accepted", true, "Accepted", "Resource accepted")
    }
}

/// Programmed with the Service it is assigned to, or False with why (istiod's
/// `SetProgrammedCondition`).
fn programmed(resolved: &Resolved) -> Condition {
    let services = human_join(&resolved.internal);
    if resolved.warnings.is_empty() {
        let message = if services.is_empty() {
            "Resource programmed".to_string()
        } else {
            format!("Resource programmed, assigned to service(s) {services}")
        };
        return Condition::new("Programmed", true, "Programmed", message);
    }
    let warnings = resolved.warnings.join("; ");
    let message = if services.is_empty() {
        format!("Failed to assign to any requested addresses: {warnings}")
    } else {
        format!(
            "Assigned to service(s) {services}, but failed to assign to all requested addresses: {warnings}"
        )
    };
    let reason = if resolved.usable {
        "AddressNotAssigned"
    } else {
        "AddressNotUsable"
    };
    Condition::new("Programmed", false, reason, message)
}

/// `a`, `a and b`, `a, b, and c`.
fn human_join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

/// The addresses to report, IPs first; empty until the Service has ready endpoints.
fn addresses(gateway: &GatewayInfo, resolved: &Resolved) -> Vec<Value> {
    let wanted = gateway
        .annotations
        .iter()
        .find(|(k, _)| k == ADDRESS_TYPE_ANNOTATION)
        .map_or("", |(_, v)| v.as_str());
    let mut values: Vec<&str> = Vec::new();
    if wanted != "Hostname" {
        values.extend(resolved.ips.iter().map(String::as_str));
    }
    if wanted != "IPAddress" {
        for host_port in &resolved.internal {
            let host = host_port
                .rsplit_once(':')
                .map_or(host_port.as_str(), |(h, _)| h);
            if !values.contains(&host) {
                values.push(host);
            }
        }
    }
    values
        .into_iter()
        .map(|value| {
            let kind = if value.parse::<IpAddr>().is_ok() {
                "IPAddress"
            } else {
                "Hostname"
            };
            json!({"type": kind, "value": value})
        })
        .collect()
}

/// One entry per listener, in order, each merged with the current entry at its index (as
/// istiod does); entries for listeners no longer in the spec are dropped.
fn listener_statuses(gateway: &GatewayInfo, previous: Option<&Value>, now: &str) -> Value {
    let mut entries: Vec<Value> = previous
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, listener) in gateway.listeners.iter().enumerate() {
        let current = entries.get(i).and_then(|e| e.get("conditions"));
        let conditions = merge_conditions(
            current,
            listener_conditions(listener),
            gateway.generation,
            now,
        );
        let entry = json!({
            "name": listener.name,
            "attachedRoutes": 0,
            "supportedKinds": supported_kinds(&listener.protocol),
            "conditions": conditions,
        });
        if i < entries.len() {
            entries[i] = entry;
        } else {
            entries.push(entry);
        }
    }
    let mut wanted: BTreeSet<&str> = gateway.listeners.iter().map(|l| l.name.as_str()).collect();
    entries.retain(|e| e["name"].as_str().is_some_and(|name| wanted.remove(name)));
    Value::Array(entries)
}

fn listener_conditions(listener: &ListenerInfo) -> Vec<Condition> {
    let accepted = if listener.port == WAYPOINT_PORT && listener.protocol == WAYPOINT_PROTOCOL {
        Condition::new("Accepted", true, "Accepted", NO_ERRORS)
    } else {
        Condition::new(
            "Accepted",
            false,
            "UnsupportedProtocol",
            "Expected a single listener on port 15008 with protocol \"HBONE\"",
        )
    };
    vec![
        accepted,
        Condition::new("Conflicted", false, "NoConflicts", NO_ERRORS),
        Condition::new("Programmed", true, "Programmed", NO_ERRORS),
        Condition::new("ResolvedRefs", true, "ResolvedRefs", NO_ERRORS),
    ]
}

/// The route kinds a listener of this protocol takes (none for HBONE).
fn supported_kinds(protocol: &str) -> Value {
    let kinds: &[&str] = match protocol {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TCP" => &["TCPRoute"],
        "TLS" => &["TLSRoute"],
        _ => &[],
    };
    kinds
        .iter()
        .map(|kind| json!({"group": "gateway.networking.k8s.io", "kind": kind}))
        .collect()
}

/// The current conditions with each decided one put in place of its type (or appended):
/// its `lastTransitionTime` is kept while its status holds, else `now`. Conditions of other
/// types stay. `observedGeneration` is left out when 0, as istiod's JSON does. Gateway,
/// listener and route status all merge this way (istiod's `SetListenerConditions`).
pub(crate) fn merge_conditions(
    current: Option<&Value>,
    decided: Vec<Condition>,
    generation: i64,
    now: &str,
) -> Value {
    let mut conditions: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for condition in decided {
        let status = if condition.status { "True" } else { "False" };
        let existing = conditions
            .iter()
            .position(|c| c["type"].as_str() == Some(condition.kind));
        let since = existing
            .map(|i| &conditions[i])
            .filter(|c| c["status"].as_str() == Some(status))
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or(now);
        let mut value = Map::new();
        value.insert("type".into(), condition.kind.into());
        value.insert("status".into(), status.into());
        value.insert("reason".into(), condition.reason.into());
        value.insert("message".into(), condition.message.into());
        value.insert("lastTransitionTime".into(), since.into());
        if generation != 0 {
            value.insert("observedGeneration".into(), generation.into());
        }
        match existing {
            Some(i) => conditions[i] = Value::Object(value),
            None => conditions.push(Value::Object(value)),
        }
    }
    Value::Array(conditions)
}

/// GatewayClass `istio-waypoint` as istiod creates it when missing (create only: an existing
/// class is never changed), so that waypoint Gateways have a class to name.
pub fn waypoint_class() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": "istio-waypoint"},
        "spec": {
            "controllerName": CONTROLLER_NAME,
            "description": "The default Istio waypoint GatewayClass",
        },
    })
}

/// The class's status: `previous` with `Accepted=True` "Handled by Istio controller", so
/// tools see the class is served.
pub fn class_status(generation: i64, now: &str, previous: Option<&Value>) -> Value {
    let mut status = previous
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let accepted = Condition::new("Accepted", true, "Accepted", "Handled by Istio controller");
    let conditions = merge_conditions(status.get("conditions"), vec![accepted], generation, now);
    status.insert("conditions".into(), conditions);
    Value::Object(status)
}

#[cfg(test)]
mod tests;
