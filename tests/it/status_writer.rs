//! The status writer (`ambientd::kube::status_writer`) against the fake API server over real HTTP:
//! the leader writes `ZtunnelAccepted` and `istio.io/WaypointBound`, keeps other controllers'
//! conditions, updates and removes its own as objects are fixed, writes nothing when nothing
//! changed or when not leading, reconciles stale conditions when it gains leadership, and
//! retries failures.
//!
//! The test owns the index: every object is stored in the fake *and* decoded into an `Index`
//! whose snapshots it publishes, as the index task would after the watch delivered it.

use crate::support::kube as kube_support;

use std::sync::Arc;
use std::time::Duration;

use ambientd::discovery::{Index, Settings, Snapshot};
use ambientd::kube::objects::{Decoded, decode};
use ambientd::kube::status_writer::{self, StatusConfig};
use ambientd::metrics::{Metrics, StatusLabel};
use kube_support::{ApiCall, FakeApiServer};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Every wait fails loudly after this.
const WAIT: Duration = Duration::from_secs(10);
/// How long "nothing happens" is watched for.
const QUIET: Duration = Duration::from_millis(300);

const BOUND: &str = "istio.io/WaypointBound";
const ACCEPTED: &str = "ZtunnelAccepted";

struct Harness {
    fake: FakeApiServer,
    metrics: Arc<Metrics>,
    index: Index,
    publish: watch::Sender<Option<Arc<Snapshot>>>,
    leader: watch::Sender<bool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start(leading: bool) -> Self {
        let fake = FakeApiServer::start().await;
        let (publish, snapshots) = watch::channel(None);
        let (leader, leading_rx) = watch::channel(leading);
        let stop = CancellationToken::new();
        let config = StatusConfig {
            qps: 1000.0,
            burst: 100,
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
        };
        let metrics = Arc::new(Metrics::new());
        let task = tokio::spawn(status_writer::run(
            fake.client(),
            snapshots,
            leading_rx,
            config,
            metrics.clone(),
            stop.clone(),
        ));
        Harness {
            fake,
            metrics,
            index: Index::new(Settings::default()),
            publish,
            leader,
            stop,
            task,
        }
    }

