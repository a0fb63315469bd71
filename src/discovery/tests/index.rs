//! Table tests of the pure conversion core for Pods: reduced Kubernetes objects in, decoded
//! `istio.workload.Workload` resources out (docs/conversion.md, "Pod → Workload" and "Network").
//! Services and the services map are in `index_services.rs`; change tracking in `index_changes.rs`.

use super::support::*;
use crate::discovery::model::Owner;
use crate::discovery::{Index, Kind, Object, ObjectRef, Settings};
use crate::pb::workload::{Locality, NetworkMode, TunnelProtocol, WorkloadStatus, WorkloadType};

/// Labels or annotations in a table row.
type Pairs = &'static [(&'static str, &'static str)];

// ---------------------------------------------------------------------------------------------
// Pod -> Workload
// ---------------------------------------------------------------------------------------------

#[test]
fn pod_becomes_workload_with_every_basic_field() {
    let mut p = pod(NS, "web-1", "10.0.0.1");
    p.service_account = "web-sa".into();
    let mut index = Index::new(Settings::default());
    let changes = index.apply(Object::Pod(p.into()));
    assert_eq!(changes.addresses.upserted, set(&[uid(NS, "web-1")]));
    assert!(changes.addresses.removed.is_empty());
    assert!(changes.authorizations.is_empty());

    let w = workload(&mut index, &uid(NS, "web-1"));
    assert_eq!(w.uid, "Kubernetes//Pod/demo/web-1");
    assert_eq!(w.name, "web-1");
    assert_eq!(w.namespace, NS);
    assert_eq!(w.addresses, vec![raw("10.0.0.1")]);
    assert_eq!(w.addresses[0].as_ref(), &[10, 0, 0, 1]);
    assert_eq!(w.hostname, "");
    assert_eq!(w.network, "");
    assert_eq!(w.service_account, "web-sa");
    assert_eq!(w.node, NODE);
    assert_eq!(w.status(), WorkloadStatus::Healthy);
    assert_eq!(w.tunnel_protocol(), TunnelProtocol::None);
    assert!(!w.native_tunnel);
    assert_eq!(w.workload_type(), WorkloadType::Pod);
    assert_eq!(w.workload_name, "web-1");
    assert_eq!(w.canonical_name, "web-1");
    assert_eq!(w.canonical_revision, "latest");
    assert_eq!(w.trust_domain, "");
    assert_eq!(w.cluster_id, "Kubernetes");
    assert_eq!(w.network_mode(), NetworkMode::Standard);
    assert_eq!(w.locality, None);
    assert!(w.waypoint.is_none());
    assert!(w.network_gateway.is_none());
    assert!(w.services.is_empty());
    assert!(w.capacity.is_none());
}

#[test]
fn dual_stack_pod_keeps_address_order_as_raw_bytes() {
    let mut p = pod(NS, "dual", "fd00::1");
    p.ips = [ip("fd00::1"), ip("10.0.0.9")].into();
    let mut index = index_of([Object::Pod(p.into())]);
    let w = workload(&mut index, &uid(NS, "dual"));
    assert_eq!(w.addresses, vec![raw("fd00::1"), raw("10.0.0.9")]);
    assert_eq!(w.addresses[0].len(), 16);
    assert_eq!(w.addresses[1].len(), 4);
}

#[test]
fn status_is_healthy_only_when_ready_and_not_terminating() {
    let table = [
        (true, false, WorkloadStatus::Healthy),
        (true, true, WorkloadStatus::Unhealthy),
        (false, false, WorkloadStatus::Unhealthy),
        (false, true, WorkloadStatus::Unhealthy),
    ];
    for (ready, terminating, want) in table {
        let mut p = pod(NS, "p", "10.0.0.1");
        p.ready = ready;
        p.terminating = terminating;
        let mut index = index_of([Object::Pod(p.into())]);
        let w = workload(&mut index, &uid(NS, "p"));
        assert_eq!(w.status(), want, "ready={ready} terminating={terminating}");
    }
}

