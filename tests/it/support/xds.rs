//! The demo mesh the xDS end-to-end tests serve: a namespace, nodes, a service and pods, as a
//! manifests directory, and what they are named.

use super::common::*;

pub const CLUSTER: &str = r#"
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
metadata:
  name: node-a
  labels: {topology.kubernetes.io/region: r1, topology.kubernetes.io/zone: z1}
"#;

pub const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http}
"#;

pub fn pod(name: &str, ip: &str, app: &str, version: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: demo
  labels: {{app: {app}, version: {version}}}
  annotations: {{ambient.istio.io/redirection: enabled}}
spec:
  serviceAccountName: {app}
  nodeName: node-a
  containers:
  - name: main
    ports: [{{name: http, containerPort: 8080}}]
status:
  phase: Running
  podIP: {ip}
  conditions: [{{type: Ready, status: "True"}}]
"#
    )
}

pub fn pods(docs: &[String]) -> String {
    docs.join("\n---\n")
}

pub fn mesh() -> Manifests {
    Manifests::new(&[
        ("cluster.yaml", CLUSTER),
        ("services.yaml", SERVICES),
        (
            "pods/web.yaml",
            &pods(&[
                pod("web-1", "10.244.1.10", "web", "v1"),
                pod("web-2", "10.244.1.11", "web", "v1"),
            ]),
        ),
        ("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v1")),
    ])
}

pub const WEB_1: &str = "Kubernetes//Pod/demo/web-1";
pub const WEB_2: &str = "Kubernetes//Pod/demo/web-2";
pub const DB_1: &str = "Kubernetes//Pod/demo/db-1";
pub const WEB_SVC: &str = "demo/web.demo.svc.cluster.local";

/// The pod's `version` label (the Workload's canonical revision) in a response, if it is there.
pub fn revision_of(
    response: &ambientd::pb::xds::DeltaDiscoveryResponse,
    uid: &str,
) -> Option<String> {
    addresses(response)
        .get(uid)
        .map(|a| workload(a).canonical_revision.clone())
}

/// Enough pods that an initial response overflows a 64 KiB HTTP/2 window, so that a client that
/// stops reading stalls the server's writes at once.
pub fn bulk_mesh() -> Manifests {
    let many: Vec<String> = (0..600)
        .map(|i| {
            pod(
                &format!("bulk-{i}"),
                &format!("10.245.{}.{}", i / 200, i % 200 + 1),
                "bulk",
                "v1",
            )
        })
        .collect();
    let mesh = mesh();
    mesh.write("pods/bulk.yaml", &pods(&many));
    mesh
}
