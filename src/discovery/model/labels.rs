//! [`Labels`]: a sorted, immutable-by-default string map for labels, annotations and
//! selectors.
//!
//! Every reduced object holds a few of these, and 100k pods hold 100k of them, so their size
//! matters more than their speed of mutation. A `BTreeMap<String, String>` allocates a node of
//! eleven slots (about 540 bytes) even for one entry, plus two strings per entry. `Labels` is
//! one shared, sorted slice of key/value pairs ([`CompactString`]s, inline up to 24 bytes):
//! one allocation for any number of short entries, none when empty, and shared by clones, so
//! equal maps interned by [`LabelSets`] (the pods of one ReplicaSet) hold one copy. Keys are
//! unique, so equality is that of the entries and lookups are a binary search. Building one
//! sorts the entries (the last value of a repeated key wins, as `BTreeMap::from_iter`);
//! `insert` rebuilds, and is meant for tests and merges, not hot paths.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use compact_str::CompactString;
use foldhash::HashSet;

/// A sorted map of label keys to values, shared by its clones.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    /// Sorted by key, keys unique; `None` when there are no entries.
    entries: Option<Arc<[(CompactString, CompactString)]>>,
}

impl Labels {
    pub(crate) fn new() -> Self {
        Labels::default()
    }

    fn entries(&self) -> &[(CompactString, CompactString)] {
        self.entries.as_deref().unwrap_or_default()
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_none()
    }

    /// How many maps share this one's entries (0 when empty).
    fn holders(&self) -> usize {
        self.entries.as_ref().map_or(0, Arc::strong_count)
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.entries()
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.find(key).ok().map(|i| self.entries()[i].1.as_str())
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Entries in key order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        self.entries().iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The entry with the smallest key.
    #[cfg(test)]
    pub(crate) fn first(&self) -> Option<(&str, &str)> {
        self.iter().next()
    }

    /// Sets one entry (rebuilding the whole map).
    pub(crate) fn insert(&mut self, key: impl AsRef<str>, value: impl AsRef<str>) {
        let (key, value) = (key.as_ref(), value.as_ref());
        let mut entries: Vec<(CompactString, CompactString)> = self.entries().to_vec();
        match self.find(key) {
            Ok(i) => entries[i].1 = value.into(),
            Err(i) => entries.insert(i, (key.into(), value.into())),
        }
        *self = Labels::from_sorted(entries);
    }

    /// Adds every entry of `other`, whose values win.
    pub(crate) fn extend_from(&mut self, other: &Labels) {
        if other.is_empty() {
            return;
        }
        *self = self.iter().chain(other.iter()).collect();
    }

    /// Entries already sorted by key, with unique keys.
    fn from_sorted(entries: Vec<(CompactString, CompactString)>) -> Self {
        Labels {
            entries: (!entries.is_empty()).then(|| Arc::from(entries)),
        }
    }

    /// Entries in any order; the last value of a repeated key wins.
    fn from_entries<K: AsRef<str>, V: AsRef<str>>(mut entries: Vec<(K, V)>) -> Self {
        // Stable, so equal keys keep their order and the last one can win.
        entries.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        let mut unique: Vec<(CompactString, CompactString)> = Vec::with_capacity(entries.len());
        for (k, v) in &entries {
            match unique.last_mut() {
                Some(last) if last.0 == k.as_ref() => last.1 = v.as_ref().into(),
                _ => unique.push((k.as_ref().into(), v.as_ref().into())),
            }
        }
        Labels::from_sorted(unique)
    }
}

/// Interned label maps: [`LabelSets::share`] gives a map the buffer of an equal one already
/// held, so the pods of one ReplicaSet (equal labels, as a rule) keep one copy between them.
/// The store interns the labels of the pods it holds.
#[derive(Debug, Default)]
pub(crate) struct LabelSets {
    sets: HashSet<Labels>,
}

impl LabelSets {
    /// Makes `labels` share the buffer of an equal map interned before, or interns it.
    pub(crate) fn share(&mut self, labels: &mut Labels) {
        if labels.is_empty() {
            return;
        }
        match self.sets.get(labels) {
            Some(interned) => *labels = interned.clone(),
            None => {
                self.sets.insert(labels.clone());
            }
        }
    }

    /// Called as the holder of `labels` (shared by [`LabelSets::share`]) leaves, while it is
    /// still alive: forgets the map if that holder was its last. Maps whose last holder left
    /// without this (a clone kept elsewhere at the time) are swept once they outnumber `live`,
    /// the holders left.
    pub(crate) fn release(&mut self, labels: &Labels, live: usize) {
        if labels.holders() == 2 {
            self.sets.remove(labels);
        }
        if self.sets.len() > live {
            self.sets.retain(|l| l.holders() > 1);
        }
    }

