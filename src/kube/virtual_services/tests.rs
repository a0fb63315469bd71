//! Decoding a VirtualService into the route model.

use super::*;
use crate::kube::objects::{Decoded, decode as decode_any, parse_yaml};

fn vs(text: &str) -> Result<Route, String> {
    let mut docs = parse_yaml(text).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    match decode_any(docs.remove(0)).pop() {
        Some(Decoded::Object(Object::VirtualService(r))) => Ok(r),
        Some(Decoded::Invalid(e)) => Err(e.reason),
        other => panic!("not a VirtualService: {other:?}"),
    }
}

#[test]
fn virtual_service_every_field() {
    let got = vs(r#"
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: reviews, namespace: ns1, creationTimestamp: "2026-01-01T00:00:01Z"}
spec:
  hosts: [reviews]
  gateways: [mesh]
  exportTo: ["."]
  http:
  - name: jason
    match:
    - uri: {prefix: /api}
      headers: {end-user: {exact: jason}, x-p: {prefix: ab}, x-r: {regex: "a.*"}}
      queryParams: {q: {exact: "1"}}
      method: {exact: GET}
      port: 9080
    - sourceLabels: {app: productpage}
    route:
    - destination: {host: reviews, subset: v2, port: {number: 9080}}
      headers: {response: {set: {x-dest: v2}}}
    timeout: 2s
    retries: {attempts: 3, perTryTimeout: 500ms, retryOn: "5xx,503"}
    headers: {request: {set: {x-a: "1"}, add: {x-b: "2"}, remove: [x-c]}}
    rewrite: {uri: /v2, authority: new.example}
    mirror: {host: mirror.ns2.svc.cluster.local, port: {number: 80}}
    mirrorPercentage: {value: 25.5}
  - match:
    - sourceLabels: {app: only}
    route:
    - destination: {host: never}
  - redirect: {uri: /moved, authority: other.example, redirectCode: 302}
  - route:
    - destination: {host: a.example.com}
      weight: 80
    - destination: {host: reviews.ns3.svc.cluster.local}
      weight: 20
  tcp:
  - route: [{destination: {host: ignored}}]
"#)
    .unwrap();
    assert_eq!(got.kind, RouteKind::Virtual);
    assert_eq!(
        (got.namespace.as_str(), got.name.as_str()),
        ("ns1", "reviews")
    );
    assert_eq!(got.creation.as_deref(), Some("2026-01-01T00:00:01Z"));
    assert_eq!(got.hostnames, ["reviews"]);
    assert_eq!(got.gateways, ["mesh"]);
    assert_eq!(got.export_to, ["."]);
    // The rule whose only match had sourceLabels is gone.
    assert_eq!(got.rules.len(), 3);

    let first = &got.rules[0];
    assert_eq!(first.name.as_deref(), Some("jason"));
    assert_eq!(first.matches.len(), 1, "the sourceLabels match is dropped");
    let m = &first.matches[0];
    assert_eq!(m.path, Some(PathMatch::RawPrefix("/api".into())));
    assert_eq!(m.port, Some(9080));
    assert_eq!(m.method.as_deref(), Some("GET"));
    let header = |name: &str| m.headers.iter().find(|h| h.name == name).unwrap().clone();
    assert!(!header("end-user").regex && !header("end-user").prefix);
    assert!(header("x-p").prefix);
    assert!(header("x-r").regex);
    assert_eq!(m.query_params[0].value, "1");
    let backend = &first.backends[0];
    assert_eq!(
        (
            backend.kind.as_str(),
            backend.name.as_str(),
            backend.namespace.as_deref()
        ),
        ("Service", "reviews", None)
    );
    assert_eq!(
        (backend.port, backend.subset.as_deref(), backend.weight),
        (Some(9080), Some("v2"), 1)
    );
    assert_eq!(
        backend.filters,
        [RouteFilter::ResponseHeaders(HeaderFilter {
            set: vec![("x-dest".into(), "v2".into())],
            ..Default::default()
        })]
    );
    assert_eq!(first.request_timeout, Some(Duration::from_secs(2)));
    assert_eq!(
        first.backend_request_timeout,
        Some(Duration::from_millis(500))
    );
    assert_eq!(
        first.retry,
        Some(Retry {
            attempts: Some(3),
            backoff: None,
            codes: vec![503],
            retry_on: Some("5xx".into()),
        })
    );
    assert!(
        first
            .filters
            .contains(&RouteFilter::RequestHeaders(HeaderFilter {
                set: vec![("x-a".into(), "1".into())],
                add: vec![("x-b".into(), "2".into())],
                remove: vec!["x-c".into()],
            }))
    );
    assert!(first.filters.contains(&RouteFilter::Rewrite(Rewrite {
        hostname: Some("new.example".into()),
        path: Some(PathModifier::RawPrefix("/v2".into())),
    })));
    let mirror = first
        .filters
        .iter()
        .find_map(|f| match f {
            RouteFilter::Mirror(m) => Some(m),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        (
            mirror.backend.name.as_str(),
            mirror.backend.namespace.as_deref()
        ),
        ("mirror", Some("ns2"))
    );
    assert_eq!(mirror.percent, Some(25.5));

    let redirect = &got.rules[1];
    assert!(redirect.matches.is_empty());
    assert_eq!(redirect.name.as_deref(), Some(""));
    assert_eq!(
        redirect.filters,
        [RouteFilter::Redirect(Redirect {
            hostname: Some("other.example".into()),
            path: Some(PathModifier::Full("/moved".into())),
            status_code: Some(302),
            ..Default::default()
        })]
    );

    let split = &got.rules[2].backends;
    assert_eq!(
        (
            split[0].kind.as_str(),
            split[0].name.as_str(),
            split[0].weight
        ),
        ("Hostname", "a.example.com", 80)
    );
    assert_eq!(
        (
            split[1].name.as_str(),
            split[1].namespace.as_deref(),
            split[1].weight
        ),
        ("reviews", Some("ns3"), 20)
    );
}

#[test]
fn virtual_service_errors_name_the_field() {
    let err = vs(r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad}
spec:
  hosts: [x]
  http:
  - match: [{uri: {exact: /a, prefix: /b}}]
    route: [{destination: {host: x}}]
"#)
    .unwrap_err();
    assert!(err.contains("spec.http[0].match[0].uri"), "{err}");
    let err = vs(r#"
apiVersion: networking.istio.io/v1alpha3
kind: VirtualService
metadata: {name: bad}
spec:
  http:
  - timeout: soon
    route: [{destination: {host: x}}]
"#)
    .unwrap_err();
    assert!(err.contains("spec.http[0].timeout"), "{err}");
}
