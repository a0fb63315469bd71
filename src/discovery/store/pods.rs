//! [`Pods`]: the store's pods, by namespace and then name.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use arcstr::ArcStr;
use foldhash::{HashMap, HashSet};

use crate::discovery::model::Pod;
use crate::discovery::model::labels::LabelSets;

/// Pods by namespace, then name. A pod is keyed by its own `namespace` and `name` fields, so
/// the store keeps no separate key strings nor a per-namespace name set; each pod is boxed so
/// that a half-empty table slot costs 8 bytes, not a whole pod. Equal label maps
/// ([`LabelSets`]) and equal strings ([`Pod::share_strings`]) are stored once.
#[derive(Debug, Default)]
pub(crate) struct Pods {
    by_namespace: HashMap<Box<str>, HashSet<ByName>>,
    len: usize,
    /// The pods' labels, interned: a ReplicaSet's pods share one buffer.
    label_sets: LabelSets,
    /// The strings pods repeat (namespaces, nodes, service accounts, owners...), interned.
    strings: HashSet<ArcStr>,
}

/// A stored pod, hashed and compared by name (unique within its namespace's set).
#[derive(Debug)]
struct ByName(Box<Pod>);

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for ByName {}

impl Hash for ByName {
    // The same hash as the `str` it borrows as.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name().hash(state);
    }
}

impl Pods {
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<&Pod> {
        Some(&self.by_namespace.get(namespace)?.get(name)?.0)
    }

    /// Stores a pod; returns the one it replaces.
    pub(crate) fn insert(&mut self, mut pod: Pod) -> Option<Pod> {
        self.label_sets.share(pod.labels_mut());
        let strings = &mut self.strings;
        pod.share_strings(|s| {
            if s.is_empty() {
                return;
            }
            match strings.get(s.as_str()) {
                Some(interned) => *s = interned.clone(),
                None => {
                    strings.insert(s.clone());
                }
            }
        });
        let set = match self.by_namespace.get_mut(pod.namespace()) {
            Some(set) => set,
            None => self.by_namespace.entry(pod.namespace().into()).or_default(),
        };
        let mut old = set.replace(ByName(Box::new(pod))).map(|old| *old.0);
        match &mut old {
            Some(old) => {
                self.label_sets.release(old.labels(), self.len);
                release_strings(&mut self.strings, old, self.len);
            }
            None => self.len += 1,
        }
        old
    }

    pub(crate) fn remove(&mut self, namespace: &str, name: &str) -> Option<Pod> {
        let set = self.by_namespace.get_mut(namespace)?;
        let pod = set.take(name)?;
        if set.is_empty() {
            self.by_namespace.remove(namespace);
        }
        self.len -= 1;
        self.label_sets.release(pod.0.labels(), self.len);
        let mut pod = *pod.0;
        release_strings(&mut self.strings, &mut pod, self.len);
        Some(pod)
    }

    /// The pods of one namespace, in no particular order.
    pub(crate) fn in_namespace<'a>(
        &'a self,
        namespace: &str,
    ) -> impl Iterator<Item = &'a Pod> + 'a {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flat_map(|set| set.iter().map(|p| &*p.0))
    }

    /// Every pod, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Pod> {
        self.by_namespace
            .values()
            .flat_map(|set| set.iter().map(|p| &*p.0))
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Forgets the interned strings `pod` (which is leaving) was the last pod to hold. A string
/// the pod held twice is not seen as its last holder's; such strings are swept once they could
/// be a noticeable share of the set.
fn release_strings(strings: &mut HashSet<ArcStr>, pod: &mut Pod, live: usize) {
    pod.share_strings(|s| {
        // Held by the set and by this pod only.
        if ArcStr::strong_count(s) == Some(2) {
            strings.remove(s.as_str());
        }
    });
    if strings.len() > 16 * live + 1024 {
        strings.retain(|s| ArcStr::strong_count(s).is_none_or(|n| n > 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::labels::Labels;
    use crate::discovery::model::pod::PodFields;

    fn pod(name: &str, app: &str) -> Pod {
        Pod::from(PodFields {
            name: name.into(),
            namespace: "ns".into(),
            labels: Labels::from([("app", app), ("pod-template-hash", "7d4b9")]),
            ..Default::default()
        })
    }

    #[test]
    fn pods_with_equal_labels_share_them_until_the_last_leaves() {
        let mut pods = Pods::default();
        for (name, app) in [("web-1", "web"), ("web-2", "web"), ("db-1", "db")] {
            assert!(pods.insert(pod(name, app)).is_none());
        }
        assert_eq!(pods.label_sets.len(), 2);
        let web = |name| pods.get("ns", name).unwrap().labels().clone();
        assert_eq!(web("web-1"), web("web-2"));
        // Replacing a pod (a status change) keeps its labels interned for its sibling.
        assert!(pods.insert(pod("web-1", "web")).is_some());
        assert_eq!(pods.label_sets.len(), 2);
        // A relabelled pod moves to its new map.
        assert!(pods.insert(pod("db-1", "web")).is_some());
        assert_eq!(pods.label_sets.len(), 1);
        for name in ["web-1", "web-2", "db-1"] {
            assert!(pods.remove("ns", name).is_some());
        }
        assert!(pods.label_sets.is_empty());
        assert!(pods.strings.is_empty(), "{:?}", pods.strings);
        assert!(pods.is_empty());
    }
}
