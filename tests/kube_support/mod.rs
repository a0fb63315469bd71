//! An in-process fake of the Kubernetes API server, over real HTTP on 127.0.0.1, that kube-rs
//! talks to for real: list (with `limit`/`continue` pages and field selectors) and watch
//! (chunked JSON lines from a resourceVersion, with bookmarks, `410 Gone` after compaction,
//! timeouts), 404 for resources that are not served (a missing CRD, installable later),
//! dropped watch connections, whole outages (connections refused and existing ones reset),
//! and TokenReview.
//!
//! Like the real API server, list items carry no `apiVersion`/`kind`; watch events do.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Fields a field selector may name (the API server supports a few per kind, too).
const SELECTABLE: [&str; 4] = [
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "spec.nodeName",
];

/// A resource the fake serves.
#[derive(Clone, Debug)]
pub struct Resource {
    pub api_version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// False: answers 404, like a resource whose CRD is not installed.
    pub served: bool,
}

/// Every resource ambientd watches, all served.
pub fn ambient_resources() -> Vec<Resource> {
    let r = |api_version: &str, kind: &str, plural: &str, namespaced: bool| Resource {
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
        namespaced,
        served: true,
    };
    vec![
        r("v1", "Namespace", "namespaces", false),
        r("v1", "Node", "nodes", false),
        r("v1", "Pod", "pods", true),
        r("v1", "Service", "services", true),
        r(
            "discovery.k8s.io/v1",
            "EndpointSlice",
            "endpointslices",
            true,
        ),
        r(
            "networking.istio.io/v1",
            "ServiceEntry",
            "serviceentries",
            true,
        ),
        r(
            "networking.istio.io/v1",
            "WorkloadEntry",
            "workloadentries",
            true,
        ),
        r(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "authorizationpolicies",
            true,
        ),
        r(
            "security.istio.io/v1",
            "PeerAuthentication",
            "peerauthentications",
            true,
        ),
        r("gateway.networking.k8s.io/v1", "Gateway", "gateways", true),
        r(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "gatewayclasses",
            false,
        ),
    ]
}

type Fields = HashMap<&'static str, String>;

struct Stored {
    rv: u64,
    fields: Fields,
    /// The object's JSON without `apiVersion`/`kind` (a list item).
    item: Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChangeType {
    Added,
    Modified,
    Deleted,
}

struct Change {
    rv: u64,
    resource: usize,
    change: ChangeType,
    namespace: String,
    old_fields: Option<Fields>,
    fields: Fields,
    item: Bytes,
}

#[derive(Clone)]
enum Broadcast {
    Change(Arc<Change>),
    Bookmark(u64),
}

struct Pages {
    rv: u64,
    items: std::collections::VecDeque<Bytes>,
}

struct FakeState {
    rv: u64,
    /// Watches from a resourceVersion below this get 410 Gone.
    floor: u64,
    resources: Vec<Resource>,
    objects: Vec<BTreeMap<(String, String), Stored>>,
    log: Vec<Arc<Change>>,
    pages: HashMap<String, Pages>,
    next_page: u64,
    requests: Vec<String>,
    tokens: HashMap<String, Value>,
    token_reviews: usize,
}

struct Shared {
    state: Mutex<FakeState>,
    changes: broadcast::Sender<Broadcast>,
    /// Cancelled to cut every open watch.
    watch_kill: Mutex<CancellationToken>,
    /// Cancelled to reset every open connection (an outage).
    conn_kill: Mutex<CancellationToken>,
    /// While true, watch requests wait before reading history (benchmarks stage a backlog).
    hold: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }
}

/// The fake API server.
pub struct FakeApiServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    serving: Mutex<Option<JoinHandle<()>>>,
}

impl FakeApiServer {
    /// Serves every resource ambientd watches.
    pub async fn start() -> Self {
        Self::start_with(ambient_resources(), 4096).await
    }

