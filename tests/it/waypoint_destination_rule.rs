//! DestinationRules at a real Envoy 1.40 waypoint, served by ambientd (docs/waypoint.md,
//! "DestinationRule"): TLS origination to a plain HTTPS backend and to one behind HBONE (SNI,
//! the CA from the agent's SDS, SAN checks, a client certificate for MUTUAL), switched on,
//! changed and off while Envoy serves and without touching a listener; and every part of a
//! traffic policy (connection pool, outlier detection, each load balancer, port-level
//! settings, TLS variants, and the route's hash and TCP proxy's timeouts it brings) accepted by
//! Envoy, as its config dump shows them.
//!
//! The mesh is on loopback as in `waypoint.rs`: VIPs 127.0.30.x, pods 127.0.20.x. The HTTPS
//! backends have certificates from a test CA; a test SDS server plays the waypoint's agent,
//! serving that CA as the `file-root:` secrets and a client certificate as `file-cert:`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::apps::{EchoApp, HttpApp, try_http_request};
use crate::support::common::Manifests;
use crate::support::envoy::{self, Envoy, EnvoyParams, WaypointNode};
use crate::support::hbone::{HboneConnection, HboneServer};
use crate::support::https::{Handshake, HttpsApp, TestCa};
use crate::support::identity::{MeshCa, WorkloadCert, start_with_ca};
use crate::support::sds::{SdsServer, tls_certificate_secret, validation_context_secret};

const BACKEND_CA: &str = "/etc/ambientd-test/backend-ca.pem";
const CLIENT_CERT: &str = "/etc/ambientd-test/client.pem";
const CLIENT_KEY: &str = "/etc/ambientd-test/client-key.pem";

/// The waypoint (as in `waypoint.rs`) and three Services bound to it: `secure` (a plain pod
/// serving HTTPS on 8443, and HTTPS with client certificates on 8444), `secure-mesh` (an
/// ambient pod serving HTTPS behind HBONE) and `tuned` (plain HTTP and echo on 8080 and 9000,
/// and ports 7001–7006 that only carry policies for the config dump).
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
---
apiVersion: v1
kind: Service
metadata: {name: secure, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.21
  selector: {app: secure}
  ports:
  - {name: http, port: 8080, targetPort: 8443}
  - {name: http-mtls, port: 8081, targetPort: 8444}
---
apiVersion: v1
kind: Pod
metadata: {name: secure-1, namespace: demo, labels: {app: secure}}
spec: {serviceAccountName: secure, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.21, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: secure-mesh, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.22
  selector: {app: secure-mesh}
  ports: [{name: http, port: 8080, targetPort: 8443}]
---
apiVersion: v1
kind: Pod
metadata:
  name: secure-mesh-1
  namespace: demo
  labels: {app: secure-mesh}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: secure-mesh, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.22, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: tuned, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 127.0.30.23
  selector: {app: tuned}
  ports:
  - {name: http, port: 8080}
  - {name: tcp, port: 9000}
  - {name: http2-ring, port: 7001}
  - {name: http-maglev, port: 7002}
  - {name: tcp-passthrough, port: 7003}
  - {name: http-auto-sni, port: 7004}
  - {name: http-insecure, port: 7005}
  - {name: http-mutual, port: 7006}
---
apiVersion: v1
kind: Pod
metadata: {name: tuned-1, namespace: demo, labels: {app: tuned}}
spec: {serviceAccountName: tuned, nodeName: node-b}
status: {phase: Running, podIP: 127.0.20.23, conditions: [{type: Ready, status: "True"}]}
"#;

/// TLS origination for `secure`: SIMPLE with an SNI and the test CA (whose SANs `sans`, if
/// any, must match), and MUTUAL with a client certificate on 8081.
fn secure_rule(sans: &[&str]) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: secure, namespace: demo}}
spec:
  host: secure
  trafficPolicy:
    tls:
      mode: SIMPLE
      sni: secure.example.com
      caCertificates: {BACKEND_CA}
      subjectAltNames: {sans:?}
    portLevelSettings:
    - port: {{number: 8081}}
      tls:
        mode: MUTUAL
        sni: secure.example.com
        caCertificates: {BACKEND_CA}
        clientCertificate: {CLIENT_CERT}
        privateKey: {CLIENT_KEY}
