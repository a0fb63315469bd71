//! The end-to-end bed: a whole ambient mesh on one machine, run by the built ambientd, with
//! real ztunnels (in-pod mode) and a real Envoy waypoint, nodes and pods as network
//! namespaces, and this test playing istio-cni's node agent. docs/testing.md has the layout,
//! a picture, and how to read a failure.
//!
//! Needs root, iproute2 and iptables, `AMBIENTD_ZTUNNEL` and Envoy (`.ci/run` provides all).
//! Run one scenario: `cargo test --test e2e -- waypoint`.
//!
//! Scenarios take turns ([`serial`]): each makes its own mesh, and two would only fight over
//! two cores.

mod bed;

mod scenarios;

use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by each scenario for its whole run.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
