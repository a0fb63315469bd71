//! What a DestinationRule's traffic policy makes of an `inbound-vip` cluster, as istiod's
//! `buildWaypointInboundVIPCluster` applies it (`applyConnectionPool`, `applyH2Upgrade`,
//! `applyOutlierDetection`, `applyLoadBalancer`, `buildWaypointTLSContext`): circuit
//! breakers, connect timeout, TCP keepalive, per-connection limits, outlier detection, the
//! load balancer, and TLS origination inside the `internal_upstream` socket.
//!
//! Without a rule the cluster gets istiod's defaults: every circuit breaker at its maximum,
//! a 10 s connect timeout, least request, plain bytes. Counts of zero mean "not set", as
//! istiod reads them.
//!
//! A rule also reaches the service's chains ([`ChainTraffic`]): the HTTP default route hashes
//! by the consistent-hash key, and the TCP proxy takes the idle timeout, the connection
//! duration and a source-IP hash.

use std::time::Duration;

use crate::discovery::model::{
    ClientTls, ConnectionPool, DestinationRule, H2UpgradePolicy, HashAlgorithm, HashKey,
    LoadBalancer, OutlierDetection, SimpleLb, TlsMode, TrafficPolicy, Warmup,
};
use crate::pb::envoy::config::cluster::v3::{
    self as cluster, CircuitBreakers, Cluster, UpstreamConnectionOptions,
};
use crate::pb::envoy::config::core::v3::{self as core, RoutingPriority};
use crate::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use crate::pb::envoy::extensions::transport_sockets::tls::v3::{self as tls, UpstreamTlsContext};
use crate::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use crate::pb::envoy::r#type::v3::Percent;
use crate::pb::google::protobuf::UInt64Value;
use crate::waypoint::envoy::{self, any, uint32};

/// The connect timeout of every `inbound-vip` cluster without a rule's (meshConfig
/// `connectTimeout`'s default).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The policy a rule gives one cluster: the port's policy and the rule it came from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppliedPolicy<'a> {
    pub(crate) policy: &'a TrafficPolicy,
    /// The (first merged) rule, named in the cluster's `istio` metadata.
    pub(crate) rule: &'a DestinationRule,
}

impl AppliedPolicy<'_> {
    /// istiod's `config` metadata value for the rule.
    pub(crate) fn config_path(&self) -> String {
        format!(
            "/apis/networking.istio.io/v1/namespaces/{}/destination-rule/{}",
            self.rule.namespace, self.rule.name
        )
    }
}

/// What a rule's top-level policy changes in a bound service's chains (istiod reads the top
/// level here, whatever the port; `buildSidecarInboundHTTPRouteConfig` for a waypoint and
/// `buildWaypointNetworkFilters`).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ChainTraffic {
    /// The HTTP default route's hash policy (a consistent hash needs one to hash by).
    pub(crate) hash_policy: Option<HashPolicy>,
    /// The TCP proxy's idle timeout and maximum connection duration (`connectionPool.tcp`).
    pub(crate) tcp_idle_timeout: Option<crate::pb::google::protobuf::Duration>,
    pub(crate) tcp_max_connection_duration: Option<crate::pb::google::protobuf::Duration>,
    /// The TCP proxy hashes by source IP (`consistentHash.useSourceIp`).
    pub(crate) tcp_source_ip_hash: bool,
}

impl ChainTraffic {
    pub(crate) fn of(policy: Option<&TrafficPolicy>) -> Self {
        let Some(policy) = policy else {
            return ChainTraffic::default();
        };
        let key = policy
            .load_balancer
            .as_ref()
            .and_then(|lb| lb.consistent_hash.as_ref())
            .map(|hash| &hash.key);
        let tcp = policy
            .connection_pool
            .as_ref()
            .and_then(|pool| pool.tcp.as_ref());
        ChainTraffic {
            hash_policy: key.and_then(route_hash_policy),
            tcp_idle_timeout: tcp.and_then(|t| t.idle_timeout).and_then(duration),
            tcp_max_connection_duration: tcp
                .and_then(|t| t.max_connection_duration)
                .and_then(duration),
            tcp_source_ip_hash: key == Some(&HashKey::SourceIp),
        }
    }
}

