//! A real Kubernetes API server for the bed: etcd and kube-apiserver (`AMBIENTD_ETCD`,
//! `AMBIENTD_KUBE_APISERVER`, with the upstream Istio and Gateway API CRDs from
//! `AMBIENTD_CRDS`) on ctl's loopback, where ambientd watches them. There is no
//! controller-manager, scheduler or kubelet: the bed plays them, creating each pod bound to
//! its node and then reporting it Running with its IP through the `status` subresource, and
//! creating the pod of each waypoint Deployment that ambientd's controller writes.
//!
//! The test's own client is kube-rs on a thread inside ctl (the API server listens on ctl's
//! loopback), fed closures over a channel.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine as _;
use futures::future::BoxFuture;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use rcgen::{CertificateParams, DnType, Issuer, KeyPair, SanType};
use serde_json::{Value, json};

use super::netns::Netns;
use super::process::{Process, wait_for};

/// The API server's port on ctl's loopback.
const PORT: u16 = 16443;

/// Where the kube tools are.
#[derive(Clone, Debug)]
pub struct KubeTools {
    pub etcd: PathBuf,
    pub apiserver: PathBuf,
    pub crds: PathBuf,
}

impl KubeTools {
    /// The tools, or `None` after saying which is missing (a panic under CI).
    pub fn find() -> Option<KubeTools> {
        let get = |var: &str| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .filter(|p| p.exists())
        };
        match (
            get("AMBIENTD_ETCD"),
            get("AMBIENTD_KUBE_APISERVER"),
            get("AMBIENTD_CRDS"),
        ) {
            (Some(etcd), Some(apiserver), Some(crds)) => Some(KubeTools {
                etcd,
                apiserver,
                crds,
            }),
            _ => {
                let why = "no Kubernetes API server: set AMBIENTD_ETCD, AMBIENTD_KUBE_APISERVER \
                           and AMBIENTD_CRDS (a directory of CRD YAML); .ci/run unpacks them";
                if std::env::var_os("CI").is_some() {
                    panic!("{why}");
                }
                eprintln!("SKIPPED: {why}");
                None
            }
        }
    }
}

type Job = Box<dyn FnOnce(&tokio::runtime::Runtime, &kube::Client) + Send>;

/// An object as the API server names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            name: name.into(),
        }
    }

    /// The reference of a whole object.
    pub fn of(object: &Value) -> Self {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        ObjectRef {
            api_version: text(&object["apiVersion"]),
            kind: text(&object["kind"]),
            namespace: object["metadata"]["namespace"].as_str().map(str::to_string),
            name: text(&object["metadata"]["name"]),
        }
    }

    /// The `Api` for its kind and namespace, by discovery.
    async fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", &self.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &self.kind);
        let (resource, _): (ApiResource, _) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("discover {} {}: {e}", self.api_version, self.kind));
        match &self.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        }
    }
}

/// The running API server, its admin kubeconfig, and a client.
pub struct ApiServer {
    pub kubeconfig: PathBuf,
    jobs: mpsc::Sender<Job>,
    /// Dropped last: the client thread goes when `jobs` closes.
    _processes: Vec<Process>,
}

