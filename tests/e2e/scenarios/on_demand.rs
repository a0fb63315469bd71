//! ztunnel's on-demand xDS (`XDS_ON_DEMAND=true`) against ambientd's `--scope-to-node`: a
//! ztunnel starts with its node's workloads only, asks for a destination the first time one
//! of its pods calls it, and the call goes through.

use std::time::Duration;

use super::l4::until;
use crate::bed::apps::{self, Protocol};
use crate::bed::mesh::{Mesh, PodSpec};

#[test]
fn a_ztunnel_asks_for_what_its_pods_call() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start_on_demand(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(PodSpec::new("b", 2));
    mesh.serve("b", Protocol::Http, 8080);
    let vip = mesh.add_service("b", &[("app", "b")], &[("http", 80, 8080)], &[]);
    let (a_ip, b_ip) = (
        format!("{}\"", mesh.pod("a").ip),
        format!("{}\"", mesh.pod("b").ip),
    );
    // Each ztunnel has its own node's pod, and (scoped) not the other's.
    until(Duration::from_secs(30), || {
        mesh.ztunnel_get(1, 15000, "/config_dump").contains(&a_ip)
            && mesh.ztunnel_get(2, 15000, "/config_dump").contains(&b_ip)
    })
    .expect("each ztunnel has its node's pod");
    assert!(
        !mesh.ztunnel_get(1, 15000, "/config_dump").contains(&b_ip),
        "node1's ztunnel was sent b, a workload of node2, without asking"
    );

    let a = &mesh.pod("a").netns;
    let response = until(Duration::from_secs(30), || {
        apps::http(a, (vip, 80).into(), "GET", "/", "b").is_ok()
    })
    .map(|_| apps::http(a, (vip, 80).into(), "GET", "/", "b").expect("a -> b"))
    .unwrap_or_else(|| panic!("a never reached b on demand\n{}", mesh.ztunnel_log_tail(1)));
    assert_eq!(response.field("server"), Some("b"));
    assert!(
        mesh.ztunnel_get(1, 15000, "/config_dump").contains(&b_ip),
        "node1's ztunnel reached b without holding it"
    );
    let hbone = format!("dst.addr={}:15008", mesh.pod("b").ip);
    mesh.expect_ztunnel_line(
        1,
        &["connection complete", &hbone],
        "a's ztunnel to use HBONE to b",
    );
    mesh.assert_no_nacks();
}
