//! Which `targetRef(s)` policies attach to which of a waypoint's chains (istio/istio `pilot/pkg/model/policyattachment.go` and `pilot/pkg/security/`,
//! istiod's `ShouldAttachPolicy` for a waypoint proxy). AuthorizationPolicies and
//! RequestAuthentications attach by the same rules.

use crate::discovery::model::{AuthorizationPolicy, PolicyTargetRef, RequestAuthentication};

/// What a chain serves, for attachment.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target<'a> {
    /// A bound service's chains: its namespace, its name, and whether it is a Kubernetes
    /// Service (else a ServiceEntry).
    Service {
        namespace: &'a str,
        name: &'a str,
        kubernetes: bool,
    },
    /// The direct workload chains: policies on the waypoint as a whole only.
    Waypoint,
}

/// Where a waypoint's policies attach from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attachment<'a> {
    /// The waypoint's namespace and Gateway name.
    pub(crate) namespace: &'a str,
    pub(crate) gateway: &'a str,
    /// The mesh's root namespace (GatewayClass policies live there).
    pub(crate) root_namespace: &'a str,
}

const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";
const ISTIO_NETWORKING_GROUP: &str = "networking.istio.io";
const WAYPOINT_CLASS: &str = "istio-waypoint";

/// A policy that attaches by `targetRef(s)`.
pub(crate) trait Targeting {
    fn namespace(&self) -> &str;
    fn target_refs(&self) -> &[PolicyTargetRef];
}

impl Targeting for AuthorizationPolicy {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn target_refs(&self) -> &[PolicyTargetRef] {
        &self.target_refs
    }
}

impl Targeting for RequestAuthentication {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn target_refs(&self) -> &[PolicyTargetRef] {
        &self.target_refs
    }
}

impl Attachment<'_> {
    /// Whether `policy` applies to a chain serving `target`.
    pub(crate) fn attaches(&self, policy: &impl Targeting, target: Target<'_>) -> bool {
        let policy_namespace = policy.namespace();
        policy.target_refs().iter().any(|t| {
            let same_namespace = t.namespace.is_empty() || t.namespace == policy_namespace;
            match (t.kind.as_str(), t.group.as_str(), target) {
                ("Gateway", GATEWAY_GROUP, _) => {
                    same_namespace && policy_namespace == self.namespace && t.name == self.gateway
                }
                ("GatewayClass", GATEWAY_GROUP, _) => {
                    policy_namespace == self.root_namespace && t.name == WAYPOINT_CLASS
                }
                (
                    "Service",
                    "" | "core",
                    Target::Service {
                        namespace,
                        name,
                        kubernetes: true,
                    },
                ) => same_namespace && policy_namespace == namespace && t.name == name,
                (
                    "ServiceEntry",
                    ISTIO_NETWORKING_GROUP,
                    Target::Service {
                        namespace,
                        name,
                        kubernetes: false,
                    },
                ) => same_namespace && policy_namespace == namespace && t.name == name,
                _ => false,
            }
        })
    }
}
