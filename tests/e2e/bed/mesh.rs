//! A whole ambient mesh on one machine: ambientd in a control-plane namespace, nodes with a
//! real ztunnel each (in-pod mode, this bed playing istio-cni's node agent), pods with the
//! in-pod redirection istio-cni installs, a real Envoy as a waypoint, and the Kubernetes
//! objects that describe them written as manifests ambientd follows.
//!
//! ```text
//!                      ctl  (ambientd: 172.30.255.1 :15010 :15012 :15014)
//!                  n1 /  \ n2          172.30.<i>.1 <-> 172.30.<i>.2
//!     node1 (ztunnel)      node2 (ztunnel)          ztunnels dial 172.30.255.1:15012
//!       p<j> |  |              |  |
//!      pod 10.30.1.<j>      pod 10.30.2.<j>         each pod: eth0 <-> p<j> on its node
//! ```
//!
//! Routing: a pod's default route is its node (10.30.<i>.1 on every pod link, as the ptp CNI
//! plugin does); a node routes each of its pods' /32 to the pod's link and everything else to
//! ctl; ctl routes 10.30.<i>.0/24 to node i. Service VIPs (10.96.0.0/24) never leave a pod:
//! ztunnel's redirection catches them.
//!
//! Everything a test makes is removed when its [`Mesh`] is dropped: processes first, then
//! namespaces. The bed's directory (`$AMBIENTD_E2E_DIR` or the temp dir, then
//! `ambientd-e2e-<pid>-<n>`) holds each program's log, the manifests and the CA; it is kept,
//! and its path printed, when the test fails.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::apps::{self, Protocol, Server};
use super::kube::{ApiServer, KubeTools, ObjectRef};
use super::netns::{self, Netns};
use super::objects::{cluster_objects, pod_object, service_account};
use super::process::{Process, wait_for};
use super::tools::Tools;
use super::zds::Agent;

/// ambientd's address, on ctl's loopback (a SAN of its 15012 certificate).
pub const CONTROL_PLANE: Ipv4Addr = Ipv4Addr::new(172, 30, 255, 1);
/// The namespace the apps live in (enrolled: `istio.io/dataplane-mode=ambient`).
pub const NAMESPACE: &str = "mesh";
pub const TRUST_DOMAIN: &str = "cluster.local";
/// How long a program may take to start and converge on a busy two-core machine.
pub const STARTUP: Duration = Duration::from_secs(60);

static BEDS: AtomicU32 = AtomicU32::new(0);

/// A node: its namespace, its ztunnel and its CNI agent.
pub struct Node {
    pub name: String,
    /// 1-based: the `<i>` of its addresses.
    pub index: u8,
    pub netns: Netns,
    pub agent: Agent,
    pub(super) ztunnel: Option<Process>,
    pub(super) next_pod: u8,
}

/// A pod: its namespace (with or without redirection) and who it is.
pub struct Pod {
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub uid: String,
    pub ip: Ipv4Addr,
    pub node: String,
    pub labels: BTreeMap<String, String>,
    pub netns: Netns,
    pub(super) servers: Vec<Server>,
    /// The waypoint's Envoy and `ambientd sds`, for a waypoint pod.
    pub(super) processes: Vec<Process>,
    /// Envoy's admin address inside the pod, for a waypoint pod.
    pub envoy_admin: Option<SocketAddr>,
    /// When it was reported Running with its IP (its manifest written, or its status set).
    pub written: Instant,
}

impl Pod {
    /// `spiffe://cluster.local/ns/<ns>/sa/<sa>`.
    pub fn identity(&self) -> String {
        format!(
            "spiffe://{TRUST_DOMAIN}/ns/{}/sa/{}",
            self.namespace, self.service_account
        )
    }
}

/// What a new pod is.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub name: String,
    pub node: usize,
    pub service_account: String,
    pub labels: BTreeMap<String, String>,
}

