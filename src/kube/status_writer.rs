//! The status writer: puts the conditions the index computes (`Snapshot::statuses`) on the
//! objects, as istiod's ambient status queue does. `ZtunnelAccepted` goes on
//! AuthorizationPolicies, `istio.io/WaypointBound` on Services, ServiceEntries and
//! WorkloadEntries. Only the leader writes.
//!
//! * **Only differences are written.** On gaining leadership the writer lists the four kinds
//!   once to learn which objects carry its condition, then writes only where that differs
//!   from what the snapshot wants. After that it follows snapshots: an object is looked at
//!   only when the snapshot's wish for it changes (the snapshot's change history names it),
//!   and patched only if what it carries differs. An unchanged wish costs nothing.
//! * **Other conditions are kept.** Each write reads the object's status, merges ambientd's
//!   one condition into `status.conditions` (replacing or removing only its own type), and
//!   sends a JSON merge patch to the `status` subresource carrying the read
//!   `metadata.resourceVersion`. The API server refuses it with 409 if anyone changed the
//!   object in between; the writer then reads again. Server-side apply would need no read,
//!   but the Istio CRDs' status is schemaless (`x-kubernetes-preserve-unknown-fields`), so
//!   there `status.conditions` is an atomic list: an apply would replace every other
//!   manager's conditions. The optimistic read-modify-write behaves the same on Services
//!   and on the CRDs.
//! * `lastTransitionTime` moves only when the status flips; `observedGeneration` is the
//!   `metadata.generation` the index computed the condition from.
//! * **Calls are rate-limited** (token bucket, `--status-qps`), so a mass change (a namespace
//!   relabelled, a waypoint deleted) drains at a steady pace. Failures are retried per object
//!   with exponential backoff; an object deleted meanwhile (404) is dropped. Nothing here
//!   ends the process.
//! * **Leadership**: nothing is read or written while not leading; when leadership comes,
//!   everything is reconciled; when it goes, pending work is dropped.
//!
//! API calls (for RBAC): `list` on services, serviceentries, workloadentries and
//! authorizationpolicies (once per leadership), `get` and `patch` on their `status`
//! subresource.

pub mod conditions;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::Snapshot;
use crate::discovery::model::status::{DesiredStatus, StatusKind, StatusTarget};
use crate::discovery::snapshot::PersistentMap;
use crate::metrics::{Metrics, StatusLabel};
use conditions::Observed;

/// Objects listed per page when reconciling everything.
const PAGE: u32 = 500;
/// A single API call that takes longer than this counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Immediate re-reads allowed after a 409 before backing off.
const CONFLICT_RETRIES: u32 = 3;

/// Why one status call failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{call} timed out after {CALL_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("{call}: {source}")]
    Api {
        call: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl StatusError {
    fn code(&self) -> Option<u16> {
        match self {
            StatusError::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }
}

/// How the writer paces itself.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    /// Sustained API calls per second (reads and patches together).
    pub qps: f64,
    /// Calls allowed at once after a quiet period.
    pub burst: u32,
    /// First retry delay after a failure; doubles per failure.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for StatusConfig {
    fn default() -> Self {
        StatusConfig {
            qps: 20.0,
            burst: 40,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
        }
    }
}

/// The resource each kind is written through.
fn resource(kind: StatusKind) -> ApiResource {
    let (group, version, kind_name, plural) = match kind {
        StatusKind::Service => ("", "v1", "Service", "services"),
        StatusKind::ServiceEntry | StatusKind::ServiceEntryVisibility => (
            "networking.istio.io",
            "v1",
            "ServiceEntry",
            "serviceentries",
        ),
        StatusKind::WorkloadEntry => (
            "networking.istio.io",
            "v1",
            "WorkloadEntry",
            "workloadentries",
        ),
        StatusKind::AuthorizationPolicy | StatusKind::WaypointPolicy => (
            "security.istio.io",
            "v1",
            "AuthorizationPolicy",
            "authorizationpolicies",
        ),
    };
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind_name.into(),
        plural: plural.into(),
    }
}

