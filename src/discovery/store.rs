//! The stored inputs and the reverse indexes that builders and dependency tracking read.
//!
//! The store only holds objects and answers questions about them (which services select a
//! workload, which object wins a hostname, which waypoint a name refers to). It never builds
//! resources; the index does that.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;
use std::sync::Arc;

use foldhash::HashMap;

use crate::discovery::model::authorization::PolicyTargetRef;
use crate::discovery::model::network_gateway::NetworkGateway;
use crate::discovery::model::request_authentication::{Jwks, RequestAuthentication};
use crate::discovery::model::visibility::{ServiceEntryVisibility, Visibility};
use crate::discovery::model::waypoint::{GATEWAY_NAME_LABEL, Waypoint};
use crate::discovery::model::{
    AuthorizationPolicy, DestinationRule, EndpointSlice, Gateway, GatewayClass, Labels, Namespace,
    Node, Object, ObjectRef, PeerAuthentication, Pod, Route, Service, ServiceEntry, WorkloadEntry,
};
use crate::discovery::names::service_hostname;
use crate::discovery::settings::Settings;

mod pods;
mod small_set;
pub(crate) use pods::Pods;
pub(crate) use small_set::SmallSet;

use crate::discovery::model::{Key, NETWORK_LABEL, RouteKind};

/// An object that publishes Services: a Kubernetes Service, or a ServiceEntry (one per host).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ServiceRef {
    Kube(Key),
    Entry(Key),
}

/// What one namespace holds, by name (its pods are in [`Pods`]).
#[derive(Debug, Default)]
pub(crate) struct NamespaceMembers {
    pub(crate) services: BTreeSet<String>,
    pub(crate) slices: BTreeSet<String>,
    pub(crate) service_entries: BTreeSet<String>,
    pub(crate) workload_entries: BTreeSet<String>,
    pub(crate) policies: BTreeSet<String>,
    pub(crate) peer_authentications: BTreeSet<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Store {
    namespaces: HashMap<String, Namespace>,
    nodes: HashMap<String, Node>,
    pods: Pods,
    /// Boxed: a table slot is then a pointer, not a `Service`, and the table's empty slots
    /// (up to half of them after it grows) cost 8 bytes each, not 184.
    services: HashMap<Key, Box<Service>>,
    slices: HashMap<Key, EndpointSlice>,
    service_entries: HashMap<Key, ServiceEntry>,
    workload_entries: HashMap<Key, WorkloadEntry>,
    gateway_classes: HashMap<String, GatewayClass>,
    gateways: HashMap<Key, Gateway>,
    policies: HashMap<Key, AuthorizationPolicy>,
    peer_authentications: HashMap<Key, PeerAuthentication>,
    destination_rules: HashMap<Key, DestinationRule>,
    request_authentications: HashMap<Key, RequestAuthentication>,
    /// Key sets fetched for RequestAuthentications, by [`Jwks::name`].
    jwks: HashMap<String, Jwks>,
    /// HTTPRoutes and GRPCRoutes, read by waypoints only: the snapshot shares these `Arc`s.
    http_routes: HashMap<Key, Arc<Route>>,
    grpc_routes: HashMap<Key, Arc<Route>>,
    /// VirtualServices, as routes (`RouteKind::Virtual`).
    virtual_services: HashMap<Key, Arc<Route>>,
    /// Gateways that are ready waypoints (derived from Gateway + GatewayClass).
    waypoints: HashMap<Key, Waypoint>,
    members: HashMap<String, NamespaceMembers>,
    /// `(ns, service name)` -> slices labelled for it.
    slices_by_service: HashMap<Key, BTreeSet<String>>,
    /// Pod -> slices (which may live in another namespace) with an endpoint whose targetRef
    /// names it.
    slices_by_pod: HashMap<Key, BTreeSet<Key>>,
    /// Hostname -> `(namespace, object)` claiming it.
    hostnames: HashMap<String, SmallSet<(String, ServiceRef)>>,
    /// namespace -> label key -> value -> Services and ServiceEntries whose selector's first
    /// entry is that label: a workload finds the few candidates that may select it by its own
    /// labels instead of scanning every service in its namespace.
    selectors: HashMap<String, HashMap<String, HashMap<String, SmallSet<ServiceRef>>>>,
    /// meshConfig.serviceEntryVisibility (the index's settings); `None`: not configured.
    visibility: Option<Arc<ServiceEntryVisibility>>,
    /// Gateway `(namespace, name)` -> service account -> how many pods of that namespace
    /// labelled `gateway.networking.k8s.io/gateway-name: <name>` run as it (the waypoint's
    /// instances, whose identities the implicit waypoint policy allows).
    waypoint_accounts: HashMap<Key, BTreeMap<String, u32>>,
    /// Network -> its east-west gateways, by (Gateway, address).
    network_gateways: BTreeMap<String, BTreeMap<(Key, String), NetworkGateway>>,
    /// `(kind, namespace, name)` of a policy target -> the AuthorizationPolicies whose
    /// `targetRef(s)` name it (namespace empty for a GatewayClass).
    policy_targets: HashMap<(String, Key), BTreeSet<Key>>,
}

/// Read access to what the store holds. Writes go through [`Store::insert`],
/// [`Store::remove`] and the few methods below them that keep the reverse indexes true.
impl Store {
    pub(crate) fn namespaces(&self) -> &HashMap<String, Namespace> {
        &self.namespaces
    }

