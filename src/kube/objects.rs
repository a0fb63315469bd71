//! Kubernetes objects as they appear in YAML/JSON, decoded to only the fields ambientd reads,
//! then reduced to [`crate::discovery::model`] types with the API server's defaults applied.
//!
//! Defaults applied on read (what the API server would write), listed in docs/manifests.md:
//! a namespaced object without `metadata.namespace` is in `default`; a Service port's
//! `protocol` is TCP and its `targetPort` is its `port`; `spec.type` is ClusterIP;
//! `clusterIPs` is `[clusterIP]`; a container port's
//! `protocol` is TCP; a Pod's `serviceAccountName` is `serviceAccount` or `default`; its
//! `status.phase` is `Pending`; `podIPs` is `[podIP]`.

use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use crate::discovery::model::{
    ContainerPort, IpFamily, Labels, Namespace, Node, Object, Owner, Pod, PodFields, Protocol,
    Service, ServicePort, TargetPort,
};
use crate::kube::{destination_rule, mesh, routes, security, virtual_services};

/// The pod annotations the conversion reads; others are dropped on decode to save memory.
const POD_ANNOTATIONS: &[&str] = &["ambient.istio.io/redirection"];

/// Why one object could not be used. It names the object and the field.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name}: {reason}")]
pub struct ObjectError {
    pub kind: String,
    pub name: String,
    pub reason: String,
}

/// The outcome of decoding one document (or one item of a `kind: List`).
#[allow(clippy::large_enum_variant)] // short-lived, consumed right away
#[derive(Debug)]
pub enum Decoded {
    Object(Object),
    /// A kind ambientd does not read; the payload names it for a debug log.
    Ignored(String),
    Invalid(ObjectError),
}

/// Parses YAML text into its documents, as kubectl reads it but with YAML 1.2 booleans
/// (`n`, `yes` and `off` stay strings). Empty documents are dropped. The error's first line
/// has the position.
pub fn parse_yaml(text: &str) -> Result<Vec<Value>, String> {
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options)
        .map(|documents| documents.into_iter().filter(|d| !d.is_null()).collect())
        .map_err(|e| e.to_string())
}

/// Decodes one Kubernetes object (a JSON value), expanding `kind: List` into its items.
pub fn decode(value: Value) -> Vec<Decoded> {
    let api_version = value
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let kind_name = if api_version.is_empty() {
        kind.to_string()
    } else {
        format!("{api_version}/{kind}")
    };
    let result = match (api_version, kind) {
        (_, "List") | (_, "ServiceList") | (_, "PodList") => {
            return match value.get("items") {
                Some(Value::Array(items)) => items.iter().cloned().flat_map(decode).collect(),
                _ => Vec::new(),
            };
        }
        ("v1", "Namespace") => parse::<RawNamespace>(&value).and_then(RawNamespace::reduce),
        ("v1", "Node") => parse::<RawNode>(&value).and_then(RawNode::reduce),
        ("v1", "Pod") => parse::<RawPod>(&value).and_then(RawPod::reduce),
        ("v1", "Service") => parse::<RawService>(&value).and_then(RawService::reduce),
        ("discovery.k8s.io/v1", "EndpointSlice") => mesh::endpoint_slice(&value),
        (
            "networking.istio.io/v1"
            | "networking.istio.io/v1beta1"
            | "networking.istio.io/v1alpha3",
            "ServiceEntry",
        ) => mesh::service_entry(&value),
        (
            "networking.istio.io/v1"
            | "networking.istio.io/v1beta1"
            | "networking.istio.io/v1alpha3",
            "WorkloadEntry",
        ) => mesh::workload_entry(&value),
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "Gateway") => {
            mesh::gateway(&value)
        }
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "GatewayClass") => {
            mesh::gateway_class(&value)
        }
        (
            "networking.istio.io/v1"
            | "networking.istio.io/v1beta1"
            | "networking.istio.io/v1alpha3",
            "DestinationRule",
        ) => destination_rule::decode(&value).map(Object::DestinationRule),
        ("security.istio.io/v1" | "security.istio.io/v1beta1", "AuthorizationPolicy") => {
            security::decode_authorization_policy(&value).map(Object::AuthorizationPolicy)
        }
        ("security.istio.io/v1" | "security.istio.io/v1beta1", "PeerAuthentication") => {
            security::decode_peer_authentication(&value).map(Object::PeerAuthentication)
        }
        ("security.istio.io/v1" | "security.istio.io/v1beta1", "RequestAuthentication") => {
            security::decode_request_authentication(&value).map(Object::RequestAuthentication)
        }
        ("gateway.networking.k8s.io/v1" | "gateway.networking.k8s.io/v1beta1", "HTTPRoute") => {
            routes::http_route(&value)
        }
        ("gateway.networking.k8s.io/v1", "GRPCRoute") => routes::grpc_route(&value),
        (
            "networking.istio.io/v1"
            | "networking.istio.io/v1beta1"
            | "networking.istio.io/v1alpha3",
            "VirtualService",
        ) => virtual_services::virtual_service(&value),
        _ => return vec![Decoded::Ignored(kind_name)],
    };
    vec![match result {
        Ok(object) => Decoded::Object(object),
        Err(reason) => Decoded::Invalid(ObjectError {
            kind: kind_name,
            name: object_name(&value),
            reason,
        }),
    }]
}

