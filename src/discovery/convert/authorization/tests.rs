//! Table tests for the AuthorizationPolicy conversion: each mapping, the quirks, and bad input.

use super::test_support::*;

#[test]
fn string_match_mapping() {
    let cases = [
        ("*", presence()),
        ("*x", suffix("x")),
        ("x*", prefix("x")),
        ("x", exact("x")),
        ("**", suffix("*")),
        ("*x*", suffix("x*")),
        ("", exact("")),
        ("a*b", exact("a*b")),
    ];
    for (input, want) in cases {
        assert_eq!(convert::string_match(input), want, "{input:?}");
    }
}

#[test]
fn ip_mapping_keeps_the_address_as_written() {
    let v4 = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap().octets().to_vec();
    type Bytes = Option<(Vec<u8>, u32)>;
    let cases: [(&str, Bytes); 12] = [
        ("1.2.3.4", Some((v4("1.2.3.4"), 32))),
        ("5.6.7.8/16", Some((v4("5.6.7.8"), 16))),
        ("0.0.0.0/0", Some((v4("0.0.0.0"), 0))),
        (
            "::1",
            Some((
                "::1"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets()
                    .to_vec(),
                128,
            )),
        ),
        (
            "2001:db8::1/32",
            Some((
                "2001:db8::1"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets()
                    .to_vec(),
                32,
            )),
        ),
        (
            "::ffff:1.2.3.4",
            Some((
                "::ffff:1.2.3.4"
                    .parse::<std::net::Ipv6Addr>()
                    .unwrap()
                    .octets()
                    .to_vec(),
                128,
            )),
        ),
        ("1.2.3.4/33", None),
        ("1.2.3.4/", None),
        ("1.2.3.4/08", None),
        ("1.2.3.4/+8", None),
        ("bogus", None),
        ("", None),
    ];
    for (input, want) in cases {
        let got = convert::parse_address(input).map(|a| (a.address.to_vec(), a.length));
        assert_eq!(got, want, "{input:?}");
    }
}

#[test]
fn port_mapping_keeps_only_decimal_ports() {
    let cases = [
        ("80", Some(80)),
        ("0", Some(0)),
        ("65535", Some(65535)),
        ("0080", Some(80)),
        ("65536", None),
        ("99999999999999999999", None),
        ("http", None),
        ("+80", None),
        (" 80", None),
        ("", None),
        ("-1", None),
    ];
    for (input, want) in cases {
        assert_eq!(convert::parse_port(input), want, "{input:?}");
    }
}

#[test]
fn clauses_are_to_then_from_then_each_when() {
    let p = policy(
        "ns",
        "order",
        PolicyAction::Deny,
        vec![PolicyRule {
            from: vec![
                Source {
                    namespaces: strs(&["a"]),
                    ..Default::default()
                },
                Source {
                    principals: strs(&["td/ns/b/sa/c"]),
                    ..Default::default()
                },
            ],
            to: vec![Operation {
                ports: strs(&["80"]),
                ..Default::default()
            }],
            when: vec![
                Condition {
                    key: "destination.port".into(),
                    values: strs(&["81"]),
                    ..Default::default()
                },
                Condition {
                    key: "source.ip".into(),
                    not_values: strs(&["10.0.0.0/8"]),
                    ..Default::default()
                },
            ],
        }],
    );
    let want = rule(vec![
        vec![Match {
            destination_ports: vec![80],
            ..Default::default()
        }],
        vec![
            Match {
                namespaces: vec![exact("a")],
                ..Default::default()
            },
            Match {
                principals: vec![exact("td/ns/b/sa/c")],
                ..Default::default()
            },
        ],
        vec![Match {
            destination_ports: vec![81],
            ..Default::default()
        }],
        vec![Match {
            not_source_ips: vec![addr("10.0.0.0/8")],
            ..Default::default()
        }],
    ]);
    assert_eq!(authz(&p).rules, vec![want]);
    assert_eq!(status(&p), accepted());
}

