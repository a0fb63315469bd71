//! ztunnel's L4 authorization decision (istio/ztunnel `src/rbac.rs`), run over the
//! `istio.security.Authorization` protos ambientd sends.
//!
//! Nothing here is on the serving path: it lets tests and `/debug/authorize` answer
//! "would ztunnel let this connection in?" for what the conversion produced, with ztunnel's
//! own edge cases: a policy with no rules never matches, a Rule with no clauses always does, a
//! Clause with no matches always does, and a Match left with no field (after ztunnel drops
//! invalid addresses and typeless string matches) never does.

use std::fmt;
use std::net::IpAddr;

use crate::discovery::names::ip_from_bytes;
use crate::pb::security::{
    Action, Address, Authorization, Match, Scope, ServiceAccountMatch, StringMatch,
    string_match::MatchType,
};
use crate::pb::workload::Workload;

#[cfg(test)]
mod tests;

/// A peer's SPIFFE identity, `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) trust_domain: String,
    pub(crate) namespace: String,
    pub(crate) service_account: String,
}

impl Identity {
    /// The principal policies compare against: the SPIFFE URI without `spiffe://`.
    pub(crate) fn principal(&self) -> String {
        format!(
            "{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// One inbound connection as the destination ztunnel sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Connection {
    /// The peer certificate's identity; `None` for plaintext.
    pub(crate) source_identity: Option<Identity>,
    pub(crate) source_ip: IpAddr,
    pub(crate) destination_ip: IpAddr,
    pub(crate) destination_port: u16,
}

/// Why a connection was allowed or denied, worded as ztunnel logs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reason {
    /// A DENY policy matched.
    Denied,
    /// An ALLOW policy matched.
    Allowed,
    /// No DENY matched and no ALLOW policy applies.
    NoAllowPolicies,
    /// ALLOW policies apply but none matched.
    NoAllowMatched,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Denied => "explicitly denied",
            Reason::Allowed => "explicitly allowed",
            Reason::NoAllowPolicies => "no allow policies",
            Reason::NoAllowMatched => "allow policies exist, but none allowed",
        })
    }
}

/// The outcome for one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) allowed: bool,
    /// `ns/name` of the policy that decided, when one did.
    pub(crate) policy: Option<String>,
    /// Index in that policy's `rules` (the *converted* rules) of the first one that matched.
    pub(crate) rule: Option<usize>,
    pub(crate) reason: Reason,
}

/// Decides a connection to `destination` as ztunnel does, from every policy it knows.
///
/// Applied policies: GLOBAL ones, NAMESPACE ones of the destination's namespace, and any named
/// in `destination.authorization_policies` (unknown names are skipped). A policy with an
/// unknown scope or action number is one ztunnel would have rejected, so it is ignored; a
/// dry-run policy is only logged by ztunnel, so it is ignored too. Then: any DENY matching
/// denies; else no ALLOW policy allows; else any ALLOW matching allows; else deny. Policies are
/// visited in `ns/name` order so the reported policy is deterministic.
pub(crate) fn evaluate(
    policies: &[&Authorization],
    destination: &Workload,
    request: &Connection,
) -> Decision {
    let mut applied: Vec<(String, &Authorization)> = policies
        .iter()
        .filter(|p| applies_to(p, destination))
        .map(|p| (key(p), *p))
        .collect();
    applied.sort_by(|a, b| a.0.cmp(&b.0));
    applied.dedup_by(|a, b| a.0 == b.0);

    let deny = applied
        .iter()
        .filter(|(_, p)| p.action == Action::Deny as i32);
    for (name, policy) in deny {
        if let Some(rule) = matching_rule(policy, request) {
            return decision(false, Some(name), Some(rule), Reason::Denied);
        }
    }
    let mut allows = applied
        .iter()
        .filter(|(_, p)| p.action == Action::Allow as i32)
        .peekable();
    if allows.peek().is_none() {
        return decision(true, None, None, Reason::NoAllowPolicies);
    }
    for (name, policy) in allows {
        if let Some(rule) = matching_rule(policy, request) {
            return decision(true, Some(name), Some(rule), Reason::Allowed);
        }
    }
    decision(false, None, None, Reason::NoAllowMatched)
}

fn decision(allowed: bool, policy: Option<&str>, rule: Option<usize>, reason: Reason) -> Decision {
    Decision {
        allowed,
        policy: policy.map(str::to_string),
        rule,
        reason,
    }
}

fn key(policy: &Authorization) -> String {
    format!("{}/{}", policy.namespace, policy.name)
}

/// Whether ztunnel would apply `policy` to connections to `destination` (scope, reference,
/// valid enums, not dry-run).
pub(crate) fn applies_to(policy: &Authorization, destination: &Workload) -> bool {
    let (Ok(scope), Ok(_)) = (
        Scope::try_from(policy.scope),
        Action::try_from(policy.action),
    ) else {
        return false;
    };
    if policy.dry_run {
        return false;
    }
    let by_scope = match scope {
        Scope::Global => true,
        Scope::Namespace => policy.namespace == destination.namespace,
        Scope::WorkloadSelector => false,
    };
    by_scope || destination.authorization_policies.contains(&key(policy))
}

