//! The CA's decoders: CSRs (`CreateCertificate` on 15012), bearer tokens (every 15012 call) and
//! client certificate chains (the TLS handshake on 15012, then the identity taken from the leaf).
//!
//! The CA runs as `ambientd serve` builds it (src/ca/mod.rs): a self-signed root loaded from a
//! CA directory, the client-certificate and JWT authenticators in that order (the JWT one
//! trusting the local token key and a JWKS issuer), ztunnel's impersonation policy, and a pod
//! index with one pod.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ambientd::ca::authn::{ClientCertAuthenticator, spiffe_id_of};
use ambientd::ca::authorize::{Method, ProxyClaim, authorize, check_xds_identity};
use ambientd::ca::service::IMPERSONATED_IDENTITY;
use ambientd::ca::signer::Csr;
use ambientd::ca::token::{DEFAULT_AUDIENCE, LocalKey, Subject, local_claims};
use ambientd::ca::{
    AuthContext, Authenticators, CaState, CertificateService, JwtAuthenticator, PodInfo, Policy,
    SpiffeId, StaticPods, TtlPolicy,
};
use ambientd::metrics::Metrics;
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::istio::v1::auth::IstioCertificateRequest;
use ambientd::pb::istio::v1::auth::istio_certificate_service_server::IstioCertificateService;
use arc_swap::ArcSwap;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use tonic::metadata::MetadataMap;

use crate::{fixtures, runtime};

pub const TRUST_DOMAIN: &str = "cluster.local";
/// The JWKS issuer (as a cluster's service-account tokens name it).
pub const JWKS_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The identity whose token the harness's own calls carry: ztunnel, a node agent.
pub const ZTUNNEL: (&str, &str) = ("istio-system", "ztunnel");
/// ztunnel's node, where the one pod of the pod index runs.
pub const NODE: &str = "node-1";
/// The pod ztunnel may impersonate (it runs on [`NODE`]).
pub const POD: (&str, &str, &str) = (
    "bookinfo",
    "productpage-v1-6b746f74dc-9stvs",
    "bookinfo-productpage",
);

/// The CA and what the targets call it with.
pub struct Ca {
    pub state: Arc<CaState>,
    /// `Bearer <ztunnel's token>`, valid for ten years from the process's start.
    pub ztunnel_bearer: String,
    /// 15012's client certificate verifier over the CA's roots.
    pub verifier: Arc<dyn ClientCertVerifier>,
}

/// The CA, built on first use.
pub fn ca() -> &'static Ca {
    static CA: LazyLock<Ca> = LazyLock::new(build);
    &CA
}

fn build() -> Ca {
    let dir = fixtures();
    let now = time::OffsetDateTime::now_utc();
    let loaded =
        ambientd::ca::roots::load_or_create_self_signed(&dir.join("ca"), TRUST_DOMAIN, now)
            .expect("fixtures/ca");
    let roots = loaded.signer.roots().to_vec();
    let local = LocalKey::load_or_create(&dir).expect("fixtures/token-key.pem");
    let jwks = ambientd::ca::authn::read_jwks(&dir.join("jwks.json")).expect("fixtures/jwks.json");
    let jwt = JwtAuthenticator::new(TRUST_DOMAIN, vec![DEFAULT_AUDIENCE.to_string()], &local)
        .with_jwks(JWKS_ISSUER, &jwks)
        .expect("the JWKS has a usable key");
    let mut pods = StaticPods::default();
    pods.insert(
        POD.0,
        POD.1,
        PodInfo {
            service_account: POD.2.to_string(),
            node: NODE.to_string(),
            uid: None,
        },
    );
    let state = Arc::new(CaState {
        signer: ArcSwap::from_pointee(loaded.signer),
        authenticators: Authenticators::new(vec![
            Arc::new(ClientCertAuthenticator::new(TRUST_DOMAIN)),
            Arc::new(jwt),
        ]),
        policy: Policy {
            trusted_node_accounts: vec![(ZTUNNEL.0.to_string(), ZTUNNEL.1.to_string())],
            trust_domain: TRUST_DOMAIN.to_string(),
        },
        ttl: TtlPolicy::default(),
        pods: Arc::new(pods),
        metrics: Arc::new(Metrics::new()),
        root_bundle: tokio::sync::watch::channel(String::new()).0,
        csr_limits: Default::default(),
    });
    let subject = Subject {
        namespace: ZTUNNEL.0.to_string(),
        service_account: ZTUNNEL.1.to_string(),
        pod: None,
        node: Some(NODE.to_string()),
    };
    let claims = local_claims(
        &subject,
        &[DEFAULT_AUDIENCE.to_string()],
        jsonwebtoken::get_current_timestamp(),
        Duration::from_secs(10 * 365 * 24 * 3600),
    );
    let token = local.mint(&claims).expect("minting ztunnel's token");
    let verifier = ambientd::ca::tls::client_verifier(&roots, ambientd::ca::tls::provider())
        .expect("the client verifier");
    Ca {
        state,
        ztunnel_bearer: format!("Bearer {token}"),
        verifier,
    }
}

fn ztunnel() -> SpiffeId {
    SpiffeId::new(TRUST_DOMAIN, ZTUNNEL.0, ZTUNNEL.1)
}

