//! Table tests of the index's incremental behaviour: which `Changes` each event produces,
//! relists (`reset`), on-demand lookups and the snapshot change history.

use super::support::*;
use crate::discovery::model::{Event, Kind, ObjectRef};
use crate::discovery::snapshot::{HISTORY, MIN_HISTORY_NAMES};
use crate::discovery::{Changes, Index, Object, Settings, TypeKind};
use std::collections::BTreeSet;

const ZONE: &str = "topology.kubernetes.io/zone";

fn pod_ref(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef::new(Kind::Pod, namespace, name)
}

fn svc_ref(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef::new(Kind::Service, namespace, name)
}

fn assert_only_upserted<S: AsRef<str>>(changes: &Changes, names: &[S]) {
    assert_eq!(changes.addresses.upserted, set(names), "{changes:?}");
    assert!(changes.addresses.removed.is_empty(), "{changes:?}");
    assert!(changes.authorizations.is_empty(), "{changes:?}");
}

// ---------------------------------------------------------------------------------------------
// Changes per event
// ---------------------------------------------------------------------------------------------

#[test]
fn pod_lifecycle_changes() {
    let p = uid(NS, "p");
    let mut index = Index::new(Settings::default());

    // Add.
    let base = pod_with(NS, "p", "10.0.0.1", &[("app", "web")]);
    assert_only_upserted(&index.apply(Object::Pod(base.clone().into())), &[&p]);
    assert!(index.has_unpublished());
    index.snapshot();
    assert!(!index.has_unpublished());

    // Applying the identical object changes nothing.
    let changes = index.apply(Object::Pod(base.clone().into()));
    assert!(changes.is_empty(), "{changes:?}");
    assert!(!index.has_unpublished());

    // A field the index does not read (phase Pending -> Running) changes nothing either.
    let mut pending = base.clone();
    pending.phase = "Pending".into();
    assert!(index.apply(Object::Pod(pending.into())).is_empty());
    assert!(index.apply(Object::Pod(base.clone().into())).is_empty());

    // An update that changes the resource is an upsert, and is visible in the snapshot.
    let mut v2 = base.clone();
    v2.labels.insert("version", "v2");
    let before = index.snapshot().addresses.get(p.as_str()).unwrap().version;
    assert_only_upserted(&index.apply(Object::Pod(v2.clone().into())), &[&p]);
    let after = index.snapshot().addresses.get(p.as_str()).unwrap().version;
    assert_ne!(before, after);
    assert_eq!(workload(&mut index, &p).canonical_revision, "v2");

    // Readiness flips are changes.
    let mut unready = v2.clone();
    unready.ready = false;
    assert_only_upserted(&index.apply(Object::Pod(unready.into())), &[&p]);

    // Delete, then delete again (nothing left to remove).
    let changes = index.delete(&pod_ref(NS, "p"));
    assert!(changes.addresses.upserted.is_empty());
    assert_eq!(changes.addresses.removed, set(&[&p]));
    assert!(index.snapshot().addresses.is_empty());
    assert!(index.delete(&pod_ref(NS, "p")).is_empty());
    assert!(index.delete(&pod_ref(NS, "never")).is_empty());
}

#[test]
fn version_is_a_content_hash() {
    let mut a = index_of([Object::Pod(pod(NS, "p", "10.0.0.1").into())]);
    let mut b = index_of([Object::Pod(pod(NS, "p", "10.0.0.1").into())]);
    assert_eq!(versions(&a.snapshot()), versions(&b.snapshot()));
    b.apply(Object::Pod(pod(NS, "p", "10.0.0.2").into()));
    assert_ne!(versions(&a.snapshot()), versions(&b.snapshot()));
}

