//! CreateCertificate over TLS against a pod index with uids: who may impersonate whom.
//!
//! Allowed: a node account with a valid token asking for an identity with a pod on its node.
//! Refused (always `Unauthenticated`, with no reason given): a caller that is not a node
//! account; an identity with no pod on that node, or only on another node; a forged, expired,
//! wrong-audience or missing token; a token whose pod uid does not match the index.

use crate::support::ca as ca_support;

use std::sync::Arc;

use ambientd::ca::token::Claims;
use ambientd::ca::{CaConfig, PodInfo, StaticPods};
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ca_support::*;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::KeyPair;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const KID: &str = "cluster-key-1";
const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";
const DB: &str = "spiffe://cluster.local/ns/demo/sa/db";
const GHOST: &str = "spiffe://cluster.local/ns/demo/sa/ghost";

/// A signing key standing in for the API server's service-account key.
struct ClusterKey {
    pkcs8: Vec<u8>,
}

impl ClusterKey {
    fn new() -> Self {
        ClusterKey {
            pkcs8: KeyPair::generate().unwrap().serialize_der(),
        }
    }

    fn jwks(&self) -> JwkSet {
        let mut jwk =
            Jwk::from_encoding_key(&EncodingKey::from_ec_der(&self.pkcs8), Algorithm::ES256)
                .unwrap();
        jwk.common.key_id = Some(KID.into());
        JwkSet { keys: vec![jwk] }
    }

    fn sign(&self, claims: &Claims) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(KID.into());
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_ec_der(&self.pkcs8)).unwrap()
    }
}

fn pods() -> StaticPods {
    let mut pods = StaticPods::default();
    let pod = |sa: &str, node: &str, uid: &str| PodInfo {
        service_account: sa.into(),
        node: node.into(),
        uid: Some(uid.into()),
    };
    pods.insert(
        "istio-system",
        "ztunnel-a",
        pod("ztunnel", "node-a", "uid-ztunnel-a"),
    );
    pods.insert(
        "istio-system",
        "ztunnel-b",
        pod("ztunnel", "node-b", "uid-ztunnel-b"),
    );
    pods.insert("demo", "web-1", pod("web", "node-a", "uid-web-1"));
    pods.insert("demo", "db-1", pod("db", "node-b", "uid-db-1"));
    pods
}

struct Ca {
    _dir: tempfile::TempDir,
    dir: std::path::PathBuf,
    client: IstioCertificateServiceClient<tonic::transport::Channel>,
    key: ClusterKey,
    shutdown: CancellationToken,
    _snapshots: tokio::sync::watch::Sender<Option<Arc<ambientd::discovery::Snapshot>>>,
}

async fn start() -> Ca {
    let dir = tempfile::tempdir().unwrap();
    let key = ClusterKey::new();
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, serde_json::to_vec(&key.jwks()).unwrap()).unwrap();
    let ca_dir = dir.path().join("ca");
    let mut config = CaConfig::local(&ca_dir);
    config.jwks = Some((jwks_path, ISSUER.into()));
    let ca_support::Started {
        address,
        shutdown,
        snapshots: tx,
    } = ca_support::start_server(&config, pods()).await;
    let tls = ztunnel_tls(&config.root_cert_path());
    let channel = channel(address, tls, ISTIOD).await.expect("connect");
    Ca {
        _dir: dir,
        dir: ca_dir,
        client: IstioCertificateServiceClient::new(channel),
        key,
        shutdown,
        _snapshots: tx,
    }
}

impl Ca {
    async fn ask(
        &mut self,
        token: Option<&str>,
        impersonate: &str,
    ) -> Result<Vec<String>, tonic::Status> {
        let (_key, csr) = ztunnel_csr(impersonate);
        tokio::time::timeout(
            WAIT,
            self.client
                .create_certificate(csr_request(&csr, token, Some(impersonate))),
        )
        .await
        .expect("CSR timed out")
        .map(|r| r.into_inner().cert_chain)
    }
}

fn ztunnel_a() -> Claims {
    claims(
        ISSUER,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", "uid-ztunnel-a")),
        Some("node-a"),
    )
}

