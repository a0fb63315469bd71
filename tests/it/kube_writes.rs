//! Cluster writes by whole ambientd replicas (app::start) against the fake API server over
//! real HTTP: the CA Secret `istio-ca-secret` (created once, shared by racing replicas, reused
//! by later ones), the root ConfigMaps `istio-ca-root-cert` (every selected namespace, new
//! ones, restored after deletion and edits, updated when the root changes, never in excluded,
//! unselected or terminating namespaces), and a non-leader that writes nothing at all.

use crate::support::kube as kube_support;

use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use kube_support::FakeApiServer;
use kube_support::replica::{Replica, SYSTEM, replica, until};
use serde_json::{Value, json};

const ROOT_CM: &str = "istio-ca-root-cert";

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::from_value::<ByteString>(value.clone())
        .expect("base64")
        .0
}

fn ca_secret(fake: &FakeApiServer) -> Option<Value> {
    fake.get("v1", "Secret", SYSTEM, "istio-ca-secret")
}

fn root_in(fake: &FakeApiServer, namespace: &str) -> Option<String> {
    let cm = fake.get("v1", "ConfigMap", namespace, ROOT_CM)?;
    assert_eq!(cm["metadata"]["labels"]["istio.io/config"], "true", "{cm}");
    cm["data"]["root-cert.pem"].as_str().map(str::to_string)
}

fn posts_to(fake: &FakeApiServer, resource: &str) -> Vec<kube_support::ApiCall> {
    fake.api_calls()
        .into_iter()
        .filter(|c| c.verb == "create" && c.resource == resource)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_create_one_ca_secret_and_later_ones_reuse_it() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace(SYSTEM, json!({})));
    let (a, b) = tokio::join!(replica(&fake, "a", &[]), replica(&fake, "b", &[]));

    let secret = ca_secret(&fake).expect("istio-ca-secret was created");
    assert_eq!(secret["type"], "istio.io/ca-root");
    let data = &secret["data"];
    let cert = bytes(&data["ca-cert.pem"]);
    assert!(String::from_utf8_lossy(&cert).contains("BEGIN CERTIFICATE"));
    assert!(String::from_utf8_lossy(&bytes(&data["ca-key.pem"])).contains("PRIVATE KEY"));
    assert_eq!(
        bytes(&data["root-cert.pem"]),
        cert,
        "root-cert.pem is the CA certificate"
    );
    assert!(bytes(&data["cert-chain.pem"]).is_empty());
    assert!(bytes(&data["key.pem"]).is_empty());

    // Both replicas sign with the one stored root, whoever won the race.
    let stored = String::from_utf8(cert).unwrap();
    assert_eq!(a.root().trim(), stored.trim());
    assert_eq!(b.root().trim(), stored.trim());
    let creates = posts_to(&fake, "secrets");
    assert!((1..=2).contains(&creates.len()), "{creates:?}");

    // A replica starting later reads it and creates nothing.
    let c = replica(&fake, "c", &[]).await;
    assert_eq!(c.root().trim(), stored.trim());
    assert_eq!(posts_to(&fake, "secrets").len(), creates.len());

    // Exactly one of the three leads, and says so on /metrics.
    let leaders = |rs: &[&Replica]| {
        rs.iter()
            .filter(|r| r.running.leadership.is_leader())
            .count()
    };
    until("one leader among three replicas", || {
        let n = leaders(&[&a, &b, &c]);
        assert!(n <= 1, "{n} leaders at once");
        n == 1
    })
    .await;
    for r in [&a, &b, &c] {
        assert_eq!(
            r.running.metrics.leader.get(),
            i64::from(r.running.leadership.is_leader())
        );
    }

    // Deleted while running: the leader puts the CA in use back, so the root stays.
    assert!(fake.delete("v1", "Secret", SYSTEM, "istio-ca-secret"));
    until("istio-ca-secret re-created", || {
        ca_secret(&fake).is_some_and(|s| bytes(&s["data"]["ca-cert.pem"]) == stored.as_bytes())
    })
    .await;
    assert_eq!(a.root().trim(), stored.trim());

    // The leader stops: another replica takes over.
    let (leader, rest): (Vec<Replica>, Vec<Replica>) = [a, b, c]
        .into_iter()
        .partition(|r| r.running.leadership.is_leader());
    for r in leader {
        r.running.stop().await;
    }
    until("a new leader after the old one stopped", || {
        leaders(&[&rest[0], &rest[1]]) == 1
    })
    .await;
    for r in rest {
        r.running.stop().await;
    }
}

