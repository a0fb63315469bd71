//! Gateway API routes through a real Envoy 1.40 as waypoint (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes), issue 24):
//! an HTTPRoute and a GRPCRoute on the Service `web`, and a client playing the calling
//! ztunnel. Each check is a real request through Envoy:
//!
//! * a path match and a header match reach different backends; an unmatched path gets 404;
//! * a 90/10 split over 1,000 requests (keep-alive tunnels) lands within ±5 %;
//! * request header modifiers are seen by the backend, response ones by the client;
//! * a redirect answers 302 with its location; a rewrite reaches the backend rewritten;
//! * a request timeout on a slow backend answers 504;
//! * a GRPCRoute routes by service and method;
//! * changing a route changes what the next request gets, while a keep-alive tunnel opened
//!   before still gets answers, by the old routes (the listener's changed chain drains;
//!   nothing is dropped).
//!
//! Backends: `web-v1` (a plain pod, bound to the waypoint), `web-v2` (an ambient pod reached
//! over HBONE, *not* bound: its `outbound|…` cluster), `slow` (bound, answers after 3 s). VIPs
//! 127.0.30.x, pods 127.0.20.x, as in tests/it/waypoint.rs.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::support::apps::{HttpApp, HttpAppOptions, HttpResponse, try_http_request};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::{HboneConnection, HboneServer, Tunnel};
use crate::support::identity::start_with_ca;
use crate::support::sds::SdsServer;

pub(crate) const WEB: &str = "127.0.30.12:8080";
pub(crate) const V2_CLUSTER: &str = "outbound|8080||web-v2.demo.svc.cluster.local";

pub(crate) const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 127.0.30.1}, {type: Hostname, value: waypoint.demo.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo}
spec:
  clusterIP: 127.0.30.1
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: status-port, port: 15021, appProtocol: tcp}, {name: mesh, port: 15008, appProtocol: hbone}]
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-7d9c4b-x2x7q
  namespace: demo
  labels: {gateway.networking.k8s.io/gateway-name: waypoint}
spec: {serviceAccountName: waypoint, nodeName: node-a}
status: {phase: Running, podIP: 127.0.20.1, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.12
  selector: {app: web}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v1, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.13
  selector: {app: web-v1}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-v1-1, namespace: demo, labels: {app: web-v1}}
spec: {serviceAccountName: web, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.5, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-v2, namespace: demo, labels: {istio.io/use-waypoint: none}}
spec:
  clusterIP: 127.0.30.14
  selector: {app: web-v2}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web-v2-1
  namespace: demo
  labels: {app: web-v2}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: web, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.6, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: slow, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.15
  selector: {app: slow}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: slow-1, namespace: demo, labels: {app: slow}}
spec: {serviceAccountName: slow, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.7, conditions: [{type: Ready, status: "True"}]}
"#;

/// The HTTPRoute on `web`; `v2_backend` is where `/v2` goes.
fn http_route(v2_backend: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web, namespace: demo}}
spec:
  parentRefs: [{{group: "", kind: Service, name: web}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /v2}}}}]
    backendRefs: [{{name: {v2_backend}, port: 8080}}]
  - matches: [{{path: {{value: /any}}, headers: [{{name: x-version, value: v2}}]}}]
    backendRefs: [{{name: web-v2, port: 8080}}]
  - matches: [{{path: {{value: /any}}}}]
    backendRefs: [{{name: web-v1, port: 8080}}]
  - matches: [{{path: {{value: /split}}}}]
    backendRefs: [{{name: web-v1, port: 8080, weight: 90}}, {{name: web-v2, port: 8080, weight: 10}}]
  - matches: [{{path: {{value: /headers}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-added, value: "yes"}}], remove: [x-drop]}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-resp, value: r}}]}}
    backendRefs: [{{name: web-v1, port: 8080}}]
  - matches: [{{path: {{type: Exact, value: /old}}}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {{statusCode: 302, path: {{type: ReplaceFullPath, replaceFullPath: /new}}}}
  - matches: [{{path: {{value: /rewrite}}}}]
    filters:
    - type: URLRewrite
      urlRewrite: {{path: {{type: ReplacePrefixMatch, replacePrefixMatch: /rewritten}}}}
    backendRefs: [{{name: web-v1, port: 8080}}]
  - matches: [{{path: {{value: /slow}}}}]
    timeouts: {{request: 500ms}}
    backendRefs: [{{name: slow, port: 8080}}]
"#
    )
}

