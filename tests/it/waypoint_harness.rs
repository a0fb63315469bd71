//! The waypoint test harness, proven on its own before ambientd serves waypoints: the
//! SO_REUSEPORT routing the HBONE servers rely on, the HBONE client and server with the apps
//! behind them (no Envoy), and a real Envoy that gets its certificates from the test SDS server
//! and terminates mutual TLS with them.

use crate::support::apps::{EchoApp, HttpApp, echo, http_get};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::{self, HboneConnection, HboneError, HboneServer};
use crate::support::identity::{MeshCa, start_with_ca};
use crate::support::sds::SdsServer;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
"#;

async fn mesh() -> (Manifests, MeshCa) {
    let manifests = Manifests::new(&[("mesh.yaml", MESH)]);
    let mesh = start_with_ca(manifests.root()).await;
    (manifests, mesh)
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Which of two listeners takes the next connection (the other must take none).
async fn taker(any: &TcpListener, specific: &TcpListener) -> &'static str {
    let which = tokio::select! {
        accepted = any.accept() => { accepted.unwrap(); "0.0.0.0" }
        accepted = specific.accept() => { accepted.unwrap(); "127.0.20.5" }
    };
    // Nothing for the other one.
    let other = tokio::time::timeout(Duration::from_millis(50), async {
        tokio::select! {
            _ = any.accept() => {}
            _ = specific.accept() => {}
        }
    });
    assert!(other.await.is_err(), "one connection, two accepts");
    which
}

#[tokio::test]
async fn reuseport_hands_a_connection_to_the_most_specific_address() {
    // Envoy binds 0.0.0.0:15008 with SO_REUSEPORT; a test HBONE server binds 127.0.20.5:15008
    // beside it. A free port here, so that this runs beside Envoy tests.
    let any = hbone::reuseport_listener("0.0.0.0:0".parse().unwrap());
    let port = any.local_addr().unwrap().port();
    let specific = hbone::reuseport_listener(SocketAddr::new(ip("127.0.20.5"), port));
    for _ in 0..5 {
        for (to, expected) in [
            ("127.0.20.5", "127.0.20.5"),
            ("127.0.0.1", "0.0.0.0"),
            ("127.0.20.6", "0.0.0.0"),
        ] {
            let _client = tokio::net::TcpStream::connect((ip(to), port))
                .await
                .unwrap();
            assert_eq!(taker(&any, &specific).await, expected, "connecting to {to}");
        }
    }
}

#[tokio::test]
async fn hbone_client_reaches_the_apps_through_the_hbone_server() {
    let _port = envoy::exclusive().await;
    let (_manifests, mesh) = mesh().await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let pod = mesh.workload_cert("demo", "web").await;
    assert_eq!(client.spiffe_id, "spiffe://cluster.local/ns/demo/sa/sleep");
    let pod_ip = ip("127.0.20.5");
    let _http = HttpApp::start(SocketAddr::new(pod_ip, 8080), "web-1").await;
    let _echo = EchoApp::start(SocketAddr::new(pod_ip, 9000), "web-1").await;
    let server = HboneServer::start(pod_ip, &pod).await;
    assert_eq!(server.address, "127.0.20.5:15008".parse().unwrap());

    let connection = HboneConnection::open(server.address, &client)
        .await
        .unwrap();
    assert_eq!(
        connection.peer_identity.as_deref(),
        Some(pod.spiffe_id.as_str())
    );
    assert_eq!(connection.alpn.as_deref(), Some(&b"h2"[..]));

    // HTTP/1.1 over the tunnel, twice on one stream (keep-alive).
    let mut tunnel = connection.connect("127.0.20.5:8080").await.unwrap();
    assert_eq!(
        tunnel.peer_identity.as_deref(),
        Some(pod.spiffe_id.as_str())
    );
    for path in ["/hello", "/again"] {
        let (status, body) = http_get(&mut tunnel, "web.demo.svc.cluster.local", path).await;
        assert_eq!(
            (status, body.as_str()),
            (200, &*format!("backend web-1 path {path}"))
        );
    }
    // TCP on another stream of the same connection; closing our side closes the app's.
    let mut tunnel = connection.connect("127.0.20.5:9000").await.unwrap();
    assert_eq!(echo(&mut tunnel, "ping").await, "web-1: ping");
    assert_eq!(echo(&mut tunnel, "pong").await, "web-1: pong");
    tunnel.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tunnel.read_to_end(&mut rest))
        .await
        .expect("the app closes after our END_STREAM")
        .unwrap();
    assert!(rest.is_empty());

    // A one-shot connect (a new connection per tunnel).
    let mut tunnel = hbone::connect(server.address, "127.0.20.5:9000", &client)
        .await
        .unwrap();
    assert_eq!(echo(&mut tunnel, "once").await, "web-1: once");

    // An authority that is not this pod's, and a port nothing listens on.
    let refused = |r: Result<_, HboneError>| match r {
        Err(HboneError::Refused(status)) => status,
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("CONNECT accepted"),
    };
    assert_eq!(refused(connection.connect("127.0.20.6:8080").await), 400);
    assert_eq!(refused(connection.connect("127.0.20.5:1").await), 503);

    let connects = server.connects();
    let authorities: Vec<_> = connects
        .iter()
        .map(|c| (c.authority.as_str(), c.status))
        .collect();
    assert_eq!(
        authorities,
        [
            ("127.0.20.5:8080", 200),
            ("127.0.20.5:9000", 200),
            ("127.0.20.5:9000", 200),
            ("127.0.20.6:8080", 400),
            ("127.0.20.5:1", 503),
        ]
    );
    assert!(
        server
            .peer_identities()
            .iter()
            .all(|id| id.as_deref() == Some(client.spiffe_id.as_str())),
        "{:?}",
        server.peer_identities()
    );

    // Without a client certificate there is no session: the server ends the handshake.
    let anonymous = hbone::client_tls_anonymous(&client, &["h2"]);
    let outcome = HboneConnection::open_with(server.address, anonymous).await;
    let refused = match outcome {
        Err(_) => true,
        // TLS 1.3: the client finishes first; the server's alert ends the connection after.
        Ok(connection) => connection.connect("127.0.20.5:8080").await.is_err(),
    };
    assert!(refused, "a client without a certificate got a tunnel");
    // The server records the failure as it sends the alert: maybe after the client saw it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.failures().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let failures = server.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("certificate"), "{failures:?}");
    mesh.running.stop().await;
}

