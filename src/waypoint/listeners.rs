//! A waypoint's three listeners (istio/istio `pilot/pkg/networking/core/listener_waypoint.go`): `connect_terminate` (HBONE in),
//! `main_internal` (the matcher from VIP to port to chain, over the chains that
//! [`crate::waypoint::chains`] builds) and `connect_originate` (HBONE out).

use std::collections::BTreeMap;

use crate::pb::envoy::config::core::v3::{self as core, CidrRange, TrafficDirection};
use crate::pb::envoy::config::listener::v3::{
    self as listener, FilterChain, Listener, ListenerFilter, ListenerFilterChainMatchPredicate,
    listener_filter_chain_match_predicate as predicate,
};
use crate::pb::envoy::config::route::v3::{
    self as route, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use crate::pb::envoy::extensions::filters::common::set_filter_state::v3::{
    FilterStateValue, filter_state_value,
};
use crate::pb::envoy::extensions::filters::http::router::v3::Router;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    self as hcm, HttpConnectionManager, HttpFilter,
};
use crate::pb::envoy::extensions::filters::network::tcp_proxy::v3::{self as tcp, TcpProxy};
use crate::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use crate::pb::envoy::r#type::v3::Int32Range;
use crate::pb::google::protobuf::StringValue;
use crate::pb::xds::core::v3::{CidrRange as XdsCidrRange, TypedExtensionConfig};
use crate::pb::xds::r#type::matcher::v3::{IpMatcher, Matcher, ip_matcher, matcher};
use crate::waypoint::envoy::{self, any, empty, http_filter, network_filter, seconds, uint32};
use crate::waypoint::rbac::{self};

pub(crate) const CONNECT_TERMINATE: &str = "connect_terminate";
pub(crate) const MAIN_INTERNAL: &str = "main_internal";
pub(crate) const CONNECT_ORIGINATE: &str = "connect_originate";
pub(crate) const ENCAP: &str = "encap";
pub(crate) const DIRECT_TCP: &str = "direct-tcp";
pub(crate) const DIRECT_HTTP: &str = "direct-http";
/// The HBONE port.
pub(crate) const HBONE_PORT: u32 = 15008;

pub(crate) const ORIGINAL_DST_LOCAL: &str = "envoy.filters.listener.original_dst.local_ip";
const ORIGINAL_DST_REMOTE: &str = "envoy.filters.listener.original_dst.remote_ip";

/// How a port's traffic is handled: by its protocol, or sniffed when unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PortProtocol {
    /// HTTP/1.1.
    Http,
    /// HTTP/2 or gRPC: the HCM and the upstream speak h2.
    Http2,
    Tcp,
    /// Unknown: both chains, chosen by the sniffed application protocol.
    Auto,
}

impl PortProtocol {
    pub(crate) fn has_http(self) -> bool {
        self != PortProtocol::Tcp
    }

    pub(crate) fn has_tcp(self) -> bool {
        matches!(self, PortProtocol::Tcp | PortProtocol::Auto)
    }
}

/// One chain of `main_internal`, ready to be placed in the matcher.
pub(crate) struct Chain {
    pub(crate) chain: FilterChain,
}

/// What the listeners need to know of the waypoint.
pub(crate) struct ListenerSettings<'a> {
    pub(crate) trust_domain: &'a str,
    /// `istio.hashable_string` or `envoy.string` (`WaypointProxy::string_factory`).
    pub(crate) string_factory: &'a str,
    pub(crate) extensions: crate::waypoint::proxy::Extensions,
}

