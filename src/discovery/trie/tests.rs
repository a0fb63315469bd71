//! The trie's tests: it follows a `BTreeMap`, clones stay apart, `diff` is exact, and leaves
//! stay within their bounds and well filled.

use super::*;
use std::collections::BTreeMap;

#[test]
fn follows_a_btreemap_through_inserts_and_removes() {
    let mut trie: HashTrie<String, u32> = HashTrie::new();
    let mut model = BTreeMap::new();
    // Enough keys for two levels of branches; a simple LCG picks the operations.
    let mut seed = 12345u64;
    for step in 0..20_000u32 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = format!("key-{}", (seed >> 33) % 5_000);
        if (seed >> 20).is_multiple_of(4) {
            assert_eq!(
                trie.remove(key.as_str()),
                model.remove(&key),
                "remove {key}"
            );
        } else {
            assert_eq!(trie.insert(key.clone(), step), model.insert(key, step));
        }
        assert_eq!(trie.len(), model.len());
    }
    let mut all: Vec<(String, u32)> = trie.iter().map(|(k, v)| (k.clone(), *v)).collect();
    all.sort();
    assert_eq!(all, model.into_iter().collect::<Vec<_>>());
    for (k, v) in &all {
        assert_eq!(trie.get(k.as_str()), Some(v));
    }
    assert!(trie.get("absent").is_none());
}

#[test]
fn a_clone_keeps_its_state_while_the_original_changes() {
    let mut a: HashTrie<u32, u32> = (0..1_000).map(|i| (i, i)).collect();
    let b = a.clone();
    assert!(a.ptr_eq(&b));
    a.insert(5, 50);
    a.remove(&7);
    *a.get_mut(&9).unwrap() = 90;
    assert_eq!(b.get(&5), Some(&5));
    assert_eq!(b.get(&7), Some(&7));
    assert_eq!(b.get(&9), Some(&9));
    assert_eq!(a.get(&5), Some(&50));
    assert_eq!(a.get(&7), None);
    assert_eq!(a.get(&9), Some(&90));
    assert_eq!((a.len(), b.len()), (999, 1_000));
    assert_ne!(a, b);
}

#[test]
fn diff_names_exactly_the_changed_keys() {
    let old: HashTrie<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
    let mut new = old.clone();
    new.insert(3, 30);
    new.insert(20_000, 1);
    new.remove(&4_000);
    new.insert(77, 77); // the same value: not a change
    let mut changed = Vec::new();
    new.diff(&old, |k| changed.push(*k));
    changed.sort();
    assert_eq!(changed, vec![3, 4_000, 20_000]);
    // Maps built apart share no nodes and compare entry by entry, with the same answer.
    let other: HashTrie<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
    let mut changed = Vec::new();
    new.diff(&other, |k| changed.push(*k));
    changed.sort();
    assert_eq!(changed, vec![3, 4_000, 20_000]);
}

/// A key whose hash is always the same: every entry collides.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Colliding(u32);

impl std::hash::Hash for Colliding {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u32(7);
    }
}

#[test]
fn keys_whose_hashes_collide_share_one_deep_leaf_and_stay_distinct() {
    let mut trie: HashTrie<Colliding, u32> = HashTrie::new();
    for i in 0..200 {
        assert_eq!(trie.insert(Colliding(i), i), None);
    }
    let old = trie.clone();
    for i in 0..200 {
        assert_eq!(trie.get(&Colliding(i)), Some(&i));
    }
    assert_eq!(trie.insert(Colliding(5), 50), Some(5));
    assert_eq!(trie.remove(&Colliding(6)), Some(6));
    assert_eq!(trie.remove(&Colliding(6)), None);
    assert_eq!(trie.len(), 199);
    let mut changed = Vec::new();
    trie.diff(&old, |k| changed.push(k.0));
    changed.sort();
    assert_eq!(changed, vec![5, 6]);
    assert_eq!(old.get(&Colliding(5)), Some(&5));
}

#[test]
fn emptied_maps_free_their_nodes_and_refill() {
    let mut trie: HashTrie<u32, ()> = (0..500).map(|i| (i, ())).collect();
    for i in 0..500 {
        assert_eq!(trie.remove(&i), Some(()));
    }
    assert!(trie.is_empty());
    assert!(trie.root.is_none());
    assert_eq!(trie.iter().count(), 0);
    trie.insert(1, ());
    assert_eq!(trie.iter().count(), 1);
}

