//! 15012 end to end: a tonic client with ztunnel's exact TLS settings (TLS 1.3, AES-GCM, h2,
//! the written root-cert.pem, server name istiod.istio-system.svc) syncs delta ADS and gets a
//! certificate; the xDS identity check; client-certificate authentication; plugged-in reload.

use crate::support::ca as ca_support;
use crate::support::ca_cluster;
use crate::support::common as support;

use std::sync::Arc;
use std::time::Duration;

use ambientd::app;
use ambientd::ca::CaConfig;
use ambientd::config::Config;
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use ca_cluster::*;
use ca_support::*;
use tonic::Code;

#[tokio::test]
async fn ztunnel_settings_sync_delta_ads_and_get_a_certificate() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;
    let token = cluster.ztunnel_token();

    let mut stream = open_ads(channel.clone(), Some(&token), "istio-system")
        .await
        .expect("stream accepted");
    let addresses = next(&mut stream).await;
    assert_eq!(addresses.type_url, ADDRESS_TYPE);
    let mut names: Vec<_> = addresses
        .resources
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "Kubernetes//Pod/demo/db-1",
            "Kubernetes//Pod/demo/web-1",
            "Kubernetes//Pod/istio-system/ztunnel-a"
        ]
    );
    assert_eq!(next(&mut stream).await.type_url, AUTHORIZATION_TYPE);

    // Shared mode on the same connection: a certificate for a pod on our node.
    let mut ca = IstioCertificateServiceClient::new(channel);
    let (_key, csr) = ztunnel_csr(WEB);
    let response = tokio::time::timeout(
        WAIT,
        ca.create_certificate(csr_request(&csr, Some(&token), Some(WEB))),
    )
    .await
    .expect("CSR timed out")
    .expect("CSR signed")
    .into_inner();
    let leaf = verify_chain(&response.cert_chain);
    assert_eq!(leaf.uris, vec![WEB.to_string()]);
    let root = std::fs::read_to_string(cluster.ca_dir.path().join("root-cert.pem")).unwrap();
    assert_eq!(response.cert_chain.last().unwrap(), &root);

    // A pod on another node is refused, with no reason given.
    let (_key, csr) = ztunnel_csr(DB);
    let status = ca
        .create_certificate(csr_request(&csr, Some(&token), Some(DB)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains("node"), "{}", status.message());

    // The CA's metrics moved: two CSRs, one certificate, one authentication failure.
    let (code, metrics) = support::http_get(cluster.running.debug_address, "/metrics").await;
    assert_eq!(code, 200);
    for (series, value) in [
        ("citadel_server_csr_count", "2"),
        ("citadel_server_success_cert_issuance_count", "1"),
        ("citadel_server_authentication_failure_count", "1"),
    ] {
        assert!(
            metrics.lines().any(|l| l == format!("{series} {value}")),
            "{series} {value} in\n{metrics}"
        );
    }
    // A self-signed CA signs with its root: the chain expires with it.
    let gauge = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in\n{metrics}"))
            .parse()
            .unwrap()
    };
    let root = gauge("citadel_server_root_cert_expiry_timestamp");
    assert!(root > 0.0);
    assert_eq!(gauge("citadel_server_cert_chain_expiry_timestamp"), root);
    assert!(gauge("citadel_server_cert_chain_expiry_seconds") > 0.0);
    cluster.running.stop().await;
}

#[tokio::test]
async fn a_large_reconnect_on_15012_is_checked_by_its_node_and_resends_nothing_unchanged() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;
    let token = cluster.ztunnel_token();
    let mut first = open_ads(channel.clone(), Some(&token), "istio-system")
        .await
        .expect("stream accepted");
    let addresses = next(&mut first).await;
    let mut held: std::collections::BTreeMap<String, String> = addresses
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    drop(first);
    // Plus 30,000 names that no longer exist: a first request of about 1.5 MB, far more than
    // the node the guard reads it for.
    for i in 0..30_000 {
        held.insert(
            format!("Kubernetes//Pod/gone/pod-{i:05}"),
            format!("{i:016x}"),
        );
    }
    let mut again = open_ads_holding(channel.clone(), Some(&token), "istio-system", held)
        .await
        .expect("reconnect accepted");
    let addresses = next(&mut again).await;
    assert_eq!(addresses.type_url, ADDRESS_TYPE);
    assert!(addresses.resources.is_empty(), "{:?}", addresses.resources);
    assert_eq!(addresses.removed_resources.len(), 30_000);
    assert_eq!(next(&mut again).await.type_url, AUTHORIZATION_TYPE);

    // The node is still checked against the caller when it comes with a large request.
    let web = local_token(cluster.ca_dir.path(), "demo", "web", None, None);
    let many = (0..30_000)
        .map(|i| (format!("Kubernetes//Pod/gone/pod-{i:05}"), "1".to_string()))
        .collect();
    let status = open_ads_holding(channel, Some(&web), "istio-system", many)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");
    cluster.running.stop().await;
}