#[tokio::test]
async fn a_replica_that_loses_the_create_race_uses_the_winners_secret() {
    use ambientd::kube::ca_secret::{CaSecrets, Origin};
    let fake = FakeApiServer::start().await;
    fake.apply(namespace(SYSTEM, json!({})));
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let winner = CaSecrets::new(fake.client(), SYSTEM, "cluster.local", dirs.0.path());
    let won = winner.ensure().await.unwrap();
    assert_eq!(won.origin, Origin::SelfSigned);

    // The loser read both Secrets as absent just before the winner created one: its create
    // gets 409 AlreadyExists, and it re-reads and adopts the winner's CA.
    fake.fail_requests("GET", "secrets", 2, 404);
    let loser = CaSecrets::new(fake.client(), SYSTEM, "cluster.local", dirs.1.path());
    let lost = loser.ensure().await.unwrap();
    assert_eq!(lost, won);
    assert_eq!(posts_to(&fake, "secrets").len(), 2, "both tried to create");
    for name in [
        "ca-cert.pem",
        "ca-key.pem",
        "root-cert.pem",
        "cert-chain.pem",
    ] {
        assert_eq!(
            std::fs::read(loser.dir().join(name)).unwrap(),
            std::fs::read(winner.dir().join(name)).unwrap(),
            "{name}"
        );
    }
}

