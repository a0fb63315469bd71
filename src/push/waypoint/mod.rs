//! A waypoint's delta ADS stream (istio/istio `pilot/pkg/xds/delta.go`): CDS and LDS (wildcard), EDS (by
//! cluster name) and `istio.workload.Workload` (wildcard), from the waypoint's shared config
//! ([`configs`]) and the snapshot.
//!
//! Each type's first request is answered, even with nothing. Afterwards each new snapshot
//! sends, per type in istiod's order (CDS, EDS, LDS, Workload), only resources whose version
//! the proxy does not hold, and removals of wildcard names that are gone ([`state`]). A NACK is
//! logged with the proxy and Envoy's message, counted in `pilot_total_xds_rejects`, shown in
//! syncz, and the rejected version is not sent again. Subscription changes are applied even on
//! a stale nonce: Envoy asks for new clusters' endpoints with the last nonce it has read.
//! A cluster sent again (updated) is followed by its ClusterLoadAssignment, even unchanged:
//! Envoy warms the new cluster only once it has one (istiod forces the same EDS push).

pub mod configs;
pub mod state;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{debug, info, warn};

use crate::discovery::names::ResourceType;
use crate::discovery::snapshot::Name;
use crate::discovery::{Resource, Snapshot, TypeKind};
use crate::metrics::{Metrics, TypeLabel};
use crate::pb::xds::DeltaDiscoveryRequest;
use crate::push::indexer::Snapshots;
use crate::push::known::{KnownVersions, Received};
use crate::push::outbound::Outbound;
use crate::push::registry::{ClientView, Handle, TypeStatus};
use crate::push::response::Outgoing;
use crate::push::server::{Inbound, ProxyInfo};
use crate::waypoint::{ConfigId, WaypointConfig, WaypointProxy};

use configs::{Entry, WaypointConfigs};
use state::{Lookup, WaypointDelta, WaypointTypeState};

/// The metric label of a waypoint type (istiod's short names).
pub fn type_label(kind: ResourceType) -> TypeLabel {
    TypeLabel::named(match kind {
        ResourceType::Cluster => "cds",
        ResourceType::ClusterLoadAssignment => "eds",
        ResourceType::Listener => "lds",
        ResourceType::Workload => "workload",
        ResourceType::Address => "wds",
        ResourceType::Authorization => "wads",
    })
}

/// Why the stream ended.
enum End {
    Closed,
    Shutdown,
    Expired,
    Error(Status),
}

/// One waypoint stream's state. Owned by its task.
pub(crate) struct WaypointConnection {
    pub(crate) id: u64,
    pub(crate) snapshots: Snapshots,
    pub(crate) configs: Arc<WaypointConfigs>,
    pub(crate) outbound: Outbound,
    pub(crate) status: Handle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) expires: Option<Duration>,
    pub(crate) proxy: WaypointProxy,
    pub(crate) latest: Option<Arc<Snapshot>>,
    pub(crate) config: Option<Arc<WaypointConfig>>,
    /// The shared entry of the config in use (held so that it is kept).
    pub(crate) entry: Option<Entry>,
    pub(crate) types: BTreeMap<ResourceType, WaypointTypeState>,
    /// The snapshot generation each type was last brought to (Workload diffs by history).
    pub(crate) synced: BTreeMap<ResourceType, u64>,
    pub(crate) dirty: BTreeSet<ResourceType>,
    pub(crate) sent: u64,
    /// Clusters sent before the proxy's first EDS request: their assignments are sent then,
    /// whatever versions the proxy says it holds.
    pub(crate) eds_after_cds: BTreeSet<String>,
}