impl ApiServer {
    /// Starts etcd and the API server in `ctl`, waits for `/readyz`, and installs the CRDs.
    pub fn start(tools: &KubeTools, ctl: &Netns, dir: &Path) -> ApiServer {
        let dir = dir.join("kube");
        std::fs::create_dir_all(&dir).expect("kube dir");
        let pki = Pki::write(&dir);
        let mut etcd = ctl.command(&tools.etcd);
        etcd.args(["--name", "e2e", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--client-url", "http://127.0.0.1:12379"])
            .args(["--peer-url", "http://127.0.0.1:12380"])
            .args(["--unsafe-no-fsync", "--log-level", "warn"]);
        let etcd = Process::start("etcd", etcd, dir.parent().expect("bed dir"));
        let mut apiserver = ctl.command(&tools.apiserver);
        let file = |name: &str| dir.join(name).display().to_string();
        apiserver
            .arg("--etcd-servers=http://127.0.0.1:12379")
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={PORT}"))
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--tls-cert-file={}", file("serving.pem")))
            .arg(format!(
                "--tls-private-key-file={}",
                file("serving-key.pem")
            ))
            .arg(format!("--client-ca-file={}", file("ca.pem")))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", file("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                file("sa.key")
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg("--authorization-mode=RBAC")
            .arg("--endpoint-reconciler-type=none")
            .arg(format!("--cert-dir={}", file("certs")));
        let apiserver = Process::start("kube-apiserver", apiserver, dir.parent().expect("dir"));
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, pki.kubeconfig()).expect("kubeconfig");
        let jobs = client_thread(ctl, &kubeconfig);
        let mut server = ApiServer {
            kubeconfig,
            jobs,
            _processes: vec![etcd, apiserver],
        };
        wait_for(
            "the API server's /readyz",
            Duration::from_secs(60),
            || {
                for process in &mut server._processes {
                    process.assert_running();
                }
                server
                    .call(|client| {
                        Box::pin(async move {
                            let request = http::Request::get("/readyz").body(Vec::new()).ok()?;
                            client.request_text(request).await.ok()
                        })
                    })
                    .filter(|text| text.trim() == "ok")
            },
            String::new,
        );
        server.install_crds(&tools.crds);
        server
    }

    /// Runs `f` with the client on its thread and returns what it returns.
    pub fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(kube::Client) -> BoxFuture<'static, T> + Send + 'static,
    ) -> T {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |runtime, client| {
                let _ = tx.send(runtime.block_on(f(client.clone())));
            }))
            .expect("the kube client thread");
        rx.recv().expect("the kube client thread answered")
    }

    fn install_crds(&self, dir: &Path) {
        let mut crds = Vec::new();
        for entry in std::fs::read_dir(dir).expect("AMBIENTD_CRDS") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read CRDs");
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("CRD YAML {}: {e}", path.display()));
            crds.extend(
                docs.into_iter()
                    .filter(|d| d["kind"] == "CustomResourceDefinition"),
            );
        }
        for crd in &crds {
            self.apply(crd);
        }
        let names: Vec<String> = crds
            .iter()
            .map(|c| {
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        wait_for(
            "every CRD Established",
            Duration::from_secs(60),
            || {
                names
                    .iter()
                    .all(|name| {
                        self.get(&ObjectRef::new(
                            "apiextensions.k8s.io/v1",
                            "CustomResourceDefinition",
                            None,
                            name,
                        ))
                        .is_some_and(|crd| {
                            crd["status"]["conditions"].as_array().is_some_and(|c| {
                                c.iter()
                                    .any(|c| c["type"] == "Established" && c["status"] == "True")
                            })
                        })
                    })
                    .then_some(())
            },
            String::new,
        );
    }

    /// Server-side applies `object` (its `status` too, through the status subresource, for
    /// the kinds that have one) and returns the object as stored.
    pub fn apply(&self, object: &Value) -> Value {
        let mut object = object.clone();
        let status = object.as_object_mut().and_then(|o| o.remove("status"));
        let target = ObjectRef::of(&object);
        self.call(move |client| {
            Box::pin(async move {
                let api = target.api(&client).await;
                let (kind, name) = (&target.kind, &target.name);
                let params = PatchParams::apply("ambientd-e2e").force();
                let stored = api
                    .patch(name, &params, &Patch::Apply(&object))
                    .await
                    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
                let stored = match status {
                    Some(status) if kind == "Pod" || kind == "Gateway" => api
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": status})),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("status of {kind} {name}: {e}")),
                    _ => stored,
                };
                serde_json::to_value(stored).expect("json")
            })
        })
    }

    /// Deletes an object at once (grace 0: no kubelet is there to confirm a pod's end).
    pub fn delete(&self, target: &ObjectRef) {
        let target = target.clone();
        self.call(move |client| {
            Box::pin(async move {
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                target
                    .api(&client)
                    .await
                    .delete(&target.name, &params)
                    .await
                    .unwrap_or_else(|e| panic!("delete {} {}: {e}", target.kind, target.name));
            })
        })
    }

    /// An object, if it exists.
    pub fn get(&self, target: &ObjectRef) -> Option<Value> {
        let target = target.clone();
        self.call(move |client| {
            Box::pin(async move {
                let object = target
                    .api(&client)
                    .await
                    .get_opt(&target.name)
                    .await
                    .ok()??;
                serde_json::to_value(object).ok()
            })
        })
    }

    /// A service-account token from the TokenRequest API, bound to a pod, for `audience`.
    pub fn token(
        &self,
        namespace: &str,
        service_account: &str,
        pod: (&str, &str),
        audience: &str,
    ) -> String {
        let uri = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience],
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.0, "uid": pod.1},
            },
        });
        self.call(move |client| {
            Box::pin(async move {
                let request = http::Request::post(uri)
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).expect("json"))
                    .expect("request");
                let answer: Value = client.request(request).await.expect("TokenRequest");
                answer["status"]["token"]
                    .as_str()
                    .expect("a token")
                    .to_string()
            })
        })
    }

    /// `data[key]` of a ConfigMap, or a Secret's decoded.
    pub fn data(&self, kind: &str, namespace: &str, name: &str, key: &str) -> Option<String> {
        let object = self.get(&ObjectRef::new("v1", kind, Some(namespace), name))?;
        let value = object["data"][key].as_str()?;
        if kind == "Secret" {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(value)
                .ok()?;
            String::from_utf8(bytes).ok()
        } else {
            Some(value.to_string())
        }
    }
}

