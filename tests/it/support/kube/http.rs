//! The fake's HTTP side: routing, list, watch and TokenReview (single objects and writes are
//! in `write`).

use super::*;

/// `path=value`, `path==value` and `path!=value`, joined by commas.
struct FieldSelector(Vec<(&'static str, bool, String)>);

impl FieldSelector {
    fn parse(text: Option<&String>) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.map(String::as_str).unwrap_or("").split(',') {
            if term.is_empty() {
                continue;
            }
            let (path, negate, value) = if let Some((p, v)) = term.split_once("!=") {
                (p, true, v)
            } else if let Some((p, v)) = term.split_once("==") {
                (p, false, v)
            } else if let Some((p, v)) = term.split_once('=') {
                (p, false, v)
            } else {
                return Err(format!("invalid field selector {term:?}"));
            };
            let path = SELECTABLE
                .iter()
                .find(|s| **s == path)
                .ok_or_else(|| format!("field label not supported: {path}"))?;
            terms.push((*path, negate, value.to_string()));
        }
        Ok(FieldSelector(terms))
    }

    fn matches(&self, fields: &Fields) -> bool {
        self.0.iter().all(|(path, negate, value)| {
            let actual = fields.get(path).map(String::as_str).unwrap_or("");
            (actual == value) != *negate
        })
    }
}

pub(super) fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

pub(super) fn error_response(code: u16, reason: &str, message: &str) -> Response {
    let status_code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status_code,
        [("content-type", "application/json")],
        status(code, reason, message).to_string(),
    )
        .into_response()
}

pub(super) struct Target {
    pub(super) resource: usize,
    pub(super) namespace: Option<String>,
    /// `.../plural/NAME`: one object (get, replace, patch, delete).
    pub(super) name: Option<String>,
    /// `.../plural/NAME/SUB`: a subresource such as `status`.
    pub(super) subresource: Option<String>,
}

