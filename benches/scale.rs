//! Scale harness (issue 7, "The benchmark"): a synthetic cluster of N pods, M services,
//! P AuthorizationPolicies and K nodes, as the Kubernetes JSON an API server sends, driven
//! through the real decoders (`ambientd::kube::objects::decode`) into an `Index`, and served by
//! the real `AdsServer` over loopback to real delta ADS gRPC clients.
//!
//! ```sh
//! cargo bench --bench scale                       # every scenario, full sizes
//! cargo bench --bench scale -- --quick            # small sizes, few runs (well under a minute)
//! cargo bench --bench scale -- --only T3 --json   # one scenario, JSON rows
//! ```
//!
//! Each scenario runs in its own child process (the bench re-executes itself with `--child`), so
//! that RSS figures are not skewed by what an earlier scenario allocated and freed. T7's clients
//! run in yet another process so that the server's RSS is the server's alone.
//!
//! Scenarios: T1 cold build, T2 memory per pod, T3 one pod change, T4 event to the last of S
//! streams, T5 bytes per pod change per stream, T6 reconnect storm, T7 idle stream memory.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambientd::discovery::names::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::discovery::{Index, Kind, Object, Settings, Snapshot};
use ambientd::kube::objects::{Decoded, decode};
use ambientd::metrics::Metrics;
use ambientd::pb::google::protobuf::{Struct, Value as PbValue, value::Kind as PbKind};
use ambientd::pb::security::Authorization;
use ambientd::pb::workload::Address;
use ambientd::pb::xds::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node};
use ambientd::push::{AdsServer, Registry};
use futures::StreamExt;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;

// The allocator the binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Any single expected network event.
const WAIT: Duration = Duration::from_secs(30);
const SCENARIOS: [&str; 7] = ["T1", "T2", "T3", "T4", "T5", "T6", "T7"];

// ---------------------------------------------------------------------------------------------
// Options and result rows

#[derive(Clone, Debug, Default)]
struct Opts {
    quick: bool,
    json: bool,
    only: Vec<String>,
    child: Option<String>,
    /// `--clients ADDR COUNT`: the T7 client process.
    clients: Option<(String, usize)>,
}

fn opts() -> Opts {
    let mut o = Opts::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => o.quick = true,
            "--json" => o.json = true,
            "--only" if i + 1 < args.len() => {
                i += 1;
                o.only
                    .extend(args[i].split(',').map(|s| s.trim().to_uppercase()));
            }
            "--child" if i + 1 < args.len() => {
                i += 1;
                o.child = Some(args[i].clone());
            }
            "--clients" if i + 2 < args.len() => {
                o.clients = Some((args[i + 1].clone(), args[i + 2].parse().unwrap_or(0)));
                i += 2;
            }
            // `cargo bench` passes `--bench`; anything else unknown is ignored too.
            _ => {}
        }
        i += 1;
    }
    o
}

#[derive(Clone, Debug)]
struct Row {
    scenario: String,
    size: String,
    metric: String,
    median: f64,
    unit: String,
    target: String,
    pass: Option<bool>,
    note: String,
}

impl Row {
    fn to_json(&self) -> Value {
        json!({
            "scenario": self.scenario, "size": self.size, "metric": self.metric,
            "median": self.median, "unit": self.unit, "target": self.target,
            "pass": self.pass, "note": self.note,
        })
    }

    fn from_json(v: &Value) -> Option<Row> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Some(Row {
            scenario: s("scenario"),
            size: s("size"),
            metric: s("metric"),
            median: v.get("median")?.as_f64()?,
            unit: s("unit"),
            target: s("target"),
            pass: v.get("pass").and_then(Value::as_bool),
            note: s("note"),
        })
    }
}

/// Emits one row from a child process (parsed by the parent).
fn emit(row: Row) {
    println!("ROW {}", row.to_json());
    let _ = std::io::stdout().flush();
}

#[allow(clippy::too_many_arguments)]
fn row(
    scenario: &str,
    size: impl Into<String>,
    metric: &str,
    median: f64,
    unit: &str,
    target: &str,
    pass: Option<bool>,
    note: impl Into<String>,
) -> Row {
    Row {
        scenario: scenario.into(),
        size: size.into(),
        metric: metric.into(),
        median,
        unit: unit.into(),
        target: target.into(),
        pass,
        note: note.into(),
    }
}

