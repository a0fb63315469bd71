//! The conversion itself (istiod's `convertAuthorizationPolicy` / `handleRule`) and the status.
//!
//! Per spec rule, one `Rule` whose clauses are, in istiod's order: the `to` ports (one Match
//! per `to[]`), the `from` sources (one Match per `from[]`), then one clause per `when[]`.
//! L7 attributes drop the whole rule from an ALLOW policy and are left out of a DENY policy;
//! a DENY Match left with no field is sent as `{}`, which ztunnel never matches (istiod does
//! the same and says so in the status).
//!
//! Fail closed on invalid values (istiod silently drops them, which can loosen a policy). A
//! value that does not parse (an IP or CIDR, a port: named ports are invalid in Istio's own
//! validation) is *unknown*: it might have matched anything.
//! * ALLOW keeps only what it can prove. In a positive list the invalid values are dropped as
//!   istiod does, but if none is left the Match can never match and is sent as `{}`; an invalid
//!   value in a `not*` list also makes the Match `{}` (nothing it excludes can be known).
//! * DENY widens. An invalid value in a positive list removes that whole field from the Match
//!   (the field might have matched); an invalid value in a `not*` list is dropped (it might have
//!   excluded nothing). A Match that is left with no field because of this matches everything,
//!   so its clause is left out of the rule (a rule with no clause denies everything).
//!
//! Either way the policy is stricter than written, never looser, and the status lists the
//! invalid values.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::discovery::model::authorization::{
    AuthorizationPolicy, Condition, Operation, PolicyAction, PolicyRule, Source,
};
use crate::discovery::names::ip_bytes;
use crate::pb::google::protobuf::Empty;
use crate::pb::security::{
    Action, Address, Authorization, Clause, Match, Rule, Scope, ServiceAccountMatch, StringMatch,
    string_match::MatchType,
};

use crate::discovery::model::status::ZTUNNEL_ACCEPTED;
/// Kubernetes caps `Condition.message` at 32768 bytes.
const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// How many invalid values the status names before summarising.
const MAX_INVALID_LISTED: usize = 5;

const HTTP_DENY_NO_EFFECT: &str = "After omitting unsupported HTTP attributes, this DENY policy has no \
     enforceable rules at ztunnel and will have no effect. Deploy a waypoint proxy and use a \
     targetRef to enforce this policy.";
const HTTP_DENY_MIXED: &str = "DENY policy with HTTP attributes is enforced without the HTTP rules. \
     This will be more restrictive than requested.";
const HTTP_ALLOW: &str = "Within an ALLOW policy, rules matching HTTP attributes are omitted. This \
     will be more restrictive than requested.";

/// The five `when` keys ztunnel can enforce.
const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

use crate::discovery::model::status::PolicyStatus;

impl PolicyStatus {
    fn new(status: bool, reason: &str, message: String) -> Self {
        PolicyStatus {
            condition_type: ZTUNNEL_ACCEPTED,
            status,
            reason: reason.to_string(),
            message: truncate(message),
        }
    }
}

/// What one AuthorizationPolicy becomes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvertedPolicy {
    /// The resource to serve as `<ns>/<name>`; `None` when ztunnel must not see the policy.
    pub(crate) authorization: Option<Authorization>,
    /// The condition to write; `None` when istiod writes none (waypoint/targetRef policies).
    pub(crate) status: Option<PolicyStatus>,
}

/// Inputs of the conversion besides the policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvertOptions<'a> {
    /// meshConfig.rootNamespace: selector-less policies there are GLOBAL.
    pub(crate) root_namespace: &'a str,
    /// `AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY` (istiod default: false). When false,
    /// dry-run policies are not sent; when true they are sent with `dry_run: true`.
    pub(crate) dry_run_enabled: bool,
}

/// Converts with istiod's defaults (dry-run support off), for tests. See [`convert_policy_with`].
#[cfg(test)]
pub(crate) fn convert_policy(
    policy: &AuthorizationPolicy,
    root_namespace: &str,
) -> ConvertedPolicy {
    convert_policy_with(
        policy,
        ConvertOptions {
            root_namespace,
            dry_run_enabled: false,
        },
    )
}