/// The resource, namespace, name and subresource a path names, if the fake serves it (else
/// 404). `/api/v1/namespaces/NS/PLURAL[/NAME[/SUB]]` is namespaced when PLURAL is a served
/// namespaced resource; otherwise it is `/api/v1/PLURAL[/NAME[/SUB]]` (so
/// `/api/v1/namespaces/NS/status` is Namespace NS's status).
pub(super) fn route(state: &FakeState, path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => (version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let served = |plural: &str, namespaced: bool| {
        state.resources.iter().position(|r| {
            r.api_version == api_version
                && r.plural == plural
                && r.served
                && r.namespaced == namespaced
        })
    };
    let owned = |s: Option<&&str>| s.map(|s| s.to_string());
    if let ["namespaces", namespace, plural, tail @ ..] = rest
        && tail.len() <= 2
        && let Some(resource) = served(plural, true)
    {
        return Some(Target {
            resource,
            namespace: Some(namespace.to_string()),
            name: owned(tail.first()),
            subresource: owned(tail.get(1)),
        });
    }
    let [plural, tail @ ..] = rest else {
        return None;
    };
    if tail.len() > 2 {
        return None;
    }
    let resource = match served(plural, false) {
        Some(resource) => resource,
        // A namespaced resource listed across all namespaces.
        None if tail.is_empty() => served(plural, true)?,
        None => return None,
    };
    Some(Target {
        resource,
        namespace: None,
        name: owned(tail.first()),
        subresource: owned(tail.get(1)),
    })
}

/// A path the server does not serve (a group/version, or a resource in a served group, whose
/// CRD is not installed). A real kube-apiserver answers this from its HTTP mux, not from a
/// resource handler: a plain-text `404 page not found`, no JSON `Status` (captured in
/// tests/fixtures/kube-responses/404-group-not-served.txt and
/// 404-resource-not-in-served-group.txt). kube-rs cannot parse it into a `Status`, so code that
/// tells "not served" from other errors must look at the HTTP code.
pub(super) fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [("content-type", "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

/// An injected failure as the real server words it: a 404 is a missing object
/// (404-object-not-found.txt), a 403 an RBAC refusal (403-forbidden.txt, with this fake's
/// fixed user), a 409 a stale resourceVersion (409-conflict-stale-resourceversion.txt).
fn injected(code: u16, request: &Request) -> Response {
    let call = request.api_call();
    let (verb, group, plural, namespace, name) = match &call {
        Some(c) => (
            c.verb.as_str(),
            c.group.as_str(),
            c.resource.as_str(),
            c.namespace.clone(),
            c.name.clone().unwrap_or_default(),
        ),
        None => ("get", "", "", None, String::new()),
    };
    let mut body = match code {
        403 => {
            let scope = match &namespace {
                Some(ns) => format!("in the namespace \"{ns}\""),
                None => "at the cluster scope".to_string(),
            };
            let what = if name.is_empty() {
                plural.to_string()
            } else {
                format!("{plural} \"{name}\"")
            };
            status(
                403,
                "Forbidden",
                &format!(
                    "{what} is forbidden: User \"{FAKE_USER}\" cannot {verb} resource \"{plural}\" in API group \"{group}\" {scope}"
                ),
            )
        }
        404 => status(404, "NotFound", &format!("{plural} \"{name}\" not found")),
        // API priority and fairness shedding load (no capture: worded as kubernetes
        // staging/src/k8s.io/apiserver/pkg/server/filters/priority-and-fairness.go answers).
        429 => {
            let mut body = status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            );
            body["details"] = json!({"retryAfterSeconds": 1});
            body
        }
        409 => status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on {plural} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        ),
        503 => status(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        _ => status(
            code,
            "InternalError",
            "Internal error occurred: injected failure",
        ),
    };
    if matches!(code, 403 | 404 | 409) {
        let mut details = json!({"kind": plural});
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        // The real server orders `name` before `kind`; JSON readers do not care.
        body["details"] = details;
    }
    let status_code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        status_code,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response();
    if matches!(code, 429 | 503) {
        // Both come with a hint of when to come back, which kube's client honours.
        response
            .headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    response
}

/// The user an injected 403 names (the real message names the caller).
pub const FAKE_USER: &str = "system:serviceaccount:istio-system:ambientd";

pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: HashMap<String, String> = Query::try_from_uri(&uri)
        .map(|Query(q)| q)
        .unwrap_or_default();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let request = Request {
        method: method.to_string(),
        path: uri.path().to_string(),
        query: uri.query().unwrap_or_default().to_string(),
        content_type,
    };
    let (failure, interposed) = {
        let mut state = shared.lock();
        let failure = state
            .take_failure(&request)
            .or_else(|| state.take_call_failure(&request));
        let interposed = if failure.is_none() && request.is_write() {
            state.take_interposed(&request)
        } else {
            None
        };
        state.requests.push(request.clone());
        (failure, interposed)
    };
    if let Some(code) = failure {
        return injected(code, &request);
    }
    if let Some(object) = interposed {
        // Another client's write lands first.
        let mut state = shared.lock();
        let index = state.resources.iter().position(|r| {
            r.api_version == object["apiVersion"].as_str().unwrap_or_default()
                && r.kind == object["kind"].as_str().unwrap_or_default()
        });
        if let Some(index) = index {
            super::write::store(&shared, &mut state, index, object);
        }
    }
    if method == Method::POST && uri.path() == "/apis/authentication.k8s.io/v1/tokenreviews" {
        let delay = shared.lock().token_review_delay();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        return token_review(&shared, &body);
    }
    if uri.path() == "/.well-known/openid-configuration" {
        let body = json!({"issuer": "https://kubernetes.default.svc.cluster.local",
                          "jwks_uri": "https://127.0.0.1/openid/v1/jwks"});
        return ([("content-type", "application/json")], body.to_string()).into_response();
    }
    if uri.path() == "/openid/v1/jwks" {
        let jwks = shared
            .lock()
            .jwks
            .clone()
            .unwrap_or_else(|| json!({"keys": []}));
        return (
            [("content-type", "application/jwk-set+json")],
            jwks.to_string(),
        )
            .into_response();
    }
    let single = route(&shared.lock(), uri.path()).is_some_and(|t| t.name.is_some());
    if method != Method::GET || single {
        return super::write::handle(&shared, &method, &uri, &query, &headers, &body);
    }
    let selector = match FieldSelector::parse(query.get("fieldSelector")) {
        Ok(selector) => selector,
        Err(message) => return error_response(400, "BadRequest", &message),
    };
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if watching && shared.lock().hangs(&request) {
        return super::faults::silent_watch(shared.clone(), request);
    }
    if !watching {
        // A hung list answers only once the hang is lifted (the client has given up by then).
        shared.hang_while_faulty(&request).await;
    }
    if watching {
        let mut hold = shared.hold.subscribe();
        let _ = hold.wait_for(|held| !held).await;
        watch(&shared, &uri, &query, selector)
    } else {
        list(&shared, &uri, &query, &selector)
    }
}

fn list(
    shared: &Shared,
    uri: &Uri,
    query: &HashMap<String, String>,
    selector: &FieldSelector,
) -> Response {
    let mut state = shared.lock();
    let Some(target) = route(&state, uri.path()) else {
        return not_found();
    };
    let resource = state.resources[target.resource].clone();
    let mut pages = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => match state.pages.remove(token) {
            Some(pages) => pages,
            // As the real server words an expired continue token.
            None => {
                return error_response(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter, or use the continue token \
                     in this response to retrieve the remainder of the results. Continuing with the \
                     provided token results in an inconsistent list - objects that were created, \
                     modified, or deleted between the time the first chunk was returned and now may \
                     show up in the list.",
                );
            }
        },
        None => Pages {
            rv: state.rv,
            items: state.objects[target.resource]
                .values()
                .filter(|s| {
                    target
                        .namespace
                        .as_ref()
                        .is_none_or(|ns| s.fields["metadata.namespace"] == *ns)
                })
                .filter(|s| selector.matches(&s.fields))
                .map(|s| s.item.clone())
                .collect(),
        },
    };
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page: Vec<Bytes> = pages.items.drain(..limit.min(pages.items.len())).collect();
    let rest = std::mem::take(&mut pages.items);
    let mut continue_token = String::new();
    if !rest.is_empty() {
        state.next_page += 1;
        continue_token = format!("page-{}", state.next_page);
        state.pages.insert(
            continue_token.clone(),
            Pages {
                rv: pages.rv,
                items: rest,
            },
        );
    }
    drop(state);
    let mut body = Vec::with_capacity(page.iter().map(|i| i.len() + 1).sum::<usize>() + 256);
    // As the real server writes a list (200-list.txt): `kind`, `apiVersion`, then metadata
    // with `continue` only when there is more.
    let more = if continue_token.is_empty() {
        String::new()
    } else {
        format!(",\"continue\":\"{continue_token}\"")
    };
    body.extend_from_slice(
        format!(
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{}\"{more}}},\"items\":[",
            resource.kind, resource.api_version, pages.rv
        )
        .as_bytes(),
    );
    for (i, item) in page.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(item);
    }
    body.extend_from_slice(b"]}");
    ([("content-type", "application/json")], body).into_response()
}

