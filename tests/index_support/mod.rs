//! Builders for reduced objects and decoders for the resources an `Index` publishes, shared by
//! the pure-core table tests (`index.rs`, `index_services.rs`, `index_changes.rs`,
//! `subscription.rs`).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ambientd::discovery::model::{
    IpFamily, Labels, Namespace, Node, Pod, Protocol, Service, ServicePort, TargetPort,
};
use ambientd::discovery::{Index, Object, Settings, Snapshot};
use ambientd::pb::workload::{self, Address, Workload, address};
use bytes::Bytes;
use prost::Message;

pub const NS: &str = "demo";
pub const NODE: &str = "node-a";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("bad ip {s}: {e}"))
}

/// Raw network-order bytes, as the protos carry IPs.
pub fn raw(s: &str) -> Bytes {
    match ip(s) {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A running, ready pod on `node-a` with service account `default`.
pub fn pod(namespace: &str, name: &str, pod_ip: &str) -> Pod {
    Pod {
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
pub fn pod_with(namespace: &str, name: &str, pod_ip: &str, pod_labels: &[(&str, &str)]) -> Pod {
    Pod {
        labels: labels(pod_labels),
        ..pod(namespace, name, pod_ip)
    }
}

/// A TCP container port.
pub fn cport(name: &str, port: u16) -> ambientd::discovery::model::ContainerPort {
    ambientd::discovery::model::ContainerPort {
        name: name.into(),
        port,
        protocol: Protocol::Tcp,
    }
}

/// A TCP service port.
pub fn sport(name: &str, port: u16, target: TargetPort) -> ServicePort {
    ServicePort {
        name: name.into(),
        port,
        target_port: target,
        protocol: Protocol::Tcp,
        app_protocol: None,
    }
}

pub fn num(n: u16) -> TargetPort {
    TargetPort::Number(n)
}

pub fn named(n: &str) -> TargetPort {
    TargetPort::Name(n.into())
}

/// A ClusterIP IPv4 service with one `http` port 80 -> 8080; `vip` empty means headless.
pub fn svc(namespace: &str, name: &str, vip: &str, selector: &[(&str, &str)]) -> Service {
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

pub fn ns(name: &str) -> Namespace {
    Namespace {
        name: name.into(),
        ..Default::default()
    }
}

pub fn node(name: &str, node_labels: &[(&str, &str)]) -> Node {
    Node {
        name: name.into(),
        labels: labels(node_labels),
    }
}

/// The workload uid (and resource name) with default settings.
pub fn uid(namespace: &str, name: &str) -> String {
    format!("Kubernetes//Pod/{namespace}/{name}")
}

/// The service resource name and services-map key with default settings.
pub fn skey(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}.{namespace}.svc.cluster.local")
}

/// An index with default settings and `objects` applied in order.
pub fn index_of(objects: impl IntoIterator<Item = Object>) -> Index {
    let mut index = Index::new(Settings::default());
    for object in objects {
        index.apply(object);
    }
    index
}

pub fn decode(snapshot: &Snapshot, name: &str) -> Option<address::Type> {
    let resource = snapshot.addresses.get(name)?;
    let message = Address::decode(resource.any.value.clone()).expect("decode Address");
    Some(message.r#type.expect("Address without a type"))
}

pub fn try_workload(index: &mut Index, name: &str) -> Option<Workload> {
    match decode(&index.snapshot(), name)? {
        address::Type::Workload(w) => Some(w),
        other => panic!("{name} is not a workload: {other:?}"),
    }
}

/// The decoded workload named `name`, which must exist.
pub fn workload(index: &mut Index, name: &str) -> Workload {
    try_workload(index, name).unwrap_or_else(|| panic!("no workload {name}"))
}

pub fn try_service(index: &mut Index, name: &str) -> Option<workload::Service> {
    match decode(&index.snapshot(), name)? {
        address::Type::Service(s) => Some(s),
        other => panic!("{name} is not a service: {other:?}"),
    }
}

/// The decoded service named `name`, which must exist.
pub fn service(index: &mut Index, name: &str) -> workload::Service {
    try_service(index, name).unwrap_or_else(|| panic!("no service {name}"))
}

/// Owned, sorted names, for comparing against sets of resource names.
pub fn set<S: AsRef<str>>(names: &[S]) -> BTreeSet<String> {
    names.iter().map(|n| n.as_ref().to_string()).collect()
}

/// Every Address resource as name -> version.
pub fn versions(snapshot: &Snapshot) -> BTreeMap<String, String> {
    snapshot
        .addresses
        .iter()
        .map(|(name, r)| (name.clone(), r.version.clone()))
        .collect()
}
