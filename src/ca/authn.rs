//! Authenticators: who is calling, from a client certificate or a bearer token.
//!
//! They are tried in order and the first success wins, as in istiod. Each says `Ok(None)` when
//! the request carries no credential of its kind, and `Err(reason)` when it carries a bad one
//! ([`AuthError::Invalid`]) or one that cannot be checked right now
//! ([`AuthError::Unavailable`]: the API server's TokenReview failed or timed out).
//! A Kubernetes TokenReview authenticator (for the Kubernetes source) implements the same
//! [`Authenticator`] trait and slots in beside these.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use tonic::metadata::MetadataMap;
use x509_parser::extensions::GeneralName;

use crate::ca::authorize::{Caller, Method, PodBinding};
use crate::ca::identity::SpiffeId;
use crate::ca::token::{KubernetesClaim, LOCAL_ISSUER, LocalKey};

/// What a request offers as credentials.
#[derive(Clone, Copy, Debug)]
pub struct AuthContext<'a> {
    pub metadata: &'a MetadataMap,
    /// The TLS client certificate chain, already verified against our roots by the handshake.
    pub peer_certs: Option<&'a [CertificateDer<'static>]>,
}

/// One way of authenticating a caller.
#[tonic::async_trait]
pub trait Authenticator: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &'static str;
    /// `Ok(None)`: no credential of this kind. `Err(reason)`: a credential that fails.
    async fn authenticate(&self, ctx: &AuthContext<'_>) -> Result<Option<Caller>, AuthError>;
}

/// Why an authenticator did not accept a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// The credential is bad.
    Invalid(String),
    /// The credential could not be checked now (whoever vouches for it did not answer); the
    /// caller should retry.
    Unavailable(String),
}

impl From<String> for AuthError {
    fn from(reason: String) -> Self {
        AuthError::Invalid(reason)
    }
}

impl From<&str> for AuthError {
    fn from(reason: &str) -> Self {
        AuthError::Invalid(reason.to_string())
    }
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::Invalid(reason) | AuthError::Unavailable(reason) => f.write_str(reason),
        }
    }
}

/// The authenticators to try, in order.
#[derive(Clone, Default)]
pub struct Authenticators(Vec<Arc<dyn Authenticator>>);

/// Why nobody was authenticated: each authenticator's reason, for the log only, and whether
/// one of them could not check its credential (then the caller is told to retry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthFailure(pub Vec<String>, pub Option<String>);

impl AuthFailure {
    /// The reason a credential could not be checked, when that is why nobody was
    /// authenticated (rather than a bad credential): safe to tell the caller.
    pub fn unavailable(&self) -> Option<&str> {
        self.1.as_deref()
    }
}

impl std::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            f.write_str("no credentials (no client certificate, no bearer token)")
        } else {
            f.write_str(&self.0.join("; "))
        }
    }
}

impl std::fmt::Debug for Authenticators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|a| a.name()).collect();
        f.debug_tuple("Authenticators").field(&names).finish()
    }
}

impl Authenticators {
    /// Tries `list` in order.
    pub fn new(list: Vec<Arc<dyn Authenticator>>) -> Self {
        Authenticators(list)
    }

    /// The first authenticator's success, or every failure reason.
    pub async fn authenticate(&self, ctx: &AuthContext<'_>) -> Result<Caller, AuthFailure> {
        let mut reasons = Vec::new();
        let mut unavailable = None;
        for authenticator in &self.0 {
            match authenticator.authenticate(ctx).await {
                Ok(Some(caller)) => return Ok(caller),
                Ok(None) => {}
                Err(reason) => {
                    if let AuthError::Unavailable(why) = &reason {
                        unavailable.get_or_insert_with(|| why.clone());
                    }
                    reasons.push(format!("{}: {reason}", authenticator.name()));
                }
            }
        }
        Err(AuthFailure(reasons, unavailable))
    }
}

/// A client certificate (verified by the TLS handshake against our roots) with a SPIFFE URI SAN
/// in this mesh's trust domain. A root shared with another mesh (a plugged-in CA used by
/// several trust domains) does not make that mesh's workloads ours: their identities are
/// refused, so the CA never signs for another trust domain and no xDS stream is opened for one.
#[derive(Clone, Debug)]
pub struct ClientCertAuthenticator {
    trust_domain: String,
}

impl ClientCertAuthenticator {
    /// Accepts identities in `trust_domain` only.
    pub fn new(trust_domain: &str) -> Self {
        ClientCertAuthenticator {
            trust_domain: trust_domain.to_string(),
        }
    }
}

