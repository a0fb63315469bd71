//! Support for `tests/it/conformance.rs`: the fixture model, the runner, rendering of decoded
//! protos in the fixture's encodings, the matching rules, and the API-server defaults
//! normalisation.

pub mod compare;
pub mod defaults;
pub mod fixture;
pub mod render;
pub mod runner;
