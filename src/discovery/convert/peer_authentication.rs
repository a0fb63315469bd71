//! PeerAuthentication -> Authorizations and per-workload references, per docs/authorization.md,
//! "PeerAuthentication".
//!
//! ztunnel has no notion of mTLS modes: istiod expresses STRICT as DENY policies on
//! unauthenticated peers. Three outputs:
//! 1. [`static_strict_policy`]: one shared "deny plaintext" policy, sent iff any
//!    PeerAuthentication exists;
//! 2. [`converted_policy`]: a per-PA DENY policy for a selector PA with port-level exceptions;
//! 3. [`workload_references`]: which of those a workload lists in `authorization_policies`.
//!
//! istiod's quirks are reproduced on purpose (each has a test named `quirk_*`): the Go
//! operator-precedence slip in the STRICT-port skip test, DISABLE ports ignored when an UNSET
//! workload inherits STRICT, references to converted policies that were never generated, and
//! the two meanings of "selector-less" (see [`converted_policy`] and [`workload_references`]).

use std::cmp::Ordering;
use std::collections::BTreeSet;

use crate::discovery::model::Labels;
use crate::discovery::model::peer_authentication::{MtlsMode, PeerAuthentication};
use crate::pb::google::protobuf::Empty;
use crate::pb::security::{
    Action, Authorization, Clause, Match, Rule, Scope, StringMatch, string_match::MatchType,
};

#[cfg(test)]
mod tests;

/// Name of the shared "deny plaintext" policy (`_` cannot appear in Kubernetes names).
pub(crate) const STATIC_STRICT_NAME: &str = "istio_converted_static_strict";
/// Prefix of a converted per-PA policy's name.
pub(crate) const CONVERTED_PREFIX: &str = "converted_peer_authentication_";

/// The xDS name of the static policy: `<root ns>/istio_converted_static_strict`.
pub(crate) fn static_strict_key(root_namespace: &str) -> String {
    format!("{root_namespace}/{STATIC_STRICT_NAME}")
}

/// The Authorization name of a PA's converted policy: `converted_peer_authentication_<name>`.
pub(crate) fn converted_name(pa_name: &str) -> String {
    format!("{CONVERTED_PREFIX}{pa_name}")
}

/// The xDS name of a PA's converted policy: `<pa ns>/converted_peer_authentication_<name>`.
pub(crate) fn converted_key(pa: &PeerAuthentication) -> String {
    format!("{}/{}", pa.namespace, converted_name(&pa.name))
}

/// The shared policy that denies unauthenticated peers. Send it iff at least one
/// PeerAuthentication exists anywhere; STRICT workloads reference it.
pub(crate) fn static_strict_policy(root_namespace: &str) -> Authorization {
    Authorization {
        name: STATIC_STRICT_NAME.to_string(),
        namespace: root_namespace.to_string(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules: vec![Rule {
            clauses: vec![clause(deny_plaintext())],
        }],
        dry_run: false,
        extensions: Vec::new(),
    }
}

fn presence() -> StringMatch {
    StringMatch {
        match_type: Some(MatchType::Presence(Empty {})),
    }
}

/// `not_principals: [presence]`: matches any peer without an identity.
fn deny_plaintext() -> Match {
    Match {
        not_principals: vec![presence()],
        ..Default::default()
    }
}

fn clause(m: Match) -> Clause {
    Clause { matches: vec![m] }
}

/// The oldest PA of `pas` in `namespace` with no `selector` field at all (istiod's
/// `PeerAuthByNamespace` index: here an empty `matchLabels` does *not* count as selector-less).
fn oldest_without_selector<'a>(
    pas: &[&'a PeerAuthentication],
    namespace: &str,
) -> Option<&'a PeerAuthentication> {
    pas.iter()
        .copied()
        .filter(|pa| pa.namespace == namespace && pa.selector.is_none())
        .min_by(|a, b| a.age_order(b))
}

