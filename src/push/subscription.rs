//! Protocol decisions, kept pure: what a client subscribed to, how to classify each request,
//! and which resources to send (and remove) for a given snapshot.
//!
//! A wildcard client's view is "the snapshot it was last synced to", so following it costs one
//! pointer per connection, not a map of every name: updates are the difference between that
//! snapshot and the new one, found through the snapshot's change history (or, if the client
//! fell further behind than the history reaches, a full comparison). An explicit (on-demand)
//! client holds a small map of the names it was sent.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::discovery::names::TypeKind;
use crate::discovery::snapshot::{Name, Resource, ResourceMap, Snapshot};
use crate::pb::xds::DeltaDiscoveryRequest;
use crate::push::known::KnownVersions;

/// The wildcard subscription name.
pub const WILDCARD: &str = "*";

/// Names one stream may subscribe to, per type. An on-demand ztunnel asks for the names it
/// meets, one or a few at a time, and on reconnect lists what it holds (at most every resource
/// of the mesh): 100,000 is the largest mesh ambientd is sized for (BENCHMARKS.md, T6), so an
/// honest proxy never reaches it, while a stream asking for names without end would hold
/// memory without bound (about 0.5 KB per name, BENCHMARKS.md "Overload"). Past it the stream
/// ends with `RESOURCE_EXHAUSTED`.
pub const MAX_SUBSCRIBED_NAMES: usize = 100_000;

/// The status a stream ends with when a request would take it past
/// [`MAX_SUBSCRIBED_NAMES`]; `would_hold` is how many names it would then hold.
pub fn too_many_names(type_url: &str, would_hold: usize) -> String {
    format!(
        "this request would subscribe the stream to {would_hold} names of {type_url}, more than \
         the limit of {MAX_SUBSCRIBED_NAMES} per stream: subscribe to the wildcard (*) instead"
    )
}

/// How many names a first request subscribes to: its subscribe list (not `*`) and, when it
/// is not a wildcard subscription, the names it holds from an earlier stream.
pub fn initial_names(request: &DeltaDiscoveryRequest, known: usize) -> usize {
    let wildcard = Subscription::initial_is_wildcard(
        &request.resource_names_subscribe,
        &request.resource_names_unsubscribe,
    );
    let named = request
        .resource_names_subscribe
        .iter()
        .filter(|n| *n != WILDCARD)
        .count();
    if wildcard { named } else { named + known }
}

/// What the client subscribed to, for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subscription {
    pub wildcard: bool,
    pub names: BTreeSet<String>,
}

impl Subscription {
    /// From the first request of a type: an empty subscribe list is the legacy wildcard, `*`
    /// subscribes to everything, and `*` in the unsubscribe list turns the wildcard off
    /// (ztunnel's on-demand "subscribe to nothing yet" is `subscribe: [*], unsubscribe: [*]`).
    pub fn initial(subscribe: &[String], unsubscribe: &[String]) -> Self {
        let mut subscription = Subscription {
            wildcard: subscribe.is_empty(),
            names: BTreeSet::new(),
        };
        subscription.update(subscribe, unsubscribe);
        subscription
    }

    /// Whether a first request with these lists subscribes to the wildcard.
    fn initial_is_wildcard(subscribe: &[String], unsubscribe: &[String]) -> bool {
        let mut wildcard = subscribe.is_empty() || subscribe.iter().any(|n| n == WILDCARD);
        if unsubscribe.iter().any(|n| n == WILDCARD) {
            wildcard = false;
        }
        wildcard
    }

    /// How many names this subscription would hold after subscribing to `subscribe` (before
    /// any unsubscribe in the same request): what [`MAX_SUBSCRIBED_NAMES`] is checked against.
    pub fn would_hold(&self, subscribe: &[String]) -> usize {
        let mut new: Vec<&String> = subscribe
            .iter()
            .filter(|n| *n != WILDCARD && !self.names.contains(*n))
            .collect();
        new.sort_unstable();
        new.dedup();
        self.names.len() + new.len()
    }