#[tokio::test]
async fn xds_on_15012_needs_an_authenticated_caller_of_the_proxys_namespace() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;

    let status = open_ads(channel.clone(), None, "istio-system")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status}");

    let web = local_token(cluster.ca_dir.path(), "demo", "web", None, None);
    let status = open_ads(channel.clone(), Some(&web), "istio-system")
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status}");

    // The same caller for a proxy in its own namespace is served.
    let mut stream = open_ads(channel, Some(&web), "demo")
        .await
        .expect("accepted");
    assert_eq!(next(&mut stream).await.type_url, ADDRESS_TYPE);
    cluster.running.stop().await;
}

#[tokio::test]
async fn a_workload_certificate_authenticates_as_a_client_certificate() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;
    // Dedicated mode: a workload asks for its own identity with its own token.
    let token = local_token(cluster.ca_dir.path(), "demo", "web", None, None);
    let (key, csr) = ztunnel_csr(WEB);
    let response = IstioCertificateServiceClient::new(channel)
        .create_certificate(csr_request(&csr, Some(&token), None))
        .await
        .expect("own identity")
        .into_inner();
    verify_chain(&response.cert_chain);

    // Now with that certificate and no token at all.
    let root = cluster.ca_dir.path().join("root-cert.pem");
    let chain = ambientd::ca::keys::certificates(response.cert_chain[0].as_bytes()).unwrap();
    let tls = ztunnel_tls_with_cert(&root, chain, key.serialize_der());
    let channel = channel_with(&cluster, tls).await;
    let (_key, csr) = ztunnel_csr(WEB);
    let response = IstioCertificateServiceClient::new(channel)
        .create_certificate(csr_request(&csr, None, None))
        .await
        .expect("authenticated by client certificate")
        .into_inner();
    assert_eq!(
        verify_chain(&response.cert_chain).uris,
        vec![WEB.to_string()]
    );
    cluster.running.stop().await;
}

async fn channel_with(
    cluster: &Cluster,
    tls: Arc<rustls::ClientConfig>,
) -> tonic::transport::Channel {
    channel(cluster.running.xds_tls_address.unwrap(), tls, ISTIOD)
        .await
        .expect("connect")
}

