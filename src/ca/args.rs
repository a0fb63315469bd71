//! The CA's command-line flags (each also an environment variable), flattened into `serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::ca::CaConfig;
use crate::ca::authorize::Policy;
use crate::ca::signer::TtlPolicy;
use crate::ca::token::{DEFAULT_AUDIENCE, parse_duration};

/// The CA and 15012 flags of `ambientd serve`.
#[derive(Clone, Debug, Args)]
pub struct CaArgs {
    /// TLS listener for delta xDS and the CA (ztunnel's XDS_ADDRESS and CA_ADDRESS).
    #[arg(
        long,
        env = "AMBIENTD_XDS_TLS_ADDRESS",
        default_value = "0.0.0.0:15012",
        value_name = "ADDR"
    )]
    pub xds_tls_address: SocketAddr,

    /// Directory for the self-signed CA (created on first start, reused after), the local token
    /// key, and root-cert.pem, the root bundle clients trust (ztunnel's XDS_ROOT_CA/CA_ROOT_CA).
    #[arg(
        long,
        env = "AMBIENTD_CA_DIR",
        default_value = "ambientd-ca",
        value_name = "DIR"
    )]
    pub ca_dir: PathBuf,

    /// Plugged-in CA (istiod's cacerts): ca-cert.pem, ca-key.pem, root-cert.pem and
    /// cert-chain.pem, or tls.crt, tls.key and ca.crt. Reloaded when its files change.
    #[arg(long, env = "AMBIENTD_CACERTS", value_name = "DIR")]
    pub cacerts: Option<PathBuf>,

    /// Extra SANs for the 15012 serving certificate (DNS names or IPs, comma-separated), besides
    /// istiod.<ns>.svc and ambientd.<ns>.svc.
    #[arg(
        long = "tls-san",
        env = "AMBIENTD_TLS_SANS",
        value_delimiter = ',',
        value_name = "NAME|IP"
    )]
    pub tls_sans: Vec<String>,

    /// A JWK set file (such as the API server's /openid/v1/jwks) to validate service-account
    /// tokens with; needs --jwt-issuer. Reloaded when it changes.
    #[arg(
        long,
        env = "AMBIENTD_JWKS",
        value_name = "FILE",
        requires = "jwt_issuer"
    )]
    pub jwks: Option<PathBuf>,

    /// The `iss` of tokens validated with --jwks.
    #[arg(
        long,
        env = "AMBIENTD_JWT_ISSUER",
        value_name = "ISSUER",
        requires = "jwks"
    )]
    pub jwt_issuer: Option<String>,

    /// Token audiences accepted (comma-separated).
    #[arg(
        long,
        env = "AMBIENTD_TOKEN_AUDIENCES",
        default_value = DEFAULT_AUDIENCE,
        value_delimiter = ','
    )]
    pub token_audiences: Vec<String>,

    /// How long a TokenReview (cluster mode) may take; past it the CSR or stream fails with
    /// `Unavailable` and the caller retries.
    #[arg(long, env = "AMBIENTD_TOKEN_REVIEW_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub token_review_timeout: Duration,

    /// Accounts (namespace/service-account, comma-separated) that may ask for certificates of
    /// pods on their node (ztunnel's ImpersonatedIdentity). Empty: nobody.
    #[arg(
        long,
        env = "AMBIENTD_TRUSTED_NODE_ACCOUNTS",
        default_value = "istio-system/ztunnel",
        value_name = "NS/SA,..."
    )]
    pub trusted_node_accounts: String,

    /// Workload certificate lifetime when the request names none.
    #[arg(long, env = "AMBIENTD_DEFAULT_CERT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub default_cert_ttl: Duration,

    /// Longest workload certificate lifetime a request may ask for.
    #[arg(long, env = "AMBIENTD_MAX_CERT_TTL", default_value = "90d", value_parser = parse_duration)]
    pub max_cert_ttl: Duration,
}

impl CaArgs {
    /// Validates the flags into a [`CaConfig`]; errors name the flag.
    pub fn into_config(self) -> Result<CaConfig, String> {
        let trusted_node_accounts = Policy::parse_accounts(&self.trusted_node_accounts)
            .map_err(|e| format!("--trusted-node-accounts: {e}"))?;
        if self.token_audiences.iter().all(|a| a.trim().is_empty()) {
            return Err("--token-audiences: at least one audience is needed".into());
        }
        if self.default_cert_ttl.is_zero() || self.default_cert_ttl > self.max_cert_ttl {
            return Err(format!(
                "--default-cert-ttl {}s must be positive and at most --max-cert-ttl {}s",
                self.default_cert_ttl.as_secs(),
                self.max_cert_ttl.as_secs()
            ));
        }
        crate::ca::tls::serving_sans("x", "default", &self.tls_sans)?;
        Ok(CaConfig {
            xds_tls_address: self.xds_tls_address,
            ca_dir: self.ca_dir,
            cacerts: self.cacerts,
            tls_sans: self.tls_sans,
            jwks: self.jwks.zip(self.jwt_issuer),
            audiences: self.token_audiences,
            token_review_timeout: self.token_review_timeout,
            trusted_node_accounts,
            ttl: TtlPolicy {
                default: self.default_cert_ttl,
                max: self.max_cert_ttl,
            },
            metrics: Default::default(),
            csr_limits: Default::default(),
        })
    }
}
