//! The scenarios, one module each.

mod figures;
mod kube;
mod l4;
mod lifecycle;
mod restart;
mod waypoint;
