//! AuthorizationPolicies with `targetRefs` -> Envoy RBAC on a waypoint's chains
//! (istio/istio `pilot/pkg/model/policyattachment.go` and `pilot/pkg/security/`), as istiod's `pilot/pkg/security/authz/model` translates them. Which
//! policies attach to which chain is `attach`.
//!
//! - Identities (`principals`, `namespaces`, `serviceAccounts`, `trustDomains`, `source.*`)
//!   match the filter state `io.istio.peer_principal` that `connect_terminate` sets from the
//!   HBONE client's certificate (the mTLS peer lives on the outer connection), as istiod does
//!   with `UseFilterState`.
//! - On HTTP chains: `methods`, `paths` (with `{*}`/`{**}` templates), `hosts`,
//!   `remoteIpBlocks`, `request.headers[…]`, and what the chain's `jwt_authn` filter verified:
//!   `requestPrincipals`, `request.auth.principal`, `request.auth.audiences`,
//!   `request.auth.presenter` and `request.auth.claims[…]` match its payload in the dynamic
//!   metadata (`jwt`). A request without a token has no payload and matches none of them.
//! - Policy names are istiod's: `ns[<ns>]-policy[<name>]-rule[<i>]`.
//!
//! What this translator cannot express fails closed, as istiod does: in an ALLOW policy the
//! rule is dropped (it allows less), in a DENY policy only that condition is dropped (it denies
//! more). That covers every HTTP attribute (JWT ones included) on a TCP chain, the
//! `experimental.envoy.filters.*` conditions, and values Envoy would refuse (an empty header
//! or claim name, a malformed path template, an unparsable IP or port). Which attributes are
//! HTTP only, which `when` keys exist and which values parse is decided once, in
//! `discovery::convert::waypoint_authorization`, which the policy's `WaypointAccepted`
//! condition reads too.

use std::collections::BTreeMap;

use crate::discovery::convert::waypoint_authorization::{
    self as expressible, PathValue, REQUEST_CLAIMS, REQUEST_HEADERS, Reach, is_header_name,
};
use crate::discovery::model::{AuthorizationPolicy, Condition, Operation, PolicyAction, Source};
use crate::pb::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use crate::pb::envoy::config::rbac::v3 as rbac;
use crate::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use crate::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use crate::pb::envoy::r#type::matcher::v3::{FilterStateMatcher, PathMatcher, StringMatcher};
use crate::pb::envoy::r#type::matcher::v3::{filter_state_matcher, path_matcher};
use crate::waypoint::envoy::{self, exact, prefix_match, regex_match, suffix_match, uint32};
use crate::waypoint::jwt;

/// The filter-state key holding the HBONE client's SPIFFE id.
pub(crate) const PEER_PRINCIPAL: &str = "io.istio.peer_principal";

/// What a chain is, for attachment and for which attributes it can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainKind {
    Http,
    Tcp,
}

/// The RBAC configs of one chain, in filter order: DENY, then ALLOW (AUDIT is not enforced
/// and CUSTOM has no provider here: a CUSTOM policy denies what it selects, fail closed).
pub(crate) fn chain_rbac<'a>(
    policies: impl Iterator<Item = &'a AuthorizationPolicy>,
    kind: ChainKind,
) -> Vec<rbac::Rbac> {
    let mut deny = BTreeMap::new();
    let mut allow = BTreeMap::new();
    let mut any_allow = false;
    for policy in policies.filter(|p| !p.dry_run) {
        let (action, out) = match &policy.action {
            PolicyAction::Allow => {
                any_allow = true;
                (Action::Allow, &mut allow)
            }
            PolicyAction::Deny | PolicyAction::Custom => (Action::Deny, &mut deny),
            // An unknown action cannot be enforced as written: deny what it selects.
            PolicyAction::Unknown(_) => (Action::Deny, &mut deny),
            PolicyAction::Audit => continue,
        };
        if policy.rules.is_empty() {
            if action == Action::Allow {
                // An ALLOW policy without rules allows nothing; its entry never matches.
                out.insert(
                    rule_name(policy, 0),
                    rbac::Policy {
                        permissions: vec![not_rule(any_permission())],
                        principals: vec![not_id(any_principal())],
                    },
                );
            }
            continue;
        }
        for (i, rule) in policy.rules.iter().enumerate() {
            let built = Rule {
                action,
                kind,
                namespace: &policy.namespace,
            }
            .build(&rule.from, &rule.to, &rule.when);
            if let Some(built) = built {
                out.insert(rule_name(policy, i), built);
            }
        }
    }
    let mut filters = Vec::new();
    if !deny.is_empty() {
        filters.push(rbac::Rbac {
            action: rbac::r#rbac::Action::Deny as i32,
            policies: deny,
        });
    }
    if any_allow {
        // Present even when every rule was dropped: an ALLOW filter with no policy that
        // matches denies everything, which is what such a policy must do.
        filters.push(rbac::Rbac {
            action: rbac::r#rbac::Action::Allow as i32,
            policies: allow,
        });
    }
    filters
}

