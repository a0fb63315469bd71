//! The filter chains of `main_internal` (istio/istio `pilot/pkg/networking/core/listener_waypoint.go`): each bound service port's HTTP
//! chain (an HCM with `jwt_authn`, RBAC, and its routes or the default route) and TCP chain
//! (RBAC, then `tcp_proxy`), and the direct workload chains `direct-http` and `direct-tcp`.

use crate::pb::envoy::config::core::v3 as core;
use crate::pb::envoy::config::listener::v3::{self as listener, FilterChain};
use crate::pb::envoy::config::route::v3::{
    self as route, Decorator, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost,
};
use crate::pb::envoy::extensions::filters::common::set_filter_state::v3::{
    FilterStateValue, filter_state_value,
};
use crate::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    self as hcm, HttpConnectionManager, HttpFilter,
};
use crate::pb::envoy::extensions::filters::network::tcp_proxy::v3::{self as tcp, TcpProxy};
use crate::waypoint::envoy::{self, any, empty, http_filter, network_filter, seconds, uint32};
use crate::waypoint::listeners::{
    Chain, DIRECT_HTTP, DIRECT_TCP, ENCAP, ListenerSettings, ORIGINAL_DST_LOCAL, PortProtocol,
    router,
};
use crate::waypoint::rbac::ChainKind;
use crate::waypoint::traffic_policy::ChainTraffic;

/// What a service chain needs: its name, port, protocol, cluster and policies.
pub(crate) struct ChainSpec<'a> {
    pub(crate) name: &'a str,
    pub(crate) hostname: &'a str,
    pub(crate) port: u32,
    pub(crate) protocol: PortProtocol,
    pub(crate) cluster: &'a str,
    pub(crate) rbac: Vec<crate::pb::envoy::config::rbac::v3::Rbac>,
    /// What the service's DestinationRule changes in the chain.
    pub(crate) traffic: &'a ChainTraffic,
    /// The chain's `jwt_authn` filter (HTTP chains with RequestAuthentications).
    pub(crate) jwt: Option<JwtAuthentication>,
    /// The chain's routes from Gateway API routes (`crate::waypoint::routes`); `None`: the
    /// default route.
    pub(crate) routes: Option<Vec<Route>>,
}

/// A service's HTTP chain `inbound-vip|<port>|http|<host>` (§2.2): an HCM with the service's
/// `jwt_authn` and RBAC, and its routes, or the default route to its cluster (§4.2).
pub(crate) fn http_chain(spec: ChainSpec<'_>, s: &ListenerSettings<'_>) -> Chain {
    let mut filters = auth_filters(spec.jwt.as_ref(), &spec.rbac);
    filters.push(http_filter(
        "envoy.filters.http.grpc_stats",
        any(
            envoy::GRPC_STATS,
            &crate::pb::envoy::extensions::filters::http::grpc_stats::v3::FilterConfig {
                emit_filter_state: true,
                per_method_stat_specifier: Some(
                    crate::pb::envoy::extensions::filters::http::grpc_stats::v3::filter_config::PerMethodStatSpecifier::StatsForAllMethods(
                        envoy::boolean(false).unwrap_or_default(),
                    ),
                ),
            },
        ),
    ));
    filters.push(http_filter("envoy.filters.http.fault", empty(envoy::FAULT)));
    filters.push(http_filter("envoy.filters.http.cors", empty(envoy::CORS)));
    if s.extensions.peer_metadata {
        filters.push(http_filter(
            "waypoint_upstream_peer_metadata",
            envoy::typed_struct(
                envoy::PEER_METADATA,
                vec![(
                    "upstream_discovery",
                    envoy::list_value(vec![envoy::struct_value(vec![(
                        "workload_discovery",
                        envoy::struct_value(vec![]),
                    )])]),
                )],
            ),
        ));
    }
    if s.extensions.stats {
        filters.push(http_filter(
            "istio.stats",
            envoy::typed_struct(
                envoy::ISTIO_STATS,
                vec![("reporter", envoy::string_value("SERVER_GATEWAY"))],
            ),
        ));
    }
    filters.push(router());
    // istiod's route config from routes has no direct-response limit; the default one has.
    let (routes, max_direct_response) = match spec.routes {
        Some(routes) => (routes, None),
        None => (
            vec![default_route(
                spec.cluster,
                spec.hostname,
                spec.port,
                spec.traffic,
            )],
            uint32(1024 * 1024),
        ),
    };
    let route_config = RouteConfiguration {
        name: spec.name.into(),
        validate_clusters: envoy::boolean(false),
        max_direct_response_body_size_bytes: max_direct_response,
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{}", spec.port),
            domains: vec!["*".into()],
            routes,
        }],
    };
    let manager = http_manager(
        &format!("inbound_0.0.0.0_{};", spec.port),
        route_config,
        filters,
        spec.protocol == PortProtocol::Http2,
    );
    Chain {
        chain: FilterChain {
            name: spec.name.into(),
            filters: vec![network_filter(
                "envoy.filters.network.http_connection_manager",
                any(envoy::HCM, &manager),
            )],
            ..Default::default()
        },
    }
}

