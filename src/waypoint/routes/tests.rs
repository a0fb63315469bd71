//! Table tests of Gateway API routes at a waypoint (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)): each match
//! kind, weights, each filter, timeouts and retries, GRPCRoute methods, parentRef ports,
//! which routes apply where, `outbound` clusters for unbound backends, and what a change
//! rebuilds.

use std::collections::BTreeMap;

use prost::Message;

use crate::discovery::{Event, Index, Object, Settings, Snapshot};
use crate::pb::envoy::config::cluster::v3::Cluster;
use crate::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use crate::pb::envoy::config::listener::v3::{Listener, filter};
use crate::pb::envoy::config::route::v3::{
    Route, RouteAction, header_matcher, query_parameter_matcher, redirect_action, route,
    route_action, route_match,
};
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
use crate::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use crate::pb::google::protobuf::{Struct, Value, value::Kind};
use crate::pb::xds::Node;
use crate::waypoint::{ConfigId, Rebuild, WaypointConfig, WaypointProxy, WaypointSettings};

/// The waypoint `demo/waypoint`, and Services bound to it: `web` (HTTP 8080 and 8081, TCP
/// 9000), `web-v1` and `web-v2` (HTTP 8080); `other` (HTTP 8080, one ambient pod) is not
/// bound.
const MESH: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio-waypoint}
spec: {controllerName: istio.io/mesh-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: waypoint, namespace: demo}
spec:
  gatewayClassName: istio-waypoint
  listeners: [{name: mesh, port: 15008, protocol: HBONE}]
status:
  addresses: [{type: IPAddress, value: 10.96.0.10}, {type: Hostname, value: waypoint.demo.svc.cluster.local}]
---
apiVersion: v1
kind: Service
metadata: {name: waypoint, namespace: demo}
spec:
  clusterIP: 10.96.0.10
  selector: {gateway.networking.k8s.io/gateway-name: waypoint}
  ports: [{name: mesh, port: 15008, appProtocol: hbone}]
---
apiVersion: v1
kind: Pod
metadata:
  name: waypoint-1
  namespace: demo
  labels: {gateway.networking.k8s.io/gateway-name: waypoint}
spec: {serviceAccountName: waypoint, nodeName: node-a}
status: {phase: Running, podIP: 10.244.1.5, conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 10.96.0.20
  selector: {app: web}
  ports: [{name: http, port: 8080, appProtocol: http}, {name: http-alt, port: 8081, appProtocol: http}, {name: tcp, port: 9000, appProtocol: tcp}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v1, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 10.96.0.21
  selector: {app: web, version: v1}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: web-v2, namespace: demo, labels: {istio.io/use-waypoint: waypoint}}
spec:
  clusterIP: 10.96.0.22
  selector: {app: web, version: v2}
  ports: [{name: http, port: 8080, appProtocol: http}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: demo}
spec:
  clusterIP: 10.96.0.30
  selector: {app: other}
  ports: [{name: http, port: 8080, targetPort: 18080, appProtocol: http}]
---
apiVersion: v1
kind: Pod
metadata:
  name: other-1
  namespace: demo
  labels: {app: other}
  annotations: {ambient.istio.io/redirection: enabled}
spec: {serviceAccountName: other, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.9, conditions: [{type: Ready, status: "True"}]}
"#;

const WEB: &str = "inbound-vip|8080|http|web.demo.svc.cluster.local";
const WEB_ALT: &str = "inbound-vip|8081|http|web.demo.svc.cluster.local";
const WEB_V1: &str = "inbound-vip|8080|http|web-v1.demo.svc.cluster.local";
const WEB_V2: &str = "inbound-vip|8080|http|web-v2.demo.svc.cluster.local";
const OTHER: &str = "outbound|8080||other.demo.svc.cluster.local";

fn objects(yaml: &str) -> Vec<Object> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, yaml).expect("write");
    crate::kube::manifests::read_file(&path).expect("manifests")
}

