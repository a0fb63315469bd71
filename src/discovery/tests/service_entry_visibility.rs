//! meshConfig.serviceEntryVisibility (Istio 1.31): what each resolved visibility does to the
//! Services, endpoints, canonical choice, waypoints and status conditions of ServiceEntries,
//! and that a Namespace label change re-resolves it incrementally.

use std::sync::Arc;

use super::support::*;
use crate::discovery::model::status::{
    StatusKind, StatusTarget, VISIBILITY_APPLIED, WAYPOINT_BOUND,
};
use crate::discovery::model::visibility::{ServiceEntryVisibility, Visibility, VisibilityPolicy};
use crate::discovery::model::{AllowedNamespaces, Gateway, Listener, NamespaceSelector};
use crate::discovery::{Index, Object, Settings};

const HOST: &str = "api.example.com";
/// No label: the default visibility (NAMESPACE).
const PRIVATE: &str = "team-a";
/// `trusted: "true"`: PUBLIC.
const TRUSTED: &str = "team-b";
/// `tier: untrusted`: NONE.
const BLOCKED: &str = "sandbox";
const WP_NS: &str = "egress";

fn config() -> ServiceEntryVisibility {
    ServiceEntryVisibility {
        default: Visibility::Namespace,
        policies: vec![
            VisibilityPolicy {
                visibility: Visibility::Public,
                rules: vec![NamespaceSelector::labels(labels(&[("trusted", "true")]))],
            },
            VisibilityPolicy {
                visibility: Visibility::None,
                rules: vec![NamespaceSelector::labels(labels(&[("tier", "untrusted")]))],
            },
        ],
    }
}

fn index(visibility: Option<ServiceEntryVisibility>, objects: Vec<Object>) -> Index {
    let mut index = Index::new(Settings {
        service_entry_visibility: visibility.map(Arc::new),
        ..Settings::default()
    });
    for object in objects {
        index.apply(object);
    }
    index
}

/// A ServiceEntry for [`HOST`] with one endpoint, created at `created`.
fn entry(namespace: &str, created: &str, endpoint_ip: &str) -> Object {
    let mut se = service_entry(namespace, "api", &[HOST]);
    se.created = created.into();
    se.endpoints = vec![endpoint(endpoint_ip)];
    Object::ServiceEntry(se)
}

fn namespaces() -> Vec<Object> {
    vec![
        Object::Namespace(ns(PRIVATE)),
        Object::Namespace(ns_with(TRUSTED, &[("trusted", "true")])),
        Object::Namespace(ns_with(BLOCKED, &[("tier", "untrusted")])),
        Object::Namespace(ns(WP_NS)),
    ]
}

/// Each namespace's entry endpoint.
const ENDPOINTS: [(&str, &str); 3] = [
    (PRIVATE, "10.1.0.1"),
    (TRUSTED, "10.2.0.1"),
    (BLOCKED, "10.3.0.1"),
];

/// Entries for the same host in the three namespaces: the NONE one oldest, then the NAMESPACE
/// one, then the PUBLIC one.
fn mesh() -> Vec<Object> {
    let mut objects = namespaces();
    let created = [
        "2026-01-01T00:00:00Z",
        "2026-02-01T00:00:00Z",
        "2025-01-01T00:00:00Z",
    ];
    for ((namespace, endpoint_ip), created) in ENDPOINTS.into_iter().zip(created) {
        objects.push(entry(namespace, created, endpoint_ip));
    }
    objects
}

/// `(status, reason, message)` of one condition in the snapshot.
fn condition(
    index: &mut Index,
    kind: StatusKind,
    namespace: &str,
) -> Option<(bool, String, String)> {
    let object = StatusTarget {
        kind,
        namespace: namespace.into(),
        name: "api".into(),
    };
    let snapshot = index.snapshot();
    let c = snapshot.statuses.get(&object)?.condition.as_ref()?;
    assert_eq!(c.condition_type, kind.condition_type());
    Some((c.status, c.reason.clone(), c.message.clone()))
}

