//! Overload: every limit (docs/xds.md and docs/ca.md, "Limits") at its value (served) and just
//! past it (refused with a gRPC status that names the limit), and a CSR flood from one caller
//! refused beyond its share while another caller is served. Figures are in the scale harness
//! (T9) and `benches/ca.rs`, BENCHMARKS.md "Overload".

use crate::support::ca as ca_support;
use crate::support::common as support;

use std::sync::Arc;

use ambientd::ca::limit::CsrLimits;
use ambientd::ca::service::MAX_CSR_REQUEST_BYTES;
use ambientd::ca::{CaConfig, PodInfo, StaticPods};
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::istio::v1::auth::IstioCertificateRequest;
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ambientd::pb::xds::DeltaDiscoveryRequest;
use ambientd::push::route::MAX_REQUEST_BYTES;
use ambientd::push::subscription::MAX_SUBSCRIBED_NAMES;
use prost::Message;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";
const DB: &str = "spiffe://cluster.local/ns/demo/sa/db";

// ---------------------------------------------------------------------------------------------
// The CA on 15012

struct Ca {
    _dir: tempfile::TempDir,
    channel: tonic::transport::Channel,
    client: IstioCertificateServiceClient<tonic::transport::Channel>,
    /// ztunnel on node-a (may ask for `web`) and on node-b (may ask for `db`).
    token_a: String,
    token_b: String,
    metrics: Arc<ambientd::metrics::Metrics>,
    shutdown: CancellationToken,
    _snapshots: tokio::sync::watch::Sender<Option<Arc<ambientd::discovery::Snapshot>>>,
}

