//! The index: stored objects, their dependants, and the encoded resources built from them.
//!
//! Every mutation works the same way: find the resources the change can affect (its
//! dependants, computed against the state before and after), store the new object, rebuild
//! exactly those resources, and record a change only for those whose bytes differ from before.
//! Waypoint dependencies are recorded as builders read them, so a waypoint change re-evaluates
//! exactly the objects that looked it up. A relist ([`Index::reset`]) is the truth: objects
//! missing from it are deleted, whatever deletes were missed.

use std::borrow::Borrow;
use std::collections::BTreeSet;
use std::hash::Hash;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt, HashSet};

use crate::discovery::model::Key;
use crate::discovery::model::authorization::{AuthorizationPolicy, REVISION_LABEL};
use crate::discovery::model::destination_rule::DestinationRule;
use crate::discovery::model::request_authentication::{Jwks, RequestAuthentication};
use crate::discovery::model::route::{Route, RouteKind};
use crate::discovery::model::status::PolicyStatus;
use crate::discovery::model::status::{DesiredStatus, StatusKind, StatusTarget};
use crate::discovery::model::visibility::ServiceEntryVisibility;
use crate::discovery::model::{Event, Kind, Object, ObjectRef};
use crate::discovery::names::{TypeKind, pod_uid};
use crate::discovery::snapshot::address_index::aliases_of;
use crate::discovery::snapshot::address_index::{Aliases, Networks};
use crate::discovery::snapshot::links::Links;
use crate::discovery::snapshot::{
    Changes, HISTORY, MIN_HISTORY_NAMES, Name, NameSet, PersistentMap, Resource, ResourceMap,
    Snapshot,
};
use crate::discovery::store::Store;

mod build;
mod dependants;

pub(crate) use crate::discovery::settings::Settings;

/// A unit of rebuilding: one object and every resource it produces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Target {
    KubeService(Key),
    EntryServices(Key),
    Pod(Key),
    WorkloadEntry(Key),
    EntryWorkloads(Key),
    Slice(Key),
    Policy(Key),
    PeerAuthentication(Key),
    StaticStrict,
    /// A waypoint's implicit ALLOW policy (`auto_allow_waypoint_policy`).
    WaypointPolicy(Key),
    /// The Workloads of every east-west gateway (`NetworkGateway/<net>/<addr>/<port>`): one
    /// target, since two Gateways may describe the same address.
    NetworkGateways,
}

