//! One waypoint's whole config ([`WaypointConfig`]): its listeners, clusters and endpoints as
//! encoded resources, built from a snapshot, and brought up to date with the next one doing
//! only the work its changes need.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::discovery::model::{
    AuthorizationPolicy, DestinationRule, Jwks, RequestAuthentication, Route,
};
use crate::discovery::names::ResourceType;
use crate::discovery::snapshot::Name;
use crate::discovery::{Resource, Snapshot};
use crate::pb::envoy::config::core::v3::CidrRange;
use crate::pb::istio::workload::{AppProtocol, Service};
use crate::waypoint::attach::{Attachment, Target};
use crate::waypoint::bound::{Bound, WaypointKey, members};
use crate::waypoint::chains::{self, ChainSpec, rbac_kind};
use crate::waypoint::destination_rule::{DestinationRules, port_policy};
use crate::waypoint::envoy::uint32;
use crate::waypoint::listeners::{self, Chain, ListenerSettings, PortProtocol, ServiceMatch};
use crate::waypoint::proxy::{Extensions, WaypointProxy};
use crate::waypoint::routes::{Destinations, RouteIndex};
use crate::waypoint::traffic_policy::{AppliedPolicy, ChainTraffic};
use crate::waypoint::{WaypointSettings, clusters, endpoints};
use crate::waypoint::{jwt, rbac};

/// What a config is built for: the waypoint's key, and what its proxy's flavour changes.
/// Replicas of one waypoint have the same and share one config.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigId {
    pub key: WaypointKey,
    /// Filter-state factory (by the proxy's version and extensions).
    pub string_factory: &'static str,
    pub peer_metadata: bool,
    pub stats: bool,
    pub metadata_exchange: bool,
}

impl ConfigId {
    pub fn of(proxy: &WaypointProxy, snapshot: &Snapshot, domain: &str) -> Self {
        ConfigId {
            key: WaypointKey::of(proxy, snapshot, domain),
            string_factory: proxy.string_factory(),
            peer_metadata: proxy.extensions.peer_metadata,
            stats: proxy.extensions.stats,
            metadata_exchange: proxy.extensions.metadata_exchange,
        }
    }

    fn extensions(&self) -> Extensions {
        Extensions {
            peer_metadata: self.peer_metadata,
            stats: self.stats,
            metadata_exchange: self.metadata_exchange,
            hashable_string: self.string_factory == "istio.hashable_string",
        }
    }
}

/// A waypoint's resources of one snapshot, by type and name.
#[derive(Clone, Debug, Default)]
pub struct WaypointConfig {
    /// The snapshot generation it reflects.
    pub generation: u64,
    pub listeners: BTreeMap<Name, Arc<Resource>>,
    pub clusters: BTreeMap<Name, Arc<Resource>>,
    pub endpoints: BTreeMap<Name, Arc<Resource>>,
    /// The services and workloads bound (names), for finding what a change touches.
    bound: Arc<BTreeSet<String>>,
    /// Each EDS cluster's service, port and the members it was built from (persistent maps:
    /// an update copies only what it changes).
    eds: imbl::OrdMap<Name, EdsSource>,
    /// Bound service -> its EDS clusters.
    service_clusters: imbl::HashMap<Name, Arc<[Name]>>,
    /// Workload -> the bound services it is an endpoint of, as last built.
    member_of: imbl::HashMap<Name, Arc<[Name]>>,
    /// The waypoint policies, RequestAuthentications and key sets it was built with (the
    /// snapshot shares each slice until one of its items changes).
    policies: Option<Arc<[Arc<AuthorizationPolicy>]>>,
    /// The DestinationRules it was built with (shared the same way).
    destination_rules: Option<Arc<[Arc<DestinationRule>]>>,
    authentications: Option<Arc<[Arc<RequestAuthentication>]>>,
    jwks: Option<Arc<[Arc<Jwks>]>>,
    /// The routes it was built with (shared the same way).
    routes: Option<Arc<[Arc<Route>]>>,
    /// The services (`ns/hostname`) its routes send to, found or not: a change of one
    /// changes clusters or route targets.
    route_reads: Arc<BTreeSet<String>>,
}

