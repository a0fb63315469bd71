//! The `Changes` an index step produced, and the immutable `Snapshot` of encoded resources
//! ([`crate::discovery::snapshot::resource`]).
//!
//! A snapshot is a set of persistent maps: cloning it is O(1), and the index updates it in
//! O(log n) per resource.

pub(crate) mod address_index;
pub(crate) mod links;
pub(crate) mod name;
pub(crate) mod resource;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::discovery::model::authorization::AuthorizationPolicy;
use crate::discovery::model::destination_rule::DestinationRule;
use crate::discovery::model::request_authentication::{Jwks, RequestAuthentication};
use crate::discovery::model::route::Route;
use crate::discovery::model::status::PolicyStatus;
use crate::discovery::model::status::{DesiredStatus, StatusTarget};
use crate::discovery::names::TypeKind;
use crate::discovery::snapshot::address_index::{Aliases, Networks};
pub(crate) use crate::discovery::snapshot::name::Name;
pub use crate::discovery::snapshot::name::NameSet;
pub use crate::discovery::snapshot::resource::{Resource, Version};

/// Names touched by one or more index steps, for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TypeChanges {
    pub upserted: BTreeSet<Name>,
    pub removed: BTreeSet<Name>,
}

impl TypeChanges {
    pub(crate) fn upsert(&mut self, name: &Name) {
        self.removed.remove(name);
        self.upserted.insert(name.clone());
    }

    pub(crate) fn remove(&mut self, name: &Name) {
        self.upserted.remove(name);
        self.removed.insert(name.clone());
    }

    pub fn is_empty(&self) -> bool {
        self.upserted.is_empty() && self.removed.is_empty()
    }

    /// Every name touched, whether upserted or removed.
    pub(crate) fn names(&self) -> impl Iterator<Item = &Name> {
        self.upserted.iter().chain(self.removed.iter())
    }

    /// Folds a later set of changes into this one.
    pub(crate) fn merge(&mut self, later: &TypeChanges) {
        for name in &later.upserted {
            self.upsert(name);
        }
        for name in &later.removed {
            self.remove(name);
        }
    }
}

/// What an index step changed, per resource type. Equal-to-before resources are not changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub addresses: TypeChanges,
    pub authorizations: TypeChanges,
    /// Objects whose wanted status condition changed (or that came or went), even when no
    /// resource did: a snapshot is published for them too, for the status writer.
    pub(crate) statuses: BTreeSet<StatusTarget>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.authorizations.is_empty() && self.statuses.is_empty()
    }

    /// How many names (and status targets) it holds.
    pub(crate) fn len(&self) -> usize {
        let names = |t: &TypeChanges| t.upserted.len() + t.removed.len();
        names(&self.addresses) + names(&self.authorizations) + self.statuses.len()
    }

    pub(crate) fn merge(&mut self, later: &Changes) {
        self.addresses.merge(&later.addresses);
        self.authorizations.merge(&later.authorizations);
        self.statuses.extend(later.statuses.iter().cloned());
    }

    pub(crate) fn of(&self, kind: TypeKind) -> &TypeChanges {
        match kind {
            TypeKind::Address => &self.addresses,
            TypeKind::Authorization => &self.authorizations,
        }
    }

    pub(crate) fn of_mut(&mut self, kind: TypeKind) -> &mut TypeChanges {
        match kind {
            TypeKind::Address => &mut self.addresses,
            TypeKind::Authorization => &mut self.authorizations,
        }
    }
}

/// A persistent hash map (cheap to clone, O(log n) to change), dense in memory
/// ([`crate::discovery::trie`]).
pub(crate) type PersistentMap<K, V> = crate::discovery::trie::HashTrie<K, V>;

/// Resources of one type by name: each entry is the resource, keyed by its own name (16 B a
/// slot, where a separate key doubled it).
pub type ResourceMap = crate::discovery::trie::Trie<Arc<Resource>>;

impl crate::discovery::trie::Entry for Arc<Resource> {
    type Key = Name;
    type Value = Arc<Resource>;

