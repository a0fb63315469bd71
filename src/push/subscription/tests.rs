//! Table tests of the pure delta xDS protocol decisions: subscriptions, request classification
//! and what each `TypeState` sends for a snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::discovery::model::{Kind, ObjectRef, PodFields, Service};
use crate::discovery::names::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use crate::discovery::snapshot::HISTORY;
use crate::discovery::tests::support::*;
use crate::discovery::{Index, Object, Snapshot, TypeKind};
use crate::pb::xds::{DeltaDiscoveryRequest, Status};
use crate::push::subscription::{
    Delta, InFlight, PUSH_WINDOW, RequestKind, Subscription, TypeState, WILDCARD, classify, split,
};

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn request(subscribe: &[&str], unsubscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE.into(),
        resource_names_subscribe: strings(subscribe),
        resource_names_unsubscribe: strings(unsubscribe),
        ..Default::default()
    }
}

/// Owned, sorted names, for comparing against a subscription's names.
fn owned_set<S: AsRef<str>>(names: &[S]) -> BTreeSet<String> {
    names.iter().map(|n| n.as_ref().to_string()).collect()
}

/// Names of the resources a delta sends, and the names it removes.
fn summary(delta: &Delta) -> (Vec<String>, Vec<String>) {
    let mut sent: Vec<String> = delta.resources.iter().map(|r| r.name.to_string()).collect();
    sent.sort();
    let mut removed = delta.removed.clone();
    removed.sort();
    (sent, removed)
}

fn assert_delta<S: AsRef<str>, R: AsRef<str>>(delta: &Delta, sent: &[S], removed: &[R]) {
    let sent: Vec<String> = sent.iter().map(|s| s.as_ref().to_string()).collect();
    let removed: Vec<String> = removed.iter().map(|s| s.as_ref().to_string()).collect();
    assert_eq!(summary(delta), (sent, removed), "{delta:?}");
}

const NONE: &[&str] = &[];

/// Resource names or subscription keys in a table row.
type NameSet = &'static [&'static str];

/// Pods a (10.0.0.1) and b (10.0.0.2) behind service web (10.96.0.10), and pod c (10.0.0.3).
fn cluster() -> Index {
    index_of([
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Pod(pod_with(NS, "a", "10.0.0.1", &[("app", "web")]).into()),
        Object::Pod(pod_with(NS, "b", "10.0.0.2", &[("app", "web")]).into()),
        Object::Pod(pod_with(NS, "c", "10.0.0.3", &[("app", "other")]).into()),
    ])
}

fn all_names() -> Vec<String> {
    vec![uid(NS, "a"), uid(NS, "b"), uid(NS, "c"), skey(NS, "web")]
}

fn current_versions(snapshot: &Arc<Snapshot>) -> BTreeMap<String, String> {
    versions(snapshot)
}

// ---------------------------------------------------------------------------------------------
// Subscription
// ---------------------------------------------------------------------------------------------

#[test]
fn initial_subscription() {
    // (subscribe, unsubscribe, wildcard, names)
    let table: &[(NameSet, NameSet, bool, NameSet)] = &[
        // Legacy wildcard: an empty first subscribe list.
        (&[], &[], true, &[]),
        (&[WILDCARD], &[], true, &[]),
        (&[WILDCARD, "x"], &[], true, &["x"]),
        // ztunnel on-demand: subscribe to nothing yet.
        (&[WILDCARD], &[WILDCARD], false, &[]),
        (&["/10.0.0.1"], &[], false, &["/10.0.0.1"]),
        (&["a", "b"], &["b"], false, &["a"]),
        // Only unsubscribing `*` with an empty subscribe list also means nothing.
        (&[], &[WILDCARD], false, &[]),
    ];
    for (subscribe, unsubscribe, wildcard, names) in table {
        let got = Subscription::initial(&strings(subscribe), &strings(unsubscribe));
        let want = Subscription {
            wildcard: *wildcard,
            names: owned_set(names),
        };
        assert_eq!(
            got, want,
            "subscribe={subscribe:?} unsubscribe={unsubscribe:?}"
        );
    }
}

