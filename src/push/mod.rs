//! The push edge: the index task that publishes snapshots, and the delta ADS server that
//! follows them for each connected proxy.
//!
//! Protocol decisions (subscriptions, ACK/NACK, what to send) are pure functions in
//! [`subscription`]; [`server`] only moves bytes between them and the stream.

mod connection;
pub mod indexer;
pub mod known;
pub mod listener;
pub mod outbound;
pub mod registry;
pub mod response;
pub mod route;
pub mod server;
pub mod subscription;
pub mod waypoint;

pub use indexer::{Debounce, Snapshots};
pub use registry::Registry;
pub use server::AdsServer;
