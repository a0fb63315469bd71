//! A persistent hash map that stores its entries densely: the snapshot's maps.
//!
//! A hash array mapped trie whose leaves are sorted vectors of up to [`LEAF_MAX`] entries. A
//! branch reads six hash bits (64 buckets), and each of its children holds a *range* of
//! buckets: the branch's `u64` marks where each child's range starts. A full leaf splits in two
//! at the bucket that best halves it, and becomes a branch on the next six bits only when one
//! bucket holds all of it. So leaves hold between about half and all of [`LEAF_MAX`] entries at
//! any size. Splitting a full leaf into one child per bucket, as a classic HAMT does, spreads
//! its entries over nearly as many leaves (a node each), so that between powers of 64 most
//! leaves hold only a few entries; split by ranges, they stay at least half full on average (a
//! test checks it from 1k to 300k keys). Cloning is O(1); changing an entry copies the one path
//! to it, and only the nodes still shared with a clone.
//!
//! Leaves hold up to 16 entries rather than 32: copying a leaf clones each of its entries, and
//! for the resource map that is one `Arc` count per entry, each in its own cache line, so at
//! 100k pods 32-entry leaves make a pod change slower (benchmark T3), and 16 cost no more
//! memory.
//!
//! Why not `imbl`'s `HashMap`: its nodes are fixed arrays of 32 slots (16 at the leaves) however
//! few entries they hold, and at 100k keys its leaves hold about three. The snapshot's two
//! per-workload maps cost 166 and 205 B per pod in node slack; here an entry costs its own size
//! plus about 10 B of node overhead. Lookups hash once, descend two or three branches and binary
//! search one leaf. Two maps cloned from each other share untouched subtrees, which
//! [`HashTrie::diff`] skips by pointer.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// Entries a leaf holds before it becomes a branch (unless the hash bits are used up).
pub(crate) const LEAF_MAX: usize = 16;
/// Hash bits consumed per level.
const BITS: u32 = 6;
/// Levels that can branch (10 × 6 = 60 of the hash's 64 bits); a leaf below them grows freely.
const MAX_DEPTH: u32 = 10;

/// One seed per process, random, so every map hashes alike (two snapshots' maps can be
/// compared node by node) and names from the cluster cannot be chosen to collide.
fn hasher() -> foldhash::fast::FixedState {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed = *SEED.get_or_init(|| foldhash::fast::RandomState::default().hash_one(0u64));
    foldhash::fast::FixedState::with_seed(seed)
}

fn hash_of<Q: Hash + ?Sized>(key: &Q) -> u64 {
    hasher().hash_one(key)
}

/// What a [`Trie`] stores: a key with a value (`(K, V)`, the [`HashTrie`] map), or a value
/// that carries its own key (a resource and its name), so the key is not stored twice.
pub trait Entry: Clone {
    type Key: Hash + Ord;
    type Value;
    fn new(key: Self::Key, value: Self::Value) -> Self;
    fn key(&self) -> &Self::Key;
    fn value(&self) -> &Self::Value;
    fn into_value(self) -> Self::Value;
}

impl<K: Hash + Ord + Clone, V: Clone> Entry for (K, V) {
    type Key = K;
    type Value = V;

    fn new(key: K, value: V) -> Self {
        (key, value)
    }

    fn key(&self) -> &K {
        &self.0
    }

    fn value(&self) -> &V {
        &self.1
    }

    fn into_value(self) -> V {
        self.1
    }
}

enum Node<E> {
    /// Child `i` holds the buckets from the `i`-th set bit of `bitmap` up to the next one (the
    /// last, up to 63). Bit 0 is always set.
    Branch {
        bitmap: u64,
        children: Vec<Arc<Node<E>>>,
    },
    /// Sorted by (hash, key), unique.
    Leaf(Vec<Slot<E>>),
}

/// A leaf entry with the low 32 bits of its key's hash: a leaf is searched by comparing
/// numbers in one array rather than keys behind pointers, and split without rehashing.
#[derive(Clone)]
struct Slot<E> {
    hash: u32,
    entry: E,
}