impl Drop for Ca {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start_ca(limits: CsrLimits) -> Ca {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let mut config = CaConfig::local(&ca_dir);
    config.csr_limits = limits;
    let metrics = config.metrics.clone();
    let mut pods = StaticPods::default();
    let pod = |sa: &str, node: &str| PodInfo {
        service_account: sa.into(),
        node: node.into(),
        uid: None,
    };
    pods.insert("demo", "web-1", pod("web", "node-a"));
    pods.insert("demo", "db-1", pod("db", "node-b"));
    let ca_support::Started {
        address,
        shutdown,
        snapshots: tx,
    } = ca_support::start_server(&config, pods).await;
    let tls = ca_support::ztunnel_tls(&config.root_cert_path());
    let channel = ca_support::channel(address, tls, ca_support::ISTIOD)
        .await
        .expect("connect");
    let token =
        |node| ca_support::local_token(&ca_dir, "istio-system", "ztunnel", None, Some(node));
    Ca {
        token_a: token("node-a"),
        token_b: token("node-b"),
        _dir: dir,
        client: IstioCertificateServiceClient::new(channel.clone()),
        channel,
        metrics,
        shutdown,
        _snapshots: tx,
    }
}

/// ztunnel on node-a asking for `web`'s certificate.
fn web_request(ca: &Ca) -> tonic::Request<IstioCertificateRequest> {
    let (_key, csr) = ca_support::ztunnel_csr(WEB);
    ca_support::csr_request(&csr, Some(&ca.token_a), Some(WEB))
}

/// A metric's value in the Prometheus text, `None` if the series is absent.
fn metric(metrics: &ambientd::metrics::Metrics, series: &str) -> Option<f64> {
    metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// One caller sends 200 CSRs at once: beyond its 4 in flight each is refused at once with
/// `RESOURCE_EXHAUSTED` saying why and when to retry, counted in `ambientd_csr_refused`;
/// another caller is served during the flood; and once the flood is over the flooding caller
/// is served again.
#[tokio::test]
async fn a_csr_flood_from_one_caller_is_refused_beyond_its_share() {
    let ca = start_ca(CsrLimits::new(4, 64, 1)).await;
    let flood: Vec<_> = (0..200)
        .map(|_| {
            let mut client = ca.client.clone();
            let request = web_request(&ca);
            tokio::spawn(async move { client.create_certificate(request).await })
        })
        .collect();
    // Another ztunnel, during the flood.
    let (_key, csr) = ca_support::ztunnel_csr(DB);
    let mut client = ca.client.clone();
    let other =
        client.create_certificate(ca_support::csr_request(&csr, Some(&ca.token_b), Some(DB)));
    let other = tokio::time::timeout(ca_support::WAIT, other)
        .await
        .expect("the other caller's CSR timed out");
    assert!(other.is_ok(), "the other caller was refused: {other:?}");

    let (mut signed, mut refused) = (0, 0);
    for task in flood {
        match tokio::time::timeout(ca_support::WAIT, task)
            .await
            .expect("a flood CSR timed out")
            .unwrap()
        {
            Ok(response) => {
                assert_eq!(response.into_inner().cert_chain.len(), 2);
                signed += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("4, the limit per caller")
                        && status.message().contains("retry"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
        }
    }
    assert!(signed >= 4, "only {signed} signed");
    assert!(
        refused > 0,
        "nothing refused: the flood was never over 4 in flight"
    );
    assert_eq!(signed + refused, 200);
    assert_eq!(
        metric(&ca.metrics, "ambientd_csr_refused{reason=\"caller\"}"),
        Some(refused as f64)
    );
    assert_eq!(
        metric(&ca.metrics, "citadel_server_success_cert_issuance_count"),
        Some(signed as f64 + 1.0)
    );
    // Over: the caller is served again.
    let again = ca.client.clone().create_certificate(web_request(&ca)).await;
    assert!(again.is_ok(), "{again:?}");
}

/// The CA's limit on requests in flight from every caller together.
#[tokio::test]
async fn the_cas_total_limit_refuses_every_caller_with_its_own_message() {
    let ca = start_ca(CsrLimits::new(100, 2, 1)).await;
    let flood: Vec<_> = (0..100)
        .map(|i| {
            let mut client = ca.client.clone();
            let request = if i % 2 == 0 {
                web_request(&ca)
            } else {
                let (_key, csr) = ca_support::ztunnel_csr(DB);
                ca_support::csr_request(&csr, Some(&ca.token_b), Some(DB))
            };
            tokio::spawn(async move { client.create_certificate(request).await })
        })
        .collect();
    let mut refused = 0;
    for task in flood {
        if let Err(status) = task.await.unwrap() {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            assert!(
                status
                    .message()
                    .contains("the CA has 2 certificate requests in flight"),
                "{}",
                status.message()
            );
            refused += 1;
        }
    }
    assert!(refused > 0, "nothing refused");
    assert_eq!(
        metric(&ca.metrics, "ambientd_csr_refused{reason=\"total\"}"),
        Some(refused as f64)
    );
}

/// A CSR request of exactly `MAX_CSR_REQUEST_BYTES` is signed; one byte more is refused with
/// `OUT_OF_RANGE` (tonic's decoder) naming the limit, before it is authenticated.
#[tokio::test]
async fn a_csr_request_at_the_size_limit_is_served_and_over_it_refused() {
    let ca = start_ca(CsrLimits::default()).await;
    let sized = |bytes: usize| {
        let mut request = web_request(&ca);
        // Trailing newlines after the PEM block: still the same CSR.
        let base = request.get_ref().encoded_len();
        request.get_mut().csr.push_str(&"\n".repeat(bytes - base));
        // The field's length prefix may have grown by a byte or two.
        while request.get_ref().encoded_len() > bytes {
            request.get_mut().csr.pop();
        }
        assert_eq!(request.get_ref().encoded_len(), bytes);
        request
    };
    let served = ca
        .client
        .clone()
        .create_certificate(sized(MAX_CSR_REQUEST_BYTES))
        .await;
    assert!(served.is_ok(), "{served:?}");
    let refused = ca
        .client
        .clone()
        .create_certificate(sized(MAX_CSR_REQUEST_BYTES + 1))
        .await
        .unwrap_err();
    // tonic's decoder says OUT_OF_RANGE.
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(
        refused
            .message()
            .contains(&MAX_CSR_REQUEST_BYTES.to_string()),
        "{}",
        refused.message()
    );
}

/// Headers: a request whose header block fits the 16 KiB limit is served; a larger one is
/// refused before any handler runs (HTTP 431, which the gRPC client reports with that status).
#[tokio::test]
async fn request_headers_over_the_limit_are_refused() {
    let ca = start_ca(CsrLimits::default()).await;
    let with_header = |bytes: usize| {
        let mut request = web_request(&ca);
        request
            .metadata_mut()
            .insert("x-padding", "x".repeat(bytes).parse().unwrap());
        request
    };
    let served = ca
        .client
        .clone()
        .create_certificate(with_header(12 * 1024))
        .await;
    assert!(served.is_ok(), "{served:?}");
    let refused = ca
        .client
        .clone()
        .create_certificate(with_header(17 * 1024))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unknown, "{refused:?}");
    assert!(refused.message().contains("431"), "{}", refused.message());
}

// ---------------------------------------------------------------------------------------------
// Delta ADS on 15010

/// A wildcard initial request of exactly `bytes` encoded bytes: padded with the version of one
/// known resource the server does not have.
fn request_of(bytes: usize) -> DeltaDiscoveryRequest {
    let mut request = DeltaDiscoveryRequest {
        node: Some(support::ztunnel_node("node-a")),
        type_url: ADDRESS_TYPE.to_string(),
        ..Default::default()
    };
    let base = request.encoded_len();
    let mut version = "0".repeat(bytes - base - 32);
    loop {
        request.initial_resource_versions =
            [("Kubernetes//Pod/demo/padding".to_string(), version.clone())].into();
        let len = request.encoded_len();
        if len == bytes {
            return request;
        }
        if len < bytes {
            version.push('0');
        } else {
            version.pop();
        }
    }
}

/// A DeltaDiscoveryRequest of exactly `MAX_REQUEST_BYTES` (64 MiB) is served; one byte more
/// ends the stream with `RESOURCE_EXHAUSTED` naming the limit.
#[tokio::test]
async fn an_xds_request_at_the_size_limit_is_served_and_over_it_refused() {
    let mesh = crate::support::xds::mesh();
    let running = support::start(mesh.root()).await;

    let mut at = support::XdsClient::connect(&running).await;
    at.send(request_of(MAX_REQUEST_BYTES)).await;
    let response = at.recv().await;
    assert_eq!(response.type_url, ADDRESS_TYPE);
    assert!(!response.resources.is_empty());
    // The padding resource, unknown to the server, is removed.
    assert!(
        response
            .removed_resources
            .contains(&"Kubernetes//Pod/demo/padding".to_string()),
        "{:?}",
        response.removed_resources
    );
    drop(at);

    let mut over = support::XdsClient::connect(&running).await;
    over.send(request_of(MAX_REQUEST_BYTES + 1)).await;
    let status = match over.next().await {
        Err(status) => status,
        other => panic!("expected the stream to end with a status, got {other:?}"),
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains(&MAX_REQUEST_BYTES.to_string()),
        "{}",
        status.message()
    );
    running.stop().await;
}

/// On-demand names, `count` of them starting at `from`, that name nothing in the mesh (as a
/// ztunnel's lookups of addresses outside it).
fn names(from: usize, count: usize) -> Vec<String> {
    (from..from + count)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect()
}

/// An on-demand first request: `subscribe: [*, names…], unsubscribe: [*]`.
fn on_demand(subscribe: Vec<String>) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(support::ztunnel_node("node-a")),
        type_url: ADDRESS_TYPE.to_string(),
        resource_names_subscribe: [vec!["*".to_string()], subscribe].concat(),
        resource_names_unsubscribe: vec!["*".to_string()],
        ..Default::default()
    }
}

fn assert_too_many_names(status: &tonic::Status, would_hold: usize) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let message = status.message();
    assert!(
        message.contains(&format!("{would_hold} names"))
            && message.contains(&format!("limit of {MAX_SUBSCRIBED_NAMES} per stream")),
        "{message}"
    );
}