#[test]
fn leaves_stay_within_their_bound() {
    let trie: HashTrie<u32, ()> = (0..100_000).map(|i| (i, ())).collect();
    fn check(node: &Node<(u32, ())>) -> usize {
        match node {
            Node::Branch { bitmap, children } => {
                assert_eq!(bitmap.count_ones() as usize, children.len());
                assert_eq!(bitmap & 1, 1, "the first range starts at bucket 0");
                children.iter().map(|c| check(c)).sum()
            }
            Node::Leaf(entries) => {
                assert!(entries.len() <= LEAF_MAX && !entries.is_empty());
                assert!(
                    entries
                        .windows(2)
                        .all(|w| (w[0].hash, w[0].entry.0) < (w[1].hash, w[1].entry.0))
                );
                entries.len()
            }
        }
    }
    assert_eq!(check(trie.root.as_ref().unwrap()), 100_000);
}

/// (leaves, entries) below `node`.
fn leaves<E>(node: &Node<E>) -> (usize, usize) {
    match node {
        Node::Branch { children, .. } => children
            .iter()
            .map(|c| leaves(c))
            .fold((0, 0), |(l, e), (l2, e2)| (l + l2, e + e2)),
        Node::Leaf(entries) => (1, entries.len()),
    }
}

#[test]
fn leaves_stay_well_filled_at_every_size() {
    // A classic HAMT split of a full leaf leaves one or two entries a leaf past 4,096 × 32
    // keys; range splits keep them at least half full on average, and removals keep the
    // map exact.
    for size in [1_000u32, 40_000, 100_000, 150_000, 300_000] {
        let mut trie: HashTrie<u32, ()> = (0..size).map(|i| (i, ())).collect();
        let (count, entries) = leaves(trie.root.as_ref().unwrap());
        assert_eq!(entries, size as usize);
        let mean = entries as f64 / count as f64;
        assert!(
            mean >= LEAF_MAX as f64 / 2.0,
            "{size} keys: {mean:.1} a leaf"
        );
        for i in (0..size).step_by(3) {
            assert_eq!(trie.remove(&i), Some(()));
        }
        assert_eq!(trie.len(), (size - size.div_ceil(3)) as usize);
        assert!((0..size).all(|i| trie.contains_key(&i) != i.is_multiple_of(3)));
    }
}

/// Checks a branch's ranges: bit 0 set, one child per set bit, none empty.
fn check_shape<E>(node: &Node<E>) {
    if let Node::Branch { bitmap, children } = node {
        assert_eq!(bitmap & 1, 1, "the first range starts at bucket 0");
        assert_eq!(bitmap.count_ones() as usize, children.len());
        for child in children {
            match &**child {
                Node::Leaf(entries) => assert!(!entries.is_empty()),
                branch => check_shape(branch),
            }
        }
    }
}

#[test]
fn removing_whole_ranges_hands_their_buckets_to_a_neighbour() {
    let mut trie: HashTrie<u32, u32> = (0..3_000).map(|i| (i, i)).collect();
    // In iteration (hash) order, so the first and then the middle children empty whole.
    let order: Vec<u32> = trie.keys().copied().collect();
    let (first, rest) = order.split_at(600);
    let (middle, _) = rest.split_at(900);
    for k in first.iter().chain(&middle[300..]) {
        assert_eq!(trie.remove(k), Some(*k));
    }
    check_shape(trie.root.as_ref().unwrap());
    let gone: std::collections::BTreeSet<u32> =
        first.iter().chain(&middle[300..]).copied().collect();
    for i in 0..3_000 {
        assert_eq!(
            trie.get(&i).copied(),
            (!gone.contains(&i)).then_some(i),
            "{i}"
        );
    }
    // Keys of the emptied buckets go back in, into the neighbours that took them over.
    for k in &gone {
        assert_eq!(trie.insert(*k, *k + 1), None);
    }
    check_shape(trie.root.as_ref().unwrap());
    assert_eq!(trie.len(), 3_000);
    for i in 0..3_000 {
        let want = if gone.contains(&i) { i + 1 } else { i };
        assert_eq!(trie.get(&i), Some(&want));
    }
}
