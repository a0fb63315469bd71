//! Decoding tables: every field, the defaults, and errors that name the field.

use super::*;
use crate::kube::objects::parse_yaml;

fn yaml(text: &str) -> Value {
    let mut docs = parse_yaml(text).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

fn authz(text: &str) -> Result<AuthorizationPolicy, String> {
    decode_authorization_policy(&yaml(text))
}

fn peer(text: &str) -> Result<PeerAuthentication, String> {
    decode_peer_authentication(&yaml(text))
}

fn strs(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

#[test]
fn authorization_policy_every_field() {
    let got = authz(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: p
  namespace: ns1
  creationTimestamp: "2026-01-01T00:00:01Z"
  labels: {istio.io/rev: canary}
  annotations: {istio.io/dry-run: "true"}
spec:
  selector: {matchLabels: {app: a, version: 2}}
  action: DENY
  rules:
  - from:
    - source:
        principals: [p]
        notPrincipals: [np]
        requestPrincipals: [rp]
        notRequestPrincipals: [nrp]
        namespaces: [n]
        notNamespaces: [nn]
        serviceAccounts: [sa]
        notServiceAccounts: [nsa]
        ipBlocks: [1.2.3.4]
        notIpBlocks: [5.6.7.8/16]
        remoteIpBlocks: [9.9.9.9]
        notRemoteIpBlocks: [8.8.8.8]
        trustDomains: [td]
        notTrustDomains: [ntd]
    - {}
    to:
    - operation:
        hosts: [h]
        notHosts: [nh]
        ports: ["80", 8080]
        notPorts: ["90"]
        methods: [GET]
        notMethods: [PUT]
        paths: [/a]
        notPaths: [/b]
    - {operation: null}
    when:
    - {key: source.ip, values: [10.0.0.1], notValues: [10.0.0.2]}
    - {key: destination.port}
"#,
    )
    .unwrap();
    let want = AuthorizationPolicy {
        name: "p".into(),
        namespace: "ns1".into(),
        generation: 0,
        revision: Some("canary".into()),
        dry_run: true,
        selector: Some(
            [("app", "a"), ("version", "2")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        has_target_refs: false,
        target_refs: Vec::new(),
        action: PolicyAction::Deny,
        rules: vec![PolicyRule {
            from: vec![
                Source {
                    principals: strs(&["p"]),
                    not_principals: strs(&["np"]),
                    request_principals: strs(&["rp"]),
                    not_request_principals: strs(&["nrp"]),
                    namespaces: strs(&["n"]),
                    not_namespaces: strs(&["nn"]),
                    service_accounts: strs(&["sa"]),
                    not_service_accounts: strs(&["nsa"]),
                    ip_blocks: strs(&["1.2.3.4"]),
                    not_ip_blocks: strs(&["5.6.7.8/16"]),
                    remote_ip_blocks: strs(&["9.9.9.9"]),
                    not_remote_ip_blocks: strs(&["8.8.8.8"]),
                    trust_domains: strs(&["td"]),
                    not_trust_domains: strs(&["ntd"]),
                },
                Source::default(),
            ],
            to: vec![
                Operation {
                    hosts: strs(&["h"]),
                    not_hosts: strs(&["nh"]),
                    ports: strs(&["80", "8080"]),
                    not_ports: strs(&["90"]),
                    methods: strs(&["GET"]),
                    not_methods: strs(&["PUT"]),
                    paths: strs(&["/a"]),
                    not_paths: strs(&["/b"]),
                },
                Operation::default(),
            ],
            when: vec![
                Condition {
                    key: "source.ip".into(),
                    values: strs(&["10.0.0.1"]),
                    not_values: strs(&["10.0.0.2"]),
                },
                Condition {
                    key: "destination.port".into(),
                    ..Default::default()
                },
            ],
        }],
        creation: Some("2026-01-01T00:00:01Z".into()),
    };
    assert_eq!(got, want);
}

#[test]
fn authorization_policy_defaults() {
    let got = authz(
        "{apiVersion: security.istio.io/v1beta1, kind: AuthorizationPolicy, metadata: {name: p}}",
    )
    .unwrap();
    assert_eq!(
        got,
        AuthorizationPolicy {
            name: "p".into(),
            namespace: "default".into(),
            ..Default::default()
        }
    );
    let got = authz("{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p, namespace: x}, spec: null}")
        .unwrap();
    assert_eq!(got.action, PolicyAction::Allow);
    assert!(got.rules.is_empty());
    let got = authz("{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p}, spec: {rules: [{}]}}")
        .unwrap();
    assert_eq!(got.rules, vec![PolicyRule::default()]);
}

#[test]
fn selector_presence_is_kept() {
    let selector = |spec: &str| {
        authz(&format!(
            "{{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {{name: p}}, spec: {spec}}}"
        ))
        .unwrap()
        .selector
    };
    assert_eq!(selector("{}"), None);
    assert_eq!(selector("{selector: null}"), None);
    assert_eq!(selector("{selector: {}}"), Some(Labels::new()));
    assert_eq!(
        selector("{selector: {matchLabels: {}}}"),
        Some(Labels::new())
    );
    assert_eq!(
        selector("{selector: {matchLabels: null}}"),
        Some(Labels::new())
    );
}

#[test]
fn target_refs_and_dry_run_and_actions() {
    let decode = |meta: &str, spec: &str| {
        authz(&format!(
            "{{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {{name: p, {meta}}}, spec: {spec}}}"
        ))
        .unwrap()
    };
    assert!(decode("", "{targetRef: {kind: Gateway, name: w}}").has_target_refs);
    assert!(decode("", "{targetRefs: [{kind: Service, name: s}]}").has_target_refs);
    assert!(!decode("", "{targetRefs: []}").has_target_refs);
    assert!(!decode("", "{targetRef: null}").has_target_refs);
    // istiod's GetTargetRefs: targetRef when set, else targetRefs.
    let both = decode(
        "",
        "{targetRef: {kind: Gateway, group: gateway.networking.k8s.io, name: w}, \
         targetRefs: [{kind: Service, name: s, namespace: other}]}",
    );
    assert_eq!(
        both.target_refs,
        [PolicyTargetRef {
            group: "gateway.networking.k8s.io".into(),
            kind: "Gateway".into(),
            name: "w".into(),
            namespace: String::new(),
        }]
    );
    let list = decode(
        "",
        "{targetRefs: [{kind: Service, name: s, namespace: other}]}",
    );
    assert_eq!(list.target_refs[0].namespace, "other");
    assert_eq!(list.target_refs[0].kind, "Service");

    for (value, want) in [
        ("\"true\"", true),
        ("\"True\"", true),
        ("\"1\"", true),
        ("\"t\"", true),
        ("\"yes\"", false),
        ("\"false\"", false),
        ("\"\"", false),
    ] {
        let got = decode(&format!("annotations: {{istio.io/dry-run: {value}}}"), "{}");
        assert_eq!(got.dry_run, want, "{value}");
    }

    for (action, want) in [
        ("ALLOW", PolicyAction::Allow),
        ("DENY", PolicyAction::Deny),
        ("AUDIT", PolicyAction::Audit),
        ("CUSTOM", PolicyAction::Custom),
        ("null", PolicyAction::Allow),
        ("1", PolicyAction::Deny),
        ("deny", PolicyAction::Unknown("deny".into())),
        ("DENNY", PolicyAction::Unknown("DENNY".into())),
        ("9", PolicyAction::Unknown("9".into())),
    ] {
        assert_eq!(
            decode("", &format!("{{action: {action}}}")).action,
            want,
            "{action}"
        );
    }
}

#[test]
fn authorization_policy_errors_name_the_field() {
    let err = |text: &str| authz(text).unwrap_err();
    assert_eq!(
        err(
            "{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {namespace: x}}"
        ),
        "metadata.name is missing"
    );
    assert!(
        err("{apiVersion: networking.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p}}")
            .starts_with("apiVersion:")
    );
    assert!(
        err("{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {name: p}}")
            .starts_with("kind:")
    );
    let e = err(
        "{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p}, spec: {rules: [{from: [{source: {principals: [{a: b}]}}]}]}}",
    );
    assert!(
        e.starts_with("spec.rules[0].from[0].source.principals"),
        "{e}"
    );
    let e = err(
        "{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p}, spec: {rules: {}}}",
    );
    assert!(e.starts_with("spec.rules"), "{e}");
    let e = err(
        "{apiVersion: security.istio.io/v1, kind: AuthorizationPolicy, metadata: {name: p}, spec: {action: [DENY]}}",
    );
    assert!(e.starts_with("spec.action"), "{e}");
}

#[test]
fn peer_authentication_fields_and_defaults() {
    let got = peer(
        r#"
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: pa, namespace: foo, creationTimestamp: "2026-01-01T00:00:02Z", labels: {istio.io/rev: r1}}
spec:
  selector: {matchLabels: {app: a}}
  mtls: {mode: PERMISSIVE}
  portLevelMtls:
    "9090": {mode: STRICT}
    "8080": {mode: DISABLE}
    "7070": {}
    "6060": null
"#,
    )
    .unwrap();
    let want = PeerAuthentication {
        name: "pa".into(),
        namespace: "foo".into(),
        revision: Some("r1".into()),
        selector: Some([("app".to_string(), "a".to_string())].into()),
        mode: MtlsMode::Permissive,
        port_level: [
            (9090, MtlsMode::Strict),
            (8080, MtlsMode::Disable),
            (7070, MtlsMode::Unset),
            (6060, MtlsMode::Unset),
        ]
        .into(),
        creation: Some("2026-01-01T00:00:02Z".into()),
    };
    assert_eq!(got, want);

    let got = peer("{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {name: pa}, spec: {}}").unwrap();
    assert_eq!(
        got,
        PeerAuthentication {
            name: "pa".into(),
            namespace: "default".into(),
            ..Default::default()
        }
    );
    for (mode, want) in [
        ("UNSET", MtlsMode::Unset),
        ("STRICT", MtlsMode::Strict),
        ("null", MtlsMode::Unset),
        ("3", MtlsMode::Strict),
    ] {
        let got = peer(&format!(
            "{{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {{name: pa}}, spec: {{mtls: {{mode: {mode}}}}}}}"
        ))
        .unwrap();
        assert_eq!(got.mode, want, "{mode}");
    }
    let got = peer("{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {name: pa}, spec: {selector: {}, mtls: null}}").unwrap();
    assert_eq!(
        (got.selector, got.mode),
        (Some(Labels::new()), MtlsMode::Unset)
    );
}

#[test]
fn peer_authentication_errors_name_the_field() {
    let err = |spec: &str| {
        peer(&format!(
            "{{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {{name: pa}}, spec: {spec}}}"
        ))
        .unwrap_err()
    };
    assert_eq!(
        err("{portLevelMtls: {http: {mode: STRICT}}}"),
        "spec.portLevelMtls[\"http\"]: not a port number"
    );
    assert_eq!(
        err("{portLevelMtls: {\"-1\": {mode: STRICT}}}"),
        "spec.portLevelMtls[\"-1\"]: not a port number"
    );
    assert_eq!(
        err("{portLevelMtls: {\"99999999999\": {mode: STRICT}}}"),
        "spec.portLevelMtls[\"99999999999\"]: not a port number"
    );
    assert_eq!(
        err("{mtls: {mode: STRICTT}}"),
        "spec.mtls.mode: unknown mode \"STRICTT\" (expected UNSET, DISABLE, PERMISSIVE or STRICT)"
    );
    assert!(
        err("{portLevelMtls: {\"80\": {mode: strict}}}")
            .starts_with("spec.portLevelMtls[\"80\"].mode: unknown mode")
    );
    let e = err("{selector: {matchLabels: [a]}}");
    assert!(e.starts_with("spec.selector.matchLabels"), "{e}");
    assert!(
        peer("{apiVersion: security.istio.io/v1, kind: PeerAuthentication, metadata: {}}")
            .unwrap_err()
            .contains("metadata.name")
    );
}

fn request_authn(text: &str) -> Result<RequestAuthentication, String> {
    decode_request_authentication(&yaml(text))
}

#[test]
fn request_authentication_every_field() {
    let got = request_authn(
        r#"
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata:
  name: jwt
  namespace: ns1
  creationTimestamp: "2026-01-01T00:00:01Z"
  labels: {istio.io/rev: canary}
spec:
  targetRefs: [{kind: Service, group: "", name: web}, {kind: Gateway, group: gateway.networking.k8s.io, name: wp}]
  jwtRules:
  - issuer: https://issuer.example
    audiences: [a1, a2]
    jwksUri: https://issuer.example/keys
    jwks: '{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}'
    fromHeaders: [{name: x-jwt, prefix: "Bearer "}, {name: x-other}]
    fromParams: [token]
    fromCookies: [session]
    outputPayloadToHeader: x-payload
    forwardOriginalToken: true
    outputClaimToHeaders: [{header: x-sub, claim: sub}]
    timeout: 1.5s
    spaceDelimitedClaims: [roles]
  - issuer: other
"#,
    )
    .unwrap();
    let target = |kind: &str, group: &str, name: &str| PolicyTargetRef {
        kind: kind.into(),
        group: group.into(),
        name: name.into(),
        namespace: String::new(),
    };
    let want = RequestAuthentication {
        name: "jwt".into(),
        namespace: "ns1".into(),
        revision: Some("canary".into()),
        selector: None,
        target_refs: vec![
            target("Service", "", "web"),
            target("Gateway", "gateway.networking.k8s.io", "wp"),
        ],
        jwt_rules: vec![
            JwtRule {
                issuer: "https://issuer.example".into(),
                audiences: strs(&["a1", "a2"]),
                jwks_uri: "https://issuer.example/keys".into(),
                jwks: r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#.into(),
                from_headers: vec![
                    JwtHeader {
                        name: "x-jwt".into(),
                        prefix: "Bearer ".into(),
                    },
                    JwtHeader {
                        name: "x-other".into(),
                        prefix: String::new(),
                    },
                ],
                from_params: strs(&["token"]),
                from_cookies: strs(&["session"]),
                output_payload_to_header: "x-payload".into(),
                forward_original_token: true,
                output_claim_to_headers: vec![ClaimToHeader {
                    header: "x-sub".into(),
                    claim: "sub".into(),
                }],
                timeout_ms: Some(1500),
                space_delimited_claims: strs(&["roles"]),
            },
            JwtRule {
                issuer: "other".into(),
                ..Default::default()
            },
        ],
        creation: Some("2026-01-01T00:00:01Z".into()),
    };
    assert_eq!(got, want);
}

#[test]
fn request_authentication_defaults_and_target_ref() {
    let got = request_authn(
        r#"
apiVersion: security.istio.io/v1beta1
kind: RequestAuthentication
metadata: {name: jwt}
spec:
  selector: {matchLabels: {app: a}}
  targetRef: {kind: Service, name: web}
  targetRefs: [{kind: Service, name: ignored}]
  jwtRules: [{issuer: i, audiences: null, fromHeaders: null}]
"#,
    )
    .unwrap();
    assert_eq!(got.namespace, "default");
    assert_eq!(got.target_refs.len(), 1);
    assert_eq!(got.target_refs[0].name, "web");
    assert!(got.selector.is_some());
    assert_eq!(
        got.jwt_rules,
        vec![JwtRule {
            issuer: "i".into(),
            ..Default::default()
        }]
    );
    let empty = request_authn(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: e}\n",
    )
    .unwrap();
    assert!(empty.jwt_rules.is_empty() && empty.target_refs.is_empty());
}

/// What Istio's validation refuses, and what Envoy would refuse inside a listener, fails the
/// object with the field's path; nothing of it reaches a waypoint.
#[test]
fn request_authentication_errors_name_the_field() {
    let cases = [
        ("{}", "spec.jwtRules[0]: issuer or jwksUri must be set"),
        (
            "{issuer: i, audiences: ['']}",
            "spec.jwtRules[0].audiences[0]: empty",
        ),
        (
            "{issuer: i, jwksUri: 'ftp://x/keys'}",
            "spec.jwtRules[0].jwksUri",
        ),
        (
            "{issuer: i, jwksUri: 'https:///keys'}",
            "spec.jwtRules[0].jwksUri",
        ),
        (
            "{issuer: i, fromHeaders: [{prefix: x}]}",
            "spec.jwtRules[0].fromHeaders[0].name",
        ),
        (
            "{issuer: i, fromHeaders: [{name: 'a:b'}]}",
            "spec.jwtRules[0].fromHeaders[0].name",
        ),
        (
            "{issuer: i, fromParams: ['']}",
            "spec.jwtRules[0].fromParams[0]: empty",
        ),
        (
            "{issuer: i, fromCookies: ['']}",
            "spec.jwtRules[0].fromCookies[0]: empty",
        ),
        (
            "{issuer: i, outputPayloadToHeader: \"a\\nb\"}",
            "spec.jwtRules[0].outputPayloadToHeader",
        ),
        (
            "{issuer: i, outputClaimToHeaders: [{header: x}]}",
            "spec.jwtRules[0].outputClaimToHeaders[0]",
        ),
        (
            "{issuer: i, jwks: 'not json'}",
            "spec.jwtRules[0].jwks: not JSON",
        ),
        (
            "{issuer: i, jwks: '{\"keys\": []}'}",
            "spec.jwtRules[0].jwks: no keys",
        ),
        ("{issuer: i, timeout: 5}", "spec.jwtRules[0].timeout"),
        ("{issuer: i, timeout: 5m}", "spec.jwtRules[0].timeout"),
        (
            "{issuer: i, forwardOriginalToken: yes}",
            "spec.jwtRules[0].forwardOriginalToken",
        ),
    ];
    for (rule, field) in cases {
        let text = format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: r}}\nspec:\n  jwtRules: [{{issuer: ok}}, {rule}]\n"
        )
        .replace("jwtRules[0]", "jwtRules[1]");
        let error = request_authn(&text).expect_err(rule);
        let field = field.replace("jwtRules[0]", "jwtRules[1]");
        assert!(error.contains(&field), "{rule}: {error}");
    }
    // Only jwksUri, no issuer: valid (istiod fetches the keys; any issuer is accepted).
    let only_uri = request_authn(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: r}\nspec: {jwtRules: [{jwksUri: 'http://keys:8080/jwks'}]}\n",
    )
    .unwrap();
    assert_eq!(only_uri.jwt_rules[0].jwks_uri, "http://keys:8080/jwks");
    assert!(
        request_authn(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {}\n"
        )
        .unwrap_err()
        .contains("metadata.name")
    );
}

#[test]
fn a_request_authentication_is_decoded_from_manifests_and_watches_alike() {
    let value = yaml(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: r, namespace: n}\nspec: {jwtRules: [{issuer: i}]}\n",
    );
    let from_manifest = match crate::kube::objects::decode(value.clone()).remove(0) {
        crate::kube::objects::Decoded::Object(o) => o,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        from_manifest,
        crate::discovery::model::Object::RequestAuthentication(_)
    ));
    let mut json = value;
    json.as_object_mut().unwrap().remove("apiVersion");
    json.as_object_mut().unwrap().remove("kind");
    let from_watch = crate::kube::objects::decode_json(
        "security.istio.io/v1",
        "RequestAuthentication",
        &json.to_string(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(from_manifest, from_watch);
}