    /// Applies a later request's changes; returns the names newly subscribed (not `*`).
    pub fn update(&mut self, subscribe: &[String], unsubscribe: &[String]) -> Vec<String> {
        let mut added = Vec::new();
        for name in subscribe {
            if name == WILDCARD {
                self.wildcard = true;
            } else if self.names.insert(name.clone()) {
                added.push(name.clone());
            }
        }
        for name in unsubscribe {
            if name == WILDCARD {
                self.wildcard = false;
            } else {
                self.names.remove(name);
                added.retain(|n| n != name);
            }
        }
        added
    }
}

/// What a request means, given what this connection has sent so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A type URL ambientd does not serve.
    UnknownType(String),
    /// The first request for a type on this stream.
    Initial(TypeKind),
    /// Accepts the last response of the type.
    Ack(TypeKind),
    /// Rejects a response: never answered by re-sending.
    Nack { kind: TypeKind, message: String },
    /// A nonce older than the last response: superseded, ignored.
    Stale(TypeKind),
    /// No nonce, not the first request: a subscription change (on-demand lookups).
    Subscribe(TypeKind),
}

/// Classifies a request. `last_nonce` is the nonce of the last response sent for its type,
/// `None` if the type was never requested on this stream.
pub fn classify(request: &DeltaDiscoveryRequest, last_nonce: Option<&str>) -> RequestKind {
    let Some(kind) = TypeKind::from_type_url(&request.type_url) else {
        return RequestKind::UnknownType(request.type_url.clone());
    };
    let Some(last_nonce) = last_nonce else {
        return RequestKind::Initial(kind);
    };
    if let Some(error) = &request.error_detail {
        return RequestKind::Nack {
            kind,
            message: error.message.clone(),
        };
    }
    if request.response_nonce.is_empty() {
        RequestKind::Subscribe(kind)
    } else if request.response_nonce == last_nonce {
        RequestKind::Ack(kind)
    } else {
        RequestKind::Stale(kind)
    }
}

/// How many responses of one type may await their ACK or NACK before further changes wait
/// and coalesce. One would make every push wait a full round trip to the proxy (under load,
/// the proxy's ACK is slowest exactly when changes come fastest); two lets the next response
/// go while the previous one is being applied, and still bounds what HTTP/2 buffers per
/// stream to two responses per type.
pub const PUSH_WINDOW: usize = 2;

/// The nonces (the connection's response counters) of one type's unanswered responses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    counters: [u64; PUSH_WINDOW],
    len: u8,
}

