//! What a waypoint can express of an AuthorizationPolicy with `targetRef(s)`: one
//! classification, read by both the waypoint's RBAC translator (`src/waypoint/rbac.rs`, which
//! sits above `src/discovery` and calls these functions) and the policy's `WaypointAccepted`
//! condition ([`unexpressed`], `convert::conditions`). Pure: no store, no Envoy types.
//!
//! Three kinds of field fail closed at a waypoint (the translator drops the rule from an ALLOW
//! policy and the field from a DENY policy):
//! - HTTP attributes (`hosts`, `methods`, `paths`, `remoteIpBlocks`, `requestPrincipals`, their
//!   `not` forms, and the `request.*` / `remote.ip` conditions): matched on HTTP ports only,
//!   never on TCP ones;
//! - `when` keys the waypoint does not support, anywhere: `experimental.envoy.filters.*` and
//!   any key that is not an Istio condition;
//! - values Envoy would refuse: an unparsable IP, CIDR or port, a malformed path template, a
//!   header name Envoy refuses.
//!
//! The action matters too: AUDIT is not enforced; CUSTOM (no extension provider here) and
//! unknown actions deny what their rules match; dry-run policies are not enforced.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::discovery::model::authorization::{
    AuthorizationPolicy, Condition, Operation, PolicyAction, Source,
};

/// Where a waypoint can match an attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Every chain: identities, addresses, ports, SNI.
    AllPorts,
    /// HTTP chains only (needs the request, or its verified JWT).
    HttpPorts,
    /// Nowhere: not a condition the waypoint supports.
    Nowhere,
}

/// `request.auth.claims[...]`.
pub(crate) const REQUEST_CLAIMS: &str = "request.auth.claims";
/// `request.headers[...]`.
pub(crate) const REQUEST_HEADERS: &str = "request.headers";

/// Where a `when` key can be matched: the translator's `condition` arms, as data.
pub(crate) fn when_key_reach(key: &str) -> Reach {
    match key {
        "source.ip"
        | "source.namespace"
        | "source.principal"
        | "source.serviceAccount"
        | "source.trustDomain"
        | "destination.ip"
        | "destination.port"
        | "connection.sni" => Reach::AllPorts,
        "remote.ip"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter" => Reach::HttpPorts,
        _ if key.starts_with(REQUEST_CLAIMS) => match claim_names(&key[REQUEST_CLAIMS.len()..]) {
            Some(_) => Reach::HttpPorts,
            None => Reach::Nowhere,
        },
        _ if key.starts_with(REQUEST_HEADERS) => match header_of(key) {
            Some(_) => Reach::HttpPorts,
            None => Reach::Nowhere,
        },
        _ => Reach::Nowhere,
    }
}

/// The header name of a `request.headers[<name>]` key.
pub(crate) fn header_of(key: &str) -> Option<&str> {
    key.strip_prefix(REQUEST_HEADERS)?
        .strip_prefix('[')?
        .strip_suffix(']')
}

/// The claim names of `request.auth.claims[a][b]`'s `[a][b]` (istiod's nested claims), or of
/// `[a.b]` as one name; `None` when there is no name or one is empty.
pub(crate) fn claim_names(brackets: &str) -> Option<Vec<&str>> {
    let whole = || {
        brackets
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .map(|name| vec![name])
    };
    let mut names = Vec::new();
    let mut rest = brackets;
    let names = loop {
        if rest.is_empty() {
            break Some(names);
        }
        let Some(inner) = rest.strip_prefix('[') else {
            break whole();
        };
        match inner.find(['[', ']']) {
            Some(end) if inner.as_bytes()[end] == b']' => {
                names.push(&inner[..end]);
                rest = &inner[end + 1..];
            }
            _ => break whole(),
        }
    };
    names.filter(|n| !n.is_empty() && n.iter().all(|name| !name.is_empty()))
}

/// A header name Envoy accepts: not empty, and no NUL, CR, LF, or `:` after the first
/// character (pseudo-headers such as `:method` start with one).
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(['\0', '\r', '\n'])
        && !name.get(1..).is_some_and(|rest| rest.contains(':'))
}

/// A port number (0–65535).
pub(crate) fn port(text: &str) -> Option<u32> {
    text.parse::<u16>().ok().map(u32::from)
}

