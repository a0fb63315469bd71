//! A real Envoy 1.40 as a waypoint, served by ambientd (istio/istio `pilot/pkg/networking/core/waypoint.go`, issue 22): it
//! accepts every resource, and a client playing the calling ztunnel reaches a plain backend and
//! an HBONE backend through it, on HTTP and TCP ports; an L4 DENY on the Service refuses and
//! its removal lets through; a new backend pod gets traffic and an unbound Service's chain goes
//! away, while Envoy serves.
//!
//! The mesh is on loopback: VIPs 127.0.30.x, pods 127.0.20.x. Envoy binds 0.0.0.0:15008 as
//! istiod configures it; the HBONE backends bind `<pod ip>:15008` beside it (SO_REUSEPORT).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::apps::{EchoApp, HttpApp, try_http_request};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::{HboneConnection, HboneError, HboneServer};
use crate::support::identity::{MeshCa, WorkloadCert, start_with_ca};
use crate::support::sds::SdsServer;

const WAYPOINT_IP: &str = "127.0.20.1";

/// The waypoint (Gateway, its Service and pod) and two Services bound to it: `plain` (a pod not
/// in the mesh) and `mesh` (an ambient pod, reached over HBONE), each with an HTTP and a TCP
/// port.
const MESH: &str = r#"
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
"#;

fn service(name: &str, vip: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: demo
  labels: {{istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: {vip}
  selector: {{app: {name}}}
  ports: [{{name: http, port: 8080}}, {{name: tcp, port: 9000}}]
"#
    )
}

fn pod(app: &str, name: &str, ip: &str, ambient: bool) -> String {
    let annotations = if ambient {
        "{ambient.istio.io/redirection: enabled}"
    } else {
        "{}"
    };
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: demo
  labels: {{app: {app}}}
  annotations: {annotations}
spec: {{serviceAccountName: {app}, nodeName: node-b}}
status: {{phase: Running, podIP: {ip}, conditions: [{{type: Ready, status: "True"}}]}}
"#
    )
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn at(ip_text: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(ip_text), port)
}

/// One backend pod: its apps on 8080 (HTTP) and 9000 (echo), and for an ambient pod its HBONE
/// server on 15008.
struct Backend {
    _http: HttpApp,
    _echo: EchoApp,
    hbone: Option<HboneServer>,
}

async fn backend(name: &str, pod_ip: &str, cert: Option<&WorkloadCert>) -> Backend {
    Backend {
        _http: HttpApp::start(at(pod_ip, 8080), name).await,
        _echo: EchoApp::start(at(pod_ip, 9000), name).await,
        hbone: match cert {
            Some(cert) => Some(HboneServer::start(ip(pod_ip), cert).await),
            None => None,
        },
    }
}

/// GET `path` through the waypoint to `authority`: the body, or why not.
async fn get(client: &WorkloadCert, authority: &str, path: &str) -> Result<String, String> {
    let connection = HboneConnection::open(at("127.0.0.1", 15008), client)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut tunnel = connection
        .connect(authority)
        .await
        .map_err(|e| format!("CONNECT {authority}: {e:?}"))?;
    let response = tokio::time::timeout(
        Duration::from_secs(5),
        try_http_request(&mut tunnel, "GET", "web", path, &[]),
    )
    .await
    .map_err(|_| "no answer".to_string())?
    .map_err(|e| format!("GET {path}: {e}"))?;
    if response.status == 200 {
        Ok(response.body)
    } else {
        Err(format!("HTTP {}: {}", response.status, response.body))
    }
}