#[test]
fn service_lifecycle_changes() {
    let s = skey(NS, "web");
    let a = uid(NS, "a");
    let mut index = index_of([Object::Pod(
        pod_with(NS, "a", "10.0.0.1", &[("app", "web")]).into(),
    )]);

    // A new service is upserted together with the pods whose services map it enters.
    let web = svc(NS, "web", "10.96.0.10", &[("app", "web")]);
    assert_only_upserted(&index.apply(Object::Service(web.clone())), &[&s, &a]);
    assert!(index.apply(Object::Service(web.clone())).is_empty());

    // A port change touches the service and its members.
    let mut ports = web.clone();
    ports.ports[0].target_port = num(9090);
    assert_only_upserted(&index.apply(Object::Service(ports.clone())), &[&s, &a]);

    // A VIP change touches only the service (members carry no VIPs).
    let mut vip = ports.clone();
    vip.cluster_ips = vec![ip("10.96.0.11")];
    assert_only_upserted(&index.apply(Object::Service(vip)), &[&s]);

    // Delete: the service is removed and its members lose the entry.
    let changes = index.delete(&svc_ref(NS, "web"));
    assert_eq!(changes.addresses.upserted, set(&[&a]));
    assert_eq!(changes.addresses.removed, set(&[&s]));
    assert!(workload(&mut index, &a).services.is_empty());
    assert!(index.snapshot().members.get(s.as_str()).is_none());
}

#[test]
fn service_selector_change_re_emits_exactly_the_pods_whose_map_changed() {
    let mut index = index_of([
        Object::Pod(pod_with(NS, "a", "10.0.0.1", &[("app", "a")]).into()),
        Object::Pod(pod_with(NS, "b", "10.0.0.2", &[("app", "b")]).into()),
        Object::Pod(pod_with(NS, "c", "10.0.0.3", &[("app", "c")]).into()),
        Object::Pod(pod_with(NS, "ab", "10.0.0.4", &[("app", "a"), ("x", "b")]).into()),
        Object::Pod(pod_with("other", "b2", "10.0.1.2", &[("app", "b")]).into()),
        Object::Service(svc(NS, "s", "10.96.0.1", &[("app", "a")])),
    ]);
    index.snapshot();
    struct Step {
        selector: &'static [(&'static str, &'static str)],
        want: &'static [&'static str],
    }
    let steps = [
        // a and ab leave, b joins; the Service resource itself carries no selector.
        Step {
            selector: &[("app", "b")],
            want: &["a", "ab", "b"],
        },
        // Same selector again: nothing.
        Step {
            selector: &[("app", "b")],
            want: &[],
        },
        // b leaves and nobody joins.
        Step {
            selector: &[("app", "nobody")],
            want: &["b"],
        },
        // Empty selector selects nothing: still nothing.
        Step {
            selector: &[],
            want: &[],
        },
        Step {
            selector: &[("x", "b")],
            want: &["ab"],
        },
    ];
    for step in steps {
        let changes = index.apply(Object::Service(svc(NS, "s", "10.96.0.1", step.selector)));
        let want: Vec<String> = step.want.iter().map(|n| uid(NS, n)).collect();
        assert_only_upserted(&changes, &want);
    }
    let members = index
        .snapshot()
        .members
        .get(skey(NS, "s").as_str())
        .cloned();
    assert_eq!(
        members.map(|m| m.into_iter().map(|n| n.to_string()).collect::<Vec<_>>()),
        Some(vec![uid(NS, "ab")])
    );
}

