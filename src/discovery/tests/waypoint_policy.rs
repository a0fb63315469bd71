//! istiod's implicit waypoint policy (`PILOT_AUTO_ALLOW_WAYPOINT_POLICY`; docs/authorization.md):
//! the Authorization each waypoint with instances gets, which workloads list it, and that it
//! follows its instances and bindings incrementally.

use super::support::*;
use crate::discovery::model::{AllowedNamespaces, Gateway, Listener};
use crate::discovery::{Index, Object, Settings};
use crate::pb::security::{Action, Authorization, Scope, string_match::MatchType};
use prost::Message;

const WP: &str = "demo/istio_allow_waypoint_demo_wp";
const WP2: &str = "demo/istio_allow_waypoint_demo_wp2";

fn waypoint(name: &str, address: &str) -> Object {
    Object::Gateway(Gateway {
        labels: labels(&[("istio.io/waypoint-for", "all")]),
        listeners: vec![Listener {
            name: "mesh".into(),
            port: 15008,
            protocol: "HBONE".into(),
            allowed: Some(AllowedNamespaces::Same),
        }],
        ..ready_gateway(NS, name, address)
    })
}

/// A pod of the waypoint `gateway`, running as `account`.
fn instance(name: &str, ip: &str, gateway: &str, account: &str) -> Object {
    let mut p = pod_with(
        NS,
        name,
        ip,
        &[("gateway.networking.k8s.io/gateway-name", gateway)],
    );
    p.service_account = account.into();
    Object::Pod(p.into())
}

fn mesh() -> Vec<Object> {
    vec![
        Object::Namespace(ns(NS)),
        waypoint("wp", "10.9.0.1"),
        instance("wp-1", "10.0.9.1", "wp", "wp-sa"),
        instance("wp-2", "10.0.9.2", "wp", "another"),
        // Bound itself.
        Object::Pod(pod_with(NS, "web", "10.0.0.1", &[("istio.io/use-waypoint", "wp")]).into()),
        // Bound through its service.
        Object::Pod(pod_with(NS, "api-1", "10.0.0.2", &[("app", "api")]).into()),
        Object::Service({
            let mut s = svc(NS, "api", "10.96.0.1", &[("app", "api")]);
            s.labels = labels(&[("istio.io/use-waypoint", "wp")]);
            s
        }),
        // Not behind a waypoint.
        Object::Pod(pod_with(NS, "plain", "10.0.0.3", &[("app", "plain")]).into()),
    ]
}

fn index(auto_allow: bool, objects: Vec<Object>) -> Index {
    let mut index = Index::new(Settings {
        auto_allow_waypoint_policy: auto_allow,
        ..Settings::default()
    });
    for object in objects {
        index.apply(object);
    }
    index
}

fn authorization(index: &mut Index, name: &str) -> Option<Authorization> {
    let snapshot = index.snapshot();
    let resource = snapshot.authorizations.get(name)?;
    Some(Authorization::decode(resource.value()).expect("decode Authorization"))
}

fn references(index: &mut Index, pod: &str) -> Vec<String> {
    workload(index, &uid(NS, pod)).authorization_policies
}

#[test]
fn a_waypoint_with_instances_allows_their_identities() {
    let mut index = index(true, mesh());
    let policy = authorization(&mut index, WP).expect("the implicit policy");
    assert_eq!(policy.name, "istio_allow_waypoint_demo_wp");
    assert_eq!(policy.namespace, NS);
    assert_eq!(policy.scope, Scope::WorkloadSelector as i32);
    assert_eq!(policy.action, Action::Allow as i32);
    let [rule] = &policy.rules[..] else {
        panic!("one rule: {policy:?}")
    };
    let [clause] = &rule.clauses[..] else {
        panic!("one clause: {policy:?}")
    };
    let [m] = &clause.matches[..] else {
        panic!("one match: {policy:?}")
    };
    let principals: Vec<&str> = m
        .principals
        .iter()
        .map(|p| match &p.match_type {
            Some(MatchType::Exact(e)) => e.as_str(),
            other => panic!("not exact: {other:?}"),
        })
        .collect();
    // Sorted, with the full trust domain (not the wire's empty cluster.local).
    assert_eq!(
        principals,
        [
            "cluster.local/ns/demo/sa/another",
            "cluster.local/ns/demo/sa/wp-sa"
        ]
    );
    let mut rest = m.clone();
    rest.principals.clear();
    assert_eq!(rest, Default::default(), "principals only");

    assert_eq!(references(&mut index, "web"), [WP]);
    assert_eq!(references(&mut index, "api-1"), [WP]);
    assert!(references(&mut index, "plain").is_empty());
    // The waypoint's own pods use no waypoint.
    assert!(references(&mut index, "wp-1").is_empty());
}

#[test]
fn off_by_default() {
    let mut index = index(false, mesh());
    assert!(authorization(&mut index, WP).is_none());
    assert!(references(&mut index, "web").is_empty());
    assert!(references(&mut index, "api-1").is_empty());
}

