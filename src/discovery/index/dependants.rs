//! Which targets an object change affects: its dependants, computed against the store before
//! and after the change. Reads only: the index applies the change and refreshes what is
//! derived from it (`Index::after_change`).

use std::collections::BTreeSet;

use crate::discovery::index::{Index, Target};
use crate::discovery::model::Key;
use crate::discovery::model::network_gateway::NetworkGateway;
use crate::discovery::model::waypoint::GATEWAY_NAME_LABEL;
use crate::discovery::model::{Object, selects};
use crate::discovery::names::service_hostname;
use crate::discovery::store::{ServiceRef, slice_pods};

impl Index {
    pub(super) fn all_targets(&self) -> Vec<Target> {
        let s = &self.store;
        let mut all: Vec<Target> = Vec::new();
        all.extend(s.pods().iter().map(pod_target));
        all.extend(s.services().keys().cloned().map(Target::KubeService));
        all.extend(
            s.service_entries()
                .keys()
                .cloned()
                .map(Target::EntryServices),
        );
        all.extend(
            s.service_entries()
                .keys()
                .cloned()
                .map(Target::EntryWorkloads),
        );
        all.extend(
            s.workload_entries()
                .keys()
                .cloned()
                .map(Target::WorkloadEntry),
        );
        all.extend(s.slices().keys().cloned().map(Target::Slice));
        all.extend(s.policies().keys().cloned().map(Target::Policy));
        all.extend(
            s.peer_authentications()
                .keys()
                .cloned()
                .map(Target::PeerAuthentication),
        );
        all.push(Target::StaticStrict);
        all.push(Target::NetworkGateways);
        if self.settings.auto_allow_waypoint_policy {
            all.extend(s.gateways().keys().cloned().map(Target::WaypointPolicy));
        }
        all
    }

    /// Workloads a WORKLOAD_SELECTOR policy in `namespace` may list: pods and WorkloadEntries
    /// by their labels, ServiceEntry endpoints by the entry's labels; every namespace when the
    /// policy is in the root namespace.
    pub(super) fn policy_selected(
        &self,
        namespace: &str,
        selector: &crate::discovery::model::Labels,
        targets: &mut BTreeSet<Target>,
    ) {
        let namespaces: Vec<String> = if namespace == self.settings.root_namespace {
            self.store.namespace_members().keys().cloned().collect()
        } else {
            vec![namespace.to_string()]
        };
        for ns in &namespaces {
            self.selected_workloads(ns, selector, targets);
            for se in self.store.service_entries_in(ns) {
                if selects(selector, &se.labels) {
                    targets.insert(Target::EntryWorkloads((
                        se.namespace.clone(),
                        se.name.clone(),
                    )));
                }
            }
        }
    }

    /// Every workload (pods, WorkloadEntries, ServiceEntry endpoints) of a namespace, or of
    /// every namespace when it is the root namespace: the ones a policy there may reach.
    pub(super) fn policy_scope(&self, namespace: &str, targets: &mut BTreeSet<Target>) {
        let namespaces: Vec<String> = if namespace == self.settings.root_namespace {
            self.store.namespace_members().keys().cloned().collect()
        } else {
            vec![namespace.to_string()]
        };
        for ns in namespaces {
            let Some(m) = self.store.members(&ns) else {
                continue;
            };
            let key = |name: &String| (ns.clone(), name.clone());
            targets.extend(self.store.pods().in_namespace(&ns).map(pod_target));
            targets.extend(
                m.workload_entries
                    .iter()
                    .map(key)
                    .map(Target::WorkloadEntry),
            );
            targets.extend(
                m.service_entries
                    .iter()
                    .map(key)
                    .map(Target::EntryWorkloads),
            );
        }
    }

    /// Every target in a namespace.
    pub(super) fn namespace_targets(&self, namespace: &str, targets: &mut BTreeSet<Target>) {
        let Some(m) = self.store.members(namespace) else {
            return;
        };
        let key = |name: &String| (namespace.to_string(), name.clone());
        targets.extend(self.store.pods().in_namespace(namespace).map(pod_target));
        targets.extend(m.services.iter().map(key).map(Target::KubeService));
        targets.extend(m.service_entries.iter().map(key).map(Target::EntryServices));
        targets.extend(
            m.service_entries
                .iter()
                .map(key)
                .map(Target::EntryWorkloads),
        );
        targets.extend(
            m.workload_entries
                .iter()
                .map(key)
                .map(Target::WorkloadEntry),
        );
        targets.extend(m.slices.iter().map(key).map(Target::Slice));
        targets.extend(m.policies.iter().map(key).map(Target::Policy));
        targets.extend(
            m.peer_authentications
                .iter()
                .map(key)
                .map(Target::PeerAuthentication),
        );
    }

