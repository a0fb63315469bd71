//! Which pods run where, as the CA's impersonation check needs it.
//!
//! [`PodIndex`] is the boundary: the authorizer asks it for a pod by namespace and name, and
//! whether an identity has a pod on a node. [`SnapshotPods`] answers from the published xDS
//! snapshot (Workload resources carry name, namespace, service account and node, but not the
//! Kubernetes pod uid); [`StaticPods`] is a plain map for tests and for sources that know uids.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prost::Message;

use crate::discovery::Snapshot;
use crate::pb::workload::{Address, WorkloadType, address};
use crate::push::Snapshots;

/// What the CA needs to know about one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub service_account: String,
    /// `spec.nodeName`; empty while unscheduled.
    pub node: String,
    /// `metadata.uid`, when the index knows it. `None` skips the token's pod-uid check.
    pub uid: Option<String>,
}

/// Pods by name and by node. Terminal (Succeeded/Failed) pods must not be reported.
pub trait PodIndex: Send + Sync {
    /// The pod `namespace/name`, if it exists.
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo>;
    /// Whether at least one pod running as `namespace/service_account` is on `node`.
    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool;
}

/// A fixed set of pods.
#[derive(Clone, Debug, Default)]
pub struct StaticPods {
    pods: HashMap<(String, String), PodInfo>,
}

impl StaticPods {
    /// Adds or replaces the pod `namespace/name`.
    pub fn insert(&mut self, namespace: &str, name: &str, pod: PodInfo) {
        self.pods
            .insert((namespace.to_string(), name.to_string()), pod);
    }
}

impl PodIndex for StaticPods {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.pods.iter().any(|((ns, _), pod)| {
            pod.node == node && ns == namespace && pod.service_account == service_account
        })
    }
}

/// Reads pods from the newest published snapshot, keeping a table that it updates by the
/// snapshot's change history (decoding only changed workloads), or rebuilds after a gap.
pub struct SnapshotPods {
    snapshots: Snapshots,
    table: Mutex<PodTable>,
}

impl SnapshotPods {
    /// Follows `snapshots`; nothing is decoded until the first question.
    pub fn new(snapshots: Snapshots) -> Self {
        SnapshotPods {
            snapshots,
            table: Mutex::new(PodTable::default()),
        }
    }

    fn with_table<T>(&self, f: impl FnOnce(&PodTable, Option<&Snapshot>) -> T) -> T {
        let latest: Option<Arc<Snapshot>> = self.snapshots.borrow().clone();
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(snapshot) = &latest {
            table.follow(snapshot);
        }
        f(&table, latest.as_deref())
    }
}

impl PodIndex for SnapshotPods {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodInfo> {
        self.with_table(|t, snapshot| {
            let (resource, info) = t.by_name.get(&(namespace.to_string(), name.to_string()))?;
            // The uid is read live: a pod recreated under the same name changes only its uid.
            let uid = snapshot.and_then(|s| s.pod_uid(resource));
            Some(PodInfo {
                uid,
                ..info.clone()
            })
        })
    }

    fn identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.with_table(|t, _| {
            t.on_node
                .get(&(
                    node.to_string(),
                    namespace.to_string(),
                    service_account.to_string(),
                ))
                .is_some_and(|n| *n > 0)
        })
    }
}

/// One pod row, keyed by its Address resource name.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Row {
    namespace: String,
    name: String,
    info: PodInfo,
}

/// Pods of one snapshot generation.
#[derive(Debug, Default)]
struct PodTable {
    generation: u64,
    rows: HashMap<String, Row>,
    /// `(namespace, name)` -> (its workload's resource name, what we know).
    by_name: HashMap<(String, String), (String, PodInfo)>,
    on_node: HashMap<(String, String, String), usize>,
}