#[test]
fn without_the_mesh_setting_every_entry_is_public_and_no_condition_is_written() {
    let mut index = index(None, mesh());
    for (namespace, endpoint_ip) in ENDPOINTS {
        let s = service(&mut index, &host_key(namespace, HOST));
        assert_eq!(s.visibility, 0, "{namespace}");
        let w = workload(&mut index, &se_uid(namespace, "api", endpoint_ip));
        assert!(w.services.contains_key(&host_key(namespace, HOST)));
        assert_eq!(
            condition(&mut index, StatusKind::ServiceEntryVisibility, namespace),
            None
        );
    }
    // The oldest entry is canonical.
    assert!(service(&mut index, &host_key(BLOCKED, HOST)).canonical);
    assert!(!service(&mut index, &host_key(PRIVATE, HOST)).canonical);
}

#[test]
fn each_visibility_shapes_what_is_published() {
    let mut index = index(Some(config()), mesh());

    // NAMESPACE: marked, published with its endpoint, never canonical although it is the
    // oldest published entry.
    let private = service(&mut index, &host_key(PRIVATE, HOST));
    assert_eq!(private.visibility, 1);
    assert!(!private.canonical);
    let w = workload(&mut index, &se_uid(PRIVATE, "api", "10.1.0.1"));
    assert!(w.services.contains_key(&host_key(PRIVATE, HOST)));

    // PUBLIC: canonical.
    let trusted = service(&mut index, &host_key(TRUSTED, HOST));
    assert_eq!(trusted.visibility, 0);
    assert!(trusted.canonical);

    // NONE: nothing at all, not even the endpoint, and it takes no part in the canonical
    // choice although it is the oldest.
    assert!(try_service(&mut index, &host_key(BLOCKED, HOST)).is_none());
    assert!(try_workload(&mut index, &se_uid(BLOCKED, "api", "10.3.0.1")).is_none());

    // The condition names the resolved visibility; NONE gets none (istiod's known limitation).
    let applied = |reason: &str| {
        Some((
            true,
            reason.to_string(),
            format!(
                "ServiceEntry visibility resolved to {reason} by meshConfig.serviceEntryVisibility"
            ),
        ))
    };
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntryVisibility, PRIVATE),
        applied("Namespace")
    );
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntryVisibility, TRUSTED),
        applied("Public")
    );
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntryVisibility, BLOCKED),
        None
    );
}

#[test]
fn a_kubernetes_service_still_wins_its_namespace_and_stays_canonical() {
    let mut objects = mesh();
    // A Service whose hostname an entry of the NONE namespace also claims.
    let host = format!("web.{BLOCKED}.svc.cluster.local");
    let mut se = service_entry(BLOCKED, "shadow", &[&host]);
    se.created = "2020-01-01T00:00:00Z".into();
    objects.push(Object::ServiceEntry(se));
    objects.push(Object::Service(svc(
        BLOCKED,
        "web",
        "10.96.0.9",
        &[("app", "web")],
    )));
    let mut index = index(Some(config()), objects);
    let s = service(&mut index, &host_key(BLOCKED, &host));
    assert_eq!(s.name, "web");
    assert!(s.canonical);
    assert_eq!(s.visibility, 0);
}

#[test]
fn a_namespace_label_change_re_resolves_its_entries_and_their_rivals() {
    let mut index = index(Some(config()), mesh());
    assert!(service(&mut index, &host_key(TRUSTED, HOST)).canonical);

    // team-a becomes trusted: its (older) entry turns PUBLIC and takes canonical from team-b.
    index.apply(Object::Namespace(ns_with(PRIVATE, &[("trusted", "true")])));
    let private = service(&mut index, &host_key(PRIVATE, HOST));
    assert_eq!((private.visibility, private.canonical), (0, true));
    assert!(!service(&mut index, &host_key(TRUSTED, HOST)).canonical);
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntryVisibility, PRIVATE).map(|c| c.1),
        Some("Public".to_string())
    );

    // The sandbox is no longer untrusted: its entry appears, endpoint included, and as the
    // oldest PUBLIC entry it is now canonical.
    index.apply(Object::Namespace(ns_with(BLOCKED, &[("trusted", "true")])));
    assert!(service(&mut index, &host_key(BLOCKED, HOST)).canonical);
    assert!(!service(&mut index, &host_key(PRIVATE, HOST)).canonical);
    assert!(try_workload(&mut index, &se_uid(BLOCKED, "api", "10.3.0.1")).is_some());

    // And back to untrusted: gone again, and canonical returns to team-a.
    index.apply(Object::Namespace(ns_with(
        BLOCKED,
        &[("tier", "untrusted")],
    )));
    assert!(try_service(&mut index, &host_key(BLOCKED, HOST)).is_none());
    assert!(try_workload(&mut index, &se_uid(BLOCKED, "api", "10.3.0.1")).is_none());
    assert!(service(&mut index, &host_key(PRIVATE, HOST)).canonical);
}

