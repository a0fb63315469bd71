//! Building one target's resources, and encoding each resource once.

use crate::discovery::authorization::PolicyStatus;
use crate::discovery::index::{Index, Target};
use crate::discovery::names::{
    ADDRESS_TYPE, AUTHORIZATION_TYPE, TypeKind, ip_from_bytes, network_address_key, service_key,
};
use crate::discovery::snapshot::Resource;
use crate::discovery::store::Key;
use crate::discovery::{endpoint_slice, entry, policies, service, service_entry, workload};
use crate::pb::security::Authorization;
use crate::pb::workload::{self as wl, Address, address};

impl Index {
    /// Builds every resource of one target, and a policy's status.
    pub(super) fn build(&self, target: &Target, reads: &mut Vec<Key>) -> Built {
        let (settings, store) = (&self.settings, &self.store);
        let addresses = |resources: Vec<Resource>| Built {
            resources: resources
                .into_iter()
                .map(|r| (TypeKind::Address, r))
                .collect(),
            status: None,
        };
        let authorization = |a: Option<Authorization>| Built {
            resources: a
                .map(|a| (TypeKind::Authorization, authorization_resource(a)))
                .into_iter()
                .collect(),
            status: None,
        };
        match target {
            Target::Pod(k) => addresses(
                store
                    .pods
                    .get(k)
                    .and_then(|pod| workload::build(settings, store, pod, reads))
                    .map(workload_resource)
                    .into_iter()
                    .collect(),
            ),
            Target::WorkloadEntry(k) => addresses(
                store
                    .workload_entries
                    .get(k)
                    .map(|we| workload_resource(entry::workload_entry(settings, store, we, reads)))
                    .into_iter()
                    .collect(),
            ),
            Target::EntryWorkloads(k) => addresses(
                store
                    .service_entries
                    .get(k)
                    .map(|se| entry::service_entry_workloads(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::Slice(k) => addresses(
                store
                    .slices
                    .get(k)
                    .map(|slice| endpoint_slice::build(settings, store, slice))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::KubeService(k) => addresses(
                store
                    .services
                    .get(k)
                    .and_then(|svc| service::build(settings, store, svc, reads))
                    .map(service_resource)
                    .into_iter()
                    .collect(),
            ),
            Target::EntryServices(k) => addresses(
                store
                    .service_entries
                    .get(k)
                    .map(|se| service_entry::build(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_iter()
                    .map(service_resource)
                    .collect(),
            ),
            Target::Policy(k) => match policies::convert(settings, store, k) {
                Some(converted) => Built {
                    status: Some(converted.status),
                    ..authorization(converted.authorization)
                },
                None => Built {
                    status: Some(None),
                    ..authorization(None)
                },
            },
            Target::PeerAuthentication(k) => {
                authorization(policies::converted_peer_policy(settings, store, k))
            }
            Target::StaticStrict => authorization(policies::static_strict(settings, store)),
        }
    }
}

/// What building one target produced.
pub(super) struct Built {
    pub(super) resources: Vec<(TypeKind, Resource)>,
    /// For a policy: its new status (`Some(None)`: none).
    pub(super) status: Option<Option<PolicyStatus>>,
}

fn authorization_resource(a: Authorization) -> Resource {
    let name = format!("{}/{}", a.namespace, a.name);
    Resource::encode(AUTHORIZATION_TYPE, name, Vec::new(), false, Vec::new(), &a)
}

fn workload_resource(w: wl::Workload) -> Resource {
    let aliases = aliases(&w.network, &w.addresses);
    let services = w.services.keys().cloned().collect();
    let name = w.uid.clone();
    let node = w.node.clone();
    let waypoints = waypoint_key(w.waypoint.as_ref()).into_iter().collect();
    let message = Address {
        r#type: Some(address::Type::Workload(w)),
    };
    let mut resource = Resource::encode(ADDRESS_TYPE, name, aliases, false, services, &message);
    resource.node = node;
    resource.waypoints = waypoints;
    resource
}

/// The lookup key of a waypoint address: `ns/hostname`, or `network/ip`.
fn waypoint_key(waypoint: Option<&wl::GatewayAddress>) -> Option<String> {
    use wl::gateway_address::Destination;
    match waypoint?.destination.as_ref()? {
        Destination::Hostname(h) => Some(service_key(&h.namespace, &h.hostname)),
        Destination::Address(a) => {
            let ip = ip_from_bytes(&a.address)?;
            Some(network_address_key(&a.network, &ip))
        }
    }
}

fn service_resource(s: wl::Service) -> Resource {
    let name = service_key(&s.namespace, &s.hostname);
    let aliases = s
        .addresses
        .iter()
        .filter_map(|a| {
            let ip = ip_from_bytes(&a.address)?;
            Some(match a.length {
                Some(len) => format!("{}/{len}", network_address_key(&a.network, &ip)),
                None => network_address_key(&a.network, &ip),
            })
        })
        .collect();
    let waypoints = waypoint_key(s.waypoint.as_ref()).into_iter().collect();
    let message = Address {
        r#type: Some(address::Type::Service(s)),
    };
    let mut resource = Resource::encode(ADDRESS_TYPE, name, aliases, true, Vec::new(), &message);
    resource.waypoints = waypoints;
    resource
}

/// `network/ip` for each raw address.
fn aliases(network: &str, addresses: &[bytes::Bytes]) -> Vec<String> {
    addresses
        .iter()
        .filter_map(|raw| ip_from_bytes(raw))
        .map(|ip| network_address_key(network, &ip))
        .collect()
}