    /// Pods and WorkloadEntries of `namespace` that `selector` picks.
    pub(super) fn selected_workloads(
        &self,
        namespace: &str,
        selector: &crate::discovery::model::Labels,
        targets: &mut BTreeSet<Target>,
    ) {
        for pod in self.store.pods_in(namespace) {
            if selects(selector, pod.labels()) {
                targets.insert(pod_target(pod));
            }
        }
        for we in self.store.workload_entries_in(namespace) {
            if selects(selector, &we.labels) {
                targets.insert(Target::WorkloadEntry((
                    we.namespace.clone(),
                    we.name.clone(),
                )));
            }
        }
    }

    /// Everything built from `object`, or from other objects that read it, in the current
    /// state of the store.
    pub(super) fn dependants(&self, object: &Object, targets: &mut BTreeSet<Target>) {
        let key = {
            let r = object.object_ref();
            (r.namespace, r.name)
        };
        match object {
            Object::Namespace(ns) => {
                self.namespace_targets(&ns.name, targets);
                // Its labels may bind its services to a waypoint: the policies targeting them.
                targets.extend(
                    self.store
                        .policies_targeting_namespace(&ns.name)
                        .cloned()
                        .map(Target::Policy),
                );
                // Its labels decide its ServiceEntries' visibility, so which entry wins a
                // hostname elsewhere, and which one is canonical.
                if self.store.visibility().is_some() {
                    let hosts: Vec<String> = self
                        .store
                        .service_entries_in(&ns.name)
                        .flat_map(|se| se.hosts.iter().cloned())
                        .collect();
                    self.hostname_rivals(&hosts, targets);
                }
            }
            // A scan, not a per-node index: a node's labels rarely change (a status-only update
            // is a no-op after reduction), and an index of pods by node would cost ~130 B a pod.
            Object::Node(node) => targets.extend(
                self.store
                    .pods()
                    .iter()
                    .filter(|pod| *pod.node_name() == *node.name)
                    .map(pod_target),
            ),
            // Waypoints are handled by `Index::after_change`.
            Object::Gateway(gw) => {
                if self.settings.auto_allow_waypoint_policy {
                    targets.insert(Target::WaypointPolicy(key));
                }
                self.network_gateway_readers(gw, targets);
            }
            Object::GatewayClass(class) => targets.extend(
                self.store
                    .policies_targeting("GatewayClass", &(String::new(), class.name.clone()))
                    .cloned()
                    .map(Target::Policy),
            ),
            Object::Pod(pod) => {
                // A waypoint's instance: its identity is in the waypoint's implicit policy,
                // which the workloads behind the waypoint list only while it has instances.
                if self.settings.auto_allow_waypoint_policy
                    && let Some(gateway) = pod.labels().get(GATEWAY_NAME_LABEL)
                {
                    let gateway = (key.0.clone(), gateway.to_string());
                    if let Some(readers) = self.waypoint_readers.get(&gateway) {
                        targets.extend(readers.iter().cloned());
                    }
                    targets.insert(Target::WaypointPolicy(gateway));
                }
                targets.insert(Target::Pod(key));
            }
            Object::WorkloadEntry(_) => {
                targets.insert(Target::WorkloadEntry(key));
            }
            Object::EndpointSlice(slice) => {
                targets.insert(Target::Slice(key));
                targets.extend(slice_pods(slice).into_iter().map(Target::Pod));
            }
            Object::Service(svc) => {
                targets.insert(Target::KubeService(key.clone()));
                targets.extend(
                    self.store
                        .policies_targeting("Service", &key)
                        .cloned()
                        .map(Target::Policy),
                );
                self.selected_workloads(&svc.namespace, &svc.selector, targets);
                if let Some(slices) = self.store.slices_by_service().get(&key) {
                    for name in slices {
                        let slice_key = (svc.namespace.clone(), name.clone());
                        if let Some(slice) = self.store.slices().get(&slice_key) {
                            targets.extend(slice_pods(slice).into_iter().map(Target::Pod));
                        }
                        targets.insert(Target::Slice(slice_key));
                    }
                }
                if !svc.external_name {
                    let host = service_hostname(&svc.name, &svc.namespace, &self.settings.domain);
                    self.hostname_rivals(&[host], targets);
                }
            }
            Object::AuthorizationPolicy(policy) => {
                targets.insert(Target::Policy(key));
                // Workloads whose reference list may change: those its selector picks, in its
                // namespace (every namespace for the root namespace). Called for the old and
                // the new policy, so workloads that leave and join are both covered.
                if let Some(selector) = policy.selector.as_ref().filter(|s| !s.is_empty()) {
                    self.policy_selected(&policy.namespace, selector, targets);
                }
            }
            // Read only by waypoints, from the snapshot: no resource of the index depends on it.
            Object::DestinationRule(_) => {}
            Object::PeerAuthentication(pa) => {
                // Parents of other PAs' converted policies, the static policy, and references.
                targets.insert(Target::StaticStrict);
                let root = pa.namespace == self.settings.root_namespace;
                let peers: Vec<Key> = if root {
                    self.store.peer_authentications().keys().cloned().collect()
                } else {
                    self.store
                        .peer_authentications_in(&pa.namespace)
                        .map(|p| (p.namespace.clone(), p.name.clone()))
                        .collect()
                };
                targets.extend(peers.into_iter().map(Target::PeerAuthentication));
                targets.insert(Target::PeerAuthentication(key));
                self.policy_scope(&pa.namespace, targets);
            }
            // Read by waypoints only, from the snapshot (`Index::snapshot`): no ztunnel
            // resource depends on them.
            Object::RequestAuthentication(_) | Object::Jwks(_) => {}
            Object::ServiceEntry(se) => {
                targets.insert(Target::EntryServices(key.clone()));
                targets.extend(
                    self.store
                        .policies_targeting("ServiceEntry", &key)
                        .cloned()
                        .map(Target::Policy),
                );
                targets.insert(Target::EntryWorkloads(key));
                if let Some(selector) = &se.workload_selector {
                    self.selected_workloads(&se.namespace, selector, targets);
                }
                self.hostname_rivals(&se.hosts, targets);
            }
            // Routes build nothing here: waypoints translate them from the snapshot.
            Object::HttpRoute(_) | Object::GrpcRoute(_) | Object::VirtualService(_) => {}
        }
    }

