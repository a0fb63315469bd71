//! istiod's debug over xDS on 15012: the `istio.io/debug` types on state-of-the-world ADS,
//! answered for callers in the root namespace only.

use crate::support::ca as ca_support;
use crate::support::ca_cluster;
use crate::support::common as support;

use std::time::Duration;

use ambientd::ca::CaConfig;
use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::xds::DeltaDiscoveryRequest;
use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ca_cluster::*;
use ca_support::*;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use ambientd::pb::csds::{ClientConfig, ConfigStatus};
use ambientd::pb::xds::{DiscoveryRequest, DiscoveryResponse};
use prost::Message;

const SYNCZ: &str = "istio.io/debug/syncz";

/// Opens a state-of-the-world ADS stream as istioctl does (its token, its node) and sends
/// `first`.
async fn open_sotw(
    channel: tonic::transport::Channel,
    token: Option<&str>,
    first: DiscoveryRequest,
) -> Result<
    (
        mpsc::Sender<DiscoveryRequest>,
        tonic::Streaming<DiscoveryResponse>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let response = tokio::time::timeout(WAIT, client.stream_aggregated_resources(request))
        .await
        .expect("opening the stream timed out")?;
    Ok((tx, response.into_inner()))
}

fn debug_request(type_url: &str, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node: Some(ambientd::pb::xds::Node {
            id: "debug~0.0.0.0~istioctl~cluster.local".into(),
            ..Default::default()
        }),
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

/// One response (or the stream's error status).
async fn sotw_next(
    responses: &mut tonic::Streaming<DiscoveryResponse>,
) -> Result<DiscoveryResponse, tonic::Status> {
    tokio::time::timeout(WAIT, responses.message())
        .await
        .expect("no debug response in time")
        .map(|r| r.expect("stream ended"))
}

/// The one ClientConfig a syncz response holds, and its Address and Authorization statuses.
fn one_client(response: &DiscoveryResponse) -> (ClientConfig, Vec<(String, i32)>) {
    assert_eq!(response.resources.len(), 1, "{response:?}");
    let any = &response.resources[0];
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.service.status.v3.ClientConfig"
    );
    let config = ClientConfig::decode(&any.value[..]).unwrap();
    let statuses = config
        .generic_xds_configs
        .iter()
        .map(|g| (g.type_url.clone(), g.config_status))
        .collect();
    (config, statuses)
}

