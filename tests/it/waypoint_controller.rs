//! The waypoint deployment controller and Gateway status (istio/istio `pilot/pkg/config/kube/gatewaycommon/deploymentcontroller.go` and `pilot/pkg/config/kube/gateway/conversion.go`, issue 23), run
//! by a whole replica against the fake API server: `istioctl waypoint apply`'s Gateway gets its
//! GatewayClass, ServiceAccount, Deployment and Service (owned by the Gateway); once its
//! Service has a ClusterIP and a ready pod the Gateway's status has both addresses and
//! `Programmed`, a Service labelled `istio.io/use-waypoint` is then sent to ztunnel with its
//! waypoint; deleting the Gateway stops the applies and unbinds the Service. A replica that does
//! not lead writes nothing.

use crate::support::common::XdsClient;
use crate::support::kube as kube_support;

use std::time::Duration;

use ambientd::pb::workload::address;
use kube_support::FakeApiServer;
use kube_support::replica::{SYSTEM, replica, until};
use serde_json::{Value, json};

const GROUP: &str = "gateway.networking.k8s.io/v1";

fn seed(fake: &FakeApiServer) {
    for ns in [SYSTEM, "apps"] {
        fake.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "reviews", "namespace": "apps",
                     "labels": {"istio.io/use-waypoint": "waypoint"}},
        "spec": {"clusterIP": "10.96.0.20", "selector": {"app": "reviews"},
                 "ports": [{"name": "http", "port": 9080}]},
    }));
}

