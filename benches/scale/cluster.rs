//! The synthetic cluster, as the JSON an API server sends, and building an index from it.

use super::*;

// ---------------------------------------------------------------------------------------------
// The synthetic cluster, as API-server JSON

pub(super) const PODS_PER_SERVICE: usize = 10;

#[derive(Clone, Copy, Debug)]
pub(super) struct Spec {
    pub(super) pods: usize,
    pub(super) services: usize,
    pub(super) policies: usize,
    pub(super) nodes: usize,
    pub(super) namespaces: usize,
}

impl Spec {
    pub(super) fn new(pods: usize) -> Spec {
        Spec {
            pods,
            services: (pods / PODS_PER_SERVICE).max(1),
            policies: (pods / 100).max(1),
            nodes: (pods / 100).clamp(3, 1000),
            namespaces: (pods / 2000).clamp(2, 50),
        }
    }

    pub(super) fn label(&self) -> String {
        format!(
            "{}p/{}s/{}ap/{}n",
            short(self.pods),
            short(self.services),
            short(self.policies),
            short(self.nodes)
        )
    }

    pub(super) fn namespace_of_service(&self, s: usize) -> String {
        format!("team-{}", s % self.namespaces)
    }
}

pub(super) fn short(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

pub(super) fn ipv4(base: u32, i: usize) -> String {
    std::net::Ipv4Addr::from(base + i as u32).to_string()
}

pub(super) fn namespace_json(spec: &Spec, i: usize) -> Value {
    let _ = spec;
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": format!("team-{i}"), "uid": format!("ns-{i}"),
        "labels": {"istio.io/dataplane-mode": "ambient", "kubernetes.io/metadata.name": format!("team-{i}")}
    }})
}

pub(super) fn node_json(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": format!("node-{i}"),
        "labels": {
            "kubernetes.io/hostname": format!("node-{i}"),
            "topology.kubernetes.io/region": "us-east1",
            "topology.kubernetes.io/zone": format!("us-east1-{}", ["b", "c", "d"][i % 3]),
        }
    }})
}

pub(super) fn service_json(spec: &Spec, s: usize) -> Value {
    let app = format!("app-{s}");
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": app, "namespace": spec.namespace_of_service(s), "uid": format!("svc-{s}"),
        "labels": {"app": app, "team": format!("t{}", s % 37)}
    }, "spec": {
        "type": "ClusterIP", "clusterIP": ipv4(0x0a60_0000, s), "clusterIPs": [ipv4(0x0a60_0000, s)],
        "ipFamilies": ["IPv4"], "selector": {"app": app},
        "ports": [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            {"name": "grpc", "port": 9090, "targetPort": 9090, "protocol": "TCP", "appProtocol": "grpc"}
        ]
    }})
}

pub(super) fn pod_json(spec: &Spec, i: usize, ready: bool) -> Value {
    let s = i / PODS_PER_SERVICE;
    let app = format!("app-{s}");
    let hash = format!("{:010x}", s * 2654435761 % (1 << 40));
    let name = format!("{app}-{hash}-{i:06}");
    let ip = ipv4(0x0a00_0000, i + 1);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": spec.namespace_of_service(s), "uid": format!("00000000-0000-0000-0000-{i:012}"),
        "generateName": format!("{app}-{hash}-"),
        "labels": {"app": app, "version": "v1", "pod-template-hash": hash, "team": format!("t{}", s % 37)},
        "annotations": {"ambient.istio.io/redirection": "enabled"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-{hash}"), "uid": "rs", "controller": true}]
    }, "spec": {
        "serviceAccountName": app, "nodeName": format!("node-{}", i % spec.nodes),
        "containers": [{"name": "app", "image": "example/app:1", "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]
    }, "status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ipv4(0xc0a8_0000, i % spec.nodes),
        "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": if ready { "True" } else { "False" }},
            {"type": "ContainersReady", "status": if ready { "True" } else { "False" }},
            {"type": "PodScheduled", "status": "True"}
        ]
    }})
}

pub(super) fn policy_json(spec: &Spec, p: usize) -> Value {
    // Each policy selects one service's pods (app label) and allows two other services' accounts.
    let s = (p * 10) % spec.services;
    let ns = spec.namespace_of_service(s);
    let from_a = (s + 1) % spec.services;
    let from_b = (s + 2) % spec.services;
    json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy", "metadata": {
        "name": format!("allow-app-{s}"), "namespace": ns
    }, "spec": {
        "selector": {"matchLabels": {"app": format!("app-{s}")}},
        "action": "ALLOW",
        "rules": [{
            "from": [{"source": {"principals": [
                format!("cluster.local/ns/{}/sa/app-{from_a}", spec.namespace_of_service(from_a)),
                format!("cluster.local/ns/{}/sa/app-{from_b}", spec.namespace_of_service(from_b)),
            ]}}],
            "to": [{"operation": {"ports": ["8080"]}}]
        }]
    }})
}

