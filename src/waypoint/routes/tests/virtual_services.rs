//! VirtualService `http` routes at a waypoint (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)): which
//! VirtualServices apply to a bound service, their order (as written, then merged with the
//! Gateway API routes by creation time), matches, destinations and actions, all through the
//! same translation as the Gateway API routes.

use super::*;

/// A VirtualService in `demo` with this `spec` body (YAML, indented as under `spec:`).
fn vs(name: &str, created: &str, spec: &str) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: {name}, namespace: demo, creationTimestamp: "{created}"}}
spec:
{spec}
"#
    )
}

const T0: &str = "2026-01-01T00:00:00Z";

fn header_specs(r: &Route) -> Vec<(String, String)> {
    r.r#match
        .as_ref()
        .unwrap()
        .headers
        .iter()
        .map(|h| {
            let spec = match &h.header_match_specifier {
                Some(header_matcher::HeaderMatchSpecifier::StringMatch(s)) => {
                    match &s.match_pattern {
                        Some(MatchPattern::Exact(e)) => format!("exact {e}"),
                        Some(MatchPattern::Prefix(p)) => format!("prefix {p}"),
                        Some(MatchPattern::SafeRegex(r)) => format!("regex {}", r.regex),
                        other => format!("{other:?}"),
                    }
                }
                other => format!("{other:?}"),
            };
            (h.name.clone(), spec)
        })
        .collect()
}

#[test]
fn a_virtual_service_keeps_its_order_and_a_rule_without_matches_ends_it() {
    let config = config_with(&vs(
        "web",
        T0,
        r#"
  hosts: [web]
  http:
  - name: by-header
    match:
    - headers: {end-user: {exact: jason}, x-p: {prefix: ab}}
    route: [{destination: {host: web-v1, port: {number: 8080}}}]
  - name: by-prefix
    match:
    - uri: {prefix: /api}
    - uri: {regex: "/r/[0-9]+"}
      method: {exact: GET}
    - uri: {exact: /only-from-a-source}
      sourceLabels: {app: client}
    route: [{destination: {host: web-v2.demo.svc.cluster.local, port: {number: 8080}}}]
  - name: default
    route: [{destination: {host: web-v2, port: {number: 8080}}}]
  - name: unreachable
    route: [{destination: {host: web-v1, port: {number: 8080}}}]
"#,
    ));
    for chain in [WEB, WEB_ALT] {
        let routes = routes_of(&config, chain);
        let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
        // As written (no precedence sort); the sourceLabels match is dropped; the rule
        // without matches is a catch-all and ends the list.
        assert_eq!(
            names,
            ["by-header", "by-prefix", "by-prefix", "default"],
            "{chain}"
        );
        assert_eq!(
            header_specs(&routes[0]),
            [
                ("end-user".to_string(), "exact jason".to_string()),
                ("x-p".to_string(), "prefix ab".to_string()),
            ]
        );
        assert_eq!(path(&routes[0]), "prefix /");
        assert_eq!(cluster(&routes[0]), WEB_V1);
        // A VirtualService prefix is a plain string prefix, not path segments.
        assert_eq!(path(&routes[1]), "prefix /api");
        assert_eq!(path(&routes[2]), "regex /r/[0-9]+");
        assert_eq!(
            header_specs(&routes[2]),
            [(":method".to_string(), "exact GET".to_string())]
        );
        assert_eq!(cluster(&routes[1]), WEB_V2);
        assert_eq!(path(&routes[3]), "prefix /");
        assert_eq!(cluster(&routes[3]), WEB_V2);
        // istiod's metadata names the VirtualService itself.
        let metadata = format!("{:?}", routes[0].metadata);
        assert!(
            metadata.contains("/apis/networking.istio.io/v1/namespaces/demo/virtual-service/web"),
            "{metadata}"
        );
    }
    // Services no host names keep their default route.
    assert_eq!(routes_of(&config, WEB_V1)[0].name, "default");
}

#[test]
fn which_virtual_services_apply() {
    let third = r#"
apiVersion: v1
kind: Namespace
metadata: {name: third}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: elsewhere, namespace: third}
spec:
  hosts: [web.demo.svc.cluster.local]
  http: [{name: third, route: [{destination: {host: web-v1.demo.svc.cluster.local}}]}]
"#;
    let rule = |name: &str| {
        format!("  http: [{{name: {name}, route: [{{destination: {{host: web-v1}}}}]}}]")
    };
    let yaml = [
        vs(
            "wild",
            T0,
            &format!("  hosts: [\"*.demo.svc.cluster.local\"]\n{}", rule("wild")),
        ),
        vs(
            "gateway-only",
            T0,
            &format!(
                "  hosts: [web]\n  gateways: [demo/ingress]\n{}",
                rule("gateway-only")
            ),
        ),
        vs(
            "mesh-and-gateway",
            T0,
            &format!(
                "  hosts: [web-v2]\n  gateways: [mesh, demo/ingress]\n{}",
                rule("mesh")
            ),
        ),
        vs(
            "hidden",
            T0,
            &format!(
                "  hosts: [web]\n  exportTo: [elsewhere]\n{}",
                rule("hidden")
            ),
        ),
        vs(
            "own-ns",
            T0,
            &format!("  hosts: [web]\n  exportTo: [\".\"]\n{}", rule("own-ns")),
        ),
        third.to_string(),
    ]
    .join("\n---\n");
    let config = config_with(&yaml);
    let names = |chain: &str| -> Vec<String> {
        routes_of(&config, chain)
            .iter()
            .map(|r| r.name.clone())
            .collect()
    };
    // Equal creation times: by name. Not for another gateway, not hidden by exportTo, not
    // from a third namespace.
    assert_eq!(names(WEB), ["own-ns", "wild"]);
    assert_eq!(names(WEB_V2), ["mesh", "wild"]);
    assert_eq!(names(WEB_V1), ["wild"]);
    // A destination without a port on a one-port service takes that port.
    assert_eq!(cluster(&routes_of(&config, WEB)[0]), WEB_V1);
}

