//! T11: soak. Pod churn at R events/s (adds, updates and deletes mixed so that the number of
//! pods stays steady) through the real index task and the real `AdsServer` to S delta ADS
//! streams (T8's lean clients, in another process) for M minutes, sampling the server
//! process's RSS, live heap and open file descriptors every sample period.
//!
//! The churn cycles through three kinds of event: a live pod's readiness flips; a pod is
//! deleted; a pod is added in the deleted one's place under a new name, uid and IP (a
//! ReplicaSet replacing it), so names the index has never seen keep arriving and leaving, as
//! in a real cluster. Every 100th event is T8's probe (pod 0's `version` label), so the run
//! also reports how long a change took to reach every stream.
//!
//! The live heap is what the global allocator (`cap::Cap` around mimalloc, the server's
//! allocator) has handed out and not had back: the bytes in use. It and RSS are read every
//! second; a sample reports the medians of its period's readings (a single reading swings by
//! 10 % with the responses in flight) and the heap's largest.
//!
//! `SCALE_SOAK_MINUTES` (default 60; quick 3), `SCALE_SOAK_SAMPLE_SECONDS` (60; quick 30),
//! `SCALE_SOAK_WARMUP_SECONDS` (the sample the growth is measured from: 300; quick one
//! sample period), `SCALE_SOAK_STREAMS` (1,000), `SCALE_SOAK_RATE` (200 events/s),
//! `SCALE_SOAK_PODS` (1,000).

use super::*;

use super::sustained::{ChurnServer, churn_server};
use ambientd::discovery::Event;
use ambientd::push::Debounce;

/// The goal: growth from the first sample after warm-up to the last, in %.
const GOAL_PERCENT: f64 = 5.0;

/// The live heap in bytes: what the global allocator has handed out and not had back.
fn live_heap() -> Option<u64> {
    #[cfg(not(feature = "dhat-heap"))]
    {
        Some(GLOBAL.allocated() as u64)
    }
    #[cfg(feature = "dhat-heap")]
    {
        None
    }
}

/// The process's open file descriptors.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

#[derive(Clone, Debug)]
struct Sample {
    at: Duration,
    /// RSS and live heap: the medians of the period's one-second readings (an instant's
    /// reading swings with the responses in flight), and the heap's largest reading.
    rss: u64,
    heap: Option<u64>,
    heap_max: Option<u64>,
    fds: u64,
    streams: usize,
    /// Events sent since the previous sample, per second.
    rate: f64,
    snapshots: u64,
}

/// The churned pods: slot `i` (1..pods; pod 0 is the probe) holds generation `g` of its pod,
/// or nothing between a delete and the add that replaces it.
struct Churn {
    spec: Spec,
    /// Per slot: the live pod's readiness (`None` between a delete and its replacement).
    live: Vec<Option<bool>>,
    /// Per slot: the generation of its newest pod.
    generations: Vec<usize>,
    /// The next slot to replace.
    next: usize,
    step: usize,
}

impl Churn {
    fn new(spec: Spec) -> Churn {
        Churn {
            spec,
            live: (0..spec.pods).map(|i| (i > 0).then_some(true)).collect(),
            generations: vec![0; spec.pods],
            next: 1,
            step: 0,
        }
    }

    /// Slot `i`'s pod at generation `g`: generation 0 is the cluster's own pod; later ones
    /// have a new name, uid and IP (unique among live pods: one range of addresses per
    /// generation, 4,000 generations before one is reused).
    fn pod(&self, i: usize, g: usize, ready: bool) -> Value {
        let mut value = pod_json(&self.spec, i, ready);
        if g > 0 {
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            value["metadata"]["name"] = json!(format!("{name}-g{g}"));
            value["metadata"]["uid"] = json!(format!("00000000-0000-0000-{g:04x}-{i:012}"));
            let ip = ipv4(
                0x0a00_0000,
                (g % 4_000) * self.spec.pods.next_power_of_two() + i + 1,
            );
            value["status"]["podIP"] = json!(ip);
            value["status"]["podIPs"] = json!([{ "ip": ip }]);
        }
        value
    }

