//! The `Workload.services` map (docs/conversion.md, "Pod → Workload"): which services a workload
//! belongs to, and the target ports each resolves to for that workload.

use std::collections::{BTreeMap, HashMap};

use crate::discovery::model::{
    Labels, Pod, Protocol, Service, ServiceEntry, ServiceEntryPort, TargetPort, selects,
};
use crate::discovery::names::{service_hostname, service_key};
use crate::discovery::settings::Settings;
use crate::discovery::store::{ServiceRef, Store};
use crate::pb::workload::{Port, PortList};

/// The workload being placed into services.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Member<'a> {
    Pod(&'a Pod),
    /// A WorkloadEntry or ServiceEntry endpoint: its labels and its port-name map.
    Entry {
        labels: &'a Labels,
        ports: &'a BTreeMap<String, u16>,
    },
}

impl Member<'_> {
    fn labels(&self) -> &Labels {
        match self {
            Member::Pod(p) => p.labels(),
            Member::Entry { labels, .. } => labels,
        }
    }

    /// A TCP container port (pods) or an entry port with this name.
    fn named_port(&self, name: &str) -> Option<u16> {
        match self {
            Member::Pod(p) => p
                .ports()
                .find(|c| c.protocol == Protocol::Tcp && c.name == name)
                .map(|c| c.port),
            Member::Entry { ports, .. } => ports.get(name).copied(),
        }
    }
}

/// Every service in `namespace` that selects the member, plus (for pods) Services whose
/// EndpointSlices name the pod in a targetRef. Only the published winner of a hostname counts.
pub(crate) fn services_map(
    settings: &Settings,
    store: &Store,
    namespace: &str,
    member: Member<'_>,
) -> BTreeMap<String, PortList> {
    let mut map = BTreeMap::new();
    let is_pod = matches!(member, Member::Pod(_));
    for candidate in store.selecting(namespace, member.labels()) {
        match candidate {
            // istiod's PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES.
            ServiceRef::Kube(_) if !is_pod && !settings.k8s_select_workload_entries => continue,
            // istiod's PILOT_ENABLE_SERVICEENTRY_SELECT_PODS.
            ServiceRef::Entry(_) if is_pod && !settings.service_entry_select_pods => continue,
            ServiceRef::Kube(key) => {
                let Some(svc) = store.services().get(key) else {
                    continue;
                };
                if svc.external_name || !selects(&svc.selector, member.labels()) {
                    continue;
                }
                if let Some((key, ports)) = kube_entry(settings, store, svc, member) {
                    map.insert(key, ports);
                }
            }
            ServiceRef::Entry(key) => {
                let Some(se) = store.service_entries().get(key) else {
                    continue;
                };
                let Some(selector) = &se.workload_selector else {
                    continue;
                };
                if !selects(selector, member.labels()) {
                    continue;
                }
                for host in &se.hosts {
                    if wins(store, se, host) {
                        map.insert(service_key(namespace, host), entry_ports(se, member));
                    }
                }
            }
        }
    }
    if let Member::Pod(pod) = member {
        for svc in slice_services(store, pod) {
            if let Some((key, ports)) = kube_entry(settings, store, svc, member) {
                map.entry(key).or_insert(ports);
            }
        }
    }
    map
}

/// The services of a ServiceEntry that one of its endpoints belongs to (all of its published
/// hosts, or only `host` for an implicit DNS endpoint).
pub(crate) fn entry_services(
    store: &Store,
    se: &ServiceEntry,
    only_host: Option<&str>,
    member: Member<'_>,
) -> BTreeMap<String, PortList> {
    se.hosts
        .iter()
        .filter(|h| only_host.is_none_or(|only| only == h.as_str()))
        .filter(|h| wins(store, se, h))
        .map(|h| (service_key(&se.namespace, h), entry_ports(se, member)))
        .collect()
}

