//! Command-line flags (each also an environment variable), validated into a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::discovery::Settings;

#[derive(Debug, Parser)]
#[command(
    name = "ambientd",
    version,
    about = "A control plane for Istio's ambient mesh: serves ztunnel over delta xDS"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the mesh described by a manifests directory over delta xDS.
    Serve(Box<ServeArgs>),
    /// Mint a service-account token (projected-token shape) that `serve` trusts, for a local
    /// ztunnel's AUTH_TOKEN.
    Token(crate::ca::token::TokenArgs),
    /// Serve a workload certificate and roots from the local CA over SDS, for a plain Envoy
    /// run as a waypoint (pilot-agent's job in a cluster).
    Sds(crate::ca::sds::SdsArgs),
}

#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// Directory of Kubernetes YAML/JSON manifests to serve, followed as it changes.
    /// Without it, ambientd watches the Kubernetes cluster (see --kubeconfig).
    #[arg(long, env = "AMBIENTD_MANIFESTS", value_name = "DIR")]
    pub manifests: Option<PathBuf>,

    /// kubeconfig of the cluster to watch. Without it: KUBECONFIG, ~/.kube/config, then the
    /// in-cluster service account.
    #[arg(
        long,
        env = "AMBIENTD_KUBECONFIG",
        value_name = "FILE",
        conflicts_with = "manifests"
    )]
    pub kubeconfig: Option<PathBuf>,

    /// kubeconfig context (default: the current context).
    #[arg(
        long,
        env = "AMBIENTD_KUBE_CONTEXT",
        value_name = "NAME",
        conflicts_with = "manifests"
    )]
    pub kube_context: Option<String>,

    /// Each watch's `timeoutSeconds`: the API server ends a watch after this long and it is
    /// resumed. A list or watch that goes this long plus 2 s without a byte counts as hung:
    /// it fails (counted in `ambientd_source_errors{reason="timeout"}`) and is retried.
    #[arg(
        long,
        env = "AMBIENTD_KUBE_WATCH_TIMEOUT",
        default_value = "290s",
        value_parser = short_duration,
        conflicts_with = "manifests"
    )]
    pub kube_watch_timeout: Duration,

    /// Mesh discoverySelectors: read only namespaces whose labels match one of these
    /// selectors (kubectl syntax: `istio-discovery=enabled,env in (prod)`). Repeat the flag,
    /// or separate with `;`, for several (ORed).
    #[arg(
        long,
        env = "AMBIENTD_DISCOVERY_SELECTORS",
        value_name = "SELECTOR",
        value_delimiter = ';',
        value_parser = label_selector,
        conflicts_with_all = ["manifests", "mesh_config"]
    )]
    pub discovery_selectors: Vec<crate::kube::cluster::LabelSelector>,

    /// Mesh config file (istiod's `mesh`): its `discoverySelectors` are applied (cluster mode
    /// only), its `serviceEntryVisibility`, and its `rootNamespace` and `trustDomain` unless the
    /// flags give them.
    #[arg(long, env = "AMBIENTD_MESH_CONFIG", value_name = "FILE")]
    pub mesh_config: Option<PathBuf>,

    /// Plaintext delta xDS listener (unauthenticated: for trusted networks only).
    #[arg(
        long,
        env = "AMBIENTD_XDS_ADDRESS",
        default_value = "0.0.0.0:15010",
        value_name = "ADDR"
    )]
    pub xds_address: SocketAddr,

    /// Debug HTTP listener (/ready).
    #[arg(
        long,
        env = "AMBIENTD_DEBUG_ADDRESS",
        default_value = "0.0.0.0:15014",
        value_name = "ADDR"
    )]
    pub debug_address: SocketAddr,

    /// Cluster id: Workload.cluster_id and the prefix of workload uids.
    #[arg(long, env = "AMBIENTD_CLUSTER_ID", default_value = "Kubernetes", value_parser = non_empty)]
    pub cluster_id: String,

    /// Mesh trust domain (cluster.local is sent as empty, as istiod does). Default: the mesh
    /// config's `trustDomain`, else cluster.local.
    #[arg(long, env = "AMBIENTD_TRUST_DOMAIN", value_parser = dns_name)]
    pub trust_domain: Option<String>,

    /// Cluster domain suffix of Service hostnames.
    #[arg(long, env = "AMBIENTD_DOMAIN", default_value = "cluster.local", value_parser = dns_name)]
    pub domain: String,

    /// Namespace ambientd runs in; its topology.istio.io/network label names the network.
    #[arg(long, env = "AMBIENTD_SYSTEM_NAMESPACE", default_value = "istio-system", value_parser = non_empty)]
    pub system_namespace: String,

    /// meshConfig.rootNamespace: AuthorizationPolicies and PeerAuthentications here apply to
    /// the whole mesh, and debug callers must be in it. Default: the mesh config's
    /// `rootNamespace`, else the system namespace (as istiod).
    #[arg(long, env = "AMBIENTD_ROOT_NAMESPACE", value_parser = non_empty)]
    pub root_namespace: Option<String>,

    /// istiod revision: Istio config objects whose `istio.io/rev` label names another revision
    /// are ignored; unlabelled ones are served by every revision (istiod's `LabelsInRevision`).
    #[arg(long, env = "AMBIENTD_REVISION", default_value = "default", value_parser = non_empty)]
    pub revision: String,

    /// istiod's PILOT_AUTO_ALLOW_WAYPOINT_POLICY: each waypoint with instance pods gets an ALLOW
    /// policy for their identities (`<ns>/istio_allow_waypoint_<ns>_<name>`), listed by the
    /// workloads behind it, so their ALLOW policies need not name the waypoint.
    #[arg(
        long,
        env = "AMBIENTD_AUTO_ALLOW_WAYPOINT_POLICY",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub auto_allow_waypoint_policy: bool,

    /// istiod's AMBIENT_ENABLE_DRY_RUN_AUTHORIZATION_POLICY: AuthorizationPolicies annotated
    /// `istio.io/dry-run: "true"` are sent to ztunnel marked dry-run (it logs what they would
    /// decide and enforces nothing) instead of not at all.
    #[arg(
        long,
        env = "AMBIENTD_DRY_RUN_AUTHORIZATION_POLICY",
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub dry_run_authorization_policy: bool,

    /// istiod's PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES: Kubernetes Services select
    /// WorkloadEntries by their labels (`false`: only ServiceEntries do).
    #[arg(
        long,
        env = "AMBIENTD_K8S_SELECT_WORKLOAD_ENTRIES",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub k8s_select_workload_entries: bool,

    /// istiod's PILOT_ENABLE_SERVICEENTRY_SELECT_PODS: ServiceEntries with a `workloadSelector`
    /// select pods (`false`: only WorkloadEntries).
    #[arg(
        long,
        env = "AMBIENTD_SERVICE_ENTRY_SELECT_PODS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub service_entry_select_pods: bool,

    /// istiod's PILOT_ENABLE_IP_AUTOALLOCATE: the leader allocates addresses to ServiceEntries
    /// without `spec.addresses` (in their `status.addresses`), and their Services carry them
    /// (`false`: neither).
    #[arg(
        long,
        env = "AMBIENTD_IP_AUTOALLOCATE",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub ip_autoallocate: bool,

    /// istiod's PILOT_IP_AUTOALLOCATE_IPV4_PREFIX: the range auto-allocated IPv4 addresses come
    /// from.
    #[arg(long, env = "AMBIENTD_IP_AUTOALLOCATE_IPV4_PREFIX", default_value = crate::kube::ip_allocate::DEFAULT_IPV4_PREFIX)]
    pub ip_autoallocate_ipv4_prefix: String,

    /// istiod's PILOT_IP_AUTOALLOCATE_IPV6_PREFIX: the range auto-allocated IPv6 addresses come
    /// from.
    #[arg(long, env = "AMBIENTD_IP_AUTOALLOCATE_IPV6_PREFIX", default_value = crate::kube::ip_allocate::DEFAULT_IPV6_PREFIX)]
    pub ip_autoallocate_ipv6_prefix: String,

    /// Quiet period before a batch of changes is pushed (istiod's PILOT_DEBOUNCE_AFTER is
    /// 100ms); `0` pushes as soon as queued events are applied. The default is 0: measured
    /// (BENCHMARKS.md, T4/T8), a quiet period only adds latency, since events queued while the
    /// index works are published together and slow streams coalesce anyway.
    #[arg(long, env = "AMBIENTD_DEBOUNCE_AFTER", default_value = "0", value_parser = short_duration)]
    pub debounce_after: Duration,

    /// Longest a change waits for the quiet period (istiod's PILOT_DEBOUNCE_MAX is 10s).
    #[arg(long, env = "AMBIENTD_DEBOUNCE_MAX", default_value = "1s", value_parser = short_duration)]
    pub debounce_max: Duration,

    /// Each xDS stream ends after about this long (±10 %) so ztunnels reconnect and spread over
    /// the replicas; unchanged resources are not re-sent. `0` keeps streams open (istiod's
    /// MaxServerConnectionAge default is 30m).
    #[arg(long, env = "AMBIENTD_MAX_CONNECTION_AGE", default_value = "30m", value_parser = short_duration)]
    pub max_connection_age: Duration,

    /// A proxy that, while changes wait for it, reads or acknowledges no response for this
    /// long is dropped with a log line, so a stuck client's buffers stay bounded. `0` never
    /// drops.
    #[arg(long, env = "AMBIENTD_STREAM_IDLE_TIMEOUT", default_value = "5m", value_parser = short_duration)]
    pub stream_idle_timeout: Duration,

    /// A reconnecting proxy that holds names this replica does not have (yet) keeps them this
    /// long; those that still do not exist then are removed. A proxy that moves from a replica
    /// that died to one a few events behind it so never loses what was just created. `0`
    /// removes them with the first response.
    #[arg(long, env = "AMBIENTD_RECONNECT_REMOVAL_GRACE", default_value = "2s", value_parser = short_duration)]
    pub reconnect_removal_grace: Duration,

    /// Node-scoped pushes: a ztunnel (metadata NODE_NAME) gets its own node's workloads, the
    /// services they are part of, the waypoints those use and the waypoints' workloads, and
    /// everything else on demand (ztunnel's XDS_ON_DEMAND=true; a wildcard ztunnel never asks
    /// for what it lacks). Authorization stays complete.
    #[arg(long, env = "AMBIENTD_SCOPE_TO_NODE", default_value_t = false)]
    pub scope_to_node: bool,

    /// How often the key sets of RequestAuthentications' `jwksUri`s are fetched again
    /// (istiod's PILOT_JWT_PUB_KEY_REFRESH_INTERVAL). A failed fetch is retried sooner.
    #[arg(long, env = "AMBIENTD_JWKS_REFRESH_INTERVAL", default_value = "20m", value_parser = positive_duration)]
    pub jwks_refresh_interval: Duration,

    /// On SIGTERM: stop accepting, end every xDS stream (ztunnels get GOAWAY and reconnect to
    /// another replica), let certificate requests in flight finish, and exit within this long.
    /// Keep it under the pod's terminationGracePeriodSeconds (30s by default).
    #[arg(long, env = "AMBIENTD_SHUTDOWN_GRACE", default_value = "10s", value_parser = short_duration)]
    pub shutdown_grace: Duration,

    /// Log filter: a level (info, debug, ...) or a tracing directive list (ambientd=debug,info).
    #[arg(long, env = "AMBIENTD_LOG_LEVEL", default_value = "info", value_parser = log_filter)]
    pub log_level: String,

    /// Cluster mode: elect one leader among the replicas (a Lease in the system namespace) to
    /// write the root ConfigMaps. `false`: this replica always writes (run only one).
    #[arg(
        long,
        env = "AMBIENTD_LEADER_ELECTION",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub leader_election: bool,

    /// Name of the leader-election Lease (coordination.k8s.io/v1) in the system namespace.
    #[arg(long, env = "AMBIENTD_LEADER_LEASE", default_value = crate::kube::leader::DEFAULT_LEASE_NAME, value_parser = non_empty)]
    pub leader_lease: String,

    /// How long a leader that stops renewing keeps the Lease (whole seconds): the longest
    /// failover.
    #[arg(long, env = "AMBIENTD_LEADER_LEASE_DURATION", default_value = "15s", value_parser = short_duration)]
    pub leader_lease_duration: Duration,

    /// The leader renews this long before its Lease would expire (whole seconds, less than
    /// --leader-lease-duration).
    #[arg(long, env = "AMBIENTD_LEADER_RENEW_GRACE", default_value = "5s", value_parser = short_duration)]
    pub leader_renew_grace: Duration,

    /// Cluster mode: the leader writes the root bundle as ConfigMap istio-ca-root-cert into
    /// every selected namespace (as istiod does).
    #[arg(
        long,
        env = "AMBIENTD_ROOT_CONFIGMAPS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub root_configmaps: bool,

    /// Cluster mode: keep the CA in Secrets (cacerts if present, else istio-ca-secret, created
    /// when absent) so every replica signs with the same root. `false`, or --cacerts, keeps
    /// it in files as in manifests mode.
    #[arg(
        long,
        env = "AMBIENTD_CA_SECRETS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub ca_secrets: bool,

    /// Cluster mode: the leader writes status conditions as istiod does: ZtunnelAccepted on
    /// AuthorizationPolicies, istio.io/WaypointBound on Services, ServiceEntries and
    /// WorkloadEntries. Turn off when istiod (PILOT_ENABLE_AMBIENT status) writes them.
    #[arg(
        long,
        env = "AMBIENTD_WRITE_STATUS",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub write_status: bool,

    /// Status writes: API calls per second (reads and patches together; bursts of twice as
    /// many), so a mass change drains at a steady pace.
    #[arg(
        long,
        env = "AMBIENTD_STATUS_QPS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..),
        value_name = "N"
    )]
    pub status_qps: u32,

    /// Cluster mode: the leader deploys each waypoint (a Gateway of class istio-waypoint): its
    /// ServiceAccount, Deployment and Service, and writes the Gateway's status, as istiod's
    /// gateway controllers do. Turn off when istiod runs beside ambientd.
    #[arg(
        long,
        env = "AMBIENTD_WAYPOINT_CONTROLLER",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub waypoint_controller: bool,

    /// The waypoint proxy image (Istio's proxyv2: pilot-agent and Envoy).
    #[arg(
        long,
        env = "AMBIENTD_WAYPOINT_IMAGE",
        default_value = crate::kube::waypoints::DEFAULT_IMAGE,
        value_parser = non_empty,
        value_name = "IMAGE"
    )]
    pub waypoint_image: String,

    /// Replicas of each waypoint Deployment; unset leaves the field out, as istiod does (1,
    /// or whatever an autoscaler sets).
    #[arg(long, env = "AMBIENTD_WAYPOINT_REPLICAS", value_name = "N")]
    pub waypoint_replicas: Option<i32>,

    /// The waypoint container's resources as JSON (`{"requests": {...}, "limits": {...}}`);
    /// unset: istiod's defaults (requests 100m CPU and 128Mi, limits 2 CPUs and 1Gi).
    #[arg(long, env = "AMBIENTD_WAYPOINT_RESOURCES", value_parser = json_object, value_name = "JSON")]
    pub waypoint_resources: Option<serde_json::Value>,

    /// The address waypoints dial for xDS and certificates: ambientd's Service on 15012.
    /// Default: istiod.<system namespace>.svc:15012 (the chart names its Service istiod).
    #[arg(
        long,
        env = "AMBIENTD_WAYPOINT_DISCOVERY_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub waypoint_discovery_address: Option<String>,

    #[command(flatten)]
    pub ca: crate::ca::CaArgs,
}

