//! The chart's RBAC against the API calls whole ambientd replicas really make: two replicas
//! (`app::start`, cluster mode, every cluster write on) run against the fake API server and do
//! everything they write and read: the first list and watch of every kind, leader election,
//! creating the CA Secret, root ConfigMaps in several namespaces (one restored after deletion,
//! one patched back after an edit),
//! status conditions on an AuthorizationPolicy, a Service, a ServiceEntry and a WorkloadEntry
//! bound to a waypoint, the status of an HTTPRoute and a GRPCRoute, a CSR whose token goes to a TokenReview, and a graceful stop (the Lease
//! released). Then every call in the fake's request log must be allowed by the chart's rules
//! (default values, release namespace = the replicas' system namespace), and every rule of the
//! chart must be used by some call, unless it is listed in [`RESERVED`] with a reason.
//!
//! Without the Helm engine this fails under CI (`CI` set) and skips, loudly, elsewhere.

use crate::support::ca as ca_support;
use crate::support::chart as chart_support;
use crate::support::kube as kube_support;

use std::collections::BTreeSet;

use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use chart_support::{Object, engine, rbac_allows};
use kube_support::FakeApiServer;
use kube_support::replica::{SYSTEM, WAIT, replica, until};
use serde_json::{Value, json};

const ROOT_CM: &str = "istio-ca-root-cert";
/// Namespaces that get the root ConfigMap (besides the system namespace).
const APPS: [&str; 2] = ["ns", "other"];

/// Rules no call in the log shows, kept on purpose: (verb, group, resource, why). None today:
/// every rule of the chart is used by the scenario.
const RESERVED: [(&str, &str, &str, &str); 0] = [];

/// A mesh whose every status kind has something to say: a waypoint for all traffic, and a
/// Service, a ServiceEntry and a WorkloadEntry that use it; a policy ztunnel enforces.
fn seed(fake: &FakeApiServer) {
    for ns in [SYSTEM, APPS[0], APPS[1]] {
        fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
    }));
    fake.apply(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "wp", "namespace": "ns",
                     "labels": {"istio.io/waypoint-for": "all"}},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
        "status": {"addresses": [{"type": "IPAddress", "value": "10.9.0.1"}]},
    }));
    let uses = json!({"istio.io/use-waypoint": "wp"});
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns", "labels": uses},
        "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]},
    }));
    fake.apply(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "se", "namespace": "ns", "labels": uses},
        "spec": {"hosts": ["a.example.com"], "addresses": ["240.0.0.1"],
                 "ports": [{"name": "http", "number": 80, "protocol": "HTTP"}],
                 "resolution": "STATIC"},
    }));
    fake.apply(json!({
        "apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
        "metadata": {"name": "we", "namespace": "ns", "labels": uses},
        "spec": {"address": "10.1.0.1"},
    }));
    fake.apply(json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "policy", "namespace": "ns"},
        "spec": {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["80"]}}]}]},
    }));
    for kind in ["HTTPRoute", "GRPCRoute"] {
        fake.apply(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
            "metadata": {"name": "route", "namespace": "ns"},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "svc"}],
                     "rules": [{"backendRefs": [{"name": "svc", "port": 80}]}]},
        }));
    }
}

fn condition(fake: &FakeApiServer, api_version: &str, kind: &str, name: &str, ty: &str) -> bool {
    fake.get(api_version, kind, "ns", name)
        .and_then(|o| o["status"]["conditions"].as_array().cloned())
        .is_some_and(|conditions| conditions.iter().any(|c| c["type"] == ty))
}

/// A TokenReview answer for ztunnel's token on node-a.
fn ztunnel_review() -> Value {
    json!({
        "authenticated": true,
        "audiences": ["istio-ca"],
        "user": {
            "username": "system:serviceaccount:istio-system:ztunnel",
            "uid": "sa-uid",
            "groups": ["system:serviceaccounts"],
            "extra": {
                "authentication.kubernetes.io/pod-name": ["ztunnel-a"],
                "authentication.kubernetes.io/pod-uid": ["pod-uid-1"],
                "authentication.kubernetes.io/node-name": ["node-a"]
            }
        }
    })
}

