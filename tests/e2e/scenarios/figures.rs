//! The bed's figures for BENCHMARKS.md (E1–E3), ignored by `cargo test`: timings belong in
//! benchmarks, not in tests that pass or fail. Run them with
//!
//! ```sh
//! cargo test --release --test e2e figures -- --ignored --nocapture --test-threads 1
//! ```
//!
//! Each prints its figures; `AMBIENTD_E2E_ROUNDS` sets how many times E2 and E3 repeat
//! (default 5), and `AMBIENTD_E2E_SOURCE=kube` runs them with ambientd watching a real API
//! server (as scenario 7) instead of following a manifests directory.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use super::l4::until;
use crate::bed::apps::{self, Protocol, TcpSession};
use crate::bed::mesh::{Mesh, NAMESPACE, PodSpec};

/// The mesh the figures run on: from manifests, or on a real API server.
fn start(nodes: usize) -> Option<Mesh> {
    match std::env::var("AMBIENTD_E2E_SOURCE").as_deref() {
        Ok("kube") => Mesh::start_on_kube(nodes),
        _ => Mesh::start(nodes),
    }
}

fn rounds() -> usize {
    std::env::var("AMBIENTD_E2E_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
}

/// The `q` quantile (0..=1) of `samples`, nearest rank.
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// E1: for 20 new pods, each behind a Service of its own written first, the time from the
/// pod's manifest (its Running status) to its first request served through the mesh.
#[test]
#[ignore = "a figure for BENCHMARKS.md (E1); run with --ignored"]
fn e1_new_pod_to_first_request() {
    let _serial = crate::serial();
    let Some(mut mesh) = start(2) else {
        return;
    };
    mesh.add_pod(PodSpec::new("client", 1));
    let (mut known, mut served) = (Vec::new(), Vec::new());
    for i in 0..20 {
        let name = format!("new{i}");
        let vip = mesh.add_service(&name, &[("app", &name)], &[("http", 80, 8080)], &[]);
        mesh.wait_ztunnels_know(&vip.to_string());
        mesh.add_pod(PodSpec::new(&name, 1 + i % 2));
        mesh.serve(&name, Protocol::Http, 8080);
        let (written, ip) = (mesh.pod(&name).written, format!("{}\"", mesh.pod(&name).ip));
        let client = &mesh.pod("client").netns;
        let mut known_at = None;
        let served_at = until(Duration::from_secs(30), || {
            if known_at.is_none() && mesh.ztunnel_get(1, 15000, "/config_dump").contains(&ip) {
                known_at = Some(Instant::now());
            }
            apps::http(client, (vip, 80).into(), "GET", "/", &name).is_ok_and(|r| r.status == 200)
        })
        .unwrap_or_else(|| panic!("{name} never served"));
        known.push(known_at.unwrap_or(served_at) - written);
        served.push(served_at - written);
    }
    for (what, samples) in [
        ("in the caller's ztunnel (config_dump)", &mut known),
        ("first request served", &mut served),
    ] {
        let (p50, p99) = (quantile(samples, 0.5), quantile(samples, 0.99));
        eprintln!(
            "E1 pod manifest -> {what}, 20 pods: p50 {} p99 {}",
            ms(p50),
            ms(p99)
        );
    }
}

/// E2: a policy written, to the first request it refuses: a DENY at ztunnel (L4) and a
/// method rule at the waypoint (L7), each written and removed `rounds()` times.
#[test]
#[ignore = "a figure for BENCHMARKS.md (E2); run with --ignored"]
fn e2_policy_write_to_enforced() {
    let _serial = crate::serial();
    let Some(mut mesh) = start(2) else {
        return;
    };
    let vip = super::a_and_b(
        &mut mesh,
        &[(Protocol::Tcp, 9000), (Protocol::Http, 8080)],
        &[("tcp", 9000, 9000)],
    );
    mesh.add_waypoint("waypoint", 1);
    let wvip = mesh.add_service(
        "bw",
        &[("app", "b")],
        &[("http", 80, 8080)],
        &[("istio.io/use-waypoint", "waypoint")],
    );
    mesh.wait_ztunnels_know(&wvip.to_string());
    let a = &mesh.pod("a").netns;
    let via_waypoint = || apps::http(a, (wvip, 80).into(), "POST", "/", "bw");
    until(Duration::from_secs(30), || {
        via_waypoint().is_ok_and(|r| r.status == 200)
    })
    .expect("bw through the waypoint");

    let deny = json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-a", "namespace": NAMESPACE},
        "spec": {"selector": {"matchLabels": {"app": "b"}}, "action": "DENY",
                 "rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/{NAMESPACE}/sa/a")]}}]}]},
    });
    let get_only = json!({
        "apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": "bw-get-only", "namespace": NAMESPACE},
        "spec": {"targetRefs": [{"group": "", "kind": "Service", "name": "bw"}], "action": "ALLOW",
                 "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]},
    });
    let (mut ztunnel, mut waypoint) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let written = Instant::now();
        mesh.apply("e2-deny", std::slice::from_ref(&deny));
        let refused = until(Duration::from_secs(30), || {
            TcpSession::open(a, (vip, 9000).into()).is_err()
        })
        .expect("refused at ztunnel");
        ztunnel.push(refused - written);
        mesh.remove("e2-deny");
        until(Duration::from_secs(30), || {
            TcpSession::open(a, (vip, 9000).into()).is_ok()
        })
        .expect("allowed again");

        let written = Instant::now();
        mesh.apply("e2-get-only", std::slice::from_ref(&get_only));
        let refused = until(Duration::from_secs(30), || {
            via_waypoint().is_ok_and(|r| r.status == 403)
        })
        .expect("403 at the waypoint");
        waypoint.push(refused - written);
        mesh.remove("e2-get-only");
        until(Duration::from_secs(30), || {
            via_waypoint().is_ok_and(|r| r.status == 200)
        })
        .expect("POST allowed again");
    }
    for (at, samples) in [
        ("ztunnel (L4 DENY)", &mut ztunnel),
        ("waypoint (L7 403)", &mut waypoint),
    ] {
        let min = *samples.iter().min().expect("samples");
        let (p50, max) = (quantile(samples, 0.5), quantile(samples, 1.0));
        eprintln!(
            "E2 policy written -> enforced at {at}, {} rounds: min {} median {} max {}",
            samples.len(),
            ms(min),
            ms(p50),
            ms(max)
        );
    }
}