    pub(crate) fn nodes(&self) -> &HashMap<String, Node> {
        &self.nodes
    }

    pub(crate) fn pods(&self) -> &Pods {
        &self.pods
    }

    pub(crate) fn services(&self) -> &HashMap<Key, Box<Service>> {
        &self.services
    }

    pub(crate) fn slices(&self) -> &HashMap<Key, EndpointSlice> {
        &self.slices
    }

    pub(crate) fn service_entries(&self) -> &HashMap<Key, ServiceEntry> {
        &self.service_entries
    }

    pub(crate) fn workload_entries(&self) -> &HashMap<Key, WorkloadEntry> {
        &self.workload_entries
    }

    pub(crate) fn gateway_classes(&self) -> &HashMap<String, GatewayClass> {
        &self.gateway_classes
    }

    pub(crate) fn gateways(&self) -> &HashMap<Key, Gateway> {
        &self.gateways
    }

    pub(crate) fn policies(&self) -> &HashMap<Key, AuthorizationPolicy> {
        &self.policies
    }

    pub(crate) fn peer_authentications(&self) -> &HashMap<Key, PeerAuthentication> {
        &self.peer_authentications
    }

    pub(crate) fn destination_rules(&self) -> &HashMap<Key, DestinationRule> {
        &self.destination_rules
    }

    pub(crate) fn request_authentications(&self) -> &HashMap<Key, RequestAuthentication> {
        &self.request_authentications
    }

    pub(crate) fn jwks(&self) -> &HashMap<String, Jwks> {
        &self.jwks
    }

    /// HTTPRoutes, then GRPCRoutes, then VirtualServices.
    pub(crate) fn routes(&self) -> impl Iterator<Item = (&Key, &Arc<Route>)> {
        self.http_routes
            .iter()
            .chain(self.grpc_routes.iter())
            .chain(self.virtual_services.iter())
    }

    /// One HTTPRoute, GRPCRoute or VirtualService.
    pub(crate) fn route(&self, kind: RouteKind, key: &Key) -> Option<&Arc<Route>> {
        match kind {
            RouteKind::Http => self.http_routes.get(key),
            RouteKind::Grpc => self.grpc_routes.get(key),
            RouteKind::Virtual => self.virtual_services.get(key),
        }
    }

    pub(crate) fn waypoints(&self) -> &HashMap<Key, Waypoint> {
        &self.waypoints
    }

    pub(crate) fn namespace_members(&self) -> &HashMap<String, NamespaceMembers> {
        &self.members
    }

    pub(crate) fn slices_by_service(&self) -> &HashMap<Key, BTreeSet<String>> {
        &self.slices_by_service
    }

    pub(crate) fn slices_by_pod(&self) -> &HashMap<Key, BTreeSet<Key>> {
        &self.slices_by_pod
    }

    pub(crate) fn hostnames(&self) -> &HashMap<String, SmallSet<(String, ServiceRef)>> {
        &self.hostnames
    }

