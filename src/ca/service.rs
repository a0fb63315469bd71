//! The gRPC edge on 15012: `IstioCertificateService/CreateCertificate`, and the guard in front of
//! delta ADS that authenticates the caller and applies istiod's xDS identity check.
//!
//! Statuses are built here and nowhere else. Every authentication or authorization failure is
//! `Unauthenticated` with a fixed message; the reason goes to the log only. The one exception:
//! when a credential could not be checked (the API server's TokenReview failed or timed out)
//! the answer is `Unavailable`, naming the TokenReview, so the caller retries instead of
//! treating its token as bad.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Response, Status};
use tracing::{debug, warn};

use crate::ca::authn::{AuthContext, AuthFailure, Authenticators};
use crate::ca::authorize::{Caller, Policy, authorize};
use crate::ca::limit::CsrLimits;
use crate::ca::pods::PodIndex;
use crate::ca::signer::{Csr, SignError, Signer, TtlPolicy};
use crate::pb::google::protobuf::value::Kind as ValueKind;
use crate::pb::istio::v1::auth::istio_certificate_service_server::{
    IstioCertificateService, IstioCertificateServiceServer,
};
use crate::pb::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};

/// The metadata key ztunnel (shared mode) sets to the identity it asks for.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

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
    /// Certificate requests in flight, per caller and in all.
    pub csr_limits: CsrLimits,
}

impl CaState {
    /// Publishes the current root's expiry as `citadel_server_root_cert_expiry_timestamp`, the
    /// signing certificate's as `citadel_server_cert_chain_expiry_timestamp` (and so their
    /// `_seconds`), and the root bundle.
    pub fn record_root_expiry(&self) {
        let signer = self.signer.load();
        let expiry = signer.root_not_after().unix_timestamp();
        self.metrics.root_expiry.set(expiry as f64);
        let chain = signer.not_after().unix_timestamp();
        self.metrics.chain_expiry.set(chain as f64);
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
    ) -> Result<Caller, AuthFailure> {
        let peer_certs = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|info| info.peer_certs());
        let ctx = AuthContext {
            metadata,
            peer_certs: peer_certs.as_deref().map(Vec::as_slice),
        };
        self.authenticators.authenticate(&ctx).await
    }
}

/// The status for a caller nobody authenticated: `Unavailable` when its credential could not
/// be checked, else `Unauthenticated` with the fixed `message`.
pub(super) fn refusal(failure: &AuthFailure, message: &str) -> Status {
    match failure.unavailable() {
        Some(why) => Status::unavailable(format!("{why}; retry later")),
        None => Status::unauthenticated(message),
    }
}

pub(super) fn peer(extensions: &http::Extensions) -> String {
    extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.get_ref().remote_addr())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// The largest `IstioCertificateRequest` accepted (tonic's default is 4 MiB, as istiod's). A
/// ztunnel's is under 2 KiB (a P-256 CSR and one metadata field; an RSA-4096 CSR is about
/// 3.5 KiB): 64 KiB leaves room for any honest request and bounds what each of many
/// concurrent streams may make the server buffer before the request is even authenticated.
/// Larger requests get `OUT_OF_RANGE` naming the limit (from tonic's decoder).
pub const MAX_CSR_REQUEST_BYTES: usize = 64 * 1024;

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
        IstioCertificateServiceServer::new(self).max_decoding_message_size(MAX_CSR_REQUEST_BYTES)
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
            Err(failure) => {
                warn!(%peer, reason = %failure, "CSR refused: authentication failed");
                state.metrics.auth_failures.inc();
                return Err(refusal(&failure, "request authenticate failure"));
            }
        };
        let request = request.into_inner();
        // istiod reads the field with `GetStringValue()` and impersonates only when that is not
        // empty: an empty or non-string value asks for the caller's own identity.
        let impersonate = request
            .metadata
            .as_ref()
            .and_then(|m| m.fields.get(IMPERSONATED_IDENTITY))
            .and_then(|value| match &value.kind {
                Some(ValueKind::StringValue(s)) if !s.is_empty() => Some(s.as_str()),
                _ => None,
            });
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
        // Admitted only within the limits on requests in flight (`ca::limit`), counted per
        // caller; the refusal says which limit and when to retry.
        let admitted = match state.csr_limits.admit(&CsrLimits::caller_key(&caller)) {
            Ok(admitted) => admitted,
            Err(refusal) => {
                warn!(%peer, caller = %caller.identity, reason = %refusal, "CSR refused: limit on requests in flight");
                state.metrics.record_csr_refused(refusal.reason());
                return Err(Status::resource_exhausted(refusal.to_string()));
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
        // Parsing verifies the CSR's signature: CPU work, done with the signing, on the
        // blocking pool.
        let signer = state.signer.load_full();
        let signed = {
            let identity = identity.clone();
            admitted
                .sign(move || {
                    let csr = Csr::parse_pem(&request.csr)?;
                    signer.sign_workload(&csr, &identity, ttl, time::OffsetDateTime::now_utc())
                })
                .await
        };
        drop(admitted);
        let chain = signed
            .map_err(|e| status(SignError::Internal(e)))?
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
