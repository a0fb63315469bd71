//! What waypoints read from the snapshot besides resources: the AuthorizationPolicies and
//! RequestAuthentications with `targetRefs`, and the fetched key sets. Each is one shared
//! slice, replaced only when one of its items changes, and a change publishes a snapshot even
//! when no ztunnel resource or status changed with it.

use std::sync::Arc;

use super::support::*;
use crate::discovery::model::{
    AuthorizationPolicy, Jwks, JwtRule, Kind, ObjectRef, PolicyRule, PolicyTargetRef,
    RequestAuthentication,
};
use crate::discovery::{Index, Object, Settings};

fn on_service(name: &str) -> Vec<PolicyTargetRef> {
    vec![PolicyTargetRef {
        kind: "Service".into(),
        name: name.into(),
        ..Default::default()
    }]
}

fn authentication(name: &str, issuer: &str, creation: Option<&str>) -> RequestAuthentication {
    RequestAuthentication {
        name: name.into(),
        namespace: NS.into(),
        target_refs: on_service("web"),
        jwt_rules: vec![JwtRule {
            issuer: issuer.into(),
            ..Default::default()
        }],
        creation: creation.map(str::to_string),
        ..Default::default()
    }
}

fn jwks(name: &str, keys: &str) -> Object {
    Object::Jwks(Jwks {
        name: name.into(),
        keys: keys.into(),
    })
}

fn names(index: &mut Index) -> Vec<String> {
    index
        .snapshot()
        .waypoint_authentications
        .iter()
        .map(|ra| ra.name.clone())
        .collect()
}

#[test]
fn request_authentications_with_target_refs_are_listed_oldest_first() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::RequestAuthentication(authentication(
        "newer",
        "i",
        Some("2026-02-01T00:00:00Z"),
    )));
    index.apply(Object::RequestAuthentication(authentication(
        "older",
        "i",
        Some("2026-01-01T00:00:00Z"),
    )));
    index.apply(Object::RequestAuthentication(authentication(
        "undated", "i", None,
    )));
    // A selector one is a sidecar's: kept, not listed.
    index.apply(Object::RequestAuthentication(RequestAuthentication {
        target_refs: Vec::new(),
        selector: Some(labels(&[("app", "web")])),
        ..authentication("sidecar", "i", None)
    }));
    assert!(index.has_unpublished());
    assert_eq!(names(&mut index), ["older", "newer", "undated"]);
    assert_eq!(index.refs(Kind::RequestAuthentication).len(), 4);
    // Another revision's is absent.
    let mut canary = Index::new(Settings {
        revision: "stable".into(),
        ..Settings::default()
    });
    canary.apply(Object::RequestAuthentication(RequestAuthentication {
        revision: Some("canary".into()),
        ..authentication("canary", "i", None)
    }));
    assert!(names(&mut canary).is_empty());
}

#[test]
fn the_slice_is_shared_until_an_item_changes() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::RequestAuthentication(authentication(
        "a", "i", None,
    )));
    let first = index.snapshot();
    // A selector-only object and an unchanged re-apply: the same slice, nothing to publish
    // for the re-apply.
    index.apply(Object::RequestAuthentication(authentication(
        "a", "i", None,
    )));
    assert!(!index.has_unpublished());
    index.apply(Object::RequestAuthentication(RequestAuthentication {
        target_refs: Vec::new(),
        ..authentication("sidecar", "i", None)
    }));
    let second = index.snapshot();
    assert!(Arc::ptr_eq(
        &first.waypoint_authentications,
        &second.waypoint_authentications
    ));
    // A rule changes: a new slice.
    index.apply(Object::RequestAuthentication(authentication(
        "a", "j", None,
    )));
    let third = index.snapshot();
    assert!(!Arc::ptr_eq(
        &second.waypoint_authentications,
        &third.waypoint_authentications
    ));
    assert_eq!(third.waypoint_authentications[0].jwt_rules[0].issuer, "j");
    index.delete(&ObjectRef::new(Kind::RequestAuthentication, NS, "a"));
    assert!(index.snapshot().waypoint_authentications.is_empty());
}

