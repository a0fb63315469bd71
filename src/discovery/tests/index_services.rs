//! Table tests of the pure conversion core for Services: Kubernetes Service -> decoded
//! `istio.workload.Service` (docs/conversion.md, "Service → Service") and each Workload's
//! services map ("Pod → Workload").

use std::collections::BTreeMap;

use super::support::*;
use crate::discovery::model::{IpFamily, Protocol, Service};
use crate::discovery::{Index, Object, Settings};
use crate::pb::workload::load_balancing::{HealthPolicy, Mode, Scope};
use crate::pb::workload::{AppProtocol, IpFamilies, LoadBalancing, NetworkAddress, Port, PortList};

// ---------------------------------------------------------------------------------------------
// Service -> Service
// ---------------------------------------------------------------------------------------------

#[test]
fn service_becomes_service_resource() {
    let mut index = Index::new(Settings::default());
    let changes = index.apply(Object::Service(svc(
        NS,
        "web",
        "10.96.0.10",
        &[("app", "web")],
    )));
    let key = skey(NS, "web");
    assert_eq!(key, "demo/web.demo.svc.cluster.local");
    assert_eq!(changes.addresses.upserted, set(&[&key]));

    let s = service(&mut index, &key);
    assert_eq!(s.name, "web");
    assert_eq!(s.namespace, NS);
    assert_eq!(s.hostname, "web.demo.svc.cluster.local");
    assert_eq!(
        s.addresses,
        vec![NetworkAddress {
            network: String::new(),
            address: raw("10.96.0.10"),
            length: None,
        }]
    );
    assert_eq!(
        s.ports,
        vec![Port {
            service_port: 80,
            target_port: 8080,
            app_protocol: AppProtocol::Http11 as i32,
        }]
    );
    assert!(s.canonical);
    assert_eq!(s.ip_families(), IpFamilies::Ipv4Only);
    assert_eq!(s.load_balancing, None);
    assert!(s.waypoint.is_none());
    assert!(s.subject_alt_names.is_empty());
    assert_eq!(s.visibility, 0);
    let resource = index
        .snapshot()
        .addresses
        .get(key.as_str())
        .cloned()
        .unwrap();
    assert!(resource.is_service());
}

#[test]
fn service_domain_follows_settings() {
    let settings = Settings {
        domain: "corp.example".into(),
        ..Settings::default()
    };
    let mut index = Index::new(settings);
    let changes = index.apply(Object::Service(svc(NS, "web", "10.96.0.10", &[])));
    let key = "demo/web.demo.svc.corp.example";
    assert_eq!(changes.addresses.upserted, set(&[key]));
    assert_eq!(
        service(&mut index, key).hostname,
        "web.demo.svc.corp.example"
    );
}

#[test]
fn service_addresses_and_ip_families() {
    let table: &[(&[&str], &[IpFamily], IpFamilies)] = &[
        (&["10.96.0.1"], &[IpFamily::V4], IpFamilies::Ipv4Only),
        (&["fd00::10"], &[IpFamily::V6], IpFamilies::Ipv6Only),
        (
            &["10.96.0.1", "fd00::10"],
            &[IpFamily::V4, IpFamily::V6],
            IpFamilies::Dual,
        ),
        (
            &["fd00::10", "10.96.0.1"],
            &[IpFamily::V6, IpFamily::V4],
            IpFamilies::Dual,
        ),
        // Headless: no addresses, but still a Service.
        (&[], &[IpFamily::V4], IpFamilies::Ipv4Only),
        (&[], &[], IpFamilies::Automatic),
    ];
    for (vips, families, want) in table {
        let mut s = svc(NS, "web", "", &[]);
        s.cluster_ips = vips.iter().map(|v| ip(v)).collect();
        s.ip_families = families.to_vec();
        let mut index = index_of([Object::Service(s)]);
        let out = service(&mut index, &skey(NS, "web"));
        let addresses: Vec<_> = out.addresses.iter().map(|a| a.address.clone()).collect();
        let want_addresses: Vec<_> = vips.iter().map(|v| raw(v)).collect();
        assert_eq!(addresses, want_addresses, "vips={vips:?}");
        assert_eq!(out.ip_families(), *want, "vips={vips:?}");
    }
}

