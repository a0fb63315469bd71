//! Conversion: reduced objects in the [`Store`](crate::discovery::store::Store) to the
//! resources ztunnel is sent, one module per kind, policies together, and the status
//! conditions istiod would write. Reads the store; never writes it.

pub(crate) mod authorization;
pub(crate) mod conditions;
pub(crate) mod endpoint_slice;
pub(crate) mod membership;
pub(crate) mod network_gateway;
pub(crate) mod peer_authentication;
pub(crate) mod policies;
pub(crate) mod service;
pub(crate) mod service_entry;
pub(crate) mod waypoint;
pub(crate) mod waypoint_authorization;
pub(crate) mod workload;
pub(crate) mod workload_entry;
