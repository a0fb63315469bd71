//! DestinationRules on the worked example: a rule reaches the bound service's cluster (and
//! only it), a port-level setting picks its port, a rule change rebuilds the config and
//! changes no listener, and a change elsewhere rebuilds nothing. Also: a waypoint policy edit
//! alone is published, as a rule change is.

use std::sync::Arc;

use prost::Message;

use super::{REVIEWS_HTTP, WORKED_EXAMPLE, config_of, index, mentions, objects, proxy};
use crate::discovery::model::Kind;
use crate::discovery::{Event, ObjectRef};
use crate::pb::envoy::config::cluster::v3::{Cluster, cluster::LbPolicy};
use crate::waypoint::{Rebuild, WaypointSettings};

const RULE: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    connectionPool: {tcp: {maxConnections: 7}}
    tls: {mode: SIMPLE, sni: reviews.example.com}
    portLevelSettings:
    - port: {number: 9080}
      loadBalancer: {simple: RANDOM}
      tls: {mode: SIMPLE, sni: port.example.com}
"#;

fn cluster(config: &crate::waypoint::WaypointConfig, name: &str) -> Cluster {
    Cluster::decode(config.clusters[name].value()).unwrap()
}

#[test]
fn a_rule_reaches_its_services_cluster_and_a_change_rebuilds_it() {
    let mut index = index(WORKED_EXAMPLE);
    let before = index.snapshot();
    let proxy = proxy();
    let (id, config) = config_of(&before, &proxy);
    assert_eq!(
        cluster(&config, REVIEWS_HTTP).lb_policy,
        LbPolicy::LeastRequest as i32
    );

    for object in objects(RULE) {
        index.handle(Event::Apply(object));
    }
    // The rule builds nothing for ztunnel, yet a snapshot follows it.
    assert!(index.has_unpublished());
    let after = index.snapshot();
    assert_eq!(config.rebuild_needed(&id, &after), Rebuild::Everything);
    let next = config.update(&id, &after, &WaypointSettings::default());
    // 9080 has a port-level setting: it replaces the top level whole.
    let reviews = cluster(&next, REVIEWS_HTTP);
    assert_eq!(reviews.lb_policy, LbPolicy::Random as i32);
    assert!(mentions(&next.clusters[REVIEWS_HTTP], "port.example.com"));
    assert!(!mentions(
        &next.clusters[REVIEWS_HTTP],
        "reviews.example.com"
    ));
    let thresholds = &reviews.circuit_breakers.unwrap().thresholds[0];
    assert_eq!(thresholds.max_connections.unwrap().value, u32::MAX);
    assert!(mentions(
        &next.clusters[REVIEWS_HTTP],
        "/apis/networking.istio.io/v1/namespaces/default/destination-rule/reviews"
    ));
    // The other clusters and every listener are as they were.
    for (name, resource) in &next.listeners {
        assert_eq!(resource.version, config.listeners[name].version, "{name}");
    }
    for name in ["main_internal", "encap", "connect_originate"] {
        assert_eq!(next.clusters[name].version, config.clusters[name].version);
    }
    // The same as a build from nothing.
    let (_, cold) = config_of(&after, &proxy);
    assert_eq!(
        next.clusters[REVIEWS_HTTP].version,
        cold.clusters[REVIEWS_HTTP].version
    );

    // Without the port-level setting, the top level applies.
    let top_level = RULE.split("    portLevelSettings:").next().unwrap();
    for object in objects(top_level) {
        index.handle(Event::Apply(object));
    }
    let edited = index.snapshot();
    assert_eq!(next.rebuild_needed(&id, &edited), Rebuild::Everything);
    let top = next.update(&id, &edited, &WaypointSettings::default());
    let reviews = cluster(&top, REVIEWS_HTTP);
    assert_eq!(reviews.lb_policy, LbPolicy::RoundRobin as i32);
    assert_eq!(
        reviews.circuit_breakers.unwrap().thresholds[0]
            .max_connections
            .unwrap()
            .value,
        7
    );
    assert!(mentions(&top.clusters[REVIEWS_HTTP], "reviews.example.com"));

    // A change that is not a rule keeps the rules' slice, and so rebuilds nothing here.
    let unrelated = WORKED_EXAMPLE
        .split("---")
        .find(|doc| doc.contains("name: reviews-2"))
        .unwrap()
        .replace("reviews-2", "ratings-1")
        .replace("app: reviews", "app: ratings")
        .replace("10.244.2.8", "10.244.3.1");
    for object in objects(&unrelated) {
        index.handle(Event::Apply(object));
    }
    let later = index.snapshot();
    assert!(Arc::ptr_eq(
        &edited.destination_rules,
        &later.destination_rules
    ));
    assert_eq!(top.rebuild_needed(&id, &later), Rebuild::Nothing);

    // Deleting the rule brings the defaults back.
    index.handle(Event::Delete(ObjectRef::new(
        Kind::DestinationRule,
        "default",
        "reviews",
    )));
    let deleted = index.snapshot();
    let plain = top.update(&id, &deleted, &WaypointSettings::default());
    assert_eq!(
        plain.clusters[REVIEWS_HTTP].version,
        config.clusters[REVIEWS_HTTP].version
    );
}