#[test]
fn tunnel_protocol_from_redirection_annotation_and_tunnel_label() {
    const REDIRECTION: &str = "ambient.istio.io/redirection";
    const TUNNEL: &str = "networking.istio.io/tunnel";
    // (labels, annotations, tunnel protocol, native tunnel)
    type Row = (Pairs, Pairs, TunnelProtocol, bool);
    let table: &[Row] = &[
        (&[], &[], TunnelProtocol::None, false),
        (
            &[],
            &[(REDIRECTION, "enabled")],
            TunnelProtocol::Hbone,
            false,
        ),
        (
            &[],
            &[(REDIRECTION, "pending")],
            TunnelProtocol::None,
            false,
        ),
        (&[(TUNNEL, "http")], &[], TunnelProtocol::Hbone, true),
        (&[(TUNNEL, "foo,http")], &[], TunnelProtocol::Hbone, true),
        (&[(TUNNEL, "http2")], &[], TunnelProtocol::None, false),
        // Both steps apply in order (istiod's setTunnelProtocol): the label still sets
        // native_tunnel on a redirected pod.
        (
            &[(TUNNEL, "http")],
            &[(REDIRECTION, "enabled")],
            TunnelProtocol::Hbone,
            true,
        ),
        // istiod never reads the dataplane-mode label when building WDS.
        (
            &[("istio.io/dataplane-mode", "ambient")],
            &[],
            TunnelProtocol::None,
            false,
        ),
        // The sidecar tlsMode label never yields LEGACY_ISTIO_MTLS.
        (
            &[("security.istio.io/tlsMode", "istio")],
            &[],
            TunnelProtocol::None,
            false,
        ),
    ];
    for (pod_labels, annotations, want, want_native) in table {
        let mut p = pod_with(NS, "p", "10.0.0.1", pod_labels);
        p.annotations = labels(annotations);
        let mut index = index_of([Object::Pod(p.into())]);
        let w = workload(&mut index, &uid(NS, "p"));
        let case = format!("labels={pod_labels:?} annotations={annotations:?}");
        assert_eq!(w.tunnel_protocol(), *want, "{case}");
        assert_eq!(w.native_tunnel, *want_native, "{case}");
    }
}

#[test]
fn canonical_name_and_revision_fallbacks() {
    // (labels, canonical name, canonical revision)
    let table: &[(Pairs, &str, &str)] = &[
        (&[], "p", "latest"),
        (&[("app", "web"), ("version", "v1")], "web", "v1"),
        (
            &[
                ("app", "web"),
                ("app.kubernetes.io/name", "web-k8s"),
                ("version", "v1"),
                ("app.kubernetes.io/version", "v2"),
            ],
            "web-k8s",
            "v2",
        ),
        (
            &[
                ("app", "web"),
                ("app.kubernetes.io/name", "web-k8s"),
                ("service.istio.io/canonical-name", "web-canonical"),
                ("version", "v1"),
                ("service.istio.io/canonical-revision", "v3"),
            ],
            "web-canonical",
            "v3",
        ),
        (&[("version", "v1")], "p", "v1"),
        // The workload-name label feeds the canonical name fallback.
        (&[("service.istio.io/workload-name", "wl")], "wl", "latest"),
    ];
    for (pod_labels, want_name, want_revision) in table {
        let mut index = index_of([Object::Pod(
            pod_with(NS, "p", "10.0.0.1", pod_labels).into(),
        )]);
        let w = workload(&mut index, &uid(NS, "p"));
        assert_eq!(w.canonical_name, *want_name, "labels={pod_labels:?}");
        assert_eq!(
            w.canonical_revision, *want_revision,
            "labels={pod_labels:?}"
        );
    }
}

