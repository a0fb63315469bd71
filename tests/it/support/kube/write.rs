//! The fake's single-object side: GET one object, and the writes — POST (create, 409
//! `AlreadyExists`), PUT (replace, 409 `Conflict` on a stale resourceVersion), PATCH (JSON merge,
//! strategic merge treated as JSON merge, JSON patch, and server-side apply with field owners
//! and conflicts, which kube-lease-manager relies on), DELETE (with a resourceVersion
//! precondition), and the `status` subresource of every resource. Writes bump the
//! resourceVersion and reach watches like the test helpers' changes do.
//!
//! The request log is in `log`, the patch algorithms in `patch`.

// A refused write is its HTTP response; this is test code, off any hot path.
#![allow(clippy::result_large_err)]

use super::http::{error_response, route, status};
use super::patch::{changed_leaves, json_patch, leaves, merge_patch, strip_nulls};
use super::*;

impl FakeApiServer {
    /// Marks a namespace terminating (a deletion in progress): `deletionTimestamp` set and
    /// `status.phase: Terminating`. Creates in it are then refused with 403, as the API server
    /// does.
    pub fn terminate_namespace(&self, name: &str) {
        let mut namespace = self.get("v1", "Namespace", "", name).unwrap_or_else(
            || json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        );
        namespace["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        namespace["status"] = json!({"phase": "Terminating"});
        self.apply(namespace);
    }

    /// One stored object (with `apiVersion`/`kind`); `namespace` is `""` for cluster-scoped.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let state = self.shared.lock();
        let index = state
            .resources
            .iter()
            .position(|r| r.api_version == api_version && r.kind == kind)?;
        let stored = state.objects[index].get(&(namespace.to_string(), name.to_string()))?;
        Some(full(&state.resources[index], &stored.item))
    }
}

/// A stored item with its `apiVersion`/`kind` put back.
fn full(resource: &Resource, item: &[u8]) -> Value {
    let mut value: Value = serde_json::from_slice(item).expect("stored json");
    value["apiVersion"] = json!(resource.api_version);
    value["kind"] = json!(resource.kind);
    value
}

/// Stores `object` (metadata.name and, if namespaced, metadata.namespace set) at a new
/// resourceVersion and tells the watches. Returns the object as stored, with `apiVersion`/`kind`.
pub(super) fn store(
    shared: &Shared,
    state: &mut FakeState,
    index: usize,
    mut object: Value,
) -> Value {
    let resource = state.resources[index].clone();
    let meta = object["metadata"].as_object_mut().expect("metadata");
    let name = meta["name"].as_str().expect("metadata.name").to_string();
    let namespace = if resource.namespaced {
        meta.get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string()
    } else {
        meta.remove("namespace");
        String::new()
    };
    if resource.namespaced {
        meta.insert("namespace".into(), json!(namespace));
    }
    state.rv += 1;
    let rv = state.rv;
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let kind = &resource.kind;
    meta.entry("uid")
        .or_insert_with(|| json!(format!("uid-{kind}-{namespace}-{name}-{rv}")));
    meta.entry("creationTimestamp")
        .or_insert_with(|| json!("2026-01-01T00:00:00Z"));
    let fields = fields_of(&object);
    if let Some(map) = object.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
    }
    let item = Bytes::from(serde_json::to_vec(&object).expect("json"));
    let key = (namespace.clone(), name);
    let old = state.objects[index].insert(
        key,
        Stored {
            fields: fields.clone(),
            item: item.clone(),
        },
    );
    let change = Change {
        rv,
        resource: index,
        change: if old.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        },
        namespace,
        old_fields: old.map(|o| o.fields),
        fields,
        item: item.clone(),
    };
    publish(shared, state, change);
    full(&resource, &item)
}

/// Removes an object and tells the watches. Returns it as last stored, if it was there.
pub(super) fn remove(
    shared: &Shared,
    state: &mut FakeState,
    index: usize,
    namespace: &str,
    name: &str,
) -> Option<Value> {
    let key = (namespace.to_string(), name.to_string());
    let old = state.objects[index].remove(&key)?;
    state.managers.remove(&(index, key.0, key.1));
    state.rv += 1;
    let rv = state.rv;
    // The deleted object, at the deletion's resourceVersion.
    let mut value: Value = serde_json::from_slice(&old.item).expect("stored json");
    value["metadata"]["resourceVersion"] = json!(rv.to_string());
    let item = Bytes::from(serde_json::to_vec(&value).expect("json"));
    let change = Change {
        rv,
        resource: index,
        change: ChangeType::Deleted,
        namespace: namespace.to_string(),
        old_fields: Some(old.fields.clone()),
        fields: old.fields,
        item: item.clone(),
    };
    publish(shared, state, change);
    Some(full(&state.resources[index], &item))
}

