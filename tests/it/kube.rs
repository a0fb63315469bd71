//! The Kubernetes source against an in-process fake API server (tests/it/support/kube) that
//! kube-rs talks to over real HTTP: initial sync of every kind, changes through to the
//! snapshot and xDS, relists after 410, outages, missing CRDs, bookmarks, discovery selectors
//! and the revision filter.

use crate::support::common as support;
use crate::support::kube as kube_support;

use std::collections::BTreeMap;
use std::time::Duration;

use ambientd::app::{self, Running};
use ambientd::config::Config;
use ambientd::discovery::model::{Event, Kind};
use ambientd::discovery::{Index, Settings, Snapshot};
use ambientd::kube::cluster::{ClusterConfig, ClusterSource, DiscoverySelectors, Retry};
use ambientd::kube::manifests::ManifestDir;
use kube_support::FakeApiServer;
use kube_support::replica::snapshot_until as until;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

/// Quick retries so outages and missing CRDs resolve within a test's patience.
const FAST: Retry = Retry::Exponential {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(400),
};

fn config(server: &FakeApiServer, dir: &tempfile::TempDir) -> ClusterConfig {
    ClusterConfig {
        kubeconfig: Some(server.kubeconfig(dir.path())),
        retry: FAST,
        ..ClusterConfig::default()
    }
}