/// A service's TCP chain `inbound-vip|<port>|tcp|<host>`: its RBAC, then tcp_proxy to its
/// cluster.
pub(crate) fn tcp_chain(spec: ChainSpec<'_>, s: &ListenerSettings<'_>) -> Chain {
    let mut filters = Vec::new();
    if s.extensions.metadata_exchange {
        filters.push(metadata_exchange());
    }
    filters.extend(spec.rbac.iter().map(network_rbac));
    filters.push(tcp_proxy(spec.name, spec.cluster, spec.traffic));
    Chain {
        chain: FilterChain {
            name: spec.name.into(),
            filters,
            ..Default::default()
        },
    }
}

/// `direct-tcp` and `direct-http` (§2.2): traffic for a bound workload's own IP, sent on to
/// it through `encap`, with the waypoint's own policies (and, on HTTP, its own
/// RequestAuthentications' `jwt_authn`).
pub(crate) fn direct_chains(
    rbac_tcp: &[crate::pb::envoy::config::rbac::v3::Rbac],
    rbac_http: &[crate::pb::envoy::config::rbac::v3::Rbac],
    jwt_http: Option<&JwtAuthentication>,
    s: &ListenerSettings<'_>,
) -> [Chain; 2] {
    let authority = network_filter(
        "connect_authority",
        any(
            envoy::NETWORK_SET_FILTER_STATE,
            &crate::pb::envoy::extensions::filters::network::set_filter_state::v3::Config {
                on_new_connection: vec![FilterStateValue {
                    key: Some(filter_state_value::Key::ObjectKey(
                        ORIGINAL_DST_LOCAL.into(),
                    )),
                    value: Some(filter_state_value::Value::FormatString(
                        core::SubstitutionFormatString {
                            format: Some(
                                core::substitution_format_string::Format::TextFormatSource(
                                    core::DataSource {
                                        specifier: Some(
                                            core::data_source::Specifier::InlineString(format!(
                                                "%FILTER_STATE({ORIGINAL_DST_LOCAL}:PLAIN)%"
                                            )),
                                        ),
                                    },
                                ),
                            ),
                            ..Default::default()
                        },
                    )),
                    shared_with_upstream: filter_state_value::SharedWithUpstream::Once as i32,
                    ..Default::default()
                }],
            },
        ),
    );
    let mut tcp_filters = vec![authority.clone()];
    if s.extensions.metadata_exchange {
        tcp_filters.push(metadata_exchange());
    }
    tcp_filters.extend(rbac_tcp.iter().map(network_rbac));
    tcp_filters.push(tcp_proxy(ENCAP, ENCAP, &ChainTraffic::default()));
    let mut http_filters = auth_filters(jwt_http, rbac_http);
    http_filters.push(router());
    let route_config = RouteConfiguration {
        name: ENCAP.into(),
        validate_clusters: envoy::boolean(false),
        virtual_hosts: vec![VirtualHost {
            name: "inbound|http|0".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(prefix_root()),
                action: Some(route::route::Action::Route(RouteAction {
                    cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(
                        ENCAP.into(),
                    )),
                    timeout: seconds(0),
                    ..Default::default()
                })),
                ..Default::default()
            }],
        }],
        ..Default::default()
    };
    let manager = http_manager("inbound_0.0.0.0_0;", route_config, http_filters, false);
    [
        Chain {
            chain: FilterChain {
                name: DIRECT_TCP.into(),
                filters: tcp_filters,
                ..Default::default()
            },
        },
        Chain {
            chain: FilterChain {
                name: DIRECT_HTTP.into(),
                filters: vec![
                    authority,
                    network_filter(
                        "envoy.filters.network.http_connection_manager",
                        any(envoy::HCM, &manager),
                    ),
                ],
                ..Default::default()
            },
        },
    ]
}

/// The filters an HTTP chain starts with (§2.2's order): `jwt_authn`, then one RBAC filter
/// per action. Each RBAC filter counts the rules that matched by name
/// (`http.<prefix>rbac.policy.<rule>.allowed|denied` in Envoy's stats), which istiod does not
/// ask for: a denial then names its policy without an access log.
fn auth_filters(
    jwt: Option<&JwtAuthentication>,
    rbac: &[crate::pb::envoy::config::rbac::v3::Rbac],
) -> Vec<HttpFilter> {
    let jwt = jwt.map(|config| {
        http_filter(
            crate::waypoint::jwt::JWT_AUTHN,
            any(envoy::JWT_AUTHN, config),
        )
    });
    let rbac = rbac.iter().map(|rules| {
        http_filter(
            "envoy.filters.http.rbac",
            any(
                envoy::HTTP_RBAC,
                &crate::pb::envoy::extensions::filters::http::rbac::v3::Rbac {
                    rules: Some(rules.clone()),
                    track_per_rule_stats: true,
                    ..Default::default()
                },
            ),
        )
    });
    jwt.into_iter().chain(rbac).collect()
}