fn label_selector(value: &str) -> Result<crate::kube::cluster::LabelSelector, String> {
    value.parse()
}

fn json_object(value: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(object @ serde_json::Value::Object(_)) => Ok(object),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

fn non_empty(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(value.to_string())
    }
}

fn dns_name(value: &str) -> Result<String, String> {
    let valid = !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(format!("{value:?} is not a DNS name"))
    }
}

/// `0`, `5ms`, `100ms`, `2s`, `30m`, `1h`.
fn short_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let bad = || format!("{value:?} is not a duration such as 0, 5ms, 2s, 30m or 1h");
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1_000)
    } else if let Some(m) = value.strip_suffix('m') {
        (m, 60_000)
    } else if let Some(h) = value.strip_suffix('h') {
        (h, 3_600_000)
    } else if value == "0" {
        ("0", 1)
    } else {
        return Err(bad());
    };
    let number: u64 = number.parse().map_err(|_| bad())?;
    Ok(Duration::from_millis(number.saturating_mul(scale)))
}

/// [`short_duration`], but not zero.
fn positive_duration(value: &str) -> Result<Duration, String> {
    match short_duration(value)? {
        d if d.is_zero() => Err(format!("{value:?} must be more than 0")),
        d => Ok(d),
    }
}

fn log_filter(value: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(value)
        .map(|_| value.to_string())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

/// Where the mesh is read from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A manifests directory, followed as it changes.
    Manifests(PathBuf),
    /// A Kubernetes cluster, watched.
    Cluster(crate::kube::cluster::ClusterConfig),
}