#[test]
fn service_accounts_split_at_the_first_slash() {
    let p = policy(
        "pol-ns",
        "sa",
        PolicyAction::Allow,
        vec![from(vec![Source {
            service_accounts: strs(&["a/b/c", "/x", "bare"]),
            ..Default::default()
        }])],
    );
    let want = one(Match {
        service_accounts: vec![sa("a", "b/c"), sa("", "x"), sa("pol-ns", "bare")],
        ..Default::default()
    });
    assert_eq!(authz(&p).rules, vec![want]);
}

#[test]
fn scope_follows_selector_field_presence() {
    let mut p = policy("istio-system", "p", PolicyAction::Allow, vec![]);
    assert_eq!(authz(&p).scope, Scope::Global as i32);
    p.namespace = "ns".into();
    assert_eq!(authz(&p).scope, Scope::Namespace as i32);
    p.selector = Some(Labels::new());
    assert_eq!(authz(&p).scope, Scope::WorkloadSelector as i32);
}

#[test]
fn quirk_empty_match_labels_is_workload_selector_but_attaches_to_nothing() {
    let p = AuthorizationPolicy {
        selector: Some(Labels::new()),
        ..policy(
            "ns1",
            "empty",
            PolicyAction::Deny,
            vec![PolicyRule::default()],
        )
    };
    assert_eq!(authz(&p).scope, Scope::WorkloadSelector as i32);
    assert!(!policy_selects(
        &p,
        "ns1",
        &labels(&[("app", "a")]),
        "istio-system"
    ));
    assert!(!policy_selects(&p, "ns1", &Labels::new(), "istio-system"));
}

#[test]
fn policies_not_sent_to_ztunnel() {
    let base = || AuthorizationPolicy {
        selector: Some(labels(&[("app", "a")])),
        ..policy("ns1", "p", PolicyAction::Allow, vec![])
    };
    let pod = labels(&[("app", "a")]);

    let waypoint = AuthorizationPolicy {
        has_target_refs: true,
        ..base()
    };
    assert_eq!(
        convert(&waypoint),
        ConvertedPolicy {
            authorization: None,
            status: None
        }
    );
    assert!(!policy_selects(&waypoint, "ns1", &pod, "istio-system"));

    let dry = AuthorizationPolicy {
        dry_run: true,
        ..base()
    };
    let message = "found policy \"ns1/p\" using dry-run annotation, but support for ambient \
                   dry-run authorizationPolicies isn't enabled";
    assert_eq!(
        convert(&dry),
        ConvertedPolicy {
            authorization: None,
            status: Some(warning(false, message))
        }
    );
    assert!(!policy_selects(&dry, "ns1", &pod, "istio-system"));
    // dry-run is checked before targetRefs, as in istiod.
    let dry_waypoint = AuthorizationPolicy {
        has_target_refs: true,
        ..dry.clone()
    };
    assert_eq!(convert(&dry_waypoint).status, Some(warning(false, message)));

    let options = ConvertOptions {
        root_namespace: "istio-system",
        dry_run_enabled: true,
    };
    let enabled = convert_policy_with(&dry, options);
    assert!(enabled.authorization.unwrap().dry_run);
    assert_eq!(enabled.status, Some(accepted()));
    assert!(selector_attaches(&dry, "ns1", &pod, "istio-system"));

    let unknown = AuthorizationPolicy {
        action: PolicyAction::Unknown("DENNY".into()),
        ..base()
    };
    let got = convert(&unknown);
    assert_eq!(got.authorization, None);
    let got = got.status.unwrap();
    assert!(!got.status);
    assert_eq!(got.reason, "UnsupportedValue");
    assert!(got.message.contains("\"DENNY\""), "{}", got.message);
    assert!(!policy_selects(&unknown, "ns1", &pod, "istio-system"));
}

#[test]
fn empty_rule_matches_everything_and_no_rules_matches_nothing() {
    let none = policy("ns", "none", PolicyAction::Allow, vec![]);
    assert!(authz(&none).rules.is_empty());
    let all = policy("ns", "all", PolicyAction::Deny, vec![PolicyRule::default()]);
    assert_eq!(authz(&all).rules, vec![rule(vec![])]);
}

