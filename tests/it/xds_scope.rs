//! Node-scoped mode (`--scope-to-node`) end to end: a ztunnel gets its node's workloads, the
//! services they are part of, the waypoints those use and the waypoints' own workloads; other
//! keys on demand; changes elsewhere do not reach it; Authorization stays complete.

use crate::support::common as support;

use std::collections::BTreeMap;
use std::time::Duration;

use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::xds::DeltaDiscoveryRequest;
use support::*;

const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: demo}
spec:
  clusterIP: 10.96.0.20
  selector: {app: db}
  ports: [{name: tcp, port: 5432}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo, labels: {istio.io/waypoint-for: service}}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses:
  - {type: IPAddress, value: 10.96.0.30}
  - {type: Hostname, value: waypoint.demo.svc.cluster.local}
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo, labels: {gateway.networking.k8s.io/gateway-name: waypoint}}
spec:
  clusterIP: 10.96.0.30
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: mesh, port: 15008}]
"#;

fn pod(name: &str, node: &str, ip: &str, labels: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: demo, labels: {{{labels}}}}}
spec: {{serviceAccountName: sa, nodeName: {node}, containers: [{{name: main}}]}}
status: {{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: "True"}}]}}
"#
    )
}

const WEB_A: &str = "Kubernetes//Pod/demo/web-a";
const WEB_B: &str = "Kubernetes//Pod/demo/web-b";
const DB_B: &str = "Kubernetes//Pod/demo/db-b";
const WAYPOINT_POD: &str = "Kubernetes//Pod/demo/waypoint-b";
const WEB: &str = "demo/web.demo.svc.cluster.local";
const WAYPOINT: &str = "demo/waypoint.demo.svc.cluster.local";

fn mesh() -> Manifests {
    Manifests::new(&[
        ("mesh.yaml", MESH),
        (
            "web-a.yaml",
            &pod("web-a", "node-a", "10.244.1.10", "app: web"),
        ),
        (
            "web-b.yaml",
            &pod("web-b", "node-b", "10.244.2.10", "app: web"),
        ),
        (
            "db-b.yaml",
            &pod("db-b", "node-b", "10.244.2.20", "app: db"),
        ),
        (
            "waypoint-b.yaml",
            &pod(
                "waypoint-b",
                "node-b",
                "10.244.2.30",
                "gateway.networking.k8s.io/gateway-name: waypoint",
            ),
        ),
        (
            "policy.yaml",
            r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: db-only-web, namespace: demo}
spec:
  selector: {matchLabels: {app: db}}
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/sa]}}]}]
"#,
        ),
    ])
}

async fn start_scoped(mesh: &Manifests) -> ambientd::app::Running {
    let mut config = ambientd::config::Config::local(mesh.root());
    config.scope_to_node = true;
    let running = ambientd::app::start(config).await.expect("start");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("not ready in time")
        .unwrap();
    running
}

#[tokio::test]
async fn a_node_scoped_ztunnel_gets_its_node_and_asks_for_the_rest() {
    let mesh = mesh();
    let running = start_scoped(&mesh).await;
    let mut client = XdsClient::connect(&running).await;
    // A wildcard ztunnel on node-a (subscribe_wildcard sends NODE_NAME node-a).
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (addresses, authorizations) = client.initial_sync().await;
    // web-a, the service it is part of, that service's waypoint and the waypoint's own pod;
    // not node-b's web-b or db-b, nor the db service.
    assert_eq!(names(&addresses), vec![WAYPOINT_POD, WEB_A, WAYPOINT, WEB]);
    // Authorization is complete.
    assert_eq!(names(&authorizations), vec!["demo/db-only-web"]);

    // A change on another node does not reach it; one on its node does.
    mesh.write(
        "db-b.yaml",
        &pod("db-b", "node-b", "10.244.2.20", "app: db, version: v2"),
    );
    client.expect_silence(Duration::from_millis(700)).await;
    mesh.write(
        "web-a.yaml",
        &pod("web-a", "node-a", "10.244.1.10", "app: web, version: v2"),
    );
    let update = client.recv().await;
    assert_eq!(names(&update), vec![WEB_A]);
    client.ack(&update).await;

    // Anything else on demand, by IP: answered, and followed from then on.
    client.look_up("/10.244.2.20").await;
    let answer = client.recv().await;
    assert_eq!(names(&answer), vec![DB_B]);
    assert_eq!(answer.removed_resources, vec!["/10.244.2.20"]);
    client.ack(&answer).await;
    mesh.write(
        "db-b.yaml",
        &pod("db-b", "node-b", "10.244.2.20", "app: db, version: v3"),
    );
    let update = client.recv().await;
    assert_eq!(names(&update), vec![DB_B]);
    client.ack(&update).await;

    // A new pod on its node arrives unasked.
    mesh.write(
        "web-a2.yaml",
        &pod("web-a2", "node-a", "10.244.1.11", "app: web"),
    );
    let update = client.recv().await;
    assert_eq!(names(&update), vec!["Kubernetes//Pod/demo/web-a2"]);
    client.ack(&update).await;

    // Another node's ztunnel gets its own node: node-b's pods and their services' closure.
    let mut other = XdsClient::connect(&running).await;
    for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
        other
            .send(DeltaDiscoveryRequest {
                node: Some(ztunnel_node("node-b")),
                type_url: type_url.to_string(),
                ..Default::default()
            })
            .await;
    }
    let (addresses, _) = other.initial_sync().await;
    assert_eq!(
        names(&addresses),
        vec![
            DB_B,
            WAYPOINT_POD,
            WEB_B,
            "demo/db.demo.svc.cluster.local",
            WAYPOINT,
            WEB
        ]
    );
    running.stop().await;
}

#[tokio::test]
async fn without_the_flag_every_ztunnel_gets_everything() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    let (addresses, _) = client.initial_sync().await;
    assert_eq!(addresses.resources.len(), 7);
    running.stop().await;
}
