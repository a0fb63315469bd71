//! Decoding of the mesh kinds beyond core Pods and Services: EndpointSlice, Istio's
//! ServiceEntry and WorkloadEntry, and Gateway API Gateways and GatewayClasses (waypoints).
//! Same rules as [`crate::kube::objects`]: only the fields the index reads, defaults applied,
//! and errors that name the field.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::discovery::model::authorization::REVISION_LABEL;
use crate::discovery::model::{
    AllowedNamespaces, Endpoint, EndpointSlice, Gateway, GatewayClass, LabelOperator,
    LabelRequirement, Labels, Listener, NamespaceSelector, Object, Resolution, ServiceEntry,
    ServiceEntryPort, SliceEndpoint, SlicePort, TargetRef, WorkloadEntry,
};
use crate::kube::objects::{RawMeta, parse, parse_ip, port_number, protocol, string_map};

const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawEndpointSlice {
    metadata: RawMeta,
    address_type: String,
    endpoints: Vec<RawSliceEndpoint>,
    ports: Vec<RawSlicePort>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSliceEndpoint {
    addresses: Vec<String>,
    conditions: RawSliceConditions,
    target_ref: Option<RawTargetRef>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawSliceConditions {
    ready: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawTargetRef {
    kind: String,
    namespace: Option<String>,
    name: String,
    uid: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawSlicePort {
    name: Option<String>,
    port: Option<i64>,
    protocol: Option<String>,
}

pub(crate) fn endpoint_slice(value: &Value) -> Result<Object, String> {
    let raw: RawEndpointSlice = parse(value)?;
    let name = raw.metadata.name()?;
    let namespace = raw.metadata.namespace();
    let endpoints = raw
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let addresses = if raw.address_type == "FQDN" {
                Vec::new()
            } else {
                e.addresses
                    .iter()
                    .enumerate()
                    .map(|(j, a)| parse_ip(a, &format!("endpoints[{i}].addresses[{j}]")))
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap_or_else(|error| {
                        // As istiod: this endpoint builds no workload; the rest of the slice
                        // stands, and a Pod targetRef still names the pod as a member.
                        warn!(%namespace, slice = %name, %error, "skipping an EndpointSlice endpoint with an invalid address");
                        Vec::new()
                    })
            };
            SliceEndpoint {
                addresses,
                ready: e.conditions.ready,
                target_ref: e.target_ref.as_ref().map(|t| TargetRef {
                    kind: t.kind.clone(),
                    namespace: t.namespace.clone().unwrap_or_else(|| namespace.clone()),
                    name: t.name.clone(),
                    uid: t.uid.clone(),
                }),
            }
        })
        .collect();
    let ports = raw
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(SlicePort {
                name: p.name.clone(),
                port: p
                    .port
                    .map(|n| port_number(n, &format!("ports[{i}].port")))
                    .transpose()?,
                protocol: protocol(p.protocol.as_deref())?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Object::EndpointSlice(EndpointSlice {
        service_name: raw
            .metadata
            .labels
            .get(SERVICE_NAME_LABEL)
            .map(str::to_string),
        name,
        namespace,
        fqdn: raw.address_type == "FQDN",
        endpoints,
        ports,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceEntry {
    metadata: RawMeta,
    spec: RawServiceEntrySpec,
    status: RawServiceEntryStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceEntrySpec {
    hosts: Vec<String>,
    addresses: Vec<String>,
    ports: Vec<RawServiceEntryPort>,
    resolution: Option<String>,
    endpoints: Vec<RawEndpoint>,
    workload_selector: Option<RawWorkloadSelector>,
    subject_alt_names: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawServiceEntryPort {
    number: i64,
    name: String,
    protocol: Option<String>,
    target_port: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawWorkloadSelector {
    #[serde(deserialize_with = "string_map")]
    labels: Labels,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawEndpoint {
    address: String,
    ports: BTreeMap<String, i64>,
    #[serde(deserialize_with = "string_map")]
    labels: Labels,
    network: String,
    locality: String,
    weight: i64,
    service_account: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawServiceEntryStatus {
    addresses: Vec<RawAllocatedAddress>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawAllocatedAddress {
    host: String,
    value: String,
}

fn endpoint(raw: &RawEndpoint, field: &str) -> Result<Endpoint, String> {
    let ports = raw
        .ports
        .iter()
        .map(|(name, n)| {
            Ok((
                name.clone(),
                port_number(*n, &format!("{field}.ports.{name}"))?,
            ))
        })
        .collect::<Result<BTreeMap<_, _>, String>>()?;
    Ok(Endpoint {
        address: raw.address.clone(),
        ports,
        labels: raw.labels.clone(),
        network: raw.network.clone(),
        locality: raw.locality.clone(),
        weight: u32::try_from(raw.weight)
            .map_err(|_| format!("{field}.weight: {} is out of range", raw.weight))?,
        service_account: raw.service_account.clone(),
    })
}

fn resolution(value: Option<&str>) -> Result<Resolution, String> {
    Ok(match value.unwrap_or("NONE") {
        "NONE" | "" => Resolution::None,
        "STATIC" => Resolution::Static,
        "DNS" => Resolution::Dns,
        "DNS_ROUND_ROBIN" => Resolution::DnsRoundRobin,
        "DYNAMIC_DNS" => Resolution::DynamicDns,
        other => return Err(format!("spec.resolution: unknown value {other:?}")),
    })
}

/// RFC 3339 text of `metadata.creationTimestamp`, or empty.
fn created(meta: &RawMeta) -> String {
    match &meta.creation_timestamp {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    }
}

pub(crate) fn service_entry(value: &Value) -> Result<Object, String> {
    let raw: RawServiceEntry = parse(value)?;
    let spec = raw.spec;
    let ports = spec
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(ServiceEntryPort {
                name: p.name.clone(),
                number: port_number(p.number, &format!("spec.ports[{i}].number"))?,
                target_port: match p.target_port {
                    None | Some(0) => None,
                    Some(n) => Some(port_number(n, &format!("spec.ports[{i}].targetPort"))?),
                },
                protocol: p.protocol.clone().unwrap_or_default().to_ascii_uppercase(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let endpoints = spec
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| endpoint(e, &format!("spec.endpoints[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    // istiod skips an auto-allocated address it cannot parse ("unreadable is unusable") and
    // keeps the rest; it never invalidates the entry.
    let allocated = raw
        .status
        .addresses
        .iter()
        .filter_map(|a| Some((a.host.clone(), a.value.parse::<IpAddr>().ok()?)))
        .collect();
    if spec.hosts.is_empty() {
        return Err("spec.hosts is empty".into());
    }
    Ok(Object::ServiceEntry(ServiceEntry {
        name: raw.metadata.name()?,
        namespace: raw.metadata.namespace(),
        generation: raw.metadata.generation.unwrap_or_default(),
        created: created(&raw.metadata),
        labels: raw.metadata.labels,
        annotations: raw.metadata.annotations,
        hosts: spec.hosts,
        addresses: spec.addresses,
        ports,
        resolution: resolution(spec.resolution.as_deref())?,
        endpoints,
        workload_selector: spec.workload_selector.map(|s| s.labels),
        subject_alt_names: spec.subject_alt_names,
        allocated,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawWorkloadEntry {
    metadata: RawMeta,
    spec: RawEndpoint,
}

pub(crate) fn workload_entry(value: &Value) -> Result<Object, String> {
    let raw: RawWorkloadEntry = parse(value)?;
    let endpoint = endpoint(&raw.spec, "spec")?;
    // metadata labels win over spec labels.
    let mut labels = endpoint.labels.clone();
    labels.extend_from(&raw.metadata.labels);
    Ok(Object::WorkloadEntry(WorkloadEntry {
        name: raw.metadata.name()?,
        namespace: raw.metadata.namespace(),
        generation: raw.metadata.generation.unwrap_or_default(),
        labels,
        annotations: raw.metadata.annotations,
        endpoint,
        revision: raw.metadata.labels.get(REVISION_LABEL).map(str::to_string),
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawGatewayClass {
    metadata: RawMeta,
    spec: RawGatewayClassSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawGatewayClassSpec {
    controller_name: String,
}

pub(crate) fn gateway_class(value: &Value) -> Result<Object, String> {
    let raw: RawGatewayClass = parse(value)?;
    Ok(Object::GatewayClass(GatewayClass {
        name: raw.metadata.name()?,
        labels: raw.metadata.labels,
        annotations: raw.metadata.annotations,
        controller_name: raw.spec.controller_name,
    }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawGateway {
    metadata: RawMeta,
    spec: RawGatewaySpec,
    status: RawGatewayStatus,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawGatewaySpec {
    gateway_class_name: String,
    listeners: Vec<RawListener>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawListener {
    name: String,
    port: i64,
    protocol: String,
    allowed_routes: Option<RawAllowedRoutes>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawAllowedRoutes {
    namespaces: Option<RawRouteNamespaces>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawRouteNamespaces {
    from: Option<String>,
    selector: Option<RawLabelSelector>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RawLabelSelector {
    #[serde(deserialize_with = "string_map")]
    match_labels: Labels,
    match_expressions: Vec<RawLabelRequirement>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawLabelRequirement {
    key: String,
    operator: String,
    values: Vec<String>,
}

/// `metav1.LabelSelectorAsSelector`: no selector selects nothing, `{}` everything. A selector
/// Go rejects (unknown operator, values missing for In/NotIn or present for
/// Exists/DoesNotExist) is logged and selects nothing.
pub(crate) fn namespace_selector(raw: Option<&RawLabelSelector>, field: &str) -> NamespaceSelector {
    let Some(raw) = raw else {
        return NamespaceSelector::Nothing;
    };
    let expressions = raw
        .match_expressions
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let operator = match e.operator.as_str() {
                "In" => LabelOperator::In,
                "NotIn" => LabelOperator::NotIn,
                "Exists" => LabelOperator::Exists,
                "DoesNotExist" => LabelOperator::DoesNotExist,
                other => {
                    return Err(format!(
                        "{field}.matchExpressions[{i}]: unknown operator {other:?}"
                    ));
                }
            };
            let needs_values = matches!(operator, LabelOperator::In | LabelOperator::NotIn);
            if needs_values == e.values.is_empty() {
                return Err(format!(
                    "{field}.matchExpressions[{i}]: values must be {} for {:?}",
                    if needs_values { "non-empty" } else { "empty" },
                    e.operator
                ));
            }
            Ok(LabelRequirement {
                key: e.key.clone(),
                operator,
                values: e.values.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>();
    match expressions {
        Ok(expressions) => NamespaceSelector::Match {
            labels: raw.match_labels.clone(),
            expressions,
        },
        Err(error) => {
            warn!(%error, "invalid namespace selector: it admits no namespace");
            NamespaceSelector::Nothing
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawGatewayStatus {
    addresses: Vec<RawGatewayAddress>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawGatewayAddress {
    #[serde(rename = "type")]
    kind: Option<String>,
    value: String,
}

pub(crate) fn gateway(value: &Value) -> Result<Object, String> {
    let raw: RawGateway = parse(value)?;
    let listeners = raw
        .spec
        .listeners
        .iter()
        .enumerate()
        .map(|(i, l)| {
            // An unknown `from` value is Same, as in istiod's switch.
            let allowed = l
                .allowed_routes
                .as_ref()
                .and_then(|r| r.namespaces.as_ref())
                .map(|ns| match ns.from.as_deref() {
                    Some("All") => AllowedNamespaces::All,
                    Some("Selector") => AllowedNamespaces::Selector(namespace_selector(
                        ns.selector.as_ref(),
                        &format!("spec.listeners[{i}].allowedRoutes.namespaces.selector"),
                    )),
                    _ => AllowedNamespaces::Same,
                });
            Ok(Listener {
                name: l.name.clone(),
                port: port_number(l.port, &format!("spec.listeners[{i}].port"))?,
                protocol: l.protocol.clone(),
                allowed,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Object::Gateway(Gateway {
        name: raw.metadata.name()?,
        namespace: raw.metadata.namespace(),
        labels: raw.metadata.labels,
        annotations: raw.metadata.annotations,
        class_name: raw.spec.gateway_class_name,
        listeners,
        addresses: raw
            .status
            .addresses
            .into_iter()
            // The Gateway API defaults an address's type to IPAddress.
            .map(|a| (a.kind.unwrap_or_else(|| "IPAddress".into()), a.value))
            .collect(),
    }))
}
