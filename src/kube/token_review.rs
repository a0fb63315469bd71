//! Kubernetes service-account tokens checked by the API server (`TokenReview`,
//! `authentication.k8s.io/v1`), as istiod's CA authenticates them, with a short cache.
//!
//! The review asks for the `istio-ca` audience (configurable) and accepts a token only when the
//! API server says it is authenticated, for one of our audiences, and belongs to a service
//! account (`system:serviceaccount:<ns>:<sa>` in group `system:serviceaccounts`). Bound tokens
//! also name their pod (name and uid) and, on newer clusters, their node.
//!
//! Results are cached by the token's SHA-256 for a short time (never past the token's own
//! `exp`), so a proxy's burst of CSRs costs one round trip. Rejections are cached for less;
//! API errors are not cached at all. A review that takes longer than its timeout (10 s by
//! default) is abandoned as [`ReviewError::Unavailable`], which the CA answers with gRPC
//! `Unavailable` so the caller retries; each review sent is counted in
//! `ambientd_token_reviews{result}`.
//!
//! [`fetch_oidc`] reads the cluster's issuer and JWKS instead, for local validation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use kube::api::{Api, PostParams};

use crate::ca::review::{ReviewError, ReviewTokens, ReviewedToken};
use crate::metrics::{Metrics, ResultLabel};

/// The audience istiod's CA asks for.
pub const ISTIO_CA_AUDIENCE: &str = "istio-ca";

const SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

struct Cached {
    until: Instant,
    result: Result<ReviewedToken, ReviewError>,
}

/// TokenReview against the API server, with a short cache.
pub struct TokenReviewer {
    client: kube::Client,
    audiences: Vec<String>,
    ttl: Duration,
    rejected_ttl: Duration,
    max_entries: usize,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("audiences", &self.audiences)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl TokenReviewer {
    /// Audience `istio-ca`; accepted tokens cached 30 s, rejected ones 5 s, 10k entries.
    pub fn new(client: kube::Client) -> Self {
        TokenReviewer {
            client,
            audiences: vec![ISTIO_CA_AUDIENCE.to_string()],
            ttl: Duration::from_secs(30),
            rejected_ttl: Duration::from_secs(5),
            max_entries: 10_000,
            timeout: crate::ca::DEFAULT_TOKEN_REVIEW_TIMEOUT,
            metrics: None,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The audiences to ask for; a token must match one of them.
    pub fn with_audiences(mut self, audiences: Vec<String>) -> Self {
        self.audiences = audiences;
        self
    }

    /// How long a review may take before it counts as unavailable.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Counts each review sent in `ambientd_token_reviews{result}`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// How long an answer is reused (accepted, then rejected). Zero disables the cache.
    pub fn with_cache(mut self, accepted: Duration, rejected: Duration) -> Self {
        self.ttl = accepted;
        self.rejected_ttl = rejected;
        self
    }

    /// Reviews `token`, from the cache when a recent answer is there.
    pub async fn review(&self, token: &str) -> Result<ReviewedToken, ReviewError> {
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes");
        let now = Instant::now();
        if let Some(cached) = self.lock().get(&key)
            && cached.until > now
        {
            return cached.result.clone();
        }
        let (result, outcome) = match tokio::time::timeout(self.timeout, self.ask(token)).await {
            Ok(result) => {
                let outcome = match &result {
                    Ok(_) => "authenticated",
                    Err(ReviewError::Rejected(_)) => "rejected",
                    Err(ReviewError::Unavailable(_)) => "unavailable",
                };
                (result, outcome)
            }
            Err(_) => (
                Err(ReviewError::Unavailable(format!(
                    "the API server did not answer within {:?}",
                    self.timeout
                ))),
                "timeout",
            ),
        };
        if let Some(metrics) = &self.metrics {
            metrics
                .token_reviews
                .get_or_create(&ResultLabel {
                    result: outcome.to_string(),
                })
                .inc();
        }
        let ttl = match &result {
            Ok(_) => self.ttl,
            Err(ReviewError::Rejected(_)) => self.rejected_ttl,
            Err(ReviewError::Unavailable(_)) => Duration::ZERO,
        };
        let ttl = ttl.min(until_expiry(token));
        if !ttl.is_zero() {
            let mut cache = self.lock();
            if cache.len() >= self.max_entries {
                cache.retain(|_, c| c.until > now);
                if cache.len() >= self.max_entries {
                    cache.clear();
                }
            }
            cache.insert(
                key,
                Cached {
                    until: now + ttl,
                    result: result.clone(),
                },
            );
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Cached>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn ask(&self, token: &str) -> Result<ReviewedToken, ReviewError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: Some(self.audiences.clone()),
            },
            ..TokenReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ReviewError::Unavailable(e.to_string()))?;
        let status = answer.status.ok_or_else(|| {
            ReviewError::Unavailable("TokenReview answered without a status".into())
        })?;
        interpret(&status, &self.audiences)
    }
}

#[tonic::async_trait]
impl ReviewTokens for TokenReviewer {
    async fn review(&self, token: &str) -> Result<ReviewedToken, ReviewError> {
        TokenReviewer::review(self, token).await
    }
}

/// The API server's service-account token issuer and signing keys, from its OIDC discovery
/// endpoints (`/.well-known/openid-configuration`, `/openid/v1/jwks`), for validating tokens
/// locally (no round trip per token). Needs the `system:service-account-issuer-discovery`
/// ClusterRole, which Kubernetes grants to authenticated users by default.
pub async fn fetch_oidc(
    client: &kube::Client,
) -> Result<(String, jsonwebtoken::jwk::JwkSet), ReviewError> {
    #[derive(serde::Deserialize)]
    struct Discovery {
        issuer: String,
    }
    let get = |path: &str| {
        axum::http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| ReviewError::Unavailable(e.to_string()))
    };
    let discovery: Discovery = client
        .request(get("/.well-known/openid-configuration")?)
        .await
        .map_err(|e| ReviewError::Unavailable(format!("OIDC discovery: {e}")))?;
    let keys: jsonwebtoken::jwk::JwkSet = client
        .request(get("/openid/v1/jwks")?)
        .await
        .map_err(|e| ReviewError::Unavailable(format!("JWKS: {e}")))?;
    Ok((discovery.issuer, keys))
}

/// What a TokenReview status means for us (istiod's `ValidateK8sJwt`, plus the audience check
/// the TokenReview API asks clients to make).
pub fn interpret(
    status: &TokenReviewStatus,
    audiences: &[String],
) -> Result<ReviewedToken, ReviewError> {
    let reject = |why: String| Err(ReviewError::Rejected(why));
    if status.authenticated != Some(true) {
        return reject(match status.error.as_deref() {
            Some(error) if !error.is_empty() => error.to_string(),
            _ => "not authenticated".into(),
        });
    }
    let matched = status.audiences.clone().unwrap_or_default();
    if !audiences.is_empty() && !matched.iter().any(|a| audiences.contains(a)) {
        return reject(format!(
            "not for audience {} (the API server matched {matched:?})",
            audiences.join(",")
        ));
    }
    let Some(user) = &status.user else {
        return reject("no user in the review".into());
    };
    let in_group = user
        .groups
        .as_ref()
        .is_some_and(|g| g.iter().any(|g| g == SERVICE_ACCOUNTS_GROUP));
    if !in_group {
        return reject("not a service-account token".into());
    }
    let username = user.username.as_deref().unwrap_or_default();
    let parts: Vec<&str> = username.split(':').collect();
    let ["system", "serviceaccount", namespace, service_account] = parts[..] else {
        return reject(format!("username {username:?} is not a service account"));
    };
    if namespace.is_empty() || service_account.is_empty() {
        return reject(format!("username {username:?} is not a service account"));
    }
    let extra = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|e| e.get(key))
            .and_then(|v| v.first())
            .filter(|v| !v.is_empty())
            .cloned()
    };
    Ok(ReviewedToken {
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
        pod_name: extra(POD_NAME),
        pod_uid: extra(POD_UID),
        node_name: extra(NODE_NAME),
        audiences: matched,
    })
}