#[test]
fn a_consistent_hash_reaches_the_default_route() {
    let mut index = index(WORKED_EXAMPLE);
    let (id, config) = config_of(&index.snapshot(), &proxy());
    let hashed = RULE
        .split("    portLevelSettings:")
        .next()
        .unwrap()
        .replace(
            "loadBalancer: {simple: ROUND_ROBIN}",
            "loadBalancer: {consistentHash: {httpHeaderName: x-session}}",
        );
    for object in objects(&hashed) {
        index.handle(Event::Apply(object));
    }
    let snapshot = index.snapshot();
    let next = config.update(&id, &snapshot, &WaypointSettings::default());
    assert_eq!(
        cluster(&next, REVIEWS_HTTP).lb_policy,
        LbPolicy::RingHash as i32
    );
    assert!(!mentions(&config.listeners["main_internal"], "x-session"));
    assert!(mentions(&next.listeners["main_internal"], "x-session"));
}

#[test]
fn a_rule_for_another_host_or_with_a_selector_changes_no_cluster() {
    let mut index = index(WORKED_EXAMPLE);
    let (_, config) = config_of(&index.snapshot(), &proxy());
    let other = RULE.replace("host: reviews", "host: ratings");
    let selected = RULE
        .replace("name: reviews, namespace", "name: selected, namespace")
        .replace(
            "  host: reviews\n",
            "  host: reviews\n  workloadSelector: {matchLabels: {app: productpage}}\n",
        );
    for object in objects(&(other + "---" + &selected)) {
        index.handle(Event::Apply(object));
    }
    let (_, next) = config_of(&index.snapshot(), &proxy());
    for (name, resource) in &next.clusters {
        assert_eq!(resource.version, config.clusters[name].version, "{name}");
    }
}

/// Like a rule, a waypoint policy builds no ztunnel resource, and an edit of its rules may
/// change no status condition (the manifests source has no generations): the snapshot must
/// follow it all the same.
#[test]
fn an_edit_of_a_waypoint_policy_alone_publishes() {
    let mut index = index(WORKED_EXAMPLE);
    let _ = index.snapshot();
    let edited = WORKED_EXAMPLE
        .split("---")
        .last()
        .unwrap()
        .replace("GET", "POST");
    for object in objects(&edited) {
        index.handle(Event::Apply(object));
    }
    assert!(index.has_unpublished());
    let snapshot = index.snapshot();
    let (_, config) = config_of(&snapshot, &proxy());
    assert!(mentions(&config.listeners["main_internal"], "POST"));
}
