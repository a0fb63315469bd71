//! Sources: turn manifests ([`manifests`]) or Kubernetes watches ([`cluster`]) into
//! [`crate::discovery::Event`]s. [`token_review`] asks the API server about tokens for the CA;
//! [`status_writer`] writes the index's status conditions back (leader only); [`jwks`] fetches
//! RequestAuthentications' key sets for waypoints, as one more source of events.
//!
//! Writes (cluster mode, see [`writes`]): [`leader`] elects the one replica that writes,
//! [`ca_secret`] keeps the CA in Secrets, [`root_configmap`] distributes the root bundle.
//!
//! Objects are reduced to the few fields ambientd reads as soon as they are decoded
//! ([`objects`]), with the API server's defaults applied, so both sources feed the index the
//! same thing.

pub mod ca_secret;
pub mod cluster;
mod destination_rule;
pub mod ip_allocate;
pub mod jwks;
pub mod leader;
mod listed;
pub mod manifests;
pub mod mesh;
pub mod mesh_config;
pub mod objects;
pub mod root_configmap;
pub mod routes;
pub mod security;
pub mod status_writer;
pub mod token_review;
pub mod virtual_services;
pub mod waypoints;
pub mod writes;

pub use manifests::{ManifestDir, ManifestError};

use kube::runtime::watcher;

/// A 404 from a list or watch: the API server does not serve the resource (its CRD, or its
/// whole API group, is not installed).
///
/// The code is what counts, not the reason. A real kube-apiserver answers a path it does not
/// serve with a plain-text `404 page not found`, not a JSON `Status`; kube-rs then makes a
/// `Status` whose reason is "Failed to parse error data", for which `Status::is_not_found()`
/// (it trusts a known reason before the code) is false. A list in a namespace that does not
/// exist is an empty 200, so a 404 on a collection never means "no such object".
pub(crate) fn not_served(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 404,
        watcher::Error::WatchError(status) => status.code == 404,
        _ => false,
    }
}