/// `connect_terminate` (§2.1): HBONE from ztunnels on 0.0.0.0:15008, mTLS with the waypoint's
/// certificate, each CONNECT stream handed to `main_internal` with its authority, client
/// address and peer identity in the filter state.
pub(crate) fn connect_terminate(s: &ListenerSettings<'_>) -> Listener {
    let tls = DownstreamTlsContext {
        common_tls_context: Some(envoy::hbone_tls(&[format!("spiffe://{}/", s.trust_domain)])),
        require_client_certificate: envoy::boolean(true),
    };
    let mut http_filters = Vec::new();
    if s.extensions.peer_metadata {
        http_filters.push(http_filter(
            "waypoint_downstream_peer_metadata",
            envoy::typed_struct(
                envoy::PEER_METADATA,
                vec![
                    (
                        "downstream_discovery",
                        envoy::list_value(vec![envoy::struct_value(vec![(
                            "workload_discovery",
                            envoy::struct_value(vec![]),
                        )])]),
                    ),
                    ("shared_with_upstream", envoy::bool_value(true)),
                ],
            ),
        ));
    }
    let value = |key: &str, format: &str, factory: Option<&str>| FilterStateValue {
        key: Some(filter_state_value::Key::ObjectKey(key.into())),
        factory_key: factory.unwrap_or_default().into(),
        value: Some(filter_state_value::Value::FormatString(
            core::SubstitutionFormatString {
                format: Some(core::substitution_format_string::Format::TextFormatSource(
                    core::DataSource {
                        specifier: Some(core::data_source::Specifier::InlineString(format.into())),
                    },
                )),
                ..Default::default()
            },
        )),
        shared_with_upstream: filter_state_value::SharedWithUpstream::Once as i32,
        ..Default::default()
    };
    let factory = Some(s.string_factory);
    http_filters.push(http_filter(
        "connect_authority",
        any(
            envoy::HTTP_SET_FILTER_STATE,
            &crate::pb::envoy::extensions::filters::http::set_filter_state::v3::Config {
                on_request_headers: vec![
                    value(ORIGINAL_DST_LOCAL, "%REQ(:AUTHORITY)%", None),
                    value("io.istio.connect_authority", "%REQ(:AUTHORITY)%", factory),
                    value(ORIGINAL_DST_REMOTE, "%DOWNSTREAM_REMOTE_ADDRESS%", None),
                    value(rbac::PEER_PRINCIPAL, "%DOWNSTREAM_PEER_URI_SAN%", factory),
                    value(
                        "io.istio.local_principal",
                        "%DOWNSTREAM_LOCAL_URI_SAN%",
                        factory,
                    ),
                ],
            },
        ),
    ));
    http_filters.push(router());
    let manager = HttpConnectionManager {
        stat_prefix: CONNECT_TERMINATE.into(),
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::RouteConfig(
            RouteConfiguration {
                name: "default".into(),
                virtual_hosts: vec![VirtualHost {
                    name: "default".into(),
                    domains: vec!["*".into()],
                    routes: vec![Route {
                        r#match: Some(RouteMatch {
                            path_specifier: Some(
                                route::route_match::PathSpecifier::ConnectMatcher(
                                    route::route_match::ConnectMatcher {},
                                ),
                            ),
                            ..Default::default()
                        }),
                        action: Some(route::route::Action::Route(RouteAction {
                            cluster_specifier: Some(
                                route::route_action::ClusterSpecifier::Cluster(
                                    MAIN_INTERNAL.into(),
                                ),
                            ),
                            upgrade_configs: vec![route::route_action::UpgradeConfig {
                                upgrade_type: "CONNECT".into(),
                                connect_config: Some(
                                    route::route_action::upgrade_config::ConnectConfig::default(),
                                ),
                                ..Default::default()
                            }],
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                }],
                ..Default::default()
            },
        )),
        http_filters,
        use_remote_address: envoy::boolean(false),
        stream_idle_timeout: seconds(0),
        upgrade_configs: vec![hcm::http_connection_manager::UpgradeConfig {
            upgrade_type: "CONNECT".into(),
            ..Default::default()
        }],
        http2_protocol_options: Some(core::Http2ProtocolOptions {
            allow_connect: true,
            max_concurrent_streams: uint32(100),
            connection_keepalive: Some(core::KeepaliveSettings {
                interval: seconds(10),
                timeout: seconds(20),
            }),
            ..Default::default()
        }),
        forward_client_cert_details:
            hcm::http_connection_manager::ForwardClientCertDetails::AppendForward as i32,
        set_current_client_cert_details: Some(
            hcm::http_connection_manager::SetCurrentClientCertDetails {
                subject: envoy::boolean(true),
                uri: true,
                dns: true,
                ..Default::default()
            },
        ),
        server_name: "istio-envoy".into(),
        ..Default::default()
    };
    Listener {
        name: CONNECT_TERMINATE.into(),
        address: Some(envoy::socket_address("0.0.0.0", HBONE_PORT)),
        connection_balance_config: Some(listener::listener::ConnectionBalanceConfig {
            balance_type: Some(
                listener::listener::connection_balance_config::BalanceType::ExactBalance(
                    Default::default(),
                ),
            ),
        }),
        filter_chains: vec![FilterChain {
            name: "default".into(),
            filters: vec![network_filter(
                "envoy.filters.network.http_connection_manager",
                any(envoy::HCM, &manager),
            )],
            transport_socket: Some(envoy::transport_socket(
                "tls",
                any(envoy::DOWNSTREAM_TLS, &tls),
            )),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `connect_originate` (§2.3): tunnels each connection it is handed as an HBONE CONNECT to
/// the address the endpoint's metadata (or the direct chains' filter state) names.
pub(crate) fn connect_originate() -> Listener {
    let proxy = TcpProxy {
        stat_prefix: CONNECT_ORIGINATE.into(),
        cluster_specifier: Some(tcp::tcp_proxy::ClusterSpecifier::Cluster(
            CONNECT_ORIGINATE.into(),
        )),
        tunneling_config: Some(tcp::tcp_proxy::TunnelingConfig {
            hostname: "%DOWNSTREAM_LOCAL_ADDRESS%".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    Listener {
        name: CONNECT_ORIGINATE.into(),
        use_original_dst: envoy::boolean(false),
        listener_filters: vec![original_dst()],
        filter_chains: vec![FilterChain {
            filters: vec![network_filter(
                "envoy.filters.network.tcp_proxy",
                any(envoy::TCP_PROXY, &proxy),
            )],
            ..Default::default()
        }],
        listener_specifier: Some(listener::listener::ListenerSpecifier::InternalListener(
            Default::default(),
        )),
        ..Default::default()
    }
}

/// One bound service's entry in `main_internal`'s matcher: its VIPs, and per port the chain
/// (or, for an unknown protocol, the sniffed choice between its HTTP and TCP chains).
pub(crate) struct ServiceMatch {
    pub(crate) vips: Vec<CidrRange>,
    pub(crate) ports: Vec<(u32, PortProtocol, String, String)>,
}

/// `main_internal` (§2.2): the service chains and the direct workload chains, chosen by the
/// destination IP, then port, then (for unknown protocols) the sniffed protocol.
pub(crate) fn main_internal(
    chains: Vec<Chain>,
    services: &[ServiceMatch],
    workload_ips: Vec<CidrRange>,
    direct: [Chain; 2],
) -> Listener {
    let mut range_matchers = Vec::new();
    // Ports whose protocol is known alike in every service: the HTTP inspector needs not
    // look at them.
    let mut port_protocols: BTreeMap<u32, Option<bool>> = BTreeMap::new();
    for service in services {
        let mut map = BTreeMap::new();
        for (port, protocol, http, tcp) in &service.ports {
            let on_match = match protocol {
                PortProtocol::Auto => {
                    port_protocols.insert(*port, None);
                    sniffed(http, tcp)
                }
                PortProtocol::Tcp => {
                    note_protocol(&mut port_protocols, *port, false);
                    action(tcp)
                }
                PortProtocol::Http | PortProtocol::Http2 => {
                    note_protocol(&mut port_protocols, *port, true);
                    action(http)
                }
            };
            map.insert(port.to_string(), on_match);
        }
        if service.vips.is_empty() || map.is_empty() {
            continue;
        }
        range_matchers.push(ip_matcher::IpRangeMatcher {
            ranges: service.vips.iter().map(xds_cidr).collect(),
            on_match: Some(nested(tree(
                "port",
                envoy::DESTINATION_PORT,
                matcher::matcher_tree::TreeType::ExactMatchMap(matcher::matcher_tree::MatchMap {
                    map,
                }),
            ))),
            ..Default::default()
        });
    }
    let workloads_bound = !workload_ips.is_empty();
    if workloads_bound {
        range_matchers.push(ip_matcher::IpRangeMatcher {
            ranges: workload_ips.iter().map(xds_cidr).collect(),
            on_match: Some(sniffed(DIRECT_HTTP, DIRECT_TCP)),
            ..Default::default()
        });
    }
    let ip_tree = tree(
        "ip",
        envoy::DESTINATION_IP,
        matcher::matcher_tree::TreeType::CustomMatch(TypedExtensionConfig {
            name: "ip".into(),
            typed_config: Some(any(envoy::IP_MATCHER, &IpMatcher { range_matchers })),
        }),
    );
    let mut http_inspector = ListenerFilter {
        name: "envoy.filters.listener.http_inspector".into(),
        config_type: Some(listener::listener_filter::ConfigType::TypedConfig(empty(
            envoy::HTTP_INSPECTOR,
        ))),
        ..Default::default()
    };
    // With workloads bound any port may need sniffing; without, only ambiguous ones do.
    let known: Vec<u32> = port_protocols
        .iter()
        .filter(|(_, protocol)| protocol.is_some())
        .map(|(port, _)| *port)
        .collect();
    if !workloads_bound && !known.is_empty() {
        http_inspector.filter_disabled = Some(port_predicate(&known));
    }
    let mut filter_chains: Vec<FilterChain> = chains.into_iter().map(|c| c.chain).collect();
    filter_chains.extend(direct.into_iter().map(|c| c.chain));
    Listener {
        name: MAIN_INTERNAL.into(),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters: vec![original_dst(), http_inspector],
        filter_chains,
        filter_chain_matcher: Some(ip_tree),
        listener_specifier: Some(listener::listener::ListenerSpecifier::InternalListener(
            Default::default(),
        )),
        ..Default::default()
    }
}

/// Records a port's protocol; an HTTP and a TCP port of the same number make it ambiguous.
fn note_protocol(ports: &mut BTreeMap<u32, Option<bool>>, port: u32, http: bool) {
    match ports.get(&port) {
        None => {
            ports.insert(port, Some(http));
        }
        Some(Some(known)) if *known != http => {
            ports.insert(port, None);
        }
        _ => {}
    }
}

/// OR of `[p, p+1)` ranges, as istiod writes the inspector's `filter_disabled`.
fn port_predicate(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    let range = |p: u32| ListenerFilterChainMatchPredicate {
        rule: Some(predicate::Rule::DestinationPortRange(Int32Range {
            start: p as i32,
            end: p as i32 + 1,
        })),
    };
    if let [only] = ports {
        return range(*only);
    }
    ListenerFilterChainMatchPredicate {
        rule: Some(predicate::Rule::OrMatch(predicate::MatchSet {
            rules: ports.iter().map(|p| range(*p)).collect(),
        })),
    }
}

fn xds_cidr(range: &CidrRange) -> XdsCidrRange {
    XdsCidrRange {
        address_prefix: range.address_prefix.clone(),
        prefix_len: range.prefix_len,
    }
}

fn tree(name: &str, input: &str, tree_type: matcher::matcher_tree::TreeType) -> Matcher {
    Matcher {
        matcher_type: Some(matcher::MatcherType::MatcherTree(matcher::MatcherTree {
            input: Some(TypedExtensionConfig {
                name: name.into(),
                typed_config: Some(empty(input)),
            }),
            tree_type: Some(tree_type),
        })),
        on_no_match: None,
    }
}

fn nested(m: Matcher) -> matcher::OnMatch {
    matcher::OnMatch {
        on_match: Some(matcher::on_match::OnMatch::Matcher(Box::new(m))),
        ..Default::default()
    }
}

/// The leaf naming a filter chain (istiod's `match.ToChain`).
fn action(chain: &str) -> matcher::OnMatch {
    matcher::OnMatch {
        on_match: Some(matcher::on_match::OnMatch::Action(TypedExtensionConfig {
            name: chain.into(),
            typed_config: Some(any(
                envoy::STRING_VALUE,
                &StringValue {
                    value: chain.into(),
                },
            )),
        })),
        ..Default::default()
    }
}

/// HTTP (`h2c`, `http/1.1`) to `http`, anything else to `tcp`.
fn sniffed(http: &str, tcp: &str) -> matcher::OnMatch {
    let map = [("h2c", action(http)), ("http/1.1", action(http))]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mut m = tree(
        "application-protocol",
        envoy::APPLICATION_PROTOCOL,
        matcher::matcher_tree::TreeType::ExactMatchMap(matcher::matcher_tree::MatchMap { map }),
    );
    m.on_no_match = Some(Box::new(action(tcp)));
    nested(m)
}

fn original_dst() -> ListenerFilter {
    ListenerFilter {
        name: "envoy.filters.listener.original_dst".into(),
        config_type: Some(listener::listener_filter::ConfigType::TypedConfig(empty(
            envoy::ORIGINAL_DST,
        ))),
        ..Default::default()
    }
}

pub(crate) fn router() -> HttpFilter {
    http_filter(
        "envoy.filters.http.router",
        any(envoy::ROUTER, &Router::default()),
    )
}
