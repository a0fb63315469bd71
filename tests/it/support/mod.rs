//! What the test modules share. Each file or folder here was one support module of the
//! separate test binaries; a test module imports the ones it uses under their former names
//! (`use crate::support::kube as kube_support;`).

pub mod ca;
pub mod ca_cluster;
pub mod chart;
pub mod common;
pub mod kube;
pub mod xds;
