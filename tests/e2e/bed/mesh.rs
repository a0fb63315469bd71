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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::apps::{self, Protocol, Server};
use super::kube::{ApiServer, KubeTools, ObjectRef};
use super::netns::{self, Netns};
use super::objects::{cluster_objects, pod_object, service_account};
use super::process::{Process, wait_for};
use super::tools::Tools;
use super::zds::{Agent, WorkloadInfo};

/// ambientd's address, on ctl's loopback (a SAN of its 15012 certificate).
pub const CONTROL_PLANE: Ipv4Addr = Ipv4Addr::new(172, 30, 255, 1);
/// The namespace the apps live in (enrolled: `istio.io/dataplane-mode=ambient`).
pub const NAMESPACE: &str = "mesh";
pub const TRUST_DOMAIN: &str = "cluster.local";
/// How long a program may take to start and converge on a busy two-core machine.
pub const STARTUP: Duration = Duration::from_secs(60);

static BEDS: AtomicU32 = AtomicU32::new(0);

/// istio-cni's in-pod redirection (istio/istio `cni/pkg/iptables`, the ambient in-pod rule
/// set): outbound TCP to ztunnel's 15001, inbound TCP but HBONE to 15006, ztunnel's own
/// sockets (mark 0x539) left alone, and replies to what ztunnel sent in with the client's
/// address (connmark 0x111) routed back to ztunnel by [`INPOD_ROUTES`]. With `dns`, DNS
/// (UDP and TCP to port 53) goes to ztunnel's DNS proxy on 15053, in conntrack zone 1 so its
/// replies do not meet the NAT of the query, as with istio-cni's DNS capture on.
fn inpod_rules(dns: bool) -> String {
    let raw = "\
*raw
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_OUTPUT -p udp -m mark --mark 0x539/0xfff -m udp --dport 53 -j CT --zone 1
-A ISTIO_PRERT -p udp -m mark ! --mark 0x539/0xfff -m udp --sport 53 -j CT --zone 1
COMMIT
";
    let mangle = "\
*mangle
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
";
    let nat_start = "\
*nat
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127/32 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
";
    let nat_dns = "\
-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-ports 15053
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053
";
    let nat_end = "\
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";
    if dns {
        [raw, mangle, nat_start, nat_dns, nat_end].concat()
    } else {
        [mangle, nat_start, nat_end].concat()
    }
}

/// istio-cni's policy routing beside [`inpod_rules`]: packets marked 0x111 are delivered
/// locally (to ztunnel's transparent socket).
const INPOD_ROUTES: [&[&str]; 2] = [
    &[
        "rule",
        "add",
        "fwmark",
        "0x111/0xfff",
        "pref",
        "32764",
        "lookup",
        "100",
    ],
    &[
        "route",
        "add",
        "local",
        "0.0.0.0/0",
        "dev",
        "lo",
        "table",
        "100",
    ],
];

/// A node: its namespace, its ztunnel and its CNI agent.
pub struct Node {
    pub name: String,
    /// 1-based: the `<i>` of its addresses.
    pub index: u8,
    pub netns: Netns,
    pub agent: Agent,
    ztunnel: Option<Process>,
    next_pod: u8,
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
    servers: Vec<Server>,
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
    options: Options,
}

/// How the mesh runs, beside its source.
#[derive(Clone, Copy, Debug, Default)]
struct Options {
    /// ztunnel's DNS proxy and istio-cni's DNS capture.
    dns_capture: bool,
    /// ambientd's `--scope-to-node`, ztunnels' `XDS_ON_DEMAND=true`.
    on_demand: bool,
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