impl PodTable {
    fn follow(&mut self, snapshot: &Snapshot) {
        if snapshot.generation == self.generation {
            return;
        }
        match snapshot.changes_since(self.generation) {
            Some(changes) if self.generation != 0 => {
                for name in changes.addresses.names() {
                    self.remove(name);
                    if let Some(row) = snapshot.addresses.get(name).and_then(|r| pod_row(r)) {
                        self.insert(name.to_string(), row);
                    }
                }
            }
            _ => {
                *self = PodTable::default();
                for (name, resource) in snapshot.addresses.iter() {
                    if let Some(row) = pod_row(resource) {
                        self.insert(name.to_string(), row);
                    }
                }
            }
        }
        self.generation = snapshot.generation;
    }

    fn insert(&mut self, key: String, row: Row) {
        self.by_name.insert(
            (row.namespace.clone(), row.name.clone()),
            (key.clone(), row.info.clone()),
        );
        if !row.info.node.is_empty() {
            *self
                .on_node
                .entry((
                    row.info.node.clone(),
                    row.namespace.clone(),
                    row.info.service_account.clone(),
                ))
                .or_default() += 1;
        }
        self.rows.insert(key, row);
    }

    fn remove(&mut self, key: &str) {
        let Some(row) = self.rows.remove(key) else {
            return;
        };
        self.by_name
            .remove(&(row.namespace.clone(), row.name.clone()));
        let node_key = (row.info.node, row.namespace, row.info.service_account);
        if let Some(count) = self.on_node.get_mut(&node_key) {
            *count -= 1;
            if *count == 0 {
                self.on_node.remove(&node_key);
            }
        }
    }
}

/// Decodes a pod Workload out of an Address resource; services and non-pod workloads are
/// `None`.
fn pod_row(resource: &crate::discovery::Resource) -> Option<Row> {
    // Pods only: WorkloadEntries and ServiceEntry endpoints are also of type POD.
    if resource.is_service() || !resource.name.contains("//Pod/") {
        return None;
    }
    let address = Address::decode(resource.value()).ok()?;
    let Some(address::Type::Workload(workload)) = address.r#type else {
        return None;
    };
    if workload.workload_type != WorkloadType::Pod as i32 {
        return None;
    }
    Some(Row {
        namespace: workload.namespace,
        name: workload.name,
        info: PodInfo {
            service_account: workload.service_account,
            node: workload.node,
            uid: None,
        },
    })
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;
    use crate::discovery::model::{Object, PodFields, WorkloadEntry};
    use crate::discovery::{Index, Settings};

    fn pod(uid: &str) -> Object {
        Object::Pod(
            PodFields {
                name: "web-1".into(),
                namespace: "demo".into(),
                uid: uid.into(),
                phase: "Running".into(),
                ips: ["10.0.0.1".parse().unwrap()].into(),
                service_account: "web".into(),
                node_name: "node-a".into(),
                ..Default::default()
            }
            .into(),
        )
    }

    #[test]
    fn pods_come_with_their_live_uid_and_entries_are_not_pods() {
        let mut index = Index::new(Settings::default());
        index.apply(pod("uid-1"));
        // A WorkloadEntry of the same name is also a POD-type workload, but not a pod.
        index.apply(Object::WorkloadEntry(WorkloadEntry {
            name: "vm".into(),
            namespace: "demo".into(),
            ..Default::default()
        }));
        let (publish, snapshots) = tokio::sync::watch::channel(Some(index.snapshot()));
        let pods = SnapshotPods::new(snapshots);
        let found = pods.pod("demo", "web-1").expect("the pod");
        assert_eq!(found.uid.as_deref(), Some("uid-1"));
        assert_eq!(found.node, "node-a");
        assert!(pods.identity_on_node("node-a", "demo", "web"));
        assert!(!pods.identity_on_node("node-b", "demo", "web"));
        assert!(pods.pod("demo", "vm").is_none());

        // Recreated under the same name: only the uid changes, and the CA sees the new one.
        index.apply(pod("uid-2"));
        publish.send_replace(Some(index.snapshot()));
        assert_eq!(
            pods.pod("demo", "web-1").unwrap().uid.as_deref(),
            Some("uid-2")
        );
    }
}
