//! One test per dependency edge of the index: a single change must re-emit exactly the
//! resources that read the changed object (ARCHITECTURE.md, "Data flow"; docs/conversion.md,
//! "Dependencies"),
//! and nothing else. Each test builds a small mesh with bystanders, applies one change and
//! asserts the exact `Changes`; [`World::expect`] also checks that those changes are exactly
//! the snapshot diff and that the result equals an index built cold from the final objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::support::*;
use crate::discovery::model::{
    ContainerPort, Kind, ObjectRef, PodFields, Resolution, ServiceEntry,
};
use crate::discovery::{Changes, Index, Object, Snapshot};
use crate::pb::workload::PortList;

const USE_WAYPOINT: &str = "istio.io/use-waypoint";
const USE_WAYPOINT_NAMESPACE: &str = "istio.io/use-waypoint-namespace";
const WAYPOINT_FOR: &str = "istio.io/waypoint-for";
const GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";
const MANAGED: &str = "gateway.istio.io/managed";
const TRAFFIC_DISTRIBUTION: &str = "networking.istio.io/traffic-distribution";
const NETWORK: &str = "topology.istio.io/network";
const ZONE: &str = "topology.kubernetes.io/zone";
const SYSTEM: &str = "istio-system";

/// An index, the objects it was given, and the snapshot before the change under test.
struct World {
    objects: BTreeMap<ObjectRef, Object>,
    index: Index,
    before: Arc<Snapshot>,
}

impl World {
    fn new(objects: impl IntoIterator<Item = Object>) -> Self {
        let objects: BTreeMap<ObjectRef, Object> =
            objects.into_iter().map(|o| (o.object_ref(), o)).collect();
        let mut index = cold(&objects);
        let before = index.snapshot();
        World {
            objects,
            index,
            before,
        }
    }

    fn apply(&mut self, object: Object) -> Changes {
        self.objects.insert(object.object_ref(), object.clone());
        self.index.apply(object)
    }

    fn delete(&mut self, reference: ObjectRef) -> Changes {
        self.objects.remove(&reference);
        self.index.delete(&reference)
    }

    /// Asserts the exact changes, that they are exactly what differs between the snapshots
    /// before and after, and that the index equals one built cold from the same objects.
    fn expect<S: AsRef<str>>(&mut self, changes: &Changes, upserted: &[S], removed: &[S]) {
        assert_eq!(changes.addresses.upserted, set(upserted), "upserted");
        assert_eq!(changes.addresses.removed, set(removed), "removed");
        assert!(changes.authorizations.is_empty(), "{changes:?}");
        let after = self.index.snapshot();
        let (changed, gone) = diff(&self.before, &after);
        assert_eq!(
            changes.addresses.upserted, changed,
            "upserts vs snapshot diff"
        );
        assert_eq!(changes.addresses.removed, gone, "removals vs snapshot diff");
        let cold = cold(&self.objects).snapshot();
        assert_eq!(versions(&after), versions(&cold), "warm vs cold");
        self.before = after;
    }

    fn expect_nothing(&mut self, changes: &Changes) {
        self.expect::<&str>(changes, &[], &[]);
    }

    fn workload(&mut self, name: &str) -> crate::pb::workload::Workload {
        workload(&mut self.index, name)
    }
}

/// An index built from `objects`, containers first (the order of a full load).
fn cold(objects: &BTreeMap<ObjectRef, Object>) -> Index {
    let rank = |o: &Object| Kind::ALL.iter().position(|k| *k == o.kind());
    let mut sorted: Vec<&Object> = objects.values().collect();
    sorted.sort_by_key(|o| rank(o));
    index_of(sorted.into_iter().cloned())
}

fn pod_labelled(namespace: &str, name: &str, pod_ip: &str, l: &[(&str, &str)]) -> Object {
    Object::Pod(pod_with(namespace, name, pod_ip, l).into())
}

fn with_ports(mut p: PodFields, ports: &[ContainerPort]) -> Object {
    p.ports = ports.into();
    Object::Pod(p.into())
}

fn labelled_svc(namespace: &str, name: &str, vip: &str, l: &[(&str, &str)]) -> Object {
    let mut s = svc(namespace, name, vip, &[("app", name)]);
    s.labels = labels(l);
    Object::Service(s)
}

fn entry_at(namespace: &str, name: &str, host: &str, address: &str) -> ServiceEntry {
    let mut se = service_entry(namespace, name, &[host]);
    se.endpoints = vec![endpoint(address)];
    se
}

