//! Decoding tables: every field, the CRDs' defaults, and errors that name the field.

use super::*;
use crate::kube::objects::{Decoded, decode as decode_any, parse_yaml};

fn route(text: &str) -> Result<Route, String> {
    let mut docs = parse_yaml(text).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    match decode_any(docs.remove(0)).pop() {
        Some(Decoded::Object(Object::HttpRoute(r) | Object::GrpcRoute(r))) => Ok(r),
        Some(Decoded::Invalid(e)) => Err(e.reason),
        other => panic!("not a route: {other:?}"),
    }
}

#[test]
fn http_route_every_field() {
    let got = route(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: ns1, generation: 3, creationTimestamp: "2026-01-01T00:00:01Z"}
spec:
  parentRefs:
  - {group: "", kind: Service, name: web, port: 8080}
  - {name: waypoint, sectionName: mesh}
  hostnames: [web.example]
  rules:
  - name: first
    matches:
    - path: {type: Exact, value: /a}
      headers: [{name: x-v, value: "2"}, {type: RegularExpression, name: x-r, value: "a.*"}]
      queryParams: [{name: q, value: "1"}]
      method: POST
    - path: {type: RegularExpression, value: "/r/[0-9]+"}
    - headers: [{name: x-only, value: y}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Set, value: s}, {name: x-set, value: ignored}]
        add: [{name: x-add, value: a}]
        remove: [x-gone]
    - type: ResponseHeaderModifier
      responseHeaderModifier: {add: [{name: x-resp, value: r}]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 80}, fraction: {numerator: 1, denominator: 4}}
    backendRefs:
    - {name: web-v1, port: 8080, weight: 90}
    - name: web-v2
      namespace: other
      port: 8080
      weight: 10
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-b, value: "2"}]}}]
    - {group: networking.istio.io, kind: Hostname, name: api.example, port: 443}
    timeouts: {request: 1m30s, backendRequest: 500ms}
    retry: {attempts: 3, backoff: 100ms, codes: [503, 504]}
  - filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, hostname: h, port: 8443, statusCode: 302, path: {type: ReplaceFullPath, replaceFullPath: /new}}
    - type: URLRewrite
      urlRewrite: {hostname: rewritten, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    - type: ExtensionRef
"#,
    )
    .unwrap();
    assert_eq!(got.kind, RouteKind::Http);
    assert_eq!((got.namespace.as_str(), got.name.as_str()), ("ns1", "r"));
    assert_eq!(got.generation, 3);
    assert_eq!(got.creation.as_deref(), Some("2026-01-01T00:00:01Z"));
    assert_eq!(got.hostnames, ["web.example"]);
    assert_eq!(
        got.parent_refs,
        [
            ParentRef {
                group: "".into(),
                kind: "Service".into(),
                name: "web".into(),
                namespace: None,
                port: Some(8080),
                section_name: None,
            },
            ParentRef {
                group: "gateway.networking.k8s.io".into(),
                kind: "Gateway".into(),
                name: "waypoint".into(),
                namespace: None,
                port: None,
                section_name: Some("mesh".into()),
            },
        ]
    );
    let rule = &got.rules[0];
    assert_eq!(rule.name.as_deref(), Some("first"));
    assert_eq!(rule.matches.len(), 3);
    assert_eq!(rule.matches[0].path, Some(PathMatch::Exact("/a".into())));
    assert_eq!(
        rule.matches[0].headers,
        [
            ValueMatch {
                name: "x-v".into(),
                value: "2".into(),
                regex: false,
                prefix: false,
            },
            ValueMatch {
                name: "x-r".into(),
                value: "a.*".into(),
                regex: true,
                prefix: false,
            },
        ]
    );
    assert_eq!(rule.matches[0].query_params[0].name, "q");
    assert_eq!(rule.matches[0].method.as_deref(), Some("POST"));
    assert_eq!(
        rule.matches[1].path,
        Some(PathMatch::Regex("/r/[0-9]+".into()))
    );
    // No path: PathPrefix "/".
    assert_eq!(rule.matches[2].path, Some(PathMatch::Prefix("/".into())));
    assert_eq!(
        rule.filters[0],
        RouteFilter::RequestHeaders(HeaderFilter {
            set: vec![("x-set".into(), "s".into())],
            add: vec![("x-add".into(), "a".into())],
            remove: vec!["x-gone".into()],
        })
    );
    let RouteFilter::Mirror(mirror) = &rule.filters[2] else {
        panic!("{:?}", rule.filters[2])
    };
    assert_eq!(mirror.percent, Some(25.0));
    assert_eq!(mirror.backend.name, "shadow");
    assert_eq!(rule.backends.len(), 3);
    assert_eq!(
        (rule.backends[0].kind.as_str(), rule.backends[0].weight),
        ("Service", 90)
    );
    assert_eq!(rule.backends[1].namespace.as_deref(), Some("other"));
    assert_eq!(rule.backends[1].filters.len(), 1);
    assert!(rule.backends[2].is_hostname());
    assert_eq!(rule.backends[2].weight, 1);
    assert_eq!(rule.request_timeout, Some(Duration::from_secs(90)));
    assert_eq!(
        rule.backend_request_timeout,
        Some(Duration::from_millis(500))
    );
    assert_eq!(
        rule.retry,
        Some(Retry {
            attempts: Some(3),
            backoff: Some(Duration::from_millis(100)),
            codes: vec![503, 504],
            retry_on: None,
        })
    );
    let rule = &got.rules[1];
    assert!(rule.matches.is_empty());
    assert_eq!(
        rule.filters[0],
        RouteFilter::Redirect(Redirect {
            scheme: Some("https".into()),
            hostname: Some("h".into()),
            path: Some(PathModifier::Full("/new".into())),
            port: Some(8443),
            status_code: Some(302),
        })
    );
    assert_eq!(
        rule.filters[1],
        RouteFilter::Rewrite(Rewrite {
            hostname: Some("rewritten".into()),
            path: Some(PathModifier::Prefix("/v2".into())),
        })
    );
    assert_eq!(
        rule.filters[2],
        RouteFilter::Unsupported("ExtensionRef".into())
    );
}

