//! Pod to Service across nodes over HBONE, and on one node.

use crate::bed::apps::{self, Protocol, TcpSession};
use crate::bed::mesh::{Mesh, PodSpec};

#[test]
fn cross_node_tcp_and_http_carry_the_callers_identity() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(PodSpec::new("b", 2));
    mesh.serve("b", Protocol::Http, 8080);
    mesh.serve("b", Protocol::Tcp, 9000);
    let vip = mesh.add_service("b", "b", &[("http", 80, 8080), ("tcp", 9000, 9000)], &[]);
    mesh.wait_ztunnels_know(&mesh.pod("b").ip.to_string());
    mesh.wait_ztunnels_know(&vip.to_string());

    let a = mesh.pod("a");
    let response = apps::http(&a.netns, (vip, 80).into(), "GET", "/hello", "b.mesh").unwrap_or_else(|e| {
        panic!("GET b over the mesh: {e}\n{}\n{}", mesh.ztunnel_log_tail(1), mesh.ztunnel_log_tail(2))
    });
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.field("server"), Some("b"));
    let mut session = TcpSession::open(&a.netns, (vip, 9000).into()).expect("TCP to b");
    assert!(session.greeting.starts_with("server=b"), "{}", session.greeting);
    assert_eq!(session.round_trip("ping").expect("echo"), "ping");
    session.close();
    eprintln!("{}", mesh.ztunnel_log_tail(2));
}