/// The client's thread: inside ctl, a current-thread runtime, one job at a time.
fn client_thread(ctl: &Netns, kubeconfig: &Path) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let kubeconfig = kubeconfig.to_path_buf();
    let file = ctl.file();
    std::thread::Builder::new()
        .name("kube-client".into())
        .spawn(move || {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let _ = rustls::crypto::ring::default_provider().install_default();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let client = runtime.block_on(async {
                let config = kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig");
                let options = kube::config::KubeConfigOptions::default();
                let config = kube::Config::from_custom_kubeconfig(config, &options)
                    .await
                    .expect("client config");
                kube::Client::try_from(config).expect("client")
            });
            for job in rx {
                job(&runtime, &client);
            }
        })
        .expect("spawn the kube client");
    tx
}

/// The API server's certificates and keys: a CA, its serving certificate, an admin client
/// certificate (`O=system:masters`), and the service-account signing key.
struct Pki {
    ca: String,
    admin_cert: String,
    admin_key: String,
}

impl Pki {
    fn write(dir: &Path) -> Pki {
        let ca_key = KeyPair::generate().expect("key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "ambientd-e2e kube CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key).expect("CA").pem();
        let issuer = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate().expect("key");
        let mut serving = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes.default.svc".to_string(),
            "kubernetes.default.svc.cluster.local".to_string(),
        ])
        .expect("params");
        serving
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let serving = serving
            .signed_by(&serving_key, &issuer)
            .expect("serving cert");

        let admin_key = KeyPair::generate().expect("key");
        let mut admin = CertificateParams::new(Vec::<String>::new()).expect("params");
        admin
            .distinguished_name
            .push(DnType::CommonName, "ambientd-e2e-admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let admin = admin.signed_by(&admin_key, &issuer).expect("admin cert");

        let sa = KeyPair::generate().expect("key");
        let files: BTreeMap<&str, String> = [
            ("ca.pem", ca.clone()),
            ("serving.pem", serving.pem()),
            ("serving-key.pem", serving_key.serialize_pem()),
            ("sa.key", sa.serialize_pem()),
            ("sa.pub", sa.public_key_pem()),
        ]
        .into();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write pki");
        }
        Pki {
            ca,
            admin_cert: admin.pem(),
            admin_key: admin_key.serialize_pem(),
        }
    }

    fn kubeconfig(&self) -> String {
        let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
        serde_json::to_string_pretty(&json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": format!("https://127.0.0.1:{PORT}"),
                "certificate-authority-data": b64(&self.ca),
            }}],
            "users": [{"name": "admin", "user": {
                "client-certificate-data": b64(&self.admin_cert),
                "client-key-data": b64(&self.admin_key),
            }}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }))
        .expect("kubeconfig")
    }
}