#[test]
fn the_policy_follows_its_instances_and_the_bindings() {
    let mut index = index(true, mesh());
    // One instance left: still there, with one identity.
    index.delete(&crate::discovery::ObjectRef::new(
        crate::discovery::Kind::Pod,
        NS,
        "wp-2",
    ));
    let policy = authorization(&mut index, WP).unwrap();
    assert_eq!(policy.rules[0].clauses[0].matches[0].principals.len(), 1);
    // No instance: no policy, and nobody lists it.
    index.delete(&crate::discovery::ObjectRef::new(
        crate::discovery::Kind::Pod,
        NS,
        "wp-1",
    ));
    assert!(authorization(&mut index, WP).is_none());
    assert!(references(&mut index, "web").is_empty());
    assert!(references(&mut index, "api-1").is_empty());
    // An instance comes back.
    index.apply(instance("wp-3", "10.0.9.3", "wp", "wp-sa"));
    assert!(authorization(&mut index, WP).is_some());
    assert_eq!(references(&mut index, "web"), [WP]);
    assert_eq!(references(&mut index, "api-1"), [WP]);
    // The service stops using the waypoint: its member stops listing the policy.
    index.apply(Object::Service(svc(
        NS,
        "api",
        "10.96.0.1",
        &[("app", "api")],
    )));
    assert!(references(&mut index, "api-1").is_empty());
    // The waypoint goes away: no policy, no references.
    index.delete(&crate::discovery::ObjectRef::new(
        crate::discovery::Kind::Gateway,
        NS,
        "wp",
    ));
    assert!(authorization(&mut index, WP).is_none());
    assert!(references(&mut index, "web").is_empty());
}

#[test]
fn the_services_waypoints_come_first_then_the_workloads_own() {
    let mut objects = mesh();
    objects.extend([
        waypoint("wp2", "10.9.0.2"),
        instance("wp2-1", "10.0.9.4", "wp2", "wp2-sa"),
        // Its own waypoint is wp2; its service's is wp.
        Object::Pod(
            pod_with(
                NS,
                "api-2",
                "10.0.0.4",
                &[("app", "api"), ("istio.io/use-waypoint", "wp2")],
            )
            .into(),
        ),
    ]);
    let mut index = index(true, objects);
    assert_eq!(references(&mut index, "api-2"), [WP, WP2]);
    // A workload whose service uses its own waypoint lists it once.
    index.apply(Object::Pod(
        pod_with(
            NS,
            "api-3",
            "10.0.0.5",
            &[("app", "api"), ("istio.io/use-waypoint", "wp")],
        )
        .into(),
    ));
    assert_eq!(references(&mut index, "api-3"), [WP]);
}

#[test]
fn an_instance_re_emits_exactly_the_policy_and_the_workloads_behind_the_waypoint() {
    let without_instances: Vec<Object> = mesh()
        .into_iter()
        .filter(|o| !matches!(o, Object::Pod(p) if p.name().starts_with("wp-")))
        .collect();
    let mut index = index(true, without_instances);
    assert!(authorization(&mut index, WP).is_none());
    index.snapshot();
    // The first instance: the policy appears, and the workloads behind the waypoint list it.
    let changes = index.apply(instance("wp-1", "10.0.9.1", "wp", "wp-sa"));
    assert_eq!(changes.authorizations.upserted, set(&[WP]));
    assert_eq!(
        changes.addresses.upserted,
        set(&[uid(NS, "wp-1"), uid(NS, "web"), uid(NS, "api-1")])
    );
    index.snapshot();
    // A second identity changes the policy only.
    let changes = index.apply(instance("wp-2", "10.0.9.2", "wp", "another"));
    assert_eq!(changes.authorizations.upserted, set(&[WP]));
    assert_eq!(changes.addresses.upserted, set(&[uid(NS, "wp-2")]));
}

/// istiod lists one service account per instance pod (`slices.Sort`, no de-duplication), so a
/// second replica of the same account repeats its principal.
#[test]
fn each_instance_pod_lists_its_account_as_istiod_does() {
    let mut objects = mesh();
    objects.push(instance("wp-3", "10.0.9.3", "wp", "wp-sa"));
    let mut index = index(true, objects);
    let policy = authorization(&mut index, WP).unwrap();
    let principals: Vec<String> = policy.rules[0].clauses[0].matches[0]
        .principals
        .iter()
        .map(|p| match &p.match_type {
            Some(MatchType::Exact(e)) => e.clone(),
            other => panic!("not exact: {other:?}"),
        })
        .collect();
    assert_eq!(
        principals,
        [
            "cluster.local/ns/demo/sa/another",
            "cluster.local/ns/demo/sa/wp-sa",
            "cluster.local/ns/demo/sa/wp-sa"
        ]
    );
}