fn rule_name(policy: &AuthorizationPolicy, i: usize) -> String {
    format!("ns[{}]-policy[{}]-rule[{i}]", policy.namespace, policy.name)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Allow,
    Deny,
}

/// One rule's translation, under its policy's action and namespace and its chain's kind.
struct Rule<'a> {
    action: Action,
    kind: ChainKind,
    /// The policy's namespace (a bare service account is in it).
    namespace: &'a str,
}

/// An attribute this chain cannot match: the rule is dropped (ALLOW), or the attribute is
/// (DENY).
struct Unsupported;

impl Rule<'_> {
    /// The RBAC policy for one rule, `None` when it must be dropped.
    fn build(&self, from: &[Source], to: &[Operation], when: &[Condition]) -> Option<rbac::Policy> {
        // Conditions split into the principal side and the permission side.
        let mut when_ids = Vec::new();
        let mut when_rules = Vec::new();
        for condition in when {
            match self.condition(condition) {
                Ok(Side::Principal(ids)) => when_ids.extend(ids),
                Ok(Side::Permission(rules)) => when_rules.extend(rules),
                Err(Unsupported) if self.action == Action::Allow => return None,
                Err(Unsupported) => {}
            }
        }
        let mut principals = Vec::new();
        for source in from
            .iter()
            .chain(from.is_empty().then(Source::default).as_ref())
        {
            let mut ids = self.source(source)?;
            ids.extend(when_ids.iter().cloned());
            if ids.is_empty() {
                ids.push(any_principal());
            }
            principals.push(and_ids(ids));
        }
        let mut permissions = Vec::new();
        for operation in to
            .iter()
            .chain(to.is_empty().then(Operation::default).as_ref())
        {
            let mut rules = self.operation(operation)?;
            rules.extend(when_rules.iter().cloned());
            if rules.is_empty() {
                rules.push(any_permission());
            }
            permissions.push(and_rules(rules));
        }
        Some(rbac::Policy {
            permissions,
            principals,
        })
    }

    /// A field's matchers, or `None` when the rule is dropped for it.
    fn field<T>(&self, result: Result<Vec<T>, Unsupported>) -> Option<Vec<T>> {
        match result {
            Ok(items) => Some(items),
            Err(Unsupported) if self.action == Action::Allow => None,
            Err(Unsupported) => Some(Vec::new()),
        }
    }

    /// Each value's matcher, or [`Unsupported`] when the chain cannot match the attribute or
    /// a value cannot be expressed.
    fn each<T>(
        &self,
        values: &[String],
        http_only: bool,
        f: impl Fn(&str) -> Option<T>,
    ) -> Result<Vec<T>, Unsupported> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        if http_only && self.kind != ChainKind::Http {
            return Err(Unsupported);
        }
        values.iter().map(|v| f(v).ok_or(Unsupported)).collect()
    }

    /// The principal side of one `from.source`: an AND of its fields (each an OR of its
    /// values, or the negation of one); empty when it has none.
    fn source(&self, s: &Source) -> Option<Vec<rbac::Principal>> {
        let mut ids = Vec::new();
        // (values, negated, HTTP only, matcher of one value)
        type One<'f> = &'f dyn Fn(&str) -> Option<rbac::Principal>;
        let peer_principal: One = &|p| Some(peer(principal(p)));
        let namespace: One = &|n| Some(peer(in_namespace(n)));
        let account: One = &|a| Some(peer(service_account(a, self.namespace)));
        let domain: One = &|t| Some(peer(trust_domain(t)));
        let direct_ip: One = &|b| {
            cidr(b).map(|range| principal_of(rbac::principal::Identifier::DirectRemoteIp(range)))
        };
        let remote_ip: One =
            &|b| cidr(b).map(|range| principal_of(rbac::principal::Identifier::RemoteIp(range)));
        let fields: [(&[String], bool, bool, One); 12] = [
            (&s.principals, false, false, peer_principal),
            (&s.not_principals, true, false, peer_principal),
            (&s.namespaces, false, false, namespace),
            (&s.not_namespaces, true, false, namespace),
            (&s.service_accounts, false, false, account),
            (&s.not_service_accounts, true, false, account),
            (&s.trust_domains, false, false, domain),
            (&s.not_trust_domains, true, false, domain),
            (&s.ip_blocks, false, false, direct_ip),
            (&s.not_ip_blocks, true, false, direct_ip),
            (&s.remote_ip_blocks, false, true, remote_ip),
            (&s.not_remote_ip_blocks, true, true, remote_ip),
        ];
        for (values, negated, http_only, one) in fields {
            let matchers = self.field(self.each(values, http_only, one))?;
            if !matchers.is_empty() {
                let any_of = or_ids(matchers);
                ids.push(if negated { not_id(any_of) } else { any_of });
            }
        }
        // Request principals are matched all at once (istiod's extended generator: no OR
        // around a single value).
        for (values, negated) in [
            (&s.request_principals, false),
            (&s.not_request_principals, true),
        ] {
            let matched = self.field(self.jwt(values, jwt::request_principals))?;
            ids.extend(
                matched
                    .into_iter()
                    .map(|m| if negated { not_id(m) } else { m }),
            );
        }
        Some(ids)
    }

    /// A JWT attribute's one matcher for all its values: only on HTTP chains, after the
    /// chain's `jwt_authn` filter.
    fn jwt(
        &self,
        values: &[String],
        f: impl Fn(&[String]) -> rbac::Principal,
    ) -> Result<Vec<rbac::Principal>, Unsupported> {
        match (values.is_empty(), self.kind) {
            (true, _) => Ok(Vec::new()),
            (false, ChainKind::Http) => Ok(vec![f(values)]),
            (false, ChainKind::Tcp) => Err(Unsupported),
        }
    }

    /// The permission side of one `to.operation`; empty when it has no field.
    fn operation(&self, o: &Operation) -> Option<Vec<rbac::Permission>> {
        let mut rules = Vec::new();
        type One<'f> = &'f dyn Fn(&str) -> Option<rbac::Permission>;
        let port: One =
            &|p| port(p).map(|p| permission_of(rbac::permission::Rule::DestinationPort(p)));
        let method: One = &|m| {
            Some(permission_of(rbac::permission::Rule::Header(
                header_wildcard(":method", m, false)?,
            )))
        };
        let path: One = &path_permission;
        let host: One = &|h| {
            Some(permission_of(rbac::permission::Rule::Header(
                header_wildcard(":authority", h, true)?,
            )))
        };
        let fields: [(&[String], bool, bool, One); 8] = [
            (&o.ports, false, false, port),
            (&o.not_ports, true, false, port),
            (&o.methods, false, true, method),
            (&o.not_methods, true, true, method),
            (&o.paths, false, true, path),
            (&o.not_paths, true, true, path),
            (&o.hosts, false, true, host),
            (&o.not_hosts, true, true, host),
        ];
        for (values, negated, http_only, one) in fields {
            let matchers = self.field(self.each(values, http_only, one))?;
            if !matchers.is_empty() {
                let any_of = or_rules(matchers);
                rules.push(if negated { not_rule(any_of) } else { any_of });
            }
        }
        Some(rules)
    }

    /// One `when` condition on the principal or the permission side.
    fn condition(&self, c: &Condition) -> Result<Side, Unsupported> {
        let (values, not_values) = (&c.values[..], &c.not_values[..]);
        // Each value its own matcher: an OR of the values, and NOT an OR of the not-values.
        let principals = |http_only: bool, f: &dyn Fn(&str) -> Option<rbac::Principal>| {
            let mut ids = Vec::new();
            let positive = self.each(values, http_only, f)?;
            let negative = self.each(not_values, http_only, f)?;
            if !positive.is_empty() {
                ids.push(or_ids(positive));
            }
            if !negative.is_empty() {
                ids.push(not_id(or_ids(negative)));
            }
            Ok(Side::Principal(ids))
        };
        let permissions = |f: &dyn Fn(&str) -> Option<rbac::Permission>| {
            let mut rules = Vec::new();
            let positive = self.each(values, false, f)?;
            let negative = self.each(not_values, false, f)?;
            if !positive.is_empty() {
                rules.push(or_rules(positive));
            }
            if !negative.is_empty() {
                rules.push(not_rule(or_rules(negative)));
            }
            Ok(Side::Permission(rules))
        };
        // One matcher for all the values (istiod's extended generators, the JWT ones).
        let jwt = |f: &dyn Fn(&[String]) -> rbac::Principal| {
            let mut ids = self.jwt(values, f)?;
            ids.extend(self.jwt(not_values, f)?.into_iter().map(not_id));
            Ok(Side::Principal(ids))
        };
        if expressible::when_key_reach(&c.key) == Reach::Nowhere {
            return Err(Unsupported);
        }
        match c.key.as_str() {
            "source.ip" => principals(false, &|v| {
                cidr(v).map(|r| principal_of(rbac::principal::Identifier::DirectRemoteIp(r)))
            }),
            "remote.ip" => principals(true, &|v| {
                cidr(v).map(|r| principal_of(rbac::principal::Identifier::RemoteIp(r)))
            }),
            "source.namespace" => principals(false, &|v| Some(peer(in_namespace(v)))),
            "source.principal" => principals(false, &|v| Some(peer(principal(v)))),
            "source.serviceAccount" => {
                principals(false, &|v| Some(peer(service_account(v, self.namespace))))
            }
            "source.trustDomain" => principals(false, &|v| Some(peer(trust_domain(v)))),
            "destination.ip" => permissions(&|v| {
                cidr(v).map(|r| permission_of(rbac::permission::Rule::DestinationIp(r)))
            }),
            "destination.port" => permissions(&|v| {
                port(v).map(|p| permission_of(rbac::permission::Rule::DestinationPort(p)))
            }),
            "connection.sni" => permissions(&|v| {
                Some(permission_of(rbac::permission::Rule::RequestedServerName(
                    wildcard_match(v),
                )))
            }),
            "request.auth.principal" => jwt(&jwt::request_principals),
            "request.auth.audiences" => jwt(&|v| jwt::claim_principal(&["aud"], v)),
            "request.auth.presenter" => jwt(&|v| jwt::claim_principal(&["azp"], v)),
            key if key.starts_with(REQUEST_CLAIMS) => {
                let names = jwt::claim_names(&key[REQUEST_CLAIMS.len()..]).ok_or(Unsupported)?;
                jwt(&|v| jwt::claim_principal(&names, v))
            }
            key if key.starts_with(REQUEST_HEADERS) => {
                let name = expressible::header_of(key).ok_or(Unsupported)?;
                principals(true, &|v| {
                    Some(principal_of(rbac::principal::Identifier::Header(
                        header_wildcard(name, v, false)?,
                    )))
                })
            }
            _ => Err(Unsupported),
        }
    }
}

