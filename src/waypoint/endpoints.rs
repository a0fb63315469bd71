//! EDS for a waypoint's `inbound-vip` clusters (istio/istio `pilot/pkg/xds/endpoints/endpoint_builder.go`): the service's members
//! on the port, HBONE ones as internal addresses of `connect_originate` carrying their
//! `ip:port` in metadata, the others as plain sockets.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::discovery::names::ip_from_bytes;
use crate::pb::envoy::config::core::v3::{self as core, HealthStatus, Locality};
use crate::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use crate::pb::istio::workload::{TunnelProtocol, Workload, WorkloadStatus};
use crate::waypoint::clusters::{ORIGINAL_DST_METADATA, TUNNEL_HTTP, TUNNEL_LABEL};
use crate::waypoint::envoy::{self, internal_address, socket_address, uint32};
use crate::waypoint::listeners::CONNECT_ORIGINATE;

/// The cluster's load assignment: `members` that serve `service_port` of `service_key`
/// (`ns/hostname`), grouped by locality. An `outbound` cluster's HBONE endpoints also carry
/// `envoy.transport_socket_match {tunnel: http}`, which picks its HBONE transport socket.
pub(crate) fn load_assignment<'a>(
    cluster: &str,
    service_key: &str,
    service_port: u32,
    default_target: u32,
    members: impl Iterator<Item = &'a Workload>,
    outbound: bool,
) -> ClusterLoadAssignment {
    let mut by_locality: BTreeMap<(String, String, String), Vec<LbEndpoint>> = BTreeMap::new();
    for workload in members {
        if workload.status == WorkloadStatus::Unhealthy as i32 {
            continue;
        }
        let Some(ip) = workload.addresses.first().and_then(|a| ip_from_bytes(a)) else {
            continue;
        };
        let Some(port) = target_port(workload, service_key, service_port, default_target) else {
            continue;
        };
        let locality = workload.locality.clone().unwrap_or_default();
        by_locality
            .entry((locality.region, locality.zone, locality.subzone))
            .or_default()
            .push(lb_endpoint(workload, ip, port, outbound));
    }
    ClusterLoadAssignment {
        cluster_name: cluster.into(),
        endpoints: by_locality
            .into_iter()
            .map(
                |((region, zone, sub_zone), lb_endpoints)| LocalityLbEndpoints {
                    locality: (!region.is_empty() || !zone.is_empty() || !sub_zone.is_empty())
                        .then_some(Locality {
                            region,
                            zone,
                            sub_zone,
                        }),
                    load_balancing_weight: uint32(lb_endpoints.len() as u32),
                    lb_endpoints,
                    ..Default::default()
                },
            )
            .collect(),
    }
}

/// The port a workload serves `service_port` on: its own mapping for the service, else the
/// service's target port. `None` when its mapping leaves the port out.
fn target_port(w: &Workload, service_key: &str, service_port: u32, default: u32) -> Option<u32> {
    let Some(list) = w.services.get(service_key) else {
        return Some(default);
    };
    let port = list.ports.iter().find(|p| p.service_port == service_port)?;
    Some(match port.target_port {
        0 => default,
        target => target,
    })
}

fn lb_endpoint(w: &Workload, ip: IpAddr, port: u32, outbound: bool) -> LbEndpoint {
    let ip_port = match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    };
    let mut filter_metadata = BTreeMap::new();
    filter_metadata.insert(
        "istio".to_string(),
        envoy::object(vec![(
            "workload",
            envoy::string_value(format!(
                "{};{};{};{};{}",
                w.workload_name,
                w.namespace,
                w.canonical_name,
                if w.canonical_revision == "latest" {
                    ""
                } else {
                    &w.canonical_revision
                },
                w.cluster_id
            )),
        )]),
    );
    let hbone = w.tunnel_protocol == TunnelProtocol::Hbone as i32;
    let endpoint = if hbone {
        filter_metadata.insert(
            ORIGINAL_DST_METADATA.to_string(),
            envoy::object(vec![("local", envoy::string_value(ip_port.clone()))]),
        );
        if outbound {
            filter_metadata.insert(
                "envoy.transport_socket_match".to_string(),
                envoy::object(vec![(TUNNEL_LABEL, envoy::string_value(TUNNEL_HTTP))]),
            );
        }
        Endpoint {
            address: Some(internal_address(CONNECT_ORIGINATE, &ip_port)),
            ..Default::default()
        }
    } else {
        Endpoint {
            address: Some(socket_address(&ip.to_string(), port)),
            additional_addresses: w
                .addresses
                .iter()
                .skip(1)
                .filter_map(|a| ip_from_bytes(a))
                .map(
                    |extra| crate::pb::envoy::config::endpoint::v3::endpoint::AdditionalAddress {
                        address: Some(socket_address(&extra.to_string(), port)),
                    },
                )
                .collect(),
            ..Default::default()
        }
    };
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)),
        health_status: HealthStatus::Healthy as i32,
        metadata: Some(core::Metadata {
            filter_metadata,
            ..Default::default()
        }),
        load_balancing_weight: uint32(1),
    }
}
