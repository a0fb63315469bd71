//! T6, the reconnect storm: C ztunnels reconnect at once, each reporting the versions of a full
//! sync in `initial_resource_versions` (6.5 MB of request at 100k pods).
//!
//! The clients run in another process (so the server's time and RSS are its own), and are raw
//! HTTP/2 streams (h2) that all send one shared, pre-encoded pair of initial requests: a tonic
//! client would hold its own copy of the map and of its encoding (about 20 MB per client at
//! 100k pods, 20 GB for 1,000), which is the client's cost, not the server's. Every response
//! is decoded and ACKed, as ztunnel does.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::*;

pub(super) const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// How long one storm client waits for its initial responses: in a storm each waits its turn.
const STORM_WAIT: Duration = Duration::from_secs(180);

/// `message` as one gRPC frame.
pub(super) fn grpc_frame(message: &impl Message) -> Bytes {
    let mut buf = BytesMut::with_capacity(5 + message.encoded_len());
    buf.put_u8(0);
    buf.put_u32(message.encoded_len() as u32);
    message.encode(&mut buf).expect("sized buffer");
    buf.freeze()
}

/// A raw delta ADS stream on its own HTTP/2 connection: the connection's handle (kept, or the
/// connection closes), the request body, and the response, its headers still to come.
pub(super) struct RawStream {
    pub(super) send: h2::client::SendRequest<Bytes>,
    pub(super) requests: h2::SendStream<Bytes>,
    pub(super) response: h2::client::ResponseFuture,
}

/// Connects to `address` and opens a `DeltaAggregatedResources` stream, with these HTTP/2
/// windows (stream, connection) or, `None`, h2's defaults (64 KiB).
pub(super) async fn open_delta(
    address: std::net::SocketAddr,
    windows: Option<(u32, u32)>,
) -> anyhow::Result<RawStream> {
    let tcp = tokio::net::TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let mut builder = h2::client::Builder::new();
    if let Some((stream, connection)) = windows {
        builder
            .initial_window_size(stream)
            .initial_connection_window_size(connection);
    }
    let (send, connection) = builder.handshake(tcp).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await?;
    let request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}{DELTA_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (response, requests) = send.send_request(request, false)?;
    Ok(RawStream {
        send,
        requests,
        response,
    })
}

/// One storm client's open stream (kept until every client is synced).
struct Synced {
    _send: h2::client::SendRequest<Bytes>,
    _stream: h2::SendStream<Bytes>,
    _body: h2::RecvStream,
    bytes: usize,
}

/// Connects, sends `initial` (both types' initial requests, framed), and reads and ACKs
/// responses until both types are answered.
async fn storm_client(address: std::net::SocketAddr, initial: Bytes) -> anyhow::Result<Synced> {
    let RawStream {
        send,
        requests: mut stream,
        response,
    } = open_delta(address, None).await?;
    // Zero-copy: h2 sends slices of the shared buffer as the server's window allows.
    stream.send_data(initial, false)?;
    let response = tokio::time::timeout(STORM_WAIT, response).await??;
    let mut body = response.into_body();
    let mut buf = BytesMut::new();
    let mut answered = [false; 2];
    let mut bytes = 0;
    let deadline = tokio::time::Instant::now() + STORM_WAIT;
    while !(answered[0] && answered[1]) {
        let chunk = tokio::time::timeout_at(deadline, body.data())
            .await
            .map_err(|_| anyhow::anyhow!("no initial responses within {STORM_WAIT:?}"))?
            .ok_or_else(|| anyhow::anyhow!("stream ended"))??;
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            let message = buf.split_to(len);
            let response = DeltaDiscoveryResponse::decode(message)?;
            bytes += len;
            answered[usize::from(response.type_url == AUTHORIZATION_TYPE)] = true;
            stream.send_data(
                grpc_frame(&DeltaDiscoveryRequest {
                    type_url: response.type_url,
                    response_nonce: response.nonce,
                    ..Default::default()
                }),
                false,
            )?;
        }
    }
    Ok(Synced {
        _send: send,
        _stream: stream,
        _body: body,
        bytes,
    })
}