/// The cluster as serialised JSON documents, one per object, in load order, with their kinds
/// (a watcher knows the kind it watches).
pub(super) fn cluster_json(spec: &Spec) -> Vec<(Kind, Vec<u8>)> {
    let mut docs = Vec::with_capacity(spec.pods + spec.services + spec.policies + spec.nodes);
    let mut push = |kind, v: Value| docs.push((kind, serde_json::to_vec(&v).expect("serialise")));
    for i in 0..spec.namespaces {
        push(Kind::Namespace, namespace_json(spec, i));
    }
    for i in 0..spec.nodes {
        push(Kind::Node, node_json(i));
    }
    for s in 0..spec.services {
        push(Kind::Service, service_json(spec, s));
    }
    for p in 0..spec.policies {
        push(Kind::AuthorizationPolicy, policy_json(spec, p));
    }
    for i in 0..spec.pods {
        push(Kind::Pod, pod_json(spec, i, true));
    }
    docs
}

pub(super) fn decode_one(value: Value) -> Object {
    match decode(value).pop() {
        Some(Decoded::Object(object)) => object,
        other => panic!("synthetic object did not decode: {other:?}"),
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Breakdown {
    pub(super) parse: Duration,
    pub(super) decode: Duration,
    pub(super) index: Duration,
    pub(super) snapshot: Duration,
    /// `Index::apply` time per kind (its whole first list), in load order.
    pub(super) kinds: [(Kind, Duration); 5],
}

impl Breakdown {
    pub(super) fn total(&self) -> Duration {
        self.parse + self.decode + self.index + self.snapshot
    }
}

/// Objects per list page: kube's watcher lists in pages of 500 and decodes a page at a time.
pub(super) const PAGE: usize = 500;

/// Raw JSON bytes -> decoded objects -> `Index` (every resource encoded) -> snapshot, as the
/// Kubernetes source does a cold start: each kind's first list in load order, a page of
/// [`PAGE`] objects parsed at a time (parse: the watcher's `WatchedObject`), and each object
/// reduced (decode: `kinds::reduce`) and applied as it arrives; the snapshot is published once
/// every kind is listed. `docs` are in load order.
pub(super) fn build(docs: &[(Kind, Vec<u8>)]) -> (Index, Arc<Snapshot>, Breakdown) {
    let mut b = Breakdown {
        parse: Duration::ZERO,
        decode: Duration::ZERO,
        index: Duration::ZERO,
        snapshot: Duration::ZERO,
        kinds: [(Kind::Namespace, Duration::ZERO); 5],
    };
    let watched = watched_kinds();
    let mut index = Index::new(Settings::default());
    let mut slot = 0;
    let mut rest = docs;
    while let Some((kind, _)) = rest.first() {
        let kind = *kind;
        let len = rest.iter().take_while(|(k, _)| *k == kind).count();
        let (list, after) = rest.split_at(len);
        rest = after;
        let how = watched.iter().find(|w| w.kind == kind).expect("watched");
        let mut applying = Duration::ZERO;
        for page in list.chunks(PAGE) {
            let t = Instant::now();
            let parsed: Vec<WatchedObject> = page
                .iter()
                .map(|(_, d)| serde_json::from_slice(d).expect("parse"))
                .collect();
            b.parse += t.elapsed();
            for parsed in parsed {
                let t = Instant::now();
                let object = match reduce(how, parsed) {
                    Reduced::Object(object) => object,
                    Reduced::Invalid(_, error) => {
                        panic!("synthetic object did not decode: {error}")
                    }
                };
                let t2 = Instant::now();
                b.decode += t2 - t;
                index.apply(object);
                applying += t2.elapsed();
            }
        }
        b.index += applying;
        if let Some(k) = b.kinds.get_mut(slot) {
            *k = (kind, applying);
        }
        slot += 1;
    }
    let t = Instant::now();
    let snapshot = index.snapshot();
    b.snapshot = t.elapsed();
    (index, snapshot, b)
}

/// The messages behind every resource of a snapshot, decoded back from their bytes.
pub(super) fn messages(snapshot: &Snapshot) -> (Vec<Address>, Vec<Authorization>) {
    let addresses = snapshot
        .addresses
        .values()
        .map(|r| Address::decode(r.value()).expect("Address"))
        .collect();
    let authorizations = snapshot
        .authorizations
        .values()
        .map(|r| Authorization::decode(r.value()).expect("Authorization"))
        .collect();
    (addresses, authorizations)
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn runs(o: &Opts) -> usize {
    if o.quick { 2 } else { 5 }
}