/// Applies events and keeps every resource built and encoded. One owner; readers get snapshots.
#[derive(Debug)]
pub struct Index {
    settings: Settings,
    store: Store,
    addresses: ResourceMap,
    authorizations: ResourceMap,
    aliases: Aliases,
    /// The networks the alias keys refer to.
    networks: Networks,
    members: PersistentMap<Name, NameSet>,
    by_node: PersistentMap<Name, NameSet>,
    by_waypoint: PersistentMap<Name, NameSet>,
    /// AuthorizationPolicies with `targetRef(s)` (waypoint policies), rebuilt from the store
    /// when a policy changed since the last snapshot (`waypoint_policies_stale`).
    waypoint_policies: Arc<[Arc<AuthorizationPolicy>]>,
    waypoint_policies_stale: bool,
    /// Every DestinationRule (of this revision), oldest first, rebuilt from the store when
    /// one changed since the last snapshot (`destination_rules_stale`). Only waypoints read
    /// them; they produce no ztunnel resource.
    destination_rules: Arc<[Arc<DestinationRule>]>,
    destination_rules_stale: bool,
    /// RequestAuthentications with `targetRef(s)` and the fetched key sets, kept the same
    /// way (`waypoint_authentication_stale`).
    waypoint_authentications: Arc<[Arc<RequestAuthentication>]>,
    jwks: Arc<[Arc<Jwks>]>,
    waypoint_authentication_stale: bool,
    /// HTTPRoutes and GRPCRoutes, by kind and key, rebuilt (sharing the store's `Arc`s) when
    /// a route changed since the last snapshot. A route builds no resource here: waypoints
    /// translate it, and tell a change by the slice's pointer.
    routes: Arc<[Arc<Route>]>,
    routes_stale: bool,
    /// Resource names each target produced last time, sorted (most targets produce one: a
    /// boxed slice, where a `BTreeSet` would allocate a node of eleven). Pods have no entry
    /// here nor in `owners`: a pod's only resource is named from its key.
    produced: HashMap<Target, Box<[(TypeKind, Name)]>>,
    /// The target that produced each resource name.
    owners: HashMap<(TypeKind, Name), Target>,
    /// `ZtunnelAccepted` status of each AuthorizationPolicy, by `ns/name`.
    policy_status: PersistentMap<String, PolicyStatus>,
    /// What ambientd wants on each object of a kind it writes a condition on.
    statuses: PersistentMap<StatusTarget, DesiredStatus>,
    /// Waypoint -> targets that looked it up, and the reverse.
    waypoint_readers: HashMap<Key, HashSet<Target>>,
    target_reads: HashMap<Target, Vec<Key>>,
    generation: u64,
    history: imbl::Vector<(u64, Arc<Changes>)>,
    /// Names the history holds, over all its entries ([`Changes::len`]).
    history_names: usize,
    unpublished: Changes,
    /// The unpublished changes outgrew the history budget and were dropped: the next
    /// snapshot leaves no history (the initial build of a big mesh never holds every name).
    unpublished_overflow: bool,
    service_count: usize,
}

impl Index {
    pub fn new(settings: Settings) -> Self {
        Index {
            store: Store::with_visibility(settings.service_entry_visibility.clone()),
            settings,
            addresses: ResourceMap::default(),
            authorizations: ResourceMap::default(),
            aliases: Aliases::default(),
            networks: Networks::default(),
            members: PersistentMap::default(),
            by_node: PersistentMap::default(),
            by_waypoint: PersistentMap::default(),
            waypoint_policies: Arc::new([]),
            waypoint_policies_stale: false,
            destination_rules: Arc::new([]),
            destination_rules_stale: false,
            waypoint_authentications: Arc::new([]),
            jwks: Arc::new([]),
            waypoint_authentication_stale: false,
            routes: Arc::new([]),
            routes_stale: false,
            produced: HashMap::new(),
            owners: HashMap::new(),
            policy_status: PersistentMap::default(),
            statuses: PersistentMap::default(),
            waypoint_readers: HashMap::new(),
            target_reads: HashMap::new(),
            generation: 0,
            history: imbl::Vector::new(),
            history_names: 0,
            unpublished: Changes::default(),
            unpublished_overflow: false,
            service_count: 0,
        }
    }

    /// The stored objects.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The objects of `kind` the index holds, in no particular order.
    pub fn refs(&self, kind: Kind) -> Vec<ObjectRef> {
        self.store.refs(kind)
    }

    /// Applies one source event. `Synced` changes nothing here; the caller uses it for readiness.
    pub fn handle(&mut self, event: Event) -> Changes {
        match event {
            Event::Apply(object) => self.apply(object),
            Event::Delete(object) => self.delete(&object),
            Event::Reset(kind, objects) => self.reset(kind, objects),
            Event::Synced => Changes::default(),
            Event::Visibility(visibility) => self.set_visibility(visibility),
        }
    }

    /// Applies a new meshConfig.serviceEntryVisibility at runtime: every target is rebuilt
    /// under it, and, as for any change, only resources whose bytes differ (and conditions
    /// that differ) are reported.
    pub(crate) fn set_visibility(
        &mut self,
        visibility: Option<Arc<ServiceEntryVisibility>>,
    ) -> Changes {
        if self.settings.service_entry_visibility == visibility {
            return Changes::default();
        }
        self.settings.service_entry_visibility = visibility.clone();
        self.store.set_visibility(visibility);
        let targets: BTreeSet<Target> = self.all_targets().into_iter().collect();
        self.rebuild(targets)
    }