/// Time left before the token's `exp` (read without verifying: only to bound the cache).
/// A token without a readable `exp` is not limited.
fn until_expiry(token: &str) -> Duration {
    #[derive(serde::Deserialize)]
    struct Exp {
        exp: Option<u64>,
    }
    let Ok(claims) = jsonwebtoken::dangerous::insecure_decode_claims::<Exp>(token) else {
        return Duration::MAX;
    };
    let Some(exp) = claims.exp else {
        return Duration::MAX;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Duration::from_secs(exp.saturating_sub(now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;
    use std::collections::BTreeMap;

    fn status(username: &str, groups: &[&str], audiences: &[&str]) -> TokenReviewStatus {
        let mut extra = BTreeMap::new();
        extra.insert(POD_NAME.to_string(), vec!["web-1".to_string()]);
        extra.insert(POD_UID.to_string(), vec!["uid-1".to_string()]);
        TokenReviewStatus {
            authenticated: Some(true),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
            error: None,
            user: Some(UserInfo {
                username: Some(username.to_string()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                extra: Some(extra),
                uid: None,
            }),
        }
    }

    fn ours() -> Vec<String> {
        vec![ISTIO_CA_AUDIENCE.to_string()]
    }

    #[test]
    fn a_bound_service_account_token_is_accepted_with_its_pod() {
        let reviewed = interpret(
            &status(
                "system:serviceaccount:demo:web",
                &["system:serviceaccounts", "system:serviceaccounts:demo"],
                &["istio-ca"],
            ),
            &ours(),
        )
        .unwrap();
        assert_eq!(reviewed.namespace, "demo");
        assert_eq!(reviewed.service_account, "web");
        assert_eq!(reviewed.pod_name.as_deref(), Some("web-1"));
        assert_eq!(reviewed.pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(reviewed.node_name, None);
    }

    #[test]
    fn wrong_audience_user_or_group_is_rejected() {
        let sa = "system:serviceaccount:demo:web";
        let group = ["system:serviceaccounts"];
        for (status, why) in [
            (status(sa, &group, &["api"]), "audience"),
            (status(sa, &group, &[]), "audience"),
            (
                status("alice", &group, &["istio-ca"]),
                "not a service account",
            ),
            (
                status(sa, &["system:authenticated"], &["istio-ca"]),
                "service-account token",
            ),
            (
                TokenReviewStatus {
                    authenticated: Some(false),
                    error: Some("token expired".into()),
                    ..Default::default()
                },
                "token expired",
            ),
        ] {
            let Err(ReviewError::Rejected(reason)) = interpret(&status, &ours()) else {
                panic!("accepted {status:?}");
            };
            assert!(reason.contains(why), "{reason} should mention {why}");
        }
    }

    #[test]
    fn expiry_bounds_the_cache() {
        use jsonwebtoken::{EncodingKey, Header, encode};
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let token = encode(
            &Header::default(),
            &serde_json::json!({"exp": now + 10}),
            &EncodingKey::from_secret(b"k").unwrap(),
        )
        .unwrap();
        let left = until_expiry(&token);
        assert!(left <= Duration::from_secs(10) && left >= Duration::from_secs(8));
        assert_eq!(until_expiry("not a jwt"), Duration::MAX);
    }
}