/// What `istioctl waypoint apply -n apps` creates.
fn waypoint_gateway() -> Value {
    json!({
        "apiVersion": GROUP, "kind": "Gateway",
        "metadata": {"name": "waypoint", "namespace": "apps"},
        "spec": {"gatewayClassName": "istio-waypoint",
                 "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
    })
}

/// Requests that write what the waypoint controller writes.
fn controller_writes(fake: &FakeApiServer) -> Vec<String> {
    fake.writes()
        .iter()
        .filter(|r| {
            r.path.contains("/gatewayclasses")
                || r.path.contains("/serviceaccounts")
                || r.path.contains("/deployments")
                || (r.path.ends_with("/gateways/waypoint/status"))
                || (r.path.contains("/services/waypoint") && r.method == "PATCH")
        })
        .map(|r| r.to_string())
        .collect()
}

fn condition<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

#[tokio::test]
async fn a_waypoint_gateway_is_deployed_gets_its_status_and_binds() {
    let fake = FakeApiServer::start().await;
    seed(&fake);
    // Another replica holds the Lease: this one must write nothing while it waits.
    fake.apply(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "ambientd-leader", "namespace": SYSTEM},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3,
                 "renewTime": now_micro(), "acquireTime": now_micro(), "leaseTransitions": 0},
    }));
    fake.apply(waypoint_gateway());
    let b = replica(&fake, "b", &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!b.running.leadership.is_leader());
    assert_eq!(
        controller_writes(&fake),
        Vec::<String>::new(),
        "a replica that does not lead writes nothing"
    );
    // The other replica is gone: its Lease expires and this one leads.
    until("b leads", || b.running.leadership.is_leader()).await;

    // The class, then the three objects, owned by the Gateway.
    until("GatewayClass istio-waypoint", || {
        fake.get(GROUP, "GatewayClass", "", "istio-waypoint")
            .is_some()
    })
    .await;
    let class = fake
        .get(GROUP, "GatewayClass", "", "istio-waypoint")
        .unwrap();
    assert_eq!(class["spec"]["controllerName"], "istio.io/mesh-controller");
    until("the class Accepted", || {
        fake.get(GROUP, "GatewayClass", "", "istio-waypoint")
            .is_some_and(|c| {
                condition(&c["status"], "Accepted").is_some_and(|a| a["status"] == "True")
            })
    })
    .await;
    let gateway_uid =
        fake.get(GROUP, "Gateway", "apps", "waypoint").unwrap()["metadata"]["uid"].clone();
    until("the waypoint's objects", || {
        fake.get("v1", "ServiceAccount", "apps", "waypoint")
            .is_some()
            && fake
                .get("apps/v1", "Deployment", "apps", "waypoint")
                .is_some()
            && fake.get("v1", "Service", "apps", "waypoint").is_some()
    })
    .await;
    for (api_version, kind) in [
        ("v1", "ServiceAccount"),
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
    ] {
        let object = fake.get(api_version, kind, "apps", "waypoint").unwrap();
        let owners = object["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            owners.iter().any(|o| o["kind"] == "Gateway"
                && o["name"] == "waypoint"
                && o["uid"] == gateway_uid),
            "{kind} owned by the Gateway: {object}"
        );
        assert_eq!(
            object["metadata"]["labels"]["gateway.istio.io/managed"], "istio.io-mesh-controller",
            "{kind}"
        );
    }
    let deployment = fake
        .get("apps/v1", "Deployment", "apps", "waypoint")
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "docker.io/istio/proxyv2:1.28.0");
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "waypoint"),
        "{container}"
    );
    let service = fake.get("v1", "Service", "apps", "waypoint").unwrap();
    let ports: Vec<i64> = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert_eq!(ports, [15021, 15008]);
    assert!(
        fake.writes()
            .iter()
            .any(|r| r.path.ends_with("/deployments/waypoint")
                && r.decoded_param("fieldManager").as_deref()
                    == Some("istio.io/gateway-controller"))
    );

    // No ClusterIP, no pod yet: not programmed, and nothing binds.
    until("the Gateway's first status", || {
        fake.get(GROUP, "Gateway", "apps", "waypoint")
            .is_some_and(|g| condition(&g["status"], "Programmed").is_some())
    })
    .await;
    let status = fake.get(GROUP, "Gateway", "apps", "waypoint").unwrap()["status"].clone();
    assert_eq!(
        condition(&status, "Accepted").unwrap()["status"],
        "True",
        "{status}"
    );
    assert_eq!(
        condition(&status, "Programmed").unwrap()["status"],
        "False",
        "{status}"
    );

    // The API server gives the Service its ClusterIP, and the waypoint's pod becomes ready.
    let mut service = fake.get("v1", "Service", "apps", "waypoint").unwrap();
    service["spec"]["clusterIP"] = json!("10.96.0.10");
    fake.apply(service);
    fake.apply(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "waypoint-5d8f-x2", "namespace": "apps",
                     "labels": {"gateway.networking.k8s.io/gateway-name": "waypoint"}},
        "spec": {"serviceAccountName": "waypoint", "nodeName": "node-a",
                 "containers": [{"name": "istio-proxy", "ports": [{"containerPort": 15008}]}]},
        "status": {"phase": "Running", "podIP": "10.244.1.5",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }));
    until("the Gateway programmed with both addresses", || {
        fake.get(GROUP, "Gateway", "apps", "waypoint")
            .is_some_and(|g| {
                let status = &g["status"];
                condition(status, "Programmed").is_some_and(|p| p["status"] == "True")
                    && status["addresses"]
                        == json!([
                            {"type": "IPAddress", "value": "10.96.0.10"},
                            {"type": "Hostname", "value": "waypoint.apps.svc.cluster.local"},
                        ])
            })
    })
    .await;
    let status = fake.get(GROUP, "Gateway", "apps", "waypoint").unwrap()["status"].clone();
    assert_eq!(
        condition(&status, "Programmed").unwrap()["message"],
        "Resource programmed, assigned to service(s) waypoint.apps.svc.cluster.local:15008"
    );

    // The index reads the status: ztunnel is sent reviews with its waypoint.
    let mut client = XdsClient::connect(&b.running).await;
    client.subscribe_wildcard(Default::default()).await;
    let (addresses, _) = client.initial_sync().await;
    let reviews = crate::support::common::addresses(&addresses);
    let service = crate::support::common::service(&reviews["apps/reviews.apps.svc.cluster.local"]);
    assert!(service.waypoint.is_some(), "reviews is bound: {service:?}");

    // The Gateway deleted: the binding goes, and nothing more is applied for it.
    assert!(fake.delete(GROUP, "Gateway", "apps", "waypoint"));
    let unbound = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let response = client.recv().await;
            client.ack(&response).await;
            let changed = crate::support::common::addresses(&response);
            if let Some(address) = changed.get("apps/reviews.apps.svc.cluster.local")
                && let Some(address::Type::Service(s)) = &address.r#type
                && s.waypoint.is_none()
            {
                return;
            }
        }
    })
    .await;
    assert!(
        unbound.is_ok(),
        "reviews unbound after the Gateway's deletion"
    );
    let before = controller_writes(&fake).len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        controller_writes(&fake).len(),
        before,
        "no applies for a deleted Gateway"
    );
}

fn now_micro() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}