/// Decodes one object of a known `apiVersion` and `kind` from its JSON text (a watched object,
/// whose `apiVersion` and `kind` fields may be absent). The core kinds are decoded straight
/// from the text; the others through a JSON value, as [`decode`] reads them. `None`: not a
/// kind ambientd reads. An error names the failing field.
pub fn decode_json(api_version: &str, kind: &str, json: &str) -> Option<Result<Object, String>> {
    Some(match (api_version, kind) {
        ("v1", "Namespace") => parse_json::<RawNamespace>(json).and_then(RawNamespace::reduce),
        ("v1", "Node") => parse_json::<RawNode>(json).and_then(RawNode::reduce),
        ("v1", "Pod") => parse_json::<RawPod>(json).and_then(RawPod::reduce),
        ("v1", "Service") => parse_json::<RawService>(json).and_then(RawService::reduce),
        (_, "List") | (_, "ServiceList") | (_, "PodList") => return None,
        _ => {
            let mut value: Value = match serde_json::from_str(json) {
                Ok(value) => value,
                Err(error) => return Some(Err(error.to_string())),
            };
            if let Some(map) = value.as_object_mut() {
                map.insert("apiVersion".into(), api_version.into());
                map.insert("kind".into(), kind.into());
            }
            match decode(value).into_iter().next()? {
                Decoded::Object(object) => Ok(object),
                Decoded::Invalid(error) => Err(error.reason),
                Decoded::Ignored(_) => return None,
            }
        }
    })
}

fn object_name(value: &Value) -> String {
    let meta = value.get("metadata");
    let get = |field: &str| meta.and_then(|m| m.get(field)).and_then(Value::as_str);
    match (get("namespace"), get("name")) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "<unnamed>".to_string(),
    }
}

/// Decodes with the failing field's path in the message (`spec.ports[0].port: invalid type`).
/// Objects decode without tracking the path, which costs about a third of the decode; only a
/// failure is decoded again to find where it failed.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(value: &Value) -> Result<T, String> {
    T::deserialize(value).or_else(|_| {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })
    })
}

/// [`parse`] from JSON text, without an intermediate value.
pub(crate) fn parse_json<T: for<'de> Deserialize<'de>>(json: &str) -> Result<T, String> {
    serde_json::from_str(json).or_else(|_| {
        let mut deserializer = serde_json::Deserializer::from_str(json);
        let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        })?;
        deserializer.end().map_err(|e| e.to_string())?;
        Ok(value)
    })
}

/// Labels and annotations, accepting unquoted scalars (`version: 2`) as their text; `null` is
/// empty. Read straight into [`Labels`], without an intermediate map.
pub(crate) fn string_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Labels, D::Error> {
    d.deserialize_option(LabelsVisitor)
}

