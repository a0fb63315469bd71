//! The scenarios, one module each.

mod l4;
mod waypoint;