impl InFlight {
    /// Whether no more responses may be pushed until one is answered.
    pub fn is_full(&self) -> bool {
        usize::from(self.len) >= PUSH_WINDOW
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records a response sent with counter `counter` (a split response sends several; past
    /// the window only the newest are remembered, and answering those frees the window).
    pub fn sent(&mut self, counter: u64) {
        if self.is_full() {
            self.counters.copy_within(1.., 0);
            self.len -= 1;
        }
        self.counters[usize::from(self.len)] = counter;
        self.len += 1;
    }

    /// The proxy answered the response with nonce `nonce`: it and every earlier one are done
    /// (a proxy answers responses in the order it reads them). A nonce that is not ours, or
    /// not in flight, changes nothing.
    pub fn answered(&mut self, nonce: &str) {
        let Ok(counter) = u64::from_str_radix(nonce, 16) else {
            return;
        };
        let done = self.counters[..self.len()]
            .iter()
            .take_while(|c| **c <= counter)
            .count();
        self.counters.copy_within(done.., 0);
        self.len -= done as u8;
    }
}

/// Resources to send and names to remove, for one response: a [`Diff`], which a snapshot can
/// keep and share between streams.
pub use crate::discovery::snapshot::Diff as Delta;

/// One type's state on one connection.
#[derive(Clone, Debug)]
pub struct TypeState {
    pub kind: TypeKind,
    pub subscription: Subscription,
    /// Wildcard mode: the snapshot the client's view equals.
    synced: Option<Arc<Snapshot>>,
    /// Explicit mode, or before the first wildcard sync: name -> version the client holds.
    held: HashMap<String, String>,
    /// What the first request reported holding, until [`TypeState::initial`] compares it.
    known: Option<KnownVersions>,
    /// The nonce of the last response sent.
    pub last_nonce: String,
    /// Responses sent and not yet ACKed or NACKed. While [`PUSH_WINDOW`] of them are,
    /// snapshot changes wait (coalescing) instead of queueing behind them in HTTP/2's buffers.
    pub in_flight: InFlight,
    /// The generation of the newest snapshot noted.
    seen: u64,
    /// Names changed between the client's view and snapshot `seen`, each once however often it
    /// changed (bounded by the type's names); `None` once the client fell further behind than
    /// the snapshots' history reaches, when a full comparison is due.
    changed: Option<BTreeSet<Name>>,
    /// Node-scoped mode: the proxy's node, whose [`Snapshot::node_scope`] it always gets.
    node: Option<String>,
    /// On-demand mode: the proxy's node, whose workloads it gets with its first lookup and
    /// from then on (istiod's on-demand answer).
    local_node: Option<String>,
    /// How long the removal of names a wildcard client held when it connected, and this
    /// replica does not have, waits ([`TypeState::hold_removals`]).
    removal_grace: Duration,
    /// Those names, while their removal waits (boxed: rare, and every stream holds the slot).
    unconfirmed: Option<Box<Unconfirmed>>,
}

/// Names a reconnecting client holds that the snapshot it was synced to lacks. A client that
/// moves from a replica that died to one a few events behind would otherwise be told to remove
/// what was just created, and be sent it again a moment later: a workload that goes missing
/// for that moment. Their removal waits until `until`; whatever still does not exist then is
/// removed.
#[derive(Clone, Debug)]
struct Unconfirmed {
    until: Instant,
    /// Each name, with the version the client said it holds: should the name appear at that
    /// version within the grace (this replica catching up), the client already has it.
    names: HashMap<String, String>,
    /// The connection was woken for them (so it stops asking when they are due).
    due: bool,
}

/// Why an explicit (on-demand) client's resources are being computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Explicit {
    /// The first request: send only what the client does not hold at its version.
    Initial,
    /// The client asked for keys just now: send what they resolve to even if it holds it, so a
    /// waiter on each key wakes (ztunnel waits until a response names the key).
    Lookup,
    /// A new snapshot: send what changed, and a changed service's members.
    Update,
}

impl TypeState {
    /// The snapshot a wildcard client's view equals, once synced.
    pub fn synced(&self) -> Option<&Arc<Snapshot>> {
        self.synced.as_ref()
    }

    /// What an explicit client holds: name -> version.
    pub fn held(&self) -> &HashMap<String, String> {
        &self.held
    }

    /// From the first request of a type. `initial_resource_versions` are what the client holds
    /// from an earlier stream; in explicit mode they also count as subscribed names.
    pub fn new(kind: TypeKind, request: &DeltaDiscoveryRequest) -> Self {
        let known = KnownVersions::from_map(request.initial_resource_versions.clone());
        Self::with_known(kind, request, known)
    }

    /// As [`TypeState::new`], with the known versions given apart from the request (as the
    /// server decodes them: [`KnownVersions`]).
    pub fn with_known(
        kind: TypeKind,
        request: &DeltaDiscoveryRequest,
        known: KnownVersions,
    ) -> Self {
        let mut subscription = Subscription::initial(
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
        );
        if !subscription.wildcard {
            subscription
                .names
                .extend(known.iter().map(|(name, _)| name.to_string()));
        }
        TypeState {
            kind,
            subscription,
            synced: None,
            held: HashMap::new(),
            known: Some(known),
            last_nonce: String::new(),
            in_flight: InFlight::default(),
            seen: 0,
            changed: Some(BTreeSet::new()),
            node: None,
            local_node: None,
            removal_grace: Duration::ZERO,
            unconfirmed: None,
        }
    }

    /// A wildcard client's first response removes names it holds that this replica lacks only
    /// after `grace` (zero: at once), if they still do not exist then ([`Unconfirmed`]).
    pub fn hold_removals(&mut self, grace: Duration) {
        self.removal_grace = grace;
    }

