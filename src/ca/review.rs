//! What the CA asks of whoever checks Kubernetes service-account tokens for it: the
//! [`ReviewTokens`] port, implemented by `crate::kube::token_review` (TokenReview against the
//! API server) and by fakes in tests. Defined here so the CA does not depend on the
//! Kubernetes source.

/// What the API server vouches for about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewedToken {
    pub namespace: String,
    pub service_account: String,
    /// The pod a bound token belongs to (`authentication.kubernetes.io/pod-name`).
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// The node of that pod (`authentication.kubernetes.io/node-name`, Kubernetes 1.30+).
    pub node_name: Option<String>,
    /// The audiences the API server matched.
    pub audiences: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The API server's answer is no (or not a service account, or not our audience).
    #[error("token rejected: {0}")]
    Rejected(String),
    /// No answer (API server unreachable, RBAC): not cached; the caller may retry.
    #[error("TokenReview failed: {0}")]
    Unavailable(String),
}

/// Reviews a bearer token. The CA's authenticator holds one of these (a [`TokenReviewer`] in
/// a cluster, a fake in tests).
#[tonic::async_trait]
pub trait ReviewTokens: Send + Sync {
    async fn review(&self, token: &str) -> Result<ReviewedToken, ReviewError>;
}