fn median(values: &mut [f64]) -> f64 {
    percentile(values, 50.0)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_string();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "model": model,
        "mem_gib": (mem_kib as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        "loadavg": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

// ---------------------------------------------------------------------------------------------
// The synthetic cluster, as API-server JSON

const PODS_PER_SERVICE: usize = 10;

#[derive(Clone, Copy, Debug)]
struct Spec {
    pods: usize,
    services: usize,
    policies: usize,
    nodes: usize,
    namespaces: usize,
}

impl Spec {
    fn new(pods: usize) -> Spec {
        Spec {
            pods,
            services: (pods / PODS_PER_SERVICE).max(1),
            policies: (pods / 100).max(1),
            nodes: (pods / 100).clamp(3, 1000),
            namespaces: (pods / 2000).clamp(2, 50),
        }
    }

    fn label(&self) -> String {
        format!(
            "{}p/{}s/{}ap/{}n",
            short(self.pods),
            short(self.services),
            short(self.policies),
            short(self.nodes)
        )
    }

    fn namespace_of_service(&self, s: usize) -> String {
        format!("team-{}", s % self.namespaces)
    }
}

fn short(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn ipv4(base: u32, i: usize) -> String {
    std::net::Ipv4Addr::from(base + i as u32).to_string()
}

fn namespace_json(spec: &Spec, i: usize) -> Value {
    let _ = spec;
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": format!("team-{i}"), "uid": format!("ns-{i}"),
        "labels": {"istio.io/dataplane-mode": "ambient", "kubernetes.io/metadata.name": format!("team-{i}")}
    }})
}

fn node_json(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": format!("node-{i}"),
        "labels": {
            "kubernetes.io/hostname": format!("node-{i}"),
            "topology.kubernetes.io/region": "us-east1",
            "topology.kubernetes.io/zone": format!("us-east1-{}", ["b", "c", "d"][i % 3]),
        }
    }})
}

