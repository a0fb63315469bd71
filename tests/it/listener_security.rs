//! What 15012 refuses (docs/security.md): plaintext, TLS below 1.2, a client certificate that
//! does not chain to our roots or names another trust domain, and a token for another audience.
//! Each refusal is checked beside the accepted case it differs from, so a test cannot pass by
//! refusing everything.

use crate::support::ca as ca_support;
use crate::support::ca_cluster;

use std::net::SocketAddr;
use std::time::Duration;

use ambientd::ca::CaConfig;
use ambientd::ca::token::{LocalKey, Subject, local_claims};
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ca_cluster::*;
use ca_support::*;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

/// A TLS record's content type for alerts (RFC 8446 §5.1).
const ALERT: u8 = 21;
/// The `protocol_version` alert (RFC 8446 §6.2).
const PROTOCOL_VERSION: u8 = 70;

/// Sends `bytes` on a fresh connection to `address` and returns the start of the server's
/// answer: its first 7 bytes (a record header and two more), or less if it closes first.
async fn answer_to(address: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.len() >= 7 {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the server neither answered nor closed within 5 s");
    answer
}

/// A ClientHello record offering only `version` (0x0301 TLS 1.0, 0x0302 TLS 1.1, 0x0303 TLS
/// 1.2) with ECDHE AES-GCM suites and no `supported_versions` extension, as a pre-1.3 client
/// sends it (RFC 5246 §7.4.1.2). A TLS 1.2 hello carries the groups and signature algorithms
/// extensions that rustls needs to answer it.
fn client_hello(version: u16) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&[7u8; 32]); // random
    body.push(0); // no session id
    let suites: [u16; 3] = [0xc02b, 0xc02f, 0xc030];
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for suite in suites {
        body.extend_from_slice(&suite.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null
    let mut extensions = Vec::new();
    // supported_groups: secp256r1, x25519.
    extensions.extend_from_slice(&[0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x17, 0x00, 0x1d]);
    // ec_point_formats: uncompressed.
    extensions.extend_from_slice(&[0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]);
    // signature_algorithms: ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256.
    extensions.extend_from_slice(&[
        0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01,
    ]);
    body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
    body.extend_from_slice(&extensions);

    let mut handshake = vec![1]; // client_hello
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![22, 0x03, 0x01]; // handshake record, legacy version TLS 1.0
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

#[tokio::test]
async fn fifteen_012_refuses_tls_below_1_2() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let address = cluster.running.xds_tls_address.unwrap();

    for (name, version) in [("TLS 1.0", 0x0301), ("TLS 1.1", 0x0302)] {
        let answer = answer_to(address, &client_hello(version)).await;
        // One fatal alert record: type, version, length 2, level fatal (2), protocol_version.
        assert!(
            answer.len() >= 7 && answer[0] == ALERT && answer[5] == 2,
            "{name}: expected a fatal alert, got {answer:02x?}"
        );
        assert_eq!(answer[6], PROTOCOL_VERSION, "{name}: {answer:02x?}");
    }

    // The same hello offering TLS 1.2 gets a ServerHello (a handshake record, type 22).
    let answer = answer_to(address, &client_hello(0x0303)).await;
    assert_eq!(answer.first(), Some(&22), "TLS 1.2: {answer:02x?}");
    assert_eq!(answer.get(5), Some(&2), "TLS 1.2: a ServerHello first");
    cluster.running.stop().await;
}

#[tokio::test]
async fn fifteen_012_refuses_plaintext() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let address = cluster.running.xds_tls_address.unwrap();

    // An HTTP/2 client preface and an empty SETTINGS frame, as a plaintext gRPC client opens.
    let mut h2c = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    h2c.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let answer = answer_to(address, &h2c).await;
    // Never an HTTP/2 SETTINGS frame (type 4 at byte 3); at most a TLS alert, then closed.
    assert!(
        answer.is_empty() || answer[0] == ALERT,
        "plaintext HTTP/2 got {answer:02x?}"
    );

    // A plaintext gRPC call to 15012 fails; the same call over TLS is answered.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    let (_key, csr) = ztunnel_csr(WEB);
    let token = local_token(cluster.ca_dir.path(), "demo", "web", None, None);
    let status = IstioCertificateServiceClient::new(channel)
        .create_certificate(csr_request(&csr, Some(&token), None))
        .await
        .expect_err("plaintext must not be answered");
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Unknown),
        "a transport failure, not an answer: {status}"
    );
    IstioCertificateServiceClient::new(cluster.channel().await)
        .create_certificate(csr_request(&csr, Some(&token), None))
        .await
        .expect("the same call over TLS");
    cluster.running.stop().await;
}

