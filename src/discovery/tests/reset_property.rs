//! Property tests of the index (a relist is the truth: ARCHITECTURE.md, "Data flow"): whatever
//! sequence of events led here, the incremental index equals one built cold from the objects
//! that exist, every step reports exactly what it changed, and a relist converges whatever
//! events were missed.
//!
//! Objects are drawn from small pools of names, labels and IPs so that they select, bind to
//! and conflict with each other: Services select Pods and WorkloadEntries, ServiceEntries share
//! hostnames (with each other and with a Service), slices name pods by targetRef (sometimes
//! across namespaces), Gateways become and stop being waypoints that everything may bind to,
//! and AuthorizationPolicies and PeerAuthentications select workloads; RequestAuthentications
//! with and without `targetRefs` feed the waypoints' list. 64 cases per property
//! keep the suite fast; set `PROPTEST_CASES` to run more. A failure prints the shrunk input.

use std::collections::{BTreeMap, BTreeSet};

use super::support::*;
use crate::discovery::model::authorization::{PolicyAction, PolicyRule, PolicyTargetRef, Source};
use crate::discovery::model::peer_authentication::MtlsMode;
use crate::discovery::model::status::PolicyStatus;
use crate::discovery::model::status::{DesiredStatus, StatusTarget};
use crate::discovery::model::{
    AllowedNamespaces, AuthorizationPolicy, DestinationRule, Endpoint, Gateway, JwtRule, Kind,
    Labels, Listener, LoadBalancer, NamespaceSelector, ObjectRef, PeerAuthentication, PodFields,
    RequestAuthentication, Resolution, Service, ServiceEntry, SimpleLb, SliceEndpoint,
    TrafficPolicy,
};
use crate::discovery::snapshot::NameSet;
use crate::discovery::{Changes, Index, Object, Settings, Snapshot};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{select, subsequence};

const SYSTEM: &str = "istio-system";
const NAMESPACES: [&str; 2] = ["a", "b"];
const POD_IPS: [&str; 4] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
const POD_NAMES: [&str; 3] = ["p0", "p1", "p2"];
const UIDS: [&str; 2] = ["u1", "u2"];
const APPS: [&str; 2] = ["x", "y"];
const WAYPOINTS: [&str; 2] = ["wp", "wp2"];
const CLASSES: [&str; 3] = ["c1", "c2", "istio-remote"];
const HOSTS: [&str; 3] = ["h1.example.com", "h2.example.com", "s0.a.svc.cluster.local"];

/// One source event (the object boxed to keep the enum small).
#[derive(Clone, Debug)]
enum Step {
    Apply(Box<Object>),
    Delete(ObjectRef),
}

// ---------------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------------

fn namespace() -> impl Strategy<Value = String> {
    select(&NAMESPACES[..]).prop_map(str::to_string)
}

/// Optional `key=value` pairs, each value drawn from `values`.
fn some_labels(keys: &'static [(&'static str, &'static [&'static str])]) -> BoxedStrategy<Labels> {
    let pairs: Vec<BoxedStrategy<Option<(String, String)>>> = keys
        .iter()
        .map(|(k, values)| {
            option::of(select(*values))
                .prop_map(move |v| v.map(|v| (k.to_string(), v.to_string())))
                .boxed()
        })
        .collect();
    pairs
        .prop_map(|pairs| pairs.into_iter().flatten().collect())
        .boxed()
}

/// Labels of pods, WorkloadEntries and endpoints: an app, and sometimes a waypoint binding.
fn workload_labels() -> BoxedStrategy<Labels> {
    some_labels(&[
        ("app", &["x", "y"]),
        ("istio.io/use-waypoint", &["wp", "wp2", "none"]),
    ])
}

