//! EndpointSlice endpoints without a Pod targetRef -> opaque Workloads (docs/conversion.md,
//! "EndpointSlice → Workloads").
//! Pod endpoints are covered by the Pod itself.

use std::collections::{BTreeMap, BTreeSet};

use crate::discovery::model::{EndpointSlice, Protocol};
use crate::discovery::names::{ip_bytes, service_hostname, service_key};
use crate::discovery::settings::Settings;
use crate::discovery::store::Store;
use crate::pb::workload::{NetworkMode, Port, PortList, Workload, WorkloadStatus};

/// An EndpointSlice endpoint's uid: `<cluster>/discovery.k8s.io/EndpointSlice/<ns>/<slice>/<ip>`.
pub(crate) fn slice_uid(cluster_id: &str, namespace: &str, slice: &str, address: &str) -> String {
    format!("{cluster_id}/discovery.k8s.io/EndpointSlice/{namespace}/{slice}/{address}")
}

/// The workloads of a slice labelled for an existing Service, by uid. An ExternalName Service
/// publishes no Service, so istiod finds none for its slices and builds nothing.
pub(crate) fn build(
    settings: &Settings,
    store: &Store,
    slice: &EndpointSlice,
) -> BTreeMap<String, Workload> {
    let mut out = BTreeMap::new();
    let Some(service_name) = &slice.service_name else {
        return out;
    };
    if slice.fqdn {
        return out;
    }
    let Some(svc) = store
        .services()
        .get(&(slice.namespace.clone(), service_name.clone()))
        .filter(|svc| !svc.external_name)
    else {
        return out;
    };
    let hostname = service_hostname(&svc.name, &svc.namespace, &settings.domain);
    // Slice ports that are TCP, named and numbered, matched to Service ports by name.
    let ports: Vec<Port> = slice
        .ports
        .iter()
        .filter(|p| p.protocol == Protocol::Tcp)
        .filter_map(|p| {
            let name = p.name.as_deref()?;
            let target = p.port?;
            let svc_port = svc.ports.iter().find(|sp| sp.name == name)?;
            Some(Port {
                service_port: u32::from(svc_port.port),
                target_port: u32::from(target),
                app_protocol: 0,
            })
        })
        .collect();
    let mut seen = BTreeSet::new();
    for endpoint in &slice.endpoints {
        if endpoint
            .target_ref
            .as_ref()
            .is_some_and(|t| t.kind == "Pod")
        {
            continue;
        }
        let Some(first) = endpoint.addresses.first() else {
            continue;
        };
        if !seen.insert(*first) {
            continue;
        }
        let uid = slice_uid(
            &settings.cluster_id,
            &slice.namespace,
            &slice.name,
            &first.to_string(),
        );
        let workload = Workload {
            uid: uid.clone(),
            name: slice.name.clone(),
            namespace: slice.namespace.clone(),
            addresses: endpoint.addresses.iter().map(ip_bytes).collect(),
            network: store.network(settings).to_string(),
            trust_domain: settings.wire_trust_domain().to_string(),
            network_mode: NetworkMode::HostNetwork as i32,
            status: if endpoint.ready == Some(false) {
                WorkloadStatus::Unhealthy
            } else {
                WorkloadStatus::Healthy
            } as i32,
            cluster_id: settings.cluster_id.clone(),
            services: [(
                service_key(&slice.namespace, &hostname),
                PortList {
                    ports: ports.clone(),
                },
            )]
            .into(),
            ..Default::default()
        };
        out.insert(uid, workload);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::{Labels, Object, Service, SliceEndpoint};

    fn slice() -> EndpointSlice {
        EndpointSlice {
            name: "web-abc".into(),
            namespace: "demo".into(),
            service_name: Some("web".into()),
            endpoints: vec![SliceEndpoint {
                addresses: vec!["10.1.0.1".parse().unwrap()],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn store_with(settings: &Settings, external_name: bool) -> Store {
        let mut store = Store::default();
        let svc = Service {
            name: "web".into(),
            namespace: "demo".into(),
            external_name,
            selector: Labels::new(),
            ..Default::default()
        };
        store.insert(Object::Service(svc), settings);
        store
    }

    #[test]
    fn slice_workloads_carry_the_wire_trust_domain() {
        for (trust_domain, want) in [("cluster.local", ""), ("example.org", "example.org")] {
            let settings = Settings {
                trust_domain: trust_domain.into(),
                ..Settings::default()
            };
            let store = store_with(&settings, false);
            let built = build(&settings, &store, &slice());
            let workload = built.values().next().expect("one workload");
            assert_eq!(workload.trust_domain, want, "trust domain {trust_domain}");
        }
    }

    #[test]
    fn slices_of_an_external_name_service_build_nothing() {
        let settings = Settings::default();
        let store = store_with(&settings, true);
        assert!(build(&settings, &store, &slice()).is_empty());
        let store = store_with(&settings, false);
        assert_eq!(build(&settings, &store, &slice()).len(), 1);
    }
}
