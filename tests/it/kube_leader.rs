//! Leader election (src/kube/leader.rs) against the fake API server over real HTTP: two
//! electors give exactly one leader; the other takes over when the leader stops renewing
//! (within the lease duration) or steps down on shutdown (at once, by releasing the Lease).
//!
//! kube-lease-manager keeps time with the wall clock in whole seconds, so these tests run in
//! real time with a 2 s lease renewed 1 s before it expires.

use crate::support::kube as kube_support;

use std::time::{Duration, Instant};

use ambientd::kube::leader::{self, LeaderConfig, Leadership};
use kube_support::FakeApiServer;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(15);
const LEASE: Duration = Duration::from_secs(2);

struct Elector {
    identity: String,
    leadership: Leadership,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn elector(fake: &FakeApiServer, identity: &str) -> Elector {
    let config = LeaderConfig {
        identity: identity.into(),
        lease_duration: LEASE,
        renew_grace: Duration::from_secs(1),
        ..LeaderConfig::new("istio-system")
    };
    let (tx, leadership) = Leadership::channel();
    let stop = CancellationToken::new();
    let task = tokio::spawn(leader::run(fake.client(), config, tx, |_| {}, stop.clone()));
    Elector {
        identity: identity.into(),
        leadership,
        stop,
        task,
    }
}

async fn fake_with_system_namespace() -> FakeApiServer {
    let fake = FakeApiServer::start().await;
    fake.apply(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}),
    );
    fake
}

/// Waits until exactly one of `electors` leads; returns its index.
async fn one_leader(electors: &[&Elector]) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let leading: Vec<usize> = (0..electors.len())
            .filter(|i| electors[*i].leadership.is_leader())
            .collect();
        if leading.len() == 1 {
            return leading[0];
        }
        assert!(
            leading.len() <= 1,
            "two leaders at once: {:?}",
            leading
                .iter()
                .map(|i| &electors[*i].identity)
                .collect::<Vec<_>>()
        );
        assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn holder(fake: &FakeApiServer) -> Option<String> {
    let lease = fake.get(
        "coordination.k8s.io/v1",
        "Lease",
        "istio-system",
        "ambientd-leader",
    )?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_string)
}

/// For `period`, never more than one leader, and the same one throughout.
async fn stays_single(electors: &[&Elector], leader: usize, period: Duration) {
    let end = Instant::now() + period;
    while Instant::now() < end {
        for (i, e) in electors.iter().enumerate() {
            assert_eq!(
                e.leadership.is_leader(),
                i == leader,
                "{} flipped while {} held the lease",
                e.identity,
                electors[leader].identity
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_electors_one_leader_and_failover_when_it_stops_renewing() {
    let fake = fake_with_system_namespace().await;
    let a = elector(&fake, "replica-a");
    let b = elector(&fake, "replica-b");
    let first = one_leader(&[&a, &b]).await;
    let (leader, other) = if first == 0 { (a, b) } else { (b, a) };
    assert_eq!(holder(&fake).as_deref(), Some(leader.identity.as_str()));
    // Through two renewals, one leader and no flapping.
    stays_single(&[&leader, &other], 0, LEASE * 2).await;

    // The leader dies without releasing (aborted: no renewals, no goodbye).
    leader.task.abort();
    let crashed = Instant::now();
    let deadline = crashed + WAIT;
    while !other.leadership.is_leader() {
        assert!(Instant::now() < deadline, "no failover within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failover = crashed.elapsed();
    // Expiry (at most the lease duration after the last renewal) plus the manager's random
    // wait (under 1 s) after clearing an expired holder, plus slack for a loaded machine.
    assert!(
        failover <= LEASE + Duration::from_millis(3500),
        "failover took {failover:?}"
    );
    assert_eq!(holder(&fake).as_deref(), Some(other.identity.as_str()));
    other.stop.cancel();
    other.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_steps_down_and_releases_the_lease() {
    let fake = fake_with_system_namespace().await;
    let a = elector(&fake, "replica-a");
    let b = elector(&fake, "replica-b");
    let first = one_leader(&[&a, &b]).await;
    let (leader, other) = if first == 0 { (a, b) } else { (b, a) };

    let mut leader_flag = leader.leadership.clone();
    leader.stop.cancel();
    tokio::time::timeout(WAIT, leader.task)
        .await
        .expect("the elector stops in time")
        .unwrap();
    assert!(
        !leader_flag.is_leader(),
        "the stopped elector still claims to lead"
    );
    let _ = &mut leader_flag;
    let released = Instant::now();
    let deadline = released + WAIT;
    while !other.leadership.is_leader() {
        assert!(Instant::now() < deadline, "no takeover within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holder(&fake).as_deref(), Some(other.identity.as_str()));
    other.stop.cancel();
    other.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elector_survives_api_errors_and_leads_again() {
    let fake = fake_with_system_namespace().await;
    // The first attempts fail: the elector retries instead of giving up.
    fake.fail_requests("GET", "leases", 2, 500);
    let a = elector(&fake, "replica-a");
    one_leader(&[&a]).await;
    // An outage: it stops claiming leadership, and leads again once the API server is back.
    fake.outage().await;
    let deadline = Instant::now() + WAIT;
    while a.leadership.is_leader() {
        assert!(Instant::now() < deadline, "still leading through an outage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fake.restore().await;
    one_leader(&[&a]).await;
    a.stop.cancel();
    a.task.await.unwrap();
}
