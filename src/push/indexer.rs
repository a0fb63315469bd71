//! The index task: the one owner of the [`Index`]. It applies source events in batches and
//! publishes a snapshot after each batch that changed something.
//!
//! Nothing is published until the source says its first full load is done (`Synced`): before
//! that the published value is `None`, which keeps readiness at 503 and holds every xDS stream.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::discovery::{Event, Index, Snapshot};

/// The latest published snapshot; `None` until the first full load is indexed.
pub type Snapshots = watch::Receiver<Option<Arc<Snapshot>>>;

/// Events queued at once are applied together and published as one snapshot, up to this many.
const MAX_BATCH: usize = 10_000;

/// Runs until the event channel closes or `shutdown` fires.
pub async fn run(
    mut index: Index,
    mut events: mpsc::Receiver<Event>,
    publish: watch::Sender<Option<Arc<Snapshot>>>,
    shutdown: CancellationToken,
) {
    let mut synced = false;
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        let Some(first) = first else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match events.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        let count = batch.len();
        for event in batch {
            synced |= event == Event::Synced;
            index.handle(event);
        }
        if !synced {
            continue;
        }
        let first_snapshot = publish.borrow().is_none();
        if first_snapshot || index.has_unpublished() {
            let snapshot = index.snapshot();
            debug!(
                generation = snapshot.generation,
                events = count,
                addresses = snapshot.addresses.len(),
                "snapshot published"
            );
            if first_snapshot {
                info!(
                    addresses = snapshot.addresses.len(),
                    authorizations = snapshot.authorizations.len(),
                    "first snapshot built; ready"
                );
            }
            publish.send_replace(Some(snapshot));
        }
    }
}