enum Side {
    Principal(Vec<rbac::Principal>),
    Permission(Vec<rbac::Permission>),
}

/// `X` -> `spiffe://X`; a leading or trailing `*` matches by suffix or prefix; `*` alone any
/// identity.
fn principal(value: &str) -> StringMatcher {
    if value == "*" {
        prefix_match("spiffe://")
    } else if let Some(rest) = value.strip_prefix('*') {
        suffix_match(rest)
    } else if let Some(rest) = value.strip_suffix('*') {
        prefix_match(&format!("spiffe://{rest}"))
    } else {
        exact(&format!("spiffe://{value}"))
    }
}

/// `N` -> any identity in namespace `N`; `*` in `N` matches any run of characters.
fn in_namespace(namespace: &str) -> StringMatcher {
    let pattern: Vec<String> = namespace.split('*').map(regex_escape).collect();
    regex_match(&format!(".*/ns/{}/.*", pattern.join(".*")))
}

/// `ns/sa`, or a bare `sa` in the policy's namespace (istiod's `serviceAccountRegex`: other
/// key/value pairs may sit between and after).
fn service_account(account: &str, namespace: &str) -> StringMatcher {
    let (ns, sa) = account.split_once('/').unwrap_or((namespace, account));
    regex_match(&format!(
        "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
        regex_escape(ns),
        regex_escape(sa)
    ))
}