"#
    )
}

const SECURE_MESH_RULE: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: secure-mesh, namespace: demo}
spec:
  host: secure-mesh.demo.svc.cluster.local
  trafficPolicy:
    tls: {mode: SIMPLE, sni: secure-mesh.example.com, caCertificates: /etc/ambientd-test/backend-ca.pem}
"#;

/// Every part of a policy Envoy must accept, on `tuned`'s ports.
const TUNED_RULE: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: tuned, namespace: demo}
spec:
  host: tuned.demo.svc.cluster.local
  trafficPolicy:
    loadBalancer: {consistentHash: {httpHeaderName: x-user}}
    connectionPool:
      tcp:
        maxConnections: 50
        connectTimeout: 2s
        tcpKeepalive: {probes: 3, time: 600s, interval: 30s}
        maxConnectionDuration: 1h
        idleTimeout: 15m
      http:
        http1MaxPendingRequests: 7
        http2MaxRequests: 70
        maxRequestsPerConnection: 3
        maxRetries: 4
        idleTimeout: 30s
    outlierDetection:
      consecutive5xxErrors: 3
      consecutiveGatewayErrors: 2
      interval: 5s
      baseEjectionTime: 30s
      maxEjectionPercent: 50
      minHealthPercent: 20
    portLevelSettings:
    - port: {number: 9000}
      loadBalancer: {simple: RANDOM}
      connectionPool: {tcp: {idleTimeout: 10m}}
    - port: {number: 7001}
      loadBalancer: {consistentHash: {httpHeaderName: x-user, ringHash: {minimumRingSize: 64}}}
      connectionPool: {http: {maxConcurrentStreams: 10}}
    - port: {number: 7002}
      loadBalancer: {consistentHash: {useSourceIp: true, maglev: {tableSize: 65537}}}
      connectionPool: {http: {useClientProtocol: true}}
    - port: {number: 7003}
      loadBalancer: {simple: PASSTHROUGH}
    - port: {number: 7004}
      loadBalancer: {simple: LEAST_REQUEST, warmupDurationSecs: 5s}
      tls: {mode: SIMPLE}
    - port: {number: 7005}
      loadBalancer: {simple: ROUND_ROBIN, warmup: {duration: 10s}}
      tls: {mode: SIMPLE, insecureSkipVerify: true}
      connectionPool: {http: {h2UpgradePolicy: UPGRADE}}
    - port: {number: 7006}
      tls:
        mode: MUTUAL
        clientCertificate: /etc/ambientd-test/client.pem
        privateKey: /etc/ambientd-test/client-key.pem
        subjectAltNames: [tuned.example.com]
      outlierDetection: {consecutive5xxErrors: 1, splitExternalLocalOriginErrors: true, consecutiveLocalOriginFailures: 2}
"#;

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn at(ip_text: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(ip_text), port)
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
async fn echo(client: &WorkloadCert, authority: &str, line: &str) -> Result<String, String> {
    let connection = HboneConnection::open(at("127.0.0.1", 15008), client)
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut tunnel = connection
        .connect(authority)
        .await
        .map_err(|e| format!("CONNECT {authority}: {e:?}"))?;
    tokio::time::timeout(Duration::from_secs(5), async {
        tunnel
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = vec![0u8; 256];
        let n = tunnel
            .read(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_string())
    })
    .await
    .map_err(|_| "no answer".to_string())?
}

