//! Kubernetes ingest benchmark (targets in BENCHMARKS.md): 100k Pod objects as raw API-server
//! JSON, through kube-rs's watcher, our reduction and the index, to a published snapshot.
//!
//! Two paths, each from a fresh process state:
//! - `list`: the pods exist before ambientd starts; it lists them (pages of 500, as kube's
//!   watcher asks) and is ready when the first snapshot holds every workload.
//! - `watch`: ambientd starts on an empty cluster; the pods arrive as 100k `ADDED` watch
//!   events (a backlog staged in the fake, then released) until the snapshot holds them all.
//!
//! The API server is the fake from tests/it/support/kube, run in a child process (so the RSS is
//! ambientd's alone) over real HTTP on 127.0.0.1; it serves pre-serialised bytes, so its own cost
//! is small but not zero (it shares the machine). Reports pods/s and memory per pod (RSS growth /
//! pods).
//!
//! Run: `cargo bench --bench kube_ingest` (`-- --pods 100000 --mode list|watch|both|decode`,
//! `--debounce-ms N` to debounce the index's publications as `--debounce-after` does).

#[path = "../tests/it/support/kube/mod.rs"]
#[allow(dead_code, unused_imports)] // The integration tests use the rest of the fake.
mod kube_support;

/// The allocator the `ambientd` binary uses, so the figures are the binary's; with
/// `--features dhat-heap`, dhat's, to count the heap the watch path leaves live per pod (by
/// allocation site in `dhat-heap.json`).
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

use std::time::{Duration, Instant};

use ambientd::app;
use ambientd::config::Config;
use ambientd::kube::cluster::ClusterConfig;
use kube_support::FakeApiServer;
use serde_json::{Value, json};

const NAMESPACES: usize = 50;
const NODES: usize = 200;
const PODS_PER_APP: usize = 10;

/// A pod as a real API server returns it: managedFields, a projected token volume, status
/// with conditions and container statuses. About 4.5 KB of JSON.
fn pod(i: usize) -> Value {
    let app = format!("app-{}", i / PODS_PER_APP);
    let hash = format!("{:010x}", i / PODS_PER_APP);
    let ns = format!("team-{}", (i / PODS_PER_APP) % NAMESPACES);
    let name = format!("{app}-{hash}-{i:06}");
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    let node = format!("node-{}", i % NODES);
    let t = "2026-11-01T10:00:00Z";
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": format!("{app}-{hash}-"), "namespace": ns,
            "uid": format!("6f1c1d8e-0000-4000-8000-{i:012}"),
            "creationTimestamp": t,
            "labels": {"app": app, "version": "v1", "pod-template-hash": hash},
            "annotations": {"ambient.istio.io/redirection": "enabled"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("{app}-{hash}"), "uid": "7e9a7c1e-0000-4000-8000-000000000001",
                "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": t, "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {},
                        "f:pod-template-hash": {}, "f:version": {}},
                        "f:ownerReferences": {".": {}, "k:{\"uid\":\"7e9a7c1e\"}": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:image": {},
                        "f:imagePullPolicy": {}, "f:name": {}, "f:ports": {".": {},
                        "k:{\"containerPort\":8080,\"protocol\":\"TCP\"}": {".": {},
                        "f:containerPort": {}, "f:name": {}, "f:protocol": {}}},
                        "f:resources": {}, "f:terminationMessagePath": {}}},
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                        "f:schedulerName": {}, "f:securityContext": {}, "f:serviceAccount": {},
                        "f:serviceAccountName": {}, "f:terminationGracePeriodSeconds": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": t,
                 "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {
                    "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {},
                        "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {},
                        "f:type": {}}}, "f:containerStatuses": {}, "f:hostIP": {},
                        "f:phase": {}, "f:podIP": {}, "f:podIPs": {".": {},
                        "k:{\"ip\":\"10.0.0.1\"}": {".": {}, "f:ip": {}}}, "f:startTime": {}}}},
                {"manager": "istio-cni", "operation": "Update", "apiVersion": "v1", "time": t,
                 "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {},
                    "f:ambient.istio.io/redirection": {}}}}}
            ]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ], "defaultMode": 420}}],
            "containers": [{
                "name": "main", "image": format!("registry.example.com/{app}:1.4.2"),
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                    "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "serviceAccountName": app, "serviceAccount": app,
            "nodeName": node, "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": t},
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": t},
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": t},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null, "lastTransitionTime": t},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": t}
            ],
            "hostIP": "172.18.0.2", "hostIPs": [{"ip": "172.18.0.2"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": t,
            "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": t}},
                "lastState": {}, "ready": true, "restartCount": 0,
                "image": format!("registry.example.com/{app}:1.4.2"),
                "imageID": "registry.example.com/app@sha256:4f1d8d8e1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5",
                "containerID": format!("containerd://{i:064x}"), "started": true}],
            "qosClass": "Burstable"
        }
    })
}

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