/// istiod's `ConsistentHashToHashPolicy`.
fn route_hash_policy(key: &HashKey) -> Option<HashPolicy> {
    let specifier =
        match key {
            HashKey::None => return None,
            HashKey::Header(name) => hash_policy::PolicySpecifier::Header(hash_policy::Header {
                header_name: name.clone(),
            }),
            HashKey::Cookie { name, path, ttl } => {
                hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
                    name: name.clone(),
                    ttl: ttl.and_then(duration),
                    path: path.clone(),
                })
            }
            HashKey::SourceIp => hash_policy::PolicySpecifier::ConnectionProperties(
                hash_policy::ConnectionProperties { source_ip: true },
            ),
            HashKey::QueryParameter(name) => {
                hash_policy::PolicySpecifier::QueryParameter(hash_policy::QueryParameter {
                    name: name.clone(),
                })
            }
        };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
    })
}

/// Applies `policy` (`None`: no rule applies) to `cluster`, whose upstream HTTP options are
/// `options` (`None`: none yet), for a port that is HTTP/1.1 by name (`http_port`, where an
/// `h2UpgradePolicy: UPGRADE` applies). Returns the transport socket that `internal_upstream`
/// wraps: plain bytes, or TLS origination.
pub(crate) fn apply(
    cluster: &mut Cluster,
    options: &mut Option<HttpProtocolOptions>,
    policy: Option<&TrafficPolicy>,
) -> core::TransportSocket {
    let policy = policy.cloned().unwrap_or_default();
    let pool = policy.connection_pool.unwrap_or_default();
    connection_pool(cluster, options, &pool);
    if h2_upgrade(&pool) {
        set_h2(options);
    }
    if let Some(outlier) = &policy.outlier_detection {
        outlier_detection(cluster, outlier);
    }
    load_balancer(cluster, policy.load_balancer.as_ref());
    if is_original_dst(cluster) {
        cluster.lb_policy = cluster::cluster::LbPolicy::ClusterProvided as i32;
    }
    match policy.tls.as_ref().and_then(|t| tls_context(t, options)) {
        Some(context) => envoy::transport_socket(
            "envoy.transport_sockets.tls",
            any(envoy::UPSTREAM_TLS, &context),
        ),
        None => raw_buffer(),
    }
}

pub(crate) fn raw_buffer() -> core::TransportSocket {
    envoy::transport_socket(
        "envoy.transport_sockets.raw_buffer",
        envoy::empty(envoy::RAW_BUFFER),
    )
}

/// The cluster's `typed_extension_protocol_options`: none, or `options` with an HTTP/1.1
/// upstream when nothing chose one (Envoy requires a choice).
pub(crate) fn finish_options(mut options: HttpProtocolOptions) -> HttpProtocolOptions {
    if options.upstream_protocol_options.is_none() {
        options.upstream_protocol_options = Some(explicit(
            http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(
                Default::default(),
            ),
        ));
    }
    options
}

fn explicit(
    config: http_protocol_options::explicit_http_config::ProtocolConfig,
) -> http_protocol_options::UpstreamProtocolOptions {
    http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
        http_protocol_options::ExplicitHttpConfig {
            protocol_config: Some(config),
        },
    )
}

