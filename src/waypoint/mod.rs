//! Waypoints: the Envoy config ambientd serves a waypoint proxy (docs/waypoint.md, single
//! network), as istiod builds it, from the same snapshot ztunnel's resources come from.
//!
//! Pure code: a [`WaypointProxy`] (from its node) and a snapshot give a [`ConfigId`] (its
//! [`WaypointKey`] and what its Envoy supports); a [`WaypointConfig`] is that id's listeners,
//! clusters and endpoints, encoded once with content-hash versions, and brought to the next
//! snapshot doing only what its changes need (an endpoint change rebuilds that cluster's
//! assignment alone). `push::waypoint` shares one config between a waypoint's replicas and
//! serves it over delta ADS. The index never knows about Envoy.
//!
//! | module | builds |
//! |---|---|
//! | `proxy` | who the proxy is, from its node id, metadata and announced extensions |
//! | `bound` | its key, and the services and workloads bound to it |
//! | `listeners` | `connect_terminate`, `main_internal` (the matcher from VIP to port to chain), `connect_originate` |
//! | `chains` | `main_internal`'s chains: per service port HTTP (HCM, auth, routes) and TCP, and the direct ones |
//! | `clusters` | `main_internal`, `encap`, `connect_originate`, `inbound-vip\|…` |
//! | `destination_rule` | which DestinationRule applies to a bound service, and a port's policy |
//! | `traffic_policy` | that policy on an `inbound-vip` cluster (LB, limits, outlier, TLS) |
//! | `endpoints` | each `inbound-vip` cluster's ClusterLoadAssignment |
//! | `attach` | which `targetRefs` policies attach to which chain |
//! | `rbac` | AuthorizationPolicies with `targetRefs` as Envoy RBAC |
//! | `jwt` | RequestAuthentications with `targetRefs` as `jwt_authn`, and RBAC's JWT principals |
//! | `key_set` | whether Envoy accepts a key set inline |
//! | `routes` | HTTPRoutes, GRPCRoutes and VirtualServices as the HTTP chains' routes, and the `outbound` clusters they need |
//! | `config` | the whole config, and its incremental update |

mod attach;
mod bound;
mod chains;
mod clusters;
mod config;
mod destination_rule;
mod endpoints;
mod envoy;
mod jwt;
mod key_set;
mod listeners;
mod proxy;
mod rbac;
mod routes;
mod traffic_policy;

#[cfg(test)]
mod tests;

pub use bound::{Bound, WaypointKey};
pub use config::{ConfigId, Rebuild, WaypointConfig};
pub use key_set::check_key_set;
pub use proxy::{Extensions, GATEWAY_NAME_LABEL, WaypointProxy};

/// The mesh settings a waypoint's config depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaypointSettings {
    pub trust_domain: String,
    /// The cluster's DNS domain (`cluster.local`).
    pub domain: String,
    /// Where GatewayClass-wide policies live (`istio-system`).
    pub root_namespace: String,
}

impl WaypointSettings {
    pub fn of(settings: &crate::discovery::Settings) -> Self {
        WaypointSettings {
            trust_domain: settings.trust_domain.clone(),
            domain: settings.domain.clone(),
            root_namespace: settings.root_namespace.clone(),
        }
    }
}

impl Default for WaypointSettings {
    fn default() -> Self {
        WaypointSettings::of(&crate::discovery::Settings::default())
    }
}