fn publish(shared: &Shared, state: &mut FakeState, change: Change) {
    let change = Arc::new(change);
    state.log.push(change.clone());
    // Sent under the state lock, so a new watch's backlog and live events never overlap.
    let _ = shared.changes.send(Broadcast::Change(change));
}

fn json_response(code: StatusCode, value: &Value) -> Response {
    (
        code,
        [("content-type", "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// A missing object (404-object-not-found.txt).
fn not_found_object(resource: &Resource, name: &str) -> Response {
    let mut body = status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", resource.plural),
    );
    body["details"] = json!({"name": name, "kind": resource.plural});
    json_response(StatusCode::NOT_FOUND, &body)
}

/// Metadata the server owns: kept from the stored object on every write.
const SERVER_METADATA: [&str; 4] = [
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "deletionTimestamp",
];

/// Why a write is refused.
type Refusal = Response;

pub(super) fn handle(
    shared: &Shared,
    method: &Method,
    uri: &Uri,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut state = shared.lock();
    let Some(target) = route(&state, uri.path()) else {
        return super::http::not_found();
    };
    let resource = state.resources[target.resource].clone();
    let namespace = target.namespace.clone().unwrap_or_default();
    if resource.namespaced && target.namespace.is_none() {
        return error_response(405, "MethodNotAllowed", "writes need a namespace");
    }
    if let Some(sub) = &target.subresource
        && sub != "status"
    {
        return super::http::not_found();
    }
    let status_only = target.subresource.is_some();
    let manager = query
        .get("fieldManager")
        .cloned()
        .unwrap_or_else(|| "unknown".to_string());
    let dry_run = query.contains_key("dryRun");
    let key = |name: &str| (namespace.clone(), name.to_string());
    let stored = |state: &FakeState, name: &str| {
        state.objects[target.resource]
            .get(&key(name))
            .map(|s| full(&resource, &s.item))
    };
    let result: Result<(StatusCode, Value), Refusal> = (|| match (method.as_str(), &target.name) {
        ("GET", Some(name)) => stored(&state, name)
            .map(|o| (StatusCode::OK, o))
            .ok_or_else(|| not_found_object(&resource, name)),
        ("POST", None) => {
            let object = parse_body(body, headers)?;
            let name = object["metadata"]["name"]
                .as_str()
                .ok_or_else(|| error_response(422, "Invalid", "metadata.name: Required value"))?
                .to_string();
            if status_only {
                return Err(error_response(
                    405,
                    "MethodNotAllowed",
                    "POST on a subresource",
                ));
            }
            check_namespace(&state, &resource, &namespace)?;
            if stored(&state, &name).is_some() {
                let mut body = status(
                    409,
                    "AlreadyExists",
                    &format!("{} \"{name}\" already exists", resource.plural),
                );
                body["details"] = json!({"name": name, "kind": resource.plural});
                return Err(json_response(StatusCode::CONFLICT, &body));
            }
            let object = prepared(object, &resource, &namespace, &name, None);
            let owners = leaves(&object);
            Ok((
                StatusCode::CREATED,
                commit(
                    shared,
                    &mut state,
                    &target,
                    &name,
                    object,
                    Some((&manager, owners, true)),
                    dry_run,
                ),
            ))
        }
        ("PUT", Some(name)) => {
            let old = stored(&state, name).ok_or_else(|| not_found_object(&resource, name))?;
            let new = parse_body(body, headers)?;
            check_version(&new, &old, &resource, name)?;
            let object = status_split(new, &old, status_only);
            let object = prepared(object, &resource, &namespace, name, Some(&old));
            let owners = changed_leaves(&old, &object);
            Ok((
                StatusCode::OK,
                commit(
                    shared,
                    &mut state,
                    &target,
                    name,
                    object,
                    Some((&manager, owners, false)),
                    dry_run,
                ),
            ))
        }
        ("PATCH", Some(name)) => {
            let content_type = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let old = stored(&state, name);
            if content_type == "application/apply-patch+yaml" {
                let applied = parse_body(body, headers)?;
                let force = query.get("force").map(String::as_str) == Some("true");
                if query.get("fieldManager").is_none() {
                    return Err(error_response(
                        422,
                        "Invalid",
                        "fieldManager: Required value for apply",
                    ));
                }
                let code = if old.is_some() {
                    StatusCode::OK
                } else {
                    StatusCode::CREATED
                };
                let base = match &old {
                    Some(old) => old.clone(),
                    None => {
                        check_namespace(&state, &resource, &namespace)?;
                        json!({"metadata": {"name": name}})
                    }
                };
                let mut applied_fields = applied.clone();
                if status_only {
                    applied_fields = json!({"status": applied["status"]});
                }
                let mut mine = leaves(&applied_fields);
                mine.retain(|path, _| !path.starts_with("apiVersion") && !path.starts_with("kind"));
                if !force {
                    let owners = state
                        .managers
                        .get(&(target.resource, namespace.clone(), name.clone()))
                        .cloned()
                        .unwrap_or_default();
                    let current = leaves(&base);
                    let conflicts: Vec<(String, String)> = mine
                        .iter()
                        .filter_map(|(path, value)| {
                            let owner = owners.get(path)?;
                            (*owner != manager && current.get(path) != Some(value))
                                .then(|| (owner.clone(), format!(".{path}")))
                        })
                        .collect();
                    if !conflicts.is_empty() {
                        return Err(apply_conflict(&conflicts));
                    }
                }
                let mut object = base.clone();
                merge_patch(&mut object, &strip_nulls(applied_fields));
                check_version(&object, &base, &resource, name)?;
                let object = prepared(object, &resource, &namespace, name, old.as_ref());
                let owners = mine;
                return Ok((
                    code,
                    commit(
                        shared,
                        &mut state,
                        &target,
                        name,
                        object,
                        Some((&manager, owners, false)),
                        dry_run,
                    ),
                ));
            }
            let old = old.ok_or_else(|| not_found_object(&resource, name))?;
            let mut object = old.clone();
            match content_type.as_str() {
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    let patch = parse_body(body, headers)?;
                    merge_patch(&mut object, &patch);
                }
                "application/json-patch+json" => {
                    let patch: Value = serde_json::from_slice(body)
                        .map_err(|e| error_response(400, "BadRequest", &e.to_string()))?;
                    json_patch(&mut object, &patch)
                        .map_err(|message| error_response(422, "Invalid", &message))?;
                }
                other => {
                    return Err(error_response(
                        415,
                        "UnsupportedMediaType",
                        &format!("the fake does not take PATCH bodies of type {other:?}"),
                    ));
                }
            }
            check_version(&object, &old, &resource, name)?;
            let object = status_split(object, &old, status_only);
            let object = prepared(object, &resource, &namespace, name, Some(&old));
            let owners = changed_leaves(&old, &object);
            Ok((
                StatusCode::OK,
                commit(
                    shared,
                    &mut state,
                    &target,
                    name,
                    object,
                    Some((&manager, owners, false)),
                    dry_run,
                ),
            ))
        }
        ("DELETE", Some(name)) => {
            let old = stored(&state, name).ok_or_else(|| not_found_object(&resource, name))?;
            if !body.is_empty()
                && let Ok(options) = serde_json::from_slice::<Value>(body)
                && let Some(rv) = options["preconditions"]["resourceVersion"].as_str()
                && old["metadata"]["resourceVersion"].as_str() != Some(rv)
            {
                return Err(conflict(&resource, name));
            }
            if dry_run {
                return Ok((StatusCode::OK, old));
            }
            let gone =
                remove(shared, &mut state, target.resource, &namespace, name).expect("present");
            Ok((StatusCode::OK, gone))
        }
        _ => Err(error_response(
            405,
            "MethodNotAllowed",
            "the fake does not do that",
        )),
    })();
    match result {
        Ok((code, value)) => json_response(code, &value),
        Err(response) => response,
    }
}

/// Stores a write (unless a dry run) and records its field owners: `owners` maps leaf paths to
/// anything; `replace_all` makes `manager` the only owner (a create).
fn commit(
    shared: &Shared,
    state: &mut FakeState,
    target: &super::http::Target,
    name: &str,
    object: Value,
    owners: Option<(&String, BTreeMap<String, Value>, bool)>,
    dry_run: bool,
) -> Value {
    if dry_run {
        return object;
    }
    let namespace = target.namespace.clone().unwrap_or_default();
    let stored = store(shared, state, target.resource, object);
    let present = leaves(&stored);
    let map = state
        .managers
        .entry((target.resource, namespace, name.to_string()))
        .or_default();
    if let Some((manager, owned, replace_all)) = owners {
        if replace_all {
            map.clear();
        }
        for path in owned.into_keys() {
            map.insert(path, manager.clone());
        }
    }
    // Fields that are gone have no owner.
    map.retain(|path, _| present.contains_key(path));
    stored
}

/// An object ready to store: name and namespace from the path, the server's metadata kept.
fn prepared(
    mut object: Value,
    resource: &Resource,
    namespace: &str,
    name: &str,
    old: Option<&Value>,
) -> Value {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["metadata"]["name"] = json!(name);
    if resource.namespaced {
        object["metadata"]["namespace"] = json!(namespace);
    }
    let meta = object["metadata"].as_object_mut().expect("metadata");
    meta.remove("managedFields");
    for field in SERVER_METADATA {
        meta.remove(field);
        if let Some(value) = old.and_then(|o| o["metadata"].get(field))
            && !value.is_null()
        {
            meta.insert(field.to_string(), value.clone());
        }
    }
    // A new resourceVersion is assigned on store.
    meta.remove("resourceVersion");
    object
}

/// A server-side apply conflict as the real server words it (409-apply-conflict.txt): the
/// count, the other managers, the fields, and one cause per field.
fn apply_conflict(conflicts: &[(String, String)]) -> Response {
    let n = conflicts.len();
    let message = if let [(owner, field)] = conflicts {
        format!("Apply failed with 1 conflict: conflict with \"{owner}\": {field}")
    } else {
        let mut by_owner: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (owner, field) in conflicts {
            by_owner.entry(owner).or_default().push(field);
        }
        let parts: Vec<String> = by_owner
            .iter()
            .map(|(owner, fields)| {
                let list: Vec<String> = fields.iter().map(|f| format!("- {f}")).collect();
                format!("conflicts with \"{owner}\":\n{}", list.join("\n"))
            })
            .collect();
        format!("Apply failed with {n} conflicts: {}", parts.join("\n"))
    };
    let mut body = status(409, "Conflict", &message);
    body["details"] = json!({"causes": conflicts
        .iter()
        .map(|(owner, field)| json!({
            "reason": "FieldManagerConflict",
            "message": format!("conflict with \"{owner}\""),
            "field": field,
        }))
        .collect::<Vec<_>>()});
    json_response(StatusCode::CONFLICT, &body)
}

/// A write at a stale resourceVersion (409-conflict-stale-resourceversion.txt).
fn conflict(resource: &Resource, name: &str) -> Response {
    let mut body = status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            resource.plural
        ),
    );
    body["details"] = json!({"name": name, "kind": resource.plural});
    json_response(StatusCode::CONFLICT, &body)
}