/// Runs until `stop`: writes conditions while `leader` is true. `snapshots` is the index's
/// published snapshot (`None` until the first full load).
pub async fn run(
    client: kube::Client,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    leader: watch::Receiver<bool>,
    config: StatusConfig,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut writer = Writer {
        client,
        metrics,
        limiter: RateLimiter::new(config.qps, config.burst),
        config,
        snapshots,
        leader,
        seen: PersistentMap::default(),
        seen_generation: 0,
        queue: Queue::default(),
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = writer.run() => {}
    }
}

type Statuses = PersistentMap<StatusTarget, DesiredStatus>;

struct Writer {
    client: kube::Client,
    metrics: Arc<Metrics>,
    config: StatusConfig,
    limiter: RateLimiter,
    snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    leader: watch::Receiver<bool>,
    /// The snapshot map last looked at, and that snapshot's generation.
    seen: Statuses,
    seen_generation: u64,
    queue: Queue,
}

impl Writer {
    async fn run(&mut self) {
        loop {
            // Wait to lead, with a snapshot to go by.
            while !(*self.leader.borrow_and_update() && self.snapshots.borrow().is_some()) {
                tokio::select! {
                    changed = self.leader.changed() => if changed.is_err() { return },
                    changed = self.snapshots.changed() => if changed.is_err() { return },
                }
            }
            info!("leading: reconciling status conditions");
            if self.reconcile_all().await {
                self.follow().await;
            }
            self.queue.clear();
            self.metrics.status_pending.set(0);
            self.seen = Statuses::default();
            self.seen_generation = 0;
            info!("no longer leading: status writes stopped");
        }
    }

    fn leading(&self) -> bool {
        *self.leader.borrow()
    }

    fn latest(&self) -> Option<Arc<Snapshot>> {
        self.snapshots.borrow().clone()
    }

