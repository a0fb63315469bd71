//! The `jwt_authn` config against istiod's `convertToEnvoyJwtConfig`, where keys come from,
//! the JWT principals against istiod's generators, and how RequestAuthentications attach to a
//! waypoint's chains and rebuild its config.

use std::sync::Arc;

use prost::Message;

use super::*;
use crate::discovery::model::{Jwks, JwtHeader, PolicyTargetRef};
use crate::discovery::{Event, Object};
use crate::pb::envoy::config::listener::v3::{Listener, filter};
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use crate::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use crate::waypoint::tests::{
    REVIEWS_HTTP, WORKED_EXAMPLE, config_of, index, listener, objects, proxy,
};
use crate::waypoint::{Rebuild, WaypointSettings};

/// A key set Envoy accepts: one P-256 key with key id `kid`.
fn key_set(kid: &str) -> String {
    format!(
        r#"{{"keys":[{{"kty":"EC","crv":"P-256","kid":"{kid}","x":"VXVkC_DOoEmNESjUIriZ9f_SOSC2vV0HcrpWNry3NZE","y":"ZbaMLwmT3xfYe8ZX1ycNQGgFY7mag-nYdzDizVbSzR0"}}]}}"#
    )
}

fn rule(issuer: &str) -> JwtRule {
    JwtRule {
        issuer: issuer.into(),
        jwks: key_set(issuer),
        ..Default::default()
    }
}

fn authentication(name: &str, rules: Vec<JwtRule>) -> RequestAuthentication {
    RequestAuthentication {
        name: name.into(),
        namespace: "default".into(),
        target_refs: vec![PolicyTargetRef {
            kind: "Service".into(),
            name: "reviews".into(),
            ..Default::default()
        }],
        jwt_rules: rules,
        ..Default::default()
    }
}

fn provider_requirement(name: &str) -> JwtRequirement {
    requirement(RequiresType::ProviderName(name.into()))
}

fn token_if_present(name: &str) -> JwtRequirement {
    requires_any(vec![
        provider_requirement(name),
        requirement(RequiresType::AllowMissing(Empty {})),
    ])
}

fn inline(provider: &JwtProvider) -> &str {
    match &provider.jwks_source_specifier {
        Some(jwt::jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
        })) => text,
        other => panic!("not inline: {other:?}"),
    }
}

fn requires(config: &JwtAuthentication) -> &JwtRequirement {
    match &config.rules[..] {
        [
            RequirementRule {
                r#match: Some(m),
                requirement_type: Some(jwt::requirement_rule::RequirementType::Requires(r)),
            },
        ] => {
            assert_eq!(
                m.path_specifier,
                Some(route_match::PathSpecifier::Prefix("/".into()))
            );
            r
        }
        other => panic!("one rule on every path: {other:?}"),
    }
}

#[test]
fn one_rule_is_istiods_shape() {
    let ra = authentication(
        "jwt",
        vec![JwtRule {
            audiences: vec!["web".into()],
            from_headers: vec![JwtHeader {
                name: "x-token".into(),
                prefix: "Bearer ".into(),
            }],
            forward_original_token: true,
            space_delimited_claims: vec!["roles".into(), "scope".into()],
            ..rule("https://issuer.example")
        }],
    );
    let config = jwt_authn([&ra].into_iter(), &Snapshot::default()).expect("a filter");
    assert!(config.bypass_cors_preflight);
    assert_eq!(requires(&config), &token_if_present("origins-0"));
    let names: Vec<&str> = config.providers.keys().map(String::as_str).collect();
    assert_eq!(names, ["origins-0"]);
    let provider = &config.providers["origins-0"];
    assert_eq!(provider.issuer, "https://issuer.example");
    assert_eq!(provider.audiences, ["web"]);
    assert_eq!(provider.payload_in_metadata, "payload");
    assert!(provider.forward && provider.clear_route_cache);
    assert_eq!(provider.from_headers[0].name, "x-token");
    assert_eq!(provider.from_headers[0].value_prefix, "Bearer ");
    assert_eq!(
        provider
            .normalize_payload_in_metadata
            .as_ref()
            .unwrap()
            .space_delimited_claims,
        ["permission", "roles", "scope"]
    );
    assert_eq!(inline(provider), key_set("https://issuer.example"));
    // Nothing attached, or only rule-less policies: no filter.
    assert!(jwt_authn(std::iter::empty(), &Snapshot::default()).is_none());
    let empty = authentication("empty", Vec::new());
    assert!(jwt_authn([&empty].into_iter(), &Snapshot::default()).is_none());
}

