//! The waypoint deployment controller (placeholder: the controller replaces this file).
pub mod render;
pub mod status;
