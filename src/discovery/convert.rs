//! Conversion: reduced objects in the [`Store`](crate::discovery::store::Store) to the
//! resources ztunnel is sent, one module per kind, policies together, and the status
//! conditions istiod would write. Reads the store; never writes it.

pub mod authorization;
pub mod conditions;
pub mod endpoint_slice;
pub mod membership;
pub mod network_gateway;
pub mod peer_authentication;
pub mod policies;
pub mod service;
pub mod service_entry;
pub mod waypoint;
pub mod workload;
pub mod workload_entry;