/// Where `key` (with `hash`) is in a leaf, or where it would go.
fn find<E: Entry, Q: Ord + ?Sized>(entries: &[Slot<E>], hash: u64, key: &Q) -> Result<usize, usize>
where
    E::Key: Borrow<Q>,
{
    let hash = hash as u32;
    let mut i = entries.partition_point(|s| s.hash < hash);
    while let Some(slot) = entries.get(i).filter(|s| s.hash == hash) {
        match slot.entry.key().borrow().cmp(key) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Equal => return Ok(i),
            std::cmp::Ordering::Greater => break,
        }
    }
    Err(i)
}

/// Leaves grow by this many slots at a time. One: the allocator grows a block in place
/// within its size class, so most growth moves nothing, and a leaf holds no slack beyond its
/// class's rounding. Growing by several at a time would keep empty slots in every leaf and, in
/// a cold build, free blocks of sizes that no finished leaf reuses: memory per pod, which
/// benchmark T2 counts.
const GROW: usize = 1;

impl<E: Clone> Clone for Node<E> {
    fn clone(&self) -> Self {
        match self {
            Node::Branch { bitmap, children } => Node::Branch {
                bitmap: *bitmap,
                children: children.clone(),
            },
            Node::Leaf(entries) => Node::Leaf(entries.clone()),
        }
    }
}

/// The child slot for `hash` at `depth`.
fn chunk(hash: u64, depth: u32) -> u32 {
    ((hash >> (depth * BITS)) & ((1 << BITS) - 1)) as u32
}

/// Index of the child whose range holds bucket `bit`: the starts at or below it, less one.
fn position(bitmap: u64, bit: u32) -> usize {
    (bitmap & (u64::MAX >> (63 - bit))).count_ones() as usize - 1
}

/// The buckets of child `i`: from its start to the next child's (64 for the last).
fn range(bitmap: u64, i: usize) -> (u32, u32) {
    let mut rest = bitmap;
    for _ in 0..i {
        rest &= rest - 1;
    }
    let start = rest.trailing_zeros();
    rest &= rest - 1;
    let end = if rest == 0 { 64 } else { rest.trailing_zeros() };
    (start, end)
}

/// The entry's hash as far as `depth` needs: the stored 32 bits, or the key hashed again.
fn hash_for<E: Entry>(slot: &Slot<E>, depth: u32) -> u64 {
    if (depth + 1) * BITS <= 32 {
        u64::from(slot.hash)
    } else {
        hash_of(slot.entry.key())
    }
}

/// A persistent hash map of entries: cheap to clone, dense in memory.
pub struct Trie<E> {
    root: Option<Arc<Node<E>>>,
    len: usize,
}

/// A persistent hash map from `K` to `V`.
pub(crate) type HashTrie<K, V> = Trie<(K, V)>;

impl<E> Default for Trie<E> {
    fn default() -> Self {
        Trie { root: None, len: 0 }
    }
}

impl<E> Clone for Trie<E> {
    fn clone(&self) -> Self {
        Trie {
            root: self.root.clone(),
            len: self.len,
        }
    }
}

