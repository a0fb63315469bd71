//! Scenario 3: a Service bound to a waypoint. Requests to it go through a real Envoy, which
//! routes by path (an HTTPRoute) and enforces an L7 AuthorizationPolicy; the destination's
//! ztunnel sees the waypoint's identity, and an L4 policy that allows only the waypoint
//! refuses a direct call that bypasses it.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::l4::until;
use crate::bed::apps::{self, Protocol};
use crate::bed::mesh::{Mesh, NAMESPACE, PodSpec};

/// Service `c` (pods c1, version v1, and c2, version v2, on node 2) and `c-v1`, `c-v2`, all
/// bound to waypoint `waypoint` on node 1; client `a` on node 1. Returns c's VIP.
fn mesh_with_waypoint(mesh: &mut Mesh) -> Ipv4Addr {
    mesh.add_pod(PodSpec::new("a", 1));
    mesh.add_pod(
        PodSpec::new("c1", 2)
            .label("app", "c")
            .label("version", "v1")
            .service_account("c"),
    );
    mesh.add_pod(
        PodSpec::new("c2", 2)
            .label("app", "c")
            .label("version", "v2")
            .service_account("c"),
    );
    for pod in ["c1", "c2"] {
        mesh.serve(pod, Protocol::Http, 8080);
    }
    mesh.add_waypoint("waypoint", 1);
    let bound = [("istio.io/use-waypoint", "waypoint")];
    let http = [("http", 80, 8080)];
    let vip = mesh.add_service("c", &[("app", "c")], &http, &bound);
    mesh.add_service("c-v1", &[("app", "c"), ("version", "v1")], &http, &bound);
    mesh.add_service("c-v2", &[("app", "c"), ("version", "v2")], &http, &bound);
    mesh.wait_ztunnels_know(&vip.to_string());
    mesh.wait_ztunnels_know(&mesh.pod("waypoint").ip.to_string());
    vip
}

/// GAMMA: `/v2…` to c-v2, the rest to c-v1.
fn path_split() -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "c-split", "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"group": "", "kind": "Service", "name": "c", "port": 80}],
            "rules": [
                {"matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                 "backendRefs": [{"name": "c-v2", "port": 80}]},
                {"backendRefs": [{"name": "c-v1", "port": 80}]},
            ],
        },
    })
}

/// At the waypoint, for Service c: GET only.
fn get_only() -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "c-get-only", "namespace": NAMESPACE},
        "spec": {
            "targetRefs": [{"group": "", "kind": "Service", "name": "c"}],
            "action": "ALLOW",
            "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}],
        },
    })
}

/// At c's ztunnel: only the waypoint may connect (istiod's "allow only from the waypoint").
fn only_from_waypoint() -> Value {
    json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "c-via-waypoint", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": "c"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/{NAMESPACE}/sa/waypoint")]}}]}],
        },
    })
}

#[test]
fn waypoint_routes_enforces_l7_policy_and_is_the_only_way_in() {
    let _serial = crate::serial();
    if let Some(mut mesh) = Mesh::start(2) {
        through_the_waypoint(&mut mesh);
    }
}