/// Everything `app::start` needs, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub source: Source,
    pub xds_address: SocketAddr,
    pub debug_address: SocketAddr,
    pub settings: Settings,
    /// The CA and the TLS listener (15012); `None` serves plaintext xDS only.
    pub ca: Option<crate::ca::CaConfig>,
    /// Changes the log filter at runtime (`/logging`); `None` when logging is not ours.
    pub log_filter: Option<crate::debug::LogControl>,
    /// Gathering of index changes into one push.
    pub debounce: crate::push::Debounce,
    /// Streams end after about this long so proxies rebalance; `None` keeps them open.
    pub max_stream_age: Option<Duration>,
    /// Streams whose proxy reads nothing for this long are dropped; `None` never.
    pub stream_idle_timeout: Option<Duration>,
    /// How long a reconnecting proxy keeps names this replica lacks (`--reconnect-removal-grace`).
    pub reconnect_removal_grace: Duration,
    /// Writes to the cluster (leader election, CA Secrets, root ConfigMaps); cluster mode
    /// only. `None` writes nothing.
    pub writes: Option<crate::kube::writes::ClusterWrites>,
    /// The longest a shutdown waits for servers to drain.
    pub shutdown_grace: Duration,
    /// Node-scoped pushes (see `--scope-to-node`).
    pub scope_to_node: bool,
    /// The mesh config file, followed while running; `None` without `--mesh-config`.
    pub mesh_config: Option<crate::kube::mesh_config::MeshFile>,
    /// How often the mesh config file is read again.
    pub mesh_poll: Duration,
    /// The JWKS fetcher (RequestAuthentications' `jwksUri`s).
    pub jwks: crate::kube::jwks::JwksConfig,
}

