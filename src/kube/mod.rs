//! Sources: turn manifests ([`manifests`]) or Kubernetes watches ([`cluster`]) into
//! [`crate::discovery::Event`]s. [`token_review`] asks the API server about tokens for the CA;
//! [`status`] writes the index's status conditions back (leader only).
//!
//! Writes (cluster mode, see [`writes`]): [`leader`] elects the one replica that writes,
//! [`ca_secret`] keeps the CA in Secrets, [`root_configmap`] distributes the root bundle.
//!
//! Objects are reduced to the few fields ambientd reads as soon as they are decoded
//! ([`objects`]), with the API server's defaults applied, so both sources feed the index the
//! same thing.

pub mod ca_secret;
pub mod cluster;
pub mod ip_allocate;
pub mod leader;
mod listed;
pub mod manifests;
pub mod mesh;
pub mod mesh_config;
pub mod objects;
pub mod root_configmap;
pub mod security;
pub mod status;
pub mod token_review;
pub mod writes;

pub use manifests::{ManifestDir, ManifestError};
