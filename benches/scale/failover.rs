//! T12: failover. C ztunnel-shaped clients, fully synced with replica A (its own process,
//! serving the same synthetic cluster as B), lose A to SIGKILL; each notices its stream end,
//! reconnects to replica B (in this process) with the versions it holds in
//! `initial_resource_versions`, and is re-synced when it holds exactly what B serves. B has
//! meanwhile seen G changes A's clients never got (G pods' readiness flipped, one pod deleted,
//! one added): the bytes B re-sends each client should be those changes and nothing else.
//!
//! Measured: from the SIGKILL to the last client re-synced (and the median client), and the
//! bytes and resources B sent each client.
//!
//! A client is re-synced when its (name, version) set, kept as an order-independent digest,
//! equals the digest of B's snapshot, and both types have been answered. Clients hold the
//! versions of one full sync; each checks that its own digest equals that of the versions it
//! will report, which are encoded once for all of them (as T6 does: a per-client copy of a
//! 10k-pod map is the client's memory, not the server's).
//!
//! `SCALE_T12_PODS` (10,000; quick 1,000), `SCALE_T12_CLIENTS` (1,000; quick 100),
//! `SCALE_T12_RUNS` (3; quick 1), `SCALE_T12_GAP` (readiness flips during the gap: 10).

use bytes::{Buf, Bytes, BytesMut};
use std::collections::HashMap;
use xxhash_rust::xxh64::Xxh64;

use super::*;

/// How long anything in a run may take.
const RUN_WAIT: Duration = Duration::from_secs(300);

/// A `DeltaDiscoveryResponse` as far as a client's bookkeeping needs: names and versions
/// (each resource's value is skipped, not copied), removals, and what an ACK names.
#[derive(Clone, PartialEq, prost::Message)]
struct Skim {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<SkimResource>,
    #[prost(string, tag = "4")]
    type_url: String,
    #[prost(string, tag = "5")]
    nonce: String,
    #[prost(string, repeated, tag = "6")]
    removed_resources: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SkimResource {
    #[prost(string, tag = "1")]
    version: String,
    #[prost(string, tag = "3")]
    name: String,
}

/// An order-independent digest of a set of (type, name, version).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Digest {
    sum: u64,
    count: u64,
}

fn pair_hash(kind: u8, name: &str, version: &str) -> u64 {
    let mut h = Xxh64::new(u64::from(kind));
    h.update(name.as_bytes());
    h.update(&[0]);
    h.update(version.as_bytes());
    h.digest()
}

impl Digest {
    fn add(&mut self, kind: u8, name: &str, version: &str) {
        self.sum = self.sum.wrapping_add(pair_hash(kind, name, version));
        self.count += 1;
    }

    fn remove(&mut self, kind: u8, name: &str, version: &str) {
        self.sum = self.sum.wrapping_sub(pair_hash(kind, name, version));
        self.count -= 1;
    }

    fn of_snapshot(snapshot: &Snapshot) -> Digest {
        let mut d = Digest::default();
        for (name, r) in snapshot.addresses.iter() {
            d.add(0, &name.to_string(), &r.version.to_string());
        }
        for (name, r) in snapshot.authorizations.iter() {
            d.add(1, &name.to_string(), &r.version.to_string());
        }
        d
    }
}

fn kind_of(type_url: &str) -> u8 {
    u8::from(type_url == AUTHORIZATION_TYPE)
}

/// One raw-h2 delta ADS stream that ACKs every response.
struct Stream {
    _send: h2::client::SendRequest<Bytes>,
    requests: h2::SendStream<Bytes>,
    body: h2::RecvStream,
    pending: BytesMut,
}