/// Drives two replicas through every kind of call they make; returns the distinct calls.
async fn exercise() -> BTreeSet<kube_support::ApiCall> {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    fake.add_token("ztunnel-token", ztunnel_review());
    let (a, b) = tokio::join!(replica(&fake, "a", &[]), replica(&fake, "b", &[]));

    // Leader election: one of them leads.
    until("a leader", || {
        a.running.leadership.is_leader() || b.running.leadership.is_leader()
    })
    .await;
    // The CA Secret, created by whoever won the race.
    until("istio-ca-secret", || {
        fake.get("v1", "Secret", SYSTEM, "istio-ca-secret")
            .is_some()
    })
    .await;
    // Root ConfigMaps everywhere, and one restored after deletion.
    let root_in = |ns: &str| fake.get("v1", "ConfigMap", ns, ROOT_CM).is_some();
    until("root ConfigMaps", || {
        root_in(SYSTEM) && APPS.iter().all(|ns| root_in(ns))
    })
    .await;
    assert!(fake.delete("v1", "ConfigMap", "other", ROOT_CM));
    until("the deleted root ConfigMap restored", || root_in("other")).await;
    let mut edited = fake.get("v1", "ConfigMap", "ns", ROOT_CM).unwrap();
    edited["data"]["root-cert.pem"] = json!("edited");
    fake.apply(edited);
    until("the edited root ConfigMap patched back", || {
        fake.get("v1", "ConfigMap", "ns", ROOT_CM)
            .is_some_and(|cm| cm["data"]["root-cert.pem"] != "edited")
    })
    .await;
    // Status on every kind the writer serves.
    for (api_version, kind, name, ty) in [
        ("v1", "Service", "svc", "istio.io/WaypointBound"),
        (
            "networking.istio.io/v1",
            "ServiceEntry",
            "se",
            "istio.io/WaypointBound",
        ),
        (
            "networking.istio.io/v1",
            "WorkloadEntry",
            "we",
            "istio.io/WaypointBound",
        ),
        (
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "policy",
            "ZtunnelAccepted",
        ),
    ] {
        until(&format!("{ty} on the {kind}"), || {
            condition(&fake, api_version, kind, name, ty)
        })
        .await;
    }
    for kind in ["HTTPRoute", "GRPCRoute"] {
        until(&format!("the {kind}'s status"), || {
            fake.get("gateway.networking.k8s.io/v1", kind, "ns", "route")
                .is_some_and(|r| {
                    r["status"]["parents"]
                        .as_array()
                        .is_some_and(|p| !p.is_empty())
                })
        })
        .await;
    }
    // A CSR with a token only the API server can check: a TokenReview.
    let tls = ca_support::ztunnel_tls(&a.ca_dir.join("root-cert.pem"));
    let channel = ca_support::channel(a.running.xds_tls_address.unwrap(), tls, ca_support::ISTIOD)
        .await
        .expect("TLS connect");
    let (_key, csr) = ca_support::ztunnel_csr("spiffe://cluster.local/ns/istio-system/sa/ztunnel");
    let answer =
        tokio::time::timeout(
            WAIT,
            IstioCertificateServiceClient::new(channel)
                .create_certificate(ca_support::csr_request(&csr, Some("ztunnel-token"), None)),
        )
        .await
        .expect("CSR answered in time");
    assert!(answer.is_ok(), "the CSR is signed: {answer:?}");
    assert!(fake.token_reviews() >= 1, "the token went to a TokenReview");

    // A graceful stop releases the Lease.
    tokio::join!(a.running.stop(), b.running.stop());
    fake.api_calls().into_iter().collect()
}