    /// The resource; `name` must be its own.
    fn new(name: Name, resource: Arc<Resource>) -> Self {
        debug_assert_eq!(name, resource.name);
        resource
    }

    fn key(&self) -> &Name {
        &self.name
    }

    fn value(&self) -> &Arc<Resource> {
        self
    }

    fn into_value(self) -> Arc<Resource> {
        self
    }
}

/// How many recent `Changes` a snapshot remembers, so a connection that skipped a few snapshots
/// can still catch up by names instead of a full diff.
pub(crate) const HISTORY: usize = 64;

/// The least number of names the history may hold (it may hold an eighth of the resources'
/// count when that is more). A step that touches more leaves no history behind it.
pub(crate) const MIN_HISTORY_NAMES: usize = 4096;

/// An immutable view of every resource, cheap to clone and share.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Counts published snapshots, from 1.
    pub generation: u64,
    pub addresses: ResourceMap,
    pub authorizations: ResourceMap,
    /// `network/ip` -> names of Address resources with that address (workloads and services).
    /// Usually one name each, kept alone ([`Aliases`]). The keys are numbers ([`crate::discovery::snapshot::address_index::Alias`]); [`Snapshot::alias`]
    /// looks one up by its text.
    pub(crate) aliases: Aliases,
    /// The networks aliases refer to.
    pub(crate) networks: Networks,
    /// Service name (`ns/hostname`) -> uids of workloads whose services map holds it. Sorted
    /// shared slices: an `imbl::OrdSet` node is a fixed array, and a slice is copied only when a
    /// workload joins or leaves (a pod turning ready touches none of these indexes).
    pub(crate) members: PersistentMap<Name, NameSet>,
    /// Node name -> the workloads on it.
    pub(crate) by_node: PersistentMap<Name, NameSet>,
    /// Waypoint lookup key (`ns/hostname` or `network/ip`, as [`Resource::waypoint`] gives
    /// it) -> the services and workloads that use that waypoint: what a waypoint serves.
    pub(crate) by_waypoint: PersistentMap<Name, NameSet>,
    /// AuthorizationPolicies with `targetRef(s)`, by `ns/name`: enforced by waypoints, never
    /// sent to ztunnel. The same slice until one of them changes.
    pub waypoint_policies: Arc<[Arc<AuthorizationPolicy>]>,
    /// Every DestinationRule, oldest first (istiod's merge order): waypoints choose and apply
    /// them. The same slice until one of them changes.
    pub destination_rules: Arc<[Arc<DestinationRule>]>,
    /// RequestAuthentications with `targetRef(s)`, oldest first: enforced by waypoints (their
    /// `jwt_authn` filter). The same slice until one of them changes.
    pub waypoint_authentications: Arc<[Arc<RequestAuthentication>]>,
    /// The key sets ambientd fetched for them (by its key-set fetcher), by name. The same slice until one
    /// changes.
    pub jwks: Arc<[Arc<Jwks>]>,
    /// HTTPRoutes and GRPCRoutes, by kind, namespace and name: translated by waypoints, never
    /// sent to ztunnel. The same slice until one of them changes.
    pub routes: Arc<[Arc<Route>]>,
    /// `(generation, changes that produced it)`, oldest first, at most [`HISTORY`] entries and
    /// [`MIN_HISTORY_NAMES`] or an eighth of the resources' count in names.
    pub(crate) history: imbl::Vector<(u64, Arc<Changes>)>,
    /// The `ZtunnelAccepted` condition of each AuthorizationPolicy, by `ns/name`.
    pub(crate) policy_status: PersistentMap<String, PolicyStatus>,
    /// Every AuthorizationPolicy, Service, ServiceEntry and WorkloadEntry, with the condition
    /// ambientd wants on it (`ZtunnelAccepted` on policies, `istio.io/WaypointBound` on the
    /// others; `None`: it must carry none of ours). An object missing here does not exist. The
    /// status writer compares successive snapshots' maps; an unchanged map is shared.
    pub(crate) statuses: PersistentMap<StatusTarget, DesiredStatus>,
    /// When the publisher handed it out (set by the publishing task, for convergence metrics).
    pub published_at: Option<std::time::Instant>,
    /// Each type's resources as one flat list, built on first use ([`Snapshot::flat`]).
    pub(crate) flat: [std::sync::OnceLock<FlatList>; 2],
    /// Diffs to this snapshot from earlier ones, computed once for every stream that needs
    /// the same one ([`Snapshot::diff_from`]).
    pub(crate) diffs: Diffs,
}

