//! `networking.istio.io` DestinationRules (v1, v1beta1, v1alpha3) as they appear in YAML/JSON,
//! decoded to the reduced [`DestinationRule`] of `crate::discovery`: host, scope, subsets and
//! the parts of the traffic policy a waypoint applies.
//!
//! Lenient where Kubernetes is (missing fields take their defaults, unknown fields are
//! ignored, `null` is missing) and strict where istiod's validation is: an unknown enum name,
//! an unparsable duration or a port-level setting without a port is an error naming the field,
//! and the rule is skipped. Durations are Go's (`10s`, `1.5m`, `100ms`), as Istio reads them.
//! Fields a waypoint does not apply (locality settings, tunnel, proxy protocol, retry budget)
//! are not read.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::discovery::model::authorization::REVISION_LABEL;
use crate::discovery::model::{
    ClientTls, ConnectionPool, ConsistentHash, DestinationRule, H2UpgradePolicy, HashAlgorithm,
    HashKey, HttpSettings, Labels, LoadBalancer, OutlierDetection, PortTrafficPolicy, SimpleLb,
    Subset, TcpKeepalive, TcpSettings, TlsMode, TrafficPolicy, Warmup,
};
use crate::kube::objects::{RawMeta, parse, string_map};

/// Decodes a DestinationRule. The error names the failing field.
pub(crate) fn decode(value: &Value) -> Result<DestinationRule, String> {
    let raw: RawDestinationRule = parse(value)?;
    let spec = raw.spec.unwrap_or_default();
    let host = spec.host.unwrap_or_default();
    if host.is_empty() {
        return Err("spec.host is empty".into());
    }
    let subsets = spec
        .subsets
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let field = format!("spec.subsets[{i}]");
            let name = s.name.unwrap_or_default();
            if name.is_empty() {
                return Err(format!("{field}.name is empty"));
            }
            Ok(Subset {
                name,
                labels: s.labels,
                traffic_policy: s
                    .traffic_policy
                    .map(|p| p.reduce(&format!("{field}.trafficPolicy")))
                    .transpose()?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(DestinationRule {
        name: raw.metadata.name()?,
        namespace: raw.metadata.namespace(),
        revision: raw.metadata.labels.get(REVISION_LABEL).map(str::to_string),
        creation: match &raw.metadata.creation_timestamp {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        },
        host,
        export_to: spec.export_to.unwrap_or_default(),
        workload_selector: spec.workload_selector.map(|s| s.match_labels),
        traffic_policy: spec
            .traffic_policy
            .map(|p| p.reduce("spec.trafficPolicy").map(Box::new))
            .transpose()?,
        subsets,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawDestinationRule {
    metadata: RawMeta,
    spec: Option<RawSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSpec {
    host: Option<String>,
    export_to: Option<Vec<String>>,
    workload_selector: Option<RawWorkloadSelector>,
    traffic_policy: Option<RawTrafficPolicy>,
    subsets: Option<Vec<RawSubset>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawWorkloadSelector {
    #[serde(deserialize_with = "string_map")]
    match_labels: Labels,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawSubset {
    name: Option<String>,
    #[serde(deserialize_with = "string_map")]
    labels: Labels,
    traffic_policy: Option<RawTrafficPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawTrafficPolicy {
    load_balancer: Option<RawLoadBalancer>,
    connection_pool: Option<RawConnectionPool>,
    outlier_detection: Option<RawOutlierDetection>,
    tls: Option<RawTls>,
    port_level_settings: Option<Vec<RawPortTrafficPolicy>>,
}

impl RawTrafficPolicy {
    fn reduce(self, field: &str) -> Result<TrafficPolicy, String> {
        let port_level = self
            .port_level_settings
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, p)| p.reduce(&format!("{field}.portLevelSettings[{i}]")))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(TrafficPolicy {
            port_level,
            ..parts(
                self.load_balancer,
                self.connection_pool,
                self.outlier_detection,
                self.tls,
                field,
            )?
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawPortTrafficPolicy {
    port: Option<RawPortSelector>,
    load_balancer: Option<RawLoadBalancer>,
    connection_pool: Option<RawConnectionPool>,
    outlier_detection: Option<RawOutlierDetection>,
    tls: Option<RawTls>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawPortSelector {
    number: Option<i64>,
}

impl RawPortTrafficPolicy {
    fn reduce(self, field: &str) -> Result<PortTrafficPolicy, String> {
        let port = match self.port.and_then(|p| p.number) {
            Some(n @ 1..=65535) => n as u32,
            Some(n) => return Err(format!("{field}.port.number: {n} is not a port")),
            None => return Err(format!("{field}.port.number is missing")),
        };
        Ok(PortTrafficPolicy {
            port,
            policy: parts(
                self.load_balancer,
                self.connection_pool,
                self.outlier_detection,
                self.tls,
                field,
            )?,
        })
    }
}

/// The four parts a policy and a port-level policy share.
fn parts(
    load_balancer: Option<RawLoadBalancer>,
    connection_pool: Option<RawConnectionPool>,
    outlier_detection: Option<RawOutlierDetection>,
    tls: Option<RawTls>,
    field: &str,
) -> Result<TrafficPolicy, String> {
    Ok(TrafficPolicy {
        load_balancer: load_balancer
            .map(|lb| lb.reduce(&format!("{field}.loadBalancer")))
            .transpose()?,
        connection_pool: connection_pool
            .map(|p| p.reduce(&format!("{field}.connectionPool")))
            .transpose()?,
        outlier_detection: outlier_detection
            .map(|o| o.reduce(&format!("{field}.outlierDetection")))
            .transpose()?,
        tls: tls.map(|t| t.reduce(&format!("{field}.tls"))).transpose()?,
        port_level: Vec::new(),
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawLoadBalancer {
    simple: Option<Value>,
    consistent_hash: Option<RawConsistentHash>,
    warmup_duration_secs: Option<String>,
    warmup: Option<RawWarmup>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawWarmup {
    duration: Option<String>,
}

impl RawLoadBalancer {
    fn reduce(self, field: &str) -> Result<LoadBalancer, String> {
        let simple = self
            .simple
            .filter(|v| !v.is_null())
            .map(|v| {
                enum_value(
                    &v,
                    &format!("{field}.simple"),
                    &[
                        ("UNSPECIFIED", SimpleLb::Unspecified),
                        ("LEAST_CONN", SimpleLb::LeastRequest),
                        ("RANDOM", SimpleLb::Random),
                        ("PASSTHROUGH", SimpleLb::Passthrough),
                        ("ROUND_ROBIN", SimpleLb::RoundRobin),
                        ("LEAST_REQUEST", SimpleLb::LeastRequest),
                    ],
                )
            })
            .transpose()?;
        let warmup = match (
            self.warmup.and_then(|w| w.duration),
            self.warmup_duration_secs,
        ) {
            (Some(d), _) => Some(Warmup {
                duration: duration(&d, &format!("{field}.warmup.duration"))?,
                window_only: false,
            }),
            (None, Some(d)) => Some(Warmup {
                duration: duration(&d, &format!("{field}.warmupDurationSecs"))?,
                window_only: true,
            }),
            (None, None) => None,
        };
        Ok(LoadBalancer {
            simple,
            consistent_hash: self
                .consistent_hash
                .map(|h| h.reduce(&format!("{field}.consistentHash")))
                .transpose()?,
            warmup,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawConsistentHash {
    http_header_name: Option<String>,
    http_cookie: Option<RawCookie>,
    use_source_ip: Option<bool>,
    http_query_parameter_name: Option<String>,
    ring_hash: Option<RawRingHash>,
    maglev: Option<RawMaglev>,
    minimum_ring_size: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawCookie {
    name: Option<String>,
    path: Option<String>,
    ttl: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawRingHash {
    minimum_ring_size: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawMaglev {
    table_size: Option<u64>,
}

impl RawConsistentHash {
    fn reduce(self, field: &str) -> Result<ConsistentHash, String> {
        let key = if let Some(name) = self.http_header_name {
            HashKey::Header(name)
        } else if let Some(cookie) = self.http_cookie {
            HashKey::Cookie {
                name: cookie.name.unwrap_or_default(),
                path: cookie.path.unwrap_or_default(),
                ttl: cookie
                    .ttl
                    .map(|t| duration(&t, &format!("{field}.httpCookie.ttl")))
                    .transpose()?,
            }
        } else if self.use_source_ip == Some(true) {
            HashKey::SourceIp
        } else if let Some(name) = self.http_query_parameter_name {
            HashKey::QueryParameter(name)
        } else {
            HashKey::None
        };
        let algorithm = if let Some(maglev) = self.maglev {
            HashAlgorithm::Maglev {
                table_size: maglev.table_size.unwrap_or_default(),
            }
        } else if let Some(ring) = self.ring_hash {
            HashAlgorithm::RingHash {
                minimum_ring_size: ring.minimum_ring_size.unwrap_or_default(),
            }
        } else {
            HashAlgorithm::Default {
                minimum_ring_size: self.minimum_ring_size.unwrap_or_default(),
            }
        };
        Ok(ConsistentHash { key, algorithm })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawConnectionPool {
    tcp: Option<RawTcp>,
    http: Option<RawHttp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawTcp {
    max_connections: Option<i64>,
    connect_timeout: Option<String>,
    tcp_keepalive: Option<RawKeepalive>,
    max_connection_duration: Option<String>,
    idle_timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawKeepalive {
    probes: Option<i64>,
    time: Option<String>,
    interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawHttp {
    http1_max_pending_requests: Option<i64>,
    http2_max_requests: Option<i64>,
    max_requests_per_connection: Option<i64>,
    max_retries: Option<i64>,
    max_concurrent_streams: Option<i64>,
    idle_timeout: Option<String>,
    h2_upgrade_policy: Option<Value>,
    use_client_protocol: Option<bool>,
}

impl RawConnectionPool {
    fn reduce(self, field: &str) -> Result<ConnectionPool, String> {
        let tcp = match self.tcp {
            None => None,
            Some(tcp) => {
                let field = format!("{field}.tcp");
                let at = |name: &str| format!("{field}.{name}");
                Some(TcpSettings {
                    max_connections: count(tcp.max_connections),
                    connect_timeout: optional_duration(tcp.connect_timeout, &at("connectTimeout"))?,
                    tcp_keepalive: match tcp.tcp_keepalive {
                        None => None,
                        Some(k) => Some(TcpKeepalive {
                            probes: count(k.probes),
                            time: optional_duration(k.time, &at("tcpKeepalive.time"))?,
                            interval: optional_duration(k.interval, &at("tcpKeepalive.interval"))?,
                        }),
                    },
                    max_connection_duration: optional_duration(
                        tcp.max_connection_duration,
                        &at("maxConnectionDuration"),
                    )?,
                    idle_timeout: optional_duration(tcp.idle_timeout, &at("idleTimeout"))?,
                })
            }
        };
        let http = match self.http {
            None => None,
            Some(http) => {
                let field = format!("{field}.http");
                Some(HttpSettings {
                    http1_max_pending_requests: count(http.http1_max_pending_requests),
                    http2_max_requests: count(http.http2_max_requests),
                    max_requests_per_connection: count(http.max_requests_per_connection),
                    max_retries: count(http.max_retries),
                    max_concurrent_streams: count(http.max_concurrent_streams),
                    idle_timeout: optional_duration(
                        http.idle_timeout,
                        &format!("{field}.idleTimeout"),
                    )?,
                    h2_upgrade_policy: match http.h2_upgrade_policy.filter(|v| !v.is_null()) {
                        None => H2UpgradePolicy::Default,
                        Some(v) => enum_value(
                            &v,
                            &format!("{field}.h2UpgradePolicy"),
                            &[
                                ("DEFAULT", H2UpgradePolicy::Default),
                                ("DO_NOT_UPGRADE", H2UpgradePolicy::DoNotUpgrade),
                                ("UPGRADE", H2UpgradePolicy::Upgrade),
                            ],
                        )?,
                    },
                    use_client_protocol: http.use_client_protocol.unwrap_or_default(),
                })
            }
        };
        Ok(ConnectionPool { tcp, http })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawOutlierDetection {
    consecutive_5xx_errors: Option<u32>,
    consecutive_gateway_errors: Option<u32>,
    interval: Option<String>,
    base_ejection_time: Option<String>,
    max_ejection_percent: Option<i64>,
    min_health_percent: Option<i64>,
    split_external_local_origin_errors: Option<bool>,
    consecutive_local_origin_failures: Option<u32>,
}

impl RawOutlierDetection {
    fn reduce(self, field: &str) -> Result<OutlierDetection, String> {
        let percent = |value: Option<i64>, name: &str| match value.unwrap_or_default() {
            n @ 0..=100 => Ok(n as u32),
            n => Err(format!("{field}.{name}: {n} is not a percentage")),
        };
        Ok(OutlierDetection {
            consecutive_5xx_errors: self.consecutive_5xx_errors,
            consecutive_gateway_errors: self.consecutive_gateway_errors,
            interval: optional_duration(self.interval, &format!("{field}.interval"))?,
            base_ejection_time: optional_duration(
                self.base_ejection_time,
                &format!("{field}.baseEjectionTime"),
            )?,
            max_ejection_percent: percent(self.max_ejection_percent, "maxEjectionPercent")?,
            min_health_percent: percent(self.min_health_percent, "minHealthPercent")?,
            split_external_local_origin_errors: self
                .split_external_local_origin_errors
                .unwrap_or_default(),
            consecutive_local_origin_failures: self.consecutive_local_origin_failures,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawTls {
    mode: Option<Value>,
    client_certificate: Option<String>,
    private_key: Option<String>,
    ca_certificates: Option<String>,
    credential_name: Option<String>,
    subject_alt_names: Option<Vec<String>>,
    sni: Option<String>,
    insecure_skip_verify: Option<bool>,
}

impl RawTls {
    fn reduce(self, field: &str) -> Result<ClientTls, String> {
        Ok(ClientTls {
            mode: match self.mode.filter(|v| !v.is_null()) {
                None => TlsMode::Disable,
                Some(v) => enum_value(
                    &v,
                    &format!("{field}.mode"),
                    &[
                        ("DISABLE", TlsMode::Disable),
                        ("SIMPLE", TlsMode::Simple),
                        ("MUTUAL", TlsMode::Mutual),
                        ("ISTIO_MUTUAL", TlsMode::IstioMutual),
                    ],
                )?,
            },
            client_certificate: self.client_certificate.unwrap_or_default(),
            private_key: self.private_key.unwrap_or_default(),
            ca_certificates: self.ca_certificates.unwrap_or_default(),
            credential_name: self.credential_name.unwrap_or_default(),
            subject_alt_names: self.subject_alt_names.unwrap_or_default(),
            sni: self.sni.unwrap_or_default(),
            insecure_skip_verify: self.insecure_skip_verify.unwrap_or_default(),
        })
    }
}

/// A count where istiod reads zero or less as "not set".
fn count(value: Option<i64>) -> u32 {
    value.unwrap_or_default().clamp(0, u32::MAX as i64) as u32
}

/// A protobuf enum by name, or by number (its position in `names`, which lists the API's
/// values in number order).
fn enum_value<T: Copy>(value: &Value, field: &str, names: &[(&str, T)]) -> Result<T, String> {
    let expected = || names.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    match value {
        Value::String(s) => names
            .iter()
            .find(|(n, _)| n == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("{field}: unknown value {s:?} (expected {})", expected())),
        Value::Number(n) => n
            .as_u64()
            .and_then(|i| names.get(usize::try_from(i).ok()?))
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("{field}: unknown value {n}")),
        other => Err(format!("{field}: expected a string, found {other}")),
    }
}

fn optional_duration(text: Option<String>, field: &str) -> Result<Option<Duration>, String> {
    text.map(|t| duration(&t, field)).transpose()
}

fn duration(text: &str, field: &str) -> Result<Duration, String> {
    parse_go_duration(text).ok_or_else(|| format!("{field}: {text:?} is not a duration"))
}

/// Go's `time.ParseDuration` for non-negative values: `0`, or decimal numbers each with a
/// unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), such as `1h30m` or `1.5s`.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        rest = &rest[unit_len..];
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut nanos = whole.checked_mul(nanos_per_unit)?;
        let mut scale = nanos_per_unit;
        for digit in fraction.bytes() {
            scale /= 10;
            nanos += u128::from(digit - b'0') * scale;
        }
        total_nanos = total_nanos.checked_add(nanos)?;
    }
    let seconds = u64::try_from(total_nanos / 1_000_000_000).ok()?;
    Some(Duration::new(seconds, (total_nanos % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests;
