//! The index task: the one owner of the [`Index`]. It applies source events in batches and
//! publishes a snapshot after each batch that changed something.
//!
//! Nothing is published until the source says its first full load is done (`Synced`): before
//! that the published value is `None`, which keeps readiness at 503 and holds every xDS stream.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::discovery::names::TypeKind;
use crate::discovery::{Event, Index, Kind, Snapshot};
use crate::metrics::{KindLabel, Metrics, TypeLabel};

/// The latest published snapshot; `None` until the first full load is indexed.
pub type Snapshots = watch::Receiver<Option<Arc<Snapshot>>>;

/// Events queued at once are applied together and published as one snapshot, up to this many.
const MAX_BATCH: usize = 10_000;

/// Runs until the event channel closes or `shutdown` fires.
pub async fn run(
    mut index: Index,
    mut events: mpsc::Receiver<Event>,
    publish: watch::Sender<Option<Arc<Snapshot>>>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut synced = false;
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => return,
            event = events.recv() => event,
        };
        let Some(first) = first else { return };
        let batch_started = Instant::now();
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
            let mut snapshot = index.snapshot();
            if let Some(s) = Arc::get_mut(&mut snapshot) {
                s.published_at = Some(Instant::now());
            }
            record(&metrics, &index, &snapshot, batch_started);
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

/// Gauges that follow the index, and the batch's debounce time.
fn record(metrics: &Metrics, index: &Index, snapshot: &Snapshot, batch_started: Instant) {
    metrics
        .debounce_time
        .observe(batch_started.elapsed().as_secs_f64());
    metrics.generation.set(snapshot.generation as i64);
    for kind in Kind::ALL {
        metrics
            .objects
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .set(index.store().count(kind) as i64);
    }
    for kind in TypeKind::ALL {
        metrics
            .resources
            .get_or_create(&TypeLabel::of(kind))
            .set(snapshot.resources(kind).len() as i64);
    }
    metrics.services.set(index.service_count() as i64);
    metrics.source_last_sync.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default(),
    );
}
