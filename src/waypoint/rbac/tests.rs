//! Table tests of the translation against istiod's generators: the JWT attributes on HTTP
//! and TCP chains, failing closed by action, and the values Envoy would refuse.

use super::*;
use crate::discovery::model::PolicyRule;
use crate::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;

fn policy(action: PolicyAction, rule: PolicyRule) -> AuthorizationPolicy {
    AuthorizationPolicy {
        name: "p".into(),
        namespace: "demo".into(),
        action,
        rules: vec![rule],
        has_target_refs: true,
        ..Default::default()
    }
}

fn strs(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

fn when(key: &str, values: &[&str], not_values: &[&str]) -> PolicyRule {
    PolicyRule {
        when: vec![Condition {
            key: key.into(),
            values: strs(values),
            not_values: strs(not_values),
        }],
        ..Default::default()
    }
}

fn from(source: Source) -> PolicyRule {
    PolicyRule {
        from: vec![source],
        ..Default::default()
    }
}

fn to(operation: Operation) -> PolicyRule {
    PolicyRule {
        to: vec![operation],
        ..Default::default()
    }
}

/// The one filter of a one-policy chain and its rule's RBAC policy (`None`: dropped).
fn translate(action: PolicyAction, rule: PolicyRule, kind: ChainKind) -> Option<rbac::Policy> {
    let p = policy(action, rule);
    let filters = chain_rbac([&p].into_iter(), kind);
    assert_eq!(filters.len(), 1, "{filters:?}");
    filters[0]
        .policies
        .get("ns[demo]-policy[p]-rule[0]")
        .cloned()
}

/// The principal side's AND list of the rule's only `from` (or of no `from`).
fn ids(policy: &rbac::Policy) -> Vec<rbac::Principal> {
    assert_eq!(policy.principals.len(), 1);
    match &policy.principals[0].identifier {
        Some(rbac::principal::Identifier::AndIds(set)) => set.ids.clone(),
        other => panic!("{other:?}"),
    }
}

fn rules(policy: &rbac::Policy) -> Vec<rbac::Permission> {
    assert_eq!(policy.permissions.len(), 1);
    match &policy.permissions[0].rule {
        Some(rbac::permission::Rule::AndRules(set)) => set.rules.clone(),
        other => panic!("{other:?}"),
    }
}

fn is_any_principal(ids: &[rbac::Principal]) -> bool {
    matches!(ids, [p] if p.identifier == Some(rbac::principal::Identifier::Any(true)))
}

#[test]
fn request_principals_match_the_verified_payload_on_http_chains() {
    let source = Source {
        request_principals: strs(&["https://issuer.example/alice"]),
        not_request_principals: strs(&["https://issuer.example/mallory"]),
        ..Default::default()
    };
    let built = translate(PolicyAction::Allow, from(source.clone()), ChainKind::Http).unwrap();
    let got = ids(&built);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        got[0],
        jwt::request_principals(&strs(&["https://issuer.example/alice"]))
    );
    assert_eq!(
        got[1],
        not_id(jwt::request_principals(&strs(&[
            "https://issuer.example/mallory"
        ])))
    );
    // On TCP there is no token: an ALLOW rule that needs one is dropped (the filter stays
    // and denies), a DENY rule denies more.
    let p = policy(PolicyAction::Allow, from(source.clone()));
    let filters = chain_rbac([&p].into_iter(), ChainKind::Tcp);
    assert_eq!(filters.len(), 1);
    assert!(filters[0].policies.is_empty());
    let wider = translate(PolicyAction::Deny, from(source), ChainKind::Tcp).unwrap();
    assert!(is_any_principal(&ids(&wider)));
}

