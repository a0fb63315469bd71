//! The JSON views: connections and their sync state, what each proxy was sent, and the mesh.

use crate::discovery::snapshot::Name;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::debug::{DebugState, render};
use crate::discovery::ResourceType;
use crate::discovery::model::status::{StatusCondition, StatusKind, StatusTarget};
use crate::discovery::names::TypeKind;
use crate::discovery::{Resource, Snapshot};
use crate::push::registry::{ClientView, ConnectionStatus, TypeStatus};

/// `time` as istiod's JSON writes a Go `time.Time`: RFC 3339 in UTC with the fraction of a second
/// trimmed of trailing zeros (`2026-11-30T10:20:15.123456789Z`); `null` for no time.
pub fn rfc3339(time: Option<SystemTime>) -> Value {
    let Some(time) = time else { return Value::Null };
    OffsetDateTime::from(time)
        .format(&Rfc3339)
        .map_or(Value::Null, Value::String)
}

#[derive(Debug, Default, Deserialize)]
pub struct NamespaceQuery {
    pub namespace: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ProxyQuery {
    #[serde(rename = "proxyID")]
    pub proxy_id: Option<String>,
}

fn in_namespace(c: &ConnectionStatus, namespace: &Option<String>) -> bool {
    namespace
        .as_ref()
        .is_none_or(|ns| c.proxy.as_ref().is_some_and(|p| &p.namespace == ns))
}

/// Whether the snapshot served is current, for each `/debug/syncz` entry's `source` field:
/// `current` is false while any kind's watch is failing; `failing` names those kinds, since
/// when, with their last error. A manifests source is always current.
pub fn source_status(state: &DebugState) -> Value {
    let Some(health) = &state.source_health else {
        return json!({"current": true, "failing": []});
    };
    let failing: Vec<Value> = health
        .kinds()
        .into_iter()
        .filter(|(_, h)| h.failing)
        .map(|(kind, h)| {
            json!({
                "kind": kind.to_string(),
                "since": rfc3339(h.failing_since),
                "reason": h.last_reason.map(|r| r.as_str()),
                "lastError": h.last_error,
                "errors": h.errors,
                "lastProgress": rfc3339(h.last_progress),
            })
        })
        .collect();
    json!({"current": failing.is_empty(), "failing": failing})
}

/// `/debug/syncz`: one object per connection, with per-type sent/acked nonces, and (our
/// addition to istiod's shape) whether the snapshot behind them is current.
pub async fn syncz(
    State(state): State<DebugState>,
    Query(q): Query<NamespaceQuery>,
) -> Json<Value> {
    let source = source_status(&state);
    let connections: Vec<Value> = state
        .registry
        .list()
        .iter()
        .filter(|c| in_namespace(c, &q.namespace))
        .map(|c| {
            let resources: BTreeMap<&str, Value> = c
                .types
                .iter()
                .map(|(kind, t)| (kind.type_url(), t))
                .chain(
                    c.waypoint_types
                        .iter()
                        .map(|(kind, t)| (kind.type_url(), t)),
                )
                .map(|(type_url, t)| {
                    (
                        type_url,
                        json!({
                            "sent": t.sent_nonce,
                            "acked": t.acked_nonce,
                            "sentTime": rfc3339(t.sent_at),
                            "ackedTime": rfc3339(t.acked_at),
                            "lastError": t.last_error,
                        }),
                    )
                })
                .collect();
            let proxy = c.proxy.clone().unwrap_or_default();
            json!({
                "proxy": c.proxy.as_ref().map(|p| p.proxy_id()),
                "connectionId": c.connection_id,
                "proxy_id": proxy.id,
                "proxy_type": proxy.id.split('~').next().unwrap_or_default(),
                "cluster_id": proxy.cluster_id,
                "istio_version": proxy.version,
                "resources": resources,
                "source": source,
            })
        })
        .collect();
    Json(Value::Array(connections))
}

fn connection_summary(c: &ConnectionStatus) -> Value {
    json!({
        "connectionId": c.connection_id,
        "connectedAt": rfc3339(Some(c.connected_at)),
        "address": c.peer,
        // What the connection holds back for a slow proxy: at most one queued response, and
        // each changed name once.
        "pending": {
            "queuedResponses": c.pending.queued_responses,
            "queuedBytes": c.pending.queued_bytes,
            "changedNames": c.pending.changed_names,
        },
    })
}

/// `/debug/connections`.
pub async fn connections(State(state): State<DebugState>) -> Json<Value> {
    let clients: Vec<Value> = state
        .registry
        .list()
        .iter()
        .map(connection_summary)
        .collect();
    Json(json!({"totalClients": clients.len(), "clients": clients}))
}

/// `/debug/adsz`: connections with metadata and subscriptions.
pub async fn adsz(State(state): State<DebugState>, Query(q): Query<ProxyQuery>) -> Json<Value> {
    let list = match &q.proxy_id {
        Some(id) => state.registry.find(id),
        None => state.registry.list(),
    };
    let clients: Vec<Value> = list
        .iter()
        .map(|c| {
            let mut summary = connection_summary(c);
            let proxy = c.proxy.clone().unwrap_or_default();
            let watches: BTreeMap<&str, Value> = c
                .types
                .iter()
                .map(|(kind, t)| (kind.type_url(), t))
                .chain(
                    c.waypoint_types
                        .iter()
                        .map(|(kind, t)| (kind.type_url(), t)),
                )
                .map(|(type_url, t)| {
                    let names = if t.wildcard {
                        json!([])
                    } else {
                        json!(t.names)
                    };
                    (type_url, names)
                })
                .collect();
            if let Value::Object(map) = &mut summary {
                map.insert("proxyId".into(), json!(proxy.id));
                map.insert(
                    "metadata".into(),
                    json!({
                        "NAME": proxy.name,
                        "NAMESPACE": proxy.namespace,
                        "NODE_NAME": proxy.node_name,
                        "CLUSTER_ID": proxy.cluster_id,
                    }),
                );
                map.insert("watches".into(), json!(watches));
                map.insert(
                    "wildcard".into(),
                    json!(
                        c.types
                            .iter()
                            .filter(|(_, t)| t.wildcard)
                            .map(|(k, _)| k.type_url())
                            .chain(
                                c.waypoint_types
                                    .iter()
                                    .filter(|(_, t)| t.wildcard)
                                    .map(|(k, _)| k.type_url())
                            )
                            .collect::<Vec<_>>()
                    ),
                );
            }
            summary
        })
        .collect();
    Json(json!({"totalClients": clients.len(), "clients": clients}))
}

#[derive(Debug, Default, Deserialize)]
pub struct ConfigDumpQuery {
    #[serde(rename = "proxyID")]
    pub proxy_id: Option<String>,
    /// Comma-separated short type names (`WDS`, `WADS`) or type URLs.
    pub types: Option<String>,
}

/// The types `config_dump` shows: the Address resources alone unless `types` names others
/// (`WDS` = Address, `WADS` = Authorization, or the type URLs), in push order.
pub fn dump_types(types: Option<&str>) -> Result<Vec<TypeKind>, String> {
    let names: Vec<&str> = types
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if names.is_empty() {
        return Ok(vec![TypeKind::Address]);
    }
    let mut wanted = Vec::new();
    for name in names {
        let kind = TypeKind::ALL
            .into_iter()
            .find(|k| type_name(*k).eq_ignore_ascii_case(name) || k.type_url() == name)
            .ok_or_else(|| {
                format!("unknown type {name:?}; known: WDS (Address), WADS (Authorization)")
            })?;
        wanted.push(kind);
    }
    Ok(TypeKind::ALL
        .into_iter()
        .filter(|k| wanted.contains(k))
        .collect())
}

/// The resources of one type a waypoint holds, by name.
fn waypoint_held(status: &TypeStatus) -> Vec<Arc<Resource>> {
    let Some(ClientView::Waypoint { config, kind }) = &status.view else {
        return Vec::new();
    };
    let Some(resources) = config.of(*kind) else {
        return Vec::new();
    };
    if status.wildcard {
        resources.values().cloned().collect()
    } else {
        status
            .names
            .iter()
            .filter_map(|name| resources.get(name.as_str()).cloned())
            .collect()
    }
}

/// The types a waypoint's `config_dump` shows: clusters, listeners and endpoints unless `types`
/// names some (`CDS`, `LDS`, `EDS`, or the type URLs), in push order.
pub fn waypoint_dump_types(types: Option<&str>) -> Result<Vec<ResourceType>, String> {
    let names: Vec<&str> = types
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    let envoy = [
        ResourceType::Cluster,
        ResourceType::ClusterLoadAssignment,
        ResourceType::Listener,
    ];
    if names.is_empty() {
        return Ok(envoy.to_vec());
    }
    let mut wanted = Vec::new();
    for name in names {
        let kind = envoy
            .into_iter()
            .find(|k| k.short_name().eq_ignore_ascii_case(name) || k.type_url() == name)
            .ok_or_else(|| format!("unknown waypoint type {name:?}; known: CDS, EDS, LDS"))?;
        wanted.push(kind);
    }
    Ok(envoy.into_iter().filter(|k| wanted.contains(k)).collect())
}

/// `/debug/config_dump?proxyID=[&types=]`: what that proxy holds, as istiod's Envoy-admin-style
/// `ConfigDump`: `{"configs": [Any...]}`, each resource as protojson writes an `Any` (see
/// [`render::any`]), sorted by name within each type. For a waypoint, its Envoy resources as
/// [`render::envoy`] summarises them ([`waypoint_dump_types`]). 400 without proxyID or with an
/// unknown type, 404 when no such proxy is connected here.
pub async fn config_dump(
    State(state): State<DebugState>,
    Query(q): Query<ConfigDumpQuery>,
) -> Response {
    let Some(id) = q.proxy_id.filter(|id| !id.is_empty()) else {
        return (StatusCode::BAD_REQUEST, "proxyID is required\n").into_response();
    };
    let Some(connection) = state.registry.find(&id).into_iter().next() else {
        return (
            StatusCode::NOT_FOUND,
            format!("proxy {id:?} is not connected to this replica\n"),
        )
            .into_response();
    };
    if !connection.waypoint_types.is_empty() {
        return match waypoint_dump_types(q.types.as_deref()) {
            Ok(kinds) => {
                let configs: Vec<Value> = kinds
                    .into_iter()
                    .filter_map(|kind| connection.waypoint_types.get(&kind))
                    .flat_map(waypoint_held)
                    .map(|resource| render::envoy(&resource))
                    .collect();
                Json(json!({ "configs": configs })).into_response()
            }
            Err(error) => (StatusCode::BAD_REQUEST, format!("types: {error}\n")).into_response(),
        };
    }
    let kinds = match dump_types(q.types.as_deref()) {
        Ok(kinds) => kinds,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("types: {error}\n")).into_response();
        }
    };
    let latest = state.snapshots.borrow().clone();
    let configs: Vec<Value> = kinds
        .into_iter()
        .flat_map(|kind| held(&connection, kind, latest.as_deref()))
        .map(|(_, resource)| render::any(&resource))
        .collect();
    Json(json!({ "configs": configs })).into_response()
}