/// The T6 client process: learns the versions of a full sync, then on each `GO` line from
/// stdin reconnects `count` clients at once with them and reports
/// `DONE <ms> <bytes received> <clients synced>`. Ends when stdin closes.
pub(super) fn t6_clients_process(address: &str, count: usize) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    rt.block_on(async {
        let (first, initial) = Client::sync(address, 0, &Known::default())
            .await
            .expect("first sync");
        let full_bytes = first.bytes;
        drop(first);
        let known: Known = initial.map(|response| {
            response
                .resources
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect()
        });
        // Both initial requests, as a reconnecting ztunnel sends them, encoded once.
        let mut shared = BytesMut::new();
        for (type_url, versions) in [ADDRESS_TYPE, AUTHORIZATION_TYPE].iter().zip(&known) {
            shared.extend_from_slice(&grpc_frame(&DeltaDiscoveryRequest {
                node: Some(ztunnel_node(1)),
                type_url: type_url.to_string(),
                initial_resource_versions: versions.clone().into_iter().collect(),
                ..Default::default()
            }));
        }
        let shared = shared.freeze();
        let request_bytes = shared.len();
        drop(known);
        println!("READY {full_bytes} {request_bytes}");
        let _ = std::io::stdout().flush();
        let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        });
        while let Some(line) = lines.recv().await {
            if line.trim() != "GO" {
                continue;
            }
            let started = Instant::now();
            let results: Vec<anyhow::Result<Synced>> =
                futures::future::join_all((0..count).map(|_| {
                    let shared = shared.clone();
                    async move {
                        storm_client(address, shared)
                            .await
                            .map_err(|e| anyhow::anyhow!("after {:.1?}: {e}", started.elapsed()))
                    }
                }))
                .await;
            let elapsed = started.elapsed();
            let mut failures = 0;
            for result in &results {
                if let Err(e) = result {
                    if failures < 3 || failures % 50 == 0 {
                        eprintln!("  T6 client failed: {e}");
                    }
                    failures += 1;
                }
            }
            let synced: Vec<&Synced> = results.iter().flatten().collect();
            let bytes: usize = synced.iter().map(|s| s.bytes).sum();
            println!("DONE {} {bytes} {}", ms(elapsed), synced.len());
            let _ = std::io::stdout().flush();
            drop(results);
        }
    });
}

/// The server side of T6 at one size: serves `pods`, drives `runs` storms of `clients` from a
/// client process, and samples its own RSS while each runs.
pub(super) struct StormOutcome {
    pub(super) times: Vec<f64>,
    pub(super) sent: Vec<f64>,
    pub(super) synced: usize,
    pub(super) full_bytes: usize,
    pub(super) request_bytes: usize,
    pub(super) rss_before: u64,
    pub(super) rss_peak: u64,
}

/// The numbers on the client process's next line starting with `prefix`.
async fn next(lines: &mut mpsc::UnboundedReceiver<String>, prefix: &str) -> Option<Vec<f64>> {
    let wait = tokio::time::timeout(Duration::from_secs(900), async {
        while let Some(line) = lines.recv().await {
            if let Some(rest) = line.strip_prefix(prefix) {
                return Some(
                    rest.split_whitespace()
                        .filter_map(|w| w.parse::<f64>().ok())
                        .collect::<Vec<f64>>(),
                );
            }
        }
        None
    });
    wait.await.ok().flatten()
}