fn service_json(spec: &Spec, s: usize) -> Value {
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

fn pod_json(spec: &Spec, i: usize, ready: bool) -> Value {
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

fn policy_json(spec: &Spec, p: usize) -> Value {
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

/// The cluster as serialised JSON documents, one per object, in load order.
fn cluster_json(spec: &Spec) -> Vec<Vec<u8>> {
    let mut docs = Vec::with_capacity(spec.pods + spec.services + spec.policies + spec.nodes);
    let mut push = |v: Value| docs.push(serde_json::to_vec(&v).expect("serialise"));
    for i in 0..spec.namespaces {
        push(namespace_json(spec, i));
    }
    for i in 0..spec.nodes {
        push(node_json(i));
    }
    for s in 0..spec.services {
        push(service_json(spec, s));
    }
    for p in 0..spec.policies {
        push(policy_json(spec, p));
    }
    for i in 0..spec.pods {
        push(pod_json(spec, i, true));
    }
    docs
}

fn decode_one(value: Value) -> Object {
    match decode(value).pop() {
        Some(Decoded::Object(object)) => object,
        other => panic!("synthetic object did not decode: {other:?}"),
    }
}

#[derive(Debug, Clone, Copy)]
struct Breakdown {
    parse: Duration,
    decode: Duration,
    index: Duration,
    snapshot: Duration,
    /// `Index::reset` time per kind, in load order.
    kinds: [(Kind, Duration); 5],
}

impl Breakdown {
    fn total(&self) -> Duration {
        self.parse + self.decode + self.index + self.snapshot
    }
}

/// Raw JSON bytes -> `Value` -> decoded objects -> `Index` (every resource encoded) -> snapshot.
fn build(docs: &[Vec<u8>]) -> (Index, Arc<Snapshot>, Breakdown) {
    let mut b = Breakdown {
        parse: Duration::ZERO,
        decode: Duration::ZERO,
        index: Duration::ZERO,
        snapshot: Duration::ZERO,
        kinds: [(Kind::Namespace, Duration::ZERO); 5],
    };
    let t = Instant::now();
    let values: Vec<Value> = docs
        .iter()
        .map(|d| serde_json::from_slice(d).expect("parse"))
        .collect();
    b.parse = t.elapsed();
    let t = Instant::now();
    let mut by_kind: BTreeMap<usize, (Kind, Vec<Object>)> = BTreeMap::new();
    for value in values {
        let object = decode_one(value);
        let kind = object.kind();
        let order = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(99);
        by_kind
            .entry(order)
            .or_insert_with(|| (kind, Vec::new()))
            .1
            .push(object);
    }
    b.decode = t.elapsed();
    let t = Instant::now();
    let mut index = Index::new(Settings::default());
    for (slot, (_, (kind, objects))) in by_kind.into_iter().enumerate() {
        let t = Instant::now();
        index.reset(kind, objects);
        if let Some(k) = b.kinds.get_mut(slot) {
            *k = (kind, t.elapsed());
        }
    }
    b.index = t.elapsed();
    let t = Instant::now();
    let snapshot = index.snapshot();
    b.snapshot = t.elapsed();
    (index, snapshot, b)
}

/// The messages behind every resource of a snapshot, decoded back from their bytes.
fn messages(snapshot: &Snapshot) -> (Vec<Address>, Vec<Authorization>) {
    let addresses = snapshot
        .addresses
        .values()
        .map(|r| Address::decode(r.any.value.clone()).expect("Address"))
        .collect();
    let authorizations = snapshot
        .authorizations
        .values()
        .map(|r| Authorization::decode(r.any.value.clone()).expect("Authorization"))
        .collect();
    (addresses, authorizations)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn runs(o: &Opts) -> usize {
    if o.quick { 2 } else { 5 }
}

// ---------------------------------------------------------------------------------------------
// T1 cold build, T2 memory per pod, T3 one pod change (pure)

fn t1(o: &Opts) {
    let spec = Spec::new(if o.quick { 10_000 } else { 100_000 });
    // The issue fixes T1 at 10k services and 1k policies for 100k pods; Spec::new gives that.
    eprintln!("T1: generating {}", spec.label());
    let docs = cluster_json(&spec);
    let bytes: usize = docs.iter().map(Vec::len).sum();
    let mut totals = Vec::new();
    let mut parts: Vec<Breakdown> = Vec::new();
    let mut prost = Vec::new();
    let mut resources = 0;
    for run in 0..runs(o) {
        let (index, snapshot, b) = build(&docs);
        eprintln!("T1 run {run}: {:.0} ms", ms(b.total()));
        totals.push(ms(b.total()));
        parts.push(b);
        resources = snapshot.addresses.len() + snapshot.authorizations.len();
        if run == 0 || !o.quick {
            let (addresses, authorizations) = messages(&snapshot);
            let t = Instant::now();
            let mut n = 0usize;
            for a in &addresses {
                n += std::hint::black_box(a.encode_to_vec()).len();
            }
            for a in &authorizations {
                n += std::hint::black_box(a.encode_to_vec()).len();
            }
            prost.push(ms(t.elapsed()));
            std::hint::black_box(n);
        }
        drop((index, snapshot));
    }
    let med = median(&mut totals.clone());
    let part = |f: fn(&Breakdown) -> Duration| {
        median(&mut parts.iter().map(|b| ms(f(b))).collect::<Vec<_>>())
    };
    let prost_ms = median(&mut prost);
    let per_kind: Vec<String> = (0..5)
        .map(|slot| {
            let kind = parts[0].kinds[slot].0;
            let t = median(
                &mut parts
                    .iter()
                    .map(|b| ms(b.kinds[slot].1))
                    .collect::<Vec<_>>(),
            );
            format!("{kind:?} {t:.0}")
        })
        .collect();
    let full_size = spec.pods == 100_000;
    emit(row(
        "T1",
        spec.label(),
        "cold build: JSON -> snapshot",
        med,
        "ms",
        "< 2000 ms (100k)",
        full_size.then_some(med < 2000.0),
        format!(
            "parse {:.0} / decode {:.0} / index+encode {:.0} ({}) / publish {:.1} ms; {} resources, {:.0} MB JSON; raw prost encode {:.1} ms = {:.1}% of the build ({:.0}x)",
            part(|b| b.parse),
            part(|b| b.decode),
            part(|b| b.index),
            per_kind.join(", "),
            part(|b| b.snapshot),
            resources,
            bytes as f64 / 1e6,
            prost_ms,
            prost_ms / med * 100.0,
            med / prost_ms
        ),
    ));
}

fn t2(o: &Opts) {
    let spec = Spec::new(if o.quick { 10_000 } else { 100_000 });
    eprintln!("T2: generating {}", spec.label());
    let docs = cluster_json(&spec);
    let before = rss_bytes();
    let (index, snapshot, _) = build(&docs);
    let after = rss_bytes();
    let per_pod = (after.saturating_sub(before)) as f64 / spec.pods as f64;
    emit(row(
        "T2",
        spec.label(),
        "RSS delta / pods (index + snapshot, all objects)",
        per_pod,
        "B",
        "<= 1024 B",
        Some(per_pod <= 1024.0),
        format!(
            "RSS {:.0} -> {:.0} MB, {} Address resources; one sample (own process)",
            before as f64 / 1e6,
            after as f64 / 1e6,
            snapshot.addresses.len()
        ),
    ));
    drop((index, snapshot, docs));
}

/// Pre-decoded (ready, not ready) variants of a few pods, so a timed step holds no JSON work.
fn flips(spec: &Spec, count: usize) -> Vec<(Object, Object)> {
    (0..count)
        .map(|k| {
            let i = (k * 7919 + 13) % spec.pods;
            (
                decode_one(pod_json(spec, i, true)),
                decode_one(pod_json(spec, i, false)),
            )
        })
        .collect()
}

fn t3(o: &Opts) {
    let sizes: &[usize] = if o.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let iterations = if o.quick { 2_000 } else { 20_000 };
    for &pods in sizes {
        let spec = Spec::new(pods);
        let docs = cluster_json(&spec);
        let (mut index, _, _) = build(&docs);
        drop(docs);
        let pairs = flips(&spec, 64);
        let mut ready = vec![true; pairs.len()];
        let mut times = Vec::with_capacity(iterations);
        let mut encode_times = Vec::new();
        let mut sizes_seen = Vec::new();
        for n in 0..iterations {
            let k = n % pairs.len();
            ready[k] = !ready[k];
            let object = if ready[k] {
                pairs[k].0.clone()
            } else {
                pairs[k].1.clone()
            };
            let t = Instant::now();
            let changes = index.apply(object);
            let snapshot = index.snapshot();
            let elapsed = t.elapsed();
            times.push(elapsed.as_secs_f64() * 1e6);
            assert_eq!(changes.addresses.upserted.len(), 1, "one workload changed");
            if n % 16 == 0 {
                let name = changes.addresses.upserted.iter().next().expect("name");
                let resource = snapshot.addresses.get(name).expect("resource");
                sizes_seen.push(resource.any.value.len() as f64);
                let message = Address::decode(resource.any.value.clone()).expect("Address");
                let t = Instant::now();
                std::hint::black_box(message.encode_to_vec());
                encode_times.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        // A no-op update: the same object again.
        let k = 0;
        let same = if ready[k] {
            pairs[k].0.clone()
        } else {
            pairs[k].1.clone()
        };
        let noop = index.apply(same);
        let p99 = percentile(&mut times.clone(), 99.0);
        let med = median(&mut times);
        let prost = median(&mut encode_times);
        emit(row(
            "T3",
            spec.label(),
            "one pod change: apply + encode + publish",
            med,
            "µs",
            "< 20 µs, flat",
            Some(med < 20.0),
            format!(
                "p99 {p99:.1} µs over {iterations}; raw prost encode of that Workload {prost:.2} µs ({:.0}x); Workload {:.0} B; no-op update -> empty Changes: {}",
                med / prost,
                median(&mut sizes_seen),
                noop.is_empty()
            ),
        ));
        assert!(noop.is_empty(), "a no-op update produced changes");
    }
}

// ---------------------------------------------------------------------------------------------
// Served scenarios: an Index-backed AdsServer on 127.0.0.1 and ztunnel-shaped clients

struct Server {
    address: std::net::SocketAddr,
    publish: watch::Sender<Option<Arc<Snapshot>>>,
    stop: CancellationToken,
}

async fn serve(snapshot: Arc<Snapshot>) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr");
    let (publish, snapshots) = watch::channel(Some(snapshot));
    let ads = AdsServer::new(
        snapshots,
        Arc::new(Registry::default()),
        Arc::new(Metrics::new()),
    )
    .into_service();
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(ads)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), token.cancelled_owned())
            .await;
    });
    Server {
        address,
        publish,
        stop,
    }
}

/// Publishes the index's next snapshot, stamped as the server's own indexer does.
fn publish(server: &Server, index: &mut Index) {
    let mut snapshot = index.snapshot();
    if let Some(s) = Arc::get_mut(&mut snapshot) {
        s.published_at = Some(Instant::now());
    }
    server.publish.send_replace(Some(snapshot));
}

fn ztunnel_node(n: usize) -> Node {
    let string = |s: String| PbValue {
        kind: Some(PbKind::StringValue(s)),
    };
    let mut fields = BTreeMap::new();
    fields.insert("NAME".to_string(), string(format!("ztunnel-{n}")));
    fields.insert("NAMESPACE".to_string(), string("istio-system".into()));
    fields.insert("INSTANCE_IPS".to_string(), string(ipv4(0x0af0_0000, n)));
    fields.insert("NODE_NAME".to_string(), string(format!("node-{n}")));
    fields.insert("CLUSTER_ID".to_string(), string("Kubernetes".into()));
    Node {
        id: format!(
            "ztunnel~{}~ztunnel-{n}.istio-system~istio-system.svc.cluster.local",
            ipv4(0x0af0_0000, n)
        ),
        cluster: String::new(),
        metadata: Some(Struct { fields }),
    }
}

/// Versions a client already holds: [Address, Authorization], `{name: version}`.
type Known = [BTreeMap<String, String>; 2];

struct Client {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
    /// Response bytes received (protobuf-encoded size, without gRPC/HTTP2 framing).
    bytes: usize,
}

impl Client {
    /// Connects (one HTTP/2 connection per client, as each ztunnel has), subscribes to both
    /// types wildcard with `known` versions, and waits for both initial responses (ACKed).
    async fn sync(
        address: std::net::SocketAddr,
        n: usize,
        known: &Known,
    ) -> anyhow::Result<(Client, [DeltaDiscoveryResponse; 2])> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
            .connect_timeout(WAIT)
            .connect()
            .await?;
        let mut grpc = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(512 * 1024 * 1024);
        let (requests, rx) = mpsc::channel(16);
        requests
            .send(DeltaDiscoveryRequest {
                node: Some(ztunnel_node(n)),
                type_url: ADDRESS_TYPE.to_string(),
                initial_resource_versions: known[0].clone().into_iter().collect(),
                ..Default::default()
            })
            .await?;
        requests
            .send(DeltaDiscoveryRequest {
                node: Some(ztunnel_node(n)),
                type_url: AUTHORIZATION_TYPE.to_string(),
                initial_resource_versions: known[1].clone().into_iter().collect(),
                ..Default::default()
            })
            .await?;
        let responses = tokio::time::timeout(
            WAIT,
            grpc.delta_aggregated_resources(ReceiverStream::new(rx)),
        )
        .await??
        .into_inner();
        let mut client = Client {
            requests,
            responses,
            bytes: 0,
        };
        let mut initial: [Option<DeltaDiscoveryResponse>; 2] = [None, None];
        while initial.iter().any(Option::is_none) {
            let response = client.recv().await?;
            client.ack(&response).await?;
            let slot = usize::from(response.type_url == AUTHORIZATION_TYPE);
            if initial[slot].is_none() {
                initial[slot] = Some(response);
            }
        }
        let [a, b] = initial;
        Ok((client, [a.expect("Address"), b.expect("Authorization")]))
    }

    async fn recv(&mut self) -> anyhow::Result<DeltaDiscoveryResponse> {
        match tokio::time::timeout(WAIT, self.responses.message()).await {
            Err(_) => anyhow::bail!("no response within {WAIT:?}"),
            Ok(Err(status)) => anyhow::bail!("stream failed: {status}"),
            Ok(Ok(None)) => anyhow::bail!("stream ended"),
            Ok(Ok(Some(response))) => {
                self.bytes += response.encoded_len();
                Ok(response)
            }
        }
    }

    async fn ack(&self, response: &DeltaDiscoveryResponse) -> anyhow::Result<()> {
        self.requests
            .send(DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }
}

/// Connects `count` clients, `parallel` at a time. Returns them and the time taken.
async fn connect_all(
    address: std::net::SocketAddr,
    count: usize,
    parallel: usize,
    known: &Known,
) -> (Vec<Client>, Duration) {
    let t = Instant::now();
    let clients: Vec<Client> = futures::stream::iter(0..count)
        .map(|n| async move { Client::sync(address, n, known).await })
        .buffer_unordered(parallel)
        .filter_map(|r| async move {
            match r {
                Ok((c, _)) => Some(c),
                Err(e) => {
                    eprintln!("client failed: {e:#}");
                    None
                }
            }
        })
        .collect()
        .await;
    (clients, t.elapsed())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What one stream saw for one response: (stream, arrival, bytes, names).
type Arrival = (usize, Instant, usize, Vec<String>);

/// T4 and T5 over `streams` streams: returns (last-stream latencies ms, per-stream latencies ms,
/// bytes per response per stream).
async fn events_to_streams(
    pods: usize,
    streams: usize,
    events: usize,
) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>, Duration)> {
    let spec = Spec::new(pods);
    let docs = cluster_json(&spec);
    let (mut index, snapshot, _) = build(&docs);
    drop(docs);
    let server = serve(snapshot).await;
    let (clients, connect_time) = connect_all(server.address, streams, 64, &Known::default()).await;
    if clients.len() < streams {
        eprintln!("only {} of {streams} streams connected", clients.len());
    }
    let connected = clients.len();
    eprintln!("  {connected} streams synced in {connect_time:.1?}");
    let (tx, mut rx) = mpsc::unbounded_channel::<Arrival>();
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (id, mut client) in clients.into_iter().enumerate() {
        let tx = tx.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = stop.cancelled() => return,
                    m = client.responses.message() => m,
                };
                let Ok(Some(response)) = message else { return };
                let at = Instant::now();
                let bytes = response.encoded_len();
                let names = response.resources.iter().map(|r| r.name.clone()).collect();
                if client.ack(&response).await.is_err() {
                    return;
                }
                if tx.send((id, at, bytes, names)).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let pairs = flips(&spec, events.max(1));
    let mut last = Vec::new();
    let mut each = Vec::new();
    let mut bytes = Vec::new();
    for e in 0..events {
        let changes = index.apply(pairs[e % pairs.len()].1.clone());
        let Some(name) = changes.addresses.upserted.iter().next().cloned() else {
            continue;
        };
        let t0 = Instant::now();
        publish(&server, &mut index);
        let mut got = vec![false; connected];
        let mut count = 0;
        let mut latest = t0;
        let deadline = tokio::time::Instant::now() + WAIT;
        while count < connected {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((id, at, b, names))) => {
                    if names.contains(&name) && !got[id] {
                        got[id] = true;
                        count += 1;
                        latest = latest.max(at);
                        each.push(ms(at.duration_since(t0)));
                        bytes.push(b as f64);
                    }
                }
                _ => {
                    eprintln!("  event {e}: only {count} of {connected} streams within {WAIT:?}");
                    break;
                }
            }
        }
        last.push(ms(latest.duration_since(t0)));
        // Restore the pod outside the measured window, and let the streams drain it.
        index.apply(pairs[e % pairs.len()].0.clone());
        publish(&server, &mut index);
        tokio::time::sleep(Duration::from_millis(if streams > 200 { 200 } else { 50 })).await;
        while rx.try_recv().is_ok() {}
    }
    stop.cancel();
    server.stop.cancel();
    tasks.shutdown().await;
    Some((last, each, bytes, connect_time))
}