fn event_line(resource: &Resource, change: &str, item: &[u8]) -> Bytes {
    let inner = &item[1..item.len() - 1];
    let mut line = Vec::with_capacity(item.len() + 128);
    line.extend_from_slice(
        format!(
            "{{\"type\":\"{change}\",\"object\":{{\"kind\":\"{}\",\"apiVersion\":\"{}\"",
            resource.kind, resource.api_version
        )
        .as_bytes(),
    );
    if !inner.is_empty() {
        line.push(b',');
        line.extend_from_slice(inner);
    }
    line.extend_from_slice(b"}}\n");
    Bytes::from(line)
}

/// What a watcher with this selector sees of a change, as the API server translates it.
fn translate(change: &Change, selector: &FieldSelector) -> Option<&'static str> {
    let now = selector.matches(&change.fields);
    let before = change
        .old_fields
        .as_ref()
        .is_some_and(|f| selector.matches(f));
    match change.change {
        ChangeType::Added => now.then_some("ADDED"),
        ChangeType::Deleted => before.then_some("DELETED"),
        ChangeType::Modified => match (before, now) {
            (true, true) => Some("MODIFIED"),
            (false, true) => Some("ADDED"),
            (true, false) => Some("DELETED"),
            (false, false) => None,
        },
    }
}

