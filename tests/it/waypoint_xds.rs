//! A waypoint's delta ADS conversation at the wire (istio/istio `pilot/pkg/xds/delta.go`), with the node
//! Istio's proxy sends (no `extensions` list: Istio's own filters are given): the four types
//! answered on their first request; an endpoint change sends one ClusterLoadAssignment and
//! the new Workload, no LDS or CDS; a NACK is counted, logged and shown in syncz and not
//! re-sent; a reconnect with `initial_resource_versions` is sent nothing it holds; config_dump
//! shows what the waypoint holds.

use std::collections::BTreeMap;
use std::time::Duration;

use ambientd::discovery::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, WORKLOAD_TYPE};
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::workload::Workload;
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use prost::Message;

use crate::support::common::{Manifests, XdsClient, http_get, names, start, versions};

const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 10.96.0.10}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: mesh, port: 15008, appProtocol: hbone}]
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-7d9c4b-x2x7q
  namespace: demo
  labels: {gateway.networking.k8s.io/gateway-name: waypoint}
spec: {serviceAccountName: waypoint, nodeName: node-a}
status: {phase: Running, podIP: 10.244.1.5, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata:
  name: reviews
  namespace: demo
  labels: {istio.io/use-waypoint: waypoint}
spec:
  clusterIP: 10.96.0.20
  selector: {app: reviews}
  ports: [{name: http, port: 9080}]
---
apiVersion: v1
kind: Pod
metadata:
  name: reviews-1
  namespace: demo
  labels: {app: reviews}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: reviews, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.7, conditions: [{type: Ready, status: "True"}]}
"#;

const REVIEWS: &str = "inbound-vip|9080|http|reviews.demo.svc.cluster.local";

/// The node pilot-agent sends for a waypoint pod (an Istio 1.29.3 proxy).
fn istio_node() -> Node {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let labels = Value {
        kind: Some(Kind::StructValue(Struct {
            fields: [(
                "gateway.networking.k8s.io/gateway-name".to_string(),
                string("waypoint"),
            )]
            .into(),
        })),
    };
    Node {
        id: "waypoint~10.244.1.5~waypoint-7d9c4b-x2x7q.demo~demo.svc.cluster.local".into(),
        cluster: "waypoint.demo".into(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), string("demo")),
                ("NAME".to_string(), string("waypoint-7d9c4b-x2x7q")),
                ("INSTANCE_IPS".to_string(), string("10.244.1.5")),
                ("ISTIO_VERSION".to_string(), string("1.29.3")),
                ("LABELS".to_string(), labels),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

fn request(
    type_url: &str,
    subscribe: &[&str],
    known: BTreeMap<String, String>,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: Some(istio_node()),
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        initial_resource_versions: known.into_iter().collect(),
        ..Default::default()
    }
}

fn mentions(response: &DeltaDiscoveryResponse, name: &str, needle: &str) -> bool {
    response
        .resources
        .iter()
        .filter(|r| r.name == name)
        .filter_map(|r| r.resource.as_ref())
        .any(|any| {
            any.value
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
        })
}

/// The initial sync of all four types, ACKed; returns the responses by type.
async fn sync(
    client: &mut XdsClient,
    known: &BTreeMap<&str, BTreeMap<String, String>>,
) -> BTreeMap<String, DeltaDiscoveryResponse> {
    let mut got = BTreeMap::new();
    for (type_url, subscribe) in [
        (CLUSTER_TYPE, vec![]),
        (ENDPOINT_TYPE, vec![REVIEWS]),
        (LISTENER_TYPE, vec![]),
        (WORKLOAD_TYPE, vec![]),
    ] {
        let held = known.get(type_url).cloned().unwrap_or_default();
        client.send(request(type_url, &subscribe, held)).await;
        let response = client.recv().await;
        assert_eq!(
            response.type_url, type_url,
            "each first request is answered in turn"
        );
        client.ack(&response).await;
        got.insert(type_url.to_string(), response);
    }
    got
}

async fn metrics(running: &ambientd::app::Running) -> String {
    http_get(running.debug_address, "/metrics").await.1
}