#[test]
fn deny_with_l7_when_kills_the_rule_and_says_so() {
    let p = policy(
        "ns",
        "d",
        PolicyAction::Deny,
        vec![PolicyRule {
            from: vec![Source {
                namespaces: strs(&["a"]),
                ..Default::default()
            }],
            when: vec![Condition {
                key: "request.headers[x]".into(),
                values: strs(&["1"]),
                ..Default::default()
            }],
            ..Default::default()
        }],
    );
    let want = rule(vec![
        vec![Match {
            namespaces: vec![exact("a")],
            ..Default::default()
        }],
        vec![Match::default()],
    ]);
    assert_eq!(authz(&p).rules, vec![want]);
    let message = format!(
        "ztunnel does not support HTTP attributes (found: request.headers[x]). {HTTP_PREAMBLE} \
         After omitting unsupported HTTP attributes, this DENY policy has no enforceable rules \
         at ztunnel and will have no effect. Deploy a waypoint proxy and use a targetRef to \
         enforce this policy."
    );
    assert_eq!(status(&p), warning(true, &message));
}

#[test]
fn allow_drops_only_the_rules_with_l7() {
    let p = policy(
        "ns",
        "a",
        PolicyAction::Allow,
        vec![
            to(vec![Operation {
                methods: strs(&["GET"]),
                ports: strs(&["80"]),
                ..Default::default()
            }]),
            to(vec![Operation {
                ports: strs(&["81"]),
                ..Default::default()
            }]),
        ],
    );
    let want = one(Match {
        destination_ports: vec![81],
        ..Default::default()
    });
    assert_eq!(authz(&p).rules, vec![want]);
}

#[test]
fn trust_domains_are_unsupported_not_ignored() {
    let src = Source {
        principals: strs(&["*"]),
        trust_domains: strs(&["other.td"]),
        ..Default::default()
    };
    let allow = policy(
        "ns",
        "a",
        PolicyAction::Allow,
        vec![from(vec![src.clone()])],
    );
    assert!(
        authz(&allow).rules.is_empty(),
        "ALLOW rule dropped, not widened"
    );
    assert!(status(&allow).message.contains("found: trustDomains"));
    let deny = policy("ns", "d", PolicyAction::Deny, vec![from(vec![src])]);
    assert_eq!(
        authz(&deny).rules,
        vec![one(Match {
            principals: vec![presence()],
            ..Default::default()
        })]
    );
}