/// A static listener on `port`: mutual TLS with the SDS secrets `default` and `ROOTCA`, as
/// ambientd's waypoint listeners will have, in front of a TCP proxy to `backend`; and a plain
/// one on `0.0.0.0:<wildcard_port>` to the same, bound as Envoy binds 15008.
fn smoke_listeners(port: u16, wildcard_port: u16, backend: SocketAddr) -> String {
    let sds = |name: &str| {
        format!(
            "{{name: {name}, sds_config: {{api_config_source: {{api_type: GRPC, \
             transport_api_version: V3, set_node_on_first_message_only: true, \
             grpc_services: [{{envoy_grpc: {{cluster_name: sds-grpc}}}}]}}, \
             initial_fetch_timeout: 0s, resource_api_version: V3}}}}"
        )
    };
    format!(
        r#"
static_resources:
  listeners:
  - name: smoke
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
          require_client_certificate: true
          common_tls_context:
            tls_params: {{tls_minimum_protocol_version: TLSv1_3}}
            tls_certificate_sds_secret_configs: [{default}]
            validation_context_sds_secret_config: {rootca}
      filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: smoke
          cluster: echo
  - name: wildcard
    address: {{socket_address: {{address: 0.0.0.0, port_value: {wildcard_port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.tcp_proxy
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy
          stat_prefix: wildcard
          cluster: echo
  clusters:
  - name: echo
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: echo
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: {ip}, port_value: {backend_port}}}}}}}}}]}}]
"#,
        default = sds("default"),
        rootca = sds("ROOTCA"),
        ip = backend.ip(),
        backend_port = backend.port(),
    )
}

