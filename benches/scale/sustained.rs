//! T8: sustained churn. R pod events per second for D seconds, through the real index task
//! (`push::indexer::run`, with the debounce under test) and the real `AdsServer`, to S
//! ztunnel-shaped streams that ACK every response.
//!
//! Convergence is measured with probes: every 100th event sets a dedicated pod's `version`
//! label to `probe-N` instead of flipping a pod's readiness. A stream has probe N when it has
//! received that pod at probe N or later (a slow stream may skip straight to a newer one, which
//! is what coalescing means); probe N has converged when every stream has it.
//!
//! `SCALE_T8_SECONDS` (default 60; quick 10), `SCALE_T8_STREAMS` (1,000; quick 100),
//! `SCALE_T8_RATE` (events/s, 1,000), `SCALE_T8_DEBOUNCE` (`after_ms,max_ms`, default `0,1000`).

use super::*;

use ambientd::discovery::Event;
use ambientd::push::Debounce;

pub(super) fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(super) fn debounce() -> Debounce {
    let text = std::env::var("SCALE_T8_DEBOUNCE").unwrap_or_else(|_| "0,1000".into());
    let mut parts = text
        .split(',')
        .map(|p| p.trim().parse::<u64>().unwrap_or(0));
    Debounce {
        after: Duration::from_millis(parts.next().unwrap_or(0)),
        max: Duration::from_millis(parts.next().unwrap_or(1000)),
    }
}

/// The probe pod: pod 0 with `version: probe-N`.
pub(super) fn probe(spec: &Spec, n: usize) -> Object {
    let mut value = pod_json(spec, 0, true);
    value["metadata"]["labels"]["version"] = json!(format!("probe-{n}"));
    decode_one(value)
}

/// The server side of T8, T9 and T11: the real index task over a synthetic cluster of `pods`
/// (first snapshot published) and the real `AdsServer`, as `configure` leaves it, on a
/// loopback port.
pub(super) struct ChurnServer {
    pub(super) spec: Spec,
    pub(super) address: std::net::SocketAddr,
    pub(super) events: mpsc::Sender<Event>,
    pub(super) snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    pub(super) registry: Arc<Registry>,
    pub(super) stop: CancellationToken,
    pub(super) indexer: tokio::task::JoinHandle<()>,
    /// Pod 0's uid: its changes are the probes.
    pub(super) probe_uid: String,
}

pub(super) async fn churn_server(
    pods: usize,
    debounce: Debounce,
    configure: impl FnOnce(AdsServer) -> AdsServer,
) -> ChurnServer {
    let spec = Spec::new(pods);
    let docs = cluster_json(&spec);
    let (index, _, _) = build(&docs);
    drop(docs);
    let probe_uid = {
        let Object::Pod(p) = decode_one(pod_json(&spec, 0, true)) else {
            unreachable!()
        };
        format!("Kubernetes//Pod/{}/{}", p.namespace(), p.name())
    };
    // The server's own listener: a backlog of somaxconn, for streams that connect at once.
    let listener =
        ambientd::push::server::listen("127.0.0.1:0".parse().expect("address")).expect("bind");
    let address = listener.local_addr().expect("addr");
    let (publish, snapshots) = watch::channel(None);
    let (events, events_rx) = mpsc::channel(10_000);
    let stop = CancellationToken::new();
    let indexer = tokio::spawn(ambientd::push::indexer::run(
        index,
        events_rx,
        publish,
        Arc::new(Metrics::new()),
        debounce,
        stop.clone(),
    ));
    events.send(Event::Synced).await.expect("indexer");
    let registry = Arc::new(Registry::default());
    let ads = configure(AdsServer::new(
        snapshots.clone(),
        registry.clone(),
        Arc::new(Metrics::new()),
    ))
    .with_shutdown(stop.clone())
    .into_service();
    let token = stop.clone();
    tokio::spawn(async move {
        let _ = ambientd::push::server::grpc_server()
            .add_service(ads)
            .serve_with_incoming_shutdown(
                ambientd::push::listener::proxy_connections(listener),
                token.cancelled_owned(),
            )
            .await;
    });
    let mut ready = snapshots.clone();
    let _ = ready.wait_for(Option::is_some).await;
    ChurnServer {
        spec,
        address,
        events,
        snapshots,
        registry,
        stop,
        indexer,
        probe_uid,
    }
}

