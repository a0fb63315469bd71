//! SIGTERM on the real binary: it stops accepting, ends the open delta ADS stream (the proxy
//! sees the stream end and reconnects elsewhere), lets a certificate request that is in flight
//! finish, and exits 0 well within its grace period.

use crate::support::ca as ca_support;
use crate::support::common as support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ambientd::pb::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
use ca_support::*;
use support::XdsClient;

const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: demo, labels: {app: web}}
spec: {serviceAccountName: web, nodeName: node-a, containers: [{name: main}]}
status: {phase: Running, podIP: 10.244.1.10, conditions: [{type: Ready, status: "True"}]}
"#;

const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";
const GRACE: Duration = Duration::from_secs(8);

/// A port free right now on 127.0.0.1 (bound, then released for the binary to take).
fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// Kills the child if the test fails before it exits.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_ready(debug: SocketAddr) {
    let deadline = Instant::now() + WAIT;
    loop {
        if tokio::net::TcpStream::connect(debug).await.is_ok()
            && support::http_get(debug, "/ready").await.0 == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "ambientd never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_ends_streams_lets_a_csr_finish_and_exits_zero_within_the_grace() {
    let manifests = support::Manifests::new(&[("mesh.yaml", MESH)]);
    let ca_dir = tempfile::tempdir().unwrap();
    let (xds, tls, debug) = (free_port(), free_port(), free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_ambientd"))
        .arg("serve")
        .arg("--manifests")
        .arg(manifests.root())
        .arg("--ca-dir")
        .arg(ca_dir.path())
        .args(["--xds-address", &xds.to_string()])
        .args(["--xds-tls-address", &tls.to_string()])
        .args(["--debug-address", &debug.to_string()])
        .args(["--shutdown-grace", &format!("{}s", GRACE.as_secs())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the ambientd binary");
    let mut process = Process(child);
    wait_ready(debug).await;

    // A proxy with an open, synced stream.
    let mut proxy = XdsClient::connect_to(xds, |e| e).await;
    proxy.subscribe_wildcard(BTreeMap::new()).await;
    proxy.initial_sync().await;

    // A certificate request whose headers are sent but whose body is held back: in flight.
    let tls_config = ztunnel_tls(&ca_dir.path().join("root-cert.pem"));
    let channel = channel(tls, tls_config, ISTIOD).await.expect("TLS connect");
    let token = local_token(
        ca_dir.path(),
        "istio-system",
        "ztunnel",
        None,
        Some("node-a"),
    );
    let (_key, csr) = ztunnel_csr(WEB);
    let unary = csr_request(&csr, Some(&token), Some(WEB));
    let (metadata, extensions, message) = unary.into_parts();
    let (release, held) = tokio::sync::oneshot::channel::<()>();
    let body = futures::stream::once(async move {
        let _ = held.await;
        message
    });
    let request = tonic::Request::from_parts(metadata, extensions, body);
    let csr_call = tokio::spawn(async move {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("CA channel ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/istio.v1.auth.IstioCertificateService/CreateCertificate",
        );
        let codec =
            tonic_prost::ProstCodec::<IstioCertificateRequest, IstioCertificateResponse>::default();
        grpc.client_streaming(request, path, codec).await
    });
    // Let the request's headers reach the server (if they did not, the CSR fails: no false pass).
    tokio::time::sleep(Duration::from_millis(300)).await;

    let signalled = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &process.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(kill.success());

    // The stream ends with Unavailable "transport is closing", as grpc-go's draining server
    // ends it (ztunnel reconnects after 10 ms, without a warning), well before the grace period.
    match proxy.next().await {
        Err(status)
            if status.code() == tonic::Code::Unavailable
                && status.message() == "transport is closing" => {}
        other => panic!("expected the stream to end with Unavailable, got {other:?}"),
    }
    let ended = signalled.elapsed();
    assert!(ended < GRACE / 2, "the stream ended only after {ended:?}");

    // The certificate request, released during the shutdown, is still answered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    release.send(()).expect("the CSR body is still wanted");
    let response = tokio::time::timeout(WAIT, csr_call)
        .await
        .expect("the in-flight CSR was not answered in time")
        .expect("CSR task")
        .expect("the in-flight CSR is signed during shutdown")
        .into_inner();
    assert_eq!(
        verify_chain(&response.cert_chain).uris,
        vec![WEB.to_string()]
    );

    // The process exits 0, without waiting out the grace period.
    let status = loop {
        if let Some(status) = process.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            signalled.elapsed() < GRACE,
            "ambientd did not exit within its {GRACE:?} grace period"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let exited = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(exited < GRACE / 2, "exited only after {exited:?}");

    // Nothing accepts connections any more.
    assert!(tokio::net::TcpStream::connect(xds).await.is_err());
}