/// The resources of `kind` a connection's proxy holds, by name. An on-demand client's come
/// from the latest snapshot when it still has the version the proxy holds (a newer one is on
/// its way otherwise, and the resource is left out: a dump has nowhere to say "content
/// unknown").
pub(crate) fn held(
    connection: &ConnectionStatus,
    kind: TypeKind,
    latest: Option<&Snapshot>,
) -> Vec<(String, Arc<Resource>)> {
    let Some(status) = connection.types.get(&kind) else {
        return Vec::new();
    };
    let mut entries: Vec<(String, Arc<Resource>)> = match &status.view {
        Some(ClientView::Snapshot(snapshot)) => snapshot
            .resources(kind)
            .iter()
            .map(|(name, r)| (name.to_string(), r.clone()))
            .collect(),
        Some(ClientView::Held(held)) => held
            .iter()
            .filter_map(|(name, version)| {
                let resource = latest?
                    .resources(kind)
                    .get(name.as_str())
                    .cloned()
                    .filter(|r| r.version.is(version))?;
                Some((name.clone(), resource))
            })
            .collect(),
        Some(ClientView::Waypoint { .. }) | None => Vec::new(),
    };
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

/// `/debug/ambientz[?namespace=]`: workloads, services and policies, each policy with its
/// conversion status, and the `istio.io/WaypointBound` condition of each object that has one.
pub async fn ambientz(
    State(state): State<DebugState>,
    Query(q): Query<NamespaceQuery>,
) -> Response {
    let Some(snapshot) = state.snapshots.borrow().clone() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response();
    };
    let wanted = |value: &Value| {
        q.namespace
            .as_ref()
            .is_none_or(|ns| value.get("namespace").and_then(Value::as_str) == Some(ns.as_str()))
    };
    let mut workloads = Vec::new();
    let mut services = Vec::new();
    let mut names: Vec<&Name> = snapshot.addresses.keys().collect();
    names.sort();
    for name in names {
        let resource = &snapshot.addresses[name];
        let value = render::address(resource);
        if !wanted(&value) {
            continue;
        }
        if resource.is_service() {
            services.push(value);
        } else {
            workloads.push(value);
        }
    }
    let mut policy_names: Vec<&Name> = snapshot.authorizations.keys().collect();
    policy_names.sort();
    let mut policies: Vec<Value> = policy_names
        .into_iter()
        .map(|name| {
            let mut value = render::resource(&snapshot.authorizations[name]);
            if let (Value::Object(map), Some(status)) =
                (&mut value, snapshot.policy_status.get(&**name))
            {
                map.insert("status".into(), status_json(status));
            }
            value
        })
        .filter(|v| wanted(v))
        .collect();
    // Policies that are not sent to ztunnel still have a status worth seeing.
    let mut unsent: Vec<(&String, _)> = snapshot
        .policy_status
        .iter()
        .filter(|(name, _)| !snapshot.authorizations.contains_key(name.as_str()))
        .collect();
    unsent.sort_by(|a, b| a.0.cmp(b.0));
    for (name, status) in unsent {
        let (namespace, policy) = name.split_once('/').unwrap_or(("", name));
        let value = json!({"name": policy, "namespace": namespace, "sent": false, "status": status_json(status)});
        if wanted(&value) {
            policies.push(value);
        }
    }
    // The WaypointBound condition of Services, ServiceEntries and WorkloadEntries, and the
    // VisibilityApplied condition of ServiceEntries.
    let conditions = |kinds: &[StatusKind]| -> Vec<Value> {
        let mut held: Vec<(&StatusTarget, &StatusCondition)> = snapshot
            .statuses
            .iter()
            .filter(|(target, _)| kinds.contains(&target.kind))
            .filter_map(|(target, desired)| Some((target, &**desired.condition.as_ref()?)))
            .collect();
        held.sort_by(|a, b| a.0.cmp(b.0));
        held.into_iter()
            .map(|(target, condition)| {
                json!({"kind": target.kind.as_str(), "namespace": target.namespace,
                       "name": target.name, "status": status_json(condition)})
            })
            .filter(|v| wanted(v))
            .collect()
    };
    let bound = conditions(&[
        StatusKind::Service,
        StatusKind::ServiceEntry,
        StatusKind::WorkloadEntry,
    ]);
    let visibility = conditions(&[StatusKind::ServiceEntryVisibility]);
    Json(
        json!({"workloads": workloads, "services": services, "policies": policies,
                "waypointBound": bound, "visibilityApplied": visibility,
                "generation": snapshot.generation}),
    )
    .into_response()
}