#[tonic::async_trait]
impl Authenticator for ClientCertAuthenticator {
    fn name(&self) -> &'static str {
        "client-certificate"
    }

    async fn authenticate(&self, ctx: &AuthContext<'_>) -> Result<Option<Caller>, AuthError> {
        let Some(leaf) = ctx.peer_certs.and_then(|certs| certs.first()) else {
            return Ok(None);
        };
        let identity = spiffe_id_of(leaf)?;
        if identity.trust_domain != self.trust_domain {
            return Err(format!(
                "client certificate identity {identity} is not in this mesh's trust domain {}",
                self.trust_domain
            )
            .into());
        }
        Ok(Some(Caller {
            identity,
            method: Method::ClientCertificate,
            pod: None,
            node: None,
        }))
    }
}

/// The first `spiffe://td/ns/X/sa/Y` URI SAN of a certificate.
pub fn spiffe_id_of(cert: &CertificateDer<'_>) -> Result<SpiffeId, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("client certificate does not parse: {e}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("client certificate SAN: {e}"))?;
    san.into_iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .find_map(|name| match name {
            GeneralName::URI(uri) => SpiffeId::parse(uri),
            _ => None,
        })
        .ok_or_else(|| "client certificate has no SPIFFE URI SAN".to_string())
}

/// How many validated tokens to remember (ztunnel sends the same token on every call).
const TOKEN_CACHE: usize = 10_000;
/// Clock skew allowed on `exp`/`nbf`, in seconds.
const LEEWAY: u64 = 60;