/// Both readiness states of every pod but the probe, decoded up front: the churn's events.
pub(super) fn readiness_variants(spec: &Spec) -> Vec<[Object; 2]> {
    (1..spec.pods)
        .map(|i| {
            [
                decode_one(pod_json(spec, i, false)),
                decode_one(pod_json(spec, i, true)),
            ]
        })
        .collect()
}

struct Outcome {
    /// Per probe: time until every stream had it (ms); `None` if some stream never did.
    convergence: Vec<Option<f64>>,
    sent: usize,
    elapsed: Duration,
    snapshots: u64,
    responses: usize,
    rss: Vec<u64>,
    connected: usize,
}

async fn sustained(
    pods: usize,
    streams: usize,
    rate: usize,
    seconds: usize,
    debounce: Debounce,
) -> Outcome {
    let ChurnServer {
        spec,
        address,
        events,
        snapshots,
        registry: _,
        stop,
        indexer,
        probe_uid,
    } = churn_server(pods, debounce, |ads| ads).await;
    let variants = readiness_variants(&spec);

    // The streams live in another process (so that the server's CPU and RSS are its own); it
    // reports each probe arrival as `P stream probe micros-since-epoch`.
    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(exe)
        .args([
            "--t8-clients",
            &address.to_string(),
            &streams.to_string(),
            &probe_uid,
        ])
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn the T8 clients");
    let stdout = child.stdout.take().expect("stdout");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<usize>();
    // Arrivals are folded as they come (`Convergence`): keeping each one (1,000 streams × 10
    // probes a second, 32 B each) would grow this process's RSS, which T8 reports as the
    // server's, by about 0.3 MB/s.
    let reader = std::thread::spawn(move || {
        let mut convergence = Convergence::default();
        let mut responses = 0usize;
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
                Some("R") => responses = words.next().and_then(|n| n.parse().ok()).unwrap_or(0),
                _ => {}
            }
        }
        (convergence, responses)
    });
    let connected = tokio::task::spawn_blocking(move || {
        ready_rx.recv_timeout(Duration::from_secs(300)).unwrap_or(0)
    })
    .await
    .unwrap_or(0);
    eprintln!("  T8: {connected} streams synced");
    let generation =
        |s: &ambientd::push::Snapshots| s.borrow().as_ref().map_or(0, |s| s.generation);
    let first_generation = generation(&snapshots);

    let rss_stop = CancellationToken::new();
    let rss_task = {
        let rss_stop = rss_stop.clone();
        let trace: Option<usize> = std::env::var("SCALE_T8_RSS_TRACE")
            .ok()
            .and_then(|n| n.parse().ok())
            .filter(|n| *n > 0);
        tokio::spawn(async move {
            let mut samples = vec![rss_bytes()];
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = rss_stop.cancelled() => return samples,
                    _ = tick.tick() => {
                        samples.push(rss_bytes());
                        // `SCALE_T8_RSS_TRACE=N`: the server's RSS every N seconds.
                        if trace.is_some_and(|every| samples.len() % every == 0) {
                            eprintln!(
                                "  T8 RSS at {} s: {:.1} MB",
                                samples.len() - 1,
                                samples.last().copied().unwrap_or(0) as f64 / 1e6
                            );
                        }
                    }
                }
            }
        })
    };

    // The producer: one event per 1/rate s, catching up in bursts if it falls behind.
    let total = rate * seconds;
    let mut ready = vec![true; variants.len()];
    let mut probes_sent: Vec<u128> = Vec::new();
    let started = Instant::now();
    let per_tick = rate.div_ceil(1000).max(1);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(per_tick as f64 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sent = 0;
    while sent < total {
        tick.tick().await;
        for _ in 0..per_tick {
            let event = if sent % 100 == 0 {
                probes_sent.push(epoch_micros());
                probe(&spec, probes_sent.len() - 1)
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
    let elapsed = started.elapsed();
    // Let the last probes arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let snapshots_published = generation(&snapshots) - first_generation;
    rss_stop.cancel();
    let rss = rss_task.await.unwrap_or_default();
    // Closing the clients' stdin ends them; they report their response count first.
    drop(child.stdin.take());
    let (arrivals, responses) = tokio::task::spawn_blocking(move || {
        let out = reader.join().unwrap_or_default();
        let _ = child.wait();
        out
    })
    .await
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
    Outcome {
        convergence,
        sent,
        elapsed,
        snapshots: snapshots_published,
        responses,
        rss,
        connected,
    }
}

/// Probe arrivals, folded as they come: for each probe, how many streams hold it or a later
/// one, and when the last of them got there. O(probes + streams), whatever the run's length.
#[derive(Default)]
pub(super) struct Convergence {
    /// Per stream: the newest probe it has received.
    newest: Vec<Option<usize>>,
    /// Per probe: streams that hold it or a later one, and the latest time one got there.
    reached: Vec<(usize, u128)>,
}

impl Convergence {
    /// With room for `streams` streams and `probes` probes, so that a run of the expected
    /// length does not grow it.
    pub(super) fn with_capacity(streams: usize, probes: usize) -> Convergence {
        Convergence {
            newest: Vec::with_capacity(streams),
            reached: Vec::with_capacity(probes),
        }
    }

    /// Stream `id` received probe `n` at `at` (µs since the epoch). A stream's arrivals come in
    /// time order, so this is the first time it holds every probe after its previous newest.
    pub(super) fn arrival(&mut self, id: usize, n: usize, at: u128) {
        if self.newest.len() <= id {
            self.newest.resize(id + 1, None);
        }
        if self.reached.len() <= n {
            self.reached.resize(n + 1, (0, 0));
        }
        let from = self.newest[id].map_or(0, |newest| newest + 1);
        for probe in self.reached.iter_mut().take(n + 1).skip(from) {
            probe.0 += 1;
            probe.1 = probe.1.max(at);
        }
        self.newest[id] = Some(self.newest[id].map_or(n, |newest| newest.max(n)));
    }

    /// When probe `n` had reached all of `streams`; `None` if some never got it.
    pub(super) fn converged(&self, n: usize, streams: usize) -> Option<u128> {
        self.reached
            .get(n)
            .filter(|(count, _)| *count >= streams && streams > 0)
            .map(|(_, at)| *at)
    }
}

pub(super) fn t8(o: &Opts) {
    let seconds = env_or("SCALE_T8_SECONDS", if o.quick { 10 } else { 60 });
    let streams = env_or("SCALE_T8_STREAMS", if o.quick { 100 } else { 1_000 });
    let rate = env_or("SCALE_T8_RATE", 1_000);
    let pods = 1_000;
    let debounce = debounce();
    eprintln!(
        "T8: {rate} events/s for {seconds} s, {streams} streams, {pods} pods, debounce {debounce:?}"
    );
    let rt = runtime();
    let outcome = rt.block_on(sustained(pods, streams, rate, seconds, debounce));
    let probes = outcome.convergence.len();
    let done: Vec<f64> = outcome.convergence.iter().flatten().copied().collect();
    let missing = probes - done.len();
    let p99 = percentile(&mut done.clone(), 99.0);
    let p50 = median(&mut done.clone());
    let max = done.iter().copied().fold(0.0, f64::max);
    let achieved = outcome.sent as f64 / outcome.elapsed.as_secs_f64();
    let size = format!(
        "{} streams, {}, {rate}/s x {seconds} s, debounce {}/{} ms",
        outcome.connected,
        Spec::new(pods).label(),
        debounce.after.as_millis(),
        debounce.max.as_millis()
    );
    emit(row(
        "T8",
        size.clone(),
        "sustained churn: probe -> every stream, p99",
        p99,
        "ms",
        "p99 < 200 ms",
        Some(missing == 0 && p99 < 200.0 && outcome.connected == streams),
        format!(
            "p50 {p50:.1} / max {max:.1} ms over {probes} probes ({missing} never reached every stream); {achieved:.0} events/s achieved; {} snapshots ({:.1} events each); {:.1} responses per stream per s; clients in another process; RSS is the server's",
            outcome.snapshots,
            outcome.sent as f64 / outcome.snapshots.max(1) as f64,
            outcome.responses as f64
                / outcome.connected.max(1) as f64
                / outcome.elapsed.as_secs_f64()
        ),
    ));
    let rss = &outcome.rss;
    let mb = |b: u64| b as f64 / 1e6;
    let first = rss.first().copied().unwrap_or(0);
    let quarter = rss.get(rss.len() / 4).copied().unwrap_or(first);
    let last = rss.last().copied().unwrap_or(0);
    let peak = rss.iter().copied().max().unwrap_or(0);
    emit(row(
        "T8",
        size,
        "RSS growth from 1/4 of the run to its end",
        mb(last.saturating_sub(quarter)),
        "MB",
        "bounded (no growth with time)",
        None,
        format!(
            "server RSS: {:.0} MB at the start, {:.0} at 1/4, {:.0} at the end, peak {:.0}",
            mb(first),
            mb(quarter),
            mb(last),
            mb(peak)
        ),
    ));
}

pub(super) fn epoch_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Each stream follows the churn in its own task (reporting probes on `lines`) until `stop`.
pub(super) fn spawn_followers(
    readers: &mut tokio::task::JoinSet<()>,
    streams: Vec<LeanStream>,
    probe_uid: &str,
    lines: &mpsc::UnboundedSender<String>,
    responses: &Arc<std::sync::atomic::AtomicUsize>,
    stop: &CancellationToken,
) {
    for (id, stream) in streams.into_iter().enumerate() {
        let (lines, stop) = (lines.clone(), stop.clone());
        let (probe_uid, responses) = (probe_uid.to_string(), responses.clone());
        readers.spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = stream.follow(id, &probe_uid, &lines, &responses) => {}
            }
        });
    }
}

