//! The status of HTTPRoutes and GRPCRoutes (istio/istio `pilot/pkg/networking/core/listener_waypoint.go` (routes)), as istiod's gateway
//! status controller writes it (istio/istio `pilot/pkg/config/kube/gateway/conditions.go`
//! `createRouteStatus`, `conversion.go` `referenceAllowed`, `extractParentReferenceInfo`):
//! one `parents` entry per parentRef ambientd serves, with `controllerName`
//! `istio.io/gateway-controller` and the conditions `Accepted`, `ResolvedRefs` and
//! `ResolvedWaypoints`.
//!
//! * **Parents.** A `Service` (group `""`) or `ServiceEntry` (`networking.istio.io`) is
//!   served, found or not. A `Gateway` is served when it is a waypoint (class
//!   `istio-waypoint`): ambientd applies such routes (istiod converts none for a waypoint
//!   Gateway and reports them not allowed). Other parents (another class's Gateway, a
//!   missing Gateway, other kinds) get no entry here, as in istiod.
//! * **Accepted.** True "Route was valid"; for a parent Service or ServiceEntry that does not
//!   exist, false `NoMatchingParent` "parent service: "<name>" not found".
//! * **ResolvedRefs.** True "All references resolved"; false with the reason of the last
//!   problem found: an unsupported filter or invalid header value (`InvalidFilter`), a backend
//!   without a port (`InvalidDestination`), a backend of an unsupported kind (`InvalidKind`),
//!   a backend that does not exist (`BackendNotFound`, "backend(<host>) not found").
//! * **ResolvedWaypoints.** Always true with reason `ResolvedWaypoints`; its message says
//!   "All waypoints resolved", or that the parent is not found, or that neither the parent
//!   nor its namespace has `istio.io/use-waypoint` (the route will not be respected).
//!
//! As with the Gateway status, the new `parents` start from the route's current ones:
//! entries of other controllers stay, ours are replaced in place (keeping a condition's
//! `lastTransitionTime` while its status holds), ours for parents no longer listed go, and
//! new ones are appended. The writer ([`RouteStatusWriter`]) is leader only, rate-limited,
//! and writes a JSON merge patch of the `status` subresource only when it differs (times
//! aside). It is a task of its own beside the Gateway controller: it follows other objects
//! (routes, and Gateways only for their class), and a slow write of one never holds up the
//! other.
//!
//! API calls (for RBAC): `list`/`watch` on httproutes, grpcroutes and gateways; `patch` on
//! `httproutes/status` and `grpcroutes/status`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::discovery::Snapshot;
use crate::discovery::model::status::{StatusKind, StatusTarget};
use crate::discovery::model::{BackendRef, Object, Route, RouteError, RouteFilter, RouteKind};
use crate::kube::cluster::{Recorded, Retry as WatchRetry};
use crate::kube::leader::Leadership;
use crate::kube::listed::Listed;
use crate::kube::status_writer::RateLimiter;

use super::status::{Condition, merge_conditions};
use super::{WAYPOINT_CLASS, api_resource, sleep_until, without_times};

/// The `controllerName` of ambientd's (istiod's) route parent statuses.
pub const ROUTE_CONTROLLER: &str = "istio.io/gateway-controller";
const MISSING_LABEL: &str = "istio.io/use-waypoint label missing from parent and parent namespace; in ambient mode, route will not be respected";
const NO_PARENT: &str = "parent not found";

/// What the status needs to know of the mesh.
pub trait Resolve {
    /// A Service (`service_entry` false) or ServiceEntry: `None` when it does not exist,
    /// else whether it (or its namespace) asks for a waypoint.
    fn parent(&self, service_entry: bool, namespace: &str, name: &str) -> Option<bool>;
    /// Whether a Gateway is a waypoint (class `istio-waypoint`).
    fn waypoint_gateway(&self, namespace: &str, name: &str) -> bool;
    /// Whether a backend Service exists.
    fn service(&self, namespace: &str, name: &str) -> bool;
    /// Whether a hostname resolves to a service from `namespace`.
    fn hostname(&self, namespace: &str, hostname: &str) -> bool;
}

