//! The guard in front of the ADS service on 15012: authenticates each stream, and checks the
//! first request's node against the caller's identity before the stream reaches ADS. The
//! caller goes with the request ([`VerifiedCaller`]), for debug over xDS.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as _, Frame};
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tracing::{debug, warn};

use crate::ca::authorize::{ProxyClaim, check_xds_identity};
use crate::ca::service::{CaState, peer};
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::xds::Node;
use crate::push::server::VerifiedCaller;

/// The largest first xDS request the guard accepts (reconnects list every known resource): the
/// ADS service's own limit, so the guard never refuses what the service would take.
const MAX_FIRST_REQUEST: usize = crate::push::route::MAX_REQUEST_BYTES;

/// What a proxy claims in its xDS node: `NAMESPACE` (else the node id's `<ns>.svc…` suffix)
/// and `SERVICE_ACCOUNT` metadata.
pub fn proxy_claim(node: &Node) -> ProxyClaim {
    let meta = |key: &str| {
        node.metadata
            .as_ref()
            .and_then(|m| m.fields.get(key))
            .and_then(|v| match &v.kind {
                Some(ValueKind::StringValue(s)) if !s.is_empty() => Some(s.clone()),
                _ => None,
            })
    };
    let from_id = || {
        // ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local
        node.id
            .split('~')
            .nth(3)
            .and_then(|domain| domain.split('.').next())
            .map(str::to_string)
    };
    ProxyClaim {
        namespace: meta("NAMESPACE").or_else(from_id).unwrap_or_default(),
        service_account: meta("SERVICE_ACCOUNT"),
    }
}

/// Wraps the ADS service on 15012: authenticates every stream, then reads the first request
/// and refuses the stream (`PermissionDenied`) unless the caller's namespace is the node's.
#[derive(Clone)]
pub struct XdsGuard<S> {
    inner: S,
    state: Arc<CaState>,
}

impl<S> XdsGuard<S> {
    /// Guards `inner` (the ADS server) with `state`'s authenticators.
    pub fn new(inner: S, state: Arc<CaState>) -> Self {
        XdsGuard { inner, state }
    }
}

impl<S: NamedService> NamedService for XdsGuard<S> {
    const NAME: &'static str = S::NAME;
}

const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

impl<S> Service<http::Request<Body>> for XdsGuard<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone may not be ready; the one that was polled ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = self.state.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let peer = peer(&parts.extensions);
            let metadata = MetadataMap::from_headers(parts.headers.clone());
            let caller = match state.authenticate(&metadata, &parts.extensions).await {
                Ok(caller) => caller,
                Err(failure) => {
                    warn!(%peer, reason = %failure, "xDS stream refused: authentication failed");
                    return Ok(
                        super::service::refusal(&failure, "authentication failure").into_http()
                    );
                }
            };
            let body = if parts.uri.path() == DELTA_PATH {
                let first = tokio::time::timeout(FIRST_REQUEST_WAIT, first_node(body))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::deadline_exceeded(format!(
                            "the first request's node did not arrive within {FIRST_REQUEST_WAIT:?}"
                        )))
                    });
                match first {
                    Ok((first, body)) => {
                        let claim = first
                            .as_ref()
                            .and_then(Option::as_ref)
                            .map(proxy_claim)
                            .unwrap_or_default();
                        if first.is_some()
                            && let Err(refusal) = check_xds_identity(&caller.identity, &claim)
                        {
                            warn!(%peer, caller = %caller.identity, reason = %refusal, "xDS stream refused");
                            return Ok(Status::permission_denied(format!(
                                "authorization failed: {refusal}"
                            ))
                            .into_http());
                        }
                        body
                    }
                    Err(status) => return Ok(status.into_http()),
                }
            } else {
                body
            };
            debug!(%peer, caller = %caller.identity, path = parts.uri.path(), "xDS stream authenticated");
            // Debug over xDS (state of the world) authorizes by it.
            parts.extensions.insert(VerifiedCaller {
                identity: caller.identity.to_string(),
                namespace: caller.identity.namespace.clone(),
            });
            inner.call(http::Request::from_parts(parts, body)).await
        })
    }
}