const GRPC_ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules:
  - matches: [{method: {service: echo.Echo, method: Ping}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{method: {service: echo.Echo}}]
    backendRefs: [{name: web-v2, port: 8080}]
"#;

pub(crate) fn at(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse::<IpAddr>().unwrap(), port)
}

/// One request on an open tunnel (keep-alive), or why none came.
async fn request(
    tunnel: &mut Tunnel,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    tokio::time::timeout(
        Duration::from_secs(10),
        try_http_request(tunnel, method, "web", path, headers),
    )
    .await
    .map_err(|_| format!("{method} {path}: no answer"))?
    .map_err(|e| format!("{method} {path}: {e}"))
}

/// A new CONNECT to `web` on `connection`, then one GET.
pub(crate) async fn get(connection: &HboneConnection, path: &str) -> Result<HttpResponse, String> {
    get_with(connection, path, &[]).await
}

pub(crate) async fn get_with(
    connection: &HboneConnection,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse, String> {
    let mut tunnel = connection
        .connect(WEB)
        .await
        .map_err(|e| format!("CONNECT: {e:?}"))?;
    request(&mut tunnel, "GET", path, headers).await
}

/// The backend's name from its answer's first line (`backend <name> path <path>`).
pub(crate) fn backend_of(response: &HttpResponse) -> &str {
    response.body.split_whitespace().nth(1).unwrap_or("")
}

/// Repeats `attempt` until `done` holds; fails loudly on timeout.
pub(crate) async fn eventually<T: std::fmt::Debug, F, Fut>(
    what: &str,
    mut attempt: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let result = attempt().await;
        if done(&result) {
            return result;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn gateway_api_routes_through_a_real_envoy() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let manifests = Manifests::new(&[
        ("mesh.yaml", MESH),
        ("route.yaml", &http_route("web-v2")),
        ("grpc.yaml", GRPC_ROUTE),
    ]);
    let mesh = start_with_ca(manifests.root()).await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let web_identity = mesh.workload_cert("demo", "web").await;
    let sds = SdsServer::start(&waypoint).await;
    let echo = HttpAppOptions {
        echo_headers: true,
        ..HttpAppOptions::default()
    };
    let _v1 = HttpApp::start_with(at("127.0.20.5", 8080), "web-v1", echo.clone()).await;
    let _v2 = HttpApp::start_with(at("127.0.20.6", 8080), "web-v2", echo).await;
    let v2_hbone = HboneServer::start("127.0.20.6".parse().unwrap(), &web_identity).await;
    let slow = HttpAppOptions {
        delay: Some(Duration::from_secs(3)),
        ..HttpAppOptions::default()
    };
    let _slow = HttpApp::start_with(at("127.0.20.7", 8080), "slow", slow).await;

    let mut node = WaypointNode::new("demo", "waypoint");
    node.ip = "127.0.20.1".into();
    let params = EnvoyParams::new(mesh.running.xds_address, sds.address, node);
    let envoy = Envoy::start(&binary, &params).await;
    envoy.wait_live().await;
    let dump = envoy
        .wait_until("the routes' clusters", |dump| {
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

    // A path match and a header match reach different backends; no route, no default.
    let v2 = eventually(
        "the path match",
        || get(&connection, "/v2/a"),
        |r| r.as_ref().is_ok_and(|r| r.status == 200),
    )
    .await
    .unwrap();
    assert_eq!(backend_of(&v2), "web-v2", "{}", v2.body);
    assert!(
        v2.body.starts_with("backend web-v2 path /v2/a"),
        "{}",
        v2.body
    );
    // web-v2 is reached over HBONE with the waypoint's identity, through its outbound cluster.
    let connects = v2_hbone.connects();
    assert!(!connects.is_empty());
    assert_eq!(
        connects[0].peer_identity.as_deref(),
        Some(waypoint.spiffe_id.as_str())
    );
    assert_eq!(connects[0].authority, "127.0.20.6:8080");
    let by_header = get_with(&connection, "/any", &[("x-version", "v2")])
        .await
        .unwrap();
    assert_eq!(backend_of(&by_header), "web-v2");
    let without = get(&connection, "/any").await.unwrap();
    assert_eq!(backend_of(&without), "web-v1");
    assert_eq!(get(&connection, "/nowhere").await.unwrap().status, 404);

    // A 90/10 split over 1,000 requests on four keep-alive tunnels.
    let mut v1_count = 0;
    let mut total = 0;
    for _ in 0..4 {
        let mut tunnel = connection.connect(WEB).await.expect("CONNECT");
        for _ in 0..250 {
            let response = request(&mut tunnel, "GET", "/split", &[]).await.unwrap();
            assert_eq!(response.status, 200, "{}", response.body);
            match backend_of(&response) {
                "web-v1" => v1_count += 1,
                "web-v2" => {}
                other => panic!("split to {other}"),
            }
            total += 1;
        }
    }
    assert_eq!(total, 1000);
    eprintln!("split: web-v1 {v1_count} of {total}");
    assert!(
        (850..=950).contains(&v1_count),
        "web-v1 got {v1_count} of 1000 (want 900 ± 50)"
    );

    // Header modifiers: the backend sees the request's, the client the response's.
    let headers = get_with(&connection, "/headers", &[("x-drop", "1"), ("x-keep", "2")])
        .await
        .unwrap();
    assert_eq!(headers.status, 200);
    assert!(headers.body.contains("\nx-added: yes"), "{}", headers.body);
    assert!(headers.body.contains("\nx-keep: 2"), "{}", headers.body);
    assert!(!headers.body.contains("x-drop"), "{}", headers.body);
    assert_eq!(headers.header("x-resp"), Some("r"));

    // A redirect, and a rewrite the backend sees.
    let redirect = get(&connection, "/old").await.unwrap();
    assert_eq!(redirect.status, 302);
    assert_eq!(redirect.header("location"), Some("http://web:8080/new"));
    let rewritten = get(&connection, "/rewrite/a").await.unwrap();
    assert!(
        rewritten
            .body
            .starts_with("backend web-v1 path /rewritten/a"),
        "{}",
        rewritten.body
    );

    // A request timeout on the slow backend.
    let started = Instant::now();
    let timed_out = get(&connection, "/slow").await.unwrap();
    assert_eq!(timed_out.status, 504, "{}", timed_out.body);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // The GRPCRoute: by service and method.
    let grpc = [
        ("content-type", "application/grpc"),
        ("content-length", "0"),
    ];
    let mut tunnel = connection.connect(WEB).await.expect("CONNECT");
    let ping = request(&mut tunnel, "POST", "/echo.Echo/Ping", &grpc)
        .await
        .unwrap();
    assert_eq!(backend_of(&ping), "web-v1", "{}", ping.body);
    let other = request(&mut tunnel, "POST", "/echo.Echo/Other", &grpc)
        .await
        .unwrap();
    assert_eq!(backend_of(&other), "web-v2", "{}", other.body);

    // A route change: the next request follows it; a keep-alive tunnel opened before keeps
    // being answered (its chain drains), and no connection is refused.
    let mut before = connection.connect(WEB).await.expect("CONNECT");
    let first = request(&mut before, "GET", "/v2/b", &[]).await.unwrap();
    assert_eq!(backend_of(&first), "web-v2");
    let modified = envoy
        .stat("listener_manager.listener_modified")
        .await
        .unwrap_or(0);
    manifests.write("route.yaml", &http_route("web-v1"));
    let changed = eventually(
        "the changed route",
        || get(&connection, "/v2/c"),
        |r| r.as_ref().is_ok_and(|r| backend_of(r) == "web-v1"),
    )
    .await
    .unwrap();
    assert_eq!(changed.status, 200);
    assert!(
        envoy
            .stat("listener_manager.listener_modified")
            .await
            .unwrap_or(0)
            > modified
    );
    let old_tunnel = request(&mut before, "GET", "/v2/d", &[]).await.unwrap();
    assert_eq!(old_tunnel.status, 200, "{}", old_tunnel.body);
    // Its connection was on the chain Envoy replaced: the old routes serve it while it drains.
    assert_eq!(backend_of(&old_tunnel), "web-v2", "{}", old_tunnel.body);
    assert_eq!(
        envoy.stat("listener_manager.lds.update_rejected").await,
        Some(0)
    );
    assert_eq!(
        envoy.stat("cluster_manager.cds.update_rejected").await,
        Some(0)
    );
}
