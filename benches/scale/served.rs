//! T4–T7: an index-backed `AdsServer` on 127.0.0.1 and ztunnel-shaped delta ADS clients.

use super::*;

// ---------------------------------------------------------------------------------------------
// Served scenarios: an Index-backed AdsServer on 127.0.0.1 and ztunnel-shaped clients

pub(super) struct Server {
    pub(super) address: std::net::SocketAddr,
    pub(super) publish: watch::Sender<Option<Arc<Snapshot>>>,
    pub(super) stop: CancellationToken,
}

pub(super) async fn serve(snapshot: Arc<Snapshot>) -> Server {
    let listener =
        ambientd::push::server::listen("127.0.0.1:0".parse().expect("address")).expect("bind");
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
        let _ = ambientd::push::server::grpc_server()
            .add_service(ads)
            .serve_with_incoming_shutdown(
                ambientd::push::listener::proxy_connections(listener),
                token.cancelled_owned(),
            )
            .await;
    });
    Server {
        address,
        publish,
        stop,
    }
}

/// Publishes the index's next snapshot, stamped as the server's own indexer does.
pub(super) fn publish(server: &Server, index: &mut Index) {
    let mut snapshot = index.snapshot();
    if let Some(s) = Arc::get_mut(&mut snapshot) {
        s.published_at = Some(Instant::now());
    }
    server.publish.send_replace(Some(snapshot));
}

pub(super) fn ztunnel_node(n: usize) -> Node {
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
        ..Default::default()
    }
}

/// Versions a client already holds: [Address, Authorization], `{name: version}`.
pub(super) type Known = [BTreeMap<String, String>; 2];

pub(super) struct Client {
    pub(super) requests: mpsc::Sender<DeltaDiscoveryRequest>,
    pub(super) responses: tonic::Streaming<DeltaDiscoveryResponse>,
    /// Response bytes received (protobuf-encoded size, without gRPC/HTTP2 framing).
    pub(super) bytes: usize,
}