#[test]
fn key_sets_are_kept_by_name_and_a_relist_is_the_truth() {
    let mut index = Index::new(Settings::default());
    index.apply(jwks("https://b/keys", r#"{"keys":["b"]}"#));
    index.apply(jwks("https://a/keys", r#"{"keys":["a"]}"#));
    let snapshot = index.snapshot();
    assert_eq!(
        snapshot.key_set("https://a/keys").map(|j| j.keys.as_str()),
        Some(r#"{"keys":["a"]}"#)
    );
    assert!(snapshot.key_set("https://c/keys").is_none());
    let listed: Vec<&str> = snapshot.jwks.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(listed, ["https://a/keys", "https://b/keys"]);
    // The same keys again: no change.
    index.apply(jwks("https://a/keys", r#"{"keys":["a"]}"#));
    assert!(!index.has_unpublished());
    // A relist with a different set.
    index.reset(
        Kind::Jwks,
        vec![jwks("https://c/keys", r#"{"keys":["c"]}"#)],
    );
    let relisted = index.snapshot();
    let listed: Vec<&str> = relisted.jwks.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(listed, ["https://c/keys"]);
    index.delete(&ObjectRef::new(Kind::Jwks, "", "https://c/keys"));
    assert!(index.snapshot().jwks.is_empty());
}

#[test]
fn a_relist_of_request_authentications_with_a_different_set_converges() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::RequestAuthentication(authentication(
        "a", "i", None,
    )));
    index.apply(Object::RequestAuthentication(authentication(
        "b", "i", None,
    )));
    index.snapshot();
    index.reset(
        Kind::RequestAuthentication,
        vec![
            Object::RequestAuthentication(authentication("b", "changed", None)),
            Object::RequestAuthentication(authentication("c", "i", None)),
        ],
    );
    let snapshot = index.snapshot();
    let got: Vec<(&str, &str)> = snapshot
        .waypoint_authentications
        .iter()
        .map(|ra| (ra.name.as_str(), ra.jwt_rules[0].issuer.as_str()))
        .collect();
    assert_eq!(got, [("b", "changed"), ("c", "i")]);
}

/// A waypoint policy's rules changing while its status stays the same (a manifest has no
/// generation) still publishes, with a new policy slice; a selector policy's change leaves
/// the waypoints' slice alone.
#[test]
fn a_waypoint_policy_change_publishes_even_without_a_status_change() {
    let policy = |methods: &[&str]| AuthorizationPolicy {
        name: "p".into(),
        namespace: NS.into(),
        has_target_refs: true,
        target_refs: on_service("web"),
        rules: vec![PolicyRule {
            to: vec![crate::discovery::model::Operation {
                methods: methods.iter().map(|m| m.to_string()).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut index = Index::new(Settings::default());
    index.apply(Object::Namespace(ns(NS)));
    index.apply(Object::AuthorizationPolicy(policy(&["GET"])));
    let before = index.snapshot();
    let changes = index.apply(Object::AuthorizationPolicy(policy(&["POST"])));
    assert!(
        changes.is_empty(),
        "no ztunnel resource or status: {changes:?}"
    );
    assert!(index.has_unpublished());
    let after = index.snapshot();
    assert!(!Arc::ptr_eq(
        &before.waypoint_policies,
        &after.waypoint_policies
    ));
    assert_eq!(after.waypoint_policies[0].rules[0].to[0].methods, ["POST"]);
    // A ztunnel policy (a selector, no targetRefs).
    index.apply(Object::AuthorizationPolicy(AuthorizationPolicy {
        name: "ztunnel".into(),
        namespace: NS.into(),
        selector: Some(labels(&[("app", "web")])),
        ..Default::default()
    }));
    let later = index.snapshot();
    assert!(Arc::ptr_eq(
        &after.waypoint_policies,
        &later.waypoint_policies
    ));
}