fn apply(index: &mut Index, yaml: &str) {
    for object in objects(yaml) {
        index.handle(Event::Apply(object));
    }
}

fn index_with(routes: &str) -> Index {
    let mut index = Index::new(Settings::default());
    apply(&mut index, MESH);
    if !routes.is_empty() {
        apply(&mut index, routes);
    }
    index
}

fn proxy() -> WaypointProxy {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.into())),
    };
    let labels = Value {
        kind: Some(Kind::StructValue(Struct {
            fields: [(
                "gateway.networking.k8s.io/gateway-name".to_string(),
                string("waypoint"),
            )]
            .into(),
        })),
    };
    WaypointProxy::from_node(&Node {
        id: "waypoint~10.244.1.5~waypoint-1.demo~demo.svc.cluster.local".into(),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), string("demo")),
                ("LABELS".to_string(), labels),
            ]
            .into(),
        }),
        ..Default::default()
    })
    .unwrap()
}

fn build(snapshot: &Snapshot) -> (ConfigId, WaypointConfig) {
    let settings = WaypointSettings::default();
    let id = ConfigId::of(&proxy(), snapshot, &settings.domain);
    let config = WaypointConfig::build(&id, snapshot, &settings);
    (id, config)
}

fn config_with(routes: &str) -> WaypointConfig {
    build(&index_with(routes).snapshot()).1
}

/// Each HTTP chain's route config: chain name -> (routes, direct-response limit set).
fn chains(config: &WaypointConfig) -> BTreeMap<String, (Vec<Route>, bool)> {
    let main = Listener::decode(config.listeners["main_internal"].value()).unwrap();
    let mut out = BTreeMap::new();
    for chain in main
        .filter_chains
        .iter()
        .filter(|c| c.name != "direct-http")
    {
        let Some(filter::ConfigType::TypedConfig(any)) = chain
            .filters
            .iter()
            .find(|f| f.name == "envoy.filters.network.http_connection_manager")
            .and_then(|f| f.config_type.clone())
        else {
            continue;
        };
        let hcm = HttpConnectionManager::decode(any.value.clone()).unwrap();
        let Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier
        else {
            panic!("inline route config")
        };
        assert_eq!(rc.name, chain.name);
        let vhost = &rc.virtual_hosts[0];
        assert_eq!(vhost.domains, ["*"]);
        assert!(vhost.name.starts_with("inbound|http|"));
        out.insert(
            chain.name.clone(),
            (
                vhost.routes.clone(),
                rc.max_direct_response_body_size_bytes.is_some(),
            ),
        );
    }
    out
}

fn routes_of(config: &WaypointConfig, chain: &str) -> Vec<Route> {
    chains(config)
        .remove(chain)
        .unwrap_or_else(|| panic!("no chain {chain}"))
        .0
}

fn action(r: &Route) -> &RouteAction {
    match &r.action {
        Some(route::Action::Route(a)) => a,
        other => panic!("{}: not a route action: {other:?}", r.name),
    }
}

fn cluster(r: &Route) -> &str {
    match &action(r).cluster_specifier {
        Some(route_action::ClusterSpecifier::Cluster(c)) => c,
        other => panic!("{}: {other:?}", r.name),
    }
}

fn path(r: &Route) -> String {
    match &r.r#match.as_ref().unwrap().path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => format!("prefix {p}"),
        Some(route_match::PathSpecifier::Path(p)) => format!("path {p}"),
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => format!("segments {p}"),
        Some(route_match::PathSpecifier::SafeRegex(r)) => format!("regex {}", r.regex),
        other => format!("{other:?}"),
    }
}

/// One HTTPRoute on the `web` Service, with these rules (YAML, indented as under `rules:`).
fn web_route(name: &str, rules: &str) -> String {
    format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: demo, creationTimestamp: "2026-01-01T00:00:00Z"}}
spec:
  parentRefs: [{{group: "", kind: Service, name: web}}]
  rules:
{rules}
"#
    )
}