#[tokio::test]
async fn the_serving_certificate_has_the_istiod_names_and_extra_ips() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let tls = ztunnel_tls(&cluster.ca_dir.path().join("root-cert.pem"));
    for name in [
        "istiod.istio-system.svc",
        "istiod-remote.istio-system.svc",
        "istio-pilot.istio-system.svc",
        "ambientd.istio-system.svc",
        "127.0.0.1",
        "localhost",
    ] {
        channel(cluster.running.xds_tls_address.unwrap(), tls.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // No revision name for the default revision, and no other namespace.
    for name in ["istiod-default.istio-system.svc", "istiod.other.svc"] {
        assert!(
            channel(cluster.running.xds_tls_address.unwrap(), tls.clone(), name)
                .await
                .is_err(),
            "{name} must not be a SAN"
        );
    }
    cluster.running.stop().await;
}

#[tokio::test]
async fn a_non_default_revision_adds_its_istiod_name_to_the_serving_certificate() {
    let manifests = support::Manifests::new(&[("mesh.yaml", MESH)]);
    let ca_dir = tempfile::tempdir().unwrap();
    let mut config = Config::local(manifests.root());
    config.settings.revision = "canary".into();
    config.ca = Some(CaConfig::local(ca_dir.path()));
    let running = app::start(config).await.expect("start ambientd");
    let tls = ztunnel_tls(&ca_dir.path().join("root-cert.pem"));
    for name in ["istiod-canary.istio-system.svc", "istiod.istio-system.svc"] {
        channel(running.xds_tls_address.unwrap(), tls.clone(), name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    running.stop().await;
}

#[tokio::test]
async fn a_restart_serves_the_same_root() {
    let manifests = support::Manifests::new(&[("mesh.yaml", MESH)]);
    let ca_dir = tempfile::tempdir().unwrap();
    let mut roots = Vec::new();
    for _ in 0..2 {
        let mut config = Config::local(manifests.root());
        config.ca = Some(CaConfig::local(ca_dir.path()));
        let running = app::start(config).await.expect("start");
        roots.push(std::fs::read_to_string(ca_dir.path().join("root-cert.pem")).unwrap());
        running.stop().await;
    }
    assert_eq!(roots[0], roots[1]);
}

#[tokio::test]
async fn a_plugged_in_ca_is_reloaded_when_its_files_change() {
    let cacerts = tempfile::tempdir().unwrap();
    let first = plugged_ca(Duration::from_secs(365 * 86400));
    first.write_cacerts(cacerts.path());
    let cluster = start_plugged(cacerts.path()).await;
    let root_path = cluster.ca_dir.path().join("root-cert.pem");
    assert_eq!(std::fs::read_to_string(&root_path).unwrap(), first.root_pem);
    let token = cluster.ztunnel_token();
    let (_key, csr) = ztunnel_csr(WEB);
    let response = IstioCertificateServiceClient::new(cluster.channel().await)
        .create_certificate(csr_request(&csr, Some(&token), Some(WEB)))
        .await
        .expect("signed")
        .into_inner();
    assert_eq!(response.cert_chain.len(), 3, "[leaf, intermediate, root]");
    assert_eq!(response.cert_chain[1], first.intermediate_pem);
    verify_chain(&response.cert_chain);

    // A new CA lands file by file, as a Secret update does.
    let second = plugged_ca(Duration::from_secs(365 * 86400));
    second.write_cacerts(cacerts.path());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while std::fs::read_to_string(&root_path).unwrap() != second.root_pem {
        assert!(
            tokio::time::Instant::now() < deadline,
            "root-cert.pem was not rewritten after the CA files changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // New connections trust the new root (the serving certificate was re-issued).
    let (_key, csr) = ztunnel_csr(WEB);
    let response = IstioCertificateServiceClient::new(cluster.channel().await)
        .create_certificate(csr_request(&csr, Some(&token), Some(WEB)))
        .await
        .expect("signed by the new CA")
        .into_inner();
    assert_eq!(response.cert_chain[1], second.intermediate_pem);
    assert_eq!(response.cert_chain[2], second.root_pem);
    verify_chain(&response.cert_chain);
    cluster.running.stop().await;
}

/// The CA's metrics, as istiod names them: the root's expiry (not the signing certificate's),
/// the chain's (the signing certificate's), signing errors by type, and a malformed ImpersonatedIdentity as an authentication failure
/// (a non-string or empty one is no impersonation, as in istiod).
#[tokio::test]
async fn ca_metrics_report_the_roots_expiry_and_each_failure() {
    use ambientd::pb::google::protobuf::{Value, value::Kind};
    let cacerts = tempfile::tempdir().unwrap();
    // The intermediate expires in a year, the root in ten.
    let ca = plugged_ca(Duration::from_secs(365 * 86400));
    ca.write_cacerts(cacerts.path());
    let cluster = start_plugged(cacerts.path()).await;
    let metrics = cluster.running.metrics.clone();
    let not_after = |pem: &str| {
        let der = ambientd::ca::keys::certificates(pem.as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        cert.validity().not_after.timestamp() as f64
    };
    assert_ne!(not_after(&ca.root_pem), not_after(&ca.intermediate_pem));
    assert_eq!(metrics.root_expiry.get(), not_after(&ca.root_pem));
    // The chain's expiry is the signing (intermediate) certificate's, as istiod's
    // ExtractCACertExpiryTimestamp reads it.
    assert_eq!(metrics.chain_expiry.get(), not_after(&ca.intermediate_pem));
    let text = metrics.encode();
    let seconds: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("citadel_server_root_cert_expiry_seconds "))
        .unwrap_or_else(|| panic!("no root expiry seconds in\n{text}"))
        .parse()
        .unwrap();
    assert!(
        (9.0 * 365.0 * 86400.0..=10.0 * 365.0 * 86400.0).contains(&seconds),
        "{seconds}"
    );

    let token = cluster.ztunnel_token();
    let mut client = IstioCertificateServiceClient::new(cluster.channel().await);
    let failures = metrics.auth_failures.get();
    let (_key, csr) = ztunnel_csr(WEB);
    let mut request = csr_request(&csr, Some(&token), None);
    request.get_mut().metadata = Some(ambientd::pb::google::protobuf::Struct {
        fields: [(
            "ImpersonatedIdentity".to_string(),
            Value {
                kind: Some(Kind::NumberValue(1.0)),
            },
        )]
        .into(),
    });
    // As istiod (`GetStringValue() == ""`), a non-string or empty value is no impersonation:
    // the caller gets its own identity, and nothing is counted as a failure.
    let chain = client
        .create_certificate(request)
        .await
        .expect("a non-string ImpersonatedIdentity signs the caller's own identity")
        .into_inner()
        .cert_chain;
    assert_eq!(
        verify_chain(&chain).uris,
        ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]
    );
    let request = csr_request(&csr, Some(&token), Some(""));
    let chain = client
        .create_certificate(request)
        .await
        .expect("an empty ImpersonatedIdentity signs the caller's own identity")
        .into_inner()
        .cert_chain;
    assert_eq!(
        verify_chain(&chain).uris,
        ["spiffe://cluster.local/ns/istio-system/sa/ztunnel"]
    );
    assert_eq!(metrics.auth_failures.get(), failures);
    // A string that is not a SPIFFE id of ours is a failure.
    let request = csr_request(&csr, Some(&token), Some("web"));
    let status = client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(metrics.auth_failures.get(), failures + 1);

    let mut request = csr_request(&csr, Some(&token), Some(WEB));
    request.get_mut().validity_duration = 91 * 86400;
    let status = client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let request = csr_request("not a CSR", Some(&token), Some(WEB));
    let status = client.create_certificate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let text = metrics.encode();
    for line in [
        "citadel_server_csr_sign_err_count{error=\"TTL_ERROR\"} 1\n",
        "citadel_server_csr_sign_err_count{error=\"CSR_ERROR\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    cluster.running.stop().await;
}