/// E3: the same two pods (a on node 1, b on node 2) three ways: a direct connection between
/// their namespaces (the redirection skipped for this pair), ztunnel to ztunnel over HBONE
/// (b's Service), and through the waypoint (a Service bound to it that selects b). For each:
/// round trips on one TCP connection, HTTP requests on new connections, and one bulk
/// transfer.
#[test]
#[ignore = "a figure for BENCHMARKS.md (E3); run with --ignored"]
fn e3_latency_and_throughput() {
    let _serial = crate::serial();
    let Some(mut mesh) = start(2) else {
        return;
    };
    let ports = [
        ("tcp-echo", 9000, 9000),
        ("http", 80, 8080),
        ("tcp-sink", 9100, 9100),
    ];
    let servers = [
        (Protocol::Tcp, 9000),
        (Protocol::Http, 8080),
        (Protocol::Sink, 9100),
    ];
    let mesh_vip = super::a_and_b(&mut mesh, &servers, &ports);
    mesh.add_waypoint("waypoint", 1);
    let waypoint_vip = mesh.add_service(
        "bw",
        &[("app", "b")],
        &ports,
        &[("istio.io/use-waypoint", "waypoint")],
    );
    mesh.wait_ztunnels_know(&waypoint_vip.to_string());
    let (a_ip, b_ip) = (mesh.pod("a").ip, mesh.pod("b").ip);
    // The direct path: a's connections to b's IP, and b's from a's, skip istio-cni's
    // redirection (HBONE arrives on 15008, which is not redirected anyway).
    mesh.pod("a").netns.iptables(&[
        "-t",
        "nat",
        "-I",
        "ISTIO_OUTPUT",
        "1",
        "-d",
        &b_ip.to_string(),
        "-j",
        "ACCEPT",
    ]);
    mesh.pod("b").netns.iptables(&[
        "-t",
        "nat",
        "-I",
        "ISTIO_PRERT",
        "1",
        "-s",
        &a_ip.to_string(),
        "-j",
        "ACCEPT",
    ]);
    let a = &mesh.pod("a").netns;
    until(Duration::from_secs(30), || {
        apps::http(a, (waypoint_vip, 80).into(), "GET", "/", "bw").is_ok()
    })
    .expect("bw through the waypoint");

    let paths = [
        ("direct", b_ip, [9000u16, 8080, 9100]),
        ("ztunnel", mesh_vip, [9000, 80, 9100]),
        ("waypoint", waypoint_vip, [9000, 80, 9100]),
    ];
    let bulk: u64 = 256 * 1024 * 1024;
    let mut rows = Vec::new();
    for (path, ip, [echo, http, sink]) in paths {
        let (mut rtts, mut requests, mut rates) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds() {
            let mut session = TcpSession::open(a, SocketAddr::new(ip.into(), echo)).expect("echo");
            let mut round: Vec<Duration> = (0..500)
                .map(|i| {
                    let started = Instant::now();
                    session.round_trip(&format!("{i}")).expect("round trip");
                    started.elapsed()
                })
                .collect();
            session.close();
            rtts.push(quantile(&mut round, 0.5));
            let mut round: Vec<Duration> = (0..100)
                .map(|_| {
                    let started = Instant::now();
                    let r = apps::http(a, SocketAddr::new(ip.into(), http), "GET", "/", "b")
                        .expect("GET");
                    assert_eq!(r.status, 200);
                    started.elapsed()
                })
                .collect();
            requests.push(quantile(&mut round, 0.5));
            let started = Instant::now();
            assert_eq!(
                apps::send_bulk(a, SocketAddr::new(ip.into(), sink), bulk).expect("bulk"),
                bulk
            );
            rates.push(bulk as f64 / started.elapsed().as_secs_f64() / 1e6);
        }
        rates.sort_by(f64::total_cmp);
        let (rtt, request, rate) = (
            quantile(&mut rtts, 0.5),
            quantile(&mut requests, 0.5),
            rates[rates.len() / 2],
        );
        eprintln!(
            "E3 {path}: TCP round trip p50 {rtt:?}, HTTP request on a new connection p50 {request:?}, 256 MiB at {rate:.0} MB/s (medians of {} rounds)",
            rounds()
        );
        rows.push((path, rtt, request, rate));
    }
    let (_, rtt0, req0, rate0) = rows[0];
    for (path, rtt, request, rate) in &rows[1..] {
        eprintln!(
            "E3 {path} / direct: round trip x{:.1}, request x{:.1}, throughput x{:.2}",
            rtt.as_secs_f64() / rtt0.as_secs_f64(),
            request.as_secs_f64() / req0.as_secs_f64(),
            rate / rate0
        );
    }
}