/// A write naming a resourceVersion must name the current one.
fn check_version(new: &Value, old: &Value, resource: &Resource, name: &str) -> Result<(), Refusal> {
    match new["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() && Some(rv) != old["metadata"]["resourceVersion"].as_str() => {
            Err(conflict(resource, name))
        }
        _ => Ok(()),
    }
}

/// Creates need an existing namespace that is not terminating.
fn check_namespace(state: &FakeState, resource: &Resource, namespace: &str) -> Result<(), Refusal> {
    if !resource.namespaced {
        return Ok(());
    }
    let Some(index) = state
        .resources
        .iter()
        .position(|r| r.api_version == "v1" && r.kind == "Namespace")
    else {
        return Ok(());
    };
    let Some(stored) = state.objects[index].get(&(String::new(), namespace.to_string())) else {
        let mut body = status(
            404,
            "NotFound",
            &format!("namespaces \"{namespace}\" not found"),
        );
        body["details"] = json!({"name": namespace, "kind": "namespaces"});
        return Err(json_response(StatusCode::NOT_FOUND, &body));
    };
    let ns: Value = serde_json::from_slice(&stored.item).expect("stored json");
    if ns["status"]["phase"] == "Terminating" || !ns["metadata"]["deletionTimestamp"].is_null() {
        return Err(error_response(
            403,
            "Forbidden",
            &format!(
                "{} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                resource.plural
            ),
        ));
    }
    Ok(())
}

fn parse_body(body: &[u8], headers: &HeaderMap) -> Result<Value, Refusal> {
    let yaml = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("yaml"));
    match serde_json::from_slice::<Value>(body) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err(error_response(
            400,
            "BadRequest",
            "the body is not an object",
        )),
        Err(e) if yaml => {
            let text = std::str::from_utf8(body)
                .map_err(|_| error_response(400, "BadRequest", "not UTF-8"))?;
            ambientd::kube::objects::parse_yaml(text)
                .ok()
                .and_then(|docs| docs.into_iter().next())
                .ok_or_else(|| error_response(400, "BadRequest", &e.to_string()))
        }
        Err(e) => Err(error_response(400, "BadRequest", &e.to_string())),
    }
}

/// A write through `/status` changes only the status (the rest stays `old`); a write to the
/// object itself changes everything but the status, as the API server does.
fn status_split(new: Value, old: &Value, status_only: bool) -> Value {
    if status_only {
        let mut object = old.clone();
        object["status"] = new["status"].clone();
        object
    } else {
        let mut object = new;
        if !old["status"].is_null() {
            object["status"] = old["status"].clone();
        }
        object
    }
}
