//! Type URLs and resource keys, spelled exactly as istiod spells them on the wire.

use std::fmt;
use std::net::IpAddr;

pub const ADDRESS_TYPE: &str = "type.googleapis.com/istio.workload.Address";
pub const AUTHORIZATION_TYPE: &str = "type.googleapis.com/istio.security.Authorization";
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The Workload type waypoints subscribe to for peer metadata (named by workload uid).
pub const WORKLOAD_TYPE: &str = "type.googleapis.com/istio.workload.Workload";

/// Every type a resource can have: ztunnel's two ([`TypeKind`]) and the four a waypoint's
/// Envoy is sent. One byte in each [`crate::discovery::Resource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    Address,
    Authorization,
    Cluster,
    Listener,
    ClusterLoadAssignment,
    Workload,
}

impl ResourceType {
    /// The waypoint types, in istiod's push order (`ads.go` `PushOrder`: CDS, EDS, LDS, then
    /// Workload).
    pub const WAYPOINT: [ResourceType; 4] = [
        ResourceType::Cluster,
        ResourceType::ClusterLoadAssignment,
        ResourceType::Listener,
        ResourceType::Workload,
    ];

    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::Address => ADDRESS_TYPE,
            ResourceType::Authorization => AUTHORIZATION_TYPE,
            ResourceType::Cluster => CLUSTER_TYPE,
            ResourceType::Listener => LISTENER_TYPE,
            ResourceType::ClusterLoadAssignment => ENDPOINT_TYPE,
            ResourceType::Workload => WORKLOAD_TYPE,
        }
    }

    pub fn from_type_url(type_url: &str) -> Option<Self> {
        [
            ResourceType::Address,
            ResourceType::Authorization,
            ResourceType::Cluster,
            ResourceType::Listener,
            ResourceType::ClusterLoadAssignment,
            ResourceType::Workload,
        ]
        .into_iter()
        .find(|t| t.type_url() == type_url)
    }

    /// Envoy's short name for the type, as istiod's debug views and metrics label it.
    pub fn short_name(self) -> &'static str {
        match self {
            ResourceType::Address => "Address",
            ResourceType::Authorization => "Authorization",
            ResourceType::Cluster => "cds",
            ResourceType::Listener => "lds",
            ResourceType::ClusterLoadAssignment => "eds",
            ResourceType::Workload => "Workload",
        }
    }
}

impl From<TypeKind> for ResourceType {
    fn from(kind: TypeKind) -> Self {
        match kind {
            TypeKind::Address => ResourceType::Address,
            TypeKind::Authorization => ResourceType::Authorization,
        }
    }
}

/// The resource types ambientd serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TypeKind {
    Address,
    Authorization,
}

impl TypeKind {
    /// In istiod's push order: Address, then Authorization.
    pub(crate) const ALL: [TypeKind; 2] = [TypeKind::Address, TypeKind::Authorization];

    pub(crate) fn from_type_url(type_url: &str) -> Option<Self> {
        match type_url {
            ADDRESS_TYPE => Some(TypeKind::Address),
            AUTHORIZATION_TYPE => Some(TypeKind::Authorization),
            _ => None,
        }
    }

    pub(crate) fn type_url(self) -> &'static str {
        match self {
            TypeKind::Address => ADDRESS_TYPE,
            TypeKind::Authorization => AUTHORIZATION_TYPE,
        }
    }
}

/// One value per resource type, in [`TypeKind::ALL`] order: two slots, where a `BTreeMap`
/// would allocate a node of eleven (about 2 KB per connection for its sync state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerType<T>([Option<T>; 2]);

impl<T> Default for PerType<T> {
    fn default() -> Self {
        PerType([None, None])
    }
}

type Entries<'a, T> = std::iter::FilterMap<
    std::iter::Zip<std::slice::Iter<'static, TypeKind>, std::slice::Iter<'a, Option<T>>>,
    fn((&'static TypeKind, &'a Option<T>)) -> Option<(&'static TypeKind, &'a T)>,
