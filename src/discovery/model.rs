//! The reduced input objects the index reads: only the fields a conversion needs.
//!
//! Sources (manifests or Kubernetes watches) reduce every object to these types right away and
//! apply the API server's defaults, so the index never sees an unset `targetPort` or
//! `serviceAccountName`. A full Pod costs tens of kilobytes; a [`Pod`] here costs a few hundred
//! bytes.

pub mod authorization;
pub mod event;
pub mod kinds;
pub mod labels;
pub mod network_gateway;
pub mod peer_authentication;
pub mod pod;
pub mod status;
pub mod uid;
pub mod visibility;
pub mod waypoint;

pub use authorization::AuthorizationPolicy;
pub use event::{Event, Kind, Object, ObjectRef};
pub use kinds::*;
pub use labels::Labels;
pub use peer_authentication::PeerAuthentication;
pub use pod::{ContainerPort, Owner, Pod, PodFields};
