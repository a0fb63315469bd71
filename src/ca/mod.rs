//! The embedded CA and the TLS listener on 15012 (`--xds-tls-address`).
//!
//! * [`roots`]: the CA's key and certificates (self-signed and persisted in `--ca-dir`, or
//!   plugged in from `--cacerts` and reloaded when its files change); the root bundle is
//!   written to `<ca-dir>/root-cert.pem` for clients. In a cluster the material comes from
//!   Secrets (`crate::kube::ca_secret`), written to a directory loaded as a plugged-in CA, and
//!   [`CaState::root_bundles`] feeds the root ConfigMaps.
//! * [`signer`]: CSR in, `[leaf, intermediates…, root]` out; time is passed in.
//! * [`authn`]: who is calling (client certificate, service-account JWT), tried in order.
//! * [`authorize`] (pure): which identity the caller may have, including ztunnel's
//!   impersonation of pods on its node ([`pods`] answers "which pods run where"), and the xDS
//!   identity check.
//! * [`token`]: the local token key and `ambientd token`.
//! * [`tls`] and [`service`]: rustls with ztunnel's parameters, the certificate service, and the
//!   guard in front of delta ADS.
//!
//! [`start`] wires them: it loads the CA, issues the serving certificate, binds the listener,
//! and returns a [`CaServer`] to run.

pub mod args;
pub mod authn;
pub mod authorize;
pub mod identity;
pub mod keys;
pub mod limit;
pub mod pods;
pub mod review;
pub mod roots;
pub mod sds;
pub mod service;
pub mod signer;
pub mod tls;
pub mod token;
pub mod xds_guard;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use notify::Watcher;
use rcgen::{KeyPair, SanType};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::discovery::Settings;
use crate::metrics::Metrics;

pub use args::CaArgs;
pub use authn::{
    AuthContext, AuthError, AuthFailure, Authenticator, Authenticators, JwtAuthenticator,
    TokenReviewAuthenticator,
};
pub use authorize::{Caller, Policy};
pub use identity::SpiffeId;
pub use pods::{PodIndex, PodInfo, SnapshotPods, StaticPods};
pub use service::{CaState, CertificateService};
pub use signer::{Signer, TtlPolicy};
pub use xds_guard::XdsGuard;

/// Lifetime of the 15012 serving certificate; it is renewed at half-life.
pub const SERVING_TTL: Duration = Duration::from_secs(24 * 3600);
/// How often the CA files and JWKS are re-read even without a file event.
const RECHECK: Duration = Duration::from_secs(60);
/// Quiet time after a file event before reloading (secret updates touch several files).
const SETTLE: Duration = Duration::from_millis(500);

/// The CA's settings (flags in [`crate::config`]).
#[derive(Clone, Debug)]
pub struct CaConfig {
    /// TLS listener for delta ADS and the certificate service.
    pub xds_tls_address: SocketAddr,
    /// Self-signed CA, local token key, and the published `root-cert.pem`.
    pub ca_dir: PathBuf,
    /// A plugged-in CA directory, used instead of the self-signed CA.
    pub cacerts: Option<PathBuf>,
    /// Extra SANs (DNS names or IPs) for the serving certificate.
    pub tls_sans: Vec<String>,
    /// A JWK set file and the issuer whose tokens it validates.
    pub jwks: Option<(PathBuf, String)>,
    /// Audiences a token must carry one of.
    pub audiences: Vec<String>,
    /// How long a TokenReview may take before the caller is told the API server is
    /// unavailable (cluster mode).
    pub token_review_timeout: Duration,
    /// Accounts allowed to impersonate (`ImpersonatedIdentity`).
    pub trusted_node_accounts: Vec<(String, String)>,
    pub ttl: TtlPolicy,
    /// Where the `citadel_server_*` metrics go; the app shares its registry here.
    pub metrics: Arc<Metrics>,
    /// Certificate requests in flight, per caller and in all (docs/ca.md, "Limits").
    pub csr_limits: limit::CsrLimits,
}