    /// `capacity`: watch events a slow watcher may fall behind before it gets 410 Gone.
    pub async fn start_with(resources: Vec<Resource>, capacity: usize) -> Self {
        let objects = resources.iter().map(|_| BTreeMap::new()).collect();
        let (changes, _) = broadcast::channel(capacity);
        let shared = Arc::new(Shared {
            state: Mutex::new(FakeState {
                rv: 1,
                floor: 0,
                resources,
                objects,
                log: Vec::new(),
                pages: HashMap::new(),
                next_page: 0,
                requests: Vec::new(),
                tokens: HashMap::new(),
                token_reviews: 0,
            }),
            changes,
            watch_kill: Mutex::new(CancellationToken::new()),
            conn_kill: Mutex::new(CancellationToken::new()),
            hold: tokio::sync::watch::channel(false).0,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = FakeApiServer {
            addr,
            shared,
            serving: Mutex::new(None),
        };
        server.serve(listener);
        server
    }

    fn serve(&self, listener: TcpListener) {
        let kill = self.shared.conn_kill.lock().unwrap().clone();
        let router = Router::new()
            .fallback(handle)
            .with_state(self.shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(KillableListener { listener, kill }, router).await;
        });
        *self.serving.lock().unwrap() = Some(task);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server.
    pub fn client(&self) -> kube::Client {
        let config = kube::Config::new(self.url().parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    /// Writes a kubeconfig naming this server into `dir`.
    pub fn kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\n",
            self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Creates or replaces an object (`apiVersion`, `kind` and `metadata.name` required).
    /// Returns its new resourceVersion.
    pub fn apply(&self, mut object: Value) -> u64 {
        let api_version = object["apiVersion"]
            .as_str()
            .expect("apiVersion")
            .to_string();
        let kind = object["kind"].as_str().expect("kind").to_string();
        let mut state = self.shared.lock();
        let index = state
            .resources
            .iter()
            .position(|r| r.api_version == api_version && r.kind == kind)
            .unwrap_or_else(|| panic!("the fake does not serve {api_version} {kind}"));
        let namespaced = state.resources[index].namespaced;
        let meta = object["metadata"].as_object_mut().expect("metadata");
        let name = meta["name"].as_str().expect("metadata.name").to_string();
        let namespace = if namespaced {
            meta.get("namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        if namespaced {
            meta.insert("namespace".into(), json!(namespace));
        }
        state.rv += 1;
        let rv = state.rv;
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.entry("uid")
            .or_insert_with(|| json!(format!("uid-{kind}-{namespace}-{name}")));
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
                rv,
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
            item,
        };
        self.publish(&mut state, change);
        rv
    }

    /// Applies every document of a YAML text.
    pub fn apply_yaml(&self, yaml: &str) {
        for document in ambientd::kube::objects::parse_yaml(yaml).expect("yaml") {
            if document["kind"] == "List" {
                for item in document["items"].as_array().cloned().unwrap_or_default() {
                    self.apply(item);
                }
            } else {
                self.apply(document);
            }
        }
    }

    /// Every stored object, as a watch event would carry it (with `apiVersion`/`kind`).
    pub fn objects(&self) -> Vec<Value> {
        let state = self.shared.lock();
        let mut all = Vec::new();
        for (resource, objects) in state.resources.iter().zip(&state.objects) {
            for stored in objects.values() {
                let mut value: Value = serde_json::from_slice(&stored.item).expect("json");
                value["apiVersion"] = json!(resource.api_version);
                value["kind"] = json!(resource.kind);
                all.push(value);
            }
        }
        all
    }

    /// Deletes an object; false if it was not there.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> bool {
        let mut state = self.shared.lock();
        let index = state
            .resources
            .iter()
            .position(|r| r.api_version == api_version && r.kind == kind)
            .expect("resource");
        let key = (namespace.to_string(), name.to_string());
        let Some(old) = state.objects[index].remove(&key) else {
            return false;
        };
        state.rv += 1;
        let rv = state.rv;
        // The deleted object, at the deletion's resourceVersion.
        let mut value: Value = serde_json::from_slice(&old.item).expect("stored json");
        value["metadata"]["resourceVersion"] = json!(rv.to_string());
        let change = Change {
            rv,
            resource: index,
            change: ChangeType::Deleted,
            namespace: namespace.to_string(),
            old_fields: Some(old.fields.clone()),
            fields: old.fields,
            item: Bytes::from(serde_json::to_vec(&value).expect("json")),
        };
        self.publish(&mut state, change);
        true
    }

    fn publish(&self, state: &mut FakeState, change: Change) {
        let change = Arc::new(change);
        state.log.push(change.clone());
        // Sent under the state lock, so a new watch's backlog and live events never overlap.
        let _ = self.shared.changes.send(Broadcast::Change(change));
    }

    /// Sends a BOOKMARK at the current resourceVersion to watches that asked for them.
    pub fn bookmark(&self) {
        let state = self.shared.lock();
        let _ = self.shared.changes.send(Broadcast::Bookmark(state.rv));
    }

    /// Forgets history: watches from any earlier resourceVersion get 410 Gone.
    pub fn compact(&self) {
        let mut state = self.shared.lock();
        state.floor = state.rv;
        state.log.clear();
    }

    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    /// Parks new watch requests (true) until released (false); they then replay the history
    /// written meanwhile.
    pub fn hold_watches(&self, hold: bool) {
        self.shared.hold.send_replace(hold);
    }

    /// How many watch requests have been made.
    pub fn watches(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.contains("watch=true"))
            .count()
    }

    /// Cuts every open watch connection mid-stream.
    pub fn drop_watches(&self) {
        let mut kill = self.shared.watch_kill.lock().unwrap();
        kill.cancel();
        *kill = CancellationToken::new();
    }

    /// Stops listening and resets every connection: an API-server outage.
    pub async fn outage(&self) {
        let task = self.serving.lock().unwrap().take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        self.drop_watches();
        let mut kill = self.shared.conn_kill.lock().unwrap();
        kill.cancel();
        *kill = CancellationToken::new();
    }

    /// Listens again on the same address after [`outage`](Self::outage).
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.expect("rebind");
        self.serve(listener);
    }

    /// Serves (or 404s) a resource, as installing or deleting its CRD would.
    pub fn set_served(&self, api_version: &str, kind: &str, served: bool) {
        {
            let mut state = self.shared.lock();
            for r in &mut state.resources {
                if r.api_version == api_version && r.kind == kind {
                    r.served = served;
                }
            }
        }
        if !served {
            self.drop_watches();
        }
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// How many lists of `plural` have been served (first pages only).
    pub fn lists_of(&self, plural: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| {
                let path = r.split('?').next().unwrap_or_default();
                path.ends_with(&format!("/{plural}"))
                    && !r.contains("watch=true")
                    && !r.contains("continue=")
            })
            .count()
    }

    /// Makes TokenReview answer `status` for `token`.
    pub fn add_token(&self, token: &str, status: Value) {
        self.shared.lock().tokens.insert(token.into(), status);
    }

    pub fn token_reviews(&self) -> usize {
        self.shared.lock().token_reviews
    }
}

fn fields_of(object: &Value) -> Fields {
    SELECTABLE
        .iter()
        .map(|path| {
            let mut value = object;
            for part in path.split('.') {
                value = &value[part];
            }
            (*path, value.as_str().unwrap_or_default().to_string())
        })
        .collect()
}

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

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code
    })
}

