//! Status conditions written by a whole ambientd replica (app::start in cluster mode) against
//! the fake API server: the cluster source feeds the index, the leader writes
//! `istio.io/WaypointBound` on a Service using a waypoint and `ZtunnelAccepted` on a policy,
//! and follows a fix; with `--write-status=false` it writes nothing.

use crate::support::kube as kube_support;

use std::time::Duration;

use ambientd::app::{self, Running};
use ambientd::config::Config;
use ambientd::kube::cluster::{ClusterConfig, Retry};
use ambientd::kube::writes::ClusterWrites;
use kube_support::FakeApiServer;
use kube_support::replica::until;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn replica(fake: &FakeApiServer, dir: &std::path::Path, write_status: bool) -> Running {
    let mut config = Config::cluster(ClusterConfig {
        kubeconfig: Some(fake.kubeconfig(dir)),
        retry: Retry::Exponential {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(400),
        },
        ..ClusterConfig::default()
    });
    config.writes = Some(ClusterWrites {
        // A single replica: always the leader.
        leader: None,
        ca_secrets: false,
        root_configmaps: false,
        status: write_status,
        // This test is about status conditions; the waypoint controller has its own
        // (waypoint_controller.rs).
        waypoints: None,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        ..ClusterWrites::new("istio-system")
    });
    tokio::time::timeout(WAIT, app::start(config))
        .await
        .expect("ambientd started in time")
        .expect("ambientd starts")
}

fn seed(fake: &FakeApiServer) {
    fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}));
    fake.apply(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "wp", "namespace": "ns"},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        "status": {"addresses": [{"type": "IPAddress", "value": "10.9.0.1"}]},
    }));
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns", "labels": {"istio.io/use-waypoint": "wp"}},
        "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]},
    }));
    fake.apply(policy(true));
}

fn policy(http: bool) -> Value {
    let operation = if http {
        json!({"ports": ["80"], "paths": ["/admin"]})
    } else {
        json!({"ports": ["80"]})
    };
    json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "policy", "namespace": "ns"},
        "spec": {"action": "DENY", "rules": [{"to": [{"operation": operation}]}]},
    })
}

fn condition(
    fake: &FakeApiServer,
    api_version: &str,
    kind: &str,
    name: &str,
    ty: &str,
) -> Option<Value> {
    let object = fake.get(api_version, kind, "ns", name)?;
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
        .cloned()
}

#[tokio::test]
async fn a_replica_writes_and_updates_conditions() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    let dir = tempfile::tempdir().unwrap();
    let running = replica(&fake, dir.path(), true).await;

    let bound = || condition(&fake, "v1", "Service", "svc", "istio.io/WaypointBound");
    until("WaypointBound on the service", || bound().is_some()).await;
    assert_eq!(
        bound().unwrap()["message"],
        "Successfully attached to waypoint ns/wp"
    );

    let accepted = || {
        condition(
            &fake,
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "policy",
            "ZtunnelAccepted",
        )
    };
    until("ZtunnelAccepted on the policy", || accepted().is_some()).await;
    let first = accepted().unwrap();
    assert_eq!(first["reason"], "UnsupportedValue");
    assert!(
        first["message"].as_str().unwrap().contains("found: paths"),
        "{first}"
    );

    // The fix reaches the index through the watch, and the condition follows.
    let mut fixed = policy(false);
    fixed["status"] = fake
        .get(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "ns",
            "policy",
        )
        .unwrap()["status"]
        .clone();
    fake.apply(fixed);
    until("ZtunnelAccepted updated", || {
        accepted().is_some_and(|c| c["reason"] == "Accepted")
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn write_status_off_writes_nothing() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    let dir = tempfile::tempdir().unwrap();
    let running = replica(&fake, dir.path(), false).await;
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(|s| s.is_some()))
        .await
        .expect("first snapshot in time")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.writes(), vec![]);
    running.stop().await;
}
