//! Connected proxies, for the debug views (`/debug/syncz`, `/debug/config_dump`, ...).
//!
//! Each connection task owns its state and publishes a small summary here after every step:
//! one uncontended lock per response. The debug server only reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use crate::discovery::Snapshot;
use crate::discovery::names::{PerType, ResourceType};
use crate::push::server::ProxyInfo;

/// What the client holds for one type.
#[derive(Clone, Debug)]
pub enum ClientView {
    /// A wildcard client holds exactly this snapshot's resources of the type.
    Snapshot(Arc<Snapshot>),
    /// An explicit (on-demand) client holds these names, at these versions.
    Held(BTreeMap<String, String>),
    /// A waypoint holds its config's resources of `kind` that it wants: all of them for a
    /// wildcard type, else the [`TypeStatus::names`] it asked for.
    Waypoint {
        config: Arc<crate::waypoint::WaypointConfig>,
        kind: ResourceType,
    },
}

/// One type's sync state on one connection.
#[derive(Clone, Debug)]
pub struct TypeStatus {
    pub wildcard: bool,
    /// Explicitly subscribed names.
    pub names: Vec<String>,
    pub sent_nonce: String,
    pub sent_at: Option<SystemTime>,
    pub acked_nonce: String,
    pub acked_at: Option<SystemTime>,
    /// The last NACK's message, until the next ACK.
    pub last_error: Option<String>,
    pub view: Option<ClientView>,
}

/// What a connection has not yet delivered to its proxy. A slow proxy holds at most one queued
/// response and the names changed since its view, never a backlog of responses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// Responses waiting for the gRPC encoder (at most [`crate::push::outbound::QUEUE`]).
    pub queued_responses: usize,
    /// Their encoded size.
    pub queued_bytes: usize,
    /// Resource names changed since what the proxy was last sent, not yet sent; each counted
    /// once however often it changed.
    pub changed_names: usize,
}

/// One connection as the debug views show it.
#[derive(Clone, Debug)]
pub struct ConnectionStatus {
    pub id: u64,
    /// `<pod name>.<namespace>-<id>` (or the peer address before the node is known).
    pub connection_id: String,
    pub peer: String,
    pub connected_at: SystemTime,
    pub proxy: Option<ProxyInfo>,
    pub types: PerType<TypeStatus>,
    /// A waypoint's types (Cluster, ClusterLoadAssignment, Listener, Workload).
    pub waypoint_types: BTreeMap<ResourceType, TypeStatus>,
    pub pending: Pending,
}

/// Every connection on this replica.
#[derive(Debug, Default)]
pub struct Registry {
    connections: Mutex<BTreeMap<u64, Arc<Mutex<ConnectionStatus>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    /// Adds a connection; the handle removes it when dropped.
    pub fn register(self: &Arc<Self>, id: u64, peer: String) -> Handle {
        let status = Arc::new(Mutex::new(ConnectionStatus {
            id,
            connection_id: format!("{peer}-{id}"),
            peer,
            connected_at: SystemTime::now(),
            proxy: None,
            types: PerType::new(),
            waypoint_types: BTreeMap::new(),
            pending: Pending::default(),
        }));
        lock(&self.connections).insert(id, status.clone());
        Handle {
            registry: self.clone(),
            id,
            status,
        }
    }

    /// A copy of every connection's status, by id.
    pub fn list(&self) -> Vec<ConnectionStatus> {
        let connections: Vec<_> = lock(&self.connections).values().cloned().collect();
        connections.iter().map(|c| lock(c).clone()).collect()
    }

    /// Connections whose connection id or proxy id contains `needle`.
    pub fn find(&self, needle: &str) -> Vec<ConnectionStatus> {
        self.list()
            .into_iter()
            .filter(|c| {
                c.connection_id.contains(needle)
                    || c.proxy.as_ref().is_some_and(|p| p.id.contains(needle))
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        lock(&self.connections).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A connection's entry; removed from the registry on drop.
pub struct Handle {
    registry: Arc<Registry>,
    id: u64,
    status: Arc<Mutex<ConnectionStatus>>,
}

impl Handle {
    /// Runs `f` on this connection's status.
    pub fn update(&self, f: impl FnOnce(&mut ConnectionStatus)) {
        f(&mut lock(&self.status));
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        lock(&self.registry.connections).remove(&self.id);
    }
}