#[test]
fn external_name_service_produces_nothing() {
    let mut s = svc(NS, "ext", "", &[("app", "web")]);
    s.external_name = true;
    let mut index = Index::new(Settings::default());
    index.apply(Object::Pod(
        pod_with(NS, "p", "10.0.0.1", &[("app", "web")]).into(),
    ));
    let changes = index.apply(Object::Service(s));
    // No resource; the service is only listed among the objects that may carry a status
    // condition (with none).
    assert!(
        changes.addresses.is_empty() && changes.authorizations.is_empty(),
        "{changes:?}"
    );
    assert!(try_service(&mut index, &skey(NS, "ext")).is_none());
    // Nor does it select pods.
    assert!(workload(&mut index, &uid(NS, "p")).services.is_empty());
}

#[test]
fn app_protocol_derivation() {
    use AppProtocol::*;
    let table: &[(&str, u16, Protocol, Option<&str>, AppProtocol)] = &[
        ("http", 80, Protocol::Tcp, None, Http11),
        ("HTTP-web", 80, Protocol::Tcp, None, Http11),
        ("http2", 80, Protocol::Tcp, None, Http2),
        ("grpc", 80, Protocol::Tcp, None, Grpc),
        ("grpc-api", 80, Protocol::Tcp, None, Grpc),
        ("grpc-web", 80, Protocol::Tcp, None, Unknown),
        ("tcp", 80, Protocol::Tcp, None, Tcp),
        ("tcp-db", 80, Protocol::Tcp, None, Tcp),
        ("tls", 443, Protocol::Tcp, None, Tls),
        ("https", 443, Protocol::Tcp, None, Tls),
        ("mongo", 80, Protocol::Tcp, None, Unknown),
        ("redis", 6379, Protocol::Tcp, None, Unknown),
        ("mysql", 3306, Protocol::Tcp, None, Unknown),
        ("web", 80, Protocol::Tcp, None, Unknown),
        ("", 80, Protocol::Tcp, None, Unknown),
        // Well-known ports with an unrecognised name are TCP.
        ("", 3306, Protocol::Tcp, None, Tcp),
        ("db", 3306, Protocol::Tcp, None, Tcp),
        ("smtp", 25, Protocol::Tcp, None, Tcp),
        ("", 53, Protocol::Tcp, None, Tcp),
        ("", 27017, Protocol::Tcp, None, Tcp),
        // UDP is always UNKNOWN, even when named http or on a well-known port.
        ("http", 80, Protocol::Udp, None, Unknown),
        ("dns", 53, Protocol::Udp, None, Unknown),
        // appProtocol wins over the name.
        ("tcp", 80, Protocol::Tcp, Some("kubernetes.io/h2c"), Http2),
        ("tcp", 80, Protocol::Tcp, Some("kubernetes.io/ws"), Http11),
        ("tcp", 80, Protocol::Tcp, Some("kubernetes.io/wss"), Tls),
        ("tcp", 80, Protocol::Tcp, Some("http"), Http11),
        ("http", 80, Protocol::Tcp, Some("grpc"), Grpc),
        ("http", 80, Protocol::Tcp, Some("tcp"), Tcp),
        (
            "http",
            80,
            Protocol::Udp,
            Some("kubernetes.io/h2c"),
            Unknown,
        ),
    ];
    let mut s = svc(NS, "web", "10.96.0.10", &[]);
    s.ports = table
        .iter()
        .map(|(name, port, protocol, app_protocol, _)| {
            let mut p = sport(name, *port, num(*port));
            p.protocol = *protocol;
            p.app_protocol = app_protocol.map(String::from);
            p
        })
        .collect();
    let mut index = index_of([Object::Service(s)]);
    let out = service(&mut index, &skey(NS, "web"));
    assert_eq!(out.ports.len(), table.len());
    for (port, (name, number, protocol, app_protocol, want)) in out.ports.iter().zip(table) {
        assert_eq!(
            port.app_protocol(),
            *want,
            "name={name:?} port={number} {protocol:?} appProtocol={app_protocol:?}"
        );
        assert_eq!(port.service_port, u32::from(*number));
    }
}

#[test]
fn service_ports_keep_order_and_named_target_is_zero() {
    let mut s = svc(NS, "web", "10.96.0.10", &[]);
    s.ports = vec![
        sport("http", 80, named("http-web")),
        sport("grpc", 9000, num(9001)),
    ];
    let mut index = index_of([Object::Service(s)]);
    let out = service(&mut index, &skey(NS, "web"));
    let ports: Vec<_> = out
        .ports
        .iter()
        .map(|p| (p.service_port, p.target_port))
        .collect();
    assert_eq!(ports, vec![(80, 0), (9000, 9001)]);
}

