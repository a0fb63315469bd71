//! The index task: the one owner of the [`Index`]. It applies source events in batches and
//! publishes a snapshot after each batch that changed something. A batch is whatever is queued;
//! with a [`Debounce`] it also gathers events until the source has been quiet for a while (but
//! never longer than a maximum delay), so a burst of changes becomes one push.
//!
//! Nothing is published until the source says its first full load is done (`Synced`): before
//! that the published value is `None`, which keeps readiness at 503 and holds every xDS stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How long to gather events before publishing (istiod's `PILOT_DEBOUNCE_AFTER` and
/// `PILOT_DEBOUNCE_MAX`). A zero `after` publishes as soon as the queue is empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Debounce {
    /// Publish once no event has arrived for this long.
    pub after: Duration,
    /// ... but no later than this after the batch's first event.
    pub max: Duration,
}

/// Runs until the event channel closes or `shutdown` fires.
pub async fn run(
    mut index: Index,
    mut events: mpsc::Receiver<Event>,
    publish: watch::Sender<Option<Arc<Snapshot>>>,
    metrics: Arc<Metrics>,
    debounce: Debounce,
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
        let mut count = 1;
        synced |= first == Event::Synced;
        index.handle(first);
        let mut last_event = tokio::time::Instant::now();
        let deadline = last_event + debounce.max;
        loop {
            while count < MAX_BATCH {
                match events.try_recv() {
                    Ok(event) => {
                        count += 1;
                        synced |= event == Event::Synced;
                        index.handle(event);
                        last_event = tokio::time::Instant::now();
                    }
                    Err(_) => break,
                }
            }
            if debounce.after.is_zero() || count >= MAX_BATCH {
                break;
            }
            let quiet_until = (last_event + debounce.after).min(deadline);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(quiet_until) => break,
                event = events.recv() => match event {
                    Some(event) => {
                        count += 1;
                        synced |= event == Event::Synced;
                        index.handle(event);
                        last_event = tokio::time::Instant::now();
                    }
                    None => break,
                },
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::model::{Object, PodFields};
    use crate::discovery::{Kind, Settings};

    /// A pod whose `version` label (and so its Workload) changes with `label`.
    fn pod(label: &str) -> Event {
        Event::Apply(Object::Pod(
            PodFields {
                name: "p".into(),
                namespace: "ns".into(),
                labels: [("version".to_string(), label.to_string())].into(),
                phase: "Running".into(),
                ips: ["10.0.0.1".parse().unwrap()].into(),
                ..Default::default()
            }
            .into(),
        ))
    }

    /// How many snapshots were published for `burst` changes `gap` apart (generations are
    /// counted, since a watch receiver only keeps the latest).
    async fn publications(debounce: Debounce, burst: usize, gap: Duration) -> u64 {
        let (tx, rx) = mpsc::channel(64);
        let (publish, mut snapshots) = watch::channel(None);
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            Index::new(Settings::default()),
            rx,
            publish,
            Arc::new(Metrics::new()),
            debounce,
            stop.clone(),
        ));
        tx.send(Event::Reset(Kind::Namespace, Vec::new()))
            .await
            .unwrap();
        tx.send(Event::Synced).await.unwrap();
        snapshots.changed().await.unwrap();
        let first = snapshots.borrow_and_update().as_ref().unwrap().generation;
        let mut last = first;
        for i in 0..burst {
            tx.send(pod(&i.to_string())).await.unwrap();
            tokio::time::sleep(gap).await;
        }
        // Collect publications until nothing more arrives.
        while let Ok(Ok(())) =
            tokio::time::timeout(Duration::from_millis(400), snapshots.changed()).await
        {
            last = snapshots.borrow_and_update().as_ref().unwrap().generation;
        }
        stop.cancel();
        task.await.unwrap();
        last - first
    }

    #[tokio::test]
    async fn a_burst_within_the_quiet_period_is_one_publication() {
        let debounce = Debounce {
            after: Duration::from_millis(150),
            max: Duration::from_secs(5),
        };
        // Ten changes 5 ms apart: one snapshot.
        let published = publications(debounce, 10, Duration::from_millis(5)).await;
        assert_eq!(published, 1);
    }

    #[tokio::test]
    async fn the_maximum_delay_bounds_a_steady_stream() {
        let debounce = Debounce {
            after: Duration::from_millis(100),
            max: Duration::from_millis(150),
        };
        // 40 changes 20 ms apart (800 ms): never quiet for 100 ms, so `max` forces several.
        let published = publications(debounce, 40, Duration::from_millis(20)).await;
        assert!(published >= 4, "{published}");
        assert!(published < 40, "debounced at all: {published}");
    }
}