/// What one EDS cluster was built from.
#[derive(Clone, Debug)]
struct EdsSource {
    service: Name,
    port: u32,
    target_port: u32,
    members: Arc<[Name]>,
    /// An `outbound|…` cluster (its HBONE endpoints say so in their metadata).
    outbound: bool,
}

/// How much of a config a snapshot's changes need rebuilt.
#[derive(Debug, PartialEq, Eq)]
pub enum Rebuild {
    Nothing,
    /// Only these EDS clusters.
    Endpoints(BTreeSet<Name>),
    /// Routes changed: the listeners and clusters; the assignments are kept, but these.
    Routes(BTreeSet<Name>),
    Everything,
}

impl WaypointConfig {
    /// The resources of one type.
    pub fn of(&self, kind: ResourceType) -> Option<&BTreeMap<Name, Arc<Resource>>> {
        match kind {
            ResourceType::Listener => Some(&self.listeners),
            ResourceType::Cluster => Some(&self.clusters),
            ResourceType::ClusterLoadAssignment => Some(&self.endpoints),
            _ => None,
        }
    }

    /// The config of `id` in `snapshot`, from nothing.
    pub fn build(id: &ConfigId, snapshot: &Snapshot, settings: &WaypointSettings) -> Self {
        Builder {
            id,
            snapshot,
            settings,
        }
        .build()
    }

    /// This config brought to `snapshot`: rebuilt as far as its changes since this one's
    /// generation need, or whole when the history no longer tells them.
    pub fn update(&self, id: &ConfigId, snapshot: &Snapshot, settings: &WaypointSettings) -> Self {
        let builder = Builder {
            id,
            snapshot,
            settings,
        };
        match self.rebuild_needed(id, snapshot) {
            Rebuild::Nothing => WaypointConfig {
                generation: snapshot.generation,
                ..self.clone()
            },
            Rebuild::Endpoints(clusters) => {
                let mut next = WaypointConfig {
                    generation: snapshot.generation,
                    ..self.clone()
                };
                for name in clusters {
                    let Some(before) = self.eds.get(&name) else {
                        continue;
                    };
                    let (resource, source) = builder.endpoints(&name, before.clone());
                    next.note_members(&source.service, &before.members, &source.members);
                    next.endpoints.insert(name.clone(), resource);
                    next.eds.insert(name, source);
                }
                next
            }
            Rebuild::Routes(refresh) => builder.build_keeping(Some((self, &refresh))),
            Rebuild::Everything => builder.build(),
        }
    }

    /// What `snapshot`'s changes since this config need rebuilt.
    pub fn rebuild_needed(&self, id: &ConfigId, snapshot: &Snapshot) -> Rebuild {
        if snapshot.generation == self.generation {
            return Rebuild::Nothing;
        }
        let policies_same = self
            .policies
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &snapshot.waypoint_policies))
            && self
                .destination_rules
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(r, &snapshot.destination_rules))
            && self
                .authentications
                .as_ref()
                .is_some_and(|a| Arc::ptr_eq(a, &snapshot.waypoint_authentications))
            && self
                .jwks
                .as_ref()
                .is_some_and(|j| Arc::ptr_eq(j, &snapshot.jwks));
        let routes_same = self
            .routes
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(r, &snapshot.routes));
        let Some(changed) =
            snapshot.names_changed_since(crate::discovery::TypeKind::Address, self.generation)
        else {
            return Rebuild::Everything;
        };
        if !policies_same {
            return Rebuild::Everything;
        }
        let changed: BTreeSet<&Name> = changed.collect();
        if changed.is_empty() {
            return if routes_same {
                Rebuild::Nothing
            } else {
                Rebuild::Routes(BTreeSet::new())
            };
        }
        if Bound::names_of(&id.key, snapshot) != *self.bound {
            return Rebuild::Everything;
        }
        let mut clusters = BTreeSet::new();
        for name in changed {
            // A bound service or workload itself. (A change of the waypoint's own Services
            // changes its key, and so which config it is given.)
            if self.bound.contains(name.as_str()) || self.route_reads.contains(name.as_str()) {
                return Rebuild::Everything;
            }
            // A member of a bound service, now or before: that service's EDS clusters.
            let now = snapshot
                .addresses
                .get(name)
                .map(|r| r.links().services.to_vec())
                .unwrap_or_default();
            let before = self.member_of.get(name).cloned().unwrap_or_default();
            for service in now.iter().chain(before.iter()) {
                if let Some(of_service) = self.service_clusters.get(service) {
                    clusters.extend(of_service.iter().cloned());
                }
            }
        }
        if !routes_same {
            Rebuild::Routes(clusters)
        } else if clusters.is_empty() {
            Rebuild::Nothing
        } else {
            Rebuild::Endpoints(clusters)
        }
    }
}

