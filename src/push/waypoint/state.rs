//! What one waypoint stream holds for one type, and what it must be sent next: pure, so the
//! delta rules are table-tested without a stream.
//!
//! Listeners and clusters are wildcard: the proxy holds the whole set, and a name that leaves
//! it is removed. ClusterLoadAssignments are asked for by name; a name that is no longer
//! asked for is forgotten (the proxy dropped it). `istio.workload.Workload` is wildcard over
//! every workload. Each resource is sent only when the proxy does not hold its version: a
//! proxy that reconnects with `initial_resource_versions` gets only what changed, and an
//! endpoint change sends one ClusterLoadAssignment and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use crate::discovery::snapshot::Name;
use crate::discovery::{Resource, Version};
use crate::push::known::KnownVersions;
use crate::push::subscription::InFlight;

/// One type's state on a waypoint stream.
#[derive(Clone, Debug, Default)]
pub struct WaypointTypeState {
    pub wildcard: bool,
    /// Names asked for explicitly.
    pub names: BTreeSet<String>,
    /// What the proxy holds (or has been sent): name -> version.
    pub held: HashMap<String, Version>,
    /// The nonce of the last response sent (an ACK or NACK names it).
    pub last_nonce: String,
    pub in_flight: InFlight,
}

/// Names to send and names to remove, for one response.
#[derive(Debug, Default, PartialEq)]
pub struct WaypointDelta {
    pub resources: Vec<Arc<Resource>>,
    pub removed: Vec<String>,
}

impl WaypointDelta {
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }
}

impl WaypointTypeState {
    /// The state after a type's first request: wildcard when it names nothing (or `*`), and
    /// holding what the proxy says it holds.
    pub fn initial(subscribe: &[String], known: &KnownVersions) -> Self {
        let mut state = WaypointTypeState {
            wildcard: subscribe.is_empty(),
            ..Default::default()
        };
        state.subscribe(subscribe, &[]);
        for (name, version) in known.iter() {
            if let Some(version) = parse_version(version) {
                state.held.insert(name.to_string(), version);
            } else {
                // A version that is not ours: the resource is re-sent.
                state.held.insert(name.to_string(), Version::default());
            }
        }
        state
    }

    /// Applies a subscription change; returns the names newly asked for.
    pub fn subscribe(&mut self, subscribe: &[String], unsubscribe: &[String]) -> Vec<String> {
        let mut added = Vec::new();
        for name in subscribe {
            if name == "*" {
                self.wildcard = true;
            } else if self.names.insert(name.clone()) {
                added.push(name.clone());
            }
        }
        for name in unsubscribe {
            if name == "*" {
                self.wildcard = false;
            } else if self.names.remove(name) {
                // The proxy no longer holds it: asking again later gets it again.
                self.held.remove(name);
            }
        }
        added
    }

    /// Whether the proxy wants `name`.
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// Forgets that the proxy holds `name`, so the next sync sends it again even unchanged;
    /// returns whether the proxy wants it. Envoy warms an updated EDS cluster only once it
    /// gets the cluster's assignment again (istiod sends EDS after CDS for the same reason).
    pub fn resend(&mut self, name: &str) -> bool {
        self.held.remove(name);
        self.wants(name)
    }

    /// What to send so the proxy holds `current` (every resource of the type), as far as it
    /// wants it; and records it as held. `only` limits the comparison to those names (the
    /// ones changed since the last step, when known).
    pub fn sync(&mut self, current: &dyn Lookup, only: Option<&BTreeSet<Name>>) -> WaypointDelta {
        let mut delta = WaypointDelta::default();
        let mut consider =
            |name: &str, resource: Option<&Arc<Resource>>, held: &mut HashMap<String, Version>| {
                match resource {
                    Some(resource) => {
                        if held.get(name) != Some(&resource.version) {
                            held.insert(name.to_string(), resource.version);
                            delta.resources.push(resource.clone());
                        }
                    }
                    None => {
                        if held.remove(name).is_some() {
                            delta.removed.push(name.to_string());
                        }
                    }
                }
            };
        match only {
            Some(names) => {
                for name in names {
                    if self.wants(name) {
                        let resource = current.get(name);
                        consider(name, resource.as_ref(), &mut self.held);
                    }
                }
            }
            None => {
                let mut gone: Vec<String> = self
                    .held
                    .keys()
                    .filter(|name| current.get(name).is_none())
                    .cloned()
                    .collect();
                gone.sort();
                for name in gone {
                    consider(&name, None, &mut self.held);
                }
                if self.wildcard {
                    current.for_each(&mut |name, resource| {
                        consider(name, Some(resource), &mut self.held);
                    });
                } else {
                    let names: Vec<String> = self.names.iter().cloned().collect();
                    for name in names {
                        let resource = current.get(&name);
                        if resource.is_some() {
                            consider(&name, resource.as_ref(), &mut self.held);
                        }
                    }
                }
            }
        }
        // A named subscription whose resource does not exist is not "removed" (never held).
        delta
    }
}