fn se_with_endpoint(namespace: &str, name: &str, host: &str, address: &str) -> Object {
    Object::ServiceEntry(entry_at(namespace, name, host, address))
}

fn all_waypoint(namespace: &str, name: &str, address: &str) -> Object {
    let mut gw = ready_gateway(namespace, name, address);
    gw.labels = labels(&[(WAYPOINT_FOR, "all")]);
    Object::Gateway(gw)
}

// ---------------------------------------------------------------------------------------------
// Namespaces
// ---------------------------------------------------------------------------------------------

#[test]
fn namespace_use_waypoint_re_emits_what_binds_in_that_namespace_only() {
    let mut world = World::new([
        Object::Namespace(ns(NS)),
        Object::Namespace(ns("other")),
        all_waypoint(NS, "wp", "10.0.9.1"),
        Object::Gateway(gateway(NS, "not-ready")),
        // Bind through the namespace.
        pod_labelled(NS, "a", "10.0.0.1", &[]),
        labelled_svc(NS, "web", "10.96.0.1", &[]),
        Object::WorkloadEntry(workload_entry(NS, "vm", "10.0.1.1", &[])),
        se_with_endpoint(NS, "ext", "ext.example.com", "10.0.2.1"),
        // Bystanders: opted out, bound elsewhere by their own label, a waypoint instance, a
        // mesh-controller Service, slice workloads (never bound) and another namespace.
        pod_labelled(NS, "optout", "10.0.0.2", &[(USE_WAYPOINT, "none")]),
        pod_labelled(NS, "own", "10.0.0.3", &[(USE_WAYPOINT, "missing")]),
        pod_labelled(NS, "wp-pod", "10.0.0.4", &[(GATEWAY_NAME, "wp")]),
        labelled_svc(
            NS,
            "wp",
            "10.96.0.2",
            &[(MANAGED, "istio.io-mesh-controller")],
        ),
        Object::EndpointSlice(ip_slice(NS, "web-1", "web", "10.0.3.1")),
        pod_labelled("other", "x", "10.0.4.1", &[]),
        labelled_svc("other", "db", "10.96.1.1", &[]),
    ]);

    // Pointing at a waypoint that is not ready binds nothing: no change.
    let changes = world.apply(Object::Namespace(ns_with(
        NS,
        &[(USE_WAYPOINT, "not-ready")],
    )));
    world.expect_nothing(&changes);

    let bound = [
        uid(NS, "a"),
        skey(NS, "web"),
        we_uid(NS, "vm"),
        host_key(NS, "ext.example.com"),
        se_uid(NS, "ext", "10.0.2.1"),
    ];
    let changes = world.apply(Object::Namespace(ns_with(NS, &[(USE_WAYPOINT, "wp")])));
    world.expect(&changes, &bound, &[]);
    assert!(world.workload(&uid(NS, "a")).waypoint.is_some());
    assert!(world.workload(&uid(NS, "optout")).waypoint.is_none());

    // Removing the label unbinds the same set.
    let changes = world.apply(Object::Namespace(ns(NS)));
    world.expect(&changes, &bound, &[]);
}

#[test]
fn namespace_traffic_distribution_re_emits_its_services_without_their_own_setting() {
    let mut own_annotation = svc(NS, "annotated", "10.96.0.2", &[]);
    own_annotation.annotations = labels(&[(TRAFFIC_DISTRIBUTION, "PreferSameNode")]);
    let mut own_spec = svc(NS, "spec", "10.96.0.3", &[]);
    own_spec.traffic_distribution = Some("PreferSameNode".into());
    let mut local = svc(NS, "local", "10.96.0.4", &[]);
    local.internal_traffic_local = true;
    let mut dns = service_entry(NS, "dns", &["dns.example.com"]);
    dns.resolution = Resolution::Dns;
    let mut passthrough = service_entry(NS, "passthrough", &["pt.example.com"]);
    passthrough.resolution = Resolution::None;
    let mut world = World::new([
        Object::Namespace(ns(NS)),
        Object::Namespace(ns("other")),
        Object::Service(svc(NS, "plain", "10.96.0.1", &[("app", "plain")])),
        Object::Service(own_annotation),
        Object::Service(own_spec),
        Object::Service(local),
        Object::ServiceEntry(dns),
        Object::ServiceEntry(passthrough),
        pod_labelled(NS, "p", "10.0.0.1", &[("app", "plain")]),
        Object::Service(svc("other", "plain", "10.96.1.1", &[])),
    ]);
    let mut annotated = ns(NS);
    annotated.annotations = labels(&[(TRAFFIC_DISTRIBUTION, "PreferClose")]);
    let changes = world.apply(Object::Namespace(annotated));
    // The DNS ServiceEntry is a Service too and reads the namespace annotation;
    // NONE resolution is always PASSTHROUGH.
    world.expect(
        &changes,
        &[skey(NS, "plain"), host_key(NS, "dns.example.com")],
        &[],
    );
}

