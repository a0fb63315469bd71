//! `ambientd sds`: a local SDS server for a plain Envoy run as a waypoint, doing the part of
//! pilot-agent's job that ambientd's waypoint config relies on: the secrets `default` (a
//! workload certificate for one identity, signed by the local CA in `--ca-dir`) and `ROOTCA`
//! (its roots), over state-of-the-world `StreamSecrets` on the `sds-grpc` cluster.
//!
//! In a cluster Istio's proxy has pilot-agent for this; this command exists so that
//! `examples/waypoint/` runs with nothing but ambientd and Envoy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use clap::Args;
use futures::{Stream, StreamExt};
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use crate::ca::identity::SpiffeId;
use crate::ca::signer::{Csr, Signer};
use crate::pb::envoy::config::core::v3::{DataSource, data_source};
use crate::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use crate::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use crate::pb::google::protobuf::Any;
use crate::pb::xds::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// `ambientd sds`: serve a waypoint Envoy its certificate and roots.
#[derive(Clone, Debug, Args)]
pub struct SdsArgs {
    /// The identity's namespace.
    #[arg(long)]
    pub namespace: String,
    /// The identity's service account.
    #[arg(long)]
    pub service_account: String,
    #[arg(long, default_value = "cluster.local")]
    pub trust_domain: String,
    /// Where to serve SDS (the bootstrap's `sds-grpc` cluster).
    #[arg(long, default_value = "127.0.0.1:15053")]
    pub listen: SocketAddr,
    /// Certificate lifetime, such as 24h.
    #[arg(long, default_value = "24h", value_parser = crate::ca::token::parse_duration)]
    pub ttl: Duration,
    /// The local CA directory, as given to `serve` (its self-signed root, created if missing).
    #[arg(
        long,
        env = "AMBIENTD_CA_DIR",
        default_value = "ambientd-ca",
        value_name = "DIR"
    )]
    pub ca_dir: PathBuf,
}

/// The two secrets a waypoint's TLS contexts name.
#[derive(Clone, Debug)]
pub struct Secrets {
    pub default: Secret,
    pub root: Secret,
}

impl Secrets {
    /// A fresh key and a certificate for `identity` from `signer`.
    pub fn issue(signer: &Signer, identity: &SpiffeId, ttl: Duration) -> Result<Secrets, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| format!("generating a key: {e}"))?;
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .and_then(|csr| csr.pem())
            .map_err(|e| format!("making a CSR: {e}"))?;
        let csr = Csr::parse_pem(&csr).map_err(|e| e.to_string())?;
        let chain = signer
            .sign_workload(&csr, identity, ttl, time::OffsetDateTime::now_utc())
            .map_err(|e| e.to_string())?;
        // The chain as Envoy wants it: the leaf and intermediates, not the roots.
        let leaf_and_intermediates = chain[..chain.len() - 1].concat();
        let inline = |text: String| DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
        };
        Ok(Secrets {
            default: Secret {
                name: "default".into(),
                r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                    certificate_chain: Some(inline(leaf_and_intermediates)),
                    private_key: Some(inline(key.serialize_pem())),
                })),
            },
            root: Secret {
                name: "ROOTCA".into(),
                r#type: Some(secret::Type::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: Some(inline(signer.root_bundle().to_string())),
                        ..Default::default()
                    },
                )),
            },
        })
    }

    fn named(&self, name: &str) -> Option<&Secret> {
        [&self.default, &self.root]
            .into_iter()
            .find(|s| s.name == name)
    }

    /// The response to a request for `names` (every secret when it names none).
    fn response(&self, names: &[String], nonce: u64) -> DiscoveryResponse {
        let resources = if names.is_empty() {
            vec![&self.default, &self.root]
        } else {
            names.iter().filter_map(|n| self.named(n)).collect()
        };
        DiscoveryResponse {
            version_info: "1".into(),
            resources: resources
                .into_iter()
                .map(|s| Any {
                    type_url: SECRET_TYPE.into(),
                    value: s.encode_to_vec().into(),
                })
                .collect(),
            type_url: SECRET_TYPE.into(),
            nonce: nonce.to_string(),
            ..Default::default()
        }
    }
}