/// Converts one policy per docs/authorization.md: the Authorization ztunnel enforces (if any)
/// and the `ZtunnelAccepted` condition.
pub(crate) fn convert_policy_with(
    policy: &AuthorizationPolicy,
    options: ConvertOptions<'_>,
) -> ConvertedPolicy {
    // istiod checks dry-run before targetRefs, so a dry-run waypoint policy gets this status.
    if policy.dry_run && !options.dry_run_enabled {
        let message = format!(
            "found policy \"{}/{}\" using dry-run annotation, but support for ambient dry-run \
             authorizationPolicies isn't enabled",
            policy.namespace, policy.name
        );
        return not_sent(Some(PolicyStatus::new(false, "UnsupportedValue", message)));
    }
    if policy.has_target_refs {
        return not_sent(None);
    }
    let action = match &policy.action {
        PolicyAction::Allow => Action::Allow,
        PolicyAction::Deny => Action::Deny,
        PolicyAction::Audit | PolicyAction::Custom => {
            let message = format!(
                "ztunnel does not support the {} action",
                policy.action.as_str()
            );
            return not_sent(Some(PolicyStatus::new(false, "UnsupportedValue", message)));
        }
        PolicyAction::Unknown(text) => {
            let message = format!(
                "ztunnel does not support the {text:?} action (not one of ALLOW, DENY, AUDIT, \
                 CUSTOM); the policy is not sent to ztunnel"
            );
            return not_sent(Some(PolicyStatus::new(false, "UnsupportedValue", message)));
        }
    };
    let scope = match &policy.selector {
        Some(_) => Scope::WorkloadSelector,
        None if policy.namespace == options.root_namespace => Scope::Global,
        None => Scope::Namespace,
    };
    let mut findings = Findings::default();
    let rules: Vec<Rule> = policy
        .rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| convert_rule(action, rule, &policy.namespace, i, &mut findings))
        .collect();
    let status = findings.status(action, &rules);
    let authorization = Authorization {
        name: policy.name.clone(),
        namespace: policy.namespace.clone(),
        scope: scope as i32,
        action: action as i32,
        rules,
        dry_run: policy.dry_run && options.dry_run_enabled,
        extensions: Vec::new(),
    };
    ConvertedPolicy {
        authorization: Some(authorization),
        status: Some(status),
    }
}

/// Whether [`convert_policy_with`] produces an Authorization for this policy.
pub(super) fn is_sent(policy: &AuthorizationPolicy, dry_run_enabled: bool) -> bool {
    (dry_run_enabled || !policy.dry_run)
        && !policy.has_target_refs
        && matches!(policy.action, PolicyAction::Allow | PolicyAction::Deny)
}

fn not_sent(status: Option<PolicyStatus>) -> ConvertedPolicy {
    ConvertedPolicy {
        authorization: None,
        status,
    }
}

/// What the conversion had to leave out, for the status.
#[derive(Default)]
struct Findings {
    /// Unsupported (HTTP) attribute names and `when` keys, sorted as istiod sorts them.
    l7: BTreeSet<String>,
    /// `path: "value"` of each invalid value, in order.
    invalid: Vec<String>,
}

impl Findings {
    fn status(&self, action: Action, rules: &[Rule]) -> PolicyStatus {
        let mut parts = Vec::new();
        if !self.l7.is_empty() {
            let boilerplate = match action {
                Action::Deny if !has_effective_rules(rules) => HTTP_DENY_NO_EFFECT,
                Action::Deny => HTTP_DENY_MIXED,
                Action::Allow => HTTP_ALLOW,
            };
            let found = self.l7.iter().map(String::as_str).collect::<Vec<_>>();
            parts.push(format!(
                "ztunnel does not support HTTP attributes (found: {}). In ambient mode you must \
                 use a waypoint proxy to enforce HTTP rules. {boilerplate}",
                found.join(", ")
            ));
        }
        if !self.invalid.is_empty() {
            let mut listed = self.invalid[..self.invalid.len().min(MAX_INVALID_LISTED)].join(", ");
            if self.invalid.len() > MAX_INVALID_LISTED {
                let _ = write!(
                    listed,
                    ", and {} more",
                    self.invalid.len() - MAX_INVALID_LISTED
                );
            }
            let effect = match action {
                Action::Allow => {
                    "In an ALLOW policy a condition on an invalid value never matches."
                }
                Action::Deny => {
                    "In a DENY policy a condition on an invalid value is treated as matching any \
                     connection."
                }
            };
            parts.push(format!(
                "ztunnel cannot use invalid values (found: {listed}). {effect} This will be more \
                 restrictive than requested."
            ));
        }
        if parts.is_empty() {
            PolicyStatus::new(true, "Accepted", "attached to ztunnel".to_string())
        } else {
            PolicyStatus::new(true, "UnsupportedValue", parts.join(" "))
        }
    }
}