#[test]
fn subscription_update_reports_newly_added_names() {
    let mut s = Subscription::initial(&strings(&[WILDCARD]), &strings(&[WILDCARD]));
    type Step = (NameSet, NameSet, NameSet, bool, NameSet);
    let steps: &[Step] = &[
        // (subscribe, unsubscribe, added, wildcard after, names after)
        (&["x", "y"], &[], &["x", "y"], false, &["x", "y"]),
        (&["x", "z"], &[], &["z"], false, &["x", "y", "z"]),
        (&["w"], &["w", "x"], &[], false, &["y", "z"]),
        (&[WILDCARD], &[], &[], true, &["y", "z"]),
        (&[], &[WILDCARD], &[], false, &["y", "z"]),
    ];
    for (subscribe, unsubscribe, added, wildcard, names) in steps {
        let got = s.update(&strings(subscribe), &strings(unsubscribe));
        assert_eq!(got, strings(added), "subscribe={subscribe:?}");
        assert_eq!(s.wildcard, *wildcard, "subscribe={subscribe:?}");
        assert_eq!(s.names, owned_set(names), "subscribe={subscribe:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// classify
// ---------------------------------------------------------------------------------------------

#[test]
fn classify_requests() {
    let nack = |nonce: &str| DeltaDiscoveryRequest {
        response_nonce: nonce.into(),
        error_detail: Some(Status {
            code: 3,
            message: "bad resource".into(),
            details: vec![],
        }),
        ..request(&[], &[])
    };
    let with_nonce = |type_url: &str, nonce: &str| DeltaDiscoveryRequest {
        type_url: type_url.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    let table: Vec<(&str, DeltaDiscoveryRequest, Option<&str>, RequestKind)> = vec![
        (
            "first request",
            request(&[], &[]),
            None,
            RequestKind::Initial(TypeKind::Address),
        ),
        (
            "first authorization request",
            with_nonce(AUTHORIZATION_TYPE, ""),
            None,
            RequestKind::Initial(TypeKind::Authorization),
        ),
        (
            "first request with a leftover nonce",
            with_nonce(ADDRESS_TYPE, "n0"),
            None,
            RequestKind::Initial(TypeKind::Address),
        ),
        (
            "ack",
            with_nonce(ADDRESS_TYPE, "n1"),
            Some("n1"),
            RequestKind::Ack(TypeKind::Address),
        ),
        (
            "stale",
            with_nonce(ADDRESS_TYPE, "n0"),
            Some("n1"),
            RequestKind::Stale(TypeKind::Address),
        ),
        (
            "nack of the last response",
            nack("n1"),
            Some("n1"),
            RequestKind::Nack {
                kind: TypeKind::Address,
                message: "bad resource".into(),
            },
        ),
        (
            "nack of an older response",
            nack("n0"),
            Some("n1"),
            RequestKind::Nack {
                kind: TypeKind::Address,
                message: "bad resource".into(),
            },
        ),
        (
            "subscription change",
            request(&["/10.0.0.1"], &[]),
            Some("n1"),
            RequestKind::Subscribe(TypeKind::Address),
        ),
        (
            "unknown type",
            with_nonce("type.googleapis.com/envoy.config.cluster.v3.Cluster", "n1"),
            Some("n1"),
            RequestKind::UnknownType("type.googleapis.com/envoy.config.cluster.v3.Cluster".into()),
        ),
        (
            "unknown type on first request",
            with_nonce("", ""),
            None,
            RequestKind::UnknownType(String::new()),
        ),
    ];
    for (case, req, last_nonce, want) in table {
        assert_eq!(classify(&req, last_nonce), want, "{case}");
    }
}

// ---------------------------------------------------------------------------------------------
// TypeState: wildcard
// ---------------------------------------------------------------------------------------------

#[test]
fn wildcard_initial_sends_everything_in_name_order() {
    let snapshot = cluster().snapshot();
    for req in [request(&[], &[]), request(&[WILDCARD], &[])] {
        let mut state = TypeState::new(TypeKind::Address, &req);
        assert!(state.subscription.wildcard);
        let delta = state.initial(&snapshot);
        let sent: Vec<String> = delta.resources.iter().map(|r| r.name.to_string()).collect();
        assert_eq!(sent, all_names()); // sorted by name
        assert!(delta.removed.is_empty());
        // Nothing new: nothing to send.
        assert!(state.on_snapshot(&snapshot).is_empty());
    }
}

#[test]
fn wildcard_initial_with_initial_resource_versions() {
    let snapshot = cluster().snapshot();
    let current = current_versions(&snapshot);
    let gone = uid(NS, "gone");

    let mut held_all = current.clone();
    held_all.insert(gone.clone(), "1234".into());
    let mut one_stale = current.clone();
    one_stale.insert(uid(NS, "b"), "stale".into());
    let mut partial = current.clone();
    partial.remove(&skey(NS, "web"));

    // (case, initial_resource_versions, sent, removed)
    type Row = (
        &'static str,
        BTreeMap<String, String>,
        Vec<String>,
        Vec<String>,
    );
    let table: Vec<Row> = vec![
        ("holds everything", current.clone(), vec![], vec![]),
        (
            "holds everything and a gone name",
            held_all,
            vec![],
            vec![gone],
        ),
        ("one stale version", one_stale, vec![uid(NS, "b")], vec![]),
        ("one missing", partial, vec![skey(NS, "web")], vec![]),
    ];
    for (case, initial, sent, removed) in table {
        let req = DeltaDiscoveryRequest {
            initial_resource_versions: initial,
            ..request(&[], &[])
        };
        let mut state = TypeState::new(TypeKind::Address, &req);
        let delta = state.initial(&snapshot);
        assert_eq!(summary(&delta), (sent, removed), "{case}");
    }
}

#[test]
fn a_reconnect_keeps_names_this_replica_lacks_until_the_grace_ends() {
    let mut index = cluster();
    let snapshot = index.snapshot();
    let (late, gone) = (uid(NS, "late"), uid(NS, "gone"));
    let mut held = current_versions(&snapshot);
    held.insert(late.clone(), "1".into());
    held.insert(gone.clone(), "1".into());
    let req = DeltaDiscoveryRequest {
        initial_resource_versions: held,
        ..request(&[], &[])
    };
    let mut state = TypeState::new(TypeKind::Address, &req);
    state.hold_removals(Duration::from_millis(30));
    assert_delta(&state.initial(&snapshot), NONE, NONE);
    let due = state.removals_due_at().expect("removals held back");

    // This replica catches up within the grace: the late pod is sent, nothing removed.
    index.apply(Object::Pod(pod(NS, "late", "10.0.0.8").into()));
    assert_delta(
        &state.on_snapshot(&index.snapshot()),
        &[late.as_str()],
        NONE,
    );
    assert_eq!(state.removals_due_at(), Some(due));

    // Once due, what still does not exist is removed, with no new snapshot needed.
    std::thread::sleep(due.saturating_duration_since(Instant::now()));
    state.removals_woken();
    assert_eq!(state.removals_due_at(), None, "woken once");
    let current = state.synced().unwrap().clone();
    assert_delta(&state.on_snapshot(&current), NONE, &[gone.as_str()]);
    assert!(state.on_snapshot(&current).is_empty());

    // Without a grace the removal is in the first response, as before.
    let mut state = TypeState::new(TypeKind::Address, &req);
    state.hold_removals(Duration::ZERO);
    assert_delta(
        &state.initial(&snapshot),
        NONE,
        &[gone.as_str(), late.as_str()],
    );
    assert_eq!(state.removals_due_at(), None);
}

/// A reconnecting client holds a name this replica lacks yet (it got it from the replica it
/// left); when this replica catches up and the resource appears at the version the client
/// holds, nothing is sent: the client has it. (tests/it/failover.rs saw every client of a
/// killed replica re-sent such a pod.)
#[test]
fn a_name_held_back_is_not_resent_when_it_appears_at_the_version_held() {
    let mut index = cluster();
    let snapshot = index.snapshot();
    let late = uid(NS, "late");
    let mut ahead = cluster();
    ahead.apply(Object::Pod(pod(NS, "late", "10.0.0.8").into()));
    let held = current_versions(&ahead.snapshot());
    assert!(held.contains_key(&late));
    let req = DeltaDiscoveryRequest {
        initial_resource_versions: held,
        ..request(&[], &[])
    };
    let mut state = TypeState::new(TypeKind::Address, &req);
    state.hold_removals(Duration::from_secs(60));
    assert_delta(&state.initial(&snapshot), NONE, NONE);

    index.apply(Object::Pod(pod(NS, "late", "10.0.0.8").into()));
    let caught_up = state.on_snapshot(&index.snapshot());
    assert!(
        caught_up.is_empty(),
        "re-sent what the client holds: {:?}",
        summary(&caught_up)
    );

    // No longer held back: its deletion is an ordinary removal.
    index.delete(&ObjectRef::new(Kind::Pod, NS, "late"));
    assert_delta(
        &state.on_snapshot(&index.snapshot()),
        NONE,
        &[late.as_str()],
    );
}

#[test]
fn wildcard_on_snapshot_sends_exactly_what_changed() {
    let mut index = cluster();
    let mut state = TypeState::new(TypeKind::Address, &request(&[], &[]));
    state.initial(&index.snapshot());

    // A pod update.
    index.apply(Object::Pod(
        pod_with(NS, "c", "10.0.0.3", &[("app", "other"), ("version", "v2")]).into(),
    ));
    assert_delta(&state.on_snapshot(&index.snapshot()), &[uid(NS, "c")], NONE);

    // No changes: a new generation with nothing to send.
    assert!(state.on_snapshot(&index.snapshot()).is_empty());

    // A removal.
    index.delete(&ObjectRef::new(Kind::Pod, NS, "c"));
    assert_delta(&state.on_snapshot(&index.snapshot()), NONE, &[uid(NS, "c")]);

    // Several snapshots skipped: changes are merged; add-then-delete sends nothing.
    index.apply(Object::Pod(pod(NS, "tmp", "10.0.0.9").into()));
    index.snapshot();
    index.delete(&ObjectRef::new(Kind::Pod, NS, "tmp"));
    index.snapshot();
    index.apply(Object::Service(svc(
        NS,
        "web",
        "10.96.0.10",
        &[("app", "none")],
    )));
    index.snapshot();
    let delta = state.on_snapshot(&index.snapshot());
    assert_delta(&delta, &[uid(NS, "a"), uid(NS, "b")], NONE);

    // Changes that revert before the client sees them send nothing.
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.77").into()));
    index.snapshot();
    index.apply(Object::Pod(
        pod_with(NS, "a", "10.0.0.1", &[("app", "web")]).into(),
    ));
    assert!(state.on_snapshot(&index.snapshot()).is_empty());
}

#[test]
fn streams_synced_to_the_same_snapshot_share_one_diff() {
    let mut index = cluster();
    let first = index.snapshot();
    let mut a = TypeState::new(TypeKind::Address, &request(&[], &[]));
    let mut b = TypeState::new(TypeKind::Address, &request(&[], &[]));
    a.initial(&first);
    b.initial(&first);
    index.apply(Object::Pod(
        pod_with(NS, "c", "10.0.0.3", &[("app", "other"), ("version", "v2")]).into(),
    ));
    index.delete(&ObjectRef::new(Kind::Pod, NS, "b"));
    let second = index.snapshot();
    let from_a = a.on_snapshot(&second);
    assert_delta(&from_a, &[uid(NS, "c")], &[uid(NS, "b")]);
    assert_eq!(b.on_snapshot(&second), from_a);
    // The second stream used the diff the first computed.
    let shared = second.diff_from(TypeKind::Address, first.generation, || {
        panic!("the diff was computed again")
    });
    assert_eq!(shared.resources.len(), 1);
    // A stream synced elsewhere computes its own.
    let mut c = TypeState::new(TypeKind::Address, &request(&[], &[]));
    c.initial(&second);
    index.apply(Object::Pod(pod(NS, "d", "10.0.0.4").into()));
    let third = index.snapshot();
    assert_delta(&c.on_snapshot(&third), &[uid(NS, "d")], NONE);
    assert_delta(&a.on_snapshot(&third), &[uid(NS, "d")], NONE);
}

#[test]
fn wildcard_client_behind_the_history_gets_a_full_diff() {
    let mut index = cluster();
    let mut state = TypeState::new(TypeKind::Address, &request(&[], &[]));
    state.initial(&index.snapshot());
    index.delete(&ObjectRef::new(Kind::Pod, NS, "b"));
    index.apply(Object::Pod(pod(NS, "d", "10.0.0.4").into()));
    for _ in 0..HISTORY + 2 {
        index.snapshot();
    }
    let snapshot = index.snapshot();
    assert!(snapshot.changes_since(1).is_none());
    // b left web's members, but the Service resource itself is unchanged.
    assert_delta(
        &state.on_snapshot(&snapshot),
        &[uid(NS, "d")],
        &[uid(NS, "b")],
    );
}

#[test]
fn authorization_wildcard_with_no_policies_sends_nothing() {
    let snapshot = cluster().snapshot();
    let req = DeltaDiscoveryRequest {
        type_url: AUTHORIZATION_TYPE.into(),
        ..Default::default()
    };
    let mut state = TypeState::new(TypeKind::Authorization, &req);
    assert!(state.initial(&snapshot).is_empty());
    let req = DeltaDiscoveryRequest {
        initial_resource_versions: [("demo/old-policy".to_string(), "1".to_string())].into(),
        ..req
    };
    let mut state = TypeState::new(TypeKind::Authorization, &req);
    assert_delta(&state.initial(&snapshot), NONE, &["demo/old-policy"]);
}

// ---------------------------------------------------------------------------------------------
// TypeState: explicit (on-demand)
// ---------------------------------------------------------------------------------------------

/// A ztunnel on-demand stream: `subscribe: [*], unsubscribe: [*]`.
fn on_demand(snapshot: &Arc<Snapshot>) -> TypeState {
    let mut state = TypeState::new(TypeKind::Address, &request(&[WILDCARD], &[WILDCARD]));
    assert!(!state.subscription.wildcard);
    assert!(state.initial(snapshot).is_empty());
    state
}

#[test]
fn explicit_subscriptions_answer_each_key() {
    let snapshot = cluster().snapshot();
    let web = skey(NS, "web");
    let table: &[(&str, Vec<String>, Vec<String>)] = &[
        // An IP key: the workload, and the key itself as removed so the waiter wakes.
        ("/10.0.0.1", vec![uid(NS, "a")], strings(&["/10.0.0.1"])),
        // A VIP: the service and its members.
        (
            "/10.96.0.10",
            vec![uid(NS, "a"), uid(NS, "b"), web.clone()],
            strings(&["/10.96.0.10"]),
        ),
        // A hostname key is itself a resource name: not removed.
        (&web, vec![uid(NS, "a"), uid(NS, "b"), web.clone()], vec![]),
        // A uid.
        (&uid(NS, "c"), vec![uid(NS, "c")], vec![]),
        // Unknown keys come back removed.
        ("/10.9.9.9", vec![], strings(&["/10.9.9.9"])),
        (&uid(NS, "nope"), vec![], vec![uid(NS, "nope")]),
    ];
    for (key, sent, removed) in table {
        let mut state = on_demand(&snapshot);
        let delta = state.on_subscribe(&snapshot, &strings(&[key]), &[]);
        assert_eq!(
            summary(&delta),
            (sent.clone(), removed.clone()),
            "key {key}"
        );
    }
}

#[test]
fn explicit_mode_follows_held_resources() {
    let mut index = cluster();
    let mut state = on_demand(&index.snapshot());
    let snapshot = index.snapshot();
    let delta = state.on_subscribe(&snapshot, &strings(&["/10.0.0.1"]), &[]);
    assert_delta(&delta, &[uid(NS, "a")], &["/10.0.0.1"]);

    // Asking again: answered again in full, as istiod answers every lookup (the client may
    // have rejected what it was sent, and waits until a response names the key).
    let delta = state.on_subscribe(&snapshot, &strings(&["/10.0.0.1"]), &[]);
    assert_delta(&delta, &[uid(NS, "a")], &["/10.0.0.1"]);

    // A change to a held resource is sent; a change to anything else is not.
    index.apply(Object::Pod(
        pod_with(NS, "a", "10.0.0.1", &[("app", "web"), ("version", "v2")]).into(),
    ));
    index.apply(Object::Pod(
        pod_with(NS, "c", "10.0.0.3", &[("app", "other"), ("version", "v2")]).into(),
    ));
    assert_delta(&state.on_snapshot(&index.snapshot()), &[uid(NS, "a")], NONE);
    assert!(state.on_snapshot(&index.snapshot()).is_empty());

    // A later pod taking a subscribed IP is sent too.
    index.apply(Object::Pod(pod(NS, "twin", "10.0.0.1").into()));
    assert_delta(
        &state.on_snapshot(&index.snapshot()),
        &[uid(NS, "twin")],
        NONE,
    );

    // Removal of a held resource.
    index.delete(&ObjectRef::new(Kind::Pod, NS, "a"));
    assert_delta(&state.on_snapshot(&index.snapshot()), NONE, &[uid(NS, "a")]);
}

#[test]
fn a_lookup_by_name_of_a_held_resource_sends_it_again() {
    // ztunnel waits on a uid or `ns/hostname` key until a response names it. It may hold the
    // resource at the current version (rejected, then asked for again): it is sent anyway.
    let snapshot = cluster().snapshot();
    let web = skey(NS, "web");
    let mut state = on_demand(&snapshot);
    let delta = state.on_subscribe(&snapshot, &strings(&[&uid(NS, "c")]), &[]);
    assert_delta(&delta, &[uid(NS, "c")], NONE);
    let delta = state.on_subscribe(&snapshot, &strings(&[&uid(NS, "c")]), &[]);
    assert_delta(&delta, &[uid(NS, "c")], NONE);
    let delta = state.on_subscribe(&snapshot, &strings(&[&web]), &[]);
    assert_delta(&delta, &[uid(NS, "a"), uid(NS, "b"), web.clone()], NONE);
    let delta = state.on_subscribe(&snapshot, &strings(&[&web]), &[]);
    assert_delta(&delta, &[uid(NS, "a"), uid(NS, "b"), web], NONE);
    // `*` again is never answered as a removed name.
    let delta = state.on_subscribe(
        &snapshot,
        &strings(&[WILDCARD, &uid(NS, "c")]),
        &strings(&[WILDCARD]),
    );
    assert_delta(&delta, &[uid(NS, "c")], NONE);
}

#[test]
fn an_on_demand_proxy_gets_its_node_workloads_from_its_first_lookup() {
    let mut index = index_of([
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Pod(pod_with(NS, "a", "10.0.0.1", &[("app", "web")]).into()),
        Object::Pod(
            PodFields {
                node_name: "node-b".into(),
                ..pod_with(NS, "b", "10.0.0.2", &[("app", "web")])
            }
            .into(),
        ),
        Object::Pod(pod(NS, "c", "10.0.0.3").into()),
    ]);
    let snapshot = index.snapshot();
    let mut state = TypeState::new(TypeKind::Address, &request(&[WILDCARD], &[WILDCARD]));
    state.on_demand_from(NODE);
    // istiod's first on-demand response is empty.
    assert!(state.initial(&snapshot).is_empty());
    // The first lookup brings the workloads on the proxy's node (a and c), not node-b's.
    let delta = state.on_subscribe(&snapshot, &strings(&["/10.0.0.2"]), &[]);
    assert_delta(
        &delta,
        &[uid(NS, "a"), uid(NS, "b"), uid(NS, "c")],
        &["/10.0.0.2"],
    );
    // A new pod on the node arrives unasked; one on another node does not.
    index.apply(Object::Pod(pod(NS, "d", "10.0.0.4").into()));
    index.apply(Object::Pod(
        PodFields {
            node_name: "node-b".into(),
            ..pod(NS, "e", "10.0.0.5")
        }
        .into(),
    ));
    assert_delta(&state.on_snapshot(&index.snapshot()), &[uid(NS, "d")], NONE);
    // A wildcard subscription is not affected.
    let mut wildcard = TypeState::new(TypeKind::Address, &request(&[], &[]));
    wildcard.on_demand_from(NODE);
    assert_eq!(wildcard.initial(&index.snapshot()).resources.len(), 6);
}

#[test]
fn a_changed_service_is_sent_with_its_members() {
    // ztunnel builds a service's endpoints from its workloads as they arrive; istiod resends
    // them with the service, so a new health policy (publishNotReadyAddresses) reaches them.
    let mut index = cluster();
    let mut wildcard = TypeState::new(TypeKind::Address, &request(&[], &[]));
    wildcard.initial(&index.snapshot());
    let mut explicit = on_demand(&index.snapshot());
    explicit.on_subscribe(&index.snapshot(), &strings(&["/10.0.0.1"]), &[]);
    index.apply(Object::Service(Service {
        publish_not_ready_addresses: true,
        ..svc(NS, "web", "10.96.0.10", &[("app", "web")])
    }));
    let snapshot = index.snapshot();
    assert_delta(
        &wildcard.on_snapshot(&snapshot),
        &[uid(NS, "a"), uid(NS, "b"), skey(NS, "web")],
        NONE,
    );
    // An on-demand proxy that holds only pod a gets neither the service nor pod b.
    assert!(explicit.on_snapshot(&snapshot).is_empty());
    // One that looked the service up gets it with both members.
    let mut explicit = on_demand(&index.snapshot());
    explicit.on_subscribe(&index.snapshot(), &strings(&["/10.96.0.10"]), &[]);
    index.apply(Object::Service(svc(
        NS,
        "web",
        "10.96.0.10",
        &[("app", "web")],
    )));
    assert_delta(
        &explicit.on_snapshot(&index.snapshot()),
        &[uid(NS, "a"), uid(NS, "b"), skey(NS, "web")],
        NONE,
    );
    // A pod change alone sends only the pod.
    wildcard.on_snapshot(&index.snapshot());
    index.apply(Object::Pod(
        pod_with(NS, "a", "10.0.0.1", &[("app", "web"), ("version", "v2")]).into(),
    ));
    assert_delta(
        &wildcard.on_snapshot(&index.snapshot()),
        &[uid(NS, "a")],
        NONE,
    );
}

#[test]
fn explicit_initial_resource_versions_count_as_subscribed() {
    let snapshot = cluster().snapshot();
    let current = current_versions(&snapshot);
    let a = uid(NS, "a");
    let gone = uid(NS, "gone");
    let req = DeltaDiscoveryRequest {
        initial_resource_versions: [
            (a.clone(), current[&a].clone()),
            (uid(NS, "b"), "stale".to_string()),
            (gone.clone(), "1".to_string()),
        ]
        .into(),
        ..request(&[WILDCARD], &[WILDCARD])
    };
    let mut state = TypeState::new(TypeKind::Address, &req);
    assert!(!state.subscription.wildcard);
    assert_eq!(
        state.subscription.names,
        owned_set(&[&a, &uid(NS, "b"), &gone])
    );
    assert_delta(&state.initial(&snapshot), &[uid(NS, "b")], &[gone]);
}

#[test]
fn switching_between_wildcard_and_explicit() {
    let mut index = cluster();
    let snapshot = index.snapshot();
    let mut state = on_demand(&snapshot);
    state.on_subscribe(&snapshot, &strings(&["/10.0.0.1"]), &[]);

    // Turning the wildcard on syncs everything the client does not hold yet.
    let delta = state.on_subscribe(&snapshot, &strings(&[WILDCARD]), &[]);
    let want: Vec<String> = all_names()
        .into_iter()
        .filter(|n| *n != uid(NS, "a"))
        .collect();
    assert_delta(&delta, &want, NONE);
    // Subscribing a name while wildcard is answered, with nothing new.
    assert!(
        state
            .on_subscribe(&snapshot, &strings(&["/10.0.0.2"]), &[])
            .is_empty()
    );

    // Turning it off keeps following what the client holds (answered, with nothing).
    assert!(
        state
            .on_subscribe(&snapshot, &[], &strings(&[WILDCARD]))
            .is_empty()
    );
    index.apply(Object::Pod(pod(NS, "c", "10.0.0.33").into()));
    index.apply(Object::Pod(pod(NS, "new", "10.0.0.5").into()));
    assert_delta(&state.on_snapshot(&index.snapshot()), &[uid(NS, "c")], NONE);
}

#[test]
fn explicit_first_request_and_recreated_resources() {
    let mut index = cluster();
    let snapshot = index.snapshot();
    // A first request that names keys is explicit from the start.
    let mut state = TypeState::new(
        TypeKind::Address,
        &request(&["/10.0.0.1", &uid(NS, "c")], &[]),
    );
    assert!(!state.subscription.wildcard);
    assert_delta(
        &state.initial(&snapshot),
        &[uid(NS, "a"), uid(NS, "c")],
        &["/10.0.0.1"],
    );

    // A subscribed uid that disappears is removed, and is sent again when it comes back.
    index.delete(&ObjectRef::new(Kind::Pod, NS, "c"));
    assert_delta(&state.on_snapshot(&index.snapshot()), NONE, &[uid(NS, "c")]);
    index.apply(Object::Pod(pod(NS, "c", "10.0.0.3").into()));
    assert_delta(&state.on_snapshot(&index.snapshot()), &[uid(NS, "c")], NONE);
}

#[test]
fn a_slow_client_notes_each_changed_name_once_and_sends_its_latest_version() {
    let mut index = cluster();
    let mut state = TypeState::new(TypeKind::Address, &request(&[], &[]));
    state.initial(&index.snapshot());
    // More snapshots than the history keeps, all changing pod c: noted one at a time (as a
    // connection does while its proxy is slow), they stay one name.
    let mut last = index.snapshot();
    for round in 0..HISTORY + 10 {
        index.apply(Object::Pod(
            pod_with(
                NS,
                "c",
                "10.0.0.3",
                &[("app", "other"), ("version", &format!("v{round}"))],
            )
            .into(),
        ));
        last = index.snapshot();
        state.note(&last);
        assert_eq!(state.changed_names(&last), 1, "round {round}");
    }
    let delta = state.on_snapshot(&last);
    assert_delta(&delta, &[uid(NS, "c")], NONE);
    assert_eq!(
        delta.resources[0].version,
        last.addresses[uid(NS, "c").as_str()].version
    );
    assert_eq!(state.changed_names(&last), 0);
}

#[test]
fn split_keeps_every_resource_once_under_the_limit() {
    let mut index = cluster();
    let snapshot = index.snapshot();
    let mut state = TypeState::new(TypeKind::Address, &request(&[], &[]));
    let mut delta = state.initial(&snapshot);
    delta.removed = strings(&["gone"]);
    let whole = summary(&delta);
    // Under the limit: one part, unchanged.
    assert_eq!(split(delta.clone(), usize::MAX), vec![delta.clone()]);
    // A limit of one byte: one resource per part, removals with the first.
    let parts = split(delta.clone(), 1);
    assert_eq!(parts.len(), delta.resources.len());
    assert_eq!(parts[0].removed, strings(&["gone"]));
    assert!(parts[1..].iter().all(|p| p.removed.is_empty()));
    let mut sent: Vec<String> = parts
        .iter()
        .flat_map(|p| p.resources.iter().map(|r| r.name.to_string()))
        .collect();
    sent.sort();
    assert_eq!(sent, whole.0);
    // Nothing to send is still one (empty) part: an initial request is always answered.
    assert_eq!(split(Delta::default(), 1), vec![Delta::default()]);
}

#[test]
fn the_push_window_fills_and_answers_free_it_in_order() {
    assert_eq!(PUSH_WINDOW, 2);
    let mut window = InFlight::default();
    assert!(window.is_empty() && !window.is_full());
    // Nonces are the connection's response counters in hex; other types' responses are
    // interleaved (counters 0xb and 0xc went to another type).
    window.sent(0xa);
    assert!(
        !window.is_full(),
        "one response in flight leaves room for the next"
    );
    window.sent(0xd);
    assert!(window.is_full());

    // Nonces that are not ours, or are no longer in flight, change nothing.
    for nonce in ["", "zz", "9", "-1"] {
        window.answered(nonce);
        assert_eq!(window.len(), 2, "answering {nonce:?}");
    }
    // An answer to the older response frees one place; the newer one stays in flight.
    window.answered("a");
    assert_eq!(window.len(), 1);
    assert!(!window.is_full());
    // Answering the newest answers everything before it (responses are read in order).
    window.sent(0x10);
    assert!(window.is_full());
    window.answered("10");
    assert!(window.is_empty());
}

#[test]
fn a_split_response_past_the_window_is_freed_by_answering_its_last_part() {
    let mut window = InFlight::default();
    for counter in 1..=5 {
        window.sent(counter);
    }
    assert!(window.is_full());
    window.answered("3");
    assert!(window.is_full(), "parts 4 and 5 are still unanswered");
    window.answered("5");
    assert!(window.is_empty());
}