>;

impl<T> PerType<T> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn slot(kind: TypeKind) -> usize {
        match kind {
            TypeKind::Address => 0,
            TypeKind::Authorization => 1,
        }
    }

    pub(crate) fn get(&self, kind: &TypeKind) -> Option<&T> {
        self.0[Self::slot(*kind)].as_ref()
    }

    pub(crate) fn get_mut(&mut self, kind: &TypeKind) -> Option<&mut T> {
        self.0[Self::slot(*kind)].as_mut()
    }

    /// Sets `kind`'s value; returns the one it replaces.
    pub(crate) fn insert(&mut self, kind: TypeKind, value: T) -> Option<T> {
        self.0[Self::slot(kind)].replace(value)
    }

    pub(crate) fn get_or_insert_with(&mut self, kind: TypeKind, f: impl FnOnce() -> T) -> &mut T {
        self.0[Self::slot(kind)].get_or_insert_with(f)
    }

    /// The types that have a value, with it, in [`TypeKind::ALL`] order.
    pub(crate) fn iter(&self) -> Entries<'_, T> {
        TypeKind::ALL
            .iter()
            .zip(self.0.iter())
            .filter_map(|(kind, value)| Some((kind, value.as_ref()?)))
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = TypeKind> + '_ {
        self.iter().map(|(kind, _)| *kind)
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.0.iter_mut().flatten()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.iter().flatten().count()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a, T> IntoIterator for &'a PerType<T> {
    type Item = (&'static TypeKind, &'a T);
    type IntoIter = Entries<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Display for TypeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A pod workload's uid and xDS name: `<cluster>//Pod/<ns>/<name>` (the double slash is istiod's).
pub(crate) fn pod_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}//Pod/{namespace}/{name}")
}

/// A Kubernetes Service's hostname: `<name>.<ns>.svc.<domain>`.
pub(crate) fn service_hostname(name: &str, namespace: &str, domain: &str) -> String {
    format!("{name}.{namespace}.svc.{domain}")
}

/// A service's xDS name and services-map key: `<ns>/<hostname>`.
pub(crate) fn service_key(namespace: &str, hostname: &str) -> String {
    format!("{namespace}/{hostname}")
}

/// The `network/ip` alias and on-demand lookup key (`/10.0.0.1` on the default network).
pub(crate) fn network_address_key(network: &str, ip: &IpAddr) -> String {
    format!("{network}/{ip}")
}

/// An IP from raw network-order bytes (4 or 16); `None` for any other length.
pub(crate) fn ip_from_bytes(raw: &[u8]) -> Option<IpAddr> {
    match raw.len() {
        4 => <[u8; 4]>::try_from(raw).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(raw).ok().map(IpAddr::from),
        _ => None,
    }
}

/// Raw network-order bytes of an IP, as the protos carry it.
pub(crate) fn ip_bytes(ip: &IpAddr) -> bytes::Bytes {
    match ip {
        IpAddr::V4(v4) => bytes::Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes::Bytes::copy_from_slice(&v6.octets()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_type_holds_one_value_per_kind_in_push_order() {
        let mut map: PerType<&str> = PerType::new();
        assert!(map.is_empty());
        assert_eq!(map.insert(TypeKind::Authorization, "b"), None);
        assert_eq!(map.keys().collect::<Vec<_>>(), [TypeKind::Authorization]);
        assert_eq!(map.insert(TypeKind::Address, "a"), None);
        assert_eq!(map.insert(TypeKind::Address, "a2"), Some("a"));
        *map.get_or_insert_with(TypeKind::Authorization, || "unused") = "b2";
        assert_eq!(
            map.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>(),
            [(TypeKind::Address, "a2"), (TypeKind::Authorization, "b2")]
        );
        for value in map.values_mut() {
            *value = "x";
        }
        assert_eq!((&map).into_iter().count(), 2);
        assert_eq!(map.get(&TypeKind::Address), Some(&"x"));
        assert_eq!(map.len(), 2);
    }
}
