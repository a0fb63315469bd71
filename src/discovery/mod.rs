//! The pure core: reduced objects in, encoded xDS resources out.
//!
//! Nothing here does I/O or knows about tokio, tonic or the Kubernetes client. The [`Index`] is
//! owned by one task; it applies events and returns the [`Changes`] they caused, and hands out
//! immutable [`Snapshot`]s for everyone else to read.
//!
//! The public surface is this facade and [`model`], the objects sources send: what the rest of
//! the crate's public API, `benches/` and `tests/it/` use. Everything else is `pub(crate)`, and
//! `unreachable_pub` flags a `pub` that nothing outside the crate can reach. The core's own
//! tests are unit tests: beside each module, and in `tests/` for the index as a whole.

#![warn(unreachable_pub)]

pub(crate) mod convert;
pub(crate) mod evaluator;
pub(crate) mod index;
pub mod model;
pub(crate) mod names;
pub(crate) mod settings;
pub(crate) mod snapshot;
pub(crate) mod store;
pub(crate) mod trie;

#[cfg(test)]
mod layers;
#[cfg(test)]
pub(crate) mod tests;

pub use index::Index;
pub use model::{Event, Kind, Object, ObjectRef};
pub use names::{
    ADDRESS_TYPE, AUTHORIZATION_TYPE, CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, PerType,
    ResourceType, TypeKind, WORKLOAD_TYPE,
};
pub use settings::Settings;
pub use snapshot::{Changes, NameSet, Resource, ResourceMap, Snapshot, TypeChanges, Version};