#[tokio::test]
async fn a_waypoint_is_served_its_four_types_incrementally() {
    let manifests = Manifests::new(&[("mesh.yaml", MESH)]);
    let running = start(manifests.root()).await;
    let mut client = XdsClient::connect(&running).await;
    let first = sync(&mut client, &BTreeMap::new()).await;

    assert_eq!(
        names(&first[CLUSTER_TYPE]),
        ["connect_originate", "encap", REVIEWS, "main_internal"]
    );
    assert_eq!(
        names(&first[LISTENER_TYPE]),
        ["connect_originate", "connect_terminate", "main_internal"]
    );
    assert_eq!(names(&first[ENDPOINT_TYPE]), [REVIEWS]);
    // Istio's proxy gets Istio's filters (1.29.3: istio.hashable_string).
    let listeners = &first[LISTENER_TYPE];
    assert!(mentions(
        listeners,
        "connect_terminate",
        "io.istio.http.peer_metadata.Config"
    ));
    assert!(mentions(
        listeners,
        "connect_terminate",
        "istio.hashable_string"
    ));
    assert!(mentions(listeners, "main_internal", "stats.PluginConfig"));
    // Workloads: every workload, named by uid, as istio.workload.Workload.
    let workloads = &first[WORKLOAD_TYPE];
    let uids = names(workloads);
    assert!(
        uids.contains(&"Kubernetes//Pod/demo/reviews-1".to_string()),
        "{uids:?}"
    );
    for resource in &workloads.resources {
        let any = resource.resource.as_ref().unwrap();
        assert_eq!(any.type_url, WORKLOAD_TYPE);
        let workload = Workload::decode(any.value.clone()).unwrap();
        assert_eq!(workload.uid, resource.name);
    }

    // A new endpoint: one ClusterLoadAssignment and the new Workload, nothing else.
    manifests.write(
        "reviews-2.yaml",
        &MESH
            .split("---")
            .find(|d| d.contains("name: reviews-1"))
            .unwrap()
            .replace("reviews-1", "reviews-2")
            .replace("10.244.2.7", "10.244.2.8"),
    );
    let mut pushed = BTreeMap::new();
    while pushed.len() < 2 {
        let response = client.recv().await;
        client.ack(&response).await;
        assert!(
            [ENDPOINT_TYPE, WORKLOAD_TYPE].contains(&response.type_url.as_str()),
            "only EDS and Workload after an endpoint change, got {}",
            response.type_url
        );
        pushed.insert(response.type_url.clone(), response);
    }
    let eds = &pushed[ENDPOINT_TYPE];
    assert_eq!(names(eds), [REVIEWS]);
    let bytes: usize = eds.resources.iter().map(|r| r.encoded_len()).sum();
    assert!(bytes < 2048, "{bytes} B");
    assert!(mentions(eds, REVIEWS, "10.244.2.8:9080"));
    assert_eq!(
        names(&pushed[WORKLOAD_TYPE]),
        ["Kubernetes//Pod/demo/reviews-2"]
    );
    client.expect_silence(Duration::from_millis(300)).await;

    // A NACK: counted, shown in syncz, and the rejected version is not sent again.
    manifests.write(
        "deny.yaml",
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: demo}
spec:
  targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]
  action: DENY
  rules: [{}]
"#,
    );
    let lds = client.recv().await;
    assert_eq!(
        lds.type_url, LISTENER_TYPE,
        "a policy changes listeners only"
    );
    assert_eq!(names(&lds), ["main_internal"]);
    client.nack(&lds, "invalid RBAC (test)").await;
    let rejects = || async {
        metrics(&running)
            .await
            .lines()
            .filter(|l| l.starts_with("pilot_total_xds_rejects") && l.contains("lds"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rejects().await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the NACK was not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, syncz) = http_get(running.debug_address, "/debug/syncz").await;
    assert!(syncz.contains("invalid RBAC (test)"), "{syncz}");
    assert!(syncz.contains(LISTENER_TYPE), "{syncz}");
    client.expect_silence(Duration::from_millis(300)).await;

    // config_dump shows the waypoint's clusters, endpoints and listeners.
    let (status, dump) = http_get(
        running.debug_address,
        "/debug/config_dump?proxyID=waypoint-7d9c4b-x2x7q.demo",
    )
    .await;
    assert_eq!(status, 200, "{dump}");
    for expected in [
        REVIEWS,
        "connect_terminate",
        "internal:connect_originate;10.244.2.8:9080",
    ] {
        assert!(dump.contains(expected), "{expected} in {dump}");
    }

    // A reconnect holding what it was sent gets nothing again.
    let mut held: BTreeMap<&str, BTreeMap<String, String>> = BTreeMap::new();
    for (type_url, response) in first
        .iter()
        .chain(pushed.iter())
        .chain([(&LISTENER_TYPE.to_string(), &lds)])
    {
        held.entry(match type_url.as_str() {
            CLUSTER_TYPE => CLUSTER_TYPE,
            ENDPOINT_TYPE => ENDPOINT_TYPE,
            LISTENER_TYPE => LISTENER_TYPE,
            _ => WORKLOAD_TYPE,
        })
        .or_default()
        .extend(versions(response));
    }
    drop(client);
    let mut again = XdsClient::connect(&running).await;
    let resent = sync(&mut again, &held).await;
    for (type_url, response) in &resent {
        assert!(
            response.resources.is_empty() && response.removed_resources.is_empty(),
            "{type_url}: re-sent {:?}",
            names(response)
        );
    }
}

#[tokio::test]
async fn a_bad_waypoint_request_gets_a_clear_error() {
    let manifests = Manifests::new(&[("mesh.yaml", MESH)]);
    let running = start(manifests.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client
        .send(request(
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            &[],
            BTreeMap::new(),
        ))
        .await;
    let status = client.next().await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("RouteConfiguration"),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains(CLUSTER_TYPE),
        "{}",
        status.message()
    );
}