impl<E: Entry> Trie<E> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether both maps are the same, shared, tree (so certainly equal).
    pub(crate) fn ptr_eq(&self, other: &Self) -> bool {
        match (&self.root, &other.root) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }

    /// Every entry, in hash order (stable for a map and its clones, not across processes).
    pub fn iter(&self) -> Iter<'_, E> {
        Iter {
            stack: Vec::new(),
            leaf: [].iter(),
            root: self.root.as_deref(),
        }
    }

    pub fn keys(&self) -> impl Iterator<Item = &E::Key> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &E::Value> {
        self.iter().map(|(_, v)| v)
    }

    pub(crate) fn get_key_value<Q>(&self, key: &Q) -> Option<(&E::Key, &E::Value)>
    where
        E::Key: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        let hash = hash_of(key);
        let mut node = self.root.as_deref()?;
        let mut depth = 0;
        loop {
            match node {
                Node::Branch { bitmap, children } => {
                    node = &children[position(*bitmap, chunk(hash, depth))];
                    depth += 1;
                }
                Node::Leaf(entries) => {
                    let slot = &entries[find(entries, hash, key).ok()?];
                    return Some((slot.entry.key(), slot.entry.value()));
                }
            }
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&E::Value>
    where
        E::Key: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        self.get_key_value(key).map(|(_, v)| v)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        E::Key: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        self.get_key_value(key).is_some()
    }

    /// Sets `key` to `value`; returns the value it replaces.
    pub(crate) fn insert(&mut self, key: E::Key, value: E::Value) -> Option<E::Value> {
        let entry = E::new(key, value);
        let hash = hash_of(entry.key());
        let root = self
            .root
            .get_or_insert_with(|| Arc::new(Node::Leaf(Vec::new())));
        let root = Arc::make_mut(root);
        if let Node::Leaf(entries) = root
            && entries.len() >= LEAF_MAX
            && find(entries, hash, entry.key()).is_err()
        {
            // A full root leaf becomes a branch with it as the one child, which then splits.
            let leaf = Node::Leaf(std::mem::take(entries));
            *root = Node::Branch {
                bitmap: 1,
                children: vec![Arc::new(leaf)],
            };
        }
        let old = insert_at(root, hash, 0, entry);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<E::Value>
    where
        E::Key: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        // Look first, so a miss copies nothing.
        self.get_key_value(key)?;
        let hash = hash_of(key);
        let root = self.root.as_mut()?;
        let (old, empty) = remove_at(Arc::make_mut(root), hash, 0, key);
        if empty {
            self.root = None;
        }
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Calls `changed(key)` for every key whose value differs between `old` and `self` (present
    /// in one only, or with unequal values), skipping the subtrees the two maps share (every
    /// map in the process hashes alike, so equal keys sit at equal places).
    pub(crate) fn diff<'a>(&'a self, old: &'a Self, mut changed: impl FnMut(&'a E::Key))
    where
        E::Value: PartialEq,
    {
        diff_nodes(old.root.as_deref(), self.root.as_deref(), &mut changed);
    }
}

/// Changing values in place: for maps whose entries hold the key apart from the value.
impl<K: Hash + Ord + Clone, V: Clone> HashTrie<K, V> {
    /// The stored key and a mutable value, copying the path to it where it is shared.
    pub(crate) fn get_key_value_mut<Q>(&mut self, key: &Q) -> Option<(&K, &mut V)>
    where
        K: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        // Look first, so a miss copies nothing.
        self.get_key_value(key)?;
        let hash = hash_of(key);
        let mut node = Arc::make_mut(self.root.as_mut()?);
        let mut depth = 0;
        loop {
            match node {
                Node::Branch { bitmap, children } => {
                    let i = position(*bitmap, chunk(hash, depth));
                    node = Arc::make_mut(&mut children[i]);
                    depth += 1;
                }
                Node::Leaf(entries) => {
                    let i = find(entries, hash, key).ok()?;
                    let (k, v) = &mut entries[i].entry;
                    return Some((&*k, v));
                }
            }
        }
    }

    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Ord + ?Sized,
    {
        self.get_key_value_mut(key).map(|(_, v)| v)
    }
}

fn insert_at<E: Entry>(node: &mut Node<E>, hash: u64, depth: u32, entry: E) -> Option<E::Value> {
    match node {
        Node::Branch { bitmap, children } => {
            let bit = chunk(hash, depth);
            let mut i = position(*bitmap, bit);
            // Make room first when the entry is new and its leaf is full: split the leaf's
            // range in two, or, when one bucket holds it all, push the leaf one level down.
            if let Node::Leaf(entries) = &*children[i]
                && entries.len() >= LEAF_MAX
                && find(entries, hash, entry.key()).is_err()
            {
                let (start, end) = range(*bitmap, i);
                let Node::Leaf(entries) = Arc::make_mut(&mut children[i]) else {
                    unreachable!("a leaf, checked above")
                };
                match split(entries, depth, start, end) {
                    Some((at, high)) => {
                        children.insert(i + 1, Arc::new(Node::Leaf(high)));
                        *bitmap |= 1 << at;
                        i = position(*bitmap, bit);
                    }
                    None if depth + 1 < MAX_DEPTH => {
                        let child = Arc::make_mut(&mut children[i]);
                        let leaf = std::mem::replace(child, Node::Leaf(Vec::new()));
                        *child = Node::Branch {
                            bitmap: 1,
                            children: vec![Arc::new(leaf)],
                        };
                    }
                    // The hash bits are used up: the leaf grows freely.
                    None => {}
                }
            }
            insert_at(Arc::make_mut(&mut children[i]), hash, depth + 1, entry)
        }
        Node::Leaf(entries) => match find(entries, hash, entry.key()) {
            Ok(i) => Some(std::mem::replace(&mut entries[i].entry, entry).into_value()),
            Err(i) => {
                // Room was made above (or the hash bits are used up: the leaf grows freely).
                if entries.len() == entries.capacity() {
                    entries.reserve_exact(GROW);
                }
                let slot = Slot {
                    hash: hash as u32,
                    entry,
                };
                entries.insert(i, slot);
                None
            }
        },
    }
}