#[test]
fn system_namespace_network_re_emits_everything_that_carries_the_network() {
    let mut remote_we = workload_entry(NS, "remote-vm", "10.0.1.2", &[]);
    remote_we.endpoint.network = "vm-net".into();
    let mut remote_se = service_entry(NS, "remote", &["remote.example.com"]);
    let mut remote_endpoint = endpoint("10.0.2.2");
    remote_endpoint.network = "vm-net".into();
    remote_se.endpoints = vec![remote_endpoint];
    let mut vip_se = service_entry(NS, "ext", &["ext.example.com"]);
    vip_se.addresses = vec!["240.0.0.1".into()];
    vip_se.endpoints = vec![endpoint("10.0.2.1")];
    let mut headless_bound = svc(NS, "headless-bound", "", &[]);
    headless_bound.labels = labels(&[(USE_WAYPOINT, "wp")]);
    let mut world = World::new([
        Object::Namespace(ns(SYSTEM)),
        Object::Namespace(ns(NS)),
        Object::Gateway(ready_gateway(NS, "wp", "10.0.9.1")),
        pod_labelled(SYSTEM, "istiod", "10.0.0.9", &[]),
        pod_labelled(NS, "a", "10.0.0.1", &[]),
        Object::Service(svc(NS, "web", "10.96.0.1", &[("app", "web")])),
        // A headless Service carries no address, but this one carries its waypoint's.
        Object::Service(headless_bound),
        Object::WorkloadEntry(workload_entry(NS, "vm", "10.0.1.1", &[])),
        Object::ServiceEntry(vip_se),
        Object::EndpointSlice(ip_slice(NS, "web-1", "web", "10.0.3.1")),
        // Bystanders: nothing in them names the local network.
        Object::Service(svc(NS, "headless", "", &[])),
        Object::WorkloadEntry(remote_we),
        Object::ServiceEntry(remote_se),
    ]);
    let every = [
        uid(SYSTEM, "istiod"),
        uid(NS, "a"),
        skey(NS, "web"),
        skey(NS, "headless-bound"),
        we_uid(NS, "vm"),
        host_key(NS, "ext.example.com"),
        se_uid(NS, "ext", "10.0.2.1"),
        slice_uid(NS, "web-1", "10.0.3.1"),
    ];
    let changes = world.apply(Object::Namespace(ns_with(SYSTEM, &[(NETWORK, "n1")])));
    world.expect(&changes, &every, &[]);
    assert_eq!(world.workload(&uid(NS, "a")).network, "n1");

    // The network label on any other namespace means nothing.
    let changes = world.apply(Object::Namespace(ns_with(NS, &[(NETWORK, "n2")])));
    world.expect_nothing(&changes);

    let changes = world.delete(ObjectRef::new(Kind::Namespace, "", SYSTEM));
    world.expect(&changes, &every, &[]);
}

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

#[test]
fn node_zone_re_emits_only_the_pods_on_that_node() {
    let mut on_b = pod(NS, "on-b", "10.0.0.3");
    on_b.node_name = "node-b".into();
    let mut done = pod(NS, "done", "10.0.0.4");
    done.phase = "Succeeded".into();
    let mut vm = workload_entry(NS, "vm", "10.0.1.1", &[]);
    vm.endpoint.locality = "r1/z1".into();
    let mut world = World::new([
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::Node(node("node-b", &[(ZONE, "z1")])),
        Object::Pod(pod(NS, "a", "10.0.0.1").into()),
        Object::Pod(pod("other", "b", "10.0.0.2").into()),
        Object::Pod(on_b.into()),
        // Terminal: on the node, but produces no workload.
        Object::Pod(done.into()),
        Object::WorkloadEntry(vm),
        Object::Service(svc(NS, "web", "10.96.0.1", &[("app", "web")])),
    ]);
    let changes = world.apply(Object::Node(node(NODE, &[(ZONE, "z2")])));
    world.expect(&changes, &[uid(NS, "a"), uid("other", "b")], &[]);
    assert_eq!(world.workload(&uid(NS, "a")).locality.unwrap().zone, "z2");
}

// ---------------------------------------------------------------------------------------------
// Services
// ---------------------------------------------------------------------------------------------