fn error_response(code: u16, reason: &str, message: &str) -> Response {
    let status_code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status_code,
        [("content-type", "application/json")],
        status(code, reason, message).to_string(),
    )
        .into_response()
}

struct Target {
    resource: usize,
    namespace: Option<String>,
}

/// The resource and namespace a path names, if the fake serves it (else 404).
fn route(state: &FakeState, path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => (version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, plural) = match rest {
        [plural] => (None, *plural),
        ["namespaces", namespace, plural] => (Some(namespace.to_string()), *plural),
        _ => return None,
    };
    let resource = state
        .resources
        .iter()
        .position(|r| r.api_version == api_version && r.plural == plural && r.served)?;
    Some(Target {
        resource,
        namespace,
    })
}

fn not_found() -> Response {
    error_response(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let query: HashMap<String, String> = Query::try_from_uri(&uri)
        .map(|Query(q)| q)
        .unwrap_or_default();
    shared.lock().requests.push(format!(
        "{method} {}",
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("")
    ));
    if method == Method::POST && uri.path() == "/apis/authentication.k8s.io/v1/tokenreviews" {
        return token_review(&shared, &body);
    }
    if method != Method::GET {
        return error_response(405, "MethodNotAllowed", "the fake only lists and watches");
    }
    let selector = match FieldSelector::parse(query.get("fieldSelector")) {
        Ok(selector) => selector,
        Err(message) => return error_response(400, "BadRequest", &message),
    };
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
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
            None => return error_response(410, "Expired", "the continue token has expired"),
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
    body.extend_from_slice(
        format!(
            "{{\"apiVersion\":\"{}\",\"kind\":\"{}List\",\"metadata\":{{\"resourceVersion\":\"{}\",\"continue\":\"{}\"}},\"items\":[",
            resource.api_version, resource.kind, pages.rv, continue_token
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
            "{{\"type\":\"{change}\",\"object\":{{\"apiVersion\":\"{}\",\"kind\":\"{}\"",
            resource.api_version, resource.kind
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
        let status = status(410, "Expired", &format!("too old resource version: {from}"));
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
                    Bytes::from(format!(
                        "{}\n",
                        json!({"type": "BOOKMARK", "object": {
                            "apiVersion": resource.api_version, "kind": resource.kind,
                            "metadata": {"resourceVersion": rv.to_string()}
                        }})
                    ))
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow: the API server would close it with 410 too.
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
        .unwrap_or_else(|| json!({"authenticated": false, "error": "invalid bearer token"}));
    let answer = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "metadata": {"creationTimestamp": null},
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

/// A listener whose connections all fail at once when `kill` fires.
struct KillableListener {
    listener: TcpListener,
    kill: CancellationToken,
}

impl axum::serve::Listener for KillableListener {
    type Io = KillableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok((stream, addr)) = self.listener.accept().await {
                let _ = stream.set_nodelay(true);
                return (
                    KillableStream {
                        inner: stream,
                        token: self.kill.clone(),
                        kill: Box::pin(self.kill.clone().cancelled_owned()),
                    },
                    addr,
                );
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

struct KillableStream {
    inner: TcpStream,
    token: CancellationToken,
    kill: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl KillableStream {
    fn killed(&mut self, cx: &mut Context<'_>) -> bool {
        self.token.is_cancelled() || self.kill.as_mut().poll(cx).is_ready()
    }
}

fn reset() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "fake API server outage")
}

impl AsyncRead for KillableStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.killed(cx) {
            return Poll::Ready(Err(reset()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