/// `T` -> identities of trust domain `T`; `*` alone any; one `*` inside matches within the
/// domain name.
fn trust_domain(domain: &str) -> StringMatcher {
    if domain == "*" {
        prefix_match("spiffe://")
    } else if let Some((before, after)) = domain.split_once('*') {
        regex_match(&format!(
            "spiffe://{}[^/]*{}/.*",
            regex_escape(before),
            regex_escape(after)
        ))
    } else {
        prefix_match(&format!("spiffe://{domain}/"))
    }
}

fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Istio's wildcard strings: `*` any, `x*` prefix, `*x` suffix, else exact.
fn wildcard_match(value: &str) -> StringMatcher {
    if value == "*" {
        regex_match(".+")
    } else if let Some(rest) = value.strip_prefix('*') {
        suffix_match(rest)
    } else if let Some(rest) = value.strip_suffix('*') {
        prefix_match(rest)
    } else {
        exact(value)
    }
}

/// A header matched as istiod's `HeaderMatcher` (and, ignoring case, `HostMatcher`): `*` is
/// presence, `*x` a suffix, `x*` a prefix, else exact. `None` for a name Envoy would refuse.
fn header_wildcard(name: &str, value: &str, ignore_case: bool) -> Option<HeaderMatcher> {
    if !is_header_name(name) {
        return None;
    }
    let specifier = if value == "*" {
        header_matcher::HeaderMatchSpecifier::PresentMatch(true)
    } else {
        let mut m = wildcard_match(value);
        m.ignore_case = ignore_case;
        header_matcher::HeaderMatchSpecifier::StringMatch(m)
    };
    Some(HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    })
}