fn namespace_object() -> impl Strategy<Value = Object> {
    (
        select(&["a", "b", SYSTEM][..]),
        some_labels(&[
            ("istio.io/use-waypoint", &["wp", "none"]),
            ("topology.istio.io/network", &["n1", "n2"]),
            ("team", &["x"]),
            ("tier", &["untrusted"]),
        ]),
        some_labels(&[("networking.istio.io/traffic-distribution", &["PreferClose"])]),
    )
        .prop_map(|(name, labels, annotations)| {
            let mut n = ns_with(name, &[]);
            n.labels = labels;
            n.annotations = annotations;
            Object::Namespace(n)
        })
}

fn node_object() -> impl Strategy<Value = Object> {
    (
        select(&[NODE, "node-b"][..]),
        option::of(select(&["z1", "z2"][..])),
    )
        .prop_map(|(name, zone)| {
            let zone: Vec<(&str, &str)> = zone
                .map(|z| ("topology.kubernetes.io/zone", z))
                .into_iter()
                .collect();
            Object::Node(node(name, &zone))
        })
}

fn pod_object() -> impl Strategy<Value = Object> {
    (
        (namespace(), select(&POD_NAMES[..]), select(&UIDS[..])),
        (workload_labels(), any::<bool>()),
        (select(&POD_IPS[..]), select(&[NODE, "node-b"][..])),
        (
            any::<bool>(),
            select(&["Running", "Pending", "Succeeded"][..]),
        ),
        (
            option::of(select(&[8080u16, 9090][..])),
            select(&["default", "waypoint"][..]),
        ),
    )
        .prop_map(
            |(
                (ns, name, pod_uid),
                (mut labels, instance),
                (pod_ip, node_name),
                (ready, phase),
                (port, service_account),
            )| {
                if instance {
                    labels.insert("gateway.networking.k8s.io/gateway-name", "wp");
                }
                Object::Pod(
                    PodFields {
                        uid: pod_uid.into(),
                        labels,
                        node_name: node_name.into(),
                        ready,
                        phase: phase.into(),
                        ports: port.map(|p| cport("web", p)).into_iter().collect(),
                        service_account: service_account.into(),
                        ..pod(&ns, name, pod_ip)
                    }
                    .into(),
                )
            },
        )
}

fn service_object() -> impl Strategy<Value = Object> {
    (
        (namespace(), select(&["s0", "s1"][..])),
        option::of(select(&APPS[..])),
        select(&["", "10.96.0.1", "10.96.0.2"][..]),
        any::<bool>(),
        some_labels(&[("istio.io/use-waypoint", &["wp", "wp2", "none"])]),
        some_labels(&[(
            "networking.istio.io/traffic-distribution",
            &["PreferSameNode"],
        )]),
    )
        .prop_map(
            |((ns, name), app, vip, named_target, labels, annotations)| {
                let selector: Vec<(&str, &str)> = app.map(|a| ("app", a)).into_iter().collect();
                let target = if named_target {
                    named("web")
                } else {
                    num(8080)
                };
                Object::Service(Service {
                    ports: vec![sport("http", 80, target)],
                    labels,
                    annotations,
                    ..svc(&ns, name, vip, &selector)
                })
            },
        )
}

fn endpoint_of() -> impl Strategy<Value = Endpoint> {
    (select(&POD_IPS[..]), workload_labels(), any::<bool>()).prop_map(|(address, labels, web)| {
        let mut e = endpoint(address);
        e.labels = labels;
        if web {
            e.ports = [("http".to_string(), 9000)].into();
        }
        e
    })
}