    /// Stores objects in the fake and the index, without publishing. Like a real update of
    /// the main resource, an update keeps the stored status.
    fn store(&mut self, objects: &[Value]) {
        for object in objects {
            let mut object = object.clone();
            let meta = &object["metadata"];
            let namespace = meta["namespace"].as_str().unwrap_or_default();
            let name = meta["name"].as_str().unwrap_or_default();
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            let kind = object["kind"].as_str().unwrap_or_default();
            if let Some(stored) = self.fake.get(api_version, kind, namespace, name) {
                object["status"] = stored["status"].clone();
            }
            let object = &object;
            self.fake.apply(object.clone());
            for decoded in decode(object.clone()) {
                match decoded {
                    Decoded::Object(o) => {
                        self.index.apply(o);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    /// Stores objects and publishes a snapshot.
    fn apply(&mut self, objects: &[Value]) {
        self.store(objects);
        self.publish();
    }

    fn publish(&mut self) {
        self.publish.send_replace(Some(self.index.snapshot()));
    }

    fn object(&self, api_version: &str, kind: &str, name: &str) -> Value {
        self.fake
            .get(api_version, kind, "ns", name)
            .unwrap_or_else(|| panic!("{kind} ns/{name} missing"))
    }

    /// Waits until `check` holds for the object's conditions; fails after [`WAIT`].
    async fn until(
        &self,
        (api_version, kind, name): (&str, &str, &str),
        what: &str,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let object = self.object(api_version, kind, name);
            let conditions = conditions(&object);
            if check(&conditions) {
                return conditions;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{kind} ns/{name}: {what} never happened; conditions {conditions:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn status_writes(&self) -> usize {
        self.fake
            .writes()
            .iter()
            .filter(|r| r.path.ends_with("/status"))
            .count()
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("writer stops")
            .unwrap();
    }
}

const SVC: (&str, &str, &str) = ("v1", "Service", "svc");
const POLICY: (&str, &str, &str) = ("security.istio.io/v1", "AuthorizationPolicy", "policy");

fn conditions(object: &Value) -> Vec<Value> {
    object["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn find<'a>(conditions: &'a [Value], kind: &str) -> Option<&'a Value> {
    conditions.iter().find(|c| c["type"] == kind)
}

fn base() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "wp", "namespace": "ns"},
            "spec": {"gatewayClassName": "istio-waypoint", "listeners": [
                {"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
            "status": {"addresses": [{"type": "IPAddress", "value": "10.9.0.1"}]},
        }),
    ]
}

/// A Service using waypoint `waypoint` (none: no label), at `generation`, carrying another
/// controller's condition.
fn service(waypoint: Option<&str>, generation: i64) -> Value {
    let labels = match waypoint {
        Some(w) => json!({"istio.io/use-waypoint": w}),
        None => json!({}),
    };
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns", "labels": labels, "generation": generation},
        "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]},
        "status": {"conditions": [other_condition()]},
    })
}

fn other_condition() -> Value {
    json!({"type": "example.com/Other", "status": "True", "reason": "Mine",
           "message": "not ambientd's", "lastTransitionTime": "2020-01-01T00:00:00Z"})
}

/// An ALLOW policy; with `http`, its rule also names HTTP methods (unsupported at ztunnel).
fn policy(http: bool) -> Value {
    let to = if http {
        json!([{"operation": {"ports": ["80"], "methods": ["GET"]}}])
    } else {
        json!([{"operation": {"ports": ["80"]}}])
    };
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "policy", "namespace": "ns", "generation": 2},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "rules": [{"to": to}]},
    })
}

#[tokio::test]
async fn leader_writes_conditions_keeps_others_and_follows_fixes() {
    let mut h = Harness::start(true).await;
    h.apply(&[base(), vec![service(Some("wp"), 4), policy(true)]].concat());

    let svc = h
        .until(SVC, "WaypointBound written", |c| find(c, BOUND).is_some())
        .await;
    let bound = find(&svc, BOUND).unwrap();
    assert_eq!(bound["status"], "True");
    assert_eq!(bound["reason"], "WaypointAccepted");
    assert_eq!(bound["message"], "Successfully attached to waypoint ns/wp");
    assert_eq!(bound["observedGeneration"], 4);
    assert!(bound["lastTransitionTime"].is_string());
    assert_eq!(find(&svc, "example.com/Other"), Some(&other_condition()));

    let pol = h
        .until(POLICY, "ZtunnelAccepted written", |c| {
            find(c, ACCEPTED).is_some()
        })
        .await;
    let accepted = find(&pol, ACCEPTED).unwrap().clone();
    assert_eq!(accepted["status"], "True");
    assert_eq!(accepted["reason"], "UnsupportedValue");
    assert!(
        accepted["message"]
            .as_str()
            .unwrap()
            .starts_with("ztunnel does not support HTTP attributes (found: methods)"),
        "{accepted}"
    );
    assert_eq!(accepted["observedGeneration"], 2);

    // Fixing the policy rewrites the condition; the status stays True, so its
    // lastTransitionTime does not move.
    h.apply(&[policy(false)]);
    let pol = h
        .until(POLICY, "ZtunnelAccepted updated", |c| {
            find(c, ACCEPTED).is_some_and(|a| a["reason"] == "Accepted")
        })
        .await;
    let fixed = find(&pol, ACCEPTED).unwrap();
    assert_eq!(fixed["message"], "attached to ztunnel");
    assert_eq!(fixed["lastTransitionTime"], accepted["lastTransitionTime"]);

    // Pointing the service at a missing waypoint flips the condition to False.
    h.apply(&[service(Some("missing"), 5)]);
    let svc = h
        .until(SVC, "WaypointBound flipped", |c| {
            find(c, BOUND).is_some_and(|b| b["status"] == "False")
        })
        .await;
    let failed = find(&svc, BOUND).unwrap();
    assert_eq!(failed["reason"], "WaypointIsNotReady");
    assert_eq!(failed["message"], "waypoint \"ns/missing\" is not ready");
    assert_eq!(failed["observedGeneration"], 5);

    // Removing the label removes ambientd's condition and only it.
    h.apply(&[service(None, 6)]);
    let svc = h
        .until(SVC, "WaypointBound removed", |c| find(c, BOUND).is_none())
        .await;
    assert_eq!(svc, vec![other_condition()]);

    // Every call was a list, a status read or a status patch: what the Helm RBAC must grant.
    let mut calls: Vec<String> = h
        .fake
        .api_calls()
        .into_iter()
        .map(
            |ApiCall {
                 verb,
                 group,
                 resource,
                 subresource,
                 ..
             }| {
                let sub = subresource.map(|s| format!("/{s}")).unwrap_or_default();
                format!("{verb} {group}/{resource}{sub}")
            },
        )
        .collect();
    calls.sort();
    calls.dedup();
    assert_eq!(
        calls,
        vec![
            "get /services/status",
            "get security.istio.io/authorizationpolicies/status",
            "list /services",
            "list networking.istio.io/serviceentries",
            "list networking.istio.io/workloadentries",
            "list security.istio.io/authorizationpolicies",
            "patch /services/status",
            "patch security.istio.io/authorizationpolicies/status",
        ]
    );
    h.stop().await;
}

#[tokio::test]
async fn nothing_changed_nothing_written() {
    let mut h = Harness::start(true).await;
    h.apply(&[base(), vec![service(Some("wp"), 1), policy(true)]].concat());
    h.until(SVC, "written", |c| find(c, BOUND).is_some()).await;
    h.until(POLICY, "written", |c| find(c, ACCEPTED).is_some())
        .await;
    let writes = h.status_writes();
    assert_eq!(writes, 2, "{:?}", h.fake.writes());

    // The same snapshot again, then one with an unrelated change.
    h.publish();
    h.apply(&[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})]);
    // A change to the service that does not change its condition (same generation).
    let mut relabelled = service(Some("wp"), 1);
    relabelled["metadata"]["labels"]["team"] = json!("a");
    h.apply(&[relabelled]);
    tokio::time::sleep(QUIET).await;
    assert_eq!(h.status_writes(), writes, "{:?}", h.fake.writes());
    h.stop().await;
}

