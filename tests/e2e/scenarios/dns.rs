//! ztunnel's DNS proxy with istio-cni's DNS capture: a pod's DNS queries, to any server,
//! reach its ztunnel, which answers for the mesh's hosts from what ambientd sent: a
//! Service's names, and a ServiceEntry's host with its address. A request by the answer
//! goes through the mesh.

use serde_json::json;

use crate::bed::apps::{self, Protocol};
use crate::bed::mesh::{Mesh, NAMESPACE};

#[test]
fn ztunnel_answers_for_services_and_service_entries() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start_with_dns_capture(2) else {
        return;
    };
    let vip = super::a_and_b(&mut mesh, &[(Protocol::Http, 8080)], &[("http", 80, 8080)]);
    mesh.apply(
        "serviceentry-external",
        &[json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "ServiceEntry",
            "metadata": {"name": "external", "namespace": NAMESPACE},
            "spec": {
                "hosts": ["api.example.com"],
                "addresses": ["240.240.0.5"],
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}],
                "location": "MESH_EXTERNAL",
                "resolution": "DNS",
            },
        })],
    );
    mesh.wait_ztunnels_know("api.example.com");
    // Any server address: the query never leaves the pod.
    let server = std::net::Ipv4Addr::new(10, 96, 0, 2);
    let a = &mesh.pod("a").netns;
    for name in ["b.mesh.svc.cluster.local", "b.mesh.svc", "b.mesh", "b"] {
        assert_eq!(apps::resolve(a, server, name), Ok(vec![vip]), "{name}");
    }
    assert_eq!(
        apps::resolve(a, server, "api.example.com"),
        Ok(vec!["240.240.0.5".parse().unwrap()])
    );
    mesh.expect_ztunnel_metric(1, "istio_dns_requests_total", &[], 5);
    // What the name resolved to is the mesh's address.
    let response =
        apps::http(a, (vip, 80).into(), "GET", "/", "b.mesh.svc.cluster.local").expect("a -> b");
    assert_eq!(response.field("server"), Some("b"));
    mesh.assert_no_nacks();
}