fn duration(d: Duration) -> Option<crate::pb::google::protobuf::Duration> {
    Some(crate::pb::google::protobuf::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

/// `applyConnectionPool`: circuit breakers, the connect timeout, TCP keepalive and the
/// per-connection HTTP limits; `useClientProtocol` follows the downstream protocol.
fn connection_pool(
    cluster: &mut Cluster,
    options: &mut Option<HttpProtocolOptions>,
    pool: &ConnectionPool,
) {
    let mut threshold = cluster::circuit_breakers::Thresholds {
        priority: RoutingPriority::Default as i32,
        max_connections: uint32(u32::MAX),
        max_pending_requests: uint32(u32::MAX),
        max_requests: uint32(u32::MAX),
        max_retries: uint32(u32::MAX),
        ..Default::default()
    };
    let positive = |n: u32| (n > 0).then_some(n);
    let mut idle_timeout = None;
    let mut max_requests_per_connection = 0;
    let mut max_concurrent_streams = 0;
    let mut max_connection_duration = None;
    if let Some(http) = &pool.http {
        if let Some(n) = positive(http.http2_max_requests) {
            threshold.max_requests = uint32(n);
        }
        if let Some(n) = positive(http.http1_max_pending_requests) {
            threshold.max_pending_requests = uint32(n);
        }
        if let Some(n) = positive(http.max_retries) {
            threshold.max_retries = uint32(n);
        }
        idle_timeout = http.idle_timeout;
        max_requests_per_connection = http.max_requests_per_connection;
        max_concurrent_streams = http.max_concurrent_streams;
    }
    cluster.connect_timeout = duration(CONNECT_TIMEOUT);
    if let Some(tcp) = &pool.tcp {
        if let Some(timeout) = tcp.connect_timeout {
            cluster.connect_timeout = duration(timeout);
        }
        if let Some(n) = positive(tcp.max_connections) {
            threshold.max_connections = uint32(n);
        }
        max_connection_duration = tcp.max_connection_duration;
        idle_timeout = idle_timeout.or(tcp.idle_timeout);
        if let Some(keepalive) = &tcp.tcp_keepalive {
            // An empty keepalive sets SO_KEEPALIVE with the OS's values.
            cluster.upstream_connection_options = Some(UpstreamConnectionOptions {
                tcp_keepalive: Some(core::TcpKeepalive {
                    keepalive_probes: positive(keepalive.probes).and_then(uint32),
                    keepalive_time: keepalive.time.and_then(|t| uint32(t.as_secs() as u32)),
                    keepalive_interval: keepalive.interval.and_then(|t| uint32(t.as_secs() as u32)),
                }),
            });
        }
    }
    cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![threshold],
    });
    if max_connection_duration.is_some()
        || idle_timeout.is_some()
        || max_requests_per_connection > 0
        || max_concurrent_streams > 0
    {
        let options = options.get_or_insert_with(Default::default);
        let common = options
            .common_http_protocol_options
            .get_or_insert_with(Default::default);
        if let Some(idle) = idle_timeout {
            common.idle_timeout = duration(idle);
        }
        if max_requests_per_connection > 0 {
            common.max_requests_per_connection = uint32(max_requests_per_connection);
        }
        if let Some(max) = max_connection_duration {
            common.max_connection_duration = duration(max);
        }
        if let Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config:
                    Some(
                        http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                            h2,
                        ),
                    ),
            },
        )) = &mut options.upstream_protocol_options
            && max_concurrent_streams > 0
        {
            h2.max_concurrent_streams = uint32(max_concurrent_streams);
        }
    }
    if pool.http.as_ref().is_some_and(|h| h.use_client_protocol) {
        let options = options.get_or_insert_with(Default::default);
        let http1 = match &options.upstream_protocol_options {
            Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config:
                        Some(
                            http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(
                                http1,
                            ),
                        ),
                },
            )) => *http1,
            _ => Default::default(),
        };
        options.upstream_protocol_options = Some(
            http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
                http_protocol_options::UseDownstreamHttpConfig {
                    http_protocol_options: Some(http1),
                    http2_protocol_options: Some(Default::default()),
                },
            ),
        );
    }
}

/// `shouldH2Upgrade` with the mesh's default policy (`DO_NOT_UPGRADE`): only a rule's
/// `UPGRADE` upgrades, and `useClientProtocol` wins over it.
fn h2_upgrade(pool: &ConnectionPool) -> bool {
    pool.http.as_ref().is_some_and(|http| {
        !http.use_client_protocol && http.h2_upgrade_policy == H2UpgradePolicy::Upgrade
    })
}

/// `setH2Options`: HTTP/2 upstream, unless a protocol is already chosen.
fn set_h2(options: &mut Option<HttpProtocolOptions>) {
    let options = options.get_or_insert_with(Default::default);
    if options.upstream_protocol_options.is_none() {
        options.upstream_protocol_options = Some(explicit(
            http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                Default::default(),
            ),
        ));
    }
}

fn is_http2(options: &Option<HttpProtocolOptions>) -> bool {
    matches!(
        options.as_ref().and_then(|o| o.upstream_protocol_options.as_ref()),
        Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(_)
                ),
            }
        ))
    )
}

/// `applyOutlierDetection`: consecutive 5xx and gateway errors (enforced at 100 % when set
/// above zero), success-rate ejection off, and the panic threshold at `minHealthPercent`.
fn outlier_detection(cluster: &mut Cluster, outlier: &OutlierDetection) {
    let enforcing = |n: u32| uint32(if n > 0 { 100 } else { 0 });
    let mut out = cluster::OutlierDetection {
        enforcing_success_rate: uint32(0),
        ..Default::default()
    };
    if let Some(n) = outlier.consecutive_5xx_errors {
        out.consecutive_5xx = uint32(n);
        out.enforcing_consecutive_5xx = enforcing(n);
    }
    if let Some(n) = outlier.consecutive_gateway_errors {
        out.consecutive_gateway_failure = uint32(n);
        out.enforcing_consecutive_gateway_failure = enforcing(n);
    }
    out.interval = outlier.interval.and_then(duration);
    out.base_ejection_time = outlier.base_ejection_time.and_then(duration);
    if outlier.max_ejection_percent > 0 {
        out.max_ejection_percent = uint32(outlier.max_ejection_percent);
    }
    if outlier.split_external_local_origin_errors {
        out.split_external_local_origin_errors = true;
        if let Some(n) = outlier.consecutive_local_origin_failures.filter(|n| *n > 0) {
            out.consecutive_local_origin_failure = uint32(n);
            out.enforcing_consecutive_local_origin_failure = uint32(100);
        }
        out.enforcing_local_origin_success_rate = uint32(0);
    }
    cluster.outlier_detection = Some(out);
    cluster
        .common_lb_config
        .get_or_insert_with(Default::default)
        .healthy_panic_threshold = Some(Percent {
        value: f64::from(outlier.min_health_percent),
    });
}

