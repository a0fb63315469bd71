//! The Kubernetes objects that describe the bed, as the API server would hold them once its
//! controllers and kubelets have done their part: Namespaces, Nodes, Pods (Running, Ready,
//! with their IP), and a waypoint's Gateway, Service and pod.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::mesh::{NAMESPACE, Pod};

/// Namespaces (the apps' one enrolled in ambient, with `labels` besides), Nodes, and the
/// ServiceAccount ztunnels run as.
pub fn cluster_objects(nodes: usize, labels: &[(&str, &str)]) -> Vec<Value> {
    let mut namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE,
        "labels": {"kubernetes.io/metadata.name": NAMESPACE, "istio.io/dataplane-mode": "ambient"},
    }});
    for (key, value) in labels {
        namespace["metadata"]["labels"][key] = json!(value);
    }
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}),
        namespace,
        service_account("istio-system", "ztunnel"),
    ];
    for i in 1..=nodes {
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": format!("node{i}"), "labels": {"kubernetes.io/hostname": format!("node{i}")}},
        }));
    }
    objects
}

pub fn service_account(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    })
}

/// A pod bound to its node, and (with `running`) the status its kubelet reports: Running,
/// Ready, with its IP.
pub fn pod_object(pod: &Pod, redirected: bool, ports: &[u16], running: bool) -> Value {
    let mut annotations = serde_json::Map::new();
    if redirected {
        annotations.insert("ambient.istio.io/redirection".into(), json!("enabled"));
    }
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"containerPort": p, "protocol": "TCP"}))
        .collect();
    let mut object = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": pod.labels,
            "annotations": annotations,
        },
        "spec": {
            "serviceAccountName": pod.service_account,
            "nodeName": pod.node,
            "containers": [{"name": "app", "image": "e2e", "ports": ports}],
        },
    });
    if !pod.uid.is_empty() {
        object["metadata"]["uid"] = json!(pod.uid);
    }
    if running {
        object["status"] = json!({
            "phase": "Running",
            "podIP": pod.ip.to_string(),
            "podIPs": [{"ip": pod.ip.to_string()}],
            "hostIP": format!("172.30.{}.2", pod.ip.octets()[2]),
            "conditions": [{"type": "Ready", "status": "True"}],
        });
    }
    object
}

/// A waypoint's Gateway, as `istioctl waypoint apply` writes it; with `vip`, also the
/// addresses istiod's gateway controller reports.
pub fn gateway(name: &str, vip: Option<Ipv4Addr>) -> Value {
    let mut gateway = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"istio.io/waypoint-for": "service"}},
        "spec": {
            "gatewayClassName": "istio-waypoint",
            "listeners": [{"name": "mesh", "port": 15008, "protocol": "HBONE",
                           "allowedRoutes": {"namespaces": {"from": "Same"}}}],
        },
    });
    if let Some(vip) = vip {
        gateway["status"] = json!({"addresses": [
            {"type": "IPAddress", "value": vip.to_string()},
            {"type": "Hostname", "value": format!("{name}.{NAMESPACE}.svc.cluster.local")},
        ]});
    }
    gateway
}

/// The GatewayClass, and the Service istiod's deployment controller makes for a waypoint.
pub fn waypoint_class_and_service(name: &str, vip: Ipv4Addr) -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "istio-waypoint"},
            "spec": {"controllerName": "istio.io/mesh-controller"},
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
                "gateway.istio.io/managed": "istio.io-mesh-controller",
                "gateway.networking.k8s.io/gateway-name": name,
            }},
            "spec": {
                "clusterIP": vip.to_string(),
                "clusterIPs": [vip.to_string()],
                "selector": {"gateway.networking.k8s.io/gateway-name": name},
                "ports": [{"name": "mesh", "port": 15008, "appProtocol": "all"}],
            },
        }),
    ]
}