/// What changed for one type between two snapshots, as a stream sends it: the resources to
/// send and the names to remove (`push::subscription::Delta`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diff {
    pub(crate) resources: Vec<Arc<Resource>>,
    pub(crate) removed: Vec<String>,
}

impl Diff {
    pub(crate) fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }
}

/// The diffs a snapshot keeps: by type and earlier generation, the few most recent.
#[derive(Default)]
pub(crate) struct Diffs(std::sync::Mutex<Vec<(TypeKind, u64, Arc<Diff>)>>);

/// How many diffs a snapshot keeps. Streams that follow the snapshots closely share one or two
/// earlier generations; a stream further behind computes its own.
const DIFFS_KEPT: usize = 8;

impl Diffs {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(TypeKind, u64, Arc<Diff>)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clone for Diffs {
    /// A copy of a snapshot shares no cached diffs (they are only valid for that snapshot).
    fn clone(&self) -> Self {
        Diffs::default()
    }
}

impl std::fmt::Debug for Diffs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Diffs")
    }
}

/// A type's resources in one contiguous list (name, version, resource), with each name's
/// position in it.
pub(crate) type FlatList = Arc<Flat>;

#[derive(Debug)]
pub(crate) struct Flat {
    pub(crate) list: Box<[(Name, Version, Arc<Resource>)]>,
    /// Name -> position in `list`.
    positions: std::collections::HashMap<Name, u32, foldhash::fast::RandomState>,
}

impl Flat {
    fn new(list: Box<[(Name, Version, Arc<Resource>)]>) -> Flat {
        let mut positions =
            std::collections::HashMap::with_capacity_and_hasher(list.len(), Default::default());
        for (at, (name, _, _)) in list.iter().enumerate() {
            positions.insert(name.clone(), at as u32);
        }
        Flat { list, positions }
    }

    /// Where `name` is in [`Flat::list`].
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.positions.get(name).map(|&at| at as usize)
    }
}

impl Snapshot {
    /// The key set fetched under `name` ([`crate::discovery::model::JwksSource::key`]).
    pub fn key_set(&self, name: &str) -> Option<&Jwks> {
        self.jwks
            .binary_search_by(|j| j.name.as_str().cmp(name))
            .ok()
            .map(|at| &*self.jwks[at])
    }

    pub fn resources(&self, kind: TypeKind) -> &ResourceMap {
        match kind {
            TypeKind::Address => &self.addresses,
            TypeKind::Authorization => &self.authorizations,
        }
    }

    /// A type's resources as one flat list, built the first time it is asked for and then
    /// shared by every stream on this snapshot. A reconnecting proxy's known versions are
    /// compared by walking their entries once, each looked up in the list's shared index: when
    /// 1,000 proxies reconnect to 100k resources at once (benchmark T6), walking the persistent
    /// map's nodes for each of them costs far more than a contiguous list. About 50 B per
    /// resource, only on snapshots that saw a reconnect, and freed with the snapshot.
    pub(crate) fn flat(&self, kind: TypeKind) -> &FlatList {
        let slot = match kind {
            TypeKind::Address => &self.flat[0],
            TypeKind::Authorization => &self.flat[1],
        };
        slot.get_or_init(|| {
            Arc::new(Flat::new(
                self.resources(kind)
                    .iter()
                    .map(|(name, resource)| (name.clone(), resource.version, resource.clone()))
                    .collect(),
            ))
        })
    }