fn waypoint(namespace: &str, name: &str, address: &str) -> Object {
    Object::Gateway(Gateway {
        labels: labels(&[("istio.io/waypoint-for", "service")]),
        listeners: vec![Listener {
            name: "mesh".into(),
            port: 15008,
            protocol: "HBONE".into(),
            allowed: Some(AllowedNamespaces::All),
        }],
        ..ready_gateway(namespace, name, address)
    })
}

/// An entry of `namespace` asking for the waypoint `wp_ns/wp`.
fn entry_using(namespace: &str, wp_ns: &str) -> Object {
    let mut se = service_entry(namespace, "api", &[HOST]);
    se.labels = labels(&[
        ("istio.io/use-waypoint", "wp"),
        ("istio.io/use-waypoint-namespace", wp_ns),
    ]);
    Object::ServiceEntry(se)
}

#[test]
fn a_namespace_local_entry_may_not_use_a_waypoint_of_another_namespace() {
    let mut objects = namespaces();
    objects.extend([
        waypoint(WP_NS, "wp", "10.9.0.1"),
        waypoint(PRIVATE, "wp", "10.9.0.2"),
        entry_using(PRIVATE, WP_NS),
        entry_using(TRUSTED, WP_NS),
    ]);
    let mut index = index(Some(config()), objects);

    // NONE: no service, so no binding to report.
    index.apply(entry_using(BLOCKED, WP_NS));
    assert!(try_service(&mut index, &host_key(BLOCKED, HOST)).is_none());
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntry, BLOCKED),
        None
    );

    // NAMESPACE visibility: refused, with istiod's reason.
    assert_eq!(service(&mut index, &host_key(PRIVATE, HOST)).waypoint, None);
    let (status, reason, message) = condition(&mut index, StatusKind::ServiceEntry, PRIVATE)
        .expect("a WaypointBound condition");
    assert!(!status);
    assert_eq!(reason, "CrossNamespaceWaypointForbidden");
    assert_eq!(
        message,
        "cannot bind to waypoint \"egress/wp\" in another namespace: cross-namespace waypoint \
         binding is not permitted for a ServiceEntry with NAMESPACE visibility"
    );

    // PUBLIC: the same cross-namespace waypoint binds.
    assert!(
        service(&mut index, &host_key(TRUSTED, HOST))
            .waypoint
            .is_some()
    );
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntry, TRUSTED).map(|c| (c.0, c.1)),
        Some((true, "WaypointAccepted".to_string()))
    );

    // A waypoint of its own namespace binds normally.
    index.apply(entry_using(PRIVATE, PRIVATE));
    assert!(
        service(&mut index, &host_key(PRIVATE, HOST))
            .waypoint
            .is_some()
    );
    let bound = condition(&mut index, StatusKind::ServiceEntry, PRIVATE).unwrap();
    assert_eq!((bound.0, bound.1.as_str()), (true, "WaypointAccepted"));

    // Both conditions live side by side on the one object.
    let snapshot = index.snapshot();
    let types: Vec<&str> = [StatusKind::ServiceEntry, StatusKind::ServiceEntryVisibility]
        .iter()
        .filter_map(|&kind| {
            let target = StatusTarget {
                kind,
                namespace: PRIVATE.into(),
                name: "api".into(),
            };
            Some(
                snapshot
                    .statuses
                    .get(&target)?
                    .condition
                    .as_ref()?
                    .condition_type,
            )
        })
        .collect();
    assert_eq!(types, [WAYPOINT_BOUND, VISIBILITY_APPLIED]);
}