    pub(crate) fn visibility(&self) -> &Option<Arc<ServiceEntryVisibility>> {
        &self.visibility
    }
}

impl Store {
    /// meshConfig.serviceEntryVisibility changed (`None`: no longer configured).
    pub(crate) fn set_visibility(&mut self, visibility: Option<Arc<ServiceEntryVisibility>>) {
        self.visibility = visibility;
    }

    /// Re-derives the waypoint of Gateway `key` (from the Gateway, its class and the local
    /// `network`); returns whether it changed.
    pub(crate) fn refresh_waypoint(&mut self, key: &Key, network: &str) -> bool {
        let waypoint = self.gateways.get(key).and_then(|gw| {
            Waypoint::from_gateway(gw, self.gateway_classes.get(&gw.class_name), network)
        });
        if self.waypoints.get(key) == waypoint.as_ref() {
            return false;
        }
        match waypoint {
            Some(w) => self.waypoints.insert(key.clone(), w),
            None => self.waypoints.remove(key),
        };
        true
    }
}

/// How a policy's target is indexed: GatewayClasses are cluster-scoped.
fn target_key(policy: &AuthorizationPolicy, target: &PolicyTargetRef) -> (String, Key) {
    let namespace = match target.kind.as_str() {
        "GatewayClass" => "",
        _ if target.namespace.is_empty() => policy.namespace.as_str(),
        _ => target.namespace.as_str(),
    };
    (target.kind.clone(), key(namespace, &target.name))
}

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_string(), name.to_string())
}

impl Store {
    /// An empty store under meshConfig.serviceEntryVisibility (`None`: not configured).
    pub(crate) fn with_visibility(visibility: Option<Arc<ServiceEntryVisibility>>) -> Self {
        Store {
            visibility,
            ..Store::default()
        }
    }

    /// The local network: the system namespace's `topology.istio.io/network` label, or `""`.
    pub(crate) fn network(&self, settings: &Settings) -> &str {
        self.namespaces
            .get(&settings.system_namespace)
            .and_then(|ns| ns.labels.get(NETWORK_LABEL))
            .unwrap_or("")
    }

    pub(crate) fn namespace_labels(&self, namespace: &str) -> Option<&Labels> {
        self.namespaces.get(namespace).map(|n| &n.labels)
    }

    pub(crate) fn members(&self, namespace: &str) -> Option<&NamespaceMembers> {
        self.members.get(namespace)
    }

