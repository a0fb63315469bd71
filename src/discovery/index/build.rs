//! Building one target's resources, and encoding each resource once.

use crate::discovery::convert::{
    conditions, endpoint_slice, policies, service, service_entry, workload, workload_entry,
};
use crate::discovery::index::{Index, Target};
use crate::discovery::model::Key;
use crate::discovery::model::status::{DesiredStatus, StatusCondition, StatusKind, StatusTarget};
use crate::discovery::model::visibility::Visibility;
use crate::discovery::names::{TypeKind, service_key};
use crate::discovery::snapshot::{Name, Resource};
use crate::pb::security::Authorization;
use crate::pb::workload::{self as wl, Address, address};

impl Index {
    /// Builds every resource of one target, and the status condition of its object.
    pub(super) fn build(&self, target: &Target, reads: &mut Vec<Key>) -> Built {
        if let Target::Policy(k) = target {
            return self.build_policy(k, reads);
        }
        let mut built = self.build_resources(target, reads);
        built.statuses = self.build_statuses(target, reads);
        built
    }

    /// A policy's Authorization and its `ZtunnelAccepted` condition, from one conversion.
    fn build_policy(&self, k: &Key, reads: &mut Vec<Key>) -> Built {
        let converted = policies::convert(&self.settings, &self.store, k);
        let waypoint = (
            StatusTarget::new(StatusKind::WaypointPolicy, k),
            self.store.policies().get(k).map(|p| DesiredStatus {
                generation: p.generation,
                condition: conditions::waypoint_policy_accepted(
                    &self.settings.root_namespace,
                    &self.store,
                    p,
                    reads,
                )
                .map(Box::new),
            }),
        );
        let (authorization, desired) = match converted {
            Some(c) => (
                c.authorization,
                Some(DesiredStatus {
                    generation: self.store.policies().get(k).map_or(0, |p| p.generation),
                    condition: c.status.map(Box::new),
                }),
            ),
            None => (None, None),
        };
        Built {
            resources: authorization
                .map(|a| (TypeKind::Authorization, authorization_resource(a)))
                .into_iter()
                .collect(),
            statuses: vec![
                (
                    StatusTarget::new(StatusKind::AuthorizationPolicy, k),
                    desired,
                ),
                waypoint,
            ],
        }
    }

    /// The conditions the target's object should carry, for the targets that own some.
    fn build_statuses(
        &self,
        target: &Target,
        reads: &mut Vec<Key>,
    ) -> Vec<(StatusTarget, Option<DesiredStatus>)> {
        let store = &self.store;
        let desired = |generation: i64, condition: Option<StatusCondition>| {
            Some(DesiredStatus {
                generation,
                condition: condition.map(Box::new),
            })
        };
        vec![match target {
            Target::KubeService(k) => (
                StatusTarget::new(StatusKind::Service, k),
                store.services().get(k).and_then(|svc| {
                    // istiod builds nothing for an ExternalName service, so binds nothing.
                    let condition = (!svc.external_name)
                        .then(|| {
                            conditions::service_waypoint_bound(
                                store,
                                &svc.namespace,
                                &svc.labels,
                                false,
                                reads,
                            )
                        })
                        .flatten();
                    desired(svc.generation, condition)
                }),
            ),
            Target::EntryServices(k) => {
                let se = store.service_entries().get(k);
                let visibility = (
                    StatusTarget::new(StatusKind::ServiceEntryVisibility, k),
                    se.and_then(|se| {
                        let condition = conditions::visibility_applied(store, &se.namespace);
                        desired(se.generation, condition)
                    }),
                );
                let waypoint = (
                    StatusTarget::new(StatusKind::ServiceEntry, k),
                    se.and_then(|se| {
                        let visibility = store.entry_visibility(&se.namespace);
                        // Visibility NONE publishes nothing, so binds nothing (istiod has no
                        // service to report on).
                        let condition = (visibility != Some(Visibility::None))
                            .then(|| {
                                conditions::service_waypoint_bound(
                                    store,
                                    &se.namespace,
                                    &se.labels,
                                    visibility == Some(Visibility::Namespace),
                                    reads,
                                )
                            })
                            .flatten();
                        desired(se.generation, condition)
                    }),
                );
                return vec![waypoint, visibility];
            }
            Target::WorkloadEntry(k) => (
                StatusTarget::new(StatusKind::WorkloadEntry, k),
                store.workload_entries().get(k).and_then(|we| {
                    let condition = conditions::workload_waypoint_bound(
                        store,
                        &we.namespace,
                        &we.labels,
                        reads,
                    );
                    desired(we.generation, condition)
                }),
            ),
            _ => return Vec::new(),
        }]
    }

