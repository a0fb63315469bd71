//! The index: stored objects, their dependants, and the encoded resources built from them.
//!
//! Every mutation works the same way: find the resources the change can affect (its
//! dependants, computed against the state before and after), store the new object, rebuild
//! exactly those resources, and record a change only for those whose bytes differ from before.
//! Waypoint dependencies are recorded as builders read them, so a waypoint change re-evaluates
//! exactly the objects that looked it up. A relist ([`Index::reset`]) is the truth: objects
//! missing from it are deleted, whatever deletes were missed.

use std::collections::BTreeSet;

use foldhash::{HashMap, HashMapExt, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::discovery::authorization::{PolicyStatus, REVISION_LABEL};
use crate::discovery::model::{Event, Kind, Object, ObjectRef, selects};
use crate::discovery::names::{
    ADDRESS_TYPE, AUTHORIZATION_TYPE, TypeKind, network_address_key, pod_uid, service_hostname,
    service_key,
};
use crate::discovery::snapshot::{
    Changes, HISTORY, PersistentMap, Resource, ResourceMap, Snapshot,
};
use crate::discovery::store::{Key, ServiceRef, Store, slice_pods};
use crate::discovery::waypoint::Waypoint;
use crate::discovery::{endpoint_slice, entry, policies, service, service_entry, workload};
use crate::pb::security::Authorization;
use crate::pb::workload::{self as wl, Address, address};

pub use crate::discovery::store::NETWORK_LABEL;

/// Mesh-wide settings the conversion reads.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `Workload.cluster_id` and the prefix of workload uids (istiod's `CLUSTER_ID`).
    pub cluster_id: String,
    pub trust_domain: String,
    /// The cluster domain suffix of Service hostnames.
    pub domain: String,
    /// Its `topology.istio.io/network` label names the local network; also the root namespace.
    pub system_namespace: String,
    /// istiod's revision: Istio config objects labelled `istio.io/rev` with another value are
    /// ignored; unlabelled ones are taken when this is `default`.
    pub revision: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            domain: "cluster.local".into(),
            system_namespace: "istio-system".into(),
            revision: "default".into(),
        }
    }
}

impl Settings {
    /// The trust domain as sent: `cluster.local` goes out empty (ztunnel's default).
    pub fn wire_trust_domain(&self) -> &str {
        if self.trust_domain == "cluster.local" {
            ""
        } else {
            &self.trust_domain
        }
    }
}

/// A unit of rebuilding: one object and every resource it produces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    KubeService(Key),
    EntryServices(Key),
    Pod(Key),
    WorkloadEntry(Key),
    EntryWorkloads(Key),
    Slice(Key),
    Policy(Key),
    PeerAuthentication(Key),
    StaticStrict,
}

/// Applies events and keeps every resource built and encoded. One owner; readers get snapshots.
#[derive(Debug)]
pub struct Index {
    settings: Settings,
    store: Store,
    addresses: ResourceMap,
    authorizations: ResourceMap,
    aliases: PersistentMap<String, imbl::OrdSet<String>>,
    members: PersistentMap<String, imbl::OrdSet<String>>,
    /// Resource names each target produced last time.
    produced: HashMap<Target, BTreeSet<(TypeKind, String)>>,
    /// The target that produced each resource name.
    owners: HashMap<(TypeKind, String), Target>,
    /// `ZtunnelAccepted` status of each AuthorizationPolicy, by `ns/name`.
    policy_status: PersistentMap<String, PolicyStatus>,
    /// Waypoint -> targets that looked it up, and the reverse.
    waypoint_readers: HashMap<Key, HashSet<Target>>,
    target_reads: HashMap<Target, Vec<Key>>,
    generation: u64,
    history: imbl::Vector<(u64, Arc<Changes>)>,
    unpublished: Changes,
    service_count: usize,
    pod_uids: PersistentMap<String, String>,
}

