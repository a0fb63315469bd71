//! Table tests of a traffic policy on an `inbound-vip` cluster against istiod's
//! `buildWaypointInboundVIPCluster`: the defaults without a rule, each part of the policy, and
//! TLS origination inside `internal_upstream`.

use std::time::Duration;

use prost::Message;

use super::*;
use crate::discovery::model::{
    ConsistentHash, HashKey, HttpSettings, TcpKeepalive, TcpSettings, Warmup,
};
use crate::pb::envoy::extensions::transport_sockets::internal_upstream::v3::InternalUpstreamTransport;
use crate::waypoint::clusters::inbound_vip;
use crate::waypoint::listeners::PortProtocol;

const NAME: &str = "inbound-vip|8080|http|web.demo.svc.cluster.local";

fn rule() -> DestinationRule {
    DestinationRule {
        name: "web".into(),
        namespace: "demo".into(),
        host: "web".into(),
        ..Default::default()
    }
}

fn cluster(protocol: PortProtocol, http: bool, policy: Option<&TrafficPolicy>) -> Cluster {
    let rule = rule();
    inbound_vip(
        NAME,
        "web.demo.svc.cluster.local",
        "web",
        "demo",
        protocol,
        http,
        policy.map(|policy| AppliedPolicy {
            policy,
            rule: &rule,
        }),
    )
}

fn options(cluster: &Cluster) -> Option<HttpProtocolOptions> {
    let any = cluster
        .typed_extension_protocol_options
        .get(envoy::UPSTREAM_HTTP_OPTIONS)?;
    Some(HttpProtocolOptions::decode(any.value.clone()).unwrap())
}

/// The socket `internal_upstream` wraps: its name and typed config.
fn inner(cluster: &Cluster) -> (String, Option<UpstreamTlsContext>) {
    let Some(core::transport_socket::ConfigType::TypedConfig(outer)) = cluster
        .transport_socket
        .as_ref()
        .and_then(|t| t.config_type.clone())
    else {
        panic!("no transport socket");
    };
    let upstream = InternalUpstreamTransport::decode(outer.value).unwrap();
    let socket = upstream.transport_socket.unwrap();
    let Some(core::transport_socket::ConfigType::TypedConfig(config)) = socket.config_type else {
        panic!("no typed config");
    };
    let tls = (config.type_url == format!("type.googleapis.com/{}", envoy::UPSTREAM_TLS))
        .then(|| UpstreamTlsContext::decode(config.value).unwrap());
    (socket.name, tls)
}

fn thresholds(cluster: &Cluster) -> (u32, u32, u32, u32) {
    let t = &cluster.circuit_breakers.as_ref().unwrap().thresholds[0];
    let v = |w: &Option<crate::pb::google::protobuf::UInt32Value>| w.unwrap().value;
    (
        v(&t.max_connections),
        v(&t.max_pending_requests),
        v(&t.max_requests),
        v(&t.max_retries),
    )
}

fn lb(simple: SimpleLb) -> Option<LoadBalancer> {
    Some(LoadBalancer {
        simple: Some(simple),
        ..Default::default()
    })
}

