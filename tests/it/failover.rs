//! Failover between two replicas of the real binary (docs/deployment.md, "Failover"): both
//! read one manifests directory and share one CA directory; ten ztunnel-shaped clients hold
//! what each replica sent them while the manifests change under them. Replica A is killed with
//! SIGKILL mid-churn: each of its clients reconnects to B reporting what it holds in
//! `initial_resource_versions`, and
//! - every client is in sync with B within `SYNC_BOUND` of the kill;
//! - no response, from either replica, ever carries a resource at the version the client
//!   already holds (versions are content hashes, so B knows A's);
//! - no response ever removes a resource that still exists, not even a pod the dead replica
//!   had pushed moments before the kill that the survivor has not seen yet: the survivor
//!   holds a moved client's names it lacks for `--reconnect-removal-grace` (2 s by default,
//!   as the replicas here run) and has them by then (docs/deployment.md, "Failover");
//! - a certificate request in flight on A when it dies fails, and the same request to B is
//!   signed under the root the client trusts.
//!
//! Then B gets SIGTERM with all twenty streams on it: every stream ends with Unavailable and
//! B exits 0 well within its `--shutdown-grace` (shutdown.rs covers the single-stream case).

use crate::support::ca as ca_support;
use crate::support::common as support;
use crate::support::process::Replica;
use crate::support::xds::{CLUSTER, SERVICES, pod};

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ambientd::discovery::{ADDRESS_TYPE, AUTHORIZATION_TYPE};
use ambientd::pb::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};
use ambientd::pb::xds::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use prost::Message;
use support::{Manifests, XdsClient, ztunnel_node};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const GRACE: Duration = Duration::from_secs(6);
/// From the kill to every client in sync with the survivor (the measured figure is the
/// scale bench's T12; this bound only has to fail loudly).
const SYNC_BOUND: Duration = Duration::from_secs(5);
const PER_REPLICA: usize = 10;
/// Pods that are only ever updated, never deleted.
const STABLE: usize = 10;
/// Short-lived pods alive at once: each churn step adds one and deletes the oldest.
const EPHEMERAL: usize = 4;
const CHURN_EVERY: Duration = Duration::from_millis(50);
const WEB: &str = "spiffe://cluster.local/ns/demo/sa/web";

const POLICY: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-from-db, namespace: demo}
spec:
  selector: {matchLabels: {app: web}}
  action: ALLOW
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/db"]}}]
"#;

fn eph_uid(j: usize) -> String {
    format!("Kubernetes//Pod/demo/eph-{j}")
}

/// The churned pods at step `step`: stable pod `i` at version `v{(step + i) / 5}` (two of
/// them change each step) or `final`, and ephemeral pods `step..step + EPHEMERAL`.
fn churn_file(step: usize, last: bool) -> String {
    let mut docs: Vec<String> = (0..STABLE)
        .map(|i| {
            let version = if last {
                "final".to_string()
            } else {
                format!("v{}", (step + i) / 5)
            };
            pod(
                &format!("web-{i}"),
                &format!("10.244.1.{}", 10 + i),
                "web",
                &version,
            )
        })
        .collect();
    docs.extend((step..step + EPHEMERAL).map(|j| {
        pod(
            &format!("eph-{j}"),
            &format!("10.244.2.{}", j % 250 + 1),
            "eph",
            "v1",
        )
    }));
    docs.join("\n---\n")
}

/// What a client holds: name -> version, per type (Address, Authorization).
type Held = [BTreeMap<String, String>; 2];

/// What every client's task shares with the test.
#[derive(Default)]
struct Shared {
    /// Resources whose objects the churn has deleted (recorded before the file is written).
    deleted: Mutex<HashSet<String>>,
    violations: Mutex<Vec<String>>,
}

#[derive(Clone, Default)]
struct Report {
    held: Held,
    /// The replica whose responses it is reading.
    on: Option<SocketAddr>,
    /// After a move: responses and bytes the survivor sent, and when its first arrived.
    moved_responses: usize,
    moved_bytes: usize,
    moved_at: Option<Instant>,
}

fn type_index(type_url: &str) -> usize {
    usize::from(type_url == AUTHORIZATION_TYPE)
}