#[tokio::test]
async fn debug_over_xds_answers_root_namespace_callers_on_the_tls_port() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;
    // A connected ztunnel, not yet ACKing.
    let mut ztunnel = open_ads(
        channel.clone(),
        Some(&cluster.ztunnel_token()),
        "istio-system",
    )
    .await
    .expect("ztunnel stream");
    let addresses = next(&mut ztunnel).await;
    let authorizations = next(&mut ztunnel).await;

    // istioctl's token: the default service account of the root namespace.
    let istioctl = local_token(cluster.ca_dir.path(), "istio-system", "default", None, None);
    let (requests, mut responses) =
        open_sotw(channel.clone(), Some(&istioctl), debug_request(SYNCZ, &[]))
            .await
            .expect("debug stream accepted");
    let response = sotw_next(&mut responses).await.expect("syncz answered");
    assert_eq!(response.type_url, SYNCZ);
    assert!(!response.nonce.is_empty());
    let identifier = &response.control_plane.as_ref().unwrap().identifier;
    let identifier: serde_json::Value = serde_json::from_str(identifier).unwrap();
    assert_eq!(identifier["Component"], "istiod");
    assert_eq!(identifier["Info"]["version"], env!("CARGO_PKG_VERSION"));
    let (config, statuses) = one_client(&response);
    let node = config.node.unwrap();
    assert_eq!(node.id, support::ztunnel_node("node-a").id);
    let metadata = node.metadata.unwrap().fields;
    assert!(matches!(
        &metadata["NODE_NAME"].kind,
        Some(ambientd::pb::google::protobuf::value::Kind::StringValue(n)) if n == "node-a"
    ));
    let stale = ConfigStatus::Stale as i32;
    assert_eq!(
        statuses,
        [
            (ADDRESS_TYPE.to_string(), stale),
            (AUTHORIZATION_TYPE.to_string(), stale)
        ]
    );

    // The ztunnel ACKs both: SYNCED (asked again until the connection has recorded the ACKs).
    for response in [&addresses, &authorizations] {
        ztunnel
            ._requests
            .send(DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let synced = ConfigStatus::Synced as i32;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        requests.send(debug_request(SYNCZ, &[])).await.unwrap();
        let response = sotw_next(&mut responses).await.expect("syncz answered");
        let (_, statuses) = one_client(&response);
        if statuses.iter().all(|(_, s)| *s == synced) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never SYNCED after the ACKs: {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // An ACK of a debug response is not answered: the next response is the next request's.
    requests
        .send(DiscoveryRequest {
            type_url: SYNCZ.into(),
            response_nonce: "1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    requests
        .send(debug_request(
            "istio.io/debug/config_dump",
            &["ztunnel-x7k2p.istio-system"],
        ))
        .await
        .unwrap();
    let dump = sotw_next(&mut responses)
        .await
        .expect("config_dump answered");
    assert_eq!(dump.type_url, "istio.io/debug/config_dump");
    let mut workloads = Vec::new();
    for any in &dump.resources {
        if any.type_url == ADDRESS_TYPE {
            let address = ambientd::pb::workload::Address::decode(&any.value[..]).unwrap();
            if let Some(ambientd::pb::workload::address::Type::Workload(w)) = address.r#type {
                workloads.push(w.name);
            }
        }
    }
    workloads.sort();
    assert_eq!(workloads, ["db-1", "web-1", "ztunnel-a"], "{dump:?}");
    // Not connected here: nothing (istioctl asks every replica), not an error.
    requests
        .send(debug_request(
            "istio.io/debug/config_dump",
            &["nobody.nowhere"],
        ))
        .await
        .unwrap();
    let nothing = sotw_next(&mut responses).await.expect("answered");
    assert!(nothing.resources.is_empty());

    // istio.io/debug: a debug endpoint's JSON.
    requests
        .send(debug_request("istio.io/debug", &["syncz"]))
        .await
        .unwrap();
    let endpoint = sotw_next(&mut responses).await.expect("answered");
    assert_eq!(endpoint.resources.len(), 1);
    assert_eq!(endpoint.resources[0].type_url, "istio.io/debug");
    let syncz: serde_json::Value = serde_json::from_slice(&endpoint.resources[0].value).unwrap();
    assert_eq!(syncz[0]["proxy"], "ztunnel-x7k2p.istio-system");
    // An unknown endpoint is an error that names it.
    requests
        .send(debug_request("istio.io/debug", &["nope"]))
        .await
        .unwrap();
    let error = sotw_next(&mut responses).await.unwrap_err();
    assert_eq!(error.code(), Code::NotFound, "{error}");
    assert!(error.message().contains("/debug/nope"), "{error}");
    cluster.running.stop().await;
}

#[tokio::test]
async fn debug_over_xds_is_refused_without_a_root_namespace_identity() {
    let cluster = start(|d| CaConfig::local(d)).await;
    let channel = cluster.channel().await;
    // Another namespace's identity.
    let web = local_token(cluster.ca_dir.path(), "demo", "web", None, None);
    let (_tx, mut responses) = open_sotw(channel.clone(), Some(&web), debug_request(SYNCZ, &[]))
        .await
        .expect("stream opened");
    let error = sotw_next(&mut responses).await.unwrap_err();
    assert_eq!(error.code(), Code::PermissionDenied, "{error}");
    assert!(error.message().contains("root namespace"), "{error}");

    // The plaintext port authenticates no one.
    let plaintext =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.running.xds_address))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let (_tx, mut responses) = open_sotw(plaintext, None, debug_request(SYNCZ, &[]))
        .await
        .expect("stream opened");
    let error = sotw_next(&mut responses).await.unwrap_err();
    assert_eq!(error.code(), Code::Unauthenticated, "{error}");
    assert!(error.message().contains("15012"), "{error}");

    // State of the world serves nothing but the debug types.
    let istioctl = local_token(cluster.ca_dir.path(), "istio-system", "default", None, None);
    let (_tx, mut responses) =
        open_sotw(channel, Some(&istioctl), debug_request(ADDRESS_TYPE, &[]))
            .await
            .expect("stream opened");
    let error = sotw_next(&mut responses).await.unwrap_err();
    assert_eq!(error.code(), Code::Unimplemented, "{error}");
    assert!(
        error.message().contains("DeltaAggregatedResources"),
        "{error}"
    );
    cluster.running.stop().await;
}