#[tokio::test]
async fn envoy_terminates_mutual_tls_with_certificates_from_the_test_sds_server() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let (_manifests, mesh) = mesh().await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let sds = SdsServer::start(&waypoint).await;
    let backend = EchoApp::start("127.0.0.1:0".parse().unwrap(), "echo").await;
    let free_port = || {
        let probe = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let (port, wildcard_port) = (free_port(), free_port());
    let mut params = EnvoyParams::new(
        mesh.running.xds_address,
        sds.address,
        WaypointNode::new("demo", "waypoint"),
    );
    params.extra_bootstrap_yaml = Some(smoke_listeners(port, wildcard_port, backend.address));
    // This mesh has no waypoint Gateway: ambientd answers with the empty waypoint config, which
    // is what lets Envoy go on to SDS (it asks only after CDS has answered) with Istio's
    // initial_fetch_timeout of none.

    let started = Instant::now();
    let envoy = Envoy::start(&binary, &params).await;
    let admin_up = started.elapsed();
    let dump = envoy
        .wait_until("holding the SDS secrets default and ROOTCA", |dump| {
            envoy::active_secrets(dump) == ["ROOTCA", "default"]
        })
        .await;
    let secrets_in = started.elapsed();
    assert_eq!(envoy::static_listeners(&dump), ["smoke", "wildcard"]);
    assert!(envoy::warming_secrets(&dump).is_empty());
    // Its listeners accept once initialization is over.
    envoy.wait_live().await;
    let live = started.elapsed();

    // The harness's TLS client (ztunnel's settings) through Envoy's TLS to the echo server.
    let listener: SocketAddr = ([127, 0, 0, 1], port).into();
    let tls = hbone::client_tls(&client, &[]);
    let (mut stream, peer) = hbone::tls_connect(listener, tls)
        .await
        .expect("TLS to Envoy");
    assert_eq!(peer.as_deref(), Some(waypoint.spiffe_id.as_str()));
    assert_eq!(
        echo(&mut stream, "through envoy").await,
        "echo: through envoy"
    );
    let echoed = started.elapsed();

    // Without a client certificate Envoy ends the connection.
    let anonymous = hbone::client_tls_anonymous(&client, &[]);
    if let Ok((mut stream, _)) = hbone::tls_connect(listener, anonymous).await {
        let _ = stream.write_all(b"anyone?\n").await;
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("Envoy answers a missing certificate");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    // SDS: two streams (one per secret), each answered once and ACKed, nothing refused.
    let requests = sds.requests();
    assert!(sds.nacks().is_empty(), "{requests:#?}");
    let mut asked: Vec<_> = requests
        .iter()
        .filter(|r| r.response_nonce.is_empty())
        .flat_map(|r| r.resource_names.clone())
        .collect();
    asked.sort();
    assert_eq!(asked, ["ROOTCA", "default"], "{requests:#?}");
    assert!(
        requests
            .iter()
            .any(|r| !r.response_nonce.is_empty() && !r.answered),
        "an ACK: {requests:#?}"
    );
    assert!(envoy.stat("cluster.echo.upstream_cx_total").await >= Some(1));
    let listener_stat = |name: &str| format!("listener.127.0.0.1_{port}.{name}");
    assert!(envoy.stat(&listener_stat("ssl.handshake")).await >= Some(1));
    assert!(envoy.stat(&listener_stat("ssl.fail_verify_no_cert")).await >= Some(1));

    // Envoy binds with SO_REUSEPORT: a test server binds a pod address beside its 0.0.0.0 and
    // gets that address's connections; the others still reach Envoy.
    let beside = hbone::reuseport_listener(SocketAddr::new(ip("127.0.20.5"), wildcard_port));
    let mut to_envoy = tokio::net::TcpStream::connect(("127.0.0.1", wildcard_port))
        .await
        .unwrap();
    assert_eq!(echo(&mut to_envoy, "wildcard").await, "echo: wildcard");
    let _to_beside = tokio::net::TcpStream::connect(beside.local_addr().unwrap())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), beside.accept())
        .await
        .expect("the pod address's connection reaches the server beside Envoy")
        .unwrap();
    let wildcard_stat = format!("listener.0.0.0.0_{wildcard_port}.downstream_cx_total");
    assert_eq!(
        envoy.stat(&wildcard_stat).await,
        Some(1),
        "only 127.0.0.1's"
    );

    // A rotation: the SDS server pushes a new `default` (another identity, to tell them apart)
    // and Envoy serves it to the next connection.
    let rotated = mesh.workload_cert("demo", "waypoint-rotated").await;
    sds.set_cert(&rotated);
    envoy
        .wait_until("holding the rotated default", |dump| {
            envoy::secret_version(dump, "default").is_some_and(|v| v != "1")
        })
        .await;
    let tls = hbone::client_tls(&client, &[]);
    let (mut stream, peer) = hbone::tls_connect(listener, tls)
        .await
        .expect("TLS to Envoy");
    assert_eq!(peer.as_deref(), Some(rotated.spiffe_id.as_str()));
    assert_eq!(echo(&mut stream, "rotated").await, "echo: rotated");
    let rotated_in = started.elapsed();
    assert!(sds.nacks().is_empty(), "{:#?}", sds.requests());

    eprintln!(
        "timings: admin up {admin_up:?}, secrets active {secrets_in:?}, LIVE {live:?}, \
         echo {echoed:?}, rotated {rotated_in:?}"
    );
    drop(envoy);
    mesh.running.stop().await;
}