/// [`Resolve`] from a snapshot (services and their `istio.io/WaypointBound` wishes) and the
/// waypoint Gateways the writer watches.
pub struct SnapshotResolve<'a> {
    pub snapshot: &'a Snapshot,
    /// `ns/name` of every Gateway of class `istio-waypoint`.
    pub waypoints: &'a BTreeSet<String>,
}

impl Resolve for SnapshotResolve<'_> {
    fn parent(&self, service_entry: bool, namespace: &str, name: &str) -> Option<bool> {
        let kind = if service_entry {
            StatusKind::ServiceEntry
        } else {
            StatusKind::Service
        };
        let key = (namespace.to_string(), name.to_string());
        // The index keeps a wanted `WaypointBound` for every Service and ServiceEntry; it has
        // a condition exactly when the object or its namespace asks for a waypoint.
        let desired = self.snapshot.statuses.get(&StatusTarget::new(kind, &key))?;
        Some(desired.condition.is_some())
    }

    fn waypoint_gateway(&self, namespace: &str, name: &str) -> bool {
        self.waypoints.contains(&format!("{namespace}/{name}"))
    }

    fn service(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.snapshot
            .statuses
            .contains_key(&StatusTarget::new(StatusKind::Service, &key))
    }

    fn hostname(&self, namespace: &str, hostname: &str) -> bool {
        self.snapshot
            .addresses
            .get(format!("{namespace}/{hostname}").as_str())
            .is_some()
    }
}

/// One parent's outcome.
struct ParentResult {
    /// The parentRef as the route spells it.
    reference: Value,
    denied: Option<RouteError>,
    waypoint_message: &'static str,
}

/// `parentRefString`: group/kind/name/section/port.namespace, with the defaults.
fn parent_ref_string(reference: &Value, route_namespace: &str) -> String {
    let text = |field: &str, default: &str| {
        reference
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_string()
    };
    format!(
        "{}/{}/{}/{}/{}.{}",
        text("group", crate::discovery::model::route::GATEWAY_GROUP),
        text("kind", "Gateway"),
        text("name", ""),
        text("sectionName", ""),
        reference.get("port").and_then(Value::as_u64).unwrap_or(0),
        text("namespace", route_namespace),
    )
}

/// The problem the route's `ResolvedRefs` reports, if any: a conversion error, else the last
/// backend that cannot be resolved (istiod keeps the last error it meets).
pub fn route_error(route: &Route, resolve: &impl Resolve, domain: &str) -> Option<RouteError> {
    if let Some(error) = route.conversion_error() {
        return Some(error);
    }
    let mut last = None;
    for rule in &route.rules {
        let weighted = rule.backends.iter().map(|b| b.weight).sum::<u32>() > 0;
        let redirect = rule
            .filters
            .iter()
            .any(|f| matches!(f, RouteFilter::Redirect(_)));
        let mut backend_error = None;
        if weighted || redirect {
            for backend in rule.backends.iter().filter(|b| b.weight > 0) {
                if let Some(e) = backend_error_of(backend, route, resolve, domain) {
                    backend_error = Some(e);
                }
            }
        }
        // An HTTPRoute's mirror that cannot be used is dropped, and said.
        let mut mirror_error = None;
        if route.kind == RouteKind::Http {
            for filter in &rule.filters {
                if let RouteFilter::Mirror(m) = filter {
                    mirror_error = if m.backend.port.is_none() {
                        Some(RouteError {
                            reason: "InvalidDestination",
                            message: "port is required in backendRef".into(),
                        })
                    } else {
                        backend_error_of(&m.backend, route, resolve, domain)
                    };
                }
            }
        }
        let joined = match (backend_error, mirror_error) {
            (Some(mut a), Some(b)) => {
                a.message = format!("{}; {}", a.message, b.message);
                Some(a)
            }
            (a, b) => a.or(b),
        };
        if joined.is_some() {
            last = joined;
        }
    }
    last
}

