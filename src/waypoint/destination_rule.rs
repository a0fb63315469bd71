//! Which DestinationRule applies to a Service bound to a waypoint, as istiod chooses it
//! (`PushContext.setDestinationRules`, `mergeDestinationRule`, `PushContext.destinationRule`
//! and `SidecarScope.DestinationRule` for the inbound direction), and the policy of one port
//! (`util.GetPortLevelTrafficPolicy`). What the policy becomes in Envoy is
//! [`super::traffic_policy`].
//!
//! A waypoint's scope is its namespace's: a rule in the waypoint's namespace visible there
//! wins, then one exported from the Service's namespace, then one exported from the root
//! namespace. Within a namespace, rules for the same host with the same `exportTo` are merged
//! oldest first: subsets are concatenated (the first of a name wins) and the first top-level
//! traffic policy wins. A Service's host matches exactly, else the most specific wildcard.
//!
//! Rules with a `workloadSelector` never apply here: istiod reads them for outbound traffic
//! only. They are left out before the merge (istiod merges them too, which in one corner case,
//! a selector-less rule with `exportTo: [.]` beside a selector rule, loses the former).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::discovery::model::{DestinationRule, Subset, TrafficPolicy};

/// The rules for one host in one namespace, after istiod's merge.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MergedRule {
    /// The first (oldest) rule merged: the cluster's `istio` metadata names it.
    pub(crate) rule: Arc<DestinationRule>,
    /// The first top-level traffic policy among the merged rules.
    pub(crate) traffic_policy: Option<TrafficPolicy>,
    /// Subsets of every merged rule, the first of each name.
    pub(crate) subsets: Vec<Subset>,
    /// `ns/name` of every merged rule, oldest first.
    pub(crate) from: Vec<String>,
    export_to: BTreeSet<String>,
}

impl MergedRule {
    fn new(rule: &Arc<DestinationRule>, export_to: BTreeSet<String>) -> Self {
        MergedRule {
            rule: rule.clone(),
            traffic_policy: rule.traffic_policy.as_deref().cloned(),
            subsets: rule.subsets.clone(),
            from: vec![format!("{}/{}", rule.namespace, rule.name)],
            export_to,
        }
    }

    fn absorb(&mut self, rule: &DestinationRule) {
        self.from.push(format!("{}/{}", rule.namespace, rule.name));
        for subset in &rule.subsets {
            if !self.subsets.iter().any(|s| s.name == subset.name) {
                self.subsets.push(subset.clone());
            }
        }
        if self.traffic_policy.is_none() {
            self.traffic_policy = rule.traffic_policy.as_deref().cloned();
        }
    }

    fn exported_to(&self, namespace: &str) -> bool {
        self.export_to.is_empty()
            || self.export_to.contains("*")
            || self.export_to.contains(namespace)
    }
}

/// Merged rules by host: exact hosts and wildcard hosts (`*.example.com`, `*`) apart.
#[derive(Debug, Default)]
struct ByHost {
    specific: BTreeMap<String, Vec<MergedRule>>,
    wildcard: BTreeMap<String, Vec<MergedRule>>,
}

impl ByHost {
    /// istiod's `mergeDestinationRule` for rules without a workload selector.
    fn merge(&mut self, host: String, rule: &Arc<DestinationRule>, export_to: &BTreeSet<String>) {
        let map = if host.starts_with('*') {
            &mut self.wildcard
        } else {
            &mut self.specific
        };
        let list = map.entry(host).or_default();
        let mut append = true;
        for merged in list.iter_mut() {
            let same = *export_to == merged.export_to;
            let wider = !merged.export_to.is_empty() && export_to.is_superset(&merged.export_to);
            if !(same || wider) {
                append = true;
                continue;
            }
            append = false;
            merged.absorb(rule);
        }
        if append {
            list.push(MergedRule::new(rule, export_to.clone()));
        }
    }

    /// istiod's `MostSpecificHostMatch`: the exact host, else the most specific wildcard that
    /// covers it.
    fn matching(&self, host: &str) -> Option<&[MergedRule]> {
        let (needle, exact) = match host.strip_prefix('*') {
            Some(rest) => (rest, self.wildcard.get(host)),
            None => (host, self.specific.get(host)),
        };
        if let Some(rules) = exact {
            return Some(rules);
        }
        self.wildcard
            .iter()
            .filter(|(h, _)| needle.ends_with(&h[1..]))
            .min_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then(a.cmp(b)))
            .map(|(_, rules)| rules.as_slice())
    }
}

