//! Property: the converted policies never allow a connection that the original policies could
//! deny, with L7 conditions and unparseable values treated as *unknown* (three-valued logic).
//!
//! The oracle evaluates the original [`AuthorizationPolicy`] directly. Two documented
//! exceptions follow istiod on purpose, and the oracle encodes them:
//! * in a DENY policy, a `from`/`to`/`when` entry made only of L7 attributes never matches
//!   (istiod sends `{}` and reports "will have no effect");
//! * an entry with no attribute at all (rejected by Istio's validation) never matches.
//!
//! A second property: when every policy converts cleanly (status "attached to ztunnel"), the
//! converted decision equals the oracle's exactly.

use std::net::IpAddr;

use proptest::prelude::*;

use super::*;
use crate::discovery::evaluator::{Connection, Identity, evaluate};
use crate::discovery::model::authorization::{
    Condition, Operation, PolicyAction, PolicyRule, Source,
};
use crate::pb::workload::Workload;

const ROOT: &str = "istio-system";
const NS: &str = "ns";

const PRINCIPALS: &[&str] = &[
    "cluster.local/ns/a/sa/x",
    "cluster.local/ns/b/*",
    "*/sa/y",
    "*",
];
const NAMESPACES: &[&str] = &["a", "b", "*", "a*", "*b"];
const SERVICE_ACCOUNTS: &[&str] = &["a/x", "y", "ns/y", "b/y"];
const IPS: &[&str] = &[
    "10.0.0.1",
    "10.0.0.0/8",
    "10.0.0.4/30",
    "192.168.1.0/24",
    "::1",
    "bogus",
    "10.0.0.1/33",
];
const PORTS: &[&str] = &["80", "8080", "443", "http", "99999"];
const L7: &[&str] = &["x", "*"];
const WHEN_KEYS: &[&str] = &[
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
    "request.headers[x]",
    "remote.ip",
];

/// Up to two values of `pool`, usually none.
fn values(pool: &'static [&'static str]) -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        3 => Just(Vec::new()),
        2 => proptest::sample::subsequence(pool, 1..=2)
            .prop_map(|v| v.into_iter().map(String::from).collect()),
    ]
}

fn source() -> impl Strategy<Value = Source> {
    (
        (values(PRINCIPALS), values(PRINCIPALS)),
        (values(NAMESPACES), values(NAMESPACES)),
        (values(SERVICE_ACCOUNTS), values(SERVICE_ACCOUNTS)),
        (values(IPS), values(IPS)),
        (values(L7), values(IPS)),
    )
        .prop_map(|(p, n, s, i, l7)| Source {
            principals: p.0,
            not_principals: p.1,
            namespaces: n.0,
            not_namespaces: n.1,
            service_accounts: s.0,
            not_service_accounts: s.1,
            ip_blocks: i.0,
            not_ip_blocks: i.1,
            request_principals: l7.0,
            remote_ip_blocks: l7.1,
            ..Default::default()
        })
}

fn operation() -> impl Strategy<Value = Operation> {
    (values(PORTS), values(PORTS), values(L7)).prop_map(|(ports, not_ports, methods)| Operation {
        ports,
        not_ports,
        methods,
        ..Default::default()
    })
}

fn condition() -> impl Strategy<Value = Condition> {
    proptest::sample::select(WHEN_KEYS).prop_flat_map(|key| {
        let pool: &'static [&'static str] = match key {
            "source.ip" | "destination.ip" | "remote.ip" => IPS,
            "source.namespace" | "request.headers[x]" => NAMESPACES,
            "source.principal" => PRINCIPALS,
            _ => PORTS,
        };
        (values(pool), values(pool)).prop_map(move |(values, not_values)| Condition {
            key: key.to_string(),
            values,
            not_values,
        })
    })
}

fn rule() -> impl Strategy<Value = PolicyRule> {
    (
        proptest::collection::vec(source(), 0..=2),
        proptest::collection::vec(operation(), 0..=2),
        proptest::collection::vec(condition(), 0..=2),
    )
        .prop_map(|(from, to, when)| PolicyRule { from, to, when })
}

fn policy() -> impl Strategy<Value = AuthorizationPolicy> {
    (
        any::<bool>(),
        proptest::sample::select(&[NS, ROOT][..]),
        proptest::collection::vec(rule(), 0..=3),
    )
        .prop_map(|(deny, namespace, rules)| AuthorizationPolicy {
            name: "p".into(),
            namespace: namespace.into(),
            action: if deny {
                PolicyAction::Deny
            } else {
                PolicyAction::Allow
            },
            rules,
            ..Default::default()
        })
}

fn policies() -> impl Strategy<Value = Vec<AuthorizationPolicy>> {
    proptest::collection::vec(policy(), 1..=3).prop_map(|mut ps| {
        for (i, p) in ps.iter_mut().enumerate() {
            p.name = format!("p{i}");
        }
        ps
    })
}

