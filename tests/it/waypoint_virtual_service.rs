//! A VirtualService through a real Envoy as waypoint (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)): on the
//! Service `web` (the mesh of tests/it/waypoint_routes.rs), a header match sends requests to
//! `web-v2` (not bound: its `outbound|…` cluster over HBONE) and the rule without matches
//! sends everything else to `web-v1` (bound: its `inbound-vip|…` cluster). Both are real
//! requests through Envoy, on CONNECT tunnels from a client playing the calling ztunnel.

use crate::support::apps::{HttpApp, HttpAppOptions};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::{HboneConnection, HboneServer};
use crate::support::identity::start_with_ca;
use crate::support::sds::SdsServer;
use crate::waypoint_routes::{MESH, V2_CLUSTER, at, backend_of, eventually, get, get_with};

const VIRTUAL_SERVICE: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: demo}
spec:
  hosts: [web.demo.svc.cluster.local]
  http:
  - name: version-v2
    match:
    - headers: {x-version: {exact: v2}}
    headers: {response: {set: {x-routed-by: version-v2}}}
    route: [{destination: {host: web-v2, port: {number: 8080}}}]
  - name: default
    route: [{destination: {host: web-v1}}]
"#;

#[tokio::test]
async fn a_virtual_service_through_a_real_envoy() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let manifests = Manifests::new(&[("mesh.yaml", MESH), ("vs.yaml", VIRTUAL_SERVICE)]);
    let mesh = start_with_ca(manifests.root()).await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let web_identity = mesh.workload_cert("demo", "web").await;
    let sds = SdsServer::start(&waypoint).await;
    let _v1 =
        HttpApp::start_with(at("127.0.20.5", 8080), "web-v1", HttpAppOptions::default()).await;
    let _v2 =
        HttpApp::start_with(at("127.0.20.6", 8080), "web-v2", HttpAppOptions::default()).await;
    let v2_hbone = HboneServer::start("127.0.20.6".parse().unwrap(), &web_identity).await;

    let mut node = WaypointNode::new("demo", "waypoint");
    node.ip = "127.0.20.1".into();
    let params = EnvoyParams::new(mesh.running.xds_address, sds.address, node);
    let envoy = Envoy::start(&binary, &params).await;
    envoy.wait_live().await;
    let dump = envoy
        .wait_until("the VirtualService's clusters", |dump| {
            envoy::active_clusters(dump).iter().any(|c| c == V2_CLUSTER)
                && envoy::active_listeners(dump)
                    .iter()
                    .any(|l| l == "main_internal")
        })
        .await;
    assert!(
        envoy::listener_errors(&dump).is_empty(),
        "{:?}",
        envoy::listener_errors(&dump)
    );
    for stat in [
        "listener_manager.lds.update_rejected",
        "cluster_manager.cds.update_rejected",
    ] {
        assert_eq!(envoy.stat(stat).await, Some(0), "{stat}");
    }
    let connection = HboneConnection::open(at("127.0.0.1", 15008), &client)
        .await
        .expect("HBONE to the waypoint");

    // The header match: web-v2, over HBONE with the waypoint's identity.
    let v2 = eventually(
        "the header match",
        || get_with(&connection, "/a", &[("x-version", "v2")]),
        |r| r.as_ref().is_ok_and(|r| r.status == 200),
    )
    .await
    .unwrap();
    assert_eq!(backend_of(&v2), "web-v2", "{}", v2.body);
    assert_eq!(v2.header("x-routed-by"), Some("version-v2"));
    let connects = v2_hbone.connects();
    assert!(!connects.is_empty());
    assert_eq!(
        connects[0].peer_identity.as_deref(),
        Some(waypoint.spiffe_id.as_str())
    );
    // Everything else: the catch-all rule, web-v1 (its only port, no port given).
    for (path, headers) in [("/a", vec![]), ("/b/c", vec![("x-version", "v1")])] {
        let other = get_with(&connection, path, &headers).await.unwrap();
        assert_eq!(other.status, 200, "{}", other.body);
        assert_eq!(backend_of(&other), "web-v1", "{}", other.body);
        assert_eq!(other.header("x-routed-by"), None);
    }
    assert_eq!(backend_of(&get(&connection, "/").await.unwrap()), "web-v1");
}
