//! What a waypoint serves (istio/istio `pilot/pkg/networking/core/waypoint.go`): its key (the hostnames and addresses of its
//! own Services) and the services and workloads bound to it, read from the snapshot.

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message;

use crate::discovery::names::{network_address_key, service_hostname, service_key};
use crate::discovery::{Resource, Snapshot};
use crate::pb::istio::workload::{Address, Service, Workload, address};
use crate::waypoint::proxy::WaypointProxy;

/// istiod's `WaypointKey`, as the lookup keys the snapshot indexes bindings by: `ns/hostname`
/// for each of the waypoint's own Services, and `network/ip` for each of their addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaypointKey {
    pub namespace: String,
    /// The Gateway the waypoint belongs to (policy attachment by Gateway name).
    pub gateway: String,
    pub lookups: BTreeSet<String>,
}

impl WaypointKey {
    /// The key of `proxy`: the Services that select its pod (istiod's `ServiceTargets`, found
    /// by the pod's IPs), else the Service named like its Gateway.
    pub fn of(proxy: &WaypointProxy, snapshot: &Snapshot, domain: &str) -> Self {
        let mut services: BTreeSet<String> = BTreeSet::new();
        for ip in &proxy.ips {
            let Some(names) = snapshot.alias(&network_address_key(&proxy.network, ip)) else {
                continue;
            };
            for name in names.iter() {
                if let Some(workload) = snapshot.addresses.get(name)
                    && !workload.is_service()
                {
                    services.extend(workload.links().services.iter().map(|s| s.to_string()));
                }
            }
        }
        let gateway = proxy.gateway.clone().unwrap_or_else(|| {
            // Managed waypoints are named like their Gateway; without the label, the first
            // of its Services in its namespace names it.
            services
                .iter()
                .filter_map(|s| s.strip_prefix(&format!("{}/", proxy.namespace)))
                .filter_map(|host| host.split('.').next())
                .next()
                .unwrap_or_default()
                .to_string()
        });
        if services.is_empty() && !gateway.is_empty() {
            let hostname = service_hostname(&gateway, &proxy.namespace, domain);
            services.insert(service_key(&proxy.namespace, &hostname));
        }
        let mut lookups = BTreeSet::new();
        for service in &services {
            let Some((namespace, hostname)) = service.split_once('/') else {
                continue;
            };
            // istiod matches hostname references in the waypoint's own namespace only.
            if namespace == proxy.namespace {
                lookups.insert(service_key(namespace, hostname));
            }
            if let Some(resource) = snapshot.addresses.get(service.as_str()) {
                for (network, ip) in resource.links().addresses.iter() {
                    lookups.insert(network_address_key(network, ip));
                }
            }
        }
        WaypointKey {
            namespace: proxy.namespace.clone(),
            gateway,
            lookups,
        }
    }
}

/// The services and workloads bound to a waypoint, decoded, services sorted by name and
/// workloads by uid (istiod sorts by creation time, which the snapshot does not keep; the
/// order only decides the order of chains and clusters, never which one matches).
#[derive(Clone, Debug, Default)]
pub struct Bound {
    pub services: Vec<(Arc<Resource>, Service)>,
    pub workloads: Vec<(Arc<Resource>, Workload)>,
}

impl Bound {
    pub fn of(key: &WaypointKey, snapshot: &Snapshot) -> Self {
        let mut services = Vec::new();
        let mut workloads = Vec::new();
        let mut seen = BTreeSet::new();
        for lookup in &key.lookups {
            for resource in snapshot.bound_to(lookup) {
                if !seen.insert(resource.name.clone()) {
                    continue;
                }
                match Address::decode(resource.value())
                    .ok()
                    .and_then(|a| a.r#type)
                {
                    Some(address::Type::Service(s)) => services.push((resource.clone(), s)),
                    Some(address::Type::Workload(w)) => workloads.push((resource.clone(), w)),
                    None => {}
                }
            }
        }
        services.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        workloads.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        Bound {
            services,
            workloads,
        }
    }

    /// The names of what is bound to `key`, without decoding anything.
    pub fn names_of(key: &WaypointKey, snapshot: &Snapshot) -> BTreeSet<String> {
        key.lookups
            .iter()
            .flat_map(|lookup| snapshot.bound_to(lookup))
            .map(|r| r.name.to_string())
            .collect()
    }

    /// Every resource name it holds (services and workloads).
    pub fn names(&self) -> BTreeSet<String> {
        self.services
            .iter()
            .map(|(r, _)| r.name.to_string())
            .chain(self.workloads.iter().map(|(r, _)| r.name.to_string()))
            .collect()
    }
}

/// The members of a bound service that serve one of its ports, decoded: `(uid, workload)`.
pub(crate) fn members(snapshot: &Snapshot, service: &str) -> Vec<(Arc<Resource>, Workload)> {
    let Some(names) = snapshot.members.get(service) else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|name| snapshot.addresses.get(name))
        .filter_map(
            |resource| match Address::decode(resource.value()).ok()?.r#type? {
                address::Type::Workload(w) => Some((resource.clone(), w)),
                address::Type::Service(_) => None,
            },
        )
        .collect()
}