/// A type's current resources, by name.
pub trait Lookup {
    fn get(&self, name: &str) -> Option<Arc<Resource>>;
    fn for_each(&self, f: &mut dyn FnMut(&str, &Arc<Resource>));
}

impl Lookup for BTreeMap<Name, Arc<Resource>> {
    fn get(&self, name: &str) -> Option<Arc<Resource>> {
        BTreeMap::get(self, name).cloned()
    }

    fn for_each(&self, f: &mut dyn FnMut(&str, &Arc<Resource>)) {
        for (name, resource) in self {
            f(name, resource);
        }
    }
}

/// A version as sent (lowercase hex).
fn parse_version(text: &str) -> Option<Version> {
    u64::from_str_radix(text, 16).ok().map(Version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::names::ResourceType;
    use crate::pb::google::protobuf::StringValue;

    fn resource(name: &str, value: &str) -> Arc<Resource> {
        Arc::new(Resource::encode(
            ResourceType::Cluster,
            name,
            &StringValue {
                value: value.into(),
            },
        ))
    }

    fn set(items: &[(&str, &str)]) -> BTreeMap<Name, Arc<Resource>> {
        items
            .iter()
            .map(|(n, v)| (Name::from(*n), resource(n, v)))
            .collect()
    }

    fn names(delta: &WaypointDelta) -> Vec<&str> {
        delta.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn a_wildcard_type_gets_what_changed_and_removals() {
        let mut state = WaypointTypeState::initial(&[], &KnownVersions::default());
        assert!(state.wildcard);
        let first = state.sync(&set(&[("a", "1"), ("b", "1")]), None);
        assert_eq!(names(&first), ["a", "b"]);
        assert!(first.removed.is_empty());
        // Nothing changed: nothing to send.
        assert!(state.sync(&set(&[("a", "1"), ("b", "1")]), None).is_empty());
        // b changed, a went, c came.
        let next = state.sync(&set(&[("b", "2"), ("c", "1")]), None);
        assert_eq!(names(&next), ["b", "c"]);
        assert_eq!(next.removed, ["a"]);
    }

    #[test]
    fn named_resources_are_sent_when_asked_and_forgotten_when_dropped() {
        let current = set(&[("x", "1"), ("y", "1")]);
        let mut state = WaypointTypeState::initial(&["x".into()], &KnownVersions::default());
        assert!(!state.wildcard);
        assert_eq!(names(&state.sync(&current, None)), ["x"]);
        assert_eq!(state.subscribe(&["y".into(), "z".into()], &[]), ["y", "z"]);
        // z does not exist: nothing for it, and it is not "removed".
        let delta = state.sync(&current, None);
        assert_eq!(names(&delta), ["y"]);
        assert!(delta.removed.is_empty());
        state.subscribe(&[], &["x".into()]);
        assert!(!state.held.contains_key("x"));
        // Only the changed names are looked at when they are known.
        let changed = set(&[("x", "2"), ("y", "2")]);
        let only: BTreeSet<Name> = [Name::from("y")].into();
        assert_eq!(names(&state.sync(&changed, Some(&only))), ["y"]);
        // A resource the proxy asked for that goes away is removed.
        let gone = state.sync(&set(&[]), None);
        assert_eq!(gone.removed, ["y"]);
    }

    #[test]
    fn a_resent_name_is_sent_again_unchanged() {
        let current = set(&[("x", "1"), ("y", "1")]);
        let mut state = WaypointTypeState::initial(&["x".into()], &KnownVersions::default());
        assert_eq!(names(&state.sync(&current, None)), ["x"]);
        assert!(state.sync(&current, None).is_empty());
        assert!(state.resend("x"));
        assert_eq!(names(&state.sync(&current, None)), ["x"]);
        // A name not asked for is not sent.
        assert!(!state.resend("y"));
        assert!(state.sync(&current, None).is_empty());
    }

    #[test]
    fn a_reconnecting_proxy_gets_only_what_it_lacks() {
        let current = set(&[("a", "1"), ("b", "1"), ("c", "1")]);
        let b = current.get("b").unwrap().version.to_string();
        let known = KnownVersions::from_map(
            [
                ("a".to_string(), "stale".to_string()),
                ("b".to_string(), b),
                ("gone".to_string(), "1".to_string()),
            ]
            .into(),
        );
        let mut state = WaypointTypeState::initial(&[], &known);
        let delta = state.sync(&current, None);
        assert_eq!(names(&delta), ["a", "c"]);
        assert_eq!(delta.removed, ["gone"]);
    }
}