/// Ends when the parent closes this client process's stdin: the run is over.
pub(super) fn stdin_closed() -> tokio::task::JoinHandle<()> {
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
}

/// The T8 client process: `count` ztunnel-shaped streams that ACK every response and report
/// each arrival of the probe pod (`P stream probe micros`), until stdin closes (T11 runs
/// them too).
///
/// The streams are raw HTTP/2 (h2, with hyper's client windows: 2 MiB per stream, 5 MiB per
/// connection, as the tonic clients had) speaking delta ADS over gRPC framing: the same
/// requests, one ACK per response. Each response is read only as far as an ACK needs (its
/// type URL and nonce) and each resource's name; only the probe pod's payload is decoded.
/// tonic clients (`SCALE_T8_CLIENTS=tonic`) decode every response in full, which on a 2-core
/// machine takes much of the CPU the server also needs, so that T8 measures the clients as much
/// as the server.
pub(super) fn t8_clients_process(address: &str, count: usize, probe_uid: &str) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    let tonic_clients = std::env::var("SCALE_T8_CLIENTS").is_ok_and(|v| v == "tonic");
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
        let responses = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let mut readers = tokio::task::JoinSet::new();
        if tonic_clients {
            let (clients, _) = connect_all(address, count, 64, &Known::default()).await;
            let _ = lines.send(format!("READY {}", clients.len()));
            for (id, client) in clients.into_iter().enumerate() {
                let (lines, stop) = (lines.clone(), stop.clone());
                let (probe_uid, responses) = (probe_uid.to_string(), responses.clone());
                readers.spawn(tonic_reader(id, client, lines, stop, probe_uid, responses));
            }
        } else {
            let streams: Vec<LeanStream> = futures::stream::iter(0..count)
                .map(|n| async move { LeanStream::sync(address, n).await })
                .buffer_unordered(64)
                .filter_map(
                    |r| async move { r.map_err(|e| eprintln!("T8 client failed: {e:#}")).ok() },
                )
                .collect()
                .await;
            let _ = lines.send(format!("READY {}", streams.len()));
            spawn_followers(&mut readers, streams, probe_uid, &lines, &responses, &stop);
        }
        let stdin = stdin_closed();
        // At most 900 s (or `SCALE_CLIENTS_SECONDS`, which T11 sets to its run's length),
        // should the parent never close stdin.
        let limit = env_or("SCALE_CLIENTS_SECONDS", 900) as u64;
        let _ = tokio::time::timeout(Duration::from_secs(limit), stdin).await;
        stop.cancel();
        readers.shutdown().await;
        let _ = lines.send(format!(
            "R {}",
            responses.load(std::sync::atomic::Ordering::Relaxed)
        ));
        drop(lines);
        let _ = writer.join();
    });
}

