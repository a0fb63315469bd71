//! SIGTERM on the real binary: it stops accepting, ends the open delta ADS stream (the proxy
//! sees the stream end and reconnects elsewhere), lets a certificate request that is in flight
//! finish, and exits 0 well within its grace period.

use crate::support::ca as ca_support;
use crate::support::common as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::process::Replica;
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

#[tokio::test]
async fn sigterm_ends_streams_lets_a_csr_finish_and_exits_zero_within_the_grace() {
    let manifests = support::Manifests::new(&[("mesh.yaml", MESH)]);
    let ca_dir = tempfile::tempdir().unwrap();
    let mut process = Replica::start(manifests.root(), ca_dir.path(), GRACE).await;
    let (xds, tls) = (process.xds, process.tls);

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
    process.signal("TERM");

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
    let status = process
        .exit_by(
            signalled + GRACE,
            &format!("within its {GRACE:?} grace period"),
        )
        .await;
    let exited = signalled.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(exited < GRACE / 2, "exited only after {exited:?}");

    // Nothing accepts connections any more.
    assert!(tokio::net::TcpStream::connect(xds).await.is_err());
}