    /// The diff of `kind` from the snapshot of generation `from` to this one, as `compute` gives
    /// it: computed by the first stream that asks, then shared. `compute` must give the same
    /// diff whichever stream runs it (a function of the two snapshots only). A thousand
    /// streams following the same snapshots otherwise each repeat the same lookups (T8).
    pub(crate) fn diff_from(
        &self,
        kind: TypeKind,
        from: u64,
        compute: impl FnOnce() -> Diff,
    ) -> Arc<Diff> {
        if let Some((_, _, diff)) = self
            .diffs
            .lock()
            .iter()
            .find(|(k, f, _)| *k == kind && *f == from)
        {
            return diff.clone();
        }
        // Computed outside the lock: another stream may compute the same diff meanwhile, and
        // one of the two is kept.
        let diff = Arc::new(compute());
        let mut diffs = self.diffs.lock();
        if diffs.len() >= DIFFS_KEPT {
            diffs.remove(0);
        }
        diffs.push((kind, from, diff.clone()));
        diff
    }

    /// The resource changes between generation `since` and this snapshot, if history still
    /// covers them. `statuses` is left empty: every xDS stream calls this, and only the status
    /// writer needs those ([`Snapshot::status_changes_since`]).
    pub(crate) fn changes_since(&self, since: u64) -> Option<Changes> {
        let mut all = Changes::default();
        for changes in self.history_since(since)? {
            all.addresses.merge(&changes.addresses);
            all.authorizations.merge(&changes.authorizations);
        }
        Some(all)
    }

    /// The names of `kind` changed (upserted or removed) between generation `since` and this
    /// snapshot, if history still covers them; a name may come more than once. What each xDS
    /// stream folds into its own set on every snapshot, so it builds no `Changes` of its own.
    pub(crate) fn names_changed_since(
        &self,
        kind: TypeKind,
        since: u64,
    ) -> Option<impl Iterator<Item = &Name>> {
        Some(
            self.history_since(since)?
                .flat_map(move |changes| changes.of(kind).names()),
        )
    }

    /// The objects whose wanted status condition changed between generation `since` and this
    /// snapshot, if history still covers them.
    pub(crate) fn status_changes_since(&self, since: u64) -> Option<BTreeSet<StatusTarget>> {
        let mut all = BTreeSet::new();
        for changes in self.history_since(since)? {
            all.extend(changes.statuses.iter().cloned());
        }
        Some(all)
    }

    /// The history entries after generation `since`; `None` if history no longer reaches back.
    fn history_since(&self, since: u64) -> Option<impl Iterator<Item = &Arc<Changes>>> {
        if since != self.generation {
            let first = self.history.front()?.0;
            if since + 1 < first || since > self.generation {
                return None;
            }
        }
        Some(
            self.history
                .iter()
                .filter(move |(generation, _)| *generation > since)
                .map(|(_, changes)| changes),
        )
    }

    /// What a node-scoped proxy on `node` gets without asking: the workloads on the node, the
    /// services they are part of, the waypoints those workloads and services use, and the
    /// waypoints' own workloads (needed to reach them).
    pub(crate) fn node_scope(&self, node: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        let Some(local) = self.by_node.get(node) else {
            return names;
        };
        let mut waypoints = BTreeSet::new();
        for uid in local.iter() {
            let Some(workload) = self.addresses.get(uid) else {
                continue;
            };
            names.insert(uid.to_string());
            waypoints.extend(workload.waypoint());
            for service in workload.links().services.iter() {
                if let Some(resource) = self.addresses.get(service) {
                    names.insert(service.to_string());
                    waypoints.extend(resource.waypoint());
                }
            }
        }
        for key in &waypoints {
            names.extend(self.lookup_addresses(key));
        }
        names
    }