/// Several providers: a token valid for any one passes, and so does a request where every
/// provider either verifies or finds no token in its own location; an invalid token fails.
#[test]
fn several_rules_are_sorted_by_issuer_and_each_checks_its_own_token() {
    let older = authentication("older", vec![rule("z-issuer")]);
    let newer = authentication("newer", vec![rule("a-issuer"), rule("m-issuer")]);
    let config = jwt_authn([&older, &newer].into_iter(), &Snapshot::default()).unwrap();
    let issuers: Vec<(&str, &str)> = config
        .providers
        .iter()
        .map(|(name, p)| (name.as_str(), p.issuer.as_str()))
        .collect();
    assert_eq!(
        issuers,
        [
            ("origins-0", "a-issuer"),
            ("origins-1", "m-issuer"),
            ("origins-2", "z-issuer")
        ]
    );
    let want = requires_any(vec![
        provider_requirement("origins-0"),
        provider_requirement("origins-1"),
        provider_requirement("origins-2"),
        requirement(RequiresType::RequiresAll(jwt::JwtRequirementAndList {
            requirements: vec![
                token_if_present("origins-0"),
                token_if_present("origins-1"),
                token_if_present("origins-2"),
            ],
        })),
    ]);
    assert_eq!(requires(&config), &want);
}

#[test]
fn keys_are_inline_fetched_or_a_key_nobody_holds() {
    let by_uri = JwtRule {
        issuer: "i".into(),
        jwks_uri: "https://keys.example/jwks".into(),
        ..Default::default()
    };
    let by_discovery = JwtRule {
        issuer: "https://issuer.example/".into(),
        ..Default::default()
    };
    assert_eq!(
        by_discovery.jwks_source().unwrap().key(),
        "openid:https://issuer.example/.well-known/openid-configuration"
    );
    let ra = authentication("jwt", vec![by_uri.clone(), by_discovery.clone()]);
    // Not fetched yet: both fail closed.
    let config = jwt_authn([&ra].into_iter(), &Snapshot::default()).unwrap();
    for provider in config.providers.values() {
        assert_eq!(inline(provider), PUBLIC_ONLY_JWKS);
    }
    // Fetched: the fetched text, as it came.
    let snapshot = Snapshot {
        jwks: vec![
            Arc::new(Jwks {
                name: "https://keys.example/jwks".into(),
                keys: key_set("uri"),
            }),
            Arc::new(Jwks {
                name: "openid:https://issuer.example/.well-known/openid-configuration".into(),
                keys: key_set("discovered"),
            }),
        ]
        .into(),
        ..Default::default()
    };
    let config = jwt_authn([&ra].into_iter(), &snapshot).unwrap();
    let keys: Vec<&str> = config.providers.values().map(inline).collect();
    // Sorted by issuer: `https://issuer.example/` (discovered), then `i` (by URI).
    assert_eq!(keys, [key_set("discovered"), key_set("uri")]);
    // Inline keys win over a URI.
    let both = JwtRule {
        jwks: key_set("inline"),
        ..by_uri
    };
    let ra = authentication("jwt", vec![both]);
    let config = jwt_authn([&ra].into_iter(), &snapshot).unwrap();
    assert_eq!(inline(&config.providers["origins-0"]), key_set("inline"));
}