fn connection() -> impl Strategy<Value = Connection> {
    let identities = vec![None, Some(("a", "x")), Some(("a", "y")), Some(("b", "y"))];
    (
        proptest::sample::select(identities),
        proptest::sample::select(&["10.0.0.1", "10.0.0.6", "192.168.1.7", "::1"][..]),
        proptest::sample::select(&["10.0.0.1", "192.168.1.1"][..]),
        proptest::sample::select(&[80u16, 8080, 443, 9090][..]),
    )
        .prop_map(|(id, src, dst, port)| Connection {
            source_identity: id.map(|(ns, sa)| Identity {
                trust_domain: "cluster.local".into(),
                namespace: ns.into(),
                service_account: sa.into(),
            }),
            source_ip: src.parse().unwrap(),
            destination_ip: dst.parse().unwrap(),
            destination_port: port,
        })
}

/// Kleene three-valued truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tri {
    T,
    F,
    U,
}
use Tri::{F, T, U};

fn and(a: Tri, b: Tri) -> Tri {
    match (a, b) {
        (F, _) | (_, F) => F,
        (T, T) => T,
        _ => U,
    }
}

fn or(a: Tri, b: Tri) -> Tri {
    match (a, b) {
        (T, _) | (_, T) => T,
        (F, F) => F,
        _ => U,
    }
}

/// Istio's string match, on the original value.
fn istio_match(pattern: &str, value: &str) -> bool {
    if pattern == "*" {
        !value.is_empty()
    } else if let Some(s) = pattern.strip_prefix('*') {
        value.ends_with(s)
    } else if let Some(p) = pattern.strip_suffix('*') {
        value.starts_with(p)
    } else {
        value == pattern
    }
}

/// Any value matches (an empty list is no constraint).
fn positive<V>(
    values: &[String],
    parse: impl Fn(&str) -> Option<V>,
    hit: impl Fn(&V) -> bool,
) -> Tri {
    if values.is_empty() {
        return T;
    }
    let parsed: Vec<Option<V>> = values.iter().map(|v| parse(v)).collect();
    if parsed.iter().flatten().any(&hit) {
        T
    } else if parsed.iter().any(Option::is_none) {
        U
    } else {
        F
    }
}

/// No value matches.
fn negative<V>(
    values: &[String],
    parse: impl Fn(&str) -> Option<V>,
    hit: impl Fn(&V) -> bool,
) -> Tri {
    match positive(values, parse, hit) {
        T if values.is_empty() => T,
        T => F,
        F => T,
        U => U,
    }
}

fn text(s: &str) -> Option<String> {
    Some(s.to_string())
}