    /// How many distinct maps are interned.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.sets.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }
}

/// Entries of [`Labels`], in key order.
pub(crate) type Iter<'a> = std::iter::Map<
    std::slice::Iter<'a, (CompactString, CompactString)>,
    fn(&'a (CompactString, CompactString)) -> (&'a str, &'a str),
>;

impl<'a> IntoIterator for &'a Labels {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Labels::from_entries(iter.into_iter().collect())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> From<[(K, V); N]> for Labels {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        Labels::from_sorted(
            map.into_iter()
                .map(|(k, v)| (CompactString::from(k), CompactString::from(v)))
                .collect(),
        )
    }
}

impl std::ops::Index<&str> for Labels {
    type Output = str;

    fn index(&self, key: &str) -> &str {
        self.get(key).expect("no such label")
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_sorted_unique_and_the_last_value_wins() {
        let labels: Labels = [("b", "2"), ("a", "1"), ("b", "3"), ("", "empty")]
            .into_iter()
            .collect();
        let entries: Vec<_> = labels.iter().collect();
        assert_eq!(entries, vec![("", "empty"), ("a", "1"), ("b", "3")]);
        assert_eq!(labels.len(), 3);
        assert_eq!(labels.get("b"), Some("3"));
        assert_eq!(labels.get("c"), None);
        assert_eq!(&labels["a"], "1");
        assert!(labels.contains_key(""));
        assert_eq!(labels.first(), Some(("", "empty")));
        assert_eq!(labels.iter().next_back(), Some(("b", "3")));
        assert_eq!(
            format!("{labels:?}"),
            r#"{"": "empty", "a": "1", "b": "3"}"#
        );
    }

    #[test]
    fn equal_maps_are_equal_whatever_the_order_they_were_built_in() {
        let one = Labels::from([("x", "1"), ("y", "2")]);
        let mut two = Labels::from([("y", "2")]);
        two.insert("x", "1");
        assert_eq!(one, two);
        two.insert("x", "3");
        assert_eq!(two.get("x"), Some("3"));
        assert_ne!(one, two);
        let mut merged = one.clone();
        merged.extend_from(&Labels::from([("x", "9"), ("z", "0")]));
        assert_eq!(merged, Labels::from([("x", "9"), ("y", "2"), ("z", "0")]));
    }

    #[test]
    fn keys_and_values_may_hold_any_text_and_long_maps_work() {
        let long = "x".repeat(300);
        let entries: Vec<(String, String)> = (0..200)
            .map(|i| {
                (
                    format!("k{i:03}/é"),
                    if i % 2 == 0 {
                        long.clone()
                    } else {
                        String::new()
                    },
                )
            })
            .collect();
        let labels: Labels = entries.iter().cloned().collect();
        assert_eq!(labels.len(), 200);
        for (k, v) in &entries {
            assert_eq!(labels.get(k), Some(v.as_str()), "{k}");
        }
        let back: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(back, entries);
        let small = Labels::from([("app", "web"), ("version", "v1")]);
        assert_eq!(small.get("version"), Some("v1"));
        assert_eq!(small.get("other"), None);
    }

    #[test]
    fn empty_labels_allocate_nothing_and_values_may_be_empty() {
        let empty = Labels::new();
        assert!(empty.is_empty() && empty.iter().next().is_none());
        assert_eq!(Labels::from([("k", "")]).get("k"), Some(""));
        let from_map: Labels = BTreeMap::from([("k".to_string(), "v".to_string())]).into();
        assert_eq!(from_map, Labels::from([("k", "v")]));
    }

    fn same_buffer(a: &Labels, b: &Labels) -> bool {
        Arc::ptr_eq(a.entries.as_ref().unwrap(), b.entries.as_ref().unwrap())
    }

    #[test]
    fn label_sets_share_equal_maps_and_forget_each_with_its_last_holder() {
        let mut sets = LabelSets::default();
        let mut a = Labels::from([("app", "web"), ("version", "v1")]);
        let mut b = Labels::from([("version", "v1"), ("app", "web")]);
        let mut c = Labels::from([("app", "db")]);
        let mut empty = Labels::new();
        for labels in [&mut a, &mut b, &mut c, &mut empty] {
            sets.share(labels);
        }
        assert!(same_buffer(&a, &b), "equal maps share one buffer");
        assert!(!same_buffer(&a, &c));
        assert_eq!(a, Labels::from([("app", "web"), ("version", "v1")]));
        assert_eq!(
            sets.len(),
            2,
            "one entry per distinct map; the empty map is not kept"
        );
        // b leaves while a still holds the map: it stays.
        sets.release(&b, 2);
        drop(b);
        assert_eq!(sets.len(), 2);
        let mut again = Labels::from([("app", "web"), ("version", "v1")]);
        sets.share(&mut again);
        assert!(same_buffer(&a, &again));
        sets.release(&again, 2);
        drop(again);
        // a was the last holder.
        sets.release(&a, 1);
        drop(a);
        assert_eq!(sets.len(), 1);
        // c's holder leaves without releasing: the entry is swept once entries outnumber the
        // holders left.
        drop(c);
        sets.release(&empty, 0);
        assert!(sets.is_empty());
    }
}
