//! Prometheus metrics, named as istiod names them so existing dashboards keep working, plus a
//! few of ambientd's own (source health, object counts, memory). No global registry: one
//! [`Metrics`] is created by the app and shared by `Arc` with whoever records.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::{EncodeLabelSet, text::encode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::discovery::names::TypeKind;

/// How many recent push latencies the debug page charts.
const RECENT_PUSHES: usize = 120;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// istiod's short type names: `wds` (Address) and `wads` (Authorization).
    pub r#type: String,
}

/// The `error` label of istiod's CA error counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

impl TypeLabel {
    pub fn of(kind: TypeKind) -> Self {
        TypeLabel {
            r#type: match kind {
                TypeKind::Address => "wds",
                TypeKind::Authorization => "wads",
            }
            .to_string(),
        }
    }

    pub fn named(name: &str) -> Self {
        TypeLabel {
            r#type: name.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// A source error's object kind and reason (`server_error`, `throttled`, `forbidden`,
/// `timeout`, `connection`, `decode`, `gone`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceErrorLabel {
    pub kind: String,
    pub reason: String,
}

/// A TokenReview's outcome (`authenticated`, `rejected`, `unavailable`, `timeout`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabel {
    pub version: String,
}

/// A status write's object kind and outcome (`written`, `unchanged`, `gone`, `conflict`,
/// `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub kind: String,
    pub result: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~13 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

fn size_histogram() -> Histogram {
    // 64 B .. ~16 MiB.
    Histogram::new(exponential_buckets(64.0, 4.0, 10))
}