/// A key set Envoy would refuse never reaches a listener (it would refuse the whole of it):
/// the provider fails closed instead.
#[test]
fn a_key_set_envoy_would_refuse_fails_closed() {
    for bad in [
        "not json",
        r#"{"keys":[]}"#,
        r#"{"keys":[{"kty":"RSA","alg":"RSA-OAEP","n":"AQAB","e":"AQAB"}]}"#,
    ] {
        let refused = JwtRule {
            jwks: bad.into(),
            ..rule("i")
        };
        let ra = authentication("jwt", vec![refused]);
        let config = jwt_authn([&ra].into_iter(), &Snapshot::default()).unwrap();
        assert_eq!(
            inline(&config.providers["origins-0"]),
            PUBLIC_ONLY_JWKS,
            "{bad}"
        );
    }
}

#[test]
fn the_public_only_key_is_a_jwks_of_one_rsa_public_key() {
    let value: serde_json::Value = serde_json::from_str(PUBLIC_ONLY_JWKS).unwrap();
    let keys = value["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["kty"], "RSA");
    assert!(keys[0].get("d").is_none(), "no private part");
    let n = keys[0]["n"].as_str().unwrap();
    // A 2048-bit modulus, base64url without padding.
    assert_eq!(n.len(), 342);
    assert_eq!(check_key_set(PUBLIC_ONLY_JWKS), Ok(1));
}

/// `(iss, sub)` string matchers of a request-principal principal.
fn iss_sub(principal: &rbac::Principal) -> (String, String) {
    let Some(rbac::principal::Identifier::AndIds(set)) = &principal.identifier else {
        panic!("AND of iss and sub: {principal:?}")
    };
    let show = |p: &rbac::Principal, claim: &str| {
        let Some(rbac::principal::Identifier::Metadata(m)) = &p.identifier else {
            panic!("metadata: {p:?}")
        };
        assert_eq!(m.filter, JWT_AUTHN);
        let path: Vec<_> = m.path.iter().map(|s| s.segment.clone()).collect();
        assert_eq!(path, [Some(key(PAYLOAD)), Some(key(claim))]);
        let Some(value_matcher::MatchPattern::StringMatch(s)) =
            m.value.as_ref().and_then(|v| v.match_pattern.clone())
        else {
            panic!("a string: {m:?}")
        };
        match s.match_pattern {
            Some(MatchPattern::Exact(v)) => format!("={v}"),
            Some(MatchPattern::Prefix(v)) => format!("{v}*"),
            Some(MatchPattern::Suffix(v)) => format!("*{v}"),
            Some(MatchPattern::SafeRegex(r)) => format!("~{}", r.regex),
            other => panic!("{other:?}"),
        }
    };
    (show(&set.ids[0], "iss"), show(&set.ids[1], "sub"))
}

fn key(k: &str) -> metadata_matcher::path_segment::Segment {
    metadata_matcher::path_segment::Segment::Key(k.into())
}

/// istiod's `requestPrincipalGenerator`, value by value.
#[test]
fn request_principals_split_at_the_last_slash_with_istiods_wildcards() {
    let cases = [
        (
            "https://issuer.example/alice",
            ("=https://issuer.example", "=alice"),
        ),
        ("*", ("~.+", "~.+")),
        ("*/alice", ("~.+", "=alice")),
        ("*.example/alice", ("*.example", "=alice")),
        ("*alice", ("~.+", "*alice")),
        (
            "https://issuer.example/*",
            ("=https://issuer.example", "~.+"),
        ),
        (
            "https://issuer.example/al*",
            ("=https://issuer.example", "al*"),
        ),
        ("issuer*", ("issuer*", "~.+")),
        // The last `/` splits, even inside a scheme (as istiod splits it).
        ("https://issuer*", ("=https:/", "issuer*")),
        ("no-slash", ("=no-slash", "=")),
    ];
    for (value, (iss, sub)) in cases {
        let got = iss_sub(&request_principals(&[value.to_string()]));
        assert_eq!(got, (iss.to_string(), sub.to_string()), "{value}");
    }
    // Several values: any of them.
    let two = request_principals(&["a/b".to_string(), "c/d".to_string()]);
    let Some(rbac::principal::Identifier::OrIds(set)) = two.identifier else {
        panic!("OR")
    };
    assert_eq!(set.ids.len(), 2);
}

/// istiod's claim matcher with extended JWT (`MetadataListValueMatcher(…, true)`): the claim
/// equals a value, or is a list with one of them.
#[test]
fn a_claim_matches_as_a_string_or_as_a_list_item() {
    let principal = claim_principal(&["groups", "team"], &["admins".into(), "ops*".into()]);
    let Some(rbac::principal::Identifier::Metadata(m)) = principal.identifier else {
        panic!("metadata")
    };
    assert_eq!(m.filter, JWT_AUTHN);
    let path: Vec<_> = m.path.iter().filter_map(|s| s.segment.clone()).collect();
    assert_eq!(path, [key("payload"), key("groups"), key("team")]);
    let values = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: vec![
                string_value(exact("admins")),
                string_value(prefix_match("ops")),
            ],
        })),
    };
    let in_list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(values.clone()))),
            },
        ))),
    };
    assert_eq!(m.value, Some(or_values(vec![in_list, values])));
    // One value: no OR around it.
    let one = claim_principal(&["aud"], &["web".into()]);
    let Some(rbac::principal::Identifier::Metadata(m)) = one.identifier else {
        panic!("metadata")
    };
    let Some(value_matcher::MatchPattern::OrMatch(or)) = m.value.unwrap().match_pattern else {
        panic!("list or string")
    };
    assert_eq!(or.value_matchers[1], string_value(exact("web")));
}

