//! Route status tables: each parent kind and istiod's reasons and messages, ResolvedRefs
//! problems, and the merge with the current status (other controllers' parents kept, ours
//! replaced or dropped, transition times kept while a status holds).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::*;
use crate::kube::objects::parse_yaml;

/// A mesh as the resolver sees it.
#[derive(Default)]
struct Mesh {
    /// `ns/name` -> asks for a waypoint.
    services: BTreeMap<String, bool>,
    entries: BTreeMap<String, bool>,
    waypoints: BTreeSet<String>,
    hostnames: BTreeSet<String>,
}

impl Resolve for Mesh {
    fn parent(&self, service_entry: bool, namespace: &str, name: &str) -> Option<bool> {
        let map = if service_entry {
            &self.entries
        } else {
            &self.services
        };
        map.get(&format!("{namespace}/{name}")).copied()
    }

    fn waypoint_gateway(&self, namespace: &str, name: &str) -> bool {
        self.waypoints.contains(&format!("{namespace}/{name}"))
    }

    fn service(&self, namespace: &str, name: &str) -> bool {
        self.services.contains_key(&format!("{namespace}/{name}"))
    }

    fn hostname(&self, namespace: &str, hostname: &str) -> bool {
        self.hostnames.contains(&format!("{namespace}/{hostname}"))
    }
}

fn mesh() -> Mesh {
    Mesh {
        services: [
            ("demo/web".to_string(), true),
            ("demo/web-v1".to_string(), true),
            ("demo/plain".to_string(), false),
        ]
        .into(),
        entries: [("demo/ext".to_string(), true)].into(),
        waypoints: ["demo/waypoint".to_string()].into(),
        hostnames: ["demo/api.example".to_string()].into(),
    }
}

/// The route and its parentRefs as written.
fn route(yaml: &str) -> (Route, Vec<Value>) {
    let value = parse_yaml(yaml).unwrap().remove(0);
    let route = match crate::kube::routes::http_route(&value).unwrap() {
        Object::HttpRoute(r) => r,
        other => panic!("{other:?}"),
    };
    let parents = value["spec"]["parentRefs"].as_array().cloned().unwrap();
    (route, parents)
}

fn status(yaml: &str, previous: Option<&Value>, now: &str) -> Value {
    let (route, parents) = route(yaml);
    route_status(&route, &parents, &mesh(), "cluster.local", previous, now)
}

/// `(type, status, reason, message)` of one parent's conditions.
fn conditions(parent: &Value) -> Vec<(String, String, String, String)> {
    parent["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let s = |f: &str| c[f].as_str().unwrap_or_default().to_string();
            (s("type"), s("status"), s("reason"), s("message"))
        })
        .collect()
}

fn condition(t: &str, s: &str, r: &str, m: &str) -> (String, String, String, String) {
    (t.into(), s.into(), r.into(), m.into())
}

const ROUTE: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: demo, generation: 4}
spec:
  parentRefs:
  - {group: "", kind: Service, name: web}
  - {group: "", kind: Service, name: plain, port: 80}
  - {group: "", kind: Service, name: gone}
  - {group: networking.istio.io, kind: ServiceEntry, name: ext}
  - {name: waypoint}
  - {name: ingress}
  - {group: example.com, kind: Thing, name: t}
  rules:
  - backendRefs: [{name: web-v1, port: 8080}]
"#;

#[test]
fn each_parent_kind_with_istiods_reasons_and_messages() {
    let got = status(ROUTE, None, "2026-01-01T00:00:00Z");
    let parents = got["parents"].as_array().unwrap();
    // Served parents only (not another Gateway, not another kind), in istiod's order for new
    // entries: descending by parentRef string.
    let refs: Vec<String> = parents
        .iter()
        .map(|p| parent_ref_string(&p["parentRef"], "demo"))
        .collect();
    assert_eq!(
        refs,
        [
            "networking.istio.io/ServiceEntry/ext//0.demo",
            "gateway.networking.k8s.io/Gateway/waypoint//0.demo",
            "/Service/web//0.demo",
            "/Service/plain//80.demo",
            "/Service/gone//0.demo",
        ]
    );
    for parent in parents {
        assert_eq!(parent["controllerName"], "istio.io/gateway-controller");
        for c in parent["conditions"].as_array().unwrap() {
            assert_eq!(c["observedGeneration"], 4);
            assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
        }
    }
    let valid = condition("Accepted", "True", "Accepted", "Route was valid");
    let resolved = condition(
        "ResolvedRefs",
        "True",
        "ResolvedRefs",
        "All references resolved",
    );
    let waypoints = |m: &str| condition("ResolvedWaypoints", "True", "ResolvedWaypoints", m);
    assert_eq!(
        conditions(&parents[2]),
        [
            valid.clone(),
            resolved.clone(),
            waypoints("All waypoints resolved")
        ]
    );
    assert_eq!(
        conditions(&parents[3]),
        [valid.clone(), resolved.clone(), waypoints(MISSING_LABEL)]
    );
    assert_eq!(
        conditions(&parents[4]),
        [
            condition(
                "Accepted",
                "False",
                "NoMatchingParent",
                "parent service: \"gone\" not found"
            ),
            resolved.clone(),
            waypoints("parent not found"),
        ]
    );
    assert_eq!(conditions(&parents[0])[0], valid);
    assert_eq!(conditions(&parents[1])[0], valid);
    // The parentRef is echoed as written.
    assert_eq!(
        parents[3]["parentRef"],
        json!({"group": "", "kind": "Service", "name": "plain", "port": 80})
    );
}