impl Stream {
    /// Connects and sends `initial` (both types' initial requests, framed).
    async fn open(address: std::net::SocketAddr, initial: Bytes) -> anyhow::Result<Stream> {
        let storm::RawStream {
            send,
            mut requests,
            response,
        } = storm::open_delta(address, Some((2 * 1024 * 1024, 5 * 1024 * 1024))).await?;
        requests.send_data(initial, false)?;
        let body = tokio::time::timeout(RUN_WAIT, response).await??.into_body();
        Ok(Stream {
            _send: send,
            requests,
            body,
            pending: BytesMut::new(),
        })
    }

    /// The next response (ACKed) and its size on the wire; an error when the stream or the
    /// connection ends.
    async fn next(&mut self) -> anyhow::Result<(Skim, usize)> {
        loop {
            if self.pending.len() >= 5 {
                let p = &self.pending;
                let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                if self.pending.len() >= 5 + len {
                    self.pending.advance(5);
                    let response = Skim::decode(self.pending.split_to(len).freeze())?;
                    self.requests.send_data(
                        storm::grpc_frame(&DeltaDiscoveryRequest {
                            type_url: response.type_url.clone(),
                            response_nonce: response.nonce.clone(),
                            ..Default::default()
                        }),
                        false,
                    )?;
                    return Ok((response, 5 + len));
                }
            }
            let chunk = self
                .body
                .data()
                .await
                .ok_or_else(|| anyhow::anyhow!("stream ended"))??;
            let _ = self.body.flow_control().release_capacity(chunk.len());
            self.pending.extend_from_slice(&chunk);
        }
    }
}

/// Both types' initial requests, framed, reporting `known`.
fn initial_requests(known: &HashMap<(u8, String), String>) -> Bytes {
    let mut out = BytesMut::new();
    for (kind, type_url) in [(0u8, ADDRESS_TYPE), (1, AUTHORIZATION_TYPE)] {
        out.extend_from_slice(&storm::grpc_frame(&DeltaDiscoveryRequest {
            node: Some(ztunnel_node(1)),
            type_url: type_url.to_string(),
            initial_resource_versions: known
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, name), version)| (name.clone(), version.clone()))
                .collect(),
            ..Default::default()
        }));
    }
    out.freeze()
}

/// A client's first sync with A: its digest, its bytes, and (for the learner) the map.
async fn first_sync(
    address: std::net::SocketAddr,
    learn: bool,
) -> anyhow::Result<(Stream, Digest, usize, HashMap<(u8, String), String>)> {
    let mut stream = Stream::open(address, initial_requests(&HashMap::new())).await?;
    let mut digest = Digest::default();
    let mut map = HashMap::new();
    let mut answered = [false; 2];
    let mut bytes = 0;
    while !(answered[0] && answered[1]) {
        let (response, len) = tokio::time::timeout(RUN_WAIT, stream.next()).await??;
        bytes += len;
        let kind = kind_of(&response.type_url);
        answered[usize::from(kind)] = true;
        for r in response.resources {
            digest.add(kind, &r.name, &r.version);
            if learn {
                map.insert((kind, r.name), r.version);
            }
        }
    }
    Ok((stream, digest, bytes, map))
}

/// After the move: follows B until the client holds `target`; returns (bytes, resources,
/// removals) B sent it.
async fn resync(
    b: std::net::SocketAddr,
    request: Bytes,
    base: &HashMap<(u8, String), String>,
    mut digest: Digest,
    target: Digest,
) -> anyhow::Result<(usize, usize, usize)> {
    let mut stream = Stream::open(b, request).await?;
    // What changed since the full sync; `None`: removed.
    let mut overlay: HashMap<(u8, String), Option<String>> = HashMap::new();
    let (mut bytes, mut resources, mut removed) = (0, 0, 0);
    let mut answered = [false; 2];
    while !(answered[0] && answered[1] && digest == target) {
        let (response, len) = tokio::time::timeout(RUN_WAIT, stream.next()).await??;
        bytes += len;
        let kind = kind_of(&response.type_url);
        answered[usize::from(kind)] = true;
        for r in response.resources {
            resources += 1;
            let key = (kind, r.name);
            let old = match overlay.get(&key) {
                Some(held) => held.clone(),
                None => base.get(&key).cloned(),
            };
            if let Some(old) = old {
                digest.remove(kind, &key.1, &old);
            }
            digest.add(kind, &key.1, &r.version);
            overlay.insert(key, Some(r.version));
        }
        for name in response.removed_resources {
            removed += 1;
            let key = (kind, name);
            let old = match overlay.get(&key) {
                Some(held) => held.clone(),
                None => base.get(&key).cloned(),
            };
            if let Some(old) = old {
                digest.remove(kind, &key.1, &old);
            }
            overlay.insert(key, None);
        }
    }
    Ok((bytes, resources, removed))
}

