//! The ADS gRPC route, with `DeltaAggregatedResources` responses framed here instead of by
//! tonic's encoder.
//!
//! tonic encodes a stream's messages into one buffer per stream that grows to the largest
//! message and never shrinks: every stream would hold memory the size of its initial response
//! (about 0.45 KiB per resource) for as long as it lives, and a stream that once got a big
//! batch would keep that too. Here each response arrives already framed, in a buffer of exactly
//! its size ([`crate::push::response`]), which HTTP/2 frees once written. Requests are decoded here for the same reason: tonic's
//! decode buffer would keep the size of the largest request (a reconnect's
//! `initial_resource_versions`, megabytes at 100k resources) for the stream's life. Every
//! other method goes to the generated server.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::pb::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use crate::push::known::{RawRequest, Received};
use crate::push::outbound::Responses;
use crate::push::server::{AdsServer, Inbound};

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest request accepted (a reconnect's `initial_resource_versions` is the largest).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// A request buffer larger than this is not kept once its message is decoded.
const KEEP_BUFFER: usize = 16 * 1024;

/// How many bytes of large requests (over [`KEEP_BUFFER`]) all streams together may be reading
/// and decoding at once. A reconnecting ztunnel's first request lists every resource it holds
/// (about 6.5 MB at 100k resources, and three times that decoded): 1,000 of them at once, as
/// after a control-plane restart, would need some 20 GB. A stream over the budget stops
/// reading its request until others are done; HTTP/2 flow control then holds the proxy back
/// (the stream's window, at most, waits in the server). Streams take their turn in order.
pub const REQUEST_BUDGET_BYTES: usize = 128 * 1024 * 1024;

/// How long a stream may hold budget for one request. A proxy that sends part of a large
/// request and then nothing would otherwise keep its share of the budget for the connection's
/// life; the stream is ended instead (ztunnel reconnects). 60 s is 8 MB (a reconnect at 100k
/// resources) at well under 1 Mbit/s.
pub const BUDGET_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// The budget's unit: one permit per KiB.
const BUDGET_UNIT: usize = 1024;

/// The budget for large requests, shared by every stream of a server.
#[derive(Clone, Debug)]
pub struct RequestBudget {
    semaphore: Arc<Semaphore>,
    units: u32,
}

impl RequestBudget {
    pub fn new(bytes: usize) -> Self {
        let units = u32::try_from((bytes / BUDGET_UNIT).max(1)).unwrap_or(u32::MAX >> 4);
        RequestBudget {
            semaphore: Arc::new(Semaphore::new(units as usize)),
            units,
        }
    }

    /// Bytes of budget free now.
    pub fn available(&self) -> usize {
        self.semaphore.available_permits() * BUDGET_UNIT
    }
}

/// The ADS service as tonic serves it (`Server::add_service`).
#[derive(Clone)]
pub struct AdsService {
    ads: AdsServer,
    generated: AggregatedDiscoveryServiceServer<AdsServer>,
}

impl AdsService {
    pub fn new(ads: AdsServer) -> Self {
        let generated = AggregatedDiscoveryServiceServer::new(ads.clone())
            .max_decoding_message_size(MAX_REQUEST_BYTES);
        AdsService { ads, generated }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl Service<http::Request<Body>> for AdsService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DELTA_PATH {
            let mut generated = self.generated.clone();
            return Box::pin(async move { generated.call(request).await });
        }
        let ads = self.ads.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let peer =
                tonic::Request::from_http(http::Request::from_parts(parts, ())).remote_addr();
            let requests = Requests::new(body).with_budget(ads.request_budget());
            let responses = ads.open(peer, requests);
            let mut http = http::Response::new(Body::new(Framed {
                responses,
                done: false,
            }));
            http.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok(http)
        })
    }
}

/// The response body: one gRPC frame per response, then the status in the trailers.
struct Framed {
    responses: Responses,
    done: bool,
}

