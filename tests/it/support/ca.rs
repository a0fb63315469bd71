//! Shared helpers for the CA tests: CSRs made as ztunnel makes them, a gRPC channel with
//! ztunnel's exact TLS settings, token minting, and chain verification with webpki.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ambientd::ca::token::{Claims, LocalKey, Ref, Subject, local_claims};
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::istio::v1::auth::IstioCertificateRequest;
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore};
use tonic::transport::{Channel, Endpoint};
use x509_parser::prelude::*;

/// A CA's 15012 server running in the test, with an xDS service behind it that has no
/// snapshot yet (kept so while `snapshots` lives).
pub struct Started {
    pub address: std::net::SocketAddr,
    pub shutdown: tokio_util::sync::CancellationToken,
    pub snapshots: tokio::sync::watch::Sender<Option<Arc<ambientd::discovery::Snapshot>>>,
}

/// Starts `ambientd::ca::start`'s server with `config` and `pods`, serving in a task.
pub async fn start_server(
    config: &ambientd::ca::CaConfig,
    pods: ambientd::ca::StaticPods,
) -> Started {
    let (snapshots, rx) = tokio::sync::watch::channel(None);
    let ads = ambientd::push::AdsServer::new(
        rx,
        Arc::new(ambientd::push::Registry::default()),
        Arc::new(ambientd::metrics::Metrics::new()),
    )
    .into_service();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = ambientd::ca::start(
        config,
        &ambientd::discovery::Settings::default(),
        ads,
        Arc::new(pods),
        shutdown.clone(),
    )
    .await
    .expect("start the CA");
    let address = server.address;
    tokio::spawn(server.serve());
    Started {
        address,
        shutdown,
        snapshots,
    }
}

/// How long any single expected event may take.
pub const WAIT: Duration = Duration::from_secs(10);
/// The server name ztunnel checks (from `https://istiod.istio-system.svc:15012`).
pub const ISTIOD: &str = "istiod.istio-system.svc";

/// A CSR exactly as ztunnel makes one: P-256 key, ECDSA-SHA256, empty subject, and one
/// critical URI SAN with the identity.
pub fn ztunnel_csr(identity: &str) -> (KeyPair, String) {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(identity.try_into().expect("ia5"))];
    let csr = params.serialize_request(&key).expect("csr");
    (key, csr.pem().expect("pem"))
}

fn ztunnel_tls_builder(
    root_cert: &Path,
) -> rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| {
        matches!(
            s.suite(),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
                | rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        )
    });
    let mut roots = RootCertStore::empty();
    let pem = std::fs::read(root_cert).expect("read root-cert.pem");
    for cert in ambientd::ca::keys::certificates(&pem).expect("root pem") {
        roots.add(cert).expect("root");
    }
    ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("versions")
        .with_root_certificates(roots)
}

fn h2(mut config: ClientConfig) -> Arc<ClientConfig> {
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// ztunnel's client TLS: TLS 1.3 only, AES-GCM suites only, ALPN h2, roots from `root_cert`,
/// no client certificate.
pub fn ztunnel_tls(root_cert: &Path) -> Arc<ClientConfig> {
    h2(ztunnel_tls_builder(root_cert).with_no_client_auth())
}

/// The same, presenting a client certificate chain (leaf first) with its PKCS#8 key.
pub fn ztunnel_tls_with_cert(
    root_cert: &Path,
    chain: Vec<CertificateDer<'static>>,
    key_pkcs8: Vec<u8>,
) -> Arc<ClientConfig> {
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pkcs8.into());
    h2(ztunnel_tls_builder(root_cert)
        .with_client_auth_cert(chain, key)
        .expect("client cert"))
}

/// A gRPC channel to `address` over `tls`, checking the server name `server_name`.
pub async fn channel(
    address: std::net::SocketAddr,
    tls: Arc<ClientConfig>,
    server_name: &str,
) -> Result<Channel, tonic::transport::Error> {
    let name = ServerName::try_from(server_name.to_string()).expect("server name");
    // The connector does TLS itself, so the URI scheme is http (tonic would add its own TLS).
    let endpoint = Endpoint::from_shared(format!("http://{server_name}:15012")).expect("uri");
    let connector = tower::service_fn(move |_uri: tonic::codegen::http::Uri| {
        let tls = tls.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(address).await?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    tokio::time::timeout(WAIT, endpoint.connect_with_connector(connector))
        .await
        .expect("connect timed out")
}

/// Mints a local token (as `ambientd token` does) with the CA directory's key.
pub fn local_token(
    ca_dir: &Path,
    ns: &str,
    sa: &str,
    pod: Option<(&str, &str)>,
    node: Option<&str>,
) -> String {
    let key = LocalKey::load_or_create(ca_dir).expect("token key");
    let subject = Subject {
        namespace: ns.into(),
        service_account: sa.into(),
        pod: pod.map(|(name, uid)| Ref {
            name: name.into(),
            uid: uid.into(),
        }),
        node: node.map(Into::into),
    };
    key.mint(&local_claims(
        &subject,
        &["istio-ca".into()],
        now(),
        Duration::from_secs(3600),
    ))
    .expect("mint")
}

/// Claims shaped like a Kubernetes projected token from `issuer`.
pub fn claims(
    issuer: &str,
    ns: &str,
    sa: &str,
    pod: Option<(&str, &str)>,
    node: Option<&str>,
) -> Claims {
    let subject = Subject {
        namespace: ns.into(),
        service_account: sa.into(),
        pod: pod.map(|(name, uid)| Ref {
            name: name.into(),
            uid: uid.into(),
        }),
        node: node.map(Into::into),
    };
    let mut claims = local_claims(
        &subject,
        &["istio-ca".into()],
        now(),
        Duration::from_secs(3600),
    );
    claims.iss = issuer.into();
    claims
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A CreateCertificate request as ztunnel sends it (shared mode when `impersonate` is set).
pub fn csr_request(
    csr: &str,
    token: Option<&str>,
    impersonate: Option<&str>,
) -> tonic::Request<IstioCertificateRequest> {
    let metadata = impersonate.map(|id| {
        let mut fields = std::collections::BTreeMap::new();
        fields.insert(
            "ImpersonatedIdentity".to_string(),
            Value {
                kind: Some(Kind::StringValue(id.to_string())),
            },
        );
        Struct { fields }
    });
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.to_string(),
        validity_duration: 86400,
        metadata,
    });
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
        request
            .metadata_mut()
            .insert("clusterid", "Kubernetes".parse().unwrap());
    }
    request
}

