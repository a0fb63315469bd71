//! Test support: a manifests directory, a running ambientd, and a ztunnel-shaped delta xDS
//! client. Every wait has a timeout that fails the test loudly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ambientd::app::{self, Running};
use ambientd::config::Config;
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::workload::{Address, Service, Workload, address};
use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status as XdsStatus};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// How long any single expected event may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// A temporary manifests directory.
pub struct Manifests {
    pub dir: tempfile::TempDir,
}

impl Manifests {
    pub fn new(files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let manifests = Manifests { dir };
        for (name, text) in files {
            manifests.write(name, text);
        }
        manifests
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes a file atomically (write + rename), as editors and ConfigMap updates do.
    pub fn write(&self, name: &str, text: &str) {
        let path = self.path(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        let tmp = self
            .dir
            .path()
            .join(format!(".tmp-{}", name.replace('/', "_")));
        std::fs::write(&tmp, text).expect("write manifest");
        std::fs::rename(&tmp, &path).expect("rename manifest");
    }

    pub fn remove(&self, name: &str) {
        std::fs::remove_file(self.path(name)).expect("remove manifest");
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}

/// Starts ambientd on `dir` with listeners on 127.0.0.1:0 and waits until it is ready.
pub async fn start(dir: &Path) -> Running {
    let running = app::start(Config::local(dir))
        .await
        .expect("start ambientd");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("ambientd did not become ready in time")
        .expect("snapshot channel closed");
    running
}

/// A delta ADS client that behaves like ztunnel.
pub struct XdsClient {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: Streaming<DeltaDiscoveryResponse>,
}

/// ztunnel's node: id `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local` and string metadata.
pub fn ztunnel_node(node_name: &str) -> Node {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let mut fields = BTreeMap::new();
    fields.insert("NAME".to_string(), string("ztunnel-x7k2p"));
    fields.insert("NAMESPACE".to_string(), string("istio-system"));
    fields.insert("INSTANCE_IPS".to_string(), string("10.244.1.2"));
    fields.insert("NODE_NAME".to_string(), string(node_name));
    fields.insert("CLUSTER_ID".to_string(), string("Kubernetes"));
    Node {
        id: "ztunnel~10.244.1.2~ztunnel-x7k2p.istio-system~istio-system.svc.cluster.local"
            .to_string(),
        cluster: String::new(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

impl XdsClient {
    pub async fn connect(running: &Running) -> Self {
        Self::connect_with_window(running, None).await
    }

    /// Connects with an HTTP/2 receive window of `window` bytes (hyper's default is 2 MiB), so
    /// that a client that stops reading stalls the server after that much.
    pub async fn connect_with_window(running: &Running, window: Option<u32>) -> Self {
        Self::connect_to(running.xds_address, |e| {
            e.initial_stream_window_size(window)
                .initial_connection_window_size(window)
        })
        .await
    }

    /// Connects to `address` with the endpoint as `configure` leaves it.
    pub async fn connect_to(
        address: std::net::SocketAddr,
        configure: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
    ) -> Self {
        let endpoint = configure(
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).expect("endpoint"),
        );
        let channel = tokio::time::timeout(WAIT, endpoint.connect())
            .await
            .expect("connect timed out")
            .expect("connect");
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let response = tokio::time::timeout(
            WAIT,
            client.delta_aggregated_resources(ReceiverStream::new(rx)),
        )
        .await
        .expect("opening the stream timed out")
        .expect("open stream");
        XdsClient {
            requests: tx,
            responses: response.into_inner(),
        }
    }

    /// Sends ztunnel's two initial requests (Address then Authorization), wildcard.
    pub async fn subscribe_wildcard(&self, known: BTreeMap<String, String>) {
        self.send(DeltaDiscoveryRequest {
            node: Some(ztunnel_node("node-a")),
            type_url: ADDRESS_TYPE.to_string(),
            initial_resource_versions: known.into_iter().collect(),
            ..Default::default()
        })
        .await;
        self.send(DeltaDiscoveryRequest {
            node: Some(ztunnel_node("node-a")),
            type_url: AUTHORIZATION_TYPE.to_string(),
            ..Default::default()
        })
        .await;
    }

    /// An on-demand lookup, as ztunnel sends one: Address, `subscribe: [key]`, nothing else.
    pub async fn look_up(&self, key: &str) {
        self.send(DeltaDiscoveryRequest {
            type_url: ADDRESS_TYPE.to_string(),
            resource_names_subscribe: vec![key.to_string()],
            ..Default::default()
        })
        .await;
    }

    pub async fn send(&self, request: DeltaDiscoveryRequest) {
        self.requests
            .send(request)
            .await
            .expect("request stream closed");
    }

    /// Sends unless the stream has ended (its requests are no longer read); `false` then.
    pub async fn try_send(&self, request: DeltaDiscoveryRequest) -> bool {
        self.requests.send(request).await.is_ok()
    }

    /// The next response; fails the test if none comes in time or the stream ends.
    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        match tokio::time::timeout(WAIT, self.responses.message()).await {
            Err(_) => panic!("no response within {WAIT:?}"),
            Ok(Err(status)) => panic!("stream failed: {status}"),
            Ok(Ok(None)) => panic!("stream ended"),
            Ok(Ok(Some(response))) => response,
        }
    }

    /// The next item: a response or the gRPC status that ended the stream.
    pub async fn next(&mut self) -> Result<Option<DeltaDiscoveryResponse>, tonic::Status> {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("no message within the wait")
    }

    /// The next response if one arrives within `within`; fails the test if the stream fails
    /// or ends.
    pub async fn try_recv(&mut self, within: Duration) -> Option<DeltaDiscoveryResponse> {
        match tokio::time::timeout(within, self.responses.message()).await {
            Err(_) => None,
            Ok(Err(status)) => panic!("stream failed: {status}"),
            Ok(Ok(None)) => panic!("stream ended"),
            Ok(Ok(Some(response))) => Some(response),
        }
    }

    /// The next item with no time limit, for a caller that bounds its waits itself.
    pub async fn next_untimed(&mut self) -> Result<Option<DeltaDiscoveryResponse>, tonic::Status> {
        self.responses.message().await
    }

    /// Asserts nothing arrives for `quiet`.
    pub async fn expect_silence(&mut self, quiet: Duration) {
        if let Ok(message) = tokio::time::timeout(quiet, self.responses.message()).await {
            panic!("expected no response, got {message:?}");
        }
    }

    pub async fn ack(&self, response: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    pub async fn nack(&self, response: &DeltaDiscoveryResponse, message: &str) {
        self.send(DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(XdsStatus {
                code: 0,
                message: message.to_string(),
                details: Vec::new(),
            }),
            ..Default::default()
        })
        .await;
    }

    /// Receives the two initial responses (Address, Authorization), ACKs both, and returns them.
    pub async fn initial_sync(&mut self) -> (DeltaDiscoveryResponse, DeltaDiscoveryResponse) {
        let addresses = self.recv().await;
        assert_eq!(
            addresses.type_url, ADDRESS_TYPE,
            "Address is answered first"
        );
        self.ack(&addresses).await;
        let authorizations = self.recv().await;
        assert_eq!(authorizations.type_url, AUTHORIZATION_TYPE);
        self.ack(&authorizations).await;
        (addresses, authorizations)
    }
}

/// Decodes every Address resource of a response by name.
pub fn addresses(response: &DeltaDiscoveryResponse) -> BTreeMap<String, Address> {
    response
        .resources
        .iter()
        .map(|r| {
            let any = r.resource.as_ref().expect("resource payload");
            assert_eq!(any.type_url, ADDRESS_TYPE);
            (
                r.name.clone(),
                Address::decode(any.value.clone()).expect("decode Address"),
            )
        })
        .collect()
}

pub fn workload(address: &Address) -> &Workload {
    match &address.r#type {
        Some(address::Type::Workload(w)) => w,
        other => panic!("expected a workload, got {other:?}"),
    }
}

pub fn service(address: &Address) -> &Service {
    match &address.r#type {
        Some(address::Type::Service(s)) => s,
        other => panic!("expected a service, got {other:?}"),
    }
}

/// `{name: version}` of a response's resources, as ztunnel records them.
pub fn versions(response: &DeltaDiscoveryResponse) -> BTreeMap<String, String> {
    response
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect()
}

pub fn names(response: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = response.resources.iter().map(|r| r.name.clone()).collect();
    names.sort();
    names
}

/// A GET over plain HTTP/1.0; returns (status code, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut text = String::new();
        stream.read_to_string(&mut text).await.expect("read");
        text
    };
    let text = tokio::time::timeout(WAIT, fetch)
        .await
        .expect("HTTP timed out");
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}