/// Keeps the older of `slot` and `pa` (istiod: a later one replaces only if strictly older).
fn keep_oldest<'a>(slot: &mut Option<&'a PeerAuthentication>, pa: &'a PeerAuthentication) {
    if slot.is_none_or(|current| pa.age_order(current) == Ordering::Less) {
        *slot = Some(pa);
    }
}

/// The DENY policy for one selector PA with `portLevelMtls` (istiod `convertPeerAuthentication`),
/// or `None` when the PA needs none.
///
/// `namespace_pas` and `root_pas` may be all PAs of the PA's namespace and of the root
/// namespace: the parents used are the oldest ones *without a `selector` field* (nsCfg,
/// rootCfg). Port numbers above 65535 are skipped: ztunnel truncates ports to 16 bits, so
/// sending one would hit an unrelated port (istiod would send it).
pub(crate) fn converted_policy(
    pa: &PeerAuthentication,
    namespace_pas: &[&PeerAuthentication],
    root_pas: &[&PeerAuthentication],
    root_namespace: &str,
) -> Option<Authorization> {
    if pa.namespace == root_namespace || pa.selector.is_none() || pa.port_level.is_empty() {
        return None;
    }
    let ns = oldest_without_selector(namespace_pas, &pa.namespace).map(|p| p.mode);
    let root = oldest_without_selector(root_pas, root_namespace).map(|p| p.mode);
    let strict = |mode: Option<MtlsMode>| mode == Some(MtlsMode::Strict);
    let unset = |mode: Option<MtlsMode>| matches!(mode, None | Some(MtlsMode::Unset));
    let mode = pa.mode;

    let mut base: Vec<Clause> = Vec::new();
    let mut rules: Vec<Rule> = Vec::new();
    if mode == MtlsMode::Strict {
        base.push(clause(deny_plaintext()));
    }
    let mut found_non_strict = false;
    for (&port, &port_mode) in pa.port_level.range(..=65535) {
        match port_mode {
            MtlsMode::Strict => {
                // Go: `wlStrict || (wlUnset && nsStrict) || (nsAbsentOrUnset && rootStrict)`.
                // The last term lacks the `wlUnset` guard (operator precedence): a PERMISSIVE or
                // DISABLE workload's STRICT port is skipped under a STRICT root with no ns PA.
                let covered = mode == MtlsMode::Strict
                    || (mode == MtlsMode::Unset && strict(ns))
                    || (unset(ns) && strict(root));
                if covered {
                    continue;
                }
                rules.push(Rule {
                    clauses: vec![clause(Match {
                        not_principals: vec![presence()],
                        destination_ports: vec![port],
                        ..Default::default()
                    })],
                });
            }
            MtlsMode::Permissive | MtlsMode::Disable => {
                if mode.non_strict() {
                    continue;
                }
                let inherited_not_strict = match (ns, root) {
                    (Some(ns), _) => ns != MtlsMode::Strict,
                    (None, Some(root)) => root != MtlsMode::Strict,
                    (None, None) => true,
                };
                if mode == MtlsMode::Unset && inherited_not_strict {
                    continue;
                }
                found_non_strict = true;
                base.push(clause(Match {
                    not_destination_ports: vec![port],
                    ..Default::default()
                }));
            }
            MtlsMode::Unset => {}
        }
    }
    if mode == MtlsMode::Strict && !found_non_strict {
        // Every port is STRICT: the static policy covers it.
        return None;
    }
    if base.is_empty() && rules.is_empty() {
        return None;
    }
    let merge_strict = (strict(root) && (unset(ns) || strict(ns))) || strict(ns);
    if merge_strict && found_non_strict {
        base.push(clause(deny_plaintext()));
    }
    if !base.is_empty() {
        rules.push(Rule { clauses: base });
    }
    Some(Authorization {
        name: converted_name(&pa.name),
        namespace: pa.namespace.clone(),
        scope: Scope::WorkloadSelector as i32,
        action: Action::Deny as i32,
        rules,
        dry_run: false,
        extensions: Vec::new(),
    })
}