fn watch(
    shared: &Arc<Shared>,
    uri: &Uri,
    query: &HashMap<String, String>,
    selector: FieldSelector,
) -> Response {
    let state = shared.lock();
    let Some(target) = route(&state, uri.path()) else {
        return not_found();
    };
    let resource = state.resources[target.resource].clone();
    let bookmarks = query.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(256);
    let in_scope = {
        let namespace = target.namespace.clone();
        move |change: &Change| namespace.as_ref().is_none_or(|ns| change.namespace == *ns)
    };
    // What the watch replays first: (event type, item), serialised only as it is sent.
    let mut backlog: Vec<(&'static str, Bytes)> = Vec::new();
    let gone = from != 0 && from < state.floor;
    if gone {
        // A 200 stream whose only event is an ERROR (410-watch-compacted-resourceversion.txt).
        let status = status(
            410,
            "Expired",
            "The resourceVersion for the provided watch is too old.",
        );
        backlog.push(("ERROR", Bytes::from(status.to_string())));
    } else if from == 0 {
        for stored in state.objects[target.resource].values() {
            if selector.matches(&stored.fields)
                && target
                    .namespace
                    .as_ref()
                    .is_none_or(|ns| stored.fields["metadata.namespace"] == *ns)
            {
                backlog.push(("ADDED", stored.item.clone()));
            }
        }
    } else {
        for change in &state.log {
            if change.rv > from
                && change.resource == target.resource
                && in_scope(change)
                && let Some(kind) = translate(change, &selector)
            {
                backlog.push((kind, change.item.clone()));
            }
        }
    }
    let mut changes = shared.changes.subscribe();
    let kill = shared.watch_kill.lock().unwrap().clone();
    drop(state);
    let resource_index = target.resource;
    let shared = shared.clone();
    tokio::spawn(async move {
        for (kind, item) in backlog {
            let line = if kind == "ERROR" {
                Bytes::from(format!(
                    "{{\"type\":\"ERROR\",\"object\":{}}}\n",
                    String::from_utf8_lossy(&item)
                ))
            } else {
                event_line(&resource, kind, &item)
            };
            // A replayed event may be the one to cut (the watch it was meant for ended).
            if kind != "ERROR" && cut(&shared, &resource, &line, &tx).await {
                return;
            }
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        if gone {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        loop {
            let message = tokio::select! {
                _ = kill.cancelled() => {
                    let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "dropped"))).await;
                    return;
                }
                _ = &mut deadline => return,
                message = changes.recv() => message,
            };
            let line = match message {
                Ok(Broadcast::Change(change)) => {
                    if change.resource != resource_index || !in_scope(&change) {
                        continue;
                    }
                    let Some(kind) = translate(&change, &selector) else {
                        continue;
                    };
                    event_line(&resource, kind, &change.item)
                }
                Ok(Broadcast::Bookmark(rv)) => {
                    if !bookmarks {
                        continue;
                    }
                    // Only `metadata.resourceVersion` (200-watch-events.txt).
                    Bytes::from(format!(
                        "{{\"type\":\"BOOKMARK\",\"object\":{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}}}}}}\n",
                        resource.kind, resource.api_version
                    ))
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow. The real server closes an unresponsive watcher's stream, and
                    // the client resumes from its last resourceVersion; this fake ends it with
                    // the 410 that resuming gets once that version has left the history, which
                    // tests the harder path.
                    let status = status(410, "Expired", "watcher fell behind");
                    let _ = tx
                        .send(Ok(Bytes::from(format!(
                            "{}\n",
                            json!({"type": "ERROR", "object": status})
                        ))))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if cut(&shared, &resource, &line, &tx).await {
                return;
            }
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
    });
    (
        [("content-type", "application/json")],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response()
}

/// If a cut is armed for this resource's watches, sends half of `line` and then kills the
/// connection (the connection dies in the middle of the line); true if it did.
async fn cut(
    shared: &Shared,
    resource: &Resource,
    line: &Bytes,
    tx: &mpsc::Sender<Result<Bytes, io::Error>>,
) -> bool {
    if !shared.lock().take_cut(&resource.plural) {
        return false;
    }
    let _ = tx.send(Ok(line.slice(..line.len() / 2))).await;
    let _ = tx
        .send(Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "cut mid-event",
        )))
        .await;
    true
}

fn token_review(shared: &Shared, body: &[u8]) -> Response {
    let request: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return error_response(400, "BadRequest", &e.to_string()),
    };
    let token = request["spec"]["token"].as_str().unwrap_or_default();
    let mut state = shared.lock();
    state.token_reviews += 1;
    let status = state
        .tokens
        .get(token)
        .cloned()
        // A rejected token's status has no `authenticated` field at all
        // (tokenreview-rejected.txt).
        .unwrap_or_else(|| json!({"user": {}, "error": "invalid bearer token"}));
    let answer = json!({
        "kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {},
        "spec": request["spec"],
        "status": status,
    });
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        answer.to_string(),
    )
        .into_response()
}