#[test]
fn node_label_change_re_emits_only_pods_on_that_node() {
    let mut on_b = pod(NS, "p3", "10.0.0.3");
    on_b.node_name = "node-b".into();
    let mut index = index_of([
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::Node(node("node-b", &[(ZONE, "z1")])),
        Object::Pod(pod(NS, "p1", "10.0.0.1").into()),
        Object::Pod(pod("other", "p2", "10.0.0.2").into()),
        Object::Pod(on_b.into()),
    ]);
    // (node-a labels, `ns/name` of the pods re-emitted)
    type Row = (
        &'static [(&'static str, &'static str)],
        &'static [&'static str],
    );
    let table: &[Row] = &[
        (&[(ZONE, "z2")], &["demo/p1", "other/p2"]),
        // A label the index doesn't read: no change.
        (&[(ZONE, "z2"), ("kubernetes.io/os", "linux")], &[]),
        (&[(ZONE, "z2"), ("kubernetes.io/os", "linux")], &[]),
        (&[], &["demo/p1", "other/p2"]),
    ];
    for (node_labels, want) in table {
        let changes = index.apply(Object::Node(node(NODE, node_labels)));
        let want: Vec<String> = want
            .iter()
            .map(|k| {
                let (ns, name) = k.split_once('/').unwrap();
                uid(ns, name)
            })
            .collect();
        assert_only_upserted(&changes, &want);
    }
    // Deleting a node the pods' locality came from re-emits its pods.
    let changes = index.delete(&ObjectRef::new(Kind::Node, "", "node-b"));
    assert_only_upserted(&changes, &[uid(NS, "p3")]);
}

#[test]
fn pod_moving_node_follows_the_new_node() {
    let mut index = index_of([
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::Node(node("node-b", &[(ZONE, "z2")])),
        Object::Pod(pod(NS, "p", "10.0.0.1").into()),
    ]);
    let mut moved = pod(NS, "p", "10.0.0.1");
    moved.node_name = "node-b".into();
    assert_only_upserted(&index.apply(Object::Pod(moved.into())), &[uid(NS, "p")]);
    assert_eq!(
        workload(&mut index, &uid(NS, "p")).locality.unwrap().zone,
        "z2"
    );
    // The old node no longer drags the pod along; the new one does.
    assert!(
        index
            .apply(Object::Node(node(NODE, &[(ZONE, "z9")])))
            .is_empty()
    );
    let changes = index.apply(Object::Node(node("node-b", &[(ZONE, "z3")])));
    assert_only_upserted(&changes, &[uid(NS, "p")]);
}

#[test]
fn node_arriving_after_its_pods_re_emits_them() {
    let mut index = index_of([Object::Pod(pod(NS, "p", "10.0.0.1").into())]);
    assert_eq!(workload(&mut index, &uid(NS, "p")).locality, None);
    let changes = index.apply(Object::Node(node(NODE, &[(ZONE, "z1")])));
    assert_only_upserted(&changes, &[uid(NS, "p")]);
    assert_eq!(
        workload(&mut index, &uid(NS, "p")).locality.unwrap().zone,
        "z1"
    );
}

#[test]
fn namespace_annotation_change_re_emits_its_services_only() {
    const ANNOTATION: &str = "networking.istio.io/traffic-distribution";
    let mut index = index_of([
        Object::Namespace(ns(NS)),
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Service(svc("other", "db", "10.96.0.11", &[])),
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "web")]).into()),
    ]);
    let mut annotated = ns(NS);
    annotated.annotations = labels(&[(ANNOTATION, "PreferClose")]);
    assert_only_upserted(
        &index.apply(Object::Namespace(annotated.clone())),
        &[skey(NS, "web")],
    );
    assert!(index.apply(Object::Namespace(annotated)).is_empty());
    let changes = index.delete(&ObjectRef::new(Kind::Namespace, "", NS));
    assert_only_upserted(&changes, &[skey(NS, "web")]);
    assert_eq!(service(&mut index, &skey(NS, "web")).load_balancing, None);
}

#[test]
fn handle_dispatches_events() {
    let mut index = Index::new(Settings::default());
    let p = pod(NS, "p", "10.0.0.1");
    assert_only_upserted(
        &index.handle(Event::Apply(Object::Pod(p.into()))),
        &[uid(NS, "p")],
    );
    assert!(index.handle(Event::Synced).is_empty());
    let changes = index.handle(Event::Delete(pod_ref(NS, "p")));
    assert_eq!(changes.addresses.removed, set(&[uid(NS, "p")]));
}

// ---------------------------------------------------------------------------------------------
// Reset (relist)
// ---------------------------------------------------------------------------------------------

