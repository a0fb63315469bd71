//! DestinationRules in the index: stored, handed to waypoints through the snapshot oldest
//! first, one shared slice until a rule changes, a published snapshot for a change that builds
//! no ztunnel resource, istiod's revision filter, and a relist as the truth.

use std::sync::Arc;

use super::support::*;
use crate::discovery::model::{DestinationRule, Kind};
use crate::discovery::{Index, Object, ObjectRef, Settings};

fn rule(namespace: &str, name: &str, host: &str, creation: &str) -> DestinationRule {
    DestinationRule {
        name: name.into(),
        namespace: namespace.into(),
        host: host.into(),
        creation: Some(creation.into()),
        ..Default::default()
    }
}

fn names(index: &mut Index) -> Vec<String> {
    index
        .snapshot()
        .destination_rules
        .iter()
        .map(|r| format!("{}/{}", r.namespace, r.name))
        .collect()
}

#[test]
fn rules_reach_the_snapshot_oldest_first_and_alone_publish() {
    let mut index = index_of([Object::Namespace(ns(NS))]);
    let first = index.snapshot();
    assert!(first.destination_rules.is_empty());
    // A rule changes no ztunnel resource, yet a snapshot must follow it.
    let changes = index.apply(Object::DestinationRule(rule(
        NS,
        "newer",
        "a",
        "2026-01-02T00:00:00Z",
    )));
    assert!(changes.is_empty());
    assert!(index.has_unpublished());
    index.apply(Object::DestinationRule(rule(
        "other",
        "older",
        "a",
        "2026-01-01T00:00:00Z",
    )));
    let with_rules = index.snapshot();
    assert!(!index.has_unpublished());
    assert_eq!(
        with_rules
            .destination_rules
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["older", "newer"]
    );
    // Unrelated changes share the slice; a rule change replaces it.
    index.apply(Object::Pod(pod(NS, "p", "10.0.0.1").into()));
    let unrelated = index.snapshot();
    assert!(Arc::ptr_eq(
        &with_rules.destination_rules,
        &unrelated.destination_rules
    ));
    // Applying the same rule again is no change.
    index.apply(Object::DestinationRule(rule(
        NS,
        "newer",
        "a",
        "2026-01-02T00:00:00Z",
    )));
    assert!(!index.has_unpublished());
    index.delete(&ObjectRef::new(Kind::DestinationRule, NS, "newer"));
    assert!(index.has_unpublished());
    let deleted = index.snapshot();
    assert!(!Arc::ptr_eq(
        &unrelated.destination_rules,
        &deleted.destination_rules
    ));
    assert_eq!(names(&mut index), ["other/older"]);
}

#[test]
fn another_revisions_rule_counts_as_absent() {
    let mut index = Index::new(Settings {
        revision: "canary".into(),
        ..Settings::default()
    });
    let mut labelled = rule(NS, "r", "a", "2026-01-01T00:00:00Z");
    labelled.revision = Some("stable".into());
    index.apply(Object::DestinationRule(labelled.clone()));
    assert!(names(&mut index).is_empty());
    labelled.revision = Some("canary".into());
    index.apply(Object::DestinationRule(labelled));
    assert_eq!(names(&mut index), ["demo/r"]);
}

#[test]
fn a_relist_is_the_truth() {
    let mut index = index_of([
        Object::DestinationRule(rule(NS, "gone", "a", "2026-01-01T00:00:00Z")),
        Object::DestinationRule(rule(NS, "kept", "b", "2026-01-01T00:00:00Z")),
    ]);
    assert_eq!(names(&mut index), ["demo/gone", "demo/kept"]);
    let mut kept = rule(NS, "kept", "b.example.com", "2026-01-01T00:00:00Z");
    kept.export_to = vec![".".into()];
    index.reset(
        Kind::DestinationRule,
        vec![
            Object::DestinationRule(kept.clone()),
            Object::DestinationRule(rule(NS, "new", "c", "2026-01-03T00:00:00Z")),
        ],
    );
    let snapshot = index.snapshot();
    let rules: Vec<DestinationRule> = snapshot
        .destination_rules
        .iter()
        .map(|r| (**r).clone())
        .collect();
    assert_eq!(rules, [kept, rule(NS, "new", "c", "2026-01-03T00:00:00Z")]);
}
