//! The index: stored objects, their dependants, and the encoded resources built from them.
//!
//! Every mutation works the same way: find the resources the change can affect (its
//! dependants), store the new object, rebuild exactly those resources, and record a change only
//! for those whose bytes differ from before. A relist ([`Index::reset`]) is the truth: objects
//! missing from it are deleted, whatever deletes were missed.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use crate::discovery::model::{
    Event, Kind, Namespace, Node, Object, ObjectRef, Pod, Service, selects,
};
use crate::discovery::names::{
    ADDRESS_TYPE, TypeKind, network_address_key, pod_uid, service_hostname, service_key,
};
use crate::discovery::snapshot::{Changes, HISTORY, Resource, ResourceMap, Snapshot};
use crate::discovery::{service, workload};
use crate::pb::workload::{Address, address};

/// The label on the system namespace that names the local network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";

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
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            domain: "cluster.local".into(),
            system_namespace: "istio-system".into(),
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

type Key = (String, String);

/// The stored inputs, plus reverse indexes for the lookups builders and dependency tracking do.
#[derive(Debug, Default)]
pub struct Objects {
    pub namespaces: HashMap<String, Namespace>,
    pub nodes: HashMap<String, Node>,
    pub pods: HashMap<Key, Pod>,
    pub services: HashMap<Key, Service>,
    pods_by_namespace: HashMap<String, BTreeSet<String>>,
    pods_by_node: HashMap<String, BTreeSet<Key>>,
    services_by_namespace: HashMap<String, BTreeSet<String>>,
}

impl Objects {
    /// The local network: the system namespace's `topology.istio.io/network` label, or `""`.
    pub fn network(&self, settings: &Settings) -> &str {
        self.namespaces
            .get(&settings.system_namespace)
            .and_then(|ns| ns.labels.get(NETWORK_LABEL))
            .map_or("", String::as_str)
    }

    /// Services of one namespace, in name order.
    pub fn services_in<'a>(&'a self, namespace: &str) -> impl Iterator<Item = &'a Service> + 'a {
        let names = self.services_by_namespace.get(namespace);
        let namespace = namespace.to_string();
        names
            .into_iter()
            .flatten()
            .filter_map(move |name| self.services.get(&(namespace.clone(), name.clone())))
    }

    fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &Pod> + '_ {
        let names = self.pods_by_namespace.get(namespace);
        let namespace = namespace.to_string();
        names
            .into_iter()
            .flatten()
            .filter_map(move |name| self.pods.get(&(namespace.clone(), name.clone())))
    }
}

/// A resource to rebuild.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Service(Key),
    Pod(Key),
}

/// Applies events and keeps every resource built and encoded. One owner; readers get snapshots.
#[derive(Debug)]
pub struct Index {
    settings: Settings,
    objects: Objects,
    addresses: ResourceMap,
    authorizations: ResourceMap,
    aliases: imbl::HashMap<String, imbl::OrdSet<String>>,
    members: imbl::HashMap<String, imbl::OrdSet<String>>,
    generation: u64,
    history: imbl::Vector<(u64, Arc<Changes>)>,
    unpublished: Changes,
}

