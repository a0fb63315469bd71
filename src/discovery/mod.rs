//! The pure core: reduced objects in, encoded xDS resources out.
//!
//! Nothing here does I/O or knows about tokio, tonic or the Kubernetes client. The [`Index`] is
//! owned by one task; it applies events and returns the [`Changes`] they caused, and hands out
//! immutable [`Snapshot`]s for everyone else to read.

pub mod convert;
pub mod evaluator;
pub mod index;
pub mod model;
pub mod names;
pub mod settings;
pub mod snapshot;
pub mod store;
pub mod trie;

#[cfg(test)]
mod layers;
#[cfg(test)]
pub(crate) mod tests;

pub use index::Index;
pub use model::{Event, Kind, Object, ObjectRef};
pub use names::TypeKind;
pub use settings::Settings;
pub use snapshot::{Changes, Resource, Snapshot, TypeChanges};
