//! Route status (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)) from a whole replica against the fake API server:
//! the leader writes an HTTPRoute's and a GRPCRoute's `parents` with istiod's conditions
//! (a bound Service, a Service without a waypoint, a missing one, the waypoint Gateway),
//! follows a change of the route (a missing backend: `ResolvedRefs` false) and of its parent
//! (the Service created: `Accepted` true), and writes nothing when nothing changed.

use crate::support::kube as kube_support;

use kube_support::FakeApiServer;
use kube_support::replica::{SYSTEM, replica, until};
use serde_json::{Value, json};

const GROUP: &str = "gateway.networking.k8s.io/v1";

fn seed(fake: &FakeApiServer) {
    for ns in [SYSTEM, "apps"] {
        fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    fake.apply(json!({
        "apiVersion": GROUP, "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "apps"},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    }));
    for (name, labels) in [
        ("web", json!({"istio.io/use-waypoint": "waypoint"})),
        ("web-v1", json!({})),
        ("plain", json!({})),
    ] {
        fake.apply(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "apps", "labels": labels},
            "spec": {"clusterIP": null, "ports": [{"name": "http", "port": 80}]},
        }));
    }
}

fn http_route(backend: &str) -> Value {
    json!({
        "apiVersion": GROUP, "kind": "HTTPRoute",
        "metadata": {"name": "r", "namespace": "apps", "generation": 1},
        "spec": {
            "parentRefs": [
                {"group": "", "kind": "Service", "name": "web"},
                {"group": "", "kind": "Service", "name": "plain"},
                {"group": "", "kind": "Service", "name": "later"},
                {"name": "waypoint"},
            ],
            "rules": [{"backendRefs": [{"name": backend, "port": 80}]}],
        },
    })
}

/// A condition's `(type, status, reason)`.
type Triple = (String, String, String);

/// `parent name -> [(type, status, reason)]` of ambientd's parents.
fn parents(route: &Value) -> Vec<(String, Vec<Triple>)> {
    route["status"]["parents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["controllerName"] == "istio.io/gateway-controller")
        .map(|p| {
            let conditions = p["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    let s = |f: &str| c[f].as_str().unwrap_or_default().to_string();
                    (s("type"), s("status"), s("reason"))
                })
                .collect();
            (
                p["parentRef"]["name"].as_str().unwrap().to_string(),
                conditions,
            )
        })
        .collect()
}

fn triple(t: &str, s: &str, r: &str) -> Triple {
    (t.into(), s.into(), r.into())
}

fn status_writes(fake: &FakeApiServer, plural: &str) -> usize {
    fake.writes()
        .iter()
        .filter(|w| w.path.contains(&format!("/{plural}/")) && w.path.ends_with("/status"))
        .count()
}

#[tokio::test]
async fn the_leader_writes_route_status_as_istiod_does() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    fake.apply(http_route("web-v1"));
    fake.apply(json!({
        "apiVersion": GROUP, "kind": "GRPCRoute",
        "metadata": {"name": "g", "namespace": "apps"},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "web"}],
            "rules": [{"matches": [{"method": {"service": "echo.Echo"}}],
                       "backendRefs": [{"name": "web-v1", "port": 80}]}],
        },
    }));
    let a = replica(&fake, "a", &[]).await;
    let get = |kind: &str, name: &str| fake.get(GROUP, kind, "apps", name).unwrap();
    until("the HTTPRoute's status", || {
        parents(&get("HTTPRoute", "r")).len() == 4
    })
    .await;
    let route = get("HTTPRoute", "r");
    let accepted = triple("Accepted", "True", "Accepted");
    let resolved = triple("ResolvedRefs", "True", "ResolvedRefs");
    let waypoints = triple("ResolvedWaypoints", "True", "ResolvedWaypoints");
    let got = parents(&route);
    let of = |name: &str| got.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(
        of("web"),
        [accepted.clone(), resolved.clone(), waypoints.clone()]
    );
    assert_eq!(
        of("waypoint"),
        [accepted.clone(), resolved.clone(), waypoints.clone()]
    );
    assert_eq!(of("plain")[0], accepted);
    assert_eq!(
        of("later")[0],
        triple("Accepted", "False", "NoMatchingParent")
    );
    let messages: Vec<&str> = route["status"]["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["conditions"][2]["message"].as_str().unwrap())
        .collect();
    assert!(messages.contains(&"All waypoints resolved"));
    assert!(messages.contains(&"parent not found"));
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("istio.io/use-waypoint label missing"))
    );
    until("the GRPCRoute's status", || {
        parents(&get("GRPCRoute", "g")).len() == 1
    })
    .await;
    assert_eq!(
        parents(&get("GRPCRoute", "g"))[0].1,
        [accepted.clone(), resolved.clone(), waypoints.clone()]
    );

    // A missing backend: ResolvedRefs false on every parent.
    fake.apply(http_route("missing"));
    until("ResolvedRefs false", || {
        parents(&get("HTTPRoute", "r"))
            .iter()
            .all(|(_, c)| c[1] == triple("ResolvedRefs", "False", "BackendNotFound"))
    })
    .await;
    // The missing parent appears: it is accepted.
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "later", "namespace": "apps"},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }));
    until("the new parent accepted", || {
        parents(&get("HTTPRoute", "r"))
            .iter()
            .any(|(n, c)| n == "later" && c[0] == accepted)
    })
    .await;
    // Nothing changes: nothing is written.
    let writes = status_writes(&fake, "httproutes");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(status_writes(&fake, "httproutes"), writes);
    assert!(status_writes(&fake, "grpcroutes") >= 1);
    a.running.stop().await;
}
