//! The ADS decoders: delta requests (`DeltaAggregatedResources`, ztunnel's and waypoints'
//! streams, framed and decoded by `push::route`, then each request's subscription, known
//! versions and on-demand names handled by its connection) and state-of-the-world requests
//! (`StreamAggregatedResources`: tonic's decoder, then istiod's debug types).
//!
//! Each input is a request body (gRPC frames: a zero byte, a 4-byte length, the message) sent
//! on both ports as the server wires them: 15010 (the ADS service alone) and 15012 (the guard
//! in front of it, with ztunnel's token; this one node-scoped, as with `--scope-to-node`,
//! so that both modes are run). The servers answer from the bookinfo example's snapshot; the
//! input is delivered in 512-byte chunks, as HTTP/2 data frames split a body.

use std::convert::Infallible;
use std::sync::{Arc, LazyLock};

use ambientd::ca::XdsGuard;
use ambientd::debug::DebugState;
use ambientd::debug::xds::DebugXds;
use ambientd::discovery::{Index, Settings, Snapshot};
use ambientd::metrics::Metrics;
use ambientd::pb::xds::DeltaDiscoveryResponse;
use ambientd::push::route::AdsService;
use ambientd::push::{AdsServer, Registry};
use bytes::Bytes;
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;
use tonic::codegen::Service;

use crate::{ca, runtime};

pub const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";
pub const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

struct Servers {
    /// 15010.
    plain: AdsService,
    /// 15012.
    guarded: XdsGuard<AdsService>,
    /// Kept so that streams see a live index (a closed channel ends them as at shutdown).
    _publish: tokio::sync::watch::Sender<Option<Arc<Snapshot>>>,
}

/// The bookinfo example (examples/bookinfo) indexed, as the manifests source loads it.
pub fn bookinfo() -> Arc<Snapshot> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/bookinfo");
    let mut manifests = ambientd::kube::ManifestDir::open(dir).expect("examples/bookinfo");
    let mut index = Index::new(Settings::default());
    for event in manifests.load() {
        index.handle(event);
    }
    index.snapshot()
}

fn servers() -> &'static Servers {
    static SERVERS: LazyLock<Servers> = LazyLock::new(|| {
        // The runtime first: its creation reads the allocation limit.
        let _ = runtime();
        let (publish, snapshots) = tokio::sync::watch::channel(Some(bookinfo()));
        let registry = Arc::new(Registry::default());
        let metrics = Arc::new(Metrics::new());
        let debug = DebugXds::new(DebugState {
            snapshots: snapshots.clone(),
            registry: registry.clone(),
            metrics: metrics.clone(),
            settings: Settings::default(),
            log_filter: None,
            authenticators: None,
            source_health: None,
        });
        let debug = Arc::new(debug);
        let plain = AdsServer::new(snapshots.clone(), registry.clone(), metrics.clone())
            .with_debug(debug.clone())
            .into_service();
        // `--scope-to-node` on this one, so that both modes of a ztunnel stream are run.
        let scoped = AdsServer::new(snapshots, registry, metrics)
            .with_debug(debug)
            .with_scope_to_node(true)
            .into_service();
        Servers {
            plain,
            guarded: XdsGuard::new(scoped, ca::ca().state.clone()),
            _publish: publish,
        }
    });
    &SERVERS
}

/// `data` as a `DeltaAggregatedResources` request body, on both ports.
pub fn delta(data: &[u8]) {
    let servers = servers();
    let bearer = ca::ca().ztunnel_bearer.as_str();
    runtime().block_on(async {
        let frames = call(servers.plain.clone(), DELTA_PATH, data, None).await;
        check_delta(&frames);
        let frames = call(servers.guarded.clone(), DELTA_PATH, data, Some(bearer)).await;
        check_delta(&frames);
    });
}

/// `data` as a `StreamAggregatedResources` request body, on both ports (on 15012 the caller,
/// ztunnel, is in the root namespace, so debug requests are answered).
pub fn sotw(data: &[u8]) {
    let servers = servers();
    let bearer = ca::ca().ztunnel_bearer.as_str();
    runtime().block_on(async {
        call(servers.plain.clone(), SOTW_PATH, data, None).await;
        call(servers.guarded.clone(), SOTW_PATH, data, Some(bearer)).await;
    });
}

/// Every response the server framed itself decodes as a `DeltaDiscoveryResponse`.
fn check_delta(frames: &[Bytes]) {
    for frame in frames {
        if let Err(error) = DeltaDiscoveryResponse::decode(frame.clone()) {
            panic!(
                "a response frame of {} bytes does not decode: {error}",
                frame.len()
            );
        }
    }
}

/// One call of `service` with `data` as the body; the response's messages (its gRPC frames,
/// checked) once the stream has ended, which it must, with a `grpc-status`.
async fn call<S>(mut service: S, path: &str, data: &[u8], bearer: Option<&str>) -> Vec<Bytes>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
{
    let chunks: Vec<Result<http_body::Frame<Bytes>, Infallible>> = data
        .chunks(512)
        .map(|chunk| Ok(http_body::Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        chunks,
    )));
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://ambientd{path}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers");
    if let Some(bearer) = bearer {
        request = request.header(http::header::AUTHORIZATION, bearer);
    }
    let request = request.body(body).expect("a request");
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .expect("infallible");
    let Ok(response) = service.call(request).await;
    let (parts, body) = response.into_parts();
    let collected = match body.collect().await {
        Ok(collected) => collected,
        Err(status) => panic!("the response body failed: {status:?}"),
    };
    let trailers = collected.trailers().cloned().unwrap_or_default();
    assert!(
        parts.headers.contains_key("grpc-status") || trailers.contains_key("grpc-status"),
        "a response without a grpc-status: {:?} {:?}",
        parts.headers,
        trailers
    );
    let mut bytes = collected.to_bytes();
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 5, "a truncated frame header");
        assert_eq!(bytes[0], 0, "a compressed response");
        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert!(bytes.len() >= 5 + len, "a truncated response frame");
        let frame = bytes.split_to(5 + len);
        frames.push(frame.slice(5..));
    }
    frames
}