    /// When removals held back at connect are due, until the connection has been woken for
    /// them ([`TypeState::removals_woken`]).
    pub fn removals_due_at(&self) -> Option<Instant> {
        self.unconfirmed
            .as_ref()
            .filter(|u| !u.due)
            .map(|u| u.until)
    }

    /// The connection woke for the held-back removals: the next [`TypeState::on_snapshot`]
    /// sends them.
    pub fn removals_woken(&mut self) {
        if let Some(unconfirmed) = &mut self.unconfirmed {
            unconfirmed.due = true;
        }
    }

    /// The held-back names that are due and still missing from `snapshot`.
    fn due_removals(&mut self, snapshot: &Snapshot) -> Vec<String> {
        let due = self
            .unconfirmed
            .as_ref()
            .is_some_and(|u| u.due || Instant::now() >= u.until);
        if !due {
            return Vec::new();
        }
        let resources = snapshot.resources(self.kind);
        let names = self.unconfirmed.take().map(|u| u.names).unwrap_or_default();
        let mut missing: Vec<String> = names
            .into_keys()
            .filter(|name| resources.get(name.as_str()).is_none())
            .collect();
        missing.sort();
        missing
    }

    /// Takes out of `delta` what appears at a version the client said it holds among the
    /// held-back names (it has those already), and stops holding back every name that now
    /// exists.
    fn confirm_held(&mut self, delta: &mut Delta) {
        let Some(unconfirmed) = self.unconfirmed.as_mut() else {
            return;
        };
        if delta.resources.is_empty() {
            return;
        }
        delta.resources.retain(
            |resource| match unconfirmed.names.remove(resource.name.as_str()) {
                Some(version) => !resource.version.is(&version),
                None => true,
            },
        );
    }

    /// The answer to the first request: everything subscribed whose version the client does
    /// not already hold, and the names it holds that no longer exist.
    pub fn initial(&mut self, snapshot: &Arc<Snapshot>) -> Delta {
        let known = self.known.take().unwrap_or_default();
        if self.subscription.wildcard {
            let mut delta = self.sync_wildcard_from(snapshot, known.iter());
            if !self.removal_grace.is_zero() && !delta.removed.is_empty() {
                let missing = std::mem::take(&mut delta.removed);
                let names = known
                    .iter()
                    .filter(|(name, _)| missing.binary_search_by(|m| m.as_str().cmp(name)).is_ok())
                    .map(|(name, version)| (name.to_string(), version.to_string()))
                    .collect();
                self.unconfirmed = Some(Box::new(Unconfirmed {
                    until: Instant::now() + self.removal_grace,
                    names,
                    due: false,
                }));
            }
            delta
        } else {
            self.held.extend(
                known
                    .iter()
                    .map(|(name, version)| (name.to_string(), version.to_string())),
            );
            let keys: Vec<String> = self.subscription.names.iter().cloned().collect();
            self.explicit(snapshot, &keys, Explicit::Initial)
        }
    }

    /// Node-scoped mode (Address only): the client gets its node's [`Snapshot::node_scope`]
    /// plus what it names explicitly. A wildcard subscription becomes exactly that: followed
    /// by name, like an on-demand one.
    pub fn scope_to_node(&mut self, node: &str) {
        if self.kind == TypeKind::Address && !node.is_empty() {
            self.node = Some(node.to_string());
            self.subscription.wildcard = false;
        }
    }

    /// On-demand mode (an explicit Address subscription, not node-scoped): as istiod does, the
    /// proxy gets the workloads on its node with its first lookup and keeps getting them.
    pub fn on_demand_from(&mut self, node: &str) {
        if self.kind == TypeKind::Address
            && !self.subscription.wildcard
            && self.node.is_none()
            && !node.is_empty()
        {
            self.local_node = Some(node.to_string());
        }
    }

    /// The node this type is scoped to, if any.
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// How many resource names of this type changed between what the client was last brought
    /// up to date with and `latest`: each name once however often it changed (for an explicit
    /// client an upper bound, since it may not hold them all).
    pub fn changed_names(&self, latest: &Snapshot) -> usize {
        match &self.changed {
            Some(changed) => changed.len(),
            None => latest.resources(self.kind).len(),
        }
    }