#[test]
fn service_selector_change_re_emits_the_members_that_left_and_joined() {
    let mut world = World::new([
        Object::Service(svc(NS, "s", "10.96.0.1", &[("app", "a")])),
        Object::Service(svc(NS, "c", "10.96.0.2", &[("app", "c")])),
        pod_labelled(NS, "a1", "10.0.0.1", &[("app", "a")]),
        pod_labelled(NS, "a2", "10.0.0.2", &[("app", "a"), ("tier", "x")]),
        pod_labelled(NS, "t", "10.0.0.3", &[("app", "b"), ("tier", "x")]),
        pod_labelled(NS, "c1", "10.0.0.4", &[("app", "c")]),
        pod_labelled("other", "t", "10.0.1.3", &[("tier", "x")]),
        Object::WorkloadEntry(workload_entry(NS, "we-a", "10.0.2.1", &[("app", "a")])),
        Object::WorkloadEntry(workload_entry(NS, "we-t", "10.0.2.2", &[("tier", "x")])),
    ]);
    let changes = world.apply(Object::Service(svc(NS, "s", "10.96.0.1", &[("tier", "x")])));
    // a1 and we-a leave, t and we-t join; a2 stays with an identical entry. The Service
    // resource carries no selector, so it is not re-sent either.
    world.expect(
        &changes,
        &[
            uid(NS, "a1"),
            uid(NS, "t"),
            we_uid(NS, "we-a"),
            we_uid(NS, "we-t"),
        ],
        &[],
    );
    assert!(
        world
            .workload(&uid(NS, "t"))
            .services
            .contains_key(&skey(NS, "s"))
    );
}

#[test]
fn service_port_change_re_emits_the_service_and_its_members_only() {
    let web_port = sport("http", 80, named("web"));
    let mut web = svc(NS, "web", "10.96.0.1", &[("app", "web")]);
    web.ports = vec![web_port.clone()];
    let mut twin = web.clone();
    twin.name = "twin".into();
    twin.cluster_ips = vec![ip("10.96.0.2")];
    twin.selector = labels(&[("app", "twin")]);
    let mut vm = workload_entry(NS, "vm", "10.0.1.1", &[("app", "web")]);
    vm.endpoint.ports = [("web".to_string(), 9000)].into();
    let mut web_slice = ip_slice(NS, "web-1", "web", "10.0.3.1");
    web_slice.ports = vec![slice_port("http", 8080)];
    let mut targeted = pod(NS, "targeted", "10.0.0.3");
    targeted.uid = "u-targeted".into();
    targeted.ports = [cport("web", 8081)].into();
    web_slice
        .endpoints
        .push(slice_pod("10.0.0.3", NS, "targeted", "u-targeted"));
    let mut world = World::new([
        Object::Service(web.clone()),
        Object::Service(twin),
        with_ports(
            pod_with(NS, "w1", "10.0.0.1", &[("app", "web")]),
            &[cport("web", 8080)],
        ),
        // A member without the named port: its (empty) entry does not change.
        pod_labelled(NS, "w2", "10.0.0.2", &[("app", "web")]),
        Object::Pod(targeted.into()),
        Object::WorkloadEntry(vm),
        Object::EndpointSlice(web_slice),
        with_ports(
            pod_with(NS, "t1", "10.0.0.4", &[("app", "twin")]),
            &[cport("web", 8080)],
        ),
        with_ports(
            pod_with("other", "w1", "10.0.1.4", &[("app", "web")]),
            &[cport("web", 8080)],
        ),
    ]);
    web.ports[0].port = 81;
    let changes = world.apply(Object::Service(web));
    world.expect(
        &changes,
        &[
            skey(NS, "web"),
            uid(NS, "w1"),
            uid(NS, "targeted"),
            we_uid(NS, "vm"),
            slice_uid(NS, "web-1", "10.0.3.1"),
        ],
        &[],
    );
    assert_eq!(
        world
            .workload(&uid(NS, "w2"))
            .services
            .get(&skey(NS, "web")),
        Some(&PortList { ports: vec![] })
    );
}

// ---------------------------------------------------------------------------------------------
// ServiceEntries
// ---------------------------------------------------------------------------------------------

fn selecting_entry(selector: &[(&str, &str)]) -> ServiceEntry {
    let mut se = service_entry(NS, "se", &["one.example.com", "two.example.com"]);
    se.addresses = vec!["240.0.0.1".into()];
    se.workload_selector = Some(labels(selector));
    se
}

