//! The integration tests, as one test binary: each module was a test binary of its own
//! (`tests/<name>.rs`), `support` is what they share. One binary links the crate and its
//! dependencies once instead of once per file. Run one module with its path as the filter:
//! `cargo test --test it kube::` (a substring: `xds::` also runs `ca_debug_xds::`).
//!
//! Tests of the pure core (the discovery index, the push layer's subscription logic) are unit
//! tests in the crate: `src/discovery/tests/`, `src/push/subscription/tests.rs`.
//!
//! `tests/idle_memory.rs` stays a binary of its own: its global allocator counts every
//! allocation in the process, so other tests running beside it would count too.

mod support;

mod ca;
mod ca_debug_xds;
mod ca_impersonation;
mod ca_tls;
mod chart;
mod chart_rbac;
mod chart_rbac_calls;
mod debug;
mod debug_browser;
mod failover;
mod ip_allocate;
mod kube;
mod kube_e2e;
mod kube_fake_writes;
mod kube_faults;
mod kube_leader;
mod kube_token_review;
mod kube_writes;
mod listener_security;
mod overload;
mod replicas;
mod route_status;
mod shutdown;
mod status_app;
mod status_writer;
mod waypoint;
mod waypoint_controller;
mod waypoint_destination_rule;
mod waypoint_harness;
mod waypoint_jwt;
mod waypoint_routes;
mod waypoint_virtual_service;
mod waypoint_xds;
mod xds;
mod xds_flow;
mod xds_scope;