/// `10.0.0.0/8` or a bare IP (a /32 or /128): the address and the prefix length.
pub(crate) fn cidr(text: &str) -> Option<(IpAddr, u32)> {
    let (ip, len) = match text.split_once('/') {
        Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
        None => (text, None),
    };
    let ip: IpAddr = ip.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((ip, len))
}

/// How a `paths` value is matched: a plain path (Istio's `*` prefix/suffix forms), or a path
/// template (`{*}` one segment, `{**}` the rest) as Envoy's URI template (`*`, `**`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PathValue<'a> {
    Plain(&'a str),
    Template(String),
}

/// A `paths` value, or `None` for a template istiod's validation refuses, and for `{`/`}`
/// elsewhere (a template this cannot read).
pub(crate) fn path_value(path: &str) -> Option<PathValue<'_>> {
    const ONE: &str = "{*}";
    const ANY: &str = "{**}";
    if !path.contains(['{', '}']) {
        return Some(PathValue::Plain(path));
    }
    if !path.starts_with('/') || path.len() > 256 {
        return None;
    }
    let mut seen_any = false;
    for segment in path.trim_matches('/').split('/') {
        match segment {
            ONE | ANY if seen_any => return None,
            ONE => {}
            ANY => seen_any = true,
            literal if !literal.is_empty() && literal.chars().all(is_path_literal) => {}
            _ => return None,
        }
    }
    Some(PathValue::Template(
        path.replace(ANY, "**").replace(ONE, "*"),
    ))
}

/// A path segment's literal character in a template (RFC 3986 `pchar`, as istiod checks it).
fn is_path_literal(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~%!$&'()+,;:@=".contains(c)
}

/// What a waypoint leaves out of one policy, for its `WaypointAccepted` condition.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Unexpressed {
    /// HTTP attribute names and `when` keys (sorted): matched on HTTP ports only.
    pub(crate) http_only: BTreeSet<String>,
    /// `when` keys the waypoint does not support (sorted).
    pub(crate) unsupported: BTreeSet<String>,
    /// `rules[i]...field "value"` of each value Envoy would refuse, in order.
    pub(crate) invalid: Vec<String>,
}

/// The fields of `policy` a waypoint cannot express in full (module docs).
pub(crate) fn unexpressed(policy: &AuthorizationPolicy) -> Unexpressed {
    let mut out = Unexpressed::default();
    for (i, rule) in policy.rules.iter().enumerate() {
        for (j, source) in rule.from.iter().enumerate() {
            check_source(source, &format!("rules[{i}].from[{j}].source"), &mut out);
        }
        for (j, operation) in rule.to.iter().enumerate() {
            check_operation(
                operation,
                &format!("rules[{i}].to[{j}].operation"),
                &mut out,
            );
        }
        for (j, condition) in rule.when.iter().enumerate() {
            check_condition(condition, &format!("rules[{i}].when[{j}]"), &mut out);
        }
    }
    out
}

/// One list field: its name, values, whether it is HTTP only, and its value check.
type Field<'a> = (&'a str, &'a [String], bool, fn(&str) -> bool);

