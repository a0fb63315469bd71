//! Flow control end to end: proxies that stop reading, or have not yet acknowledged, hold
//! back only the latest version of what changed, in bounded memory, and delay no one.

use crate::support::common as support;
use crate::support::xds as xds_support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::*;
use xds_support::*;

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped_and_delays_no_one() {
    // Enough pods that the initial response overflows HTTP/2's flow-control window.
    let mesh = bulk_mesh();
    let mut config = ambientd::config::Config::local(mesh.root());
    config.stream_idle_timeout = Some(Duration::from_millis(500));
    let running = ambientd::app::start(config).await.expect("start");
    let mut snapshots = running.snapshots.clone();
    tokio::time::timeout(WAIT, snapshots.wait_for(Option::is_some))
        .await
        .unwrap()
        .unwrap();

    // A small receive window, so the stuck client stalls the server's writes quickly.
    let stuck = XdsClient::connect_with_window(&running, Some(65_535)).await;
    stuck.subscribe_wildcard(BTreeMap::new()).await; // and never reads
    let mut healthy = XdsClient::connect(&running).await;
    healthy.subscribe_wildcard(BTreeMap::new()).await;
    healthy.initial_sync().await;

    for round in 0..8 {
        mesh.write(
            "pods/db.yaml",
            &pod("db-1", "10.244.1.20", "db", &format!("r{round}")),
        );
        let update = tokio::time::timeout(Duration::from_secs(3), healthy.recv())
            .await
            .expect("the healthy client was delayed");
        assert_eq!(names(&update), vec![DB_1]);
        healthy.ack(&update).await;
    }

    let deadline = std::time::Instant::now() + WAIT;
    while running.registry.len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the stuck stream was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(stuck);
    running.stop().await;
}

/// The stuck connection's status in the registry.
fn pending_of(running: &ambientd::app::Running, id: u64) -> ambientd::push::registry::Pending {
    running
        .registry
        .list()
        .into_iter()
        .find(|c| c.id == id)
        .expect("the stuck connection is registered")
        .pending
}

/// Writes `version` of a pod and waits until the healthy client has received it.
async fn change_and_follow(
    mesh: &Manifests,
    healthy: &mut XdsClient,
    (file, name, ip, app, uid): (&str, &str, &str, &str, &str),
    version: &str,
) {
    mesh.write(file, &pod(name, ip, app, version));
    loop {
        let update = tokio::time::timeout(Duration::from_secs(3), healthy.recv())
            .await
            .unwrap_or_else(|_| panic!("the healthy client was delayed at {name} {version}"));
        healthy.ack(&update).await;
        if revision_of(&update, uid).as_deref() == Some(version) {
            return;
        }
    }
}

/// A proxy that stops reading (and so acknowledges nothing) while one pod changes 100 times:
/// the other proxy gets every change promptly; the stuck one holds at most the response being
/// written and one queued response and the names that changed (never a backlog), and once it
/// reads again it receives each changed pod once, at its last version.
#[tokio::test]
async fn a_stuck_client_coalesces_per_name_in_bounded_memory_and_delays_no_one() {
    const WEB_FILE: (&str, &str, &str, &str, &str) =
        ("pods/web1.yaml", "web-1", "10.244.1.10", "web", WEB_1);
    const DB_FILE: (&str, &str, &str, &str, &str) =
        ("pods/db.yaml", "db-1", "10.244.1.20", "db", DB_1);
    let mesh = bulk_mesh();
    // web-1 in a file of its own, so that it can change alone.
    mesh.write("pods/web.yaml", &pod("web-2", "10.244.1.11", "web", "v1"));
    mesh.write("pods/web1.yaml", &pod("web-1", "10.244.1.10", "web", "v1"));
    let running = start(mesh.root()).await;
    let mut stuck = XdsClient::connect_with_window(&running, Some(65_535)).await;
    stuck.subscribe_wildcard(BTreeMap::new()).await; // and does not read for now
    let mut healthy = XdsClient::connect(&running).await;
    healthy.subscribe_wildcard(BTreeMap::new()).await;
    healthy.initial_sync().await;
    let stuck_id = running
        .registry
        .list()
        .iter()
        .map(|c| c.id)
        .min()
        .expect("two connections");

    // The initial Address response fills the client's window: HTTP/2 holds two of its pieces,
    // the rest of it waits in the outbound queue's current response, and the Authorization
    // response waits in the one-slot queue. web-1's change waits for room in that queue. From
    // then on no further response is made: changes are noted by name.
    change_and_follow(&mesh, &mut healthy, WEB_FILE, "fill").await;
    let mut held = None;
    for round in 0..100 {
        change_and_follow(&mesh, &mut healthy, DB_FILE, &format!("r{round}")).await;
        let pending = pending_of(&running, stuck_id);
        assert!(pending.queued_responses <= 1, "round {round}: {pending:?}");
        // What waits is the initial responses' rest, never a backlog of db-1 versions.
        let first = *held.get_or_insert(pending.queued_bytes);
        assert!(pending.queued_bytes <= first, "round {round}: {pending:?}");
        // Two names changed, however often: the pending state does not grow with the updates.
        assert!(pending.changed_names <= 2, "round {round}: {pending:?}");
    }
    // The last change reached the stuck connection too (it was noted, not sent).
    let deadline = std::time::Instant::now() + WAIT;
    while pending_of(&running, stuck_id).changed_names != 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "web-1 and db-1 never noted: {:?}",
            pending_of(&running, stuck_id)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Reading again: the initial responses, then web-1 and db-1 once each, at their last
    // versions.
    let (initial, _) = stuck.initial_sync().await;
    assert_eq!(revision_of(&initial, DB_1).as_deref(), Some("v1"));
    let update = stuck.recv().await;
    assert_eq!(names(&update), vec![DB_1, WEB_1]);
    assert_eq!(revision_of(&update, WEB_1).as_deref(), Some("fill"));
    assert_eq!(revision_of(&update, DB_1).as_deref(), Some("r99"));
    stuck.ack(&update).await;
    stuck.expect_silence(Duration::from_millis(700)).await;
    running.stop().await;
}