impl Index {
    pub fn new(settings: Settings) -> Self {
        Index {
            settings,
            objects: Objects::default(),
            addresses: ResourceMap::default(),
            authorizations: ResourceMap::default(),
            aliases: imbl::HashMap::default(),
            members: imbl::HashMap::default(),
            generation: 0,
            history: imbl::Vector::new(),
            unpublished: Changes::default(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// Creates or replaces one object.
    pub fn apply(&mut self, object: Object) -> Changes {
        let mut targets = BTreeSet::new();
        match object {
            Object::Namespace(ns) => {
                let old = self.objects.namespaces.get(&ns.name);
                self.namespace_dependants(&ns.name, old, Some(&ns), &mut targets);
                self.objects.namespaces.insert(ns.name.clone(), ns);
            }
            Object::Node(node) => {
                self.node_dependants(&node.name, &mut targets);
                self.objects.nodes.insert(node.name.clone(), node);
            }
            Object::Pod(pod) => {
                let key = (pod.namespace.clone(), pod.name.clone());
                self.unlink_pod(&key);
                self.objects
                    .pods_by_namespace
                    .entry(pod.namespace.clone())
                    .or_default()
                    .insert(pod.name.clone());
                self.objects
                    .pods_by_node
                    .entry(pod.node_name.clone())
                    .or_default()
                    .insert(key.clone());
                self.objects.pods.insert(key.clone(), pod);
                targets.insert(Target::Pod(key));
            }
            Object::Service(svc) => {
                let key = (svc.namespace.clone(), svc.name.clone());
                if let Some(old) = self.objects.services.get(&key) {
                    self.service_dependants(old, &mut targets);
                }
                self.service_dependants(&svc, &mut targets);
                self.objects
                    .services_by_namespace
                    .entry(svc.namespace.clone())
                    .or_default()
                    .insert(svc.name.clone());
                self.objects.services.insert(key, svc);
            }
        }
        self.rebuild(targets)
    }

    /// Removes one object, if present.
    pub fn delete(&mut self, object: &ObjectRef) -> Changes {
        let mut targets = BTreeSet::new();
        let key = (object.namespace.clone(), object.name.clone());
        match object.kind {
            Kind::Namespace => {
                if let Some(old) = self.objects.namespaces.remove(&object.name) {
                    self.namespace_dependants(&object.name, Some(&old), None, &mut targets);
                }
            }
            Kind::Node => {
                if self.objects.nodes.remove(&object.name).is_some() {
                    self.node_dependants(&object.name, &mut targets);
                }
            }
            Kind::Pod => {
                if self.objects.pods.contains_key(&key) {
                    self.unlink_pod(&key);
                    self.objects.pods.remove(&key);
                    targets.insert(Target::Pod(key));
                }
            }
            Kind::Service => {
                if let Some(old) = self.objects.services.remove(&key) {
                    // Still a target (to remove it) and its selected pods lose a membership.
                    self.service_dependants(&old, &mut targets);
                    if let Some(names) = self.objects.services_by_namespace.get_mut(&key.0) {
                        names.remove(&key.1);
                    }
                }
            }
        }
        self.rebuild(targets)
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

    /// Replaces every object of `kind` with `objects`: the relist is the truth.
    pub fn reset(&mut self, kind: Kind, objects: Vec<Object>) -> Changes {
        let keep: BTreeSet<ObjectRef> = objects.iter().map(Object::object_ref).collect();
        let stale: Vec<ObjectRef> = self
            .refs(kind)
            .into_iter()
            .filter(|r| !keep.contains(r))
            .collect();
        let mut changes = Changes::default();
        for object in &stale {
            changes.merge(&self.delete(object));
        }
        for object in objects.into_iter().filter(|o| o.kind() == kind) {
            if self.stored(&object) {
                continue;
            }
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
        })
    }

    /// Whether there are changes not yet published.
    pub fn has_unpublished(&self) -> bool {
        !self.unpublished.is_empty()
    }

    fn stored(&self, object: &Object) -> bool {
        match object {
            Object::Namespace(n) => self.objects.namespaces.get(&n.name) == Some(n),
            Object::Node(n) => self.objects.nodes.get(&n.name) == Some(n),
            Object::Pod(p) => {
                self.objects
                    .pods
                    .get(&(p.namespace.clone(), p.name.clone()))
                    == Some(p)
            }
            Object::Service(s) => {
                self.objects
                    .services
                    .get(&(s.namespace.clone(), s.name.clone()))
                    == Some(s)
            }
        }
    }

    fn refs(&self, kind: Kind) -> Vec<ObjectRef> {
        match kind {
            Kind::Namespace => self
                .objects
                .namespaces
                .keys()
                .map(|n| ObjectRef::new(kind, "", n))
                .collect(),
            Kind::Node => self
                .objects
                .nodes
                .keys()
                .map(|n| ObjectRef::new(kind, "", n))
                .collect(),
            Kind::Pod => self
                .objects
                .pods
                .keys()
                .map(|(ns, n)| ObjectRef::new(kind, ns, n))
                .collect(),
            Kind::Service => self
                .objects
                .services
                .keys()
                .map(|(ns, n)| ObjectRef::new(kind, ns, n))
                .collect(),
        }
    }

    fn unlink_pod(&mut self, key: &Key) {
        let Some(old) = self.objects.pods.get(key) else {
            return;
        };
        if let Some(names) = self.objects.pods_by_namespace.get_mut(&key.0) {
            names.remove(&key.1);
        }
        if let Some(keys) = self.objects.pods_by_node.get_mut(&old.node_name) {
            keys.remove(key);
        }
    }

    /// A namespace's pods and services read its labels and annotations; the system namespace's
    /// network label is read by everything.
    fn namespace_dependants(
        &self,
        name: &str,
        old: Option<&Namespace>,
        new: Option<&Namespace>,
        targets: &mut BTreeSet<Target>,
    ) {
        let network_of =
            |ns: Option<&Namespace>| ns.and_then(|n| n.labels.get(NETWORK_LABEL)).cloned();
        if name == self.settings.system_namespace && network_of(old) != network_of(new) {
            targets.extend(self.objects.pods.keys().cloned().map(Target::Pod));
            targets.extend(self.objects.services.keys().cloned().map(Target::Service));
            return;
        }
        targets.extend(
            self.objects
                .pods_in(name)
                .map(|p| Target::Pod((p.namespace.clone(), p.name.clone()))),
        );
        targets.extend(
            self.objects
                .services_in(name)
                .map(|s| Target::Service((s.namespace.clone(), s.name.clone()))),
        );
    }

    fn node_dependants(&self, name: &str, targets: &mut BTreeSet<Target>) {
        if let Some(keys) = self.objects.pods_by_node.get(name) {
            targets.extend(keys.iter().cloned().map(Target::Pod));
        }
    }

    /// The service itself and every pod its selector picks.
    fn service_dependants(&self, svc: &Service, targets: &mut BTreeSet<Target>) {
        targets.insert(Target::Service((svc.namespace.clone(), svc.name.clone())));
        targets.extend(
            self.objects
                .pods_in(&svc.namespace)
                .filter(|p| selects(&svc.selector, &p.labels))
                .map(|p| Target::Pod((p.namespace.clone(), p.name.clone()))),
        );
    }

    fn rebuild(&mut self, targets: BTreeSet<Target>) -> Changes {
        let mut changes = Changes::default();
        for target in targets {
            match target {
                Target::Pod(key) => {
                    let name = pod_uid(&self.settings.cluster_id, &key.0, &key.1);
                    let built = self
                        .objects
                        .pods
                        .get(&key)
                        .and_then(|pod| workload::build(&self.settings, &self.objects, pod));
                    let resource = built.map(|w| {
                        let aliases = aliases(&w.network, &w.addresses);
                        let services = w.services.keys().cloned().collect();
                        let message = Address {
                            r#type: Some(address::Type::Workload(w)),
                        };
                        Resource::encode(
                            ADDRESS_TYPE,
                            name.clone(),
                            aliases,
                            false,
                            services,
                            &message,
                        )
                    });
                    self.set_address(&name, resource, &mut changes);
                }
                Target::Service(key) => {
                    let hostname = service_hostname(&key.1, &key.0, &self.settings.domain);
                    let name = service_key(&key.0, &hostname);
                    let built = self
                        .objects
                        .services
                        .get(&key)
                        .and_then(|svc| service::build(&self.settings, &self.objects, svc));
                    let resource = built.map(|s| {
                        let vips: Vec<_> = s.addresses.iter().map(|a| a.address.clone()).collect();
                        let aliases = aliases(
                            &s.addresses
                                .first()
                                .map(|a| a.network.clone())
                                .unwrap_or_default(),
                            &vips,
                        );
                        let message = Address {
                            r#type: Some(address::Type::Service(s)),
                        };
                        Resource::encode(
                            ADDRESS_TYPE,
                            name.clone(),
                            aliases,
                            true,
                            Vec::new(),
                            &message,
                        )
                    });
                    self.set_address(&name, resource, &mut changes);
                }
            }
        }
        self.unpublished.merge(&changes);
        changes
    }

    /// Stores (or removes) one Address resource, keeping the alias and member indexes in step,
    /// and records a change only if the bytes differ.
    fn set_address(&mut self, name: &str, new: Option<Resource>, changes: &mut Changes) {
        let old = self.addresses.get(name).cloned();
        if old.as_ref().map(|r| &r.any) == new.as_ref().map(|r| &r.any) {
            return;
        }
        if let Some(old) = &old {
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

fn remove_from(map: &mut imbl::HashMap<String, imbl::OrdSet<String>>, key: &str, name: &str) {
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