/// Scenario 3 on `mesh`.
pub fn through_the_waypoint(mesh: &mut Mesh) {
    let vip = mesh_with_waypoint(mesh);
    let a = mesh.pod("a");
    let get = |path: &str| {
        apps::http(
            &a.netns,
            (vip, 80).into(),
            "GET",
            path,
            "c.mesh.svc.cluster.local",
        )
    };

    // Through the waypoint: Envoy counts the request, and c's ztunnel saw the waypoint's
    // identity, not a's.
    let before = downstream_requests(mesh);
    let first = until(Duration::from_secs(30), || {
        get("/").is_ok_and(|r| r.status == 200)
    })
    .map(|_| get("/").expect("GET c"))
    .unwrap_or_else(|| {
        panic!(
            "c never answered through the waypoint: {:?}\n{}\n{}",
            get("/"),
            mesh.ztunnel_log_tail(1),
            mesh.ztunnel_log_tail(2)
        )
    });
    assert!(
        first.field("server").is_some_and(|s| s.starts_with('c')),
        "{first:?}"
    );
    assert!(
        downstream_requests(mesh) > before,
        "Envoy counted no request"
    );
    let waypoint_identity = mesh.pod("waypoint").identity();
    assert_eq!(
        first.field("peer").and_then(|p| p.split(':').next()),
        Some(&*mesh.pod("waypoint").ip.to_string()),
        "c's app is called by the waypoint: {first:?}"
    );
    mesh.expect_ztunnel_metric(
        2,
        "istio_tcp_connections_opened_total",
        &[
            ("reporter", "destination"),
            ("source_principal", &waypoint_identity),
        ],
        1,
    );
    let (to_waypoint, authority) = (
        format!("dst.addr={}:15008", mesh.pod("waypoint").ip),
        format!("dst.hbone_addr={vip}:80"),
    );
    mesh.expect_ztunnel_line(
        1,
        &["connection complete", &to_waypoint, &authority],
        "a's ztunnel to log c's VIP sent to the waypoint over HBONE",
    );

    // The HTTPRoute splits by path.
    let written = Instant::now();
    mesh.apply("route-c-split", &[path_split()]);
    // Without the route both pods answer both paths: twenty answers in a row from the right
    // pod are chance once in a million.
    until(Duration::from_secs(30), || {
        (0..10).all(|_| {
            get("/v2/x").is_ok_and(|r| r.field("server") == Some("c2"))
                && get("/other").is_ok_and(|r| r.field("server") == Some("c1"))
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "the route never split: {:?} {:?}",
            get("/v2/x"),
            get("/other")
        )
    });
    eprintln!(
        "route written -> enforced at the waypoint in {:?}",
        written.elapsed()
    );
    for _ in 0..10 {
        assert_eq!(get("/v2/a").expect("GET /v2").field("server"), Some("c2"));
        assert_eq!(get("/v1/a").expect("GET /v1").field("server"), Some("c1"));
    }

    // L7 policy: GET allowed, POST refused by the waypoint with 403.
    let written = Instant::now();
    mesh.apply("policy-c-get-only", &[get_only()]);
    let post = || {
        apps::http(
            &a.netns,
            (vip, 80).into(),
            "POST",
            "/v1/a",
            "c.mesh.svc.cluster.local",
        )
    };
    until(Duration::from_secs(30), || {
        post().is_ok_and(|r| r.status == 403)
    })
    .unwrap_or_else(|| panic!("POST was never refused: {:?}", post()));
    eprintln!(
        "E2 (waypoint): policy written -> first 403 in {:?}",
        written.elapsed()
    );
    let refused = post().expect("POST");
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.body.contains("RBAC: access denied"), "{refused:?}");
    assert_eq!(get("/v1/a").expect("GET").status, 200);
    assert!(rbac_denied(mesh) >= 1, "Envoy's RBAC counted no denial");

    // Only the waypoint may reach c's pods: through the VIP works, straight to a pod does not.
    mesh.apply("policy-c-via-waypoint", &[only_from_waypoint()]);
    let c1: std::net::SocketAddr = (mesh.pod("c1").ip, 8080).into();
    until(Duration::from_secs(30), || {
        apps::http(&a.netns, c1, "GET", "/", "c1").is_err()
    })
    .unwrap_or_else(|| panic!("a still reaches c1 directly\n{}", mesh.ztunnel_log_tail(2)));
    // (That first refusal may be a connection closed as the policy arrived; this one is
    // refused at its start.)
    apps::http(&a.netns, c1, "GET", "/", "c1").expect_err("a reached c1 directly");
    mesh.expect_ztunnel_line(
        2,
        &["allow policies exist, but none allowed"],
        "c's ztunnel to refuse a by policy",
    );
    let through = get("/v1/a").expect("GET through the waypoint under c-via-waypoint");
    assert_eq!((through.status, through.field("server")), (200, Some("c1")));
    mesh.assert_no_nacks();
}

/// Requests Envoy's HTTP connection managers took from ztunnels (every chain's sum).
fn downstream_requests(mesh: &Mesh) -> u64 {
    envoy_sum(mesh, "downstream_rq_total")
}

/// Requests the RBAC filters refused.
fn rbac_denied(mesh: &Mesh) -> u64 {
    envoy_sum(mesh, "rbac.denied")
}

/// The sum of the waypoint's `http.<prefix>.<suffix>` counters.
fn envoy_sum(mesh: &Mesh, suffix: &str) -> u64 {
    mesh.envoy_get("waypoint", "/stats?usedonly")
        .lines()
        .filter(|l| {
            l.starts_with("http.")
                && l.split(':')
                    .next()
                    .is_some_and(|n| n.ends_with(&format!(".{suffix}")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `istioctl waypoint apply --enroll-namespace`: the namespace's `istio.io/use-waypoint`
/// binds every Service in it without a label of its own, and a Service's
/// `istio.io/use-waypoint: none` opts it out.
#[test]
fn a_namespace_waypoint_binds_its_services() {
    let _serial = crate::serial();
    let Some(mut mesh) = Mesh::start(2) else {
        return;
    };
    let http = [("http", 80, 8080)];
    let vip = super::a_and_b(&mut mesh, &[(Protocol::Http, 8080)], &http);
    let direct = mesh.add_service(
        "b-direct",
        &[("app", "b")],
        &http,
        &[("istio.io/use-waypoint", "none")],
    );
    mesh.add_waypoint("waypoint", 1);
    let a = &mesh.pod("a").netns;
    let via = |vip: Ipv4Addr| {
        apps::http(a, (vip, 80).into(), "GET", "/", "b")
            .map(|r| r.field("peer").unwrap_or_default().to_string())
    };
    let waypoint_ip = mesh.pod("waypoint").ip.to_string();
    assert!(
        via(vip)
            .expect("a -> b")
            .starts_with(&mesh.pod("a").ip.to_string())
    );

    mesh.label_namespace(&[("istio.io/use-waypoint", "waypoint")]);
    until(Duration::from_secs(30), || {
        via(vip).is_ok_and(|peer| peer.starts_with(&waypoint_ip))
    })
    .unwrap_or_else(|| {
        panic!(
            "b is not reached through the namespace's waypoint: {:?}",
            via(vip)
        )
    });
    let opted_out = via(direct).expect("a -> b-direct");
    assert!(
        opted_out.starts_with(&mesh.pod("a").ip.to_string()),
        "b-direct went through the waypoint: {opted_out}"
    );

    mesh.label_namespace(&[]);
    until(Duration::from_secs(30), || {
        via(vip).is_ok_and(|peer| !peer.starts_with(&waypoint_ip))
    })
    .unwrap_or_else(|| panic!("b still goes through the waypoint after the label went"));
    mesh.assert_no_nacks();
}
