//! A `security.istio.io` RequestAuthentication, reduced to what a waypoint's `jwt_authn`
//! filter reads (istio/istio `pilot/pkg/security/authn/`), and [`Jwks`]: a key set ambientd fetched from a
//! `jwksUri`, which reaches the index as an object of its own so that the pure waypoint
//! builder can inline it.

use crate::discovery::model::authorization::PolicyTargetRef;
use crate::discovery::model::labels::Labels;

/// A `security.istio.io` RequestAuthentication. Only those with `targetRef(s)` attach at a
/// waypoint; selector-based ones are a sidecar's and are kept only so a relist can tell them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestAuthentication {
    pub name: String,
    pub namespace: String,
    /// The `istio.io/rev` label, if any; the index ignores objects of another revision.
    pub revision: Option<String>,
    /// `spec.selector.matchLabels`: `None` without a `selector` field.
    pub selector: Option<Labels>,
    /// `spec.targetRef` when set, else `spec.targetRefs` (istiod's `GetTargetRefs`).
    pub target_refs: Vec<PolicyTargetRef>,
    pub jwt_rules: Vec<JwtRule>,
    /// `metadata.creationTimestamp` as written (RFC 3339): istiod lists these oldest first.
    pub creation: Option<String>,
}

/// One `spec.jwtRules[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwtRule {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// Where ambientd fetches the key set when `jwks` is empty.
    pub jwks_uri: String,
    /// The key set inline (a JWKS document as text).
    pub jwks: String,
    /// Where the token is read from; both empty means Envoy's defaults (the `Authorization`
    /// header as a bearer token, and the `access_token` query parameter).
    pub from_headers: Vec<JwtHeader>,
    pub from_params: Vec<String>,
    pub from_cookies: Vec<String>,
    pub output_payload_to_header: String,
    pub forward_original_token: bool,
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// `timeout` for fetching the key set, in milliseconds (istiod's default is 5 s).
    pub timeout_ms: Option<u64>,
    pub space_delimited_claims: Vec<String>,
}

/// `fromHeaders[i]`: a header and the prefix before the token (`Bearer `).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwtHeader {
    pub name: String,
    pub prefix: String,
}

/// `outputClaimToHeaders[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimToHeader {
    pub header: String,
    pub claim: String,
}

/// The OpenID discovery document of an issuer (istiod reads `jwks_uri` from it when a rule
/// names neither `jwks` nor `jwksUri`).
const OPENID_CONFIGURATION: &str = "/.well-known/openid-configuration";

impl JwtRule {
    /// Where this rule's keys come from when they are not inline: the `jwksUri`, or (with
    /// neither `jwks` nor `jwksUri`) the issuer's OpenID discovery document. `None` when the
    /// keys are inline or there is nothing to fetch from.
    pub fn jwks_source(&self) -> Option<JwksSource> {
        if !self.jwks.is_empty() {
            None
        } else if !self.jwks_uri.is_empty() {
            Some(JwksSource::Uri(self.jwks_uri.clone()))
        } else if !self.issuer.is_empty() {
            let issuer = self.issuer.trim_end_matches('/');
            Some(JwksSource::Discovery(format!(
                "{issuer}{OPENID_CONFIGURATION}"
            )))
        } else {
            None
        }
    }
}

/// Where a key set is fetched from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JwksSource {
    /// A JWKS document at this URI.
    Uri(String),
    /// An OpenID discovery document at this URI, whose `jwks_uri` names the JWKS.
    Discovery(String),
}

impl JwksSource {
    /// The name of its [`Jwks`] object: the URI, or `openid:` and the discovery URI.
    pub fn key(&self) -> String {
        match self {
            JwksSource::Uri(uri) => uri.clone(),
            JwksSource::Discovery(uri) => format!("openid:{uri}"),
        }
    }

    /// The first URI to fetch.
    pub fn uri(&self) -> &str {
        match self {
            JwksSource::Uri(uri) | JwksSource::Discovery(uri) => uri,
        }
    }
}

/// A key set ambientd fetched (by its key-set fetcher), named by [`JwksSource::key`]. Not a Kubernetes
/// object: no source lists it, so it is not in `Kind::ALL`. Only a good fetch is sent; a
/// source without one has no object, and the waypoint fails closed for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Jwks {
    pub name: String,
    /// The JWKS document as fetched.
    pub keys: String,
}