fn is_original_dst(cluster: &Cluster) -> bool {
    cluster.cluster_discovery_type
        == Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::OriginalDst as i32,
        ))
}

/// `applyLoadBalancer` (without locality settings): least request unless the rule says
/// otherwise; `PASSTHROUGH` sends each connection to its original destination; a consistent
/// hash is a ring hash or Maglev.
fn load_balancer(cluster: &mut Cluster, lb: Option<&LoadBalancer>) {
    use cluster::cluster::{LbConfig, LbPolicy};
    let warmup = lb.and_then(|lb| lb.warmup).map(slow_start);
    match lb.and_then(|lb| lb.simple).unwrap_or_default() {
        SimpleLb::Random => cluster.lb_policy = LbPolicy::Random as i32,
        SimpleLb::RoundRobin => {
            cluster.lb_policy = LbPolicy::RoundRobin as i32;
            if let Some(slow_start_config) = warmup {
                cluster.lb_config = Some(LbConfig::RoundRobinLbConfig(
                    cluster::cluster::RoundRobinLbConfig {
                        slow_start_config: Some(slow_start_config),
                    },
                ));
            }
        }
        SimpleLb::Passthrough => {
            cluster.lb_policy = LbPolicy::ClusterProvided as i32;
            cluster.cluster_discovery_type = Some(cluster::cluster::ClusterDiscoveryType::Type(
                cluster::cluster::DiscoveryType::OriginalDst as i32,
            ));
            cluster.load_assignment = None;
            // Only an EDS cluster has an EDS config (istiod's `maybeApplyEdsConfig`).
            cluster.eds_cluster_config = None;
        }
        SimpleLb::LeastRequest | SimpleLb::Unspecified => {
            cluster.lb_policy = LbPolicy::LeastRequest as i32;
            if let Some(slow_start_config) = warmup {
                cluster.lb_config = Some(LbConfig::LeastRequestLbConfig(
                    cluster::cluster::LeastRequestLbConfig {
                        slow_start_config: Some(slow_start_config),
                    },
                ));
            }
        }
    }
    let Some(hash) = lb.and_then(|lb| lb.consistent_hash.as_ref()) else {
        return;
    };
    let size = |n: u64| (n != 0).then_some(UInt64Value { value: n });
    match hash.algorithm {
        HashAlgorithm::Maglev { table_size } => {
            cluster.lb_policy = LbPolicy::Maglev as i32;
            if let Some(table_size) = size(table_size) {
                cluster.lb_config =
                    Some(LbConfig::MaglevLbConfig(cluster::cluster::MaglevLbConfig {
                        table_size: Some(table_size),
                    }));
            }
        }
        HashAlgorithm::RingHash { minimum_ring_size } => {
            cluster.lb_policy = LbPolicy::RingHash as i32;
            if let Some(minimum_ring_size) = size(minimum_ring_size) {
                cluster.lb_config = Some(LbConfig::RingHashLbConfig(
                    cluster::cluster::RingHashLbConfig {
                        minimum_ring_size: Some(minimum_ring_size),
                    },
                ));
            }
        }
        HashAlgorithm::Default { minimum_ring_size } => {
            cluster.lb_policy = LbPolicy::RingHash as i32;
            cluster.lb_config = Some(LbConfig::RingHashLbConfig(
                cluster::cluster::RingHashLbConfig {
                    minimum_ring_size: size(minimum_ring_size)
                        .or(Some(UInt64Value { value: 1024 })),
                },
            ));
        }
    }
}

