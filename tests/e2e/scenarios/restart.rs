//! Scenario 5: ambientd restarts under a running mesh, stopped (SIGTERM: it ends the streams
//! with a status) or killed (SIGKILL: they just break). A long-lived connection survives,
//! the data plane keeps serving while the control plane is away, the ztunnels reconnect and
//! take the new replica's state without a NACK, and no ztunnel loses its certificates.

use std::time::{Duration, Instant};

use super::l4::until;
use crate::bed::apps::{Protocol, TcpSession};
use crate::bed::mesh::{Mesh, PodSpec};

#[test]
fn ambientd_restart_keeps_connections_certificates_and_config() {
    let _serial = crate::serial();
    if let Some(mut mesh) = Mesh::start(2) {
        restart(&mut mesh, Mesh::stop_ambientd);
    }
}

#[test]
fn ambientd_killed_keeps_connections_certificates_and_config() {
    let _serial = crate::serial();
    if let Some(mut mesh) = Mesh::start(2) {
        restart(&mut mesh, Mesh::kill_ambientd);
    }
}

/// Scenario 5 with ambientd taken down by `down`.
fn restart(mesh: &mut Mesh, down: fn(&mut Mesh)) {
    let vip = super::a_and_b(mesh, &[(Protocol::Tcp, 9000)], &[("tcp", 9000, 9000)]);
    let target = (vip, 9000).into();
    let mut long_lived = TcpSession::open(&mesh.pod("a").netns, target).expect("a -> b");
    assert_eq!(long_lived.round_trip("before").expect("echo"), "before");
    let available = |mesh: &Mesh, node: usize, pod: &str| {
        let identity = mesh.pod(pod).identity();
        mesh.ztunnel_certificates(node)
            .into_iter()
            .find(|(id, state, _)| *id == identity && state == "Available")
            .unwrap_or_else(|| {
                panic!(
                    "node{node}'s ztunnel holds no usable certificate for {identity}: {:?}",
                    mesh.ztunnel_certificates(node)
                )
            })
    };
    let held: Vec<_> = [(1, "a"), (2, "b")]
        .iter()
        .map(|(n, p)| available(mesh, *n, p))
        .collect();

    // Down: the connection still carries data, and new connections still work from what the
    // ztunnels hold.
    down(mesh);
    assert_eq!(
        long_lived
            .round_trip("while down")
            .expect("echo while down"),
        "while down"
    );
    TcpSession::open(&mesh.pod("a").netns, target)
        .expect("a new connection while ambientd is down");

    // Back: the ztunnels reconnect, ACK everything, and the mesh follows changes again.
    let restarted = Instant::now();
    mesh.start_ambientd();
    let reconnected = until(Duration::from_secs(60), || {
        (1..=2).all(|node| {
            mesh.ambientd_log()
                .lines()
                .filter(|l| l.contains("proxy connected"))
                .filter(|l| l.contains(&format!("ztunnel-node{node}")))
                .count()
                >= 2
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "the ztunnels did not reconnect:\n{}",
            mesh.ztunnel_log_tail(1)
        )
    });
    eprintln!(
        "ambientd ready -> both ztunnels reconnected in {:?}",
        reconnected - restarted
    );
    assert_eq!(
        long_lived
            .round_trip("after")
            .expect("echo after the restart"),
        "after"
    );
    let mut fresh =
        TcpSession::open(&mesh.pod("a").netns, target).expect("a -> b after the restart");
    assert_eq!(fresh.round_trip("new").expect("echo"), "new");

    // A change made after the restart reaches the ztunnels: the mesh is served, not frozen.
    mesh.add_pod(PodSpec::new("c", 2));
    mesh.wait_ztunnels_know(&format!("{}\"", mesh.pod("c").ip));

    mesh.assert_no_nacks();
    for node in 1..=2 {
        let log = mesh.ztunnel_log(node);
        assert!(
            !log.contains("NACK") && !log.contains("rejected"),
            "node{node}'s ztunnel rejected config:\n{}",
            mesh.ztunnel_log_tail(node)
        );
        let pod = if node == 1 { "a" } else { "b" };
        // The same certificate, still usable: a restart costs no re-issue.
        assert_eq!(available(mesh, node, pod), held[node - 1]);
    }
    long_lived.close();
}
