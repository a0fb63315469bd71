//! Builders for reduced objects and decoders for the resources an `Index` publishes, shared by
//! the tests beside this file and by `src/push/subscription/tests.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::discovery::model::{
    Endpoint, EndpointSlice, Gateway, GatewayClass, IpFamily, Labels, Namespace, Node, PodFields,
    Protocol, Resolution, Service, ServiceEntry, ServiceEntryPort, ServicePort, SliceEndpoint,
    SlicePort, TargetPort, TargetRef, WorkloadEntry,
};
pub(crate) use crate::discovery::snapshot::Name;
use crate::discovery::{Index, Object, Settings, Snapshot};
use crate::pb::workload::{self, Address, Workload, address};
use bytes::Bytes;
use prost::Message;

pub(crate) const NS: &str = "demo";
pub(crate) const NODE: &str = "node-a";

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("bad ip {s}: {e}"))
}

/// Raw network-order bytes, as the protos carry IPs.
pub(crate) fn raw(s: &str) -> Bytes {
    match ip(s) {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A running, ready pod on `node-a` with service account `default`.
pub(crate) fn pod(namespace: &str, name: &str, pod_ip: &str) -> PodFields {
    PodFields {
        name: name.into(),
        namespace: namespace.into(),
        phase: "Running".into(),
        ready: true,
        ips: vec![ip(pod_ip)],
        service_account: "default".into(),
        node_name: NODE.into(),
        ..Default::default()
    }
}

/// `pod(..)` with labels.
pub(crate) fn pod_with(
    namespace: &str,
    name: &str,
    pod_ip: &str,
    pod_labels: &[(&str, &str)],
) -> PodFields {
    PodFields {
        labels: labels(pod_labels),
        ..pod(namespace, name, pod_ip)
    }
}

/// A TCP container port.
pub(crate) fn cport(name: &str, port: u16) -> crate::discovery::model::ContainerPort {
    crate::discovery::model::ContainerPort {
        name: name.into(),
        port,
        protocol: Protocol::Tcp,
    }
}

/// A TCP service port.
pub(crate) fn sport(name: &str, port: u16, target: TargetPort) -> ServicePort {
    ServicePort {
        name: name.into(),
        port,
        target_port: target,
        protocol: Protocol::Tcp,
        app_protocol: None,
    }
}

pub(crate) fn num(n: u16) -> TargetPort {
    TargetPort::Number(n)
}

pub(crate) fn named(n: &str) -> TargetPort {
    TargetPort::Name(n.into())
}

/// A ClusterIP IPv4 service with one `http` port 80 -> 8080; `vip` empty means headless.
pub(crate) fn svc(namespace: &str, name: &str, vip: &str, selector: &[(&str, &str)]) -> Service {
    let cluster_ips = if vip.is_empty() {
        vec![]
    } else {
        vec![ip(vip)]
    };
    Service {
        name: name.into(),
        namespace: namespace.into(),
        ip_families: vec![IpFamily::V4],
        cluster_ips,
        ports: vec![sport("http", 80, num(8080))],
        selector: labels(selector),
        ..Default::default()
    }
}

pub(crate) fn ns(name: &str) -> Namespace {
    Namespace {
        name: name.into(),
        ..Default::default()
    }
}

pub(crate) fn node(name: &str, node_labels: &[(&str, &str)]) -> Node {
    Node {
        name: name.into(),
        labels: labels(node_labels),
    }
}

/// The workload uid (and resource name) with default settings.
pub(crate) fn uid(namespace: &str, name: &str) -> String {
    format!("Kubernetes//Pod/{namespace}/{name}")
}

/// The service resource name and services-map key with default settings.
pub(crate) fn skey(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}.{namespace}.svc.cluster.local")
}

/// An index with default settings and `objects` applied in order.
pub(crate) fn index_of(objects: impl IntoIterator<Item = Object>) -> Index {
    let mut index = Index::new(Settings::default());
    for object in objects {
        index.apply(object);
    }
    index
}

pub(crate) fn decode(snapshot: &Snapshot, name: &str) -> Option<address::Type> {
    let resource = snapshot.addresses.get(name)?;
    let message = Address::decode(resource.value()).expect("decode Address");
    Some(message.r#type.expect("Address without a type"))
}

pub(crate) fn try_workload(index: &mut Index, name: &str) -> Option<Workload> {
    match decode(&index.snapshot(), name)? {
        address::Type::Workload(w) => Some(w),
        other => panic!("{name} is not a workload: {other:?}"),
    }
}

/// The decoded workload named `name`, which must exist.
pub(crate) fn workload(index: &mut Index, name: &str) -> Workload {
    try_workload(index, name).unwrap_or_else(|| panic!("no workload {name}"))
}

pub(crate) fn try_service(index: &mut Index, name: &str) -> Option<workload::Service> {
    match decode(&index.snapshot(), name)? {
        address::Type::Service(s) => Some(s),
        other => panic!("{name} is not a service: {other:?}"),
    }
}

/// The decoded service named `name`, which must exist.
pub(crate) fn service(index: &mut Index, name: &str) -> workload::Service {
    try_service(index, name).unwrap_or_else(|| panic!("no service {name}"))
}

/// Owned, sorted names, for comparing against sets of resource names.
pub(crate) fn set<S: AsRef<str>>(names: &[S]) -> BTreeSet<Name> {
    names.iter().map(|n| n.as_ref().into()).collect()
}

/// Every Address resource as name -> version.
pub(crate) fn versions(snapshot: &Snapshot) -> BTreeMap<String, String> {
    snapshot
        .addresses
        .iter()
        .map(|(name, r)| (name.to_string(), r.version.to_string()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Mesh kinds: ServiceEntry, WorkloadEntry, EndpointSlice, Gateway, GatewayClass
// ---------------------------------------------------------------------------------------------

/// A namespace with labels.
pub(crate) fn ns_with(name: &str, ns_labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        labels: labels(ns_labels),
        ..ns(name)
    }
}

/// A ServiceEntry port with the given protocol (upper-case, as the source reduces it).
pub(crate) fn se_port(name: &str, number: u16, protocol: &str) -> ServiceEntryPort {
    ServiceEntryPort {
        name: name.into(),
        number,
        target_port: None,
        protocol: protocol.into(),
    }
}

/// A ServiceEntry endpoint at `address` (an IP or a hostname).
pub(crate) fn endpoint(address: &str) -> Endpoint {
    Endpoint {
        address: address.into(),
        ..Default::default()
    }
}

/// A STATIC ServiceEntry for `hosts` with one `http` port 80, no addresses, no endpoints and
/// no creation time.
pub(crate) fn service_entry(namespace: &str, name: &str, hosts: &[&str]) -> ServiceEntry {
    ServiceEntry {
        name: name.into(),
        namespace: namespace.into(),
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        ports: vec![se_port("http", 80, "HTTP")],
        resolution: Resolution::Static,
        ..Default::default()
    }
}

/// A WorkloadEntry at `address` with (merged) labels.
pub(crate) fn workload_entry(
    namespace: &str,
    name: &str,
    address: &str,
    we_labels: &[(&str, &str)],
) -> WorkloadEntry {
    WorkloadEntry {
        name: name.into(),
        namespace: namespace.into(),
        labels: labels(we_labels),
        endpoint: endpoint(address),
        ..Default::default()
    }
}

/// An EndpointSlice labelled `kubernetes.io/service-name=<service>`, without endpoints or ports.
pub(crate) fn slice(namespace: &str, name: &str, service: &str) -> EndpointSlice {
    EndpointSlice {
        name: name.into(),
        namespace: namespace.into(),
        service_name: Some(service.into()),
        ..Default::default()
    }
}

/// A slice endpoint at `address` without a targetRef.
pub(crate) fn slice_ip(address: &str) -> SliceEndpoint {
    SliceEndpoint {
        addresses: vec![ip(address)],
        ..Default::default()
    }
}

/// A slice endpoint at `address` whose targetRef names a Pod.
pub(crate) fn slice_pod(
    address: &str,
    namespace: &str,
    name: &str,
    pod_uid: &str,
) -> SliceEndpoint {
    SliceEndpoint {
        target_ref: Some(TargetRef {
            kind: "Pod".into(),
            namespace: namespace.into(),
            name: name.into(),
            uid: pod_uid.into(),
        }),
        ..slice_ip(address)
    }
}

/// A named TCP slice port.
pub(crate) fn slice_port(name: &str, port: u16) -> SlicePort {
    SlicePort {
        name: Some(name.into()),
        port: Some(port),
        protocol: Protocol::Tcp,
    }
}

pub(crate) fn gateway_class(name: &str, class_labels: &[(&str, &str)]) -> GatewayClass {
    GatewayClass {
        name: name.into(),
        labels: labels(class_labels),
        ..Default::default()
    }
}

/// A Gateway of class `istio-waypoint` with no listeners and no status address (not ready).
pub(crate) fn gateway(namespace: &str, name: &str) -> Gateway {
    Gateway {
        name: name.into(),
        namespace: namespace.into(),
        class_name: "istio-waypoint".into(),
        ..Default::default()
    }
}

/// `gateway(..)` with a status `IPAddress`: a ready waypoint.
pub(crate) fn ready_gateway(namespace: &str, name: &str, address: &str) -> Gateway {
    Gateway {
        addresses: vec![("IPAddress".into(), address.into())],
        ..gateway(namespace, name)
    }
}

/// A WorkloadEntry's resource name with default settings.
pub(crate) fn we_uid(namespace: &str, name: &str) -> String {
    format!("Kubernetes/networking.istio.io/WorkloadEntry/{namespace}/{name}")
}

/// A ServiceEntry endpoint's resource name with default settings.
pub(crate) fn se_uid(namespace: &str, name: &str, address: &str) -> String {
    format!("Kubernetes/networking.istio.io/ServiceEntry/{namespace}/{name}/{address}")
}

/// An EndpointSlice endpoint's resource name with default settings.
pub(crate) fn slice_uid(namespace: &str, name: &str, address: &str) -> String {
    format!("Kubernetes/discovery.k8s.io/EndpointSlice/{namespace}/{name}/{address}")
}

/// A ServiceEntry host's resource name and services-map key.
pub(crate) fn host_key(namespace: &str, host: &str) -> String {
    format!("{namespace}/{host}")
}

/// Every Authorization resource as name -> version.
pub(crate) fn authorization_versions(snapshot: &Snapshot) -> BTreeMap<String, String> {
    snapshot
        .authorizations
        .iter()
        .map(|(name, r)| (name.to_string(), r.version.to_string()))
        .collect()
}

/// A slice for `service` with one endpoint at `address` and no targetRef.
pub(crate) fn ip_slice(namespace: &str, name: &str, service: &str, address: &str) -> EndpointSlice {
    EndpointSlice {
        endpoints: vec![slice_ip(address)],
        ..slice(namespace, name, service)
    }
}

/// Address names whose version differs between two snapshots: `(upserted, removed)`, which
/// is what the `Changes` of the steps between them must say.
pub(crate) fn diff(before: &Snapshot, after: &Snapshot) -> (BTreeSet<Name>, BTreeSet<Name>) {
    diff_versions(&versions(before), &versions(after))
}

/// Names whose version differs between two `name -> version` maps: `(upserted, removed)`.
pub(crate) fn diff_versions(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> (BTreeSet<Name>, BTreeSet<Name>) {
    let upserted = new
        .iter()
        .filter(|(name, version)| old.get(*name) != Some(*version))
        .map(|(name, _)| name.as_str().into())
        .collect();
    let removed = old
        .keys()
        .filter(|name| !new.contains_key(*name))
        .map(|name| name.as_str().into())
        .collect();
    (upserted, removed)
}