fn t4(o: &Opts) {
    let rt = runtime();
    let pods = 1_000;
    let cases: &[(usize, f64)] = if o.quick {
        &[(100, 10.0)]
    } else {
        &[(100, 10.0), (1_000, 50.0)]
    };
    let events = if o.quick { 10 } else { 40 };
    for &(streams, target) in cases {
        eprintln!("T4: {streams} streams, {pods} pods");
        let Some((mut last, mut each, _, connect)) =
            rt.block_on(events_to_streams(pods, streams, events))
        else {
            continue;
        };
        let p99 = percentile(&mut last.clone(), 99.0);
        let p50 = median(&mut last);
        let each_p50 = median(&mut each.clone());
        let each_p99 = percentile(&mut each, 99.0);
        emit(row(
            "T4",
            format!("{streams} streams, {}", Spec::new(pods).label()),
            "event -> last stream has it, p99",
            p99,
            "ms",
            &format!("p99 < {target} ms"),
            Some(p99 < target),
            format!(
                "last-stream p50 {p50:.2} ms over {events} events; any stream p50 {each_p50:.2} / p99 {each_p99:.2} ms; clients in the same process; initial sync of all streams {connect:.1?}"
            ),
        ));
    }
}

fn t5(o: &Opts) {
    let rt = runtime();
    let sizes: &[usize] = if o.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 100_000]
    };
    for &pods in sizes {
        eprintln!("T5: {pods} pods, 10 streams");
        let Some((_, _, mut bytes, _)) = rt.block_on(events_to_streams(pods, 10, 20)) else {
            continue;
        };
        let med = median(&mut bytes);
        emit(row(
            "T5",
            format!("10 streams, {}", Spec::new(pods).label()),
            "bytes per single-pod change per stream",
            med,
            "B",
            "<= 400 B, flat",
            Some(med <= 400.0),
            "DeltaDiscoveryResponse encoded size (gRPC adds 5 B, HTTP/2 9 B per frame)",
        ));
    }
}