#[test]
fn reset_converges_to_a_cold_build_of_the_final_set() {
    let initial_pods = [
        pod_with(NS, "p1", "10.0.0.1", &[("app", "a")]),
        pod_with(NS, "p2", "10.0.0.2", &[("app", "b")]),
        pod_with(NS, "p3", "10.0.0.3", &[("app", "b")]),
    ];
    let initial_services = [
        svc(NS, "s1", "10.96.0.1", &[("app", "a")]),
        svc(NS, "s2", "10.96.0.2", &[("app", "b")]),
    ];
    let final_pods = [
        // p1 gone, p2 changed, p3 unchanged, p4 new.
        pod_with(NS, "p2", "10.0.0.2", &[("app", "c")]),
        pod_with(NS, "p3", "10.0.0.3", &[("app", "b")]),
        pod_with(NS, "p4", "10.0.0.4", &[("app", "a")]),
    ];
    let final_services = [
        // s1 gone, s2 reselects, s3 new.
        svc(NS, "s2", "10.96.0.2", &[("app", "c")]),
        svc(NS, "s3", "10.96.0.3", &[("app", "a")]),
    ];
    let base = [Object::Namespace(ns(NS)), Object::Node(node(NODE, &[]))];

    let mut index = index_of(
        base.iter()
            .cloned()
            .chain(initial_services.iter().cloned().map(Object::Service))
            .chain(initial_pods.iter().cloned().map(|p| Object::Pod(p.into()))),
    );
    index.snapshot();

    let pods = final_pods
        .iter()
        .cloned()
        .map(|p| Object::Pod(p.into()))
        .collect();
    let mut changes = index.reset(Kind::Pod, pods);
    assert!(changes.addresses.removed.contains(uid(NS, "p1").as_str()));
    assert!(changes.addresses.upserted.contains(uid(NS, "p4").as_str()));
    assert!(!changes.addresses.upserted.contains(uid(NS, "p3").as_str()));

    let services = final_services.iter().cloned().map(Object::Service);
    changes.merge(&index.handle(Event::Reset(Kind::Service, services.collect())));
    assert_eq!(
        changes.addresses.removed,
        set(&[uid(NS, "p1"), skey(NS, "s1")])
    );
    assert_eq!(
        changes.addresses.upserted,
        set(&[uid(NS, "p2"), uid(NS, "p3"), uid(NS, "p4"), skey(NS, "s3"),])
    );

    let mut cold = index_of(
        base.iter()
            .cloned()
            .chain(final_pods.iter().cloned().map(|p| Object::Pod(p.into())))
            .chain(final_services.iter().cloned().map(Object::Service)),
    );
    let (warm, cold) = (index.snapshot(), cold.snapshot());
    assert_eq!(versions(&warm), versions(&cold));
    assert_eq!(warm.members, cold.members);
    let aliases = |s: &crate::discovery::Snapshot| -> Vec<(String, Vec<String>)> {
        let mut all: Vec<_> = s
            .alias_texts()
            .map(|(a, names)| (a, names.iter().map(|n| n.to_string()).collect()))
            .collect();
        all.sort();
        all
    };
    assert_eq!(aliases(&warm), aliases(&cold));

    // Resetting to the same set again changes nothing.
    let pods = final_pods
        .iter()
        .cloned()
        .map(|p| Object::Pod(p.into()))
        .collect();
    assert!(index.reset(Kind::Pod, pods).is_empty());

    // An empty relist removes everything of that kind.
    let changes = index.reset(Kind::Service, vec![]);
    assert_eq!(
        changes.addresses.removed,
        set(&[skey(NS, "s2"), skey(NS, "s3")])
    );
    assert_eq!(
        changes.addresses.upserted,
        set(&[uid(NS, "p2"), uid(NS, "p4")])
    );
}

