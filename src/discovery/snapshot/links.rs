//! [`Links`]: what the index and the snapshot look an Address resource up by besides its name
//! (its `network/ip` addresses, a workload's node and services, the waypoint it uses), taken
//! from the message when the resource is built and kept beside its encoded bytes.

use std::net::IpAddr;

use crate::discovery::names::{ip_from_bytes, network_address_key, service_key};
use crate::discovery::snapshot::name::Name;
use crate::pb::istio::workload::gateway_address::Destination;
use crate::pb::istio::workload::{Address, GatewayAddress, address};

/// The lookup facts of one Address resource. Empty for other resource types.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Links {
    /// Its addresses as `(network, ip)`, sorted and unique: a workload's `addresses` on its
    /// `network`, or a service's addresses (a CIDR by its IP alone, as istiod's address index
    /// keys it).
    pub(crate) addresses: Box<[(Name, IpAddr)]>,
    /// A workload's node, when set.
    pub(crate) node: Option<Name>,
    /// The keys (`namespace/hostname`) of a workload's services map, sorted.
    pub(crate) services: Box<[Name]>,
    /// The lookup key of the waypoint it uses: `ns/hostname`, or `network/ip`.
    pub(crate) waypoint: Option<Name>,
    /// The Address holds a Service (else a Workload).
    pub(crate) is_service: bool,
}

impl Links {
    /// The facts of an Address message.
    pub(crate) fn of(message: &Address) -> Self {
        match &message.r#type {
            Some(address::Type::Workload(w)) => {
                let network = Name::from(w.network.as_str());
                let mut addresses: Vec<(Name, IpAddr)> = w
                    .addresses
                    .iter()
                    .filter_map(|raw| ip_from_bytes(raw))
                    .map(|ip| (network.clone(), ip))
                    .collect();
                addresses.sort_unstable();
                addresses.dedup();
                let mut services: Vec<Name> =
                    w.services.keys().map(|k| Name::from(k.as_str())).collect();
                services.sort_unstable();
                Links {
                    addresses: addresses.into_boxed_slice(),
                    node: (!w.node.is_empty()).then(|| Name::from(w.node.as_str())),
                    services: services.into_boxed_slice(),
                    waypoint: waypoint_key(w.waypoint.as_ref()),
                    is_service: false,
                }
            }
            Some(address::Type::Service(s)) => {
                let mut addresses: Vec<(Name, IpAddr)> = s
                    .addresses
                    .iter()
                    .filter_map(|a| {
                        Some((Name::from(a.network.as_str()), ip_from_bytes(&a.address)?))
                    })
                    .collect();
                addresses.sort_unstable();
                addresses.dedup();
                Links {
                    addresses: addresses.into_boxed_slice(),
                    waypoint: waypoint_key(s.waypoint.as_ref()),
                    is_service: true,
                    ..Links::default()
                }
            }
            None => Links::default(),
        }
    }
}

/// The lookup key of a waypoint address: `ns/hostname`, or `network/ip`.
fn waypoint_key(waypoint: Option<&GatewayAddress>) -> Option<Name> {
    match waypoint?.destination.as_ref()? {
        Destination::Hostname(h) => Some(service_key(&h.namespace, &h.hostname).into()),
        Destination::Address(a) => {
            let ip = ip_from_bytes(&a.address)?;
            Some(network_address_key(&a.network, &ip).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::names::ip_bytes;
    use crate::pb::istio::workload::{
        self as wl, NamespacedHostname, NetworkAddress, PortList, address,
    };

    fn hostname(ns: &str, host: &str) -> Option<GatewayAddress> {
        Some(GatewayAddress {
            destination: Some(Destination::Hostname(NamespacedHostname {
                namespace: ns.into(),
                hostname: host.into(),
            })),
            ..Default::default()
        })
    }

    fn names(texts: &[&str]) -> Box<[Name]> {
        texts.iter().map(|t| Name::from(*t)).collect()
    }

    #[test]
    fn a_workload_gives_its_addresses_node_services_and_waypoint() {
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        let workload = wl::Address {
            r#type: Some(address::Type::Workload(wl::Workload {
                uid: "c//Pod/ns/a".into(),
                name: "a".into(),
                network: "net1".into(),
                addresses: vec![ip_bytes(&ip("10.0.0.2")), ip_bytes(&ip("10.0.0.1"))],
                node: "node-1".into(),
                waypoint: hostname("ns", "wp.ns.svc.cluster.local"),
                services: [
                    ("ns/b.ns.svc.cluster.local", PortList::default()),
                    ("ns/a.ns.svc.cluster.local", PortList { ports: vec![] }),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
                ..Default::default()
            })),
        };
        assert_eq!(
            Links::of(&workload),
            Links {
                addresses: vec![
                    (Name::from("net1"), ip("10.0.0.1")),
                    (Name::from("net1"), ip("10.0.0.2"))
                ]
                .into(),
                node: Some(Name::from("node-1")),
                services: names(&["ns/a.ns.svc.cluster.local", "ns/b.ns.svc.cluster.local"]),
                waypoint: Some(Name::from("ns/wp.ns.svc.cluster.local")),
                is_service: false,
            }
        );

        // A service: no node nor members; its VIPs; its waypoint by address.
        let service = wl::Address {
            r#type: Some(address::Type::Service(wl::Service {
                name: "s".into(),
                namespace: "ns".into(),
                hostname: "s.ns.svc.cluster.local".into(),
                addresses: vec![NetworkAddress {
                    network: String::new(),
                    address: ip_bytes(&ip("10.96.0.1")),
                    length: None,
                }],
                waypoint: Some(GatewayAddress {
                    destination: Some(Destination::Address(NetworkAddress {
                        network: "net1".into(),
                        address: ip_bytes(&ip("10.0.0.9")),
                        length: None,
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        };
        let links = Links::of(&service);
        assert!(links.is_service);
        assert_eq!(&*links.addresses, &[(Name::from(""), ip("10.96.0.1"))]);
        assert_eq!((links.node, &*links.services), (None, &[][..]));
        assert_eq!(links.waypoint.as_deref(), Some("net1/10.0.0.9"));

        // Nothing set.
        let bare = wl::Address {
            r#type: Some(address::Type::Workload(wl::Workload::default())),
        };
        assert_eq!(Links::of(&bare), Links::default());
    }
}
