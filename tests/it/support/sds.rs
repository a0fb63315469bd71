//! A test SDS server in the place of Istio's agent: state-of-the-world `StreamSecrets` serving
//! the workload certificate as `default` (TlsCertificate: chain + key) and its root as `ROOTCA`
//! (validation context), inline PEM, on loopback TCP for the bootstrap's `sds-grpc` cluster.
//!
//! Each request is answered with the secrets among its `resource_names` that the server has;
//! an ACK (the last nonce, the same names) and a NACK are not answered. [`SdsServer::set`]
//! pushes a changed secret to every stream that asked for it. Every request is recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use ambientd::pb::envoy::config::core::v3::{DataSource, data_source};
use ambientd::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use ambientd::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use ambientd::pb::google::protobuf::Any;
use ambientd::pb::xds::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::Stream;
use prost::{Message, Name};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use super::identity::WorkloadCert;

/// What the server saw of one request.
#[derive(Clone, Debug)]
pub struct SdsRequest {
    /// Which stream (0, 1, ... in the order they opened; Envoy opens one per secret).
    pub stream: usize,
    pub resource_names: Vec<String>,
    pub version_info: String,
    pub response_nonce: String,
    /// A NACK's message.
    pub error: Option<String>,
    /// Whether the server answered it.
    pub answered: bool,
}

/// The secrets and their version (bumped by every [`SdsServer::set`]).
type Secrets = (u64, BTreeMap<String, Secret>);

#[derive(Default)]
struct Log {
    streams: usize,
    requests: Vec<SdsRequest>,
}

#[derive(Clone)]
struct Service {
    secrets: watch::Receiver<Secrets>,
    log: Arc<Mutex<Log>>,
}

/// The server; stops when dropped.
pub struct SdsServer {
    pub address: SocketAddr,
    secrets: watch::Sender<Secrets>,
    log: Arc<Mutex<Log>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SdsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SdsServer {
    /// Serves `default` and `ROOTCA` from `cert` on 127.0.0.1:0.
    pub async fn start(cert: &WorkloadCert) -> Self {
        Self::start_with(workload_secrets(cert)).await
    }

    pub async fn start_with(secrets: Vec<Secret>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind SDS");
        let address = listener.local_addr().expect("local addr");
        let map = secrets.into_iter().map(|s| (s.name.clone(), s)).collect();
        let (sender, receiver) = watch::channel((1, map));
        let log = Arc::new(Mutex::new(Log::default()));
        let service = Service {
            secrets: receiver,
            log: log.clone(),
        };
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(SecretDiscoveryServiceServer::new(service))
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
                .expect("SDS server");
        });
        SdsServer {
            address,
            secrets: sender,
            log,
            task,
        }
    }

    /// Adds or replaces a secret, pushing it to the streams that asked for it.
    pub fn set(&self, secret: Secret) {
        self.secrets.send_modify(|(version, secrets)| {
            *version += 1;
            secrets.insert(secret.name.clone(), secret);
        });
    }

    /// Replaces `default` and `ROOTCA` (a rotation).
    pub fn set_cert(&self, cert: &WorkloadCert) {
        for secret in workload_secrets(cert) {
            self.set(secret);
        }
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<SdsRequest> {
        self.log.lock().unwrap().requests.clone()
    }

    /// The NACKs' messages.
    pub fn nacks(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.error)
            .collect()
    }
}

/// `default` and `ROOTCA` as Istio's agent serves them for `cert`.
pub fn workload_secrets(cert: &WorkloadCert) -> Vec<Secret> {
    vec![
        tls_certificate_secret("default", &cert.chain_pem, &cert.key_pem),
        validation_context_secret("ROOTCA", &cert.root_pem),
    ]
}

fn inline(pem: &str) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineString(pem.to_string())),
    })
}

/// A TlsCertificate secret with an inline chain and key (PEM).
pub fn tls_certificate_secret(name: &str, chain_pem: &str, key_pem: &str) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(chain_pem),
            private_key: inline(key_pem),
        })),
    }
}

/// A validation-context secret trusting `root_pem`.
pub fn validation_context_secret(name: &str, root_pem: &str) -> Secret {
    Secret {
        name: name.to_string(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(root_pem),
                ..Default::default()
            },
        )),
    }
}

fn response(
    version: u64,
    secrets: &BTreeMap<String, Secret>,
    names: &[String],
    nonce: u64,
) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_string(),
        resources: names
            .iter()
            .filter_map(|name| secrets.get(name))
            .map(|secret| Any {
                type_url: Secret::type_url(),
                value: secret.encode_to_vec().into(),
            })
            .collect(),
        type_url: Secret::type_url(),
        nonce: nonce.to_string(),
        ..Default::default()
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for Service {
    type StreamSecretsStream = ResponseStream<DiscoveryResponse>;
    type DeltaSecretsStream = ResponseStream<DeltaDiscoveryResponse>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let mut requests = request.into_inner();
        let mut secrets = self.secrets.clone();
        let log = self.log.clone();
        let stream = {
            let mut log = log.lock().unwrap();
            log.streams += 1;
            log.streams - 1
        };
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // What this stream asked for, and the nonce of the last response sent.
            let mut names: Vec<String> = Vec::new();
            let mut nonce = 0u64;
            let mut sent_version = 0u64;
            loop {
                let answer = tokio::select! {
                    request = requests.message() => {
                        let Ok(Some(request)) = request else { return };
                        let error = request.error_detail.as_ref().map(|s| s.message.clone());
                        let same_names = request.resource_names.iter().collect::<BTreeSet<_>>()
                            == names.iter().collect::<BTreeSet<_>>();
                        let current = nonce > 0 && request.response_nonce == nonce.to_string();
                        // A first request (or a reconnect) has no nonce; one that changes the
                        // names is answered; an ACK or NACK of the last response is not, nor is
                        // one with a stale nonce.
                        let answer = error.is_none()
                            && (request.response_nonce.is_empty() || (current && !same_names));
                        if request.response_nonce.is_empty() || current {
                            names = request.resource_names.clone();
                        }
                        log.lock().unwrap().requests.push(SdsRequest {
                            stream,
                            resource_names: request.resource_names,
                            version_info: request.version_info,
                            response_nonce: request.response_nonce,
                            error,
                            answered: answer,
                        });
                        answer
                    }
                    changed = secrets.changed() => {
                        if changed.is_err() { return }
                        // Pushed only if this stream has been answered and holds an older version.
                        nonce > 0 && secrets.borrow().0 != sent_version
                    }
                };
                if answer {
                    nonce += 1;
                    let message = {
                        let current = secrets.borrow_and_update();
                        sent_version = current.0;
                        response(current.0, &current.1, &names, nonce)
                    };
                    if tx.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "this test SDS server speaks StreamSecrets",
        ))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let request = request.into_inner();
        let current = self.secrets.borrow();
        Ok(Response::new(response(
            current.0,
            &current.1,
            &request.resource_names,
            0,
        )))
    }
}
