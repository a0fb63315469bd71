//! The gRPC edge on 15012: `IstioCertificateService/CreateCertificate`, and the guard in front of
//! delta ADS that authenticates the caller and applies istiod's xDS identity check.
//!
//! Statuses are built here and nowhere else. Every authentication or authorization failure is
//! `Unauthenticated` with a fixed message; the reason goes to the log only.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body as _, Frame};
use prost::Message;
use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::ca::authn::{AuthContext, Authenticators};
use crate::ca::authorize::{Caller, Policy, ProxyClaim, authorize, check_xds_identity};
use crate::ca::pods::PodIndex;
use crate::ca::signer::{Csr, SignError, Signer, TtlPolicy};
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use crate::pb::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
use crate::pb::xds::{DeltaDiscoveryRequest, Node};

/// The metadata key ztunnel (shared mode) sets to the identity it asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
/// The largest first xDS request the guard buffers (reconnects list every known resource).
const MAX_FIRST_REQUEST: usize = 64 * 1024 * 1024;

/// Everything a CSR or a 15012 stream is checked against.
pub struct CaState {
    /// The current CA; swapped when a plugged-in CA's files change.
    pub signer: ArcSwap<Signer>,
    pub authenticators: Authenticators,
    pub policy: Policy,
    pub ttl: TtlPolicy,
    pub pods: Arc<dyn PodIndex>,
    /// `citadel_server_*` counters.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The current root bundle (PEM), for whoever distributes it (the root ConfigMaps).
    pub root_bundle: tokio::sync::watch::Sender<String>,
}

impl CaState {
    /// Publishes the current root's expiry as `citadel_server_root_cert_expiry_timestamp` (and
    /// so `_seconds`), and the root bundle.
    pub fn record_root_expiry(&self) {
        let signer = self.signer.load();
        let expiry = signer.root_not_after().unix_timestamp();
        self.metrics.root_expiry.set(expiry as f64);
        self.root_bundle.send_if_modified(|bundle| {
            let changed = bundle.as_str() != signer.root_bundle();
            if changed {
                *bundle = signer.root_bundle().to_string();
            }
            changed
        });
    }

    /// The root bundle now and whenever it changes.
    pub fn root_bundles(&self) -> tokio::sync::watch::Receiver<String> {
        self.root_bundle.subscribe()
    }

    /// Authenticates a request from its metadata and TLS client certificate.
    pub async fn authenticate(
        &self,
        metadata: &MetadataMap,
        extensions: &http::Extensions,
    ) -> Result<Caller, String> {
        let peer_certs = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs());
        let ctx = AuthContext {
            metadata,
            peer_certs: peer_certs.as_deref().map(Vec::as_slice),
        };
        self.authenticators
            .authenticate(&ctx)
            .await
            .map_err(|failure| failure.to_string())
    }
}

fn peer(extensions: &http::Extensions) -> String {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.get_ref().remote_addr())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// `istio.v1.auth.IstioCertificateService`.
#[derive(Clone)]
pub struct CertificateService {
    state: Arc<CaState>,
}

impl CertificateService {
    /// The service over `state`.
    pub fn new(state: Arc<CaState>) -> Self {
        CertificateService { state }
    }

    /// The tonic server for it.
    pub fn into_service(self) -> IstioCertificateServiceServer<Self> {
        IstioCertificateServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CertificateService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let state = &self.state;
        let peer = peer(request.extensions());
        state.metrics.csr_count.inc();
        let caller = match state
            .authenticate(request.metadata(), request.extensions())
            .await
        {
            Ok(caller) => caller,
            Err(reason) => {
                warn!(%peer, %reason, "CSR refused: authentication failed");
                state.metrics.auth_failures.inc();
                return Err(Status::unauthenticated("request authenticate failure"));
            }
        };
        let request = request.into_inner();
        let impersonate = match request
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get(IMPERSONATED_IDENTITY))
        {
            None => None,
            Some(value) => match &value.kind {
                Some(ValueKind::StringValue(s)) => Some(s.as_str()),
                _ => {
                    warn!(%peer, caller = %caller.identity, "CSR refused: ImpersonatedIdentity is not a string");
                    state.metrics.auth_failures.inc();
                    return Err(Status::unauthenticated(
                        "request impersonation authentication failure",
                    ));
                }
            },
        };
        let identity = match authorize(&state.policy, &caller, impersonate, state.pods.as_ref()) {
            Ok(identity) => identity,
            Err(refusal) => {
                warn!(%peer, caller = %caller.identity, method = %caller.method, requested = impersonate, reason = %refusal, "CSR refused");
                state.metrics.auth_failures.inc();
                return Err(Status::unauthenticated(
                    "request impersonation authentication failure",
                ));
            }
        };
        // Each failure here is a signing error to istiod (counted by its type).
        let sign_error = |error: SignError| {
            state.metrics.record_sign_error(error.error_type());
            status(error)
        };
        let ttl = state
            .ttl
            .resolve(request.validity_duration)
            .map_err(sign_error)?;
        let csr = Csr::parse_pem(&request.csr).map_err(sign_error)?;
        let signer = state.signer.load();
        let chain = signer
            .sign_workload(&csr, &identity, ttl, time::OffsetDateTime::now_utc())
            .map_err(sign_error)?;
        debug!(%peer, caller = %caller.identity, %identity, ttl = ttl.as_secs(), "signed a workload certificate");
        state.metrics.certs_issued.inc();
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: chain,
        }))
    }
}

fn status(error: SignError) -> Status {
    match error {
        SignError::BadCsr(_) | SignError::TtlTooLong { .. } => {
            Status::invalid_argument(error.to_string())
        }
        SignError::Internal(_) => {
            warn!(%error, "signing failed");
            Status::internal(error.to_string())
        }
    }
}

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
            let (parts, body) = request.into_parts();
            let peer = peer(&parts.extensions);
            let metadata = MetadataMap::from_headers(parts.headers.clone());
            let caller = match state.authenticate(&metadata, &parts.extensions).await {
                Ok(caller) => caller,
                Err(reason) => {
                    warn!(%peer, %reason, "xDS stream refused: authentication failed");
                    return Ok(Status::unauthenticated("authentication failure").into_http());
                }
            };
            let body = if parts.uri.path() == DELTA_PATH {
                match first_request(body).await {
                    Ok((first, body)) => {
                        let claim = first
                            .as_ref()
                            .and_then(|r| r.node.as_ref())
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
            inner.call(http::Request::from_parts(parts, body)).await
        })
    }
}

/// Reads the first gRPC message of a request body. Returns it (or `None` if the body ended
/// first) and a body that replays everything read, followed by the rest.
async fn first_request(mut body: Body) -> Result<(Option<DeltaDiscoveryRequest>, Body), Status> {
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
                return Err(Status::resource_exhausted("first request too large"));
            }
            if buffer.len() >= 5 + length {
                let request =
                    DeltaDiscoveryRequest::decode(&buffer[5..5 + length]).map_err(|e| {
                        Status::invalid_argument(format!("decoding the first request: {e}"))
                    })?;
                return Ok((Some(request), replay(buffer.freeze(), body, ended)));
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