/// One tonic client's reading loop (`SCALE_T8_CLIENTS=tonic`): decodes each response in full.
async fn tonic_reader(
    id: usize,
    mut client: Client,
    lines: mpsc::UnboundedSender<String>,
    stop: CancellationToken,
    probe_uid: String,
    responses: Arc<std::sync::atomic::AtomicUsize>,
) {
    loop {
        let message = tokio::select! {
            _ = stop.cancelled() => return,
            m = client.responses.message() => m,
        };
        let Ok(Some(response)) = message else { return };
        let at = epoch_micros();
        responses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if client.ack(&response).await.is_err() {
            return;
        }
        let Some(any) = response
            .resources
            .iter()
            .find(|r| r.name == probe_uid)
            .and_then(|r| r.resource.as_ref())
        else {
            continue;
        };
        if let Some(n) = probe_revision(&any.value) {
            let _ = lines.send(format!("P {id} {n} {at}"));
        }
    }
}

/// The `N` of a probe pod's `canonical_revision: probe-N`, from its encoded Address.
fn probe_revision(address: &[u8]) -> Option<String> {
    match Address::decode(address) {
        Ok(Address {
            r#type: Some(ambientd::pb::workload::address::Type::Workload(w)),
        }) => w
            .canonical_revision
            .strip_prefix("probe-")
            .map(str::to_string),
        _ => None,
    }
}

