//! WorkloadEntry and ServiceEntry endpoints -> Workloads (docs/conversion.md, "ServiceEntry →
//! Services and Workloads" and "WorkloadEntry → Workload").

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::discovery::convert::membership::{self, Member};
use crate::discovery::convert::network_gateway;
use crate::discovery::convert::policies;
use crate::discovery::convert::waypoint;
use crate::discovery::convert::workload::{
    REDIRECTION_ANNOTATION, canonical_name, canonical_revision, parse_locality, tunnel_protocol,
};
use crate::discovery::model::Key;
use crate::discovery::model::{Endpoint, Labels, Resolution, ServiceEntry, WorkloadEntry};
use crate::discovery::names::ip_bytes;
use crate::discovery::settings::Settings;
use crate::discovery::store::Store;
use crate::pb::google::protobuf::UInt32Value;
use crate::pb::workload::{PortList, Workload, WorkloadType};

const AUTO_REGISTRATION_GROUP: &str = "istio.io/autoRegistrationGroup";
const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

/// A WorkloadEntry's uid and xDS name.
pub(crate) fn workload_entry_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}/networking.istio.io/WorkloadEntry/{namespace}/{name}")
}

/// A ServiceEntry endpoint's uid: the endpoint address (IP or hostname) as written, or the
/// host for an implicit DNS endpoint.
pub(crate) fn service_entry_uid(
    cluster_id: &str,
    namespace: &str,
    name: &str,
    address: &str,
) -> String {
    format!("{cluster_id}/networking.istio.io/ServiceEntry/{namespace}/{name}/{address}")
}

/// The fields an entry workload takes from its endpoint: address or hostname, network,
/// service account, locality and capacity.
fn from_endpoint(settings: &Settings, store: &Store, endpoint: &Endpoint) -> Workload {
    let (addresses, hostname) = match endpoint.address.parse::<IpAddr>() {
        Ok(ip) => (vec![ip_bytes(&ip)], String::new()),
        Err(_) => (Vec::new(), endpoint.address.clone()),
    };
    let network = if endpoint.network.is_empty() {
        store.network(settings).to_string()
    } else {
        endpoint.network.clone()
    };
    Workload {
        addresses,
        hostname,
        network_gateway: network_gateway::for_network(store, &network),
        network,
        service_account: endpoint.service_account.clone(),
        locality: parse_locality(&endpoint.locality),
        capacity: (endpoint.weight > 0).then_some(UInt32Value {
            value: endpoint.weight,
        }),
        trust_domain: settings.wire_trust_domain().to_string(),
        cluster_id: settings.cluster_id.clone(),
        workload_type: WorkloadType::Pod as i32,
        ..Default::default()
    }
}

/// A WorkloadEntry's Workload. Labels are `merge(spec.labels, metadata.labels)`.
pub(crate) fn workload_entry(
    settings: &Settings,
    store: &Store,
    we: &WorkloadEntry,
    reads: &mut Vec<Key>,
) -> Workload {
    let workload_name = we
        .annotations
        .get(AUTO_REGISTRATION_GROUP)
        .or_else(|| we.labels.get(WORKLOAD_NAME_LABEL))
        .map_or_else(|| we.name.clone(), str::to_string);
    let (tunnel, native_tunnel) =
        tunnel_protocol(&we.labels, we.annotations.get(REDIRECTION_ANNOTATION));
    let member = Member::Entry {
        labels: &we.labels,
        ports: &we.endpoint.ports,
    };
    // Exactly like a pod: a waypoint's own entry uses none and carries its inbound binding.
    let (binding, application_tunnel) =
        waypoint::workload_binding(store, &we.namespace, &we.labels, reads);
    let services = membership::services_map(settings, store, &we.namespace, member);
    let mut authorization_policies =
        policies::workload_policies(settings, store, &we.namespace, &we.labels);
    authorization_policies.extend(policies::implicit_waypoint_references(
        settings,
        store,
        binding.key(),
        &services,
        reads,
    ));
    Workload {
        uid: workload_entry_uid(&settings.cluster_id, &we.namespace, &we.name),
        name: we.name.clone(),
        namespace: we.namespace.clone(),
        canonical_name: canonical_name(&we.labels, &workload_name),
        canonical_revision: canonical_revision(&we.labels),
        workload_name,
        tunnel_protocol: tunnel as i32,
        native_tunnel,
        waypoint: binding.into_address(),
        application_tunnel,
        services,
        authorization_policies,
        ..from_endpoint(settings, store, &we.endpoint)
    }
}