/// How long a stream may take to deliver its first request's node.
const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(60);

/// Reads a request body until the first gRPC message's `node` has arrived. Returns the node
/// (the outer `None` if the body ended before a whole message; the inner one if the message
/// has no node) and a body that replays everything read, followed by the rest.
///
/// Only the node is waited for and decoded. A reconnect's first request also lists every
/// resource version the proxy holds (megabytes at 100k resources, for each of a thousand
/// proxies reconnecting together); the ADS service reads those within its request budget,
/// not this guard. Every encoder puts `node` (field 1) first, so what is held here is the
/// node and the rest of the frames it came in.
async fn first_node(mut body: Body) -> Result<(Option<Option<Node>>, Body), Status> {
    let mut buffer = BytesMut::new();
    let mut ended = false;
    loop {
        if buffer.len() >= 5 {
            let compressed = buffer[0];
            let length = (&buffer[1..5]).get_u32() as usize;
            if compressed != 0 {
                return Err(Status::unimplemented(
                    "compressed requests are not supported",
                ));
            }
            if length > MAX_FIRST_REQUEST {
                return Err(Status::resource_exhausted(format!(
                    "a DeltaDiscoveryRequest of {length} bytes exceeds the \
                     {MAX_FIRST_REQUEST}-byte limit"
                )));
            }
            let message = &buffer[5..buffer.len().min(5 + length)];
            let complete = message.len() == length;
            if let Scan::Found(node) = scan_node(message, complete)? {
                return Ok((Some(node), replay(buffer.freeze(), body, ended)));
            }
        }
        if ended {
            return Ok((None, replay(buffer.freeze(), body, true)));
        }
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => buffer.extend_from_slice(&data),
                // Trailers end a request stream.
                Err(_) => ended = true,
            },
            Some(Err(status)) => return Err(status),
            None => ended = true,
        }
    }
}

/// What the bytes of a first message so far say about its `node`.
#[derive(Debug, PartialEq)]
enum Scan {
    /// More bytes are needed.
    More,
    /// The node (`None`: the whole message is in, and it has none).
    Found(Option<Node>),
}

/// Walks the fields of a `DeltaDiscoveryRequest` (`complete`: all its bytes are in `message`)
/// and decodes `node` (field 1) once its bytes are in.
fn scan_node(message: &[u8], complete: bool) -> Result<Scan, Status> {
    let invalid =
        |what: &str| Status::invalid_argument(format!("decoding the first request: {what}"));
    // Incomplete bytes wait for more, unless the message is whole: then they are malformed.
    let short = |what: &str| {
        if complete {
            Err(invalid(what))
        } else {
            Ok(Scan::More)
        }
    };
    let mut at = 0;
    while at < message.len() {
        let Some((key, key_len)) = varint(&message[at..]) else {
            return short("a truncated field key");
        };
        let start = at + key_len;
        let (value_at, end) = match key & 7 {
            0 => match varint(&message[start..]) {
                Some((_, n)) => (start, start + n),
                None => return short("a truncated varint"),
            },
            1 => (start, start + 8),
            5 => (start, start + 4),
            2 => match varint(&message[start..]) {
                Some((len, n)) => (start + n, (start + n).saturating_add(len as usize)),
                None => return short("a truncated length"),
            },
            wire => return Err(invalid(&format!("wire type {wire}"))),
        };
        if end > message.len() {
            return short("a truncated field");
        }
        if key >> 3 == 1 {
            if key & 7 != 2 {
                return Err(invalid("node is not a message"));
            }
            let node = Node::decode(&message[value_at..end])
                .map_err(|e| invalid(&format!("node: {e}")))?;
            return Ok(Scan::Found(Some(node)));
        }
        at = end;
    }
    if complete {
        Ok(Scan::Found(None))
    } else {
        Ok(Scan::More)
    }
}

