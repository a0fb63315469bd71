//! The ADS gRPC route, with `DeltaAggregatedResources` responses framed here instead of by
//! tonic's encoder.
//!
//! tonic encodes a stream's messages into one buffer per stream that grows to the largest
//! message and never shrinks: every stream would hold memory the size of its initial response
//! (about 0.45 KiB per resource) for as long as it lives, and a stream that once got a big
//! batch would keep that too. Here each response is encoded into a buffer of exactly its size,
//! which HTTP/2 frees once written. Requests are still decoded by tonic; every other method
//! goes to the generated server.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use prost::Message;
use tonic::body::Body;
use tonic::codec::Codec;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;
use tonic::{Status, Streaming};

use crate::pb::xds::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use crate::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use crate::push::outbound::Responses;
use crate::push::server::AdsServer;

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Largest request accepted (a reconnect's `initial_resource_versions` is the largest).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

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
            let decoder =
                tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default()
                    .decoder();
            let requests = Streaming::new_request(decoder, body, None, Some(MAX_REQUEST_BYTES));
            let request = tonic::Request::from_http(http::Request::from_parts(parts, requests));
            let response = match ads.delta_aggregated_resources(request).await {
                Ok(response) => response,
                Err(status) => return Ok(status.into_http()),
            };
            let (metadata, responses, _) = response.into_parts();
            let mut http = http::Response::new(Body::new(Framed {
                responses,
                done: false,
            }));
            *http.headers_mut() = metadata.into_headers();
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

/// `response` as one gRPC message (uncompressed flag, length, bytes) in a buffer of its size.
fn frame(response: &DeltaDiscoveryResponse) -> Bytes {
    let len = response.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    response
        .encode(&mut buf)
        .expect("the buffer has the message's exact size");
    buf.freeze()
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
            Poll::Ready(Some(Ok(response))) => Poll::Ready(Some(Ok(Frame::data(frame(&response))))),
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
