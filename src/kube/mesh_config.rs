//! Following the mesh config file (`--mesh-config`), as istiod follows its `istio` ConfigMap.
//!
//! The file is read again every few seconds (a mounted ConfigMap changes by swapping a
//! symbolic link, which polling sees without caring how). A changed `serviceEntryVisibility`
//! is applied at once: the index rebuilds under it and pushes only what differs. The other
//! fields ambientd reads (`discoverySelectors`, `rootNamespace`, `trustDomain`) shape the
//! sources, the CA and the debug server as they start, so a change to them is logged as
//! needing a restart. A file that does not parse is logged and the last good one stays.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::discovery::Event;
use crate::kube::cluster::MeshSettings;

/// The mesh config file and what was read from it at start.
#[derive(Clone, Debug)]
pub struct MeshFile {
    pub path: PathBuf,
    pub settings: MeshSettings,
}

/// How often the file is read again.
pub const POLL: Duration = Duration::from_secs(5);

/// Follows `file` until `stop`, sending visibility changes to the index.
pub async fn follow(
    file: MeshFile,
    every: Duration,
    events: mpsc::Sender<Event>,
    stop: CancellationToken,
) {
    let path = file.path.display().to_string();
    let mut current = file.settings;
    let mut last_text: Option<String> = None;
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let text = match tokio::fs::read_to_string(&file.path).await {
            Ok(text) => text,
            Err(e) => {
                let error = e.to_string();
                if last_error.as_ref() != Some(&error) {
                    warn!(%path, %error, "mesh config not read; the last good one stays");
                    last_error = Some(error);
                }
                continue;
            }
        };
        if last_text.as_ref() == Some(&text) {
            continue;
        }
        let parsed = MeshSettings::parse(&text);
        last_text = Some(text);
        let next = match parsed {
            Ok(next) => next,
            Err(error) => {
                warn!(%path, %error, "mesh config does not parse; the last good one stays");
                continue;
            }
        };
        last_error = None;
        if next.service_entry_visibility != current.service_entry_visibility {
            info!(%path, configured = next.service_entry_visibility.is_some(),
                  "serviceEntryVisibility changed: applying it");
            let visibility = next.service_entry_visibility.clone().map(Arc::new);
            if events.send(Event::Visibility(visibility)).await.is_err() {
                return;
            }
        }
        let at_start: Vec<&str> = [
            (
                "discoverySelectors",
                next.discovery_selectors != current.discovery_selectors,
            ),
            (
                "rootNamespace",
                next.root_namespace != current.root_namespace,
            ),
            ("trustDomain", next.trust_domain != current.trust_domain),
        ]
        .into_iter()
        .filter_map(|(field, changed)| changed.then_some(field))
        .collect();
        if !at_start.is_empty() {
            warn!(%path, fields = ?at_start,
                  "mesh config fields changed that are read only at start: restart ambientd to apply them");
        }
        current = next;
    }
}