async fn start(cluster: ClusterConfig) -> Running {
    if let Ok(filter) = std::env::var("TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    let running = app::start(Config::cluster(cluster))
        .await
        .expect("start ambientd on the fake cluster");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("ambientd did not become ready in time")
        .expect("snapshot channel closed");
    running
}

fn has(snapshot: &Snapshot, name: &str) -> bool {
    snapshot.addresses.contains_key(name)
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn pod(namespace: &str, name: &str, ip: &str, phase: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"},
                     "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"serviceAccountName": "web", "nodeName": "node-a",
                 "containers": [{"name": "main", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn service(namespace: &str, name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"], "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    })
}

fn workload(namespace: &str, name: &str) -> String {
    format!("Kubernetes//Pod/{namespace}/{name}")
}

fn base(server: &FakeApiServer) {
    server.apply(namespace("istio-system", json!({})));
    server.apply(namespace("demo", json!({})));
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));
}

/// Runs the source alone and collects what it sends up to and including `Synced`.
async fn initial_load(
    source: ClusterSource,
) -> (Vec<Event>, mpsc::Receiver<Event>, CancellationToken) {
    let (tx, mut rx) = mpsc::channel(1024);
    let stop = CancellationToken::new();
    tokio::spawn(source.run(tx, stop.clone()));
    let mut events = Vec::new();
    loop {
        let event = tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("the source did not sync in time")
            .expect("the source stopped");
        let done = event == Event::Synced;
        events.push(event);
        if done {
            return (events, rx, stop);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_of_every_kind_is_what_the_manifests_source_reads() {
    let server = FakeApiServer::start().await;
    for file in std::fs::read_dir("examples/bookinfo").unwrap() {
        let path = file.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            server.apply_yaml(&std::fs::read_to_string(&path).unwrap());
        }
    }
    server.apply(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "ext-1", "namespace": "bookinfo",
                     "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.9.9.9"], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}]
    }));
    // The manifests source reads the very objects the fake serves.
    let manifests = tempfile::tempdir().unwrap();
    for (i, object) in server.objects().into_iter().enumerate() {
        std::fs::write(
            manifests.path().join(format!("{i:03}.json")),
            serde_json::to_vec(&object).unwrap(),
        )
        .unwrap();
    }
    let expected = ManifestDir::open(manifests.path()).unwrap().load();
    // A Failed pod is not even listed (field selector), as in istiod's informer.
    server.apply(pod("bookinfo", "crashed", "10.7.7.7", "Failed"));

    let source = ClusterSource::new(
        server.client(),
        ClusterConfig {
            retry: FAST,
            ..ClusterConfig::default()
        },
    );
    let (events, _rx, stop) = initial_load(source).await;
    stop.cancel();

    // In the manifests source's order: containers before contents.
    let position = |e: &Event| match e {
        Event::Apply(o) => Kind::ALL.iter().position(|k| *k == o.kind()),
        Event::Reset(kind, _) => Kind::ALL.iter().position(|k| k == kind),
        _ => None,
    };
    let positions: Vec<usize> = events.iter().filter_map(position).collect();
    assert!(positions.is_sorted(), "kinds arrive in Kind::ALL order");
    assert_eq!(events.last(), Some(&Event::Synced));

    let mut from_cluster = Index::new(Settings::default());
    let mut from_manifests = Index::new(Settings::default());
    for event in events {
        from_cluster.handle(event);
    }
    for event in expected {
        from_manifests.handle(event);
    }
    for kind in Kind::ALL {
        let mut refs = from_cluster.refs(kind);
        let mut expected_refs = from_manifests.refs(kind);
        refs.sort();
        expected_refs.sort();
        assert!(!refs.is_empty(), "{kind} has objects in the example");
        assert_eq!(refs, expected_refs, "{kind}");
    }
    assert!(
        !from_cluster
            .refs(Kind::Pod)
            .iter()
            .any(|r| r.name == "crashed"),
        "a Failed pod is not listed"
    );
    let versions = |index: &mut Index| {
        let snapshot = index.snapshot();
        let of = |map: &ambientd::discovery::ResourceMap| {
            map.iter()
                .map(|(name, r)| (name.clone(), r.version))
                .collect::<BTreeMap<_, _>>()
        };
        (of(&snapshot.addresses), of(&snapshot.authorizations))
    };
    let (cluster_addresses, cluster_authorizations) = versions(&mut from_cluster);
    assert!(!cluster_addresses.is_empty() && !cluster_authorizations.is_empty());
    assert_eq!(
        (cluster_addresses, cluster_authorizations),
        versions(&mut from_manifests),
        "the same resources, byte for byte"
    );
    let pods_list = server
        .requests()
        .into_iter()
        .find(|r| r.starts_with("GET /api/v1/pods?") && !r.contains("watch=true"))
        .expect("pods were listed");
    assert!(
        pods_list.contains("fieldSelector=status.phase%21%3DFailed"),
        "{pods_list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_updates_and_deletes_flow_through_to_xds() {
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(service("demo", "web", "10.96.0.10"));
    server.apply(pod("demo", "web-1", "10.244.1.10", "Running"));
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(&server, &dir)).await;
    let snapshot = until(&running, "web-1 and its service", |s| {
        has(s, &workload("demo", "web-1")) && has(s, "demo/web.demo.svc.cluster.local")
    })
    .await;
    assert!(snapshot.addresses.len() >= 2);

    let mut client = support::XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (initial, _) = client.initial_sync().await;
    assert!(support::names(&initial).contains(&workload("demo", "web-1")));

    // Add.
    server.apply(pod("demo", "web-2", "10.244.1.11", "Running"));
    let response = client.recv().await;
    assert_eq!(support::names(&response), vec![workload("demo", "web-2")]);
    client.ack(&response).await;

    // Update: a new IP.
    server.apply(pod("demo", "web-2", "10.244.1.12", "Running"));
    let response = client.recv().await;
    let updated = support::addresses(&response);
    let w = support::workload(&updated[&workload("demo", "web-2")]);
    assert_eq!(w.addresses, vec![vec![10, 244, 1, 12]]);
    client.ack(&response).await;

    // Delete.
    assert!(server.delete("v1", "Pod", "demo", "web-2"));
    let response = client.recv().await;
    assert_eq!(response.removed_resources, vec![workload("demo", "web-2")]);
    client.ack(&response).await;

    // A pod turning Failed leaves the field-selected watch: the API server says DELETED.
    server.apply(pod("demo", "web-1", "10.244.1.10", "Failed"));
    until(&running, "failed web-1 removed", |s| {
        !has(s, &workload("demo", "web-1"))
    })
    .await;

    // An update the decoders reject is treated as absent.
    server.apply(pod("demo", "web-3", "10.244.1.13", "Running"));
    until(&running, "web-3", |s| has(s, &workload("demo", "web-3"))).await;
    server.apply(pod("demo", "web-3", "10.244.1.300", "Running"));
    until(&running, "invalid web-3 removed", |s| {
        !has(s, &workload("demo", "web-3"))
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_410_removes_what_was_deleted_while_disconnected() {
    let server = FakeApiServer::start().await;
    base(&server);
    for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        server.apply(pod("demo", name, ip, "Running"));
    }
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(&server, &dir)).await;
    until(&running, "a, b, c", |s| {
        ["a", "b", "c"].iter().all(|n| has(s, &workload("demo", n)))
    })
    .await;
    let lists_before = server.lists_of("pods");

    server.outage().await;
    assert!(server.delete("v1", "Pod", "demo", "b"));
    server.apply(pod("demo", "d", "10.0.0.4", "Running"));
    server.apply(pod("demo", "c", "10.0.0.33", "Running"));
    server.compact();
    server.restore().await;

    let snapshot = until(&running, "the relist's truth", |s| {
        has(s, &workload("demo", "d")) && !has(s, &workload("demo", "b"))
    })
    .await;
    assert!(has(&snapshot, &workload("demo", "a")));
    assert!(
        server.lists_of("pods") > lists_before,
        "410 Gone forces a fresh list"
    );
    let lookup = snapshot.lookup_addresses("/10.0.0.33");
    assert_eq!(
        lookup,
        vec![workload("demo", "c")],
        "c moved while we were away"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_keeps_the_last_snapshot_served() {
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(pod("demo", "a", "10.0.0.1", "Running"));
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(&server, &dir)).await;
    let before = until(&running, "a", |s| has(s, &workload("demo", "a"))).await;

    server.outage().await;
    // The watchers notice (errors counted in ambientd_source_restarts) and back off.
    tokio::time::timeout(WAIT, async {
        while running.metrics.source_restarts.get() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("watch errors are counted");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let during = running.snapshots.borrow().clone().expect("still published");
    assert_eq!(
        during.generation, before.generation,
        "nothing changed meanwhile"
    );
    assert!(has(&during, &workload("demo", "a")));
    let (code, _) = support::http_get(running.debug_address, "/ready").await;
    assert_eq!(code, 200, "still ready: serving the last snapshot");

    server.apply(pod("demo", "b", "10.0.0.2", "Running"));
    server.restore().await;
    until(&running, "b after the outage", |s| {
        has(s, &workload("demo", "b"))
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_counts_as_empty_and_is_picked_up_when_installed() {
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(pod("demo", "a", "10.0.0.1", "Running"));
    server.set_served("security.istio.io/v1", "AuthorizationPolicy", false);
    server.set_served("gateway.networking.k8s.io/v1", "Gateway", false);
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(&server, &dir)).await;
    let ready = until(&running, "a", |s| has(s, &workload("demo", "a"))).await;
    assert!(ready.authorizations.is_empty());

    server.set_served("security.istio.io/v1", "AuthorizationPolicy", true);
    server.apply(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-all", "namespace": "demo"},
        "spec": {"action": "DENY", "rules": [{}]}
    }));
    until(&running, "the policy once its CRD exists", |s| {
        s.authorizations.contains_key("demo/deny-all")
    })
    .await;
    running.stop().await;
}

/// Log lines written while the guard lives, on this thread (a current-thread runtime runs
/// every task of the test here, so other tests' logs stay out).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        // tracing caches whether a callsite is enabled, process-wide, when the callsite is
        // first hit. While only one dispatcher exists it asks just the hitting thread's
        // default, so a callsite first hit by another test's thread (no subscriber) would be
        // cached as disabled for this capture too. With a second dispatcher alive for the whole
        // process, tracing asks every live dispatcher, this one included.
        static OTHER: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        OTHER.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter("ambientd=debug")
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).to_string()
    }

    /// Lines at `level` (INFO, WARN) that contain every one of `words`.
    fn count(&self, level: &str, words: &[&str]) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).to_string();
        text.lines()
            .filter(|l| l.contains(level) && words.iter().all(|w| l.contains(w)))
            .count()
    }
}

