//! The waypoint deployment controller and Gateway status (istio/istio `pilot/pkg/config/kube/gatewaycommon/deploymentcontroller.go` and `pilot/pkg/config/kube/gateway/conversion.go`), as istiod's
//! gateway deployment controller and gateway status controller do them for class
//! `istio-waypoint`.
//!
//! * **Leader only.** It watches Gateways itself, and writes nothing until they have listed and
//!   this replica leads. Its memory of what it wrote is dropped when leadership goes, so a new
//!   leader re-applies everything once.
//! * **The class.** GatewayClass `istio-waypoint` is created when missing (create only; an
//!   existing one is never changed), and its status says `Accepted`.
//! * **Per managed waypoint Gateway** (class `istio-waypoint`, no `spec.addresses` or exactly
//!   one IPAddress): a ServiceAccount, a Deployment running Istio's proxy as a waypoint and a
//!   Service on 15021 and 15008 ([`render`]). They are server-side applied under one field
//!   manager (`istio.io/gateway-controller`, forced), with owner references to the Gateway so
//!   that deleting it deletes them. They are applied again only when what they render to
//!   changes, and every [`RESYNC`] in case someone changed them.
//! * **Gateway status** ([`status`]): addresses (the Service's ClusterIPs, then its
//!   hostname), the Gateway's and each listener's conditions. It is written as a JSON merge
//!   patch of the `status` subresource, only when it differs from what the Gateway carries
//!   (times aside). The Service's ClusterIPs and whether it has ready endpoints come from the
//!   published snapshot. So once the waypoint's pod is ready the status gets its addresses,
//!   the index binds the Services that use the waypoint, and ztunnels and the waypoint are
//!   told, with no other step.
//! * **Calls are rate-limited** (a token bucket of `--status-qps`, as the status writer's, with
//!   a budget of its own), so a mass change drains at a steady pace.
//! * **Failures** are logged and retried per Gateway with exponential backoff; a Gateway
//!   deleted meanwhile is dropped. Nothing here stops the process.
//!
//! * **Route status** ([`route_status`]): HTTPRoutes and GRPCRoutes get their parents'
//!   conditions from a task of its own, started with the controller, under the same
//!   leadership and settings.
//!
//! API calls (for RBAC): `list`/`watch` on gateways; `patch` (apply) on serviceaccounts,
//! deployments and services; `patch` on `gateways/status`; `get` and `create` on
//! gatewayclasses and `patch` on `gatewayclasses/status`; and [`route_status`]'s.

pub mod render;
pub mod route_status;
pub mod status;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::Snapshot;
use crate::kube::cluster::{Recorded, Retry as WatchRetry};
use crate::kube::leader::Leadership;
use crate::kube::listed::Listed;
use crate::kube::status_writer::RateLimiter;
use crate::pb::istio::workload::{Address, WorkloadStatus, address};
use render::{GatewayInfo, ListenerInfo, ProxySettings};
use status::ServiceState;

/// The class this controller deploys.
pub const WAYPOINT_CLASS: &str = "istio-waypoint";
/// Everything is applied again this often, in case an applied object was changed or deleted.
pub const RESYNC: Duration = Duration::from_secs(300);
/// The longest wait between retries of the controller's Gateway watch.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

fn api_resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn gateways() -> ApiResource {
    api_resource("gateway.networking.k8s.io", "v1", "Gateway", "gateways")
}

fn gateway_classes() -> ApiResource {
    api_resource(
        "gateway.networking.k8s.io",
        "v1",
        "GatewayClass",
        "gatewayclasses",
    )
}

/// The resource an applied object is written through, from its `kind`.
fn resource_of(object: &Value) -> Option<ApiResource> {
    Some(match object["kind"].as_str()? {
        "ServiceAccount" => api_resource("", "v1", "ServiceAccount", "serviceaccounts"),
        "Deployment" => api_resource("apps", "v1", "Deployment", "deployments"),
        "Service" => api_resource("", "v1", "Service", "services"),
        _ => return None,
    })
}

/// The proxy image a waypoint runs by default.
pub const DEFAULT_IMAGE: &str = "docker.io/istio/proxyv2:1.28.0";

