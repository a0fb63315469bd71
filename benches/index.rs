//! Index micro-benchmarks (targets in BENCHMARKS.md):
//! - `pod_update/N`: one pod update applied to an index holding N pods (and N/10 services),
//!   through to encoded bytes and a published snapshot. Target: < 20 µs, flat across sizes.
//! - `cold_build/100000`: 100k pods and 10k services from reduced objects to an encoded
//!   snapshot. Target: < 1 s.
//!
//! Run: `cargo bench --bench index` (add `-- pod_update` or `-- cold_build` to pick one).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use ambientd::discovery::model::{
    ContainerPort, IpFamily, Kind, Labels, Namespace, Node, Object, Owner, Pod, PodFields,
    Protocol, Service, ServicePort, TargetPort,
};
use ambientd::discovery::{Index, Settings};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

// The allocator the binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PODS_PER_SERVICE: usize = 10;
const NAMESPACES: usize = 20;
const NODES: usize = 100;

fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn ip(base: u32, i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(base + i as u32))
}

fn namespace(i: usize) -> String {
    format!("team-{}", i % NAMESPACES)
}

fn pod(i: usize, ready: bool) -> Pod {
    let app = format!("app-{}", i / PODS_PER_SERVICE);
    let hash = format!("{:010x}", i / PODS_PER_SERVICE);
    PodFields {
        name: format!("{app}-{hash}-{i:05}"),
        uid: format!("00000000-0000-0000-0000-{i:012}"),
        namespace: namespace(i / PODS_PER_SERVICE),
        generate_name: format!("{app}-{hash}-"),
        labels: labels(&[
            ("app", app.clone()),
            ("version", "v1".into()),
            ("pod-template-hash", hash.clone()),
        ]),
        annotations: labels(&[("ambient.istio.io/redirection", "enabled".into())]),
        owner: Some(Owner {
            kind: "ReplicaSet".into(),
            name: format!("{app}-{hash}"),
        }),
        terminating: false,
        phase: "Running".into(),
        ready,
        ips: vec![ip(0x0a00_0000, i)],
        service_account: app,
        node_name: format!("node-{}", i % NODES),
        host_network: false,
        ports: vec![ContainerPort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp,
        }],
    }
    .into()
}

fn service(s: usize) -> Service {
    let app = format!("app-{s}");
    Service {
        name: app.clone(),
        namespace: namespace(s),
        labels: labels(&[("app", app.clone())]),
        cluster_ips: vec![ip(0x0a60_0000, s)],
        ports: vec![
            ServicePort {
                name: "http".into(),
                port: 80,
                target_port: TargetPort::Name("http".into()),
                protocol: Protocol::Tcp,
                app_protocol: None,
            },
            ServicePort {
                name: "grpc".into(),
                port: 9090,
                target_port: TargetPort::Number(9090),
                protocol: Protocol::Tcp,
                app_protocol: None,
            },
        ],
        selector: labels(&[("app", app)]),
        ip_families: vec![IpFamily::V4],
        ..Default::default()
    }
}

/// The reduced objects of a cluster with `pods` pods and one service per 10 pods.
fn cluster(pods: usize) -> Vec<(Kind, Vec<Object>)> {
    let namespaces = (0..NAMESPACES)
        .map(|i| {
            Object::Namespace(Namespace {
                name: namespace(i),
                ..Default::default()
            })
        })
        .collect();
    let nodes = (0..NODES)
        .map(|i| {
            Object::Node(Node {
                name: format!("node-{i}"),
                labels: labels(&[
                    ("topology.kubernetes.io/region", "r1".into()),
                    ("topology.kubernetes.io/zone", format!("z{}", i % 3)),
                ]),
            })
        })
        .collect();
    let services = (0..pods / PODS_PER_SERVICE)
        .map(|s| Object::Service(service(s)))
        .collect();
    let pod_objects = (0..pods).map(|i| Object::Pod(pod(i, true))).collect();
    vec![
        (Kind::Namespace, namespaces),
        (Kind::Node, nodes),
        (Kind::Service, services),
        (Kind::Pod, pod_objects),
    ]
}

fn build(pods: usize) -> Index {
    let mut index = Index::new(Settings::default());
    for (kind, objects) in cluster(pods) {
        index.reset(kind, objects);
    }
    index.snapshot();
    index
}

fn pod_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("pod_update");
    for pods in [1_000, 10_000, 100_000] {
        let mut index = build(pods);
        let mut ready = true;
        let mut i = 0usize;
        group.bench_function(pods.to_string(), |b| {
            b.iter(|| {
                // Flip one pod's readiness: one Workload re-encoded and published.
                ready = !ready;
                i = (i + 7919) % pods;
                let changes = index.apply(Object::Pod(pod(i, ready)));
                debug_assert_eq!(changes.addresses.upserted.len(), 1);
                black_box(index.snapshot());
            })
        });
    }
    group.finish();
}

fn cold_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("cold_build");
    group.sample_size(10);
    let pods = 100_000;
    group.bench_function(pods.to_string(), |b| {
        b.iter_batched(
            || cluster(pods),
            |objects| {
                let mut index = Index::new(Settings::default());
                for (kind, objects) in objects {
                    index.reset(kind, objects);
                }
                let snapshot = index.snapshot();
                // Returned so that tearing the index down happens outside the measurement.
                (index, snapshot)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, pod_update, cold_build);
criterion_main!(benches);