/// Repeats `attempt` until `done` holds for its result; fails loudly on timeout.
async fn eventually<T: std::fmt::Debug, F, Fut>(
    what: &str,
    mut attempt: F,
    done: impl Fn(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
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

async fn metric(mesh: &MeshCa, name: &str) -> f64 {
    let (_, text) = crate::support::common::http_get(mesh.running.debug_address, "/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The active cluster `name` from a config dump.
fn cluster<'a>(dump: &'a Value, name: &str) -> &'a Value {
    envoy::sections(dump, "ClustersConfigDump")
        .into_iter()
        .flat_map(|s| {
            s["dynamic_active_clusters"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .map(|c| &c["cluster"])
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no active cluster {name}"))
}

/// The filter `name` of `main_internal`'s chain `chain` from a config dump.
fn chain_filter(dump: &Value, chain: &str, name: &str) -> Option<Value> {
    envoy::sections(dump, "ListenersConfigDump")
        .into_iter()
        .flat_map(|s| s["dynamic_listeners"].as_array().into_iter().flatten())
        .filter(|l| l["name"] == "main_internal")
        .flat_map(|l| {
            l["active_state"]["listener"]["filter_chains"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|c| c["name"] == chain)
        .flat_map(|c| c["filters"].as_array().cloned().unwrap_or_default())
        .find(|f| f["name"] == name)
}

fn tuned(port: u16, kind: &str) -> String {
    format!("inbound-vip|{port}|{kind}|tuned.demo.svc.cluster.local")
}

/// The UpstreamTlsContext inside a cluster's `internal_upstream` socket, if any.
fn inner_tls(cluster: &Value) -> Option<&Value> {
    let inner = &cluster["transport_socket"]["typed_config"]["transport_socket"];
    (inner["name"] == "envoy.transport_sockets.tls").then(|| &inner["typed_config"])
}

fn http_options(cluster: &Value) -> &Value {
    &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
}

#[tokio::test]
async fn destination_rules_at_a_real_envoy_waypoint() {
    let Some(binary) = envoy::envoy_binary() else {
        return;
    };
    let _port = envoy::exclusive().await;
    let manifests = Manifests::new(&[("mesh.yaml", MESH)]);
    let mesh = start_with_ca(manifests.root()).await;
    let waypoint = mesh.workload_cert("demo", "waypoint").await;
    let client = mesh.workload_cert("demo", "sleep").await;
    let secure_mesh_id = mesh.workload_cert("demo", "secure-mesh").await;

    // The backends, and the agent's SDS with the test CA and the waypoint's client cert.
    let ca = TestCa::new();
    let secure = HttpsApp::start(at("127.0.20.21", 8443), "secure", &ca, false).await;
    let secure_mtls = HttpsApp::start(at("127.0.20.21", 8444), "secure", &ca, true).await;
    let secure_mesh = HttpsApp::start(at("127.0.20.22", 8443), "secure-mesh", &ca, false).await;
    let secure_mesh_hbone = HboneServer::start(ip("127.0.20.22"), &secure_mesh_id).await;
    let _tuned_http = HttpApp::start(at("127.0.20.23", 8080), "tuned-1").await;
    let _tuned_echo = EchoApp::start(at("127.0.20.23", 9000), "tuned-1").await;
    let sds = SdsServer::start(&waypoint).await;
    let (client_chain, client_key) = ca.leaf("waypoint-client");
    sds.set(validation_context_secret(
        &format!("file-root:{BACKEND_CA}"),
        &ca.root_pem,
    ));
    sds.set(validation_context_secret("file-root:system", &ca.root_pem));
    sds.set(tls_certificate_secret(
        &format!("file-cert:{CLIENT_CERT}~{CLIENT_KEY}"),
        &client_chain,
        &client_key,
    ));

    let mut node = WaypointNode::new("demo", "waypoint");
    node.ip = "127.0.20.1".into();
    let envoy = Envoy::start(
        &binary,
        &EnvoyParams::new(mesh.running.xds_address, sds.address, node),
    )
    .await;
    envoy.wait_live().await;
    envoy
        .wait_until("the secure clusters", |dump| {
            envoy::active_clusters(dump)
                .iter()
                .any(|c| c == "inbound-vip|8080|http|secure.demo.svc.cluster.local")
        })
        .await;
    let lds_updates = envoy.stat("listener_manager.lds.update_success").await;

    // Without a rule the waypoint speaks plain HTTP to an HTTPS server: refused.
    let plain = eventually(
        "plain HTTP to the HTTPS backend fails",
        || get(&client, "127.0.30.21:8080", "/before"),
        Result::is_err,
    )
    .await;
    let plain = plain.unwrap_err();
    assert!(plain.starts_with("HTTP 50"), "{plain}");

    // SIMPLE: TLS with the rule's SNI, verified with the CA from SDS.
    manifests.write("secure-rule.yaml", &secure_rule(&[]));
    envoy
        .wait_until("TLS on the secure clusters", |dump| {
            envoy::active_clusters(dump)
                .iter()
                .any(|c| c == "inbound-vip|8080|http|secure.demo.svc.cluster.local")
                && inner_tls(cluster(
                    dump,
                    "inbound-vip|8080|http|secure.demo.svc.cluster.local",
                ))
                .is_some()
        })
        .await;
    let body = eventually(
        "TLS origination to the plain backend",
        || get(&client, "127.0.30.21:8080", "/a"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend secure path /a");
    let seen = secure.handshakes();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|h| h
            == &Handshake {
                sni: Some("secure.example.com".into()),
                client: None,
            }),
        "{seen:?}"
    );
    // MUTUAL on 8081 (port-level): the client certificate from the agent's files.
    let body = eventually(
        "mutual TLS origination",
        || get(&client, "127.0.30.21:8081", "/m"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend secure path /m");
    assert!(
        secure_mtls
            .handshakes()
            .iter()
            .all(|h| h.client.as_deref() == Some("waypoint-client")),
        "{:?}",
        secure_mtls.handshakes()
    );

    // The SAN check: a name the certificate lacks fails the handshake, its own passes.
    manifests.write("secure-rule.yaml", &secure_rule(&["other.example.com"]));
    let _ = eventually(
        "a SAN mismatch refused",
        || get(&client, "127.0.30.21:8080", "/b"),
        Result::is_err,
    )
    .await;
    manifests.write("secure-rule.yaml", &secure_rule(&["secure.example.com"]));
    let body = eventually(
        "the matching SAN accepted",
        || get(&client, "127.0.30.21:8080", "/c"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend secure path /c");

    // TLS inside the HBONE tunnel to a mesh pod.
    manifests.write("secure-mesh-rule.yaml", SECURE_MESH_RULE);
    let body = eventually(
        "TLS origination through HBONE",
        || get(&client, "127.0.30.22:8080", "/d"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend secure-mesh path /d");
    assert!(
        secure_mesh_hbone
            .connects()
            .iter()
            .any(|c| c.authority == "127.0.20.22:8443")
    );
    assert!(
        secure_mesh
            .handshakes()
            .iter()
            .any(|h| h.sni.as_deref() == Some("secure-mesh.example.com"))
    );

    // The rule removed: plain HTTP again, refused.
    manifests.remove("secure-rule.yaml");
    let _ = eventually(
        "the rule's removal",
        || get(&client, "127.0.30.21:8080", "/e"),
        Result::is_err,
    )
    .await;
    // TLS rules change clusters alone: no listener was sent again.
    assert_eq!(
        envoy.stat("listener_manager.lds.update_success").await,
        lds_updates
    );

    // Every part of a policy, accepted: active clusters, no NACK, as the dump shows them.
    manifests.write("tuned-rule.yaml", TUNED_RULE);
    let dump = envoy
        .wait_until("the tuned rule's clusters", |dump| {
            let active = envoy::active_clusters(dump);
            [
                tuned(8080, "http"),
                tuned(9000, "tcp"),
                tuned(7001, "http"),
                tuned(7002, "http"),
                tuned(7003, "tcp"),
                tuned(7004, "http"),
                tuned(7005, "http"),
                tuned(7006, "http"),
            ]
            .iter()
            .all(|name| active.contains(name))
                && cluster(dump, &tuned(8080, "http"))["outlier_detection"].is_object()
                && cluster(dump, &tuned(7006, "http"))["outlier_detection"].is_object()
                && chain_filter(dump, &tuned(9000, "tcp"), "envoy.filters.network.tcp_proxy")
                    .is_some_and(|f| f["typed_config"]["idle_timeout"] == "900s")
        })
        .await;
    // The top level reaches the chains: the HTTP route hashes by the header, the TCP proxy
    // takes the idle timeout and the connection duration.
    let manager = chain_filter(
        &dump,
        &tuned(8080, "http"),
        "envoy.filters.network.http_connection_manager",
    )
    .expect("the HTTP chain's manager");
    let route = &manager["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0];
    assert_eq!(
        route["route"]["hash_policy"][0]["header"]["header_name"],
        "x-user"
    );
    let proxy = chain_filter(
        &dump,
        &tuned(9000, "tcp"),
        "envoy.filters.network.tcp_proxy",
    )
    .expect("the TCP chain's proxy");
    assert_eq!(
        proxy["typed_config"]["max_downstream_connection_duration"],
        "3600s"
    );
    let http = cluster(&dump, &tuned(8080, "http"));
    assert_eq!(http["lb_policy"], "RING_HASH");
    assert_eq!(http["ring_hash_lb_config"]["minimum_ring_size"], "1024");
    assert_eq!(http["connect_timeout"], "2s");
    let thresholds = &http["circuit_breakers"]["thresholds"][0];
    assert_eq!(thresholds["max_connections"], 50);
    assert_eq!(thresholds["max_pending_requests"], 7);
    assert_eq!(thresholds["max_requests"], 70);
    assert_eq!(thresholds["max_retries"], 4);
    let outlier = &http["outlier_detection"];
    assert_eq!(outlier["consecutive_5xx"], 3);
    assert_eq!(outlier["enforcing_consecutive_5xx"], 100);
    assert_eq!(outlier["consecutive_gateway_failure"], 2);
    assert_eq!(outlier["interval"], "5s");
    assert_eq!(outlier["base_ejection_time"], "30s");
    assert_eq!(outlier["max_ejection_percent"], 50);
    assert_eq!(outlier["enforcing_success_rate"], 0);
    assert_eq!(
        http["common_lb_config"]["healthy_panic_threshold"]["value"],
        20.0
    );
    let keepalive = &http["upstream_connection_options"]["tcp_keepalive"];
    assert_eq!(
        (
            &keepalive["keepalive_probes"],
            &keepalive["keepalive_time"],
            &keepalive["keepalive_interval"]
        ),
        (&Value::from(3), &Value::from(600), &Value::from(30))
    );
    let common = &http_options(http)["common_http_protocol_options"];
    assert_eq!(common["idle_timeout"], "30s");
    assert_eq!(common["max_requests_per_connection"], 3);
    assert_eq!(common["max_connection_duration"], "3600s");
    assert_eq!(
        http["metadata"]["filter_metadata"]["istio"]["config"],
        "/apis/networking.istio.io/v1/namespaces/demo/destination-rule/tuned"
    );
    // Port-level settings replace the top level for their port.
    let tcp = cluster(&dump, &tuned(9000, "tcp"));
    assert_eq!(tcp["lb_policy"], "RANDOM");
    assert_eq!(tcp["connect_timeout"], "10s");
    assert!(tcp.get("outlier_detection").is_none());
    assert_eq!(
        http_options(tcp)["common_http_protocol_options"]["idle_timeout"],
        "600s"
    );
    let ring = cluster(&dump, &tuned(7001, "http"));
    assert_eq!(ring["lb_policy"], "RING_HASH");
    assert_eq!(ring["ring_hash_lb_config"]["minimum_ring_size"], "64");
    assert_eq!(
        http_options(ring)["explicit_http_config"]["http2_protocol_options"]["max_concurrent_streams"],
        10
    );
    let maglev = cluster(&dump, &tuned(7002, "http"));
    assert_eq!(maglev["lb_policy"], "MAGLEV");
    assert_eq!(maglev["maglev_lb_config"]["table_size"], "65537");
    assert!(http_options(maglev)["use_downstream_protocol_config"].is_object());
    let passthrough = cluster(&dump, &tuned(7003, "tcp"));
    assert_eq!(passthrough["type"], "ORIGINAL_DST");
    assert_eq!(passthrough["lb_policy"], "CLUSTER_PROVIDED");
    let auto_sni = cluster(&dump, &tuned(7004, "http"));
    assert_eq!(auto_sni["lb_policy"], "LEAST_REQUEST");
    let upstream = &http_options(auto_sni)["upstream_http_protocol_options"];
    assert_eq!(
        (&upstream["auto_sni"], &upstream["auto_san_validation"]),
        (&Value::from(true), &Value::from(true))
    );
    let tls = inner_tls(auto_sni).expect("TLS origination on 7004");
    assert_eq!(
        tls["common_tls_context"]["combined_validation_context"]["validation_context_sds_secret_config"]
            ["name"],
        "file-root:system"
    );
    let upgraded = cluster(&dump, &tuned(7005, "http"));
    // ROUND_ROBIN is the enum's zero: the dump leaves it out.
    assert!(
        upgraded.get("lb_policy").is_none_or(|p| p == "ROUND_ROBIN"),
        "{upgraded}"
    );
    assert_eq!(
        upgraded["round_robin_lb_config"]["slow_start_config"]["slow_start_window"],
        "10s"
    );
    assert!(http_options(upgraded)["explicit_http_config"]["http2_protocol_options"].is_object());
    let insecure = inner_tls(upgraded).expect("TLS on 7005");
    assert!(insecure["common_tls_context"]["validation_context"].is_object());
    assert_eq!(insecure["common_tls_context"]["alpn_protocols"][0], "h2");
    let mutual = cluster(&dump, &tuned(7006, "http"));
    let tls = inner_tls(mutual).expect("TLS on 7006");
    assert_eq!(
        tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["name"],
        format!("file-cert:{CLIENT_CERT}~{CLIENT_KEY}")
    );
    assert_eq!(
        mutual["outlier_detection"]["consecutive_local_origin_failure"],
        2
    );
    assert_eq!(
        mutual["outlier_detection"]["split_external_local_origin_errors"],
        true
    );
    // And the tuned service still answers on HTTP and TCP.
    let body = eventually(
        "HTTP to tuned",
        || get(&client, "127.0.30.23:8080", "/t"),
        Result::is_ok,
    )
    .await;
    assert_eq!(body.unwrap(), "backend tuned-1 path /t");
    let line = eventually(
        "TCP to tuned",
        || echo(&client, "127.0.30.23:9000", "hi"),
        Result::is_ok,
    )
    .await;
    assert_eq!(line.unwrap(), "tuned-1: hi");

    // No NACK anywhere, and no rule change touched a listener.
    assert_eq!(
        envoy.stat("cluster_manager.cds.update_rejected").await,
        Some(0)
    );
    assert_eq!(
        envoy.stat("listener_manager.lds.update_rejected").await,
        Some(0)
    );
    assert_eq!(metric(&mesh, "pilot_total_xds_rejects").await, 0.0);
    assert!(sds.nacks().is_empty(), "{:?}", sds.nacks());
}