    /// The workloads on `node`: what istiod adds to an on-demand proxy's answers.
    pub(crate) fn node_workloads(&self, node: &str) -> impl Iterator<Item = String> + '_ {
        self.by_node
            .get(node)
            .into_iter()
            .flat_map(|names| names.iter())
            .filter(|uid| self.addresses.contains_key(uid.as_str()))
            .map(|uid| uid.to_string())
    }

    /// Kubernetes `metadata.uid` of the pod whose workload is named `workload_uid`
    /// (`<cluster>//Pod/<ns>/<name>`): the CA checks a token's pod binding against it.
    pub(crate) fn pod_uid(&self, workload_uid: &str) -> Option<String> {
        Some(self.addresses.get(workload_uid)?.pod_uid()?.to_string())
    }

    /// istiod's `Lookup(key)` for Address resources: a workload uid; `network/ip` (the workloads
    /// with that IP, or else the service with that VIP and its members); or `ns/hostname` (the
    /// service and its members). Returns resource names; empty when nothing matches.
    pub fn lookup_addresses(&self, key: &str) -> Vec<String> {
        if let Some(resource) = self.addresses.get(key) {
            let mut names = vec![resource.name.to_string()];
            if resource.is_service()
                && let Some(members) = self.members.get(key)
            {
                names.extend(members.iter().map(|n| n.to_string()));
            }
            return names;
        }
        let Some(found) = self.alias(key) else {
            return Vec::new();
        };
        let is_service = |name: &Name| self.addresses.get(name).is_some_and(|r| r.is_service());
        let workloads: Vec<String> = found
            .iter()
            .filter(|n| !is_service(n))
            .map(|n| n.to_string())
            .collect();
        if !workloads.is_empty() {
            return workloads;
        }
        match found.iter().find(|n| is_service(n)) {
            Some(service) => self.lookup_addresses(service),
            None => Vec::new(),
        }
    }

    /// The services and workloads that use the waypoint a lookup key names (`ns/hostname` or
    /// `network/ip`).
    pub fn bound_to(&self, waypoint_key: &str) -> impl Iterator<Item = &Arc<Resource>> + '_ {
        self.by_waypoint
            .get(waypoint_key)
            .into_iter()
            .flat_map(|names| names.iter())
            .filter_map(|name| self.addresses.get(name))
    }

    /// The names with the address a `network/ip` key names.
    pub(crate) fn alias(&self, key: &str) -> Option<NameSet> {
        self.aliases.get(&self.networks.parse(key)?)
    }

    /// Every alias as its text, with its names.
    pub fn alias_texts(&self) -> impl Iterator<Item = (String, NameSet)> {
        self.aliases
            .iter()
            .map(|(alias, names)| (self.networks.text(alias), names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_is_kept_inline_and_more_are_shared() {
        let one = NameSet::from(vec![Name::from("a")]);
        assert!(matches!(one, NameSet::One(_)));
        assert_eq!(&*one, [Name::from("a")]);
        let two = NameSet::from(vec![Name::from("a"), "b".into()]);
        assert!(matches!(two, NameSet::Many(_)));
        assert_eq!(two.len(), 2);
        // A thin shared pointer for several: the enum fits in the one name's 16 bytes.
        assert_eq!(std::mem::size_of::<NameSet>(), 16);
    }

    #[test]
    fn names_grow_in_place_alone_and_copy_when_shared() {
        let name = |s: &str| Name::from(s);
        let mut names = NameSet::from(vec![name("b")]);
        names.insert(1, name("d"));
        names.insert(0, name("a"));
        names.insert(2, name("c"));
        assert_eq!(&*names, [name("a"), name("b"), name("c"), name("d")]);
        // A snapshot holds a clone: changing the index's copy leaves it as it was.
        let published = names.clone();
        names.insert(4, name("e"));
        assert!(names.remove(0));
        assert_eq!(&*published, [name("a"), name("b"), name("c"), name("d")]);
        assert_eq!(&*names, [name("b"), name("c"), name("d"), name("e")]);
        let NameSet::Many(shared) = &names else {
            panic!("several names")
        };
        // Copied at its size (five), then one removed in place.
        assert_eq!(shared.capacity(), 5);
        // Down to one name: inline again; the last cannot be removed (the key goes instead).
        assert!(names.remove(3) && names.remove(0) && names.remove(1));
        assert!(matches!(&names, NameSet::One(n) if **n == *"c"));
        assert!(!names.remove(0));
    }
}
