//! The root bundle in every namespace: ConfigMap `istio-ca-root-cert` (label
//! `istio.io/config: "true"`, key `root-cert.pem`), as istiod distributes it, written by the
//! leader only.
//!
//! It watches Namespaces and the ConfigMaps of that name (a field selector, across all
//! namespaces), and converges: every namespace that the discovery selectors select, that is not
//! `kube-public`, `kube-node-lease` or `local-path-storage`, and that is not terminating gets the
//! ConfigMap with the current root; a deleted one is re-created, an edited one (another root, a
//! missing label) is patched back, and a root change reaches every namespace. Nothing is
//! written before both watches have listed, while the root is unknown, or while this replica
//! does not lead. Failed writes are retried per namespace with exponential backoff; nothing
//! here ever stops the process.

use std::collections::HashMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::discovery::model::Labels;
use crate::kube::cluster::DiscoverySelectors;
use crate::kube::leader::Leadership;
use crate::kube::listed::{Listed, namespace_entry};

/// The ConfigMap's name (istiod's `PILOT_CA_CERT_CONFIGMAP` default).
pub const ROOT_CONFIGMAP: &str = "istio-ca-root-cert";
/// Its data key.
pub const ROOT_KEY: &str = "root-cert.pem";
/// Its label.
pub const CONFIG_LABEL: (&str, &str) = ("istio.io/config", "true");
/// Namespaces that never get it (kube-system does, for ztunnel).
pub const EXCLUDED_NAMESPACES: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];
/// The field manager of our writes.
const FIELD_MANAGER: &str = "ambientd";

/// Where the ConfigMaps go and how failures are retried.
#[derive(Clone)]
pub struct RootConfigMaps {
    pub client: kube::Client,
    pub selectors: DiscoverySelectors,
    /// First retry delay after a failed write; doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl std::fmt::Debug for RootConfigMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootConfigMaps")
            .field("selectors", &self.selectors)
            .finish_non_exhaustive()
    }
}

/// What a namespace's root ConfigMap holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    resource_version: Option<String>,
    root: Option<String>,
    labelled: bool,
}

/// The Namespaces followed: labels (for the discovery selectors) and whether terminating.
type Namespaces = Listed<(Labels, bool)>;
/// The root ConfigMaps followed, by namespace.
type Maps = Listed<Held>;

/// A namespace whose write failed: when to try again, and the next delay.
#[derive(Debug)]
struct Retry {
    at: Instant,
    delay: Duration,
}

fn map_entry(cm: &ConfigMap) -> (String, Option<Held>) {
    let namespace = cm.metadata.namespace.clone().unwrap_or_default();
    let labelled = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONFIG_LABEL.0))
        .is_some_and(|v| v == CONFIG_LABEL.1);
    let held = Held {
        resource_version: cm.metadata.resource_version.clone(),
        root: cm.data.as_ref().and_then(|d| d.get(ROOT_KEY)).cloned(),
        labelled,
    };
    (namespace, Some(held))
}

/// Whether `namespace` should hold the root ConfigMap.
pub fn wanted(
    selectors: &DiscoverySelectors,
    namespace: &str,
    labels: &Labels,
    terminating: bool,
) -> bool {
    !terminating && !EXCLUDED_NAMESPACES.contains(&namespace) && selectors.selects(labels)
}