fn selector_world() -> World {
    World::new([
        Object::ServiceEntry(selecting_entry(&[("app", "a")])),
        se_with_endpoint(NS, "bystander", "by.example.com", "10.0.2.9"),
        pod_labelled(NS, "a", "10.0.0.1", &[("app", "a")]),
        pod_labelled(NS, "b", "10.0.0.2", &[("app", "b")]),
        pod_labelled(NS, "c", "10.0.0.3", &[("app", "c")]),
        pod_labelled("other", "a", "10.0.1.1", &[("app", "a")]),
        Object::WorkloadEntry(workload_entry(NS, "we-a", "10.0.2.1", &[("app", "a")])),
        Object::WorkloadEntry(workload_entry(NS, "we-b", "10.0.2.2", &[("app", "b")])),
    ])
}

#[test]
fn service_entry_selector_change_re_emits_the_workloads_it_selected_or_selects() {
    let mut world = selector_world();
    let changes = world.apply(Object::ServiceEntry(selecting_entry(&[("app", "b")])));
    world.expect(
        &changes,
        &[
            uid(NS, "a"),
            uid(NS, "b"),
            we_uid(NS, "we-a"),
            we_uid(NS, "we-b"),
        ],
        &[],
    );
    let b = world.workload(&uid(NS, "b"));
    assert!(b.services.contains_key(&host_key(NS, "one.example.com")));
}

#[test]
fn service_entry_port_change_re_emits_its_services_and_selected_workloads() {
    let mut world = selector_world();
    let mut se = selecting_entry(&[("app", "a")]);
    se.ports[0].number = 81;
    let changes = world.apply(Object::ServiceEntry(se));
    world.expect(
        &changes,
        &[
            host_key(NS, "one.example.com"),
            host_key(NS, "two.example.com"),
            uid(NS, "a"),
            we_uid(NS, "we-a"),
        ],
        &[],
    );
}

#[test]
fn deleting_the_older_service_entry_lets_the_newer_one_win() {
    const HOST: &str = "shared.example.com";
    let entry = |namespace: &str, name: &str, created: &str, address: &str| {
        let mut se = entry_at(namespace, name, HOST, address);
        se.created = created.into();
        Object::ServiceEntry(se)
    };
    let mut world = World::new([
        entry(NS, "old", "2020-01-01T00:00:00Z", "10.1.0.1"),
        entry(NS, "new", "2021-01-01T00:00:00Z", "10.1.0.2"),
        // Same host in another namespace: its own slot, never canonical (newest).
        entry("other", "late", "2022-01-01T00:00:00Z", "10.1.0.3"),
        se_with_endpoint(NS, "unrelated", "unrelated.example.com", "10.1.0.4"),
    ]);
    assert!(try_workload(&mut world.index, &se_uid(NS, "new", "10.1.0.2")).is_none());
    let changes = world.delete(ObjectRef::new(Kind::ServiceEntry, NS, "old"));
    world.expect(
        &changes,
        &[host_key(NS, HOST), se_uid(NS, "new", "10.1.0.2")],
        &[se_uid(NS, "old", "10.1.0.1")],
    );
    assert_eq!(service(&mut world.index, &host_key(NS, HOST)).name, "new");
}

#[test]
fn deleting_the_older_service_entry_moves_selected_pods_to_the_newer_one() {
    const HOST: &str = "shared.example.com";
    let mut old = service_entry(NS, "old", &[HOST]);
    old.created = "2020-01-01T00:00:00Z".into();
    old.workload_selector = Some(labels(&[("app", "old")]));
    let mut new = service_entry(NS, "new", &[HOST]);
    new.created = "2021-01-01T00:00:00Z".into();
    new.ports = vec![se_port("http", 8080, "HTTP")];
    new.workload_selector = Some(labels(&[("app", "new")]));
    let mut world = World::new([
        Object::ServiceEntry(old),
        Object::ServiceEntry(new),
        pod_labelled(NS, "o", "10.0.0.1", &[("app", "old")]),
        pod_labelled(NS, "n", "10.0.0.2", &[("app", "new")]),
        pod_labelled(NS, "x", "10.0.0.3", &[("app", "x")]),
        pod_labelled("other", "n", "10.0.1.2", &[("app", "new")]),
    ]);
    assert!(world.workload(&uid(NS, "n")).services.is_empty());
    let changes = world.delete(ObjectRef::new(Kind::ServiceEntry, NS, "old"));
    world.expect(
        &changes,
        &[host_key(NS, HOST), uid(NS, "o"), uid(NS, "n")],
        &[],
    );
    assert!(
        world
            .workload(&uid(NS, "n"))
            .services
            .contains_key(&host_key(NS, HOST))
    );
}