fn http_manager(
    stat_prefix: &str,
    route_config: RouteConfiguration,
    http_filters: Vec<HttpFilter>,
    http2: bool,
) -> HttpConnectionManager {
    HttpConnectionManager {
        stat_prefix: stat_prefix.into(),
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::RouteConfig(
            route_config,
        )),
        http_filters,
        use_remote_address: envoy::boolean(false),
        stream_idle_timeout: seconds(0),
        upgrade_configs: vec![hcm::http_connection_manager::UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        normalize_path: envoy::boolean(true),
        path_with_escaped_slashes_action:
            hcm::http_connection_manager::PathWithEscapedSlashesAction::KeepUnchanged as i32,
        http2_protocol_options: http2.then(core::Http2ProtocolOptions::default),
        server_name: "istio-envoy".into(),
        ..Default::default()
    }
}

fn prefix_root() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(route::route_match::PathSpecifier::Prefix("/".into())),
        ..Default::default()
    }
}

/// istiod's default route for a service port without routes (§4.2), hashing by the
/// DestinationRule's consistent-hash key if it has one.
fn default_route(cluster: &str, hostname: &str, port: u32, traffic: &ChainTraffic) -> Route {
    Route {
        name: "default".into(),
        r#match: Some(prefix_root()),
        decorator: Some(Decorator {
            operation: format!("{hostname}:{port}/*"),
            ..Default::default()
        }),
        action: Some(route::route::Action::Route(RouteAction {
            cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(
                cluster.into(),
            )),
            timeout: seconds(0),
            max_grpc_timeout: seconds(0),
            retry_policy: Some(default_retry_policy()),
            hash_policy: traffic.hash_policy.clone().into_iter().collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Istio's default retry policy (the mesh's `defaultHttpRetryPolicy` unset): two retries on
/// connection failures, refused streams and `unavailable`, on another host.
pub(crate) fn default_retry_policy() -> RetryPolicy {
    RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: uint32(2),
        retry_host_predicate: vec![route::retry_policy::RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(
                route::retry_policy::retry_host_predicate::ConfigType::TypedConfig(empty(
                    envoy::PREVIOUS_HOSTS,
                )),
            ),
        }],
        host_selection_retry_max_attempts: 5,
        ..Default::default()
    }
}

/// A service's TCP proxy, with its DestinationRule's idle timeout, connection duration and
/// source-IP hash.
fn tcp_proxy(stat_prefix: &str, cluster: &str, traffic: &ChainTraffic) -> listener::Filter {
    use crate::pb::envoy::r#type::v3::{HashPolicy, hash_policy};
    network_filter(
        "envoy.filters.network.tcp_proxy",
        any(
            envoy::TCP_PROXY,
            &TcpProxy {
                stat_prefix: stat_prefix.into(),
                cluster_specifier: Some(tcp::tcp_proxy::ClusterSpecifier::Cluster(cluster.into())),
                idle_timeout: traffic.tcp_idle_timeout,
                max_downstream_connection_duration: traffic.tcp_max_connection_duration,
                hash_policy: if traffic.tcp_source_ip_hash {
                    vec![HashPolicy {
                        policy_specifier: Some(hash_policy::PolicySpecifier::SourceIp(
                            hash_policy::SourceIp {},
                        )),
                    }]
                } else {
                    Vec::new()
                },
                ..Default::default()
            },
        ),
    )
}

fn network_rbac(rules: &crate::pb::envoy::config::rbac::v3::Rbac) -> listener::Filter {
    network_filter(
        "envoy.filters.network.rbac",
        any(
            envoy::NETWORK_RBAC,
            &crate::pb::envoy::extensions::filters::network::rbac::v3::Rbac {
                rules: Some(rules.clone()),
                stat_prefix: "tcp.".into(),
                ..Default::default()
            },
        ),
    )
}

fn metadata_exchange() -> listener::Filter {
    network_filter(
        "istio.metadata_exchange",
        envoy::typed_struct(
            envoy::METADATA_EXCHANGE,
            vec![
                ("protocol", envoy::string_value("istio-peer-exchange")),
                ("enable_discovery", envoy::bool_value(true)),
            ],
        ),
    )
}

/// The chain kind RBAC translates for.
pub(crate) fn rbac_kind(http: bool) -> ChainKind {
    if http {
        ChainKind::Http
    } else {
        ChainKind::Tcp
    }
}