/// Applies a response to `held`, recording a violation for a resource re-sent at the version
/// held, or a removal of a resource that was not deleted.
fn apply(who: &str, held: &mut Held, response: &DeltaDiscoveryResponse, shared: &Shared) {
    let map = &mut held[type_index(&response.type_url)];
    for resource in &response.resources {
        if map.get(&resource.name) == Some(&resource.version) {
            shared.violations.lock().unwrap().push(format!(
                "{who}: re-sent {} at {}, which it held",
                resource.name, resource.version
            ));
        }
        map.insert(resource.name.clone(), resource.version.clone());
    }
    for name in &response.removed_resources {
        if !shared.deleted.lock().unwrap().contains(name) {
            shared
                .violations
                .lock()
                .unwrap()
                .push(format!("{who}: told {name} was removed; it still exists"));
        }
        map.remove(name);
    }
}

/// Subscribes like ztunnel to both types, reporting what it holds.
async fn subscribe(client: &XdsClient, held: &Held) {
    for (type_url, known) in [(ADDRESS_TYPE, &held[0]), (AUTHORIZATION_TYPE, &held[1])] {
        client
            .send(DeltaDiscoveryRequest {
                node: Some(ztunnel_node("node-a")),
                type_url: type_url.to_string(),
                initial_resource_versions: known.clone().into_iter().collect(),
                ..Default::default()
            })
            .await;
    }
}

/// One ztunnel: follows `home` and, when that stream ends, reconnects once to `survivor`
/// with what it holds. Returns the status that ended its last stream.
async fn follow(
    who: String,
    home: SocketAddr,
    survivor: SocketAddr,
    shared: Arc<Shared>,
    report: watch::Sender<Report>,
    stop: CancellationToken,
) -> Option<tonic::Status> {
    let mut held = Held::default();
    let mut last = None;
    let targets = if home == survivor {
        vec![home]
    } else {
        vec![home, survivor]
    };
    for (attempt, address) in targets.into_iter().enumerate() {
        let mut client = XdsClient::connect_to(address, |e| e).await;
        subscribe(&client, &held).await;
        report.send_modify(|r| r.on = Some(address));
        loop {
            let message = tokio::select! {
                _ = stop.cancelled() => return None,
                m = client.next_untimed() => m,
            };
            match message {
                Ok(Some(response)) => {
                    apply(&who, &mut held, &response, &shared);
                    // The stream may have just died (A killed): the next read says so.
                    let _ = client
                        .try_send(DeltaDiscoveryRequest {
                            type_url: response.type_url.clone(),
                            response_nonce: response.nonce.clone(),
                            ..Default::default()
                        })
                        .await;
                    let len = response.encoded_len();
                    report.send_modify(|r| {
                        r.held = held.clone();
                        if attempt > 0 {
                            r.moved_responses += 1;
                            r.moved_bytes += len;
                            r.moved_at.get_or_insert_with(Instant::now);
                        }
                    });
                }
                Ok(None) => {
                    last = None;
                    break;
                }
                Err(status) => {
                    last = Some(status);
                    break;
                }
            }
        }
    }
    last
}

