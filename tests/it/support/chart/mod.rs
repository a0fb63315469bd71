//! Test support for the Helm chart: render it with the real Helm engine (helm-python-sdk, run
//! through `tools/helm_render.py`), parse every document into its k8s-openapi type, and
//! evaluate the chart's RBAC for an API call as the API server's authorizer would.
//!
//! The engine is the venv python that `.ci/run` installs: `AMBIENTD_HELM_PYTHON`, else
//! `/var/tmp/ambientd-venv/bin/python`. Without it, [`engine`] fails the test under CI (`CI`
//! set) and skips it, loudly, elsewhere.

mod rbac;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use rbac::{ApiCall, rbac_allows};

/// The default venv `.ci/run` creates.
const DEFAULT_PYTHON: &str = "/var/tmp/ambientd-venv/bin/python";

/// The Helm engine: a python that can import `helm_python`.
#[derive(Clone, Debug)]
pub struct Engine {
    python: PathBuf,
}

/// The engine, or `None` (after saying why) when this machine has none and CI is not set.
/// Under CI a missing engine fails the test.
pub fn engine() -> Option<Engine> {
    let python = std::env::var_os("AMBIENTD_HELM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PYTHON));
    let works = Command::new(&python)
        .args(["-c", "import helm_python"])
        .output()
        .map(|o| o.status.success());
    if let Ok(true) = works {
        return Some(Engine { python });
    }
    let why = format!(
        "no Helm engine: {} cannot import helm_python ({works:?}); .ci/run installs it \
         (python3 -m venv /var/tmp/ambientd-venv && /var/tmp/ambientd-venv/bin/pip install \
         helm-python-sdk), or point AMBIENTD_HELM_PYTHON at a python that has it",
        python.display()
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// What one render gave: the documents, typed.
#[derive(Clone, Debug)]
pub struct Rendered {
    pub objects: Vec<Object>,
}

impl Engine {
    /// Lints and renders the chart with `values` (JSON, as a -f file) into `namespace`.
    /// `Err` carries the engine's message.
    pub fn render_text(
        &self,
        values: &Value,
        namespace: &str,
        notes: bool,
    ) -> Result<String, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        let values_file = dir.path().join("values.json");
        std::fs::write(&values_file, values.to_string()).expect("write values");
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut command = Command::new(&self.python);
        command
            .arg(root.join("tools/helm_render.py"))
            .arg(root.join("charts/ambientd"))
            .arg("-f")
            .arg(&values_file)
            .args(["--name", "ambientd", "--namespace", namespace]);
        if notes {
            command.arg("--notes");
        }
        let output = command.output().expect("run tools/helm_render.py");
        if output.status.success() {
            Ok(String::from_utf8(output.stdout).expect("UTF-8 output"))
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// Renders and parses; panics with the engine's message on a lint or render error.
    pub fn render(&self, values: Value, namespace: &str) -> Rendered {
        let text = self
            .render_text(&values, namespace, false)
            .unwrap_or_else(|e| panic!("the chart failed with {values}: {e}"));
        Rendered {
            objects: parse(&text),
        }
    }

    /// NOTES.txt as rendered.
    pub fn notes(&self, values: Value, namespace: &str) -> String {
        self.render_text(&values, namespace, true)
            .unwrap_or_else(|e| panic!("the chart failed with {values}: {e}"))
    }
}

/// One rendered document as its Kubernetes type. An unknown kind fails [`parse`].
#[derive(Clone, Debug)]
pub enum Object {
    Deployment(Box<Deployment>),
    Service(Box<Service>),
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    Role(Role),
    RoleBinding(RoleBinding),
    PodDisruptionBudget(PodDisruptionBudget),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Deployment(_) => "Deployment",
            Object::Service(_) => "Service",
            Object::ServiceAccount(_) => "ServiceAccount",
            Object::ConfigMap(_) => "ConfigMap",
            Object::ClusterRole(_) => "ClusterRole",
            Object::ClusterRoleBinding(_) => "ClusterRoleBinding",
            Object::Role(_) => "Role",
            Object::RoleBinding(_) => "RoleBinding",
            Object::PodDisruptionBudget(_) => "PodDisruptionBudget",
        }
    }
}

/// Parses the rendered YAML stream. Each document must be a known `apiVersion`/`kind`, must
/// deserialise into its k8s-openapi type, and must serialise back to the same JSON, so a
/// misspelt or misplaced field (which serde would silently drop) fails too.
pub fn parse(text: &str) -> Vec<Object> {
    let options = serde_saphyr::options! { strict_booleans: true };
    let documents: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
        .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{text}"));
    documents
        .into_iter()
        .filter(|d| !d.is_null())
        .map(|document| {
            let api_version = document["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let kind = document["kind"].as_str().unwrap_or_default().to_string();
            match (api_version.as_str(), kind.as_str()) {
                ("apps/v1", "Deployment") => Object::Deployment(Box::new(typed(document))),
                ("v1", "Service") => Object::Service(Box::new(typed(document))),
                ("v1", "ServiceAccount") => Object::ServiceAccount(typed(document)),
                ("v1", "ConfigMap") => Object::ConfigMap(typed(document)),
                ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                    Object::ClusterRole(typed(document))
                }
                ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                    Object::ClusterRoleBinding(typed(document))
                }
                ("rbac.authorization.k8s.io/v1", "Role") => Object::Role(typed(document)),
                ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                    Object::RoleBinding(typed(document))
                }
                ("policy/v1", "PodDisruptionBudget") => {
                    Object::PodDisruptionBudget(typed(document))
                }
                other => panic!("the chart rendered an unknown kind {other:?}:\n{document:#}"),
            }
        })
        .collect()
}

