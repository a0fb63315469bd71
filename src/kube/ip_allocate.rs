//! The IP auto-allocator: istiod's `ipallocate` controller (`PILOT_ENABLE_IP_AUTOALLOCATE`).
//! A ServiceEntry without `spec.addresses` gets one address per host from each of two ranges
//! (240.240.0.0/16 and 2001:2::/48 unless configured), written to `status.addresses` as
//! `{host, value}`; the conversion gives its Services those addresses (docs/conversion.md,
//! "ServiceEntry → Services and Workloads"), and ztunnel's DNS proxy answers the host with them.
//! Without it such a ServiceEntry has no VIP in the mesh. What is allocated, and how conflicts
//! are settled, is [`plan`]'s.
//!
//! * **Leader only.** It watches ServiceEntries and Namespaces itself, and plans nothing until
//!   both have listed and this replica leads. A new leader first records every address in use
//!   (from the listed objects), so it never hands out one that is taken; its memory is
//!   dropped when leadership goes.
//! * **Writes** are JSON merge patches of `status.addresses` on the `status` subresource,
//!   carrying the `metadata.resourceVersion` the plan was made from: a change in between is a
//!   409, and the next plan starts from the new object. Other status fields (the conditions
//!   the status writer puts there) are untouched. The patched object is taken as the new
//!   state at once, so the same entry is not planned twice while the watch catches up.
//! * **Failures** are logged and retried per entry with exponential backoff; a deleted entry
//!   (404) is dropped. Nothing here stops the process.
//! * **Discovery selectors:** entries in namespaces they do not select get no addresses, but
//!   their addresses count as taken.
//!
//! API calls (for RBAC): `list`/`watch` on serviceentries and namespaces, `patch` on
//! `serviceentries/status`.

pub mod plan;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::model::{Labels, Object};
use crate::kube::cluster::{DiscoverySelectors, Recorded, Retry as WatchRetry};
use crate::kube::leader::Leadership;
use crate::kube::listed::{Listed, namespace_entry};
use crate::kube::objects::decode_json;
use plan::{Allocator, Entry, Write};
pub use plan::{DEFAULT_IPV4_PREFIX, DEFAULT_IPV6_PREFIX, Prefix};

/// The field manager of our writes.
const FIELD_MANAGER: &str = "ambientd";
const API_VERSION: &str = "networking.istio.io/v1";

/// The two ranges addresses come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefixes {
    pub v4: Prefix,
    pub v6: Prefix,
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes {
            v4: DEFAULT_IPV4_PREFIX.parse().expect("default IPv4 prefix"),
            v6: DEFAULT_IPV6_PREFIX.parse().expect("default IPv6 prefix"),
        }
    }
}

impl Prefixes {
    /// Both ranges from their text; each must be of its family.
    pub fn parse(v4: &str, v6: &str) -> Result<Self, String> {
        let v4: Prefix = v4.parse()?;
        let v6: Prefix = v6.parse()?;
        if !v4.is_ipv4() {
            return Err(format!("{v4} is not an IPv4 prefix"));
        }
        if v6.is_ipv4() {
            return Err(format!("{v6} is not an IPv6 prefix"));
        }
        Ok(Prefixes { v4, v6 })
    }
}

/// Where the allocator writes and how failures are retried.
#[derive(Clone)]
pub struct IpAllocation {
    pub client: kube::Client,
    pub selectors: DiscoverySelectors,
    pub prefixes: Prefixes,
    /// First retry delay after a failed write; doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl std::fmt::Debug for IpAllocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpAllocation")
            .field("prefixes", &self.prefixes)
            .finish_non_exhaustive()
    }
}

fn resource() -> ApiResource {
    ApiResource {
        group: "networking.istio.io".into(),
        version: "v1".into(),
        api_version: API_VERSION.into(),
        kind: "ServiceEntry".into(),
        plural: "serviceentries".into(),
    }
}

/// A watched ServiceEntry: what the plan reads, and the resourceVersion a write names.
#[derive(Debug)]
struct Stored {
    entry: Entry,
    resource_version: String,
}

/// The ServiceEntries followed, by `ns/name`.
type Entries = Listed<Stored>;
/// The Namespaces followed: labels (for the discovery selectors) and whether terminating.
type Namespaces = Listed<(Labels, bool)>;

/// `ns/name` and the decoded entry; an entry that cannot be read is logged and kept out.
fn entry(object: &DynamicObject) -> (String, Option<Stored>) {
    let key = format!(
        "{}/{}",
        object.metadata.namespace.as_deref().unwrap_or_default(),
        object.metadata.name.as_deref().unwrap_or_default()
    );
    match stored(object) {
        Ok(stored) => (key, Some(stored)),
        Err(reason) => {
            warn!(serviceentry = %key, %reason, "IP auto-allocation skips an unreadable ServiceEntry");
            (key, None)
        }
    }
}

/// The decoded entry, or why the object cannot be read.
fn stored(object: &DynamicObject) -> Result<Stored, String> {
    let json = serde_json::to_string(object).map_err(|e| e.to_string())?;
    let resource_version = object.metadata.resource_version.clone().unwrap_or_default();
    match decode_json(API_VERSION, "ServiceEntry", &json) {
        Some(Ok(Object::ServiceEntry(se))) => Ok(Stored {
            entry: Entry { se, selected: true },
            resource_version,
        }),
        Some(Err(reason)) => Err(reason),
        _ => Err("not a ServiceEntry".into()),
    }
}

/// The longest wait between retries of the allocator's own watches.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// An entry whose write failed: when to try again, and the next delay.
#[derive(Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

