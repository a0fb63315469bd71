//! An in-process fake of the Kubernetes API server, over real HTTP on 127.0.0.1, that kube-rs
//! talks to for real: list (with `limit`/`continue` pages and field selectors) and watch
//! (chunked JSON lines from a resourceVersion, with bookmarks, `410 Gone` after compaction,
//! timeouts), 404 for resources that are not served (a missing CRD, installable later),
//! dropped watch connections, whole outages (connections refused and existing ones reset),
//! TokenReview, and writes: get, create, replace, patch (merge, JSON, server-side apply),
//! delete and the `status` subresource (see `write`), with a request log tests can audit.
//!
//! Injected faults (errors, hangs, watches cut mid-event, slow TokenReviews, concurrent
//! writers) are described in `faults`.
//!
//! Like the real API server, list items carry no `apiVersion`/`kind`; watch events do. Each
//! error answer names the captured real answer it imitates (tests/fixtures/kube-responses),
//! and `kube_fake_writes.rs` replays those captures against the fake.

mod faults;
mod http;
mod log;
mod net;
mod patch;
pub mod replica;
mod write;

pub use http::FAKE_USER;
pub use log::{ApiCall, Request};

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

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

/// Every resource ambientd watches or writes, all served.
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
            "networking.istio.io/v1",
            "DestinationRule",
            "destinationrules",
            true,
        ),
        r(
            "networking.istio.io/v1",
            "VirtualService",
            "virtualservices",
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
        r(
            "security.istio.io/v1",
            "RequestAuthentication",
            "requestauthentications",
            true,
        ),
        r("gateway.networking.k8s.io/v1", "Gateway", "gateways", true),
        r(
            "gateway.networking.k8s.io/v1",
            "HTTPRoute",
            "httproutes",
            true,
        ),
        r(
            "gateway.networking.k8s.io/v1",
            "GRPCRoute",
            "grpcroutes",
            true,
        ),
        // What ambientd writes (and reads back): leader election, the CA, root ConfigMaps.
        r("coordination.k8s.io/v1", "Lease", "leases", true),
        r("v1", "ConfigMap", "configmaps", true),
        r("v1", "Secret", "secrets", true),
        r(
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "gatewayclasses",
            false,
        ),
        // What the waypoint controller applies.
        r("v1", "ServiceAccount", "serviceaccounts", true),
        r("apps/v1", "Deployment", "deployments", true),
    ]
}

type Fields = HashMap<&'static str, String>;

struct Stored {
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
    requests: Vec<Request>,
    /// Injected failures: (method, plural, remaining, status code).
    failures: Vec<log::Failure>,
    /// Field ownership per object, for server-side apply conflicts.
    managers: HashMap<(usize, String, String), BTreeMap<String, String>>,
    tokens: HashMap<String, Value>,
    token_reviews: usize,
    jwks: Option<Value>,
    faults: faults::Faults,
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
    /// Bumped whenever a hang is lifted, to wake parked requests.
    released: tokio::sync::watch::Sender<u64>,
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
                failures: Vec::new(),
                managers: HashMap::new(),
                tokens: HashMap::new(),
                token_reviews: 0,
                jwks: None,
                faults: faults::Faults::default(),
            }),
            changes,
            watch_kill: Mutex::new(CancellationToken::new()),
            conn_kill: Mutex::new(CancellationToken::new()),
            hold: tokio::sync::watch::channel(false).0,
            released: tokio::sync::watch::channel(0).0,
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
            .fallback(http::handle)
            .with_state(self.shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(net::KillableListener { listener, kill }, router).await;
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
    pub fn apply(&self, object: Value) -> u64 {
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
        write::store(&self.shared, &mut state, index, object);
        state.rv
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
        write::remove(&self.shared, &mut state, index, namespace, name).is_some()
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
    #[allow(dead_code)] // Only benches/kube_ingest.rs uses it.
    pub fn hold_watches(&self, hold: bool) {
        self.shared.hold.send_replace(hold);
    }

    /// How many watch requests have been made.
    #[allow(dead_code)] // Only benches/kube_ingest.rs uses it.
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
        self.shared
            .lock()
            .requests
            .iter()
            .map(Request::to_string)
            .collect()
    }

    /// Every request so far, with its content type.
    pub fn request_log(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// The requests that change something (POST, PUT, PATCH, DELETE), TokenReviews excepted.
    pub fn writes(&self) -> Vec<Request> {
        self.request_log()
            .into_iter()
            .filter(|r| r.is_write() && !r.path.ends_with("/tokenreviews"))
            .collect()
    }

    /// Every request as the API call RBAC authorizes (verb, group, resource, subresource,
    /// namespace), in order, repeats included. Requests outside the resource API (the OIDC
    /// discovery documents) are left out.
    pub fn api_calls(&self) -> Vec<ApiCall> {
        self.request_log()
            .iter()
            .filter_map(Request::api_call)
            .collect()
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

    /// What `/openid/v1/jwks` serves.
    pub fn set_jwks(&self, jwks: Value) {
        self.shared.lock().jwks = Some(jwks);
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
