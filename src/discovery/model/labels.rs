//! [`Labels`]: a compact, sorted, immutable-by-default string map for labels, annotations and
//! selectors.
//!
//! Every reduced object holds a few of these, and 100k pods hold 100k of them, so their size
//! matters more than their speed of mutation. A `BTreeMap<String, String>` allocates a node of
//! eleven slots (about 540 bytes) even for one entry, plus two strings per entry. `Labels`
//! packs all keys and values into one string, after a table of their end offsets: one
//! allocation for any number of entries, none when empty. The offsets are written as ASCII
//! (seven bits a byte, one byte each for a map under 128 bytes, as most are), so the whole
//! buffer is a `str` and no unsafe code is needed to read it. Entries are sorted by key with unique keys, so
//! equality is that of the bytes and lookups are a binary search. Building one sorts the entries
//! (the last value of a repeated key wins, as `BTreeMap::from_iter`); `insert` rebuilds, and is
//! meant for tests and merges, not hot paths.

use arcstr::ArcStr;
use foldhash::HashSet;
use std::collections::BTreeMap;
use std::fmt;

/// A sorted map of label keys to values, packed into one allocation.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    /// The width `w` of the head's numbers (one byte: 1 to 4); the entry count; the end offset
    /// of each key and value (`2 * len` of them, counted from the start of the buffer); each
    /// number as `w` bytes of seven bits. Then every key and value, in order: `k0 v0 k1 v1 ...`.
    /// `None` when there are no entries. Shared, so that equal maps interned by [`LabelSets`]
    /// (the pods of one ReplicaSet) hold one buffer; a thin pointer, so a map is 8 bytes.
    text: Option<ArcStr>,
}

/// The widest head number: four bytes of seven bits, so a map of 256 MiB at most.
const MAX_WIDTH: usize = 4;

/// `n` as `width` bytes of seven bits, low first: ASCII, so a buffer of numbers and text stays
/// a `str` (here and in [`crate::discovery::model::pod::Pod`]).
fn put_seven_bits(out: &mut String, n: usize, width: usize) {
    debug_assert!(n < 1 << (7 * width));
    for i in 0..width {
        out.push(char::from(((n >> (7 * i)) & 0x7f) as u8));
    }
}

/// Number `i` of a buffer that starts with a width byte `w` followed by numbers that
/// [`put_seven_bits`] wrote `w` bytes each (a `Labels` head).
fn head_number(buf: &[u8], i: usize) -> usize {
    match buf[0] {
        // Nearly every map and pod: one byte each.
        1 => usize::from(buf[1 + i]),
        width => {
            let width = usize::from(width);
            buf[1 + i * width..1 + (i + 1) * width]
                .iter()
                .enumerate()
                .fold(0, |n, (j, byte)| n | (usize::from(*byte) << (7 * j)))
        }
    }
}

impl Labels {
    pub(crate) fn new() -> Self {
        Labels::default()
    }

    /// The packed buffer; empty when there are no entries.
    fn text(&self) -> &str {
        self.text.as_deref().unwrap_or_default()
    }

    fn width(&self) -> usize {
        usize::from(self.text().as_bytes()[0])
    }

    fn word(&self, i: usize) -> usize {
        head_number(self.text().as_bytes(), i)
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        if self.is_empty() { 0 } else { self.word(0) }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.text.is_none()
    }

    /// How many maps share this one's buffer (0 when empty).
    fn holders(&self) -> usize {
        self.text
            .as_ref()
            .and_then(ArcStr::strong_count)
            .unwrap_or(0)
    }

    /// The end of key (even `i`) or value (odd `i`) number `i / 2`.
    fn end(&self, i: usize) -> usize {
        self.word(1 + i)
    }

    /// Where the first key starts.
    fn start(&self) -> usize {
        1 + (1 + 2 * self.len()) * self.width()
    }

    fn bound(&self, i: usize) -> usize {
        if i == 0 {
            self.start()
        } else {
            self.end(i - 1)
        }
    }

    fn key_at(&self, i: usize) -> &str {
        &self.text()[self.bound(2 * i)..self.end(2 * i)]
    }

