//! Type URLs and resource keys, spelled exactly as istiod spells them on the wire.

use std::fmt;
use std::net::IpAddr;

pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
pub const AUTHORIZATION_TYPE: &str = "type.googleapis.com/istio.security.Authorization";

/// The resource types ambientd serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeKind {
    Address,
    Authorization,
}

impl TypeKind {
    /// In istiod's push order: Address, then Authorization.
    pub const ALL: [TypeKind; 2] = [TypeKind::Address, TypeKind::Authorization];

    pub fn from_type_url(type_url: &str) -> Option<Self> {
        match type_url {
            ADDRESS_TYPE => Some(TypeKind::Address),
            AUTHORIZATION_TYPE => Some(TypeKind::Authorization),
            _ => None,
        }
    }

    pub fn type_url(self) -> &'static str {
        match self {
            TypeKind::Address => ADDRESS_TYPE,
            TypeKind::Authorization => AUTHORIZATION_TYPE,
        }
    }
}

impl fmt::Display for TypeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A pod workload's uid and xDS name: `<cluster>//Pod/<ns>/<name>` (the double slash is istiod's).
pub fn pod_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}//Pod/{namespace}/{name}")
}

/// A Kubernetes Service's hostname: `<name>.<ns>.svc.<domain>`.
pub fn service_hostname(name: &str, namespace: &str, domain: &str) -> String {
    format!("{name}.{namespace}.svc.{domain}")
}

/// A service's xDS name and services-map key: `<ns>/<hostname>`.
pub fn service_key(namespace: &str, hostname: &str) -> String {
    format!("{namespace}/{hostname}")
}

/// The `network/ip` alias and on-demand lookup key (`/10.0.0.1` on the default network).
pub fn network_address_key(network: &str, ip: &IpAddr) -> String {
    format!("{network}/{ip}")
}

/// An IP from raw network-order bytes (4 or 16); `None` for any other length.
pub fn ip_from_bytes(raw: &[u8]) -> Option<IpAddr> {
    match raw.len() {
        4 => <[u8; 4]>::try_from(raw).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(raw).ok().map(IpAddr::from),
        _ => None,
    }
}

/// Raw network-order bytes of an IP, as the protos carry it.
pub fn ip_bytes(ip: &IpAddr) -> bytes::Bytes {
    match ip {
        IpAddr::V4(v4) => bytes::Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes::Bytes::copy_from_slice(&v6.octets()),
    }
}
