//! The pure core: reduced objects in, encoded xDS resources out.
//!
//! Nothing here does I/O or knows about tokio, tonic or the Kubernetes client. The [`Index`] is
//! owned by one task; it applies events and returns the [`Changes`] they caused, and hands out
//! immutable [`Snapshot`]s for everyone else to read.

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
pub use names::{ADDRESS_TYPE, AUTHORIZATION_TYPE, TypeKind};
pub use settings::Settings;
pub use snapshot::{Changes, Resource, ResourceMap, Snapshot, TypeChanges};