/// Follows B with a fresh client until it holds the churn's final state; returns it.
async fn truth(b: SocketAddr, final_step: usize, shared: &Shared) -> Held {
    let mut client = XdsClient::connect_to(b, |e| e).await;
    subscribe(&client, &Held::default()).await;
    let mut held = Held::default();
    let want_eph: HashSet<String> = (final_step..final_step + EPHEMERAL).map(eph_uid).collect();
    // Stable pods last seen at revision `final`.
    let mut finals = HashSet::new();
    let done = |held: &Held, finals: &HashSet<String>| {
        let eph: HashSet<String> = held[0]
            .keys()
            .filter(|n| n.contains("/eph-"))
            .cloned()
            .collect();
        eph == want_eph && finals.len() == STABLE && !held[1].is_empty()
    };
    let deadline = Instant::now() + support::WAIT;
    while !done(&held, &finals) {
        let response = client.recv().await;
        let addresses = if response.type_url == ADDRESS_TYPE {
            support::addresses(&response)
        } else {
            BTreeMap::new()
        };
        let pods = addresses
            .into_iter()
            .filter(|(name, _)| name.starts_with("Kubernetes//Pod/"));
        for (name, address) in pods {
            if support::workload(&address).canonical_revision == "final" {
                finals.insert(name);
            } else {
                finals.remove(&name);
            }
        }
        apply("truth", &mut held, &response, shared);
        client.ack(&response).await;
        assert!(
            Instant::now() < deadline,
            "B never served the churn's final state"
        );
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_one_replica_its_clients_resync_on_the_other_and_sigterm_drains() {
    let manifests = Arc::new(Manifests::new(&[
        ("cluster.yaml", CLUSTER),
        ("services.yaml", SERVICES),
        ("policy.yaml", POLICY),
        ("churn.yaml", &churn_file(0, false)),
    ]));
    let ca_dir = tempfile::tempdir().unwrap();
    // A creates the CA; B, started after it is ready, loads the same one.
    let mut a = Replica::start(manifests.root(), ca_dir.path(), GRACE).await;
    let mut b = Replica::start(manifests.root(), ca_dir.path(), GRACE).await;

    let shared = Arc::new(Shared::default());
    let stop = CancellationToken::new();
    let mut clients = Vec::new();
    for n in 0..2 * PER_REPLICA {
        let home = if n < PER_REPLICA { a.xds } else { b.xds };
        let (report, reports) = watch::channel(Report::default());
        let who = format!(
            "client {n} (home {})",
            if n < PER_REPLICA { "A" } else { "B" }
        );
        let task = tokio::spawn(follow(
            who.clone(),
            home,
            b.xds,
            shared.clone(),
            report,
            stop.clone(),
        ));
        clients.push((who, reports, task));
    }
    // Every client synced: it holds every stable pod.
    let synced = |r: &Report| {
        (0..STABLE).all(|i| r.held[0].contains_key(&format!("Kubernetes//Pod/demo/web-{i}")))
    };
    for (who, reports, _) in &mut clients {
        tokio::time::timeout(support::WAIT, reports.wait_for(synced))
            .await
            .unwrap_or_else(|_| panic!("{who} did not sync in time"))
            .expect("client task");
    }

    // Churn: every CHURN_EVERY two stable pods change and an ephemeral pod comes and goes.
    let stop_churn = CancellationToken::new();
    let churn = {
        let (shared, stop_churn) = (shared.clone(), stop_churn.clone());
        let manifests = manifests.clone();
        tokio::spawn(async move {
            let mut step = 0;
            loop {
                let last = stop_churn.is_cancelled();
                step += 1;
                shared.deleted.lock().unwrap().insert(eph_uid(step - 1));
                manifests.write("churn.yaml", &churn_file(step, last));
                if last {
                    return step;
                }
                tokio::time::sleep(CHURN_EVERY).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // A certificate request in flight on A: headers sent, body held back.
    use ca_support::*;
    let root_cert = ca_dir.path().join("root-cert.pem");
    let token = local_token(
        ca_dir.path(),
        "istio-system",
        "ztunnel",
        None,
        Some("node-a"),
    );
    let (_key, csr) = ztunnel_csr(WEB);
    let (metadata, extensions, message) = csr_request(&csr, Some(&token), Some(WEB)).into_parts();
    let (release, held_back) = tokio::sync::oneshot::channel::<()>();
    let body = futures::stream::once(async move {
        let _ = held_back.await;
        message
    });
    let in_flight = tokio::spawn({
        let channel = channel(a.tls, ztunnel_tls(&root_cert), ISTIOD)
            .await
            .expect("TLS connect to A");
        async move {
            let mut grpc = tonic::client::Grpc::new(channel);
            grpc.ready().await.expect("CA channel ready");
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/istio.v1.auth.IstioCertificateService/CreateCertificate",
            );
            let codec = tonic_prost::ProstCodec::<
                IstioCertificateRequest,
                IstioCertificateResponse,
            >::default();
            grpc.client_streaming(
                tonic::Request::from_parts(metadata, extensions, body),
                path,
                codec,
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // SIGKILL A mid-churn; the churn goes on for a second, then writes its final state.
    let killed = Instant::now();
    a.signal("KILL");
    let status = a.exit_by(killed + support::WAIT, "after SIGKILL").await;
    assert!(!status.success(), "A was killed: {status}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_churn.cancel();
    let final_step = churn.await.expect("churn task");
    let truth = truth(b.xds, final_step, &shared).await;

    // (a) every client, moved or not, holds exactly what B serves, within the bound.
    let deadline = killed + SYNC_BOUND;
    for (who, reports, _) in &mut clients {
        let left = deadline.saturating_duration_since(Instant::now());
        let in_sync = matches!(
            tokio::time::timeout(
                left,
                reports.wait_for(|r| r.on == Some(b.xds) && r.held == truth),
            )
            .await,
            Ok(Ok(_))
        );
        if !in_sync {
            let r = reports.borrow().clone();
            let differ: Vec<&String> = truth[0]
                .iter()
                .chain(&truth[1])
                .filter(|(name, version)| !r.held.iter().any(|m| m.get(*name) == Some(*version)))
                .map(|(name, _)| name)
                .collect();
            panic!(
                "{who} was not in sync with B within {SYNC_BOUND:?} of the kill (on B: {}); it lacks or differs in {differ:?}; it holds {} names, B serves {}",
                r.on == Some(b.xds),
                r.held[0].len() + r.held[1].len(),
                truth[0].len() + truth[1].len()
            );
        }
    }
    let resynced = killed.elapsed();
    // (b) and (c), over every response either replica sent.
    let violations = shared.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    // The moved clients were sent something (the churn during the gap), but far less than
    // everything they hold: only what changed.
    for (who, reports, _) in clients.iter().take(PER_REPLICA) {
        let r = reports.borrow();
        let moved_at = r.moved_at.expect("a moved client heard from B");
        assert!(
            moved_at.duration_since(killed) < SYNC_BOUND,
            "{who} first heard from B {:?} after the kill",
            moved_at.duration_since(killed)
        );
        assert!(r.moved_responses > 0, "{who}: B sent nothing");
    }
    let first_heard = clients
        .iter()
        .take(PER_REPLICA)
        .filter_map(|(_, reports, _)| reports.borrow().moved_at)
        .map(|at| at.duration_since(killed))
        .max();
    eprintln!("failover: every moved client heard from B within {first_heard:?} of the kill");
    eprintln!(
        "failover: all {} clients in sync with B {resynced:?} after the kill",
        clients.len()
    );

    // (d) the CSR in flight on A failed with A; the same request to B is signed under the
    // root the client trusts.
    let _ = release.send(());
    let lost = tokio::time::timeout(support::WAIT, in_flight)
        .await
        .expect("the CSR on A never ended")
        .expect("CSR task");
    assert!(lost.is_err(), "a CSR on a killed replica cannot succeed");
    let channel = channel(b.tls, ztunnel_tls(&root_cert), ISTIOD)
        .await
        .expect("TLS connect to B");
    let response = ambientd::pb::istio::v1::auth::istio_certificate_service_client::IstioCertificateServiceClient::new(channel)
        .create_certificate(csr_request(&csr, Some(&token), Some(WEB)))
        .await
        .expect("the retried CSR is signed by B")
        .into_inner();
    assert_eq!(
        verify_chain(&response.cert_chain).uris,
        vec![WEB.to_string()]
    );
    let trusted = std::fs::read_to_string(&root_cert).expect("root-cert.pem");
    assert_eq!(
        response.cert_chain.last().map(|r| r.trim()),
        Some(trusted.trim()),
        "B signs under the root the clients trust"
    );

    // SIGTERM B with every stream on it: each ends with Unavailable, and B exits 0 well
    // within its grace.
    let signalled = Instant::now();
    b.signal("TERM");
    for (who, _, task) in clients {
        let ended = tokio::time::timeout(GRACE / 2, task)
            .await
            .unwrap_or_else(|_| panic!("{who}'s stream did not end within {:?}", GRACE / 2))
            .expect("client task");
        match ended {
            Some(status) if status.code() == tonic::Code::Unavailable => {}
            other => panic!("{who}: expected Unavailable, got {other:?}"),
        }
    }
    let status = b
        .exit_by(signalled + GRACE, &format!("within its {GRACE:?} grace"))
        .await;
    assert!(status.success(), "B's exit status {status}");
    assert!(
        signalled.elapsed() < GRACE / 2,
        "B took {:?}",
        signalled.elapsed()
    );
    stop.cancel();
}