/// istiod's `extractNameInNestedBrackets`, and names Envoy would refuse.
#[test]
fn claim_names_are_read_as_istiod_reads_them() {
    let cases: [(&str, Option<&[&str]>); 9] = [
        ("[groups]", Some(&["groups"])),
        ("[a][b]", Some(&["a", "b"])),
        ("[a.b]", Some(&["a.b"])),
        ("[a[b]]", Some(&["a[b]"])),
        ("[a]b", None),
        ("groups", None),
        ("[]", None),
        ("[a][]", None),
        ("", None),
    ];
    for (text, want) in cases {
        assert_eq!(claim_names(text).as_deref(), want, "{text:?}");
    }
}

/// The HTTP filters of `chain` in `main_internal`.
fn http_filters(main: &Listener, chain: &str) -> Vec<HttpFilter> {
    let chain = main
        .filter_chains
        .iter()
        .find(|c| c.name == chain)
        .unwrap_or_else(|| panic!("no chain {chain}"));
    let hcm = chain
        .filters
        .iter()
        .find(|f| f.name == "envoy.filters.network.http_connection_manager")
        .expect("an HCM");
    let Some(filter::ConfigType::TypedConfig(any)) = &hcm.config_type else {
        panic!("typed")
    };
    HttpConnectionManager::decode(any.value.clone())
        .unwrap()
        .http_filters
}

fn filter_names(filters: &[HttpFilter]) -> Vec<&str> {
    filters.iter().map(|f| f.name.as_str()).collect()
}

fn jwt_config(filter: &HttpFilter) -> JwtAuthentication {
    let Some(http_filter::ConfigType::TypedConfig(any)) = &filter.config_type else {
        panic!("typed")
    };
    assert_eq!(
        any.type_url,
        "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"
    );
    JwtAuthentication::decode(any.value.clone()).unwrap()
}