#[test]
fn without_routes_every_chain_keeps_the_default_route() {
    let config = config_with("");
    for (name, (routes, limit)) in chains(&config) {
        assert_eq!(routes.len(), 1, "{name}");
        assert_eq!(routes[0].name, "default", "{name}");
        assert!(limit, "{name}");
    }
}

#[test]
fn path_matches_are_ordered_by_precedence_and_replace_the_default_route() {
    let config = config_with(&web_route(
        "paths",
        r#"
  - matches: [{path: {type: PathPrefix, value: /api/}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {type: RegularExpression, value: "/r/[0-9]+"}}]
    backendRefs: [{name: web-v2, port: 8080}]
  - matches: [{path: {type: Exact, value: /exact}}, {path: {type: PathPrefix, value: /api/v2}}]
    backendRefs: [{name: web-v2, port: 8080}]
  - backendRefs: [{name: web, port: 8080}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    let got: Vec<(String, String, &str)> = routes
        .iter()
        .map(|r| (r.name.clone(), path(r), cluster(r)))
        .collect();
    assert_eq!(
        got,
        [
            ("demo.paths.2".into(), "path /exact".into(), WEB_V2),
            ("demo.paths.2".into(), "segments /api/v2".into(), WEB_V2),
            ("demo.paths.0".into(), "segments /api".into(), WEB_V1),
            ("demo.paths.1".into(), "regex /r/[0-9]+".into(), WEB_V2),
            ("demo.paths.3".into(), "prefix /".into(), WEB),
        ]
    );
    assert!(routes.iter().all(|r| r.name != "default"));
    // A route config from routes has no direct-response limit; the other services' chains
    // keep theirs. A parentRef without a port takes every port of the service.
    let all = chains(&config);
    assert!(!all[WEB].1);
    assert_eq!(all[WEB_ALT].0.len(), routes.len());
    assert_eq!(all[WEB_V1].0[0].name, "default");
    // istiod's metadata, decorator and case sensitivity.
    let first = &routes[0];
    assert_eq!(
        first.decorator.as_ref().unwrap().operation,
        "web-v2.demo.svc.cluster.local:8080/exact"
    );
    assert!(
        format!("{:?}", first.metadata)
            .contains("/apis/networking.istio.io/v1/namespaces/demo/virtual-service/demo~web.demo.svc.cluster.local")
    );
    assert_eq!(
        first.r#match.as_ref().unwrap().case_sensitive,
        Some(crate::pb::google::protobuf::BoolValue { value: true })
    );
    assert_eq!(
        action(first).cluster_not_found_response_code,
        route_action::ClusterNotFoundResponseCode::InternalServerError as i32
    );
}

#[test]
fn header_query_and_method_matches() {
    let config = config_with(&web_route(
        "headers",
        r#"
  - matches:
    - headers: [{name: x-z, value: last}, {name: x-a, type: RegularExpression, value: "v[0-9]"}, {name: x-any, type: RegularExpression, value: "*"}]
      queryParams: [{name: q, value: "1"}, {name: r, type: RegularExpression, value: "a+"}]
      method: POST
    backendRefs: [{name: web-v2, port: 8080}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    // A header match is not a catch-all: the list ends there, with no default route.
    assert_eq!(routes.len(), 1);
    let m = routes[0].r#match.as_ref().unwrap();
    let headers: Vec<(String, String)> = m
        .headers
        .iter()
        .map(|h| {
            let spec = match &h.header_match_specifier {
                Some(header_matcher::HeaderMatchSpecifier::PresentMatch(true)) => {
                    "present".to_string()
                }
                Some(header_matcher::HeaderMatchSpecifier::StringMatch(s)) => {
                    match &s.match_pattern {
                        Some(MatchPattern::Exact(e)) => format!("exact {e}"),
                        Some(MatchPattern::SafeRegex(r)) => format!("regex {}", r.regex),
                        other => format!("{other:?}"),
                    }
                }
                other => format!("{other:?}"),
            };
            (h.name.clone(), spec)
        })
        .collect();
    assert_eq!(
        headers,
        [
            ("x-a".to_string(), "regex v[0-9]".to_string()),
            ("x-any".to_string(), "present".to_string()),
            ("x-z".to_string(), "exact last".to_string()),
            (":method".to_string(), "exact POST".to_string()),
        ]
    );
    let query: Vec<(String, String)> = m
        .query_parameters
        .iter()
        .map(|q| {
            let Some(query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(s)) =
                &q.query_parameter_match_specifier
            else {
                panic!("{q:?}")
            };
            (q.name.clone(), format!("{:?}", s.match_pattern))
        })
        .collect();
    assert_eq!(query[0].0, "q");
    assert!(query[0].1.contains("Exact(\"1\")"), "{query:?}");
    assert_eq!(query[1].0, "r");
    assert!(query[1].1.contains("a+"), "{query:?}");
    assert_eq!(path(&routes[0]), "prefix /");
}

#[test]
fn weights_make_weighted_clusters_without_zeros() {
    let config = config_with(&web_route(
        "split",
        r#"
  - matches: [{path: {value: /split}}]
    backendRefs: [{name: web-v1, port: 8080, weight: 90}, {name: web-v2, port: 8080, weight: 10}, {name: web, port: 8080, weight: 0}]
  - matches: [{path: {value: /one}}]
    backendRefs: [{name: web-v1, port: 8080, weight: 0}, {name: web-v2, port: 8080, weight: 3}]
  - matches: [{path: {value: /none}}]
    backendRefs: [{name: web-v1, port: 8080, weight: 0}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    let by_path: BTreeMap<String, &Route> = routes.iter().map(|r| (path(r), r)).collect();
    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) =
        &action(by_path["segments /split"]).cluster_specifier
    else {
        panic!("weighted")
    };
    let weights: Vec<(&str, u32)> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(weights, [(WEB_V1, 90), (WEB_V2, 10)]);
    // One backend left: a plain cluster, its weight dropped.
    assert_eq!(cluster(by_path["segments /one"]), WEB_V2);
    // No backend with weight: 500, as the Gateway API says.
    let Some(route::Action::DirectResponse(direct)) = &by_path["segments /none"].action else {
        panic!("direct response")
    };
    assert_eq!(direct.status, 500);
}

#[test]
fn each_filter() {
    let config = config_with(&web_route(
        "filters",
        r#"
  - matches: [{path: {value: /headers}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-set, value: s}, {name: Host, value: rewritten.example}], add: [{name: x-add, value: a}], remove: [x-gone, ":path"]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-resp, value: r}], remove: [server]}
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /redirect}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, hostname: new.example, statusCode: 302, path: {type: ReplaceFullPath, replaceFullPath: /moved}}}]
  - matches: [{path: {value: /here}}]
    filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /there}}}]
  - matches: [{path: {value: /old}}]
    filters: [{type: URLRewrite, urlRewrite: {hostname: h.example, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new/}}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /strip}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /full}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replaceFullPath: /fixed}}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /mirror}}]
    filters:
    - {type: RequestMirror, requestMirror: {backendRef: {name: web-v2, port: 8080}, percent: 25}}
    - {type: RequestMirror, requestMirror: {backendRef: {name: other, port: 8080}}}
    backendRefs: [{name: web-v1, port: 8080}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    let by_path: BTreeMap<String, &Route> = routes.iter().map(|r| (path(r), r)).collect();

    let headers = by_path["segments /headers"];
    let added: Vec<(String, String, i32)> = headers
        .request_headers_to_add
        .iter()
        .map(|o| {
            let h = o.header.as_ref().unwrap();
            (h.key.clone(), h.value.clone(), o.append_action)
        })
        .collect();
    use crate::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction as A;
    assert_eq!(
        added,
        [
            ("x-set".into(), "s".into(), A::OverwriteIfExistsOrAdd as i32),
            ("x-add".into(), "a".into(), A::AppendIfExistsOrAdd as i32),
        ]
    );
    assert_eq!(headers.request_headers_to_remove, ["x-gone"]);
    assert_eq!(headers.response_headers_to_remove, ["server"]);
    assert_eq!(headers.response_headers_to_add.len(), 1);
    // `Host` is not set as a header but rewrites the authority.
    assert_eq!(
        action(headers).host_rewrite_specifier,
        Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
            "rewritten.example".into()
        ))
    );

    let Some(route::Action::Redirect(redirect)) = &by_path["segments /redirect"].action else {
        panic!("redirect")
    };
    assert_eq!(redirect.host_redirect, "new.example");
    assert_eq!(
        redirect.scheme_rewrite_specifier,
        Some(redirect_action::SchemeRewriteSpecifier::SchemeRedirect(
            "https".into()
        ))
    );
    assert_eq!(
        redirect.path_rewrite_specifier,
        Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            "/moved".into()
        ))
    );
    assert_eq!(redirect.port_redirect, 0, "the scheme's default port");
    assert_eq!(
        redirect.response_code,
        redirect_action::RedirectResponseCode::Found as i32
    );
    // No scheme and no port: the request's port (the listener's), and 301.
    let Some(route::Action::Redirect(here)) = &by_path["segments /here"].action else {
        panic!("redirect")
    };
    assert_eq!(here.port_redirect, 8080);
    assert_eq!(
        here.path_rewrite_specifier,
        Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
            "/there".into()
        ))
    );
    assert_eq!(
        here.response_code,
        redirect_action::RedirectResponseCode::MovedPermanently as i32
    );

    let old = action(by_path["segments /old"]);
    assert_eq!(old.prefix_rewrite, "/new");
    assert_eq!(
        old.host_rewrite_specifier,
        Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
            "h.example".into()
        ))
    );
    let strip = action(by_path["segments /strip"])
        .regex_rewrite
        .clone()
        .unwrap();
    assert_eq!(strip.pattern.unwrap().regex, "^/strip(/?)(.*)");
    assert_eq!(strip.substitution, "/\\2");
    let full = action(by_path["segments /full"])
        .regex_rewrite
        .clone()
        .unwrap();
    assert_eq!(full.pattern.unwrap().regex, "/.*");
    assert_eq!(full.substitution, "/fixed");

    let mirrors = &action(by_path["segments /mirror"]).request_mirror_policies;
    let got: Vec<(&str, u32, i32)> = mirrors
        .iter()
        .map(|m| {
            let f = m
                .runtime_fraction
                .as_ref()
                .unwrap()
                .default_value
                .as_ref()
                .unwrap();
            (m.cluster.as_str(), f.numerator, f.denominator)
        })
        .collect();
    use crate::pb::envoy::r#type::v3::fractional_percent::DenominatorType as D;
    assert_eq!(
        got,
        [
            (WEB_V2, 250_000, D::Million as i32),
            (OTHER, 100, D::Hundred as i32)
        ]
    );
}