    /// Creates or replaces one object. An Istio config object of another revision counts as
    /// absent.
    pub fn apply(&mut self, object: Object) -> Changes {
        if !self.accepted(&object) {
            return self.delete(&object.object_ref());
        }
        if self.store.holds(&object) {
            return Changes::default();
        }
        let reference = object.object_ref();
        self.note_waypoint_input(reference.kind);
        let mut targets = BTreeSet::new();
        if let Some(old) = self.stored(&reference) {
            self.dependants(&old, &mut targets);
        }
        let network_before = self.store.network(&self.settings).to_string();
        // The new object's dependants do not depend on it being stored yet, so it can be moved
        // into the store without a copy.
        self.dependants(&object, &mut targets);
        self.store.insert(object, &self.settings);
        self.after_change(&reference, &network_before, &mut targets);
        self.rebuild(targets)
    }

    /// Removes one object, if present.
    pub fn delete(&mut self, reference: &ObjectRef) -> Changes {
        let Some(old) = self.stored(reference) else {
            return Changes::default();
        };
        self.note_waypoint_input(reference.kind);
        let mut targets = BTreeSet::new();
        self.dependants(&old, &mut targets);
        let network_before = self.store.network(&self.settings).to_string();
        self.store.remove(reference, &self.settings);
        self.dependants(&old, &mut targets);
        self.after_change(reference, &network_before, &mut targets);
        self.rebuild(targets)
    }

    /// Replaces every object of `kind` with `objects`: the relist is the truth.
    pub fn reset(&mut self, kind: Kind, objects: Vec<Object>) -> Changes {
        let stale: Vec<ObjectRef> = if self.store.count(kind) == 0 {
            Vec::new()
        } else {
            let keep: std::collections::HashSet<ObjectRef> =
                objects.iter().map(Object::object_ref).collect();
            self.store
                .refs(kind)
                .into_iter()
                .filter(|r| !keep.contains(r))
                .collect()
        };
        let mut changes = Changes::default();
        for object in &stale {
            changes.merge(&self.delete(object));
        }
        for object in objects.into_iter().filter(|o| o.kind() == kind) {
            changes.merge(&self.apply(object));
        }
        changes
    }

