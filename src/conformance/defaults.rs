//! The one normalisation of expectations, and it is narrow on purpose.
//!
//! The fixture header's "Note on defaults": istio's unit tests feed raw objects, so a few
//! expectations (target_port 0 for an unset Service targetPort, an empty service_account) reflect
//! skipped API-server defaulting; ambientd's manifests source applies those defaults, as a cluster
//! would; "treat such values as targetPort = port and serviceAccountName = default".
//!
//! So, and only when the raw input object really lacks the field:
//! * a Pod workload's expected `service_account` that is `""`/`null` (or unlisted under
//!   `exact: true`) becomes `default` when the Pod has no `spec.serviceAccountName` /
//!   `spec.serviceAccount`;
//! * an expected `target_port` of 0 (or omitted) for a port of a *Kubernetes Service* becomes the
//!   port when that Service port has no `targetPort` - both in `Service.ports` and in a workload's
//!   `services` map entry for that Service.
//!
//! A named targetPort still expects 0, and every other defaulting difference (e.g. `ipFamilies`)
//! is left alone. Each rewrite is returned as a note.

use std::collections::BTreeMap;

use crate::discovery::Settings;
use serde_json::{Value, json};

use super::runner::RawKey;

/// Raw objects currently applied, by `(kind, namespace, name)`.
type Raw = BTreeMap<RawKey, Value>;

fn raw<'a>(raw: &'a Raw, kind: &str, namespace: &str, name: &str) -> Option<&'a Value> {
    raw.get(&(kind.to_string(), namespace.to_string(), name.to_string()))
}

/// A value the API server would have defaulted: missing, `null` or `""`.
fn unset(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    }
}

/// An expected port number that reads as 0 (omitted, `null` or `0`).
fn zero(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Number(n)) => n.as_u64() == Some(0),
        Some(_) => false,
    }
}

/// The raw Kubernetes Service behind a service key `<ns>/<name>.<ns>.svc.<domain>`.
fn kube_service<'a>(settings: &Settings, raw_objects: &'a Raw, key: &str) -> Option<&'a Value> {
    let (namespace, hostname) = key.split_once('/')?;
    let name = hostname.strip_suffix(&format!(".{namespace}.svc.{}", settings.domain))?;
    raw(raw_objects, "Service", namespace, name)
}

/// Whether the raw Service's port `service_port` (preferring list position `index`) has no
/// targetPort.
fn target_port_unset(service: &Value, index: Option<usize>, service_port: u64) -> bool {
    let Some(Value::Array(ports)) = service.pointer("/spec/ports") else {
        return false;
    };
    let is_port = |p: &&Value| p.get("port").and_then(Value::as_u64) == Some(service_port);
    let port = index
        .and_then(|i| ports.get(i))
        .filter(is_port)
        .or_else(|| ports.iter().find(is_port));
    port.is_some_and(|p| unset(p.get("targetPort")))
}

/// Normalises one expected workload (see the module docs). Returns it and notes of what changed.
pub(super) fn workload(
    settings: &Settings,
    raw_objects: &Raw,
    uid: &str,
    mut expected: Value,
) -> (Value, Vec<String>) {
    let mut notes = Vec::new();
    let Some(fields) = expected.as_object_mut() else {
        return (expected, notes);
    };
    // Pod workloads: `<cluster>//Pod/<ns>/<name>`.
    let pod = uid
        .strip_prefix(&format!("{}//Pod/", settings.cluster_id))
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(ns, name)| raw(raw_objects, "Pod", ns, name));
    if let Some(pod) = pod {
        let exact = fields.get("exact") == Some(&Value::Bool(true));
        let listed = fields.get("service_account");
        let expects_empty = match listed {
            None => exact,
            Some(v) => unset(Some(v)),
        };
        let pod_lacks_sa = unset(pod.pointer("/spec/serviceAccountName"))
            && unset(pod.pointer("/spec/serviceAccount"));
        if expects_empty && pod_lacks_sa {
            fields.insert("service_account".into(), json!("default"));
            notes.push(format!(
                "defaults: workload {uid:?} service_account \"\" -> \"default\" (header note on defaults)"
            ));
        }
    }
    if let Some(Value::Object(services)) = fields.get_mut("services") {
        for (key, entry) in services.iter_mut() {
            let Some(service) = kube_service(settings, raw_objects, key) else {
                continue;
            };
            let Some(Value::Object(ports)) = entry.get_mut("ports") else {
                continue;
            };
            for (service_port, target_port) in ports.iter_mut() {
                let Ok(number) = service_port.parse::<u64>() else {
                    continue;
                };
                if zero(Some(target_port)) && target_port_unset(service, None, number) {
                    *target_port = json!(number);
                    notes.push(format!(
                        "defaults: workload {uid:?} services[{key:?}] port {number}: target 0 -> {number} (header note on defaults)"
                    ));
                }
            }
        }
    }
    (expected, notes)
}

/// Normalises one expected service (see the module docs). Returns it and notes of what changed.
pub(super) fn service(
    settings: &Settings,
    raw_objects: &Raw,
    key: &str,
    mut expected: Value,
) -> (Value, Vec<String>) {
    let mut notes = Vec::new();
    let Some(service) = kube_service(settings, raw_objects, key) else {
        return (expected, notes);
    };
    let Some(Value::Array(ports)) = expected.get_mut("ports") else {
        return (expected, notes);
    };
    for (i, port) in ports.iter_mut().enumerate() {
        let Some(fields) = port.as_object_mut() else {
            continue;
        };
        let Some(number) = fields.get("service_port").and_then(Value::as_u64) else {
            continue;
        };
        if zero(fields.get("target_port")) && target_port_unset(service, Some(i), number) {
            fields.insert("target_port".into(), json!(number));
            notes.push(format!(
                "defaults: service {key:?} ports[{i}] (port {number}): target_port 0 -> {number} (header note on defaults)"
            ));
        }
    }
    (expected, notes)
}