/// A plugged-in CA (istiod's `cacerts` layout), generated fresh.
fn cacerts_secret() -> (Value, String) {
    let generated =
        ambientd::ca::roots::self_signed_pem("cluster.local", time::OffsetDateTime::now_utc())
            .unwrap();
    let b64 = |s: &str| serde_json::to_value(ByteString(s.as_bytes().to_vec())).unwrap();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cacerts", "namespace": SYSTEM},
        "data": {
            "ca-cert.pem": b64(&generated.cert_pem),
            "ca-key.pem": b64(&generated.key_pem),
            "root-cert.pem": b64(&generated.cert_pem),
            "cert-chain.pem": b64(""),
        },
    });
    (secret, generated.cert_pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_configmaps_everywhere_selected_restored_and_refreshed() {
    let fake = FakeApiServer::start().await;
    let on = json!({"istio-discovery": "enabled"});
    fake.apply(namespace(SYSTEM, on.clone()));
    fake.apply(namespace("app", on.clone()));
    fake.apply(namespace("kube-system", on.clone()));
    fake.apply(namespace("kube-public", on.clone()));
    fake.apply(namespace("kube-node-lease", on.clone()));
    fake.apply(namespace("other", json!({})));
    fake.apply(namespace("dying", on.clone()));
    fake.terminate_namespace("dying");

    // The first creates fail: they are retried with backoff.
    fake.fail_requests("POST", "configmaps", 3, 500);
    let replica = replica(&fake, "a", &["istio-discovery=enabled"]).await;
    let root = replica.root();
    for ns in [SYSTEM, "app", "kube-system"] {
        until(&format!("the root ConfigMap in {ns}"), || {
            root_in(&fake, ns).as_deref() == Some(root.as_str())
        })
        .await;
    }
    assert!(replica.running.leadership.is_leader());

    // A new selected namespace gets it; a namespace that becomes selected does too.
    fake.apply(namespace("late", on.clone()));
    until("the root ConfigMap in a new namespace", || {
        root_in(&fake, "late").is_some()
    })
    .await;
    fake.apply(namespace("other-now-selected", json!({})));
    fake.apply(namespace("other-now-selected", on.clone()));
    until("the root ConfigMap in a newly selected namespace", || {
        root_in(&fake, "other-now-selected").is_some()
    })
    .await;

    // Deleted: re-created.
    assert!(fake.delete("v1", "ConfigMap", "app", ROOT_CM));
    until("the deleted ConfigMap back", || {
        root_in(&fake, "app").as_deref() == Some(root.as_str())
    })
    .await;
    // Edited (another root, label gone): patched back.
    fake.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ROOT_CM, "namespace": "app"},
        "data": {"root-cert.pem": "tampered", "extra": "kept"}}));
    until("the edited ConfigMap restored", || {
        fake.get("v1", "ConfigMap", "app", ROOT_CM)
            .is_some_and(|cm| {
                cm["data"]["root-cert.pem"] == root.as_str()
                    && cm["metadata"]["labels"]["istio.io/config"] == "true"
            })
    })
    .await;

    // A plugged-in CA appears: the CA reloads and every ConfigMap carries the new root.
    let (cacerts, new_root) = cacerts_secret();
    fake.apply(cacerts);
    for ns in [SYSTEM, "app", "kube-system", "late"] {
        until(&format!("the new root in {ns}"), || {
            root_in(&fake, ns).is_some_and(|r| r.trim() == new_root.trim())
        })
        .await;
    }
    until("the replica serving the new root", || {
        replica.root().trim() == new_root.trim()
    })
    .await;

    // Never in excluded, unselected or terminating namespaces.
    for ns in ["kube-public", "kube-node-lease", "other", "dying"] {
        assert!(root_in(&fake, ns).is_none(), "a root ConfigMap in {ns}");
    }
    // Every write is one the Helm chart's RBAC grants (docs/deployment.md).
    for call in fake.api_calls() {
        let allowed = match (
            call.verb.as_str(),
            call.group.as_str(),
            call.resource.as_str(),
        ) {
            ("get" | "list" | "watch", _, _) => true,
            ("create", "authentication.k8s.io", "tokenreviews") => true,
            ("create" | "patch", "", "configmaps") => call.subresource.is_none(),
            ("create" | "patch", "coordination.k8s.io", "leases") => {
                call.namespace.as_deref() == Some(SYSTEM)
            }
            ("create", "", "secrets") => call.namespace.as_deref() == Some(SYSTEM),
            // The waypoint controller: GatewayClass istio-waypoint and its status, and the
            // applies and status of waypoint Gateways (none in this scenario).
            ("create", "gateway.networking.k8s.io", "gatewayclasses") => true,
            (
                "patch",
                "gateway.networking.k8s.io",
                "gatewayclasses" | "gateways" | "httproutes" | "grpcroutes",
            ) => call.subresource.as_deref() == Some("status"),
            ("patch", "", "serviceaccounts" | "services") | ("patch", "apps", "deployments") => {
                call.subresource.is_none()
            }
            _ => false,
        };
        assert!(allowed, "an API call outside the documented set: {call}");
    }
    for call in posts_to(&fake, "configmaps") {
        let ns = call.namespace.unwrap_or_default();
        assert!(
            !["kube-public", "kube-node-lease", "other", "dying"].contains(&ns.as_str()),
            "a create in {ns}"
        );
    }
    replica.running.stop().await;
}

/// A Lease held by someone else, renewed now (the test renews it by calling again).
fn foreign_lease(fake: &FakeApiServer) -> Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ambientd-leader", "namespace": SYSTEM},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3,
                 "acquireTime": now, "renewTime": now}});
    fake.apply(lease.clone());
    lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_leader_writes_nothing_until_it_leads() {
    let fake = FakeApiServer::start().await;
    fake.apply(namespace(SYSTEM, json!({})));
    fake.apply(namespace("app", json!({})));
    // The CA Secret exists already, so starting creates nothing either.
    let (cacerts, root) = cacerts_secret();
    fake.apply(cacerts);
    foreign_lease(&fake);
    let replica = replica(&fake, "a", &[]).await;
    let writes_before = fake.writes().len();
    assert_eq!(writes_before, 0, "{:?}", fake.writes());

    // Someone else leads for a while, renewing; ambientd keeps its hands off.
    let end = Instant::now() + Duration::from_secs(4);
    while Instant::now() < end {
        foreign_lease(&fake);
        assert!(!replica.running.leadership.is_leader());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(root_in(&fake, "app").is_none());
    assert_eq!(fake.writes(), vec![], "a non-leader wrote");

    // The other leader is gone (no more renewals): ambientd takes over and writes.
    until("leadership after the other leader's lease expired", || {
        replica.running.leadership.is_leader()
    })
    .await;
    until("the root ConfigMap from the new leader", || {
        root_in(&fake, "app").is_some_and(|r| r.trim() == root.trim())
    })
    .await;
    replica.running.stop().await;
}