impl PodSpec {
    /// Pod `name` on node `node` (1-based), service account `name`, label `app=<name>`.
    pub fn new(name: &str, node: usize) -> PodSpec {
        PodSpec {
            name: name.into(),
            node,
            service_account: name.into(),
            labels: [("app".to_string(), name.to_string())].into(),
        }
    }

    pub fn label(mut self, key: &str, value: &str) -> PodSpec {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn service_account(mut self, sa: &str) -> PodSpec {
        self.service_account = sa.into();
        self
    }
}

/// Where ambientd reads the mesh from.
pub enum Source {
    /// A manifests directory: objects are files.
    Manifests,
    /// A real API server: objects are applied to it, and ambientd watches it.
    Kube(Box<ApiServer>),
}

/// The mesh; everything in it is removed on drop.
pub struct Mesh {
    pub tools: Tools,
    pub(super) dir: PathBuf,
    manifests: PathBuf,
    pub(super) ca_dir: PathBuf,
    /// The mesh's root certificate, for ztunnels and the waypoint.
    pub(super) root_cert: PathBuf,
    pub ctl: Netns,
    pub source: Source,
    /// What each `apply` name put in the API server, for `remove`.
    applied: std::sync::Mutex<BTreeMap<String, Vec<ObjectRef>>>,
    service_accounts: std::collections::BTreeSet<(String, String)>,
    ambientd: Option<Process>,
    pub nodes: Vec<Node>,
    pub(super) pods: Vec<Pod>,
    pub(super) next_vip: u8,
    pub(super) options: Options,
}

/// How the mesh runs, beside its source.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Options {
    /// ztunnel's DNS proxy and istio-cni's DNS capture.
    pub(super) dns_capture: bool,
    /// ambientd's `--scope-to-node`, ztunnels' `XDS_ON_DEMAND=true`.
    pub(super) on_demand: bool,
}

impl Mesh {
    /// A mesh of `nodes` nodes with a ztunnel each, served by ambientd from manifests; `None`
    /// (after saying why) when a tool is missing outside CI.
    pub fn start(nodes: usize) -> Option<Mesh> {
        Mesh::start_with(nodes, None, Options::default())
    }

    /// The mesh with ztunnel's DNS proxy on and istio-cni's DNS capture in every pod.
    pub fn start_with_dns_capture(nodes: usize) -> Option<Mesh> {
        let options = Options {
            dns_capture: true,
            ..Options::default()
        };
        Mesh::start_with(nodes, None, options)
    }

    /// The mesh with ambientd's `--scope-to-node` and ztunnels' `XDS_ON_DEMAND=true`: each
    /// ztunnel holds its node's workloads and asks for the rest as it needs them.
    pub fn start_on_demand(nodes: usize) -> Option<Mesh> {
        let options = Options {
            on_demand: true,
            ..Options::default()
        };
        Mesh::start_with(nodes, None, options)
    }

    /// The same mesh with ambientd watching a real API server, which holds its objects.
    pub fn start_on_kube(nodes: usize) -> Option<Mesh> {
        let kube = KubeTools::find()?;
        Mesh::start_with(nodes, Some(kube), Options::default())
    }