#[tokio::test]
async fn impersonation_allowed_and_refused() {
    let mut ca = start().await;
    let good = ca.key.sign(&ztunnel_a());

    // Allowed: a pod with that identity is on the caller's node.
    let chain = ca.ask(Some(&good), WEB).await.expect("web is on node-a");
    assert_eq!(verify_chain(&chain).uris, vec![WEB.to_string()]);
    // The pod binding decides the node; a token without a node claim works too.
    let mut no_node = ztunnel_a();
    no_node.kubernetes.node = None;
    ca.ask(Some(&ca.key.sign(&no_node)), WEB)
        .await
        .expect("node from the pod binding");
    // A local token (ambientd token) uses its node claim.
    let local = local_token(
        &ca.dir,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-local", "")),
        Some("node-a"),
    );
    ca.ask(Some(&local), WEB)
        .await
        .expect("local token with node claim");

    let not_node_account = ca.key.sign(&claims(
        ISSUER,
        "demo",
        "web",
        Some(("web-1", "uid-web-1")),
        Some("node-a"),
    ));
    let other_node = ca.key.sign(&claims(
        ISSUER,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-b", "uid-ztunnel-b")),
        Some("node-b"),
    ));
    let forged = {
        let stranger = ClusterKey::new();
        stranger.sign(&ztunnel_a())
    };
    let expired = {
        let mut claims = ztunnel_a();
        claims.iat -= 7200;
        claims.nbf -= 7200;
        claims.exp = now() - 3600;
        ca.key.sign(&claims)
    };
    let wrong_audience = {
        let mut claims = ztunnel_a();
        claims.aud = vec!["kubernetes".into()];
        ca.key.sign(&claims)
    };
    let wrong_uid = ca.key.sign(&claims(
        ISSUER,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", "uid-stale")),
        Some("node-a"),
    ));
    let unknown_pod = ca.key.sign(&claims(
        ISSUER,
        "istio-system",
        "ztunnel",
        Some(("ztunnel-gone", "u")),
        Some("node-a"),
    ));
    let untrusted_issuer = ca.key.sign(&claims(
        "https://elsewhere",
        "istio-system",
        "ztunnel",
        Some(("ztunnel-a", "uid-ztunnel-a")),
        Some("node-a"),
    ));

    let refused: Vec<(&str, Option<&str>, &str)> = vec![
        ("not a node account", Some(&not_node_account), WEB),
        ("identity only on another node", Some(&good), DB),
        ("identity with no pod at all", Some(&good), GHOST),
        (
            "the other ztunnel for this node's pod",
            Some(&other_node),
            WEB,
        ),
        ("forged signature", Some(&forged), WEB),
        ("expired token", Some(&expired), WEB),
        ("wrong audience", Some(&wrong_audience), WEB),
        ("pod uid does not match", Some(&wrong_uid), WEB),
        ("caller pod not in the index", Some(&unknown_pod), WEB),
        ("untrusted issuer", Some(&untrusted_issuer), WEB),
        ("garbage token", Some("not.a.jwt"), WEB),
        ("no token", None, WEB),
    ];
    for (name, token, identity) in refused {
        let status = ca.ask(token, identity).await.expect_err(name);
        assert_eq!(status.code(), Code::Unauthenticated, "{name}: {status}");
        assert!(
            matches!(
                status.message(),
                "request authenticate failure" | "request impersonation authentication failure"
            ),
            "{name}: the caller learns no reason: {}",
            status.message()
        );
    }
    ca.shutdown.cancel();
}

#[tokio::test]
async fn bad_requests_are_invalid_argument() {
    let mut ca = start().await;
    let token = ca.key.sign(&ztunnel_a());

    let mut request = csr_request(
        "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        Some(&token),
        Some(WEB),
    );
    let status = ca.client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("CSR"), "{}", status.message());

    let (_key, csr) = ztunnel_csr(WEB);
    request = csr_request(&csr, Some(&token), Some(WEB));
    request.get_mut().validity_duration = 91 * 86400;
    let status = ca.client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("TTL"), "{}", status.message());

    // Own identity, default TTL when none is asked for.
    request = csr_request(&csr, Some(&token), None);
    request.get_mut().validity_duration = 0;
    let chain = ca
        .client
        .create_certificate(request)
        .await
        .unwrap()
        .into_inner()
        .cert_chain;
    let leaf = verify_chain(&chain);
    assert_eq!(
        leaf.uris,
        vec!["spiffe://cluster.local/ns/istio-system/sa/ztunnel".to_string()]
    );
    assert_eq!(leaf.not_after - leaf.not_before, 86400 + 120);
    ca.shutdown.cancel();
}