/// The T12 client process: `count` streams synced with A (`READY synced mismatched
/// request_bytes full_bytes`); on `TARGET sum count` from stdin, `ARMED`; then each stream,
/// when A's connection dies, reconnects to B and reports `S id lost_micros synced_micros
/// bytes resources removed` once re-synced (or `F id error`).
pub(super) fn t12_clients_process(a: &str, b: &str, count: usize) {
    let rt = runtime();
    let a: std::net::SocketAddr = a.parse().expect("address");
    let b: std::net::SocketAddr = b.parse().expect("address");
    rt.block_on(async {
        let (_, base_digest, full_bytes, base) = first_sync(a, true).await.expect("learner sync");
        let base = Arc::new(base);
        let request = initial_requests(&base);
        let synced: Vec<(Stream, Digest)> = futures::stream::iter(0..count)
            .map(|_| async move { first_sync(a, false).await })
            .buffer_unordered(64)
            .filter_map(|r| async move {
                r.map_err(|e| eprintln!("T12 client failed: {e:#}"))
                    .ok()
                    .map(|(s, d, _, _)| (s, d))
            })
            .collect()
            .await;
        let mismatched = synced.iter().filter(|(_, d)| *d != base_digest).count();
        println!(
            "READY {} {mismatched} {} {full_bytes}",
            synced.len(),
            request.len()
        );
        let _ = std::io::stdout().flush();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let mut words = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok());
        let (Some(sum), Some(n)) = (words.next(), words.next()) else {
            eprintln!("T12 clients: no target");
            return;
        };
        let target = Digest { sum, count: n };
        println!("ARMED");
        let _ = std::io::stdout().flush();
        let (lines, mut lines_rx) = mpsc::unbounded_channel::<String>();
        let mut tasks = tokio::task::JoinSet::new();
        for (id, (mut stream, digest)) in synced.into_iter().enumerate() {
            if digest != base_digest {
                // It holds something else than the shared request reports: not measured.
                let _ = lines.send(format!("F {id} holds other versions than the learner"));
                continue;
            }
            let (lines, base, request) = (lines.clone(), base.clone(), request.clone());
            tasks.spawn(async move {
                // Read (and ACK) until A's connection dies.
                while stream.next().await.is_ok() {}
                let lost = epoch_micros();
                drop(stream);
                match resync(b, request, &base, digest, target).await {
                    Ok((bytes, resources, removed)) => {
                        let at = epoch_micros();
                        let _ =
                            lines.send(format!("S {id} {lost} {at} {bytes} {resources} {removed}"));
                    }
                    Err(e) => {
                        let _ = lines.send(format!("F {id} {e:#}"));
                    }
                }
            });
        }
        drop(lines);
        let writer = tokio::spawn(async move {
            let mut out = std::io::stdout();
            while let Some(line) = lines_rx.recv().await {
                let _ = writeln!(out, "{line}");
            }
            let _ = out.flush();
        });
        while tasks.join_next().await.is_some() {}
        let _ = writer.await;
    });
}