// ---------------------------------------------------------------------------------------------
// Waypoints
// ---------------------------------------------------------------------------------------------

/// `wp` (waypoint-for `all`, not ready yet) and `wp2` (ready) in `demo`, and what binds to
/// them, plus bystanders that look it up without binding.
fn waypoint_world(wp: Object) -> World {
    World::new([
        Object::Namespace(ns_with(NS, &[(USE_WAYPOINT, "wp")])),
        Object::Namespace(ns("other")),
        wp,
        Object::Gateway(ready_gateway(NS, "wp2", "10.0.9.2")),
        // Bound to wp: through the namespace, or their own label.
        pod_labelled(NS, "q", "10.0.0.1", &[]),
        pod_labelled(NS, "p", "10.0.0.2", &[(USE_WAYPOINT, "wp")]),
        labelled_svc(NS, "web", "10.96.0.1", &[]),
        Object::WorkloadEntry(workload_entry(
            NS,
            "vm",
            "10.0.1.1",
            &[(USE_WAYPOINT, "wp")],
        )),
        se_with_endpoint(NS, "ext", "ext.example.com", "10.0.2.1"),
        // Bystanders.
        pod_labelled(NS, "wp-pod", "10.0.0.3", &[(GATEWAY_NAME, "wp")]),
        pod_labelled(NS, "p2", "10.0.0.4", &[(USE_WAYPOINT, "wp2")]),
        labelled_svc(NS, "web2", "10.96.0.2", &[(USE_WAYPOINT, "wp2")]),
        pod_labelled("other", "same-name", "10.0.3.1", &[(USE_WAYPOINT, "wp")]),
        pod_labelled(
            "other",
            "denied",
            "10.0.3.2",
            &[(USE_WAYPOINT, "wp"), (USE_WAYPOINT_NAMESPACE, NS)],
        ),
    ])
}

fn bound_to_wp() -> Vec<String> {
    vec![
        uid(NS, "q"),
        uid(NS, "p"),
        skey(NS, "web"),
        we_uid(NS, "vm"),
        host_key(NS, "ext.example.com"),
        se_uid(NS, "ext", "10.0.2.1"),
    ]
}

#[test]
fn gateway_becoming_ready_re_emits_exactly_what_binds_to_it() {
    let mut not_ready = gateway(NS, "wp");
    not_ready.labels = labels(&[(WAYPOINT_FOR, "all")]);
    let mut world = waypoint_world(Object::Gateway(not_ready));
    assert!(world.workload(&uid(NS, "p")).waypoint.is_none());

    let changes = world.apply(all_waypoint(NS, "wp", "10.0.9.1"));
    world.expect(&changes, &bound_to_wp(), &[]);
    assert!(world.workload(&uid(NS, "p")).waypoint.is_some());
    assert!(world.workload(&uid(NS, "wp-pod")).waypoint.is_none());

    // Deleting it unbinds the same set.
    let changes = world.delete(ObjectRef::new(Kind::Gateway, NS, "wp"));
    world.expect(&changes, &bound_to_wp(), &[]);
}

#[test]
fn gateway_waypoint_for_label_re_emits_the_objects_whose_binding_changed() {
    let mut world = waypoint_world(Object::Gateway(ready_gateway(NS, "wp", "10.0.9.1")));
    // `service` (the default) -> `workload`: services unbind, workloads bind.
    let mut gw = ready_gateway(NS, "wp", "10.0.9.1");
    gw.labels = labels(&[(WAYPOINT_FOR, "workload")]);
    let changes = world.apply(Object::Gateway(gw.clone()));
    world.expect(&changes, &bound_to_wp(), &[]);

    // `workload` -> `all`: only the services change.
    gw.labels = labels(&[(WAYPOINT_FOR, "all")]);
    let changes = world.apply(Object::Gateway(gw));
    world.expect(
        &changes,
        &[skey(NS, "web"), host_key(NS, "ext.example.com")],
        &[],
    );
}

