//! What the index looks an Address up by besides its name and aliases, read back from its
//! encoded value: a workload's node and the services in its services map, and the waypoint a
//! workload or service uses.
//!
//! A resource does not also carry these as a slice of shared names, which would cost a block per
//! workload and 16 bytes in the resource: they are in the value anyway, and the index reads them
//! only when a workload changes (and then only if they may have changed: see `Index::set_address`)
//! or for a node-scoped proxy's initial state. Field numbers are those of proto/workload.proto.

use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint};

use crate::discovery::names::{ip_from_bytes, network_address_key, service_key};
use crate::discovery::snapshot::name::Name;
use crate::pb::istio::workload::GatewayAddress;
use crate::pb::istio::workload::gateway_address::Destination;

/// `Address.workload`.
const ADDRESS_WORKLOAD: u32 = 1;
/// `Workload.node`.
const WORKLOAD_NODE: u32 = 9;
/// `Workload.services`: map entries, whose key is field 1.
const WORKLOAD_SERVICES: u32 = 22;
const MAP_KEY: u32 = 1;

/// A workload's node and service keys, borrowed from its encoded value.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct WorkloadLinks<'a> {
    /// `Workload.node`, when set.
    pub node: Option<&'a str>,
    /// The keys (`namespace/hostname`) of `Workload.services`, in encoded order.
    pub services: Vec<&'a str>,
}

/// The node and service keys of an encoded `Address`; none for a service (or bytes that do not
/// decode: the index encodes every value itself).
pub(crate) fn workload_links(value: &[u8]) -> WorkloadLinks<'_> {
    let mut links = WorkloadLinks::default();
    let Some((ADDRESS_WORKLOAD, workload)) = LengthDelimited(value).next() else {
        return links;
    };
    for (field, bytes) in LengthDelimited(workload) {
        match field {
            WORKLOAD_NODE => links.node = std::str::from_utf8(bytes).ok(),
            WORKLOAD_SERVICES => {
                let key = LengthDelimited(bytes).find(|(f, _)| *f == MAP_KEY);
                let key = key.and_then(|(_, k)| std::str::from_utf8(k).ok());
                links.services.extend(key);
            }
            _ => {}
        }
    }
    links.node = links.node.filter(|n| !n.is_empty());
    links
}

/// The length-delimited fields of a message, in order: `(field number, contents)`. Other
/// fields are skipped; malformed bytes end it.
struct LengthDelimited<'a>(&'a [u8]);

impl<'a> Iterator for LengthDelimited<'a> {
    type Item = (u32, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        while !self.0.is_empty() {
            let (field, wire_type) = decode_key(&mut self.0).ok()?;
            let skip = match wire_type {
                WireType::Varint => {
                    decode_varint(&mut self.0).ok()?;
                    0
                }
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => {
                    let len = usize::try_from(decode_varint(&mut self.0).ok()?).ok()?;
                    let (contents, rest) = self.0.split_at_checked(len)?;
                    self.0 = rest;
                    return Some((field, contents));
                }
                WireType::StartGroup | WireType::EndGroup => {
                    self.0 = &[];
                    return None;
                }
            };
            self.0 = self.0.get(skip..)?;
        }
        None
    }
}

/// The lookup key of the waypoint an encoded `Address` (workload or service) uses:
/// `ns/hostname`, or `network/ip`.
pub(crate) fn waypoint_of(value: &[u8]) -> Option<Name> {
    let waypoint = match AddressWaypoint::decode(value).ok()?.kind? {
        Uses::Workload(w) => w.waypoint,
        Uses::Service(s) => s.waypoint,
    };
    waypoint_key(waypoint.as_ref())
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

// The waypoint fields only (`Workload.waypoint` = 8, `Service.waypoint` = 7).

#[derive(Clone, PartialEq, prost::Message)]
struct AddressWaypoint {
    #[prost(oneof = "Uses", tags = "1, 2")]
    kind: Option<Uses>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Uses {
    #[prost(message, tag = "1")]
    Workload(WorkloadWaypoint),
    #[prost(message, tag = "2")]
    Service(ServiceWaypoint),
}

#[derive(Clone, PartialEq, prost::Message)]
struct WorkloadWaypoint {
    #[prost(message, optional, tag = "8")]
    waypoint: Option<GatewayAddress>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ServiceWaypoint {
    #[prost(message, optional, tag = "7")]
    waypoint: Option<GatewayAddress>,
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

    #[test]
    fn a_workload_value_gives_back_its_node_services_and_waypoint() {
        let workload = wl::Address {
            r#type: Some(address::Type::Workload(wl::Workload {
                uid: "c//Pod/ns/a".into(),
                name: "a".into(),
                node: "node-1".into(),
                status: wl::WorkloadStatus::Unhealthy as i32,
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
        let value = workload.encode_to_vec();
        let mut links = workload_links(&value);
        links.services.sort();
        assert_eq!(
            links,
            WorkloadLinks {
                node: Some("node-1"),
                services: vec!["ns/a.ns.svc.cluster.local", "ns/b.ns.svc.cluster.local"],
            }
        );
        assert_eq!(
            waypoint_of(&value).as_deref(),
            Some("ns/wp.ns.svc.cluster.local")
        );

        // A service: no node nor members; its waypoint by address.
        let service = wl::Address {
            r#type: Some(address::Type::Service(wl::Service {
                name: "s".into(),
                namespace: "ns".into(),
                hostname: "s.ns.svc.cluster.local".into(),
                waypoint: Some(GatewayAddress {
                    destination: Some(Destination::Address(NetworkAddress {
                        network: "net1".into(),
                        address: ip_bytes(&"10.0.0.9".parse().unwrap()),
                        length: None,
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            })),
        };
        let value = service.encode_to_vec();
        assert_eq!(workload_links(&value), WorkloadLinks::default());
        assert_eq!(waypoint_of(&value).as_deref(), Some("net1/10.0.0.9"));

        // Nothing to read, or bytes that are not protobuf.
        let bare = wl::Address {
            r#type: Some(address::Type::Workload(wl::Workload::default())),
        };
        assert_eq!(
            workload_links(&bare.encode_to_vec()),
            WorkloadLinks::default()
        );
        assert_eq!(waypoint_of(&bare.encode_to_vec()), None);
        assert_eq!(workload_links(b"\x0a\xff\xff"), WorkloadLinks::default());
        assert_eq!(waypoint_of(b"\xff not protobuf"), None);
    }
}