#[test]
fn resolved_refs_says_what_cannot_be_resolved() {
    let with_rules = |rules: &str| {
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: demo}}\nspec:\n  parentRefs: [{{group: \"\", kind: Service, name: web}}]\n  rules:\n{rules}\n"
        );
        let got = status(&yaml, None, "t");
        conditions(&got["parents"][0])[1].clone()
    };
    let cases = [
        (
            "  - backendRefs: [{name: missing, port: 80}]",
            (
                "False",
                "BackendNotFound",
                "backend(missing.demo.svc.cluster.local) not found",
            ),
        ),
        (
            "  - backendRefs: [{name: web-v1}]",
            (
                "False",
                "InvalidDestination",
                "port is required in backendRef",
            ),
        ),
        (
            "  - backendRefs: [{group: example.com, kind: Thing, name: t, port: 80}]",
            (
                "False",
                "InvalidKind",
                "referencing unsupported backendRef: group \"example.com\" kind \"Thing\"",
            ),
        ),
        (
            "  - filters: [{type: ExtensionRef}]\n    backendRefs: [{name: web-v1, port: 80}]",
            (
                "False",
                "InvalidFilter",
                "unsupported filter type \"ExtensionRef\"",
            ),
        ),
        (
            "  - backendRefs: [{group: networking.istio.io, kind: Hostname, name: api.example, port: 443}]",
            ("True", "ResolvedRefs", "All references resolved"),
        ),
        (
            // A zero-weight backend is never resolved.
            "  - backendRefs: [{name: missing, port: 80, weight: 0}]",
            ("True", "ResolvedRefs", "All references resolved"),
        ),
        (
            "  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: nowhere, port: 80}}}]\n    backendRefs: [{name: missing, port: 80}]",
            (
                "False",
                "BackendNotFound",
                "backend(missing.demo.svc.cluster.local) not found; backend(nowhere.demo.svc.cluster.local) not found",
            ),
        ),
    ];
    for (rules, (s, r, m)) in cases {
        assert_eq!(
            with_rules(rules),
            condition("ResolvedRefs", s, r, m),
            "{rules}"
        );
    }
}

#[test]
fn the_current_status_is_merged_as_istiod_merges_it() {
    let first = status(ROUTE, None, "t1");
    // Another controller's parent, and a parent of ours the route no longer has.
    let mut previous = first.clone();
    let parents = previous["parents"].as_array_mut().unwrap();
    parents.insert(
        0,
        json!({"parentRef": {"name": "other"}, "controllerName": "example.com/ctl", "conditions": []}),
    );
    parents.push(json!({
        "parentRef": {"group": "", "kind": "Service", "name": "removed"},
        "controllerName": "istio.io/gateway-controller",
        "conditions": [],
    }));
    previous["extra"] = json!("kept");
    let again = status(ROUTE, Some(&previous), "t2");
    let parents = again["parents"].as_array().unwrap();
    assert_eq!(parents[0]["controllerName"], "example.com/ctl");
    assert_eq!(parents.len(), 6);
    assert!(!parents.iter().any(|p| p["parentRef"]["name"] == "removed"));
    assert_eq!(again["extra"], "kept");
    // Unchanged statuses keep their transition time.
    for p in &parents[1..] {
        for c in p["conditions"].as_array().unwrap() {
            assert_eq!(c["lastTransitionTime"], "t1", "{p}");
        }
    }
    assert_eq!(
        without_times(&again["parents"][1]),
        without_times(&first["parents"][0])
    );
    // A parent that appears: its Accepted turns true at the new time; the others keep t1.
    let mut mesh = mesh();
    mesh.services.insert("demo/gone".into(), true);
    let (route, refs) = route(ROUTE);
    let later = route_status(&route, &refs, &mesh, "cluster.local", Some(&again), "t3");
    let gone = later["parents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["parentRef"]["name"] == "gone")
        .unwrap();
    assert_eq!(gone["conditions"][0]["status"], "True");
    assert_eq!(gone["conditions"][0]["lastTransitionTime"], "t3");
    assert_eq!(gone["conditions"][1]["lastTransitionTime"], "t1");
}