/// The Workloads of a ServiceEntry, by uid: one per endpoint; or, for DNS resolution with
/// neither endpoints nor a workload selector, one implicit workload per host. Nothing when the
/// ServiceEntry publishes none of its hosts (it lost them to an older one).
pub(crate) fn service_entry_workloads(
    settings: &Settings,
    store: &Store,
    se: &ServiceEntry,
    reads: &mut Vec<Key>,
) -> BTreeMap<String, Workload> {
    let mut out = BTreeMap::new();
    let (tunnel, native_tunnel) =
        tunnel_protocol(&se.labels, se.annotations.get(REDIRECTION_ANNOTATION));
    // Selected with the ServiceEntry's labels, not the endpoint's.
    let policies = policies::workload_policies(settings, store, &se.namespace, &se.labels);
    let base =
        |endpoint: &Endpoint, uid_address: &str, services: BTreeMap<String, PortList>| Workload {
            uid: service_entry_uid(&settings.cluster_id, &se.namespace, &se.name, uid_address),
            name: se.name.clone(),
            namespace: se.namespace.clone(),
            workload_name: se.name.clone(),
            canonical_name: canonical_name(&se.labels, &se.name),
            canonical_revision: canonical_revision(&se.labels),
            tunnel_protocol: tunnel as i32,
            native_tunnel,
            services,
            authorization_policies: policies.clone(),
            ..from_endpoint(settings, store, endpoint)
        };
    if !se.endpoints.is_empty() {
        for endpoint in &se.endpoints {
            let member = Member::Entry {
                labels: &endpoint.labels,
                ports: &endpoint.ports,
            };
            let services = membership::entry_services(store, se, None, member);
            if services.is_empty() {
                continue;
            }
            let mut workload = base(endpoint, &endpoint.address, services);
            // The waypoint is that of a synthetic object with the endpoint's labels, computed
            // as for a pod (an instance of a waypoint uses none).
            let (binding, application_tunnel) =
                waypoint::workload_binding(store, &se.namespace, &endpoint.labels, reads);
            workload
                .authorization_policies
                .extend(policies::implicit_waypoint_references(
                    settings,
                    store,
                    binding.key(),
                    &workload.services,
                    reads,
                ));
            workload.waypoint = binding.into_address();
            workload.application_tunnel = application_tunnel;
            out.entry(workload.uid.clone()).or_insert(workload);
        }
        return out;
    }
    let dns = matches!(
        se.resolution,
        Resolution::Dns | Resolution::DnsRoundRobin | Resolution::DynamicDns
    );
    if !dns || se.workload_selector.is_some() {
        return out;
    }
    let no_ports = BTreeMap::new();
    let no_labels = Labels::new();
    for host in &se.hosts {
        let member = Member::Entry {
            labels: &no_labels,
            ports: &no_ports,
        };
        let services = membership::entry_services(store, se, Some(host), member);
        if services.is_empty() {
            continue;
        }
        let endpoint = Endpoint {
            address: host.clone(),
            ..Default::default()
        };
        let mut workload = base(&endpoint, host, services);
        workload
            .authorization_policies
            .extend(policies::implicit_waypoint_references(
                settings,
                store,
                None,
                &workload.services,
                reads,
            ));
        out.insert(workload.uid.clone(), workload);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::waypoint::{GATEWAY_NAME_LABEL, INBOUND_BINDING, USE_WAYPOINT};
    use crate::discovery::model::{Gateway, Namespace, Object};
    use crate::pb::workload::{ApplicationTunnel, application_tunnel::Protocol};

    /// A store with the ready waypoint `demo/wp` (taking all traffic, inbound binding
    /// `PROXY/15088`) that namespace `demo` uses.
    fn store(settings: &Settings) -> Store {
        let mut store = Store::default();
        let namespace = Namespace {
            name: "demo".into(),
            labels: Labels::from([(USE_WAYPOINT, "wp")]),
            ..Default::default()
        };
        store.insert(Object::Namespace(namespace), settings);
        let gw = Gateway {
            name: "wp".into(),
            namespace: "demo".into(),
            labels: Labels::from([("istio.io/waypoint-for", "all")]),
            annotations: Labels::from([(INBOUND_BINDING, "PROXY/15088")]),
            addresses: vec![("IPAddress".into(), "10.9.0.1".into())],
            ..Default::default()
        };
        store.insert(Object::Gateway(gw), settings);
        assert!(store.refresh_waypoint(&("demo".into(), "wp".into()), ""));
        store
    }

    fn proxy_tunnel() -> Option<ApplicationTunnel> {
        Some(ApplicationTunnel {
            protocol: Protocol::Proxy as i32,
            port: 15088,
        })
    }

    fn entry(labels: Labels) -> WorkloadEntry {
        WorkloadEntry {
            name: "vm".into(),
            namespace: "demo".into(),
            labels,
            endpoint: Endpoint {
                address: "10.5.0.1".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn workload_entry_that_is_a_waypoint_instance_is_handled_like_a_pod() {
        let settings = Settings::default();
        let store = store(&settings);
        let instance = entry(Labels::from([(GATEWAY_NAME_LABEL, "wp")]));
        let w = workload_entry(&settings, &store, &instance, &mut Vec::new());
        assert_eq!(w.waypoint, None, "a waypoint's own entry uses none");
        assert_eq!(w.application_tunnel, proxy_tunnel());
        let bound = |labels: &Labels| {
            crate::discovery::convert::conditions::workload_waypoint_bound(
                &store,
                "demo",
                labels,
                &mut Vec::new(),
            )
        };
        assert_eq!(
            bound(&instance.labels),
            None,
            "an instance gets no WaypointBound"
        );
        assert!(bound(&Labels::new()).is_some());
        // Any other entry of the namespace binds to it, without an application tunnel.
        let w = workload_entry(&settings, &store, &entry(Labels::new()), &mut Vec::new());
        assert!(w.waypoint.is_some());
        assert_eq!(w.application_tunnel, None);
        // Naming a gateway that is not a ready waypoint is no instance: the binding stands.
        let other = entry(Labels::from([(GATEWAY_NAME_LABEL, "other")]));
        let w = workload_entry(&settings, &store, &other, &mut Vec::new());
        assert!(w.waypoint.is_some());
        assert_eq!(w.application_tunnel, None);
    }

    #[test]
    fn service_entry_endpoint_that_is_a_waypoint_instance_is_handled_like_a_pod() {
        let settings = Settings::default();
        let mut store = store(&settings);
        let endpoint = |address: &str, labels: Labels| Endpoint {
            address: address.into(),
            labels,
            ..Default::default()
        };
        let se = ServiceEntry {
            name: "se".into(),
            namespace: "demo".into(),
            hosts: vec!["a.example.com".into()],
            resolution: Resolution::Static,
            endpoints: vec![
                endpoint("10.5.0.1", Labels::from([(GATEWAY_NAME_LABEL, "wp")])),
                endpoint("10.5.0.2", Labels::new()),
            ],
            ..Default::default()
        };
        store.insert(Object::ServiceEntry(se.clone()), &settings);
        let built = service_entry_workloads(&settings, &store, &se, &mut Vec::new());
        let uid = |address| service_entry_uid("Kubernetes", "demo", "se", address);
        let instance = &built[&uid("10.5.0.1")];
        assert_eq!(instance.waypoint, None);
        assert_eq!(instance.application_tunnel, proxy_tunnel());
        let other = &built[&uid("10.5.0.2")];
        assert!(other.waypoint.is_some());
        assert_eq!(other.application_tunnel, None);
    }
}
