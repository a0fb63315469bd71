//! AuthorizationPolicy -> `istio.security.Authorization`, per docs/authorization.md.
//!
//! [`AuthorizationPolicy`] is the reduced object (in the model). [`convert_policy_with`] turns
//! it into the resource ztunnel enforces plus the `ZtunnelAccepted` status istiod would write,
//! and [`selector_attaches`] (with "the conversion produced an Authorization") says which
//! workloads list it in `Workload.authorization_policies`.
//!
//! Where istiod's conversion would let invalid input make a policy *looser* than written, this
//! module fails closed instead; [`convert`] documents each such choice.

mod convert;

#[cfg(test)]
mod conformance_tests;
#[cfg(test)]
mod property_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use convert::convert_policy;
pub(crate) use convert::{ConvertOptions, ConvertedPolicy, convert_policy_with};

use crate::discovery::model::Labels;
use crate::discovery::model::authorization::AuthorizationPolicy;

impl AuthorizationPolicy {
    /// Whether [`convert_policy`] (default options) sends this policy to ztunnel at all: not a
    /// waypoint (targetRef) policy, not dry-run, and an ALLOW or DENY action.
    #[cfg(test)]
    pub(crate) fn is_sent_to_ztunnel(&self) -> bool {
        convert::is_sent(self, false)
    }

    /// [`Self::is_sent_to_ztunnel`] with dry-run support on or off
    /// ([`ConvertOptions::dry_run_enabled`]).
    pub(crate) fn is_sent_with(&self, dry_run_enabled: bool) -> bool {
        convert::is_sent(self, dry_run_enabled)
    }
}

/// Whether a workload lists `policy` in `Workload.authorization_policies` (istiod's
/// `buildWorkloadPolicies`), with the default conversion options.
///
/// Only WORKLOAD_SELECTOR policies are ever listed: the policy must be sent to ztunnel, live in
/// the workload's namespace or the root namespace, and have a non-empty `matchLabels` that is a
/// subset of the workload's labels. NAMESPACE and GLOBAL policies are applied by ztunnel
/// itself and are never listed. Quirk (istiod): a selector with empty `matchLabels` makes the
/// policy WORKLOAD_SELECTOR-scoped, yet it is attached to nothing.
///
/// The workload's list is the sorted `ns/name` of every policy this returns true for. The index
/// decides with [`selector_attaches`] and its own options; this is the tests' statement of it.
#[cfg(test)]
pub(crate) fn policy_selects(
    policy: &AuthorizationPolicy,
    workload_namespace: &str,
    workload_labels: &Labels,
    root_namespace: &str,
) -> bool {
    policy.is_sent_to_ztunnel()
        && selector_attaches(policy, workload_namespace, workload_labels, root_namespace)
}

/// The selector/namespace half of [`policy_selects`], for callers that convert with
/// non-default [`ConvertOptions`]: combine it with "the conversion produced an Authorization".
pub(crate) fn selector_attaches(
    policy: &AuthorizationPolicy,
    workload_namespace: &str,
    workload_labels: &Labels,
    root_namespace: &str,
) -> bool {
    let in_scope = policy.namespace == workload_namespace || policy.namespace == root_namespace;
    match &policy.selector {
        Some(selector) if in_scope && !selector.is_empty() => selector
            .iter()
            .all(|(k, v)| workload_labels.get(k) == Some(v)),
        _ => false,
    }
}