/// One echo line through the waypoint to `authority`.
async fn tcp(client: &WorkloadCert, authority: &str, line: &str) -> Result<String, String> {
    let connection = HboneConnection::open(at("127.0.0.1", 15008), client)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut tunnel = match connection.connect(authority).await {
        Ok(tunnel) => tunnel,
        Err(HboneError::Refused(status)) => return Err(format!("refused {status}")),
        Err(e) => return Err(format!("CONNECT {authority}: {e:?}")),
    };
    tokio::time::timeout(Duration::from_secs(5), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tunnel
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = vec![0u8; 256];
        let n = tunnel
            .read(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed".to_string());
        }
        Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_string())
    })
    .await
    .map_err(|_| "no answer".to_string())?
}

/// Repeats `attempt` until `done` says its result is the expected one; fails loudly on timeout.
async fn eventually<T: std::fmt::Debug, F, Fut>(
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

fn main_internal_chains(dump: &Value) -> Vec<String> {
    envoy::sections(dump, "ListenersConfigDump")
        .into_iter()
        .flat_map(|s| {
            s["dynamic_listeners"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|l| l["name"] == "main_internal")
        .flat_map(|l| {
            l["active_state"]["listener"]["filter_chains"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

async fn metric(mesh: &MeshCa, name: &str) -> f64 {
    let (_, text) = crate::support::common::http_get(mesh.running.debug_address, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_real_envoy_serves_as_waypoint() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let manifests = Manifests::new(&[
        ("mesh.yaml", MESH),
        (
            "plain.yaml",
            &(service("plain", "127.0.30.11")
                + "---"
                + &pod("plain", "plain-1", "127.0.20.6", false)),
        ),
        (
            "mesh-svc.yaml",
            &(service("web", "127.0.30.12") + "---" + &pod("web", "web-1", "127.0.20.5", true)),
        ),
    ]);
    let mesh = start_with_ca(manifests.root()).await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let web = mesh.workload_cert("demo", "web").await;
    let sds = SdsServer::start(&waypoint).await;
    let _plain = backend("plain-1", "127.0.20.6", None).await;
    let web_1 = backend("web-1", "127.0.20.5", Some(&web)).await;

    let mut node = WaypointNode::new("demo", "waypoint");
    node.ip = WAYPOINT_IP.into();
    let params = EnvoyParams::new(mesh.running.xds_address, sds.address, node);
    let envoy = Envoy::start(&binary, &params).await;
    envoy.wait_live().await;

    // Every resource accepted: the three listeners active, the clusters present, no NACK.
    let dump = envoy
        .wait_until("the waypoint's listeners and clusters", |dump| {
            let listeners = envoy::active_listeners(dump);
            ["connect_terminate", "main_internal", "connect_originate"]
                .iter()
                .all(|l| listeners.iter().any(|a| a == l))
                && envoy::active_clusters(dump)
                    .iter()
                    .any(|c| c == "inbound-vip|9000|tcp|web.demo.svc.cluster.local")
        })
        .await;
    assert!(
        envoy::listener_errors(&dump).is_empty(),
        "{:?}",
        envoy::listener_errors(&dump)
    );
    let clusters = envoy::active_clusters(&dump);
    for expected in [
        "main_internal",
        "encap",
        "connect_originate",
        "inbound-vip|8080|http|plain.demo.svc.cluster.local",
        "inbound-vip|9000|tcp|plain.demo.svc.cluster.local",
        "inbound-vip|8080|http|web.demo.svc.cluster.local",
        "inbound-vip|9000|tcp|web.demo.svc.cluster.local",
    ] {
        assert!(
            clusters.iter().any(|c| c == expected),
            "{expected} in {clusters:?}"
        );
    }
    for stat in [
        "listener_manager.lds.update_rejected",
        "cluster_manager.cds.update_rejected",
    ] {
        assert_eq!(envoy.stat(stat).await, Some(0), "{stat}");
    }
    assert_eq!(metric(&mesh, "pilot_total_xds_rejects").await, 0.0);

    // (a) a plain backend, HTTP and TCP.
    let body = eventually(
        "HTTP to the plain backend",
        || get(&client, "127.0.30.11:8080", "/a"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend plain-1 path /a");
    let line = eventually(
        "TCP to the plain backend",
        || tcp(&client, "127.0.30.11:9000", "hi"),
        Result::is_ok,
    )
    .await;
    assert_eq!(line.unwrap(), "plain-1: hi");

    // (b) an HBONE backend: the waypoint tunnels to its 15008 with its own identity.
    let body = eventually(
        "HTTP to the HBONE backend",
        || get(&client, "127.0.30.12:8080", "/b"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend web-1 path /b");
    let line = eventually(
        "TCP to the HBONE backend",
        || tcp(&client, "127.0.30.12:9000", "ho"),
        Result::is_ok,
    )
    .await;
    assert_eq!(line.unwrap(), "web-1: ho");
    let server = web_1.hbone.as_ref().unwrap();
    let connects = server.connects();
    assert!(!connects.is_empty());
    for connect in &connects {
        assert_eq!(
            connect.peer_identity.as_deref(),
            Some(waypoint.spiffe_id.as_str())
        );
        assert!(
            ["127.0.20.5:8080", "127.0.20.5:9000"].contains(&connect.authority.as_str()),
            "{connect:?}"
        );
    }

    // An L4 DENY on the Service refuses; removing it lets the next connection through.
    manifests.write(
        "deny.yaml",
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-sleep, namespace: demo}
spec:
  targetRefs: [{kind: Service, group: "", name: web}]
  action: DENY
  rules: [{from: [{source: {principals: [cluster.local/ns/demo/sa/sleep]}}]}]
"#,
    );
    let denied = eventually(
        "the DENY on HTTP",
        || get(&client, "127.0.30.12:8080", "/c"),
        |r| r.as_ref().is_err_and(|e| e.contains("403")),
    )
    .await;
    assert!(denied.unwrap_err().contains("403"));
    let _ = eventually(
        "the DENY on TCP",
        || tcp(&client, "127.0.30.12:9000", "x"),
        Result::is_err,
    )
    .await;
    // The plain Service has no policy.
    assert_eq!(
        get(&client, "127.0.30.11:8080", "/d").await.unwrap(),
        "backend plain-1 path /d"
    );
    manifests.remove("deny.yaml");
    let allowed = eventually(
        "the DENY removed",
        || get(&client, "127.0.30.12:8080", "/e"),
        Result::is_ok,
    )
    .await;
    assert_eq!(allowed.unwrap(), "backend web-1 path /e");

    // A new backend pod starts getting traffic.
    let web_2 = backend("web-2", "127.0.20.7", Some(&web)).await;
    manifests.write("web-2.yaml", &pod("web", "web-2", "127.0.20.7", true));
    let _ = eventually(
        "traffic at the new pod",
        || get(&client, "127.0.30.12:8080", "/f"),
        |r| r.as_ref().is_ok_and(|b| b.starts_with("backend web-2")),
    )
    .await;
    assert!(!web_2.hbone.as_ref().unwrap().connects().is_empty());

    // An unbound Service's chain goes away, and its VIP finds no chain.
    manifests.write(
        "plain.yaml",
        &(service("plain", "127.0.30.11")
            .replace("labels: {istio.io/use-waypoint: waypoint}", "labels: {}")
            + "---"
            + &pod("plain", "plain-1", "127.0.20.6", false)),
    );
    envoy
        .wait_until("the plain chains gone", |dump| {
            let chains = main_internal_chains(dump);
            !chains.is_empty() && !chains.iter().any(|c| c.contains("plain.demo"))
        })
        .await;
    let _ = eventually(
        "the plain VIP unreachable",
        || get(&client, "127.0.30.11:8080", "/g"),
        Result::is_err,
    )
    .await;
    assert_eq!(
        envoy.stat("listener_manager.lds.update_rejected").await,
        Some(0)
    );
    assert_eq!(metric(&mesh, "pilot_total_xds_rejects").await, 0.0);
}