fn status_json(status: &StatusCondition) -> Value {
    json!({
        "type": status.condition_type,
        "status": if status.status { "True" } else { "False" },
        "reason": status.reason,
        "message": status.message,
    })
}

/// The type kinds as the debug views name them.
pub fn type_name(kind: TypeKind) -> &'static str {
    match kind {
        TypeKind::Address => "WDS",
        TypeKind::Authorization => "WADS",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_writes_times_as_go_time_json_does() {
        let at = |secs, nanos| Some(SystemTime::UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(
            rfc3339(at(1_796_034_015, 123_456_789)),
            json!("2026-11-30T10:20:15.123456789Z")
        );
        // Trailing zeros of the fraction are trimmed, and a whole second has none (RFC3339Nano).
        assert_eq!(
            rfc3339(at(1_796_034_015, 120_000_000)),
            json!("2026-11-30T10:20:15.12Z")
        );
        assert_eq!(rfc3339(at(0, 0)), json!("1970-01-01T00:00:00Z"));
        assert_eq!(rfc3339(None), Value::Null);
    }

    #[test]
    fn config_dump_shows_addresses_unless_types_selects_others() {
        use TypeKind::{Address, Authorization};
        assert_eq!(dump_types(None), Ok(vec![Address]));
        assert_eq!(dump_types(Some("")), Ok(vec![Address]));
        assert_eq!(dump_types(Some("WADS")), Ok(vec![Authorization]));
        assert_eq!(
            dump_types(Some("WADS, wds,WADS")),
            Ok(vec![Address, Authorization])
        );
        assert_eq!(
            dump_types(Some("type.googleapis.com/istio.security.Authorization")),
            Ok(vec![Authorization])
        );
        assert!(dump_types(Some("WDS,CDS")).unwrap_err().contains("\"CDS\""));
    }
}
