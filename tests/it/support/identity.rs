//! Workload identities from ambientd's own CA, for the Envoy (waypoint) tests: an ambientd with
//! a local CA on a manifests directory, and certificates asked of it over 15012 the way a
//! workload's agent asks (its own service-account token, a fresh P-256 key, no impersonation).

use std::path::Path;

use ambientd::app::{self, Running};
use ambientd::ca::CaConfig;
use ambientd::config::Config;
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;

use super::ca::{ISTIOD, WAIT, channel, csr_request, local_token, ztunnel_csr, ztunnel_tls};

/// A running ambientd with a local CA in `ca_dir` (its root is `ca_dir/root-cert.pem`).
pub struct MeshCa {
    pub running: Running,
    pub ca_dir: tempfile::TempDir,
}

/// Starts ambientd on the manifests in `dir` with a local CA (listener on 127.0.0.1:0, like
/// [`super::common::start`] plus 15012) and waits until it is ready.
pub async fn start_with_ca(dir: &Path) -> MeshCa {
    let ca_dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::local(dir);
    config.ca = Some(CaConfig::local(ca_dir.path()));
    let running = app::start(config).await.expect("start ambientd");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("ambientd did not become ready in time")
        .expect("snapshot channel closed");
    MeshCa { running, ca_dir }
}

impl MeshCa {
    /// [`workload_cert`] from this ambientd.
    pub async fn workload_cert(&self, namespace: &str, service_account: &str) -> WorkloadCert {
        workload_cert(
            &self.running,
            self.ca_dir.path(),
            namespace,
            service_account,
        )
        .await
    }
}

/// A certificate as a workload holds it: what Istio's agent serves Envoy as the SDS secrets
/// `default` (chain + key) and `ROOTCA` (root).
#[derive(Clone, Debug)]
pub struct WorkloadCert {
    /// `spiffe://cluster.local/ns/<namespace>/sa/<service account>`.
    pub spiffe_id: String,
    /// The leaf, then any intermediates (not the root), PEM.
    pub chain_pem: String,
    /// The leaf's P-256 key, PKCS#8 PEM.
    pub key_pem: String,
    /// The root bundle, PEM.
    pub root_pem: String,
}

/// Asks `running`'s CA (15012, TLS checked against `ca_dir/root-cert.pem`) for a certificate
/// for `namespace/service_account`, authenticated by a local token for that account minted with
/// the CA directory's key (as `ambientd token` mints them).
pub async fn workload_cert(
    running: &Running,
    ca_dir: &Path,
    namespace: &str,
    service_account: &str,
) -> WorkloadCert {
    let spiffe_id = format!("spiffe://cluster.local/ns/{namespace}/sa/{service_account}");
    let address = running
        .xds_tls_address
        .expect("ambientd runs without a CA (start it with start_with_ca)");
    let tls = ztunnel_tls(&ca_dir.join("root-cert.pem"));
    let channel = channel(address, tls, ISTIOD)
        .await
        .expect("TLS connect to 15012");
    let token = local_token(ca_dir, namespace, service_account, None, None);
    let (key, csr) = ztunnel_csr(&spiffe_id);
    let response = tokio::time::timeout(
        WAIT,
        IstioCertificateServiceClient::new(channel).create_certificate(csr_request(
            &csr,
            Some(&token),
            None,
        )),
    )
    .await
    .expect("CSR timed out")
    .unwrap_or_else(|status| panic!("CSR for {spiffe_id} refused: {status}"))
    .into_inner();
    let mut chain = response.cert_chain;
    assert!(chain.len() >= 2, "[leaf, ..., root]: {chain:?}");
    let root_pem = chain.pop().expect("root");
    WorkloadCert {
        spiffe_id,
        chain_pem: chain.concat(),
        key_pem: key.serialize_pem(),
        root_pem,
    }
}
