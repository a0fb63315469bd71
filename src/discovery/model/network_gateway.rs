//! East-west (network) gateways as data (docs/conversion.md, "East-west (network) gateways").
//!
//! A Gateway of class `istio-remote` labelled `topology.istio.io/network: <net>` describes the
//! east-west gateway of network `<net>`: each of its status addresses (IP or hostname) with its
//! first `HBONE` listener's port is one network gateway (istiod's
//! `localK8sGatewayToNetworkGateways`). Its Workload and the `network_gateway` of the workloads
//! on its network are `convert::network_gateway`.

use std::net::IpAddr;

use crate::discovery::model::kinds::{Gateway, Key, NETWORK_LABEL};
use crate::discovery::names::ip_bytes;
use crate::pb::workload::{
    GatewayAddress, NamespacedHostname, NetworkAddress, gateway_address::Destination,
};

/// The GatewayClass of the gateways that front other networks.
pub(crate) const REMOTE_GATEWAY_CLASS: &str = "istio-remote";
/// Names the service account a gateway's pods run as.
pub(crate) const SERVICE_ACCOUNT_ANNOTATION: &str = "gateway.istio.io/service-account";

/// One address of an east-west gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NetworkGateway {
    pub(crate) network: String,
    /// An IP or a hostname, as the Gateway's status writes it.
    pub(crate) address: String,
    pub(crate) hbone_port: u32,
    /// The Gateway it comes from.
    pub(crate) source: Key,
    /// The service account its pods run as (in the Gateway's namespace).
    pub(crate) service_account: String,
}

impl NetworkGateway {
    /// The Gateway's network gateways: none unless it is of class `istio-remote` and names a
    /// network; then one per IP or hostname status address, with its first HBONE listener's
    /// port (none without such a listener).
    pub(crate) fn from_gateway(gw: &Gateway) -> Vec<NetworkGateway> {
        let Some(network) = gw.labels.get(NETWORK_LABEL).filter(|n| !n.is_empty()) else {
            return Vec::new();
        };
        if gw.class_name != REMOTE_GATEWAY_CLASS {
            return Vec::new();
        }
        let Some(listener) = gw.listeners.iter().find(|l| l.protocol == "HBONE") else {
            return Vec::new();
        };
        // istiod's `GatewaySA`: the annotation, else `<name>-istio-remote`.
        let service_account = gw
            .annotations
            .get(SERVICE_ACCOUNT_ANNOTATION)
            .filter(|sa| !sa.is_empty())
            .map_or_else(|| format!("{}-{}", gw.name, gw.class_name), str::to_string);
        gw.addresses
            .iter()
            .filter(|(kind, _)| kind == "IPAddress" || kind == "Hostname")
            .map(|(_, address)| NetworkGateway {
                network: network.to_string(),
                address: address.clone(),
                hbone_port: u32::from(listener.port),
                source: (gw.namespace.clone(), gw.name.clone()),
                service_account: service_account.clone(),
            })
            .collect()
    }

    /// Its Workload's uid (and resource name).
    pub(crate) fn uid(&self) -> String {
        format!(
            "NetworkGateway/{}/{}/{}",
            self.network, self.address, self.hbone_port
        )
    }

    /// How a workload on its network names it.
    pub(crate) fn gateway_address(&self) -> GatewayAddress {
        let destination = match self.address.parse::<IpAddr>() {
            Ok(ip) => Destination::Address(NetworkAddress {
                network: self.network.clone(),
                address: ip_bytes(&ip),
                length: None,
            }),
            Err(_) => Destination::Hostname(NamespacedHostname {
                namespace: self.source.0.clone(),
                hostname: self.address.clone(),
            }),
        };
        GatewayAddress {
            destination: Some(destination),
            hbone_mtls_port: self.hbone_port,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::kinds::Listener;
    use crate::discovery::model::labels::Labels;

    fn remote(addresses: &[(&str, &str)], annotations: &[(&str, &str)]) -> Gateway {
        let labels = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Gateway {
            name: "eastwest".into(),
            namespace: "ns-gtw".into(),
            labels: labels(&[(NETWORK_LABEL, "remote-network")]),
            annotations: labels(annotations),
            class_name: REMOTE_GATEWAY_CLASS.into(),
            listeners: vec![
                Listener {
                    name: "tls".into(),
                    port: 15443,
                    protocol: "TLS".into(),
                    allowed: None,
                },
                Listener {
                    name: "mesh".into(),
                    port: 15008,
                    protocol: "HBONE".into(),
                    allowed: None,
                },
            ],
            addresses: addresses
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn each_status_address_with_the_hbone_listener_is_a_gateway() {
        let gw = remote(
            &[
                ("IPAddress", "9.9.9.9"),
                ("Hostname", "gw.example.com"),
                ("NamedAddress", "x"),
            ],
            &[(SERVICE_ACCOUNT_ANNOTATION, "sa-gtw")],
        );
        let gateways = NetworkGateway::from_gateway(&gw);
        let uids: Vec<String> = gateways.iter().map(NetworkGateway::uid).collect();
        assert_eq!(
            uids,
            [
                "NetworkGateway/remote-network/9.9.9.9/15008",
                "NetworkGateway/remote-network/gw.example.com/15008"
            ]
        );
        let w = gateways[0].workload();
        assert_eq!(w.name, w.uid, "named by its uid, as istiod does");
        assert_eq!(
            (w.namespace.as_str(), w.service_account.as_str()),
            ("ns-gtw", "sa-gtw")
        );
        assert_eq!(w.addresses, [bytes::Bytes::from_static(&[9, 9, 9, 9])]);
        assert_eq!(gateways[1].workload().hostname, "gw.example.com");
        // Without the annotation: `<name>-istio-remote`.
        let plain = NetworkGateway::from_gateway(&remote(&[("IPAddress", "9.9.9.9")], &[]));
        assert_eq!(plain[0].service_account, "eastwest-istio-remote");
    }

    #[test]
    fn other_classes_unlabelled_gateways_and_no_hbone_listener_give_none() {
        let mut gw = remote(&[("IPAddress", "9.9.9.9")], &[]);
        gw.class_name = "istio-waypoint".into();
        assert!(NetworkGateway::from_gateway(&gw).is_empty());
        let mut gw = remote(&[("IPAddress", "9.9.9.9")], &[]);
        gw.labels = Labels::new();
        assert!(NetworkGateway::from_gateway(&gw).is_empty());
        let mut gw = remote(&[("IPAddress", "9.9.9.9")], &[]);
        gw.listeners.retain(|l| l.protocol != "HBONE");
        assert!(NetworkGateway::from_gateway(&gw).is_empty());
    }
}