#[test]
fn reset_of_one_kind_leaves_other_kinds_alone() {
    let mut index = index_of([
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::Pod(pod(NS, "p", "10.0.0.1").into()),
    ]);
    let changes = index.reset(
        Kind::Node,
        vec![Object::Pod(pod(NS, "q", "10.0.0.2").into())],
    );
    // The node was not in the relist: removed, so the pod loses its locality.
    assert_only_upserted(&changes, &[uid(NS, "p")]);
    assert!(try_workload(&mut index, &uid(NS, "q")).is_none());
    assert_eq!(workload(&mut index, &uid(NS, "p")).locality, None);
}

// ---------------------------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------------------------

#[test]
fn lookup_addresses() {
    let mut host_a = pod_with(NS, "h1", "192.168.0.5", &[("app", "host")]);
    host_a.host_network = true;
    let mut host_b = host_a.clone();
    host_b.name = "h2".into();
    let mut dual = svc(NS, "dual", "10.96.0.12", &[("app", "other")]);
    dual.cluster_ips.push(ip("fd00::12"));
    let mut index = index_of([
        Object::Pod(pod_with(NS, "a", "10.0.0.1", &[("app", "web")]).into()),
        Object::Pod(pod_with(NS, "b", "10.0.0.2", &[("app", "web")]).into()),
        Object::Pod(pod_with(NS, "c", "10.0.0.3", &[("app", "other")]).into()),
        Object::Pod(host_a.into()),
        Object::Pod(host_b.into()),
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Service(svc(NS, "empty", "10.96.0.11", &[("app", "none")])),
        Object::Service(svc(NS, "headless", "", &[("app", "web")])),
        Object::Service(dual),
    ]);
    let snapshot = index.snapshot();
    let web = vec![skey(NS, "web"), uid(NS, "a"), uid(NS, "b")];
    let table: &[(String, Vec<String>)] = &[
        (uid(NS, "a"), vec![uid(NS, "a")]),
        ("/10.0.0.1".into(), vec![uid(NS, "a")]),
        ("/10.0.0.3".into(), vec![uid(NS, "c")]),
        ("/192.168.0.5".into(), vec![uid(NS, "h1"), uid(NS, "h2")]),
        ("/10.96.0.10".into(), web.clone()),
        (skey(NS, "web"), web.clone()),
        ("/10.96.0.11".into(), vec![skey(NS, "empty")]),
        (
            skey(NS, "headless"),
            vec![skey(NS, "headless"), uid(NS, "a"), uid(NS, "b")],
        ),
        ("/10.96.0.12".into(), vec![skey(NS, "dual"), uid(NS, "c")]),
        ("/fd00::12".into(), vec![skey(NS, "dual"), uid(NS, "c")]),
        ("/10.9.9.9".into(), vec![]),
        ("net1/10.0.0.1".into(), vec![]),
        ("10.0.0.1".into(), vec![]),
        ("demo/nope.demo.svc.cluster.local".into(), vec![]),
        (uid(NS, "nope"), vec![]),
        (String::new(), vec![]),
    ];
    for (key, want) in table {
        assert_eq!(&snapshot.lookup_addresses(key), want, "key {key:?}");
    }
}

#[test]
fn lookup_follows_ip_changes() {
    let mut index = index_of([Object::Pod(pod(NS, "a", "10.0.0.1").into())]);
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.7").into()));
    let snapshot = index.snapshot();
    assert!(snapshot.lookup_addresses("/10.0.0.1").is_empty());
    assert_eq!(snapshot.lookup_addresses("/10.0.0.7"), vec![uid(NS, "a")]);
    assert!(snapshot.alias("/10.0.0.1").is_none());
}

// ---------------------------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------------------------

