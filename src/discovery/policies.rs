//! Authorization glue between the store and the pure conversions in [`authorization`] and
//! [`peer_authentication`]: the Authorization resources of stored policies, and the policy
//! names each workload lists (conversion.md §1.6, §1.7).

use crate::discovery::authorization::{self, ConvertedPolicy, policy_selects};
use crate::discovery::index::Settings;
use crate::discovery::model::{Labels, PeerAuthentication};
use crate::discovery::peer_authentication::{self, converted_policy, static_strict_policy};
use crate::discovery::store::{Key, Store};
use crate::pb::security::Authorization;

/// `Workload.authorization_policies`: the sorted `ns/name` of WORKLOAD_SELECTOR policies (in the
/// workload's namespace or the root namespace) whose selector matches its labels, then the
/// PeerAuthentication reference (static strict policy or a converted one).
pub fn workload_policies(
    settings: &Settings,
    store: &Store,
    namespace: &str,
    labels: &Labels,
) -> Vec<String> {
    let root = settings.root_namespace.as_str();
    let mut names: Vec<String> = store
        .policies_in(namespace)
        .chain(store.policies_in(root).filter(|_| namespace != root))
        .filter(|p| policy_selects(p, namespace, labels, root))
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
pub fn convert(settings: &Settings, store: &Store, key: &Key) -> Option<ConvertedPolicy> {
    let policy = store.policies.get(key)?;
    Some(authorization::convert_policy(
        policy,
        &settings.root_namespace,
    ))
}

/// The converted port-level policy of one PeerAuthentication, if it needs one.
pub fn converted_peer_policy(
    settings: &Settings,
    store: &Store,
    key: &Key,
) -> Option<Authorization> {
    let pa = store.peer_authentications.get(key)?;
    let root = settings.root_namespace.as_str();
    let in_namespace: Vec<&PeerAuthentication> =
        store.peer_authentications_in(&pa.namespace).collect();
    let in_root: Vec<&PeerAuthentication> = store.peer_authentications_in(root).collect();
    converted_policy(pa, &in_namespace, &in_root, root)
}

/// The shared "deny plaintext" policy: served iff any PeerAuthentication exists.
pub fn static_strict(settings: &Settings, store: &Store) -> Option<Authorization> {
    (!store.peer_authentications.is_empty()).then(|| static_strict_policy(&settings.root_namespace))
}
