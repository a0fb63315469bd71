//! Scale harness (targets in BENCHMARKS.md): a synthetic cluster of N pods, M services,
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
//! streams, T5 bytes per pod change per stream, T6 reconnect storm, T7 idle stream memory,
//! T8 sustained churn (1,000 pod events/s to 1,000 streams through the real index task), T9
//! overload (5,000 streams at once, a quarter of them slow, under churn; beside T9-BASE, the
//! same without the slow ones), T10 on-demand names (streams subscribed to 100k names each);
//! with `--only` only: T11 soak (200 pod events/s to 1,000 streams for an hour, RSS, live
//! heap and file descriptors each minute: `cargo bench --bench scale -- --only T11 [--quick]`),
//! T12 failover (1,000 clients of a SIGKILLed replica re-sync on the other: `--only T12`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::discovery::{Index, Kind, Object, Settings, Snapshot};
use ambientd::kube::cluster::kinds::{Reduced, WatchedObject, reduce, watched_kinds};
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
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

// The allocator the binary uses, counted (`cap::Cap` keeps the bytes in use: T10's live heap;
// one atomic add per allocation and free); with `--features dhat-heap`, dhat's (T7 then writes
// a heap profile of its idle connections).
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static GLOBAL: cap::Cap<mimalloc::MiMalloc> = cap::Cap::new(mimalloc::MiMalloc, usize::MAX);
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static GLOBAL: dhat::Alloc = dhat::Alloc;

/// Any single expected network event.
const WAIT: Duration = Duration::from_secs(30);
const SCENARIOS: [&str; 10] = ["T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9", "T10"];
/// Scenarios that take many minutes: run only when named with `--only`.
const LONG_SCENARIOS: [&str; 2] = ["T11", "T12"];

mod cluster;
mod failover;
mod names;
mod overload;
mod pure;
mod served;
mod soak;
mod storm;
mod sustained;

use cluster::*;
use pure::*;
use served::*;
use sustained::*;

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
    /// `--t6-clients ADDR COUNT`: the T6 client process.
    t6_clients: Option<(String, usize)>,
    /// `--t8-clients ADDR COUNT PROBE`: the T8 (and T10) client process.
    t8_clients: Option<(String, usize, String)>,
    /// `--t9-clients ADDR FAST SLOW PROBE`: the T9 client process.
    t9_clients: Option<(String, usize, usize, String)>,
    /// `--t10-clients ADDR STREAMS PODS NAMES`: the T10 client process.
    t10_clients: Option<(String, usize, usize, usize)>,
    /// `--t12-replica PODS`: T12's replica A.
    t12_replica: Option<usize>,
    /// `--t12-clients A B COUNT`: the T12 client process.
    t12_clients: Option<(String, String, usize)>,
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
            "--t8-clients" if i + 3 < args.len() => {
                o.t8_clients = Some((
                    args[i + 1].clone(),
                    args[i + 2].parse().unwrap_or(0),
                    args[i + 3].clone(),
                ));
                i += 3;
            }
            "--t10-clients" if i + 4 < args.len() => {
                o.t10_clients = Some((
                    args[i + 1].clone(),
                    args[i + 2].parse().unwrap_or(0),
                    args[i + 3].parse().unwrap_or(0),
                    args[i + 4].parse().unwrap_or(0),
                ));
                i += 4;
            }
            "--t9-clients" if i + 4 < args.len() => {
                o.t9_clients = Some((
                    args[i + 1].clone(),
                    args[i + 2].parse().unwrap_or(0),
                    args[i + 3].parse().unwrap_or(0),
                    args[i + 4].clone(),
                ));
                i += 4;
            }
            "--t12-replica" if i + 1 < args.len() => {
                i += 1;
                o.t12_replica = args[i].parse().ok();
            }
            "--t12-clients" if i + 3 < args.len() => {
                o.t12_clients = Some((
                    args[i + 1].clone(),
                    args[i + 2].clone(),
                    args[i + 3].parse().unwrap_or(0),
                ));
                i += 3;
            }
            "--t6-clients" if i + 2 < args.len() => {
                o.t6_clients = Some((args[i + 1].clone(), args[i + 2].parse().unwrap_or(0)));
                i += 2;
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
        "T8" => t8(o),
        "T9" => overload::t9(o, true),
        "T9-BASE" => overload::t9(o, false),
        "T10" => names::t10(o),
        "T11" => soak::t11(o),
        "T12" => failover::t12(o),
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
    let mut command = Command::new(exe);
    command.args(&args).stdout(Stdio::piped());
    if name == "T2" && std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // T2 reads RSS right after the build. mimalloc returns freed pages to the OS 10 ms
        // after they empty, at its next call; in a running server that is within
        // milliseconds, but a process that stops allocating keeps them, and the figure swung by
        // hundreds of bytes per pod between runs. Returning them at once measures what a
        // running server holds.
        command.env("MIMALLOC_PURGE_DELAY", "0");
    }
    let mut child = match command.spawn() {
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
    if let Some((address, count)) = &o.t6_clients {
        storm::t6_clients_process(address, *count);
        return;
    }
    if let Some((address, count, probe)) = &o.t8_clients {
        t8_clients_process(address, *count, probe);
        return;
    }
    if let Some((address, streams, pods, names)) = &o.t10_clients {
        names::t10_clients_process(address, *streams, *pods, *names);
        return;
    }
    if let Some((address, fast, slow, probe)) = &o.t9_clients {
        overload::t9_clients_process(address, *fast, *slow, probe);
        return;
    }
    if let Some(pods) = o.t12_replica {
        failover::t12_replica_process(pods);
        return;
    }
    if let Some((a, b, count)) = &o.t12_clients {
        failover::t12_clients_process(a, b, *count);
        return;
    }
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
    for name in SCENARIOS.into_iter().chain(LONG_SCENARIOS) {
        let named = o.only.iter().any(|s| s == name);
        if (!o.only.is_empty() || LONG_SCENARIOS.contains(&name)) && !named {
            continue;
        }
        let limit = match name {
            // Its own length (`SCALE_SOAK_MINUTES`) and ten minutes to set up and finish.
            "T11" => Duration::from_secs(
                60 * std::env::var("SCALE_SOAK_MINUTES")
                    .ok()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(if o.quick { 3 } else { 60 })
                    + 600,
            ),
            _ => limit,
        };
        // T9 runs beside its baseline (the same fast streams, no slow ones).
        let children: &[&str] = if name == "T9" {
            &["T9-BASE", "T9"]
        } else {
            &[name]
        };
        for child in children {
            let started = Instant::now();
            let got = spawn_scenario(child, &o, limit);
            eprintln!("{child} done in {:.1?}", started.elapsed());
            for r in &got {
                eprintln!(
                    "  {} {} {}: {:.2} {} ({})",
                    r.scenario, r.size, r.metric, r.median, r.unit, r.note
                );
            }
            rows.extend(got);
        }
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