/// A leaf for `identity` signed by the plugged-in CA's intermediate, and its PKCS#8 key.
fn leaf_from(ca: &PluggedCa, identity: &str) -> (Vec<CertificateDer<'static>>, Vec<u8>) {
    let ca_key = KeyPair::from_pem(&ca.intermediate_key_pem).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.intermediate_pem, ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(identity.try_into().unwrap())];
    let leaf = params.signed_by(&key, &issuer).unwrap();
    let intermediate = ambientd::ca::keys::certificates(ca.intermediate_pem.as_bytes()).unwrap();
    let mut chain = vec![leaf.der().clone()];
    chain.extend(intermediate);
    (chain, key.serialize_der())
}

#[tokio::test]
async fn a_client_certificate_from_another_trust_domain_or_root_is_refused() {
    let cacerts = tempfile::tempdir().unwrap();
    let ca = plugged_ca(Duration::from_secs(30 * 86400));
    ca.write_cacerts(cacerts.path());
    let cluster = start_plugged(cacerts.path()).await;
    let root = cluster.ca_dir.path().join("root-cert.pem");
    let address = cluster.running.xds_tls_address.unwrap();
    let with_cert = |chain: Vec<CertificateDer<'static>>, key: Vec<u8>| {
        let tls = ztunnel_tls_with_cert(&root, chain, key);
        async move { channel(address, tls, ISTIOD).await.expect("TLS connect") }
    };

    // Our trust domain, under our root: authenticated by the certificate alone.
    let (chain, key) = leaf_from(&ca, WEB);
    let ours = with_cert(chain, key).await;
    let (_key, csr) = ztunnel_csr(WEB);
    IstioCertificateServiceClient::new(ours.clone())
        .create_certificate(csr_request(&csr, None, None))
        .await
        .expect("our trust domain's certificate authenticates");
    open_ads(ours, None, "demo")
        .await
        .expect("and opens xDS for its namespace");

    // The same root, another trust domain: refused for certificates and for xDS.
    let other = "spiffe://other.example/ns/demo/sa/web";
    let (chain, key) = leaf_from(&ca, other);
    let theirs = with_cert(chain, key).await;
    for csr_identity in [other, WEB] {
        let (_key, csr) = ztunnel_csr(csr_identity);
        let status = IstioCertificateServiceClient::new(theirs.clone())
            .create_certificate(csr_request(&csr, None, None))
            .await
            .expect_err("another trust domain gets no certificate");
        assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    }
    let status = open_ads(theirs, None, "demo").await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");

    // A certificate under a root we do not trust fails the handshake itself.
    let stranger = plugged_ca(Duration::from_secs(30 * 86400));
    let (chain, key) = leaf_from(&stranger, WEB);
    let tls = ztunnel_tls_with_cert(&root, chain, key);
    let refused = match channel(address, tls, ISTIOD).await {
        Err(_) => true,
        // TLS 1.3 clients learn of a refused certificate at their first read.
        Ok(channel) => IstioCertificateServiceClient::new(channel)
            .create_certificate(csr_request(&csr, None, None))
            .await
            .is_err(),
    };
    assert!(refused, "a certificate from an untrusted root was accepted");
    cluster.running.stop().await;
}

#[tokio::test]
async fn a_token_for_another_audience_is_refused_on_15012() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let key = LocalKey::load_or_create(cluster.ca_dir.path()).unwrap();
    let mint = |audience: &str| {
        let subject = Subject {
            namespace: "demo".into(),
            service_account: "web".into(),
            pod: None,
            node: None,
        };
        key.mint(&local_claims(
            &subject,
            &[audience.into()],
            now(),
            Duration::from_secs(600),
        ))
        .unwrap()
    };
    let (right, wrong) = (mint("istio-ca"), mint("kubernetes"));
    let channel = cluster.channel().await;
    let (_key, csr) = ztunnel_csr(WEB);

    let client = || IstioCertificateServiceClient::new(channel.clone());
    client()
        .create_certificate(csr_request(&csr, Some(&right), None))
        .await
        .expect("the CA's audience");
    open_ads(channel.clone(), Some(&right), "demo")
        .await
        .expect("xDS with the CA's audience");

    let status = client()
        .create_certificate(csr_request(&csr, Some(&wrong), None))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    let status = open_ads(channel.clone(), Some(&wrong), "demo")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");
    cluster.running.stop().await;
}