    /// ServiceEntries of one namespace, in name order.
    pub(crate) fn service_entries_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a ServiceEntry> + 'a {
        self.members(namespace)
            .into_iter()
            .flat_map(|m| m.service_entries.iter())
            .filter_map(move |name| self.service_entries.get(&key(namespace, name)))
    }

    pub(crate) fn pods_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Pod> + 'a {
        self.pods.in_namespace(namespace)
    }

    pub(crate) fn workload_entries_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a WorkloadEntry> + 'a {
        self.members(namespace)
            .into_iter()
            .flat_map(|m| m.workload_entries.iter())
            .filter_map(move |name| self.workload_entries.get(&key(namespace, name)))
    }

    /// AuthorizationPolicies of one namespace, in name order.
    pub(crate) fn policies_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a AuthorizationPolicy> + 'a {
        self.members(namespace)
            .into_iter()
            .flat_map(|m| m.policies.iter())
            .filter_map(move |name| self.policies.get(&key(namespace, name)))
    }

    /// PeerAuthentications of one namespace, in name order.
    pub(crate) fn peer_authentications_in<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a PeerAuthentication> + 'a {
        self.members(namespace)
            .into_iter()
            .flat_map(|m| m.peer_authentications.iter())
            .filter_map(move |name| self.peer_authentications.get(&key(namespace, name)))
    }

    /// Services and ServiceEntries of `namespace` whose selector may match `labels` (their
    /// first selector entry does); callers check the whole selector.
    pub(crate) fn selecting(&self, namespace: &str, labels: &Labels) -> BTreeSet<&ServiceRef> {
        let Some(by_key) = self.selectors.get(namespace) else {
            return BTreeSet::new();
        };
        labels
            .iter()
            .filter_map(|(k, v)| by_key.get(k)?.get(v))
            .flatten()
            .collect()
    }

    fn index_selector(&mut self, namespace: &str, selector: Option<&Labels>, service: ServiceRef) {
        let Some((k, v)) = selector.and_then(|s| s.iter().next()) else {
            return;
        };
        self.selectors
            .entry(namespace.to_string())
            .or_default()
            .entry(k.to_string())
            .or_default()
            .entry(v.to_string())
            .or_default()
            .insert(service);
    }

    fn unindex_selector(
        &mut self,
        namespace: &str,
        selector: Option<&Labels>,
        service: &ServiceRef,
    ) {
        let Some((k, v)) = selector.and_then(|s| s.iter().next()) else {
            return;
        };
        let Some(by_key) = self.selectors.get_mut(namespace) else {
            return;
        };
        if let Some(by_value) = by_key.get_mut(k) {
            if let Some(set) = by_value.get_mut(v) {
                set.remove(service);
                if set.is_empty() {
                    by_value.remove(v);
                }
            }
            if by_value.is_empty() {
                by_key.remove(k);
            }
        }
        if by_key.is_empty() {
            self.selectors.remove(namespace);
        }
    }

    /// The hostnames a service-publishing object claims.
    pub(crate) fn claimed_hostnames(
        &self,
        service: &ServiceRef,
        settings: &Settings,
    ) -> Vec<String> {
        match service {
            ServiceRef::Kube(k) => self
                .services
                .get(k)
                .filter(|s| !s.external_name)
                .map(|s| vec![service_hostname(&s.name, &s.namespace, &settings.domain)])
                .unwrap_or_default(),
            ServiceRef::Entry(k) => self
                .service_entries
                .get(k)
                .map(|se| se.hosts.clone())
                .unwrap_or_default(),
        }
    }

    /// The visibility of the ServiceEntries of `namespace` (meshConfig.serviceEntryVisibility,
    /// from the namespace's labels): `None` when the feature is not configured.
    pub(crate) fn entry_visibility(&self, namespace: &str) -> Option<Visibility> {
        let config = self.visibility.as_ref()?;
        Some(config.resolve(self.namespace_labels(namespace)))
    }

    /// The service accounts of a gateway's instance pods (its namespace's pods labelled with
    /// its name), sorted, one per pod as istiod lists them (two replicas, the account twice).
    pub(crate) fn waypoint_accounts(&self, gateway: &Key) -> impl Iterator<Item = &str> {
        self.waypoint_accounts
            .get(gateway)
            .into_iter()
            .flat_map(|accounts| accounts.iter())
            .flat_map(|(account, pods)| std::iter::repeat_n(account.as_str(), *pods as usize))
    }

    /// The AuthorizationPolicies whose `targetRef(s)` name the `kind` object `namespace/name`
    /// (namespace empty for a GatewayClass).
    pub(crate) fn policies_targeting(
        &self,
        kind: &str,
        target: &Key,
    ) -> impl Iterator<Item = &Key> {
        self.policy_targets
            .get(&(kind.to_string(), target.clone()))
            .into_iter()
            .flatten()
    }

    /// The AuthorizationPolicies that target a Service or ServiceEntry of `namespace`.
    pub(crate) fn policies_targeting_namespace<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        self.policy_targets
            .iter()
            .filter(move |((kind, (ns, _)), _)| {
                ns == namespace && (kind == "Service" || kind == "ServiceEntry")
            })
            .flat_map(|(_, policies)| policies)
    }

    /// The east-west gateways of `network`, by Gateway then address.
    pub(crate) fn network_gateways(&self, network: &str) -> impl Iterator<Item = &NetworkGateway> {
        self.network_gateways
            .get(network)
            .into_iter()
            .flat_map(BTreeMap::values)
    }

    /// Every east-west gateway, by network, Gateway and address.
    pub(crate) fn all_network_gateways(&self) -> impl Iterator<Item = &NetworkGateway> {
        self.network_gateways.values().flat_map(BTreeMap::values)
    }

    /// Whether the entries of `namespace` may be seen only there: NAMESPACE visibility.
    pub(crate) fn entries_namespace_local(&self, namespace: &str) -> bool {
        self.entry_visibility(namespace) == Some(Visibility::Namespace)
    }

    /// Which object publishes `namespace/hostname`: a Kubernetes Service always wins; otherwise
    /// the oldest ServiceEntry (creation time, then name). Losers publish nothing. A
    /// ServiceEntry of visibility NONE publishes nothing and takes no part.
    pub(crate) fn slot_winner(&self, namespace: &str, hostname: &str) -> Option<ServiceRef> {
        let claimants = self.hostnames.get(hostname)?;
        let hidden = self.entry_visibility(namespace) == Some(Visibility::None);
        claimants
            .iter()
            .filter(|(ns, _)| ns == namespace)
            .map(|(_, r)| r)
            .filter(|r| !(hidden && matches!(r, ServiceRef::Entry(_))))
            .min_by_key(|r| self.precedence(r))
            .cloned()
    }

    /// Whether the winner of `namespace/hostname` is the canonical one across namespaces: the
    /// Kubernetes Service if there is one, else the oldest ServiceEntry winner of PUBLIC
    /// visibility (a NAMESPACE one never is).
    pub(crate) fn is_canonical(&self, namespace: &str, hostname: &str) -> bool {
        let Some(claimants) = self.hostnames.get(hostname) else {
            return false;
        };
        let namespaces: BTreeSet<&String> = claimants.iter().map(|(ns, _)| ns).collect();
        let best = namespaces
            .into_iter()
            .filter_map(|ns| self.slot_winner(ns, hostname).map(|w| (ns, w)))
            .filter(|(ns, w)| {
                !(matches!(w, ServiceRef::Entry(_)) && self.entries_namespace_local(ns))
            })
            .min_by_key(|(ns, w)| (self.precedence(w), (*ns).clone()));
        best.is_some_and(|(ns, _)| ns == namespace)
    }

    /// Lower sorts first: Kubernetes Services, then ServiceEntries by age, then name.
    fn precedence(&self, service: &ServiceRef) -> (u8, String, String) {
        match service {
            ServiceRef::Kube(k) => (0, String::new(), k.1.clone()),
            ServiceRef::Entry(k) => {
                let created = self
                    .service_entries
                    .get(k)
                    .map(|se| se.created.clone())
                    .unwrap_or_default();
                // An unknown creation time sorts last, as "newest".
                let created = if created.is_empty() {
                    "~".to_string()
                } else {
                    created
                };
                (1, created, k.1.clone())
            }
        }
    }

    /// Stores an object, keeping every reverse index in step. Returns the previous value.
    pub(crate) fn insert(&mut self, object: Object, settings: &Settings) -> Option<Object> {
        let reference = object.object_ref();
        let old = self.remove(&reference, settings);
        let k = key(&reference.namespace, &reference.name);
        match object {
            Object::Namespace(n) => {
                self.namespaces.insert(n.name.clone(), n);
            }
            Object::Node(n) => {
                self.nodes.insert(n.name.clone(), n);
            }
            Object::GatewayClass(c) => {
                self.gateway_classes.insert(c.name.clone(), c);
            }
            Object::Gateway(g) => {
                for gateway in NetworkGateway::from_gateway(&g) {
                    self.network_gateways
                        .entry(gateway.network.clone())
                        .or_default()
                        .insert((k.clone(), gateway.address.clone()), gateway);
                }
                self.gateways.insert(k, g);
            }
            Object::Pod(p) => {
                // The namespace is listed among those with members (a root-namespace policy
                // reaches every one of them).
                self.member_mut(&k.0);
                if let Some(gateway) = p.labels().get(GATEWAY_NAME_LABEL) {
                    *self
                        .waypoint_accounts
                        .entry(key(&k.0, gateway))
                        .or_default()
                        .entry(p.service_account().to_string())
                        .or_default() += 1;
                }
                self.pods.insert(p);
            }
            Object::Service(s) => {
                self.member_mut(&k.0).services.insert(k.1.clone());
                let service = ServiceRef::Kube(k.clone());
                self.index_selector(&k.0, Some(&s.selector), service.clone());
                self.services.insert(k.clone(), Box::new(s));
                for host in self.claimed_hostnames(&service, settings) {
                    self.hostnames
                        .entry(host)
                        .or_default()
                        .insert((k.0.clone(), service.clone()));
                }
            }
            Object::ServiceEntry(se) => {
                self.member_mut(&k.0).service_entries.insert(k.1.clone());
                self.index_selector(
                    &k.0,
                    se.workload_selector.as_ref(),
                    ServiceRef::Entry(k.clone()),
                );
                for host in &se.hosts {
                    self.hostnames
                        .entry(host.clone())
                        .or_default()
                        .insert((k.0.clone(), ServiceRef::Entry(k.clone())));
                }
                self.service_entries.insert(k, se);
            }
            Object::WorkloadEntry(we) => {
                self.member_mut(&k.0).workload_entries.insert(k.1.clone());
                self.workload_entries.insert(k, we);
            }
            Object::AuthorizationPolicy(p) => {
                self.member_mut(&k.0).policies.insert(k.1.clone());
                for target in &p.target_refs {
                    self.policy_targets
                        .entry(target_key(&p, target))
                        .or_default()
                        .insert(k.clone());
                }
                self.policies.insert(k, p);
            }
            Object::PeerAuthentication(p) => {
                self.member_mut(&k.0)
                    .peer_authentications
                    .insert(k.1.clone());
                self.peer_authentications.insert(k, p);
            }
            Object::DestinationRule(r) => {
                self.destination_rules.insert(k, r);
            }
            Object::RequestAuthentication(ra) => {
                self.request_authentications.insert(k, ra);
            }
            Object::Jwks(jwks) => {
                self.jwks.insert(jwks.name.clone(), jwks);
            }
            Object::HttpRoute(r) => {
                self.http_routes.insert(k, Arc::new(r));
            }
            Object::GrpcRoute(r) => {
                self.grpc_routes.insert(k, Arc::new(r));
            }
            Object::VirtualService(r) => {
                self.virtual_services.insert(k, Arc::new(r));
            }
            Object::EndpointSlice(slice) => {
                self.member_mut(&k.0).slices.insert(k.1.clone());
                if let Some(service) = &slice.service_name {
                    self.slices_by_service
                        .entry(key(&k.0, service))
                        .or_default()
                        .insert(k.1.clone());
                }
                for pod in slice_pods(&slice) {
                    self.slices_by_pod.entry(pod).or_default().insert(k.clone());
                }
                self.slices.insert(k, slice);
            }
        }
        old
    }

    /// Removes an object and its reverse-index entries. Returns it.
    pub(crate) fn remove(&mut self, reference: &ObjectRef, settings: &Settings) -> Option<Object> {
        use crate::discovery::model::Kind;
        let k = key(&reference.namespace, &reference.name);
        match reference.kind {
            Kind::Namespace => self
                .namespaces
                .remove(&reference.name)
                .map(Object::Namespace),
            Kind::Node => self.nodes.remove(&reference.name).map(Object::Node),
            Kind::GatewayClass => self
                .gateway_classes
                .remove(&reference.name)
                .map(Object::GatewayClass),
            Kind::Gateway => {
                let gw = self.gateways.remove(&k)?;
                for gateway in NetworkGateway::from_gateway(&gw) {
                    if let Some(on_network) = self.network_gateways.get_mut(&gateway.network) {
                        on_network.remove(&(k.clone(), gateway.address));
                        if on_network.is_empty() {
                            self.network_gateways.remove(&gateway.network);
                        }
                    }
                }
                Some(Object::Gateway(gw))
            }
            Kind::Pod => {
                let pod = self.pods.remove(&k.0, &k.1)?;
                if let Some(gateway) = pod.labels().get(GATEWAY_NAME_LABEL) {
                    let gateway = key(&k.0, gateway);
                    if let Some(accounts) = self.waypoint_accounts.get_mut(&gateway) {
                        if let Some(count) = accounts.get_mut(pod.service_account()) {
                            *count -= 1;
                            if *count == 0 {
                                accounts.remove(pod.service_account());
                            }
                        }
                        if accounts.is_empty() {
                            self.waypoint_accounts.remove(&gateway);
                        }
                    }
                }
                Some(Object::Pod(pod))
            }
            Kind::Service => {
                let service = ServiceRef::Kube(k.clone());
                let hosts = self.claimed_hostnames(&service, settings);
                let svc = self.services.remove(&k)?;
                self.member_mut(&k.0).services.remove(&k.1);
                self.unindex_selector(&k.0, Some(&svc.selector), &service);
                for host in hosts {
                    self.unclaim(&host, &k.0, &service);
                }
                Some(Object::Service(*svc))
            }
            Kind::ServiceEntry => {
                let se = self.service_entries.remove(&k)?;
                self.member_mut(&k.0).service_entries.remove(&k.1);
                let service = ServiceRef::Entry(k.clone());
                self.unindex_selector(&k.0, se.workload_selector.as_ref(), &service);
                for host in &se.hosts {
                    self.unclaim(host, &k.0, &service);
                }
                Some(Object::ServiceEntry(se))
            }
            Kind::WorkloadEntry => {
                let we = self.workload_entries.remove(&k)?;
                self.member_mut(&k.0).workload_entries.remove(&k.1);
                Some(Object::WorkloadEntry(we))
            }
            Kind::AuthorizationPolicy => {
                let p = self.policies.remove(&k)?;
                self.member_mut(&k.0).policies.remove(&k.1);
                for target in &p.target_refs {
                    let indexed = target_key(&p, target);
                    if let Some(policies) = self.policy_targets.get_mut(&indexed) {
                        policies.remove(&k);
                        if policies.is_empty() {
                            self.policy_targets.remove(&indexed);
                        }
                    }
                }
                Some(Object::AuthorizationPolicy(p))
            }
            Kind::PeerAuthentication => {
                let p = self.peer_authentications.remove(&k)?;
                self.member_mut(&k.0).peer_authentications.remove(&k.1);
                Some(Object::PeerAuthentication(p))
            }
            Kind::DestinationRule => self
                .destination_rules
                .remove(&k)
                .map(Object::DestinationRule),
            Kind::RequestAuthentication => self
                .request_authentications
                .remove(&k)
                .map(Object::RequestAuthentication),
            Kind::Jwks => self.jwks.remove(&reference.name).map(Object::Jwks),
            Kind::HttpRoute => self
                .http_routes
                .remove(&k)
                .map(|r| Object::HttpRoute(Arc::unwrap_or_clone(r))),
            Kind::GrpcRoute => self
                .grpc_routes
                .remove(&k)
                .map(|r| Object::GrpcRoute(Arc::unwrap_or_clone(r))),
            Kind::VirtualService => self
                .virtual_services
                .remove(&k)
                .map(|r| Object::VirtualService(Arc::unwrap_or_clone(r))),
            Kind::EndpointSlice => {
                let slice = self.slices.remove(&k)?;
                self.member_mut(&k.0).slices.remove(&k.1);
                if let Some(service) = &slice.service_name
                    && let Some(names) = self.slices_by_service.get_mut(&key(&k.0, service))
                {
                    names.remove(&k.1);
                }
                for pod in slice_pods(&slice) {
                    if let Some(slices) = self.slices_by_pod.get_mut(&pod) {
                        slices.remove(&k);
                        if slices.is_empty() {
                            self.slices_by_pod.remove(&pod);
                        }
                    }
                }
                Some(Object::EndpointSlice(slice))
            }
        }
    }

    fn unclaim(&mut self, host: &str, namespace: &str, service: &ServiceRef) {
        if let Some(claimants) = self.hostnames.get_mut(host) {
            claimants.remove(&(namespace.to_string(), service.clone()));
            if claimants.is_empty() {
                self.hostnames.remove(host);
            }
        }
    }

    fn member_mut(&mut self, namespace: &str) -> &mut NamespaceMembers {
        self.members.entry(namespace.to_string()).or_default()
    }

    /// Whether the stored object equals `object`.
    pub(crate) fn holds(&self, object: &Object) -> bool {
        let r = object.object_ref();
        let k = key(&r.namespace, &r.name);
        match object {
            Object::Namespace(o) => self.namespaces.get(&o.name) == Some(o),
            Object::Node(o) => self.nodes.get(&o.name) == Some(o),
            Object::GatewayClass(o) => self.gateway_classes.get(&o.name) == Some(o),
            Object::Gateway(o) => self.gateways.get(&k) == Some(o),
            Object::Pod(o) => self.pods.get(&k.0, &k.1) == Some(o),
            Object::Service(o) => self.services.get(&k).is_some_and(|s| **s == *o),
            Object::ServiceEntry(o) => self.service_entries.get(&k) == Some(o),
            Object::WorkloadEntry(o) => self.workload_entries.get(&k) == Some(o),
            Object::EndpointSlice(o) => self.slices.get(&k) == Some(o),
            Object::AuthorizationPolicy(o) => self.policies.get(&k) == Some(o),
            Object::PeerAuthentication(o) => self.peer_authentications.get(&k) == Some(o),
            Object::DestinationRule(o) => self.destination_rules.get(&k) == Some(o),
            Object::RequestAuthentication(o) => self.request_authentications.get(&k) == Some(o),
            Object::Jwks(o) => self.jwks.get(&o.name) == Some(o),
            Object::HttpRoute(o) => self.http_routes.get(&k).is_some_and(|r| **r == *o),
            Object::GrpcRoute(o) => self.grpc_routes.get(&k).is_some_and(|r| **r == *o),
            Object::VirtualService(o) => self.virtual_services.get(&k).is_some_and(|r| **r == *o),
        }
    }

    /// How many objects of one kind are stored.
    pub(crate) fn count(&self, kind: crate::discovery::model::Kind) -> usize {
        use crate::discovery::model::Kind;
        match kind {
            Kind::Namespace => self.namespaces.len(),
            Kind::Node => self.nodes.len(),
            Kind::GatewayClass => self.gateway_classes.len(),
            Kind::Gateway => self.gateways.len(),
            Kind::Pod => self.pods.len(),
            Kind::Service => self.services.len(),
            Kind::ServiceEntry => self.service_entries.len(),
            Kind::WorkloadEntry => self.workload_entries.len(),
            Kind::EndpointSlice => self.slices.len(),
            Kind::AuthorizationPolicy => self.policies.len(),
            Kind::PeerAuthentication => self.peer_authentications.len(),
            Kind::DestinationRule => self.destination_rules.len(),
            Kind::RequestAuthentication => self.request_authentications.len(),
            Kind::Jwks => self.jwks.len(),
            Kind::HttpRoute => self.http_routes.len(),
            Kind::GrpcRoute => self.grpc_routes.len(),
            Kind::VirtualService => self.virtual_services.len(),
        }
    }

    /// References to every stored object of one kind.
    pub(crate) fn refs(&self, kind: crate::discovery::model::Kind) -> Vec<ObjectRef> {
        use crate::discovery::model::Kind;
        fn keyed<V>(kind: Kind, map: &HashMap<Key, V>) -> Vec<ObjectRef> {
            map.keys()
                .map(|(ns, n)| ObjectRef::new(kind, ns, n))
                .collect()
        }
        fn named<V>(kind: Kind, map: &HashMap<String, V>) -> Vec<ObjectRef> {
            map.keys().map(|n| ObjectRef::new(kind, "", n)).collect()
        }
        match kind {
            Kind::Namespace => named(kind, &self.namespaces),
            Kind::Node => named(kind, &self.nodes),
            Kind::GatewayClass => named(kind, &self.gateway_classes),
            Kind::Gateway => keyed(kind, &self.gateways),
            Kind::Pod => self
                .pods
                .iter()
                .map(|p| ObjectRef::new(kind, p.namespace(), p.name()))
                .collect(),
            Kind::Service => keyed(kind, &self.services),
            Kind::ServiceEntry => keyed(kind, &self.service_entries),
            Kind::WorkloadEntry => keyed(kind, &self.workload_entries),
            Kind::EndpointSlice => keyed(kind, &self.slices),
            Kind::AuthorizationPolicy => keyed(kind, &self.policies),
            Kind::PeerAuthentication => keyed(kind, &self.peer_authentications),
            Kind::DestinationRule => keyed(kind, &self.destination_rules),
            Kind::RequestAuthentication => keyed(kind, &self.request_authentications),
            Kind::Jwks => named(kind, &self.jwks),
            Kind::HttpRoute => keyed(kind, &self.http_routes),
            Kind::GrpcRoute => keyed(kind, &self.grpc_routes),
            Kind::VirtualService => keyed(kind, &self.virtual_services),
        }
    }
}

/// Pods named by a slice's endpoint targetRefs.
pub(crate) fn slice_pods(slice: &EndpointSlice) -> Vec<Key> {
    slice
        .endpoints
        .iter()
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|t| t.kind == "Pod")
        .map(|t| key(&t.namespace, &t.name))
        .collect()
}
