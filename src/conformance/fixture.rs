//! The conformance fixture (`tests/fixtures/conformance.yaml`) as typed cases. The file's header
//! documents the format; unknown keys are rejected here so that a format change cannot be silently
//! ignored.

use std::collections::BTreeMap;

use crate::discovery::Settings;
use serde::Deserialize;
use serde_json::Value;

/// The fixture text, compiled in: the tests read no file at run time.
pub(super) const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/conformance.yaml"
));

/// ambientd's own cases in the same format (`tests/fixtures/derived.yaml`): behaviour the
/// public fixture has no case for, with expectations read from istiod's code and Istio's
/// documentation (each case's `derived_from`).
pub(super) const DERIVED: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/derived.yaml"
));

/// The label on the system namespace that names the local network.
const NETWORK_LABEL: &str = "topology.istio.io/network";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Case {
    pub(super) name: String,
    pub(super) source: String,
    #[serde(default)]
    pub(super) derived: bool,
    #[serde(default)]
    pub(super) derived_from: Option<String>,
    #[serde(default)]
    pub(super) note: Option<String>,
    #[serde(default)]
    pub(super) settings: CaseSettings,
    #[serde(default)]
    pub(super) input: Vec<Value>,
    #[serde(default)]
    pub(super) steps: Vec<Step>,
    #[serde(default)]
    pub(super) expect: Option<Expect>,
}

/// `settings`: only the keys that differ from the header's defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CaseSettings {
    pub(super) cluster_id: Option<String>,
    pub(super) trust_domain: Option<String>,
    pub(super) root_namespace: Option<String>,
    pub(super) system_namespace: Option<String>,
    pub(super) domain_suffix: Option<String>,
    /// Informational: istiod reads it from the system namespace's network label (in `input`).
    pub(super) network: Option<String>,
    pub(super) revision: Option<String>,
    pub(super) mesh_config: Option<BTreeMap<String, Value>>,
    pub(super) features: Option<BTreeMap<String, Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Step {
    pub(super) desc: String,
    #[serde(default)]
    pub(super) apply: Vec<Value>,
    #[serde(default)]
    pub(super) delete: Vec<DeleteRef>,
    #[serde(default)]
    pub(super) expect: Option<Expect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteRef {
    pub(super) kind: String,
    #[serde(default)]
    pub(super) namespace: String,
    pub(super) name: String,
}

/// `expect` (of the initial state or of one step). Maps are keyed as the header says.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Expect {
    /// Workload uid -> fields.
    #[serde(default)]
    pub(super) workloads: BTreeMap<String, Value>,
    /// `ns/hostname` -> fields.
    #[serde(default)]
    pub(super) services: BTreeMap<String, Value>,
    /// `ns/name` -> fields.
    #[serde(default)]
    pub(super) authorizations: BTreeMap<String, Value>,
    #[serde(default)]
    pub(super) absent: Vec<String>,
    #[serde(default)]
    pub(super) lookups: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub(super) lookup_workloads: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub(super) all_names: Option<Vec<String>>,
    /// `ns/name` -> conditions ambientd computes for an AuthorizationPolicy (`ZtunnelAccepted`).
    #[serde(default)]
    pub(super) policy_status: BTreeMap<String, Value>,
    /// `ns/name` -> conditions for a Service, ServiceEntry or WorkloadEntry
    /// (`istio.io/WaypointBound`).
    #[serde(default)]
    pub(super) service_status: BTreeMap<String, Value>,
}

impl Expect {
    /// How many individual expectations this holds (for the fixture sanity check).
    pub(super) fn len(&self) -> usize {
        self.workloads.len()
            + self.services.len()
            + self.authorizations.len()
            + self.absent.len()
            + self.lookups.len()
            + self.lookup_workloads.len()
            + usize::from(self.all_names.is_some())
            + self.policy_status.len()
            + self.service_status.len()
    }
}

/// Parses the whole fixture: ONE YAML document that is a list of cases.
pub(super) fn load() -> Result<Vec<Case>, String> {
    load_text(FIXTURE)
}

/// Parses a fixture text in the same format.
pub(super) fn load_text(text: &str) -> Result<Vec<Case>, String> {
    let mut documents = crate::kube::objects::parse_yaml(text)?;
    if documents.len() != 1 {
        return Err(format!(
            "expected one YAML document, found {}",
            documents.len()
        ));
    }
    let Value::Array(items) = documents.remove(0) else {
        return Err("the fixture document is not a list of cases".into());
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let name = item
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("<unnamed>")
                .to_string();
            serde_json::from_value::<Case>(item).map_err(|e| format!("case #{i} ({name}): {e}"))
        })
        .collect()
}

