//! The authz-* cases of tests/fixtures/conformance.yaml, re-expressed in Rust.

use super::test_support::*;
use crate::discovery::model::authorization::xds_name;

fn allow_full_policy() -> AuthorizationPolicy {
    let src = |f: fn(&mut Source)| {
        let mut s = Source::default();
        f(&mut s);
        from(vec![s])
    };
    let op = |f: fn(&mut Operation)| {
        let mut o = Operation::default();
        f(&mut o);
        to(vec![o])
    };
    let (ips, not_ips) = (
        ["10.10.10.10", "192.168.10.0/24"],
        ["90.10.10.10", "90.168.10.0/24"],
    );
    let cond = |key: &str, v: &str| {
        let values = [
            v.to_string(),
            format!("{v}-prefix-*"),
            format!("*-suffix-{v}"),
            "*".into(),
        ];
        let not = [
            format!("not-{v}"),
            format!("not-{v}-prefix-*"),
            format!("*-not-suffix-{v}"),
            "*".into(),
        ];
        PolicyRule {
            when: vec![Condition {
                key: key.into(),
                values: values.to_vec(),
                not_values: not.to_vec(),
            }],
            ..Default::default()
        }
    };
    let rules = vec![
        src(|s| {
            s.principals = strs(&["principal", "principal-prefix-*", "*-suffix-principal", "*"]);
            s.not_principals = strs(&[
                "not-principal",
                "not-principal-prefix-*",
                "*-suffix-not-principal",
                "*",
            ]);
        }),
        src(|s| {
            s.service_accounts = strs(&["ns/sa", "sa-only"]);
            s.not_service_accounts = strs(&["ns/sa-not", "sa-not-only"]);
        }),
        src(|s| {
            s.request_principals = strs(&["requestPrincipals", "rp-*", "*-rp", "*"]);
            s.not_request_principals = strs(&["not-requestPrincipals", "*"]);
        }),
        src(|s| {
            s.namespaces = strs(&["ns", "ns-prefix-*", "*-ns-suffix", "*"]);
            s.not_namespaces = strs(&["not-ns", "not-ns-prefix-*", "*-not-ns-suffix", "*"]);
        }),
        src(|s| {
            s.ip_blocks = strs(&["1.2.3.4", "5.6.0.0/16"]);
            s.not_ip_blocks = strs(&["2.2.3.4", "6.6.0.0/16"]);
        }),
        src(|s| {
            s.remote_ip_blocks = strs(&["1.2.3.4", "5.6.0.0/16"]);
            s.not_remote_ip_blocks = strs(&["2.2.3.4", "6.6.0.0/16"]);
        }),
        op(|o| {
            o.methods = strs(&["method", "method-prefix-*", "*-suffix-method", "*"]);
            o.not_methods = strs(&["not-method", "*"]);
        }),
        op(|o| {
            o.hosts = strs(&["exact.com", "*.suffix.com", "prefix.*", "*"]);
            o.not_hosts = strs(&["not-exact.com", "*"]);
        }),
        op(|o| {
            o.ports = strs(&["80", "90"]);
            o.not_ports = strs(&["800", "900"]);
        }),
        op(|o| {
            o.paths = strs(&["/exact", "/prefix/*", "*/suffix", "*"]);
            o.not_paths = strs(&["/not-exact", "*"]);
        }),
        cond("request.headers[X-header]", "header"),
        when("source.ip", &ips, &not_ips),
        when("remote.ip", &ips, &not_ips),
        when(
            "source.namespace",
            &["ns", "ns-prefix-*", "*-ns-suffix", "*"],
            &["not-ns", "not-ns-prefix-*", "*-not-ns-suffix", "*"],
        ),
        cond("source.principal", "principal"),
        cond("request.auth.principal", "requestPrincipals"),
        cond("request.auth.audiences", "audiences"),
        cond("request.auth.presenter", "presenter"),
        cond("request.auth.claims[iss]", "iss"),
        cond("request.auth.claims[nested1][nested2]", "nested"),
        when("destination.ip", &ips, &not_ips),
        when("destination.port", &["91", "92"], &["9001", "9002"]),
        cond("connection.sni", "sni"),
        cond("experimental.envoy.filters.a.b[c]", "exact"),
    ];
    policy("cfg", "allow", PolicyAction::Allow, rules)
}

