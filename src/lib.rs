//! ambientd: the part of istiod that ztunnel talks to, rebuilt small and fast.
//!
//! Data flow: sources ([`kube`]) turn manifests or Kubernetes watches into typed events; the
//! pure [`discovery`] index turns those into encoded xDS resources and publishes immutable
//! snapshots; [`push`] serves them to ztunnel over delta ADS, and [`waypoint`] builds each
//! waypoint's Envoy config from them; [`debug`] serves readiness.
//! See ARCHITECTURE.md for the picture.
#![forbid(unsafe_code)]

pub mod app;
pub mod ca;
pub mod config;
#[cfg(test)]
mod conformance;
pub mod debug;
pub mod discovery;
pub mod kube;
pub mod metrics;
pub mod pb;
pub mod push;
pub mod waypoint;