/// The T12 replica A process: serves `pods` and prints `ADDR address`; runs until killed.
pub(super) fn t12_replica_process(pods: usize) {
    let rt = runtime();
    rt.block_on(async {
        let docs = cluster_json(&Spec::new(pods));
        let (_index, snapshot, _) = build(&docs);
        drop(docs);
        let server = serve(snapshot).await;
        println!("ADDR {}", server.address);
        let _ = std::io::stdout().flush();
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {}
        })
        .await;
    });
}

/// A child's stdout, line by line.
fn lines_of(stdout: std::process::ChildStdout) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

async fn line_starting(
    lines: &mut mpsc::UnboundedReceiver<String>,
    prefix: &str,
) -> Option<String> {
    tokio::time::timeout(RUN_WAIT, async {
        while let Some(line) = lines.recv().await {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(rest.trim().to_string());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

struct RunResult {
    /// Per client: from the SIGKILL to re-synced (ms).
    resynced: Vec<f64>,
    /// Per client: from the SIGKILL to the stream's end noticed (ms).
    noticed: Vec<f64>,
    bytes: Vec<f64>,
    resources: Vec<f64>,
    removed: Vec<f64>,
    failed: usize,
    clients: usize,
    request_bytes: usize,
    full_bytes: usize,
}

/// A child process, killed and reaped when dropped (a run that gives up early leaves none).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn one_run(pods: usize, clients: usize, gap: usize) -> Option<RunResult> {
    let spec = Spec::new(pods);
    let docs = cluster_json(&spec);
    let (mut index, snapshot, _) = build(&docs);
    drop(docs);
    let b = serve(snapshot).await;
    let exe = std::env::current_exe().expect("exe");
    let mut a = Reaped(
        Command::new(&exe)
            .args(["--t12-replica", &pods.to_string()])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn replica A"),
    );
    let mut a_lines = lines_of(a.0.stdout.take().expect("stdout"));
    let a_address = line_starting(&mut a_lines, "ADDR ").await?;
    let mut c = Reaped(
        Command::new(&exe)
            .args([
                "--t12-clients",
                &a_address,
                &b.address.to_string(),
                &clients.to_string(),
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn the T12 clients"),
    );
    let mut c_stdin = c.0.stdin.take().expect("stdin");
    let mut c_lines = lines_of(c.0.stdout.take().expect("stdout"));
    let ready: Vec<usize> = line_starting(&mut c_lines, "READY ")
        .await?
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (synced, mismatched, request_bytes, full_bytes) = (ready[0], ready[1], ready[2], ready[3]);
    eprintln!(
        "  T12: {synced} clients synced with A ({mismatched} hold other versions), {full_bytes} B each; reconnect request {request_bytes} B"
    );

    // What B sees that A's clients never got: `gap` readiness flips, a pod deleted, one added.
    for i in 1..=gap {
        index.apply(decode_one(pod_json(&spec, i, false)));
    }
    index.delete(&decode_one(pod_json(&spec, gap + 1, true)).object_ref());
    index.apply(decode_one(pod_json(&spec, spec.pods, true)));
    publish(&b, &mut index);
    let target = Digest::of_snapshot(b.publish.borrow().as_ref().expect("B's snapshot"));
    writeln!(c_stdin, "TARGET {} {}", target.sum, target.count).ok()?;
    c_stdin.flush().ok()?;
    line_starting(&mut c_lines, "ARMED").await?;

    let killed = epoch_micros();
    let _ = a.0.kill();
    let _ = a.0.wait();
    let mut result = RunResult {
        resynced: Vec::new(),
        noticed: Vec::new(),
        bytes: Vec::new(),
        resources: Vec::new(),
        removed: Vec::new(),
        failed: mismatched,
        clients: synced,
        request_bytes,
        full_bytes,
    };
    let ms_since_kill = |at: u128| at.saturating_sub(killed) as f64 / 1e3;
    while result.resynced.len() + result.failed < synced {
        let Ok(Some(line)) = tokio::time::timeout(RUN_WAIT, c_lines.recv()).await else {
            eprintln!("  T12: the clients stopped reporting");
            break;
        };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("S") => {
                let n: Vec<u128> = words.filter_map(|w| w.parse().ok()).collect();
                result.noticed.push(ms_since_kill(n[1]));
                result.resynced.push(ms_since_kill(n[2]));
                result.bytes.push(n[3] as f64);
                result.resources.push(n[4] as f64);
                result.removed.push(n[5] as f64);
            }
            Some("F") => {
                if result.failed < 3 {
                    eprintln!("  T12 client failed: {line}");
                }
                result.failed += 1;
            }
            _ => {}
        }
    }
    drop(c_stdin);
    let _ = tokio::task::spawn_blocking(move || c.0.wait()).await;
    b.stop.cancel();
    Some(result)
}

pub(super) fn t12(o: &Opts) {
    let pods = sustained::env_or("SCALE_T12_PODS", if o.quick { 1_000 } else { 10_000 });
    let clients = sustained::env_or("SCALE_T12_CLIENTS", if o.quick { 100 } else { 1_000 });
    let runs = sustained::env_or("SCALE_T12_RUNS", if o.quick { 1 } else { 3 }).max(1);
    let gap = sustained::env_or("SCALE_T12_GAP", 10).max(1);
    eprintln!("T12: {clients} clients x {pods} pods, {gap} changes in the gap, {runs} runs");
    let mut last_times = Vec::new();
    let mut p50_times = Vec::new();
    let mut noticed = Vec::new();
    let mut bytes = Vec::new();
    let mut resources = Vec::new();
    let (mut failed, mut request_bytes, mut full_bytes, mut measured) = (0, 0, 0, usize::MAX);
    for run in 0..runs {
        let rt = runtime();
        let Some(mut r) = rt.block_on(one_run(pods, clients, gap)) else {
            eprintln!("  T12 run {run}: no result");
            continue;
        };
        let last = r.resynced.iter().copied().fold(0.0, f64::max);
        let p50 = median(&mut r.resynced);
        let notice = percentile(&mut r.noticed, 100.0);
        eprintln!(
            "  T12 run {run}: last client re-synced {last:.0} ms after the kill (median {p50:.0}); streams' ends noticed within {notice:.0} ms; {:.0} B / {:.0} resources / {:.0} removals per client (median); {} failed",
            median(&mut r.bytes),
            median(&mut r.resources),
            median(&mut r.removed),
            r.failed
        );
        last_times.push(last);
        p50_times.push(p50);
        noticed.push(notice);
        bytes.push(median(&mut r.bytes));
        resources.push(median(&mut r.resources));
        failed += r.failed;
        measured = measured.min(r.resynced.len());
        request_bytes = r.request_bytes;
        full_bytes = r.full_bytes;
        let _ = r.clients;
    }
    if last_times.is_empty() {
        return;
    }
    let size = format!(
        "{clients} clients, {}, {gap}+2 changes in the gap",
        Spec::new(pods).label()
    );
    let each = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    emit(row(
        "T12",
        size.clone(),
        "SIGKILL -> every client re-synced on B",
        median(&mut last_times.clone()),
        "ms",
        "< 2 s",
        Some(failed == 0 && measured == clients && median(&mut last_times.clone()) < 2_000.0),
        format!(
            "median of {} runs ({} ms); median client {} ms; ends noticed within {} ms; {failed} clients failed; reconnect request {request_bytes} B per client",
            last_times.len(),
            each(&last_times),
            each(&p50_times),
            each(&noticed)
        ),
    ));
    emit(row(
        "T12",
        size,
        "bytes re-sent per client after the move",
        median(&mut bytes.clone()),
        "B",
        "only the gap's changes",
        None,
        format!(
            "{} resources per client (the gap changed {} and removed 1); a full sync is {full_bytes} B",
            each(&resources),
            gap + 1
        ),
    ));
}
