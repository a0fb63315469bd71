//! [`SmallSet`]: the store's small sorted sets.

/// A sorted set kept as a vector with no spare capacity. The store's per-hostname and
/// per-selector sets hold one or two entries each, where a `BTreeSet` allocates a node of
/// eleven (632 to 896 bytes per Service).
#[derive(Debug)]
pub(crate) struct SmallSet<T>(Vec<T>);

impl<T> Default for SmallSet<T> {
    fn default() -> Self {
        SmallSet(Vec::new())
    }
}

impl<T: Ord> SmallSet<T> {
    pub(crate) fn insert(&mut self, item: T) {
        if let Err(i) = self.0.binary_search(&item) {
            self.0.reserve_exact(1);
            self.0.insert(i, item);
        }
    }

    pub(crate) fn remove(&mut self, item: &T) {
        if let Ok(i) = self.0.binary_search(item) {
            self.0.remove(i);
            self.0.shrink_to_fit();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// In order.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

impl<'a, T> IntoIterator for &'a SmallSet<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}