#[test]
fn a_namespace_local_entry_drops_a_canary_of_another_namespace() {
    let mut objects = namespaces();
    objects.extend([
        waypoint(PRIVATE, "wp", "10.9.0.2"),
        waypoint(WP_NS, "canary", "10.9.0.3"),
        waypoint(PRIVATE, "canary", "10.9.0.4"),
    ]);
    let mut se = service_entry(PRIVATE, "api", &[HOST]);
    se.labels = labels(&[
        ("istio.io/use-waypoint", "wp"),
        ("istio.io/use-waypoint-canary", "canary"),
        ("istio.io/use-waypoint-canary-namespace", WP_NS),
    ]);
    se.annotations = labels(&[("istio.io/use-waypoint-canary-weight", "20")]);
    objects.push(Object::ServiceEntry(se.clone()));
    let mut index = index(Some(config()), objects);
    let s = service(&mut index, &host_key(PRIVATE, HOST));
    assert!(s.waypoint.is_some());
    assert!(
        s.weighted_waypoints.is_empty(),
        "{:?}",
        s.weighted_waypoints
    );

    // A canary in the entry's own namespace is kept.
    se.labels = labels(&[
        ("istio.io/use-waypoint", "wp"),
        ("istio.io/use-waypoint-canary", "canary"),
    ]);
    index.apply(Object::ServiceEntry(se));
    let s = service(&mut index, &host_key(PRIVATE, HOST));
    let weights: Vec<u32> = s.weighted_waypoints.iter().map(|w| w.weight).collect();
    assert_eq!(weights, [80, 20]);
}

#[test]
fn a_namespace_label_change_re_emits_exactly_its_entries_and_their_rivals() {
    let mut objects = mesh();
    objects.extend([
        // Bystanders: a pod of team-a, and an entry of team-b for another host.
        Object::Pod(pod_with(PRIVATE, "web", "10.1.0.9", &[("app", "web")]).into()),
        Object::ServiceEntry(service_entry(TRUSTED, "other", &["other.example.com"])),
    ]);
    let mut index = index(Some(config()), objects);
    index.snapshot();
    let changes = index.apply(Object::Namespace(ns_with(PRIVATE, &[("trusted", "true")])));
    // team-a's entry turns PUBLIC and canonical; team-b's loses canonical. Nothing else differs.
    assert_eq!(
        changes.addresses.upserted,
        set(&[host_key(PRIVATE, HOST), host_key(TRUSTED, HOST)])
    );
    assert!(changes.addresses.removed.is_empty());
    assert!(changes.authorizations.is_empty());
}

#[test]
fn a_new_visibility_at_runtime_re_emits_only_what_differs() {
    let mut objects = mesh();
    objects.push(Object::Pod(
        pod_with(PRIVATE, "web", "10.1.0.9", &[("app", "web")]).into(),
    ));
    let mut index = index(Some(config()), objects);
    index.snapshot();
    // The same configuration again: nothing.
    assert!(
        index
            .set_visibility(Some(Arc::new(config())))
            .addresses
            .is_empty()
    );
    // Not configured any more: every entry is public, the sandbox's appears with its endpoint,
    // and as the oldest it takes canonical. Bystanders are untouched.
    let changes = index.set_visibility(None);
    assert_eq!(
        changes.addresses.upserted,
        set(&[
            host_key(PRIVATE, HOST),
            host_key(TRUSTED, HOST),
            host_key(BLOCKED, HOST),
            se_uid(BLOCKED, "api", "10.3.0.1"),
        ])
    );
    assert!(changes.addresses.removed.is_empty());
    assert!(service(&mut index, &host_key(BLOCKED, HOST)).canonical);
    // The VisibilityApplied conditions go.
    assert_eq!(
        condition(&mut index, StatusKind::ServiceEntryVisibility, PRIVATE),
        None
    );
    assert!(
        changes
            .statuses
            .iter()
            .any(|t| t.kind == StatusKind::ServiceEntryVisibility && &*t.namespace == PRIVATE)
    );
}

#[test]
fn the_debug_view_shows_each_services_visibility() {
    let mut index = index(Some(config()), mesh());
    let snapshot = index.snapshot();
    let view = |namespace: &str| {
        let resource = &snapshot.addresses[host_key(namespace, HOST).as_str()];
        crate::debug::render::address(resource)["visibility"].clone()
    };
    assert_eq!(view(PRIVATE), "NAMESPACE");
    assert_eq!(view(TRUSTED), "PUBLIC");
}