#[test]
fn conformance_authz_allow_full_attribute_matrix() {
    let got = authz(&allow_full_policy());
    let ns_match = Match {
        namespaces: vec![
            exact("ns"),
            prefix("ns-prefix-"),
            suffix("-ns-suffix"),
            presence(),
        ],
        not_namespaces: vec![
            exact("not-ns"),
            prefix("not-ns-prefix-"),
            suffix("-not-ns-suffix"),
            presence(),
        ],
        ..Default::default()
    };
    let ip_pair = |pos: &[&str], neg: &[&str]| {
        (
            pos.iter().map(|a| addr(a)).collect::<Vec<_>>(),
            neg.iter().map(|a| addr(a)).collect::<Vec<_>>(),
        )
    };
    let (when_ips, when_not_ips) = ip_pair(
        &["10.10.10.10/32", "192.168.10.0/24"],
        &["90.10.10.10/32", "90.168.10.0/24"],
    );
    let want = Authorization {
        name: "allow".into(),
        namespace: "cfg".into(),
        scope: Scope::Namespace as i32,
        action: Action::Allow as i32,
        rules: vec![
            one(Match {
                principals: vec![
                    exact("principal"),
                    prefix("principal-prefix-"),
                    suffix("-suffix-principal"),
                    presence(),
                ],
                not_principals: vec![
                    exact("not-principal"),
                    prefix("not-principal-prefix-"),
                    suffix("-suffix-not-principal"),
                    presence(),
                ],
                ..Default::default()
            }),
            one(Match {
                service_accounts: vec![sa("ns", "sa"), sa("cfg", "sa-only")],
                not_service_accounts: vec![sa("ns", "sa-not"), sa("cfg", "sa-not-only")],
                ..Default::default()
            }),
            one(ns_match.clone()),
            one(Match {
                source_ips: vec![addr("1.2.3.4/32"), addr("5.6.0.0/16")],
                not_source_ips: vec![addr("2.2.3.4/32"), addr("6.6.0.0/16")],
                ..Default::default()
            }),
            one(Match {
                destination_ports: vec![80, 90],
                not_destination_ports: vec![800, 900],
                ..Default::default()
            }),
            one(Match {
                source_ips: when_ips.clone(),
                not_source_ips: when_not_ips.clone(),
                ..Default::default()
            }),
            one(ns_match),
            one(Match {
                principals: vec![
                    exact("principal"),
                    prefix("principal-prefix-"),
                    suffix("-suffix-principal"),
                    presence(),
                ],
                not_principals: vec![
                    exact("not-principal"),
                    prefix("not-principal-prefix-"),
                    suffix("-not-suffix-principal"),
                    presence(),
                ],
                ..Default::default()
            }),
            one(Match {
                destination_ips: when_ips,
                not_destination_ips: when_not_ips,
                ..Default::default()
            }),
            one(Match {
                destination_ports: vec![91, 92],
                not_destination_ports: vec![9001, 9002],
                ..Default::default()
            }),
        ],
        dry_run: false,
        extensions: vec![],
    };
    assert_eq!(got, want);
    let found = "connection.sni, experimental.envoy.filters.a.b[c], hosts, methods, notHosts, \
                 notMethods, notPaths, notRemoteIpBlocks, notRequestPrincipals, paths, remote.ip, \
                 remoteIpBlocks, request.auth.audiences, request.auth.claims[iss], \
                 request.auth.claims[nested1][nested2], request.auth.presenter, \
                 request.auth.principal, request.headers[X-header], requestPrincipals";
    let message = format!(
        "ztunnel does not support HTTP attributes (found: {found}). {HTTP_PREAMBLE} Within an \
         ALLOW policy, rules matching HTTP attributes are omitted. This will be more restrictive \
         than requested."
    );
    assert_eq!(status(&allow_full_policy()), warning(true, &message));
}

#[test]
fn conformance_authz_audit_and_custom_actions_not_sent() {
    let rules = vec![PolicyRule {
        from: vec![Source {
            principals: strs(&["trust/ns/echo-1234/"]),
            ..Default::default()
        }],
        to: vec![Operation {
            ports: strs(&["http"]),
            ..Default::default()
        }],
        when: vec![],
    }];
    for (name, action, text) in [
        ("audit", PolicyAction::Audit, "AUDIT"),
        ("custom", PolicyAction::Custom, "CUSTOM"),
    ] {
        let p = policy("ns1", name, action, rules.clone());
        let got = convert_policy(&p, "test-system");
        assert_eq!(got.authorization, None, "{name}");
        let message = format!("ztunnel does not support the {text} action");
        assert_eq!(got.status, Some(warning(false, &message)), "{name}");
        assert!(!p.is_sent_to_ztunnel());
    }
}

