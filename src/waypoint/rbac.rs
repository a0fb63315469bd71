//! AuthorizationPolicies with `targetRefs` -> Envoy RBAC on a waypoint's chains
//! (spec/waypoint.md §5.1–§5.2): which policies attach to which chain, and the translation.
//!
//! Identities are matched on the filter state `io.istio.peer_principal` that `connect_terminate`
//! sets from the HBONE client's certificate (the mTLS peer lives on the outer connection), as
//! istiod does with `UseFilterState`. Policy names are istiod's: `ns[<ns>]-policy[<name>]-rule[<i>]`.
//!
//! What this translator cannot express fails closed, as istiod does: in an ALLOW policy the
//! rule is dropped (it allows less), in a DENY policy only that condition is dropped (it denies
//! more). Request principals and `request.auth.*` (JWT, RequestAuthentication) are not yet
//! expressed; HTTP attributes (methods, paths, hosts, request headers) are expressed on HTTP
//! chains and are unusable on TCP chains.

use std::collections::BTreeMap;

use crate::discovery::model::{AuthorizationPolicy, Condition, Operation, PolicyAction, Source};
use crate::pb::envoy::config::core::v3::CidrRange;
use crate::pb::envoy::config::rbac::v3 as rbac;
use crate::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use crate::pb::envoy::r#type::matcher::v3::{FilterStateMatcher, PathMatcher, StringMatcher};
use crate::pb::envoy::r#type::matcher::v3::{filter_state_matcher, path_matcher};
use crate::waypoint::envoy::{exact, prefix_match, regex_match, suffix_match, uint32};

/// The filter-state key holding the HBONE client's SPIFFE id.
pub(crate) const PEER_PRINCIPAL: &str = "io.istio.peer_principal";

/// What a chain is, for attachment and for which attributes it can match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainKind {
    Http,
    Tcp,
}

/// What a chain serves, for attachment.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target<'a> {
    /// A bound service's chains: its namespace, its name, and whether it is a Kubernetes
    /// Service (else a ServiceEntry).
    Service {
        namespace: &'a str,
        name: &'a str,
        kubernetes: bool,
    },
    /// The direct workload chains: policies on the waypoint as a whole only.
    Waypoint,
}

/// Where a waypoint's policies attach from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attachment<'a> {
    /// The waypoint's namespace and Gateway name.
    pub(crate) namespace: &'a str,
    pub(crate) gateway: &'a str,
    /// The mesh's root namespace (GatewayClass policies live there).
    pub(crate) root_namespace: &'a str,
}

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
const ISTIO_NETWORKING_GROUP: &str = "networking.istio.io";
const WAYPOINT_CLASS: &str = "istio-waypoint";

impl Attachment<'_> {
    /// Whether `policy` applies to a chain serving `target` (istiod's `ShouldAttachPolicy`
    /// for a waypoint proxy).
    pub(crate) fn attaches(&self, policy: &AuthorizationPolicy, target: Target<'_>) -> bool {
        policy.target_refs.iter().any(|t| {
            let same_namespace = t.namespace.is_empty() || t.namespace == policy.namespace;
            match (t.kind.as_str(), t.group.as_str(), target) {
                ("Gateway", GATEWAY_GROUP, _) => {
                    same_namespace && policy.namespace == self.namespace && t.name == self.gateway
                }
                ("GatewayClass", GATEWAY_GROUP, _) => {
                    policy.namespace == self.root_namespace && t.name == WAYPOINT_CLASS
                }
                (
                    "Service",
                    "" | "core",
                    Target::Service {
                        namespace,
                        name,
                        kubernetes: true,
                    },
                ) => same_namespace && policy.namespace == namespace && t.name == name,
                (
                    "ServiceEntry",
                    ISTIO_NETWORKING_GROUP,
                    Target::Service {
                        namespace,
                        name,
                        kubernetes: false,
                    },
                ) => same_namespace && policy.namespace == namespace && t.name == name,
                _ => false,
            }
        })
    }
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
            let built =
                Rule { action, kind }.build(&rule.from, &rule.to, &rule.when, &policy.namespace);
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

/// One rule's translation, under its policy's action and its chain's kind.
struct Rule {
    action: Action,
    kind: ChainKind,
}

/// An attribute this chain cannot match: the rule is dropped (ALLOW), or the attribute is
/// (DENY).
struct Unsupported;

