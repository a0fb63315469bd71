//! The pure core: reduced objects in, encoded xDS resources out.
//!
//! Nothing here does I/O or knows about tokio, tonic or the Kubernetes client. The [`Index`] is
//! owned by one task; it applies events and returns the [`Changes`] they caused, and hands out
//! immutable [`Snapshot`]s for everyone else to read.

pub mod alias;
pub mod authorization;
pub mod endpoint_slice;
pub mod entry;
pub mod evaluator;
pub mod index;
pub mod labels;
pub mod links;
pub mod membership;
pub mod model;
pub mod names;
pub mod network_gateway;
pub mod peer_authentication;
pub mod pod;
pub mod policies;
pub mod resource;
pub mod service;
pub mod service_entry;
pub mod snapshot;
pub mod status;
pub mod store;
pub mod trie;
pub mod uid;
pub mod visibility;
pub mod waypoint;
pub mod workload;

pub use index::{Index, Settings};
pub use model::{Event, Kind, Object, ObjectRef};
pub use names::TypeKind;
pub use snapshot::{Changes, Resource, Snapshot, TypeChanges};