/// One grant of a rule: a verb on a group's resource (with `/subresource`), maybe by name.
#[derive(Debug)]
struct Grant {
    verb: String,
    group: String,
    resource: String,
    names: Vec<String>,
    namespace: Option<String>,
}

fn grants(objects: &[Object]) -> Vec<Grant> {
    let mut grants = Vec::new();
    for object in objects {
        let (rules, namespace) = match object {
            Object::ClusterRole(r) => (&r.rules, None),
            Object::Role(r) => (&r.rules, r.metadata.namespace.clone()),
            _ => continue,
        };
        for rule in rules.iter().flatten() {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        grants.push(Grant {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            names: rule.resource_names.clone().unwrap_or_default(),
                            namespace: namespace.clone(),
                        });
                    }
                }
            }
        }
    }
    grants
}

fn uses(grant: &Grant, call: &kube_support::ApiCall) -> bool {
    let resource = match &call.subresource {
        Some(sub) => format!("{}/{sub}", call.resource),
        None => call.resource.clone(),
    };
    grant.verb == call.verb
        && grant.group == call.group
        && grant.resource == resource
        && (grant.names.is_empty() || call.name.as_ref().is_some_and(|n| grant.names.contains(n)))
        && (grant.namespace.is_none() || grant.namespace == call.namespace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_allows_every_call_in_the_log_and_nothing_unused() {
    let Some(helm) = engine() else { return };
    let calls = exercise().await;
    let listing = calls
        .iter()
        .map(|c| format!("  {c} name={:?}", c.name))
        .collect::<Vec<_>>()
        .join("\n");

    // Every kind the replicas make, at least once: the scenario did what it says.
    for (verb, resource, sub) in [
        ("list", "pods", None),
        ("watch", "gatewayclasses", None),
        ("create", "tokenreviews", None),
        ("create", "secrets", None),
        ("watch", "secrets", None),
        ("create", "configmaps", None),
        ("patch", "configmaps", None),
        ("create", "leases", None),
        ("patch", "leases", None),
        ("get", "authorizationpolicies", Some("status")),
        ("patch", "services", Some("status")),
        ("patch", "serviceentries", Some("status")),
        ("patch", "workloadentries", Some("status")),
        ("patch", "authorizationpolicies", Some("status")),
        ("patch", "httproutes", Some("status")),
        ("patch", "grpcroutes", Some("status")),
    ] {
        assert!(
            calls.iter().any(|c| c.verb == verb
                && c.resource == resource
                && c.subresource.as_deref() == sub),
            "no {verb} {resource} {sub:?} in the log:\n{listing}"
        );
    }

    let rendered = helm.render(json!({}), SYSTEM);
    let denied: Vec<_> = calls
        .iter()
        .filter(|c| {
            let call = chart_support::ApiCall {
                verb: &c.verb,
                group: &c.group,
                resource: &c.resource,
                subresource: c.subresource.as_deref(),
                namespace: c.namespace.as_deref(),
                name: c.name.as_deref(),
            };
            !rbac_allows(&rendered.objects, &call)
        })
        .map(|c| format!("{c} name={:?}", c.name))
        .collect();
    assert!(
        denied.is_empty(),
        "the chart denies {denied:#?}\nevery distinct call:\n{listing}"
    );

    // The other way: every grant is used by some call, or reserved with a reason.
    let unused: Vec<_> = grants(&rendered.objects)
        .into_iter()
        .filter(|g| !calls.iter().any(|c| uses(g, c)))
        .filter(|g| {
            !RESERVED.iter().any(|(verb, group, resource, _)| {
                g.verb == *verb && g.group == *group && g.resource == *resource
            })
        })
        .collect();
    assert!(
        unused.is_empty(),
        "rules no call uses (remove them, or add them to RESERVED with a reason): \
         {unused:#?}\nevery distinct call:\n{listing}"
    );
}