#[test]
fn workload_name_from_controller_owner() {
    struct Case {
        generate_name: &'static str,
        owner: Option<(&'static str, &'static str)>,
        labels: &'static [(&'static str, &'static str)],
        want: &'static str,
    }
    let table = [
        // Deployment: ReplicaSet minus the pod-template-hash.
        Case {
            generate_name: "web-7d4b9c-",
            owner: Some(("ReplicaSet", "web-7d4b9c")),
            labels: &[("pod-template-hash", "7d4b9c")],
            want: "web",
        },
        // Argo Rollout.
        Case {
            generate_name: "roll-5f6d-",
            owner: Some(("ReplicaSet", "roll-5f6d")),
            labels: &[("rollouts-pod-template-hash", "5f6d")],
            want: "roll",
        },
        // A bare ReplicaSet without the hash label keeps its name.
        Case {
            generate_name: "rs-",
            owner: Some(("ReplicaSet", "rs")),
            labels: &[],
            want: "rs",
        },
        // CronJob: Job `<x>-<8..10 digits>` -> x.
        Case {
            generate_name: "x-12345678-",
            owner: Some(("Job", "x-12345678")),
            labels: &[],
            want: "x",
        },
        Case {
            generate_name: "backup-1234567890-",
            owner: Some(("Job", "backup-1234567890")),
            labels: &[],
            want: "backup",
        },
        // Seven or eleven digits are not a CronJob timestamp.
        Case {
            generate_name: "job-1234567-",
            owner: Some(("Job", "job-1234567")),
            labels: &[],
            want: "job-1234567",
        },
        Case {
            generate_name: "job-12345678901-",
            owner: Some(("Job", "job-12345678901")),
            labels: &[],
            want: "job-12345678901",
        },
        Case {
            generate_name: "dc-1-",
            owner: Some(("ReplicationController", "dc-1")),
            labels: &[("deploymentconfig", "dc")],
            want: "dc",
        },
        Case {
            generate_name: "db-",
            owner: Some(("StatefulSet", "db")),
            labels: &[],
            want: "db",
        },
        // No generateName: the pod's own name even with an owner.
        Case {
            generate_name: "",
            owner: Some(("ReplicaSet", "web-7d4b9c")),
            labels: &[("pod-template-hash", "7d4b9c")],
            want: "p",
        },
        // No controller: the pod's own name.
        Case {
            generate_name: "web-",
            owner: None,
            labels: &[],
            want: "p",
        },
        // The workload-name label overrides everything.
        Case {
            generate_name: "web-7d4b9c-",
            owner: Some(("ReplicaSet", "web-7d4b9c")),
            labels: &[
                ("pod-template-hash", "7d4b9c"),
                ("service.istio.io/workload-name", "override"),
            ],
            want: "override",
        },
    ];
    for case in table {
        let mut p = pod_with(NS, "p", "10.0.0.1", case.labels);
        p.generate_name = case.generate_name.into();
        p.owner = case.owner.map(|(kind, name)| Owner {
            kind: kind.into(),
            name: name.into(),
        });
        let mut index = index_of([Object::Pod(p.into())]);
        let w = workload(&mut index, &uid(NS, "p"));
        assert_eq!(w.workload_name, case.want, "owner={:?}", case.owner);
        // Without app labels the canonical name falls back to the workload name.
        if !case.labels.iter().any(|(k, _)| k.contains("workload-name")) {
            assert_eq!(w.canonical_name, case.want, "owner={:?}", case.owner);
        }
        assert_eq!(w.workload_type(), WorkloadType::Pod);
    }
}

#[test]
fn trust_domain_and_cluster_id_follow_settings() {
    let table = [
        ("Kubernetes", "cluster.local", "Kubernetes//Pod/demo/p", ""),
        ("c1", "example.org", "c1//Pod/demo/p", "example.org"),
        ("", "cluster.local", "//Pod/demo/p", ""),
    ];
    for (cluster_id, trust_domain, want_uid, want_td) in table {
        let settings = Settings {
            cluster_id: cluster_id.into(),
            trust_domain: trust_domain.into(),
            ..Settings::default()
        };
        let mut index = Index::new(settings);
        let changes = index.apply(Object::Pod(pod(NS, "p", "10.0.0.1").into()));
        assert_eq!(changes.addresses.upserted, set(&[want_uid]));
        let w = workload(&mut index, want_uid);
        assert_eq!(w.uid, want_uid);
        assert_eq!(w.cluster_id, cluster_id);
        assert_eq!(w.trust_domain, want_td);
    }
}

#[test]
fn host_network_pod() {
    let mut p = pod(NS, "p", "192.168.1.10");
    p.host_network = true;
    let mut index = index_of([Object::Pod(p.into())]);
    let w = workload(&mut index, &uid(NS, "p"));
    assert_eq!(w.network_mode(), NetworkMode::HostNetwork);
}

#[test]
fn locality_from_node_topology_labels() {
    const REGION: &str = "topology.kubernetes.io/region";
    const ZONE: &str = "topology.kubernetes.io/zone";
    const SUBZONE: &str = "topology.istio.io/subzone";
    let locality = |region: &str, zone: &str, subzone: &str| Locality {
        region: region.into(),
        zone: zone.into(),
        subzone: subzone.into(),
    };
    // (node labels, or no Node at all; locality)
    let table: &[(Option<Pairs>, Option<Locality>)] = &[
        (None, None),
        (Some(&[]), None),
        (Some(&[("kubernetes.io/hostname", NODE)]), None),
        (
            Some(&[(REGION, "r1"), (ZONE, "z1"), (SUBZONE, "s1")]),
            Some(locality("r1", "z1", "s1")),
        ),
        (Some(&[(REGION, "r1")]), Some(locality("r1", "", ""))),
        (Some(&[(ZONE, "z1")]), Some(locality("", "z1", ""))),
    ];
    for (node_labels, want) in table {
        let mut objects = vec![];
        if let Some(node_labels) = node_labels {
            objects.push(Object::Node(node(NODE, node_labels)));
        }
        objects.push(Object::Pod(pod(NS, "p", "10.0.0.1").into()));
        let mut index = index_of(objects);
        let w = workload(&mut index, &uid(NS, "p"));
        assert_eq!(w.locality, *want, "node labels {node_labels:?}");
    }
}

