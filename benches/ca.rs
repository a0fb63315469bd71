//! CA throughput and latency through the real gRPC service over loopback TLS.
//!
//! `cargo bench --bench ca` prints, for 1 and 2 server worker threads:
//! * closed-loop certificates/s (64 requests in flight over 8 connections, like 8 ztunnels
//!   with ztunnel's limit of 8 CSRs in flight each);
//! * latency with 500 requests in flight (63 connections);
//! * latency of an open-loop load at half the measured capacity spread over 500 connections
//!   (500 ztunnels renewing certificates).
//!
//! As the ceiling it also prints the raw ring P-256 sign and verify rates on one core, and the
//! in-process signer (parse + verify CSR, sign leaf) without gRPC.
//!
//! With 2 server threads it then floods the CA from one caller (2,000 CSRs in flight over 8
//! connections, each re-sent as soon as it is answered or refused) and measures what the limits
//! on requests in flight (`ambientd::ca::limit`) make of it: CSRs signed and refused per second,
//! and another caller's CSR latency beside the same without the flood.
//!
//! Each connection is its own ztunnel (its own node's token), as in a mesh.
//!
//! Requests are ztunnel-shaped: a fresh P-256 CSR with an empty subject and one URI SAN, shared
//! mode (`ImpersonatedIdentity`), and a local token (validated once, then cached, as for a real
//! ztunnel that sends the same token on every call). `CA_BENCH_SECONDS` sets each phase's length
//! (default 3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ambientd::ca::signer::Csr;
use ambientd::ca::token::{LocalKey, Subject, local_claims};
use ambientd::ca::{CaConfig, PodInfo, SpiffeId, StaticPods};
use ambientd::discovery::Settings;
use ambientd::pb::google::protobuf::{Struct, Value, value::Kind};
use ambientd::pb::istio::v1::auth::IstioCertificateRequest;
use ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient;
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _};
use rustls::pki_types::ServerName;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

const IDENTITIES: usize = 64;
/// Nodes, each with a pod of every identity: a connection's ztunnel is on node `c % NODES`.
const NODES: usize = 64;
/// CSRs the flooding caller keeps in flight.
const FLOOD: usize = 2_000;
const CSRS: usize = 1024;