pub(super) async fn storm(snapshot: Arc<Snapshot>, clients: usize, runs: usize) -> StormOutcome {
    let server = serve(snapshot).await;
    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(exe)
        .args([
            "--t6-clients",
            &server.address.to_string(),
            &clients.to_string(),
        ])
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn the T6 clients");
    let mut stdin = child.stdin.take().expect("stdin");
    let (lines_tx, mut lines) = mpsc::unbounded_channel::<String>();
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut outcome = StormOutcome {
        times: Vec::new(),
        sent: Vec::new(),
        synced: clients,
        full_bytes: 0,
        request_bytes: 0,
        rss_before: 0,
        rss_peak: 0,
    };
    let Some(ready) = next(&mut lines, "READY ").await else {
        eprintln!("T6: the client process never got ready");
        let _ = child.kill();
        let _ = child.wait();
        server.stop.cancel();
        return outcome;
    };
    outcome.full_bytes = ready.first().copied().unwrap_or(0.0) as usize;
    outcome.request_bytes = ready.get(1).copied().unwrap_or(0.0) as usize;
    tokio::time::sleep(Duration::from_millis(500)).await;
    outcome.rss_before = rss_bytes();
    for _ in 0..runs {
        let stop_sampling = CancellationToken::new();
        let sampler = {
            let stop = stop_sampling.clone();
            tokio::spawn(async move {
                let mut peak = rss_bytes();
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return peak,
                        _ = tick.tick() => peak = peak.max(rss_bytes()),
                    }
                }
            })
        };
        if writeln!(stdin, "GO").and_then(|_| stdin.flush()).is_err() {
            break;
        }
        let done = next(&mut lines, "DONE ").await;
        stop_sampling.cancel();
        outcome.rss_peak = outcome.rss_peak.max(sampler.await.unwrap_or(0));
        let Some(done) = done else {
            eprintln!("T6: the storm never finished");
            break;
        };
        let (time, bytes, synced) = (done[0], done[1], done[2] as usize);
        eprintln!("  T6: {synced}/{clients} synced in {time:.0} ms, {bytes:.0} B received");
        outcome.times.push(time);
        outcome.sent.push(bytes);
        outcome.synced = outcome.synced.min(synced);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(stdin);
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    server.stop.cancel();
    outcome
}

/// T6's physical limit: bytes per second through one HTTP/2 stream on loopback (h2 at both
/// ends, the server's windows, nothing decoded), uploading `total` bytes as
/// a reconnecting proxy uploads its known versions.
pub(super) async fn loopback_throughput(total: usize) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        tcp.set_nodelay(true).expect("nodelay");
        // The server's receive windows, as ambientd has them.
        let window = ambientd::push::listener::RECEIVE_WINDOW;
        let mut connection = h2::server::Builder::new()
            .initial_window_size(window)
            .initial_connection_window_size(window)
            .handshake::<_, Bytes>(tcp)
            .await
            .expect("handshake");
        let (request, mut respond) = connection
            .accept()
            .await
            .expect("a stream")
            .expect("a request");
        tokio::spawn(async move { while connection.accept().await.is_some() {} });
        let mut body = request.into_body();
        let mut received = 0usize;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("data");
            received += chunk.len();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let _ = respond.send_response(tonic::codegen::http::Response::new(()), true);
        received
    });
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    tcp.set_nodelay(true).expect("nodelay");
    let (send, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut send = send.ready().await.expect("ready");
    let request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{address}/upload"))
        .body(())
        .expect("request");
    let chunk = Bytes::from(vec![7u8; 1024 * 1024]);
    let started = Instant::now();
    let (_response, mut stream) = send.send_request(request, false).expect("send");
    let mut sent = 0;
    while sent < total {
        // Send within the window, as a real sender does, instead of buffering everything.
        stream.reserve_capacity(chunk.len());
        let capacity = futures::future::poll_fn(|cx| stream.poll_capacity(cx))
            .await
            .expect("capacity")
            .expect("capacity");
        let n = capacity.min(chunk.len()).min(total - sent);
        stream.send_data(chunk.slice(..n), false).expect("data");
        sent += n;
    }
    stream.send_data(Bytes::new(), true).expect("end");
    let received = server.await.expect("server");
    let elapsed = started.elapsed();
    assert_eq!(received, total);
    total as f64 / elapsed.as_secs_f64()
}