fn t6(o: &Opts) {
    let rt = runtime();
    let cases: &[(usize, usize)] = if o.quick {
        &[(1_000, 50)]
    } else {
        &[(10_000, 1_000), (100_000, 100)]
    };
    for &(pods, clients) in cases {
        eprintln!("T6: {clients} clients reconnecting to {pods} pods");
        let spec = Spec::new(pods);
        let docs = cluster_json(&spec);
        let (_index, snapshot, _) = build(&docs);
        drop(docs);
        let mut times = Vec::new();
        let mut sent = Vec::new();
        let mut full_bytes = 0usize;
        let mut ok = clients;
        rt.block_on(async {
            let server = serve(snapshot).await;
            let Ok((first, initial)) = Client::sync(server.address, 0, &Known::default()).await
            else {
                eprintln!("T6: first client failed");
                return;
            };
            full_bytes = first.bytes;
            drop(first);
            let known: Known = initial.map(|response| {
                response
                    .resources
                    .iter()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect()
            });
            for _ in 0..runs(o).min(3) {
                // All at once (ztunnels after a control-plane restart), up to 1,000 in flight.
                let (connected, elapsed) =
                    connect_all(server.address, clients, clients.min(1000), &known).await;
                ok = ok.min(connected.len());
                times.push(ms(elapsed));
                sent.push(connected.iter().map(|c| c.bytes).sum::<usize>() as f64);
                drop(connected);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            server.stop.cancel();
        });
        let med = median(&mut times);
        let bytes = median(&mut sent);
        emit(row(
            "T6",
            format!("{clients} clients, {}", spec.label()),
            "reconnect storm: all synced (unchanged versions)",
            med,
            "ms",
            "< 30000 ms (1k clients, 100k pods)",
            (pods == 100_000 && clients == 1_000).then_some(med < 30_000.0 && ok == clients),
            format!(
                "{ok}/{clients} synced; server sent {:.0} B in all ({:.0} B per client) vs {:.1} MB for one full initial sync",
                bytes,
                bytes / clients as f64,
                full_bytes as f64 / 1e6
            ),
        ));
    }
}

fn t7(o: &Opts) {
    let streams = if o.quick { 200 } else { 10_000 };
    // `SCALE_T7_PODS` sets the served state's size (default 100 pods), to separate per-stream
    // state that grows with the resources sent from the fixed cost of a connection.
    let pods = std::env::var("SCALE_T7_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rt = runtime();
    let spec = Spec::new(pods);
    let docs = cluster_json(&spec);
    let (_index, snapshot, _) = build(&docs);
    drop(docs);
    let result = rt.block_on(async {
        let server = serve(snapshot).await;
        // Warm up the server's paths with a few streams in this process, then measure.
        let (warm, _) = connect_all(server.address, 4, 4, &Known::default()).await;
        drop(warm);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = rss_bytes();
        let exe = std::env::current_exe().expect("exe");
        let mut child = Command::new(exe)
            .args([
                "--clients",
                &server.address.to_string(),
                &streams.to_string(),
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn clients");
        let stdout = child.stdout.take().expect("stdout");
        let ready = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            line
        });
        let line = tokio::time::timeout(Duration::from_secs(300), ready)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let connected: usize = line
            .strip_prefix("READY ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_bytes();
        let _ = child.kill();
        let _ = child.wait();
        server.stop.cancel();
        (before, after, connected)
    });
    let (before, after, connected) = result;
    let per = after.saturating_sub(before) as f64 / connected.max(1) as f64;
    emit(row(
        "T7",
        format!("{connected} of {streams} idle streams, {}", spec.label()),
        "server RSS delta / idle stream",
        per / 1024.0,
        "KiB",
        "<= 16 KiB (10k streams)",
        Some(connected > 0 && per <= 16.0 * 1024.0),
        format!(
            "one connection per stream; clients in a separate process; server RSS {:.0} -> {:.0} MB",
            before as f64 / 1e6,
            after as f64 / 1e6
        ),
    ));
}

/// The T7 client process: connects `count` streams, prints `READY n`, and holds them until
/// stdin closes or 10 minutes pass.
fn clients_process(address: &str, count: usize) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    rt.block_on(async {
        let (clients, elapsed) = connect_all(address, count, 64, &Known::default()).await;
        eprintln!(
            "  T7 clients: {} streams synced in {elapsed:.1?}",
            clients.len()
        );
        println!("READY {}", clients.len());
        let _ = std::io::stdout().flush();
        let stdin = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {}
        });
        let _ = tokio::time::timeout(Duration::from_secs(600), stdin).await;
        drop(clients);
    });
}