/// Splits a full leaf holding buckets `start..end` at `depth` where the two parts come
/// closest in size: keeps the lower part in `entries` and returns the bucket the upper part
/// starts at, with that part (both stay sorted). `None` when one bucket holds every entry.
fn split<E: Entry>(
    entries: &mut Vec<Slot<E>>,
    depth: u32,
    start: u32,
    end: u32,
) -> Option<(u32, Vec<Slot<E>>)> {
    let buckets: Vec<u32> = entries
        .iter()
        .map(|slot| chunk(hash_for(slot, depth), depth))
        .collect();
    let mut counts = [0usize; 64];
    for &b in &buckets {
        counts[b as usize] += 1;
    }
    let half = entries.len() / 2;
    let mut best: Option<(u32, usize)> = None;
    let mut below = 0usize;
    for b in start + 1..end {
        below += counts[(b - 1) as usize];
        if below == 0 || below == entries.len() {
            continue;
        }
        let off = below.abs_diff(half);
        if best.is_none_or(|(_, o)| off < o) {
            best = Some((b, off));
        }
    }
    let (at, _) = best?;
    let all = std::mem::take(entries);
    let upper = buckets.iter().filter(|b| **b >= at).count();
    let mut high = Vec::with_capacity(upper);
    entries.reserve_exact(all.len() - upper);
    for (slot, b) in all.into_iter().zip(buckets) {
        if b < at {
            entries.push(slot);
        } else {
            high.push(slot);
        }
    }
    Some((at, high))
}

/// Removes `key` below `node`; returns its value and whether `node` is now empty.
fn remove_at<E: Entry, Q>(
    node: &mut Node<E>,
    hash: u64,
    depth: u32,
    key: &Q,
) -> (Option<E::Value>, bool)
where
    E::Key: Borrow<Q>,
    Q: Ord + ?Sized,
{
    match node {
        Node::Branch { bitmap, children } => {
            let i = position(*bitmap, chunk(hash, depth));
            let (old, empty) = remove_at(Arc::make_mut(&mut children[i]), hash, depth + 1, key);
            if empty {
                // Its buckets go to the child before it (the first child's, to the next one,
                // which then starts at 0).
                let drop = if i == 0 {
                    let rest = *bitmap & (*bitmap - 1);
                    rest & rest.wrapping_neg()
                } else {
                    1 << range(*bitmap, i).0
                };
                *bitmap &= !drop;
                children.remove(i);
                children.shrink_to_fit();
            }
            (old, children.is_empty())
        }
        Node::Leaf(entries) => match find(entries, hash, key) {
            Ok(i) => {
                let slot = entries.remove(i);
                if entries.capacity() - entries.len() > GROW {
                    entries.shrink_to_fit();
                }
                (Some(slot.entry.into_value()), entries.is_empty())
            }
            Err(_) => (None, entries.is_empty()),
        },
    }
}