#[test]
fn timeouts_and_retries() {
    let config = config_with(&web_route(
        "time",
        r#"
  - matches: [{path: {value: /request}}]
    timeouts: {request: 2s}
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /backend}}]
    timeouts: {request: 5s, backendRequest: 1s}
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /retry}}]
    timeouts: {request: 5s, backendRequest: 1s}
    retry: {attempts: 3, backoff: 250ms, codes: [503, 504]}
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /noretry}}]
    retry: {attempts: 0}
    backendRefs: [{name: web-v1, port: 8080}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    let by_path: BTreeMap<String, &Route> = routes.iter().map(|r| (path(r), r)).collect();
    let secs = |d: &Option<crate::pb::google::protobuf::Duration>| {
        d.as_ref()
            .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
    };
    let request = action(by_path["segments /request"]);
    assert_eq!(secs(&request.timeout), Some(2.0));
    assert_eq!(secs(&request.max_grpc_timeout), Some(2.0));
    // Istio's default retry policy when the rule has none.
    let default = request.retry_policy.as_ref().unwrap();
    assert_eq!(default.num_retries.as_ref().unwrap().value, 2);
    assert!(default.retry_on.ends_with("retriable-status-codes"));
    // backendRequest without a retry bounds the whole request.
    assert_eq!(
        secs(&action(by_path["segments /backend"]).timeout),
        Some(1.0)
    );
    let retry = action(by_path["segments /retry"]);
    assert_eq!(secs(&retry.timeout), Some(5.0));
    let policy = retry.retry_policy.as_ref().unwrap();
    assert_eq!(policy.num_retries.as_ref().unwrap().value, 3);
    assert_eq!(
        policy.retry_on,
        "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
    );
    assert_eq!(policy.retriable_status_codes, [503, 504]);
    assert_eq!(secs(&policy.per_try_timeout), Some(1.0));
    assert_eq!(
        secs(&policy.retry_back_off.as_ref().unwrap().base_interval),
        Some(0.25)
    );
    assert_eq!(policy.retry_host_predicate.len(), 1);
    // Zero attempts: no retry at all; no timeout: 0s (none).
    let none = action(by_path["segments /noretry"]);
    assert!(none.retry_policy.is_none());
    assert_eq!(secs(&none.timeout), Some(0.0));
}