    /// Fails the test if any proxy (ztunnel or waypoint) has NACKed what ambientd sent it
    /// (`pilot_total_xds_rejects`, by type) since ambientd last started.
    pub fn assert_no_nacks(&self) {
        // The family has samples only once some type was NACKed.
        let metrics = self.ambientd_metrics();
        let nacks: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with("pilot_total_xds_rejects"))
            .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) != Some(0.0))
            .collect();
        assert!(
            nacks.is_empty(),
            "proxies NACKed ambientd's config: {nacks:?}\n{}",
            self.ambientd_log_tail()
        );
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

    // ---- nodes ----

    fn add_node(&mut self, index: u8) {
        let name = format!("node{index}");
        let netns = Netns::create(&format!("n{index}"));
        let link = format!("n{index}");
        self.ctl.veth(&link, &netns);
        self.ctl
            .ip(&["addr", "add", &format!("172.30.{index}.1/24"), "dev", &link]);
        self.ctl.ip(&["link", "set", &link, "up"]);
        self.ctl.ip(&[
            "route",
            "add",
            &format!("10.30.{index}.0/24"),
            "via",
            &format!("172.30.{index}.2"),
        ]);
        netns.ip(&[
            "addr",
            "add",
            &format!("172.30.{index}.2/24"),
            "dev",
            "eth0",
        ]);
        netns.ip(&["link", "set", "eth0", "up"]);
        netns.ip(&[
            "route",
            "add",
            "default",
            "via",
            &format!("172.30.{index}.1"),
        ]);
        netns.sysctl("net.ipv4.ip_forward", "1");
        for netns in [&netns, &self.ctl] {
            netns.sysctl("net.ipv4.conf.all.rp_filter", "0");
            netns.sysctl("net.ipv4.conf.default.rp_filter", "0");
        }
        let agent = Agent::listen(&self.dir.join(format!("{name}.zds.sock")));
        let mut node = Node {
            name,
            index,
            netns,
            agent,
            ztunnel: None,
            next_pod: 10,
        };
        node.ztunnel = Some(self.start_ztunnel(&node));
        self.nodes.push(node);
    }

    /// A real ztunnel for `node`, as its DaemonSet runs it: in-pod mode on the agent's
    /// socket, xDS and certificates from ambientd's 15012 with a node-bound token.
    fn start_ztunnel(&mut self, node: &Node) -> Process {
        // ztunnel's own pod, for its token's binding (on a cluster, ambientd finds the node a
        // ztunnel may ask certificates for from the pod its token is bound to).
        let mut pod = Pod {
            name: format!("ztunnel-{}", node.name),
            namespace: "istio-system".into(),
            service_account: "ztunnel".into(),
            uid: format!("00000000-e2e0-4000-8000-0000000000{:02x}", node.index),
            ip: Ipv4Addr::new(172, 30, node.index, 2),
            node: node.name.clone(),
            labels: [("app".to_string(), "ztunnel".to_string())].into(),
            netns: Netns::create(&format!("z{}", node.index)),
            servers: Vec::new(),
            processes: Vec::new(),
            envoy_admin: None,
            written: Instant::now(),
        };
        self.publish_pod(&mut pod, false);
        let token = self.pod_token(&format!("{}.token", node.name), &pod);
        let root = self.root_cert.clone();
        let endpoint = format!("https://{CONTROL_PLANE}:15012");
        // ztunnel reads ./etc/istio/config/mesh and ./var/run/secrets relative to where it
        // runs: a directory of its own keeps it from finding anything by accident.
        let cwd = self.dir.join(format!("ztunnel-{}", node.name));
        std::fs::create_dir_all(&cwd).expect("ztunnel dir");
        let mut command = node.netns.command(&self.tools.ztunnel);
        command
            .current_dir(&cwd)
            .args(["proxy", "ztunnel"])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("XDS_ADDRESS", &endpoint)
            .env("CA_ADDRESS", &endpoint)
            .env("XDS_ROOT_CA", &root)
            .env("CA_ROOT_CA", &root)
            .env("AUTH_TOKEN", &token)
            .env("NODE_NAME", &node.name)
            .env("POD_NAME", format!("ztunnel-{}", node.name))
            .env("POD_NAMESPACE", "istio-system")
            .env("INSTANCE_IP", format!("172.30.{}.2", node.index))
            .env("ISTIO_META_CLUSTER_ID", "Kubernetes")
            .env("INPOD_UDS", node.agent.path())
            .env(
                "XDS_ON_DEMAND",
                if self.options.on_demand {
                    "true"
                } else {
                    "false"
                },
            )
            .env(
                "ISTIO_META_DNS_CAPTURE",
                if self.options.dns_capture {
                    "true"
                } else {
                    "false"
                },
            )
            .env("IPV6_ENABLED", "false")
            .env(
                "RUST_LOG",
                std::env::var("AMBIENTD_E2E_ZTUNNEL_LOG").unwrap_or_else(|_| "info".into()),
            );
        Process::start(&format!("ztunnel-{}", node.name), command, &self.dir)
    }

    fn wait_ztunnel_ready(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        wait_for(
            &format!("{}'s ztunnel ready", node.name),
            STARTUP,
            || {
                node.ztunnel.as_mut().expect("ztunnel").assert_running();
                apps::http(
                    &node.netns,
                    ([127, 0, 0, 1], 15021).into(),
                    "GET",
                    "/healthz/ready",
                    "ztunnel",
                )
                .ok()
                .filter(|r| r.status == 200)
            },
            String::new,
        );
    }

    /// Node `index` (1-based).
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index - 1]
    }

    /// A ztunnel's admin, stats or readiness endpoint (`port` 15000, 15020 or 15021).
    pub fn ztunnel_get(&self, node: usize, port: u16, path: &str) -> String {
        apps::http(
            &self.node(node).netns,
            ([127, 0, 0, 1], port).into(),
            "GET",
            path,
            "ztunnel",
        )
        .map(|r| r.body)
        .unwrap_or_default()
    }

    /// The sum of a ztunnel's Prometheus samples of `metric` whose labels include all of
    /// `labels` (`key="value"` as the exposition writes them).
    pub fn ztunnel_metric(&self, node: usize, metric: &str, labels: &[(&str, &str)]) -> u64 {
        sum_samples(&self.ztunnel_get(node, 15020, "/metrics"), metric, labels)
    }

    /// Waits (5 s at most: ztunnel writes an access log line as the connection ends, just
    /// after the client sees it end) for a line of a ztunnel's log that contains all of
    /// `parts`; fails the test with `what` and the log's tail.
    pub fn expect_ztunnel_line(&self, node: usize, parts: &[&str], what: &str) {
        wait_for(
            what,
            Duration::from_secs(5),
            || {
                self.ztunnel_log(node)
                    .lines()
                    .any(|l| parts.iter().all(|p| l.contains(p)))
                    .then_some(())
            },
            || self.ztunnel_log_tail(node),
        );
    }

    /// Waits (5 s at most) until a ztunnel's [`Mesh::ztunnel_metric`] is at least `min`.
    pub fn expect_ztunnel_metric(
        &self,
        node: usize,
        metric: &str,
        labels: &[(&str, &str)],
        min: u64,
    ) {
        wait_for(
            &format!("node{node}'s ztunnel to count {min} {metric} {labels:?}"),
            Duration::from_secs(5),
            || (self.ztunnel_metric(node, metric, labels) >= min).then_some(()),
            || self.ztunnel_get(node, 15020, "/metrics"),
        );
    }

    /// The certificates a ztunnel holds (its config_dump's `certificates`): identity, state
    /// (`Available` when usable) and the leaf's serial number.
    pub fn ztunnel_certificates(&self, node: usize) -> Vec<(String, String, String)> {
        let dump: Value = serde_json::from_str(&self.ztunnel_get(node, 15000, "/config_dump"))
            .unwrap_or_default();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        dump["certificates"]
            .as_array()
            .map(|certs| {
                certs
                    .iter()
                    .map(|c| {
                        (
                            text(&c["identity"]),
                            text(&c["state"]),
                            text(&c["certChain"][0]["serialNumber"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A ztunnel's log so far.
    pub fn ztunnel_log(&self, node: usize) -> String {
        self.node(node)
            .ztunnel
            .as_ref()
            .map(Process::log)
            .unwrap_or_default()
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

    pub(super) fn make_pod(&mut self, spec: &PodSpec, redirected: bool) -> Pod {
        let node = &mut self.nodes[spec.node - 1];
        let (i, j) = (node.index, node.next_pod);
        node.next_pod += 1;
        let ip = Ipv4Addr::new(10, 30, i, j);
        let netns = Netns::create(&spec.name);
        let link = format!("p{j}");
        node.netns.veth(&link, &netns);
        node.netns
            .ip(&["addr", "add", &format!("10.30.{i}.1/32"), "dev", &link]);
        node.netns.ip(&["link", "set", &link, "up"]);
        node.netns
            .ip(&["route", "add", &format!("{ip}/32"), "dev", &link]);
        netns.ip(&["addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
        netns.ip(&["link", "set", "eth0", "up"]);
        netns.ip(&[
            "route",
            "add",
            &format!("10.30.{i}.1"),
            "dev",
            "eth0",
            "scope",
            "link",
        ]);
        netns.ip(&["route", "add", "default", "via", &format!("10.30.{i}.1")]);
        if redirected {
            netns.iptables_restore(&inpod_rules(self.options.dns_capture));
            for args in INPOD_ROUTES {
                netns.ip(args);
            }
        }
        Pod {
            name: spec.name.clone(),
            namespace: NAMESPACE.into(),
            service_account: spec.service_account.clone(),
            uid: format!("00000000-e2e0-4000-8000-{:012x}", u32::from(ip)),
            ip,
            node: node.name.clone(),
            labels: spec.labels.clone(),
            netns,
            servers: Vec::new(),
            processes: Vec::new(),
            envoy_admin: None,
            written: Instant::now(),
        }
    }

    fn enroll(&self, pod: &Pod) {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == pod.node)
            .expect("node");
        node.agent.add(
            &pod.uid,
            WorkloadInfo {
                name: pod.name.clone(),
                namespace: pod.namespace.clone(),
                service_account: pod.service_account.clone(),
            },
            pod.netns.file(),
        );
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

    /// Waits until every ztunnel's config_dump lists `what` (an IP or a name), and returns
    /// how long that took.
    pub fn wait_ztunnels_know(&self, what: &str) -> Duration {
        let started = Instant::now();
        for node in 1..=self.nodes.len() {
            wait_for(
                &format!("node{node}'s ztunnel to know {what}"),
                STARTUP,
                || {
                    self.ztunnel_get(node, 15000, "/config_dump")
                        .contains(what)
                        .then_some(())
                },
                || self.ztunnel_log_tail(node),
            );
        }
        started.elapsed()
    }

    /// Waits until no ztunnel's config_dump contains `what`; how long that took.
    pub fn wait_ztunnels_forget(&self, what: &str) -> Duration {
        let started = Instant::now();
        for node in 1..=self.nodes.len() {
            wait_for(
                &format!("node{node}'s ztunnel to forget {what}"),
                STARTUP,
                || (!self.ztunnel_get(node, 15000, "/config_dump").contains(what)).then_some(()),
                || self.ztunnel_log_tail(node),
            );
        }
        started.elapsed()
    }

    pub fn ztunnel_log_tail(&self, node: usize) -> String {
        let log = self.ztunnel_log(node);
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "--- ztunnel-node{node}:\n{}",
            lines[lines.len().saturating_sub(30)..].join("\n")
        )
    }
}

/// The sum of the samples of `metric` in Prometheus text whose labels include all of
/// `labels`.
pub fn sum_samples(text: &str, metric: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The last `lines` lines of a log file.
pub fn tail(path: &Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Mesh {
    /// Writes what each proxy holds into the bed's directory, for reading a failure:
    /// `ztunnel-<node>.config_dump.json`, `envoy-<waypoint>.config_dump.json` and `.stats`.
    fn save_state(&self) {
        for node in 1..=self.nodes.len() {
            let dump = self.ztunnel_get(node, 15000, "/config_dump");
            let _ = std::fs::write(
                self.dir
                    .join(format!("ztunnel-node{node}.config_dump.json")),
                dump,
            );
        }
        for pod in self.pods.iter().filter(|p| p.envoy_admin.is_some()) {
            for (path, suffix) in [
                ("/config_dump?include_eds", "config_dump.json"),
                ("/stats", "stats"),
            ] {
                let _ = std::fs::write(
                    self.dir.join(format!("envoy-{}.{suffix}", pod.name)),
                    super::waypoint::envoy_admin_get(pod, path),
                );
            }
        }
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