    /// Folds the changes up to `latest` into the names still to compare, without computing
    /// anything to send: what a connection does for each snapshot while its proxy is slow.
    pub fn note(&mut self, latest: &Snapshot) {
        if latest.generation <= self.seen {
            return;
        }
        if let Some(changed) = &mut self.changed {
            match latest.names_changed_since(self.kind, self.seen) {
                Some(names) => changed.extend(names.cloned()),
                None => self.changed = None,
            }
        }
        self.seen = latest.generation;
    }

    /// What a new snapshot means for this client.
    pub fn on_snapshot(&mut self, snapshot: &Arc<Snapshot>) -> Delta {
        if !self.subscription.wildcard {
            self.note(snapshot);
            if self.changed.as_ref().is_some_and(BTreeSet::is_empty) {
                // No resource of this type changed: no lookup can resolve differently.
                return Delta::default();
            }
            return self.explicit(snapshot, &[], Explicit::Update);
        }
        let Some(synced) = self.synced.clone() else {
            return self.sync_wildcard(snapshot);
        };
        let due = self.due_removals(snapshot);
        if synced.generation == snapshot.generation {
            return Delta {
                resources: Vec::new(),
                removed: due,
            };
        }
        self.note(snapshot);
        let resources = snapshot.resources(self.kind);
        let old = synced.resources(self.kind);
        let delta = match self.changed.replace(BTreeSet::new()) {
            Some(changed) => {
                // The names changed since `synced`, all from the history: the same for every
                // stream synced to that snapshot, so the diff is computed once and shared.
                let shared = snapshot.diff_from(self.kind, synced.generation, || {
                    let mut delta = Delta::default();
                    for name in &changed {
                        diff_one(name, old, resources, &mut delta);
                    }
                    with_members(snapshot, &mut delta, |_| true);
                    delta
                });
                Delta::clone(&shared)
            }
            None => {
                // Fell behind the history: compare the two snapshots, skipping the parts of
                // their maps they still share (most of them, for a client a few seconds behind).
                let mut delta = Delta::default();
                resources.diff(old, |name| diff_one(name, old, resources, &mut delta));
                with_members(snapshot, &mut delta, |_| true);
                delta
            }
        };
        self.synced = Some(snapshot.clone());
        let mut delta = delta;
        self.confirm_held(&mut delta);
        if !due.is_empty() {
            delta.removed.extend(due);
            delta.removed.sort();
            delta.removed.dedup();
        }
        delta
    }

