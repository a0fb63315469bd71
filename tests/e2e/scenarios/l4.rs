//! Layer 4 through ztunnels: pod to Service and pod to pod, across nodes and on one node,
//! over HBONE with mTLS, and an AuthorizationPolicy that ztunnel enforces.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::bed::apps::{self, Protocol, TcpSession};
use crate::bed::mesh::{Mesh, NAMESPACE, PodSpec};

/// Scenario 1: A on node 1 calls Service B, whose pod is on node 2. TCP and HTTP arrive, the
/// app sees A's own address (ztunnel keeps the source), and B's ztunnel names A's SPIFFE
/// identity, learnt from the mTLS handshake, in its metrics and access log.
#[test]
fn cross_node_tcp_and_http_carry_the_callers_identity() {
    let _serial = crate::serial();
    if let Some(mut mesh) = Mesh::start(2) {
        cross_node(&mut mesh);
    }
}

/// Scenario 1 on `mesh`.
pub fn cross_node(mesh: &mut Mesh) {
    let vip = super::a_and_b(
        mesh,
        &[(Protocol::Http, 8080), (Protocol::Tcp, 9000)],
        &[("http", 80, 8080), ("tcp", 9000, 9000)],
    );

    let (a, b) = (mesh.pod("a"), mesh.pod("b"));
    let response = apps::http(&a.netns, (vip, 80).into(), "GET", "/hello", "b.mesh")
        .unwrap_or_else(|e| panic!("GET b over the mesh: {e}\n{}", mesh.ztunnel_log_tail(2)));
    assert_eq!(response.status, 200, "{response:?}");
    assert_eq!(response.field("server"), Some("b"));
    assert_eq!(response.field("path"), Some("/hello"));
    let peer: SocketAddr = response.field("peer").expect("peer").parse().expect("addr");
    assert_eq!(peer.ip(), a.ip, "B's app sees A's address: {response:?}");

    let mut session = TcpSession::open(&a.netns, (vip, 9000).into()).expect("TCP to b");
    assert!(
        session.greeting.starts_with("server=b"),
        "{}",
        session.greeting
    );
    assert_eq!(session.round_trip("ping").expect("echo"), "ping");
    session.close();

    // B's ztunnel, the destination reporter, saw A's identity over mutual TLS, for both.
    let identity = a.identity();
    let inbound = [
        ("reporter", "destination"),
        ("source_principal", identity.as_str()),
        ("destination_principal", &b.identity()),
        ("connection_security_policy", "mutual_tls"),
    ];
    mesh.expect_ztunnel_metric(2, "istio_tcp_connections_opened_total", &inbound, 2);
    let src = format!("src.identity=\"{identity}\"");
    mesh.expect_ztunnel_line(
        2,
        &["connection complete", &src, "direction=\"inbound\""],
        &format!("B's ztunnel to log an inbound connection from {identity}"),
    );
    // A's ztunnel sent it over HBONE to B's pod on 15008.
    let hbone = format!("dst.addr={}:15008", b.ip);
    mesh.expect_ztunnel_line(
        1,
        &["connection complete", &hbone],
        &format!("A's ztunnel to log HBONE to {}:15008", b.ip),
    );
    mesh.assert_no_nacks();
}

/// Scenario 6: a pod reaches a pod on its own node and one on another, by pod IP and through
/// their Service, all over HBONE.
#[test]
fn same_node_and_cross_node_both_work() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(
        PodSpec::new("near", 1)
            .label("app", "b")
            .service_account("b"),
    );
    mesh.add_pod(
        PodSpec::new("far", 2)
            .label("app", "b")
            .service_account("b"),
    );
    for pod in ["near", "far"] {
        mesh.serve(pod, Protocol::Http, 8080);
    }
    let vip = mesh.add_service("b", &[("app", "b")], &[("http", 80, 8080)], &[]);
    mesh.wait_ztunnels_know(&vip.to_string());
    for pod in ["near", "far"] {
        mesh.wait_ztunnels_know(&mesh.pod(pod).ip.to_string());
    }

    let a = mesh.pod("a");
    for (pod, node) in [("near", 1), ("far", 2)] {
        let ip = mesh.pod(pod).ip;
        let response = apps::http(&a.netns, (ip, 8080).into(), "GET", "/", "b")
            .unwrap_or_else(|e| panic!("a -> {pod} ({ip}): {e}\n{}", mesh.ztunnel_log_tail(node)));
        assert_eq!(response.field("server"), Some(pod), "{response:?}");
        assert_eq!(
            response.field("peer").and_then(|p| p.split(':').next()),
            Some(&*a.ip.to_string())
        );
    }
    // Through the Service, both endpoints answer in time.
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < 2 && Instant::now() < deadline {
        let response = apps::http(&a.netns, (vip, 80).into(), "GET", "/", "b").expect("a -> b");
        seen.insert(response.field("server").unwrap_or_default().to_string());
    }
    assert_eq!(seen, ["far".to_string(), "near".to_string()].into());
    for node in [1, 2] {
        mesh.expect_ztunnel_metric(
            node,
            "istio_tcp_connections_opened_total",
            &[
                ("reporter", "destination"),
                ("source_principal", &a.identity()),
                ("connection_security_policy", "mutual_tls"),
            ],
            1,
        );
    }
    mesh.assert_no_nacks();
}