fn cidr(s: &str) -> Option<(IpAddr, u32)> {
    let (ip, bits) = match s.split_once('/') {
        Some((ip, bits)) => (ip.parse::<IpAddr>().ok()?, Some(bits.parse::<u32>().ok()?)),
        None => (s.parse::<IpAddr>().ok()?, None),
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((ip, bits))
}

fn in_cidr(net: &(IpAddr, u32), ip: IpAddr) -> bool {
    let (a, b, width) = match (net.0, ip) {
        (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
        (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
        _ => return false,
    };
    let shift = width - net.1;
    shift >= 128 || (a >> shift) == (b >> shift)
}

fn port(s: &str) -> Option<u16> {
    s.parse().ok()
}

struct Oracle<'a> {
    conn: &'a Connection,
    deny: bool,
    policy_ns: &'a str,
}

impl Oracle<'_> {
    fn principal(&self, pattern: &str) -> bool {
        let id = self.conn.source_identity.as_ref();
        id.is_some_and(|i| istio_match(pattern, &i.principal()))
    }

    fn namespace(&self, pattern: &str) -> bool {
        let ns = self
            .conn
            .source_identity
            .as_ref()
            .map_or("", |i| i.namespace.as_str());
        istio_match(pattern, ns)
    }

    fn service_account(&self, value: &str) -> bool {
        let (ns, sa) = value.split_once('/').unwrap_or((self.policy_ns, value));
        let id = self.conn.source_identity.as_ref();
        id.is_some_and(|i| i.namespace == ns && i.service_account == sa)
    }

    /// One entry, given its L4 result and whether it had L4/L7 attributes.
    fn entry(&self, l4: Tri, has_l4: bool, has_l7: bool) -> Tri {
        match (has_l4, has_l7) {
            (false, false) => F,
            (false, true) if self.deny => F,
            (_, true) => and(l4, U),
            _ => l4,
        }
    }

    fn source(&self, s: &Source) -> Tri {
        let src = self.conn.source_ip;
        let l4 = [
            positive(&s.principals, text, |p| self.principal(p)),
            negative(&s.not_principals, text, |p| self.principal(p)),
            positive(&s.namespaces, text, |p| self.namespace(p)),
            negative(&s.not_namespaces, text, |p| self.namespace(p)),
            positive(&s.service_accounts, text, |v| self.service_account(v)),
            negative(&s.not_service_accounts, text, |v| self.service_account(v)),
            positive(&s.ip_blocks, cidr, |n| in_cidr(n, src)),
            negative(&s.not_ip_blocks, cidr, |n| in_cidr(n, src)),
        ]
        .into_iter()
        .fold(T, and);
        let has_l4 = [
            &s.principals,
            &s.not_principals,
            &s.namespaces,
            &s.not_namespaces,
            &s.service_accounts,
            &s.not_service_accounts,
            &s.ip_blocks,
            &s.not_ip_blocks,
        ]
        .iter()
        .any(|v| !v.is_empty());
        let has_l7 = !s.request_principals.is_empty() || !s.remote_ip_blocks.is_empty();
        self.entry(l4, has_l4, has_l7)
    }

    fn operation(&self, o: &Operation) -> Tri {
        let dport = self.conn.destination_port;
        let l4 = and(
            positive(&o.ports, port, |p| *p == dport),
            negative(&o.not_ports, port, |p| *p == dport),
        );
        let has_l4 = !o.ports.is_empty() || !o.not_ports.is_empty();
        self.entry(l4, has_l4, !o.methods.is_empty())
    }

    fn condition(&self, c: &Condition) -> Tri {
        let (v, n) = (&c.values, &c.not_values);
        let (src, dst, dport) = (
            self.conn.source_ip,
            self.conn.destination_ip,
            self.conn.destination_port,
        );
        let l4 = match c.key.as_str() {
            "source.ip" => and(
                positive(v, cidr, |x| in_cidr(x, src)),
                negative(n, cidr, |x| in_cidr(x, src)),
            ),
            "destination.ip" => and(
                positive(v, cidr, |x| in_cidr(x, dst)),
                negative(n, cidr, |x| in_cidr(x, dst)),
            ),
            "destination.port" => and(
                positive(v, port, |p| *p == dport),
                negative(n, port, |p| *p == dport),
            ),
            "source.namespace" => and(
                positive(v, text, |p| self.namespace(p)),
                negative(n, text, |p| self.namespace(p)),
            ),
            "source.principal" => and(
                positive(v, text, |p| self.principal(p)),
                negative(n, text, |p| self.principal(p)),
            ),
            _ => return self.entry(T, false, true),
        };
        self.entry(l4, !v.is_empty() || !n.is_empty(), false)
    }

    fn rule(&self, r: &PolicyRule) -> Tri {
        let mut result = T;
        if !r.to.is_empty() {
            result = and(result, r.to.iter().map(|o| self.operation(o)).fold(F, or));
        }
        if !r.from.is_empty() {
            result = and(result, r.from.iter().map(|s| self.source(s)).fold(F, or));
        }
        r.when.iter().map(|c| self.condition(c)).fold(result, and)
    }

    fn policy(conn: &Connection, p: &AuthorizationPolicy) -> Tri {
        let oracle = Oracle {
            conn,
            deny: p.action == PolicyAction::Deny,
            policy_ns: &p.namespace,
        };
        p.rules.iter().map(|r| oracle.rule(r)).fold(F, or)
    }
}

fn destination() -> Workload {
    Workload {
        name: "w".into(),
        namespace: NS.into(),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn converted_never_allows_what_the_original_could_deny(
        policies in policies(),
        conn in connection(),
    ) {
        let converted: Vec<ConvertedPolicy> =
            policies.iter().map(|p| convert_policy(p, ROOT)).collect();
        let sent: Vec<&crate::pb::security::Authorization> =
            converted.iter().filter_map(|c| c.authorization.as_ref()).collect();
        prop_assert_eq!(sent.len(), policies.len());
        let decision = evaluate(&sent, &destination(), &conn);

        let results: Vec<(bool, Tri)> = policies
            .iter()
            .map(|p| (p.action == PolicyAction::Deny, Oracle::policy(&conn, p)))
            .collect();
        let denies = results.iter().filter(|(deny, _)| *deny).map(|(_, t)| *t);
        let allows: Vec<Tri> = results.iter().filter(|(deny, _)| !deny).map(|(_, t)| *t).collect();
        let could_deny = denies.clone().any(|t| t != F)
            || (!allows.is_empty() && allows.iter().all(|t| *t != T));
        prop_assert!(
            !(decision.allowed && could_deny),
            "converted allows ({:?}) but the original could deny: {:?}",
            decision,
            results
        );

        let clean = converted
            .iter()
            .all(|c| c.status.as_ref().is_some_and(|s| s.reason == "Accepted"));
        if clean {
            let oracle_allows = !denies.clone().any(|t| t == T)
                && (allows.is_empty() || allows.contains(&T));
            prop_assert!(results.iter().all(|(_, t)| *t != U), "clean policies are definite");
            prop_assert_eq!(decision.allowed, oracle_allows, "{:?}", results);
        }
    }
}