    fn start_with(nodes: usize, kube: Option<KubeTools>, options: Options) -> Option<Mesh> {
        let tools = Tools::find()?;
        netns::sweep_stale();
        let base = std::env::var_os("AMBIENTD_E2E_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!(
            "ambientd-e2e-{}-{}",
            std::process::id(),
            BEDS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let (manifests, ca_dir) = (dir.join("manifests"), dir.join("ca"));
        std::fs::create_dir_all(&manifests).expect("manifests dir");
        std::fs::create_dir_all(&ca_dir).expect("ca dir");
        eprintln!("the bed's logs and manifests: {}", dir.display());

        let ctl = Netns::create("ctl");
        ctl.sysctl("net.ipv4.ip_forward", "1");
        ctl.ip(&["addr", "add", &format!("{CONTROL_PLANE}/32"), "dev", "lo"]);
        let source = match &kube {
            Some(kube) => Source::Kube(Box::new(ApiServer::start(kube, &ctl, &dir))),
            None => Source::Manifests,
        };
        let root_cert = match source {
            Source::Manifests => ca_dir.join("root-cert.pem"),
            Source::Kube(_) => dir.join("root-cert.pem"),
        };
        let mut mesh = Mesh {
            tools,
            dir,
            manifests,
            ca_dir,
            root_cert,
            ctl,
            source,
            applied: Default::default(),
            service_accounts: Default::default(),
            ambientd: None,
            nodes: Vec::new(),
            pods: Vec::new(),
            next_vip: 10,
            options,
        };
        mesh.apply("00-cluster", &cluster_objects(nodes, &[]));
        mesh.start_ambientd();
        if let Source::Kube(api) = &mesh.source {
            // The root ztunnels trust, as their chart mounts it: the ConfigMap ambientd's
            // leader writes into every namespace.
            let root = wait_for(
                "ambientd to write ConfigMap istio-ca-root-cert",
                STARTUP,
                || {
                    api.data(
                        "ConfigMap",
                        "istio-system",
                        "istio-ca-root-cert",
                        "root-cert.pem",
                    )
                },
                String::new,
            );
            std::fs::write(&mesh.root_cert, root).expect("root cert");
        }
        for index in 1..=nodes as u8 {
            mesh.add_node(index);
        }
        for index in 0..nodes {
            mesh.wait_ztunnel_ready(index);
        }
        Some(mesh)
    }

    /// The API server, in a mesh started on one.
    pub fn api(&self) -> Option<&ApiServer> {
        match &self.source {
            Source::Kube(api) => Some(api),
            Source::Manifests => None,
        }
    }

    // ---- the control plane ----

    /// Starts (or restarts) ambientd in ctl and waits until it is ready.
    pub fn start_ambientd(&mut self) {
        let mut command = self.ctl.command(&self.tools.ambientd);
        command.arg("serve");
        match &self.source {
            Source::Manifests => command.arg("--manifests").arg(&self.manifests),
            Source::Kube(api) => command.arg("--kubeconfig").arg(&api.kubeconfig),
        };
        command
            .arg("--ca-dir")
            .arg(&self.ca_dir)
            .args(["--xds-address", "0.0.0.0:15010"])
            .args(["--xds-tls-address", "0.0.0.0:15012"])
            .args(["--debug-address", "0.0.0.0:15014"])
            .args(["--tls-san", &CONTROL_PLANE.to_string()])
            .args([
                "--log-level",
                &std::env::var("AMBIENTD_E2E_AMBIENTD_LOG")
                    .unwrap_or_else(|_| "ambientd=debug,info".into()),
            ])
            .env("NO_COLOR", "1");
        if self.options.on_demand {
            command.arg("--scope-to-node");
        }
        let mut process = Process::start("ambientd", command, &self.dir);
        wait_for(
            "ambientd's /ready",
            STARTUP,
            || {
                process.assert_running();
                let ready = apps::http(
                    &self.ctl,
                    (CONTROL_PLANE, 15014).into(),
                    "GET",
                    "/ready",
                    "ambientd",
                );
                ready.ok().filter(|r| r.status == 200)
            },
            || self.ambientd_log_tail(),
        );
        self.ambientd = Some(process);
    }

    /// Stops ambientd (SIGTERM, then SIGKILL after 10 s).
    pub fn stop_ambientd(&mut self) {
        if let Some(mut process) = self.ambientd.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Kills ambientd (SIGKILL): its streams break without a status, as in a crash.
    pub fn kill_ambientd(&mut self) {
        drop(self.ambientd.take());
    }

    pub fn ambientd_log(&self) -> String {
        self.ambientd.as_ref().map(Process::log).unwrap_or_else(|| {
            std::fs::read_to_string(self.dir.join("ambientd.log")).unwrap_or_default()
        })
    }

    pub(super) fn ambientd_log_tail(&self) -> String {
        let log = self.ambientd_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// ambientd's Prometheus text.
    pub fn ambientd_metrics(&self) -> String {
        apps::http(
            &self.ctl,
            (CONTROL_PLANE, 15014).into(),
            "GET",
            "/metrics",
            "ambientd",
        )
        .map(|r| r.body)
        .unwrap_or_default()
    }

    /// Adds `labels` to the apps' namespace (such as `istio.io/use-waypoint`).
    pub fn label_namespace(&self, labels: &[(&str, &str)]) {
        self.apply("00-cluster", &cluster_objects(self.nodes.len(), labels));
    }

    /// Mints a token from ambientd's CA directory (`ambientd token`).
    pub(super) fn local_token(&self, file: &str, args: &[&str]) -> PathBuf {
        let path = self.dir.join(file);
        netns::run(
            std::process::Command::new(&self.tools.ambientd)
                .arg("token")
                .arg("--ca-dir")
                .arg(&self.ca_dir)
                .arg("--output")
                .arg(&path)
                .args(args),
        );
        path
    }

    /// A token for `pod`'s service account, bound to it, in `file`: from the TokenRequest
    /// API on a cluster (checked by ambientd with a TokenReview), else minted locally.
    pub(super) fn pod_token(&self, file: &str, pod: &Pod) -> PathBuf {
        match &self.source {
            Source::Kube(api) => {
                let token = api.token(
                    &pod.namespace,
                    &pod.service_account,
                    (&pod.name, &pod.uid),
                    "istio-ca",
                );
                let path = self.dir.join(file);
                std::fs::write(&path, token).expect("token");
                path
            }
            Source::Manifests => self.local_token(
                file,
                &[
                    "--namespace",
                    &pod.namespace,
                    "--service-account",
                    &pod.service_account,
                    "--pod",
                    &pod.name,
                    "--pod-uid",
                    &pod.uid,
                    "--node",
                    &pod.node,
                ],
            ),
        }
    }

    // ---- objects ----

    /// Publishes `objects` under `name`: a file `<name>.json` (a `List`, written atomically)
    /// in the manifests directory, or each object applied to the API server.
    pub fn apply(&self, name: &str, objects: &[Value]) {
        match &self.source {
            Source::Manifests => {
                let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
                let temp = self.manifests.join(format!(".{name}.tmp"));
                std::fs::write(&temp, serde_json::to_vec_pretty(&list).expect("json"))
                    .expect("write");
                std::fs::rename(&temp, self.manifests.join(format!("{name}.json")))
                    .expect("rename");
            }
            Source::Kube(api) => {
                let ids = objects
                    .iter()
                    .map(|object| {
                        api.apply(object);
                        ObjectRef::of(object)
                    })
                    .collect();
                self.applied
                    .lock()
                    .expect("applied")
                    .insert(name.into(), ids);
            }
        }
    }

    /// Takes back what `apply(name, …)` published.
    pub fn remove(&self, name: &str) {
        match &self.source {
            Source::Manifests => std::fs::remove_file(self.manifests.join(format!("{name}.json")))
                .unwrap_or_else(|e| panic!("remove manifest {name}: {e}")),
            Source::Kube(api) => {
                let ids = self.applied.lock().expect("applied").remove(name);
                for object in ids.unwrap_or_default() {
                    api.delete(&object);
                }
            }
        }
    }

    // ---- pods ----

    /// Adds a pod in the mesh in the order a cluster does it: its object bound to its node
    /// (on a cluster; it gets its uid there), its netns and link, istio-cni's redirection and
    /// its enrollment with the node's ztunnel (the CNI ADD), then its status Running with its
    /// IP (the kubelet; a manifest is written only now). `Pod::written` is that moment.
    pub fn add_pod(&mut self, spec: PodSpec) -> &Pod {
        let mut pod = self.make_pod(&spec, true);
        self.publish_pod(&mut pod, true);
        self.pods.push(pod);
        self.pods.last().expect("pod")
    }

    /// Adds a pod outside the mesh: no redirection, not enrolled with its ztunnel (as a pod
    /// in the namespace that istio-cni has not captured yet, without
    /// `ambient.istio.io/redirection`).
    pub fn add_pod_outside_mesh(&mut self, spec: PodSpec) -> &Pod {
        let mut pod = self.make_pod(&spec, false);
        self.publish_pod(&mut pod, false);
        self.pods.push(pod);
        self.pods.last().expect("pod")
    }

    /// Publishes a pod made by `make_pod`: created (a cluster gives its uid), enrolled with
    /// its ztunnel when `redirected`, then reported Running.
    pub(super) fn publish_pod(&mut self, pod: &mut Pod, redirected: bool) {
        let file = format!("pod-{}", pod.name);
        if let Source::Kube(api) = &self.source {
            let account = (pod.namespace.clone(), pod.service_account.clone());
            if self.service_accounts.insert(account) {
                api.apply(&service_account(&pod.namespace, &pod.service_account));
            }
            pod.uid.clear();
            let created = api.apply(&pod_object(pod, redirected, &[], false));
            pod.uid = created["metadata"]["uid"]
                .as_str()
                .expect("a uid")
                .to_string();
        }
        if redirected {
            self.enroll(pod);
        }
        pod.written = Instant::now();
        self.apply(&file, &[pod_object(pod, redirected, &[], true)]);
    }

    /// Deletes a pod as a cluster does: its object goes (the Service's endpoints with it),
    /// and once every ztunnel has dropped it, the CNI DEL (out of its ztunnel) and its
    /// sandbox. Returns how long the ztunnels took to drop it.
    pub fn delete_pod(&mut self, name: &str) -> Duration {
        let at = self
            .pods
            .iter()
            .position(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"));
        self.remove(&format!("pod-{name}"));
        let ip = self.pods[at].ip;
        let took = self.wait_ztunnels_forget(&format!("{ip}\""));
        let pod = self.pods.remove(at);
        if let Some(node) = self.nodes.iter().find(|n| n.name == pod.node) {
            node.agent.delete(&pod.uid);
        }
        drop(pod);
        took
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// Starts an echo server in pod `name`.
    pub fn serve(&mut self, name: &str, protocol: Protocol, port: u16) {
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pod {name}"));
        let server = apps::serve(&pod.netns, &pod.name, protocol, port);
        pod.servers.push(server);
    }

    // ---- services and policy ----

    /// A Service selecting `selector` with `ports` (name, port, targetPort) and the next VIP;
    /// `extra_labels` such as `istio.io/use-waypoint`.
    pub fn add_service(
        &mut self,
        name: &str,
        selector: &[(&str, &str)],
        ports: &[(&str, u16, u16)],
        extra_labels: &[(&str, &str)],
    ) -> Ipv4Addr {
        let selector: serde_json::Map<String, Value> = selector
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let vip = Ipv4Addr::new(10, 96, 0, self.next_vip);
        self.next_vip += 1;
        let labels: serde_json::Map<String, Value> = extra_labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let ports: Vec<Value> = ports
            .iter()
            .map(|(name, port, target)| {
                json!({"name": name, "port": port, "targetPort": target, "protocol": "TCP"})
            })
            .collect();
        self.apply(
            &format!("svc-{name}"),
            &[json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                "spec": {
                    "clusterIP": vip.to_string(),
                    "clusterIPs": [vip.to_string()],
                    "selector": selector,
                    "ports": ports,
                },
            })],
        );
        vip
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.save_state();
        }
        // Programs first (ztunnels hold pods' namespaces), then namespaces.
        for pod in &mut self.pods {
            pod.processes.clear();
        }
        for node in &mut self.nodes {
            node.ztunnel = None;
        }
        self.ambientd = None;
        self.pods.clear();
        self.nodes.clear();
        if std::thread::panicking() || std::env::var_os("AMBIENTD_E2E_KEEP").is_some() {
            eprintln!(
                "the bed's logs, manifests and CA are kept in {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