impl Client {
    /// Connects (one HTTP/2 connection per client, as each ztunnel has), subscribes to both
    /// types wildcard with `known` versions, and waits for both initial responses (ACKed).
    pub(super) async fn sync(
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

    pub(super) async fn recv(&mut self) -> anyhow::Result<DeltaDiscoveryResponse> {
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

    pub(super) async fn ack(&self, response: &DeltaDiscoveryResponse) -> anyhow::Result<()> {
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
pub(super) async fn connect_all(
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

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// What one stream saw for one response: (stream, arrival, bytes, the resources' own bytes
/// (their `Any` values), names).
pub(super) type Arrival = (usize, Instant, usize, usize, Vec<String>);

/// T4 and T5 over `streams` streams: returns (last-stream latencies ms, per-stream latencies ms,
/// bytes per response per stream, of which the envelope around the resources' values).
pub(super) async fn events_to_streams(
    pods: usize,
    streams: usize,
    events: usize,
) -> Option<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Duration)> {
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
                let values: usize = response
                    .resources
                    .iter()
                    .filter_map(|r| r.resource.as_ref())
                    .map(|any| any.value.len())
                    .sum();
                let names = response.resources.iter().map(|r| r.name.clone()).collect();
                if client.ack(&response).await.is_err() {
                    return;
                }
                if tx.send((id, at, bytes, values, names)).is_err() {
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
    let mut envelopes = Vec::new();
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
                Ok(Some((id, at, b, values, names))) => {
                    if names.iter().any(|n| **n == *name) && !got[id] {
                        got[id] = true;
                        count += 1;
                        latest = latest.max(at);
                        each.push(ms(at.duration_since(t0)));
                        bytes.push(b as f64);
                        envelopes.push((b - values) as f64);
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
    Some((last, each, bytes, envelopes, connect_time))
}

pub(super) fn t4(o: &Opts) {
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
        let Some((mut last, mut each, _, _, connect)) =
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

pub(super) fn t5(o: &Opts) {
    let rt = runtime();
    let sizes: &[usize] = if o.quick {
        &[1_000, 10_000]
    } else {
        &[1_000, 100_000]
    };
    for &pods in sizes {
        eprintln!("T5: {pods} pods, 10 streams");
        let Some((_, _, mut bytes, mut envelopes, _)) =
            rt.block_on(events_to_streams(pods, 10, 20))
        else {
            continue;
        };
        let med = median(&mut bytes);
        let envelope = median(&mut envelopes);
        emit(row(
            "T5",
            format!("10 streams, {}", Spec::new(pods).label()),
            "bytes per single-pod change per stream",
            med,
            "B",
            "<= 400 B, flat",
            Some(med <= 400.0),
            format!(
                "DeltaDiscoveryResponse encoded size (gRPC adds 5 B, HTTP/2 9 B per frame): the resource value (the Address around the Workload, as istiod encodes it) {:.0} B, the envelope around it {envelope:.0} B",
                med - envelope
            ),
        ));
    }
}

pub(super) fn t6(o: &Opts) {
    let rt = runtime();
    // `SCALE_T6_CASES=100000x1000,10000x100` sets the cases (pods x clients).
    let cases: Vec<(usize, usize)> = match std::env::var("SCALE_T6_CASES") {
        Ok(list) => list
            .split(',')
            .filter_map(|case| {
                let (pods, clients) = case.split_once('x')?;
                Some((pods.trim().parse().ok()?, clients.trim().parse().ok()?))
            })
            .collect(),
        Err(_) if o.quick => vec![(1_000, 50)],
        Err(_) => vec![(10_000, 1_000), (100_000, 100)],
    };
    for (pods, clients) in cases {
        eprintln!("T6: {clients} clients reconnecting to {pods} pods");
        let spec = Spec::new(pods);
        let docs = cluster_json(&spec);
        let (_index, snapshot, _) = build(&docs);
        drop(docs);
        let outcome = rt.block_on(super::storm::storm(snapshot, clients, runs(o).min(3)));
        // The physical limit: every client's request through one loopback HTTP/2 stream.
        let upload = (outcome.request_bytes * clients).max(1);
        let rate = rt.block_on(super::storm::loopback_throughput(upload.min(2 << 30)));
        let floor_ms = upload as f64 / rate * 1e3;
        let mut times = outcome.times;
        let mut sent = outcome.sent;
        let ok = outcome.synced;
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
                "{ok}/{clients} synced; {:.1}x the physical limit ({:.0} ms: the {:.1} GB of requests at {:.2} GB/s, one loopback HTTP/2 stream); each sent {:.1} MB of initial_resource_versions; server sent {:.0} B in all ({:.0} B per client) vs {:.1} MB for one full initial sync; server RSS {:.0} MB before, peak {:.0} MB; clients in another process",
                med / floor_ms,
                floor_ms,
                upload as f64 / 1e9,
                rate / 1e9,
                outcome.request_bytes as f64 / 1e6,
                bytes,
                bytes / clients as f64,
                outcome.full_bytes as f64 / 1e6,
                outcome.rss_before as f64 / 1e6,
                outcome.rss_peak as f64 / 1e6,
            ),
        ));
    }
}

pub(super) fn t7(o: &Opts) {
    // `SCALE_T7_STREAMS` sets the number of streams (default 10,000; 200 with `--quick`).
    let streams = std::env::var("SCALE_T7_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if o.quick { 200 } else { 10_000 });
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
        // With `--features dhat-heap`: every allocation from here on is recorded, and those
        // still live once the streams are idle are written to `dhat-heap.json`.
        #[cfg(feature = "dhat-heap")]
        let profiler = dhat::Profiler::builder().trim_backtraces(None).build();
        #[cfg(feature = "dhat-heap")]
        let heap_before = dhat::HeapStats::get();
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
        #[cfg(feature = "dhat-heap")]
        {
            let heap = dhat::HeapStats::get();
            let per = heap.curr_bytes.saturating_sub(heap_before.curr_bytes) as f64
                / connected.max(1) as f64;
            let blocks = heap.curr_blocks.saturating_sub(heap_before.curr_blocks) as f64
                / connected.max(1) as f64;
            eprintln!(
                "  T7 heap (dhat): {:.0} B in {blocks:.1} blocks live per idle stream",
                per
            );
            drop(profiler);
        }
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
pub(super) fn clients_process(address: &str, count: usize) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    rt.block_on(async {
        // `SCALE_T7_RECONNECT=1`: the streams connect as reconnecting ztunnels do, with the
        // versions of a full sync in `initial_resource_versions` (a large first request).
        let mut known = Known::default();
        if std::env::var("SCALE_T7_RECONNECT").is_ok_and(|v| v == "1") {
            let (_, initial) = Client::sync(address, 0, &known).await.expect("first sync");
            known = initial.map(|response| {
                response
                    .resources
                    .iter()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect()
            });
        }
        let (clients, elapsed) = connect_all(address, count, 64, &known).await;
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