/// Every metric ambientd exports.
pub struct Metrics {
    registry: Registry,
    /// `pilot_xds`: connected xDS clients.
    pub xds_clients: Family<VersionLabel, Gauge>,
    /// `pilot_xds_pushes{type}`: responses sent.
    pub pushes: Family<TypeLabel, Counter>,
    /// `pilot_xds_push_time{type}`: time to compute and queue one response.
    pub push_time: Family<TypeLabel, Histogram, fn() -> Histogram>,
    /// `pilot_xds_config_size_bytes{type}`: encoded size of one response's resources.
    pub config_size: Family<TypeLabel, Histogram, fn() -> Histogram>,
    /// `pilot_proxy_convergence_time`: from a snapshot's publication to a proxy's response.
    pub convergence_time: Histogram,
    /// `pilot_debounce_time`: from the first event of a batch to the snapshot's publication.
    pub debounce_time: Histogram,
    /// `pilot_push_triggers{type}`: why pushes happened (`ambient` index changes, `request`).
    pub push_triggers: Family<TypeLabel, Counter>,
    /// `pilot_total_xds_rejects{type}`: NACKs received.
    pub rejects: Family<TypeLabel, Counter>,
    /// `pilot_xds_expired_nonce{type}`: requests carrying a superseded nonce.
    pub expired_nonce: Family<TypeLabel, Counter>,
    /// `pilot_services`: Services (Kubernetes and ServiceEntry hosts) served.
    pub services: Gauge,
    /// CA (`citadel_server_*`), recorded by the CA service.
    pub csr_count: Counter,
    pub auth_failures: Counter,
    pub certs_issued: Counter,
    /// `citadel_server_csr_sign_err_count{error}`: CSRs that failed to sign, by istiod's error
    /// type (`CSR_ERROR`, `TTL_ERROR`, `CERT_GEN_ERROR`).
    pub sign_errors: Family<ErrorLabel, Counter>,
    /// `ambientd_csr_refused{reason}`: CSRs refused by the limits on requests in flight
    /// (`caller`: its caller's; `total`: the CA's), docs/ca.md "Limits".
    pub csr_refused: Family<ReasonLabel, Counter>,
    /// `ambientd_xds_refused{reason}`: xDS streams ended by a limit (`subscribed_names`),
    /// docs/xds.md "Limits".
    pub xds_refused: Family<ReasonLabel, Counter>,
    /// `citadel_server_root_cert_expiry_timestamp`: the root's NotAfter (Unix seconds); 0 until
    /// the CA starts.
    pub root_expiry: Gauge<f64, AtomicU64>,
    /// `citadel_server_root_cert_expiry_seconds`: seconds until then, refreshed on each scrape.
    root_expiry_seconds: Gauge<f64, AtomicU64>,
    /// `citadel_server_cert_chain_expiry_timestamp`: the CA (signing) certificate's NotAfter,
    /// as istiod's `ExtractCACertExpiryTimestamp`; 0 until the CA starts. For a self-signed CA
    /// it is the root's.
    pub chain_expiry: Gauge<f64, AtomicU64>,
    /// `citadel_server_cert_chain_expiry_seconds`: seconds until then, refreshed on each scrape.
    chain_expiry_seconds: Gauge<f64, AtomicU64>,
    /// `ambientd_leader`: 1 while this replica holds the leader Lease (or runs without
    /// election and writes), else 0.
    pub leader: Gauge,
    /// ambientd: objects held per kind, resources served per type, snapshot generation.
    pub objects: Family<KindLabel, Gauge>,
    pub resources: Family<TypeLabel, Gauge>,
    pub generation: Gauge,
    /// ambientd: source health.
    pub source_restarts: Counter,
    pub source_last_sync: Gauge<f64, AtomicU64>,
    /// ambientd: watch errors per kind and reason, and whether each kind's watch is failing
    /// (1) or working (0): while any is 1, the snapshot served may be stale.
    pub source_errors: Family<SourceErrorLabel, Counter>,
    pub source_failing: Family<KindLabel, Gauge>,
    /// ambientd: TokenReviews the CA asked the API server for, by outcome (cache hits are not
    /// counted).
    pub token_reviews: Family<ResultLabel, Counter>,
    /// ambientd: status conditions the leader wrote (or found right, or failed to write), and
    /// objects waiting to be written.
    pub status_writes: Family<StatusLabel, Counter>,
    pub status_pending: Gauge,
    /// istiod's JWKS resolver: fetches of RequestAuthentication key sets (`kube::jwks`).
    pub jwks_fetch_success: Counter,
    pub jwks_fetch_fail: Counter,
    /// Resident memory, refreshed on each scrape.
    pub resident_memory: Gauge,
    started: SystemTime,
    recent: Mutex<VecDeque<(SystemTime, f64)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let xds_clients = Family::<VersionLabel, Gauge>::default();
        let pushes = Family::<TypeLabel, Counter>::default();
        let push_time = Family::<TypeLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let config_size = Family::<TypeLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            size_histogram as fn() -> Histogram,
        );
        let convergence_time = latency_histogram();
        let debounce_time = latency_histogram();
        let push_triggers = Family::<TypeLabel, Counter>::default();
        let rejects = Family::<TypeLabel, Counter>::default();
        let expired_nonce = Family::<TypeLabel, Counter>::default();
        let services = Gauge::default();
        let csr_count = Counter::default();
        let auth_failures = Counter::default();
        let certs_issued = Counter::default();
        let sign_errors = Family::<ErrorLabel, Counter>::default();
        let csr_refused = Family::<ReasonLabel, Counter>::default();
        let xds_refused = Family::<ReasonLabel, Counter>::default();
        let root_expiry = Gauge::<f64, AtomicU64>::default();
        let root_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        let chain_expiry = Gauge::<f64, AtomicU64>::default();
        let chain_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        let leader = Gauge::default();
        let objects = Family::<KindLabel, Gauge>::default();
        let resources = Family::<TypeLabel, Gauge>::default();
        let generation = Gauge::default();
        let source_restarts = Counter::default();
        let source_last_sync = Gauge::<f64, AtomicU64>::default();
        let source_errors = Family::<SourceErrorLabel, Counter>::default();
        let source_failing = Family::<KindLabel, Gauge>::default();
        let token_reviews = Family::<ResultLabel, Counter>::default();
        let resident_memory = Gauge::default();
        let status_writes = Family::<StatusLabel, Counter>::default();
        let status_pending = Gauge::default();
        let jwks_fetch_success = Counter::default();
        let jwks_fetch_fail = Counter::default();

        // Counters get `_total` appended by OpenMetrics; istiod's names are kept as the stem.
        registry.register("pilot_xds", "Connected xDS clients", xds_clients.clone());
        registry.register(
            "pilot_xds_pushes",
            "xDS responses sent, by type",
            pushes.clone(),
        );
        registry.register(
            "pilot_xds_push_time",
            "Seconds to compute and queue one xDS response, by type",
            push_time.clone(),
        );
        registry.register(
            "pilot_xds_config_size_bytes",
            "Bytes of resources in one xDS response, by type",
            config_size.clone(),
        );
        registry.register(
            "pilot_proxy_convergence_time",
            "Seconds from a snapshot's publication to a proxy's response",
            convergence_time.clone(),
        );
        registry.register(
            "pilot_debounce_time",
            "Seconds from the first event of a batch to the snapshot's publication",
            debounce_time.clone(),
        );
        registry.register("pilot_push_triggers", "Push causes", push_triggers.clone());
        registry.register(
            "pilot_total_xds_rejects",
            "NACKs received, by type",
            rejects.clone(),
        );
        registry.register(
            "pilot_xds_expired_nonce",
            "Requests with a superseded nonce, by type",
            expired_nonce.clone(),
        );
        registry.register("pilot_services", "Services served", services.clone());
        registry.register(
            "citadel_server_csr_count",
            "CSRs received",
            csr_count.clone(),
        );
        registry.register(
            "citadel_server_authentication_failure_count",
            "CA requests that failed authentication",
            auth_failures.clone(),
        );
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "Certificates issued",
            certs_issued.clone(),
        );
        registry.register(
            "citadel_server_csr_sign_err_count",
            "CSRs that failed to sign, by error type",
            sign_errors.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_timestamp",
            "Unix time the root certificate expires",
            root_expiry.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_seconds",
            "Seconds until the root certificate expires (negative once expired)",
            root_expiry_seconds.clone(),
        );
        registry.register(
            "citadel_server_cert_chain_expiry_timestamp",
            "Unix time the CA certificate chain expires",
            chain_expiry.clone(),
        );
        registry.register(
            "citadel_server_cert_chain_expiry_seconds",
            "Seconds until the CA certificate chain expires (negative once expired)",
            chain_expiry_seconds.clone(),
        );
        registry.register(
            "ambientd_csr_refused",
            "Certificate requests refused by a limit on requests in flight, by limit",
            csr_refused.clone(),
        );
        registry.register(
            "ambientd_xds_refused",
            "xDS streams ended by a limit, by limit",
            xds_refused.clone(),
        );
        registry.register(
            "ambientd_leader",
            "1 while this replica is the leader that writes to the cluster",
            leader.clone(),
        );
        registry.register(
            "ambientd_objects",
            "Objects held by the index, by kind",
            objects.clone(),
        );
        registry.register(
            "ambientd_resources",
            "Resources served, by type",
            resources.clone(),
        );
        registry.register(
            "ambientd_snapshot_generation",
            "Generation of the latest published snapshot",
            generation.clone(),
        );
        registry.register(
            "ambientd_source_restarts",
            "Watch restarts (errors, relists) of the sources",
            source_restarts.clone(),
        );
        registry.register(
            "ambientd_source_last_sync_timestamp",
            "Unix time a source last delivered a change or relist",
            source_last_sync.clone(),
        );
        registry.register(
            "ambientd_source_errors",
            "Watch errors of the Kubernetes source, by kind and reason (gone: a forced re-list)",
            source_errors.clone(),
        );
        registry.register(
            "ambientd_source_failing",
            "1 while the kind's watch is failing (the snapshot served may be stale), else 0",
            source_failing.clone(),
        );
        registry.register(
            "ambientd_token_reviews",
            "TokenReviews sent for the CA, by result (authenticated, rejected, unavailable, timeout)",
            token_reviews.clone(),
        );
        registry.register(
            "ambientd_status_writes",
            "Status conditions handled by the leader, by object kind and result",
            status_writes.clone(),
        );
        registry.register(
            "ambientd_status_pending",
            "Objects whose status condition waits to be written",
            status_pending.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_success",
            "Total number of successfully network fetch by pilot jwks resolver",
            jwks_fetch_success.clone(),
        );
        registry.register(
            "pilot_jwks_resolver_network_fetch_fail",
            "Total number of failed network fetch by pilot jwks resolver",
            jwks_fetch_fail.clone(),
        );
        registry.register(
            "ambientd_resident_memory_bytes",
            "Resident set size of the process",
            resident_memory.clone(),
        );
        Metrics {
            registry,
            xds_clients,
            pushes,
            push_time,
            config_size,
            convergence_time,
            debounce_time,
            push_triggers,
            rejects,
            expired_nonce,
            services,
            csr_count,
            auth_failures,
            certs_issued,
            sign_errors,
            csr_refused,
            xds_refused,
            root_expiry,
            root_expiry_seconds,
            chain_expiry,
            chain_expiry_seconds,
            leader,
            objects,
            resources,
            generation,
            source_restarts,
            source_last_sync,
            source_errors,
            source_failing,
            token_reviews,
            status_writes,
            status_pending,
            jwks_fetch_success,
            jwks_fetch_fail,
            resident_memory,
            started: SystemTime::now(),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Records one response sent: how long it took to compute and queue, and its size.
    pub fn record_push(&self, kind: TypeKind, took: Duration, bytes: usize) {
        let label = TypeLabel::of(kind);
        self.pushes.get_or_create(&label).inc();
        self.push_time
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        self.config_size.get_or_create(&label).observe(bytes as f64);
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_back((SystemTime::now(), took.as_secs_f64()));
        while recent.len() > RECENT_PUSHES {
            recent.pop_front();
        }
    }

    /// Records how long a proxy took to receive a published snapshot.
    pub fn record_convergence(&self, took: Duration) {
        self.convergence_time.observe(took.as_secs_f64());
    }

    /// Recent convergence latencies in seconds, oldest first, for the debug page.
    pub fn recent_pushes(&self) -> Vec<f64> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().map(|(_, s)| *s).collect()
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed().unwrap_or_default()
    }

    /// The Prometheus text exposition (format 0.0.4), with istiod's exact names.
    /// Counts a CSR that failed to sign, with istiod's error type.
    pub fn record_csr_refused(&self, reason: &str) {
        self.csr_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn record_xds_refused(&self, reason: &str) {
        self.xds_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn record_sign_error(&self, error_type: &str) {
        self.sign_errors
            .get_or_create(&ErrorLabel {
                error: error_type.to_string(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        if let Some(rss) = resident_memory_bytes() {
            self.resident_memory.set(rss as i64);
        }
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        for (expiry, seconds) in [
            (&self.root_expiry, &self.root_expiry_seconds),
            (&self.chain_expiry, &self.chain_expiry_seconds),
        ] {
            let expiry = expiry.get();
            if expiry > 0.0 {
                seconds.set(expiry - now);
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        prometheus_text(&out)
    }
}

/// The content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Counters whose istiod names end in `_total` themselves (prometheus-client refuses such a
/// registered name): they keep the suffix it adds.
const ISTIOD_TOTALS: [&str; 2] = [
    "pilot_jwks_resolver_network_fetch_success",
    "pilot_jwks_resolver_network_fetch_fail",
];

/// Turns prometheus-client's OpenMetrics text into the Prometheus text format istiod serves:
/// counters keep their registered names (`pilot_xds_pushes`, not `pilot_xds_pushes_total`), so
/// dashboards and alerts written for istiod work unchanged; `# UNIT` and `# EOF` go.
fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut counter: Option<String> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // Their HELP and TYPE name the samples, `_total` included.
        if let Some(name) = ISTIOD_TOTALS.iter().find(|name| {
            line.strip_prefix("# HELP ")
                .or_else(|| line.strip_prefix("# TYPE "))
                .and_then(|rest| rest.strip_prefix(**name))
                .is_some_and(|rest| rest.starts_with(' '))
        }) {
            out.push_str(&line.replacen(name, &format!("{name}_total"), 1));
            out.push('\n');
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            counter = rest
                .strip_suffix(" counter")
                .filter(|name| !ISTIOD_TOTALS.contains(name))
                .map(|name| format!("{name}_total"));
        } else if !line.starts_with('#')
            && let Some(total) = &counter
            && let Some(rest) = line.strip_prefix(total.as_str())
            && (rest.starts_with('{') || rest.starts_with(' '))
        {
            out.push_str(&total[..total.len() - "_total".len()]);
            out.push_str(rest);
            out.push('\n');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Resident set size from `/proc/self/statm`, where there is one.
pub fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_istiods_names() {
        let metrics = Metrics::new();
        metrics.record_push(TypeKind::Address, Duration::from_millis(1), 100);
        metrics.csr_count.inc();
        let text = metrics.encode();
        assert!(text.contains("# TYPE pilot_xds_pushes counter\n"), "{text}");
        assert!(
            text.contains("pilot_xds_pushes{type=\"wds\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("citadel_server_csr_count 1\n"), "{text}");
        // No `_total` is added: only names that are istiod's with it have it.
        for line in text.lines().filter(|l| l.contains("_total")) {
            assert!(line.contains("jwks_resolver_network_fetch_"), "{line}");
            assert!(!line.contains("_total_total"), "{line}");
        }
        metrics.jwks_fetch_success.inc();
        let text = metrics.encode();
        assert!(
            text.contains(
                "# TYPE pilot_jwks_resolver_network_fetch_success_total counter\n\
                 pilot_jwks_resolver_network_fetch_success_total 1\n"
            ),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
        // Histograms keep their series.
        assert!(text.contains("pilot_xds_push_time_bucket{"), "{text}");
    }

    #[test]
    fn ca_metrics_have_istiods_names_and_labels() {
        let metrics = Metrics::new();
        metrics.record_sign_error("TTL_ERROR");
        metrics.record_sign_error("TTL_ERROR");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        metrics.root_expiry.set(now + 1000.0);
        metrics.chain_expiry.set(now + 500.0);
        let text = metrics.encode();
        assert!(
            text.contains("# TYPE citadel_server_csr_sign_err_count counter\n"),
            "{text}"
        );
        assert!(
            text.contains("citadel_server_csr_sign_err_count{error=\"TTL_ERROR\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE citadel_server_root_cert_expiry_seconds gauge\n"),
            "{text}"
        );
        let seconds: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("citadel_server_root_cert_expiry_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((990.0..=1000.0).contains(&seconds), "{seconds}");
        let chain: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("citadel_server_cert_chain_expiry_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((490.0..=500.0).contains(&chain), "{chain}");
        assert!(text.contains(
            "# TYPE citadel_server_cert_chain_expiry_timestamp gauge
"
        ));
    }
}