#[test]
fn gateway_class_waypoint_for_re_emits_objects_bound_to_gateways_of_that_class_only() {
    let mut own_label = ready_gateway(NS, "wp-own", "10.0.9.2");
    own_label.labels = labels(&[(WAYPOINT_FOR, "service")]);
    let mut other_class = ready_gateway(NS, "wp-other", "10.0.9.3");
    other_class.class_name = "other".into();
    let mut world = World::new([
        Object::GatewayClass(gateway_class("istio-waypoint", &[])),
        Object::GatewayClass(gateway_class("other", &[])),
        Object::Gateway(ready_gateway(NS, "wp", "10.0.9.1")),
        Object::Gateway(own_label),
        Object::Gateway(other_class),
        pod_labelled(NS, "p", "10.0.0.1", &[(USE_WAYPOINT, "wp")]),
        pod_labelled(NS, "p-own", "10.0.0.2", &[(USE_WAYPOINT, "wp-own")]),
        pod_labelled(NS, "p-other", "10.0.0.3", &[(USE_WAYPOINT, "wp-other")]),
        labelled_svc(NS, "s", "10.96.0.1", &[(USE_WAYPOINT, "wp")]),
        labelled_svc(NS, "s-own", "10.96.0.2", &[(USE_WAYPOINT, "wp-own")]),
        labelled_svc(NS, "s-other", "10.96.0.3", &[(USE_WAYPOINT, "wp-other")]),
    ]);
    // service -> all: the pod bound to `wp` binds; its service was bound and stays so.
    let changes = world.apply(Object::GatewayClass(gateway_class(
        "istio-waypoint",
        &[(WAYPOINT_FOR, "all")],
    )));
    world.expect(&changes, &[uid(NS, "p")], &[]);

    // all -> workload: the service unbinds; the pod stays bound.
    let changes = world.apply(Object::GatewayClass(gateway_class(
        "istio-waypoint",
        &[(WAYPOINT_FOR, "workload")],
    )));
    world.expect(&changes, &[skey(NS, "s")], &[]);
}

// ---------------------------------------------------------------------------------------------
// Pods and EndpointSlices
// ---------------------------------------------------------------------------------------------

#[test]
fn pod_container_port_change_re_emits_only_that_pod() {
    let mut web = svc(NS, "web", "10.96.0.1", &[("app", "web")]);
    web.ports = vec![sport("http", 80, named("web"))];
    let member = |name: &str, pod_ip: &str, port: u16| {
        with_ports(
            pod_with(NS, name, pod_ip, &[("app", "web")]),
            &[cport("web", port)],
        )
    };
    let mut world = World::new([
        Object::Service(web),
        member("p1", "10.0.0.1", 8080),
        member("p2", "10.0.0.2", 8080),
    ]);
    let changes = world.apply(member("p1", "10.0.0.1", 9090));
    world.expect(&changes, &[uid(NS, "p1")], &[]);
    let ports = &world.workload(&uid(NS, "p1")).services[&skey(NS, "web")].ports;
    assert_eq!(ports[0].target_port, 9090);
}

#[test]
fn endpoint_slice_target_ref_adds_its_service_to_exactly_that_pod() {
    let with_uid = |name: &str, pod_ip: &str, pod_uid: &str| {
        let mut p = pod(NS, name, pod_ip);
        p.uid = pod_uid.into();
        Object::Pod(p.into())
    };
    let mut world = World::new([
        // Selectorless.
        Object::Service(svc(NS, "ext", "10.96.0.1", &[])),
        with_uid("p", "10.0.0.1", "u-p"),
        with_uid("q", "10.0.0.2", "u-q"),
        with_uid("r", "10.0.0.3", "u-r"),
    ]);
    let mut ext = slice(NS, "ext-1", "ext");
    ext.endpoints = vec![
        slice_pod("10.0.0.1", NS, "p", "u-p"),
        // Wrong uid: not that pod (a targetRef must match kind, namespace, name and uid).
        slice_pod("10.0.0.2", NS, "q", "u-stale"),
        // An IP without a targetRef is its own workload, and never attaches pod r.
        slice_ip("10.0.0.3"),
    ];
    let changes = world.apply(Object::EndpointSlice(ext));
    world.expect(
        &changes,
        &[uid(NS, "p"), slice_uid(NS, "ext-1", "10.0.0.3")],
        &[],
    );
    assert!(
        world
            .workload(&uid(NS, "p"))
            .services
            .contains_key(&skey(NS, "ext"))
    );
    assert!(world.workload(&uid(NS, "q")).services.is_empty());

    let changes = world.delete(ObjectRef::new(Kind::EndpointSlice, NS, "ext-1"));
    world.expect(
        &changes,
        &[uid(NS, "p")],
        &[slice_uid(NS, "ext-1", "10.0.0.3")],
    );
}