fn typed<T: DeserializeOwned + serde::Serialize>(document: Value) -> T {
    let name = format!(
        "{} {}",
        document["kind"],
        document["metadata"]["name"].as_str().unwrap_or("?")
    );
    let object: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|e| panic!("{name} is not a valid {}: {e}", std::any::type_name::<T>()));
    let back = serde_json::to_value(&object).expect("serialise");
    assert_eq!(
        back, document,
        "{name}: fields were lost or changed when read as its Kubernetes type (a typo?)"
    );
    object
}

impl Rendered {
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut kinds: Vec<_> = self.objects.iter().map(Object::kind).collect();
        kinds.sort_unstable();
        kinds
    }

    pub fn deployment(&self) -> &Deployment {
        let mut all = self.objects.iter().filter_map(|o| match o {
            Object::Deployment(d) => Some(d.as_ref()),
            _ => None,
        });
        let one = all.next().expect("a Deployment");
        assert!(all.next().is_none(), "one Deployment");
        one
    }

    pub fn service(&self) -> &Service {
        let mut all = self.objects.iter().filter_map(|o| match o {
            Object::Service(s) => Some(s.as_ref()),
            _ => None,
        });
        let one = all.next().expect("a Service");
        assert!(all.next().is_none(), "one Service");
        one
    }

    pub fn service_account(&self) -> &ServiceAccount {
        let mut all = self.objects.iter().filter_map(|o| match o {
            Object::ServiceAccount(s) => Some(s),
            _ => None,
        });
        let one = all.next().expect("a ServiceAccount");
        assert!(all.next().is_none(), "one ServiceAccount");
        one
    }

    pub fn config_maps(&self) -> Vec<&ConfigMap> {
        self.objects
            .iter()
            .filter_map(|o| match o {
                Object::ConfigMap(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    pub fn pdb(&self) -> Option<&PodDisruptionBudget> {
        self.objects.iter().find_map(|o| match o {
            Object::PodDisruptionBudget(p) => Some(p),
            _ => None,
        })
    }

    /// The ambientd container's args.
    pub fn args(&self) -> Vec<String> {
        let spec = self.deployment().spec.as_ref().expect("spec");
        let pod = spec.template.spec.as_ref().expect("pod spec");
        pod.containers[0].args.clone().unwrap_or_default()
    }

    /// The value of `--flag=value` in the args (the chart always writes the `=` form); every
    /// value when the flag repeats.
    pub fn flag(&self, flag: &str) -> Vec<String> {
        let prefix = format!("{flag}=");
        self.args()
            .iter()
            .filter_map(|a| a.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }
}
