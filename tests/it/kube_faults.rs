//! Faults of the Kubernetes API server (issue #25, "Reliability"), injected by the fake
//! (tests/it/support/kube/faults.rs), one test per fault. Each checks that while the fault
//! lasts ambientd keeps serving its last snapshot to a connected ztunnel-shaped delta xDS
//! client and says it is degraded (`ambientd_source_failing`, `ambientd_source_errors`,
//! `/debug/syncz`'s `source`), and that once the fault ends it converges to the API server's
//! state: adds, updates and deletes made meanwhile all arrive, nothing the client ACKed is
//! removed that was not deleted, and the indicators clear.
//!
//! Each test prints `converged after <fault> in <ms> ms`, and the watch tests `noticed <fault>
//! in <ms> ms` (run with `--nocapture`); BENCHMARKS.md ("Faults") reports the medians.
//!
//! - `watch`: 500s on watch and on list, a hung list, a hung watch, a watch cut mid-event,
//!   429s with Retry-After.
//! - `token_review`: a slow and a failing TokenReview.
//! - `status`: status writes that conflict.

mod status;
mod token_review;
mod watch;

use crate::support::common::{self as support, XdsClient};
use crate::support::kube as kube_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ambientd::app::{self, Running};
use ambientd::config::Config;
use ambientd::discovery::ADDRESS_TYPE;
use ambientd::kube::cluster::{ClusterConfig, Retry};
use ambientd::pb::workload::Address;
use ambientd::pb::xds::DeltaDiscoveryResponse;
use kube_support::FakeApiServer;
use serde_json::{Value, json};

/// How long any wait may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// Quick retries: 50 ms doubling to 400 ms.
const FAST: Retry = Retry::Exponential {
    initial: Duration::from_millis(50),
    max: Duration::from_millis(400),
};

/// Each watch ends after 1 s, so a request silent for 3 s (1 s + the 2 s grace) is hung.
const WATCH_TIMEOUT: Duration = Duration::from_secs(1);