/// A `DeltaDiscoveryResponse` read only as far as the lean client needs: the fields an ACK
/// names, and each resource's name and undecoded `Any` (prost reads a message field as its
/// bytes, without copying them out of the received buffer).
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Skimmed {
    #[prost(message, repeated, tag = "2")]
    resources: Vec<SkimmedResource>,
    #[prost(string, tag = "4")]
    pub(super) type_url: String,
    #[prost(string, tag = "5")]
    pub(super) nonce: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SkimmedResource {
    #[prost(bytes = "bytes", tag = "3")]
    name: bytes::Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    resource: bytes::Bytes,
}

/// An `Any`'s value (field 2), undecoded.
#[derive(Clone, PartialEq, prost::Message)]
struct SkimmedAny {
    #[prost(bytes = "bytes", tag = "2")]
    value: bytes::Bytes,
}

/// A lean T8 stream: raw h2, gRPC-framed delta ADS.
pub(super) struct LeanStream {
    _send: h2::client::SendRequest<bytes::Bytes>,
    requests: h2::SendStream<bytes::Bytes>,
    body: h2::RecvStream,
    /// Received bytes not yet a whole gRPC message.
    pending: bytes::BytesMut,
}

impl LeanStream {
    /// Connects as ztunnel `n`, sends both wildcard initial requests, and reads (and ACKs)
    /// until both types are answered.
    pub(super) async fn sync(
        address: std::net::SocketAddr,
        n: usize,
    ) -> anyhow::Result<LeanStream> {
        Self::sync_within(address, n, WAIT).await
    }

    /// As [`LeanStream::sync`], waiting at most `wait` for the initial responses.
    pub(super) async fn sync_within(
        address: std::net::SocketAddr,
        n: usize,
        wait: Duration,
    ) -> anyhow::Result<LeanStream> {
        let storm::RawStream {
            send,
            mut requests,
            response,
        } = storm::open_delta(address, Some((2 * 1024 * 1024, 5 * 1024 * 1024))).await?;
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
        let body = tokio::time::timeout(wait, response).await??.into_body();
        let mut stream = LeanStream {
            _send: send,
            requests,
            body,
            pending: bytes::BytesMut::new(),
        };
        let mut answered = [false; 2];
        while !(answered[0] && answered[1]) {
            let response = tokio::time::timeout(wait, stream.next())
                .await
                .map_err(|_| anyhow::anyhow!("no initial responses within {wait:?}"))??;
            answered[usize::from(response.type_url == AUTHORIZATION_TYPE)] = true;
        }
        Ok(stream)
    }

    /// The next response, ACKed.
    async fn next(&mut self) -> anyhow::Result<Skimmed> {
        use bytes::Buf;
        loop {
            if self.pending.len() >= 5 {
                let p = &self.pending;
                let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                if self.pending.len() >= 5 + len {
                    self.pending.advance(5);
                    let message = self.pending.split_to(len).freeze();
                    let response = Skimmed::decode(message)?;
                    self.requests.send_data(
                        storm::grpc_frame(&DeltaDiscoveryRequest {
                            type_url: response.type_url.clone(),
                            response_nonce: response.nonce.clone(),
                            ..Default::default()
                        }),
                        false,
                    )?;
                    return Ok(response);
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

    /// Reads, ACKs and reports the probe's arrivals until the stream ends.
    pub(super) async fn follow(
        mut self,
        id: usize,
        probe_uid: &str,
        lines: &mpsc::UnboundedSender<String>,
        responses: &std::sync::atomic::AtomicUsize,
    ) {
        while let Ok(response) = self.next().await {
            let at = epoch_micros();
            responses.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let probe = response
                .resources
                .iter()
                .find(|r| r.name.as_ref() == probe_uid.as_bytes());
            let Some(any) = probe.and_then(|r| SkimmedAny::decode(r.resource.clone()).ok()) else {
                continue;
            };
            if let Some(n) = probe_revision(&any.value) {
                let _ = lines.send(format!("P {id} {n} {at}"));
            }
        }
    }
}