const RA_ON_REVIEWS: &str = r#"
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: default}
spec:
  targetRefs: [{kind: Service, group: "", name: reviews}]
  jwtRules: [{issuer: https://issuer.example, jwksUri: https://issuer.example/jwks}]
"#;

/// Attached by istiod's rules (a Service's chains, or the whole waypoint), placed before
/// RBAC; a RequestAuthentication without `targetRefs` is a sidecar's.
#[test]
fn a_request_authentication_attaches_as_a_policy_does_and_runs_before_rbac() {
    let snapshot = index(&format!("{WORKED_EXAMPLE}---{RA_ON_REVIEWS}")).snapshot();
    let (_, config) = config_of(&snapshot, &proxy());
    let main = listener(&config, "main_internal");
    let filters = http_filters(&main, REVIEWS_HTTP);
    assert_eq!(
        filter_names(&filters)[..3],
        [
            "envoy.filters.http.jwt_authn",
            "envoy.filters.http.rbac",
            "envoy.filters.http.grpc_stats"
        ]
    );
    let jwt = jwt_config(&filters[0]);
    assert_eq!(jwt.providers["origins-0"].issuer, "https://issuer.example");
    // The direct chains serve the waypoint's own policies only.
    let direct = http_filters(&main, "direct-http");
    assert_eq!(filter_names(&direct), ["envoy.filters.http.router"]);

    let cases = [
        // On the waypoint's Gateway: every HTTP chain.
        (
            "targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: waypoint}]",
            true,
            true,
        ),
        // Another namespace's policy on reviews: not attached.
        (
            "targetRefs: [{kind: Service, group: \"\", name: reviews, namespace: other}]",
            false,
            false,
        ),
        // A selector: a sidecar's, never a waypoint's.
        ("selector: {matchLabels: {app: reviews}}", false, false),
        // A GatewayClass outside the root namespace.
        (
            "targetRefs: [{kind: GatewayClass, group: gateway.networking.k8s.io, name: istio-waypoint}]",
            false,
            false,
        ),
    ];
    for (target, on_service, on_direct) in cases {
        let ra = RA_ON_REVIEWS.replace(
            r#"targetRefs: [{kind: Service, group: "", name: reviews}]"#,
            target,
        );
        let snapshot = index(&format!("{WORKED_EXAMPLE}---{ra}")).snapshot();
        let (_, config) = config_of(&snapshot, &proxy());
        let main = listener(&config, "main_internal");
        let has_jwt = |chain: &str| filter_names(&http_filters(&main, chain))[0] == JWT_AUTHN;
        assert_eq!(has_jwt(REVIEWS_HTTP), on_service, "{target}");
        assert_eq!(has_jwt("direct-http"), on_direct, "{target}");
    }
}

/// A RequestAuthentication or a fetched key set rebuilds the config; the fetched keys replace
/// the key nobody holds.
#[test]
fn an_authentication_or_a_key_set_change_rebuilds_the_config() {
    let mut index = index(WORKED_EXAMPLE);
    let before = index.snapshot();
    let proxy = proxy();
    let (id, config) = config_of(&before, &proxy);
    for object in objects(RA_ON_REVIEWS) {
        index.handle(Event::Apply(object));
    }
    let with_ra = index.snapshot();
    assert_eq!(config.rebuild_needed(&id, &with_ra), Rebuild::Everything);
    let settings = WaypointSettings::default();
    let next = config.update(&id, &with_ra, &settings);
    let keys = |config: &crate::waypoint::WaypointConfig| {
        let main = listener(config, "main_internal");
        let jwt = jwt_config(&http_filters(&main, REVIEWS_HTTP)[0]);
        inline(&jwt.providers["origins-0"]).to_string()
    };
    assert_eq!(keys(&next), PUBLIC_ONLY_JWKS);

    index.handle(Event::Apply(Object::Jwks(Jwks {
        name: "https://issuer.example/jwks".into(),
        keys: key_set("k1"),
    })));
    let fetched = index.snapshot();
    assert_eq!(next.rebuild_needed(&id, &fetched), Rebuild::Everything);
    let updated = next.update(&id, &fetched, &settings);
    assert_eq!(keys(&updated), key_set("k1"));
    // Only main_internal changed.
    for (name, resource) in &updated.listeners {
        assert_eq!(
            resource.version == next.listeners[name].version,
            name.as_str() != "main_internal",
            "{name}"
        );
    }
    // The same keys again: nothing to publish, nothing to rebuild.
    index.handle(Event::Apply(Object::Jwks(Jwks {
        name: "https://issuer.example/jwks".into(),
        keys: key_set("k1"),
    })));
    assert!(!index.has_unpublished());
}