/// The proxy settings of a default install: [`DEFAULT_IMAGE`], dialing ambientd's Service
/// `istiod` in `system_namespace` on 15012, in cluster `Kubernetes` and trust domain
/// `cluster.local`.
pub fn default_proxy(system_namespace: &str) -> ProxySettings {
    ProxySettings {
        image: DEFAULT_IMAGE.into(),
        image_pull_policy: None,
        istiod_address: format!("istiod.{system_namespace}.svc:15012"),
        cluster_id: "Kubernetes".into(),
        trust_domain: "cluster.local".into(),
        domain: "cluster.local".into(),
        mesh_id: "cluster.local".into(),
        network: String::new(),
        revision: String::new(),
        replicas: None,
        resources: None,
    }
}

/// What the controller needs to write.
#[derive(Clone)]
pub struct WaypointController {
    pub client: kube::Client,
    pub proxy: ProxySettings,
    /// API calls per second (bursts of twice as many).
    pub qps: u32,
    /// First retry delay after a failed write; doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl std::fmt::Debug for WaypointController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaypointController")
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

/// A watched Gateway: what rendering reads, its current status, and whether it is ours.
#[derive(Debug, Clone)]
struct Stored {
    info: GatewayInfo,
    status: Option<Value>,
}

/// `ns/name` and the Gateway as [`GatewayInfo`]; one that cannot be read is logged and kept out.
fn stored(object: &DynamicObject) -> (String, Option<Stored>) {
    let namespace = object.metadata.namespace.clone().unwrap_or_default();
    let name = object.metadata.name.clone().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let pairs = |map: &Option<BTreeMap<String, String>>| -> Vec<(String, String)> {
        map.iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    let spec = &object.data["spec"];
    let string_map = |value: &Value| -> Option<Vec<(String, String)>> {
        value.as_object().map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
    };
    let mut listeners = Vec::new();
    for (i, listener) in spec["listeners"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(port) = listener["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
        else {
            warn!(gateway = %key, listener = i, "waypoint controller skips a Gateway whose listener has no valid port");
            return (key, None);
        };
        listeners.push(ListenerInfo {
            name: listener["name"].as_str().unwrap_or_default().to_string(),
            port,
            protocol: listener["protocol"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        });
    }
    let info = GatewayInfo {
        name,
        namespace,
        uid: object.metadata.uid.clone().unwrap_or_default(),
        generation: object.metadata.generation.unwrap_or_default(),
        labels: pairs(&object.metadata.labels),
        annotations: pairs(&object.metadata.annotations),
        class_name: spec["gatewayClassName"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        listeners,
        spec_addresses: spec["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["type"].as_str().unwrap_or("IPAddress").to_string(),
                    a["value"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect(),
        infrastructure_labels: string_map(&spec["infrastructure"]["labels"]),
        infrastructure_annotations: string_map(&spec["infrastructure"]["annotations"]),
    };
    let status = object.data.get("status").cloned().filter(|s| !s.is_null());
    (key, Some(Stored { info, status }))
}

/// A Gateway whose write failed: when to try again, and the next delay.
#[derive(Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

/// What this leader has written, so that nothing is written twice.
#[derive(Debug, Default)]
struct Written {
    /// The class exists and its status is written.
    class: bool,
    /// Gateway -> the rendered objects last applied (as JSON text).
    applied: HashMap<String, String>,
    /// Gateway -> the status last written, without its times.
    status: HashMap<String, Value>,
    /// When everything is applied again.
    resync_at: Option<Instant>,
}

impl WaypointController {
    /// Runs until `stop`, writing while `leadership` says this replica leads.
    pub async fn run(
        self,
        mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
        mut leadership: Leadership,
        stop: CancellationToken,
    ) {
        let routes = route_status::RouteStatusWriter {
            client: self.client.clone(),
            domain: self.proxy.domain.clone(),
            qps: self.qps,
            backoff: self.backoff,
            max_backoff: self.max_backoff,
        };
        tokio::spawn(routes.run(snapshots.clone(), leadership.clone(), stop.clone()));
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &gateways());
        let retry = WatchRetry::Exponential {
            initial: self.backoff,
            max: self.max_backoff.min(WATCH_RETRY_MAX),
        };
        let (backoff, progress) = Recorded::new(retry);
        let mut events = watcher(api, watcher::Config::default())
            .backoff(backoff)
            .boxed();
        let mut listed: Listed<Stored> = Listed::with_backoff(progress);
        let mut written = Written::default();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut limiter = RateLimiter::new(f64::from(self.qps), self.qps.saturating_mul(2));
        loop {
            let next = retries
                .values()
                .map(|r| r.at)
                .chain(written.resync_at)
                .min();
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(event) = events.next() => {
                    listed.apply(event, stored, "Gateways for the waypoint controller");
                    while let Some(Some(event)) = events.next().now_or_never() {
                        listed.apply(event, stored, "Gateways for the waypoint controller");
                    }
                }
                changed = snapshots.changed() => if changed.is_err() { return },
                leading = leadership.changed() => {
                    written = Written::default();
                    retries.clear();
                    if leading {
                        info!("leading: deploying waypoints");
                    }
                }
                _ = sleep_until(next) => {}
            }
            let snapshot = snapshots.borrow().clone();
            let Some(snapshot) = snapshot else { continue };
            if !(listed.listed && leadership.is_leader()) {
                continue;
            }
            if written.resync_at.is_some_and(|at| at <= Instant::now()) {
                written.applied.clear();
                written.status.clear();
                written.resync_at = None;
            }
            self.converge(
                &listed,
                &snapshot,
                &leadership,
                &mut written,
                &mut retries,
                &mut limiter,
            )
            .await;
        }
    }

    /// Writes what differs, for every managed waypoint Gateway.
    async fn converge(
        &self,
        listed: &Listed<Stored>,
        snapshot: &Snapshot,
        leadership: &Leadership,
        written: &mut Written,
        retries: &mut HashMap<String, Retry>,
        limiter: &mut RateLimiter,
    ) {
        let now = Instant::now();
        written.resync_at.get_or_insert(now + RESYNC);
        if !written.class {
            match self.ensure_class(limiter).await {
                Ok(()) => written.class = true,
                Err(e) => warn!(error = %e, "waypoint controller: GatewayClass istio-waypoint"),
            }
        }
        // Gone Gateways: their objects go with them (owner references).
        written
            .applied
            .retain(|key, _| listed.current.contains_key(key));
        written
            .status
            .retain(|key, _| listed.current.contains_key(key));
        retries.retain(|key, _| listed.current.contains_key(key));
        for (key, gateway) in &listed.current {
            if !leadership.is_leader() {
                return;
            }
            let info = &gateway.info;
            if info.class_name != WAYPOINT_CLASS || !render::is_managed(info) {
                continue;
            }
            if retries.get(key).is_some_and(|r| r.at > now) {
                continue;
            }
            match self
                .reconcile(key, gateway, snapshot, written, limiter)
                .await
            {
                Ok(()) => {
                    retries.remove(key);
                }
                Err(e) => {
                    let delay = retries
                        .get(key)
                        .map_or(self.backoff, |r| (r.delay * 2).min(self.max_backoff));
                    warn!(gateway = %key, error = %e, retry_in = ?delay, "waypoint controller: write failed");
                    retries.insert(
                        key.clone(),
                        Retry {
                            at: Instant::now() + delay,
                            delay,
                        },
                    );
                }
            }
        }
    }

    /// One Gateway: its objects, then its status.
    async fn reconcile(
        &self,
        key: &str,
        gateway: &Stored,
        snapshot: &Snapshot,
        written: &mut Written,
        limiter: &mut RateLimiter,
    ) -> Result<(), kube::Error> {
        let info = &gateway.info;
        let rendered = render::render(info, &self.proxy);
        let objects = [
            &rendered.service_account,
            &rendered.deployment,
            &rendered.service,
        ];
        let text = serde_json::to_string(&objects).unwrap_or_default();
        if written.applied.get(key) != Some(&text) {
            for object in objects {
                limiter.acquire().await;
                self.apply(&info.namespace, object).await?;
            }
            info!(gateway = %key, "waypoint objects applied");
            written.applied.insert(key.to_string(), text);
        }
        let service_name = rendered.service["metadata"]["name"]
            .as_str()
            .unwrap_or(&info.name)
            .to_string();
        let state = service_state(snapshot, &info.namespace, &service_name, &self.proxy.domain);
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let wanted = status::gateway_status(
            info,
            &state,
            &self.proxy.domain,
            &now,
            gateway.status.as_ref(),
        );
        let timeless = without_times(&wanted);
        let carried = gateway.status.as_ref().map(without_times);
        if carried.as_ref() == Some(&timeless) || written.status.get(key) == Some(&timeless) {
            return Ok(());
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &info.namespace, &gateways());
        limiter.acquire().await;
        api.patch_status(
            &info.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": wanted })),
        )
        .await?;
        debug!(gateway = %key, "waypoint Gateway status written");
        written.status.insert(key.to_string(), timeless);
        Ok(())
    }

    /// Server-side applies one rendered object.
    async fn apply(&self, namespace: &str, object: &Value) -> Result<(), kube::Error> {
        let Some(resource) = resource_of(object) else {
            return Ok(());
        };
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &resource);
        api.patch(
            name,
            &PatchParams::apply(render::FIELD_MANAGER).force(),
            &Patch::Apply(object),
        )
        .await?;
        Ok(())
    }

    /// Creates GatewayClass `istio-waypoint` when missing, and marks it Accepted.
    async fn ensure_class(&self, limiter: &mut RateLimiter) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &gateway_classes());
        limiter.acquire().await;
        let class = match api.get_opt(WAYPOINT_CLASS).await? {
            Some(class) => class,
            None => {
                let object: DynamicObject = serde_json::from_value(status::waypoint_class())
                    .map_err(kube::Error::SerdeError)?;
                limiter.acquire().await;
                match api.create(&PostParams::default(), &object).await {
                    Ok(created) => {
                        info!("created GatewayClass istio-waypoint");
                        created
                    }
                    // Another writer was faster.
                    Err(kube::Error::Api(e)) if e.code == 409 => api.get(WAYPOINT_CLASS).await?,
                    Err(e) => return Err(e),
                }
            }
        };
        if class.data["spec"]["controllerName"].as_str() != Some("istio.io/mesh-controller") {
            // Someone else's class of that name: not ours to mark.
            return Ok(());
        }
        let previous = class.data.get("status").filter(|s| !s.is_null());
        let generation = class.metadata.generation.unwrap_or_default();
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let wanted = status::class_status(generation, &now, previous);
        if previous.map(without_times) == Some(without_times(&wanted)) {
            return Ok(());
        }
        limiter.acquire().await;
        api.patch_status(
            WAYPOINT_CLASS,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": wanted })),
        )
        .await?;
        Ok(())
    }
}

/// What the snapshot says of the waypoint's Service `<name>.<ns>.svc.<domain>`: whether it
/// exists, its ClusterIPs, and whether a ready endpoint serves it.
pub(crate) fn service_state(
    snapshot: &Snapshot,
    namespace: &str,
    name: &str,
    domain: &str,
) -> ServiceState {
    let key = format!("{namespace}/{name}.{namespace}.svc.{domain}");
    let Some(service) = snapshot.addresses.get(key.as_str()) else {
        return ServiceState {
            exists: false,
            cluster_ips: Vec::new(),
            has_instances: false,
        };
    };
    let cluster_ips = service
        .links()
        .addresses
        .iter()
        .map(|(_, ip)| ip.to_string())
        .collect();
    let has_instances = snapshot
        .lookup_addresses(&key)
        .iter()
        .filter(|name| name.as_str() != key)
        .filter_map(|name| snapshot.addresses.get(name.as_str()))
        .filter_map(|r| Address::decode(r.value()).ok()?.r#type)
        .any(|t| matches!(t, address::Type::Workload(w) if w.status == WorkloadStatus::Healthy as i32));
    ServiceState {
        exists: true,
        cluster_ips,
        has_instances,
    }
}

/// A status with every `lastTransitionTime` taken out, for comparing what it says.
fn without_times(status: &Value) -> Value {
    match status {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| k.as_str() != "lastTransitionTime")
                .map(|(k, v)| (k.clone(), without_times(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_times).collect()),
        other => other.clone(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
