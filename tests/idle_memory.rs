//! An idle xDS connection holds no HTTP/2 codec buffers (benchmark T7's target: at most
//! 16 KiB of server memory per idle stream). Stock h2 allocates a 16 KiB write buffer, an
//! 8 KiB read buffer and a 4 KiB HPACK scratch buffer per connection and keeps them for the
//! connection's life; `vendor/h2` allocates them when there is something to write or read and
//! frees them once idle. This test counts this process's live heap while ztunnel-shaped
//! clients sit idle after their initial sync, so it fails if the patch stops applying (for
//! example after an h2 upgrade that the `[patch]` no longer matches).
//!
//! Server and clients share the process (and both use h2), so the figure is per client *and*
//! server connection. It is a heap count, not a timing: it does not depend on load.

/// The parts of the `it` binary's support that this test uses (tests/it/support/common.rs and
/// xds.rs). This test is a binary of its own: its global allocator counts every allocation in
/// the process, so tests running beside it would count too.
#[allow(dead_code)] // Only part of each module is used here.
mod it {
    pub mod support {
        pub mod common;
        pub mod xds;
    }
}

use it::support::common as support;
use it::support::xds as xds_support;

use std::time::Duration;

use support::*;
use xds_support::*;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

fn live() -> isize {
    dhat::HeapStats::get().curr_bytes as isize
}

/// Client connections measured.
const CLIENTS: usize = 64;

/// The bound per idle client-and-server connection pair. With the patch a pair holds about
/// 48 KB (tonic's client channel is most of it; the server's side is about 15 KiB, see
/// BENCHMARKS.md T7). Stock h2 adds 28.7 KB of codec buffers per side, 57 KB per pair.
const BOUND: isize = 64 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_hold_no_http2_codec_buffers() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let mesh = mesh();
    let running = start(mesh.root()).await;
    // One connection first, so that lazily built state (runtime, registries, the snapshot's
    // encoded responses) is not counted against the measured ones.
    let mut warm = XdsClient::connect(&running).await;
    warm.subscribe_wildcard(Default::default()).await;
    warm.initial_sync().await;
    settle().await;

    let before = live();
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = XdsClient::connect(&running).await;
        client.subscribe_wildcard(Default::default()).await;
        let (addresses, _) = client.initial_sync().await;
        assert!(
            !addresses.resources.is_empty(),
            "each client is sent the mesh"
        );
        clients.push(client);
    }
    settle().await;
    let per_pair = (live() - before) / CLIENTS as isize;
    assert!(
        per_pair <= BOUND,
        "an idle client and server connection hold {per_pair} B of heap together (bound {BOUND} B)"
    );
    // The connections are still open and serving: one more change reaches a client (`recv`
    // fails the test if it does not come in time).
    drop(clients.split_off(1));
    mesh.write("extra.yaml", &pod("late", "10.1.9.9", "web", "v1"));
    loop {
        let response = clients[0].recv().await;
        clients[0].ack(&response).await;
        if names(&response).iter().any(|n| n.ends_with("/late")) {
            break;
        }
    }
}

/// Lets ACKs and the last flushes be processed.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}
