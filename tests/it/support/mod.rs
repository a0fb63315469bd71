//! What the test modules share. Each file or folder here was one support module of the
//! separate test binaries; a test module imports the ones it uses under their former names
//! (`use crate::support::kube as kube_support;`).

#[allow(dead_code)] // The waypoint harness: waypoint_harness.rs proves it, not all of it.
pub mod apps;
pub mod ca;
pub mod ca_cluster;
pub mod chart;
pub mod common;
#[allow(dead_code)] // The waypoint harness: waypoint_harness.rs proves it, not all of it.
pub mod envoy;
#[allow(dead_code)] // The waypoint harness: waypoint_harness.rs proves it, not all of it.
pub mod hbone;
pub mod https;
pub mod identity;
pub mod kube;
pub mod process;
#[allow(dead_code)] // The waypoint harness: waypoint_harness.rs proves it, not all of it.
pub mod sds;
pub mod xds;
