//! The scenarios, one module each.

mod l4;
mod lifecycle;
mod restart;
mod waypoint;