/// Every rule indexed as istiod's push context indexes them, for the waypoints of one
/// snapshot.
#[derive(Debug, Default)]
pub(crate) struct DestinationRules {
    /// Namespace -> rules visible in it (`exportTo` empty, `*`, `.` or the namespace).
    namespace_local: BTreeMap<String, ByHost>,
    /// Namespace -> rules it exports to others.
    exported: BTreeMap<String, ByHost>,
    /// The root namespace's rules exported to it alone.
    root_local: ByHost,
    root_namespace: String,
}

impl DestinationRules {
    /// `rules` oldest first, as the snapshot holds them.
    pub(crate) fn new(rules: &[Arc<DestinationRule>], root_namespace: &str, domain: &str) -> Self {
        let mut index = DestinationRules {
            root_namespace: root_namespace.to_string(),
            ..Default::default()
        };
        for rule in rules.iter().filter(|r| r.workload_selector.is_none()) {
            let host = resolve_short_name(&rule.host, &rule.namespace, domain);
            let namespace = rule.namespace.as_str();
            let export_to: BTreeSet<String> = rule.export_to.iter().cloned().collect();
            if export_to.is_empty()
                || export_to.contains("*")
                || export_to.contains(".")
                || export_to.contains(namespace)
            {
                index
                    .namespace_local
                    .entry(namespace.to_string())
                    .or_default()
                    .merge(host.clone(), rule, &export_to);
            }
            // The mesh's default exportTo for rules is `*` (meshConfig
            // defaultDestinationRuleExportTo is not read).
            let private_only =
                export_to.len() == 1 && (export_to.contains(".") || export_to.contains(namespace));
            if !private_only {
                index
                    .exported
                    .entry(namespace.to_string())
                    .or_default()
                    .merge(host, rule, &export_to);
            } else if namespace == root_namespace {
                index.root_local.merge(host, rule, &export_to);
            }
        }
        index
    }

    /// The rule that applies to `host` (a Service of `service_namespace`) at a waypoint in
    /// `waypoint_namespace`, if any.
    pub(crate) fn for_service(
        &self,
        waypoint_namespace: &str,
        service_namespace: &str,
        host: &str,
    ) -> Option<&MergedRule> {
        // The last is the one a sidecar scope returns (its catch-all loop keeps the last).
        self.candidates(waypoint_namespace, service_namespace, host)
            .into_iter()
            .last()
    }

    /// istiod's `PushContext.destinationRule(proxyNamespace, service)`.
    fn candidates(
        &self,
        waypoint_namespace: &str,
        service_namespace: &str,
        host: &str,
    ) -> Vec<&MergedRule> {
        let local = if waypoint_namespace == self.root_namespace {
            Some(&self.root_local)
        } else {
            self.namespace_local.get(waypoint_namespace)
        };
        if let Some(rules) = local.and_then(|l| l.matching(host)) {
            return rules.iter().collect();
        }
        for owner in [service_namespace, self.root_namespace.as_str()] {
            let Some(rules) = self.exported.get(owner).and_then(|e| e.matching(host)) else {
                continue;
            };
            let visible: Vec<&MergedRule> = rules
                .iter()
                .filter(|r| r.exported_to(waypoint_namespace))
                .collect();
            if !visible.is_empty() {
                return visible;
            }
        }
        Vec::new()
    }
}

/// istiod's `ResolveShortnameToFQDN`: a host without a dot is a Kubernetes Service of the
/// rule's namespace.
fn resolve_short_name(host: &str, namespace: &str, domain: &str) -> String {
    if host == "*" || host.contains('.') || host.parse::<std::net::IpAddr>().is_ok() {
        host.to_string()
    } else {
        format!("{host}.{namespace}.svc.{domain}")
    }
}

/// The policy of one service port (istiod's `GetPortLevelTrafficPolicy`): a port-level entry
/// for the port replaces the top-level policy whole (its unset parts take their defaults,
/// not the top level's).
pub(crate) fn port_policy(policy: Option<&TrafficPolicy>, port: u32) -> Option<TrafficPolicy> {
    let policy = policy?;
    Some(match policy.port_level.iter().find(|p| p.port == port) {
        Some(port_level) => TrafficPolicy {
            port_level: Vec::new(),
            ..port_level.policy.clone()
        },
        None => policy.clone(),
    })
}

#[cfg(test)]
mod tests;
