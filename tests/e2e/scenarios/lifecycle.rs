//! Scenario 4: pods come and go. A new pod serves through the mesh soon after its manifest
//! is written; a deleted pod gets no more traffic.

use std::collections::BTreeSet;
use std::time::Duration;

use super::l4::until;
use crate::bed::apps::{self, Protocol};
use crate::bed::mesh::{Mesh, PodSpec};

#[test]
fn a_new_pod_serves_and_a_deleted_pod_gets_no_traffic() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(PodSpec::new("b1", 2).label("app", "b").service_account("b"));
    mesh.serve("b1", Protocol::Http, 8080);
    let vip = mesh.add_service("b", &[("app", "b")], &[("http", 80, 8080)], &[]);
    mesh.wait_ztunnels_know(&vip.to_string());
    let get = |mesh: &Mesh| {
        apps::http(&mesh.pod("a").netns, (vip, 80).into(), "GET", "/", "b")
            .map(|r| r.field("server").unwrap_or_default().to_string())
    };
    assert_eq!(get(&mesh).expect("a -> b1"), "b1");

    // A second pod behind b, on node 1 this time: from its manifest to its first answer.
    mesh.add_pod(PodSpec::new("b2", 1).label("app", "b").service_account("b"));
    mesh.serve("b2", Protocol::Http, 8080);
    let written = mesh.pod("b2").written;
    let served = until(Duration::from_secs(30), || {
        get(&mesh).is_ok_and(|s| s == "b2")
    })
    .unwrap_or_else(|| panic!("b2 never answered\n{}", mesh.ztunnel_log_tail(1)));
    eprintln!(
        "E1: pod manifest -> first request served in {:?}",
        served - written
    );
    let answered: BTreeSet<String> = (0..40).map(|_| get(&mesh).expect("a -> b")).collect();
    assert_eq!(answered, ["b1".to_string(), "b2".to_string()].into());

    // b1 deleted: once the ztunnels drop it, every request goes to b2 and none fails.
    let forgotten = mesh.delete_pod("b1");
    eprintln!("pod manifest removed -> gone from every ztunnel in {forgotten:?}");
    for _ in 0..40 {
        assert_eq!(get(&mesh).expect("a -> b after b1 went"), "b2");
    }
    mesh.assert_no_nacks();
}