/// A path, or a path template (`{*}` one segment, `{**}` the rest) matched with Envoy's URI
/// template matcher as istiod does. `None` for a template istiod's validation refuses, and
/// for `{`/`}` elsewhere (a template this cannot read).
fn path_permission(path: &str) -> Option<rbac::Permission> {
    let template = match expressible::path_value(path)? {
        PathValue::Plain(path) => {
            return Some(permission_of(rbac::permission::Rule::UrlPath(
                PathMatcher {
                    rule: Some(path_matcher::Rule::Path(wildcard_match(path))),
                },
            )));
        }
        PathValue::Template(template) => template,
    };
    Some(permission_of(rbac::permission::Rule::UriTemplate(
        TypedExtensionConfig {
            name: "uri-template".into(),
            typed_config: Some(envoy::any(
                envoy::URI_TEMPLATE_MATCH,
                &UriTemplateMatchConfig {
                    path_template: template,
                },
            )),
        },
    )))
}

/// A port number (0–65535).
fn port(text: &str) -> Option<u32> {
    expressible::port(text)
}

/// `10.0.0.0/8` or a bare IP (a /32 or /128).
fn cidr(text: &str) -> Option<CidrRange> {
    let (ip, len) = expressible::cidr(text)?;
    Some(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: uint32(len),
    })
}

fn peer(matcher: StringMatcher) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::FilterState(
        FilterStateMatcher {
            key: PEER_PRINCIPAL.into(),
            matcher: Some(filter_state_matcher::Matcher::StringMatch(matcher)),
        },
    ))
}

fn principal_of(identifier: rbac::principal::Identifier) -> rbac::Principal {
    rbac::Principal {
        identifier: Some(identifier),
    }
}

fn permission_of(rule: rbac::permission::Rule) -> rbac::Permission {
    rbac::Permission { rule: Some(rule) }
}

fn any_principal() -> rbac::Principal {
    principal_of(rbac::principal::Identifier::Any(true))
}

fn any_permission() -> rbac::Permission {
    permission_of(rbac::permission::Rule::Any(true))
}

fn and_ids(ids: Vec<rbac::Principal>) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::AndIds(rbac::principal::Set {
        ids,
    }))
}

fn or_ids(ids: Vec<rbac::Principal>) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::OrIds(rbac::principal::Set {
        ids,
    }))
}

fn not_id(id: rbac::Principal) -> rbac::Principal {
    principal_of(rbac::principal::Identifier::NotId(Box::new(id)))
}

fn and_rules(rules: Vec<rbac::Permission>) -> rbac::Permission {
    permission_of(rbac::permission::Rule::AndRules(rbac::permission::Set {
        rules,
    }))
}

fn or_rules(rules: Vec<rbac::Permission>) -> rbac::Permission {
    permission_of(rbac::permission::Rule::OrRules(rbac::permission::Set {
        rules,
    }))
}

fn not_rule(rule: rbac::Permission) -> rbac::Permission {
    permission_of(rbac::permission::Rule::NotRule(Box::new(rule)))
}

#[cfg(test)]
mod tests;