// ---------------------------------------------------------------------------------------------
// Driver

fn run_child(name: &str, o: &Opts) {
    match name {
        "T1" => t1(o),
        "T2" => t2(o),
        "T3" => t3(o),
        "T4" => t4(o),
        "T5" => t5(o),
        "T6" => t6(o),
        "T7" => t7(o),
        other => eprintln!("unknown scenario {other}"),
    }
}

/// Runs one scenario in a child process (bounded by `limit`) and returns its rows.
fn spawn_scenario(name: &str, o: &Opts, limit: Duration) -> Vec<Row> {
    let exe = std::env::current_exe().expect("exe");
    let mut args = vec!["--child".to_string(), name.to_string()];
    if o.quick {
        args.push("--quick".into());
    }
    let mut child = match Command::new(exe).args(&args).stdout(Stdio::piped()).spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: spawn failed: {e}");
            return Vec::new();
        }
    };
    let stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                l.strip_prefix("ROW ")
                    .and_then(|j| serde_json::from_str::<Value>(j).ok())
            })
            .filter_map(|v| Row::from_json(&v))
            .collect::<Vec<_>>()
    });
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    eprintln!("{name}: exited with {status}");
                }
                break;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                eprintln!("{name}: over its {limit:?} limit; stopped");
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
        }
    }
    reader.join().unwrap_or_default()
}