#[test]
fn changes_since_merges_history() {
    let (a, b) = (uid(NS, "a"), uid(NS, "b"));
    let mut index = Index::new(Settings::default());
    assert_eq!(index.snapshot().generation, 1); // empty
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.1").into()));
    assert_eq!(index.snapshot().generation, 2); // +a
    index.apply(Object::Pod(pod(NS, "b", "10.0.0.2").into()));
    assert_eq!(index.snapshot().generation, 3); // +b
    index.delete(&pod_ref(NS, "a"));
    let snapshot = index.snapshot(); // -a
    assert_eq!(snapshot.generation, 4);

    // (since, Some((upserted, removed)) or None when the history does not reach)
    type Row<'a> = (u64, Option<(Vec<&'a String>, Vec<&'a String>)>);
    let table: &[Row] = &[
        (4, Some((vec![], vec![]))),
        (3, Some((vec![], vec![&a]))),
        (2, Some((vec![&b], vec![&a]))),
        (1, Some((vec![&b], vec![&a]))),
        (0, Some((vec![&b], vec![&a]))),
        (5, None),
        (99, None),
    ];
    for (since, want) in table {
        let got = snapshot.changes_since(*since);
        let want = want.as_ref().map(|(up, rm)| {
            let mut changes = Changes::default();
            changes.addresses.upserted = set(up);
            changes.addresses.removed = set(rm);
            changes
        });
        assert_eq!(got, want, "since {since}");
        // What each stream folds in: the same names, per type, without building `Changes`.
        for kind in TypeKind::ALL {
            let names: Option<BTreeSet<&str>> = snapshot
                .names_changed_since(kind, *since)
                .map(|names| names.map(|n| &**n).collect());
            let want: Option<BTreeSet<&str>> = want
                .as_ref()
                .map(|w| w.of(kind).names().map(|n| &**n).collect());
            assert_eq!(names, want, "since {since}, {kind}");
        }
    }
}

#[test]
fn changes_since_is_none_once_history_is_exceeded() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.1").into()));
    let first = index.snapshot();
    assert_eq!(first.generation, 1);
    for i in 0..HISTORY as u16 {
        let last = u8::try_from(i % 250).unwrap();
        index.apply(Object::Pod(pod(NS, "a", &format!("10.0.1.{last}")).into()));
        index.snapshot();
    }
    let snapshot = index.snapshot();
    let generation = snapshot.generation;
    assert_eq!(generation, HISTORY as u64 + 2);
    assert_eq!(snapshot.history.len(), HISTORY);
    let oldest = snapshot.history.front().unwrap().0;
    assert_eq!(oldest, generation - HISTORY as u64 + 1);
    // The history still covers the step from (oldest - 1), not the one before.
    assert!(snapshot.changes_since(oldest - 1).is_some());
    assert_eq!(snapshot.changes_since(oldest - 2), None);
    assert_eq!(snapshot.changes_since(first.generation), None);
    assert_eq!(snapshot.changes_since(generation), Some(Changes::default()));
    let recent = snapshot.changes_since(generation - 2).unwrap();
    assert!(recent.addresses.upserted.contains(uid(NS, "a").as_str()));
}

#[test]
fn a_step_larger_than_the_history_budget_leaves_no_history() {
    let mut index = Index::new(Settings::default());
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.1").into()));
    let before = index.snapshot();
    // One step that adds more names than the budget allows (the initial build of a big mesh).
    let pods = MIN_HISTORY_NAMES + 10;
    for i in 0..pods {
        let ip = format!("10.1.{}.{}", i / 250, i % 250);
        index.apply(Object::Pod(pod(NS, &format!("p{i}"), &ip).into()));
    }
    let big = index.snapshot();
    assert_eq!(big.addresses.len(), pods + 1);
    assert!(big.history.is_empty(), "{} entries kept", big.history.len());
    // A client at the step before compares snapshots; one at this step has nothing to do.
    assert_eq!(big.changes_since(before.generation), None);
    assert_eq!(big.status_changes_since(before.generation), None);
    assert_eq!(big.changes_since(big.generation), Some(Changes::default()));

    // Ordinary steps after it are kept again, and reach back to the big one.
    index.apply(Object::Pod(pod(NS, "a", "10.0.0.2").into()));
    let next = index.snapshot();
    assert_eq!(next.history.len(), 1);
    let changes = next
        .changes_since(big.generation)
        .expect("history covers it");
    assert_eq!(changes.addresses.upserted, set(&[uid(NS, "a")]));
    assert_eq!(next.changes_since(before.generation), None);
}