    /// Publishes what changed since the last call as a new immutable snapshot.
    pub fn snapshot(&mut self) -> Arc<Snapshot> {
        if std::mem::take(&mut self.waypoint_policies_stale) {
            let mut policies: Vec<(&Key, &AuthorizationPolicy)> = self
                .store
                .policies()
                .iter()
                .filter(|(_, p)| p.has_target_refs)
                .collect();
            policies.sort_by(|a, b| a.0.cmp(b.0));
            let policies: Vec<&AuthorizationPolicy> =
                policies.into_iter().map(|(_, p)| p).collect();
            if !same_items(&self.waypoint_policies, &policies) {
                self.waypoint_policies =
                    policies.into_iter().map(|p| Arc::new(p.clone())).collect();
            }
        }
        if std::mem::take(&mut self.waypoint_authentication_stale) {
            self.refresh_waypoint_authentication();
        }
        if std::mem::take(&mut self.destination_rules_stale) {
            let mut rules: Vec<&DestinationRule> =
                self.store.destination_rules().values().collect();
            rules.sort_by(|a, b| a.age_order(b));
            self.destination_rules = rules.into_iter().map(|r| Arc::new(r.clone())).collect();
        }
        if std::mem::take(&mut self.routes_stale) {
            let mut routes: Vec<(Kind, &Key, &Arc<Route>)> = self
                .store
                .routes()
                .map(|(k, r)| (route_kind(r), k, r))
                .collect();
            routes.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            self.routes = routes.into_iter().map(|(_, _, r)| r.clone()).collect();
        }
        let changes = std::mem::take(&mut self.unpublished);
        self.generation += 1;
        if std::mem::take(&mut self.unpublished_overflow) {
            // What changed is not known by name: no client behind this can catch up by names.
            self.history.clear();
            self.history_names = 0;
        } else {
            self.history_names += changes.len();
            self.history.push_back((self.generation, Arc::new(changes)));
        }
        // At most HISTORY entries, and at most a budget of names: a change as large as the
        // initial build (every name) would otherwise stay in memory until HISTORY more
        // snapshots push it out, and a client that far behind is served as well by comparing
        // snapshots. When even the newest entry is over the budget, the history is empty and
        // every client behind this generation compares.
        let budget = history_budget(self.addresses.len() + self.authorizations.len());
        while self.history.len() > HISTORY || self.history_names > budget {
            let Some((_, dropped)) = self.history.pop_front() else {
                break;
            };
            self.history_names -= dropped.len();
        }
        Arc::new(Snapshot {
            generation: self.generation,
            addresses: self.addresses.clone(),
            authorizations: self.authorizations.clone(),
            aliases: self.aliases.clone(),
            networks: self.networks.clone(),
            members: self.members.clone(),
            by_node: self.by_node.clone(),
            by_waypoint: self.by_waypoint.clone(),
            waypoint_policies: self.waypoint_policies.clone(),
            destination_rules: self.destination_rules.clone(),
            waypoint_authentications: self.waypoint_authentications.clone(),
            jwks: self.jwks.clone(),
            routes: self.routes.clone(),
            history: self.history.clone(),
            policy_status: self.policy_status.clone(),
            statuses: self.statuses.clone(),
            published_at: None,
            flat: Default::default(),
            diffs: Default::default(),
        })
    }

    /// How many Service resources (Kubernetes Services and ServiceEntry hosts) are served.
    pub(crate) fn service_count(&self) -> usize {
        self.service_count
    }

    /// Whether there are changes not yet published. A waypoint input (a policy, a
    /// RequestAuthentication, a key set) counts even when no ztunnel resource or status
    /// changed with it: waypoints read it from the next snapshot.
    pub(crate) fn has_unpublished(&self) -> bool {
        // Waypoint inputs (policies, DestinationRules, RequestAuthentications, key sets,
        // routes) may change no resource of the index, only what waypoints build.
        self.unpublished_overflow
            || !self.unpublished.is_empty()
            || self.waypoint_policies_stale
            || self.destination_rules_stale
            || self.waypoint_authentication_stale
            || self.routes_stale
    }

    /// Marks what waypoints read from the snapshot as stale when an object of `kind` changes.
    fn note_waypoint_input(&mut self, kind: Kind) {
        match kind {
            Kind::AuthorizationPolicy => self.waypoint_policies_stale = true,
            Kind::DestinationRule => self.destination_rules_stale = true,
            Kind::RequestAuthentication | Kind::Jwks => self.waypoint_authentication_stale = true,
            kind if is_route(kind) => self.routes_stale = true,
            _ => {}
        }
    }

    /// Rebuilds the snapshot's RequestAuthentications with `targetRef(s)` (oldest first, as
    /// istiod lists them) and key sets (by name), each shared again only if it changed.
    fn refresh_waypoint_authentication(&mut self) {
        let mut authentications: Vec<&RequestAuthentication> = self
            .store
            .request_authentications()
            .values()
            .filter(|ra| !ra.target_refs.is_empty())
            .collect();
        authentications.sort_by(|a, b| {
            (a.creation.is_none(), &a.creation, &a.namespace, &a.name).cmp(&(
                b.creation.is_none(),
                &b.creation,
                &b.namespace,
                &b.name,
            ))
        });
        if !same_items(&self.waypoint_authentications, &authentications) {
            self.waypoint_authentications = authentications
                .into_iter()
                .map(|ra| Arc::new(ra.clone()))
                .collect();
        }
        let mut jwks: Vec<&Jwks> = self.store.jwks().values().collect();
        jwks.sort_by(|a, b| a.name.cmp(&b.name));
        if !same_items(&self.jwks, &jwks) {
            self.jwks = jwks.into_iter().map(|j| Arc::new(j.clone())).collect();
        }
    }