    /// The next churn event: a readiness flip, a delete, or the add that replaces it.
    fn next_event(&mut self) -> Event {
        let slots = self.live.len() - 1;
        let kind = self.step % 3;
        self.step += 1;
        match kind {
            0 => {
                // Flip a live pod's readiness (the slot being replaced is skipped).
                let mut i = 1 + (self.step * 7919) % slots;
                while self.live[i].is_none() {
                    i = 1 + i % slots;
                }
                let ready = !self.live[i].expect("live");
                self.live[i] = Some(ready);
                Event::Apply(decode_one(self.pod(i, self.generations[i], ready)))
            }
            1 => {
                let i = self.next;
                let ready = self.live[i].take().expect("the slot to replace is live");
                Event::Delete(decode_one(self.pod(i, self.generations[i], ready)).object_ref())
            }
            _ => {
                let i = self.next;
                self.next = 1 + self.next % slots;
                self.generations[i] += 1;
                self.live[i] = Some(true);
                Event::Apply(decode_one(self.pod(i, self.generations[i], true)))
            }
        }
    }
}

struct Run {
    samples: Vec<Sample>,
    convergence: Vec<Option<f64>>,
    sent: usize,
    elapsed: Duration,
    connected: usize,
}

async fn soak(
    pods: usize,
    streams: usize,
    rate: usize,
    duration: Duration,
    period: Duration,
) -> Run {
    let ChurnServer {
        spec,
        address,
        events,
        snapshots,
        registry,
        stop,
        indexer,
        probe_uid,
    } = churn_server(
        pods,
        Debounce {
            after: Duration::ZERO,
            max: Duration::from_secs(1),
        },
        |ads| ads,
    )
    .await;

    // T8's clients, told to live as long as the run.
    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(exe)
        .args([
            "--t8-clients",
            &address.to_string(),
            &streams.to_string(),
            &probe_uid,
        ])
        .env(
            "SCALE_CLIENTS_SECONDS",
            (duration.as_secs() + 600).to_string(),
        )
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn the soak clients");
    let stdout = child.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<usize>();
    let probes_expected = (rate as f64 * duration.as_secs_f64() / 100.0) as usize + 2;
    let reader = std::thread::spawn(move || {
        // Sized up front, so that the probes' bookkeeping does not grow the heap under test.
        let mut convergence = Convergence::with_capacity(streams, probes_expected);
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("READY") => {
                    let _ = ready_tx.send(words.next().and_then(|n| n.parse().ok()).unwrap_or(0));
                }
                Some("P") => {
                    let mut num = || words.next().and_then(|n| n.parse::<u128>().ok());
                    if let (Some(id), Some(n), Some(at)) = (num(), num(), num()) {
                        convergence.arrival(id as usize, n as usize, at);
                    }
                }
                _ => {}
            }
        }
        convergence
    });
    let connected = tokio::task::spawn_blocking(move || {
        ready_rx.recv_timeout(Duration::from_secs(300)).unwrap_or(0)
    })
    .await
    .unwrap_or(0);
    eprintln!("  T11: {connected} streams synced");
    let generation =
        |s: &ambientd::push::Snapshots| s.borrow().as_ref().map_or(0, |s| s.generation);

    let mut churn = Churn::new(spec);
    let mut probes_sent: Vec<u128> = Vec::with_capacity(probes_expected);
    let mut samples = Vec::new();
    // RSS and live heap every second, summarised at each sample.
    let readings = Arc::new(std::sync::Mutex::new(Vec::with_capacity(
        2 * period.as_secs() as usize + 8,
    )));
    let reader_task = {
        let readings = readings.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let reading = (rss_bytes(), live_heap());
                readings.lock().expect("readings").push(reading);
            }
        })
    };
    let sample = |at: Duration, rate: f64, snapshots: u64| {
        let mut taken: Vec<(u64, Option<u64>)> =
            std::mem::take(&mut *readings.lock().expect("readings"));
        if taken.is_empty() {
            taken.push((rss_bytes(), live_heap()));
        }
        let mut rss: Vec<f64> = taken.iter().map(|r| r.0 as f64).collect();
        let mut heap: Vec<f64> = taken.iter().filter_map(|r| r.1).map(|h| h as f64).collect();
        Sample {
            at,
            rss: median(&mut rss) as u64,
            heap: (!heap.is_empty()).then(|| median(&mut heap) as u64),
            heap_max: (!heap.is_empty()).then(|| percentile(&mut heap, 100.0) as u64),
            fds: open_fds(),
            streams: registry.len(),
            rate,
            snapshots,
        }
    };
    let first = sample(Duration::ZERO, 0.0, generation(&snapshots));
    print_sample(&first, None);
    samples.push(first);

    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0usize;
    let mut sent_at_sample = 0usize;
    let mut next_sample = period;
    let mut last_sample = Instant::now();
    while started.elapsed() < duration {
        tick.tick().await;
        let event = if sent.is_multiple_of(100) {
            probes_sent.push(epoch_micros());
            Event::Apply(probe(&spec, probes_sent.len() - 1))
        } else {
            churn.next_event()
        };
        if events.send(event).await.is_err() {
            break;
        }
        sent += 1;
        if started.elapsed() >= next_sample {
            let since = last_sample.elapsed().as_secs_f64();
            last_sample = Instant::now();
            let s = sample(
                started.elapsed(),
                (sent - sent_at_sample) as f64 / since,
                generation(&snapshots),
            );
            sent_at_sample = sent;
            next_sample += period;
            print_sample(&s, samples.first());
            samples.push(s);
        }
    }
    let elapsed = started.elapsed();
    reader_task.abort();
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(child.stdin.take());
    let arrivals = tokio::task::spawn_blocking(move || {
        let out = reader.join().ok();
        let _ = child.wait();
        out
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_default();
    stop.cancel();
    let _ = indexer.await;
    let convergence = (0..probes_sent.len())
        .map(|n| {
            arrivals
                .converged(n, connected)
                .map(|at| at.saturating_sub(probes_sent[n]) as f64 / 1e3)
        })
        .collect();
    Run {
        samples,
        convergence,
        sent,
        elapsed,
        connected,
    }
}

fn print_sample(s: &Sample, first: Option<&Sample>) {
    if first.is_none() {
        eprintln!(
            "  T11 {:>6} {:>9} {:>9} {:>9} {:>5} {:>7} {:>8} {:>9}",
            "min", "RSS MB", "heap MB", "heap max", "fds", "streams", "events/s", "snapshots"
        );
    }
    let mb = |b: Option<u64>| b.map_or("-".to_string(), |h| format!("{:.1}", h as f64 / 1e6));
    eprintln!(
        "  T11 {:>6.1} {:>9.1} {:>9} {:>9} {:>5} {:>7} {:>8.1} {:>9}",
        s.at.as_secs_f64() / 60.0,
        s.rss as f64 / 1e6,
        mb(s.heap),
        mb(s.heap_max),
        s.fds,
        s.streams,
        s.rate,
        s.snapshots - first.map_or(s.snapshots, |f| f.snapshots),
    );
}

fn growth(from: f64, to: f64) -> f64 {
    if from > 0.0 {
        (to - from) / from * 100.0
    } else {
        f64::NAN
    }
}

pub(super) fn t11(o: &Opts) {
    let minutes = env_or("SCALE_SOAK_MINUTES", if o.quick { 3 } else { 60 });
    let period = env_or("SCALE_SOAK_SAMPLE_SECONDS", if o.quick { 30 } else { 60 }).max(1);
    let warmup = env_or(
        "SCALE_SOAK_WARMUP_SECONDS",
        if o.quick { period } else { 300 },
    );
    let streams = env_or("SCALE_SOAK_STREAMS", 1_000);
    let rate = env_or("SCALE_SOAK_RATE", 200).max(1);
    let pods = env_or("SCALE_SOAK_PODS", 1_000).max(2);
    eprintln!(
        "T11: {rate} events/s for {minutes} min to {streams} streams, {pods} pods; a sample every {period} s, growth from {warmup} s"
    );
    let rt = runtime();
    let run = rt.block_on(soak(
        pods,
        streams,
        rate,
        Duration::from_secs(minutes as u64 * 60),
        Duration::from_secs(period as u64),
    ));
    let size = format!(
        "{} streams, {}, {rate}/s x {minutes} min",
        run.connected,
        Spec::new(pods).label()
    );
    // The first sample at or after the warm-up, and the last.
    let warm = run
        .samples
        .iter()
        .find(|s| s.at.as_secs() as usize >= warmup)
        .or(run.samples.last())
        .cloned();
    let last = run.samples.last().cloned();
    let (Some(warm), Some(last)) = (warm, last) else {
        return;
    };
    let table: Vec<String> = run
        .samples
        .iter()
        .map(|s| {
            format!(
                "{:.1}m rss {:.1} heap {} fds {} streams {} {:.0}/s",
                s.at.as_secs_f64() / 60.0,
                s.rss as f64 / 1e6,
                s.heap
                    .map_or("-".into(), |h| format!("{:.1}", h as f64 / 1e6)),
                s.fds,
                s.streams,
                s.rate
            )
        })
        .collect();
    let all_streams = run.samples.iter().all(|s| s.streams == streams);
    let achieved = run.sent as f64 / run.elapsed.as_secs_f64();
    let done: Vec<f64> = run.convergence.iter().flatten().copied().collect();
    let missing = run.convergence.len() - done.len();
    let from = format!("{:.1} min", warm.at.as_secs_f64() / 60.0);
    let rss_growth = growth(warm.rss as f64, last.rss as f64);
    emit(row(
        "T11",
        size.clone(),
        &format!("RSS growth from {from} to the end"),
        rss_growth,
        "%",
        "< 5 %",
        Some(rss_growth < GOAL_PERCENT && all_streams),
        format!(
            "{:.1} -> {:.1} MB; {achieved:.0} events/s achieved; streams alive at every sample: {all_streams}; samples: {}",
            warm.rss as f64 / 1e6,
            last.rss as f64 / 1e6,
            table.join("; ")
        ),
    ));
    if let (Some(w), Some(l)) = (warm.heap, last.heap) {
        let heap_growth = growth(w as f64, l as f64);
        emit(row(
            "T11",
            size.clone(),
            &format!("live heap growth from {from} to the end"),
            heap_growth,
            "%",
            "< 5 %",
            Some(heap_growth < GOAL_PERCENT),
            format!(
                "{:.1} -> {:.1} MB in use, medians of each period's 1 s readings (cap::Cap around mimalloc)",
                w as f64 / 1e6,
                l as f64 / 1e6
            ),
        ));
    }
    emit(row(
        "T11",
        size.clone(),
        "open file descriptors, end minus warm-up",
        last.fds as f64 - warm.fds as f64,
        "fds",
        "0",
        Some(last.fds <= warm.fds),
        format!("{} -> {}", warm.fds, last.fds),
    ));
    emit(row(
        "T11",
        size,
        "probe -> every stream during the soak, p99",
        percentile(&mut done.clone(), 99.0),
        "ms",
        "-",
        None,
        format!(
            "p50 {:.1} ms over {} probes ({missing} never reached every stream)",
            median(&mut done.clone()),
            run.convergence.len()
        ),
    ));
}
