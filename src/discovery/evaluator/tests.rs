//! Scenarios end to end (spec objects -> conversion -> ztunnel's decision) and ztunnel's edge
//! cases on hand-written protos.

use super::*;
use crate::discovery::convert::authorization::{convert_policy, policy_selects};
use crate::discovery::convert::peer_authentication::{static_strict_policy, workload_references};
use crate::discovery::model::Labels;
use crate::discovery::model::authorization::{
    AuthorizationPolicy, Condition, Operation, PolicyAction, PolicyRule, Source,
};
use crate::discovery::model::peer_authentication::{MtlsMode, PeerAuthentication};
use crate::pb::google::protobuf::Empty;
use crate::pb::security::{Clause, Rule};

const ROOT: &str = "istio-system";

fn strs(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

fn workload(ns: &str, policies: &[&str]) -> Workload {
    Workload {
        name: "w".into(),
        namespace: ns.into(),
        authorization_policies: strs(policies),
        ..Default::default()
    }
}

fn mtls(ns: &str, sa: &str, src: &str) -> Connection {
    Connection {
        source_identity: Some(Identity {
            trust_domain: "cluster.local".into(),
            namespace: ns.into(),
            service_account: sa.into(),
        }),
        ..plaintext(src)
    }
}

fn plaintext(src: &str) -> Connection {
    Connection {
        source_identity: None,
        source_ip: src.parse().unwrap(),
        destination_ip: "10.9.9.9".parse().unwrap(),
        destination_port: 8080,
    }
}

fn on_port(mut c: Connection, port: u16) -> Connection {
    c.destination_port = port;
    c
}

fn spec(ns: &str, name: &str, action: PolicyAction, rules: Vec<PolicyRule>) -> AuthorizationPolicy {
    AuthorizationPolicy {
        name: name.into(),
        namespace: ns.into(),
        action,
        rules,
        ..Default::default()
    }
}

fn converted(p: &AuthorizationPolicy) -> Authorization {
    convert_policy(p, ROOT).authorization.expect("sent")
}

fn decide(policies: &[&Authorization], w: &Workload, c: &Connection) -> (bool, Reason) {
    let d = evaluate(policies, w, c);
    (d.allowed, d.reason)
}

#[test]
fn namespace_strict_peer_authentication_denies_plaintext() {
    let pa = PeerAuthentication {
        name: "default".into(),
        namespace: "ns1".into(),
        mode: MtlsMode::Strict,
        ..Default::default()
    };
    let refs = workload_references("ns1", &Labels::new(), &[&pa], &[], ROOT);
    let w = Workload {
        authorization_policies: refs,
        ..workload("ns1", &[])
    };
    let static_policy = static_strict_policy(ROOT);
    let d = evaluate(&[&static_policy], &w, &plaintext("10.0.0.1"));
    assert_eq!(
        d,
        Decision {
            allowed: false,
            policy: Some("istio-system/istio_converted_static_strict".into()),
            rule: Some(0),
            reason: Reason::Denied,
        }
    );
    let d = evaluate(&[&static_policy], &w, &mtls("other", "sa", "10.0.0.1"));
    assert_eq!((d.allowed, d.reason), (true, Reason::NoAllowPolicies));
    // A workload that does not reference it is not affected.
    let d = evaluate(
        &[&static_policy],
        &workload("ns2", &[]),
        &plaintext("10.0.0.1"),
    );
    assert!(d.allowed);
}

#[test]
fn allow_with_methods_allows_nothing() {
    let p = spec(
        "ns1",
        "get-only",
        PolicyAction::Allow,
        vec![PolicyRule {
            to: vec![Operation {
                methods: strs(&["GET"]),
                ..Default::default()
            }],
            ..Default::default()
        }],
    );
    let a = converted(&p);
    assert!(a.rules.is_empty());
    for c in [plaintext("10.0.0.1"), mtls("ns1", "sa", "10.0.0.1")] {
        assert_eq!(
            decide(&[&a], &workload("ns1", &[]), &c),
            (false, Reason::NoAllowMatched)
        );
    }
}

#[test]
fn deny_with_only_paths_has_no_effect() {
    let p = spec(
        "ns1",
        "no-admin",
        PolicyAction::Deny,
        vec![PolicyRule {
            to: vec![Operation {
                paths: strs(&["/admin"]),
                ..Default::default()
            }],
            ..Default::default()
        }],
    );
    let a = converted(&p);
    let status = convert_policy(&p, ROOT).status.unwrap();
    assert!(
        status.message.contains("will have no effect"),
        "{}",
        status.message
    );
    for c in [plaintext("10.0.0.1"), mtls("ns1", "sa", "10.0.0.1")] {
        assert_eq!(
            decide(&[&a], &workload("ns1", &[]), &c),
            (true, Reason::NoAllowPolicies)
        );
    }
}

#[test]
fn not_ip_blocks_with_a_cidr() {
    let rule = PolicyRule {
        from: vec![Source {
            not_ip_blocks: strs(&["10.0.0.0/8"]),
            ..Default::default()
        }],
        ..Default::default()
    };
    let allow = converted(&spec(
        "ns1",
        "outside-only",
        PolicyAction::Allow,
        vec![rule.clone()],
    ));
    let w = workload("ns1", &[]);
    assert_eq!(
        decide(&[&allow], &w, &plaintext("10.1.2.3")),
        (false, Reason::NoAllowMatched)
    );
    assert_eq!(
        decide(&[&allow], &w, &plaintext("192.168.0.1")),
        (true, Reason::Allowed)
    );
    assert_eq!(
        decide(&[&allow], &w, &plaintext("::1")),
        (true, Reason::Allowed)
    );

    let deny = converted(&spec("ns1", "inside-only", PolicyAction::Deny, vec![rule]));
    assert_eq!(
        decide(&[&deny], &w, &plaintext("10.1.2.3")),
        (true, Reason::NoAllowPolicies)
    );
    assert_eq!(
        decide(&[&deny], &w, &plaintext("192.168.0.1")),
        (false, Reason::Denied)
    );
}

#[test]
fn root_namespace_policy_applies_everywhere() {
    let deny_bad = |ns: &str| {
        converted(&spec(
            ns,
            "no-bad",
            PolicyAction::Deny,
            vec![PolicyRule {
                from: vec![Source {
                    namespaces: strs(&["bad"]),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        ))
    };
    let global = deny_bad(ROOT);
    assert_eq!(global.scope, Scope::Global as i32);
    let from_bad = mtls("bad", "sa", "10.0.0.1");
    for ns in ["ns1", "ns2", ROOT] {
        let d = evaluate(&[&global], &workload(ns, &[]), &from_bad);
        assert_eq!(d.policy.as_deref(), Some("istio-system/no-bad"), "{ns}");
        assert!(!d.allowed);
    }
    // A namespace policy stays in its namespace.
    let local = deny_bad("ns1");
    assert!(!evaluate(&[&local], &workload("ns1", &[]), &from_bad).allowed);
    assert!(evaluate(&[&local], &workload("ns2", &[]), &from_bad).allowed);
}

#[test]
fn selector_policies_apply_through_the_workload_list() {
    let mut p = spec(
        "ns1",
        "sel",
        PolicyAction::Deny,
        vec![PolicyRule::default()],
    );
    p.selector = Some([("app".to_string(), "a".to_string())].into());
    let a = converted(&p);
    let labels: Labels = [("app".to_string(), "a".to_string())].into();
    assert!(policy_selects(&p, "ns1", &labels, ROOT));
    let c = plaintext("10.0.0.1");
    assert!(
        evaluate(&[&a], &workload("ns1", &[]), &c).allowed,
        "not referenced"
    );
    assert!(!evaluate(&[&a], &workload("ns1", &["ns1/sel"]), &c).allowed);
    // Unknown names in the list are skipped.
    assert!(evaluate(&[], &workload("ns1", &["ns1/sel", "ns1/gone"]), &c).allowed);
}

#[test]
fn deny_wins_over_allow_and_names_the_first_matching_rule() {
    let allow_all = converted(&spec(
        "ns1",
        "a-allow",
        PolicyAction::Allow,
        vec![PolicyRule::default()],
    ));
    let deny = converted(&spec(
        "ns1",
        "z-deny",
        PolicyAction::Deny,
        vec![
            PolicyRule {
                when: vec![Condition {
                    key: "destination.port".into(),
                    values: strs(&["1"]),
                    ..Default::default()
                }],
                ..Default::default()
            },
            PolicyRule {
                when: vec![Condition {
                    key: "destination.port".into(),
                    values: strs(&["8080"]),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    ));
    let w = workload("ns1", &[]);
    let d = evaluate(&[&allow_all, &deny], &w, &plaintext("10.0.0.1"));
    assert_eq!(
        (d.allowed, d.policy.as_deref(), d.rule),
        (false, Some("ns1/z-deny"), Some(1))
    );
    let d = evaluate(
        &[&allow_all, &deny],
        &w,
        &on_port(plaintext("10.0.0.1"), 80),
    );
    assert_eq!(
        (d.allowed, d.policy.as_deref(), d.rule),
        (true, Some("ns1/a-allow"), Some(0))
    );
    assert_eq!(d.reason.to_string(), "explicitly allowed");
    assert_eq!(
        Reason::NoAllowMatched.to_string(),
        "allow policies exist, but none allowed"
    );
}

/// A NAMESPACE policy in `ns1` with the given rules, straight as protos.
fn raw(action: Action, rules: Vec<Rule>) -> Authorization {
    Authorization {
        name: "raw".into(),
        namespace: "ns1".into(),
        scope: Scope::Namespace as i32,
        action: action as i32,
        rules,
        ..Default::default()
    }
}

fn rule_of(matches: Vec<Match>) -> Rule {
    Rule {
        clauses: vec![Clause { matches }],
    }
}

fn sm(match_type: MatchType) -> StringMatch {
    StringMatch {
        match_type: Some(match_type),
    }
}

fn v4(ip: &str, length: u32) -> Address {
    Address {
        address: crate::discovery::names::ip_bytes(&ip.parse().unwrap()),
        length,
    }
}

#[test]
fn ztunnel_edge_cases() {
    let w = workload("ns1", &[]);
    let id = mtls("src-ns", "src-sa", "10.0.0.1");
    let plain = plaintext("10.0.0.1");
    let allowed_by = |rules: Vec<Rule>, c: &Connection| {
        let a = raw(Action::Allow, rules);
        evaluate(&[&a], &w, c).allowed
    };
    let m = Match::default;
    let principal = |t| Match {
        principals: vec![sm(t)],
        ..m()
    };
    let cases: Vec<(&str, Vec<Rule>, &Connection, bool)> = vec![
        ("no rules matches nothing", vec![], &id, false),
        (
            "a rule with no clause matches everything",
            vec![Rule { clauses: vec![] }],
            &plain,
            true,
        ),
        (
            "a clause with no match matches",
            vec![Rule {
                clauses: vec![Clause { matches: vec![] }],
            }],
            &plain,
            true,
        ),
        (
            "an empty Match never matches",
            vec![rule_of(vec![m()])],
            &id,
            false,
        ),
        (
            "an empty Match is skipped, the next one counts",
            vec![rule_of(vec![
                m(),
                Match {
                    destination_ports: vec![8080],
                    ..m()
                },
            ])],
            &id,
            true,
        ),
        (
            "principal without spiffe://",
            vec![rule_of(vec![principal(MatchType::Exact(
                "cluster.local/ns/src-ns/sa/src-sa".into(),
            ))])],
            &id,
            true,
        ),
        (
            "principal with spiffe:// never matches",
            vec![rule_of(vec![principal(MatchType::Exact(
                "spiffe://cluster.local/ns/src-ns/sa/src-sa".into(),
            ))])],
            &id,
            false,
        ),
        (
            "principal prefix",
            vec![rule_of(vec![principal(MatchType::Prefix(
                "cluster.local/ns/src-ns/".into(),
            ))])],
            &id,
            true,
        ),
        (
            "presence needs an identity",
            vec![rule_of(vec![principal(MatchType::Presence(Empty {}))])],
            &plain,
            false,
        ),
        (
            "presence with an identity",
            vec![rule_of(vec![principal(MatchType::Presence(Empty {}))])],
            &id,
            true,
        ),
        (
            "not_principals presence matches plaintext",
            vec![rule_of(vec![Match {
                not_principals: vec![sm(MatchType::Presence(Empty {}))],
                ..m()
            }])],
            &plain,
            true,
        ),
        (
            "namespace match",
            vec![rule_of(vec![Match {
                namespaces: vec![sm(MatchType::Exact("src-ns".into()))],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "plaintext has no namespace",
            vec![rule_of(vec![Match {
                namespaces: vec![sm(MatchType::Suffix("".into()))],
                ..m()
            }])],
            &plain,
            true,
        ),
        (
            "plaintext fails namespace presence",
            vec![rule_of(vec![Match {
                namespaces: vec![sm(MatchType::Presence(Empty {}))],
                ..m()
            }])],
            &plain,
            false,
        ),
        (
            "service account needs both parts",
            vec![rule_of(vec![Match {
                service_accounts: vec![ServiceAccountMatch {
                    namespace: "src-ns".into(),
                    service_account: "src-sa".into(),
                }],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "service account of another namespace",
            vec![rule_of(vec![Match {
                service_accounts: vec![ServiceAccountMatch {
                    namespace: "x".into(),
                    service_account: "src-sa".into(),
                }],
                ..m()
            }])],
            &id,
            false,
        ),
        (
            "typeless string match is dropped, Match left empty",
            vec![rule_of(vec![Match {
                principals: vec![StringMatch { match_type: None }],
                ..m()
            }])],
            &id,
            false,
        ),
        (
            "length 0 is /0",
            vec![rule_of(vec![Match {
                source_ips: vec![v4("192.0.2.1", 0)],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "unmasked address with a prefix",
            vec![rule_of(vec![Match {
                source_ips: vec![v4("10.0.0.99", 24)],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "length 33 on v4 is dropped, Match left empty",
            vec![rule_of(vec![Match {
                source_ips: vec![v4("10.0.0.1", 33)],
                ..m()
            }])],
            &id,
            false,
        ),
        (
            "length is cast to u8: 288 is 32",
            vec![rule_of(vec![Match {
                source_ips: vec![v4("10.0.0.1", 288)],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "5 address bytes are dropped",
            vec![rule_of(vec![Match {
                source_ips: vec![Address {
                    address: vec![10, 0, 0, 1, 0].into(),
                    length: 32,
                }],
                ..m()
            }])],
            &id,
            false,
        ),
        (
            "a dropped negative entry loosens the Match",
            vec![rule_of(vec![Match {
                not_source_ips: vec![v4("10.0.0.1", 40)],
                destination_ports: vec![8080],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "ports are cast to u16",
            vec![rule_of(vec![Match {
                destination_ports: vec![65536 + 8080],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "a v6 network never contains a v4 source",
            vec![rule_of(vec![Match {
                source_ips: vec![Address {
                    address: crate::discovery::names::ip_bytes(&"::".parse().unwrap()),
                    length: 0,
                }],
                ..m()
            }])],
            &id,
            false,
        ),
        (
            "destination ip",
            vec![rule_of(vec![Match {
                destination_ips: vec![v4("10.9.9.9", 32)],
                ..m()
            }])],
            &id,
            true,
        ),
        (
            "not destination port",
            vec![rule_of(vec![Match {
                not_destination_ports: vec![8080],
                ..m()
            }])],
            &id,
            false,
        ),
    ];
    for (name, rules, conn, want) in cases {
        assert_eq!(allowed_by(rules, conn), want, "{name}");
    }
}

#[test]
fn policies_ztunnel_would_not_apply() {
    let w = workload("ns1", &[]);
    let c = plaintext("10.0.0.1");
    let deny_all = || raw(Action::Deny, vec![Rule { clauses: vec![] }]);
    assert!(!evaluate(&[&deny_all()], &w, &c).allowed);
    let dry = Authorization {
        dry_run: true,
        ..deny_all()
    };
    assert!(evaluate(&[&dry], &w, &c).allowed, "dry-run is only logged");
    let bad_action = Authorization {
        action: 7,
        ..deny_all()
    };
    assert!(evaluate(&[&bad_action], &w, &c).allowed, "NACKed");
    let bad_scope = Authorization {
        scope: 9,
        ..deny_all()
    };
    assert!(evaluate(&[&bad_scope], &w, &c).allowed, "NACKed");
    let other_ns = Authorization {
        namespace: "ns2".into(),
        ..deny_all()
    };
    assert!(evaluate(&[&other_ns], &w, &c).allowed);
    // Referenced by name, a policy applies whatever its scope.
    assert!(!evaluate(&[&other_ns], &workload("ns1", &["ns2/raw"]), &c).allowed);
    // The same policy twice is one policy.
    let d = evaluate(&[&deny_all(), &deny_all()], &w, &c);
    assert_eq!(d.policy.as_deref(), Some("ns1/raw"));
}
