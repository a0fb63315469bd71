//! Sources: turn manifests ([`manifests`]) or Kubernetes watches ([`cluster`]) into
//! [`crate::discovery::Event`]s. [`token_review`] asks the API server about tokens for the CA;
//! [`status`] writes the index's status conditions back (leader only).
//!
//! Objects are reduced to the few fields ambientd reads as soon as they are decoded
//! ([`objects`]), with the API server's defaults applied, so both sources feed the index the
//! same thing.

pub mod cluster;
pub mod manifests;
pub mod mesh;
pub mod objects;
pub mod security;
pub mod status;
pub mod token_review;

pub use manifests::{ManifestDir, ManifestError};
