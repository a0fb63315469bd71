//! Builders shared by the conversion tests.

pub(super) use super::*;
pub(super) use crate::discovery::model::Labels;
pub(super) use crate::discovery::model::authorization::{
    Condition, Operation, PolicyAction, PolicyRule, Source,
};
pub(super) use crate::discovery::model::status::{PolicyStatus, ZTUNNEL_ACCEPTED};
pub(super) use crate::pb::google::protobuf::Empty;
pub(super) use crate::pb::security::{
    Action, Address, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
    string_match::MatchType,
};

pub(super) fn strs(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn exact(v: &str) -> StringMatch {
    StringMatch {
        match_type: Some(MatchType::Exact(v.into())),
    }
}
pub(super) fn prefix(v: &str) -> StringMatch {
    StringMatch {
        match_type: Some(MatchType::Prefix(v.into())),
    }
}
pub(super) fn suffix(v: &str) -> StringMatch {
    StringMatch {
        match_type: Some(MatchType::Suffix(v.into())),
    }
}
pub(super) fn presence() -> StringMatch {
    StringMatch {
        match_type: Some(MatchType::Presence(Empty {})),
    }
}
/// `"<ip>/<length>"` as the conformance file writes a security.Address.
pub(super) fn addr(text: &str) -> Address {
    let (ip, len) = text.split_once('/').unwrap();
    let ip: std::net::IpAddr = ip.parse().unwrap();
    Address {
        address: crate::discovery::names::ip_bytes(&ip),
        length: len.parse().unwrap(),
    }
}
pub(super) fn sa(ns: &str, name: &str) -> ServiceAccountMatch {
    ServiceAccountMatch {
        namespace: ns.into(),
        service_account: name.into(),
    }
}
/// A Rule from clauses, each a list of Matches.
pub(super) fn rule(clauses: Vec<Vec<Match>>) -> Rule {
    Rule {
        clauses: clauses
            .into_iter()
            .map(|matches| Clause { matches })
            .collect(),
    }
}
/// A Rule of one clause with one Match.
pub(super) fn one(m: Match) -> Rule {
    rule(vec![vec![m]])
}

pub(super) fn policy(
    ns: &str,
    name: &str,
    action: PolicyAction,
    rules: Vec<PolicyRule>,
) -> AuthorizationPolicy {
    AuthorizationPolicy {
        name: name.into(),
        namespace: ns.into(),
        action,
        rules,
        ..Default::default()
    }
}
pub(super) fn from(sources: Vec<Source>) -> PolicyRule {
    PolicyRule {
        from: sources,
        ..Default::default()
    }
}
pub(super) fn to(ops: Vec<Operation>) -> PolicyRule {
    PolicyRule {
        to: ops,
        ..Default::default()
    }
}
pub(super) fn when(key: &str, values: &[&str], not_values: &[&str]) -> PolicyRule {
    PolicyRule {
        when: vec![Condition {
            key: key.into(),
            values: strs(values),
            not_values: strs(not_values),
        }],
        ..Default::default()
    }
}
pub(super) fn convert(p: &AuthorizationPolicy) -> ConvertedPolicy {
    convert_policy(p, "istio-system")
}
pub(super) fn authz(p: &AuthorizationPolicy) -> Authorization {
    convert(p).authorization.expect("policy is sent")
}
pub(super) fn status(p: &AuthorizationPolicy) -> PolicyStatus {
    convert(p).status.expect("policy has a status")
}
pub(super) fn accepted() -> PolicyStatus {
    PolicyStatus {
        condition_type: ZTUNNEL_ACCEPTED,
        status: true,
        reason: "Accepted".into(),
        message: "attached to ztunnel".into(),
    }
}
pub(super) fn warning(status: bool, message: &str) -> PolicyStatus {
    PolicyStatus {
        condition_type: ZTUNNEL_ACCEPTED,
        status,
        reason: "UnsupportedValue".into(),
        message: message.into(),
    }
}
pub(super) const HTTP_PREAMBLE: &str =
    "In ambient mode you must use a waypoint proxy to enforce HTTP rules.";
