//! Network gateways (docs/conversion.md, "East-west (network) gateways"): how workloads on
//! another network are reached. Each network gateway becomes a Workload of its own, uid
//! `NetworkGateway/<net>/<address>/<port>` (istiod's `convertGateway`), and every workload on
//! that network names the network's first gateway in `network_gateway`
//! (`getNetworkGatewayAddress`), so ztunnel tunnels to it instead of to the workload.

use std::net::IpAddr;

use crate::discovery::model::network_gateway::NetworkGateway;
use crate::discovery::names::ip_bytes;
use crate::discovery::store::Store;
use crate::pb::workload::{GatewayAddress, Workload};

impl NetworkGateway {
    /// Its Workload: address (or hostname), network, and the identity its pods run as. Its
    /// `name` is its uid, as istiod sends it (a workload with an empty name reads as nameless
    /// in ztunnel's dumps and metrics).
    pub(crate) fn workload(&self) -> Workload {
        let (addresses, hostname) = match self.address.parse::<IpAddr>() {
            Ok(ip) => (vec![ip_bytes(&ip)], String::new()),
            Err(_) => (Vec::new(), self.address.clone()),
        };
        let uid = self.uid();
        Workload {
            name: uid.clone(),
            uid,
            namespace: self.source.0.clone(),
            service_account: self.service_account.clone(),
            network: self.network.clone(),
            addresses,
            hostname,
            ..Default::default()
        }
    }
}

/// `Workload.network_gateway` for a workload on `network`: its first gateway (by Gateway, then
/// address) with an HBONE port; none for the default (empty) network or one without gateways.
pub(crate) fn for_network(store: &Store, network: &str) -> Option<GatewayAddress> {
    if network.is_empty() {
        return None;
    }
    store
        .network_gateways(network)
        .find(|gw| gw.hbone_port != 0)
        .map(NetworkGateway::gateway_address)
}
