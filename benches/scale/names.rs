//! T10: on-demand names. Streams that each subscribe to `MAX_SUBSCRIBED_NAMES` (100,000)
//! on-demand names, as an on-demand ztunnel would after meeting that many addresses: every pod
//! of the cluster (they resolve) and unknown addresses for the rest. Half the streams ask in
//! one request, half in increments of 1,000 (each answered before the next). Reports the time
//! to answer and the server's RSS per stream once they are all subscribed. The clients run in
//! another process, so the RSS is the server's.
//!
//! `SCALE_T10_STREAMS` (10; quick 4), `SCALE_T10_PODS` (10,000; quick 1,000),
//! `SCALE_T10_NAMES` (100,000, the limit).

use super::*;

use ambientd::push::subscription::MAX_SUBSCRIBED_NAMES;

const INCREMENT: usize = 1_000;

fn sizes(o: &Opts) -> (usize, usize, usize) {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    (
        env("SCALE_T10_STREAMS", if o.quick { 4 } else { 10 }).max(1),
        env("SCALE_T10_PODS", if o.quick { 1_000 } else { 10_000 }),
        env("SCALE_T10_NAMES", MAX_SUBSCRIBED_NAMES).min(MAX_SUBSCRIBED_NAMES),
    )
}

pub(super) fn t10(o: &Opts) {
    let (streams, pods, names) = sizes(o);
    eprintln!("T10: {streams} streams x {names} on-demand names over {pods} pods");
    let spec = Spec::new(pods);
    let docs = cluster_json(&spec);
    let (_index, snapshot, _) = build(&docs);
    drop(docs);
    let rt = runtime();
    let (before, after, lines) = rt.block_on(async {
        let server = serve(snapshot).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = rss_bytes();
        let exe = std::env::current_exe().expect("exe");
        let mut child = Command::new(exe)
            .args([
                "--t10-clients",
                &server.address.to_string(),
                &streams.to_string(),
                &pods.to_string(),
                &names.to_string(),
            ])
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn the T10 clients");
        let stdout = child.stdout.take().expect("stdout");
        let read = tokio::task::spawn_blocking(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let done = line.starts_with("READY");
                lines.push(line);
                if done {
                    break;
                }
            }
            lines
        });
        let lines = tokio::time::timeout(Duration::from_secs(600), read)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_bytes();
        drop(child.stdin.take());
        let _ = child.wait();
        server.stop.cancel();
        (before, after, lines)
    });
    let mut one = Vec::new();
    let mut increments = Vec::new();
    let mut steps = Vec::new();
    let mut resolved = 0usize;
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ONE", ms, got] => {
                one.extend(ms.parse::<f64>().ok());
                resolved = got.parse().unwrap_or(resolved);
            }
            ["INC", total, step_p50, step_p99] => {
                increments.extend(total.parse::<f64>().ok());
                steps.extend(step_p50.parse::<f64>().ok());
                steps.extend(step_p99.parse::<f64>().ok());
            }
            _ => {}
        }
    }
    let subscribed = one.len() + increments.len();
    let per = after.saturating_sub(before) as f64 / subscribed.max(1) as f64;
    let size = format!(
        "{subscribed} of {streams} streams x {} names, {}",
        short(names),
        spec.label()
    );
    emit(row(
        "T10",
        size.clone(),
        "server RSS per stream holding the names",
        per / 1e6,
        "MB",
        "bounded by the cap",
        Some(subscribed == streams),
        format!(
            "{:.1} B per name; server RSS {:.0} -> {:.0} MB; {resolved} names resolved per stream",
            per / names as f64,
            before as f64 / 1e6,
            after as f64 / 1e6
        ),
    ));
    emit(row(
        "T10",
        size.clone(),
        "time to answer, one request",
        median(&mut one),
        "ms",
        "-",
        None,
        format!("median of {} streams", one.len()),
    ));
    emit(row(
        "T10",
        size,
        "time to subscribe in increments of 1,000",
        median(&mut increments),
        "ms",
        "-",
        None,
        format!(
            "median of {} streams; per increment the streams' p50 / p99 medians {:.2} / {:.2} ms",
            increments.len(),
            median(&mut steps.iter().step_by(2).copied().collect::<Vec<_>>()),
            median(&mut steps.iter().skip(1).step_by(2).copied().collect::<Vec<_>>())
        ),
    ));
}

/// The names stream `n` asks for: every pod's uid, then addresses outside the cluster.
fn names_for(n: usize, pods: &[String], count: usize) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().take(count).cloned().collect();
    let base = 0x6400_0000u32 + (n as u32) * 0x0004_0000;
    let mut i = 0;
    while names.len() < count {
        names.push(format!("/{}", ipv4(base, i)));
        i += 1;
    }
    names
}

/// The T10 client process: `streams` on-demand streams, one after another, each subscribing to
/// `names` names (even ones in one request, odd ones in increments). Prints `ONE ms resolved`
/// or `INC total_ms p50 p99` per stream, then `READY`, and holds the streams until stdin closes.
pub(super) fn t10_clients_process(address: &str, streams: usize, pods: usize, names: usize) {
    let rt = runtime();
    let address: std::net::SocketAddr = address.parse().expect("address");
    let spec = Spec::new(pods);
    let uids: Vec<String> = (0..spec.pods)
        .map(|i| match decode_one(pod_json(&spec, i, true)) {
            Object::Pod(p) => format!("Kubernetes//Pod/{}/{}", p.namespace(), p.name()),
            _ => unreachable!(),
        })
        .collect();
    rt.block_on(async {
        let mut held = Vec::new();
        for n in 0..streams {
            match on_demand_stream(address, n, names_for(n, &uids, names), n % 2 == 1).await {
                Ok((client, line)) => {
                    println!("{line}");
                    held.push(client);
                }
                Err(e) => eprintln!("T10 stream {n} failed: {e:#}"),
            }
        }
        println!("READY {}", held.len());
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
        drop(held);
    });
}

/// Opens an on-demand stream (`subscribe: [*], unsubscribe: [*]`), then subscribes to `names`.
async fn on_demand_stream(
    address: std::net::SocketAddr,
    n: usize,
    names: Vec<String>,
    in_increments: bool,
) -> anyhow::Result<(Client, String)> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
        .connect_timeout(WAIT)
        .connect()
        .await?;
    let mut grpc =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(512 * 1024 * 1024);
    let (requests, rx) = mpsc::channel(16);
    requests
        .send(DeltaDiscoveryRequest {
            node: Some(ztunnel_node(n)),
            type_url: ADDRESS_TYPE.to_string(),
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
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
    let first = client.recv().await?;
    client.ack(&first).await?;
    let ask = |names: Vec<String>| DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE.to_string(),
        resource_names_subscribe: names,
        ..Default::default()
    };
    if !in_increments {
        let started = Instant::now();
        client.requests.send(ask(names)).await?;
        let answer = client.recv().await?;
        let took = started.elapsed();
        client.ack(&answer).await?;
        let line = format!("ONE {:.3} {}", ms(took), answer.resources.len());
        return Ok((client, line));
    }
    let started = Instant::now();
    let mut steps = Vec::new();
    for chunk in names.chunks(INCREMENT) {
        let step = Instant::now();
        client.requests.send(ask(chunk.to_vec())).await?;
        let answer = client.recv().await?;
        steps.push(ms(step.elapsed()));
        client.ack(&answer).await?;
    }
    let total = ms(started.elapsed());
    let line = format!(
        "INC {total:.3} {:.3} {:.3}",
        median(&mut steps.clone()),
        percentile(&mut steps, 99.0)
    );
    Ok((client, line))
}