#[test]
fn load_balancing_from_traffic_policy_and_distribution() {
    const ANNOTATION: &str = "networking.istio.io/traffic-distribution";
    let zone = Some(LoadBalancing {
        routing_preference: vec![
            Scope::Network as i32,
            Scope::Region as i32,
            Scope::Zone as i32,
        ],
        mode: Mode::Failover as i32,
        health_policy: 0,
    });
    let node_failover = Some(LoadBalancing {
        routing_preference: vec![
            Scope::Network as i32,
            Scope::Region as i32,
            Scope::Zone as i32,
            Scope::Subzone as i32,
            Scope::Node as i32,
        ],
        mode: Mode::Failover as i32,
        health_policy: 0,
    });
    let local = Some(LoadBalancing {
        routing_preference: vec![Scope::Node as i32],
        mode: Mode::Strict as i32,
        health_policy: 0,
    });
    let with_allow_all = |lb: Option<LoadBalancing>| {
        let mut lb = lb.unwrap_or_default();
        lb.health_policy = HealthPolicy::AllowAll as i32;
        Some(lb)
    };

    struct Case {
        name: &'static str,
        local: bool,
        field: Option<&'static str>,
        svc_annotation: Option<&'static str>,
        ns_annotation: Option<&'static str>,
        not_ready: bool,
        want: Option<LoadBalancing>,
    }
    let case = |name| Case {
        name,
        local: false,
        field: None,
        svc_annotation: None,
        ns_annotation: None,
        not_ready: false,
        want: None,
    };
    let table = [
        case("nothing"),
        Case {
            local: true,
            want: local.clone(),
            ..case("internalTrafficPolicy Local")
        },
        Case {
            local: true,
            field: Some("PreferClose"),
            want: local.clone(),
            ..case("Local wins over trafficDistribution")
        },
        Case {
            field: Some("PreferClose"),
            want: zone.clone(),
            ..case("PreferClose")
        },
        Case {
            field: Some("PreferSameZone"),
            want: zone.clone(),
            ..case("PreferSameZone")
        },
        Case {
            field: Some("PreferSameNode"),
            want: node_failover.clone(),
            ..case("PreferSameNode")
        },
        Case {
            field: Some("PreferClose"),
            svc_annotation: Some("PreferSameNode"),
            want: zone.clone(),
            ..case("field wins over annotation")
        },
        Case {
            svc_annotation: Some("preferclose"),
            want: zone.clone(),
            ..case("service annotation, case-insensitive")
        },
        Case {
            svc_annotation: Some("PreferSameNode"),
            want: node_failover.clone(),
            ..case("service annotation PreferSameNode")
        },
        Case {
            svc_annotation: Some("Bogus"),
            want: None,
            ..case("unknown service annotation")
        },
        Case {
            ns_annotation: Some("PreferClose"),
            want: zone.clone(),
            ..case("namespace annotation")
        },
        Case {
            svc_annotation: Some("PreferSameNode"),
            ns_annotation: Some("PreferClose"),
            want: node_failover.clone(),
            ..case("service annotation wins over namespace")
        },
        Case {
            not_ready: true,
            want: with_allow_all(None),
            ..case("publishNotReadyAddresses alone")
        },
        Case {
            not_ready: true,
            local: true,
            want: with_allow_all(local.clone()),
            ..case("publishNotReadyAddresses + Local")
        },
        Case {
            not_ready: true,
            field: Some("PreferClose"),
            want: with_allow_all(zone.clone()),
            ..case("publishNotReadyAddresses + PreferClose")
        },
    ];
    for case in table {
        let mut s = svc(NS, "web", "10.96.0.10", &[]);
        s.internal_traffic_local = case.local;
        s.traffic_distribution = case.field.map(String::from);
        s.publish_not_ready_addresses = case.not_ready;
        if let Some(value) = case.svc_annotation {
            s.annotations = labels(&[(ANNOTATION, value)]);
        }
        let mut namespace = ns(NS);
        if let Some(value) = case.ns_annotation {
            namespace.annotations = labels(&[(ANNOTATION, value)]);
        }
        let mut index = index_of([Object::Namespace(namespace), Object::Service(s)]);
        let out = service(&mut index, &skey(NS, "web"));
        assert_eq!(out.load_balancing, case.want, "{}", case.name);
    }
}

