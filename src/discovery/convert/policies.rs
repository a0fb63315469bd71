//! Authorization glue between the store and the pure conversions in [`authorization`] and
//! [`peer_authentication`]: the Authorization resources of stored policies, and the policy
//! names each workload lists (docs/authorization.md).

use std::collections::{BTreeMap, BTreeSet};

use crate::discovery::convert::authorization::{
    self, ConvertOptions, ConvertedPolicy, selector_attaches,
};
use crate::discovery::convert::peer_authentication::{
    self, converted_policy, static_strict_policy,
};
use crate::discovery::convert::waypoint::{self, Binding};
use crate::discovery::model::Key;
use crate::discovery::model::{Labels, PeerAuthentication};
use crate::discovery::settings::Settings;
use crate::discovery::store::{ServiceRef, Store};
use crate::pb::security::{
    Action, Authorization, Clause, Match, Rule, Scope, StringMatch, string_match::MatchType,
};
use crate::pb::workload::PortList;

/// `Workload.authorization_policies`: the sorted `ns/name` of WORKLOAD_SELECTOR policies (in the
/// workload's namespace or the root namespace) whose selector matches its labels, then the
/// PeerAuthentication reference (static strict policy or a converted one).
pub(crate) fn workload_policies(
    settings: &Settings,
    store: &Store,
    namespace: &str,
    labels: &Labels,
) -> Vec<String> {
    let root = settings.root_namespace.as_str();
    let mut names: Vec<String> = store
        .policies_in(namespace)
        .chain(store.policies_in(root).filter(|_| namespace != root))
        .filter(|p| {
            p.is_sent_with(settings.dry_run_authorization)
                && selector_attaches(p, namespace, labels, root)
        })
        .map(|p| p.xds_name())
        .collect();
    names.sort();
    let in_namespace: Vec<&PeerAuthentication> = store.peer_authentications_in(namespace).collect();
    let in_root: Vec<&PeerAuthentication> = store.peer_authentications_in(root).collect();
    names.extend(peer_authentication::workload_references(
        namespace,
        labels,
        &in_namespace,
        &in_root,
        root,
    ));
    names
}

/// The Authorization (if ztunnel should see it) and the status of one AuthorizationPolicy.
pub(crate) fn convert(settings: &Settings, store: &Store, key: &Key) -> Option<ConvertedPolicy> {
    let policy = store.policies().get(key)?;
    Some(authorization::convert_policy_with(
        policy,
        ConvertOptions {
            root_namespace: &settings.root_namespace,
            dry_run_enabled: settings.dry_run_authorization,
        },
    ))
}

/// The converted port-level policy of one PeerAuthentication, if it needs one.
pub(crate) fn converted_peer_policy(
    settings: &Settings,
    store: &Store,
    key: &Key,
) -> Option<Authorization> {
    let pa = store.peer_authentications().get(key)?;
    let root = settings.root_namespace.as_str();
    let in_namespace: Vec<&PeerAuthentication> =
        store.peer_authentications_in(&pa.namespace).collect();
    let in_root: Vec<&PeerAuthentication> = store.peer_authentications_in(root).collect();
    converted_policy(pa, &in_namespace, &in_root, root)
}

/// The shared "deny plaintext" policy: served iff any PeerAuthentication exists.
pub(crate) fn static_strict(settings: &Settings, store: &Store) -> Option<Authorization> {
    (!store.peer_authentications().is_empty())
        .then(|| static_strict_policy(&settings.root_namespace))
}

/// The name of a waypoint's implicit policy (`_` cannot appear in Kubernetes names).
pub(crate) fn implicit_waypoint_policy_name(waypoint: &Key) -> String {
    format!("istio_allow_waypoint_{}_{}", waypoint.0, waypoint.1)
}

/// istiod's implicit waypoint policy (`PILOT_AUTO_ALLOW_WAYPOINT_POLICY`; docs/authorization.md):
/// for a ready waypoint with instance pods, an ALLOW policy in its namespace for the
/// identities those pods run as, which the workloads behind the waypoint list. Without it, an
/// ALLOW policy on a workload must name the waypoint itself, or traffic through it is denied.
/// `None` when the flag is off, `waypoint` is not a ready waypoint, or it has no instances.
pub(crate) fn implicit_waypoint_policy(
    settings: &Settings,
    store: &Store,
    waypoint: &Key,
    reads: &mut Vec<Key>,
) -> Option<Authorization> {
    if !settings.auto_allow_waypoint_policy {
        return None;
    }
    reads.push(waypoint.clone());
    if !has_implicit_policy(store, waypoint) {
        return None;
    }
    let principals: Vec<StringMatch> = store
        .waypoint_accounts(waypoint)
        .map(|account| StringMatch {
            match_type: Some(MatchType::Exact(format!(
                "{}/ns/{}/sa/{account}",
                settings.trust_domain, waypoint.0
            ))),
        })
        .collect();
    Some(Authorization {
        name: implicit_waypoint_policy_name(waypoint),
        namespace: waypoint.0.clone(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Allow as i32,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    principals,
                    ..Default::default()
                }],
            }],
        }],
        ..Default::default()
    })
}

/// The implicit waypoint policies a workload lists after its other references (istiod's
/// `implicitWaypointPolicies`): those of the waypoints its services are bound to (sorted, once
/// each), then its own waypoint's; only waypoints that have such a policy. Nothing when the
/// flag is off. The waypoints consulted are pushed to `reads`.
pub(crate) fn implicit_waypoint_references(
    settings: &Settings,
    store: &Store,
    own: Option<&Key>,
    services: &BTreeMap<String, PortList>,
    reads: &mut Vec<Key>,
) -> Vec<String> {
    if !settings.auto_allow_waypoint_policy {
        return Vec::new();
    }
    let mut bound: BTreeSet<Key> = BTreeSet::new();
    for service in services.keys() {
        let Some((namespace, hostname)) = service.split_once('/') else {
            continue;
        };
        let (labels, local_only) = match store.slot_winner(namespace, hostname) {
            Some(ServiceRef::Kube(k)) => match store.services().get(&k) {
                Some(svc) => (&svc.labels, false),
                None => continue,
            },
            Some(ServiceRef::Entry(k)) => match store.service_entries().get(&k) {
                Some(se) => (&se.labels, store.entries_namespace_local(namespace)),
                None => continue,
            },
            None => continue,
        };
        if waypoint::never_uses_waypoint(labels) {
            continue;
        }
        if let Binding::Bound { key, .. } =
            waypoint::service_binding(store, namespace, labels, local_only, reads)
            && Some(&key) != own
        {
            bound.insert(key);
        }
    }
    bound
        .iter()
        .chain(own)
        .filter(|key| has_implicit_policy(store, key))
        .map(|key| format!("{}/{}", key.0, implicit_waypoint_policy_name(key)))
        .collect()
}

/// Whether `waypoint` is a ready waypoint with instance pods (with the flag on).
fn has_implicit_policy(store: &Store, waypoint: &Key) -> bool {
    store.waypoints().contains_key(waypoint) && store.waypoint_accounts(waypoint).next().is_some()
}