impl IpAllocation {
    /// Allocates until `stop`, while `leadership` says this replica leads.
    pub async fn run(self, mut leadership: Leadership, stop: CancellationToken) {
        let entries_api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource());
        let namespaces_api: Api<Namespace> = Api::all(self.client.clone());
        // Retries stay a few seconds apart at most, so ServiceEntries are picked up soon after
        // their CRD is installed (until then every list is a 404).
        let retry = WatchRetry::Exponential {
            initial: self.backoff,
            max: self.max_backoff.min(WATCH_RETRY_MAX),
        };
        let (entry_backoff, entry_progress) = Recorded::new(retry);
        let (namespace_backoff, namespace_progress) = Recorded::new(retry);
        let mut entry_events = watcher(entries_api, watcher::Config::default())
            .backoff(entry_backoff)
            .boxed();
        let mut namespace_events = watcher(namespaces_api, watcher::Config::default())
            .backoff(namespace_backoff)
            .boxed();
        let mut entries = Entries::with_backoff(entry_progress);
        let mut namespaces = Namespaces::with_backoff(namespace_progress);
        let mut allocator: Option<Allocator> = None;
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut reported: BTreeSet<String> = BTreeSet::new();
        loop {
            let next_retry = retries.values().map(|r| r.at).min();
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(event) = entry_events.next() => {
                    entries.apply(event, entry, "ServiceEntries for IP auto-allocation");
                    while let Some(Some(event)) = entry_events.next().now_or_never() {
                        entries.apply(event, entry, "ServiceEntries for IP auto-allocation");
                    }
                }
                Some(event) = namespace_events.next() => {
                    namespaces.apply(event, namespace_entry, "Namespaces for IP auto-allocation");
                    while let Some(Some(event)) = namespace_events.next().now_or_never() {
                        namespaces.apply(event, namespace_entry, "Namespaces for IP auto-allocation");
                    }
                }
                leading = leadership.changed() => {
                    if !leading {
                        allocator = None;
                    }
                    retries.clear();
                    reported.clear();
                }
                _ = sleep_until(next_retry) => {}
            }
            if !(entries.listed && namespaces.listed && leadership.is_leader()) {
                continue;
            }
            let allocator = allocator.get_or_insert_with(|| {
                info!(v4 = %self.prefixes.v4, v6 = %self.prefixes.v6, serviceentries = entries.current.len(), "IP auto-allocation starts");
                Allocator::new(self.prefixes.v4, self.prefixes.v6)
            });
            self.converge(
                allocator,
                &mut entries,
                &namespaces,
                &leadership,
                &mut retries,
                &mut reported,
            )
            .await;
        }
    }

    async fn converge(
        &self,
        allocator: &mut Allocator,
        entries: &mut Entries,
        namespaces: &Namespaces,
        leadership: &Leadership,
        retries: &mut HashMap<String, Retry>,
        reported: &mut BTreeSet<String>,
    ) {
        let none = Labels::new();
        for stored in entries.current.values_mut() {
            let labels = namespaces
                .current
                .get(&stored.entry.se.namespace)
                .map_or(&none, |(labels, _)| labels);
            stored.entry.selected = self.selectors.selects(labels);
        }
        retries.retain(|key, _| entries.current.contains_key(key));
        let now = Instant::now();
        let (writes, exhausted) = allocator
            .plan(entries.current.values().map(|s| &s.entry), |key| {
                retries.get(key).is_some_and(|r| r.at > now)
            });
        for full in exhausted {
            if reported.insert(full.prefix.to_string()) {
                warn!(prefix = %full.prefix, "IP auto-allocation: the range is exhausted; ServiceEntries get no address from it");
            }
        }
        for write in writes {
            if !leadership.is_leader() {
                return;
            }
            let key = format!("{}/{}", write.namespace, write.name);
            let Some(resource_version) = entries
                .current
                .get(&key)
                .map(|s| s.resource_version.clone())
            else {
                continue;
            };
            match self.write(&write, &resource_version).await {
                Ok(object) => {
                    retries.remove(&key);
                    if let (key, Some(stored)) = entry(&object) {
                        entries.current.insert(key, stored);
                    }
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    debug!(serviceentry = %key, "deleted before its addresses were written");
                    entries.current.remove(&key);
                }
                Err(error) => {
                    let delay = retries
                        .get(&key)
                        .map_or(self.backoff, |r| (r.delay * 2).min(self.max_backoff));
                    warn!(serviceentry = %key, %error, retry_in = ?delay, "cannot write auto-allocated addresses");
                    retries.insert(
                        key,
                        Retry {
                            at: Instant::now() + delay,
                            delay,
                        },
                    );
                }
            }
        }
    }

    /// Patches `status.addresses`, on the condition that the object is still at
    /// `resource_version`; returns the patched object.
    async fn write(
        &self,
        write: &Write,
        resource_version: &str,
    ) -> Result<DynamicObject, kube::Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &write.namespace, &resource());
        let addresses: Vec<_> = write
            .addresses
            .iter()
            .map(|(host, address)| json!({"host": host, "value": address.to_string()}))
            .collect();
        let patch = json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"addresses": addresses},
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        let object = api
            .patch_status(&write.name, &params, &Patch::Merge(patch))
            .await?;
        info!(
            serviceentry = %format!("{}/{}", write.namespace, write.name),
            addresses = %listed(&write.addresses),
            "auto-allocated addresses"
        );
        Ok(object)
    }
}

fn listed(addresses: &[(String, IpAddr)]) -> String {
    addresses
        .iter()
        .map(|(host, address)| format!("{host}={address}"))
        .collect::<Vec<_>>()
        .join(",")
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