/// The PeerAuthentication keys a workload lists in `authorization_policies`, after its
/// AuthorizationPolicy keys (istiod `convertedSelectorPeerAuthentications`).
///
/// Candidates: PAs of the workload's namespace with no selector or a matching one (an empty
/// `matchLabels` matches), plus root-namespace PAs with no `selector` field. Levels: mesh =
/// root-namespace selector-less, namespace = selector-less in the workload's namespace,
/// workload = with labels in the workload's namespace (here an empty `matchLabels` *does*
/// count as selector-less); selector PAs in the root namespace are ignored. At each level the
/// oldest wins. The result is `["<root>/istio_converted_static_strict"]` when effectively
/// STRICT, else `["<ns>/converted_peer_authentication_<name>"]` when port-level modes need it,
/// else empty, never both. The converted key may name a policy [`converted_policy`] did not
/// generate (istiod does the same; ztunnel skips unknown names).
pub(crate) fn workload_references<'a>(
    workload_namespace: &str,
    workload_labels: &Labels,
    pas_in_ns: &[&'a PeerAuthentication],
    root_pas: &[&'a PeerAuthentication],
    root_namespace: &str,
) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let candidates = root_pas
        .iter()
        .filter(|pa| pa.namespace == root_namespace && pa.selector.is_none())
        .chain(pas_in_ns.iter().filter(|pa| {
            pa.namespace == workload_namespace
                && pa.selector.as_ref().is_none_or(|selector| {
                    selector
                        .iter()
                        .all(|(k, v)| workload_labels.get(k) == Some(v))
                })
        }))
        .copied()
        .filter(|pa| seen.insert((pa.namespace.as_str(), pa.name.as_str())));

    let (mut mesh, mut namespace, mut workload) = (None, None, None);
    for pa in candidates {
        let selector_less = pa.selector.as_ref().is_none_or(Labels::is_empty);
        if selector_less && pa.namespace == root_namespace {
            keep_oldest(&mut mesh, pa);
        } else if selector_less {
            keep_oldest(&mut namespace, pa);
        } else if pa.namespace != root_namespace {
            keep_oldest(&mut workload, pa);
        }
    }

    let mut strict = mesh.is_some_and(|pa| pa.mode == MtlsMode::Strict);
    if let Some(ns) = namespace.filter(|pa| pa.mode != MtlsMode::Unset) {
        strict = ns.mode == MtlsMode::Strict;
    }
    let mut converted = None;
    if let Some(wl) = workload {
        match wl.mode {
            MtlsMode::Strict => strict = true,
            MtlsMode::Permissive | MtlsMode::Disable => strict = false,
            MtlsMode::Unset => {}
        }
        // Only real ports count, as in the conversion: a reference to a policy that is not
        // generated would drop the static strict policy and let plaintext in (fail open).
        let any_port =
            |pred: fn(MtlsMode) -> bool| wl.port_level.range(..=65535).any(|(_, m)| pred(*m));
        match wl.mode {
            MtlsMode::Strict => {
                if any_port(MtlsMode::non_strict) {
                    converted = Some(converted_key(wl));
                    strict = false;
                }
            }
            MtlsMode::Permissive | MtlsMode::Disable => {
                if any_port(|m| m == MtlsMode::Strict) {
                    converted = Some(converted_key(wl));
                }
            }
            // Quirk: only PERMISSIVE ports count here; DISABLE ports are not checked.
            MtlsMode::Unset if strict => {
                if any_port(|m| m == MtlsMode::Permissive) {
                    converted = Some(converted_key(wl));
                    strict = false;
                }
            }
            MtlsMode::Unset => {
                strict = false;
                if any_port(|m| m == MtlsMode::Strict) {
                    converted = Some(converted_key(wl));
                }
            }
        }
    }
    let mut keys: Vec<String> = Vec::new();
    if strict {
        keys.push(static_strict_key(root_namespace));
    }
    keys.extend(converted);
    keys.sort();
    keys
}