    /// A copy of the stored object a reference names.
    fn stored(&self, r: &ObjectRef) -> Option<Object> {
        let k = (r.namespace.clone(), r.name.clone());
        let s = &self.store;
        match r.kind {
            Kind::Namespace => s.namespaces().get(&r.name).cloned().map(Object::Namespace),
            Kind::Node => s.nodes().get(&r.name).cloned().map(Object::Node),
            Kind::GatewayClass => s
                .gateway_classes()
                .get(&r.name)
                .cloned()
                .map(Object::GatewayClass),
            Kind::Gateway => s.gateways().get(&k).cloned().map(Object::Gateway),
            Kind::Pod => s.pods().get(&k.0, &k.1).cloned().map(Object::Pod),
            Kind::Service => s.services().get(&k).map(|s| Object::Service((**s).clone())),
            Kind::ServiceEntry => s
                .service_entries()
                .get(&k)
                .cloned()
                .map(Object::ServiceEntry),
            Kind::WorkloadEntry => s
                .workload_entries()
                .get(&k)
                .cloned()
                .map(Object::WorkloadEntry),
            Kind::EndpointSlice => s.slices().get(&k).cloned().map(Object::EndpointSlice),
            Kind::AuthorizationPolicy => s
                .policies()
                .get(&k)
                .cloned()
                .map(Object::AuthorizationPolicy),
            Kind::PeerAuthentication => s
                .peer_authentications()
                .get(&k)
                .cloned()
                .map(Object::PeerAuthentication),
            Kind::DestinationRule => s
                .destination_rules()
                .get(&k)
                .cloned()
                .map(Object::DestinationRule),
            Kind::RequestAuthentication => s
                .request_authentications()
                .get(&k)
                .cloned()
                .map(Object::RequestAuthentication),
            Kind::Jwks => s.jwks().get(&r.name).cloned().map(Object::Jwks),
            Kind::HttpRoute => s
                .route(RouteKind::Http, &k)
                .map(|route| Object::HttpRoute((**route).clone())),
            Kind::GrpcRoute => s
                .route(RouteKind::Grpc, &k)
                .map(|route| Object::GrpcRoute((**route).clone())),
            Kind::VirtualService => s
                .route(RouteKind::Virtual, &k)
                .map(|route| Object::VirtualService((**route).clone())),
        }
    }

    /// istiod's revision filter (`ObjectInRevision` / `LabelsInRevision`) on the Istio config
    /// kinds: an object without an `istio.io/rev` label is global and always taken; a labelled
    /// one only by its revision (by every revision when ours is empty).
    fn accepted(&self, object: &Object) -> bool {
        let revision = match object {
            Object::AuthorizationPolicy(p) => p.revision.as_deref(),
            Object::PeerAuthentication(p) => p.revision.as_deref(),
            Object::DestinationRule(r) => r.revision.as_deref(),
            Object::RequestAuthentication(ra) => ra.revision.as_deref(),
            Object::ServiceEntry(se) => se.labels.get(REVISION_LABEL),
            // Not `we.labels`: those merge in `spec.labels`, which istiod's filter never reads.
            Object::WorkloadEntry(we) => we.revision.as_deref(),
            _ => return true,
        };
        match revision {
            None => true,
            Some(revision) => {
                self.settings.revision.is_empty() || revision == self.settings.revision
            }
        }
    }