pub fn pod(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo", "labels": {"app": "web"},
                     "annotations": {"ambient.istio.io/redirection": "enabled"}},
        "spec": {"serviceAccountName": "web", "nodeName": "node-a",
                 "containers": [{"name": "main", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// The Address name of pod `name` in `demo`.
pub fn workload_name(name: &str) -> String {
    format!("Kubernetes//Pod/demo/{name}")
}

/// Namespaces, a node, and pods a, b, c.
pub fn seed(server: &FakeApiServer) {
    for ns in ["istio-system", "demo"] {
        server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));
    for (name, ip) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        server.apply(pod(name, ip));
    }
}

/// ambientd on a fake cluster, with a ztunnel-shaped client that holds what it was sent.
pub struct Faulty {
    pub server: FakeApiServer,
    pub running: Running,
    pub proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl Faulty {
    /// Seeds the fake, starts ambientd (with `adjust` applied to its config), connects the
    /// client and waits until it holds pods a, b, c.
    pub async fn start(adjust: impl FnOnce(&mut Config, &std::path::Path)) -> Self {
        if let Ok(filter) = std::env::var("TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_test_writer()
                .try_init();
        }
        let server = FakeApiServer::start().await;
        seed(&server);
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::cluster(ClusterConfig {
            kubeconfig: Some(server.kubeconfig(dir.path())),
            retry: FAST,
            watch_timeout: WATCH_TIMEOUT,
            ..ClusterConfig::default()
        });
        adjust(&mut config, dir.path());
        let running = app::start(config).await.expect("start ambientd");
        let mut snapshots = running.snapshots.clone();
        tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
            .await
            .expect("ambientd did not become ready in time")
            .expect("snapshot channel closed");
        let mut proxy = Proxy::connect(&running).await;
        proxy
            .until("pods a, b, c", |p| p.pods() == ["a", "b", "c"])
            .await;
        Faulty {
            server,
            running,
            proxy,
            _dir: dir,
        }
    }

    /// `/metrics`.
    pub async fn metrics(&self) -> String {
        let (code, body) = support::http_get(self.running.debug_address, "/metrics").await;
        assert_eq!(code, 200, "/metrics: {body}");
        body
    }

    /// The value of one sample (`name{labels}`) of `/metrics`, 0 when absent.
    pub async fn sample(&self, series: &str) -> f64 {
        sample(&self.metrics().await, series)
    }

    /// `/debug/syncz`'s `source` field (every entry carries the same; there is one client).
    pub async fn syncz_source(&self) -> Value {
        let (code, body) = support::http_get(self.running.debug_address, "/debug/syncz").await;
        assert_eq!(code, 200, "/debug/syncz: {body}");
        let entries: Vec<Value> = serde_json::from_str(&body).expect("syncz is JSON");
        assert!(!entries.is_empty(), "the client shows in syncz: {body}");
        // istiod's shape is kept: the per-connection fields are still there.
        assert!(entries[0]["proxy"].is_string() && entries[0]["resources"].is_object());
        entries[0]["source"].clone()
    }

    /// Waits until `/metrics` and `/debug/syncz` say the Pod watch is failing with `reason`;
    /// prints how long after `since` (when `fault` began) that was.
    pub async fn until_degraded(&self, reason: &str, fault: &str, since: Instant) {
        let deadline = Instant::now() + WAIT;
        loop {
            let failing = self.sample("ambientd_source_failing{kind=\"Pod\"}").await;
            let errors = self
                .sample(&format!(
                    "ambientd_source_errors{{kind=\"Pod\",reason=\"{reason}\"}}"
                ))
                .await;
            let source = self.syncz_source().await;
            let listed = source["failing"]
                .as_array()
                .is_some_and(|f| f.iter().any(|k| k["kind"] == "Pod"));
            if failing == 1.0 && errors >= 1.0 && source["current"] == false && listed {
                let pod = source["failing"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|k| k["kind"] == "Pod")
                    .unwrap()
                    .clone();
                assert!(pod["since"].is_string(), "since when: {pod}");
                assert!(
                    pod["lastError"].as_str().is_some_and(|e| !e.is_empty()),
                    "the last error: {pod}"
                );
                println!("noticed {fault} in {} ms", since.elapsed().as_millis());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ambientd never said the Pod watch fails with {reason}: failing={failing} \
                 errors={errors} syncz source={source}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the indicators clear: nothing failing in `/metrics` or `/debug/syncz`.
    pub async fn until_healthy(&self) {
        let deadline = Instant::now() + WAIT;
        loop {
            let failing = self.sample("ambientd_source_failing{kind=\"Pod\"}").await;
            let source = self.syncz_source().await;
            if failing == 0.0 && source == json!({"current": true, "failing": []}) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the fault's indicators never cleared: failing={failing} syncz source={source}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The changes made during a fault: d added, b moved to a new IP, c deleted.
    pub fn change_pods(&self) {
        self.server.apply(pod("d", "10.0.0.4"));
        self.server.apply(pod("b", "10.0.1.2"));
        assert!(self.server.delete("v1", "Pod", "demo", "c"));
    }

    /// While the fault lasts: the client still holds a, b (old IP), c and nothing was
    /// removed; the published snapshot is the last one (no d, c still there).
    pub async fn assert_last_snapshot_served(&mut self, before: &BTreeMap<String, String>) {
        self.proxy.drain().await;
        assert_eq!(
            &self.proxy.versions, before,
            "the client's resources changed during the fault"
        );
        assert!(self.proxy.removed.is_empty(), "removed during the fault");
        assert_eq!(self.proxy.ip_of("b"), Some([10, 0, 0, 2]));
        let snapshot = self.running.snapshots.borrow().clone().expect("published");
        assert!(snapshot.addresses.contains_key(workload_name("c").as_str()));
        assert!(!snapshot.addresses.contains_key(workload_name("d").as_str()));
    }

    /// After the fault: waits until the client holds a, b (new IP), d, checks that only c was
    /// removed, and prints how long that took from `ended`.
    pub async fn converge(&mut self, fault: &str, ended: Instant) -> Duration {
        self.proxy
            .until("a, b at its new IP, d; c removed", |p| {
                p.pods() == ["a", "b", "d"] && p.ip_of("b") == Some([10, 0, 1, 2])
            })
            .await;
        let took = ended.elapsed();
        println!("converged after {fault} in {} ms", took.as_millis());
        let removed: BTreeSet<String> = self.proxy.removed.iter().cloned().collect();
        assert_eq!(
            removed,
            BTreeSet::from([workload_name("c")]),
            "only the deleted pod was removed"
        );
        took
    }
}

/// The value of `series` (`name{labels}` exactly as rendered) in a metrics text, 0 if absent.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
        .unwrap_or(0.0)
}

/// A ztunnel-shaped delta xDS client that applies and ACKs what it is sent.
pub struct Proxy {
    client: XdsClient,
    /// Address name -> version held.
    pub versions: BTreeMap<String, String>,
    pub addresses: BTreeMap<String, Address>,
    /// Every name ever removed.
    pub removed: Vec<String>,
}

impl Proxy {
    pub async fn connect(running: &Running) -> Self {
        let client = XdsClient::connect(running).await;
        client.subscribe_wildcard(BTreeMap::new()).await;
        Proxy {
            client,
            versions: BTreeMap::new(),
            addresses: BTreeMap::new(),
            removed: Vec::new(),
        }
    }

    fn apply(&mut self, response: &DeltaDiscoveryResponse) {
        if response.type_url != ADDRESS_TYPE {
            return;
        }
        for (name, address) in support::addresses(response) {
            self.addresses.insert(name, address);
        }
        self.versions.extend(support::versions(response));
        for name in &response.removed_resources {
            self.versions.remove(name);
            self.addresses.remove(name);
            self.removed.push(name.clone());
        }
    }

    /// Applies and ACKs whatever arrives within 100 ms.
    pub async fn drain(&mut self) {
        while let Some(response) = self.client.try_recv(Duration::from_millis(100)).await {
            self.apply(&response);
            self.client.ack(&response).await;
        }
    }

    /// Applies and ACKs responses until `check` holds; fails after [`WAIT`].
    pub async fn until(&mut self, what: &str, check: impl Fn(&Proxy) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !check(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(response) = self.client.try_recv(left).await else {
                panic!(
                    "timed out waiting for {what}; the client holds {:?}",
                    self.pods()
                );
            };
            self.apply(&response);
            self.client.ack(&response).await;
        }
    }

    /// The demo pods held, by name, sorted.
    pub fn pods(&self) -> Vec<String> {
        self.versions
            .keys()
            .filter_map(|n| n.strip_prefix("Kubernetes//Pod/demo/"))
            .map(str::to_string)
            .collect()
    }

    /// Pod `name`'s IPv4 address as sent.
    pub fn ip_of(&self, name: &str) -> Option<[u8; 4]> {
        let address = self.addresses.get(&workload_name(name))?;
        let ip = support::workload(address).addresses.first()?;
        ip.as_ref().try_into().ok()
    }
}