#[tokio::test]
async fn non_leader_reads_and_writes_nothing_until_it_leads() {
    let mut h = Harness::start(false).await;
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    tokio::time::sleep(QUIET).await;
    assert!(
        h.fake.request_log().is_empty(),
        "a non-leader called the API: {:?}",
        h.fake.request_log()
    );

    h.leader.send_replace(true);
    h.until(SVC, "written once leading", |c| find(c, BOUND).is_some())
        .await;

    // Leadership lost: later changes are not written.
    h.leader.send_replace(false);
    tokio::time::sleep(QUIET).await;
    let writes = h.status_writes();
    h.apply(&[service(None, 2)]);
    tokio::time::sleep(QUIET).await;
    assert_eq!(h.status_writes(), writes);
    assert!(find(&conditions(&h.object("v1", "Service", "svc")), BOUND).is_some());

    // Leading again reconciles what changed meanwhile.
    h.leader.send_replace(true);
    h.until(SVC, "removed after leading again", |c| {
        find(c, BOUND).is_none()
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn gaining_leadership_fixes_stale_conditions_and_skips_correct_ones() {
    let mut h = Harness::start(false).await;
    // One service carries a stale condition from an earlier leader; another already has the
    // right one.
    let mut stale = service(None, 1);
    stale["status"]["conditions"] = json!([other_condition(), {
        "type": BOUND, "status": "True", "reason": "WaypointAccepted",
        "message": "Successfully attached to waypoint ns/old", "observedGeneration": 1,
        "lastTransitionTime": "2020-01-01T00:00:00Z"}]);
    let mut correct = service(Some("wp"), 3);
    correct["metadata"]["name"] = json!("correct");
    correct["status"]["conditions"] = json!([{
        "type": BOUND, "status": "True", "reason": "WaypointAccepted",
        "message": "Successfully attached to waypoint ns/wp", "observedGeneration": 3,
        "lastTransitionTime": "2020-01-01T00:00:00Z"}]);
    h.apply(&[base(), vec![stale, correct]].concat());

    h.leader.send_replace(true);
    let svc = h
        .until(SVC, "stale condition removed", |c| find(c, BOUND).is_none())
        .await;
    assert_eq!(svc, vec![other_condition()]);
    tokio::time::sleep(QUIET).await;
    let touched: Vec<String> = h
        .fake
        .request_log()
        .iter()
        .filter(|r| r.path.contains("/correct"))
        .map(|r| r.to_string())
        .collect();
    assert!(touched.is_empty(), "{touched:?}");
    h.stop().await;
}

#[tokio::test]
async fn failures_are_retried_and_deleted_objects_skipped() {
    let mut h = Harness::start(true).await;
    h.fake.fail_requests("PATCH", "services", 2, 500);
    // An object the index knows but the API server no longer has.
    let mut gone = service(Some("wp"), 1);
    gone["metadata"]["name"] = json!("gone");
    h.store(&[gone]);
    h.fake.delete("v1", "Service", "ns", "gone");
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    h.until(SVC, "written after retries", |c| find(c, BOUND).is_some())
        .await;
    let patches = h
        .fake
        .request_log()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/svc/status"))
        .count();
    assert_eq!(patches, 3, "two failures, then success");
    let count = |kind: &str, result: &str| {
        h.metrics
            .status_writes
            .get_or_create(&StatusLabel {
                kind: kind.into(),
                result: result.into(),
            })
            .get()
    };
    // The counters move after the responses the fake sends (and the deleted object is a write
    // of its own, which may finish after `svc`'s): wait for them, then check them exactly.
    let counts = || {
        (
            count("Service", "error"),
            count("Service", "written"),
            count("Service", "gone"),
        )
    };
    let deadline = std::time::Instant::now() + WAIT;
    while counts() != (2, 1, 1) {
        assert!(
            std::time::Instant::now() < deadline,
            "status write counters (error, written, gone) = {:?}, expected (2, 1, 1)",
            counts()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.stop().await;
}

#[tokio::test]
async fn a_conflict_is_read_again() {
    let mut h = Harness::start(true).await;
    h.fake.fail_requests("PATCH", "services", 1, 409);
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    h.until(SVC, "written after the conflict", |c| {
        find(c, BOUND).is_some()
    })
    .await;
    let reads = h
        .fake
        .request_log()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/svc/status"))
        .count();
    assert_eq!(
        reads, 2,
        "the conflict made the writer read the object again"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_writer_behind_the_change_history_compares_whole_maps() {
    let mut h = Harness::start(true).await;
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    h.until(SVC, "written", |c| find(c, BOUND).is_some()).await;
    // More snapshots than the history keeps, published before the writer runs again.
    h.apply(&[service(Some("missing"), 2)]);
    for i in 0..70 {
        let name = format!("other-{i}");
        h.apply(&[json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})]);
    }
    h.until(SVC, "flipped", |c| {
        find(c, BOUND).is_some_and(|b| b["status"] == "False")
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn a_recreated_object_gets_its_condition_again() {
    let mut h = Harness::start(true).await;
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    h.until(SVC, "written", |c| find(c, BOUND).is_some()).await;
    // Deleted and created again (without our condition) between two snapshots.
    h.fake.delete("v1", "Service", "ns", "svc");
    h.index.delete(&ambientd::discovery::ObjectRef {
        kind: ambientd::discovery::Kind::Service,
        namespace: "ns".into(),
        name: "svc".into(),
    });
    h.apply(&[service(Some("wp"), 1)]);
    assert!(find(&conditions(&h.object("v1", "Service", "svc")), BOUND).is_none());
    h.until(SVC, "written on the new object", |c| {
        find(c, BOUND).is_some()
    })
    .await;
    h.stop().await;
}

#[tokio::test]
async fn a_failed_list_on_gaining_leadership_is_retried() {
    let mut h = Harness::start(false).await;
    h.apply(&[base(), vec![service(Some("wp"), 1)]].concat());
    // The first GET on services is the writer's list when it starts leading.
    h.fake.fail_requests("GET", "services", 1, 500);
    h.leader.send_replace(true);
    h.until(SVC, "written after the list was retried", |c| {
        find(c, BOUND).is_some()
    })
    .await;
    let lists = h
        .fake
        .request_log()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/services")
        .count();
    assert_eq!(lists, 2);
    h.stop().await;
}