/// The index settings for a case, and notes on how they were chosen.
///
/// Defaults are the header's. `domain_suffix` becomes `Settings::domain`; `system_namespace`
/// (whose `topology.istio.io/network` label names the local network) and `root_namespace`
/// (mesh-wide policies) map one to one; `mesh_config` may set `serviceEntryVisibility`, and
/// `features` `PILOT_AUTO_ALLOW_WAYPOINT_POLICY` (`--auto-allow-waypoint-policy`) and
/// `AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY` (`--dry-run-authorization-policy`),
/// `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`, `PILOT_ENABLE_SERVICEENTRY_SELECT_PODS` and
/// `PILOT_ENABLE_IP_AUTOALLOCATE` (`--ip-autoallocate`). `revision`
/// is istiod's (empty by default: every object is taken, as with an unset `REVISION`). Other
/// mesh config fields and other features have no ambientd equivalent here: a case setting them
/// cannot run.
pub(super) fn settings(case: &Case) -> Result<(Settings, Vec<String>), String> {
    let s = &case.settings;
    let notes = Vec::new();
    let mesh = match &s.mesh_config {
        Some(m) if !m.is_empty() => Some(mesh_settings(m)?),
        _ => None,
    };
    let (mut auto_allow_waypoint_policy, mut dry_run_authorization) = (false, false);
    let (mut k8s_select_workload_entries, mut service_entry_select_pods) = (true, true);
    let mut ip_autoallocate = true;
    for (flag, value) in s.features.iter().flatten() {
        let on = match value {
            Value::Bool(b) => *b,
            Value::String(text) => text
                .parse::<bool>()
                .map_err(|_| format!("settings.features.{flag}: {text:?} is not true or false"))?,
            other => {
                return Err(format!(
                    "settings.features.{flag}: {other} is not a boolean"
                ));
            }
        };
        match flag.as_str() {
            "PILOT_AUTO_ALLOW_WAYPOINT_POLICY" => auto_allow_waypoint_policy = on,
            "AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY" => dry_run_authorization = on,
            "PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES" => k8s_select_workload_entries = on,
            "PILOT_ENABLE_SERVICEENTRY_SELECT_PODS" => service_entry_select_pods = on,
            "PILOT_ENABLE_IP_AUTOALLOCATE" => ip_autoallocate = on,
            other => return Err(format!("settings.features.{other} is not supported")),
        }
    }
    let system = s.system_namespace.clone().unwrap_or("istio-system".into());
    // `network` is informational; it must agree with the label the index will read.
    let network = s.network.clone().unwrap_or_default();
    let label = network_label(&case.input, &system);
    if label.unwrap_or_default() != network {
        return Err(format!(
            "fixture inconsistency: settings.network {network:?} but the input's {system:?} \
             Namespace has network label {label:?}"
        ));
    }
    // Over the defaults, so that a field `Settings` gains later keeps its default here (and
    // this keeps compiling): the update is needless only until then.
    #[allow(clippy::needless_update)]
    let settings = Settings {
        cluster_id: s.cluster_id.clone().unwrap_or("Kubernetes".into()),
        trust_domain: s.trust_domain.clone().unwrap_or("cluster.local".into()),
        domain: s.domain_suffix.clone().unwrap_or("cluster.local".into()),
        system_namespace: system,
        root_namespace: s.root_namespace.clone().unwrap_or("istio-system".into()),
        revision: s.revision.clone().unwrap_or_default(),
        service_entry_visibility: mesh
            .and_then(|m| m.service_entry_visibility)
            .map(std::sync::Arc::new),
        auto_allow_waypoint_policy,
        dry_run_authorization,
        k8s_select_workload_entries,
        service_entry_select_pods,
        ip_autoallocate,
        ..Settings::default()
    };
    Ok((settings, notes))
}

/// A case's `mesh_config`, read as ambientd reads `--mesh-config`. Only the fields that shape
/// the index here may be set: `serviceEntryVisibility` (`rootNamespace` and `trustDomain` are
/// the case's own settings).
fn mesh_settings(
    mesh: &BTreeMap<String, Value>,
) -> Result<crate::kube::cluster::MeshSettings, String> {
    if let Some(other) = mesh.keys().find(|k| *k != "serviceEntryVisibility") {
        return Err(format!("settings.mesh_config.{other} is not supported"));
    }
    let text = serde_json::to_string(mesh).map_err(|e| e.to_string())?;
    crate::kube::cluster::MeshSettings::parse(&text)
        .map_err(|e| format!("settings.mesh_config: {e}"))
}

/// The network label of Namespace `namespace` in the initial input, if it has one.
fn network_label<'a>(input: &'a [Value], namespace: &str) -> Option<&'a str> {
    input
        .iter()
        .filter(|o| o.get("kind").and_then(Value::as_str) == Some("Namespace"))
        .filter(|o| o.pointer("/metadata/name").and_then(Value::as_str) == Some(namespace))
        .find_map(|o| o.pointer("/metadata/labels")?.get(NETWORK_LABEL)?.as_str())
}
