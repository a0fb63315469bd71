//! Table tests of rule selection against istiod's (`PushContext.destinationRule`,
//! `mergeDestinationRule`, `SidecarScope.DestinationRule` inbound): scope by namespace and
//! `exportTo`, exact before wildcard hosts, short names, merging, selectors, and port-level
//! settings.

use std::sync::Arc;

use super::*;
use crate::discovery::model::{Labels, LoadBalancer, PortTrafficPolicy, SimpleLb, Subset};

const ROOT: &str = "istio-system";
const DOMAIN: &str = "cluster.local";
const REVIEWS: &str = "reviews.bookinfo.svc.cluster.local";

/// A rule named `name` in `namespace` for `host`, created at second `age`, whose policy is a
/// load balancer named by `lb` (so a test sees which rule's policy applies).
fn rule(namespace: &str, name: &str, host: &str, age: u32, lb: SimpleLb) -> DestinationRule {
    DestinationRule {
        name: name.into(),
        namespace: namespace.into(),
        host: host.into(),
        creation: Some(format!("2026-01-01T00:00:{age:02}Z")),
        traffic_policy: Some(Box::new(policy(lb))),
        ..Default::default()
    }
}

fn policy(lb: SimpleLb) -> TrafficPolicy {
    TrafficPolicy {
        load_balancer: Some(LoadBalancer {
            simple: Some(lb),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn exported(mut rule: DestinationRule, to: &[&str]) -> DestinationRule {
    rule.export_to = to.iter().map(|s| s.to_string()).collect();
    rule
}

fn index(rules: Vec<DestinationRule>) -> DestinationRules {
    let mut rules: Vec<Arc<DestinationRule>> = rules.into_iter().map(Arc::new).collect();
    rules.sort_by(|a, b| a.age_order(b));
    DestinationRules::new(&rules, ROOT, DOMAIN)
}

/// The applying rule's `ns/name` for `host` of `service_ns` at a waypoint in `waypoint_ns`.
fn chosen(rules: &DestinationRules, waypoint_ns: &str, service_ns: &str, host: &str) -> String {
    rules
        .for_service(waypoint_ns, service_ns, host)
        .map(|r| r.from.join("+"))
        .unwrap_or_default()
}

#[test]
fn scope_waypoint_namespace_then_service_namespace_then_root() {
    use SimpleLb::*;
    let all = vec![
        rule("bookinfo", "in-service-ns", "reviews", 1, Random),
        rule("wp-ns", "in-waypoint-ns", REVIEWS, 2, RoundRobin),
        rule(ROOT, "in-root", REVIEWS, 3, LeastRequest),
    ];
    let rules = index(all.clone());
    // A waypoint in its own namespace: its namespace's rule first.
    assert_eq!(
        chosen(&rules, "wp-ns", "bookinfo", REVIEWS),
        "wp-ns/in-waypoint-ns"
    );
    // The Service's namespace (the short host resolved there) for a waypoint beside it.
    assert_eq!(
        chosen(&rules, "bookinfo", "bookinfo", REVIEWS),
        "bookinfo/in-service-ns"
    );
    // A waypoint elsewhere sees the Service namespace's exported rule.
    assert_eq!(
        chosen(&rules, "other", "bookinfo", REVIEWS),
        "bookinfo/in-service-ns"
    );
    // Without it, the root namespace's.
    let rules = index(all[1..].to_vec());
    assert_eq!(
        chosen(&rules, "other", "bookinfo", REVIEWS),
        "istio-system/in-root"
    );
    // None for another host.
    assert_eq!(
        chosen(
            &rules,
            "other",
            "bookinfo",
            "ratings.bookinfo.svc.cluster.local"
        ),
        ""
    );
}

#[test]
fn export_to_limits_who_sees_a_rule() {
    use SimpleLb::*;
    let private = exported(rule("bookinfo", "private", REVIEWS, 1, Random), &["."]);
    let to_wp = exported(rule("bookinfo", "to-wp", REVIEWS, 2, Random), &["wp-ns"]);
    let hidden = exported(rule(ROOT, "hidden", REVIEWS, 3, Random), &["~"]);
    let root_private = exported(rule(ROOT, "root-private", REVIEWS, 4, Random), &["."]);
    // A private rule applies in its namespace alone.
    let rules = index(vec![private.clone()]);
    assert_eq!(
        chosen(&rules, "bookinfo", "bookinfo", REVIEWS),
        "bookinfo/private"
    );
    assert_eq!(chosen(&rules, "wp-ns", "bookinfo", REVIEWS), "");
    // Exported to the waypoint's namespace by name: there, and not elsewhere.
    let rules = index(vec![to_wp.clone()]);
    assert_eq!(
        chosen(&rules, "wp-ns", "bookinfo", REVIEWS),
        "bookinfo/to-wp"
    );
    assert_eq!(chosen(&rules, "other", "bookinfo", REVIEWS), "");
    // `~` hides it from everyone; a private root rule is for the root namespace's proxies.
    let rules = index(vec![hidden, root_private]);
    assert_eq!(chosen(&rules, "other", "bookinfo", REVIEWS), "");
    assert_eq!(
        chosen(&rules, ROOT, "bookinfo", REVIEWS),
        "istio-system/root-private"
    );
}

#[test]
fn exact_host_before_the_most_specific_wildcard() {
    use SimpleLb::*;
    let rules = index(vec![
        rule("bookinfo", "everything", "*", 1, Random),
        rule("bookinfo", "local", "*.cluster.local", 2, Random),
        rule(
            "bookinfo",
            "namespace",
            "*.bookinfo.svc.cluster.local",
            3,
            Random,
        ),
        rule("bookinfo", "exact", REVIEWS, 4, Random),
        rule("bookinfo", "entry", "*.example.com", 5, Random),
    ]);
    let at = |host: &str| chosen(&rules, "bookinfo", "bookinfo", host);
    assert_eq!(at(REVIEWS), "bookinfo/exact");
    assert_eq!(
        at("ratings.bookinfo.svc.cluster.local"),
        "bookinfo/namespace"
    );
    assert_eq!(at("ratings.other.svc.cluster.local"), "bookinfo/local");
    assert_eq!(at("api.example.com"), "bookinfo/entry");
    assert_eq!(at("example.org"), "bookinfo/everything");
    // A wildcard ServiceEntry host: its own rule, else a wider wildcard.
    assert_eq!(at("*.example.com"), "bookinfo/entry");
    assert_eq!(at("*.api.example.com"), "bookinfo/entry");
}

#[test]
fn rules_for_one_host_merge_oldest_first() {
    use SimpleLb::*;
    let subset = |name: &str, version: &str| Subset {
        name: name.into(),
        labels: Labels::from_iter([("version".to_string(), version.to_string())]),
        traffic_policy: None,
    };
    let mut older = rule("bookinfo", "b-older", REVIEWS, 1, Random);
    older.subsets = vec![subset("v1", "1")];
    let mut newer = rule("bookinfo", "a-newer", REVIEWS, 2, RoundRobin);
    newer.subsets = vec![subset("v1", "one"), subset("v2", "2")];
    let mut no_policy = rule("bookinfo", "c-newest", REVIEWS, 3, Random);
    no_policy.traffic_policy = None;
    let rules = index(vec![newer, no_policy, older]);
    let merged = rules.for_service("bookinfo", "bookinfo", REVIEWS).unwrap();
    assert_eq!(
        merged.from,
        ["bookinfo/b-older", "bookinfo/a-newer", "bookinfo/c-newest"]
    );
    assert_eq!(merged.rule.name, "b-older");
    // The oldest policy; subsets concatenated, the first of a name kept.
    assert_eq!(merged.traffic_policy, Some(policy(Random)));
    let subsets: Vec<(&str, Option<&str>)> = merged
        .subsets
        .iter()
        .map(|s| (s.name.as_str(), s.labels.get("version")))
        .collect();
    assert_eq!(subsets, [("v1", Some("1")), ("v2", Some("2"))]);

    // A first rule without a policy takes the next one's.
    let mut first = rule("bookinfo", "first", REVIEWS, 1, Random);
    first.traffic_policy = None;
    let rules = index(vec![
        first,
        rule("bookinfo", "second", REVIEWS, 2, RoundRobin),
    ]);
    let merged = rules.for_service("bookinfo", "bookinfo", REVIEWS).unwrap();
    assert_eq!(merged.traffic_policy, Some(policy(RoundRobin)));
}

#[test]
fn rules_with_different_export_to_stay_apart_and_the_last_applies() {
    use SimpleLb::*;
    // istiod keeps them as two entries; the sidecar scope's loop returns the last.
    let rules = index(vec![
        rule("bookinfo", "public", REVIEWS, 1, Random),
        exported(rule("bookinfo", "private", REVIEWS, 2, RoundRobin), &["."]),
    ]);
    assert_eq!(
        chosen(&rules, "bookinfo", "bookinfo", REVIEWS),
        "bookinfo/private"
    );
    assert_eq!(
        chosen(&rules, "other", "bookinfo", REVIEWS),
        "bookinfo/public"
    );
    // A wider exportTo merges into a narrower (non-empty) one.
    let rules = index(vec![
        exported(rule("bookinfo", "narrow", REVIEWS, 1, Random), &["a"]),
        exported(
            rule("bookinfo", "wide", REVIEWS, 2, RoundRobin),
            &["a", "b"],
        ),
    ]);
    assert_eq!(
        chosen(&rules, "a", "bookinfo", REVIEWS),
        "bookinfo/narrow+bookinfo/wide"
    );
}

#[test]
fn a_rule_with_a_workload_selector_never_applies() {
    let mut selected = rule("bookinfo", "selected", REVIEWS, 1, SimpleLb::Random);
    selected.workload_selector = Some(Labels::from_iter([(
        "app".to_string(),
        "productpage".to_string(),
    )]));
    let rules = index(vec![selected.clone()]);
    assert_eq!(chosen(&rules, "bookinfo", "bookinfo", REVIEWS), "");
    let rules = index(vec![
        selected,
        rule("bookinfo", "plain", REVIEWS, 2, SimpleLb::Random),
    ]);
    assert_eq!(
        chosen(&rules, "bookinfo", "bookinfo", REVIEWS),
        "bookinfo/plain"
    );
}

#[test]
fn short_names_resolve_in_the_rules_namespace() {
    assert_eq!(
        resolve_short_name("reviews", "bookinfo", DOMAIN),
        "reviews.bookinfo.svc.cluster.local"
    );
    for host in ["*", "reviews.bookinfo", "10.0.0.1", "::1", "*.example.com"] {
        assert_eq!(resolve_short_name(host, "bookinfo", DOMAIN), host);
    }
}

#[test]
fn a_port_level_setting_replaces_the_top_level_policy() {
    let mut top = policy(SimpleLb::Random);
    top.outlier_detection = Some(Default::default());
    top.port_level = vec![PortTrafficPolicy {
        port: 9080,
        policy: policy(SimpleLb::RoundRobin),
    }];
    // Another port: the top level (port-level entries are not read further).
    assert_eq!(
        port_policy(Some(&top), 8080).unwrap().load_balancer,
        top.load_balancer
    );
    // The port: its own, with nothing inherited (no outlier detection).
    let port = port_policy(Some(&top), 9080).unwrap();
    assert_eq!(port, policy(SimpleLb::RoundRobin));
    assert_eq!(port_policy(None, 9080), None);
}