    fn rebuild(&mut self, targets: BTreeSet<Target>) -> Changes {
        let mut changes = Changes::default();
        let mut released: Vec<((TypeKind, Name), Target)> = Vec::new();
        for target in targets {
            let mut reads = Vec::new();
            let built = self.build(&target, &mut reads);
            self.record_reads(&target, reads);
            for (object, desired) in built.statuses {
                self.set_status(object, desired, &mut changes);
            }
            if let Target::Pod((namespace, name)) = &target {
                // A pod produces at most its own workload, named from its key, and no other
                // target produces that name: `produced` and `owners` need no entry for it.
                let uid = pod_uid(&self.settings.cluster_id, namespace, name);
                let resource = built.resources.into_iter().next().map(|(_, r)| r);
                debug_assert!(resource.as_ref().is_none_or(|r| *r.name == *uid));
                self.set_resource(TypeKind::Address, &uid, resource, &mut changes);
                continue;
            }
            let mut names: Vec<(TypeKind, Name)> = built
                .resources
                .iter()
                .map(|(kind, r)| (*kind, r.name.clone()))
                .collect();
            names.sort_unstable();
            names.dedup();
            let before = if names.is_empty() {
                self.produced.remove(&target)
            } else {
                self.produced
                    .insert(target.clone(), names.into_boxed_slice())
            };
            let now: &[(TypeKind, Name)] = self.produced.get(&target).map_or(&[], |n| n);
            for name in before.unwrap_or_default() {
                if now.binary_search(&name).is_err() {
                    released.push((name, target.clone()));
                }
            }
            for (kind, resource) in built.resources {
                let name = resource.name.clone();
                self.owners.insert((kind, name.clone()), target.clone());
                self.set_resource(kind, &name, Some(resource), &mut changes);
            }
        }
        // A name another target took over in this same step stays.
        for (name, target) in released {
            if self.owners.get(&name) == Some(&target) {
                self.owners.remove(&name);
                self.set_resource(name.0, &name.1, None, &mut changes);
            }
        }
        if !self.unpublished_overflow {
            self.unpublished.merge(&changes);
            let resources = self.addresses.len() + self.authorizations.len();
            if self.unpublished.len() > history_budget(resources) {
                self.unpublished = Changes::default();
                self.unpublished_overflow = true;
            }
        }
        changes
    }

    /// Keeps one object's desired condition (and a policy's entry in `policy_status`).
    fn set_status(
        &mut self,
        object: StatusTarget,
        desired: Option<DesiredStatus>,
        changes: &mut Changes,
    ) {
        if object.kind == StatusKind::AuthorizationPolicy {
            let name = format!("{}/{}", object.namespace, object.name);
            match desired.as_ref().and_then(|d| d.condition.as_ref()) {
                Some(c) if self.policy_status.get(&name) != Some(c) => {
                    self.policy_status.insert(name, (**c).clone());
                }
                None if self.policy_status.contains_key(&name) => {
                    self.policy_status.remove(&name);
                }
                _ => {}
            }
        }
        match desired {
            Some(d) if self.statuses.get(&object) != Some(&d) => {
                self.statuses.insert(object.clone(), d);
                changes.statuses.insert(object);
            }
            Some(_) => {}
            // Removing an absent key would still copy the shared map's path.
            None if self.statuses.contains_key(&object) => {
                self.statuses.remove(&object);
                changes.statuses.insert(object);
            }
            None => {}
        }
    }

    fn record_reads(&mut self, target: &Target, reads: Vec<Key>) {
        if let Some(old) = self.target_reads.remove(target) {
            for key in old {
                if let Some(readers) = self.waypoint_readers.get_mut(&key) {
                    readers.remove(target);
                    if readers.is_empty() {
                        self.waypoint_readers.remove(&key);
                    }
                }
            }
        }
        if reads.is_empty() {
            return;
        }
        for key in &reads {
            self.waypoint_readers
                .entry(key.clone())
                .or_default()
                .insert(target.clone());
        }
        self.target_reads.insert(target.clone(), reads);
    }