impl Config {
    /// A config for `dir` with every other value at its default and listeners on
    /// `127.0.0.1:0`: what tests and embedders start from.
    pub fn local(dir: impl Into<PathBuf>) -> Self {
        Config {
            source: Source::Manifests(dir.into()),
            xds_address: ([127, 0, 0, 1], 0).into(),
            debug_address: ([127, 0, 0, 1], 0).into(),
            settings: Settings::default(),
            ca: None,
            log_filter: None,
            debounce: crate::push::Debounce::default(),
            max_stream_age: None,
            stream_idle_timeout: None,
            reconnect_removal_grace: Duration::ZERO,
            writes: None,
            shutdown_grace: Duration::from_secs(10),
            scope_to_node: false,
            mesh_config: None,
            mesh_poll: crate::kube::mesh_config::POLL,
            jwks: crate::kube::jwks::JwksConfig::default(),
        }
    }
}

impl Config {
    /// Like [`Config::local`], over a cluster.
    pub fn cluster(cluster: crate::kube::cluster::ClusterConfig) -> Self {
        Config {
            source: Source::Cluster(cluster),
            ..Config::local("")
        }
    }
}

/// The cluster source's config from its flags.
fn cluster_source(
    args: &ServeArgs,
    mesh: Option<&crate::kube::cluster::MeshSettings>,
) -> Result<crate::kube::cluster::ClusterConfig, String> {
    use crate::kube::cluster::{ClusterConfig, DiscoverySelectors};
    let discovery_selectors = match mesh {
        Some(mesh) => mesh.discovery_selectors.clone(),
        None => DiscoverySelectors(args.discovery_selectors.clone()),
    };
    Ok(ClusterConfig {
        kubeconfig: args.kubeconfig.clone(),
        context: args.kube_context.clone(),
        discovery_selectors,
        watch_timeout: args.kube_watch_timeout,
        ..ClusterConfig::default()
    })
}