/// One trusted signing key.
struct TrustedKey {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

/// An issuer and its keys.
struct TrustedIssuer {
    issuer: String,
    method: Method,
    keys: ArcSwap<Vec<TrustedKey>>,
}

#[derive(Clone)]
struct Cached {
    caller: Caller,
    exp: u64,
}

/// Bearer-token authenticator: projected service-account JWTs validated locally, against the
/// local key (`ambientd token`) and optionally a JWKS file with its issuer. Validated tokens
/// are cached until they expire, so the signature is checked once per token, not per call.
pub struct JwtAuthenticator {
    trust_domain: String,
    audiences: Vec<String>,
    issuers: Vec<TrustedIssuer>,
    cache: Mutex<HashMap<String, Cached>>,
}

/// The claims read from a token (jsonwebtoken checks `exp`, `nbf`, `aud` and `iss`).
#[derive(Deserialize)]
struct TokenClaims {
    #[serde(default)]
    sub: Option<String>,
    #[serde(rename = "kubernetes.io", default)]
    kubernetes: Option<KubernetesClaim>,
    exp: u64,
}

#[derive(Deserialize)]
struct IssuerClaim {
    #[serde(default)]
    iss: Option<String>,
}

impl JwtAuthenticator {
    /// Trusts `local` (tokens from `ambientd token`), requiring one of `audiences`.
    pub fn new(trust_domain: &str, audiences: Vec<String>, local: &LocalKey) -> Self {
        let local = TrustedIssuer {
            issuer: LOCAL_ISSUER.to_string(),
            method: Method::LocalToken,
            keys: ArcSwap::from_pointee(vec![TrustedKey {
                kid: Some(local.kid().to_string()),
                algorithms: vec![Algorithm::ES256],
                key: local.decoding_key().clone(),
            }]),
        };
        JwtAuthenticator {
            trust_domain: trust_domain.to_string(),
            audiences,
            issuers: vec![local],
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Also trusts tokens from `issuer` signed by a key in `jwks`.
    pub fn with_jwks(mut self, issuer: &str, jwks: &JwkSet) -> Result<Self, String> {
        self.issuers.push(TrustedIssuer {
            issuer: issuer.to_string(),
            method: Method::ServiceAccountToken,
            keys: ArcSwap::from_pointee(trusted_keys(jwks)?),
        });
        Ok(self)
    }

    /// Replaces the JWKS keys (after the file changed) and forgets cached tokens.
    pub fn reload_jwks(&self, jwks: &JwkSet) -> Result<(), String> {
        let keys = trusted_keys(jwks)?;
        if let Some(issuer) = self
            .issuers
            .iter()
            .find(|i| i.method == Method::ServiceAccountToken)
        {
            issuer.keys.store(Arc::new(keys));
        }
        self.lock_cache().clear();
        Ok(())
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Validates `token` and returns its caller.
    pub fn validate(&self, token: &str) -> Result<Caller, String> {
        let now = jsonwebtoken::get_current_timestamp();
        if let Some(hit) = self.lock_cache().get(token)
            && hit.exp + LEEWAY > now
        {
            return Ok(hit.caller.clone());
        }
        let (caller, exp) = self.validate_uncached(token)?;
        let mut cache = self.lock_cache();
        if cache.len() >= TOKEN_CACHE {
            cache.retain(|_, c| c.exp + LEEWAY > now);
            if cache.len() >= TOKEN_CACHE {
                cache.clear();
            }
        }
        cache.insert(
            token.to_string(),
            Cached {
                caller: caller.clone(),
                exp,
            },
        );
        Ok(caller)
    }

    fn validate_uncached(&self, token: &str) -> Result<(Caller, u64), String> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        let unverified: IssuerClaim = jsonwebtoken::dangerous::insecure_decode_claims(token)
            .map_err(|e| format!("malformed token: {e}"))?;
        let iss = unverified.iss.unwrap_or_default();
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.issuer == iss)
            .ok_or_else(|| format!("untrusted issuer {iss:?}"))?;
        let keys = issuer.keys.load();
        let candidates: Vec<&TrustedKey> = keys
            .iter()
            .filter(|k| k.algorithms.contains(&header.alg))
            .filter(|k| match (&header.kid, &k.kid) {
                (Some(want), Some(have)) => want == have,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(format!(
                "no key of issuer {iss:?} for kid {:?} and algorithm {:?}",
                header.kid, header.alg
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_audience(&self.audiences);
        validation.set_issuer(&[&issuer.issuer]);
        validation.set_required_spec_claims(&["exp", "aud", "iss"]);
        validation.leeway = LEEWAY;
        let mut last = String::new();
        for key in candidates {
            match jsonwebtoken::decode::<TokenClaims>(token, &key.key, &validation) {
                Ok(data) => {
                    let caller =
                        self.caller(issuer.method, data.claims.sub, data.claims.kubernetes)?;
                    return Ok((caller, data.claims.exp));
                }
                Err(e) => last = describe(&e),
            }
        }
        Err(last)
    }

    fn caller(
        &self,
        method: Method,
        sub: Option<String>,
        claim: Option<KubernetesClaim>,
    ) -> Result<Caller, String> {
        let claim = claim.ok_or("token has no kubernetes.io claim (not a projected token)")?;
        if claim.namespace.is_empty() || claim.serviceaccount.name.is_empty() {
            return Err("token names no namespace or service account".into());
        }
        let expected = format!(
            "system:serviceaccount:{}:{}",
            claim.namespace, claim.serviceaccount.name
        );
        if let Some(sub) = sub
            && sub != expected
        {
            return Err(format!("token subject {sub:?} is not {expected:?}"));
        }
        Ok(Caller {
            identity: SpiffeId::new(
                &self.trust_domain,
                claim.namespace,
                claim.serviceaccount.name,
            ),
            method,
            pod: claim
                .pod
                .filter(|p| !p.name.is_empty())
                .map(|p| PodBinding {
                    name: p.name,
                    uid: Some(p.uid).filter(|u| !u.is_empty()),
                }),
            node: claim.node.map(|n| n.name).filter(|n| !n.is_empty()),
        })
    }
}

fn describe(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "token expired".into(),
        ErrorKind::ImmatureSignature => "token not yet valid".into(),
        ErrorKind::InvalidAudience => "token audience is not accepted".into(),
        ErrorKind::InvalidIssuer => "token issuer is not accepted".into(),
        ErrorKind::InvalidSignature => "token signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("token lacks the {claim} claim"),
        _ => format!("invalid token: {error}"),
    }
}

/// The usable keys of a JWK set: RSA and EC (P-256, P-384) signature keys.
fn trusted_keys(jwks: &JwkSet) -> Result<Vec<TrustedKey>, String> {
    let mut keys = Vec::new();
    for jwk in &jwks.keys {
        let algorithms = match (&jwk.common.key_algorithm, &jwk.algorithm) {
            (Some(alg), _) => match alg.to_string().parse::<Algorithm>() {
                Ok(alg)
                    if !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) =>
                {
                    vec![alg]
                }
                _ => continue,
            },
            (None, AlgorithmParameters::RSA(_)) => vec![
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
            (None, AlgorithmParameters::EllipticCurve(ec)) => match ec.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => continue,
            },
            _ => continue,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("bad JWK: {e}"))?;
        keys.push(TrustedKey {
            kid: jwk.common.key_id.clone(),
            algorithms,
            key,
        });
    }
    if keys.is_empty() {
        return Err("the JWK set has no usable RSA or EC signature key".into());
    }
    Ok(keys)
}

/// Reads a JWK set (`{"keys": [...]}`), as served at the API server's `/openid/v1/jwks`.
pub fn read_jwks(path: &std::path::Path) -> Result<JwkSet, String> {
    let text = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: not a JWK set: {e}", path.display()))
}

#[tonic::async_trait]
impl Authenticator for JwtAuthenticator {
    fn name(&self) -> &'static str {
        "jwt"
    }

    async fn authenticate(&self, ctx: &AuthContext<'_>) -> Result<Option<Caller>, AuthError> {
        match bearer_token(ctx)? {
            Some(token) => Ok(Some(self.validate(token)?)),
            None => Ok(None),
        }
    }
}

/// The `authorization: Bearer <token>` of a request: `None` without the header, an error when
/// it is not a bearer token.
fn bearer_token<'a>(ctx: &AuthContext<'a>) -> Result<Option<&'a str>, String> {
    let Some(value) = ctx.metadata.get("authorization") else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "authorization header is not text".to_string())?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or("authorization header is not a Bearer token")?
        .trim();
    Ok(Some(token))
}