    /// Stores (or removes) one resource and records a change only if the bytes differ.
    fn set_resource(
        &mut self,
        kind: TypeKind,
        name: &str,
        new: Option<Resource>,
        changes: &mut Changes,
    ) {
        if kind == TypeKind::Address {
            return self.set_address(name, new, changes);
        }
        let old = self.authorizations.get_key_value(name);
        if same_value(old.map(|(_, r)| &**r), new.as_ref()) {
            return;
        }
        let old_key = old.map(|(key, _)| key.clone());
        let changes = changes.of_mut(kind);
        match (new, old_key) {
            (Some(new), _) => {
                let key = new.name.clone();
                self.authorizations.insert(key.clone(), Arc::new(new));
                changes.upsert(&key);
            }
            (None, Some(key)) => {
                self.authorizations.remove(&key);
                changes.remove(&key);
            }
            (None, None) => {}
        }
    }

    /// Stores (or removes) one Address resource, keeping the alias and member indexes in step,
    /// and records a change only if the bytes differ.
    fn set_address(&mut self, name: &str, new: Option<Resource>, changes: &mut Changes) {
        let old = self
            .addresses
            .get_key_value(name)
            .map(|(key, r)| (key.clone(), r.clone()));
        if same_value(old.as_ref().map(|(_, r)| &**r), new.as_ref()) {
            // Same bytes; only a re-created pod's uid (never sent) may differ.
            if let (Some((key, old)), Some(mut new)) = (&old, new)
                && old.pod_uid() != new.pod_uid()
            {
                new.name = key.clone();
                self.addresses.insert(key.clone(), Arc::new(new));
            }
            return;
        }
        // The index keeps the name it first stored (one allocation shared by every index).
        let Some(key) = old
            .as_ref()
            .map(|(key, _)| key.clone())
            .or_else(|| new.as_ref().map(|r| r.name.clone()))
        else {
            return;
        };
        let none = Links::default();
        let before = old.as_ref().map_or(&none, |(_, r)| r.links());
        let after = new.as_ref().map_or(&none, |r| r.links());
        // Only the entries that differ touch the indexes (a pod turning ready changes none).
        if before.addresses != after.addresses {
            let removed = aliases_of(before, &mut self.networks);
            let added = aliases_of(after, &mut self.networks);
            for alias in removed.iter().filter(|a| !added.contains(a)) {
                self.aliases.remove(alias, &key);
            }
            for alias in &added {
                self.aliases.add(alias, &key);
            }
        }
        if before.services != after.services {
            for service in before
                .services
                .iter()
                .filter(|s| !after.services.contains(s))
            {
                remove_name(&mut self.members, service, &key);
            }
            for service in after.services.iter() {
                add_name(&mut self.members, service, Name::clone, &key);
            }
        }
        if before.node != after.node {
            if let Some(node) = &before.node {
                remove_name(&mut self.by_node, node, &key);
            }
            if let Some(node) = &after.node {
                add_name(&mut self.by_node, node, Name::clone, &key);
            }
        }
        if before.waypoint != after.waypoint {
            if let Some(waypoint) = &before.waypoint {
                remove_name(&mut self.by_waypoint, waypoint, &key);
            }
            if let Some(waypoint) = &after.waypoint {
                add_name(&mut self.by_waypoint, waypoint, Name::clone, &key);
            }
        }
        self.service_count =
            self.service_count + usize::from(after.is_service) - usize::from(before.is_service);
        let changes = changes.of_mut(TypeKind::Address);
        match new {
            Some(mut new) => {
                // The resource holds the indexes' own names (one allocation per service and
                // node, not one per workload).
                let links = new.links_mut();
                for service in links.services.iter_mut() {
                    if let Some((shared, _)) = self.members.get_key_value(service) {
                        *service = shared.clone();
                    }
                }
                if let Some(node) = &mut links.node
                    && let Some((shared, _)) = self.by_node.get_key_value(node)
                {
                    *node = shared.clone();
                }
                new.name = key.clone();
                self.addresses.insert(key.clone(), Arc::new(new));
                changes.upsert(&key);
            }
            None => {
                self.addresses.remove(&key);
                changes.remove(&key);
            }
        }
    }
}