    /// Lists what every object carries and queues each one that differs. False if leadership
    /// was lost first.
    async fn reconcile_all(&mut self) -> bool {
        let mut backoff = self.config.min_backoff;
        let observed = loop {
            if !self.leading() {
                return false;
            }
            match self.list_observed().await {
                Ok(observed) => break observed,
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "listing objects for status failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.max_backoff);
                }
            }
        };
        let Some(latest) = self.latest() else {
            return false;
        };
        let now = Instant::now();
        for (target, desired) in latest.statuses.iter() {
            if !conditions::satisfied(desired, observed.get(target)) {
                self.queue.push(target.clone(), now, 0);
            }
        }
        info!(pending = self.queue.len(), "status conditions to write");
        self.seen = latest.statuses.clone();
        self.seen_generation = latest.generation;
        true
    }

    /// Every object of the four kinds that carries ambientd's condition, and what it says.
    async fn list_observed(&mut self) -> Result<HashMap<StatusTarget, Observed>, StatusError> {
        let mut observed = HashMap::new();
        for kind in StatusKind::ALL {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource(kind));
            let mut token: Option<String> = None;
            loop {
                let mut params = ListParams::default().limit(PAGE);
                if let Some(token) = &token {
                    params = params.continue_token(token);
                }
                self.limiter.acquire().await;
                let page = match call("list", api.list(&params)).await {
                    Ok(page) => page,
                    // The CRD is not installed: no such objects.
                    Err(e) if e.code() == Some(404) => break,
                    Err(e) => return Err(e),
                };
                for object in &page.items {
                    let list = conditions_of(&object.data);
                    if let Some(found) = conditions::find(list, kind.condition_type()) {
                        let target = StatusTarget {
                            kind,
                            namespace: object.metadata.namespace.clone().unwrap_or_default().into(),
                            name: object.metadata.name.clone().unwrap_or_default().into(),
                        };
                        observed.insert(target, found);
                    }
                }
                token = page.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    break;
                }
            }
        }
        Ok(observed)
    }

    /// Follows snapshots and writes what differs, until leadership is lost. A closed channel
    /// keeps its last value.
    async fn follow(&mut self) {
        let (mut leader_open, mut snapshots_open) = (true, true);
        loop {
            self.metrics.status_pending.set(self.queue.len() as i64);
            let due = self.queue.next_due();
            tokio::select! {
                changed = self.leader.changed(), if leader_open => {
                    leader_open = changed.is_ok();
                    if !*self.leader.borrow_and_update() {
                        return;
                    }
                }
                changed = self.snapshots.changed(), if snapshots_open => {
                    snapshots_open = changed.is_ok();
                    if let Some(latest) = self.latest() {
                        self.absorb(&latest);
                    }
                }
                _ = sleep_until(due), if due.is_some() => {
                    if let Some((target, attempts)) = self.queue.pop_due(Instant::now()) {
                        self.write(target, attempts).await;
                    }
                }
            }
        }
    }

    /// Queues the objects whose wish changed since the last snapshot; the write reads each
    /// one and patches only if it differs (the object may also have been re-created, so what
    /// was written before says nothing). The snapshot's change history names them; a writer
    /// that fell behind it compares maps.
    fn absorb(&mut self, snapshot: &Snapshot) {
        let latest = snapshot.statuses.clone();
        if latest.ptr_eq(&self.seen) {
            self.seen_generation = snapshot.generation;
            return;
        }
        let changed: Vec<StatusTarget> = match snapshot.status_changes_since(self.seen_generation) {
            Some(changed) => changed.into_iter().collect(),
            None => {
                let mut changed: Vec<StatusTarget> = latest
                    .iter()
                    .filter(|(target, desired)| self.seen.get(*target) != Some(*desired))
                    .map(|(target, _)| target.clone())
                    .collect();
                changed.extend(
                    self.seen
                        .keys()
                        .filter(|target| !latest.contains_key(*target))
                        .cloned(),
                );
                changed
            }
        };
        let now = Instant::now();
        for target in changed {
            match latest.get(&target) {
                // Deleted: nothing to write on it.
                None => self.queue.remove(&target),
                Some(_) => self.queue.push(target, now, 0),
            }
        }
        self.seen = latest;
        self.seen_generation = snapshot.generation;
    }

    /// Reads one object, merges the condition the latest snapshot wants, and patches it.
    async fn write(&mut self, target: StatusTarget, attempts: u32) {
        let Some(desired) = self.seen.get(&target).cloned() else {
            return;
        };
        let kind = target.kind.as_str();
        let result = match self.read_merge_patch(&target, &desired).await {
            Ok(Outcome::Written) => {
                debug!(object = %target, "status condition written");
                "written"
            }
            Ok(Outcome::AlreadyThere) => "unchanged",
            Ok(Outcome::Gone) => "gone",
            Ok(Outcome::NotLeading) => return,
            Err(e) if e.code() == Some(409) && attempts < CONFLICT_RETRIES => {
                debug!(object = %target, "status write conflicted; reading again");
                self.queue.push(target, Instant::now(), attempts + 1);
                "conflict"
            }
            Err(e) => {
                let delay = backoff(&self.config, attempts);
                warn!(object = %target, error = %e, retry_in = ?delay, "writing status failed");
                self.queue
                    .push(target, Instant::now() + delay, attempts.saturating_add(1));
                "error"
            }
        };
        self.metrics
            .status_writes
            .get_or_create(&StatusLabel {
                kind: kind.into(),
                result: result.into(),
            })
            .inc();
    }

    async fn read_merge_patch(
        &mut self,
        target: &StatusTarget,
        desired: &DesiredStatus,
    ) -> Result<Outcome, StatusError> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &target.namespace,
            &resource(target.kind),
        );
        self.limiter.acquire().await;
        if !self.leading() {
            return Ok(Outcome::NotLeading);
        }
        let object = match call("get status", api.get_status(&target.name)).await {
            Ok(object) => object,
            Err(e) if e.code() == Some(404) => return Ok(Outcome::Gone),
            Err(e) => return Err(e),
        };
        let condition_type = target.kind.condition_type();
        let current = conditions_of(&object.data);
        let Some(merged) = conditions::merge(current, condition_type, desired, SystemTime::now())
        else {
            return Ok(Outcome::AlreadyThere);
        };
        let merged = if merged.is_empty() {
            Value::Null
        } else {
            Value::Array(merged)
        };
        let patch = json!({
            "metadata": {"resourceVersion": object.metadata.resource_version},
            "status": {"conditions": merged},
        });
        self.limiter.acquire().await;
        if !self.leading() {
            return Ok(Outcome::NotLeading);
        }
        let params = PatchParams::default();
        match call(
            "patch status",
            api.patch_status(&target.name, &params, &Patch::Merge(&patch)),
        )
        .await
        {
            Ok(_) => Ok(Outcome::Written),
            Err(e) if e.code() == Some(404) => Ok(Outcome::Gone),
            Err(e) => Err(e),
        }
    }
}