fn diff_nodes<'a, E: Entry>(
    old: Option<&'a Node<E>>,
    new: Option<&'a Node<E>>,
    changed: &mut impl FnMut(&'a E::Key),
) where
    E::Value: PartialEq,
{
    match (old, new) {
        (None, None) => {}
        (Some(a), Some(b)) if std::ptr::eq(a, b) => {}
        (
            Some(Node::Branch {
                bitmap: ob,
                children: oc,
            }),
            Some(Node::Branch {
                bitmap: nb,
                children: nc,
            }),
        ) if ob == nb => {
            // The same ranges: child by child.
            for (o, n) in oc.iter().zip(nc) {
                diff_nodes(Some(o), Some(n), changed);
            }
        }
        (old, new) => {
            // Different shapes (or leaves): compare the sorted entries of each side.
            let mut a: Vec<&'a E> = Vec::new();
            let mut b: Vec<&'a E> = Vec::new();
            collect(old, &mut a);
            collect(new, &mut b);
            a.sort_by(|x, y| x.key().cmp(y.key()));
            b.sort_by(|x, y| x.key().cmp(y.key()));
            let (mut i, mut j) = (0, 0);
            loop {
                match (a.get(i), b.get(j)) {
                    (Some(x), Some(y)) => match x.key().cmp(y.key()) {
                        std::cmp::Ordering::Less => {
                            changed(x.key());
                            i += 1;
                        }
                        std::cmp::Ordering::Greater => {
                            changed(y.key());
                            j += 1;
                        }
                        std::cmp::Ordering::Equal => {
                            if x.value() != y.value() {
                                changed(y.key());
                            }
                            i += 1;
                            j += 1;
                        }
                    },
                    (Some(x), None) => {
                        changed(x.key());
                        i += 1;
                    }
                    (None, Some(y)) => {
                        changed(y.key());
                        j += 1;
                    }
                    (None, None) => break,
                }
            }
        }
    }
}

fn collect<'a, E>(node: Option<&'a Node<E>>, out: &mut Vec<&'a E>) {
    match node {
        None => {}
        Some(Node::Leaf(entries)) => out.extend(entries.iter().map(|s| &s.entry)),
        Some(Node::Branch { children, .. }) => {
            for child in children {
                collect(Some(child), out);
            }
        }
    }
}

/// Iterates a [`Trie`] depth first.
pub struct Iter<'a, E> {
    stack: Vec<std::slice::Iter<'a, Arc<Node<E>>>>,
    leaf: std::slice::Iter<'a, Slot<E>>,
    root: Option<&'a Node<E>>,
}

impl<'a, E> Iter<'a, E> {
    fn enter(&mut self, node: &'a Node<E>) {
        match node {
            Node::Branch { children, .. } => self.stack.push(children.iter()),
            Node::Leaf(entries) => self.leaf = entries.iter(),
        }
    }
}

impl<'a, E: Entry> Iterator for Iter<'a, E> {
    type Item = (&'a E::Key, &'a E::Value);

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(root) = self.root.take() {
            self.enter(root);
        }
        loop {
            if let Some(slot) = self.leaf.next() {
                return Some((slot.entry.key(), slot.entry.value()));
            }
            let next = self.stack.last_mut()?.next();
            match next {
                Some(child) => self.enter(child),
                None => {
                    self.stack.pop();
                }
            }
        }
    }
}

impl<'a, E: Entry> IntoIterator for &'a Trie<E> {
    type Item = (&'a E::Key, &'a E::Value);
    type IntoIter = Iter<'a, E>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<E: Entry> FromIterator<(E::Key, E::Value)> for Trie<E> {
    fn from_iter<I: IntoIterator<Item = (E::Key, E::Value)>>(iter: I) -> Self {
        let mut map = Trie::new();
        map.extend(iter);
        map
    }
}

impl<E: Entry> Extend<(E::Key, E::Value)> for Trie<E> {
    fn extend<I: IntoIterator<Item = (E::Key, E::Value)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl<E: Entry, Q> std::ops::Index<&Q> for Trie<E>
where
    E::Key: Borrow<Q>,
    Q: Hash + Ord + ?Sized,
{
    type Output = E::Value;

    /// The value at `key`; panics if there is none.
    fn index(&self, key: &Q) -> &E::Value {
        self.get(key).expect("Trie: no entry for key")
    }
}

impl<E: Entry> PartialEq for Trie<E>
where
    E::Value: PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && (self.ptr_eq(other) || self.iter().all(|(k, v)| other.get(k) == Some(v)))
    }
}

impl<E: Entry> Eq for Trie<E> where E::Value: Eq {}

impl<E: Entry> fmt::Debug for Trie<E>
where
    E::Key: fmt::Debug,
    E::Value: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests;