    /// For an east-west Gateway: the gateway workloads, and the workloads that may name one of
    /// its networks' gateways (`network_gateway`): every pod when it is the local network, and
    /// the WorkloadEntries and ServiceEntry endpoints (which carry their own networks). Such
    /// Gateways are few and rarely change, so this is a scan rather than an index.
    fn network_gateway_readers(
        &self,
        gw: &crate::discovery::model::Gateway,
        targets: &mut BTreeSet<Target>,
    ) {
        let gateways = NetworkGateway::from_gateway(gw);
        if gateways.is_empty() {
            return;
        }
        targets.insert(Target::NetworkGateways);
        let local = self.store.network(&self.settings);
        if gateways.iter().any(|g| g.network == local) {
            targets.extend(self.store.pods().iter().map(pod_target));
        }
        let s = &self.store;
        targets.extend(
            s.workload_entries()
                .keys()
                .cloned()
                .map(Target::WorkloadEntry),
        );
        targets.extend(
            s.service_entries()
                .keys()
                .cloned()
                .map(Target::EntryWorkloads),
        );
    }

    /// Objects claiming the same hostnames: who wins, and who is canonical, may change.
    pub(super) fn hostname_rivals(&self, hosts: &[String], targets: &mut BTreeSet<Target>) {
        for host in hosts {
            let Some(claimants) = self.store.hostnames().get(host) else {
                continue;
            };
            for (_, claimant) in claimants {
                match claimant {
                    ServiceRef::Kube(k) => {
                        targets.insert(Target::KubeService(k.clone()));
                    }
                    ServiceRef::Entry(k) => {
                        targets.insert(Target::EntryServices(k.clone()));
                        targets.insert(Target::EntryWorkloads(k.clone()));
                        if let Some(selector) = self
                            .store
                            .service_entries()
                            .get(k)
                            .and_then(|se| se.workload_selector.as_ref())
                        {
                            self.selected_workloads(&k.0, selector, targets);
                        }
                    }
                }
            }
        }
    }
}

/// The target that builds a pod's workload.
fn pod_target(pod: &crate::discovery::model::Pod) -> Target {
    Target::Pod((pod.namespace().to_string(), pod.name().to_string()))
}