/// The revision of `uid` in the newest snapshot, if it is there.
fn snapshot_revision(running: &ambientd::app::Running, uid: &str) -> Option<String> {
    use prost::Message;
    let snapshot = running.snapshots.borrow().clone()?;
    let resource = snapshot
        .resources(ambientd::discovery::TypeKind::Address)
        .get(uid)?
        .clone();
    let address = ambientd::pb::workload::Address::decode(resource.value()).ok()?;
    Some(workload(&address).canonical_revision.clone())
}

/// A proxy that reads but has not acknowledged its last two responses gets nothing more of
/// that type: changes coalesce in the server (not in HTTP/2's buffers, which hyper lets grow
/// to 400 KiB a stream), and an ACK releases one response with each changed resource at its
/// latest version. Every ztunnel ACKs or NACKs every response.
#[tokio::test]
async fn changes_wait_while_two_responses_await_acks_and_coalesce() {
    let mesh = mesh();
    let running = start(mesh.root()).await;
    let mut client = XdsClient::connect(&running).await;
    client.subscribe_wildcard(BTreeMap::new()).await;
    client.initial_sync().await;
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v2"));
    let first = client.recv().await;
    assert_eq!(names(&first), vec![DB_1]);
    assert_eq!(revision_of(&first, DB_1).as_deref(), Some("v2"));

    // Not ACKed yet: twenty more changes, each in the server's snapshot. The first of them
    // goes out at once (two responses may await their ACK); the rest wait and coalesce.
    for v in 3..=22 {
        let version = format!("v{v}");
        mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", &version));
        let deadline = std::time::Instant::now() + WAIT;
        while snapshot_revision(&running, DB_1).as_deref() != Some(version.as_str()) {
            assert!(
                std::time::Instant::now() < deadline,
                "{version} never reached the snapshot"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let second = client.recv().await;
    assert_eq!(names(&second), vec![DB_1]);
    let second_revision = revision_of(&second, DB_1);
    client.expect_silence(Duration::from_millis(300)).await;

    // The ACK of the first releases exactly one response: db-1 at its last version (unless
    // the second already carried it, which needs the twenty writes to outrun one push).
    client.ack(&first).await;
    let update = match second_revision.as_deref() {
        Some("v22") => None,
        _ => {
            let update = client.recv().await;
            assert_eq!(names(&update), vec![DB_1]);
            assert_eq!(revision_of(&update, DB_1).as_deref(), Some("v22"));
            Some(update)
        }
    };
    client.ack(&second).await;
    if let Some(update) = update {
        client.ack(&update).await;
    }
    client.expect_silence(Duration::from_millis(500)).await;

    // A NACK releases the next response as well.
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v23"));
    let rejected = client.recv().await;
    mesh.write("pods/db.yaml", &pod("db-1", "10.244.1.20", "db", "v24"));
    client.nack(&rejected, "rejected for the test").await;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let next = tokio::time::timeout(
            deadline.saturating_duration_since(std::time::Instant::now()),
            client.recv(),
        )
        .await
        .expect("nothing sent after the NACK");
        client.ack(&next).await;
        if revision_of(&next, DB_1).as_deref() == Some("v24") {
            break;
        }
    }
    running.stop().await;
}