/// The real API server's answer for a kind whose CRD is missing is a plain-text 404 (the fake
/// imitates it). Ready within seconds; each kind found missing once in the log however often
/// it is listed again; a CRD installed later is picked up without a restart, by the index and
/// by the IP auto-allocator, with one line each.
#[tokio::test(flavor = "current_thread")]
async fn missing_crds_do_not_hold_readiness_and_are_picked_up_when_installed() {
    let logs = Captured::default();
    let _guard = logs.install();
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(pod("demo", "a", "10.0.0.1", "Running"));
    let missing = [
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("networking.istio.io/v1", "ServiceEntry"),
        ("networking.istio.io/v1", "WorkloadEntry"),
        ("security.istio.io/v1", "PeerAuthentication"),
        ("security.istio.io/v1", "AuthorizationPolicy"),
    ];
    for (api_version, kind) in missing {
        server.set_served(api_version, kind, false);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::cluster(config(&server, &dir));
    let defaults = ambientd::kube::writes::ClusterWrites::new("istio-system");
    config.writes = Some(ambientd::kube::writes::ClusterWrites {
        leader: None,
        ca_secrets: false,
        root_configmaps: false,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(400),
        ..defaults
    });
    let running = tokio::time::timeout(Duration::from_secs(10), async {
        let running = app::start(config).await.expect("start");
        let mut snapshots = running.snapshots.clone();
        snapshots
            .wait_for(Option::is_some)
            .await
            .expect("snapshots");
        running
    })
    .await
    .expect("ready within a few seconds with five CRDs missing");
    let (code, _) = support::http_get(running.debug_address, "/ready").await;
    assert_eq!(code, 200);
    until(&running, "a", |s| has(s, &workload("demo", "a"))).await;

    // Several retries (every 400 ms here) go by: still one line per missing kind.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for kind in [
        "Gateway",
        "ServiceEntry",
        "WorkloadEntry",
        "PeerAuthentication",
    ] {
        let lines = logs.count("WARN", &[&format!("kind={kind}"), "not installed"]);
        assert_eq!(lines, 1, "{kind}: one line when found missing");
    }
    assert!(
        server.lists_of("serviceentries") >= 3,
        "the missing kind is listed again"
    );
    let allocator = "ServiceEntries for IP auto-allocation";
    assert_eq!(
        logs.count("WARN", &[allocator, "not served"]),
        1,
        "{}",
        logs.text()
    );
    assert_eq!(logs.count("WARN", &["watch failing"]), 0);

    // The ServiceEntry CRD is installed: its objects are served, with no restart.
    server.set_served("networking.istio.io/v1", "ServiceEntry", true);
    server.apply(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "api", "namespace": "demo"},
        "spec": {"hosts": ["api.example.com"], "resolution": "DNS",
                 "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}
    }));
    until(&running, "the ServiceEntry once its CRD exists", |s| {
        s.addresses.keys().any(|k| k.contains("api.example.com"))
    })
    .await;
    kube_support::replica::until("the allocator's addresses", || {
        server
            .get("networking.istio.io/v1", "ServiceEntry", "demo", "api")
            .is_some_and(|o| o["status"]["addresses"].is_array())
    })
    .await;
    assert_eq!(
        logs.count("INFO", &["kind=ServiceEntry", "now served"]),
        1,
        "one line when the kind appears"
    );
    assert_eq!(logs.count("INFO", &[allocator, "now served"]), 1);
    assert_eq!(
        logs.count("WARN", &["kind=ServiceEntry", "not installed"]),
        1
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookmark_lets_a_dropped_watch_resume_without_a_relist() {
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(pod("demo", "a", "10.0.0.1", "Running"));
    let dir = tempfile::tempdir().unwrap();
    let running = start(config(&server, &dir)).await;
    until(&running, "a", |s| has(s, &workload("demo", "a"))).await;
    // The pods watch is open (it starts right after the list).
    tokio::time::timeout(WAIT, async {
        while !server
            .requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/pods?") && r.contains("watch=true"))
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the pods watch opens");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Other kinds move the resourceVersion past what the pods watch has seen...
    for i in 0..5 {
        server.apply(service("demo", &format!("s{i}"), &format!("10.96.1.{i}")));
    }
    // ...and a bookmark tells the watchers where history stands.
    server.bookmark();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lists_before = server.lists_of("pods");
    server.compact();
    server.drop_watches();
    server.apply(pod("demo", "b", "10.0.0.2", "Running"));
    until(&running, "b", |s| has(s, &workload("demo", "b"))).await;
    assert_eq!(
        server.lists_of("pods"),
        lists_before,
        "resumed from the bookmark, no 410, no relist"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_selectors_and_the_revision_filter() {
    let server = FakeApiServer::start().await;
    server.apply(namespace("istio-system", json!({})));
    server.apply(namespace("in", json!({"istio-discovery": "enabled"})));
    server.apply(namespace("out", json!({})));
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));
    for ns in ["in", "out"] {
        server.apply(pod(
            ns,
            "p",
            if ns == "in" { "10.1.0.1" } else { "10.2.0.1" },
            "Running",
        ));
        server.apply(service(
            ns,
            "web",
            if ns == "in" { "10.96.1.1" } else { "10.96.2.1" },
        ));
    }
    let policy = |name: &str, rev: Option<&str>| {
        let labels = rev.map_or(json!({}), |r| json!({"istio.io/rev": r}));
        json!({
            "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": "in", "labels": labels},
            "spec": {"action": "DENY", "rules": [{}]}
        })
    };
    server.apply(policy("default-rev", None));
    server.apply(policy("canary-rev", Some("canary")));

    let dir = tempfile::tempdir().unwrap();
    let cluster = ClusterConfig {
        discovery_selectors: DiscoverySelectors::parse_all(&["istio-discovery=enabled"]).unwrap(),
        ..config(&server, &dir)
    };
    let running = start(cluster).await;
    let snapshot = until(&running, "the selected namespace", |s| {
        has(s, &workload("in", "p")) && has(s, "in/web.in.svc.cluster.local")
    })
    .await;
    assert!(
        !has(&snapshot, &workload("out", "p")),
        "unselected namespace"
    );
    assert!(!has(&snapshot, "out/web.out.svc.cluster.local"));
    assert!(snapshot.authorizations.contains_key("in/default-rev"));
    assert!(
        !snapshot.authorizations.contains_key("in/canary-rev"),
        "another revision's policy is ignored"
    );

    // Selecting a namespace brings its objects in; deselecting takes them out.
    server.apply(namespace("out", json!({"istio-discovery": "enabled"})));
    until(&running, "out selected", |s| {
        has(s, &workload("out", "p")) && has(s, "out/web.out.svc.cluster.local")
    })
    .await;
    server.apply(namespace("in", json!({})));
    // Each kind re-lists on its own; together they converge.
    let snapshot = until(&running, "in deselected", |s| {
        !has(s, &workload("in", "p")) && !has(s, "in/web.in.svc.cluster.local")
    })
    .await;
    assert!(has(&snapshot, &workload("out", "p")));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_drives_an_index_directly() {
    let server = FakeApiServer::start().await;
    base(&server);
    server.apply(pod("demo", "a", "10.0.0.1", "Running"));
    let source = ClusterSource::new(
        server.client(),
        ClusterConfig {
            retry: FAST,
            ..ClusterConfig::default()
        },
    );
    let health = source.health();
    let (events, mut rx, stop) = initial_load(source).await;
    let mut index = Index::new(Settings::default());
    for event in events {
        index.handle(event);
    }
    assert_eq!(index.refs(Kind::Pod).len(), 1);
    assert!(health.kinds().values().all(|k| k.synced && k.lists == 1));

    server.apply(pod("demo", "b", "10.0.0.2", "Running"));
    let event = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, Event::Apply(o) if o.object_ref().name == "b"),
        "{event:?}"
    );
    index.handle(event);
    assert_eq!(index.refs(Kind::Pod).len(), 2);

    server.outage().await;
    tokio::time::timeout(WAIT, async {
        while !health.degraded() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("an outage shows as degraded");
    server.restore().await;
    server.apply(pod("demo", "c", "10.0.0.3", "Running"));
    let event = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&event, Event::Apply(o) if o.object_ref().name == "c"),
        "{event:?}"
    );
    tokio::time::timeout(WAIT, async {
        while health.degraded() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every watch re-established after the outage");
    stop.cancel();
}
