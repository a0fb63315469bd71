//! HTTPS backends for the waypoint tests: a test CA ([`TestCa`]) that issues server and client
//! certificates, and an HTTP/1.1-over-TLS server ([`HttpsApp`]) answering `backend <name> path
//! <path>` as [`super::apps::HttpApp`] does, recording each handshake's SNI and client
//! certificate, optionally requiring one.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rcgen::{CertificateParams, DistinguishedName, DnType, Issuer, KeyPair};
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A test CA for the backends' server certificates and the waypoint's client certificate.
pub struct TestCa {
    pub root_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "backend test CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let root_pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            root_pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `name` (DNS SAN and common name): chain PEM, PKCS#8 key PEM.
    pub fn leaf(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn der_chain(pem: &str) -> Vec<CertificateDer<'static>> {
    ambientd::ca::keys::certificates(pem.as_bytes()).expect("chain PEM")
}

fn der_key(pem: &str) -> PrivateKeyDer<'static> {
    let block = ambientd::ca::keys::pem_blocks(pem.as_bytes())
        .expect("key PEM")
        .into_iter()
        .find(|b| b.label == "PRIVATE KEY")
        .expect("a PKCS#8 key");
    PrivateKeyDer::Pkcs8(block.der.into())
}

/// What an [`HttpsApp`] saw of one TLS connection.
#[derive(Clone, Debug, PartialEq)]
pub struct Handshake {
    pub sni: Option<String>,
    /// The client certificate's common name, when it sent one.
    pub client: Option<String>,
}

/// An HTTPS/1.1 server answering `backend <name> path <path>` with a certificate for
/// `<name>.example.com` from `ca`, recording each handshake. With `client_auth`, it requires a
/// client certificate from `ca`.
pub struct HttpsApp {
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpsApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpsApp {
    pub async fn start(address: SocketAddr, name: &str, ca: &TestCa, client_auth: bool) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (chain, key) = ca.leaf(&format!("{name}.example.com"));
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for der in der_chain(&ca.root_pem) {
                roots.add(der).unwrap();
            }
            builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap(),
            )
        } else {
            builder.with_no_client_auth()
        };
        let config = Arc::new(
            builder
                .with_single_cert(der_chain(&chain), der_key(&key))
                .unwrap(),
        );
        let listener = TcpListener::bind(address)
            .await
            .unwrap_or_else(|e| panic!("bind {address}: {e}"));
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let seen = handshakes.clone();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen, name) = (acceptor.clone(), seen.clone(), name.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let session = stream.get_ref().1;
                    seen.lock().unwrap().push(Handshake {
                        sni: session.server_name().map(str::to_string),
                        client: session
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(common_name),
                    });
                    serve_http(stream, &name).await;
                });
            }
        });
        HttpsApp { handshakes, task }
    }

    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes.lock().unwrap().clone()
    }
}

fn common_name(der: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert.subject().iter_common_name().next()?;
    name.as_str().ok().map(str::to_string)
}

/// Answers requests on `stream` until it ends: `backend <name> path <path>`, keep-alive.
async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: S,
    name: &str,
) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let Some(path) = line.split_whitespace().nth(1).map(str::to_string) else {
            return;
        };
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if stream.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((key, value)) = header.split_once(':')
                && key.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        let body = format!("backend {name} path {path}");
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}
