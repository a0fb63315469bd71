//! The status conditions the index computes (`Snapshot::statuses`): `istio.io/WaypointBound` on
//! Services, ServiceEntries and WorkloadEntries, `ZtunnelAccepted` on AuthorizationPolicies.
//! Table tests on the pure core: bound, missing waypoint, wrong traffic type, denied namespace,
//! unbound, and that a fix updates or removes the condition incrementally.

use super::support::*;
use crate::discovery::Object;
use crate::discovery::model::authorization::{
    AuthorizationPolicy, Condition, Operation, PolicyAction, PolicyRule, PolicyTargetRef, Source,
};
use crate::discovery::model::status::{StatusKind, StatusTarget, WAYPOINT_BOUND};
use crate::discovery::model::{AllowedNamespaces, Gateway, Listener};

const WP_NS: &str = "wp";

/// A table row: name, the object's labels, the condition wanted (`None`: no condition).
type Case<W> = (&'static str, Vec<(&'static str, &'static str)>, Option<W>);

fn target(kind: StatusKind, namespace: &str, name: &str) -> StatusTarget {
    StatusTarget {
        kind,
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// `(status, reason, message)` of the condition the snapshot holds for an object.
fn condition(
    index: &mut crate::discovery::Index,
    object: &StatusTarget,
) -> Option<(bool, String, String)> {
    let snapshot = index.snapshot();
    let c = snapshot.statuses.get(object)?.condition.as_ref()?;
    Some((c.status, c.reason.clone(), c.message.clone()))
}

fn waypoint(name: &str, traffic: &str, allowed: AllowedNamespaces) -> Gateway {
    Gateway {
        labels: labels(&[("istio.io/waypoint-for", traffic)]),
        listeners: vec![Listener {
            name: "mesh".into(),
            port: 15008,
            protocol: "HBONE".into(),
            allowed: Some(allowed),
        }],
        ..ready_gateway(WP_NS, name, "10.9.0.1")
    }
}

fn labelled_svc(name: &str, svc_labels: &[(&str, &str)]) -> Object {
    let mut s = svc(NS, name, "10.0.0.1", &[("app", name)]);
    s.labels = labels(svc_labels);
    s.generation = 3;
    Object::Service(s)
}

fn base() -> Vec<Object> {
    vec![
        Object::Namespace(ns(NS)),
        Object::Namespace(ns(WP_NS)),
        Object::Gateway(waypoint("svc-wp", "service", AllowedNamespaces::All)),
        Object::Gateway(waypoint("wl-wp", "workload", AllowedNamespaces::All)),
        Object::Gateway(waypoint("same-wp", "all", AllowedNamespaces::Same)),
        Object::Gateway(gateway(WP_NS, "pending")),
    ]
}

fn use_wp(name: &'static str) -> [(&'static str, &'static str); 2] {
    [
        ("istio.io/use-waypoint", name),
        ("istio.io/use-waypoint-namespace", WP_NS),
    ]
}

#[test]
fn waypoint_bound_on_services() {
    let cases: Vec<Case<(bool, &str, &str)>> = vec![
        (
            "bound",
            use_wp("svc-wp").to_vec(),
            Some((
                true,
                "WaypointAccepted",
                "Successfully attached to waypoint wp/svc-wp",
            )),
        ),
        (
            "bound, ingress uses it",
            [
                &use_wp("svc-wp")[..],
                &[("istio.io/ingress-use-waypoint", "true")],
            ]
            .concat(),
            Some((
                true,
                "WaypointAccepted",
                "Successfully attached to waypoint wp/svc-wp. Ingress traffic will traverse the waypoint",
            )),
        ),
        (
            "bound, ingress label not true",
            [
                &use_wp("svc-wp")[..],
                &[("istio.io/ingress-use-waypoint", "eurt")],
            ]
            .concat(),
            Some((
                true,
                "WaypointAccepted",
                "Successfully attached to waypoint wp/svc-wp. Ingress traffic is not using the \
                 waypoint, set the istio.io/ingress-use-waypoint label to true if desired.",
            )),
        ),
        (
            "missing waypoint",
            use_wp("nope").to_vec(),
            Some((
                false,
                "WaypointIsNotReady",
                "waypoint \"wp/nope\" is not ready",
            )),
        ),
        (
            "gateway without address",
            use_wp("pending").to_vec(),
            Some((
                false,
                "WaypointIsNotReady",
                "waypoint \"wp/pending\" is not ready",
            )),
        ),
        (
            "workload-only waypoint",
            use_wp("wl-wp").to_vec(),
            Some((
                false,
                "UnsupportedTrafficType",
                "attempting to bind to traffic type \"service\" which the waypoint \"wp/wl-wp\" \
                 does not support",
            )),
        ),
        (
            "namespace not admitted",
            use_wp("same-wp").to_vec(),
            Some((
                false,
                "AttachmentDenied",
                "we are not permitted to attach to waypoint \"wp/same-wp\" (missing allowedRoutes?)",
            )),
        ),
        ("no label", vec![], None),
        ("opted out", vec![("istio.io/use-waypoint", "none")], None),
        (
            "the waypoint's own service",
            [
                &use_wp("svc-wp")[..],
                &[("gateway.istio.io/managed", "istio.io-mesh-controller")],
            ]
            .concat(),
            None,
        ),
    ];
    for (name, svc_labels, want) in cases {
        let mut index = index_of(base());
        index.apply(labelled_svc("s", &svc_labels));
        let got = condition(&mut index, &target(StatusKind::Service, NS, "s"));
        let want = want.map(|(s, r, m)| (s, r.to_string(), m.to_string()));
        assert_eq!(got, want, "case {name:?}");
    }
}

#[test]
fn waypoint_bound_carries_type_and_generation() {
    let mut index = index_of(base());
    index.apply(labelled_svc("s", &use_wp("svc-wp")));
    let snapshot = index.snapshot();
    let desired = &snapshot.statuses[&target(StatusKind::Service, NS, "s")];
    let c = desired.condition.as_ref().unwrap();
    assert_eq!(c.condition_type, WAYPOINT_BOUND);
    assert_eq!(desired.generation, 3);
}

#[test]
fn namespace_label_binds_services_and_reports_failures() {
    let mut index = index_of(base());
    index.apply(labelled_svc("s", &[]));
    let object = target(StatusKind::Service, NS, "s");
    assert_eq!(condition(&mut index, &object), None);
    index.apply(Object::Namespace(ns_with(NS, &use_wp("svc-wp"))));
    assert_eq!(
        condition(&mut index, &object).map(|c| c.0),
        Some(true),
        "the namespace label binds the service"
    );
    index.apply(Object::Namespace(ns_with(NS, &use_wp("wl-wp"))));
    assert_eq!(
        condition(&mut index, &object).map(|c| c.1),
        Some("UnsupportedTrafficType".to_string())
    );
}

#[test]
fn service_entries_get_one_condition_for_all_hosts() {
    let mut index = index_of(base());
    let mut se = service_entry(NS, "se", &["a.example.com", "b.example.com"]);
    se.labels = labels(&use_wp("svc-wp"));
    index.apply(Object::ServiceEntry(se));
    assert_eq!(
        condition(&mut index, &target(StatusKind::ServiceEntry, NS, "se")),
        Some((
            true,
            "WaypointAccepted".into(),
            "Successfully attached to waypoint wp/svc-wp".into()
        ))
    );
}

#[test]
fn workload_entries_bind_for_workload_traffic() {
    let cases: Vec<Case<(bool, &str)>> = vec![
        (
            "bound",
            use_wp("wl-wp").to_vec(),
            Some((true, "WaypointAccepted")),
        ),
        (
            "service-only waypoint on the entry itself",
            use_wp("svc-wp").to_vec(),
            Some((false, "UnsupportedTrafficType")),
        ),
        (
            "missing",
            use_wp("nope").to_vec(),
            Some((false, "WaypointIsNotReady")),
        ),
        ("unbound", vec![], None),
    ];
    for (name, we_labels, want) in cases {
        let mut index = index_of(base());
        index.apply(Object::WorkloadEntry(workload_entry(
            NS, "we", "10.1.0.1", &we_labels,
        )));
        let got = condition(&mut index, &target(StatusKind::WorkloadEntry, NS, "we"))
            .map(|(s, r, _)| (s, r));
        assert_eq!(got, want.map(|(s, r)| (s, r.to_string())), "case {name:?}");
    }
    // A service-only waypoint inherited from the namespace is silently no waypoint.
    let mut index = index_of(base());
    index.apply(Object::Namespace(ns_with(NS, &use_wp("svc-wp"))));
    index.apply(Object::WorkloadEntry(workload_entry(
        NS,
        "we",
        "10.1.0.1",
        &[],
    )));
    assert_eq!(
        condition(&mut index, &target(StatusKind::WorkloadEntry, NS, "we")),
        None
    );
}

#[test]
fn conditions_follow_fixes_and_deletes() {
    let mut index = index_of(base());
    index.apply(labelled_svc("s", &use_wp("pending")));
    let object = target(StatusKind::Service, NS, "s");
    assert_eq!(
        condition(&mut index, &object).map(|c| c.1),
        Some("WaypointIsNotReady".into())
    );
    // The waypoint becomes ready: the Gateway change re-evaluates the service.
    index.apply(Object::Gateway(waypoint(
        "pending",
        "service",
        AllowedNamespaces::All,
    )));
    let before = index.snapshot();
    assert!(before.statuses[&object].condition.as_ref().unwrap().status);
    // An unrelated change leaves the map shared (nothing to write).
    index.apply(Object::Namespace(ns_with("other", &[])));
    let after = index.snapshot();
    assert!(before.statuses.ptr_eq(&after.statuses));
    // The label goes: no condition any more, but the object is still there.
    index.apply(labelled_svc("s", &[]));
    assert_eq!(condition(&mut index, &object), None);
    assert!(index.snapshot().statuses.contains_key(&object));
    // Deleted objects carry nothing.
    index.apply(labelled_svc("s", &use_wp("svc-wp")));
    assert!(condition(&mut index, &object).is_some());
    index.delete(&crate::discovery::ObjectRef {
        kind: crate::discovery::Kind::Service,
        namespace: NS.into(),
        name: "s".into(),
    });
    assert!(!index.snapshot().statuses.contains_key(&object));
}

#[test]
fn ztunnel_accepted_on_policies() {
    let mut index = index_of(base());
    let policy = |methods: Vec<String>| AuthorizationPolicy {
        name: "p".into(),
        namespace: NS.into(),
        generation: 7,
        rules: vec![PolicyRule {
            to: vec![Operation {
                methods,
                ports: vec!["80".into()],
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    index.apply(Object::AuthorizationPolicy(policy(vec!["GET".into()])));
    let object = target(StatusKind::AuthorizationPolicy, NS, "p");
    let snapshot = index.snapshot();
    assert_eq!(snapshot.statuses[&object].generation, 7);
    let desired = snapshot.statuses[&object].condition.as_ref().unwrap();
    assert_eq!(desired.condition_type, "ZtunnelAccepted");
    assert_eq!(
        (desired.status, desired.reason.as_str()),
        (true, "UnsupportedValue"),
        "an ALLOW with HTTP rules is still sent (stricter), and says so"
    );
    assert!(
        desired
            .message
            .starts_with("ztunnel does not support HTTP attributes (found: methods)"),
        "{}",
        desired.message
    );
    assert_eq!(
        snapshot.policy_status.get(&format!("{NS}/p")),
        Some(&**desired)
    );
    index.apply(Object::AuthorizationPolicy(policy(vec![])));
    let fixed = condition(&mut index, &object).unwrap();
    assert_eq!(
        fixed,
        (true, "Accepted".into(), "attached to ztunnel".into())
    );
}

#[test]
fn a_status_only_change_is_a_change() {
    // DENY on port 80 with an HTTP path: ztunnel enforces port 80 alone, exactly as for the
    // fixed policy, so only the condition differs; the snapshot must still be published.
    let deny = |paths: Vec<String>| AuthorizationPolicy {
        name: "p".into(),
        namespace: NS.into(),
        action: crate::discovery::model::authorization::PolicyAction::Deny,
        rules: vec![PolicyRule {
            to: vec![Operation {
                paths,
                ports: vec!["80".into()],
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut index = index_of(base());
    index.apply(Object::AuthorizationPolicy(deny(vec!["/a".into()])));
    index.snapshot();
    let changes = index.apply(Object::AuthorizationPolicy(deny(vec![])));
    assert!(changes.authorizations.is_empty(), "{changes:?}");
    let object = target(StatusKind::AuthorizationPolicy, NS, "p");
    assert_eq!(changes.statuses.iter().collect::<Vec<_>>(), vec![&object]);
    assert!(index.has_unpublished());
    // The snapshot history names it for the status writer, not for xDS streams.
    let before = index.snapshot().generation - 1;
    let after = index.snapshot();
    let since = after.status_changes_since(before).unwrap();
    assert_eq!(since.into_iter().collect::<Vec<_>>(), vec![object]);
    assert!(after.changes_since(before).unwrap().is_empty());
}

/// istiod's AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY (`Settings::dry_run_authorization`): off,
/// a dry-run policy is not sent, not listed, and its status says why; on, it is sent marked
/// `dry_run`, listed by the workloads it selects, and accepted.
#[test]
fn dry_run_policies_are_sent_marked_only_when_enabled() {
    use crate::discovery::{Index, Settings};
    use crate::pb::security::Authorization;
    use prost::Message;
    let policy = AuthorizationPolicy {
        name: "p".into(),
        namespace: NS.into(),
        dry_run: true,
        selector: Some(labels(&[("app", "web")])),
        rules: vec![PolicyRule::default()],
        ..Default::default()
    };
    for enabled in [false, true] {
        let mut index = Index::new(Settings {
            dry_run_authorization: enabled,
            ..Settings::default()
        });
        for object in base() {
            index.apply(object);
        }
        index.apply(Object::Pod(
            pod_with(NS, "web", "10.0.0.1", &[("app", "web")]).into(),
        ));
        index.apply(Object::AuthorizationPolicy(policy.clone()));
        let snapshot = index.snapshot();
        let sent = snapshot
            .authorizations
            .get("demo/p")
            .map(|r| Authorization::decode(r.value()).unwrap());
        let listed = workload(&mut index, &uid(NS, "web")).authorization_policies;
        let status = condition(
            &mut index,
            &target(StatusKind::AuthorizationPolicy, NS, "p"),
        );
        if enabled {
            assert!(sent.expect("sent").dry_run);
            assert_eq!(listed, ["demo/p"]);
            assert_eq!(status.map(|s| (s.0, s.1)), Some((true, "Accepted".into())));
        } else {
            assert!(sent.is_none());
            assert!(listed.is_empty());
            let (ok, reason, message) = status.expect("a status");
            assert!(!ok && reason == "UnsupportedValue", "{reason}");
            assert!(message.contains("dry-run"), "{message}");
        }
    }
}

/// `WaypointAccepted` on a bound waypoint policy names what the waypoint cannot express in
/// full (the `discovery::convert::waypoint_authorization` checker): reason and exact message.
#[test]
fn waypoint_accepted_names_what_the_waypoint_cannot_express() {
    const BOUND: &str = "bound to wp/svc-wp";
    const STRICTER: &str = "This will be more restrictive than requested.";
    let when = |key: &str, value: &str| Condition {
        key: key.into(),
        values: vec![value.into()],
        not_values: vec![],
    };
    let rule = |to: Operation, when: Vec<Condition>| PolicyRule {
        from: vec![Source {
            namespaces: vec!["app".into()],
            ..Default::default()
        }],
        to: vec![to],
        when,
    };
    let ports = |ports: &[&str]| Operation {
        ports: ports.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    };
    let get = Operation {
        methods: vec!["GET".into()],
        ..Default::default()
    };
    let mysql = "experimental.envoy.filters.network.mysql_proxy[db.table]";
    type Row = (
        &'static str,
        PolicyAction,
        PolicyRule,
        &'static str,
        bool,
        String,
        String,
    );
    let rows: Vec<Row> = vec![
        (
            "fully expressible: message unchanged",
            PolicyAction::Allow,
            rule(ports(&["80"]), vec![when("destination.port", "80")]),
            "svc-wp",
            true,
            "Accepted".into(),
            BOUND.into(),
        ),
        (
            "experimental.envoy.filters.* in an ALLOW",
            PolicyAction::Allow,
            rule(ports(&["80"]), vec![when(mysql, "[update]")]),
            "svc-wp",
            true,
            "PartiallyInvalid".into(),
            format!(
                "{BOUND}. The waypoint does not support these conditions (found: {mysql}). \
                 Within an ALLOW policy, rules using them are omitted. {STRICTER}"
            ),
        ),
        (
            "unknown when key in a DENY",
            PolicyAction::Deny,
            rule(ports(&["80"]), vec![when("source.name", "x")]),
            "svc-wp",
            true,
            "PartiallyInvalid".into(),
            format!(
                "{BOUND}. The waypoint does not support these conditions (found: source.name). \
                 Within a DENY policy, they are left out of their rules, which then match more \
                 requests. {STRICTER}"
            ),
        ),
        (
            "CUSTOM action, with an HTTP attribute",
            PolicyAction::Custom,
            rule(get.clone(), vec![]),
            "svc-wp",
            true,
            "PartiallyInvalid".into(),
            format!(
                "{BOUND}. The waypoint does not support the CUSTOM action (no extension \
                 provider); requests its rules match are denied. {STRICTER} HTTP attributes \
                 apply only to HTTP ports (found: methods); on TCP ports, they are left out of \
                 their rules, which then match more connections."
            ),
        ),
        (
            "HTTP attributes alone: accepted, named",
            PolicyAction::Allow,
            rule(get.clone(), vec![when("request.headers[x-user]", "alice")]),
            "svc-wp",
            true,
            "Accepted".into(),
            format!(
                "{BOUND}. HTTP attributes apply only to HTTP ports (found: methods, \
                 request.headers[x-user]); on TCP ports, rules using them are omitted."
            ),
        ),
        (
            "an invalid value",
            PolicyAction::Allow,
            rule(ports(&["http"]), vec![]),
            "svc-wp",
            true,
            "PartiallyInvalid".into(),
            format!(
                "{BOUND}. The waypoint cannot use invalid values (found: \
                 rules[0].to[0].operation.ports \"http\"). Within an ALLOW policy, a rule with \
                 an invalid value is omitted. {STRICTER}"
            ),
        ),
        (
            "AUDIT: nothing applies",
            PolicyAction::Audit,
            rule(ports(&["80"]), vec![]),
            "svc-wp",
            false,
            "Invalid".into(),
            format!(
                "{BOUND}. The waypoint does not support the AUDIT action; the policy is not \
                 enforced."
            ),
        ),
        (
            "unbound target: the binding alone",
            PolicyAction::Allow,
            rule(ports(&["80"]), vec![when(mysql, "[update]")]),
            "nope",
            false,
            "TargetNotFound".into(),
            "not bound".into(),
        ),
    ];
    for (name, action, rule, gateway, status, reason, message) in rows {
        let mut index = index_of(base());
        index.apply(Object::AuthorizationPolicy(AuthorizationPolicy {
            name: "p".into(),
            namespace: WP_NS.into(),
            generation: 2,
            has_target_refs: true,
            target_refs: vec![PolicyTargetRef {
                group: "gateway.networking.k8s.io".into(),
                kind: "Gateway".into(),
                name: gateway.into(),
                namespace: String::new(),
            }],
            action,
            rules: vec![rule],
            ..Default::default()
        }));
        assert_eq!(
            condition(&mut index, &target(StatusKind::WaypointPolicy, WP_NS, "p")),
            Some((status, reason, message)),
            "{name}"
        );
    }
}