/// What a cluster-mode replica writes, from its flags.
fn cluster_writes(args: &ServeArgs) -> Result<crate::kube::writes::ClusterWrites, String> {
    use crate::kube::leader::LeaderConfig;
    let leader = if args.leader_election {
        let leader = LeaderConfig {
            lease_name: args.leader_lease.clone(),
            lease_duration: args.leader_lease_duration,
            renew_grace: args.leader_renew_grace,
            ..LeaderConfig::new(&args.system_namespace)
        };
        leader.validate().map_err(|e| e.to_string())?;
        Some(leader)
    } else {
        None
    };
    Ok(crate::kube::writes::ClusterWrites {
        leader,
        ca_secrets: args.ca_secrets && args.ca.cacerts.is_none(),
        root_configmaps: args.root_configmaps,
        status: args.write_status,
        ip_autoallocate: match args.ip_autoallocate {
            true => Some(
                crate::kube::ip_allocate::Prefixes::parse(
                    &args.ip_autoallocate_ipv4_prefix,
                    &args.ip_autoallocate_ipv6_prefix,
                )
                .map_err(|e| {
                    format!("--ip-autoallocate-ipv4-prefix/--ip-autoallocate-ipv6-prefix: {e}")
                })?,
            ),
            false => None,
        },
        status_qps: args.status_qps,
        ..crate::kube::writes::ClusterWrites::new(&args.system_namespace)
    })
}