    /// A subscription change on an open stream. Always answered, if only with an empty
    /// response: istiod answers every request that changes a subscription, and a client may
    /// wait for that answer.
    pub fn on_subscribe(
        &mut self,
        snapshot: &Arc<Snapshot>,
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> Delta {
        let was_wildcard = self.subscription.wildcard;
        let added = self.subscription.update(subscribe, unsubscribe);
        if self.node.is_some() {
            // Node-scoped: `*` does not widen the scope; named keys add to it.
            self.subscription.wildcard = false;
        }
        for name in unsubscribe {
            self.held.remove(name);
        }
        match (was_wildcard, self.subscription.wildcard) {
            (false, true) => self.sync_wildcard(snapshot),
            (true, false) => {
                // The client keeps what it has; follow it by name from here.
                self.held = self.view_versions();
                self.synced = None;
                if added.is_empty() {
                    Delta::default()
                } else {
                    self.explicit(snapshot, &added, Explicit::Lookup)
                }
            }
            // A wildcard client already has everything a name could add.
            (true, true) => Delta::default(),
            (false, false) => {
                // A key asked for again is answered again, so a client waiting on it is never
                // left hanging.
                let keys = if added.is_empty() {
                    subscribe.to_vec()
                } else {
                    added
                };
                self.explicit(snapshot, &keys, Explicit::Lookup)
            }
        }
    }

    fn view_versions(&self) -> HashMap<String, String> {
        match &self.synced {
            Some(s) => s
                .resources(self.kind)
                .iter()
                .map(|(k, r)| (k.to_string(), r.version.to_string()))
                .collect(),
            None => self.held.clone(),
        }
    }

    /// Full wildcard sync against what the client holds (`held`), then track by snapshot.
    fn sync_wildcard(&mut self, snapshot: &Arc<Snapshot>) -> Delta {
        let held = std::mem::take(&mut self.held);
        self.sync_wildcard_from(
            snapshot,
            held.iter()
                .map(|(name, version)| (name.as_str(), version.as_str())),
        )
    }

    /// Full wildcard sync against `known` (name, version) pairs: every resource the client
    /// does not hold at its version, and the names it holds that no longer exist. A reconnect
    /// at 100k resources compares 100k pairs, and 1,000 proxies reconnect at once after a
    /// control-plane restart (benchmark T6). The pairs are walked in the order the request
    /// holds them, each looked up in the snapshot's flat index ([`Snapshot::flat`]), built once
    /// and shared by every stream: a lookup in the persistent map costs several times that, and
    /// a hash table of the proxy's pairs, built per stream, would miss the cache on every name
    /// it compares, since each name lies in that stream's request buffer.
    fn sync_wildcard_from<'a>(
        &mut self,
        snapshot: &Arc<Snapshot>,
        known: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Delta {
        self.seen = snapshot.generation;
        self.changed = Some(BTreeSet::new());
        // The proxy's entries are walked in the order they came (the request's bytes are read
        // once, front to back) and each is looked up in the snapshot's index, which every
        // reconnecting stream shares and so stays in cache. Per resource: 0 the proxy lacks
        // it, 1 it holds this version, 2 another one (a name listed twice: the last wins).
        let flat = snapshot.flat(self.kind);
        let mut held = vec![0u8; flat.list.len()];
        let mut delta = Delta::default();
        for (name, version) in known {
            match flat.position(name) {
                Some(at) => held[at] = if flat.list[at].1.is(version) { 1 } else { 2 },
                None => delta.removed.push(name.to_string()),
            }
        }
        for ((_, _, resource), held) in flat.list.iter().zip(&held) {
            if *held != 1 {
                delta.resources.push(resource.clone());
            }
        }
        delta.resources.sort_by(|a, b| a.name.cmp(&b.name));
        delta.removed.sort();
        delta.removed.dedup();
        self.held = HashMap::new();
        self.synced = Some(snapshot.clone());
        delta
    }

    /// Explicit mode: send the resources subscribed names resolve to (and updates to what the
    /// client holds) whose versions differ; remove held names that no longer exist. Each of
    /// `fresh` keys that is not itself a resource name is also listed as removed, so that a
    /// client waiting on exactly that key (ztunnel's on-demand `/10.0.0.5`) wakes up.
    fn explicit(&mut self, snapshot: &Arc<Snapshot>, fresh: &[String], why: Explicit) -> Delta {
        self.seen = snapshot.generation;
        self.changed = Some(BTreeSet::new());
        let resources = snapshot.resources(self.kind);
        let mut wanted: BTreeSet<String> = BTreeSet::new();
        for key in &self.subscription.names {
            wanted.extend(lookup(snapshot, self.kind, key));
        }
        if let Some(node) = &self.node {
            wanted.extend(snapshot.node_scope(node));
        } else if let Some(node) = &self.local_node
            && !(self.subscription.names.is_empty() && self.held.is_empty())
        {
            // Not before the first lookup: istiod's first on-demand response is empty.
            wanted.extend(snapshot.node_workloads(node));
        }
        wanted.extend(
            self.held
                .keys()
                .filter(|name| resources.contains_key(name.as_str()))
                .cloned(),
        );
        let fresh = fresh.iter().filter(|key| *key != WILDCARD);
        let looked_up: BTreeSet<String> = match why {
            Explicit::Lookup => fresh
                .clone()
                .flat_map(|key| lookup(snapshot, self.kind, key))
                .collect(),
            Explicit::Initial | Explicit::Update => BTreeSet::new(),
        };
        let mut delta = Delta::default();
        for name in &wanted {
            if let Some(resource) = resources.get(name.as_str())
                && (looked_up.contains(name)
                    || !self.held.get(name).is_some_and(|v| resource.version.is(v)))
            {
                delta.resources.push(resource.clone());
            }
        }
        if why == Explicit::Update {
            with_members(snapshot, &mut delta, |name| wanted.contains(name));
        }
        let mut removed: BTreeSet<String> = self
            .held
            .keys()
            .filter(|name| !resources.contains_key(name.as_str()))
            .cloned()
            .collect();
        for key in fresh {
            if !resources.contains_key(key.as_str()) {
                removed.insert(key.clone());
            }
        }
        for resource in &delta.resources {
            self.held
                .insert(resource.name.to_string(), resource.version.to_string());
        }
        for name in &removed {
            self.held.remove(name);
        }
        delta.removed = removed.into_iter().collect();
        delta
    }
}

/// Splits a delta so that no response's resources exceed about `max_bytes` (a resource larger
/// than that goes alone). Removals go with the first part. Always at least one part, so an
/// initial request is answered even when there is nothing to send.
pub fn split(delta: Delta, max_bytes: usize) -> Vec<Delta> {
    let size = |r: &Resource| {
        // The Any and its type URL, name, version, and each field's tag and length (aliases
        // are not sent: `push::response`).
        r.value_len() + r.type_url().len() + r.name.len() + r.version.hex_len() + 16
    };
    let total: usize = delta.resources.iter().map(|r| size(r)).sum();
    if total <= max_bytes {
        return vec![delta];
    }
    let mut parts = vec![Delta {
        resources: Vec::new(),
        removed: delta.removed,
    }];
    let mut bytes = 0;
    for resource in delta.resources {
        let n = size(&resource);
        let current = parts.last_mut().expect("one part");
        if !current.resources.is_empty() && bytes + n > max_bytes {
            parts.push(Delta::default());
            bytes = 0;
        }
        bytes += n;
        parts.last_mut().expect("one part").resources.push(resource);
    }
    parts
}

/// Sends `name` if its version differs between the client's snapshot and the new one;
/// removes it if it is gone.
fn diff_one(name: &str, old: &ResourceMap, new: &ResourceMap, delta: &mut Delta) {
    match (old.get(name), new.get(name)) {
        (Some(o), Some(n)) if Arc::ptr_eq(o, n) || o.version == n.version => {}
        (_, Some(n)) => delta.resources.push(n.clone()),
        (Some(_), None) => delta.removed.push(name.to_string()),
        (None, None) => {}
    }
}

/// Adds the member workloads of each service in `delta` that `wanted` admits, changed or not,
/// as istiod does: ztunnel builds a service's endpoints from its workloads as they arrive, so
/// a service whose health policy now admits not-ready endpoints (`publishNotReadyAddresses`)
/// reaches them only when its workloads are sent again.
fn with_members(snapshot: &Snapshot, delta: &mut Delta, wanted: impl Fn(&str) -> bool) {
    if !delta.resources.iter().any(|r| r.is_service()) {
        return;
    }
    let mut sent: HashSet<Name> = delta.resources.iter().map(|r| r.name.clone()).collect();
    let services: Vec<Name> = delta
        .resources
        .iter()
        .filter(|r| r.is_service())
        .map(|r| r.name.clone())
        .collect();
    for service in services {
        let Some(members) = snapshot.members.get(&service) else {
            continue;
        };
        for member in members.iter() {
            if wanted(member)
                && !sent.contains(member)
                && let Some(resource) = snapshot.addresses.get(member)
            {
                sent.insert(member.clone());
                delta.resources.push(resource.clone());
            }
        }
    }
}

/// The resource names one subscribed key resolves to.
fn lookup(snapshot: &Snapshot, kind: TypeKind, key: &str) -> Vec<String> {
    match kind {
        TypeKind::Address => snapshot.lookup_addresses(key),
        TypeKind::Authorization => snapshot
            .authorizations
            .get(key)
            .map(|r| vec![r.name.to_string()])
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests;