#[test]
fn request_auth_conditions_match_claims() {
    let claims: [(&str, &[&str]); 4] = [
        ("request.auth.audiences", &["aud"]),
        ("request.auth.presenter", &["azp"]),
        ("request.auth.claims[groups]", &["groups"]),
        ("request.auth.claims[nested][team]", &["nested", "team"]),
    ];
    let mut cases: Vec<(&str, rbac::Principal, rbac::Principal)> = claims
        .iter()
        .map(|(key, path)| {
            (
                *key,
                jwt::claim_principal(path, &strs(&["a"])),
                jwt::claim_principal(path, &strs(&["b"])),
            )
        })
        .collect();
    cases.push((
        "request.auth.principal",
        jwt::request_principals(&strs(&["a"])),
        jwt::request_principals(&strs(&["b"])),
    ));
    for (key, positive, negative) in cases {
        let built = translate(
            PolicyAction::Allow,
            when(key, &["a"], &["b"]),
            ChainKind::Http,
        )
        .unwrap();
        assert_eq!(ids(&built), [positive, not_id(negative)], "{key}");
        // TCP chains: dropped from ALLOW, ignored in DENY.
        let p = policy(PolicyAction::Allow, when(key, &["a"], &[]));
        assert!(
            chain_rbac([&p].into_iter(), ChainKind::Tcp)[0]
                .policies
                .is_empty()
        );
        let wider = translate(PolicyAction::Deny, when(key, &["a"], &[]), ChainKind::Tcp).unwrap();
        assert!(is_any_principal(&ids(&wider)), "{key}");
    }
    // The claim path is istiod's: the payload, then each name.
    let Some(rbac::principal::Identifier::Metadata(m)) =
        jwt::claim_principal(&["nested", "team"], &strs(&["a"])).identifier
    else {
        panic!("metadata")
    };
    assert_eq!(m.filter, jwt::JWT_AUTHN);
    assert_eq!(m.path.len(), 3);
    // Malformed claim keys are unsupported.
    for key in [
        "request.auth.claims",
        "request.auth.claims[]",
        "request.auth.claims[a]b",
        "request.auth.claimsx",
    ] {
        let p = policy(PolicyAction::Allow, when(key, &["a"], &[]));
        let filters = chain_rbac([&p].into_iter(), ChainKind::Http);
        assert!(filters[0].policies.is_empty(), "{key}");
    }
}

fn string_of(m: &StringMatcher) -> String {
    match &m.match_pattern {
        Some(MatchPattern::Exact(v)) => format!("={v}"),
        Some(MatchPattern::Prefix(v)) => format!("{v}*"),
        Some(MatchPattern::Suffix(v)) => format!("*{v}"),
        Some(MatchPattern::SafeRegex(r)) => format!("~{}", r.regex),
        other => panic!("{other:?}"),
    }
}

fn header_of(p: &rbac::Permission) -> (String, String) {
    let Some(rbac::permission::Rule::OrRules(set)) = &p.rule else {
        panic!("OR: {p:?}")
    };
    let Some(rbac::permission::Rule::Header(h)) = &set.rules[0].rule else {
        panic!("header: {p:?}")
    };
    let value = match &h.header_match_specifier {
        Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)) => "present".to_string(),
        Some(header_matcher::HeaderMatchSpecifier::StringMatch(m)) => {
            format!(
                "{}{}",
                string_of(m),
                if m.ignore_case { " (any case)" } else { "" }
            )
        }
        other => panic!("{other:?}"),
    };
    (h.name.clone(), value)
}

/// istiod's `HeaderMatcher` and `HostMatcher`: `*` is presence.
#[test]
fn methods_hosts_and_headers_use_istiods_wildcards() {
    let cases = [
        (
            Operation {
                methods: strs(&["GET"]),
                ..Default::default()
            },
            (":method", "=GET"),
        ),
        (
            Operation {
                methods: strs(&["*"]),
                ..Default::default()
            },
            (":method", "present"),
        ),
        (
            Operation {
                hosts: strs(&["*.example"]),
                ..Default::default()
            },
            (":authority", "*.example (any case)"),
        ),
        (
            Operation {
                hosts: strs(&["*"]),
                ..Default::default()
            },
            (":authority", "present"),
        ),
    ];
    for (operation, (name, value)) in cases {
        let built = translate(PolicyAction::Allow, to(operation), ChainKind::Http).unwrap();
        assert_eq!(
            header_of(&rules(&built)[0]),
            (name.to_string(), value.to_string())
        );
    }
    let built = translate(
        PolicyAction::Deny,
        when("request.headers[x-user]", &["*"], &[]),
        ChainKind::Http,
    )
    .unwrap();
    let Some(rbac::principal::Identifier::OrIds(set)) = &ids(&built)[0].identifier else {
        panic!("OR")
    };
    let Some(rbac::principal::Identifier::Header(h)) = &set.ids[0].identifier else {
        panic!("header")
    };
    assert_eq!(h.name, "x-user");
    assert_eq!(
        h.header_match_specifier,
        Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true))
    );
    // A header name Envoy refuses: unsupported.
    for key in [
        "request.headers[]",
        "request.headers[a:b]",
        "request.headers",
        "request.headers[x",
    ] {
        let p = policy(PolicyAction::Allow, when(key, &["v"], &[]));
        assert!(
            chain_rbac([&p].into_iter(), ChainKind::Http)[0]
                .policies
                .is_empty(),
            "{key}"
        );
    }
}