#[test]
fn virtual_services_and_gateway_routes_merge_by_creation_time() {
    let yaml = [
        web_route(
            "gateway-route",
            "  - matches: [{headers: [{name: x-gw, value: \"1\"}]}]\n    backendRefs: [{name: web-v1, port: 8080}]",
        ),
        vs(
            "older",
            "2025-06-01T00:00:00Z",
            r#"  hosts: [web]
  http:
  - name: older
    match: [{headers: {x-old: {exact: "1"}}}]
    route: [{destination: {host: web-v2, port: {number: 8080}}}]"#,
        ),
        vs(
            "newer",
            "2026-06-01T00:00:00Z",
            r#"  hosts: [web]
  http:
  - name: newer
    route: [{destination: {host: web-v2, port: {number: 8080}}}]"#,
        ),
    ]
    .join("\n---\n");
    let config = config_with(&yaml);
    let names: Vec<String> = routes_of(&config, WEB)
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names, ["older", "demo.gateway-route.0", "newer"]);
}

#[test]
fn virtual_service_destinations_and_actions() {
    let config = config_with(&vs(
        "web",
        T0,
        r#"
  hosts: [web.demo.svc.cluster.local]
  http:
  - name: port-8081
    match: [{port: 8081, uri: {exact: /alt}}]
    route: [{destination: {host: web}}]
  - name: unbound
    match: [{uri: {exact: /other}}]
    route: [{destination: {host: other}}]
  - name: subset
    match: [{uri: {exact: /subset}}]
    route: [{destination: {host: web-v1, subset: v1, port: {number: 8080}}}]
  - name: split
    match: [{uri: {exact: /split}}]
    route:
    - {destination: {host: web-v1, port: {number: 8080}}, weight: 75}
    - {destination: {host: web-v2, port: {number: 8080}}, weight: 25, headers: {request: {set: {x-v: "2"}}}}
  - name: redirect
    match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: new.example}
  - name: rewrite
    match: [{uri: {prefix: /v1/}}]
    rewrite: {uri: /, authority: web.internal}
    headers: {request: {add: {x-added: "a"}, remove: [x-gone]}, response: {set: {x-resp: "r"}}}
    timeout: 1.5s
    retries: {attempts: 4, perTryTimeout: 250ms, retryOn: "gateway-error,503"}
    route: [{destination: {host: web-v2, port: {number: 8080}}}]
  - name: no-retries
    match: [{uri: {exact: /noretry}}]
    retries: {attempts: 0}
    route: [{destination: {host: web-v2, port: {number: 8080}}}]
"#,
    ));
    let on_8080 = routes_of(&config, WEB);
    let by_name: BTreeMap<&str, &Route> = on_8080.iter().map(|r| (r.name.as_str(), r)).collect();
    // A port match holds on that listener port only; without a destination port on a
    // multi-port service, the listener's port.
    assert!(!by_name.contains_key("port-8081"));
    let alt = routes_of(&config, WEB_ALT);
    assert_eq!(alt[0].name, "port-8081");
    assert_eq!(cluster(&alt[0]), WEB_ALT);
    // An unbound service: its outbound cluster (its only port); a subset: istiod's name.
    assert_eq!(cluster(by_name["unbound"]), OTHER);
    assert_eq!(
        cluster(by_name["subset"]),
        "inbound-vip|8080|http/v1|web-v1.demo.svc.cluster.local"
    );
    let Some(route_action::ClusterSpecifier::WeightedClusters(split)) =
        &action(by_name["split"]).cluster_specifier
    else {
        panic!("weighted")
    };
    let weights: Vec<(&str, u32)> = split
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(weights, [(WEB_V1, 75), (WEB_V2, 25)]);
    assert_eq!(split.clusters[1].request_headers_to_add.len(), 1);
    // A redirect without a port keeps the request's port.
    let Some(route::Action::Redirect(redirect)) = &by_name["redirect"].action else {
        panic!("redirect")
    };
    assert_eq!(redirect.host_redirect, "new.example");
    assert_eq!(redirect.port_redirect, 0);
    assert_eq!(
        redirect.path_rewrite_specifier,
        Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            "/new".into()
        ))
    );
    // A rewrite's uri is Envoy's prefix_rewrite as written.
    let rewrite = by_name["rewrite"];
    assert_eq!(path(rewrite), "prefix /v1/");
    let a = action(rewrite);
    assert_eq!(a.prefix_rewrite, "/");
    assert!(a.regex_rewrite.is_none());
    assert_eq!(
        a.host_rewrite_specifier,
        Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
            "web.internal".into()
        ))
    );
    assert_eq!(rewrite.request_headers_to_add.len(), 1);
    assert_eq!(rewrite.request_headers_to_remove, ["x-gone"]);
    assert_eq!(rewrite.response_headers_to_add.len(), 1);
    let timeout = a.timeout.as_ref().unwrap();
    assert_eq!((timeout.seconds, timeout.nanos), (1, 500_000_000));
    let policy = a.retry_policy.as_ref().unwrap();
    assert_eq!(policy.num_retries.as_ref().unwrap().value, 4);
    assert_eq!(policy.retry_on, "gateway-error,retriable-status-codes");
    assert_eq!(policy.retriable_status_codes, [503]);
    assert_eq!(
        policy.per_try_timeout.as_ref().map(|d| d.nanos),
        Some(250_000_000)
    );
    assert!(action(by_name["no-retries"]).retry_policy.is_none());
}