/// Whether a ServiceEntry is the published winner for one of its hosts.
pub(crate) fn wins(store: &Store, se: &ServiceEntry, host: &str) -> bool {
    store.slot_winner(&se.namespace, host)
        == Some(ServiceRef::Entry((se.namespace.clone(), se.name.clone())))
}

fn kube_entry(
    settings: &Settings,
    store: &Store,
    svc: &Service,
    member: Member<'_>,
) -> Option<(String, PortList)> {
    let hostname = service_hostname(&svc.name, &svc.namespace, &settings.domain);
    let winner = store.slot_winner(&svc.namespace, &hostname);
    if winner != Some(ServiceRef::Kube((svc.namespace.clone(), svc.name.clone()))) {
        return None;
    }
    Some((
        service_key(&svc.namespace, &hostname),
        PortList {
            ports: kube_ports(svc, member),
        },
    ))
}

/// A Kubernetes Service's ports for one workload. Pods: a named targetPort is the TCP
/// container port of that name, omitted when missing. Entries: a named targetPort is looked up
/// in the entry's ports (omitted when missing); otherwise the service port's name, else the
/// numeric targetPort.
pub(crate) fn kube_ports(svc: &Service, member: Member<'_>) -> Vec<Port> {
    svc.ports
        .iter()
        .filter_map(|port| {
            let target = match (&port.target_port, member) {
                (TargetPort::Name(name), _) => member.named_port(name)?,
                (TargetPort::Number(n), Member::Pod(_)) => *n,
                (TargetPort::Number(n), Member::Entry { .. }) => {
                    member.named_port(&port.name).unwrap_or(*n)
                }
            };
            Some(Port {
                service_port: u32::from(port.port),
                target_port: u32::from(target),
                app_protocol: 0,
            })
        })
        .collect()
}

/// A ServiceEntry's ports for one workload: the workload's port of the same name, else the
/// SE port's targetPort, else its number.
fn entry_ports(se: &ServiceEntry, member: Member<'_>) -> PortList {
    PortList {
        ports: se
            .ports
            .iter()
            .map(|port| Port {
                service_port: u32::from(port.number),
                target_port: u32::from(member.named_port(&port.name).unwrap_or(se_target(port))),
                app_protocol: 0,
            })
            .collect(),
    }
}

/// An SE port's target: `targetPort`, or the port number when unset.
pub(crate) fn se_target(port: &ServiceEntryPort) -> u16 {
    port.target_port.unwrap_or(port.number)
}

/// Kubernetes Services whose EndpointSlices have an endpoint whose targetRef is exactly this
/// pod (kind, namespace, name and uid).
fn slice_services<'a>(store: &'a Store, pod: &Pod) -> Vec<&'a Service> {
    let key = (pod.namespace().to_string(), pod.name().to_string());
    let Some(slice_keys) = store.slices_by_pod().get(&key) else {
        return Vec::new();
    };
    let mut services: HashMap<&str, &Service> = HashMap::new();
    for slice_key in slice_keys {
        let Some(slice) = store.slices().get(slice_key) else {
            continue;
        };
        // Membership never crosses namespaces.
        if slice.fqdn || slice.namespace != pod.namespace() {
            continue;
        }
        let targets_pod = slice.endpoints.iter().any(|e| {
            e.target_ref.as_ref().is_some_and(|t| {
                t.kind == "Pod"
                    && t.namespace == pod.namespace()
                    && t.name == pod.name()
                    && pod.uid().is(&t.uid)
            })
        });
        let Some(service_name) = slice.service_name.as_deref() else {
            continue;
        };
        if !targets_pod {
            continue;
        }
        if let Some(svc) = store
            .services()
            .get(&(pod.namespace().to_string(), service_name.to_string()))
            .filter(|s| !s.external_name)
        {
            services.insert(service_name, svc);
        }
    }
    let mut services: Vec<&Service> = services.into_values().collect();
    services.sort_by(|a, b| a.name.cmp(&b.name));
    services
}