/// `CreateCertificate` with `data` as the CSR, from ztunnel with its token: the service
/// authenticates, authorizes, parses and verifies the CSR, and signs. The input is the
/// request's `csr` field, a protobuf string: bytes that are not UTF-8 never reach the service.
pub fn csr_pem(data: &[u8]) {
    let Ok(pem) = std::str::from_utf8(data) else {
        return;
    };
    let ca = ca();
    // Both forms the service takes: the caller's own identity, and (as ztunnel asks in shared
    // mode) a pod's on its node.
    for impersonate in [None, Some(pod_identity())] {
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr: pem.to_string(),
            validity_duration: 0,
            metadata: impersonate.as_ref().map(|id| Struct {
                fields: [(
                    IMPERSONATED_IDENTITY.to_string(),
                    Value {
                        kind: Some(Kind::StringValue(id.to_string())),
                    },
                )]
                .into(),
            }),
        });
        request.metadata_mut().insert(
            "authorization",
            ca.ztunnel_bearer.parse().expect("a header value"),
        );
        let service = CertificateService::new(ca.state.clone());
        let result = runtime().block_on(service.create_certificate(request));
        match result {
            Ok(response) => {
                // Whatever the CSR asks for, the certificate names the authorized identity.
                let want = impersonate.unwrap_or_else(ztunnel);
                let chain = response.into_inner().cert_chain;
                let leaf =
                    ambientd::ca::keys::certificates(chain[0].as_bytes()).expect("the leaf is PEM");
                assert_eq!(spiffe_id_of(&leaf[0]).expect("a SPIFFE SAN"), want);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                assert!(status.message().contains("CSR"), "{status:?}");
            }
        }
    }
}

fn pod_identity() -> SpiffeId {
    SpiffeId::new(TRUST_DOMAIN, POD.0, POD.2)
}

/// A CSR's DER (what the PEM block holds): parsed, its signature verified, then signed for a
/// fixed identity, as the service does once the caller is authorized.
pub fn csr_der(data: &[u8]) {
    let Ok(csr) = Csr::parse_der(data) else {
        return;
    };
    let identity = pod_identity();
    let signer = ca().state.signer.load();
    let chain = signer
        .sign_workload(
            &csr,
            &identity,
            Duration::from_secs(3600),
            time::OffsetDateTime::now_utc(),
        )
        .expect("a verified CSR is signed");
    let leaf = ambientd::ca::keys::certificates(chain[0].as_bytes()).expect("the leaf is PEM");
    assert_eq!(spiffe_id_of(&leaf[0]).expect("a SPIFFE SAN"), identity);
}

/// `data` as a request's `authorization` header: the authenticators of every 15012 call, then
/// the CA's authorization of the caller's own identity and of a pod's.
pub fn jwt(data: &[u8]) {
    // HTTP/2 delivers only valid header values.
    let Ok(value) = http::HeaderValue::from_bytes(data) else {
        return;
    };
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value);
    let metadata = MetadataMap::from_headers(headers);
    let state = &ca().state;
    let extensions = http::Extensions::new();
    let Ok(caller) = runtime().block_on(state.authenticate(&metadata, &extensions)) else {
        return;
    };
    assert!(
        matches!(
            caller.method,
            Method::LocalToken | Method::ServiceAccountToken
        ),
        "{caller:?}"
    );
    let own = authorize(&state.policy, &caller, None, state.pods.as_ref());
    assert_eq!(own.as_ref().ok(), Some(&caller.identity));
    let pod = pod_identity().to_string();
    if let Ok(granted) = authorize(&state.policy, &caller, Some(&pod), state.pods.as_ref()) {
        assert_eq!(granted.to_string(), pod);
    }
}

/// A certificate chain as a TLS client presents it: each certificate after a 3-byte length (as
/// in the handshake's Certificate message). Input that is not such a list is one certificate.
pub fn split_chain(data: &[u8]) -> Vec<CertificateDer<'static>> {
    let mut chain = Vec::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        if rest.len() - 3 < len {
            break;
        }
        chain.push(CertificateDer::from(rest[3..3 + len].to_vec()));
        rest = &rest[3 + len..];
    }
    if !rest.is_empty() || chain.is_empty() {
        return vec![CertificateDer::from(data.to_vec())];
    }
    chain
}

/// What 15012 does with a presented chain: the handshake's verifier (our roots), then the
/// client-certificate authenticator's identity, and the xDS identity check. The leaf's SAN
/// parse also runs on chains that fail verification, which the server never parses: a
/// superset of the server's path.
pub fn peer_certificate(data: &[u8]) {
    let chain = split_chain(data);
    let ca = ca();
    let (leaf, intermediates) = chain.split_first().expect("one certificate at least");
    let verified = ca
        .verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .is_ok();
    let identity = spiffe_id_of(leaf);
    if !verified {
        return;
    }
    let metadata = MetadataMap::new();
    let ctx = AuthContext {
        metadata: &metadata,
        peer_certs: Some(&chain),
    };
    let caller = runtime().block_on(ca.state.authenticators.authenticate(&ctx));
    match (caller, identity) {
        (Ok(caller), Ok(identity)) => {
            assert_eq!(caller.identity, identity);
            assert!(matches!(caller.method, Method::ClientCertificate));
            let claim = ProxyClaim {
                namespace: identity.namespace.clone(),
                service_account: Some(identity.service_account.clone()),
            };
            check_xds_identity(&caller.identity, &claim).expect("a proxy of its own identity");
        }
        (Err(_), Err(_)) => {}
        (caller, identity) => panic!("authenticated {caller:?}, SAN {identity:?}"),
    }
}