/// Fail-closed handling of values that do not parse (module docs of `convert`).
#[test]
fn invalid_values_never_loosen_a_policy() {
    let ip_src = |ip: &[&str], not_ip: &[&str]| Source {
        ip_blocks: strs(ip),
        not_ip_blocks: strs(not_ip),
        principals: strs(&["td/ns/a/sa/b"]),
        ..Default::default()
    };
    let principal = || vec![exact("td/ns/a/sa/b")];
    let ports = |p: &[&str], n: &[&str]| Operation {
        ports: strs(p),
        not_ports: strs(n),
        ..Default::default()
    };
    // (name, action, rule, expected converted rules)
    let cases: Vec<(&str, PolicyAction, PolicyRule, Vec<Rule>)> = vec![
        (
            "allow: a bad value among good ones is dropped",
            PolicyAction::Allow,
            from(vec![ip_src(&["10.0.0.0/8", "10.0.0.0/33"], &[])]),
            vec![one(Match {
                source_ips: vec![addr("10.0.0.0/8")],
                principals: principal(),
                ..Default::default()
            })],
        ),
        (
            "allow: only bad values: the Match never matches",
            PolicyAction::Allow,
            from(vec![ip_src(&["bogus"], &[])]),
            vec![one(Match::default())],
        ),
        (
            "allow: a bad excluded value: the Match never matches",
            PolicyAction::Allow,
            from(vec![ip_src(&[], &["10.0.0.0/8", "bogus"])]),
            vec![one(Match::default())],
        ),
        (
            "allow: named port alone",
            PolicyAction::Allow,
            to(vec![ports(&["http"], &["80"])]),
            vec![one(Match::default())],
        ),
        (
            "allow: named port next to a number is dropped (istiod)",
            PolicyAction::Allow,
            to(vec![ports(&["http", "8080"], &[])]),
            vec![one(Match {
                destination_ports: vec![8080],
                ..Default::default()
            })],
        ),
        (
            "deny: a bad value widens its field",
            PolicyAction::Deny,
            from(vec![ip_src(&["10.0.0.0/8", "bogus"], &[])]),
            vec![one(Match {
                principals: principal(),
                ..Default::default()
            })],
        ),
        (
            "deny: a bad excluded value is dropped",
            PolicyAction::Deny,
            from(vec![ip_src(&[], &["10.0.0.0/8", "bogus"])]),
            vec![one(Match {
                not_source_ips: vec![addr("10.0.0.0/8")],
                principals: principal(),
                ..Default::default()
            })],
        ),
        (
            "deny: a Match widened to nothing drops its clause (deny all)",
            PolicyAction::Deny,
            to(vec![ports(&["http"], &[])]),
            vec![rule(vec![])],
        ),
        (
            "deny: only the widened clause goes",
            PolicyAction::Deny,
            PolicyRule {
                from: vec![Source {
                    namespaces: strs(&["a"]),
                    ..Default::default()
                }],
                when: vec![Condition {
                    key: "source.ip".into(),
                    values: strs(&["300.1.1.1"]),
                    ..Default::default()
                }],
                ..Default::default()
            },
            vec![one(Match {
                namespaces: vec![exact("a")],
                ..Default::default()
            })],
        ),
        (
            "deny: bad value plus L7 in one source still widens",
            PolicyAction::Deny,
            from(vec![Source {
                ip_blocks: strs(&["bogus"]),
                request_principals: strs(&["x"]),
                ..Default::default()
            }]),
            vec![rule(vec![])],
        ),
    ];
    for (name, action, spec_rule, want) in cases {
        let is_allow = action == PolicyAction::Allow;
        let p = policy("ns", "p", action, vec![spec_rule]);
        let got = convert(&p);
        assert_eq!(got.authorization.unwrap().rules, want, "{name}");
        let got = got.status.unwrap();
        assert!(got.status, "{name}");
        assert_eq!(got.reason, "UnsupportedValue", "{name}");
        assert!(
            got.message
                .contains("ztunnel cannot use invalid values (found: rules[0]."),
            "{name}: {}",
            got.message
        );
        let effect = if is_allow {
            "never matches"
        } else {
            "treated as matching any connection"
        };
        assert!(got.message.contains(effect), "{name}: {}", got.message);
    }
}

#[test]
fn invalid_value_list_is_capped() {
    let bad: Vec<&str> = vec!["x"; 8];
    let p = policy(
        "ns",
        "p",
        PolicyAction::Allow,
        vec![from(vec![Source {
            ip_blocks: strs(&bad),
            ..Default::default()
        }])],
    );
    let message = status(&p).message;
    assert!(
        message.contains("rules[0].from[0].source.ipBlocks \"x\", and 3 more)"),
        "{message}"
    );
}

#[test]
fn ten_thousand_rules_convert_with_a_clear_status() {
    let rules: Vec<PolicyRule> = (0..10_000)
        .map(|i| when("destination.port", &[&(i % 65536).to_string()], &[]))
        .collect();
    let p = policy("ns", "big", PolicyAction::Allow, rules);
    let got = convert(&p);
    assert_eq!(got.authorization.unwrap().rules.len(), 10_000);
    assert_eq!(got.status, Some(accepted()));

    // Ten thousand distinct HTTP keys: the message stays within the Kubernetes limit.
    let rules: Vec<PolicyRule> = (0..10_000)
        .map(|i| when(&format!("request.headers[x-{i}]"), &["1"], &[]))
        .collect();
    let p = policy("ns", "big", PolicyAction::Deny, rules);
    let got = convert(&p);
    assert_eq!(got.authorization.unwrap().rules.len(), 10_000);
    let got = got.status.unwrap();
    assert!(got.message.len() <= 32 * 1024);
    assert!(
        got.message
            .starts_with("ztunnel does not support HTTP attributes (found: request.headers[x-0], ")
    );
    assert!(got.message.ends_with('…'));
}