/// The default of `--token-review-timeout`.
pub const DEFAULT_TOKEN_REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

impl CaConfig {
    /// Defaults with the listener on `127.0.0.1:0` and the CA in `ca_dir`: for tests.
    pub fn local(ca_dir: impl Into<PathBuf>) -> Self {
        CaConfig {
            xds_tls_address: ([127, 0, 0, 1], 0).into(),
            ca_dir: ca_dir.into(),
            cacerts: None,
            tls_sans: vec!["127.0.0.1".into(), "localhost".into()],
            jwks: None,
            audiences: vec![token::DEFAULT_AUDIENCE.into()],
            token_review_timeout: DEFAULT_TOKEN_REVIEW_TIMEOUT,
            trusted_node_accounts: vec![("istio-system".into(), "ztunnel".into())],
            ttl: TtlPolicy::default(),
            metrics: Arc::default(),
            csr_limits: limit::CsrLimits::default(),
        }
    }

    /// Where clients find the root bundle.
    pub fn root_cert_path(&self) -> PathBuf {
        self.ca_dir.join(roots::ROOT_CERT)
    }
}

/// Why the CA could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error(transparent)]
    Roots(#[from] roots::RootsError),
    #[error("--jwks {path}: {reason}")]
    Jwks { path: PathBuf, reason: String },
    #[error("serving certificate: {0}")]
    Serving(String),
    #[error("binding --xds-tls-address {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("xDS TLS server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A started CA: bound, with its first serving certificate. [`CaServer::serve`] runs it.
pub struct CaServer {
    /// The bound `--xds-tls-address`.
    pub address: SocketAddr,
    /// `<ca-dir>/root-cert.pem`.
    pub root_cert: PathBuf,
    /// Shared with the services; tests and benchmarks reach the signer through it.
    pub state: Arc<CaState>,
    listener: TcpListener,
    tls: Arc<ArcSwap<ServerConfig>>,
    ads: crate::push::route::AdsService,
    jwt: Arc<JwtAuthenticator>,
    config: CaConfig,
    sans: Vec<SanType>,
    fingerprint: Vec<u8>,
    shutdown: CancellationToken,
}

/// Loads (or creates) the CA, issues the serving certificate and binds the TLS listener.
pub async fn start(
    config: &CaConfig,
    settings: &Settings,
    ads: crate::push::route::AdsService,
    pods: Arc<dyn PodIndex>,
    shutdown: CancellationToken,
) -> Result<CaServer, CaError> {
    start_with(config, settings, ads, pods, Vec::new(), shutdown).await
}

/// [`start`], with more authenticators (such as Kubernetes TokenReview) tried after the client
/// certificate and the locally validated JWTs.
pub async fn start_with(
    config: &CaConfig,
    settings: &Settings,
    ads: crate::push::route::AdsService,
    pods: Arc<dyn PodIndex>,
    extra_authenticators: Vec<Arc<dyn Authenticator>>,
    shutdown: CancellationToken,
) -> Result<CaServer, CaError> {
    let now = OffsetDateTime::now_utc();
    let loaded = load_ca(config, &settings.trust_domain, now)?;
    let root_cert = roots::publish_root(&config.ca_dir, loaded.signer.root_bundle())?;
    let local_key = token::LocalKey::load_or_create(&config.ca_dir)?;
    let mut jwt =
        JwtAuthenticator::new(&settings.trust_domain, config.audiences.clone(), &local_key);
    if let Some((path, issuer)) = &config.jwks {
        let jwks_error = |reason| CaError::Jwks {
            path: path.clone(),
            reason,
        };
        let set = authn::read_jwks(path).map_err(jwks_error)?;
        jwt = jwt.with_jwks(issuer, &set).map_err(jwks_error)?;
    }
    let jwt = Arc::new(jwt);
    let mut list: Vec<Arc<dyn Authenticator>> = vec![
        Arc::new(authn::ClientCertAuthenticator::new(&settings.trust_domain)),
        jwt.clone() as Arc<dyn Authenticator>,
    ];
    list.extend(extra_authenticators);
    let authenticators = Authenticators::new(list);
    let sans = tls::serving_sans(
        &settings.system_namespace,
        &settings.revision,
        &config.tls_sans,
    )
    .map_err(CaError::Serving)?;
    let tls_config = serving_config(&loaded.signer, &sans, now)?;
    let state = Arc::new(CaState {
        signer: ArcSwap::from_pointee(loaded.signer),
        authenticators,
        policy: Policy {
            trusted_node_accounts: config.trusted_node_accounts.clone(),
            trust_domain: settings.trust_domain.clone(),
        },
        ttl: config.ttl,
        pods,
        metrics: config.metrics.clone(),
        root_bundle: tokio::sync::watch::channel(String::new()).0,
        csr_limits: config.csr_limits.clone(),
    });
    state.record_root_expiry();
    let listener =
        crate::push::server::listen(config.xds_tls_address).map_err(|source| CaError::Bind {
            address: config.xds_tls_address,
            source,
        })?;
    let address = listener.local_addr().map_err(|source| CaError::Bind {
        address: config.xds_tls_address,
        source,
    })?;
    info!(%address, root_cert = %root_cert.display(), plugged_in = config.cacerts.is_some(), "CA ready; delta xDS and CreateCertificate over TLS");
    Ok(CaServer {
        address,
        root_cert,
        state,
        listener,
        tls: Arc::new(ArcSwap::new(tls_config)),
        ads,
        jwt,
        config: config.clone(),
        sans,
        fingerprint: loaded.fingerprint,
        shutdown,
    })
}

fn load_ca(
    config: &CaConfig,
    trust_domain: &str,
    now: OffsetDateTime,
) -> Result<roots::Loaded, roots::RootsError> {
    match &config.cacerts {
        Some(dir) => roots::load_plugged_in(dir, now),
        None => roots::load_or_create_self_signed(&config.ca_dir, trust_domain, now),
    }
}

/// A fresh P-256 serving key and certificate from `signer`, as a rustls config.
fn serving_config(
    signer: &Signer,
    sans: &[SanType],
    now: OffsetDateTime,
) -> Result<Arc<ServerConfig>, CaError> {
    let key = KeyPair::generate().map_err(|e| CaError::Serving(e.to_string()))?;
    let chain = signer
        .sign_server(&key, sans.to_vec(), SERVING_TTL, now)
        .map_err(|e| CaError::Serving(e.to_string()))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    tls::server_config(chain, key, signer.roots()).map_err(CaError::Serving)
}

impl CaServer {
    /// Serves until shutdown, renewing the serving certificate at half-life and reloading the
    /// plugged-in CA and the JWKS file when they change.
    pub async fn serve(self) -> Result<(), CaError> {
        let CaServer {
            listener,
            tls,
            ads,
            state,
            jwt,
            config,
            sans,
            fingerprint,
            shutdown,
            ..
        } = self;
        let incoming = tls::incoming(listener, tls.clone(), shutdown.clone());
        let server = crate::push::server::grpc_server()
            .add_service(XdsGuard::new(ads, state.clone()))
            .add_service(CertificateService::new(state.clone()).into_service())
            .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
        let maintain = Maintenance {
            state,
            tls,
            jwt,
            config,
            sans,
            fingerprint,
            renew_at: std::time::Instant::now() + SERVING_TTL / 2,
        }
        .run(shutdown);
        let (served, ()) = tokio::join!(server, maintain);
        served.map_err(CaError::from)
    }
}

/// The CA's background duties.
struct Maintenance {
    state: Arc<CaState>,
    tls: Arc<ArcSwap<ServerConfig>>,
    jwt: Arc<JwtAuthenticator>,
    config: CaConfig,
    sans: Vec<SanType>,
    fingerprint: Vec<u8>,
    renew_at: std::time::Instant,
}

impl Maintenance {
    async fn run(mut self, shutdown: CancellationToken) {
        let (events_tx, mut events) = mpsc::unbounded_channel::<()>();
        let mut watched: Vec<&Path> = Vec::new();
        if let Some(dir) = &self.config.cacerts {
            watched.push(dir);
        }
        if let Some(parent) = self.config.jwks.as_ref().and_then(|(p, _)| p.parent()) {
            watched.push(parent);
        }
        let _watcher = watch(&watched, events_tx);
        let mut jwks_bytes = self.read_jwks_bytes();
        loop {
            let wake = tokio::time::Instant::from_std(self.renew_at)
                .min(tokio::time::Instant::now() + RECHECK);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(wake) => {}
                Some(()) = events.recv() => {
                    tokio::time::sleep(SETTLE).await;
                    while events.try_recv().is_ok() {}
                }
            }
            let now = OffsetDateTime::now_utc();
            if self.config.cacerts.is_some() {
                self.reload_ca(now);
            }
            if std::time::Instant::now() >= self.renew_at {
                self.renew_serving(now);
            }
            if let Some((path, _)) = &self.config.jwks {
                let bytes = self.read_jwks_bytes();
                if bytes != jwks_bytes {
                    match authn::read_jwks(path).and_then(|set| self.jwt.reload_jwks(&set)) {
                        Ok(()) => info!(path = %path.display(), "reloaded the JWK set"),
                        Err(error) => warn!(%error, "keeping the previous JWK set"),
                    }
                    jwks_bytes = bytes;
                }
            }
        }
    }

    fn read_jwks_bytes(&self) -> Option<Vec<u8>> {
        self.config
            .jwks
            .as_ref()
            .and_then(|(path, _)| std::fs::read(path).ok())
    }

    fn reload_ca(&mut self, now: OffsetDateTime) {
        let Some(dir) = &self.config.cacerts else {
            return;
        };
        match roots::load_plugged_in(dir, now) {
            Ok(loaded) if loaded.fingerprint == self.fingerprint => {}
            Ok(loaded) => {
                let bundle = loaded.signer.root_bundle().to_string();
                self.fingerprint = loaded.fingerprint;
                self.state.signer.store(Arc::new(loaded.signer));
                self.state.record_root_expiry();
                info!(dir = %dir.display(), "reloaded the plugged-in CA");
                self.renew_serving(now);
                // Last, so a client that sees the new root finds a server that uses it.
                if let Err(error) = roots::publish_root(&self.config.ca_dir, &bundle) {
                    warn!(%error, "could not write the new root-cert.pem");
                }
            }
            // A Secret update lands file by file; a half-written set is retried later.
            Err(error) => warn!(%error, "keeping the current CA"),
        }
    }

    fn renew_serving(&mut self, now: OffsetDateTime) {
        match serving_config(&self.state.signer.load(), &self.sans, now) {
            Ok(config) => {
                self.tls.store(config);
                self.renew_at = std::time::Instant::now() + SERVING_TTL / 2;
                info!("issued a new serving certificate");
            }
            Err(error) => {
                warn!(%error, "could not renew the serving certificate; retrying");
                self.renew_at = std::time::Instant::now() + RECHECK;
            }
        }
    }
}

/// Watches `dirs` (non-recursively), sending `()` on any change. `None` if watching failed
/// (the periodic re-check still notices changes).
fn watch(dirs: &[&Path], events: mpsc::UnboundedSender<()>) -> Option<notify::RecommendedWatcher> {
    if dirs.is_empty() {
        return None;
    }
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = events.send(());
        }
    })
    .map_err(|error| warn!(%error, "cannot watch CA files; re-reading them every minute"))
    .ok()?;
    for dir in dirs {
        if let Err(error) = watcher.watch(dir, notify::RecursiveMode::NonRecursive) {
            warn!(dir = %dir.display(), %error, "cannot watch; re-reading every minute");
        }
    }
    Some(watcher)
}
