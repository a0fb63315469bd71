//! T9: overload. S delta ADS streams connect at once over a cluster of P pods; a quarter of
//! them are slow: half never read a byte ("stuck", with a 64 KiB HTTP/2 window), half read
//! one HTTP/2 frame (at most 16 KiB, their window) every `SCALE_T9_TRICKLE_MS` and ACK what
//! they complete ("trickle"). Then pod churn runs through the real index task, and every 10th
//! event is a probe (as T8's): the fast streams' event→receive latency is measured, per
//! delivery and until every fast stream has a probe. `T9-BASE` is the same run with the same
//! fast streams and no slow ones, for comparison. The server runs with an idle timeout of
//! `SCALE_T9_IDLE_SECONDS`, and reports its RSS (sampled every second), and what it holds per
//! stream at the end of the churn; the client process reports what happened to each slow
//! stream.
//!
//! `SCALE_T9_STREAMS` (5,000; quick 400), `SCALE_T9_SLOW_PERCENT` (25), `SCALE_T9_PODS`
//! (1,000; quick 500), `SCALE_T9_RATE` (events/s, 100), `SCALE_T9_SECONDS` (30; quick 10),
//! `SCALE_T9_IDLE_SECONDS` (10; quick 3), `SCALE_T9_TRICKLE_MS` (50).
//!
//! At 10,000 pods every fast stream's initial sync is 4.5 MB, 17 GB for 3,750 of them: on a
//! 2-core machine the client process, which decodes all of it, cannot answer the server's
//! keepalive pings in time, and the server rightly drops its connections, so the default is
//! 1,000 pods (T8's size).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::*;

use super::sustained::{
    ChurnServer, churn_server, readiness_variants, spawn_followers, stdin_closed,
};
use ambientd::discovery::Event;

/// A probe every this many events.
const PROBE_EVERY: usize = 10;
/// Latency histogram: 0.1 ms buckets up to 30 s (the last one counts everything later).
const BUCKET_US: u128 = 100;
const BUCKETS: usize = 300_000;
/// How long a stream of the storm may wait for its initial responses.
const CONNECT_WAIT: Duration = Duration::from_secs(300);

struct Sizes {
    pods: usize,
    fast: usize,
    slow: usize,
    rate: usize,
    seconds: usize,
    idle: Duration,
}

impl Sizes {
    fn of(o: &Opts, with_slow: bool) -> Sizes {
        let streams = env_or("SCALE_T9_STREAMS", if o.quick { 400 } else { 5_000 });
        let percent = env_or("SCALE_T9_SLOW_PERCENT", 25).min(100);
        let slow = streams * percent / 100;
        Sizes {
            pods: env_or("SCALE_T9_PODS", if o.quick { 500 } else { 1_000 }),
            fast: streams - slow,
            slow: if with_slow { slow } else { 0 },
            rate: env_or("SCALE_T9_RATE", 100).max(1),
            seconds: env_or("SCALE_T9_SECONDS", if o.quick { 10 } else { 30 }),
            idle: Duration::from_secs(
                env_or("SCALE_T9_IDLE_SECONDS", if o.quick { 3 } else { 10 }) as u64,
            ),
        }
    }
}

/// Event→receive latencies of every delivery of a probe to a fast stream, in fixed buckets
/// (allocated and touched before the server's RSS is first read).
struct Latencies {
    buckets: Vec<u32>,
    count: usize,
}

impl Latencies {
    fn new() -> Self {
        let mut buckets = vec![1u32; BUCKETS];
        buckets.fill(0);
        Latencies { buckets, count: 0 }
    }

    fn record(&mut self, micros: u128) {
        let bucket = ((micros / BUCKET_US) as usize).min(BUCKETS - 1);
        self.buckets[bucket] += 1;
        self.count += 1;
    }

    /// The `p`th percentile, in ms.
    fn percentile(&self, p: f64) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as usize;
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += *n as usize;
            if seen >= rank {
                return (i as u128 * BUCKET_US + BUCKET_US / 2) as f64 / 1e3;
            }
        }
        f64::NAN
    }
}

/// What became of the slow streams: the stuck ones from the server's registry (a stuck client
/// cannot see the server give up on it: the reset waits behind the data it does not read), the
/// trickle ones from the client process.
#[derive(Default)]
struct SlowReport {
    stuck: usize,
    /// Stuck streams still registered at the end of the churn.
    stuck_open: usize,
    trickle: usize,
    trickle_synced: usize,
    trickle_dropped: usize,
    trickle_responses: usize,
}