fn service_entry_object() -> impl Strategy<Value = Object> {
    (
        (namespace(), select(&["e0", "e1"][..])),
        subsequence(&HOSTS[..], 1..=2),
        select(&["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z", ""][..]),
        option::of(select(&APPS[..])),
        vec(endpoint_of(), 0..=2),
        select(&[Resolution::Static, Resolution::Dns, Resolution::None][..]),
        (any::<bool>(), select(&[80u16, 81][..])),
        some_labels(&[
            ("istio.io/use-waypoint", &["wp", "none"]),
            ("istio.io/rev", &["default", "canary"]),
        ]),
    )
        .prop_map(
            |((ns, name), hosts, created, app, endpoints, resolution, (vip, port), labels)| {
                Object::ServiceEntry(ServiceEntry {
                    created: created.into(),
                    workload_selector: app.map(|a| [("app".to_string(), a.to_string())].into()),
                    endpoints,
                    resolution,
                    addresses: if vip {
                        vec!["240.0.0.1".into()]
                    } else {
                        vec![]
                    },
                    ports: vec![se_port("http", port, "HTTP")],
                    labels,
                    ..service_entry(&ns, name, &hosts)
                })
            },
        )
}

fn workload_entry_object() -> impl Strategy<Value = Object> {
    (
        (namespace(), select(&["w0", "w1"][..])),
        select(&POD_IPS[..]),
        workload_labels(),
        option::of(select(&["vm-net"][..])),
        some_labels(&[("istio.io/rev", &["default", "canary"])]),
    )
        .prop_map(|((ns, name), address, mut labels, network, revision)| {
            labels.extend_from(&revision);
            let mut we = workload_entry(&ns, name, address, &[]);
            we.labels = labels;
            we.revision = revision.get("istio.io/rev").map(str::to_string);
            we.endpoint.ports = [("web".to_string(), 9000)].into();
            we.endpoint.network = network.unwrap_or_default().into();
            Object::WorkloadEntry(we)
        })
}

fn slice_endpoint(ns: String) -> impl Strategy<Value = SliceEndpoint> {
    (
        select(&POD_IPS[..]),
        option::of((
            select(&POD_NAMES[..]),
            select(&UIDS[..]),
            // Mostly the slice's own namespace; a targetRef may name any.
            select(&["", "", "", "a", "b"][..]),
        )),
        option::of(any::<bool>()),
    )
        .prop_map(move |(address, target, ready)| {
            let mut e = match target {
                Some((name, pod_uid, target_ns)) => {
                    let target_ns = if target_ns.is_empty() { &ns } else { target_ns };
                    slice_pod(address, target_ns, name, pod_uid)
                }
                None => slice_ip(address),
            };
            e.ready = ready;
            e
        })
}

fn slice_object() -> impl Strategy<Value = Object> {
    (
        namespace(),
        select(&["sl0", "sl1"][..]),
        select(&["s0", "s1"][..]),
    )
        .prop_flat_map(|(ns, name, service)| {
            (
                Just(slice(&ns, name, service)),
                vec(slice_endpoint(ns), 0..=3),
                any::<bool>(),
            )
        })
        .prop_map(|(mut s, endpoints, with_port)| {
            s.endpoints = endpoints;
            if with_port {
                s.ports = vec![slice_port("http", 8080)];
            }
            Object::EndpointSlice(s)
        })
}

fn gateway_object() -> impl Strategy<Value = Object> {
    (
        (namespace(), select(&WAYPOINTS[..]), select(&CLASSES[..])),
        select(&["none", "ip", "ip", "hostname"][..]),
        some_labels(&[
            ("istio.io/waypoint-for", &["service", "workload", "all"]),
            // An istio-remote Gateway with a network label is an east-west gateway.
            ("topology.istio.io/network", &["n1", "vm-net"]),
        ]),
        option::of(select(&["all", "selector"][..])),
    )
        .prop_map(|((ns, name, class), address, gateway_labels, allowed)| {
            let addresses = match address {
                "ip" => vec![("IPAddress".to_string(), "10.0.9.1".to_string())],
                "hostname" => vec![("Hostname".to_string(), format!("{name}.{ns}.svc"))],
                _ => vec![],
            };
            let listeners = allowed
                .map(|allowed| Listener {
                    name: "mesh".into(),
                    port: 15008,
                    protocol: "HBONE".into(),
                    allowed: Some(match allowed {
                        "all" => AllowedNamespaces::All,
                        _ => AllowedNamespaces::Selector(NamespaceSelector::labels(labels(&[(
                            "team", "x",
                        )]))),
                    }),
                })
                .into_iter()
                .collect();
            Object::Gateway(Gateway {
                class_name: class.into(),
                labels: gateway_labels,
                addresses,
                listeners,
                ..gateway(&ns, name)
            })
        })
}