fn path_of(p: &rbac::Permission) -> String {
    let Some(rbac::permission::Rule::OrRules(set)) = &p.rule else {
        panic!("OR: {p:?}")
    };
    match &set.rules[0].rule {
        Some(rbac::permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(m)),
        })) => string_of(m),
        Some(rbac::permission::Rule::UriTemplate(t)) => {
            assert_eq!(t.name, "uri-template");
            let any = t.typed_config.as_ref().unwrap();
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig"
            );
            let config =
                <UriTemplateMatchConfig as prost::Message>::decode(any.value.clone()).unwrap();
            format!("template {}", config.path_template)
        }
        other => panic!("{other:?}"),
    }
}

/// istiod's path generator: wildcards, and `{*}`/`{**}` templates through Envoy's URI
/// template matcher; what istiod's validation refuses is unsupported.
#[test]
fn paths_and_path_templates() {
    let supported = [
        ("/public/*", "/public/*"),
        ("*.html", "*.html"),
        ("/exact", "=/exact"),
        ("*", "~.+"),
        ("/api/{*}/items", "template /api/*/items"),
        ("/api/{**}", "template /api/**"),
        ("/api/{*}/x/{**}", "template /api/*/x/**"),
        // Literals may follow `{**}`; another operator may not.
        ("/api/{**}/x", "template /api/**/x"),
    ];
    for (path, want) in supported {
        let built = translate(
            PolicyAction::Allow,
            to(Operation {
                paths: strs(&[path]),
                ..Default::default()
            }),
            ChainKind::Http,
        )
        .unwrap();
        assert_eq!(path_of(&rules(&built)[0]), want, "{path}");
    }
    let refused = [
        "/api/{id}",
        "/a/{**}/{*}",
        "api/{*}",
        "/a//{*}",
        "/a/b*/{*}",
    ];
    for path in refused {
        let rule = to(Operation {
            paths: strs(&[path]),
            ..Default::default()
        });
        let p = policy(PolicyAction::Allow, rule.clone());
        assert!(
            chain_rbac([&p].into_iter(), ChainKind::Http)[0]
                .policies
                .is_empty(),
            "{path}"
        );
        // A DENY drops the path and denies more.
        let wider = translate(PolicyAction::Deny, rule, ChainKind::Http).unwrap();
        assert_eq!(rules(&wider), [any_permission()], "{path}");
    }
}

fn peer_regex(p: &rbac::Principal) -> String {
    let Some(rbac::principal::Identifier::OrIds(set)) = &p.identifier else {
        panic!("OR: {p:?}")
    };
    let Some(rbac::principal::Identifier::FilterState(f)) = &set.ids[0].identifier else {
        panic!("filter state")
    };
    assert_eq!(f.key, PEER_PRINCIPAL);
    let Some(filter_state_matcher::Matcher::StringMatch(m)) = &f.matcher else {
        panic!("string")
    };
    string_of(m)
}

/// istiod's source generators: `*` in namespaces and trust domains, its service-account
/// regex, and the `source.serviceAccount` and `source.trustDomain` conditions.
#[test]
fn identities_follow_istiods_generators() {
    let cases = [
        (
            Source {
                namespaces: strs(&["prod"]),
                ..Default::default()
            },
            "~.*/ns/prod/.*",
        ),
        (
            Source {
                namespaces: strs(&["prod-*"]),
                ..Default::default()
            },
            "~.*/ns/prod-.*/.*",
        ),
        (
            Source {
                namespaces: strs(&["a.b"]),
                ..Default::default()
            },
            "~.*/ns/a\\.b/.*",
        ),
        (
            Source {
                service_accounts: strs(&["web"]),
                ..Default::default()
            },
            "~spiffe://.+/ns/demo/(.+/|)sa/web(/.+)?",
        ),
        (
            Source {
                service_accounts: strs(&["other/web"]),
                ..Default::default()
            },
            "~spiffe://.+/ns/other/(.+/|)sa/web(/.+)?",
        ),
        (
            Source {
                trust_domains: strs(&["td"]),
                ..Default::default()
            },
            "spiffe://td/*",
        ),
        (
            Source {
                trust_domains: strs(&["*"]),
                ..Default::default()
            },
            "spiffe://*",
        ),
        (
            Source {
                trust_domains: strs(&["*.corp"]),
                ..Default::default()
            },
            "~spiffe://[^/]*\\.corp/.*",
        ),
    ];
    for (source, want) in cases {
        let built = translate(PolicyAction::Allow, from(source.clone()), ChainKind::Tcp).unwrap();
        assert_eq!(peer_regex(&ids(&built)[0]), want, "{source:?}");
    }
    let conditions = [
        (
            "source.serviceAccount",
            "web",
            "~spiffe://.+/ns/demo/(.+/|)sa/web(/.+)?",
        ),
        ("source.trustDomain", "td", "spiffe://td/*"),
    ];
    for (key, value, want) in conditions {
        let built = translate(
            PolicyAction::Allow,
            when(key, &[value], &[]),
            ChainKind::Tcp,
        )
        .unwrap();
        assert_eq!(peer_regex(&ids(&built)[0]), want, "{key}");
    }
}

