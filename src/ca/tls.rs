//! TLS for 15012: the server config ztunnel can talk to, and a listener that hands finished
//! handshakes to tonic.
//!
//! ztunnel offers TLS 1.3 (1.2 only when `TLS12_ENABLED`), AES-GCM suites only, ALPN `h2`, and no
//! client certificate. We accept exactly that (plus TLS 1.2 AES-GCM), and verify a client
//! certificate when one is sent. The config is swapped whole when the serving certificate is
//! renewed or the roots change; each new connection takes the current one.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rcgen::SanType;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{CipherSuite, RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::push::listener::ProxyConnection;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes queued for the gRPC server.
const ACCEPT_BUFFER: usize = 128;

/// ring, limited to the AES-GCM suites ztunnel offers.
pub fn provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|suite| {
        matches!(
            suite.suite(),
            CipherSuite::TLS13_AES_256_GCM_SHA384
                | CipherSuite::TLS13_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
                | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
                | CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(provider)
}

/// A server config presenting `chain` (leaf first) with `key`, speaking h2, and verifying an
/// optional client certificate against `roots`.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: &[CertificateDer<'static>],
) -> Result<Arc<ServerConfig>, String> {
    let provider = provider();
    let verifier = client_verifier(roots, provider.clone())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("serving certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How 15012 verifies a client certificate chain: against `roots`, optional (a caller may
/// offer none and authenticate with a token instead). Also the entry point of the
/// `peer_certificate` fuzz target (docs/fuzzing.md).
pub fn client_verifier(
    roots: &[CertificateDer<'static>],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut store = RootCertStore::empty();
    for root in roots {
        store
            .add(root.clone())
            .map_err(|e| format!("root certificate not usable as a trust anchor: {e}"))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(store), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("client verifier: {e}"))
}

/// The serving certificate's SANs, as DNS names: istiod's `istiod.<ns>.svc`,
/// `istiod-remote.<ns>.svc` and `istio-pilot.<ns>.svc`, `istiod-<rev>.<ns>.svc` when `revision`
/// is not `default`, and our own `ambientd.<ns>.svc`; then each extra as an IP SAN if it parses
/// as an IP, else a DNS SAN.
pub fn serving_sans(
    namespace: &str,
    revision: &str,
    extra: &[String],
) -> Result<Vec<SanType>, String> {
    let mut names = vec![
        format!("istiod.{namespace}.svc"),
        format!("istiod-remote.{namespace}.svc"),
        format!("istio-pilot.{namespace}.svc"),
    ];
    if revision != "default" {
        names.push(format!("istiod-{revision}.{namespace}.svc"));
    }
    names.push(format!("ambientd.{namespace}.svc"));
    let own = names.len();
    names.extend(extra.iter().cloned());
    let mut sans = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.as_str().try_into().map_err(|e| {
                if i < own {
                    format!("serving name {name:?} (from the namespace and --revision): {e}")
                } else {
                    format!("--tls-san {name:?}: {e}")
                }
            })?),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

/// Accepts TCP connections on `listener` and completes TLS handshakes concurrently with the
/// current `config`; finished streams come out of the returned stream, for
/// `Server::serve_with_incoming`.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ArcSwap<ServerConfig>>,
    shutdown: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<ProxyConnection>>> {
    let (tx, rx) = mpsc::channel(ACCEPT_BUFFER);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    debug!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let tcp = ProxyConnection::new(tcp);
            let acceptor = tokio_rustls::TlsAcceptor::from(config.load_full());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(error)) => debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(name: &str) -> SanType {
        SanType::DnsName(name.try_into().unwrap())
    }

    #[test]
    fn serving_sans_name_istiod_its_aliases_the_revision_and_extras() {
        let sans = serving_sans("ns", "canary", &["10.0.0.7".into(), "x.example".into()]).unwrap();
        assert_eq!(
            sans,
            vec![
                dns("istiod.ns.svc"),
                dns("istiod-remote.ns.svc"),
                dns("istio-pilot.ns.svc"),
                dns("istiod-canary.ns.svc"),
                dns("ambientd.ns.svc"),
                SanType::IpAddress("10.0.0.7".parse().unwrap()),
                dns("x.example"),
            ]
        );
        let default = serving_sans("ns", "default", &[]).unwrap();
        assert!(!default.contains(&dns("istiod-default.ns.svc")));
        assert_eq!(default.len(), 4);
        assert!(
            serving_sans("ns", "default", &["caf\u{e9}.example".into()])
                .unwrap_err()
                .contains("--tls-san")
        );
    }
}
