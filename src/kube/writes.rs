//! What ambientd writes to the cluster, and who writes it: the settings that `app` wires into
//! [`leader`](crate::kube::leader), [`ca_secret`](crate::kube::ca_secret),
//! [`root_configmap`](crate::kube::root_configmap), [`status`](crate::kube::status_writer),
//! [`ip_allocate`](crate::kube::ip_allocate) and [`waypoints`](crate::kube::waypoints).

use std::time::Duration;

use crate::kube::leader::LeaderConfig;

/// Cluster writes (cluster mode only). `None` in [`crate::config::Config`] writes nothing and
/// keeps the CA in `--ca-dir`, as manifests mode does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterWrites {
    /// Leader election; `None`: this replica always leads (a single replica).
    pub leader: Option<LeaderConfig>,
    /// The CA comes from the `cacerts` / `istio-ca-secret` Secrets (unless `--cacerts` names a
    /// directory), creating `istio-ca-secret` when neither exists.
    pub ca_secrets: bool,
    /// The leader distributes the root bundle as ConfigMap `istio-ca-root-cert`.
    pub root_configmaps: bool,
    /// The leader writes status conditions (`ZtunnelAccepted`, `istio.io/WaypointBound`).
    pub status: bool,
    /// The leader allocates addresses to addressless ServiceEntries from these ranges
    /// ([`ip_allocate`](crate::kube::ip_allocate)); `None`: it does not.
    pub ip_autoallocate: Option<crate::kube::ip_allocate::Prefixes>,
    /// The leader deploys waypoints (ServiceAccount, Deployment, Service per waypoint Gateway)
    /// with this proxy and writes their Gateways' status
    /// ([`waypoints`](crate::kube::waypoints)); `None`: it does not (istiod does).
    pub waypoints: Option<crate::kube::waypoints::render::ProxySettings>,
    /// Status API calls per second (reads and patches), the leader's budget for a mass change.
    pub status_qps: u32,
    /// First retry delay after a failed write, doubling up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl ClusterWrites {
    /// Everything on, electing in `namespace` with the default Lease.
    pub fn new(namespace: &str) -> Self {
        ClusterWrites {
            leader: Some(LeaderConfig::new(namespace)),
            ca_secrets: true,
            root_configmaps: true,
            status: true,
            ip_autoallocate: Some(crate::kube::ip_allocate::Prefixes::default()),
            waypoints: Some(crate::kube::waypoints::default_proxy(namespace)),
            status_qps: 20,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(60),
        }
    }
}