#[test]
fn locality_of_pod_on_another_node_is_none() {
    const ZONE: &str = "topology.kubernetes.io/zone";
    let mut p = pod(NS, "p", "10.0.0.1");
    p.node_name = "node-b".into();
    let mut index = index_of([
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::Pod(p.into()),
    ]);
    assert_eq!(workload(&mut index, &uid(NS, "p")).locality, None);
}

#[test]
fn terminal_and_ipless_pods_produce_nothing() {
    let table: &[(&str, &[&str], bool)] = &[
        ("Succeeded", &["10.0.0.1"], false),
        ("Failed", &["10.0.0.1"], false),
        ("Running", &[], false),
        ("Pending", &[], false),
        // istio issue 48854: a Pending pod that already has an IP is emitted.
        ("Pending", &["10.0.0.1"], true),
        ("Running", &["10.0.0.1"], true),
        ("Unknown", &["10.0.0.1"], true),
    ];
    for (phase, ips, emitted) in table {
        let mut p = pod(NS, "p", "10.0.0.1");
        p.phase = (*phase).into();
        p.ips = ips.iter().map(|s| ip(s)).collect();
        let mut index = Index::new(Settings::default());
        let changes = index.apply(Object::Pod(p.into()));
        let case = format!("phase={phase} ips={ips:?}");
        assert_eq!(
            changes.addresses.upserted.contains(uid(NS, "p").as_str()),
            *emitted,
            "{case}"
        );
        assert_eq!(
            index
                .snapshot()
                .addresses
                .contains_key(uid(NS, "p").as_str()),
            *emitted,
            "{case}"
        );
    }
}

#[test]
fn pod_becoming_terminal_is_removed() {
    let mut index = index_of([Object::Pod(pod(NS, "p", "10.0.0.1").into())]);
    let mut p = pod(NS, "p", "10.0.0.1");
    p.phase = "Succeeded".into();
    let changes = index.apply(Object::Pod(p.into()));
    assert!(changes.addresses.upserted.is_empty());
    assert_eq!(changes.addresses.removed, set(&[uid(NS, "p")]));
    assert!(try_workload(&mut index, &uid(NS, "p")).is_none());
}

// ---------------------------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------------------------

#[test]
fn system_namespace_network_label_sets_every_network() {
    const NETWORK: &str = "topology.istio.io/network";
    let mut system = ns("istio-system");
    system.labels = labels(&[(NETWORK, "net1")]);
    let mut index = index_of([
        Object::Namespace(system),
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "web")]).into()),
    ]);
    let w = workload(&mut index, &uid(NS, "p"));
    assert_eq!(w.network, "net1");
    let s = service(&mut index, &skey(NS, "web"));
    assert_eq!(s.addresses[0].network, "net1");
    let snapshot = index.snapshot();
    let aliases: Vec<(String, Vec<String>)> = snapshot
        .alias_texts()
        .map(|(alias, names)| (alias, names.iter().map(|n| n.to_string()).collect()))
        .collect();
    assert!(
        aliases.contains(&("net1/10.0.0.1".to_string(), vec![uid(NS, "p")])),
        "{aliases:?}"
    );
    assert!(aliases.iter().all(|(alias, _)| alias.starts_with("net1/")));
    assert_eq!(
        snapshot.lookup_addresses("net1/10.0.0.1"),
        vec![uid(NS, "p")]
    );
    assert!(snapshot.lookup_addresses("/10.0.0.1").is_empty());

    // The same label on another namespace means nothing.
    let mut other = ns(NS);
    other.labels = labels(&[(NETWORK, "net2")]);
    index.apply(Object::Namespace(other));
    assert_eq!(workload(&mut index, &uid(NS, "p")).network, "net1");
}