/// The index of the first rule of `policy` matching `request`, if any. A policy with no rules
/// matches nothing.
pub(crate) fn matching_rule(policy: &Authorization, request: &Connection) -> Option<usize> {
    let peer = Peer::new(request);
    policy.rules.iter().position(|rule| {
        rule.clauses.iter().all(|clause| {
            clause.matches.is_empty() || clause.matches.iter().any(|m| match_matches(m, &peer))
        })
    })
}

/// What a Match is evaluated against.
struct Peer<'a> {
    request: &'a Connection,
    /// `spiffe://`-less identity; `None` for plaintext (matches no principal).
    principal: Option<String>,
    /// The identity's namespace; empty for plaintext.
    namespace: &'a str,
}

impl<'a> Peer<'a> {
    fn new(request: &'a Connection) -> Self {
        let identity = request.source_identity.as_ref();
        Peer {
            request,
            principal: identity.map(Identity::principal),
            namespace: identity.map_or("", |i| i.namespace.as_str()),
        }
    }
}

/// One Match, as ztunnel evaluates it: invalid entries were dropped on receipt, an empty Match
/// is skipped, each field is "any positive (if any) and no negative".
fn match_matches(m: &Match, peer: &Peer<'_>) -> bool {
    let request = peer.request;
    let nets = |list: &[Address]| list.iter().filter_map(ip_net).collect::<Vec<_>>();
    let strings = |list: &[StringMatch]| {
        list.iter()
            .filter_map(|s| s.match_type.as_ref())
            .cloned()
            .collect::<Vec<_>>()
    };
    let ports = |list: &[u32]| list.iter().map(|p| *p as u16).collect::<Vec<_>>();

    let (dst_ips, not_dst_ips) = (nets(&m.destination_ips), nets(&m.not_destination_ips));
    let (src_ips, not_src_ips) = (nets(&m.source_ips), nets(&m.not_source_ips));
    let (dst_ports, not_dst_ports) = (ports(&m.destination_ports), ports(&m.not_destination_ports));
    let (principals, not_principals) = (strings(&m.principals), strings(&m.not_principals));
    let (namespaces, not_namespaces) = (strings(&m.namespaces), strings(&m.not_namespaces));
    let empty = dst_ips.is_empty()
        && not_dst_ips.is_empty()
        && src_ips.is_empty()
        && not_src_ips.is_empty()
        && dst_ports.is_empty()
        && not_dst_ports.is_empty()
        && m.service_accounts.is_empty()
        && m.not_service_accounts.is_empty()
        && principals.is_empty()
        && not_principals.is_empty()
        && namespaces.is_empty()
        && not_namespaces.is_empty();
    if empty {
        return false;
    }
    field(&dst_ips, &not_dst_ips, |n| {
        n.contains(request.destination_ip)
    }) && field(&src_ips, &not_src_ips, |n| n.contains(request.source_ip))
        && field(&dst_ports, &not_dst_ports, |p| {
            *p == request.destination_port
        })
        && field(&m.service_accounts, &m.not_service_accounts, |sa| {
            service_account_matches(sa, request.source_identity.as_ref())
        })
        && field(&principals, &not_principals, |p| {
            peer.principal
                .as_deref()
                .is_some_and(|id| string_matches(p, id))
        })
        && field(&namespaces, &not_namespaces, |ns| {
            string_matches(ns, peer.namespace)
        })
}

/// ztunnel's `matches_internal`: an empty list is no constraint.
fn field<T>(positive: &[T], negative: &[T], mut predicate: impl FnMut(&T) -> bool) -> bool {
    (positive.is_empty() || positive.iter().any(&mut predicate))
        && !negative.iter().any(&mut predicate)
}

fn string_matches(m: &MatchType, value: &str) -> bool {
    match m {
        MatchType::Exact(exact) => value == exact,
        MatchType::Prefix(prefix) => value.starts_with(prefix.as_str()),
        MatchType::Suffix(suffix) => value.ends_with(suffix.as_str()),
        MatchType::Presence(_) => !value.is_empty(),
    }
}

fn service_account_matches(sa: &ServiceAccountMatch, identity: Option<&Identity>) -> bool {
    identity.is_some_and(|i| i.namespace == sa.namespace && i.service_account == sa.service_account)
}

/// A network as ztunnel builds it: 4 or 16 address bytes and `length as u8` within the
/// family's bit length; anything else is dropped.
#[derive(Clone, Copy, Debug)]
struct IpNet {
    address: IpAddr,
    length: u8,
}

fn ip_net(address: &Address) -> Option<IpNet> {
    let ip = ip_from_bytes(&address.address)?;
    let length = address.length as u8;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (length <= max).then_some(IpNet {
        address: ip,
        length,
    })
}

impl IpNet {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.length))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.length))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}