impl WaypointConfig {
    /// Records that `service`'s endpoints went from `before` to `after`.
    fn note_members(&mut self, service: &Name, before: &[Name], after: &[Name]) {
        for gone in before.iter().filter(|m| !after.contains(m)) {
            let rest: Arc<[Name]> = self
                .member_of
                .get(gone)
                .map(|s| s.iter().filter(|s| *s != service).cloned().collect())
                .unwrap_or_default();
            if rest.is_empty() {
                self.member_of.remove(gone);
            } else {
                self.member_of.insert(gone.clone(), rest);
            }
        }
        for new in after.iter().filter(|m| !before.contains(m)) {
            let mut services: Vec<Name> = self
                .member_of
                .get(new)
                .map(|s| s.to_vec())
                .unwrap_or_default();
            if !services.contains(service) {
                services.push(service.clone());
            }
            self.member_of.insert(new.clone(), services.into());
        }
    }
}

struct Builder<'a> {
    id: &'a ConfigId,
    snapshot: &'a Snapshot,
    settings: &'a WaypointSettings,
}

/// A bound service's port: its number, target port and protocol.
fn port_protocol(app: i32) -> PortProtocol {
    match AppProtocol::try_from(app).unwrap_or(AppProtocol::Unknown) {
        AppProtocol::Http11 => PortProtocol::Http,
        AppProtocol::Http2 | AppProtocol::Grpc => PortProtocol::Http2,
        AppProtocol::Tcp | AppProtocol::Tls => PortProtocol::Tcp,
        AppProtocol::Unknown => PortProtocol::Auto,
    }
}

/// Whether a service is a Kubernetes Service (`<name>.<ns>.svc.<domain>`), else a
/// ServiceEntry host.
fn is_kubernetes(service: &Service, domain: &str) -> bool {
    service.hostname == format!("{}.{}.svc.{domain}", service.name, service.namespace)
}

fn host_range(ip: std::net::IpAddr) -> CidrRange {
    CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: uint32(if ip.is_ipv4() { 32 } else { 128 }),
    }
}

/// A config whose assignments a rebuild may keep, but those named.
type Keep<'a> = Option<(&'a WaypointConfig, &'a BTreeSet<Name>)>;