/// A stream may subscribe to `MAX_SUBSCRIBED_NAMES` on-demand names, in one request or in
/// increments, and each request is answered; a request that would take it past the limit ends
/// the stream with `RESOURCE_EXHAUSTED` naming the limit, counted in
/// `ambientd_xds_refused`. A first request over the limit is refused the same way.
#[tokio::test]
async fn subscribed_names_are_capped_per_stream() {
    let mesh = crate::support::xds::mesh();
    let running = support::start(mesh.root()).await;
    let refused = |running: &ambientd::app::Running| {
        metric(
            &running.metrics,
            "ambientd_xds_refused{reason=\"subscribed_names\"}",
        )
    };

    // In one request: at the limit.
    let mut client = support::XdsClient::connect(&running).await;
    client.send(on_demand(names(0, MAX_SUBSCRIBED_NAMES))).await;
    let first = client.recv().await;
    assert_eq!(first.type_url, ADDRESS_TYPE);
    client.ack(&first).await;
    // A name already held does not count again; a new one is one too many.
    client.look_up(&names(0, 1)[0]).await;
    let again = client.recv().await;
    client.ack(&again).await;
    client.look_up("10.250.0.1").await;
    let status = loop {
        match client.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_too_many_names(&status, MAX_SUBSCRIBED_NAMES + 1);
    assert_eq!(refused(&running), Some(1.0));

    // In increments of 25,000: each answered, then one request too many.
    let mut client = support::XdsClient::connect(&running).await;
    client.send(on_demand(Vec::new())).await;
    let first = client.recv().await;
    client.ack(&first).await;
    let step = MAX_SUBSCRIBED_NAMES / 4;
    for i in 0..4 {
        client
            .send(DeltaDiscoveryRequest {
                type_url: ADDRESS_TYPE.to_string(),
                resource_names_subscribe: names(i * step, step),
                ..Default::default()
            })
            .await;
        let response = client.recv().await;
        client.ack(&response).await;
    }
    client
        .send(DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.to_string(),
            resource_names_subscribe: names(MAX_SUBSCRIBED_NAMES - 10, 20),
            ..Default::default()
        })
        .await;
    let status = loop {
        match client.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_too_many_names(&status, MAX_SUBSCRIBED_NAMES + 10);

    // A first request over the limit; the Authorization type has its own count.
    let mut client = support::XdsClient::connect(&running).await;
    client
        .send(DeltaDiscoveryRequest {
            node: Some(support::ztunnel_node("node-a")),
            type_url: AUTHORIZATION_TYPE.to_string(),
            ..Default::default()
        })
        .await;
    client
        .send(on_demand(names(0, MAX_SUBSCRIBED_NAMES + 1)))
        .await;
    let status = loop {
        match client.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_too_many_names(&status, MAX_SUBSCRIBED_NAMES + 1);
    assert_eq!(refused(&running), Some(3.0));
    running.stop().await;
}

/// A proxy that reads nothing is dropped after the idle timeout even when nothing changes: its
/// unread, unanswered responses (the initial sync, megabytes in a large mesh, held in HTTP/2's
/// buffers) are not held for the stream's life. A proxy that reads and answers stays.
#[tokio::test]
async fn a_proxy_that_reads_nothing_is_dropped_without_any_change() {
    use crate::support::xds::pod;
    use std::time::Duration;
    // Enough pods that the initial response overflows the stuck client's window: the proxy
    // neither reads it nor answers it.
    let mesh = crate::support::xds::bulk_mesh();
    let mut config = ambientd::config::Config::local(mesh.root());
    config.stream_idle_timeout = Some(Duration::from_millis(500));
    let running = ambientd::app::start(config).await.expect("start");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(support::WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("not ready in time")
        .unwrap();
    let mut healthy = support::XdsClient::connect(&running).await;
    healthy
        .subscribe_wildcard(std::collections::BTreeMap::new())
        .await;
    healthy.initial_sync().await;
    // A 64 KiB window: the initial response (over 64 KiB) stalls at once.
    let stuck = support::XdsClient::connect_with_window(&running, Some(65_535)).await;
    stuck
        .subscribe_wildcard(std::collections::BTreeMap::new())
        .await;
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while running.registry.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stuck stream never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = tokio::time::Instant::now();
    while running.registry.len() > 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stuck stream was never dropped ({} streams)",
            running.registry.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "dropped before the idle timeout"
    );
    // The healthy stream is still served.
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v9"));
    let update = healthy.recv().await;
    assert_eq!(support::names(&update), vec![crate::support::xds::DB_1]);
    drop(stuck);
    running.stop().await;
}

/// On 15012 the guard reads the first request's length before its node: a request over the
/// ADS limit is refused there, with the same status.
#[tokio::test]
async fn an_xds_request_over_the_size_limit_is_refused_on_15012_too() {
    use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let ca = start_ca(CsrLimits::default()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(request_of(MAX_REQUEST_BYTES + 1)).await.unwrap();
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {}", ca.token_a).parse().unwrap(),
    );
    let mut client = AggregatedDiscoveryServiceClient::new(ca.channel.clone());
    let opened = tokio::time::timeout(ca_support::WAIT, client.delta_aggregated_resources(request))
        .await
        .expect("no answer in time");
    let status = match opened {
        Err(status) => status,
        Ok(response) => {
            let mut responses = response.into_inner();
            tokio::time::timeout(ca_support::WAIT, responses.message())
                .await
                .expect("no status in time")
                .expect_err("the request was not refused")
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains(&MAX_REQUEST_BYTES.to_string()),
        "{}",
        status.message()
    );
    drop(tx);
}

/// A proxy that reads slowly is not dropped: reading its initial sync takes longer than the
/// idle timeout, but every piece it reads is progress. It gets both initial responses whole,
/// and answers each, as ztunnel does. On 15010 here; over TLS on 15012 (ztunnel's port) below.
#[tokio::test]
async fn a_proxy_that_reads_slowly_is_not_dropped() {
    let (_mesh, config) = slow_reader_mesh();
    let running = ambientd::app::start(config).await.expect("start");
    wait_ready(&running).await;
    let tcp = tokio::net::TcpStream::connect(running.xds_address)
        .await
        .unwrap();
    let _stream = read_slowly(tcp, &running.xds_address.to_string(), None).await;
    tokio::time::sleep(3 * SLOW_READER_IDLE).await;
    assert_eq!(running.registry.len(), 1);
    running.stop().await;
}

#[tokio::test]
async fn a_proxy_that_reads_slowly_over_tls_is_not_dropped() {
    let (_mesh, mut config) = slow_reader_mesh();
    let ca_dir = tempfile::tempdir().unwrap();
    config.ca = Some(CaConfig::local(ca_dir.path()));
    let running = ambientd::app::start(config).await.expect("start");
    wait_ready(&running).await;
    let address = running.xds_tls_address.expect("15012");
    let tls = ca_support::ztunnel_tls(&ca_dir.path().join("root-cert.pem"));
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(ca_support::ISTIOD).unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS to 15012");
    let token = ca_support::local_token(
        ca_dir.path(),
        "istio-system",
        "ztunnel",
        None,
        Some("node-a"),
    );
    let _stream = read_slowly(
        stream,
        &format!("{}:15012", ca_support::ISTIOD),
        Some(token),
    )
    .await;
    tokio::time::sleep(3 * SLOW_READER_IDLE).await;
    assert_eq!(running.registry.len(), 1);
    running.stop().await;
}

/// The slow readers' idle timeout.
const SLOW_READER_IDLE: std::time::Duration = std::time::Duration::from_millis(250);

/// 2,000 pods (in files of 500): an initial Address response of about 450 KB; the config
/// with [`SLOW_READER_IDLE`].
fn slow_reader_mesh() -> (support::Manifests, ambientd::config::Config) {
    use crate::support::xds::{mesh as small_mesh, pod, pods};
    let mesh = small_mesh();
    for file in 0..4 {
        let many: Vec<String> = (file * 500..file * 500 + 500)
            .map(|i| {
                let ip = format!("10.245.{}.{}", i / 200, i % 200 + 1);
                pod(&format!("bulk-{i}"), &ip, "bulk", "v1")
            })
            .collect();
        mesh.write(&format!("pods/bulk-{file}.yaml"), &pods(&many));
    }
    let mut config = ambientd::config::Config::local(mesh.root());
    config.stream_idle_timeout = Some(SLOW_READER_IDLE);
    (mesh, config)
}

async fn wait_ready(running: &ambientd::app::Running) {
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(support::WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("not ready in time")
        .unwrap();
}

/// Raw HTTP/2 over `io` with a 16 KiB window, reading at about 500 KiB/s (a 64 KiB piece
/// every 120 ms), ACKing each response: both initial responses must come whole, over longer
/// than twice the idle timeout.
async fn read_slowly<T>(
    io: T,
    authority: &str,
    token: Option<String>,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    h2::SendStream<bytes::Bytes>,
    h2::RecvStream,
)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use bytes::Buf;
    use std::time::Duration;
    let (send, connection) = h2::client::Builder::new()
        .initial_window_size(16 * 1024)
        .initial_connection_window_size(16 * 1024)
        .handshake::<_, bytes::Bytes>(io)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut send = send.ready().await.unwrap();
    let mut request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!(
            "https://{authority}/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let (response, mut requests) = send.send_request(request.body(()).unwrap(), false).unwrap();
    let frame = |request: DeltaDiscoveryRequest| {
        let mut out = vec![0];
        out.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
        out.extend_from_slice(&request.encode_to_vec());
        bytes::Bytes::from(out)
    };
    for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
        let initial = DeltaDiscoveryRequest {
            node: Some(support::ztunnel_node("node-a")),
            type_url: type_url.to_string(),
            ..Default::default()
        };
        requests.send_data(frame(initial), false).unwrap();
    }
    let mut body = tokio::time::timeout(support::WAIT, response)
        .await
        .expect("no response headers")
        .unwrap()
        .into_body();
    let started = std::time::Instant::now();
    let (mut pending, mut bytes, mut types) = (bytes::BytesMut::new(), 0, Vec::new());
    while types.len() < 2 {
        let Some(chunk) = tokio::time::timeout(support::WAIT, body.data())
            .await
            .expect("no data in time")
        else {
            let trailers = body.trailers().await;
            panic!("the stream ended after {bytes} B: the slow proxy was dropped ({trailers:?})");
        };
        let chunk = chunk.expect("the stream failed: the slow proxy was dropped");
        bytes += chunk.len();
        // A slow link, not a slow parser: the time is per byte (30 ms per 16 KiB, about
        // 500 KiB/s), so frames cut small by a small window cost no more than their bytes.
        tokio::time::sleep(Duration::from_micros(30_000 * chunk.len() as u64 / 16_384)).await;
        let _ = body.flow_control().release_capacity(chunk.len());
        pending.extend_from_slice(&chunk);
        while pending.len() >= 5 {
            let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
            if pending.len() < 5 + len {
                break;
            }
            pending.advance(5);
            let response = ambientd::pb::xds::DeltaDiscoveryResponse::decode(pending.split_to(len))
                .expect("a whole response");
            let ack = DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            };
            requests.send_data(frame(ack), false).unwrap();
            types.push(response.type_url.clone());
        }
    }
    assert_eq!(types, [ADDRESS_TYPE, AUTHORIZATION_TYPE]);
    assert!(
        started.elapsed() > 2 * SLOW_READER_IDLE,
        "read {bytes} B in {:?}: not slow enough to test anything",
        started.elapsed()
    );
    (send, requests, body)
}