fn phase() -> Duration {
    let secs = std::env::var("CA_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

fn identity(i: usize) -> String {
    format!("spiffe://cluster.local/ns/bench/sa/sa-{}", i % IDENTITIES)
}

/// Ready-made requests: (CSR PEM, impersonated identity).
fn csrs() -> Vec<(String, String)> {
    (0..CSRS)
        .map(|i| {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::default();
            params.distinguished_name = DistinguishedName::new();
            let id = identity(i);
            params.subject_alt_names = vec![SanType::URI(id.as_str().try_into().unwrap())];
            (params.serialize_request(&key).unwrap().pem().unwrap(), id)
        })
        .collect()
}

fn raw_p256(duration: Duration) -> (f64, f64) {
    let rng = SystemRandom::new();
    let pkcs8 =
        EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    let public = signature::UnparsedPublicKey::new(
        &signature::ECDSA_P256_SHA256_ASN1,
        key.public_key().as_ref().to_vec(),
    );
    let message = [7u8; 300];
    let start = Instant::now();
    let mut signs = 0u64;
    let mut sig = key.sign(&rng, &message).unwrap();
    while start.elapsed() < duration / 2 {
        sig = key.sign(&rng, &message).unwrap();
        signs += 1;
    }
    let sign_rate = signs as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut verifies = 0u64;
    while start.elapsed() < duration / 2 {
        public.verify(&message, sig.as_ref()).unwrap();
        verifies += 1;
    }
    (sign_rate, verifies as f64 / start.elapsed().as_secs_f64())
}

fn in_process_signer(dir: &std::path::Path, csrs: &[(String, String)], duration: Duration) -> f64 {
    let now = time::OffsetDateTime::now_utc();
    let loaded =
        ambientd::ca::roots::load_or_create_self_signed(dir, "cluster.local", now).unwrap();
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < duration {
        let (pem, id) = &csrs[n % csrs.len()];
        let csr = Csr::parse_pem(pem).unwrap();
        let id = SpiffeId::parse(id).unwrap();
        loaded
            .signer
            .sign_workload(&csr, &id, Duration::from_secs(86400), now)
            .unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

struct Server {
    address: std::net::SocketAddr,
    root_cert: std::path::PathBuf,
    ca_dir: std::path::PathBuf,
    shutdown: CancellationToken,
    _snapshots: tokio::sync::watch::Sender<Option<Arc<ambientd::discovery::Snapshot>>>,
}

async fn start_server(dir: &std::path::Path) -> Server {
    let mut pods = StaticPods::default();
    for node in 0..NODES {
        for i in 0..IDENTITIES {
            pods.insert(
                "bench",
                &format!("pod-{i}-{node}"),
                PodInfo {
                    service_account: format!("sa-{i}"),
                    node: format!("node-{node}"),
                    uid: None,
                },
            );
        }
    }
    let config = CaConfig::local(dir);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let ads = ambientd::push::AdsServer::new(
        rx,
        Arc::new(ambientd::push::Registry::default()),
        Arc::new(ambientd::metrics::Metrics::new()),
    )
    .into_service();
    let shutdown = CancellationToken::new();
    let server = ambientd::ca::start(
        &config,
        &Settings::default(),
        ads,
        Arc::new(pods),
        shutdown.clone(),
    )
    .await
    .unwrap();
    let address = server.address;
    tokio::spawn(server.serve());
    Server {
        address,
        root_cert: config.root_cert_path(),
        ca_dir: dir.to_path_buf(),
        shutdown,
        _snapshots: tx,
    }
}

fn ztunnel_tls(root: &std::path::Path) -> Arc<rustls::ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| {
        matches!(
            s.suite(),
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384
                | rustls::CipherSuite::TLS13_AES_128_GCM_SHA256
        )
    });
    let mut roots = rustls::RootCertStore::empty();
    for cert in ambientd::ca::keys::certificates(&std::fs::read(root).unwrap()).unwrap() {
        roots.add(cert).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

async fn connect(address: std::net::SocketAddr, tls: Arc<rustls::ClientConfig>) -> Channel {
    let name = ServerName::try_from("istiod.istio-system.svc").unwrap();
    Endpoint::from_static("http://istiod.istio-system.svc:15012")
        .connect_with_connector(tower::service_fn(move |_| {
            let (tls, name) = (tls.clone(), name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(address).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(tls)
                    .connect(name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

fn request(csr: &(String, String), token: &str) -> tonic::Request<IstioCertificateRequest> {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "ImpersonatedIdentity".to_string(),
        Value {
            kind: Some(Kind::StringValue(csr.1.clone())),
        },
    );
    let mut request = tonic::Request::new(IstioCertificateRequest {
        csr: csr.0.clone(),
        validity_duration: 86400,
        metadata: Some(Struct { fields }),
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
        .metadata_mut()
        .insert("clusterid", "Kubernetes".parse().unwrap());
    request
}

#[derive(Default)]
struct Stats {
    rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration) -> Stats {
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Stats {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
        max: *latencies.last().unwrap(),
    }
}

/// `in_flight` looping callers over `connections` channels for `duration`.
async fn closed_loop(
    channels: &[Channel],
    tokens: &[String],
    csrs: &Arc<Vec<(String, String)>>,
    in_flight: usize,
    duration: Duration,
) -> Stats {
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for i in 0..in_flight {
        let mut client = IstioCertificateServiceClient::new(channels[i % channels.len()].clone());
        let (token, csrs) = (
            tokens[i % channels.len() % tokens.len()].clone(),
            csrs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = i;
            while Instant::now() < deadline {
                let begin = Instant::now();
                client
                    .create_certificate(request(&csrs[n % csrs.len()], &token))
                    .await
                    .unwrap();
                latencies.push(begin.elapsed());
                n += in_flight;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    summarize(all, start.elapsed())
}

/// Requests started at a fixed `rate` regardless of completions, over `channels`.
async fn open_loop(
    channels: &[Channel],
    tokens: &[String],
    csrs: &Arc<Vec<(String, String)>>,
    rate: f64,
    duration: Duration,
) -> Stats {
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = Vec::new();
    let mut n = 0usize;
    let mut next = tokio::time::Instant::now();
    while start.elapsed() < duration {
        tokio::time::sleep_until(next).await;
        next += interval;
        let mut client = IstioCertificateServiceClient::new(channels[n % channels.len()].clone());
        let request = request(
            &csrs[n % csrs.len()],
            &tokens[n % channels.len() % tokens.len()],
        );
        tasks.push(tokio::spawn(async move {
            let begin = Instant::now();
            client.create_certificate(request).await.unwrap();
            begin.elapsed()
        }));
        n += 1;
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.unwrap());
    }
    summarize(all, start.elapsed())
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let duration = phase();
    let csrs = Arc::new(csrs());

    let (sign, verify) = raw_p256(duration);
    println!(
        "ceiling (ring, 1 core): P-256 sign {sign:.0}/s, verify {verify:.0}/s, sign+verify {:.0}/s",
        1.0 / (1.0 / sign + 1.0 / verify)
    );
    let dir = tempfile::tempdir().unwrap();
    let signer_rate = in_process_signer(dir.path(), &csrs, duration);
    println!("in-process signer (parse+verify CSR, sign leaf, 1 core): {signer_rate:.0} certs/s");

    for workers in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap();
        let server = server_rt.block_on(start_server(dir.path()));
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        client_rt.block_on(async {
            let key = LocalKey::load_or_create(&server.ca_dir).unwrap();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let tokens: Vec<String> = (0..NODES)
                .map(|node| {
                    let subject = Subject {
                        namespace: "istio-system".into(),
                        service_account: "ztunnel".into(),
                        pod: None,
                        node: Some(format!("node-{node}")),
                    };
                    key.mint(&local_claims(
                        &subject,
                        &["istio-ca".into()],
                        now,
                        Duration::from_secs(3600),
                    ))
                    .unwrap()
                })
                .collect();
            let tls = ztunnel_tls(&server.root_cert);
            let mut channels = Vec::new();
            for _ in 0..500 {
                channels.push(connect(server.address, tls.clone()).await);
            }
            // Warm up (token cache, connections).
            closed_loop(&channels[..8], &tokens, &csrs, 64, Duration::from_millis(500)).await;
            let throughput = closed_loop(&channels[..8], &tokens, &csrs, 64, duration).await;
            println!(
                "gRPC, {workers} server thread(s), 64 in flight / 8 connections: {:.0} certs/s (p50 {}, p99 {})",
                throughput.rate,
                ms(throughput.p50),
                ms(throughput.p99)
            );
            let loaded = closed_loop(&channels[..63], &tokens, &csrs, 500, duration).await;
            println!(
                "gRPC, {workers} server thread(s), 500 in flight / 63 connections: {:.0} certs/s, p50 {}, p99 {}, max {}",
                loaded.rate,
                ms(loaded.p50),
                ms(loaded.p99),
                ms(loaded.max)
            );
            let rate = throughput.rate / 2.0;
            let open = open_loop(&channels, &tokens, &csrs, rate, duration).await;
            println!(
                "gRPC, {workers} server thread(s), open loop at {rate:.0}/s (half capacity) over 500 connections: p50 {}, p99 {}, max {}",
                ms(open.p50),
                ms(open.p99),
                ms(open.max)
            );
            if workers == 2 {
                flood(&channels, &tokens, &csrs, duration).await;
            }
        });
        server.shutdown.cancel();
        drop(client_rt);
        server_rt.shutdown_timeout(Duration::from_secs(1));
    }
}

/// One caller (node-0's ztunnel) keeps [`FLOOD`] CSRs in flight over 8 connections, re-sending
/// each as soon as it is answered; another (node-8's, on its own connection) asks for one
/// certificate at a time, first without the flood and then during it.
async fn flood(
    channels: &[Channel],
    tokens: &[String],
    csrs: &Arc<Vec<(String, String)>>,
    duration: Duration,
) {
    let victim = |deadline: Instant| {
        let mut client = IstioCertificateServiceClient::new(channels[8].clone());
        let (token, csrs) = (tokens[8].clone(), csrs.clone());
        async move {
            let mut latencies = Vec::new();
            let mut n = 0;
            while Instant::now() < deadline {
                let begin = Instant::now();
                client
                    .create_certificate(request(&csrs[n % csrs.len()], &token))
                    .await
                    .expect("the other caller was refused");
                latencies.push(begin.elapsed());
                n += 1;
            }
            latencies
        }
    };
    let start = Instant::now();
    let quiet = summarize(victim(start + duration).await, start.elapsed());

    let start = Instant::now();
    let deadline = start + duration;
    let signed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let refused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let message = Arc::new(std::sync::Mutex::new(String::new()));
    let flooders: Vec<_> = (0..FLOOD)
        .map(|i| {
            let mut client = IstioCertificateServiceClient::new(channels[i % 8].clone());
            let (token, csrs) = (tokens[0].clone(), csrs.clone());
            let (signed, refused, failed) = (signed.clone(), refused.clone(), failed.clone());
            let message = message.clone();
            tokio::spawn(async move {
                let mut n = i;
                while Instant::now() < deadline {
                    match client
                        .create_certificate(request(&csrs[n % csrs.len()], &token))
                        .await
                    {
                        Ok(_) => signed.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                            let mut m = message.lock().unwrap();
                            if m.is_empty() {
                                *m = status.message().to_string();
                            }
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        }
                        Err(_) => failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    };
                    n += FLOOD;
                }
            })
        })
        .collect();
    let rss = tokio::spawn(async move {
        let mut peak = 0;
        while Instant::now() < deadline {
            peak = peak.max(rss_bytes());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        peak
    });
    let during = summarize(victim(deadline).await, start.elapsed());
    for flooder in flooders {
        flooder.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let load = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "flood, 2 server threads: one caller with {FLOOD} CSRs in flight over 8 connections: {:.0} signed/s, {:.0} refused/s (RESOURCE_EXHAUSTED: \"{}\"), {} other errors",
        load(&signed) as f64 / elapsed,
        load(&refused) as f64 / elapsed,
        message.lock().unwrap(),
        load(&failed)
    );
    println!(
        "flood, 2 server threads: another caller, one CSR at a time: p50 {}, p99 {}, max {} ({} CSRs) during the flood; p50 {}, p99 {}, max {} ({} CSRs) without it; process RSS peak {:.0} MB (server and clients)",
        ms(during.p50),
        ms(during.p99),
        ms(during.max),
        (during.rate * elapsed).round(),
        ms(quiet.p50),
        ms(quiet.p99),
        ms(quiet.max),
        (quiet.rate * duration.as_secs_f64()).round(),
        rss.await.unwrap() as f64 / 1e6
    );
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}