impl Builder<'_> {
    fn build(&self) -> WaypointConfig {
        self.build_keeping(None)
    }

    /// The whole config; an assignment of `keep`'s config is reused when its cluster is built
    /// from the same service and ports and is not named in `keep` (a route change leaves
    /// endpoints as they were).
    fn build_keeping(&self, keep: Keep<'_>) -> WaypointConfig {
        let snapshot = self.snapshot;
        let key = &self.id.key;
        let bound = Bound::of(key, snapshot);
        let settings = ListenerSettings {
            trust_domain: &self.settings.trust_domain,
            string_factory: self.id.string_factory,
            extensions: self.id.extensions(),
        };
        let attachment = Attachment {
            namespace: &key.namespace,
            gateway: &key.gateway,
            root_namespace: &self.settings.root_namespace,
        };
        let policies = snapshot.waypoint_policies.clone();
        let destination_rules = snapshot.destination_rules.clone();
        let rules = DestinationRules::new(
            &destination_rules,
            &self.settings.root_namespace,
            &self.settings.domain,
        );
        let attached = |target: Target<'_>| -> Vec<&AuthorizationPolicy> {
            policies
                .iter()
                .map(|p| &**p)
                .filter(|p| attachment.attaches(*p, target))
                .collect()
        };
        let authentications = snapshot.waypoint_authentications.clone();
        let jwt_authn = |target: Target<'_>| {
            jwt::jwt_authn(
                authentications
                    .iter()
                    .map(|ra| &**ra)
                    .filter(|ra| attachment.attaches(*ra, target)),
                snapshot,
            )
        };

        let routes = snapshot.routes.clone();
        let route_index = RouteIndex::new(&routes, &key.namespace, &key.gateway);
        let mut destinations = Destinations::new(
            snapshot,
            &self.settings.domain,
            bound.services.iter().map(|(r, s)| (r.name.as_str(), s)),
        );
        let mut chains: Vec<Chain> = Vec::new();
        let mut matches: Vec<ServiceMatch> = Vec::new();
        let mut clusters = vec![clusters::main_internal(), clusters::encap()];
        let mut endpoints = BTreeMap::new();
        let mut eds = imbl::OrdMap::new();
        let mut service_clusters: BTreeMap<Name, Vec<Name>> = BTreeMap::new();
        for (resource, service) in &bound.services {
            let kubernetes = is_kubernetes(service, &self.settings.domain);
            let target = Target::Service {
                namespace: &service.namespace,
                name: &service.name,
                kubernetes,
            };
            let on_service = attached(target);
            let rbac_http = rbac::chain_rbac(on_service.iter().copied(), rbac_kind(true));
            let rbac_tcp = rbac::chain_rbac(on_service.iter().copied(), rbac_kind(false));
            let rule = rules.for_service(&key.namespace, &service.namespace, &service.hostname);
            let traffic = ChainTraffic::of(rule.and_then(|r| r.traffic_policy.as_ref()));
            let jwt_http = jwt_authn(target);
            let mut ports = Vec::new();
            for port in &service.ports {
                let policy =
                    rule.and_then(|r| port_policy(r.traffic_policy.as_ref(), port.service_port));
                let applied = rule
                    .zip(policy.as_ref())
                    .map(|(rule, policy)| AppliedPolicy {
                        policy,
                        rule: &rule.rule,
                    });
                let protocol = port_protocol(port.app_protocol);
                let name = |kind: &str| {
                    format!(
                        "inbound-vip|{}|{kind}|{}",
                        port.service_port, service.hostname
                    )
                };
                let (http, tcp) = (name("http"), name("tcp"));
                for (chain, is_http) in [(&http, true), (&tcp, false)] {
                    if (is_http && !protocol.has_http()) || (!is_http && !protocol.has_tcp()) {
                        continue;
                    }
                    let routes = (is_http && !route_index.is_empty())
                        .then(|| {
                            route_index.chain_routes(
                                service,
                                kubernetes,
                                port.service_port,
                                &mut destinations,
                            )
                        })
                        .flatten();
                    let spec = ChainSpec {
                        name: chain,
                        hostname: &service.hostname,
                        port: port.service_port,
                        protocol,
                        cluster: chain,
                        rbac: if is_http {
                            rbac_http.clone()
                        } else {
                            rbac_tcp.clone()
                        },
                        traffic: &traffic,
                        jwt: if is_http { jwt_http.clone() } else { None },
                        routes,
                    };
                    chains.push(if is_http {
                        chains::http_chain(spec, &settings)
                    } else {
                        chains::tcp_chain(spec, &settings)
                    });
                    clusters.push(clusters::inbound_vip(
                        chain,
                        &service.hostname,
                        &service.name,
                        &service.namespace,
                        protocol,
                        is_http,
                        applied,
                    ));
                    let source = EdsSource {
                        service: resource.name.clone(),
                        port: port.service_port,
                        target_port: port.target_port,
                        members: Arc::new([]),
                        outbound: false,
                    };
                    let (cla, source) = self.assignment(chain, source, keep);
                    let cluster = Name::from(chain.as_str());
                    endpoints.insert(cluster.clone(), cla);
                    service_clusters
                        .entry(resource.name.clone())
                        .or_default()
                        .push(cluster.clone());
                    eds.insert(cluster, source);
                }
                ports.push((port.service_port, protocol, http, tcp));
            }
            let vips = resource
                .links()
                .addresses
                .iter()
                .map(|(_, ip)| host_range(*ip))
                .collect();
            matches.push(ServiceMatch { vips, ports });
        }
        // The services routes send to that are not bound here (§3.3).
        for (name, out) in &destinations.outbound {
            clusters.push(clusters::outbound(
                name,
                &out.service.hostname,
                &out.service.name,
                &out.service.namespace,
                port_protocol(out.protocol as i32),
            ));
            let source = EdsSource {
                service: out.resource.name.clone(),
                port: out.port,
                target_port: out.target_port,
                members: Arc::new([]),
                outbound: true,
            };
            let (cla, source) = self.assignment(name, source, keep);
            let cluster = Name::from(name.as_str());
            endpoints.insert(cluster.clone(), cla);
            service_clusters
                .entry(out.resource.name.clone())
                .or_default()
                .push(cluster.clone());
            eds.insert(cluster, source);
        }
        let route_reads = std::mem::take(&mut destinations.reads);
        drop(destinations);
        clusters.push(clusters::connect_originate(
            &self.settings.trust_domain,
            &key.namespace,
        ));
        let on_waypoint = attached(Target::Waypoint);
        let direct = chains::direct_chains(
            &rbac::chain_rbac(on_waypoint.iter().copied(), rbac_kind(false)),
            &rbac::chain_rbac(on_waypoint.iter().copied(), rbac_kind(true)),
            jwt_authn(Target::Waypoint).as_ref(),
            &settings,
        );
        let workload_ips: Vec<CidrRange> = bound
            .workloads
            .iter()
            .flat_map(|(resource, _)| resource.links().addresses.iter())
            .map(|(_, ip)| host_range(*ip))
            .collect();
        let listeners = [
            listeners::connect_terminate(&settings),
            listeners::main_internal(chains, &matches, workload_ips, direct),
            listeners::connect_originate(),
        ];
        WaypointConfig {
            generation: snapshot.generation,
            listeners: listeners
                .iter()
                .map(|l| {
                    let name = Name::from(l.name.as_str());
                    (
                        name.clone(),
                        Arc::new(Resource::encode(ResourceType::Listener, name, l)),
                    )
                })
                .collect(),
            clusters: clusters
                .iter()
                .map(|c| {
                    let name = Name::from(c.name.as_str());
                    (
                        name.clone(),
                        Arc::new(Resource::encode(ResourceType::Cluster, name, c)),
                    )
                })
                .collect(),
            endpoints,
            bound: Arc::new(bound.names()),
            member_of: member_of(&eds),
            eds,
            service_clusters: service_clusters
                .into_iter()
                .map(|(service, clusters)| (service, clusters.into()))
                .collect(),
            policies: Some(policies),
            destination_rules: Some(destination_rules),
            authentications: Some(authentications),
            jwks: Some(snapshot.jwks.clone()),
            routes: Some(routes.clone()),
            route_reads: Arc::new(route_reads),
        }
    }

    /// One EDS cluster's load assignment: `keep`'s when it may be kept, else built.
    fn assignment(
        &self,
        cluster: &str,
        source: EdsSource,
        keep: Keep<'_>,
    ) -> (Arc<Resource>, EdsSource) {
        if let Some((before, refresh)) = keep
            && !refresh.contains(cluster)
            && let Some(old) = before.eds.get(cluster)
            && (&old.service, old.port, old.target_port, old.outbound)
                == (
                    &source.service,
                    source.port,
                    source.target_port,
                    source.outbound,
                )
            && let Some(resource) = before.endpoints.get(cluster)
        {
            return (resource.clone(), old.clone());
        }
        self.endpoints(cluster, source)
    }

    /// One EDS cluster's load assignment, and what it was built from.
    fn endpoints(&self, cluster: &str, mut source: EdsSource) -> (Arc<Resource>, EdsSource) {
        let members = members(self.snapshot, &source.service);
        source.members = members.iter().map(|(r, _)| r.name.clone()).collect();
        let cla = endpoints::load_assignment(
            cluster,
            &source.service,
            source.port,
            source.target_port,
            members.iter().map(|(_, w)| w),
            source.outbound,
        );
        let resource = Resource::encode(ResourceType::ClusterLoadAssignment, cluster, &cla);
        (Arc::new(resource), source)
    }
}

/// Workload -> the services whose EDS clusters it is in.
fn member_of(eds: &imbl::OrdMap<Name, EdsSource>) -> imbl::HashMap<Name, Arc<[Name]>> {
    let mut of: BTreeMap<Name, Vec<Name>> = BTreeMap::new();
    for source in eds.values() {
        for member in source.members.iter() {
            let services = of.entry(member.clone()).or_default();
            if !services.contains(&source.service) {
                services.push(source.service.clone());
            }
        }
    }
    of.into_iter().map(|(m, s)| (m, s.into())).collect()
}