    fn entry(&self, i: usize) -> (&str, &str) {
        let (start, mid, end) = (self.bound(2 * i), self.end(2 * i), self.end(2 * i + 1));
        let text = self.text();
        (&text[start..mid], &text[mid..end])
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = (low + high) / 2;
            match self.key_at(mid).cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(low)
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.find(key).ok().map(|i| self.entry(i).1)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    /// Entries in key order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        Iter {
            labels: self,
            front: 0,
            back: self.len(),
        }
    }

    /// The entry with the smallest key.
    #[cfg(test)]
    pub(crate) fn first(&self) -> Option<(&str, &str)> {
        self.iter().next()
    }

    /// Sets one entry (rebuilding the whole map).
    pub(crate) fn insert(&mut self, key: impl AsRef<str>, value: impl AsRef<str>) {
        let (key, value) = (key.as_ref(), value.as_ref());
        let mut entries: Vec<(&str, &str)> = self.iter().collect();
        match self.find(key) {
            Ok(i) => entries[i].1 = value,
            Err(i) => entries.insert(i, (key, value)),
        }
        *self = Labels::from_sorted(&entries);
    }

    /// Adds every entry of `other`, whose values win.
    pub(crate) fn extend_from(&mut self, other: &Labels) {
        if other.is_empty() {
            return;
        }
        *self = self.iter().chain(other.iter()).collect();
    }

    /// Packs entries already sorted by key, with unique keys.
    fn from_sorted(entries: &[(&str, &str)]) -> Self {
        if entries.is_empty() {
            return Labels::default();
        }
        let content: usize = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        let head = |width: usize| 1 + (1 + 2 * entries.len()) * width;
        let width = (1..=MAX_WIDTH)
            .find(|&w| head(w) + content < 1 << (7 * w))
            .expect("labels over 256 MiB");
        let size = head(width) + content;
        let mut text = String::with_capacity(size);
        text.push(char::from(width as u8));
        put_seven_bits(&mut text, entries.len(), width);
        let mut end = head(width);
        for (k, v) in entries {
            end += k.len();
            put_seven_bits(&mut text, end, width);
            end += v.len();
            put_seven_bits(&mut text, end, width);
        }
        for (k, v) in entries {
            text.push_str(k);
            text.push_str(v);
        }
        debug_assert_eq!(text.len(), size);
        Labels {
            text: Some(ArcStr::from(text)),
        }
    }

    /// Packs entries in any order; the last value of a repeated key wins.
    fn from_entries<K: AsRef<str>, V: AsRef<str>>(mut entries: Vec<(K, V)>) -> Self {
        // Stable, so equal keys keep their order and the last one can win.
        entries.sort_by(|a, b| a.0.as_ref().cmp(b.0.as_ref()));
        let mut unique: Vec<(&str, &str)> = Vec::with_capacity(entries.len());
        for (k, v) in &entries {
            match unique.last_mut() {
                Some(last) if last.0 == k.as_ref() => last.1 = v.as_ref(),
                _ => unique.push((k.as_ref(), v.as_ref())),
            }
        }
        Labels::from_sorted(&unique)
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
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    labels: &'a Labels,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.front += 1;
        Some(self.labels.entry(self.front - 1))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front == self.back {
            return None;
        }
        self.back -= 1;
        Some(self.labels.entry(self.back))
    }
}

impl ExactSizeIterator for Iter<'_> {}

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
        let entries: Vec<(&str, &str)> =
            map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Labels::from_sorted(&entries)
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
        assert_eq!(labels.width(), 3);
        // A small map spends one byte per number.
        let small = Labels::from([("app", "web"), ("version", "v1")]);
        assert_eq!(small.width(), 1);
        assert_eq!(small.text().len(), 1 + 5 + "appwebversionv1".len());
        assert_eq!(small.get("version"), Some("v1"));
        assert_eq!(std::mem::size_of::<Labels>(), 8);
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
        ArcStr::ptr_eq(a.text.as_ref().unwrap(), b.text.as_ref().unwrap())
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
