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
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

use crate::pb::xds::DeltaDiscoveryRequest;
use crate::pb::xds::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use crate::push::outbound::Responses;
use crate::push::server::{AdsServer, Inbound};

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest request accepted (a reconnect's `initial_resource_versions` is the largest).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

/// A request buffer larger than this is not kept once its message is decoded.
const KEEP_BUFFER: usize = 16 * 1024;

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
            let responses = ads.open(peer, Requests::new(body));
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
/// buffer is replaced by a new one, so a large request is freed once decoded.
pub struct Requests<B> {
    body: B,
    buf: BytesMut,
    done: bool,
}

impl<B> Requests<B> {
    pub fn new(body: B) -> Self {
        Requests {
            body,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// Bytes held for a message not yet complete (what a stream keeps between requests).
    pub fn buffered_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// One complete message from the buffer, if there is one.
    fn next_message(&mut self) -> Option<Result<DeltaDiscoveryRequest, Inbound>> {
        if self.buf.len() < 5 {
            return None;
        }
        let compressed = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if compressed != 0 {
            return Some(Err(Inbound::Invalid(Status::unimplemented(
                "compressed requests are not supported: send DeltaDiscoveryRequest uncompressed",
            ))));
        }
        if len > MAX_REQUEST_BYTES {
            return Some(Err(Inbound::Invalid(Status::resource_exhausted(format!(
                "a DeltaDiscoveryRequest of {len} bytes exceeds the {MAX_REQUEST_BYTES}-byte limit"
            )))));
        }
        if self.buf.len() < 5 + len {
            self.buf.reserve(5 + len - self.buf.len());
            return None;
        }
        let _ = self.buf.split_to(5);
        let message = self.buf.split_to(len);
        if self.buf.capacity() > KEEP_BUFFER {
            // The rest (a part of the next message) moves to a buffer of its own size, so the
            // large one is freed once `message` is decoded.
            self.buf = BytesMut::from(&self.buf[..]);
        }
        Some(DeltaDiscoveryRequest::decode(message).map_err(|e| {
            Inbound::Invalid(Status::invalid_argument(format!(
                "not a DeltaDiscoveryRequest: {e}"
            )))
        }))
    }
}

impl<B> Stream for Requests<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Item = Result<DeltaDiscoveryRequest, Inbound>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(message) = self.next_message() {
                if message.is_err() {
                    self.done = true;
                    self.buf = BytesMut::new();
                }
                return Poll::Ready(Some(message));
            }
            if self.done {
                return Poll::Ready(None);
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
    use futures::StreamExt;

    /// A body that yields the given chunks.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
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
        let chunks = wire.chunks(16 * 1024).map(Bytes::copy_from_slice).collect();
        let mut requests = Requests::new(Chunks(chunks));
        let first = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(first.initial_resource_versions.len(), 20_000);
        // The large request's buffer is not kept for the rest of the stream.
        assert!(
            requests.buffered_capacity() < 64 * 1024,
            "{} bytes kept",
            requests.buffered_capacity()
        );
        let second = requests.next().await.unwrap().ok().unwrap();
        assert_eq!(second.response_nonce, "2");
        assert!(requests.next().await.is_none());
        assert!(big.len() > 900_000, "{}", big.len());
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
            let mut requests = Requests::new(Chunks([Bytes::from(wire)].into()));
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