fn gateway_class_object() -> impl Strategy<Value = Object> {
    (
        select(&CLASSES[..]),
        some_labels(&[
            ("istio.io/waypoint-for", &["service", "workload", "all"]),
            // An istio-remote Gateway with a network label is an east-west gateway.
            ("topology.istio.io/network", &["n1", "vm-net"]),
        ]),
    )
        .prop_map(|(name, labels)| {
            let mut class = gateway_class(name, &[]);
            class.labels = labels;
            if name == "c1" {
                class.controller_name = "istio.io/mesh-controller".into();
            }
            Object::GatewayClass(class)
        })
}

/// Policies in the workload namespaces or the root namespace, selecting by app, with an
/// empty selector or none at all; sometimes of another revision, dry-run or AUDIT (not sent).
fn authorization_policy_object() -> impl Strategy<Value = Object> {
    (
        (select(&["a", "b", SYSTEM][..]), select(&["ap0", "ap1"][..])),
        option::of(option::of(select(&APPS[..]))),
        select(&[PolicyAction::Allow, PolicyAction::Deny, PolicyAction::Audit][..]),
        (
            proptest::bool::weighted(0.2),
            option::weighted(0.2, select(&["canary"][..])),
        ),
        (
            vec(option::of(select(&["a", "b"][..])), 0..=2),
            // Waypoint policies: targets that exist or not, bind or not.
            vec(
                select(
                    &[
                        ("Gateway", "wp"),
                        ("Gateway", "wp2"),
                        ("Service", "s0"),
                        ("ServiceEntry", "e0"),
                        ("GatewayClass", "c1"),
                    ][..],
                ),
                0..=2,
            ),
        ),
    )
        .prop_map(
            |((ns, name), selector, action, (dry_run, revision), (rules, targets))| {
                // None: no selector; Some(None): an empty one; Some(Some(app)): matchLabels.
                let selector = selector.map(|app| {
                    app.map(|a| [("app".to_string(), a.to_string())].into())
                        .unwrap_or_default()
                });
                let rules = rules
                    .into_iter()
                    .map(|from| PolicyRule {
                        from: from
                            .map(|n| Source {
                                namespaces: vec![n.to_string()],
                                ..Default::default()
                            })
                            .into_iter()
                            .collect(),
                        ..Default::default()
                    })
                    .collect();
                let target_refs: Vec<PolicyTargetRef> = targets
                    .into_iter()
                    .map(|(kind, name)| PolicyTargetRef {
                        kind: kind.into(),
                        name: name.into(),
                        ..Default::default()
                    })
                    .collect();
                Object::AuthorizationPolicy(AuthorizationPolicy {
                    name: name.into(),
                    namespace: ns.into(),
                    revision: revision.map(str::to_string),
                    dry_run,
                    selector,
                    action,
                    rules,
                    has_target_refs: !target_refs.is_empty(),
                    target_refs,
                    ..Default::default()
                })
            },
        )
}

fn peer_authentication_object() -> impl Strategy<Value = Object> {
    let modes = [
        MtlsMode::Unset,
        MtlsMode::Permissive,
        MtlsMode::Strict,
        MtlsMode::Disable,
    ];
    (
        (select(&["a", "b", SYSTEM][..]), select(&["pa0", "pa1"][..])),
        option::of(select(&APPS[..])),
        select(modes.to_vec()),
        option::of(select(modes.to_vec())),
        option::of(select(
            &["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"][..],
        )),
    )
        .prop_map(|((ns, name), app, mode, port_mode, creation)| {
            Object::PeerAuthentication(PeerAuthentication {
                name: name.into(),
                namespace: ns.into(),
                selector: app.map(|a| [("app".to_string(), a.to_string())].into()),
                mode,
                port_level: port_mode.map(|m| (8080, m)).into_iter().collect(),
                creation: creation.map(str::to_string),
                ..Default::default()
            })
        })
}

