//! Tests of the pure core as a whole: objects in through an [`Index`](super::Index), resources,
//! changes and status conditions out. No I/O, no runtime. Tests of one module sit beside it;
//! `support` is shared with the push layer's subscription tests. Run one file with its module
//! path as the filter: `cargo test --lib discovery::tests::index::`.

pub(crate) mod support;

mod dependencies;
mod destination_rules;
mod index;
mod index_changes;
mod index_services;
mod reset_property;
mod routes;
mod service_entry_visibility;
mod status_conditions;
mod waypoint_inputs;
mod waypoint_policy;
