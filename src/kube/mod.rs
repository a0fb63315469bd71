//! Sources: turn manifests (and, later, Kubernetes watches) into [`crate::discovery::Event`]s.
//!
//! Objects are reduced to the few fields ambientd reads as soon as they are decoded
//! ([`objects`]), with the API server's defaults applied, so both sources feed the index the
//! same thing.

pub mod manifests;
pub mod mesh;
pub mod objects;
pub mod security;

pub use manifests::{ManifestDir, ManifestError};
