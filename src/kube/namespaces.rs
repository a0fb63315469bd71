//! The Namespaces a leader-only writer follows with its own watch (the root ConfigMaps, the IP
//! auto-allocator): each one's labels, for the discovery selectors, and whether it is
//! terminating. A re-list replaces them whole.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::watcher;
use tracing::warn;

use crate::discovery::model::Labels;

#[derive(Debug, Default)]
pub(crate) struct Namespaces {
    /// name -> (labels, terminating)
    pub current: BTreeMap<String, (Labels, bool)>,
    relisting: Option<BTreeMap<String, (Labels, bool)>>,
    /// The first list is complete.
    pub listed: bool,
}

fn namespace_entry(ns: &Namespace) -> Option<(String, (Labels, bool))> {
    let name = ns.metadata.name.clone()?;
    let labels = ns.metadata.labels.clone().unwrap_or_default();
    let terminating = ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
    Some((name, (labels.into_iter().collect(), terminating)))
}

impl Namespaces {
    /// Applies one watch event; an error is logged as met while watching `for_what`.
    pub fn apply(
        &mut self,
        event: Result<watcher::Event<Namespace>, watcher::Error>,
        for_what: &str,
    ) {
        match event {
            Ok(watcher::Event::Init) => self.relisting = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(ns)) => {
                if let (Some(list), Some((k, v))) = (&mut self.relisting, namespace_entry(&ns)) {
                    list.insert(k, v);
                }
            }
            Ok(watcher::Event::InitDone) => {
                self.current = self.relisting.take().unwrap_or_default();
                self.listed = true;
            }
            Ok(watcher::Event::Apply(ns)) => {
                if let Some((k, v)) = namespace_entry(&ns) {
                    self.current.insert(k, v);
                }
            }
            Ok(watcher::Event::Delete(ns)) => {
                if let Some(name) = &ns.metadata.name {
                    self.current.remove(name);
                }
            }
            Err(error) => warn!(%error, "watching Namespaces for {for_what}"),
        }
    }
}