fn istio_config(cluster: &Cluster) -> Option<String> {
    let istio = &cluster.metadata.as_ref()?.filter_metadata["istio"];
    match istio.fields.get("config")?.kind.as_ref()? {
        crate::pb::google::protobuf::value::Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

#[test]
fn without_a_rule_istiods_defaults() {
    let c = cluster(PortProtocol::Http, true, None);
    assert_eq!(c.connect_timeout, duration(Duration::from_secs(10)));
    assert_eq!(thresholds(&c), (u32::MAX, u32::MAX, u32::MAX, u32::MAX));
    assert_eq!(c.lb_policy, cluster::cluster::LbPolicy::LeastRequest as i32);
    assert_eq!(c.lb_config, None);
    assert_eq!(c.outlier_detection, None);
    assert_eq!(c.upstream_connection_options, None);
    assert!(c.typed_extension_protocol_options.is_empty());
    assert_eq!(
        inner(&c),
        ("envoy.transport_sockets.raw_buffer".into(), None)
    );
    assert_eq!(istio_config(&c), None);
    // An HTTP/2 port keeps its upstream protocol, an auto port follows the downstream.
    assert!(is_http2(&options(&cluster(
        PortProtocol::Http2,
        true,
        None
    ))));
    assert!(matches!(
        options(&cluster(PortProtocol::Auto, true, None))
            .unwrap()
            .upstream_protocol_options,
        Some(http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
}

#[test]
fn the_connection_pool_sets_limits_timeouts_and_keepalive() {
    let policy = TrafficPolicy {
        connection_pool: Some(ConnectionPool {
            tcp: Some(TcpSettings {
                max_connections: 100,
                connect_timeout: Some(Duration::from_millis(250)),
                tcp_keepalive: Some(TcpKeepalive {
                    probes: 3,
                    time: Some(Duration::from_secs(600)),
                    interval: None,
                }),
                max_connection_duration: Some(Duration::from_secs(3600)),
                idle_timeout: Some(Duration::from_secs(30)),
            }),
            http: Some(HttpSettings {
                http1_max_pending_requests: 10,
                http2_max_requests: 1000,
                max_requests_per_connection: 5,
                max_retries: 2,
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let c = cluster(PortProtocol::Http, true, Some(&policy));
    assert_eq!(thresholds(&c), (100, 10, 1000, 2));
    assert_eq!(c.connect_timeout, duration(Duration::from_millis(250)));
    assert_eq!(
        c.upstream_connection_options.unwrap().tcp_keepalive,
        Some(core::TcpKeepalive {
            keepalive_probes: uint32(3),
            keepalive_time: uint32(600),
            keepalive_interval: None,
        })
    );
    let http_options = options(&c).unwrap();
    let common = http_options.common_http_protocol_options.unwrap();
    // The TCP idle timeout stands in for the HTTP one.
    assert_eq!(common.idle_timeout, duration(Duration::from_secs(30)));
    assert_eq!(common.max_requests_per_connection, uint32(5));
    assert_eq!(
        common.max_connection_duration,
        duration(Duration::from_secs(3600))
    );
    // Envoy needs an upstream protocol: HTTP/1.1 when none was chosen.
    assert!(matches!(
        http_options.upstream_protocol_options,
        Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
            http_protocol_options::ExplicitHttpConfig {
                protocol_config: Some(
                    http_protocol_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(_)
                )
            }
        ))
    ));
    assert_eq!(
        istio_config(&c).as_deref(),
        Some("/apis/networking.istio.io/v1/namespaces/demo/destination-rule/web")
    );

    // The HTTP idle timeout wins over TCP's; streams are limited on an HTTP/2 cluster only.
    let mut http_first = policy.clone();
    let pool = http_first.connection_pool.as_mut().unwrap();
    pool.http.as_mut().unwrap().idle_timeout = Some(Duration::from_secs(7));
    pool.http.as_mut().unwrap().max_concurrent_streams = 9;
    let h2 = options(&cluster(PortProtocol::Http2, true, Some(&http_first))).unwrap();
    assert_eq!(
        h2.common_http_protocol_options.unwrap().idle_timeout,
        duration(Duration::from_secs(7))
    );
    let Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
        http_protocol_options::ExplicitHttpConfig {
            protocol_config:
                Some(http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                    h2,
                )),
        },
    )) = h2.upstream_protocol_options
    else {
        panic!("not HTTP/2");
    };
    assert_eq!(h2.max_concurrent_streams, uint32(9));

    // A TCP cluster gets the same limits (its HTTP options are unused by tcp_proxy).
    let tcp = cluster(PortProtocol::Tcp, false, Some(&policy));
    assert_eq!(thresholds(&tcp), (100, 10, 1000, 2));
}

#[test]
fn h2_upgrade_and_use_client_protocol() {
    let http = |settings: HttpSettings| TrafficPolicy {
        connection_pool: Some(ConnectionPool {
            tcp: None,
            http: Some(settings),
        }),
        ..Default::default()
    };
    let upgrade = http(HttpSettings {
        h2_upgrade_policy: H2UpgradePolicy::Upgrade,
        ..Default::default()
    });
    assert!(is_http2(&options(&cluster(
        PortProtocol::Http,
        true,
        Some(&upgrade)
    ))));
    // An auto port already follows the downstream protocol: unchanged.
    assert!(!is_http2(&options(&cluster(
        PortProtocol::Auto,
        true,
        Some(&upgrade)
    ))));
    let client = http(HttpSettings {
        h2_upgrade_policy: H2UpgradePolicy::Upgrade,
        use_client_protocol: true,
        ..Default::default()
    });
    let client = options(&cluster(PortProtocol::Http2, true, Some(&client))).unwrap();
    assert!(matches!(
        client.upstream_protocol_options,
        Some(http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(_))
    ));
    let none = http(HttpSettings {
        h2_upgrade_policy: H2UpgradePolicy::DoNotUpgrade,
        ..Default::default()
    });
    assert!(
        cluster(PortProtocol::Http, true, Some(&none))
            .typed_extension_protocol_options
            .is_empty()
    );
}

#[test]
fn outlier_detection_as_istiod_sets_it() {
    let policy = TrafficPolicy {
        outlier_detection: Some(OutlierDetection {
            consecutive_5xx_errors: Some(5),
            consecutive_gateway_errors: Some(0),
            interval: Some(Duration::from_secs(10)),
            base_ejection_time: Some(Duration::from_secs(30)),
            max_ejection_percent: 50,
            min_health_percent: 0,
            split_external_local_origin_errors: true,
            consecutive_local_origin_failures: Some(2),
        }),
        ..Default::default()
    };
    let c = cluster(PortProtocol::Http, true, Some(&policy));
    assert_eq!(
        c.outlier_detection,
        Some(cluster::OutlierDetection {
            consecutive_5xx: uint32(5),
            enforcing_consecutive_5xx: uint32(100),
            consecutive_gateway_failure: uint32(0),
            enforcing_consecutive_gateway_failure: uint32(0),
            interval: duration(Duration::from_secs(10)),
            base_ejection_time: duration(Duration::from_secs(30)),
            max_ejection_percent: uint32(50),
            enforcing_success_rate: uint32(0),
            split_external_local_origin_errors: true,
            consecutive_local_origin_failure: uint32(2),
            enforcing_consecutive_local_origin_failure: uint32(100),
            enforcing_local_origin_success_rate: uint32(0),
        })
    );
    // The panic threshold is set even at zero.
    assert_eq!(
        c.common_lb_config.unwrap().healthy_panic_threshold,
        Some(Percent { value: 0.0 })
    );
}

#[test]
fn load_balancers() {
    use cluster::cluster::{LbConfig, LbPolicy};
    let with = |lb: Option<LoadBalancer>| {
        cluster(
            PortProtocol::Http,
            true,
            Some(&TrafficPolicy {
                load_balancer: lb,
                ..Default::default()
            }),
        )
    };
    for (simple, want) in [
        (SimpleLb::Unspecified, LbPolicy::LeastRequest),
        (SimpleLb::LeastRequest, LbPolicy::LeastRequest),
        (SimpleLb::Random, LbPolicy::Random),
        (SimpleLb::RoundRobin, LbPolicy::RoundRobin),
    ] {
        let c = with(lb(simple));
        assert_eq!(c.lb_policy, want as i32, "{simple:?}");
        assert!(c.eds_cluster_config.is_some());
    }
    // PASSTHROUGH: to the original destination, no EDS.
    let c = with(lb(SimpleLb::Passthrough));
    assert_eq!(c.lb_policy, LbPolicy::ClusterProvided as i32);
    assert!(is_original_dst(&c));
    assert_eq!(c.eds_cluster_config, None);
    // Warmup: slow start on round robin, istiod's aggression and minimum weight.
    let c = with(Some(LoadBalancer {
        simple: Some(SimpleLb::RoundRobin),
        warmup: Some(Warmup {
            duration: Duration::from_secs(60),
            window_only: false,
        }),
        ..Default::default()
    }));
    let Some(LbConfig::RoundRobinLbConfig(config)) = c.lb_config else {
        panic!("no round robin config");
    };
    let slow = config.slow_start_config.unwrap();
    assert_eq!(slow.slow_start_window, duration(Duration::from_secs(60)));
    assert_eq!(slow.aggression.unwrap().default_value, 1.0);
    assert_eq!(slow.min_weight_percent, Some(Percent { value: 10.0 }));
    let c = with(Some(LoadBalancer {
        warmup: Some(Warmup {
            duration: Duration::from_secs(5),
            window_only: true,
        }),
        ..Default::default()
    }));
    let Some(LbConfig::LeastRequestLbConfig(config)) = c.lb_config else {
        panic!("no least request config");
    };
    assert_eq!(config.slow_start_config.unwrap().aggression, None);
    // Consistent hashes.
    let hash = |algorithm| {
        with(Some(LoadBalancer {
            consistent_hash: Some(ConsistentHash {
                key: HashKey::Header("x-user".into()),
                algorithm,
            }),
            ..Default::default()
        }))
    };
    let c = hash(HashAlgorithm::Default {
        minimum_ring_size: 0,
    });
    assert_eq!(c.lb_policy, LbPolicy::RingHash as i32);
    assert_eq!(
        c.lb_config,
        Some(LbConfig::RingHashLbConfig(
            cluster::cluster::RingHashLbConfig {
                minimum_ring_size: Some(UInt64Value { value: 1024 }),
            }
        ))
    );
    let c = hash(HashAlgorithm::RingHash {
        minimum_ring_size: 0,
    });
    assert_eq!(c.lb_policy, LbPolicy::RingHash as i32);
    assert_eq!(c.lb_config, None);
    let c = hash(HashAlgorithm::Maglev { table_size: 65537 });
    assert_eq!(c.lb_policy, LbPolicy::Maglev as i32);
    assert_eq!(
        c.lb_config,
        Some(LbConfig::MaglevLbConfig(cluster::cluster::MaglevLbConfig {
            table_size: Some(UInt64Value { value: 65537 }),
        }))
    );
}

fn tls_policy(tls: ClientTls) -> TrafficPolicy {
    TrafficPolicy {
        tls: Some(tls),
        ..Default::default()
    }
}

fn validation_sds(context: &UpstreamTlsContext) -> Option<String> {
    match context
        .common_tls_context
        .as_ref()?
        .validation_context_type
        .as_ref()?
    {
        tls::common_tls_context::ValidationContextType::CombinedValidationContext(c) => Some(
            c.validation_context_sds_secret_config
                .as_ref()?
                .name
                .clone(),
        ),
        _ => None,
    }
}

#[test]
fn tls_origination_inside_internal_upstream() {
    // DISABLE and ISTIO_MUTUAL: plain bytes (HBONE is already mutual TLS).
    for mode in [TlsMode::Disable, TlsMode::IstioMutual] {
        let c = cluster(
            PortProtocol::Http,
            true,
            Some(&tls_policy(ClientTls {
                mode,
                ..Default::default()
            })),
        );
        assert_eq!(inner(&c).0, "envoy.transport_sockets.raw_buffer");
        assert!(c.typed_extension_protocol_options.is_empty());
    }
    // SIMPLE with an SNI and a CA file: verified against it, no auto SNI.
    let c = cluster(
        PortProtocol::Http,
        true,
        Some(&tls_policy(ClientTls {
            mode: TlsMode::Simple,
            sni: "web.example.com".into(),
            ca_certificates: "/etc/certs/ca.pem".into(),
            subject_alt_names: vec!["web.example.com".into()],
            ..Default::default()
        })),
    );
    let (name, context) = inner(&c);
    assert_eq!(name, "envoy.transport_sockets.tls");
    let context = context.unwrap();
    assert_eq!(context.sni, "web.example.com");
    assert_eq!(
        validation_sds(&context).as_deref(),
        Some("file-root:/etc/certs/ca.pem")
    );
    let common = context.common_tls_context.unwrap();
    assert!(common.tls_certificate_sds_secret_configs.is_empty());
    assert!(common.alpn_protocols.is_empty());
    let params = common.tls_params.unwrap();
    assert_eq!(
        (
            params.tls_minimum_protocol_version,
            params.tls_maximum_protocol_version
        ),
        (
            tls::tls_parameters::TlsProtocol::TlSv12 as i32,
            tls::tls_parameters::TlsProtocol::TlSv13 as i32
        )
    );
    let Some(tls::common_tls_context::ValidationContextType::CombinedValidationContext(combined)) =
        common.validation_context_type
    else {
        panic!("no combined validation");
    };
    let sans = combined
        .default_validation_context
        .unwrap()
        .match_typed_subject_alt_names;
    assert_eq!(sans.len(), 2);
    // The SDS secret waits for Envoy's own initial fetch timeout, as istiod's does.
    assert_eq!(
        combined
            .validation_context_sds_secret_config
            .unwrap()
            .sds_config
            .unwrap()
            .initial_fetch_timeout,
        None
    );
    assert!(c.typed_extension_protocol_options.is_empty());

    // SIMPLE without an SNI: the system roots, the request's host as SNI and checked SAN.
    let c = cluster(
        PortProtocol::Http2,
        true,
        Some(&tls_policy(ClientTls {
            mode: TlsMode::Simple,
            ..Default::default()
        })),
    );
    let context = inner(&c).1.unwrap();
    assert_eq!(
        validation_sds(&context).as_deref(),
        Some("file-root:system")
    );
    assert_eq!(context.common_tls_context.unwrap().alpn_protocols, ["h2"]);
    let upstream = options(&c).unwrap().upstream_http_protocol_options.unwrap();
    assert!(upstream.auto_sni && upstream.auto_san_validation);

    // insecureSkipVerify: no verification, and no SAN validation.
    let c = cluster(
        PortProtocol::Http,
        true,
        Some(&tls_policy(ClientTls {
            mode: TlsMode::Simple,
            insecure_skip_verify: true,
            ..Default::default()
        })),
    );
    let context = inner(&c).1.unwrap();
    assert!(matches!(
        context.common_tls_context.unwrap().validation_context_type,
        Some(tls::common_tls_context::ValidationContextType::ValidationContext(_))
    ));
    let http_options = options(&c).unwrap();
    let upstream = http_options.upstream_http_protocol_options.unwrap();
    assert!(upstream.auto_sni && !upstream.auto_san_validation);
    assert!(http_options.upstream_protocol_options.is_some());

    // MUTUAL: the client certificate from the agent's files.
    let c = cluster(
        PortProtocol::Tcp,
        false,
        Some(&tls_policy(ClientTls {
            mode: TlsMode::Mutual,
            sni: "db".into(),
            client_certificate: "/c.pem".into(),
            private_key: "/k.pem".into(),
            ..Default::default()
        })),
    );
    let common = inner(&c).1.unwrap().common_tls_context.unwrap();
    let names: Vec<&str> = common
        .tls_certificate_sds_secret_configs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names, ["file-cert:/c.pem~/k.pem"]);

    // A credential ambientd does not serve: the system roots, no client certificate.
    let c = cluster(
        PortProtocol::Http,
        true,
        Some(&tls_policy(ClientTls {
            mode: TlsMode::Mutual,
            sni: "db".into(),
            credential_name: "db-credential".into(),
            ca_certificates: "/ignored.pem".into(),
            ..Default::default()
        })),
    );
    let context = inner(&c).1.unwrap();
    assert_eq!(
        validation_sds(&context).as_deref(),
        Some("file-root:system")
    );
    assert!(
        context
            .common_tls_context
            .unwrap()
            .tls_certificate_sds_secret_configs
            .is_empty()
    );
}

#[test]
fn the_top_level_policy_reaches_the_chains() {
    assert_eq!(ChainTraffic::of(None), ChainTraffic::default());
    let hashed = |key: HashKey| {
        ChainTraffic::of(Some(&TrafficPolicy {
            load_balancer: Some(LoadBalancer {
                consistent_hash: Some(ConsistentHash {
                    key,
                    algorithm: HashAlgorithm::Maglev { table_size: 0 },
                }),
                ..Default::default()
            }),
            ..Default::default()
        }))
    };
    let specifier = |traffic: ChainTraffic| traffic.hash_policy.unwrap().policy_specifier.unwrap();
    assert_eq!(
        specifier(hashed(HashKey::Header("x-user".into()))),
        hash_policy::PolicySpecifier::Header(hash_policy::Header {
            header_name: "x-user".into()
        })
    );
    assert_eq!(
        specifier(hashed(HashKey::Cookie {
            name: "session".into(),
            path: "/".into(),
            ttl: Some(Duration::from_secs(60)),
        })),
        hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
            name: "session".into(),
            ttl: duration(Duration::from_secs(60)),
            path: "/".into(),
        })
    );
    assert_eq!(
        specifier(hashed(HashKey::QueryParameter("user".into()))),
        hash_policy::PolicySpecifier::QueryParameter(hash_policy::QueryParameter {
            name: "user".into()
        })
    );
    // The source IP: the route hashes by it, and so does the TCP proxy.
    let source = hashed(HashKey::SourceIp);
    assert!(source.tcp_source_ip_hash);
    assert_eq!(
        specifier(source),
        hash_policy::PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
            source_ip: true
        })
    );
    assert_eq!(hashed(HashKey::None).hash_policy, None);
    // The TCP proxy's timeouts.
    let tcp = ChainTraffic::of(Some(&TrafficPolicy {
        connection_pool: Some(ConnectionPool {
            tcp: Some(TcpSettings {
                idle_timeout: Some(Duration::from_secs(900)),
                max_connection_duration: Some(Duration::from_secs(3600)),
                ..Default::default()
            }),
            http: None,
        }),
        ..Default::default()
    }));
    assert_eq!(tcp.tcp_idle_timeout, duration(Duration::from_secs(900)));
    assert_eq!(
        tcp.tcp_max_connection_duration,
        duration(Duration::from_secs(3600))
    );
    assert!(!tcp.tcp_source_ip_hash && tcp.hash_policy.is_none());
}