fn check_fields(fields: &[Field<'_>], path: &str, out: &mut Unexpressed) {
    for (name, values, http_only, valid) in fields {
        if values.is_empty() {
            continue;
        }
        if *http_only {
            out.http_only.insert((*name).to_string());
        }
        for value in values.iter().filter(|v| !valid(v)) {
            out.invalid.push(format!("{path}.{name} {value:?}"));
        }
    }
}

fn any(_: &str) -> bool {
    true
}

fn is_cidr(v: &str) -> bool {
    cidr(v).is_some()
}

fn is_port(v: &str) -> bool {
    port(v).is_some()
}

fn is_path(v: &str) -> bool {
    path_value(v).is_some()
}

fn check_source(s: &Source, path: &str, out: &mut Unexpressed) {
    let fields: [Field; 14] = [
        ("principals", &s.principals, false, any),
        ("notPrincipals", &s.not_principals, false, any),
        ("namespaces", &s.namespaces, false, any),
        ("notNamespaces", &s.not_namespaces, false, any),
        ("serviceAccounts", &s.service_accounts, false, any),
        ("notServiceAccounts", &s.not_service_accounts, false, any),
        ("trustDomains", &s.trust_domains, false, any),
        ("notTrustDomains", &s.not_trust_domains, false, any),
        ("ipBlocks", &s.ip_blocks, false, is_cidr),
        ("notIpBlocks", &s.not_ip_blocks, false, is_cidr),
        ("remoteIpBlocks", &s.remote_ip_blocks, true, is_cidr),
        ("notRemoteIpBlocks", &s.not_remote_ip_blocks, true, is_cidr),
        ("requestPrincipals", &s.request_principals, true, any),
        ("notRequestPrincipals", &s.not_request_principals, true, any),
    ];
    check_fields(&fields, path, out);
}

fn check_operation(o: &Operation, path: &str, out: &mut Unexpressed) {
    let fields: [Field; 8] = [
        ("ports", &o.ports, false, is_port),
        ("notPorts", &o.not_ports, false, is_port),
        ("methods", &o.methods, true, any),
        ("notMethods", &o.not_methods, true, any),
        ("paths", &o.paths, true, is_path),
        ("notPaths", &o.not_paths, true, is_path),
        ("hosts", &o.hosts, true, any),
        ("notHosts", &o.not_hosts, true, any),
    ];
    check_fields(&fields, path, out);
}

fn check_condition(c: &Condition, path: &str, out: &mut Unexpressed) {
    let reach = when_key_reach(&c.key);
    match reach {
        Reach::Nowhere => {
            out.unsupported.insert(c.key.clone());
            return;
        }
        Reach::HttpPorts => {
            out.http_only.insert(c.key.clone());
        }
        Reach::AllPorts => {}
    }
    let valid: fn(&str) -> bool = match c.key.as_str() {
        "source.ip" | "remote.ip" | "destination.ip" => is_cidr,
        "destination.port" => is_port,
        key if key.starts_with(REQUEST_HEADERS) => {
            if header_of(key).is_some_and(is_header_name) {
                any
            } else {
                // Envoy refuses the header name: no value can be matched.
                |_| false
            }
        }
        _ => any,
    };
    for (field, values) in [("values", &c.values), ("notValues", &c.not_values)] {
        for value in values.iter().filter(|v| !valid(v)) {
            out.invalid.push(format!("{path}.{field} {value:?}"));
        }
    }
}

/// The action's effect at a waypoint, when it is not enforced as written: `(enforced at all,
/// what the status says)`.
pub(crate) fn action_note(policy: &AuthorizationPolicy) -> Option<(bool, String)> {
    if policy.dry_run {
        return Some((
            false,
            "The waypoint does not support dry-run policies; the policy is not enforced."
                .to_string(),
        ));
    }
    match &policy.action {
        PolicyAction::Allow | PolicyAction::Deny => None,
        PolicyAction::Audit => Some((
            false,
            "The waypoint does not support the AUDIT action; the policy is not enforced.".to_string(),
        )),
        PolicyAction::Custom => Some((
            true,
            "The waypoint does not support the CUSTOM action (no extension provider); requests its \
             rules match are denied. This will be more restrictive than requested."
                .to_string(),
        )),
        PolicyAction::Unknown(text) => Some((
            true,
            format!(
                "The waypoint does not support the {text:?} action (not one of ALLOW, DENY, AUDIT, \
                 CUSTOM); requests its rules match are denied. This will be more restrictive \
                 than requested."
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_keys_reach_as_the_translator_matches_them() {
        let cases = [
            ("source.ip", Reach::AllPorts),
            ("connection.sni", Reach::AllPorts),
            ("remote.ip", Reach::HttpPorts),
            ("request.auth.claims[groups]", Reach::HttpPorts),
            ("request.auth.claims[a][b]", Reach::HttpPorts),
            ("request.auth.claims[]", Reach::Nowhere),
            ("request.headers[x-a]", Reach::HttpPorts),
            ("request.headers", Reach::Nowhere),
            (
                "experimental.envoy.filters.network.mysql_proxy[db.table]",
                Reach::Nowhere,
            ),
            ("source.name", Reach::Nowhere),
        ];
        for (key, want) in cases {
            assert_eq!(when_key_reach(key), want, "{key}");
        }
    }

    #[test]
    fn path_templates() {
        assert_eq!(path_value("/a*"), Some(PathValue::Plain("/a*")));
        assert_eq!(
            path_value("/a/{*}/{**}"),
            Some(PathValue::Template("/a/*/**".into()))
        );
        assert_eq!(path_value("/a/{**}/{*}"), None);
        assert_eq!(path_value("a/{*}"), None);
    }
}
