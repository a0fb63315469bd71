//! The waypoint configs of this replica, one per [`ConfigId`], shared by every stream that has
//! that id (a waypoint's replicas): built once per snapshot, by the first stream that needs
//! it, from the previous one when it exists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::discovery::Snapshot;
use crate::waypoint::{ConfigId, WaypointConfig, WaypointSettings};

/// One id's latest config. Streams hold the entry they use; an entry no stream holds is
/// dropped.
pub type Entry = Arc<Mutex<Option<Arc<WaypointConfig>>>>;

#[derive(Debug)]
pub struct WaypointConfigs {
    settings: WaypointSettings,
    entries: Mutex<HashMap<ConfigId, Entry>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A config, and how long it took to bring it to its snapshot (zero when another stream had).
pub struct Fetched {
    pub config: Arc<WaypointConfig>,
    pub entry: Entry,
    pub built: Option<std::time::Duration>,
}

impl WaypointConfigs {
    pub fn new(settings: WaypointSettings) -> Self {
        WaypointConfigs {
            settings,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> &WaypointSettings {
        &self.settings
    }

    /// `id`'s config for `snapshot`: the shared one when it is current, else brought up to
    /// date (incrementally from the last one, or built). Streams of one id build it once; a
    /// stream still on an older snapshot gets the newer config, which is what it would get next.
    pub fn get(&self, id: &ConfigId, snapshot: &Snapshot) -> Fetched {
        let entry = {
            let mut entries = lock(&self.entries);
            // Entries only this map holds belong to waypoints that are gone.
            entries.retain(|_, e| Arc::strong_count(e) > 1);
            entries.entry(id.clone()).or_default().clone()
        };
        let mut slot = lock(&entry);
        if let Some(config) = slot.as_ref()
            && config.generation >= snapshot.generation
        {
            let config = config.clone();
            drop(slot);
            return Fetched {
                config,
                entry,
                built: None,
            };
        }
        let started = Instant::now();
        let config = Arc::new(match slot.as_ref() {
            Some(previous) => previous.update(id, snapshot, &self.settings),
            None => WaypointConfig::build(id, snapshot, &self.settings),
        });
        *slot = Some(config.clone());
        drop(slot);
        Fetched {
            config,
            entry,
            built: Some(started.elapsed()),
        }
    }

    /// How many waypoint configs are held.
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
