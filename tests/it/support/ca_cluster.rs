//! A running ambientd with a local CA and the demo mesh, and ztunnel-shaped delta ADS streams
//! on 15012, for the 15012 tests (ca_tls.rs, ca_debug_xds.rs).

use ambientd::app::{self, Running};
use ambientd::ca::CaConfig;
use ambientd::config::Config;
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::ca::*;
use super::common as support;

pub const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Pod
metadata: {name: ztunnel-a, namespace: istio-system, uid: 11111111-aaaa}
spec: {serviceAccountName: ztunnel, nodeName: node-a, containers: [{name: istio-proxy}]}
status: {phase: Running, podIP: 10.244.1.2, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: demo, labels: {app: web}}
spec: {serviceAccountName: web, nodeName: node-a, containers: [{name: main}]}
status: {phase: Running, podIP: 10.244.1.10, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: demo, labels: {app: db}}
spec: {serviceAccountName: db, nodeName: node-b, containers: [{name: main}]}
status: {phase: Running, podIP: 10.244.2.10, conditions: [{type: Ready, status: "True"}]}
"#;

pub const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";
pub const DB: &str = "spiffe://cluster.local/ns/demo/sa/db";

pub struct Cluster {
    pub _manifests: support::Manifests,
    pub ca_dir: tempfile::TempDir,
    pub running: Running,
}

/// [`start`] with a plugged-in CA read from `cacerts`.
pub async fn start_plugged(cacerts: &std::path::Path) -> Cluster {
    let dir = cacerts.to_path_buf();
    start(move |ca_dir| {
        let mut config = CaConfig::local(ca_dir);
        config.cacerts = Some(dir);
        config
    })
    .await
}

pub async fn start(ca: impl FnOnce(&std::path::Path) -> CaConfig) -> Cluster {
    let manifests = support::Manifests::new(&[("mesh.yaml", MESH)]);
    let ca_dir = tempfile::tempdir().unwrap();
    let mut config = Config::local(manifests.root());
    config.ca = Some(ca(ca_dir.path()));
    let running = app::start(config).await.expect("start ambientd");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .expect("not ready in time")
        .unwrap();
    Cluster {
        _manifests: manifests,
        ca_dir,
        running,
    }
}

impl Cluster {
    pub async fn channel(&self) -> tonic::transport::Channel {
        let tls = ztunnel_tls(&self.ca_dir.path().join("root-cert.pem"));
        channel(self.running.xds_tls_address.unwrap(), tls, ISTIOD)
            .await
            .expect("TLS connect with ztunnel's settings")
    }

    pub fn ztunnel_token(&self) -> String {
        local_token(
            self.ca_dir.path(),
            "istio-system",
            "ztunnel",
            None,
            Some("node-a"),
        )
    }
}

/// Opens a delta ADS stream with `token` and sends ztunnel's two initial requests.
pub async fn open_ads(
    channel: tonic::transport::Channel,
    token: Option<&str>,
    namespace: &str,
) -> Result<Ads, tonic::Status> {
    open_ads_holding(channel, token, namespace, Default::default()).await
}

/// [`open_ads`] for a reconnecting ztunnel that holds `held` Address resources (name ->
/// version).
pub async fn open_ads_holding(
    channel: tonic::transport::Channel,
    token: Option<&str>,
    namespace: &str,
    held: std::collections::BTreeMap<String, String>,
) -> Result<Ads, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    let mut node = support::ztunnel_node("node-a");
    node.metadata.as_mut().unwrap().fields.insert(
        "NAMESPACE".into(),
        ambientd::pb::google::protobuf::Value {
            kind: Some(ambientd::pb::google::protobuf::value::Kind::StringValue(
                namespace.into(),
            )),
        },
    );
    for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
        tx.send(DeltaDiscoveryRequest {
            node: Some(node.clone()),
            type_url: type_url.to_string(),
            initial_resource_versions: if type_url == ADDRESS_TYPE {
                held.clone()
            } else {
                Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    tokio::time::timeout(WAIT, client.delta_aggregated_resources(request))
        .await
        .expect("opening the stream timed out")
        .map(|response| Ads {
            _requests: tx,
            responses: response.into_inner(),
        })
}

/// An open stream; the request side stays open while it lives, as ztunnel's does.
#[derive(Debug)]
pub struct Ads {
    pub _requests: mpsc::Sender<DeltaDiscoveryRequest>,
    pub responses: tonic::Streaming<DeltaDiscoveryResponse>,
}

pub async fn next(stream: &mut Ads) -> DeltaDiscoveryResponse {
    tokio::time::timeout(WAIT, stream.responses.message())
        .await
        .expect("no response in time")
        .expect("stream error")
        .expect("stream ended")
}
