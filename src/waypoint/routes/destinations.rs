//! Where a route's backends go (istiod's `getWaypointDestinationCluster`): the bound
//! services' `inbound-vip` clusters, or `outbound|<port>||<host>` clusters (docs/waypoint.md
//! §3.3) for the others, collected for the builder.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use prost::Message;

use crate::discovery::model::BackendRef;
use crate::discovery::names::service_key;
use crate::discovery::{Resource, Snapshot};
use crate::pb::istio::workload::{Address, AppProtocol, Service, address};

/// The cluster name istiod gives a backend it could not resolve.
pub(crate) const UNKNOWN_SERVICE: &str = "UnknownService";

/// A service a route sends to that is not bound to this waypoint: its `outbound|…`
/// cluster is built beside the waypoint's own.
#[derive(Clone, Debug)]
pub(crate) struct Outbound {
    pub(crate) resource: Arc<Resource>,
    pub(crate) service: Service,
    pub(crate) port: u32,
    pub(crate) target_port: u32,
    pub(crate) protocol: AppProtocol,
}

/// Where a route's backends go: the bound services' `inbound-vip` clusters, or `outbound`
/// clusters for the others (collected here for the builder), with the service names it
/// looked up, found or not (a change of any of them rebuilds the config).
pub(crate) struct Destinations<'a> {
    snapshot: &'a Snapshot,
    domain: &'a str,
    /// Bound services by resource name (`ns/hostname`).
    bound: HashMap<&'a str, &'a Service>,
    /// Cluster name -> what it is built from.
    pub(crate) outbound: BTreeMap<String, Outbound>,
    /// Service resource names the routes referred to.
    pub(crate) reads: BTreeSet<String>,
    /// The port of the chain being translated: a VirtualService destination without a port
    /// (on a service with several) goes there.
    pub(crate) listener_port: u32,
}

impl<'a> Destinations<'a> {
    pub(crate) fn new(
        snapshot: &'a Snapshot,
        domain: &'a str,
        bound: impl Iterator<Item = (&'a str, &'a Service)>,
    ) -> Self {
        Destinations {
            snapshot,
            domain,
            bound: bound.collect(),
            outbound: BTreeMap::new(),
            reads: Default::default(),
            listener_port: 0,
        }
    }

    /// The cluster a backend on `port` goes to (`getWaypointDestinationCluster`).
    pub(super) fn cluster(&mut self, backend: &BackendRef, route_ns: &str) -> String {
        let Ok(host) = backend.hostname(route_ns, self.domain) else {
            return UNKNOWN_SERVICE.into();
        };
        let namespace = if backend.is_service() {
            backend.namespace_or(route_ns)
        } else {
            route_ns
        };
        let key = service_key(namespace, &host);
        self.reads.insert(key.clone());
        let found = self.lookup(&key);
        // A Gateway API backend always has a port (istiod converts no route otherwise); a
        // VirtualService destination without one takes the service's only port, else the
        // listener's.
        let port = match backend.port {
            Some(p) => u32::from(p),
            None => match found.as_ref().map(|(_, s)| s.ports.as_slice()) {
                Some([only]) => only.service_port,
                _ => self.listener_port,
            },
        };
        let named_subset = backend.subset.as_deref().unwrap_or_default();
        if let Some(service) = self.bound.get(key.as_str()) {
            let kind = subset(Some(service), port);
            return match backend.subset.as_deref() {
                Some(s) => format!("inbound-vip|{port}|{kind}/{s}|{host}"),
                None => format!("inbound-vip|{port}|{kind}|{host}"),
            };
        }
        let Some((resource, service)) = found else {
            return format!("inbound-vip|{port}|http|{host}");
        };
        let name = format!("outbound|{port}|{named_subset}|{host}");
        if !named_subset.is_empty() {
            // Subset clusters (DestinationRule subsets) are not built: its requests get 500.
            return name;
        }
        let Some((target_port, protocol)) = service
            .ports
            .iter()
            .find(|p| p.service_port == port)
            .map(|p| (p.target_port, p.app_protocol))
        else {
            // No such port: no endpoints, so no cluster; its requests get 500.
            return name;
        };
        self.outbound
            .entry(name.clone())
            .or_insert_with(|| Outbound {
                port,
                target_port,
                protocol: AppProtocol::try_from(protocol).unwrap_or(AppProtocol::Unknown),
                resource,
                service,
            });
        name
    }

    fn lookup(&self, key: &str) -> Option<(Arc<Resource>, Service)> {
        let resource = self.snapshot.addresses.get(key)?;
        match Address::decode(resource.value()).ok()?.r#type? {
            address::Type::Service(s) => Some((resource.clone(), s)),
            address::Type::Workload(_) => None,
        }
    }
}

/// `portToSubset`: `tcp` for a TCP or TLS port, `http` for any other and for a port the
/// service does not have.
pub(super) fn subset(service: Option<&Service>, port: u32) -> &'static str {
    let protocol = service
        .and_then(|s| s.ports.iter().find(|p| p.service_port == port))
        .map(|p| AppProtocol::try_from(p.app_protocol).unwrap_or(AppProtocol::Unknown));
    match protocol {
        Some(AppProtocol::Tcp | AppProtocol::Tls) => "tcp",
        _ => "http",
    }
}