fn main() {
    let o = opts();
    if let Some((address, count)) = &o.clients {
        clients_process(address, *count);
        return;
    }
    if let Some(name) = &o.child {
        run_child(name, &o);
        return;
    }
    let machine = machine();
    eprintln!(
        "machine: {} x {}, {} GiB, load {}{}",
        machine["nproc"],
        machine["model"].as_str().unwrap_or(""),
        machine["mem_gib"],
        machine["loadavg"].as_str().unwrap_or(""),
        if o.quick { " (quick)" } else { "" }
    );
    let limit = Duration::from_secs(if o.quick { 120 } else { 900 });
    let mut rows = Vec::new();
    for name in SCENARIOS {
        if !o.only.is_empty() && !o.only.iter().any(|s| s == name) {
            continue;
        }
        let started = Instant::now();
        let got = spawn_scenario(name, &o, limit);
        eprintln!("{name} done in {:.1?}", started.elapsed());
        for r in &got {
            eprintln!(
                "  {} {} {}: {:.2} {} ({})",
                r.scenario, r.size, r.metric, r.median, r.unit, r.note
            );
        }
        rows.extend(got);
    }
    if o.json {
        let out = json!({
            "machine": machine,
            "quick": o.quick,
            "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("serialise"));
        return;
    }
    println!(
        "\nmachine: nproc {}, {}, {} GiB, load {}",
        machine["nproc"],
        machine["model"].as_str().unwrap_or(""),
        machine["mem_gib"],
        machine["loadavg"].as_str().unwrap_or("")
    );
    println!(
        "{:<4} {:<36} {:<48} {:>12} {:<24} {:<5}",
        "", "size", "metric", "median", "target", "pass"
    );
    for r in &rows {
        let pass = match r.pass {
            Some(true) => "pass",
            Some(false) => "FAIL",
            None => "-",
        };
        println!(
            "{:<4} {:<36} {:<48} {:>9.2} {:<3} {:<24} {:<5}",
            r.scenario, r.size, r.metric, r.median, r.unit, r.target, pass
        );
        println!("       {}", r.note);
    }
}