/// The SDS service over fixed secrets.
#[derive(Clone, Debug)]
pub struct SdsServer(pub std::sync::Arc<Secrets>);

type SotwStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for SdsServer {
    type StreamSecretsStream = SotwStream;
    type DeltaSecretsStream = DeltaStream;

    /// Answers each request that asks for names it has not been answered for (the first,
    /// and any with new names); ACKs get nothing.
    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let secrets = self.0.clone();
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut answered: Vec<String> = Vec::new();
            let mut nonce = 0u64;
            while let Some(Ok(request)) = requests.next().await {
                if !request.response_nonce.is_empty() && request.resource_names == answered {
                    continue;
                }
                nonce += 1;
                answered = request.resource_names.clone();
                let response = secrets.response(&request.resource_names, nonce);
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "ambientd sds serves StreamSecrets (state of the world), as pilot-agent does",
        ))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        Ok(Response::new(
            self.0.response(&request.into_inner().resource_names, 1),
        ))
    }
}

/// Runs `ambientd sds` until interrupted.
pub async fn run(args: SdsArgs) -> Result<(), String> {
    let loaded = crate::ca::roots::load_or_create_self_signed(
        &args.ca_dir,
        &args.trust_domain,
        time::OffsetDateTime::now_utc(),
    )
    .map_err(|e| e.to_string())?;
    let identity = SpiffeId::new(&args.trust_domain, &args.namespace, &args.service_account);
    let secrets = Secrets::issue(&loaded.signer, &identity, args.ttl)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("binding --listen {}: {e}", args.listen))?;
    eprintln!("serving SDS for {identity} on {}", args.listen);
    tonic::transport::Server::builder()
        .add_service(SecretDiscoveryServiceServer::new(SdsServer(
            std::sync::Arc::new(secrets),
        )))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;

    #[tokio::test]
    async fn serves_a_certificate_for_the_identity_and_the_roots() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = crate::ca::roots::load_or_create_self_signed(
            dir.path(),
            "cluster.local",
            time::OffsetDateTime::now_utc(),
        )
        .unwrap();
        let identity = SpiffeId::new("cluster.local", "bookinfo", "waypoint");
        let secrets = Secrets::issue(&loaded.signer, &identity, Duration::from_secs(3600)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(SecretDiscoveryServiceServer::new(SdsServer(
                    std::sync::Arc::new(secrets),
                )))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut client = SecretDiscoveryServiceClient::connect(format!("http://{address}"))
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(DiscoveryRequest {
            resource_names: vec!["default".into()],
            type_url: SECRET_TYPE.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let mut responses = client
            .stream_secrets(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let response = responses.message().await.unwrap().unwrap();
        assert_eq!(response.resources.len(), 1);
        let secret = Secret::decode(response.resources[0].value.clone()).unwrap();
        let Some(secret::Type::TlsCertificate(cert)) = secret.r#type else {
            panic!("a certificate")
        };
        let Some(data_source::Specifier::InlineString(chain)) =
            cert.certificate_chain.and_then(|c| c.specifier)
        else {
            panic!("inline chain")
        };
        let der = crate::ca::keys::certificates(chain.as_bytes()).unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        let san = leaf.subject_alternative_name().unwrap().unwrap();
        assert!(
            format!("{:?}", san.value).contains("spiffe://cluster.local/ns/bookinfo/sa/waypoint")
        );
        // The ACK gets nothing; a request for ROOTCA gets the roots.
        tx.send(DiscoveryRequest {
            resource_names: vec!["default".into()],
            response_nonce: response.nonce.clone(),
            type_url: SECRET_TYPE.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        tx.send(DiscoveryRequest {
            resource_names: vec!["ROOTCA".into()],
            response_nonce: response.nonce.clone(),
            type_url: SECRET_TYPE.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let roots = responses.message().await.unwrap().unwrap();
        let secret = Secret::decode(roots.resources[0].value.clone()).unwrap();
        assert_eq!(secret.name, "ROOTCA");
        assert!(matches!(
            secret.r#type,
            Some(secret::Type::ValidationContext(_))
        ));
    }
}