// ---------------------------------------------------------------------------------------------
// Workload.services map
// ---------------------------------------------------------------------------------------------

fn port(service_port: u32, target_port: u32) -> Port {
    Port {
        service_port,
        target_port,
        app_protocol: 0,
    }
}

#[test]
fn services_map_resolves_named_target_ports_per_pod() {
    let mut s = svc(NS, "web", "10.96.0.10", &[("app", "web")]);
    s.ports = vec![
        sport("http", 80, named("http")),
        sport("metrics", 9090, num(9091)),
        // Only a UDP container port carries this name: omitted for this pod.
        sport("dns", 53, named("dns")),
        // No container port of this name at all: omitted.
        sport("admin", 8081, named("admin")),
        sport("grpc", 9000, named("grpc")),
    ];
    let mut p = pod_with(NS, "p", "10.0.0.1", &[("app", "web"), ("extra", "x")]);
    let mut udp = cport("dns", 5353);
    udp.protocol = Protocol::Udp;
    p.ports = [cport("grpc", 9500), udp, cport("http", 8080)].into();

    let mut index = index_of([Object::Pod(p.into()), Object::Service(s)]);
    let w = workload(&mut index, &uid(NS, "p"));
    let want: BTreeMap<String, PortList> = [(
        skey(NS, "web"),
        PortList {
            ports: vec![port(80, 8080), port(9090, 9091), port(9000, 9500)],
        },
    )]
    .into();
    assert_eq!(w.services, want);
}

#[test]
fn services_map_entry_exists_even_with_no_resolved_ports() {
    let mut s = svc(NS, "web", "10.96.0.10", &[("app", "web")]);
    s.ports = vec![sport("http", 80, named("http"))];
    let mut index = index_of([
        Object::Service(s),
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "web")]).into()),
    ]);
    let w = workload(&mut index, &uid(NS, "p"));
    assert_eq!(
        w.services,
        BTreeMap::from([(skey(NS, "web"), PortList { ports: vec![] })])
    );
}

#[test]
fn services_map_membership_rules() {
    let web = [("app", "web")];
    let table: &[(&str, Service, bool)] = &[
        (
            "same ns, matching selector",
            svc(NS, "s", "10.96.0.1", &web),
            true,
        ),
        (
            "subset selector",
            svc(NS, "s", "10.96.0.1", &[("app", "web"), ("tier", "fe")]),
            true,
        ),
        (
            "other namespace never matches",
            svc("other", "s", "10.96.0.1", &web),
            false,
        ),
        (
            "empty selector selects nothing",
            svc(NS, "s", "10.96.0.1", &[]),
            false,
        ),
        (
            "selector not a subset",
            svc(NS, "s", "10.96.0.1", &[("app", "web"), ("tier", "be")]),
            false,
        ),
        ("headless still selects", svc(NS, "s", "", &web), true),
    ];
    for (case, service, member) in table {
        let key = skey(&service.namespace, "s");
        let pod_labels = [("app", "web"), ("tier", "fe")];
        let mut index = index_of([
            Object::Service(service.clone()),
            Object::Pod(pod_with(NS, "p", "10.0.0.1", &pod_labels).into()),
        ]);
        let w = workload(&mut index, &uid(NS, "p"));
        assert_eq!(w.services.contains_key(&key), *member, "{case}");
        assert_eq!(w.services.len(), usize::from(*member), "{case}");
        let members = index.snapshot().members.get(key.as_str()).cloned();
        assert_eq!(
            members.is_some_and(|m| m.iter().any(|n| **n == *uid(NS, "p"))),
            *member,
            "{case}"
        );
    }
}

#[test]
fn services_map_holds_every_matching_service() {
    let mut index = index_of([
        Object::Service(svc(NS, "a", "10.96.0.1", &[("app", "web")])),
        Object::Service(svc(NS, "b", "10.96.0.2", &[("tier", "fe")])),
        Object::Service(svc(NS, "c", "10.96.0.3", &[("app", "other")])),
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "web"), ("tier", "fe")]).into()),
    ]);
    let w = workload(&mut index, &uid(NS, "p"));
    let keys: Vec<_> = w.services.keys().cloned().collect();
    assert_eq!(keys, vec![skey(NS, "a"), skey(NS, "b")]);
    for list in w.services.values() {
        assert_eq!(list.ports, vec![port(80, 8080)]);
    }
}