impl RootConfigMaps {
    /// Converges until `stop`. `roots` carries the current root bundle (empty: unknown).
    pub async fn run(
        self,
        mut roots: watch::Receiver<String>,
        mut leadership: Leadership,
        stop: CancellationToken,
    ) {
        let namespaces_api: Api<Namespace> = Api::all(self.client.clone());
        let maps_api: Api<ConfigMap> = Api::all(self.client.clone());
        let mut namespace_events = watcher(namespaces_api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let fields = format!("metadata.name={ROOT_CONFIGMAP}");
        let mut map_events = watcher(maps_api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut namespaces = Namespaces::default();
        let mut maps = Maps::default();
        // Namespaces we wrote to, with what their ConfigMap held when we did: until the watch
        // shows a change, our write is in flight and is not repeated.
        let mut acted: HashMap<String, Option<String>> = HashMap::new();
        let mut retries: HashMap<String, Retry> = HashMap::new();
        let mut roots_open = true;
        loop {
            let next_retry = retries.values().map(|r| r.at).min();
            tokio::select! {
                _ = stop.cancelled() => return,
                Some(event) = namespace_events.next() => {
                    namespaces.apply(event, namespace_entry, "Namespaces for the root ConfigMaps");
                    while let Some(Some(event)) = namespace_events.next().now_or_never() {
                        namespaces.apply(event, namespace_entry, "Namespaces for the root ConfigMaps");
                    }
                }
                Some(event) = map_events.next() => {
                    maps.apply(event, map_entry, "the root ConfigMaps");
                    while let Some(Some(event)) = map_events.next().now_or_never() {
                        maps.apply(event, map_entry, "the root ConfigMaps");
                    }
                }
                changed = roots.changed(), if roots_open => {
                    if changed.is_err() {
                        roots_open = false;
                    } else {
                        // A new root: every namespace is due at once.
                        retries.clear();
                    }
                }
                leading = leadership.changed() => {
                    if leading {
                        retries.clear();
                        acted.clear();
                    }
                }
                _ = sleep_until(next_retry) => {}
            }
            if !(namespaces.listed && maps.listed && leadership.is_leader()) {
                continue;
            }
            let root = roots.borrow().clone();
            if root.is_empty() {
                continue;
            }
            self.converge(
                &root,
                &namespaces,
                &maps,
                &leadership,
                &mut acted,
                &mut retries,
            )
            .await;
        }
    }

    async fn converge(
        &self,
        root: &str,
        namespaces: &Namespaces,
        maps: &Maps,
        leadership: &Leadership,
        acted: &mut HashMap<String, Option<String>>,
        retries: &mut HashMap<String, Retry>,
    ) {
        let now = Instant::now();
        acted.retain(|ns, _| namespaces.current.contains_key(ns));
        retries.retain(|ns, _| namespaces.current.contains_key(ns));
        for (namespace, (labels, terminating)) in &namespaces.current {
            if !wanted(&self.selectors, namespace, labels, *terminating) {
                continue;
            }
            let held = maps.current.get(namespace);
            let in_sync = held.is_some_and(|h| h.labelled && h.root.as_deref() == Some(root));
            let seen = held.and_then(|h| h.resource_version.clone());
            if in_sync {
                acted.remove(namespace);
                retries.remove(namespace);
                continue;
            }
            if acted.get(namespace) == Some(&seen) {
                continue; // our write has not come back through the watch yet
            }
            if retries.get(namespace).is_some_and(|r| r.at > now) {
                continue;
            }
            if !leadership.is_leader() {
                return;
            }
            match self.write(namespace, root, held.is_some()).await {
                Ok(()) => {
                    acted.insert(namespace.clone(), seen);
                    retries.remove(namespace);
                }
                Err(error) => {
                    let delay = retries
                        .get(namespace)
                        .map_or(self.backoff, |r| (r.delay * 2).min(self.max_backoff));
                    warn!(%namespace, %error, retry_in = ?delay, "cannot write the root ConfigMap");
                    retries.insert(
                        namespace.clone(),
                        Retry {
                            at: Instant::now() + delay,
                            delay,
                        },
                    );
                }
            }
        }
    }

    /// Creates the ConfigMap, or patches the root and label back into an existing one.
    async fn write(&self, namespace: &str, root: &str, exists: bool) -> Result<(), kube::Error> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        if exists {
            let patch = json!({
                "metadata": {"labels": {CONFIG_LABEL.0: CONFIG_LABEL.1}},
                "data": {ROOT_KEY: root},
            });
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            api.patch(ROOT_CONFIGMAP, &params, &Patch::Merge(patch))
                .await?;
            info!(%namespace, "updated the root ConfigMap");
            return Ok(());
        }
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(ROOT_CONFIGMAP.into()),
                namespace: Some(namespace.into()),
                labels: Some([(CONFIG_LABEL.0.to_string(), CONFIG_LABEL.1.to_string())].into()),
                ..ObjectMeta::default()
            },
            data: Some([(ROOT_KEY.to_string(), root.to_string())].into()),
            ..ConfigMap::default()
        };
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        match api.create(&params, &map).await {
            Ok(_) => {
                info!(%namespace, "created the root ConfigMap");
                Ok(())
            }
            // Created meanwhile (our watch lags): the watch brings it, and we patch if needed.
            Err(kube::Error::Api(status)) if status.code == 409 => {
                debug!(%namespace, "the root ConfigMap already exists");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excluded_terminating_and_unselected_namespaces_get_nothing() {
        let all = DiscoverySelectors::default();
        let none = Labels::new();
        assert!(wanted(&all, "default", &none, false));
        assert!(wanted(&all, "kube-system", &none, false));
        assert!(!wanted(&all, "kube-public", &none, false));
        assert!(!wanted(&all, "kube-node-lease", &none, false));
        assert!(!wanted(&all, "local-path-storage", &none, false));
        assert!(!wanted(&all, "default", &none, true));
        let selected = DiscoverySelectors::parse_all(&["team=a"]).unwrap();
        assert!(!wanted(&selected, "default", &none, false));
        let labels: Labels = [("team".to_string(), "a".to_string())].into();
        assert!(wanted(&selected, "default", &labels, false));
    }
}