impl Index {
    /// Waypoints and the network, which many objects read: recompute them after a change and
    /// add the readers of whatever changed.
    fn after_change(
        &mut self,
        reference: &ObjectRef,
        network_before: &str,
        targets: &mut BTreeSet<Target>,
    ) {
        let network_changed = self.store.network(&self.settings) != network_before;
        let gateways: Vec<Key> = match reference.kind {
            _ if network_changed => self.store.gateways().keys().cloned().collect(),
            Kind::Gateway => vec![(reference.namespace.clone(), reference.name.clone())],
            Kind::GatewayClass => self
                .store
                .gateways()
                .iter()
                .filter(|(_, g)| g.class_name == reference.name)
                .map(|(k, _)| k.clone())
                .collect(),
            _ => Vec::new(),
        };
        for key in gateways {
            let network = self.store.network(&self.settings).to_string();
            if !self.store.refresh_waypoint(&key, &network) {
                continue;
            }
            if let Some(readers) = self.waypoint_readers.get(&key) {
                targets.extend(readers.iter().cloned());
            }
        }
        if network_changed {
            targets.extend(self.all_targets());
        }
    }
}

/// Adds `name` to the sorted names at `key` (made by `own` if the map has no such key yet).
/// A name already there copies nothing.
fn add_name<K, Q>(
    map: &mut PersistentMap<K, NameSet>,
    key: &Q,
    own: impl FnOnce(&Q) -> K,
    name: &Name,
) where
    K: Hash + Ord + Clone + Borrow<Q>,
    Q: Hash + Ord + ?Sized,
{
    let Some(names) = map.get(key) else {
        map.insert(own(key), NameSet::One(name.clone()));
        return;
    };
    if let Err(at) = names.binary_search(name)
        && let Some(names) = map.get_mut(key)
    {
        names.insert(at, name.clone());
    }
}

/// Removes `name` from the names at `key`, and the key with its last name.
fn remove_name<K: Hash + Ord + Clone + Borrow<Q>, Q: Hash + Ord + ?Sized>(
    map: &mut PersistentMap<K, NameSet>,
    key: &Q,
    name: &str,
) {
    let Some(names) = map.get(key) else { return };
    let Ok(at) = names.binary_search_by(|n| (**n).cmp(name)) else {
        return;
    };
    if names.len() == 1 {
        map.remove(key);
    } else if let Some(names) = map.get_mut(key) {
        names.remove(at);
    }
}

fn is_route(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::HttpRoute | Kind::GrpcRoute | Kind::VirtualService
    )
}

fn route_kind(route: &Route) -> Kind {
    match route.kind {
        crate::discovery::model::route::RouteKind::Http => Kind::HttpRoute,
        crate::discovery::model::route::RouteKind::Grpc => Kind::GrpcRoute,
        crate::discovery::model::route::RouteKind::Virtual => Kind::VirtualService,
    }
}

/// How many names the change history may hold for `resources` resources: an eighth of them
/// (about 5 B a resource at most), and never less than [`MIN_HISTORY_NAMES`].
fn history_budget(resources: usize) -> usize {
    (resources / 8).max(MIN_HISTORY_NAMES)
}

/// Whether a shared slice holds exactly `items`, in order: a stale flag set by a change that
/// was undone (or by a selector-only object) then keeps the slice, and waypoints see no change.
fn same_items<T: PartialEq>(shared: &[Arc<T>], items: &[&T]) -> bool {
    shared.len() == items.len() && shared.iter().zip(items).all(|(a, b)| **a == **b)
}

/// Whether a resource (or its absence) is unchanged, by its value.
fn same_value(old: Option<&Resource>, new: Option<&Resource>) -> bool {
    match (old, new) {
        (Some(old), Some(new)) => old.same_value(new),
        (None, None) => true,
        _ => false,
    }
}