#[test]
fn grpc_routes_match_service_and_method() {
    let config = config_with(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: web}]
  rules:
  - matches: [{method: {service: echo.Echo, method: Ping}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{method: {service: echo.Echo}, headers: [{name: x-v, value: "2"}]}]
    backendRefs: [{name: web-v2, port: 8080}]
  - matches: [{method: {method: Health}}]
    backendRefs: [{name: web, port: 8080}]
"#,
    );
    let routes = routes_of(&config, WEB);
    let got: Vec<(String, &str)> = routes.iter().map(|r| (path(r), cluster(r))).collect();
    assert_eq!(
        got,
        [
            ("path /echo.Echo/Ping".into(), WEB_V1),
            ("segments /echo.Echo".into(), WEB_V2),
            ("regex /[^/]+/Health".into(), WEB),
        ]
    );
    assert_eq!(routes[1].r#match.as_ref().unwrap().headers[0].name, "x-v");
}

#[test]
fn a_parent_ref_port_narrows_to_that_port() {
    let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: alt-only, namespace: demo}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 8081}]
  rules:
  - backendRefs: [{name: web-v2, port: 8080}]
"#;
    let config = config_with(yaml);
    let all = chains(&config);
    assert_eq!(all[WEB].0[0].name, "default");
    let alt = &all[WEB_ALT].0;
    assert_eq!(alt.len(), 1);
    assert_eq!(alt[0].name, "demo.alt-only.0");
    assert_eq!(cluster(&alt[0]), WEB_V2);
    // The VirtualService is keyed by the port too.
    assert!(format!("{:?}", alt[0].metadata).contains("virtual-service/demo~8081~web.demo"));
}