/// What a verified leaf says.
#[derive(Debug)]
pub struct Leaf {
    pub uris: Vec<String>,
    pub san_critical: bool,
    pub not_before: i64,
    pub not_after: i64,
    pub digital_signature: bool,
    pub key_encipherment: bool,
    pub server_auth: bool,
    pub client_auth: bool,
    pub is_ca: bool,
    pub subject_empty: bool,
}

/// Verifies `chain` (`[leaf, intermediates…, root bundle]`) with webpki against the root
/// bundle in its last element, for both client and server auth, and reads the leaf.
pub fn verify_chain(chain: &[String]) -> Leaf {
    assert!(chain.len() >= 2, "chain needs a root: {}", chain.len());
    for (i, element) in chain.iter().enumerate() {
        assert!(element.ends_with('\n'), "element {i} does not end in \\n");
    }
    let pem = |s: &String| ambientd::ca::keys::certificates(s.as_bytes()).expect("pem");
    let leaf = pem(&chain[0]).remove(0);
    let intermediates: Vec<CertificateDer<'static>> =
        chain[1..chain.len() - 1].iter().flat_map(pem).collect();
    let roots = pem(chain.last().unwrap());
    let anchors: Vec<_> = roots
        .iter()
        .map(|r| {
            webpki::anchor_from_trusted_cert(r)
                .expect("anchor")
                .to_owned()
        })
        .collect();
    let ee = webpki::EndEntityCert::try_from(&leaf).expect("leaf parses for webpki");
    let time = UnixTime::now();
    for usage in [
        webpki::KeyUsage::client_auth(),
        webpki::KeyUsage::server_auth(),
    ] {
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            &intermediates,
            time,
            usage,
            None,
            None,
        )
        .expect("chain verifies to the root");
    }
    read_leaf(&leaf)
}

pub fn read_leaf(der: &[u8]) -> Leaf {
    let (_, cert) = X509Certificate::from_der(der).expect("x509");
    let san = cert.subject_alternative_name().unwrap().expect("SAN");
    let uris = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect();
    let ku = cert.key_usage().unwrap().expect("key usage");
    let eku = cert.extended_key_usage().unwrap().expect("eku");
    Leaf {
        uris,
        san_critical: san.critical,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        digital_signature: ku.value.digital_signature(),
        key_encipherment: ku.value.key_encipherment(),
        server_auth: eku.value.server_auth,
        client_auth: eku.value.client_auth,
        is_ca: cert.is_ca(),
        subject_empty: cert.subject().iter().next().is_none(),
    }
}

/// A root and an intermediate CA signed by it, as an operator's plugged-in CA.
pub struct PluggedCa {
    pub root_pem: String,
    pub intermediate_pem: String,
    pub intermediate_key_pem: String,
}

fn ca_params(name: &str, ttl: Duration) -> CertificateParams {
    let now = ::time::OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "cluster.local");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + ttl;
    params
}

/// A new root (10 years) and an intermediate valid for `intermediate_ttl`.
pub fn plugged_ca(intermediate_ttl: Duration) -> PluggedCa {
    let root_key = KeyPair::generate().unwrap();
    let root_params = ca_params("Test Root CA", Duration::from_secs(10 * 365 * 86400));
    let root = root_params.self_signed(&root_key).unwrap();
    let issuer = rcgen::Issuer::new(root_params, root_key);
    let key = KeyPair::generate().unwrap();
    let intermediate = ca_params("Test Intermediate CA", intermediate_ttl)
        .signed_by(&key, &issuer)
        .unwrap();
    PluggedCa {
        root_pem: root.pem(),
        intermediate_pem: intermediate.pem(),
        intermediate_key_pem: key.serialize_pem(),
    }
}

impl PluggedCa {
    /// Writes istiod's cacerts layout into `dir`.
    pub fn write_cacerts(&self, dir: &Path) {
        write(
            dir,
            &[
                ("ca-cert.pem", &self.intermediate_pem),
                ("ca-key.pem", &self.intermediate_key_pem),
                ("root-cert.pem", &self.root_pem),
                (
                    "cert-chain.pem",
                    &format!("{}{}", self.intermediate_pem, self.root_pem),
                ),
            ],
        );
    }
}

pub fn write(dir: &Path, files: &[(&str, &str)]) {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}
