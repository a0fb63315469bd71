//! A `security.istio.io` AuthorizationPolicy, reduced: every field of the Istio API that the
//! L4 conversion reads, mirrored one to one (a `from[i].source` is a [`Source`], a
//! `to[i].operation` an [`Operation`], a `when[i]` a [`Condition`]). Conversion is
//! `convert::authorization`.

use crate::discovery::model::labels::Labels;

/// The label that pins a config object to one istiod revision.
pub(crate) const REVISION_LABEL: &str = "istio.io/rev";
/// The annotation that marks a policy as dry-run (`strconv.ParseBool` semantics).
pub(crate) const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// A `security.istio.io` AuthorizationPolicy, reduced to what the ztunnel conversion reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthorizationPolicy {
    pub name: String,
    pub namespace: String,
    /// `metadata.generation` (0 when unset): the `observedGeneration` of its status condition.
    pub generation: i64,
    /// The `istio.io/rev` label, if any; the index ignores policies of another revision.
    pub revision: Option<String>,
    /// Annotation `istio.io/dry-run` parses as true.
    pub dry_run: bool,
    /// `spec.selector.matchLabels`: `None` when there is no `selector` field at all, `Some`
    /// (possibly empty) when there is one. The difference decides the scope.
    pub selector: Option<Labels>,
    /// `spec.targetRef` or a non-empty `spec.targetRefs`: a waypoint policy, never sent to ztunnel.
    pub has_target_refs: bool,
    /// The targets themselves (istiod's `GetTargetRefs`: `targetRef` when set, else
    /// `targetRefs`), for the policy's `WaypointAccepted` condition.
    pub target_refs: Vec<PolicyTargetRef>,
    pub action: PolicyAction,
    pub rules: Vec<PolicyRule>,
    /// `metadata.creationTimestamp` as written (RFC 3339).
    pub creation: Option<String>,
}

/// One `PolicyTargetReference`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyTargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    /// Empty: the policy's namespace.
    pub namespace: String,
}

/// `spec.action`. Anything that is not one of the four Istio actions is kept verbatim so the
/// status can name it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PolicyAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
    Unknown(String),
}

impl PolicyAction {
    /// The action as Istio spells it (`ALLOW`, ...), or the unknown text as written.
    pub(crate) fn as_str(&self) -> &str {
        match self {
            PolicyAction::Allow => "ALLOW",
            PolicyAction::Deny => "DENY",
            PolicyAction::Audit => "AUDIT",
            PolicyAction::Custom => "CUSTOM",
            PolicyAction::Unknown(text) => text,
        }
    }
}

/// One `spec.rules[i]`: every non-empty part must match (from, to, and each condition).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRule {
    /// `from[*].source`; a missing `source` is an empty [`Source`].
    pub from: Vec<Source>,
    /// `to[*].operation`; a missing `operation` is an empty [`Operation`].
    pub to: Vec<Operation>,
    pub when: Vec<Condition>,
}

/// `rules[i].from[j].source`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Source {
    pub principals: Vec<String>,
    pub not_principals: Vec<String>,
    /// L7 (JWT) attribute.
    pub request_principals: Vec<String>,
    /// L7 (JWT) attribute.
    pub not_request_principals: Vec<String>,
    pub namespaces: Vec<String>,
    pub not_namespaces: Vec<String>,
    /// `ns/sa`, or a bare `sa` in the policy's namespace.
    pub service_accounts: Vec<String>,
    pub not_service_accounts: Vec<String>,
    pub ip_blocks: Vec<String>,
    pub not_ip_blocks: Vec<String>,
    /// L7 attribute (the original client IP, from X-Forwarded-For).
    pub remote_ip_blocks: Vec<String>,
    /// L7 attribute.
    pub not_remote_ip_blocks: Vec<String>,
    /// Newer Istio API field. A Match has no trust-domain field, so istiod reports it as
    /// unsupported; kept here so that it is never silently ignored (which would loosen an ALLOW).
    pub trust_domains: Vec<String>,
    pub not_trust_domains: Vec<String>,
}

/// `rules[i].to[j].operation`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Operation {
    /// L7 attribute.
    pub hosts: Vec<String>,
    /// L7 attribute.
    pub not_hosts: Vec<String>,
    /// Destination ports as decimal strings.
    pub ports: Vec<String>,
    pub not_ports: Vec<String>,
    /// L7 attribute.
    pub methods: Vec<String>,
    /// L7 attribute.
    pub not_methods: Vec<String>,
    /// L7 attribute.
    pub paths: Vec<String>,
    /// L7 attribute.
    pub not_paths: Vec<String>,
}

/// `rules[i].when[j]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Condition {
    pub key: String,
    pub values: Vec<String>,
    pub not_values: Vec<String>,
}

/// The xDS resource name of a policy: `<namespace>/<name>`, as istiod and ztunnel key it.
pub(crate) fn xds_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

impl AuthorizationPolicy {
    /// This policy's xDS resource name, `<namespace>/<name>`.
    pub(crate) fn xds_name(&self) -> String {
        xds_name(&self.namespace, &self.name)
    }
}