#[test]
fn grpc_route_methods_and_headers() {
    let got = route(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: g}
spec:
  parentRefs: [{group: "", kind: Service, name: echo}]
  rules:
  - matches:
    - method: {service: echo.Echo, method: Ping}
      headers: [{name: x-a, value: b}]
    - method: {type: RegularExpression, service: "echo\\..*"}
    backendRefs: [{name: echo-v2, port: 9090}]
"#,
    )
    .unwrap();
    assert_eq!(got.kind, RouteKind::Grpc);
    assert_eq!(got.namespace, "default");
    let matches = &got.rules[0].matches;
    assert_eq!(matches[0].path, None);
    assert_eq!(
        matches[0].grpc,
        Some(GrpcMethodMatch {
            regex: false,
            service: Some("echo.Echo".into()),
            method: Some("Ping".into()),
        })
    );
    assert_eq!(matches[0].headers.len(), 1);
    assert_eq!(
        matches[1].grpc,
        Some(GrpcMethodMatch {
            regex: true,
            service: Some("echo\\..*".into()),
            method: None,
        })
    );
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            "spec:\n  parentRefs: [{name: w, port: 70000}]",
            "spec.parentRefs[0].port",
        ),
        (
            "spec:\n  rules: [{matches: [{path: {type: Glob, value: /x}}]}]",
            "spec.rules[0].matches[0].path.type",
        ),
        (
            "spec:\n  rules: [{matches: [{headers: [{type: Fuzzy, name: a, value: b}]}]}]",
            "spec.rules[0].matches[0].headers[0].type",
        ),
        (
            "spec:\n  rules: [{timeouts: {request: 10 seconds}}]",
            "spec.rules[0].timeouts.request",
        ),
        (
            "spec:\n  rules: [{retry: {backoff: 1d}}]",
            "spec.rules[0].retry.backoff",
        ),
        (
            "spec:\n  rules: [{backendRefs: [{name: a, port: 80, weight: -1}]}]",
            "spec.rules[0].backendRefs[0].weight",
        ),
        (
            "spec:\n  rules: [{filters: [{type: RequestRedirect}]}]",
            "spec.rules[0].filters[0].requestRedirect",
        ),
        (
            "spec:\n  rules: [{filters: [{type: URLRewrite, urlRewrite: {path: {type: Other}}}]}]",
            "spec.rules[0].filters[0].urlRewrite.path.type",
        ),
        (
            "spec:\n  rules: [{backendRefs: [{name: a, port: x}]}]",
            "spec.rules[0].backendRefs[0].port",
        ),
    ];
    for (spec, field) in cases {
        let text = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r}}\n{spec}\n"
        );
        let error = route(&text).unwrap_err();
        assert!(error.starts_with(field), "{spec}: {error}");
    }
    let missing =
        route("apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {}\n");
    assert!(missing.unwrap_err().contains("metadata.name"));
}

#[test]
fn durations_are_gateway_api_durations() {
    for (text, want) in [
        ("1h", Duration::from_secs(3600)),
        ("2m30s", Duration::from_secs(150)),
        ("1s500ms", Duration::from_millis(1500)),
        ("0s", Duration::ZERO),
        ("1h2m3s4ms", Duration::from_millis(3_723_004)),
    ] {
        assert_eq!(parse_duration(text, "f"), Ok(want), "{text}");
    }
    for bad in [
        "",
        "1",
        "s",
        "1.5s",
        "1d",
        "-1s",
        "123456s",
        "1h1m1s1ms1h",
        "1 s",
    ] {
        assert!(parse_duration(bad, "f").is_err(), "{bad}");
    }
}

#[test]
fn v1beta1_http_routes_decode_too() {
    let got = route(
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: HTTPRoute\nmetadata: {name: old}\nspec: {}\n",
    )
    .unwrap();
    assert_eq!(got.name, "old");
    assert!(got.rules.is_empty());
}