struct LabelsVisitor;

impl<'de> serde::de::Visitor<'de> for LabelsVisitor {
    type Value = Labels;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E>(self) -> Result<Labels, E> {
        Ok(Labels::new())
    }

    fn visit_unit<E>(self) -> Result<Labels, E> {
        Ok(Labels::new())
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Labels, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
        let mut entries: Vec<(String, String)> = Vec::with_capacity(map.size_hint().unwrap_or(4));
        while let Some((key, ScalarText(value))) = map.next_entry::<String, ScalarText>()? {
            entries.push((key, value));
        }
        Ok(entries.into_iter().collect())
    }
}

/// Any value as text: a string as itself, `null` as empty, anything else as its JSON.
struct ScalarText(String);

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl<'de> serde::de::Visitor<'de> for Text {
            type Value = String;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E>(self, v: &str) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_string<E>(self, v: String) -> Result<String, E> {
                Ok(v)
            }
            fn visit_unit<E>(self) -> Result<String, E> {
                Ok(String::new())
            }
            fn visit_none<E>(self) -> Result<String, E> {
                Ok(String::new())
            }
            fn visit_bool<E>(self, v: bool) -> Result<String, E> {
                Ok(v.to_string())
            }
            fn visit_i64<E>(self, v: i64) -> Result<String, E> {
                Ok(Value::from(v).to_string())
            }
            fn visit_u64<E>(self, v: u64) -> Result<String, E> {
                Ok(Value::from(v).to_string())
            }
            fn visit_f64<E>(self, v: f64) -> Result<String, E> {
                Ok(Value::from(v).to_string())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, a: A) -> Result<String, A::Error> {
                let d = serde::de::value::SeqAccessDeserializer::new(a);
                Ok(Value::deserialize(d)?.to_string())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, a: A) -> Result<String, A::Error> {
                let d = serde::de::value::MapAccessDeserializer::new(a);
                Ok(Value::deserialize(d)?.to_string())
            }
        }
        d.deserialize_any(Text).map(ScalarText)
    }
}

/// A string field that may be written unquoted as a bool or number (`status: True`).
fn lenient_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(scalar_text(Value::deserialize(d)?))
}