/// The HTTP attributes and `experimental.envoy.filters.*` on a TCP chain, unparsable values
/// and unknown keys: an ALLOW rule is dropped, a DENY rule loses the condition.
#[test]
fn what_cannot_be_expressed_fails_closed() {
    let rules_of = [
        to(Operation {
            methods: strs(&["GET"]),
            ..Default::default()
        }),
        to(Operation {
            ports: strs(&["http"]),
            ..Default::default()
        }),
        from(Source {
            ip_blocks: strs(&["10.0.0.0/33"]),
            ..Default::default()
        }),
        from(Source {
            remote_ip_blocks: strs(&["10.0.0.1"]),
            ..Default::default()
        }),
        when("experimental.envoy.filters.a.b[c]", &["v"], &[]),
        when("destination.port", &["99999"], &[]),
        when("request.headers[x]", &["v"], &[]),
        when("unknown.key", &["v"], &[]),
    ];
    for rule in rules_of {
        let p = policy(PolicyAction::Allow, rule.clone());
        assert!(
            chain_rbac([&p].into_iter(), ChainKind::Tcp)[0]
                .policies
                .is_empty(),
            "{rule:?}"
        );
        let wider = translate(PolicyAction::Deny, rule.clone(), ChainKind::Tcp).unwrap();
        assert!(is_any_principal(&ids(&wider)), "{rule:?}");
        assert_eq!(rules(&wider), [any_permission()], "{rule:?}");
    }
}

/// The status checker (`discovery::convert::waypoint_authorization::unexpressed`) agrees with
/// this translator: an ALLOW rule is kept on a chain exactly when the checker finds nothing
/// that chain cannot express (HTTP attributes count on TCP chains only).
#[test]
fn the_status_checker_agrees_with_the_translation() {
    use crate::discovery::convert::waypoint_authorization::unexpressed;
    let rules = [
        when("source.ip", &["10.0.0.0/8"], &[]),
        when("source.ip", &["ten"], &[]),
        when("destination.port", &["80"], &["x"]),
        when("connection.sni", &["a.example.com"], &[]),
        when("remote.ip", &["1.2.3.4"], &[]),
        when("request.headers[x-a]", &["v"], &[]),
        when("request.headers[a:b]", &["v"], &[]),
        when("request.headers", &["v"], &[]),
        when("request.auth.claims[iss]", &["me"], &[]),
        when("request.auth.claims[]", &["me"], &[]),
        when("request.auth.principal", &["a/b"], &[]),
        when(
            "experimental.envoy.filters.network.mysql_proxy[db.table]",
            &["[t]"],
            &[],
        ),
        when("source.name", &["x"], &[]),
        to(Operation {
            ports: strs(&["80"]),
            ..Default::default()
        }),
        to(Operation {
            not_ports: strs(&["http"]),
            ..Default::default()
        }),
        to(Operation {
            paths: strs(&["/a/{*}"]),
            ..Default::default()
        }),
        to(Operation {
            paths: strs(&["/a/{**}/{*}"]),
            ..Default::default()
        }),
        to(Operation {
            methods: strs(&["GET"]),
            ..Default::default()
        }),
        from(Source {
            ip_blocks: strs(&["1.2.3.4/40"]),
            ..Default::default()
        }),
        from(Source {
            request_principals: strs(&["a/b"]),
            ..Default::default()
        }),
        from(Source {
            trust_domains: strs(&["td"]),
            ..Default::default()
        }),
    ];
    for rule in rules {
        let found = unexpressed(&policy(PolicyAction::Allow, rule.clone()));
        let never = !found.unsupported.is_empty() || !found.invalid.is_empty();
        let http = !never;
        let tcp = !never && found.http_only.is_empty();
        for (kind, kept) in [(ChainKind::Http, http), (ChainKind::Tcp, tcp)] {
            assert_eq!(
                translate(PolicyAction::Allow, rule.clone(), kind).is_some(),
                kept,
                "{kind:?} {rule:?} {found:?}"
            );
        }
    }
}