struct Outcome {
    sizes: Sizes,
    /// Fast streams synced, and each one's time from the start of the storm to its initial
    /// responses (ms).
    connect_ms: Vec<f64>,
    connect_failures: usize,
    convergence: Vec<Option<f64>>,
    latencies: Latencies,
    /// Server RSS: before any stream, once the fast streams are synced, then every second of
    /// the churn.
    rss_idle: u64,
    rss_connected: u64,
    rss: Vec<u64>,
    /// At the end of the churn: streams still open, and the most and the total bytes waiting
    /// in their outbound queues.
    open_streams: usize,
    max_queued: usize,
    total_queued: usize,
    slow: SlowReport,
    achieved_rate: f64,
}

async fn overload(sizes: Sizes) -> Outcome {
    let ChurnServer {
        spec,
        address,
        events,
        snapshots,
        registry,
        stop,
        indexer,
        probe_uid,
    } = churn_server(sizes.pods, debounce(), |ads| {
        ads.with_idle_timeout(Some(sizes.idle))
    })
    .await;
    let variants = readiness_variants(&spec);
    let total = sizes.rate * sizes.seconds;
    let probes = total.div_ceil(PROBE_EVERY);
    let probes_sent: Arc<Vec<AtomicU64>> =
        Arc::new((0..probes).map(|_| AtomicU64::new(0)).collect());

    let rss_idle = rss_bytes();

    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(exe)
        .args([
            "--t9-clients",
            &address.to_string(),
            &sizes.fast.to_string(),
            &sizes.slow.to_string(),
            &probe_uid,
        ])
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn the T9 clients");
    let stdout = child.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let fast = sizes.fast;
    let reader = {
        let probes_sent = probes_sent.clone();
        std::thread::spawn(move || {
            let mut convergence = Convergence::default();
            let mut latencies = Latencies::new();
            let mut connect_ms = Vec::new();
            let mut failures = 0;
            let mut slow = SlowReport::default();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut words = line.split_whitespace();
                match words.next() {
                    Some("C") => {
                        connect_ms.extend(words.next().and_then(|n| n.parse::<f64>().ok()))
                    }
                    Some("F") => failures += 1,
                    Some("READY") => {
                        let _ = ready_tx.send(());
                    }
                    Some("P") => {
                        let mut num = || words.next().and_then(|n| n.parse::<u128>().ok());
                        if let (Some(id), Some(n), Some(at)) = (num(), num(), num()) {
                            let (id, n) = (id as usize, n as usize);
                            if id < fast && n < probes_sent.len() {
                                convergence.arrival(id, n, at);
                                let sent = u128::from(probes_sent[n].load(Ordering::SeqCst));
                                latencies.record(at.saturating_sub(sent));
                            }
                        }
                    }
                    Some("S") => {
                        let kind = words.next().unwrap_or("");
                        let synced = words.next().is_some_and(|w| w != "-");
                        let dropped = words.next().and_then(|w| w.parse::<f64>().ok());
                        let responses: usize =
                            words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                        if kind == "stuck" {
                            slow.stuck += 1;
                        } else {
                            slow.trickle += 1;
                            slow.trickle_synced += usize::from(synced);
                            slow.trickle_dropped += usize::from(dropped.is_some());
                            slow.trickle_responses += responses;
                        }
                    }
                    _ => {}
                }
            }
            (convergence, latencies, connect_ms, failures, slow)
        })
    };
    let _ = tokio::task::spawn_blocking(move || ready_rx.recv_timeout(CONNECT_WAIT + WAIT)).await;
    let rss_connected = rss_bytes();
    let first_generation = snapshots.borrow().as_ref().map_or(0, |s| s.generation);
    eprintln!(
        "  T9: storm over, {:.0} MB RSS; churn at {}/s for {} s",
        rss_connected as f64 / 1e6,
        sizes.rate,
        sizes.seconds
    );

    let rss_stop = CancellationToken::new();
    let rss_task = {
        let rss_stop = rss_stop.clone();
        tokio::spawn(async move {
            let mut samples = vec![rss_bytes()];
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = rss_stop.cancelled() => return samples,
                    _ = tick.tick() => samples.push(rss_bytes()),
                }
            }
        })
    };
    let mut ready = vec![true; variants.len()];
    let started = Instant::now();
    let per_tick = sizes.rate.div_ceil(1000).max(1);
    let mut tick =
        tokio::time::interval(Duration::from_secs_f64(per_tick as f64 / sizes.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < total {
        tick.tick().await;
        for _ in 0..per_tick {
            let event = if sent % PROBE_EVERY == 0 {
                let n = sent / PROBE_EVERY;
                probes_sent[n].store(epoch_micros() as u64, Ordering::SeqCst);
                probe(&spec, n)
            } else {
                let i = (sent * 7919) % variants.len();
                ready[i] = !ready[i];
                variants[i][usize::from(ready[i])].clone()
            };
            if events.send(Event::Apply(event)).await.is_err() {
                break;
            }
            sent += 1;
        }
    }
    let achieved_rate = sent as f64 / started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let streams = registry.list();
    let queued: Vec<usize> = streams.iter().map(|s| s.pending.queued_bytes).collect();
    // Slow stream `j` is ztunnel `fast + j`; the even ones are stuck.
    let stuck_open = streams
        .iter()
        .filter_map(|s| s.proxy.as_ref())
        .filter_map(|p| p.name.strip_prefix("ztunnel-")?.parse::<usize>().ok())
        .filter(|n| *n >= sizes.fast && (*n - sizes.fast).is_multiple_of(2))
        .count();
    rss_stop.cancel();
    let rss = rss_task.await.unwrap_or_default();
    eprintln!(
        "  T9: {} snapshots published during the churn",
        snapshots.borrow().as_ref().map_or(0, |s| s.generation) - first_generation
    );
    drop(child.stdin.take());
    let (convergence, latencies, connect_ms, connect_failures, mut slow) =
        tokio::task::spawn_blocking(move || {
            let out = reader.join().expect("reader");
            let _ = child.wait();
            out
        })
        .await
        .expect("reader");
    stop.cancel();
    let _ = indexer.await;
    slow.stuck_open = stuck_open;
    let synced = connect_ms.len();
    Outcome {
        convergence: (0..probes)
            .map(|n| {
                convergence.converged(n, synced).map(|at| {
                    at.saturating_sub(u128::from(probes_sent[n].load(Ordering::SeqCst))) as f64
                        / 1e3
                })
            })
            .collect(),
        sizes,
        connect_ms,
        connect_failures,
        latencies,
        rss_idle,
        rss_connected,
        rss,
        open_streams: streams.len(),
        max_queued: queued.iter().copied().max().unwrap_or(0),
        total_queued: queued.iter().sum(),
        slow,
        achieved_rate,
    }
}

pub(super) fn t9(o: &Opts, with_slow: bool) {
    let sizes = Sizes::of(o, with_slow);
    let name = if with_slow { "T9" } else { "T9-BASE" };
    eprintln!(
        "{name}: {} fast + {} slow streams at once, {} pods, {}/s churn for {} s, idle timeout {:?}",
        sizes.fast, sizes.slow, sizes.pods, sizes.rate, sizes.seconds, sizes.idle
    );
    let rt = runtime();
    let out = rt.block_on(overload(sizes));
    let s = &out.sizes;
    let size = format!(
        "{} fast + {} slow, {}, {}/s x {} s",
        s.fast,
        s.slow,
        Spec::new(s.pods).label(),
        s.rate,
        s.seconds
    );
    let mut connect = out.connect_ms.clone();
    let last = connect.iter().copied().fold(0.0, f64::max);
    emit(row(
        name,
        size.clone(),
        "storm: time to the last fast stream's initial responses",
        last / 1e3,
        "s",
        "all served",
        Some(out.connect_ms.len() == s.fast && out.connect_failures == 0),
        format!(
            "{} of {} fast streams synced ({} failed); p50 {:.2} s, p99 {:.2} s",
            out.connect_ms.len(),
            s.fast,
            out.connect_failures,
            median(&mut connect) / 1e3,
            percentile(&mut connect, 99.0) / 1e3
        ),
    ));
    let done: Vec<f64> = out.convergence.iter().flatten().copied().collect();
    let missing = out.convergence.len() - done.len();
    emit(row(
        name,
        size.clone(),
        "event -> fast stream, p99 of deliveries",
        out.latencies.percentile(99.0),
        "ms",
        "beside T9-BASE",
        None,
        format!(
            "p50 {:.1} ms over {} deliveries; probe -> every fast stream p50 {:.1} / p99 {:.1} ms over {} probes ({missing} never reached every fast stream); {:.0} events/s achieved",
            out.latencies.percentile(50.0),
            out.latencies.count,
            median(&mut done.clone()),
            percentile(&mut done.clone(), 99.0),
            out.convergence.len(),
            out.achieved_rate
        ),
    ));
    let mb = |b: u64| b as f64 / 1e6;
    let peak = out
        .rss
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(out.rss_connected);
    let first = out.rss.first().copied().unwrap_or(0);
    let quarter = out.rss.get(out.rss.len() / 4).copied().unwrap_or(first);
    let last_rss = out.rss.last().copied().unwrap_or(0);
    emit(row(
        name,
        size.clone(),
        "server RSS peak",
        mb(peak),
        "MB",
        "bounded",
        None,
        format!(
            "{:.0} MB before the streams, {:.0} once the fast ones synced, {:.0} at the churn's start, {:.0} at 1/4, {:.0} at its end (growth from 1/4 to the end {:+.1} MB); at the end {} streams open, outbound queues {:.1} KB at most per stream, {:.1} MB in all",
            mb(out.rss_idle),
            mb(out.rss_connected),
            mb(first),
            mb(quarter),
            mb(last_rss),
            mb(last_rss) - mb(quarter),
            out.open_streams,
            out.max_queued as f64 / 1e3,
            out.total_queued as f64 / 1e6
        ),
    ));
    if with_slow {
        let r = &out.slow;
        let dropped = r.stuck - r.stuck_open;
        emit(row(
            name,
            size,
            "stuck streams dropped by the idle timeout",
            dropped as f64,
            "streams",
            &format!("all {}", r.stuck),
            Some(dropped == r.stuck),
            format!(
                "{} stuck streams (idle timeout {:?}), {} still open at the end; {} trickle streams: {} synced, {} dropped, {} responses read",
                r.stuck,
                s.idle,
                r.stuck_open,
                r.trickle,
                r.trickle_synced,
                r.trickle_dropped,
                r.trickle_responses
            ),
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// The client process

#[derive(Clone, Copy, PartialEq)]
enum Slow {
    Stuck,
    Trickle,
}

/// What became of one slow stream: synced (ms after the storm began), dropped by the server
/// (s after the storm began), responses it read.
struct SlowEnd {
    synced: Option<f64>,
    dropped: Option<f64>,
    responses: usize,
}

/// The T9 client process: `fast` lean streams (as T8's) and `slow` slow ones, all connecting at
/// once. Reports `C ms` per fast stream synced (`F` per failure), `READY` once all fast ones
/// are done, `P stream probe micros` per probe arrival, and at the end (stdin closed) `S kind
/// synced dropped responses` per slow stream.
pub(super) fn t9_clients_process(address: &str, fast: usize, slow: usize, probe_uid: &str) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    let trickle_pause = Duration::from_millis(env_or("SCALE_T9_TRICKLE_MS", 50) as u64);
    rt.block_on(async {
        let (lines, mut lines_rx) = mpsc::unbounded_channel::<String>();
        let writer = std::thread::spawn(move || {
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            while let Some(line) = lines_rx.blocking_recv() {
                let _ = writeln!(out, "{line}");
                if line.starts_with("READY") {
                    let _ = out.flush();
                }
            }
            let _ = out.flush();
        });
        let stop = CancellationToken::new();
        let started = Instant::now();
        let slow_tasks: Vec<_> = (0..slow)
            .map(|j| {
                let kind = if j.is_multiple_of(2) {
                    Slow::Stuck
                } else {
                    Slow::Trickle
                };
                let stop = stop.clone();
                tokio::spawn(async move {
                    let end = slow_stream(address, fast + j, kind, trickle_pause, stop, started)
                        .await
                        .unwrap_or_else(|e| {
                            eprintln!("T9 slow stream failed: {e:#}");
                            SlowEnd {
                                synced: None,
                                dropped: Some(started.elapsed().as_secs_f64()),
                                responses: 0,
                            }
                        });
                    (kind, end)
                })
            })
            .collect();
        let fast_tasks: Vec<_> = (0..fast)
            .map(|n| {
                tokio::spawn(async move {
                    let stream = LeanStream::sync_within(address, n, CONNECT_WAIT).await;
                    (stream, started.elapsed())
                })
            })
            .collect();
        let mut streams = Vec::new();
        for task in fast_tasks {
            match task.await {
                Ok((Ok(stream), took)) => {
                    let _ = lines.send(format!("C {:.3}", took.as_secs_f64() * 1e3));
                    streams.push(stream);
                }
                Ok((Err(e), _)) => {
                    eprintln!("T9 fast stream failed: {e:#}");
                    let _ = lines.send("F".to_string());
                }
                Err(e) => {
                    eprintln!("T9 fast stream task failed: {e}");
                    let _ = lines.send("F".to_string());
                }
            }
        }
        let _ = lines.send("READY".to_string());
        let responses = Arc::new(AtomicUsize::new(0));
        let mut readers = tokio::task::JoinSet::new();
        spawn_followers(&mut readers, streams, probe_uid, &lines, &responses, &stop);
        let stdin = stdin_closed();
        let _ = tokio::time::timeout(Duration::from_secs(1800), stdin).await;
        stop.cancel();
        readers.shutdown().await;
        for task in slow_tasks {
            if let Ok((kind, end)) = task.await {
                let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
                let _ = lines.send(format!(
                    "S {} {} {} {}",
                    if kind == Slow::Stuck {
                        "stuck"
                    } else {
                        "trickle"
                    },
                    opt(end.synced),
                    opt(end.dropped),
                    end.responses
                ));
            }
        }
        drop(lines);
        let _ = writer.join();
    });
}

/// One slow stream, until `stop`.
async fn slow_stream(
    address: std::net::SocketAddr,
    n: usize,
    kind: Slow,
    pause: Duration,
    stop: CancellationToken,
    started: Instant,
) -> anyhow::Result<SlowEnd> {
    use bytes::Buf;
    let window = if kind == Slow::Stuck {
        64 * 1024
    } else {
        16 * 1024
    };
    let storm::RawStream {
        send: _send,
        mut requests,
        response,
    } = storm::open_delta(address, Some((window, 64 * 1024))).await?;
    for type_url in [ADDRESS_TYPE, AUTHORIZATION_TYPE] {
        requests.send_data(
            storm::grpc_frame(&DeltaDiscoveryRequest {
                node: Some(ztunnel_node(n)),
                type_url: type_url.to_string(),
                ..Default::default()
            }),
            false,
        )?;
    }
    let mut end = SlowEnd {
        synced: None,
        dropped: None,
        responses: 0,
    };
    if kind == Slow::Stuck {
        // Never polls the response: nothing is read, no window is given back. The server's
        // reset of the stream is what ends it.
        let reset = std::future::poll_fn(|cx| requests.poll_reset(cx));
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = reset => end.dropped = Some(started.elapsed().as_secs_f64()),
        }
        drop(response);
        return Ok(end);
    }
    let response = tokio::select! {
        _ = stop.cancelled() => return Ok(end),
        response = response => response,
    };
    let mut body = match response {
        Ok(response) => response.into_body(),
        Err(_) => {
            end.dropped = Some(started.elapsed().as_secs_f64());
            return Ok(end);
        }
    };
    let mut pending = bytes::BytesMut::new();
    let mut answered = [false; 2];
    loop {
        let chunk = tokio::select! {
            _ = stop.cancelled() => break,
            chunk = body.data() => chunk,
        };
        let chunk = match chunk {
            Some(Ok(chunk)) => chunk,
            _ => {
                end.dropped = Some(started.elapsed().as_secs_f64());
                break;
            }
        };
        tokio::time::sleep(pause).await;
        let _ = body.flow_control().release_capacity(chunk.len());
        pending.extend_from_slice(&chunk);
        while pending.len() >= 5 {
            let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
            if pending.len() < 5 + len {
                break;
            }
            pending.advance(5);
            let message = pending.split_to(len).freeze();
            let response = Skimmed::decode(message)?;
            end.responses += 1;
            answered[usize::from(response.type_url == AUTHORIZATION_TYPE)] = true;
            if end.synced.is_none() && answered[0] && answered[1] {
                end.synced = Some(started.elapsed().as_secs_f64() * 1e3);
            }
            requests.send_data(
                storm::grpc_frame(&DeltaDiscoveryRequest {
                    type_url: response.type_url.clone(),
                    response_nonce: response.nonce.clone(),
                    ..Default::default()
                }),
                false,
            )?;
        }
    }
    Ok(end)
}