    /// Builds every resource of one target.
    fn build_resources(&self, target: &Target, reads: &mut Vec<Key>) -> Built {
        let (settings, store) = (&self.settings, &self.store);
        let addresses = |resources: Vec<Resource>| Built {
            resources: resources
                .into_iter()
                .map(|r| (TypeKind::Address, r))
                .collect(),
            statuses: Vec::new(),
        };
        let authorization = |a: Option<Authorization>| Built {
            resources: a
                .map(|a| (TypeKind::Authorization, authorization_resource(a)))
                .into_iter()
                .collect(),
            statuses: Vec::new(),
        };
        match target {
            Target::Pod((namespace, name)) => addresses(
                store
                    .pods()
                    .get(namespace, name)
                    .and_then(|pod| {
                        let mut resource =
                            workload_resource(workload::build(settings, store, pod, reads)?);
                        resource.set_pod_uid(pod.uid());
                        Some(resource)
                    })
                    .into_iter()
                    .collect(),
            ),
            Target::WorkloadEntry(k) => addresses(
                store
                    .workload_entries()
                    .get(k)
                    .map(|we| {
                        workload_resource(workload_entry::workload_entry(
                            settings, store, we, reads,
                        ))
                    })
                    .into_iter()
                    .collect(),
            ),
            Target::EntryWorkloads(k) => addresses(
                store
                    .service_entries()
                    .get(k)
                    .map(|se| workload_entry::service_entry_workloads(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::Slice(k) => addresses(
                store
                    .slices()
                    .get(k)
                    .map(|slice| endpoint_slice::build(settings, store, slice))
                    .unwrap_or_default()
                    .into_values()
                    .map(workload_resource)
                    .collect(),
            ),
            Target::KubeService(k) => addresses(
                store
                    .services()
                    .get(k)
                    .and_then(|svc| service::build(settings, store, svc, reads))
                    .map(service_resource)
                    .into_iter()
                    .collect(),
            ),
            Target::EntryServices(k) => addresses(
                store
                    .service_entries()
                    .get(k)
                    .map(|se| service_entry::build(settings, store, se, reads))
                    .unwrap_or_default()
                    .into_iter()
                    .map(service_resource)
                    .collect(),
            ),
            Target::Policy(k) => self.build_policy(k, reads),
            Target::PeerAuthentication(k) => {
                authorization(policies::converted_peer_policy(settings, store, k))
            }
            Target::StaticStrict => authorization(policies::static_strict(settings, store)),
            Target::WaypointPolicy(k) => authorization(policies::implicit_waypoint_policy(
                settings, store, k, reads,
            )),
            Target::NetworkGateways => {
                // One workload per uid: the first Gateway (by network, name, address) wins.
                let mut by_uid = std::collections::BTreeMap::new();
                for gateway in store.all_network_gateways() {
                    by_uid
                        .entry(gateway.uid())
                        .or_insert_with(|| gateway.workload());
                }
                addresses(by_uid.into_values().map(workload_resource).collect())
            }
        }
    }
}

/// What building one target produced.
pub(super) struct Built {
    pub(super) resources: Vec<(TypeKind, Resource)>,
    /// For a target whose object may carry conditions: each condition's object and what it
    /// should carry (`None`: the object does not exist).
    pub(super) statuses: Vec<(StatusTarget, Option<DesiredStatus>)>,
}

fn authorization_resource(a: Authorization) -> Resource {
    let name = format!("{}/{}", a.namespace, a.name);
    Resource::encode(TypeKind::Authorization, name, &a)
}

fn workload_resource(w: wl::Workload) -> Resource {
    let name: Name = w.uid.as_str().into();
    let message = Address {
        r#type: Some(address::Type::Workload(w)),
    };
    Resource::address(name, &message)
}

fn service_resource(s: wl::Service) -> Resource {
    let name = service_key(&s.namespace, &s.hostname);
    let message = Address {
        r#type: Some(address::Type::Service(s)),
    };
    Resource::address(name, &message)
}