#[test]
fn canary_waypoints_weigh_0_by_default_and_may_come_from_the_namespace() {
    use crate::discovery::model::Namespace;
    type Pairs<'a> = &'a [(&'a str, &'a str)];
    // (service labels, service annotations, namespace labels, namespace annotations, weights)
    let table: &[(Pairs, Pairs, Pairs, Pairs, &[u32])] = &[
        // Istio: the weight "defaults to 0".
        (
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/use-waypoint-canary", "canary"),
            ],
            &[],
            &[],
            &[],
            &[100, 0],
        ),
        (
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/use-waypoint-canary", "canary"),
            ],
            &[("istio.io/use-waypoint-canary-weight", "30")],
            &[],
            &[],
            &[70, 30],
        ),
        // The canary and its weight from the Namespace.
        (
            &[("istio.io/use-waypoint", "wp")],
            &[],
            &[("istio.io/use-waypoint-canary", "canary")],
            &[("istio.io/use-waypoint-canary-weight", "20")],
            &[80, 20],
        ),
        // The Service's weight over the Namespace's.
        (
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/use-waypoint-canary", "canary"),
            ],
            &[("istio.io/use-waypoint-canary-weight", "10")],
            &[],
            &[("istio.io/use-waypoint-canary-weight", "20")],
            &[90, 10],
        ),
        // An invalid weight leaves the primary alone.
        (
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/use-waypoint-canary", "canary"),
            ],
            &[("istio.io/use-waypoint-canary-weight", "101")],
            &[],
            &[],
            &[],
        ),
        // A canary that is not a ready waypoint too.
        (
            &[
                ("istio.io/use-waypoint", "wp"),
                ("istio.io/use-waypoint-canary", "missing"),
            ],
            &[],
            &[],
            &[],
            &[],
        ),
    ];
    for (svc_labels, svc_annotations, ns_labels, ns_annotations, weights) in table {
        let mut index = index_of([
            Object::Namespace(Namespace {
                annotations: labels(ns_annotations),
                ..ns_with(NS, ns_labels)
            }),
            Object::Gateway(ready_gateway(NS, "wp", "10.0.9.1")),
            Object::Gateway(ready_gateway(NS, "canary", "10.0.9.2")),
            Object::Service(Service {
                labels: labels(svc_labels),
                annotations: labels(svc_annotations),
                ..svc(NS, "web", "10.96.0.10", &[("app", "web")])
            }),
        ]);
        let service = service(&mut index, &skey(NS, "web"));
        let got: Vec<u32> = service
            .weighted_waypoints
            .iter()
            .map(|w| w.weight)
            .collect();
        assert_eq!(
            &got, weights,
            "{svc_labels:?} {svc_annotations:?} {ns_labels:?}"
        );
        if let [primary, canary] = &service.weighted_waypoints[..] {
            assert_eq!(primary.destination, service.waypoint);
            assert_ne!(canary.destination, primary.destination);
        }
        assert!(service.waypoint.is_some());
    }
}

/// istiod's PILOT_ENABLE_SERVICEENTRY_SELECT_PODS off: a ServiceEntry's `workloadSelector`
/// selects WorkloadEntries only, no pods.
#[test]
fn service_entries_select_pods_unless_disabled() {
    let mut se = service_entry(NS, "se", &["se.example.com"]);
    se.workload_selector = Some(labels(&[("app", "a")]));
    let objects = [
        Object::Pod(pod_with(NS, "p", "10.0.0.1", &[("app", "a")]).into()),
        Object::WorkloadEntry(workload_entry(NS, "vm", "10.0.1.1", &[("app", "a")])),
        Object::ServiceEntry(se),
    ];
    for selects_pods in [true, false] {
        let mut index = Index::new(Settings {
            service_entry_select_pods: selects_pods,
            ..Settings::default()
        });
        for object in objects.clone() {
            index.apply(object);
        }
        let key = host_key(NS, "se.example.com");
        let pod = workload(&mut index, &uid(NS, "p"));
        assert_eq!(pod.services.contains_key(&key), selects_pods);
        let vm = workload(&mut index, &we_uid(NS, "vm"));
        assert!(vm.services.contains_key(&key));
    }
}