#[test]
fn conformance_authz_deny_mixed_is_enforced_without_http_parts() {
    let principal = || strs(&["cluster.local/ns/foo/sa/bar"]);
    let not_rp = || Source {
        not_request_principals: strs(&["example.com/sub-1"]),
        ..Default::default()
    };
    let by_principal = || Source {
        principals: principal(),
        ..Default::default()
    };
    let deny = |name, rules| policy("ns1", name, PolicyAction::Deny, rules);
    let principal_match = || Match {
        principals: vec![exact("cluster.local/ns/foo/sa/bar")],
        ..Default::default()
    };
    let mixed_message = format!(
        "ztunnel does not support HTTP attributes (found: notRequestPrincipals). {HTTP_PREAMBLE} \
         DENY policy with HTTP attributes is enforced without the HTTP rules. This will be more \
         restrictive than requested."
    );
    let cases = vec![
        (
            deny(
                "deny-mixed",
                vec![from(vec![Source {
                    not_request_principals: strs(&["example.com/sub-1"]),
                    ..by_principal()
                }])],
            ),
            vec![one(principal_match())],
            warning(true, &mixed_message),
        ),
        (
            deny(
                "deny-l7-and-l4-rules",
                vec![from(vec![not_rp()]), from(vec![by_principal()])],
            ),
            vec![one(Match::default()), one(principal_match())],
            warning(true, &mixed_message),
        ),
        (
            deny(
                "deny-catch-all",
                vec![PolicyRule::default(), from(vec![not_rp()])],
            ),
            vec![rule(vec![]), one(Match::default())],
            warning(true, &mixed_message),
        ),
        (
            deny("deny-l4", vec![from(vec![by_principal()])]),
            vec![one(principal_match())],
            accepted(),
        ),
    ];
    for (p, rules, want_status) in cases {
        let got = convert_policy(&p, "test-system");
        let want = Authorization {
            name: p.name.clone(),
            namespace: "ns1".into(),
            scope: Scope::Namespace as i32,
            action: Action::Deny as i32,
            rules,
            ..Default::default()
        };
        assert_eq!(got.authorization, Some(want), "{}", p.name);
        assert_eq!(got.status, Some(want_status), "{}", p.name);
    }
}

#[test]
fn conformance_authz_scope_and_workload_attachment() {
    let root = "istio-system";
    let pod = labels(&[("app", "a")]);
    let global = policy(root, "global", PolicyAction::Allow, vec![]);
    let namespace = policy("ns1", "namespace", PolicyAction::Allow, vec![]);
    let bare = |p: &AuthorizationPolicy, scope: Scope| Authorization {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        scope: scope as i32,
        ..Default::default()
    };
    assert_eq!(authz(&global), bare(&global, Scope::Global));
    assert_eq!(authz(&namespace), bare(&namespace, Scope::Namespace));
    assert!(!policy_selects(&global, "ns1", &pod, root));
    assert!(!policy_selects(&namespace, "ns1", &pod, root));

    let with_selector = |ns: &str, name: &str, app: &str| AuthorizationPolicy {
        selector: Some(labels(&[("app", app)])),
        ..policy(ns, name, PolicyAction::Allow, vec![])
    };
    let selector = with_selector("ns1", "selector", "a");
    assert_eq!(authz(&selector), bare(&selector, Scope::WorkloadSelector));
    assert!(policy_selects(&selector, "ns1", &pod, root));
    assert!(!policy_selects(
        &selector,
        "ns1",
        &labels(&[("app", "not-a")]),
        root
    ));
    assert!(
        !policy_selects(&selector, "ns2", &pod, root),
        "other namespace"
    );

    // Root-namespace selector policies attach too; the workload's list is sorted.
    let global_selector = with_selector(root, "global-selector", "a");
    let all = [&namespace, &global_selector, &selector, &global];
    let attached = |pols: &[&AuthorizationPolicy]| {
        let mut names: Vec<String> = pols
            .iter()
            .filter(|p| policy_selects(p, "ns1", &pod, root))
            .map(|p| p.xds_name())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        attached(&all),
        ["istio-system/global-selector", "ns1/selector"]
    );
    let stopped = with_selector(root, "global-selector", "not-a");
    assert_eq!(
        attached(&[&namespace, &stopped, &selector, &global]),
        ["ns1/selector"]
    );
}

#[test]
fn conformance_authz_xds_resource_names() {
    let p = policy("ns", "policy1", PolicyAction::Allow, vec![]);
    assert_eq!(p.xds_name(), "ns/policy1");
    assert_eq!(xds_name("ns", "policy2"), "ns/policy2");
    let got = authz(&p);
    assert_eq!(
        (got.name.as_str(), got.namespace.as_str()),
        ("policy1", "ns")
    );
    assert!(
        got.rules.is_empty(),
        "an empty spec is ALLOW with no rules: deny-all in scope"
    );
}