/// istiod's `hasEffectiveRules`: some rule can match at ztunnel (no clause, or every clause has
/// a Match with at least one field).
fn has_effective_rules(rules: &[Rule]) -> bool {
    rules.iter().any(|rule| {
        rule.clauses
            .iter()
            .all(|clause| clause.matches.iter().any(|m| *m != Match::default()))
    })
}

/// One spec rule -> one Rule, or `None` when an ALLOW rule is dropped for L7 attributes.
fn convert_rule(
    action: Action,
    rule: &PolicyRule,
    policy_namespace: &str,
    index: usize,
    findings: &mut Findings,
) -> Option<Rule> {
    let mut found_l7 = false;
    let mut clauses = Vec::new();
    let to: Vec<Entry> = rule
        .to
        .iter()
        .enumerate()
        .map(|(j, op)| {
            let path = format!("rules[{index}].to[{j}].operation");
            found_l7 |= operation_l7(op, &mut findings.l7);
            convert_operation(action, op, &path, findings)
        })
        .collect();
    clauses.extend(clause_of(to));
    let from: Vec<Entry> = rule
        .from
        .iter()
        .enumerate()
        .map(|(j, source)| {
            let path = format!("rules[{index}].from[{j}].source");
            found_l7 |= source_l7(source, &mut findings.l7);
            convert_source(action, source, policy_namespace, &path, findings)
        })
        .collect();
    clauses.extend(clause_of(from));
    for (j, condition) in rule.when.iter().enumerate() {
        if !L4_WHEN_KEYS.contains(&condition.key.as_str()) {
            found_l7 = true;
            findings.l7.insert(condition.key.clone());
        }
        let path = format!("rules[{index}].when[{j}]");
        clauses.extend(clause_of(vec![convert_condition(
            action, condition, &path, findings,
        )]));
    }
    if action == Action::Allow && found_l7 {
        // L7 rules never match for ALLOW: dropping the rule is more restrictive.
        return None;
    }
    Some(Rule { clauses })
}

/// A clause from one Match per entry; `None` (no clause) when an entry matches everything.
/// An empty entry list gives no clause either (the part was absent from the rule).
fn clause_of(entries: Vec<Entry>) -> Option<Clause> {
    if entries.is_empty() {
        return None;
    }
    let mut matches = Vec::with_capacity(entries.len());
    for entry in entries {
        match entry {
            Entry::Always => return None,
            Entry::Match(m) => matches.push(m),
        }
    }
    Some(Clause { matches })
}

fn operation_l7(op: &Operation, found: &mut BTreeSet<String>) -> bool {
    let fields = [
        ("hosts", &op.hosts),
        ("notHosts", &op.not_hosts),
        ("methods", &op.methods),
        ("notMethods", &op.not_methods),
        ("paths", &op.paths),
        ("notPaths", &op.not_paths),
    ];
    record_l7(&fields, found)
}

fn source_l7(source: &Source, found: &mut BTreeSet<String>) -> bool {
    let fields = [
        ("remoteIpBlocks", &source.remote_ip_blocks),
        ("notRemoteIpBlocks", &source.not_remote_ip_blocks),
        ("requestPrincipals", &source.request_principals),
        ("notRequestPrincipals", &source.not_request_principals),
        ("trustDomains", &source.trust_domains),
        ("notTrustDomains", &source.not_trust_domains),
    ];
    record_l7(&fields, found)
}

