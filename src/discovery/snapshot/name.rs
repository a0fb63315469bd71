//! Resource names: [`Name`], one shared allocation per name, and [`NameSet`], a sorted set of
//! them shared between snapshots.

use std::sync::Arc;

/// A resource name. One allocation shared by the resource, its map key, the alias, member and
/// node indexes and the change history, where `String`s would store a workload's uid five times.
/// An `ArcStr` keeps the length in the allocation, so each of those holders is a thin 8-byte
/// pointer (an `Arc<str>` is 16): about 30 B per pod in a 100k-pod mesh.
pub(crate) type Name = arcstr::ArcStr;

/// Resource names, sorted and unique, shared between snapshots: the names with one
/// `network/ip`, and the workloads of one service or node. An address's are nearly always
/// one, kept inline (a shared slice of one name would cost a 32-byte allocation per pod).
///
/// Several names are a shared `Vec` rather than a slice: while the index holds the only copy
/// (a cold build), adding a name grows it in place, where a slice would be re-allocated at
/// every size and a node's hundred pods would leave freed blocks of a hundred sizes behind,
/// memory per pod that benchmark T2 counts. A shared one is copied at its exact size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameSet {
    One(Name),
    Many(Arc<Vec<Name>>),
}

impl NameSet {
    /// Adds `name` at `at` (where a binary search put it), in place unless shared.
    pub(crate) fn insert(&mut self, at: usize, name: Name) {
        match self {
            NameSet::One(first) => {
                let mut names = Vec::with_capacity(2);
                names.push(first.clone());
                names.insert(at, name);
                *self = NameSet::Many(Arc::new(names));
            }
            NameSet::Many(shared) => match Arc::get_mut(shared) {
                Some(names) => {
                    names.reserve_exact(1);
                    names.insert(at, name);
                }
                None => {
                    let mut names = Vec::with_capacity(shared.len() + 1);
                    names.extend_from_slice(&shared[..at]);
                    names.push(name);
                    names.extend_from_slice(&shared[at..]);
                    *shared = Arc::new(names);
                }
            },
        }
    }

    /// Removes the name at `at`; `false` when it was the last.
    pub(crate) fn remove(&mut self, at: usize) -> bool {
        match self {
            NameSet::One(_) => false,
            NameSet::Many(shared) => {
                if shared.len() == 2 {
                    *self = NameSet::One(shared[1 - at].clone());
                    return true;
                }
                match Arc::get_mut(shared) {
                    Some(names) => {
                        names.remove(at);
                        if names.capacity() > names.len() + 4 {
                            names.shrink_to_fit();
                        }
                    }
                    None => {
                        let mut names = Vec::with_capacity(shared.len() - 1);
                        names.extend_from_slice(&shared[..at]);
                        names.extend_from_slice(&shared[at + 1..]);
                        *shared = Arc::new(names);
                    }
                }
                true
            }
        }
    }
}

impl std::ops::Deref for NameSet {
    type Target = [Name];

    fn deref(&self) -> &[Name] {
        match self {
            NameSet::One(name) => std::slice::from_ref(name),
            NameSet::Many(names) => names,
        }
    }
}

impl<'a> IntoIterator for &'a NameSet {
    type Item = &'a Name;
    type IntoIter = std::slice::Iter<'a, Name>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<Name>> for NameSet {
    fn from(mut names: Vec<Name>) -> Self {
        match names.len() {
            1 => NameSet::One(names.pop().expect("one name")),
            _ => {
                names.shrink_to_fit();
                NameSet::Many(Arc::new(names))
            }
        }
    }
}