fn destination_rule_object() -> impl Strategy<Value = Object> {
    (
        (select(&["a", "b", SYSTEM][..]), select(&["dr0", "dr1"][..])),
        select(&HOSTS[..]),
        option::of(select(
            &["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"][..],
        )),
        any::<bool>(),
    )
        .prop_map(|((ns, name), host, creation, random)| {
            Object::DestinationRule(DestinationRule {
                name: name.into(),
                namespace: ns.into(),
                host: host.into(),
                creation: creation.map(str::to_string),
                traffic_policy: Some(Box::new(TrafficPolicy {
                    load_balancer: Some(LoadBalancer {
                        simple: Some(if random {
                            SimpleLb::Random
                        } else {
                            SimpleLb::RoundRobin
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            })
        })
}

fn request_authentication_object() -> impl Strategy<Value = Object> {
    (
        (select(&["a", "b", SYSTEM][..]), select(&["ra0", "ra1"][..])),
        option::of(select(&["web", "api"][..])),
        select(&["https://one", "https://two"][..]),
        option::of(select(
            &["2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"][..],
        )),
    )
        .prop_map(|((ns, name), target, issuer, creation)| {
            Object::RequestAuthentication(RequestAuthentication {
                name: name.into(),
                namespace: ns.into(),
                target_refs: target
                    .map(|t| PolicyTargetRef {
                        kind: "Service".into(),
                        name: t.into(),
                        ..Default::default()
                    })
                    .into_iter()
                    .collect(),
                jwt_rules: vec![JwtRule {
                    issuer: issuer.into(),
                    ..Default::default()
                }],
                creation: creation.map(str::to_string),
                ..Default::default()
            })
        })
}

fn route_object() -> impl Strategy<Value = Object> {
    (
        (select(&["a", "b"][..]), select(&["r0", "r1"][..])),
        any::<bool>(),
        select(&APPS[..]),
        0..3i64,
    )
        .prop_map(|((ns, name), grpc, app, generation)| {
            let route = crate::discovery::model::Route {
                kind: if grpc {
                    crate::discovery::model::RouteKind::Grpc
                } else {
                    crate::discovery::model::RouteKind::Http
                },
                name: name.into(),
                namespace: ns.into(),
                generation,
                parent_refs: vec![crate::discovery::model::ParentRef {
                    kind: "Service".into(),
                    name: app.into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            if grpc {
                Object::GrpcRoute(route)
            } else {
                Object::HttpRoute(route)
            }
        })
}

fn object() -> impl Strategy<Value = Object> {
    prop_oneof![
        2 => namespace_object(),
        1 => node_object(),
        4 => pod_object(),
        3 => service_object(),
        3 => service_entry_object(),
        2 => workload_entry_object(),
        2 => slice_object(),
        3 => gateway_object(),
        2 => gateway_class_object(),
        2 => authorization_policy_object(),
        2 => peer_authentication_object(),
        1 => destination_rule_object(),
        1 => request_authentication_object(),
        1 => route_object(),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => object().prop_map(|o| Step::Apply(Box::new(o))),
        // Deleting by the reference of a random object hits stored ones often enough.
        1 => object().prop_map(|o| Step::Delete(o.object_ref())),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    vec(step(), 0..50)
}

/// A set of objects, one per reference (the last drawn wins).
fn object_set() -> impl Strategy<Value = BTreeMap<ObjectRef, Object>> {
    vec(object(), 0..30)
        .prop_map(|objects| objects.into_iter().map(|o| (o.object_ref(), o)).collect())
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The objects that exist after `steps`.
fn final_set(steps: &[Step]) -> BTreeMap<ObjectRef, Object> {
    let mut objects = BTreeMap::new();
    for step in steps {
        match step {
            Step::Apply(o) => {
                objects.insert(o.object_ref(), o.as_ref().clone());
            }
            Step::Delete(r) => {
                objects.remove(r);
            }
        }
    }
    objects
}

fn of_kind(objects: &BTreeMap<ObjectRef, Object>, kind: Kind) -> Vec<Object> {
    objects
        .values()
        .filter(|o| o.kind() == kind)
        .cloned()
        .collect()
}

/// The index settings: the defaults, or with the options that add dependencies: implicit
/// waypoint policies, and meshConfig.serviceEntryVisibility configured so that Namespace labels
/// decide ServiceEntry visibility (`team: x` NAMESPACE, `tier: untrusted` NONE, else PUBLIC).
fn settings(options: bool) -> Settings {
    use crate::discovery::model::visibility::{
        ServiceEntryVisibility, Visibility, VisibilityPolicy,
    };
    let policy = |visibility, key: &str, value: &str| VisibilityPolicy {
        visibility,
        rules: vec![NamespaceSelector::labels(labels(&[(key, value)]))],
    };
    Settings {
        service_entry_visibility: options.then(|| {
            std::sync::Arc::new(ServiceEntryVisibility {
                default: Visibility::Public,
                policies: vec![
                    policy(Visibility::None, "tier", "untrusted"),
                    policy(Visibility::Namespace, "team", "x"),
                ],
            })
        }),
        auto_allow_waypoint_policy: options,
        ..Settings::default()
    }
}

/// An index built from nothing with `objects`, applying kinds in `order`.
fn cold(objects: &BTreeMap<ObjectRef, Object>, order: &[Kind], options: bool) -> Index {
    let mut index = Index::new(settings(options));
    for kind in order {
        for object in of_kind(objects, *kind) {
            index.apply(object);
        }
    }
    index
}

/// Everything a client (or the status writer) can observe of a snapshot.
#[derive(Debug, PartialEq)]
struct Observed {
    addresses: BTreeMap<String, String>,
    authorizations: BTreeMap<String, String>,
    aliases: BTreeMap<String, BTreeSet<String>>,
    members: BTreeMap<String, BTreeSet<String>>,
    by_node: BTreeMap<String, BTreeSet<String>>,
    policy_status: BTreeMap<String, PolicyStatus>,
    statuses: BTreeMap<StatusTarget, DesiredStatus>,
    destination_rules: Vec<DestinationRule>,
    /// What waypoints read besides resources.
    waypoint_policies: Vec<AuthorizationPolicy>,
    waypoint_authentications: Vec<RequestAuthentication>,
    /// The routes waypoints read, in the snapshot's order.
    routes: Vec<crate::discovery::model::Route>,
}

fn observed(s: &Snapshot) -> Observed {
    let flat = |m: &crate::discovery::snapshot::PersistentMap<Name, NameSet>| {
        m.iter()
            .map(|(k, v)| {
                assert!(v.is_sorted() && !v.is_empty(), "{k}: {v:?}");
                (k.to_string(), v.iter().map(|n| n.to_string()).collect())
            })
            .collect()
    };
    Observed {
        addresses: versions(s),
        authorizations: authorization_versions(s),
        aliases: s
            .alias_texts()
            .map(|(k, v)| (k, v.iter().map(|n| n.to_string()).collect()))
            .collect(),
        members: flat(&s.members),
        by_node: flat(&s.by_node),
        policy_status: s
            .policy_status
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        statuses: s
            .statuses
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        destination_rules: s.destination_rules.iter().map(|r| (**r).clone()).collect(),
        waypoint_policies: s.waypoint_policies.iter().map(|p| (**p).clone()).collect(),
        waypoint_authentications: s
            .waypoint_authentications
            .iter()
            .map(|ra| (**ra).clone())
            .collect(),
        routes: s.routes.iter().map(|r| (**r).clone()).collect(),
    }
}

fn run(index: &mut Index, step: &Step) -> Changes {
    match step {
        Step::Apply(o) => index.apply(o.as_ref().clone()),
        Step::Delete(r) => index.delete(r),
    }
}

/// 64 cases by default, so the suite stays fast; `PROPTEST_CASES` runs more.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    /// Each step reports exactly the names whose resource changed; after the sequence, a relist
    /// of every kind with the objects that exist changes nothing, and the index equals a cold
    /// build of those objects.
    #[test]
    fn incremental_steps_then_relist_equal_a_cold_build(
        steps in steps(),
        options in any::<bool>(),
    ) {
        let mut index = Index::new(settings(options));
        let mut before = index.snapshot();
        for (i, step) in steps.iter().enumerate() {
            let changes = run(&mut index, step);
            let after = index.snapshot();
            let (upserted, removed) = diff(&before, &after);
            prop_assert_eq!(&changes.addresses.upserted, &upserted, "step {}: {:?}", i, step);
            prop_assert_eq!(&changes.addresses.removed, &removed, "step {}: {:?}", i, step);
            let (upserted, removed) = diff_versions(
                &authorization_versions(&before),
                &authorization_versions(&after),
            );
            prop_assert_eq!(&changes.authorizations.upserted, &upserted, "step {}: {:?}", i, step);
            prop_assert_eq!(&changes.authorizations.removed, &removed, "step {}: {:?}", i, step);
            before = after;
        }
        let objects = final_set(&steps);
        for kind in Kind::ALL {
            let changes = index.reset(kind, of_kind(&objects, kind));
            prop_assert!(changes.is_empty(), "relist of {} changed {:?}", kind, changes);
        }
        let warm = index.snapshot();
        let cold = cold(&objects, &Kind::ALL, options).snapshot();
        prop_assert_eq!(observed(&warm), observed(&cold));
    }

    /// A relist converges whatever was missed: after any sequence, resetting every kind to an
    /// unrelated set gives exactly a cold build of that set, and the relist's changes cover
    /// every name that differs.
    #[test]
    fn relist_after_missed_events_equals_a_cold_build(
        steps in steps(),
        relisted in object_set(),
        options in any::<bool>(),
    ) {
        let mut index = Index::new(settings(options));
        for step in &steps {
            run(&mut index, step);
        }
        let before = index.snapshot();
        let mut changes = Changes::default();
        for kind in Kind::ALL {
            changes.merge(&index.reset(kind, of_kind(&relisted, kind)));
        }
        let warm = index.snapshot();
        let (upserted, removed) = diff(&before, &warm);
        prop_assert!(upserted.is_subset(&changes.addresses.upserted), "{:?}", changes);
        prop_assert!(removed.is_subset(&changes.addresses.removed), "{:?}", changes);
        let (upserted, removed) = diff_versions(
            &authorization_versions(&before),
            &authorization_versions(&warm),
        );
        prop_assert!(upserted.is_subset(&changes.authorizations.upserted), "{:?}", changes);
        prop_assert!(removed.is_subset(&changes.authorizations.removed), "{:?}", changes);
        let cold = cold(&relisted, &Kind::ALL, options).snapshot();
        prop_assert_eq!(observed(&warm), observed(&cold));
    }

    /// The result does not depend on the order kinds arrive in (contents before containers,
    /// as a cold start with watches racing each other may deliver them).
    #[test]
    fn cold_build_is_independent_of_kind_order(
        objects in object_set(),
        options in any::<bool>(),
    ) {
        let mut reversed = Kind::ALL;
        reversed.reverse();
        let forward = cold(&objects, &Kind::ALL, options).snapshot();
        let backward = cold(&objects, &reversed, options).snapshot();
        prop_assert_eq!(observed(&forward), observed(&backward));
    }
}