/// A base-128 varint at the start of `bytes` and its length; `None` if it is cut short (or
/// longer than a varint can be).
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

fn replay(prefix: Bytes, rest: Body, ended: bool) -> Body {
    Body::new(Replay {
        prefix: (!prefix.is_empty()).then_some(prefix),
        rest: (!ended).then_some(rest),
    })
}

/// Bytes already read from a body, then the body itself.
struct Replay {
    prefix: Option<Bytes>,
    rest: Option<Body>,
}

impl http_body::Body for Replay {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(prefix) = self.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::xds::DeltaDiscoveryRequest;

    fn node(id: &str) -> Node {
        Node {
            id: id.into(),
            ..Default::default()
        }
    }

    fn encoded(request: &DeltaDiscoveryRequest) -> Vec<u8> {
        request.encode_to_vec()
    }

    #[test]
    fn the_node_is_found_as_soon_as_its_bytes_are_in() {
        let request = DeltaDiscoveryRequest {
            node: Some(node(
                "ztunnel~10.0.0.1~z.istio-system~istio-system.svc.cluster.local",
            )),
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            initial_resource_versions: (0..1000)
                .map(|i| (format!("Kubernetes//Pod/ns/pod-{i}"), format!("{i:x}")))
                .collect(),
            ..Default::default()
        };
        let bytes = encoded(&request);
        let node_end = 2 + request.node.as_ref().unwrap().encoded_len();
        // Cut anywhere inside the node: more is needed.
        for cut in [0, 1, 2, node_end - 1] {
            assert_eq!(
                scan_node(&bytes[..cut], false).unwrap(),
                Scan::More,
                "cut {cut}"
            );
        }
        // The node is whole long before the versions are.
        assert_eq!(
            scan_node(&bytes[..node_end], false).unwrap(),
            Scan::Found(request.node.clone())
        );
        assert_eq!(
            scan_node(&bytes, true).unwrap(),
            Scan::Found(request.node.clone())
        );
    }

    #[test]
    fn a_node_after_other_fields_is_still_found() {
        let first = DeltaDiscoveryRequest {
            type_url: "type.googleapis.com/istio.workload.Address".into(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        };
        let second = DeltaDiscoveryRequest {
            node: Some(node("late")),
            ..Default::default()
        };
        // Fields in any order concatenate into one valid message.
        let mut bytes = encoded(&first);
        let before = bytes.len();
        bytes.extend(encoded(&second));
        assert_eq!(scan_node(&bytes[..before], false).unwrap(), Scan::More);
        assert_eq!(
            scan_node(&bytes, true).unwrap(),
            Scan::Found(Some(node("late")))
        );
        assert_eq!(
            DeltaDiscoveryRequest::decode(&bytes[..]).unwrap().node,
            Some(node("late"))
        );
    }

    #[test]
    fn a_whole_message_without_a_node_has_none() {
        let request = DeltaDiscoveryRequest {
            type_url: "type.googleapis.com/istio.security.Authorization".into(),
            ..Default::default()
        };
        assert_eq!(
            scan_node(&encoded(&request), true).unwrap(),
            Scan::Found(None)
        );
        assert_eq!(scan_node(&[], true).unwrap(), Scan::Found(None));
    }

    #[test]
    fn malformed_messages_are_invalid_arguments() {
        let whole = encoded(&DeltaDiscoveryRequest {
            node: Some(node("n")),
            ..Default::default()
        });
        for (bytes, what) in [
            (&whole[..whole.len() - 1], "a truncated field"),
            (&[0x0b][..], "wire type 3"),
            (&[0x08, 0x01][..], "node is not a message"),
            (&[0x12, 0x80][..], "a truncated length"),
        ] {
            let status = scan_node(bytes, true).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(status.message().contains(what), "{}", status.message());
        }
    }
}