impl Rule {
    /// The RBAC policy for one rule, `None` when it must be dropped.
    fn build(
        &self,
        from: &[Source],
        to: &[Operation],
        when: &[Condition],
        namespace: &str,
    ) -> Option<rbac::Policy> {
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
            let mut ids = self.source(source, namespace)?;
            ids.extend(when_ids.iter().cloned());
            principals.push(and_ids(ids));
        }
        let mut permissions = Vec::new();
        for operation in to
            .iter()
            .chain(to.is_empty().then(Operation::default).as_ref())
        {
            let mut rules = self.operation(operation)?;
            rules.extend(when_rules.iter().cloned());
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

    fn source(&self, s: &Source, namespace: &str) -> Option<Vec<rbac::Principal>> {
        let mut ids = Vec::new();
        let mut add = |positive: bool, matchers: Vec<rbac::Principal>| {
            if matchers.is_empty() {
                return;
            }
            let any_of = or_ids(matchers);
            ids.push(if positive { any_of } else { not_id(any_of) });
        };
        add(
            true,
            s.principals.iter().map(|p| peer(principal(p))).collect(),
        );
        add(
            false,
            s.not_principals
                .iter()
                .map(|p| peer(principal(p)))
                .collect(),
        );
        add(
            true,
            s.namespaces.iter().map(|n| peer(in_namespace(n))).collect(),
        );
        add(
            false,
            s.not_namespaces
                .iter()
                .map(|n| peer(in_namespace(n)))
                .collect(),
        );
        add(
            true,
            s.service_accounts
                .iter()
                .map(|a| peer(service_account(a, namespace)))
                .collect(),
        );
        add(
            false,
            s.not_service_accounts
                .iter()
                .map(|a| peer(service_account(a, namespace)))
                .collect(),
        );
        add(
            true,
            s.trust_domains
                .iter()
                .map(|t| peer(trust_domain(t)))
                .collect(),
        );
        add(
            false,
            s.not_trust_domains
                .iter()
                .map(|t| peer(trust_domain(t)))
                .collect(),
        );
        let blocks = |list: &[String], remote: bool| -> Result<Vec<rbac::Principal>, Unsupported> {
            list.iter()
                .map(|b| {
                    let range = cidr(b).ok_or(Unsupported)?;
                    Ok(principal_of(if remote {
                        rbac::principal::Identifier::RemoteIp(range)
                    } else {
                        rbac::principal::Identifier::DirectRemoteIp(range)
                    }))
                })
                .collect()
        };
        let positive_ips = self.field(blocks(&s.ip_blocks, false))?;
        let negative_ips = self.field(blocks(&s.not_ip_blocks, false))?;
        let (positive_remote, negative_remote) = if self.kind == ChainKind::Http {
            (
                self.field(blocks(&s.remote_ip_blocks, true))?,
                self.field(blocks(&s.not_remote_ip_blocks, true))?,
            )
        } else {
            let unusable = |l: &[String]| {
                if l.is_empty() {
                    Ok(vec![])
                } else {
                    Err(Unsupported)
                }
            };
            (
                self.field(unusable(&s.remote_ip_blocks))?,
                self.field(unusable(&s.not_remote_ip_blocks))?,
            )
        };
        if !s.request_principals.is_empty() || !s.not_request_principals.is_empty() {
            self.field::<rbac::Principal>(Err(Unsupported))?;
        }
        add(true, positive_ips);
        add(false, negative_ips);
        add(true, positive_remote);
        add(false, negative_remote);
        if ids.is_empty() {
            ids.push(any_principal());
        }
        Some(ids)
    }

    fn operation(&self, o: &Operation) -> Option<Vec<rbac::Permission>> {
        let mut rules = Vec::new();
        let mut add = |positive: bool, matchers: Vec<rbac::Permission>| {
            if matchers.is_empty() {
                return;
            }
            let any_of = or_rules(matchers);
            rules.push(if positive { any_of } else { not_rule(any_of) });
        };
        let ports = |list: &[String]| -> Result<Vec<rbac::Permission>, Unsupported> {
            list.iter()
                .map(|p| {
                    let port: u32 = p.parse().map_err(|_| Unsupported)?;
                    Ok(permission_of(rbac::permission::Rule::DestinationPort(port)))
                })
                .collect()
        };
        let http = self.kind == ChainKind::Http;
        let l7 = |list: &[String], f: &dyn Fn(&str) -> rbac::Permission| {
            if list.is_empty() {
                Ok(Vec::new())
            } else if http {
                Ok(list.iter().map(|v| f(v)).collect())
            } else {
                Err(Unsupported)
            }
        };
        let method = |m: &str| header_permission(":method", exact(m));
        let host = |h: &str| header_permission(":authority", host_match(h));
        let path = |p: &str| {
            permission_of(rbac::permission::Rule::UrlPath(PathMatcher {
                rule: Some(path_matcher::Rule::Path(wildcard_match(p))),
            }))
        };
        add(true, self.field(ports(&o.ports))?);
        add(false, self.field(ports(&o.not_ports))?);
        add(true, self.field(l7(&o.methods, &method))?);
        add(false, self.field(l7(&o.not_methods, &method))?);
        add(true, self.field(l7(&o.paths, &path))?);
        add(false, self.field(l7(&o.not_paths, &path))?);
        add(true, self.field(l7(&o.hosts, &host))?);
        add(false, self.field(l7(&o.not_hosts, &host))?);
        if rules.is_empty() {
            rules.push(any_permission());
        }
        Some(rules)
    }

    /// One `when` condition on the principal or the permission side.
    fn condition(&self, c: &Condition) -> Result<Side, Unsupported> {
        let principals = |f: &dyn Fn(&str) -> Result<rbac::Principal, Unsupported>| {
            let mut ids = Vec::new();
            let values: Vec<_> = c.values.iter().map(|v| f(v)).collect::<Result<_, _>>()?;
            let not_values: Vec<_> = c
                .not_values
                .iter()
                .map(|v| f(v))
                .collect::<Result<_, _>>()?;
            if !values.is_empty() {
                ids.push(or_ids(values));
            }
            if !not_values.is_empty() {
                ids.push(not_id(or_ids(not_values)));
            }
            Ok(Side::Principal(ids))
        };
        let permissions = |f: &dyn Fn(&str) -> Result<rbac::Permission, Unsupported>| {
            let mut rules = Vec::new();
            let values: Vec<_> = c.values.iter().map(|v| f(v)).collect::<Result<_, _>>()?;
            let not_values: Vec<_> = c
                .not_values
                .iter()
                .map(|v| f(v))
                .collect::<Result<_, _>>()?;
            if !values.is_empty() {
                rules.push(or_rules(values));
            }
            if !not_values.is_empty() {
                rules.push(not_rule(or_rules(not_values)));
            }
            Ok(Side::Permission(rules))
        };
        let http = self.kind == ChainKind::Http;
        match c.key.as_str() {
            "source.ip" => principals(&|v| {
                Ok(principal_of(rbac::principal::Identifier::DirectRemoteIp(
                    cidr(v).ok_or(Unsupported)?,
                )))
            }),
            "remote.ip" if http => principals(&|v| {
                Ok(principal_of(rbac::principal::Identifier::RemoteIp(
                    cidr(v).ok_or(Unsupported)?,
                )))
            }),
            "source.namespace" => principals(&|v| Ok(peer(in_namespace(v)))),
            "source.principal" => principals(&|v| Ok(peer(principal(v)))),
            "destination.ip" => permissions(&|v| {
                Ok(permission_of(rbac::permission::Rule::DestinationIp(
                    cidr(v).ok_or(Unsupported)?,
                )))
            }),
            "destination.port" => permissions(&|v| {
                Ok(permission_of(rbac::permission::Rule::DestinationPort(
                    v.parse().map_err(|_| Unsupported)?,
                )))
            }),
            "connection.sni" => permissions(&|v| {
                Ok(permission_of(rbac::permission::Rule::RequestedServerName(
                    wildcard_match(v),
                )))
            }),
            key if http && key.starts_with("request.headers[") && key.ends_with(']') => {
                let name = &key["request.headers[".len()..key.len() - 1];
                principals(&|v| {
                    Ok(principal_of(rbac::principal::Identifier::Header(
                        header_matcher(name, wildcard_match(v)),
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

fn in_namespace(namespace: &str) -> StringMatcher {
    regex_match(&format!(".*/ns/{}/.*", regex_escape(namespace)))
}

/// `ns/sa`, or a bare `sa` in the policy's namespace.
fn service_account(account: &str, namespace: &str) -> StringMatcher {
    let (ns, sa) = account.split_once('/').unwrap_or((namespace, account));
    suffix_match(&format!("/ns/{ns}/sa/{sa}"))
}

fn trust_domain(domain: &str) -> StringMatcher {
    prefix_match(&format!("spiffe://{domain}/"))
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

/// Hosts compare without case, and with or without a port.
fn host_match(value: &str) -> StringMatcher {
    let mut m = wildcard_match(value);
    m.ignore_case = true;
    m
}

fn header_matcher(name: &str, matcher: StringMatcher) -> HeaderMatcher {
    HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(matcher)),
        ..Default::default()
    }
}

fn header_permission(name: &str, matcher: StringMatcher) -> rbac::Permission {
    permission_of(rbac::permission::Rule::Header(header_matcher(
        name, matcher,
    )))
}

/// `10.0.0.0/8` or a bare IP (a /32 or /128).
fn cidr(text: &str) -> Option<CidrRange> {
    let (ip, len) = match text.split_once('/') {
        Some((ip, len)) => (ip, Some(len.parse::<u32>().ok()?)),
        None => (text, None),
    };
    let ip: std::net::IpAddr = ip.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    if len > max {
        return None;
    }
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