fn backend_error_of(
    backend: &BackendRef,
    route: &Route,
    resolve: &impl Resolve,
    domain: &str,
) -> Option<RouteError> {
    let host = match backend.hostname(&route.namespace, domain) {
        Ok(host) => host,
        Err(error) => return Some(error),
    };
    let found = if backend.is_service() {
        resolve.service(backend.namespace_or(&route.namespace), &backend.name)
    } else {
        resolve.hostname(&route.namespace, &host)
    };
    (!found).then(|| RouteError {
        reason: "BackendNotFound",
        message: format!("backend({host}) not found"),
    })
}

/// The route's whole `status` (`parents`), from its current one (`previous`).
/// `parent_refs` are the route's parentRefs as written; `now` (RFC 3339) is the
/// `lastTransitionTime` of a condition that is new or changed status. `domain` names the
/// backend hostnames in messages.
pub fn route_status(
    route: &Route,
    parent_refs: &[Value],
    resolve: &impl Resolve,
    domain: &str,
    previous: Option<&Value>,
    now: &str,
) -> Value {
    let mut results: Vec<ParentResult> = Vec::new();
    for (reference, parent) in parent_refs.iter().zip(&route.parent_refs) {
        let namespace = parent.namespace_or(&route.namespace);
        let result = if parent.is_service() || parent.is_service_entry() {
            let entry = parent.is_service_entry();
            match resolve.parent(entry, namespace, &parent.name) {
                None => ParentResult {
                    reference: reference.clone(),
                    denied: Some(RouteError {
                        reason: "NoMatchingParent",
                        message: format!(
                            "parent {}: {:?} not found",
                            if entry { "service entry" } else { "service" },
                            parent.name
                        ),
                    }),
                    waypoint_message: NO_PARENT,
                },
                Some(configured) => ParentResult {
                    reference: reference.clone(),
                    denied: None,
                    waypoint_message: if configured {
                        "All waypoints resolved"
                    } else {
                        MISSING_LABEL
                    },
                },
            }
        } else if parent.is_gateway() && resolve.waypoint_gateway(namespace, &parent.name) {
            ParentResult {
                reference: reference.clone(),
                denied: None,
                waypoint_message: "All waypoints resolved",
            }
        } else {
            continue;
        };
        results.push(result);
    }
    let error = route_error(route, resolve, domain);
    let current: Vec<Value> = previous
        .and_then(|s| s.get("parents"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ours = |p: &Value| p["controllerName"].as_str() == Some(ROUTE_CONTROLLER);
    let mut parents = current.clone();
    let mut index_of: HashMap<String, usize> = HashMap::new();
    for (i, p) in current.iter().enumerate() {
        if ours(p) {
            index_of
                .entry(parent_ref_string(&p["parentRef"], &route.namespace))
                .or_insert(i);
        }
    }
    let mut appended = Vec::new();
    let mut seen = BTreeSet::new();
    for result in results {
        let key = parent_ref_string(&result.reference, &route.namespace);
        if !seen.insert(key.clone()) {
            continue;
        }
        let accepted = match &result.denied {
            None => Condition::new("Accepted", true, "Accepted", "Route was valid"),
            Some(e) => Condition::new("Accepted", false, e.reason, e.message.clone()),
        };
        let resolved = match &error {
            None => Condition::new(
                "ResolvedRefs",
                true,
                "ResolvedRefs",
                "All references resolved",
            ),
            Some(e) => Condition::new("ResolvedRefs", false, e.reason, e.message.clone()),
        };
        let waypoints = Condition::new(
            "ResolvedWaypoints",
            true,
            "ResolvedWaypoints",
            result.waypoint_message,
        );
        let existing = index_of.remove(&key).map(|i| (i, &current[i]));
        let conditions = merge_conditions(
            existing.map(|(_, p)| &p["conditions"]),
            vec![accepted, resolved, waypoints],
            route.generation,
            now,
        );
        let entry = json!({
            "parentRef": result.reference,
            "controllerName": ROUTE_CONTROLLER,
            "conditions": conditions,
        });
        match existing {
            Some((i, _)) => parents[i] = entry,
            None => appended.push((key, entry)),
        }
    }
    // istiod appends new parents in descending parentRef order.
    appended.sort_by(|a, b| b.0.cmp(&a.0));
    parents.extend(appended.into_iter().map(|(_, e)| e));
    // Ours for parents no longer served go.
    let stale: BTreeSet<usize> = index_of.into_values().collect();
    let parents: Vec<Value> = parents
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !stale.contains(i))
        .map(|(_, p)| p)
        .collect();
    let mut status = previous
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    status.insert("parents".into(), Value::Array(parents));
    Value::Object(status)
}

fn route_resource(kind: RouteKind) -> ApiResource {
    match kind {
        RouteKind::Http => {
            api_resource("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
        }
        RouteKind::Grpc => {
            api_resource("gateway.networking.k8s.io", "v1", "GRPCRoute", "grpcroutes")
        }
        // Never watched here: a VirtualService gets no route status.
        RouteKind::Virtual => api_resource(
            "networking.istio.io",
            "v1",
            "VirtualService",
            "virtualservices",
        ),
    }
}

/// A watched route: as decoded, its parentRefs as written, and its current status.
#[derive(Clone, Debug)]
struct Stored {
    route: Route,
    parent_refs: Vec<Value>,
    status: Option<Value>,
}

fn stored(kind: RouteKind) -> impl Fn(&DynamicObject) -> (String, Option<Stored>) {
    move |object| {
        let namespace = object.metadata.namespace.clone().unwrap_or_default();
        let name = object.metadata.name.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let value = serde_json::to_value(object).unwrap_or_default();
        let decoded = match kind {
            RouteKind::Http => crate::kube::routes::http_route(&value),
            RouteKind::Grpc => crate::kube::routes::grpc_route(&value),
            RouteKind::Virtual => return (key, None),
        };
        let route = match decoded {
            Ok(Object::HttpRoute(r) | Object::GrpcRoute(r)) => r,
            Ok(_) => return (key, None),
            Err(reason) => {
                debug!(route = %key, kind = kind.as_str(), %reason, "route status skips a route it cannot read");
                return (key, None);
            }
        };
        let parent_refs = value["spec"]["parentRefs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let status = object.data.get("status").cloned().filter(|s| !s.is_null());
        (
            key,
            Some(Stored {
                route,
                parent_refs,
                status,
            }),
        )
    }
}

/// `ns/name` of a waypoint Gateway (class `istio-waypoint`); others are not kept.
fn waypoint_gateway(object: &DynamicObject) -> (String, Option<()>) {
    let key = format!(
        "{}/{}",
        object.metadata.namespace.clone().unwrap_or_default(),
        object.metadata.name.clone().unwrap_or_default()
    );
    let class = object.data["spec"]["gatewayClassName"].as_str();
    (key, (class == Some(WAYPOINT_CLASS)).then_some(()))
}

/// A route whose write failed: when to try again, and the next delay.
#[derive(Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

/// Writes route status (leader only). Its calls share the Gateway controller's settings.
#[derive(Clone)]
pub struct RouteStatusWriter {
    pub client: kube::Client,
    /// The cluster's DNS domain, for backend hostnames in messages.
    pub domain: String,
    /// API calls per second (bursts of twice as many).
    pub qps: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl RouteStatusWriter {
    /// Runs until `stop`, writing while `leadership` says this replica leads.
    pub async fn run(
        self,
        mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
        mut leadership: Leadership,
        stop: CancellationToken,
    ) {
        let retry = WatchRetry::Exponential {
            initial: self.backoff,
            max: self.max_backoff.min(Duration::from_secs(5)),
        };
        let watch = |resource: &ApiResource| {
            let (backoff, progress) = Recorded::new(retry);
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            (
                watcher(api, watcher::Config::default())
                    .backoff(backoff)
                    .boxed(),
                progress,
            )
        };
        let (mut http_events, http_progress) = watch(&route_resource(RouteKind::Http));
        let (mut grpc_events, grpc_progress) = watch(&route_resource(RouteKind::Grpc));
        let (mut gateway_events, gateway_progress) = watch(&super::gateways());
        let mut http: Listed<Stored> = Listed::with_backoff(http_progress);
        let mut grpc: Listed<Stored> = Listed::with_backoff(grpc_progress);
        let mut gateways: Listed<()> = Listed::with_backoff(gateway_progress);
        let mut written: HashMap<String, Value> = HashMap::new();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut limiter = RateLimiter::new(f64::from(self.qps), self.qps.saturating_mul(2));
        loop {
            let next = retries.values().map(|r| r.at).min();
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(event) = http_events.next() => {
                    http.apply(event, stored(RouteKind::Http), "HTTPRoutes for route status");
                    while let Some(Some(event)) = http_events.next().now_or_never() {
                        http.apply(event, stored(RouteKind::Http), "HTTPRoutes for route status");
                    }
                }
                Some(event) = grpc_events.next() => {
                    grpc.apply(event, stored(RouteKind::Grpc), "GRPCRoutes for route status");
                    while let Some(Some(event)) = grpc_events.next().now_or_never() {
                        grpc.apply(event, stored(RouteKind::Grpc), "GRPCRoutes for route status");
                    }
                }
                Some(event) = gateway_events.next() => {
                    gateways.apply(event, waypoint_gateway, "Gateways for route status");
                }
                changed = snapshots.changed() => if changed.is_err() { return },
                _ = leadership.changed() => {
                    written.clear();
                    retries.clear();
                }
                _ = sleep_until(next) => {}
            }
            let snapshot = snapshots.borrow().clone();
            let Some(snapshot) = snapshot else { continue };
            // Gateway parents need the Gateways (unless their CRD is not installed).
            if !leadership.is_leader() || !(gateways.listed || gateways.unavailable()) {
                continue;
            }
            let waypoints: BTreeSet<String> = gateways.current.keys().cloned().collect();
            let resolve = SnapshotResolve {
                snapshot: &snapshot,
                waypoints: &waypoints,
            };
            for (kind, listed) in [(RouteKind::Http, &http), (RouteKind::Grpc, &grpc)] {
                if !listed.listed {
                    continue;
                }
                let prefix = format!("{}/", kind.as_str());
                written.retain(|key, _| {
                    !key.starts_with(&prefix) || listed.current.contains_key(&key[prefix.len()..])
                });
                retries.retain(|key, _| {
                    !key.starts_with(&prefix) || listed.current.contains_key(&key[prefix.len()..])
                });
                for (key, route) in &listed.current {
                    if !leadership.is_leader() {
                        break;
                    }
                    let id = format!("{prefix}{key}");
                    if retries.get(&id).is_some_and(|r| r.at > Instant::now()) {
                        continue;
                    }
                    match self
                        .reconcile(kind, &id, route, &resolve, &mut written, &mut limiter)
                        .await
                    {
                        Ok(()) => {
                            retries.remove(&id);
                        }
                        Err(e) => {
                            let delay = retries
                                .get(&id)
                                .map_or(self.backoff, |r| (r.delay * 2).min(self.max_backoff));
                            warn!(route = %id, error = %e, retry_in = ?delay, "route status write failed");
                            retries.insert(
                                id,
                                Retry {
                                    at: Instant::now() + delay,
                                    delay,
                                },
                            );
                        }
                    }
                }
            }
        }
    }

    /// One route: its status, written when it differs from what it carries.
    async fn reconcile(
        &self,
        kind: RouteKind,
        id: &str,
        stored: &Stored,
        resolve: &SnapshotResolve<'_>,
        written: &mut HashMap<String, Value>,
        limiter: &mut RateLimiter,
    ) -> Result<(), kube::Error> {
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .unwrap_or_else(|_| time::OffsetDateTime::now_utc())
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let wanted = route_status(
            &stored.route,
            &stored.parent_refs,
            resolve,
            &self.domain,
            stored.status.as_ref(),
            &now,
        );
        let timeless = without_times(&wanted);
        let carried = stored.status.as_ref().map(without_times);
        if carried.as_ref() == Some(&timeless) || written.get(id) == Some(&timeless) {
            return Ok(());
        }
        let route = &stored.route;
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &route.namespace, &route_resource(kind));
        limiter.acquire().await;
        api.patch_status(
            &route.name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": wanted })),
        )
        .await?;
        debug!(route = %id, "route status written");
        written.insert(id.to_string(), timeless);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