enum Outcome {
    Written,
    /// The object already shows the wish.
    AlreadyThere,
    Gone,
    NotLeading,
}

/// `status.conditions` of an object's JSON, or nothing.
fn conditions_of(data: &Value) -> &[Value] {
    data["status"]["conditions"]
        .as_array()
        .map_or(&[], Vec::as_slice)
}

async fn call<T>(
    name: &'static str,
    request: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, StatusError> {
    match tokio::time::timeout(CALL_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(StatusError::Api { call: name, source }),
        Err(_) => Err(StatusError::Timeout { call: name }),
    }
}

fn backoff(config: &StatusConfig, attempts: u32) -> Duration {
    config
        .min_backoff
        .saturating_mul(1u32 << attempts.min(16))
        .min(config.max_backoff)
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Objects waiting to be written, each once, in order of when they are due.
#[derive(Default)]
struct Queue {
    order: BTreeSet<(Instant, StatusTarget)>,
    entries: HashMap<StatusTarget, (Instant, u32)>,
}

impl Queue {
    /// Queues (or re-times) one object.
    fn push(&mut self, target: StatusTarget, due: Instant, attempts: u32) {
        if let Some((old, _)) = self.entries.insert(target.clone(), (due, attempts)) {
            self.order.remove(&(old, target.clone()));
        }
        self.order.insert((due, target));
    }

    fn remove(&mut self, target: &StatusTarget) {
        if let Some((due, _)) = self.entries.remove(target) {
            self.order.remove(&(due, target.clone()));
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.order.first().map(|(due, _)| *due)
    }

    fn pop_due(&mut self, now: Instant) -> Option<(StatusTarget, u32)> {
        let (due, _) = self.order.first()?;
        if *due > now {
            return None;
        }
        let (_, target) = self.order.pop_first()?;
        let (_, attempts) = self.entries.remove(&target)?;
        Some((target, attempts))
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn clear(&mut self) {
        self.order.clear();
        self.entries.clear();
    }
}

/// A token bucket: `burst` calls at once, then `qps` per second.
/// A token bucket: `qps` calls a second, `burst` at once after a quiet period. Shared in
/// shape (not in budget) with the waypoint controller.
pub(crate) struct RateLimiter {
    interval: Duration,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl RateLimiter {
    pub(crate) fn new(qps: f64, burst: u32) -> Self {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            1.0
        };
        let burst = f64::from(burst.max(1));
        RateLimiter {
            interval: Duration::from_secs_f64(1.0 / qps),
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    pub(crate) async fn acquire(&mut self) {
        loop {
            let now = Instant::now();
            let refill = now.duration_since(self.last).as_secs_f64() / self.interval.as_secs_f64();
            self.tokens = (self.tokens + refill).min(self.burst);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            let wait = self.interval.mul_f64(1.0 - self.tokens);
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rate_limiter_allows_a_burst_then_paces() {
        let mut limiter = RateLimiter::new(100.0, 3);
        let start = Instant::now();
        for _ in 0..3 {
            limiter.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(5));
        for _ in 0..10 {
            limiter.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(95), "{elapsed:?}");
    }

    #[test]
    fn queue_keeps_one_entry_per_object_in_due_order() {
        let target = |name: &str| StatusTarget {
            kind: StatusKind::Service,
            namespace: "ns".into(),
            name: name.into(),
        };
        let now = Instant::now();
        let mut queue = Queue::default();
        queue.push(target("b"), now + Duration::from_secs(2), 0);
        queue.push(target("a"), now + Duration::from_secs(1), 0);
        queue.push(target("b"), now, 3);
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.pop_due(now), Some((target("b"), 3)));
        assert_eq!(queue.pop_due(now), None);
        assert_eq!(
            queue.pop_due(now + Duration::from_secs(1)),
            Some((target("a"), 0))
        );
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let config = StatusConfig {
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            ..StatusConfig::default()
        };
        assert_eq!(backoff(&config, 0), Duration::from_millis(100));
        assert_eq!(backoff(&config, 2), Duration::from_millis(400));
        assert_eq!(backoff(&config, 30), Duration::from_secs(1));
    }
}