struct Figures {
    pods_per_second: f64,
    bytes_per_pod: f64,
    seconds: f64,
    /// CPU time this process used per pod (all threads, user + system), in µs: unlike the
    /// rate, it hardly depends on what else the machine runs.
    cpu_per_pod_us: f64,
}

/// CPU time used by this process so far (all threads, user + system), from /proc/self/stat.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let field = |n: usize| -> u64 {
        rest.split_whitespace()
            .nth(n)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the whole line (11 and 12 after the command),
    // in clock ticks of 10 ms.
    Duration::from_millis((field(11) + field(12)) * 10)
}

async fn wait_for_workloads(running: &app::Running, pods: usize) {
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(
        Duration::from_secs(600),
        snapshots.wait_for(|s| s.as_ref().is_some_and(|s| s.addresses.len() >= pods)),
    )
    .await
    .expect("ingest timed out")
    .expect("snapshots closed");
}

/// The fake API server, in a child process (this binary with `--serve-fake`) so that our RSS is
/// ambientd's alone. It talks over stdin/stdout: it prints `ready <url>` once serving (with the
/// pods in `list` mode); in `watch` mode it parks watch requests, and on `stage` waits for
/// ambientd's watches, writes the pods as history and prints `staged`, and on `release` lets
/// the watches replay it.
struct Child {
    process: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    url: String,
}