impl WaypointConnection {
    /// Serves the stream; `first` is its first request, already read.
    pub(crate) async fn run<S>(mut self: Box<Self>, first: Received, mut inbound: S)
    where
        S: Stream<Item = Result<Received, Inbound>> + Unpin,
    {
        let snapshot = {
            let shutdown = self.shutdown.clone();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                ready = self.snapshots.wait_for(Option::is_some) => match ready {
                    Ok(s) => s.clone(),
                    Err(_) => return,
                },
            }
        };
        let Some(snapshot) = snapshot else { return };
        self.set_snapshot(snapshot);
        info!(
            proxy = self.proxy.id,
            namespace = self.proxy.namespace,
            "waypoint connected"
        );
        let info = ProxyInfo {
            id: self.proxy.id.clone(),
            name: self.proxy.pod.clone(),
            namespace: self.proxy.namespace.clone(),
            node_name: String::new(),
            cluster_id: String::new(),
            version: self.proxy.istio_version.clone().unwrap_or_default(),
        };
        let connection_id = format!("{}.{}-{}", self.proxy.pod, self.proxy.namespace, self.id);
        self.status.update(|s| {
            s.connection_id = connection_id;
            s.proxy = Some(info);
        });
        let version = crate::metrics::VersionLabel {
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        self.metrics.xds_clients.get_or_create(&version).inc();
        let expiry = tokio::time::sleep(self.expires.unwrap_or(Duration::MAX));
        tokio::pin!(expiry);
        let mut end = Box::pin(self.on_request(first.0, first.1)).await.err();
        while end.is_none() {
            let outbound = self.outbound.clone();
            let can_push = self.next_pushable().is_some();
            end = tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => Some(End::Shutdown),
                _ = &mut expiry, if self.expires.is_some() => Some(End::Expired),
                message = inbound.next() => match message {
                    Some(Ok((request, known))) => Box::pin(self.on_request(request, known)).await.err(),
                    None | Some(Err(Inbound::Transport(_))) => Some(End::Closed),
                    Some(Err(Inbound::Invalid(status))) => Some(End::Error(status)),
                },
                changed = self.snapshots.changed() => match changed {
                    Err(_) => Some(End::Shutdown),
                    Ok(()) => {
                        let latest = self.snapshots.borrow_and_update().clone();
                        if let Some(latest) = latest {
                            self.set_snapshot(latest);
                        }
                        None
                    }
                },
                slot = outbound.reserve(), if can_push => match slot {
                    Err(_) => Some(End::Closed),
                    Ok(slot) => {
                        let kind = self.next_pushable().expect("checked above");
                        self.dirty.remove(&kind);
                        let delta = self.sync(kind, None);
                        if !delta.is_empty() {
                            self.send(kind, delta, Some(slot)).await.err()
                        } else {
                            None
                        }
                    }
                },
            };
        }
        self.metrics.xds_clients.get_or_create(&version).dec();
        let proxy = self.proxy.id.clone();
        match end {
            Some(End::Closed) | None => info!(proxy, "waypoint disconnected"),
            Some(End::Shutdown) | Some(End::Expired) => {
                info!(proxy, "ending the waypoint's stream; it reconnects");
                self.outbound
                    .end_with(Status::unavailable("transport is closing"));
            }
            Some(End::Error(status)) => {
                warn!(proxy, %status, "closing waypoint stream");
                self.outbound.end_with(status);
            }
        }
        let drained = self.outbound.drained();
        drop(self);
        if tokio::time::timeout(Duration::from_secs(5), drained.wait())
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while inbound.next().await.is_some() {}
            })
            .await;
        }
    }

    /// Follows a new snapshot: the waypoint's config for it (shared with its replicas), and
    /// every subscribed type to be brought up to date.
    fn set_snapshot(&mut self, snapshot: Arc<Snapshot>) {
        let id = ConfigId::of(&self.proxy, &snapshot, &self.configs.settings().domain);
        let fetched = self.configs.get(&id, &snapshot);
        if let Some(took) = fetched.built {
            self.metrics
                .push_time
                .get_or_create(&TypeLabel::named("waypoint_build"))
                .observe(took.as_secs_f64());
        }
        self.config = Some(fetched.config);
        self.entry = Some(fetched.entry);
        self.latest = Some(snapshot);
        self.dirty = self.types.keys().copied().collect();
    }

    /// The first dirty type, in push order, whose responses the proxy is not behind on.
    fn next_pushable(&self) -> Option<ResourceType> {
        ResourceType::WAYPOINT.into_iter().find(|kind| {
            self.dirty.contains(kind)
                && self.types.get(kind).is_some_and(|s| !s.in_flight.is_full())
        })
    }

    /// What `kind` needs sent now; `only` limits it to those names.
    fn sync(&mut self, kind: ResourceType, only: Option<&BTreeSet<Name>>) -> WaypointDelta {
        let snapshot = self.latest.clone().expect("a snapshot before any request");
        let config = self.config.clone().expect("a config with the snapshot");
        let since = self.synced.insert(kind, snapshot.generation);
        let Some(state) = self.types.get_mut(&kind) else {
            return WaypointDelta::default();
        };
        match kind {
            ResourceType::Workload => {
                // Every workload of the mesh: compare only the names changed since the last
                // step when the history still tells them.
                let changed: Option<BTreeSet<Name>> = match (only, since) {
                    (Some(only), _) => Some(only.clone()),
                    (None, Some(since)) if since != snapshot.generation => snapshot
                        .names_changed_since(TypeKind::Address, since)
                        .map(|names| names.cloned().collect()),
                    (None, Some(_)) => Some(BTreeSet::new()),
                    (None, None) => None,
                };
                state.sync(&Workloads(&snapshot), changed.as_ref())
            }
            _ => match config.of(kind) {
                Some(resources) => state.sync(resources, only),
                None => WaypointDelta::default(),
            },
        }
    }

    async fn on_request(
        &mut self,
        request: DeltaDiscoveryRequest,
        known: KnownVersions,
    ) -> Result<(), End> {
        let Some(kind) = ResourceType::from_type_url(&request.type_url)
            .filter(|k| ResourceType::WAYPOINT.contains(k))
        else {
            return Err(End::Error(Status::invalid_argument(format!(
                "unknown type URL {:?} for a waypoint: ambientd serves it {}",
                request.type_url,
                ResourceType::WAYPOINT.map(|t| t.type_url()).join(", ")
            ))));
        };
        let nonce = request.response_nonce.as_str();
        let Some(state) = self.types.get_mut(&kind) else {
            // The type's first request: always answered, even with nothing.
            let mut state = WaypointTypeState::initial(&request.resource_names_subscribe, &known);
            if kind == ResourceType::ClusterLoadAssignment {
                for name in std::mem::take(&mut self.eds_after_cds) {
                    state.resend(&name);
                }
            }
            debug!(
                r#type = kind_name(kind),
                wildcard = state.wildcard,
                names = state.names.len(),
                known = known.len(),
                "initial request"
            );
            self.types.insert(kind, state);
            self.publish_status(kind, true);
            let delta = self.sync(kind, None);
            return self.send(kind, delta, None).await;
        };
        if !nonce.is_empty() {
            state.in_flight.answered(nonce);
            if nonce == state.last_nonce {
                match &request.error_detail {
                    Some(error) => {
                        warn!(
                            proxy = self.proxy.id,
                            r#type = kind.type_url(),
                            nonce,
                            error = error.message,
                            "waypoint rejected resources (NACK); not re-sending them"
                        );
                        self.metrics.rejects.get_or_create(&type_label(kind)).inc();
                        let message = error.message.clone();
                        self.update_status(kind, |t| t.last_error = Some(message));
                    }
                    None => {
                        let nonce = nonce.to_string();
                        self.update_status(kind, |t| {
                            t.acked_nonce = nonce;
                            t.acked_at = Some(SystemTime::now());
                            t.last_error = None;
                        });
                    }
                }
            } else {
                self.metrics
                    .expired_nonce
                    .get_or_create(&type_label(kind))
                    .inc();
            }
        }
        let Some(state) = self.types.get_mut(&kind) else {
            return Ok(());
        };
        let added = state.subscribe(
            &request.resource_names_subscribe,
            &request.resource_names_unsubscribe,
        );
        let subscription = !request.resource_names_subscribe.is_empty()
            || !request.resource_names_unsubscribe.is_empty();
        if added.is_empty() {
            self.publish_status(kind, subscription);
            return Ok(());
        }
        let only: BTreeSet<Name> = added.iter().map(|n| Name::from(n.as_str())).collect();
        let delta = self.sync_names(kind, &only);
        self.publish_status(kind, true);
        if delta.is_empty() {
            return Ok(());
        }
        self.send(kind, delta, None).await
    }

    /// What newly asked-for names need, without moving the type's synced generation.
    fn sync_names(&mut self, kind: ResourceType, only: &BTreeSet<Name>) -> WaypointDelta {
        let snapshot = self.latest.clone().expect("a snapshot");
        let config = self.config.clone().expect("a config");
        let Some(state) = self.types.get_mut(&kind) else {
            return WaypointDelta::default();
        };
        match kind {
            ResourceType::Workload => state.sync(&Workloads(&snapshot), Some(only)),
            _ => config
                .of(kind)
                .map(|r| state.sync(r, Some(only)))
                .unwrap_or_default(),
        }
    }

    async fn send(
        &mut self,
        kind: ResourceType,
        delta: WaypointDelta,
        slot: Option<crate::push::outbound::Slot>,
    ) -> Result<(), End> {
        let started = Instant::now();
        self.sent += 1;
        let nonce = format!("{:x}", self.sent);
        debug!(
            r#type = kind_name(kind),
            nonce,
            resources = delta.resources.len(),
            removed = delta.removed.len(),
            "waypoint push"
        );
        let frame = Outgoing {
            type_url: kind.type_url(),
            nonce: &nonce,
            resources: &delta.resources,
            removed: &delta.removed,
        }
        .pieces();
        let bytes: usize = delta.resources.iter().map(|r| r.value_len()).sum();
        if kind == ResourceType::Cluster {
            self.assignments_follow(&delta.resources);
        }
        if let Some(state) = self.types.get_mut(&kind) {
            state.last_nonce = nonce;
            state.in_flight.sent(self.sent);
        }
        self.publish_status(kind, false);
        let room = match slot {
            Some(slot) => slot,
            None => self.outbound.reserve().await.map_err(|_| End::Closed)?,
        };
        room.send(frame);
        let label = type_label(kind);
        self.metrics.pushes.get_or_create(&label).inc();
        self.metrics
            .config_size
            .get_or_create(&label)
            .observe(bytes as f64);
        self.metrics
            .push_time
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Each sent cluster's assignment is sent after it (an EDS cluster's assignment has its
    /// name), now or at the proxy's first EDS request.
    fn assignments_follow(&mut self, clusters: &[Arc<Resource>]) {
        match self.types.get_mut(&ResourceType::ClusterLoadAssignment) {
            Some(eds) => {
                let mut wanted = false;
                for cluster in clusters {
                    wanted |= eds.resend(&cluster.name);
                }
                if wanted {
                    self.dirty.insert(ResourceType::ClusterLoadAssignment);
                }
            }
            None => self
                .eds_after_cds
                .extend(clusters.iter().map(|c| c.name.to_string())),
        }
    }

    fn update_status(&self, kind: ResourceType, f: impl FnOnce(&mut TypeStatus)) {
        self.status.update(|s| {
            let entry = s.waypoint_types.entry(kind).or_insert_with(empty_status);
            f(entry);
        });
    }

    /// Copies one type's sync state into the registry, for syncz and config_dump: cheap (no
    /// copy of what the proxy holds), since it runs on every response and ACK. The names
    /// asked for are copied only when `subscription` says they changed.
    fn publish_status(&self, kind: ResourceType, subscription: bool) {
        let Some(state) = self.types.get(&kind) else {
            return;
        };
        let wildcard = state.wildcard;
        let names: Option<Vec<String>> =
            subscription.then(|| state.names.iter().cloned().collect());
        let nonce = state.last_nonce.clone();
        // Envoy's types: what the proxy holds is the config's resources it wants (sent, or on
        // their way); the Workload type has no view (every workload of the mesh).
        let view = self
            .config
            .as_ref()
            .filter(|c| c.of(kind).is_some())
            .map(|config| ClientView::Waypoint {
                config: config.clone(),
                kind,
            });
        self.update_status(kind, |entry| {
            entry.wildcard = wildcard;
            if let Some(names) = names {
                entry.names = names;
            }
            if entry.sent_nonce != nonce {
                entry.sent_nonce = nonce;
                entry.sent_at = Some(SystemTime::now());
            }
            entry.view = view;
        });
    }
}

fn empty_status() -> TypeStatus {
    TypeStatus {
        wildcard: false,
        names: Vec::new(),
        sent_nonce: String::new(),
        sent_at: None,
        acked_nonce: String::new(),
        acked_at: None,
        last_error: None,
        view: None,
    }
}

fn kind_name(kind: ResourceType) -> &'static str {
    kind.short_name()
}

/// Every workload of a snapshot as `istio.workload.Workload` resources.
struct Workloads<'a>(&'a Snapshot);

impl Lookup for Workloads<'_> {
    fn get(&self, name: &str) -> Option<Arc<Resource>> {
        self.0.addresses.get(name)?.workload().map(Arc::new)
    }

    fn for_each(&self, f: &mut dyn FnMut(&str, &Arc<Resource>)) {
        for (name, resource) in self.0.addresses.iter() {
            if let Some(workload) = resource.workload() {
                f(name, &Arc::new(workload));
            }
        }
    }
}