fn record_l7(fields: &[(&str, &Vec<String>)], found: &mut BTreeSet<String>) -> bool {
    let mut any = false;
    for (name, values) in fields {
        if !values.is_empty() {
            found.insert((*name).to_string());
            any = true;
        }
    }
    any
}

fn convert_operation(action: Action, op: &Operation, path: &str, findings: &mut Findings) -> Entry {
    let mut b = EntryBuilder::new(action, path, findings);
    b.m.destination_ports = b.positive("ports", &op.ports, parse_port);
    b.m.not_destination_ports = b.negative("notPorts", &op.not_ports, parse_port);
    b.finish()
}

fn convert_source(
    action: Action,
    source: &Source,
    policy_namespace: &str,
    path: &str,
    findings: &mut Findings,
) -> Entry {
    let mut b = EntryBuilder::new(action, path, findings);
    b.m.source_ips = b.positive("ipBlocks", &source.ip_blocks, parse_address);
    b.m.not_source_ips = b.negative("notIpBlocks", &source.not_ip_blocks, parse_address);
    b.m.namespaces = string_matches(&source.namespaces);
    b.m.not_namespaces = string_matches(&source.not_namespaces);
    b.m.service_accounts = service_accounts(&source.service_accounts, policy_namespace);
    b.m.not_service_accounts = service_accounts(&source.not_service_accounts, policy_namespace);
    b.m.principals = string_matches(&source.principals);
    b.m.not_principals = string_matches(&source.not_principals);
    b.finish()
}

/// One `when` -> one Match. A key outside the five L4 keys gives `{}` (recorded as L7 by the
/// caller).
fn convert_condition(
    action: Action,
    condition: &Condition,
    path: &str,
    findings: &mut Findings,
) -> Entry {
    let mut b = EntryBuilder::new(action, path, findings);
    let (values, not_values) = (&condition.values, &condition.not_values);
    match condition.key.as_str() {
        "source.ip" => {
            b.m.source_ips = b.positive("values", values, parse_address);
            b.m.not_source_ips = b.negative("notValues", not_values, parse_address);
        }
        "source.namespace" => {
            b.m.namespaces = string_matches(values);
            b.m.not_namespaces = string_matches(not_values);
        }
        "source.principal" => {
            b.m.principals = string_matches(values);
            b.m.not_principals = string_matches(not_values);
        }
        "destination.ip" => {
            b.m.destination_ips = b.positive("values", values, parse_address);
            b.m.not_destination_ips = b.negative("notValues", not_values, parse_address);
        }
        "destination.port" => {
            b.m.destination_ports = b.positive("values", values, parse_port);
            b.m.not_destination_ports = b.negative("notValues", not_values, parse_port);
        }
        _ => {}
    }
    b.finish()
}

/// What one `from[]`, `to[]` or `when[]` entry becomes.
#[allow(clippy::large_enum_variant)] // short-lived, moved once into its Clause
enum Entry {
    /// A Match to send (`{}` never matches at ztunnel).
    Match(Match),
    /// Matches every connection: the clause it sits in is always true.
    Always,
}

/// Builds one Match, applying the fail-closed rules for invalid values (module docs).
struct EntryBuilder<'a> {
    action: Action,
    path: &'a str,
    findings: &'a mut Findings,
    m: Match,
    /// ALLOW: some field could not be proven, so the Match must never match.
    never: bool,
    /// DENY: some field was widened because of an invalid value.
    widened: bool,
}

impl<'a> EntryBuilder<'a> {
    fn new(action: Action, path: &'a str, findings: &'a mut Findings) -> Self {
        EntryBuilder {
            action,
            path,
            findings,
            m: Match::default(),
            never: false,
            widened: false,
        }
    }

    /// A list where any value matching is enough (`ipBlocks`, `ports`, `values`).
    fn positive<T>(
        &mut self,
        field: &str,
        values: &[String],
        parse: fn(&str) -> Option<T>,
    ) -> Vec<T> {
        let (valid, invalid) = self.parse(field, values, parse);
        if !invalid {
            return valid;
        }
        match self.action {
            Action::Allow => {
                self.never |= valid.is_empty();
                valid
            }
            Action::Deny => {
                self.widened = true;
                Vec::new()
            }
        }
    }