/// `setWarmup` (aggression 1.0, minimum weight 10 %), or `setSlowStartConfig` for the
/// deprecated `warmupDurationSecs` (the window alone).
fn slow_start(warmup: Warmup) -> cluster::cluster::SlowStartConfig {
    let mut config = cluster::cluster::SlowStartConfig {
        slow_start_window: duration(warmup.duration),
        ..Default::default()
    };
    if !warmup.window_only {
        config.aggression = Some(core::RuntimeDouble {
            default_value: 1.0,
            // istiod's key: a runtime key is required, and "(" can never be set.
            runtime_key: "(".into(),
        });
        config.min_weight_percent = Some(Percent { value: 10.0 });
    }
    config
}

/// `buildWaypointTLSContext`: TLS origination for `SIMPLE` and `MUTUAL`; `DISABLE` and
/// `ISTIO_MUTUAL` keep plain bytes (HBONE already carries mutual TLS).
///
/// The CA comes over SDS from the proxy's agent as `file-root:<caCertificates>`, or
/// `file-root:system` (the system roots) when none is given; `insecureSkipVerify` skips
/// verification. A client certificate is `file-cert:<cert>~<key>`. Without an SNI, the
/// request's host is sent and checked (auto SNI and SAN validation). `credentialName` names a
/// Secret that ambientd does not serve: the system roots verify instead, and `MUTUAL` sends no
/// client certificate, so a peer that needs the credential refuses (istiod would send plain
/// text for a `MUTUAL` rule missing its files; this fails closed instead).
fn tls_context(
    settings: &ClientTls,
    options: &mut Option<HttpProtocolOptions>,
) -> Option<UpstreamTlsContext> {
    let mutual = match settings.mode {
        TlsMode::Disable | TlsMode::IstioMutual => return None,
        TlsMode::Simple => false,
        TlsMode::Mutual => true,
    };
    let auto_sni = settings.sni.is_empty();
    let auto_san_validation =
        auto_sni && settings.subject_alt_names.is_empty() && !settings.insecure_skip_verify;
    if auto_sni || auto_san_validation {
        let upstream = options
            .get_or_insert_with(Default::default)
            .upstream_http_protocol_options
            .get_or_insert_with(Default::default);
        upstream.auto_sni |= auto_sni;
        upstream.auto_san_validation |= auto_san_validation;
    }
    let file_based = settings.credential_name.is_empty();
    let mut common = tls::CommonTlsContext {
        tls_params: Some(tls::TlsParameters {
            tls_minimum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    if mutual
        && file_based
        && !settings.client_certificate.is_empty()
        && !settings.private_key.is_empty()
    {
        common.tls_certificate_sds_secret_configs = vec![sds_file(&format!(
            "file-cert:{}~{}",
            settings.client_certificate, settings.private_key
        ))];
    }
    common.validation_context_type = Some(if settings.insecure_skip_verify {
        tls::common_tls_context::ValidationContextType::ValidationContext(Default::default())
    } else {
        let ca = if file_based && !settings.ca_certificates.is_empty() {
            settings.ca_certificates.as_str()
        } else {
            "system"
        };
        tls::common_tls_context::ValidationContextType::CombinedValidationContext(
            tls::common_tls_context::CombinedCertificateValidationContext {
                default_validation_context: Some(tls::CertificateValidationContext {
                    match_typed_subject_alt_names: subject_alt_names(&settings.subject_alt_names),
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds_file(&format!("file-root:{ca}"))),
            },
        )
    });
    if is_http2(options) {
        common.alpn_protocols = vec!["h2".into()];
    }
    Some(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: settings.sni.clone(),
    })
}

/// Each name matched exactly as a DNS or a URI SAN (istiod sets the untyped matcher, which
/// matches any type).
fn subject_alt_names(names: &[String]) -> Vec<tls::SubjectAltNameMatcher> {
    use tls::subject_alt_name_matcher::SanType;
    names
        .iter()
        .flat_map(|name| {
            [SanType::Dns, SanType::Uri].map(|san_type| tls::SubjectAltNameMatcher {
                san_type: san_type as i32,
                matcher: Some(envoy::exact(name)),
            })
        })
        .collect()
}

/// A file-based secret from the agent's SDS (istiod's `ConstructSdsSecretConfig` for names
/// other than `default` and `ROOTCA`: Envoy's own initial fetch timeout).
fn sds_file(name: &str) -> tls::SdsSecretConfig {
    let mut config = envoy::sds(name);
    if let Some(source) = config.sds_config.as_mut() {
        source.initial_fetch_timeout = None;
    }
    config
}

#[cfg(test)]
mod tests;