fn scalar_text(value: Value) -> String {
    match value {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RawMeta {
    pub(crate) name: String,
    pub(crate) namespace: Option<String>,
    pub(crate) uid: String,
    pub(crate) generate_name: String,
    #[serde(deserialize_with = "string_map")]
    pub(crate) labels: Labels,
    #[serde(deserialize_with = "string_map")]
    pub(crate) annotations: Labels,
    pub(crate) owner_references: Vec<RawOwnerReference>,
    pub(crate) deletion_timestamp: Option<Value>,
    pub(crate) creation_timestamp: Option<Value>,
    pub(crate) generation: Option<i64>,
}

impl RawMeta {
    pub(crate) fn name(&self) -> Result<String, String> {
        if self.name.is_empty() {
            return Err("metadata.name is missing".into());
        }
        Ok(self.name.clone())
    }

    /// `default` when unset, as `kubectl apply` would place it.
    pub(crate) fn namespace(&self) -> String {
        match self.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => ns.to_string(),
            _ => "default".to_string(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RawOwnerReference {
    kind: String,
    name: String,
    controller: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawNamespace {
    metadata: RawMeta,
}

/// The label the API server puts on every Namespace (Kubernetes 1.21+), so that selectors can
/// pick a namespace by name (Gateway API allowedRoutes, meshConfig.serviceEntryVisibility).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

impl RawNamespace {
    /// A manifest's Namespace gets [`NAMESPACE_NAME_LABEL`] as the API server would give it.
    fn reduce(self) -> Result<Object, String> {
        let name = self.metadata.name()?;
        let mut labels = self.metadata.labels;
        if labels.get(NAMESPACE_NAME_LABEL) != Some(name.as_str()) {
            labels.insert(NAMESPACE_NAME_LABEL, &name);
        }
        Ok(Object::Namespace(Namespace {
            name,
            labels,
            annotations: self.metadata.annotations,
        }))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawNode {
    metadata: RawMeta,
}

impl RawNode {
    fn reduce(self) -> Result<Object, String> {
        Ok(Object::Node(Node {
            name: self.metadata.name()?,
            labels: self.metadata.labels,
        }))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPod {
    metadata: RawMeta,
    spec: RawPodSpec,
    status: RawPodStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawPodSpec {
    service_account_name: Option<String>,
    service_account: Option<String>,
    node_name: String,
    host_network: bool,
    containers: Vec<RawContainer>,
    init_containers: Vec<RawContainer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawContainer {
    ports: Vec<RawContainerPort>,
    restart_policy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawContainerPort {
    name: String,
    container_port: i64,
    protocol: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawPodStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Vec<RawPodIp>,
    conditions: Vec<RawCondition>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPodIp {
    ip: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawCondition {
    #[serde(rename = "type")]
    kind: String,
    #[serde(deserialize_with = "lenient_string")]
    status: String,
}

impl RawPod {
    fn reduce(mut self) -> Result<Object, String> {
        let name = self.metadata.name()?;
        let status = self.status;
        let mut ip_texts: Vec<String> = status.pod_ips.into_iter().map(|p| p.ip).collect();
        if ip_texts.is_empty() {
            ip_texts.extend(status.pod_ip.filter(|ip| !ip.is_empty()));
        }
        let ips = ip_texts
            .iter()
            .enumerate()
            .map(|(i, text)| parse_ip(text, &format!("status.podIPs[{i}].ip")))
            .collect::<Result<Vec<_>, _>>()?;
        let spec = self.spec;
        // Native sidecars: init containers that keep running.
        let sidecars = spec
            .init_containers
            .iter()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let mut ports = Vec::new();
        for port in spec
            .containers
            .iter()
            .chain(sidecars)
            .flat_map(|c| &c.ports)
        {
            if port.name.is_empty() {
                continue;
            }
            ports.push(ContainerPort {
                name: port.name.clone(),
                port: port_number(port.container_port, "containerPort")?,
                protocol: protocol(port.protocol.as_deref())?,
            });
        }
        let owner = self
            .metadata
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| Owner {
                kind: o.kind.clone(),
                name: o.name.clone(),
            });
        Ok(Object::Pod(Pod::from(PodFields {
            name,
            uid: std::mem::take(&mut self.metadata.uid),
            namespace: self.metadata.namespace(),
            generate_name: self.metadata.generate_name,
            labels: self.metadata.labels,
            // Pods carry large annotations (sidecar status, checksums); keep only what the
            // conversion reads.
            annotations: self
                .metadata
                .annotations
                .into_iter()
                .filter(|(k, _)| POD_ANNOTATIONS.contains(k))
                .collect(),
            owner,
            terminating: self
                .metadata
                .deletion_timestamp
                .is_some_and(|v| !v.is_null()),
            phase: status.phase.as_deref().unwrap_or("Pending").into(),
            ready: status
                .conditions
                .iter()
                // `status: True` unquoted is a YAML boolean, read as the text "true".
                .any(|c| c.kind == "Ready" && c.status.eq_ignore_ascii_case("true")),
            ips,
            service_account: spec
                .service_account_name
                .filter(|sa| !sa.is_empty())
                .or(spec.service_account.filter(|sa| !sa.is_empty()))
                .as_deref()
                .unwrap_or("default")
                .into(),
            node_name: spec.node_name,
            host_network: spec.host_network,
            ports,
        })))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawService {
    metadata: RawMeta,
    spec: RawServiceSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceSpec {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    ports: Vec<RawServicePort>,
    #[serde(deserialize_with = "string_map")]
    selector: Labels,
    internal_traffic_policy: Option<String>,
    traffic_distribution: Option<String>,
    publish_not_ready_addresses: bool,
    ip_families: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawServicePort {
    name: String,
    port: i64,
    target_port: Option<IntOrString>,
    protocol: Option<String>,
    app_protocol: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum IntOrString {
    Int(i64),
    String(String),
}

impl RawService {
    fn reduce(self) -> Result<Object, String> {
        let name = self.metadata.name()?;
        let spec = self.spec;
        let mut ip_texts = spec.cluster_ips;
        if ip_texts.is_empty() {
            ip_texts.extend(spec.cluster_ip);
        }
        let cluster_ips = ip_texts
            .iter()
            .enumerate()
            .filter(|(_, text)| !text.is_empty() && text.as_str() != "None")
            .map(|(i, text)| parse_ip(text, &format!("spec.clusterIPs[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let ports = spec
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let port = port_number(p.port, &format!("spec.ports[{i}].port"))?;
                // The API server defaults an absent, `0` or `""` targetPort to the port.
                let target_port = match &p.target_port {
                    None | Some(IntOrString::Int(0)) => TargetPort::Number(port),
                    Some(IntOrString::Int(n)) => {
                        TargetPort::Number(port_number(*n, &format!("spec.ports[{i}].targetPort"))?)
                    }
                    Some(IntOrString::String(s)) if s.is_empty() => TargetPort::Number(port),
                    Some(IntOrString::String(s)) => match s.parse::<i64>() {
                        Ok(n) => TargetPort::Number(port_number(
                            n,
                            &format!("spec.ports[{i}].targetPort"),
                        )?),
                        Err(_) => TargetPort::Name(s.clone()),
                    },
                };
                Ok(ServicePort {
                    name: p.name.clone(),
                    port,
                    target_port,
                    protocol: protocol(p.protocol.as_deref())?,
                    app_protocol: p.app_protocol.clone(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        // Collected through `Result`, the vectors grew by doubling: kept for the service's life.
        let (cluster_ips, ports) = (exact(cluster_ips), exact(ports));
        // Not defaulted from the cluster IPs: istiod reads `spec.ipFamilies` as written, and
        // the API server always fills it in a real cluster.
        let ip_families = spec
            .ip_families
            .iter()
            .map(|f| match f.as_str() {
                "IPv4" => Ok(IpFamily::V4),
                "IPv6" => Ok(IpFamily::V6),
                other => Err(format!("spec.ipFamilies: unknown family {other:?}")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Object::Service(Service {
            name,
            namespace: self.metadata.namespace(),
            generation: self.metadata.generation.unwrap_or_default(),
            labels: self.metadata.labels,
            annotations: self.metadata.annotations,
            external_name: spec.kind.as_deref() == Some("ExternalName"),
            cluster_ips,
            ports,
            selector: spec.selector,
            internal_traffic_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            traffic_distribution: spec.traffic_distribution,
            publish_not_ready_addresses: spec.publish_not_ready_addresses,
            ip_families,
        }))
    }
}

pub(crate) fn parse_ip(text: &str, field: &str) -> Result<IpAddr, String> {
    text.parse()
        .map_err(|_| format!("{field}: {text:?} is not an IP address"))
}

pub(crate) fn port_number(value: i64, field: &str) -> Result<u16, String> {
    u16::try_from(value)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{field}: {value} is not a port number (1-65535)"))
}

pub(crate) fn protocol(value: Option<&str>) -> Result<Protocol, String> {
    match value.unwrap_or("TCP") {
        "TCP" | "" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        "SCTP" => Ok(Protocol::Sctp),
        other => Err(format!("protocol {other:?} is not TCP, UDP or SCTP")),
    }
}

/// `v` in a block of exactly its length. `shrink_to_fit` would not do: mimalloc shrinks a block
/// in place when the new size is at least half the old one, keeping all of it.
fn exact<T>(v: Vec<T>) -> Vec<T> {
    if v.capacity() == v.len() {
        return v;
    }
    let mut exact = Vec::with_capacity(v.len());
    exact.extend(v);
    exact
}

#[cfg(test)]
mod tests;