impl Child {
    fn spawn(mode: &str, pods: usize) -> Child {
        use std::io::BufRead;
        let mut process = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args(["--serve-fake", mode, &pods.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the fake API server");
        let stdout = process.stdout.take().expect("stdout");
        let mut lines = std::io::BufReader::new(stdout).lines();
        let first = lines.next().expect("fake said nothing").expect("read");
        let url = first
            .strip_prefix("ready ")
            .expect("ready line")
            .to_string();
        Child {
            process,
            lines,
            url,
        }
    }

    fn say(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.process.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to the fake");
        stdin.flush().expect("flush");
    }

    fn expect(&mut self, line: &str) {
        let got = self.lines.next().expect("fake ended").expect("read");
        assert_eq!(got, line);
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The child's side of [`Child`].
fn serve_fake(mode: &str, pods: usize) {
    use std::io::BufRead;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = FakeApiServer::start_with(kube_support::ambient_resources(), 1 << 18).await;
        if mode == "list" {
            for i in 0..pods {
                server.apply(pod(i));
            }
        } else {
            server.hold_watches(true);
        }
        println!("ready {}", server.url());
        let mut stdin = std::io::stdin().lock().lines();
        while let Some(Ok(line)) = stdin.next() {
            match line.as_str() {
                "stage" => {
                    while server.watches() < 11 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    for i in 0..pods {
                        server.apply(pod(i));
                    }
                    println!("staged");
                }
                "release" => server.hold_watches(false),
                _ => {}
            }
        }
    });
}

async fn run(mode: &str, pods: usize, debounce: Duration) -> Figures {
    let mut fake = Child::spawn(mode, pods);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\n",
            fake.url
        ),
    )
    .expect("kubeconfig");
    let cluster = ClusterConfig {
        kubeconfig: Some(kubeconfig),
        ..ClusterConfig::default()
    };
    let config = Config {
        debounce: ambientd::push::Debounce {
            after: debounce,
            max: debounce * 10,
        },
        ..Config::cluster(cluster)
    };
    // With `--features dhat-heap`: the heap each path leaves live (the app's start included).
    #[cfg(feature = "dhat-heap")]
    let profiler = dhat::Profiler::builder().trim_backtraces(None).build();
    #[cfg(feature = "dhat-heap")]
    let heap_before = dhat::HeapStats::get();
    let (before, started, running) = match mode {
        "list" => {
            let before = (rss(), cpu_time());
            let started = Instant::now();
            let running = app::start(config).await.expect("start");
            (before, started, running)
        }
        "watch" => {
            let running = app::start(config).await.expect("start");
            fake.say("stage");
            fake.expect("staged");
            let before = (rss(), cpu_time());
            let started = Instant::now();
            fake.say("release");
            (before, started, running)
        }
        other => panic!("unknown mode {other:?} (list, watch, decode)"),
    };
    wait_for_workloads(&running, pods).await;
    #[cfg(feature = "dhat-heap")]
    {
        let heap = dhat::HeapStats::get();
        println!(
            "{mode:>5}: heap (dhat) {:.0} B in {:.1} blocks live per pod",
            (heap.curr_bytes - heap_before.curr_bytes) as f64 / pods as f64,
            (heap.curr_blocks - heap_before.curr_blocks) as f64 / pods as f64,
        );
        drop(profiler);
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = cpu_time().saturating_sub(before.1);
    let grown = rss().saturating_sub(before.0);
    let generation = running
        .snapshots
        .borrow()
        .as_ref()
        .map_or(0, |s| s.generation);
    println!("{mode:>5}: {generation} snapshots published");
    running.stop().await;
    Figures {
        pods_per_second: pods as f64 / seconds,
        bytes_per_pod: grown as f64 / pods as f64,
        seconds,
        cpu_per_pod_us: cpu.as_secs_f64() * 1e6 / pods as f64,
    }
}

/// Where the time goes per pod, on one thread, no HTTP: parse, reduce, index.
fn decode_only(pods: usize) -> Figures {
    use ambientd::discovery::{Event, Index, Kind, Settings};
    use ambientd::kube::cluster::kinds::{Reduced, WatchedObject, reduce, watched_kinds};
    let lines: Vec<Vec<u8>> = (0..pods)
        .map(|i| serde_json::to_vec(&pod(i)).expect("json"))
        .collect();
    let pods_kind = watched_kinds()
        .into_iter()
        .find(|w| w.kind == Kind::Pod)
        .expect("pods");
    // One pod at a time, as the watcher does: parse, reduce, drop the parsed object.
    let (mut value_parse, mut parse, mut reduce_time) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut objects = Vec::with_capacity(pods);
    let held_before = rss();

    for line in &lines {
        let started = Instant::now();
        let value: Value = serde_json::from_slice(line).expect("parse");
        value_parse += started.elapsed();
        drop(value);
        let started = Instant::now();
        let object: WatchedObject = serde_json::from_slice(line).expect("parse");
        parse += started.elapsed();
        let started = Instant::now();
        match reduce(&pods_kind, object) {
            Reduced::Object(o) => objects.push(o),
            Reduced::Invalid(_, e) => panic!("{e}"),
        }
        reduce_time += started.elapsed();
    }
    // A deep copy lands in fresh memory, without the parse garbage interleaved: its RSS is
    // what the reduced pods themselves take.
    let copy_before = rss();
    let copy: Vec<ambientd::discovery::model::Pod> = objects
        .iter()
        .filter_map(|o| match o {
            ambientd::discovery::model::Object::Pod(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let reduced = rss().saturating_sub(copy_before);
    drop(copy);
    println!(
        "decode: size_of Pod {} B, Object {} B",
        std::mem::size_of::<ambientd::discovery::model::Pod>(),
        std::mem::size_of::<ambientd::discovery::model::Object>()
    );
    println!(
        "decode: (plain serde_json::Value parse {:.2} µs/pod); reduced pods: {:.0} B/pod (RSS of a copy; {:.0} with the parse garbage around them)",
        value_parse.as_secs_f64() * 1e6 / pods as f64,
        reduced as f64 / pods as f64,
        rss().saturating_sub(held_before) as f64 / pods as f64,
    );
    let before = rss();
    let started = Instant::now();
    let mut index = Index::new(Settings::default());
    index.handle(Event::Reset(Kind::Pod, objects));
    let snapshot = index.snapshot();
    let index_time = started.elapsed();
    let grown = rss().saturating_sub(before);
    assert_eq!(snapshot.addresses.len(), pods);

    let per = |d: Duration| d.as_secs_f64() * 1e6 / pods as f64;
    println!(
        "decode: parse {:.2} µs/pod, reduce {:.2} µs/pod, index {:.2} µs/pod, index RSS {:.0} B/pod",
        per(parse),
        per(reduce_time),
        per(index_time),
        grown as f64 / pods as f64
    );
    let total = parse + reduce_time + index_time;
    Figures {
        pods_per_second: pods as f64 / total.as_secs_f64(),
        bytes_per_pod: grown as f64 / pods as f64,
        seconds: total.as_secs_f64(),
        cpu_per_pod_us: total.as_secs_f64() * 1e6 / pods as f64,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    // `cargo bench` passes `--bench`; anything else we don't know is ignored.
    let pods: usize = value("--pods")
        .and_then(|p| p.parse().ok())
        .unwrap_or(100_000);
    if let Some(i) = args.iter().position(|a| a == "--serve-fake") {
        let mode = args.get(i + 1).cloned().unwrap_or_default();
        let pods = args.get(i + 2).and_then(|p| p.parse().ok()).unwrap_or(0);
        serve_fake(&mode, pods);
        return;
    }
    // The index's debounce (`--debounce-after`; `--debounce-max` is ten times it): 0 is off,
    // the default.
    let debounce = Duration::from_millis(
        value("--debounce-ms")
            .and_then(|d| d.parse().ok())
            .unwrap_or(0),
    );
    let mode = value("--mode").unwrap_or_else(|| "both".into());
    let modes: Vec<&str> = match mode.as_str() {
        "both" => vec!["list", "watch"],
        other => vec![other],
    };
    if modes.len() > 1 {
        // Each path in a process of its own, so one's freed memory doesn't hide the other's.
        for mode in modes {
            let status = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args(["--mode", mode, "--pods", &pods.to_string()])
                .args(["--debounce-ms", &debounce.as_millis().to_string()])
                .status()
                .expect("run a path");
            assert!(status.success(), "{mode} failed");
        }
        return;
    }
    let size = serde_json::to_vec(&pod(0)).map(|v| v.len()).unwrap_or(0);
    println!("kube_ingest: {pods} pods, {size} bytes of JSON each");
    for mode in modes {
        // A fresh runtime per path, so one's allocations don't flatter the other's RSS.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let figures = if mode == "decode" {
            decode_only(pods)
        } else {
            runtime.block_on(run(mode, pods, debounce))
        };
        println!(
            "{mode:>5}: {:>9.0} pods/s  {:>6.0} B/pod (RSS growth)  {:.2} s  {:.1} µs CPU/pod",
            figures.pods_per_second, figures.bytes_per_pod, figures.seconds, figures.cpu_per_pod_us
        );
    }
}
