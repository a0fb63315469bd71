//! [`Settings`]: the mesh-wide settings the conversion reads (istiod's flags and meshConfig
//! fields that change what ztunnel is sent).

use std::sync::Arc;

use crate::discovery::model::visibility::ServiceEntryVisibility;

/// Mesh-wide settings the conversion reads.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `Workload.cluster_id` and the prefix of workload uids (istiod's `CLUSTER_ID`).
    pub cluster_id: String,
    pub trust_domain: String,
    /// The cluster domain suffix of Service hostnames.
    pub domain: String,
    /// ambientd's (istiod's) namespace: its `topology.istio.io/network` label names the local
    /// network.
    pub system_namespace: String,
    /// meshConfig.rootNamespace: policies here apply mesh-wide. istiod's default is its own
    /// namespace.
    pub root_namespace: String,
    /// istiod's revision: Istio config objects labelled `istio.io/rev` with another value are
    /// ignored; unlabelled ones are always taken (empty: every object is taken).
    pub revision: String,
    /// meshConfig.serviceEntryVisibility; `None` when not configured (every ServiceEntry is
    /// public and no `istio.io/VisibilityApplied` condition is written).
    pub service_entry_visibility: Option<Arc<ServiceEntryVisibility>>,
    /// istiod's `PILOT_AUTO_ALLOW_WAYPOINT_POLICY` (default off): each waypoint with instances
    /// gets an ALLOW policy for its identities, listed by the workloads behind it.
    pub auto_allow_waypoint_policy: bool,
    /// istiod's `AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY` (default off): policies annotated
    /// `istio.io/dry-run` are sent with `dry_run` (ztunnel only logs them) instead of not at all.
    pub dry_run_authorization: bool,
    /// istiod's `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES` (default on): Kubernetes Services
    /// select WorkloadEntries by their labels.
    pub k8s_select_workload_entries: bool,
    /// istiod's `PILOT_ENABLE_SERVICEENTRY_SELECT_PODS` (default on): ServiceEntries with a
    /// `workloadSelector` select pods.
    pub service_entry_select_pods: bool,
    /// istiod's `PILOT_ENABLE_IP_AUTOALLOCATE` (default on): an addressless ServiceEntry's
    /// Services carry the addresses allocated in its `status.addresses`.
    pub ip_autoallocate: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_id: "Kubernetes".into(),
            trust_domain: "cluster.local".into(),
            domain: "cluster.local".into(),
            system_namespace: "istio-system".into(),
            root_namespace: "istio-system".into(),
            revision: "default".into(),
            service_entry_visibility: None,
            auto_allow_waypoint_policy: false,
            dry_run_authorization: false,
            k8s_select_workload_entries: true,
            service_entry_select_pods: true,
            ip_autoallocate: true,
        }
    }
}

impl Settings {
    /// The trust domain as sent: `cluster.local` goes out empty (ztunnel's default).
    pub(crate) fn wire_trust_domain(&self) -> &str {
        if self.trust_domain == "cluster.local" {
            ""
        } else {
            &self.trust_domain
        }
    }
}