#[test]
fn changing_the_network_re_emits_everything() {
    const NETWORK: &str = "topology.istio.io/network";
    let mut index = index_of([
        Object::Namespace(ns("istio-system")),
        Object::Service(svc(NS, "web", "10.96.0.10", &[("app", "web")])),
        Object::Service(svc("other", "db", "10.96.0.11", &[("app", "db")])),
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "web")]).into()),
        Object::Pod(pod_with("other", "q", "10.0.0.2", &[("app", "db")]).into()),
    ]);
    let all = set(&[
        uid(NS, "p"),
        uid("other", "q"),
        skey(NS, "web"),
        skey("other", "db"),
    ]);
    let mut system = ns("istio-system");
    system.labels = labels(&[(NETWORK, "net1")]);
    let changes = index.apply(Object::Namespace(system.clone()));
    assert_eq!(changes.addresses.upserted, all);
    assert!(changes.addresses.removed.is_empty());
    assert_eq!(workload(&mut index, &uid("other", "q")).network, "net1");
    assert_eq!(
        service(&mut index, &skey("other", "db")).addresses[0].network,
        "net1"
    );

    // Other system-namespace changes re-emit nothing.
    system.annotations = labels(&[("note", "x")]);
    assert!(index.apply(Object::Namespace(system.clone())).is_empty());

    // Deleting the namespace drops the label: everything again.
    let changes = index.delete(&ObjectRef::new(Kind::Namespace, "", "istio-system"));
    assert_eq!(changes.addresses.upserted, all);
    assert_eq!(workload(&mut index, &uid(NS, "p")).network, "");
}

#[test]
fn pod_uid_follows_a_recreated_pod_without_a_change() {
    let mut p = pod(NS, "p", "10.0.0.1");
    p.uid = "uid-a".into();
    let mut index = index_of([Object::Pod(p.clone().into())]);
    let name = uid(NS, "p");
    assert_eq!(index.snapshot().pod_uid(&name).as_deref(), Some("uid-a"));
    // Re-created under the same name: the same bytes (nothing to push), a new uid.
    p.uid = "uid-b".into();
    assert!(index.apply(Object::Pod(p.clone().into())).is_empty());
    assert_eq!(index.snapshot().pod_uid(&name).as_deref(), Some("uid-b"));
    // API-server uids (UUIDs, kept as 16 bytes) read back as written, and from text and back.
    for next in [
        "6f1c1d8e-0000-4000-8000-0000000004d2",
        "6f1c1d8e-0000-4000-8000-0000000004d3",
        "uid-c",
        "6F1C1D8E-0000-4000-8000-0000000004D2",
    ] {
        p.uid = next.into();
        assert!(index.apply(Object::Pod(p.clone().into())).is_empty());
        let snapshot = index.snapshot();
        assert_eq!(snapshot.pod_uid(&name).as_deref(), Some(next));
        // The index's lookups are untouched by the uid.
        assert_eq!(snapshot.lookup_addresses("/10.0.0.1"), vec![name.clone()]);
    }
    p.uid = "".into();
    assert!(index.apply(Object::Pod(p.into())).is_empty());
    assert_eq!(index.snapshot().pod_uid(&name), None);
    index.delete(&ObjectRef::new(Kind::Pod, NS, "p"));
    assert_eq!(index.snapshot().pod_uid(&name), None);
}

/// istiod's `LabelsInRevision`: an Istio config object without `istio.io/rev` is global and
/// taken by every revision; a labelled one only by its revision, or by every one when the
/// revision is empty.
#[test]
fn unlabelled_istio_config_is_taken_by_every_revision() {
    use crate::discovery::model::authorization::AuthorizationPolicy;
    let policy = |name: &str, rev: Option<&str>| {
        Object::AuthorizationPolicy(AuthorizationPolicy {
            name: name.into(),
            namespace: NS.into(),
            revision: rev.map(str::to_string),
            ..Default::default()
        })
    };
    for (revision, expected) in [
        ("default", &["demo/default", "demo/global"][..]),
        ("canary", &["demo/canary", "demo/global"][..]),
        (
            "",
            &["demo/canary", "demo/default", "demo/empty", "demo/global"][..],
        ),
    ] {
        let mut index = Index::new(Settings {
            revision: revision.into(),
            ..Settings::default()
        });
        for object in [
            policy("global", None),
            policy("default", Some("default")),
            policy("canary", Some("canary")),
            policy("empty", Some("")),
        ] {
            index.apply(object);
        }
        let snapshot = index.snapshot();
        let mut names: Vec<String> = snapshot
            .authorizations
            .keys()
            .map(|k| k.to_string())
            .collect();
        names.sort();
        assert_eq!(names, expected, "revision {revision:?}");
    }
}