    /// A list where no value may match (`notIpBlocks`, `notPorts`, `notValues`).
    fn negative<T>(
        &mut self,
        field: &str,
        values: &[String],
        parse: fn(&str) -> Option<T>,
    ) -> Vec<T> {
        let (valid, invalid) = self.parse(field, values, parse);
        if invalid {
            match self.action {
                Action::Allow => self.never = true,
                Action::Deny => self.widened = true,
            }
        }
        valid
    }

    /// Parses every value, recording the invalid ones. Returns the valid ones and whether any
    /// was invalid.
    fn parse<T>(
        &mut self,
        field: &str,
        values: &[String],
        parse: fn(&str) -> Option<T>,
    ) -> (Vec<T>, bool) {
        let mut valid = Vec::with_capacity(values.len());
        let mut invalid = false;
        for value in values {
            match parse(value) {
                Some(v) => valid.push(v),
                None => {
                    invalid = true;
                    self.findings
                        .invalid
                        .push(format!("{}.{field} {value:?}", self.path));
                }
            }
        }
        (valid, invalid)
    }

    fn finish(self) -> Entry {
        if self.never {
            Entry::Match(Match::default())
        } else if self.widened && self.m == Match::default() {
            Entry::Always
        } else {
            Entry::Match(self.m)
        }
    }
}

/// `*` -> presence; `*x` -> suffix; `x*` -> prefix; anything else -> exact.
pub(super) fn string_match(value: &str) -> StringMatch {
    let match_type = if value == "*" {
        MatchType::Presence(Empty {})
    } else if let Some(suffix) = value.strip_prefix('*') {
        MatchType::Suffix(suffix.to_string())
    } else if let Some(prefix) = value.strip_suffix('*') {
        MatchType::Prefix(prefix.to_string())
    } else {
        MatchType::Exact(value.to_string())
    };
    StringMatch {
        match_type: Some(match_type),
    }
}

fn string_matches(values: &[String]) -> Vec<StringMatch> {
    values.iter().map(|v| string_match(v)).collect()
}

/// `ns/sa` (split at the first `/`), or a bare `sa` in the policy's namespace.
fn service_accounts(values: &[String], policy_namespace: &str) -> Vec<ServiceAccountMatch> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => ServiceAccountMatch {
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            },
            None => ServiceAccountMatch {
                namespace: policy_namespace.to_string(),
                service_account: v.clone(),
            },
        })
        .collect()
}

/// A decimal port 0..=65535, as Go's `strconv.ParseUint(s, 10, 32)` plus the range check
/// (no sign, no spaces; leading zeros allowed). Named ports are `None`.
pub(super) fn parse_port(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u64 = value.parse().ok()?;
    u32::try_from(port).ok().filter(|p| *p <= 65535)
}

/// `a.b.c.d` / v6 -> full length; `addr/len` -> the address as written (not masked) and `len`.
pub(super) fn parse_address(value: &str) -> Option<Address> {
    let (ip, length) = parse_cidr(value)?;
    Some(Address {
        address: ip_bytes(&ip),
        length,
    })
}

/// Go's `netip.ParsePrefix` / `ParseAddr`: the prefix length is decimal with no sign or
/// leading zero, at most the address's bit length.
pub(super) fn parse_cidr(value: &str) -> Option<(IpAddr, u32)> {
    match value.split_once('/') {
        Some((addr, bits)) => {
            let ip: IpAddr = addr.parse().ok()?;
            let valid_digits = !bits.is_empty()
                && bits.len() <= 3
                && bits.bytes().all(|b| b.is_ascii_digit())
                && (bits == "0" || !bits.starts_with('0'));
            if !valid_digits {
                return None;
            }
            let length: u32 = bits.parse().ok()?;
            (length <= max_bits(&ip)).then_some((ip, length))
        }
        None => {
            let ip: IpAddr = value.parse().ok()?;
            Some((ip, max_bits(&ip)))
        }
    }
}

fn max_bits(ip: &IpAddr) -> u32 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Cuts a status message to the Kubernetes limit, on a character boundary.
fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}