fn trailers(status: &Status) -> Frame<Bytes> {
    let mut headers = http::HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        headers.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    Frame::trailers(headers)
}

impl http_body::Body for Framed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.responses).poll_next(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(Frame::data(frame)))),
            Poll::Ready(Some(Err(status))) => {
                self.done = true;
                Poll::Ready(Some(Ok(trailers(&status))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Ok(trailers(&Status::ok("")))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The request body as decoded requests. Each message is cut from the buffer, and an emptied
/// buffer is replaced by a new one, so a large request is freed once decoded. A large message
/// is read only with room in the shared budget ([`REQUEST_BUDGET_BYTES`]), held until it is
/// decoded.
pub struct Requests<B> {
    body: B,
    buf: BytesMut,
    done: bool,
    /// The shared budget and its size in units.
    budget: Option<(PollSemaphore, u32)>,
    /// The budget taken for the message being read.
    permit: Option<OwnedSemaphorePermit>,
    /// How long the permit may be held ([`BUDGET_HOLD`]), and until when it is.
    hold: std::time::Duration,
    hold_until: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// What the buffer holds. A return value, never stored: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Next {
    Message(Result<Received, Inbound>),
    /// A large message has begun: read on only with this much budget (in units).
    NeedsBudget(u32),
    /// More bytes are needed.
    More,
}

impl<B> Requests<B> {
    pub fn new(body: B) -> Self {
        Requests {
            body,
            buf: BytesMut::new(),
            done: false,
            budget: None,
            permit: None,
            hold: BUDGET_HOLD,
            hold_until: None,
        }
    }

    /// Reads large messages only within `budget` (shared by every stream).
    pub fn with_budget(mut self, budget: RequestBudget) -> Self {
        self.budget = Some((PollSemaphore::new(budget.semaphore), budget.units));
        self
    }

    /// Bytes held for a message not yet complete (what a stream keeps between requests).
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// One complete message from the buffer, if there is one.
    fn next_message(&mut self) -> Next {
        if self.buf.len() < 5 {
            return Next::More;
        }
        let compressed = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if compressed != 0 {
            return Next::Message(Err(Inbound::Invalid(Status::unimplemented(
                "compressed requests are not supported: send DeltaDiscoveryRequest uncompressed",
            ))));
        }
        if len > MAX_REQUEST_BYTES {
            return Next::Message(Err(Inbound::Invalid(Status::resource_exhausted(format!(
                "a DeltaDiscoveryRequest of {len} bytes exceeds the {MAX_REQUEST_BYTES}-byte limit"
            )))));
        }
        if self.buf.len() < 5 + len {
            if len > KEEP_BUFFER && self.budget.is_some() && self.permit.is_none() {
                let units = len.div_ceil(BUDGET_UNIT) as u32;
                return Next::NeedsBudget(units);
            }
            self.buf.reserve(5 + len - self.buf.len());
            return Next::More;
        }
        let _ = self.buf.split_to(5);
        let message = self.buf.split_to(len);
        if self.buf.capacity() > KEEP_BUFFER {
            // The rest (a part of the next message) moves to a buffer of its own size, so the
            // large one is freed once `message` is decoded.
            self.buf = BytesMut::from(&self.buf[..]);
        }
        // The known versions stay as slices of `message` (`push::known`).
        let decoded = RawRequest::decode(message)
            .map_err(|e| format!("not a DeltaDiscoveryRequest: {e}"))
            .and_then(RawRequest::split)
            .map_err(|e| Inbound::Invalid(Status::invalid_argument(e)));
        // Decoded, and the message's bytes freed: the budget goes to the next stream. The
        // request itself is handled at once, in the same poll of the connection's task.
        self.permit = None;
        self.hold_until = None;
        Next::Message(decoded)
    }
}

impl<B> Stream for Requests<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Item = Result<Received, Inbound>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.next_message() {
                Next::Message(message) => {
                    if message.is_err() {
                        self.done = true;
                        self.buf = BytesMut::new();
                        self.permit = None;
                        self.hold_until = None;
                    }
                    return Poll::Ready(Some(message));
                }
                Next::NeedsBudget(units) => {
                    let (budget, total) = self.budget.as_mut().expect("a budget");
                    // A message larger than the whole budget waits for all of it.
                    let units = units.min(*total);
                    match budget.poll_acquire_many(cx, units) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(permit) => {
                            // `None`: the budget was closed; read on without it.
                            if permit.is_none() {
                                self.budget = None;
                            } else {
                                self.hold_until = Some(Box::pin(tokio::time::sleep(self.hold)));
                            }
                            self.permit = permit;
                            continue;
                        }
                    }
                }
                Next::More => {}
            }
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(deadline) = self.hold_until.as_mut()
                && deadline.as_mut().poll(cx).is_ready()
            {
                let waiting = self.buf.len();
                self.done = true;
                self.buf = BytesMut::new();
                self.permit = None;
                self.hold_until = None;
                return Poll::Ready(Some(Err(Inbound::Invalid(Status::deadline_exceeded(
                    format!(
                        "a large DeltaDiscoveryRequest was not received within {:?} \
                         ({waiting} bytes arrived); reconnect and send it again",
                        self.hold
                    ),
                )))));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(Inbound::Transport(Status::from_error(
                        e.into(),
                    )))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::xds::DeltaDiscoveryRequest;
    use futures::StreamExt;

    /// A body that yields the given chunks, counting how many it gave.
    struct Chunks(
        std::collections::VecDeque<Bytes>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    impl Chunks {
        fn new(chunks: impl Into<std::collections::VecDeque<Bytes>>) -> Self {
            Chunks(chunks.into(), Arc::default())
        }

        /// How many chunks it has given so far.
        fn given(&self) -> Arc<std::sync::atomic::AtomicUsize> {
            self.1.clone()
        }
    }

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            let chunk = self.0.pop_front();
            if chunk.is_some() {
                self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Poll::Ready(chunk.map(|b| Ok(Frame::data(b))))
        }
    }

    fn grpc(request: &DeltaDiscoveryRequest) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
        out.extend_from_slice(&request.encode_to_vec());
        out
    }

    fn request(nonce: &str, known: usize) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            response_nonce: nonce.into(),
            initial_resource_versions: (0..known)
                .map(|i| (format!("Kubernetes//Pod/ns/pod-{i}"), format!("{i:016x}")))
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn decodes_messages_across_chunks_and_frees_a_large_one() {
        let big = grpc(&request("1", 20_000)); // about 1 MB, as a reconnect at 20k resources
        let small = grpc(&request("2", 0));
        let mut wire = big.clone();
        wire.extend_from_slice(&small);
        // Chunks of 16 KiB, as HTTP/2 delivers them.
        let chunks: Vec<Bytes> = wire.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
        let mut requests = Requests::new(Chunks::new(chunks));
        let (_, known) = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(known.len(), 20_000);
        // The large request's buffer is not kept for the rest of the stream.
        assert!(
            requests.buffered_capacity() < 64 * 1024,
            "{} bytes kept",
            requests.buffered_capacity()
        );
        let (second, _) = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(second.response_nonce, "2");
        assert!(requests.next().await.is_none());
        assert!(big.len() > 900_000, "{}", big.len());
    }

    /// A large request is read only with room in the shared budget: while another stream holds
    /// it, the stream stops reading its body (so HTTP/2 flow control holds the proxy back), and
    /// it goes on once the budget is free. The budget is returned once the message is decoded.
    #[tokio::test]
    async fn large_requests_wait_for_the_shared_budget() {
        let budget = RequestBudget::new(1024 * 1024);
        let wire = grpc(&request("1", 10_000)); // about 500 KB
        assert!(
            wire.len() > 400_000 && wire.len() < 1024 * 1024,
            "{}",
            wire.len()
        );
        let chunks: std::collections::VecDeque<Bytes> =
            wire.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
        let count = chunks.len();
        let body = Chunks::new(chunks);
        let read = body.given();
        let mut requests = Requests::new(body).with_budget(budget.clone());

        // Another stream holds most of the budget.
        let held = budget
            .semaphore
            .clone()
            .acquire_many_owned(900)
            .await
            .unwrap();
        let waiting = futures::poll!(requests.next());
        assert!(waiting.is_pending(), "read past the budget");
        // Only the first chunk (with the message's length) was read.
        assert_eq!(read.load(std::sync::atomic::Ordering::Relaxed), 1);

        drop(held);
        let (_, known) = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(known.len(), 10_000);
        assert_eq!(read.load(std::sync::atomic::Ordering::Relaxed), count);
        // Decoded: the whole budget is free again.
        assert_eq!(budget.available(), 1024 * 1024);
        assert!(requests.next().await.is_none());

        // A small request needs no budget, even when none is left.
        let all = budget
            .semaphore
            .clone()
            .acquire_many_owned(1024)
            .await
            .unwrap();
        let small = grpc(&request("2", 10));
        let mut requests =
            Requests::new(Chunks::new([Bytes::from(small)])).with_budget(budget.clone());
        let (second, _) = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(second.response_nonce, "2");
        drop(all);
    }

    /// A body that yields its chunks and then stalls (neither data nor end).
    struct Stalls(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Stalls {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            match self.0.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => Poll::Pending,
            }
        }
    }

    /// A proxy that sends part of a large request and then nothing gives its budget back after
    /// [`BUDGET_HOLD`]: its stream ends with a status that says why.
    #[tokio::test]
    async fn a_stalled_large_request_gives_the_budget_back() {
        let budget = RequestBudget::new(1024 * 1024);
        let wire = grpc(&request("1", 10_000));
        let first_half = Bytes::copy_from_slice(&wire[..wire.len() / 2]);
        let mut requests = Requests::new(Stalls([first_half].into())).with_budget(budget.clone());
        requests.hold = std::time::Duration::from_millis(300);
        assert!(futures::poll!(requests.next()).is_pending());
        assert!(budget.available() < 1024 * 1024, "no budget taken");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(futures::poll!(requests.next()).is_pending());
        let started = std::time::Instant::now();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), requests.next())
            .await
            .expect("the stalled request was never given up");
        assert!(started.elapsed() >= std::time::Duration::from_millis(150));
        match ended {
            Some(Err(Inbound::Invalid(status))) => {
                assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
                assert!(
                    status.message().contains("not received"),
                    "{}",
                    status.message()
                );
            }
            _ => panic!("expected the stream to end with DeadlineExceeded"),
        }
        assert_eq!(budget.available(), 1024 * 1024);
        assert!(requests.next().await.is_none());
    }

    #[tokio::test]
    async fn bad_frames_are_answered_with_a_useful_status() {
        let cases: [(Vec<u8>, tonic::Code, &str); 2] = [
            (
                vec![1, 0, 0, 0, 1, 0],
                tonic::Code::Unimplemented,
                "compressed",
            ),
            (
                vec![0, 0, 0, 0, 2, 0xff, 0xff],
                tonic::Code::InvalidArgument,
                "DeltaDiscoveryRequest",
            ),
        ];
        for (wire, code, text) in cases {
            let mut requests = Requests::new(Chunks::new([Bytes::from(wire)]));
            match requests.next().await {
                Some(Err(Inbound::Invalid(status))) => {
                    assert_eq!(status.code(), code);
                    assert!(status.message().contains(text), "{}", status.message());
                }
                _ => panic!("expected an invalid request"),
            }
            assert!(requests.next().await.is_none());
        }
    }
}