impl Index {
    pub fn new(settings: Settings) -> Self {
        Index {
            settings,
            store: Store::default(),
            addresses: ResourceMap::default(),
            authorizations: ResourceMap::default(),
            aliases: PersistentMap::default(),
            members: PersistentMap::default(),
            produced: HashMap::new(),
            owners: HashMap::new(),
            policy_status: PersistentMap::default(),
            waypoint_readers: HashMap::new(),
            target_reads: HashMap::new(),
            generation: 0,
            history: imbl::Vector::new(),
            unpublished: Changes::default(),
            service_count: 0,
            pod_uids: PersistentMap::default(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The stored objects.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Applies one source event. `Synced` changes nothing here; the caller uses it for readiness.
    pub fn handle(&mut self, event: Event) -> Changes {
        match event {
            Event::Apply(object) => self.apply(object),
            Event::Delete(object) => self.delete(&object),
            Event::Reset(kind, objects) => self.reset(kind, objects),
            Event::Synced => Changes::default(),
        }
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
        let mut targets = BTreeSet::new();
        if let Some(old) = self.stored(&reference) {
            self.dependants(&old, &mut targets);
        }
        let network_before = self.store.network(&self.settings).to_string();
        if let Object::Pod(pod) = &object {
            let name = pod_uid(&self.settings.cluster_id, &pod.namespace, &pod.name);
            if pod.uid.is_empty() {
                self.pod_uids.remove(&name);
            } else if self.pod_uids.get(&name) != Some(&pod.uid) {
                self.pod_uids.insert(name, pod.uid.clone());
            }
        }
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
        let mut targets = BTreeSet::new();
        self.dependants(&old, &mut targets);
        let network_before = self.store.network(&self.settings).to_string();
        if reference.kind == Kind::Pod {
            let name = pod_uid(
                &self.settings.cluster_id,
                &reference.namespace,
                &reference.name,
            );
            self.pod_uids.remove(&name);
        }
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
        let changes = std::mem::take(&mut self.unpublished);
        self.generation += 1;
        self.history.push_back((self.generation, Arc::new(changes)));
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
        Arc::new(Snapshot {
            generation: self.generation,
            addresses: self.addresses.clone(),
            authorizations: self.authorizations.clone(),
            aliases: self.aliases.clone(),
            members: self.members.clone(),
            history: self.history.clone(),
            policy_status: self.policy_status.clone(),
            pod_uids: self.pod_uids.clone(),
            published_at: None,
        })
    }

    /// How many Service resources (Kubernetes Services and ServiceEntry hosts) are served.
    pub fn service_count(&self) -> usize {
        self.service_count
    }

    /// Whether there are changes not yet published.
    pub fn has_unpublished(&self) -> bool {
        !self.unpublished.is_empty()
    }

    /// A copy of the stored object a reference names.
    fn stored(&self, r: &ObjectRef) -> Option<Object> {
        let k = (r.namespace.clone(), r.name.clone());
        let s = &self.store;
        match r.kind {
            Kind::Namespace => s.namespaces.get(&r.name).cloned().map(Object::Namespace),
            Kind::Node => s.nodes.get(&r.name).cloned().map(Object::Node),
            Kind::GatewayClass => s
                .gateway_classes
                .get(&r.name)
                .cloned()
                .map(Object::GatewayClass),
            Kind::Gateway => s.gateways.get(&k).cloned().map(Object::Gateway),
            Kind::Pod => s.pods.get(&k).cloned().map(Object::Pod),
            Kind::Service => s.services.get(&k).cloned().map(Object::Service),
            Kind::ServiceEntry => s.service_entries.get(&k).cloned().map(Object::ServiceEntry),
            Kind::WorkloadEntry => s
                .workload_entries
                .get(&k)
                .cloned()
                .map(Object::WorkloadEntry),
            Kind::EndpointSlice => s.slices.get(&k).cloned().map(Object::EndpointSlice),
            Kind::AuthorizationPolicy => {
                s.policies.get(&k).cloned().map(Object::AuthorizationPolicy)
            }
            Kind::PeerAuthentication => s
                .peer_authentications
                .get(&k)
                .cloned()
                .map(Object::PeerAuthentication),
        }
    }

    /// istiod's revision filter (`ObjectInRevision`) on the Istio config kinds.
    fn accepted(&self, object: &Object) -> bool {
        let revision = match object {
            Object::AuthorizationPolicy(p) => p.revision.as_deref(),
            Object::PeerAuthentication(p) => p.revision.as_deref(),
            Object::ServiceEntry(se) => se.labels.get(REVISION_LABEL).map(String::as_str),
            Object::WorkloadEntry(we) => we.labels.get(REVISION_LABEL).map(String::as_str),
            _ => return true,
        };
        match revision {
            None | Some("") => self.settings.revision == "default",
            Some(revision) => revision == self.settings.revision,
        }
    }

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
            _ if network_changed => self.store.gateways.keys().cloned().collect(),
            Kind::Gateway => vec![(reference.namespace.clone(), reference.name.clone())],
            Kind::GatewayClass => self
                .store
                .gateways
                .iter()
                .filter(|(_, g)| g.class_name == reference.name)
                .map(|(k, _)| k.clone())
                .collect(),
            _ => Vec::new(),
        };
        for key in gateways {
            let network = self.store.network(&self.settings);
            let waypoint = self.store.gateways.get(&key).and_then(|gw| {
                Waypoint::from_gateway(gw, self.store.gateway_classes.get(&gw.class_name), network)
            });
            if self.store.waypoints.get(&key) == waypoint.as_ref() {
                continue;
            }
            match waypoint {
                Some(w) => self.store.waypoints.insert(key.clone(), w),
                None => self.store.waypoints.remove(&key),
            };
            if let Some(readers) = self.waypoint_readers.get(&key) {
                targets.extend(readers.iter().cloned());
            }
        }
        if network_changed {
            targets.extend(self.all_targets());
        }
    }

    fn all_targets(&self) -> Vec<Target> {
        let s = &self.store;
        let mut all: Vec<Target> = Vec::new();
        all.extend(s.pods.keys().cloned().map(Target::Pod));
        all.extend(s.services.keys().cloned().map(Target::KubeService));
        all.extend(s.service_entries.keys().cloned().map(Target::EntryServices));
        all.extend(
            s.service_entries
                .keys()
                .cloned()
                .map(Target::EntryWorkloads),
        );
        all.extend(
            s.workload_entries
                .keys()
                .cloned()
                .map(Target::WorkloadEntry),
        );
        all.extend(s.slices.keys().cloned().map(Target::Slice));
        all.extend(s.policies.keys().cloned().map(Target::Policy));
        all.extend(
            s.peer_authentications
                .keys()
                .cloned()
                .map(Target::PeerAuthentication),
        );
        all.push(Target::StaticStrict);
        all
    }

    /// Workloads a WORKLOAD_SELECTOR policy in `namespace` may list: pods and WorkloadEntries
    /// by their labels, ServiceEntry endpoints by the entry's labels; every namespace when the
    /// policy is in the root namespace.
    fn policy_selected(
        &self,
        namespace: &str,
        selector: &crate::discovery::model::Labels,
        targets: &mut BTreeSet<Target>,
    ) {
        let namespaces: Vec<String> = if namespace == self.settings.system_namespace {
            self.store.members.keys().cloned().collect()
        } else {
            vec![namespace.to_string()]
        };
        for ns in &namespaces {
            self.selected_workloads(ns, selector, targets);
            for se in self.store.service_entries_in(ns) {
                if selects(selector, &se.labels) {
                    targets.insert(Target::EntryWorkloads((
                        se.namespace.clone(),
                        se.name.clone(),
                    )));
                }
            }
        }
    }

    /// Every workload (pods, WorkloadEntries, ServiceEntry endpoints) of a namespace, or of
    /// every namespace when it is the root namespace: the ones a policy there may reach.
    fn policy_scope(&self, namespace: &str, targets: &mut BTreeSet<Target>) {
        let namespaces: Vec<String> = if namespace == self.settings.system_namespace {
            self.store.members.keys().cloned().collect()
        } else {
            vec![namespace.to_string()]
        };
        for ns in namespaces {
            let Some(m) = self.store.members(&ns) else {
                continue;
            };
            let key = |name: &String| (ns.clone(), name.clone());
            targets.extend(m.pods.iter().map(key).map(Target::Pod));
            targets.extend(
                m.workload_entries
                    .iter()
                    .map(key)
                    .map(Target::WorkloadEntry),
            );
            targets.extend(
                m.service_entries
                    .iter()
                    .map(key)
                    .map(Target::EntryWorkloads),
            );
        }
    }

    /// Every target in a namespace.
    fn namespace_targets(&self, namespace: &str, targets: &mut BTreeSet<Target>) {
        let Some(m) = self.store.members(namespace) else {
            return;
        };
        let key = |name: &String| (namespace.to_string(), name.clone());
        targets.extend(m.pods.iter().map(key).map(Target::Pod));
        targets.extend(m.services.iter().map(key).map(Target::KubeService));
        targets.extend(m.service_entries.iter().map(key).map(Target::EntryServices));
        targets.extend(
            m.service_entries
                .iter()
                .map(key)
                .map(Target::EntryWorkloads),
        );
        targets.extend(
            m.workload_entries
                .iter()
                .map(key)
                .map(Target::WorkloadEntry),
        );
        targets.extend(m.slices.iter().map(key).map(Target::Slice));
        targets.extend(m.policies.iter().map(key).map(Target::Policy));
        targets.extend(
            m.peer_authentications
                .iter()
                .map(key)
                .map(Target::PeerAuthentication),
        );
    }

    /// Pods and WorkloadEntries of `namespace` that `selector` picks.
    fn selected_workloads(
        &self,
        namespace: &str,
        selector: &crate::discovery::model::Labels,
        targets: &mut BTreeSet<Target>,
    ) {
        for pod in self.store.pods_in(namespace) {
            if selects(selector, &pod.labels) {
                targets.insert(Target::Pod((pod.namespace.clone(), pod.name.clone())));
            }
        }
        for we in self.store.workload_entries_in(namespace) {
            if selects(selector, &we.labels) {
                targets.insert(Target::WorkloadEntry((
                    we.namespace.clone(),
                    we.name.clone(),
                )));
            }
        }
    }

    /// Everything built from `object`, or from other objects that read it, in the current
    /// state of the store.
    fn dependants(&self, object: &Object, targets: &mut BTreeSet<Target>) {
        let key = {
            let r = object.object_ref();
            (r.namespace, r.name)
        };
        match object {
            Object::Namespace(ns) => self.namespace_targets(&ns.name, targets),
            Object::Node(node) => {
                if let Some(keys) = self.store.pods_by_node.get(&node.name) {
                    targets.extend(keys.iter().cloned().map(Target::Pod));
                }
            }
            // Waypoints are handled by `after_change`.
            Object::Gateway(_) | Object::GatewayClass(_) => {}
            Object::Pod(_) => {
                targets.insert(Target::Pod(key));
            }
            Object::WorkloadEntry(_) => {
                targets.insert(Target::WorkloadEntry(key));
            }
            Object::EndpointSlice(slice) => {
                targets.insert(Target::Slice(key));
                targets.extend(slice_pods(slice).into_iter().map(Target::Pod));
            }
            Object::Service(svc) => {
                targets.insert(Target::KubeService(key.clone()));
                self.selected_workloads(&svc.namespace, &svc.selector, targets);
                if let Some(slices) = self.store.slices_by_service.get(&key) {
                    for name in slices {
                        let slice_key = (svc.namespace.clone(), name.clone());
                        if let Some(slice) = self.store.slices.get(&slice_key) {
                            targets.extend(slice_pods(slice).into_iter().map(Target::Pod));
                        }
                        targets.insert(Target::Slice(slice_key));
                    }
                }
                if !svc.external_name {
                    let host = service_hostname(&svc.name, &svc.namespace, &self.settings.domain);
                    self.hostname_rivals(&[host], targets);
                }
            }
            Object::AuthorizationPolicy(policy) => {
                targets.insert(Target::Policy(key));
                // Workloads whose reference list may change: those its selector picks, in its
                // namespace (every namespace for the root namespace). Called for the old and
                // the new policy, so workloads that leave and join are both covered.
                if let Some(selector) = policy.selector.as_ref().filter(|s| !s.is_empty()) {
                    self.policy_selected(&policy.namespace, selector, targets);
                }
            }
            Object::PeerAuthentication(pa) => {
                // Parents of other PAs' converted policies, the static policy, and references.
                targets.insert(Target::StaticStrict);
                let root = pa.namespace == self.settings.system_namespace;
                let peers: Vec<Key> = if root {
                    self.store.peer_authentications.keys().cloned().collect()
                } else {
                    self.store
                        .peer_authentications_in(&pa.namespace)
                        .map(|p| (p.namespace.clone(), p.name.clone()))
                        .collect()
                };
                targets.extend(peers.into_iter().map(Target::PeerAuthentication));
                targets.insert(Target::PeerAuthentication(key));
                self.policy_scope(&pa.namespace, targets);
            }
            Object::ServiceEntry(se) => {
                targets.insert(Target::EntryServices(key.clone()));
                targets.insert(Target::EntryWorkloads(key));
                if let Some(selector) = &se.workload_selector {
                    self.selected_workloads(&se.namespace, selector, targets);
                }
                self.hostname_rivals(&se.hosts, targets);
            }
        }
    }

    /// Objects claiming the same hostnames: who wins, and who is canonical, may change.
    fn hostname_rivals(&self, hosts: &[String], targets: &mut BTreeSet<Target>) {
        for host in hosts {
            let Some(claimants) = self.store.hostnames.get(host) else {
                continue;
            };
            for (_, claimant) in claimants {
                match claimant {
                    ServiceRef::Kube(k) => {
                        targets.insert(Target::KubeService(k.clone()));
                    }
                    ServiceRef::Entry(k) => {
                        targets.insert(Target::EntryServices(k.clone()));
                        targets.insert(Target::EntryWorkloads(k.clone()));
                        if let Some(selector) = self
                            .store
                            .service_entries
                            .get(k)
                            .and_then(|se| se.workload_selector.as_ref())
                        {
                            self.selected_workloads(&k.0, selector, targets);
                        }
                    }
                }
            }
        }
    }

    /// Builds every resource of one target, and a policy's status.
    fn build(&self, target: &Target, reads: &mut Vec<Key>) -> Built {
        let (settings, store) = (&self.settings, &self.store);
        let addresses = |resources: Vec<Resource>| Built {
            resources: resources
                .into_iter()
                .map(|r| (TypeKind::Address, r))
                .collect(),
            status: None,
        };
        let authorization = |a: Option<Authorization>| Built {
            resources: a
                .map(|a| (TypeKind::Authorization, authorization_resource(a)))
                .into_iter()
                .collect(),
            status: None,
        };
        match target {
            Target::Pod(k) => addresses(
                store
                    .pods
                    .get(k)
                    .and_then(|pod| workload::build(settings, store, pod, reads))
                    .map(workload_resource)
                    .into_iter()
                    .collect(),
            ),
            Target::WorkloadEntry(k) => addresses(
                store
                    .workload_entries
                    .get(k)
                    .map(|we| workload_resource(entry::workload_entry(settings, store, we, reads)))
                    .into_iter()
                    .collect(),
            ),
            Target::EntryWorkloads(k) => addresses(
                store
                    .service_entries
                    .get(k)
                    .map(|se| entry::service_entry_workloads(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::Slice(k) => addresses(
                store
                    .slices
                    .get(k)
                    .map(|slice| endpoint_slice::build(settings, store, slice))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::KubeService(k) => addresses(
                store
                    .services
                    .get(k)
                    .and_then(|svc| service::build(settings, store, svc, reads))
                    .map(service_resource)
                    .into_iter()
                    .collect(),
            ),
            Target::EntryServices(k) => addresses(
                store
                    .service_entries
                    .get(k)
                    .map(|se| service_entry::build(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_iter()
                    .map(service_resource)
                    .collect(),
            ),
            Target::Policy(k) => match policies::convert(settings, store, k) {
                Some(converted) => Built {
                    status: Some(converted.status),
                    ..authorization(converted.authorization)
                },
                None => Built {
                    status: Some(None),
                    ..authorization(None)
                },
            },
            Target::PeerAuthentication(k) => {
                authorization(policies::converted_peer_policy(settings, store, k))
            }
            Target::StaticStrict => authorization(policies::static_strict(settings, store)),
        }
    }

    fn rebuild(&mut self, targets: BTreeSet<Target>) -> Changes {
        let mut changes = Changes::default();
        let mut released: Vec<((TypeKind, String), Target)> = Vec::new();
        for target in targets {
            let mut reads = Vec::new();
            let built = self.build(&target, &mut reads);
            self.record_reads(&target, reads);
            if let (Target::Policy(k), Some(status)) = (&target, built.status) {
                let name = format!("{}/{}", k.0, k.1);
                match status {
                    Some(status) => self.policy_status.insert(name, status),
                    None => self.policy_status.remove(&name),
                };
            }
            let names: BTreeSet<(TypeKind, String)> = built
                .resources
                .iter()
                .map(|(kind, r)| (*kind, r.name.clone()))
                .collect();
            let before = if names.is_empty() {
                self.produced.remove(&target)
            } else {
                self.produced.insert(target.clone(), names.clone())
            };
            for name in before.unwrap_or_default().difference(&names) {
                released.push((name.clone(), target.clone()));
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
        self.unpublished.merge(&changes);
        changes
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
        let old = self.authorizations.get(name);
        if old.map(|r| &r.any) == new.as_ref().map(|r| &r.any) {
            return;
        }
        let changes = changes.of_mut(kind);
        match new {
            Some(new) => {
                self.authorizations.insert(name.to_string(), Arc::new(new));
                changes.upsert(name);
            }
            None => {
                self.authorizations.remove(name);
                changes.remove(name);
            }
        }
    }

    /// Stores (or removes) one Address resource, keeping the alias and member indexes in step,
    /// and records a change only if the bytes differ.
    fn set_address(&mut self, name: &str, new: Option<Resource>, changes: &mut Changes) {
        let old = self.addresses.get(name).cloned();
        if old.as_ref().map(|r| &r.any) == new.as_ref().map(|r| &r.any) {
            return;
        }
        if let Some(old) = &old {
            self.service_count -= usize::from(old.is_service);
            for alias in &old.aliases {
                remove_from(&mut self.aliases, alias, name);
            }
            for svc in &old.services {
                remove_from(&mut self.members, svc, name);
            }
        }
        let changes = changes.of_mut(TypeKind::Address);
        match new {
            Some(new) => {
                self.service_count += usize::from(new.is_service);
                for alias in &new.aliases {
                    self.aliases
                        .entry(alias.clone())
                        .or_default()
                        .insert(name.to_string());
                }
                for svc in &new.services {
                    self.members
                        .entry(svc.clone())
                        .or_default()
                        .insert(name.to_string());
                }
                self.addresses.insert(name.to_string(), Arc::new(new));
                changes.upsert(name);
            }
            None => {
                self.addresses.remove(name);
                changes.remove(name);
            }
        }
    }
}

/// What building one target produced.
struct Built {
    resources: Vec<(TypeKind, Resource)>,
    /// For a policy: its new status (`Some(None)`: none).
    status: Option<Option<PolicyStatus>>,
}

fn authorization_resource(a: Authorization) -> Resource {
    let name = format!("{}/{}", a.namespace, a.name);
    Resource::encode(AUTHORIZATION_TYPE, name, Vec::new(), false, Vec::new(), &a)
}

fn workload_resource(w: wl::Workload) -> Resource {
    let aliases = aliases(&w.network, &w.addresses);
    let services = w.services.keys().cloned().collect();
    let name = w.uid.clone();
    let message = Address {
        r#type: Some(address::Type::Workload(w)),
    };
    Resource::encode(ADDRESS_TYPE, name, aliases, false, services, &message)
}

fn service_resource(s: wl::Service) -> Resource {
    let name = service_key(&s.namespace, &s.hostname);
    let aliases = s
        .addresses
        .iter()
        .filter_map(|a| {
            let ip = ip_from_bytes(&a.address)?;
            Some(match a.length {
                Some(len) => format!("{}/{len}", network_address_key(&a.network, &ip)),
                None => network_address_key(&a.network, &ip),
            })
        })
        .collect();
    let message = Address {
        r#type: Some(address::Type::Service(s)),
    };
    Resource::encode(ADDRESS_TYPE, name, aliases, true, Vec::new(), &message)
}

fn remove_from(map: &mut PersistentMap<String, imbl::OrdSet<String>>, key: &str, name: &str) {
    if let Some(set) = map.get_mut(key) {
        set.remove(name);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// `network/ip` for each raw address.
fn aliases(network: &str, addresses: &[bytes::Bytes]) -> Vec<String> {
    addresses
        .iter()
        .filter_map(|raw| ip_from_bytes(raw))
        .map(|ip| network_address_key(network, &ip))
        .collect()
}

fn ip_from_bytes(raw: &[u8]) -> Option<IpAddr> {
    match raw.len() {
        4 => <[u8; 4]>::try_from(raw).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(raw).ok().map(IpAddr::from),
        _ => None,
    }
}