/// A Kubernetes service-account token checked by the API server (TokenReview, audience
/// `istio-ca`): istiod's default authenticator in a cluster. Tried after local validation.
pub struct TokenReviewAuthenticator {
    reviewer: Arc<dyn crate::ca::review::ReviewTokens>,
    trust_domain: String,
}

impl TokenReviewAuthenticator {
    pub fn new(reviewer: Arc<dyn crate::ca::review::ReviewTokens>, trust_domain: &str) -> Self {
        TokenReviewAuthenticator {
            reviewer,
            trust_domain: trust_domain.to_string(),
        }
    }
}

#[tonic::async_trait]
impl Authenticator for TokenReviewAuthenticator {
    fn name(&self) -> &'static str {
        "tokenreview"
    }

    async fn authenticate(&self, ctx: &AuthContext<'_>) -> Result<Option<Caller>, AuthError> {
        let Some(token) = bearer_token(ctx)? else {
            return Ok(None);
        };
        // Any error fails closed; an unanswered review says so, so the caller retries.
        let reviewed = self.reviewer.review(token).await.map_err(|e| match e {
            crate::ca::review::ReviewError::Unavailable(_) => AuthError::Unavailable(e.to_string()),
            crate::ca::review::ReviewError::Rejected(_) => AuthError::Invalid(e.to_string()),
        })?;
        Ok(Some(Caller {
            identity: SpiffeId::new(
                &self.trust_domain,
                reviewed.namespace,
                reviewed.service_account,
            ),
            method: crate::ca::authorize::Method::ServiceAccountToken,
            pod: reviewed
                .pod_name
                .map(|name| crate::ca::authorize::PodBinding {
                    name,
                    uid: reviewed.pod_uid,
                }),
            node: reviewed.node_name,
        }))
    }
}

#[cfg(test)]
mod token_review_tests {
    use super::*;
    use crate::ca::review::{ReviewError, ReviewTokens, ReviewedToken};

    struct Fake;

    #[tonic::async_trait]
    impl ReviewTokens for Fake {
        async fn review(&self, token: &str) -> Result<ReviewedToken, ReviewError> {
            match token {
                "good" => Ok(ReviewedToken {
                    namespace: "istio-system".into(),
                    service_account: "ztunnel".into(),
                    pod_name: Some("ztunnel-abc".into()),
                    pod_uid: Some("uid-1".into()),
                    node_name: Some("node-a".into()),
                    audiences: vec!["istio-ca".into()],
                }),
                "down" => Err(ReviewError::Unavailable("connection refused".into())),
                _ => Err(ReviewError::Rejected("bad token".into())),
            }
        }
    }

    async fn authenticate(header: Option<&str>) -> Result<Option<Caller>, AuthError> {
        let mut metadata = MetadataMap::new();
        if let Some(header) = header {
            metadata.insert("authorization", header.parse().unwrap());
        }
        let ctx = AuthContext {
            metadata: &metadata,
            peer_certs: None,
        };
        TokenReviewAuthenticator::new(Arc::new(Fake), "cluster.local")
            .authenticate(&ctx)
            .await
    }

    #[tokio::test]
    async fn reviewed_tokens_become_callers_and_failures_fail_closed() {
        let caller = authenticate(Some("Bearer good")).await.unwrap().unwrap();
        assert_eq!(
            caller.identity.to_string(),
            "spiffe://cluster.local/ns/istio-system/sa/ztunnel"
        );
        assert_eq!(caller.node.as_deref(), Some("node-a"));
        assert_eq!(caller.pod.unwrap().uid.as_deref(), Some("uid-1"));
        assert!(matches!(
            authenticate(Some("Bearer bad")).await,
            Err(AuthError::Invalid(_))
        ));
        let Err(AuthError::Unavailable(why)) = authenticate(Some("Bearer down")).await else {
            panic!("an unreachable API server is not a rejection");
        };
        assert!(why.contains("TokenReview"), "{why}");
        assert_eq!(authenticate(None).await, Ok(None));
    }
}