impl TryFrom<ServeArgs> for Config {
    type Error = String;

    fn try_from(args: ServeArgs) -> Result<Self, String> {
        let mesh = match &args.mesh_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--mesh-config {}: {e}", path.display()))?;
                let mesh = crate::kube::cluster::MeshSettings::parse(&text)
                    .map_err(|e| format!("--mesh-config {}: {e}", path.display()))?;
                if let Some(domain) = &mesh.trust_domain {
                    dns_name(domain).map_err(|e| {
                        format!("--mesh-config {}: trustDomain: {e}", path.display())
                    })?;
                }
                Some(mesh)
            }
            None => None,
        };
        let source = match &args.manifests {
            Some(dir) => {
                if mesh
                    .as_ref()
                    .is_some_and(|m| !m.discovery_selectors.is_empty())
                {
                    tracing::warn!(
                        "the mesh config's discoverySelectors apply to a cluster only: a \
                         manifests directory is read whole"
                    );
                }
                Source::Manifests(dir.clone())
            }
            None => Source::Cluster(cluster_source(&args, mesh.as_ref())?),
        };
        let trust_domain = args
            .trust_domain
            .clone()
            .or_else(|| mesh.as_ref().and_then(|m| m.trust_domain.clone()))
            .unwrap_or_else(|| "cluster.local".into());
        let root_namespace = args
            .root_namespace
            .clone()
            .or_else(|| mesh.as_ref().and_then(|m| m.root_namespace.clone()))
            .unwrap_or_else(|| args.system_namespace.clone());
        let writes = match &source {
            Source::Manifests(_) => None,
            Source::Cluster(_) => {
                let mut writes = cluster_writes(&args)?;
                writes.waypoints = None;
                if args.waypoint_controller {
                    if args.waypoint_replicas.is_some_and(|r| r < 0) {
                        return Err("--waypoint-replicas: must not be negative".into());
                    }
                    writes.waypoints = Some(crate::kube::waypoints::render::ProxySettings {
                        image: args.waypoint_image.clone(),
                        image_pull_policy: None,
                        istiod_address: args.waypoint_discovery_address.clone().unwrap_or_else(
                            || format!("istiod.{}.svc:15012", args.system_namespace),
                        ),
                        cluster_id: args.cluster_id.clone(),
                        trust_domain: trust_domain.clone(),
                        domain: args.domain.clone(),
                        mesh_id: trust_domain.clone(),
                        network: String::new(),
                        revision: args.revision.clone(),
                        replicas: args.waypoint_replicas,
                        resources: args.waypoint_resources.clone(),
                    });
                }
                Some(writes)
            }
        };
        let ca = Some(args.ca.into_config()?);
        let mesh_config = args
            .mesh_config
            .clone()
            .zip(mesh.clone())
            .map(|(path, settings)| crate::kube::mesh_config::MeshFile { path, settings });
        Ok(Config {
            writes,
            source,
            ca,
            xds_address: args.xds_address,
            debug_address: args.debug_address,
            settings: Settings {
                cluster_id: args.cluster_id,
                trust_domain,
                domain: args.domain,
                system_namespace: args.system_namespace,
                root_namespace,
                revision: args.revision,
                service_entry_visibility: mesh
                    .and_then(|m| m.service_entry_visibility)
                    .map(std::sync::Arc::new),
                auto_allow_waypoint_policy: args.auto_allow_waypoint_policy,
                dry_run_authorization: args.dry_run_authorization_policy,
                k8s_select_workload_entries: args.k8s_select_workload_entries,
                service_entry_select_pods: args.service_entry_select_pods,
                ip_autoallocate: args.ip_autoallocate,
            },
            log_filter: None,
            debounce: crate::push::Debounce {
                after: args.debounce_after,
                max: args.debounce_max,
            },
            max_stream_age: Some(args.max_connection_age).filter(|a| !a.is_zero()),
            stream_idle_timeout: Some(args.stream_idle_timeout).filter(|i| !i.is_zero()),
            reconnect_removal_grace: args.reconnect_removal_grace,
            shutdown_grace: args.shutdown_grace,
            scope_to_node: args.scope_to_node,
            mesh_config,
            mesh_poll: crate::kube::mesh_config::POLL,
            jwks: crate::kube::jwks::JwksConfig {
                refresh: args.jwks_refresh_interval,
            },
        })
    }
}

#[cfg(test)]
mod tests;