/// Scenario 2: a DENY AuthorizationPolicy for A's service account, enforced by B's ztunnel:
/// A is refused while another caller is not, and removing the file lets A through again.
#[test]
fn l4_deny_policy_is_enforced_and_lifted() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(PodSpec::new("c", 1));
    mesh.add_pod(PodSpec::new("b", 2));
    mesh.serve("b", Protocol::Tcp, 9000);
    let vip = mesh.add_service("b", &[("app", "b")], &[("tcp", 9000, 9000)], &[]);
    mesh.wait_ztunnels_know(&vip.to_string());
    let target: SocketAddr = (vip, 9000).into();
    TcpSession::open(&mesh.pod("a").netns, target).expect("a -> b before any policy");

    let written = Instant::now();
    mesh.apply(
        "policy-deny-a",
        &[json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "deny-a", "namespace": NAMESPACE},
            "spec": {
                "selector": {"matchLabels": {"app": "b"}},
                "action": "DENY",
                "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/{NAMESPACE}/sa/a")]}}]}],
            },
        })],
    );
    let refused = until(Duration::from_secs(30), || {
        TcpSession::open(&mesh.pod("a").netns, target).is_err()
    })
    .unwrap_or_else(|| panic!("a was never refused\n{}", mesh.ztunnel_log_tail(2)));
    eprintln!(
        "E2 (ztunnel): policy written -> first refusal in {:?}",
        refused - written
    );
    // Refused at B's ztunnel, by this policy; C is still let through.
    let named = format!("explicitly denied by: {NAMESPACE}/deny-a");
    mesh.expect_ztunnel_line(2, &[&named], "B's ztunnel to name the policy");
    TcpSession::open(&mesh.pod("c").netns, target).expect("c -> b under deny-a");
    let deny = [("reporter", "destination"), ("response_flags", "DENY")];
    crate::bed::process::wait_for(
        "B's ztunnel to count a DENY",
        Duration::from_secs(5),
        || {
            let opened = mesh.ztunnel_metric(2, "istio_tcp_connections_opened_total", &deny);
            let failed = mesh.ztunnel_metric(2, "istio_tcp_connections_failed_total", &deny);
            (opened + failed >= 1).then_some(())
        },
        || mesh.ztunnel_get(2, 15020, "/metrics"),
    );

    let removed = Instant::now();
    mesh.remove("policy-deny-a");
    let allowed = until(Duration::from_secs(30), || {
        TcpSession::open(&mesh.pod("a").netns, target).is_ok()
    })
    .unwrap_or_else(|| {
        panic!(
            "a stayed refused after the policy went\n{}",
            mesh.ztunnel_log_tail(2)
        )
    });
    eprintln!(
        "E2 (ztunnel): policy removed -> first success in {:?}",
        allowed - removed
    );
    mesh.assert_no_nacks();
}

/// Polls `check` every 10 ms; the instant it first held, or `None` after `timeout`.
pub fn until(timeout: Duration, mut check: impl FnMut() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// PeerAuthentication at ztunnel: a pod outside the mesh reaches B in plaintext under the
/// default (PERMISSIVE); a namespace-wide STRICT refuses it while A's mTLS goes on; removing
/// it lets the plaintext caller in again.
#[test]
fn strict_peer_authentication_refuses_plaintext_callers() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    let vip = super::a_and_b(&mut mesh, &[(Protocol::Http, 8080)], &[("http", 80, 8080)]);
    mesh.add_pod_outside_mesh(PodSpec::new("legacy", 1));
    let b: SocketAddr = (mesh.pod("b").ip, 8080).into();
    let plaintext = |mesh: &Mesh| apps::http(&mesh.pod("legacy").netns, b, "GET", "/", "b");
    let response = plaintext(&mesh).expect("legacy -> b in plaintext under PERMISSIVE");
    assert_eq!(
        response.field("peer").and_then(|p| p.split(':').next()),
        Some(&*mesh.pod("legacy").ip.to_string())
    );

    mesh.apply(
        "peerauthentication-strict",
        &[json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "PeerAuthentication",
            "metadata": {"name": "default", "namespace": NAMESPACE},
            "spec": {"mtls": {"mode": "STRICT"}},
        })],
    );
    until(Duration::from_secs(30), || plaintext(&mesh).is_err()).unwrap_or_else(|| {
        panic!(
            "plaintext still reaches b under STRICT\n{}",
            mesh.ztunnel_log_tail(2)
        )
    });
    plaintext(&mesh).expect_err("plaintext reached b under STRICT");
    let a = &mesh.pod("a").netns;
    let over_mtls = apps::http(a, (vip, 80).into(), "GET", "/", "b").expect("a -> b under STRICT");
    assert_eq!(over_mtls.field("server"), Some("b"));

    mesh.remove("peerauthentication-strict");
    until(Duration::from_secs(30), || plaintext(&mesh).is_ok()).unwrap_or_else(|| {
        panic!(
            "plaintext stays refused after STRICT went\n{}",
            mesh.ztunnel_log_tail(2)
        )
    });
    mesh.assert_no_nacks();
}