#[test]
fn which_routes_apply_where() {
    let routes = r#"
apiVersion: v1
kind: Namespace
metadata: {name: elsewhere}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: consumer, namespace: elsewhere}
spec:
  parentRefs: [{group: "", kind: Service, name: web, namespace: demo}]
  rules: [{backendRefs: [{name: web-v1, namespace: demo, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: not-ours, namespace: demo}
spec:
  parentRefs: [{name: some-gateway}]
  rules: [{backendRefs: [{name: web-v1, port: 8080}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-waypoint, namespace: demo}
spec:
  parentRefs: [{name: waypoint}]
  hostnames: ["web-v1.demo.svc.cluster.local", "*.example"]
  rules: [{backendRefs: [{name: web-v2, port: 8080}]}]
"#;
    let config = config_with(routes);
    let all = chains(&config);
    // A route of a third namespace does not apply at the waypoint; one for another Gateway
    // neither.
    assert_eq!(all[WEB].0[0].name, "default");
    // A route on the waypoint's Gateway applies to the services its hostnames allow.
    assert_eq!(all[WEB_V1].0[0].name, "demo.on-waypoint.0");
    assert_eq!(cluster(&all[WEB_V1].0[0]), WEB_V2);
    assert_eq!(all[WEB_V2].0[0].name, "default");
}

#[test]
fn a_catch_all_ends_the_list_and_creation_time_orders_equal_routes() {
    let older = web_route(
        "older",
        r#"
  - matches: [{path: {value: /same}}]
    backendRefs: [{name: web-v1, port: 8080}]
  - backendRefs: [{name: web-v1, port: 8080}]
  - matches: [{path: {value: /after-catch-all}}]
    backendRefs: [{name: web-v1, port: 8080}]
"#,
    );
    let newer = web_route(
        "newer",
        r#"
  - matches: [{path: {value: /same}}]
    backendRefs: [{name: web-v2, port: 8080}]
"#,
    )
    .replace("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z");
    let config = config_with(&format!("{newer}\n---\n{older}"));
    let routes = routes_of(&config, WEB);
    let got: Vec<(String, String)> = routes.iter().map(|r| (r.name.clone(), path(r))).collect();
    // Precedence first (the longer prefix sorts before `/same`), then creation time.
    assert_eq!(
        got,
        [
            ("demo.older.2".into(), "segments /after-catch-all".into()),
            ("demo.older.0".into(), "segments /same".into()),
            ("demo.newer.0".into(), "segments /same".into()),
            ("demo.older.1".into(), "prefix /".into()),
        ]
    );
}

#[test]
fn a_route_istiod_would_not_convert_contributes_nothing() {
    let config = config_with(&web_route(
        "bad",
        r#"
  - matches: [{path: {value: /x}}]
    filters: [{type: ExtensionRef}]
    backendRefs: [{name: web-v1, port: 8080}]
"#,
    ));
    assert_eq!(routes_of(&config, WEB)[0].name, "default");
}

#[test]
fn an_unbound_backend_gets_an_outbound_cluster_and_an_unknown_one_gets_500() {
    let config = config_with(&web_route(
        "out",
        r#"
  - matches: [{path: {value: /other}}]
    backendRefs: [{name: other, port: 8080}]
  - matches: [{path: {value: /missing}}]
    backendRefs: [{name: missing, port: 8080}]
  - matches: [{path: {value: /kind}}]
    backendRefs: [{group: example.com, kind: Thing, name: t, port: 8080}]
"#,
    ));
    let routes = routes_of(&config, WEB);
    let by_path: BTreeMap<String, &Route> = routes.iter().map(|r| (path(r), r)).collect();
    assert_eq!(cluster(by_path["segments /other"]), OTHER);
    assert_eq!(
        cluster(by_path["segments /missing"]),
        "inbound-vip|8080|http|missing.demo.svc.cluster.local"
    );
    assert_eq!(cluster(by_path["segments /kind"]), "UnknownService");
    // The outbound cluster: EDS, HBONE or plain by the endpoint's metadata.
    let cds = Cluster::decode(config.clusters[OTHER].value()).unwrap();
    let matches: Vec<&str> = cds
        .transport_socket_matches
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(matches, ["hbone", "tlsMode-disabled"]);
    assert!(cds.transport_socket.is_none());
    assert!(
        !config
            .clusters
            .contains_key("inbound-vip|8080|http|missing.demo.svc.cluster.local")
    );
    let cla = ClusterLoadAssignment::decode(config.endpoints[OTHER].value()).unwrap();
    let text = format!("{cla:?}");
    assert!(text.contains("10.244.2.9:18080"), "{text}");
    assert!(text.contains("envoy.transport_socket_match"), "{text}");
    assert!(text.contains("connect_originate"), "{text}");
}

#[test]
fn a_route_change_rebuilds_and_equals_a_cold_build() {
    let mut index = index_with(&web_route(
        "r",
        "  - backendRefs: [{name: web-v1, port: 8080}]\n",
    ));
    let before = index.snapshot();
    let (id, config) = build(&before);
    let settings = WaypointSettings::default();
    // An unrelated pod: nothing.
    apply(
        &mut index,
        r#"
apiVersion: v1
kind: Pod
metadata: {name: lonely, namespace: demo, labels: {app: lonely}}
spec: {serviceAccountName: lonely, nodeName: node-b}
status: {phase: Running, podIP: 10.244.3.1, conditions: [{type: Ready, status: "True"}]}
"#,
    );
    let unrelated = index.snapshot();
    assert_eq!(config.rebuild_needed(&id, &unrelated), Rebuild::Nothing);
    // The route changes: listeners and clusters, the assignments kept, and the same as a
    // cold build.
    apply(
        &mut index,
        &web_route("r", "  - backendRefs: [{name: other, port: 8080}]\n"),
    );
    let after = index.snapshot();
    assert_eq!(
        config.rebuild_needed(&id, &after),
        Rebuild::Routes(Default::default())
    );
    let next = config.update(&id, &after, &settings);
    for (name, resource) in &config.endpoints {
        assert!(
            std::sync::Arc::ptr_eq(resource, &next.endpoints[name]),
            "{name} rebuilt"
        );
    }
    assert_eq!(cluster(&routes_of(&next, WEB)[0]), OTHER);
    assert!(next.clusters.contains_key(OTHER));
    let cold = WaypointConfig::build(&id, &after, &settings);
    let versions = |c: &WaypointConfig| -> Vec<(String, String)> {
        c.listeners
            .values()
            .chain(c.clusters.values())
            .chain(c.endpoints.values())
            .map(|r| (r.name.to_string(), format!("{:?}", r.version)))
            .collect()
    };
    assert_eq!(versions(&next), versions(&cold));
    // A new pod of the outbound service: its assignment alone.
    apply(
        &mut index,
        r#"
apiVersion: v1
kind: Pod
metadata: {name: other-2, namespace: demo, labels: {app: other}}
spec: {serviceAccountName: other, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.10, conditions: [{type: Ready, status: "True"}]}
"#,
    );
    let member = index.snapshot();
    assert_eq!(
        next.rebuild_needed(&id, &member),
        Rebuild::Endpoints([crate::discovery::snapshot::Name::from(OTHER)].into())
    );
    let updated = next.update(&id, &member, &settings);
    let cla = ClusterLoadAssignment::decode(updated.endpoints[OTHER].value()).unwrap();
    assert!(format!("{cla:?}").contains("10.244.2.10"));
    // A route change and a member change in one step: the assignments kept but that one,
    // and still the same as a cold build.
    apply(
        &mut index,
        &(web_route(
            "r",
            "  - matches: [{path: {value: /x}}]\n    backendRefs: [{name: other, port: 8080}]\n",
        ) + "---\n"
            + r#"
apiVersion: v1
kind: Pod
metadata: {name: other-3, namespace: demo, labels: {app: other}}
spec: {serviceAccountName: other, nodeName: node-b}
status: {phase: Running, podIP: 10.244.2.11, conditions: [{type: Ready, status: "True"}]}
"#),
    );
    let both = index.snapshot();
    assert_eq!(
        updated.rebuild_needed(&id, &both),
        Rebuild::Routes([crate::discovery::snapshot::Name::from(OTHER)].into())
    );
    let updated = updated.update(&id, &both, &settings);
    assert_eq!(
        versions(&updated),
        versions(&WaypointConfig::build(&id, &both, &settings))
    );
    // The backend service itself changes (a port is added): everything.
    apply(
        &mut index,
        &MESH
            .split("---")
            .find(|d| d.contains("name: other, namespace: demo"))
            .unwrap()
            .replace(
                "appProtocol: http}]",
                "appProtocol: http}, {name: extra, port: 9999}]",
            ),
    );
    assert_eq!(
        updated.rebuild_needed(&id, &index.snapshot()),
        Rebuild::Everything
    );
}

mod virtual_services;