#[test]
fn cross_namespace_target_ref_does_not_detach_a_pod_from_its_own_slice() {
    // Regression: the pod -> slices index once held bare slice names, so deleting (or
    // updating) `other/s` also dropped `demo/s`'s claim on the pod, unlike a cold build.
    // Two slices named `s`: one in the pod's namespace, one elsewhere, both naming the pod.
    let mut p = pod(NS, "p", "10.0.0.1");
    p.uid = "u-p".into();
    let mut own = slice(NS, "s", "ext");
    own.endpoints = vec![slice_pod("10.0.0.1", NS, "p", "u-p")];
    let mut foreign = slice("other", "s", "ext");
    foreign.endpoints = vec![slice_pod("10.0.0.1", NS, "p", "u-p")];
    let mut world = World::new([
        Object::Service(svc(NS, "ext", "10.96.0.1", &[])),
        Object::Service(svc("other", "ext", "10.96.1.1", &[])),
        Object::Pod(p.into()),
        Object::EndpointSlice(own),
        Object::EndpointSlice(foreign),
    ]);
    let services = world.workload(&uid(NS, "p")).services;
    assert!(services.contains_key(&skey(NS, "ext")), "{services:?}");
    // Only slices of the pod's own namespace attach it.
    assert!(
        !services.contains_key(&skey("other", "ext")),
        "{services:?}"
    );
    // Deleting the foreign slice must leave the pod in `demo/ext`, as a cold build does.
    let changes = world.delete(ObjectRef::new(Kind::EndpointSlice, "other", "s"));
    let services = world.workload(&uid(NS, "p")).services;
    assert!(services.contains_key(&skey(NS, "ext")), "{services:?}");
    world.expect_nothing(&changes);
}

// ---------------------------------------------------------------------------------------------
// No-op updates
// ---------------------------------------------------------------------------------------------

#[test]
fn updates_to_fields_the_index_does_not_read_emit_nothing() {
    let base_pod = pod_with(NS, "p", "10.0.0.1", &[("app", "web")]);
    let base_svc = svc(NS, "web", "10.96.0.1", &[("app", "web")]);
    let objects = [
        Object::Namespace(ns(NS)),
        Object::Node(node(NODE, &[(ZONE, "z1")])),
        Object::GatewayClass(gateway_class("istio-waypoint", &[])),
        Object::Gateway(ready_gateway(NS, "wp", "10.0.9.1")),
        Object::Service(base_svc.clone()),
        Object::Pod(base_pod.clone().into()),
        Object::WorkloadEntry(workload_entry(NS, "vm", "10.0.1.1", &[("app", "web")])),
        se_with_endpoint(NS, "ext", "ext.example.com", "10.0.2.1"),
        Object::EndpointSlice(ip_slice(NS, "web-1", "web", "10.0.3.1")),
    ];
    let mut world = World::new(objects.clone());

    // Re-applying every identical object.
    for object in objects {
        let changes = world.apply(object);
        world.expect_nothing(&changes);
    }

    let mut unread: Vec<Object> = Vec::new();
    // Pod: an annotation other than ambient.istio.io/redirection; Pending is as good as
    // Running (only terminal phases are read); a container port no service names; the uid
    // while no slice names the pod.
    let mut p = base_pod.clone();
    p.annotations = labels(&[("example.com/owner", "team-a")]);
    unread.push(Object::Pod(p.clone().into()));
    p.phase = "Pending".into();
    unread.push(Object::Pod(p.clone().into()));
    p.ports = [cport("metrics", 9090)].into();
    unread.push(Object::Pod(p.clone().into()));
    p.uid = "recreated".into();
    unread.push(Object::Pod(p.into()));
    // Service: an unread annotation and label.
    let mut s = base_svc;
    s.annotations = labels(&[("example.com/owner", "team-a")]);
    s.labels = labels(&[("team", "a")]);
    unread.push(Object::Service(s));
    // Node: a label other than the three topology ones.
    unread.push(Object::Node(node(
        NODE,
        &[(ZONE, "z1"), ("kubernetes.io/os", "linux")],
    )));
    // Namespace: istiod never reads istio.io/dataplane-mode when building WDS.
    unread.push(Object::Namespace(ns_with(
        NS,
        &[("istio.io/dataplane-mode", "ambient")],
    )));
    // Gateway and GatewayClass: unread annotations.
    let mut gw = ready_gateway(NS, "wp", "10.0.9.1");
    gw.annotations = labels(&[("example.com/owner", "team-a")]);
    unread.push(Object::Gateway(gw));
    let mut class = gateway_class("istio-waypoint", &[]);
    class.annotations = labels(&[("example.com/owner", "team-a")]);
    unread.push(Object::GatewayClass(class));
    for object in unread {
        let what = object.object_ref();
        let changes = world.apply(object);
        assert!(changes.is_empty(), "{what}: {changes:?}");
        world.expect_nothing(&changes);
    }
}
