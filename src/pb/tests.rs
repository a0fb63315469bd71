//! The trimmed Envoy/xDS messages encode and decode as upstream's do: a waypoint-shaped
//! Listener round-trips through its bytes (an HttpConnectionManager inside an `Any`, a filter
//! chain matcher over destination IP and port), a few tags are checked byte for byte, and every
//! top-level message's `prost::Name` gives upstream's type URL.

use bytes::Bytes;
use prost::{Message, Name};
use std::collections::BTreeMap;

use crate::pb::envoy::config::cluster::v3 as cluster;
use crate::pb::envoy::config::core::v3 as envoy_core;
use crate::pb::envoy::config::endpoint::v3 as endpoint;
use crate::pb::envoy::config::listener::v3 as listener;
use crate::pb::envoy::config::rbac::v3 as rbac;
use crate::pb::envoy::config::route::v3 as route;
use crate::pb::envoy::extensions::filters::common::set_filter_state::v3 as set_filter_state;
use crate::pb::envoy::extensions::filters::http::cors::v3 as cors;
use crate::pb::envoy::extensions::filters::http::fault::v3 as fault;
use crate::pb::envoy::extensions::filters::http::grpc_stats::v3 as grpc_stats;
use crate::pb::envoy::extensions::filters::http::jwt_authn::v3 as jwt_authn;
use crate::pb::envoy::extensions::filters::http::rbac::v3 as http_rbac;
use crate::pb::envoy::extensions::filters::http::router::v3 as router;
use crate::pb::envoy::extensions::filters::http::set_filter_state::v3 as http_set_filter_state;
use crate::pb::envoy::extensions::filters::listener::http_inspector::v3 as http_inspector;
use crate::pb::envoy::extensions::filters::listener::original_dst::v3 as original_dst;
use crate::pb::envoy::extensions::filters::listener::tls_inspector::v3 as tls_inspector;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use crate::pb::envoy::extensions::filters::network::rbac::v3 as network_rbac;
use crate::pb::envoy::extensions::filters::network::set_filter_state::v3 as network_set_filter_state;
use crate::pb::envoy::extensions::filters::network::tcp_proxy::v3 as tcp_proxy;
use crate::pb::envoy::extensions::matching::common_inputs::network::v3 as network_inputs;
use crate::pb::envoy::extensions::path::r#match::uri_template::v3 as uri_template;
use crate::pb::envoy::extensions::transport_sockets::internal_upstream::v3 as internal_upstream;
use crate::pb::envoy::extensions::transport_sockets::raw_buffer::v3 as raw_buffer;
use crate::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use crate::pb::envoy::extensions::upstreams::http::v3 as upstream_http;
use crate::pb::envoy::r#type::matcher::v3 as matcher;
use crate::pb::envoy::r#type::metadata::v3 as metadata;
use crate::pb::envoy::r#type::v3 as types;
use crate::pb::google::protobuf::{Any, BoolValue, Duration, StringValue, UInt32Value};
use crate::pb::udpa::r#type::v1 as udpa_type;
use crate::pb::xds::core::v3 as xds_core;
use crate::pb::xds::r#type::matcher::v3 as xds_matcher;
use crate::pb::xds::r#type::v3 as xds_type;

/// `m` packed in an `Any`, as a typed_config or a resource is.
fn any<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: Bytes::from(m.encode_to_vec()),
    }
}

fn unpack<M: Message + Name + Default>(any: &Any) -> M {
    assert_eq!(any.type_url, M::type_url());
    M::decode(any.value.clone()).expect("decodes")
}

fn extension(name: &str, config: Any) -> xds_core::TypedExtensionConfig {
    xds_core::TypedExtensionConfig {
        name: name.into(),
        typed_config: Some(config),
    }
}

/// Istio's way of naming the filter chain a matcher selects: a StringValue action.
fn select_chain(chain: &str) -> xds_matcher::matcher::OnMatch {
    xds_matcher::matcher::OnMatch {
        on_match: Some(xds_matcher::matcher::on_match::OnMatch::Action(extension(
            chain,
            any(&StringValue {
                value: chain.into(),
            }),
        ))),
        keep_matching: false,
    }
}

fn http_connection_manager(chain: &str, cluster: &str) -> hcm::HttpConnectionManager {
    use hcm::http_connection_manager::{CodecType, RouteSpecifier, UpgradeConfig};
    let route = route::Route {
        name: "default".into(),
        r#match: Some(route::RouteMatch {
            path_specifier: Some(route::route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        action: Some(route::route::Action::Route(route::RouteAction {
            cluster_specifier: Some(route::route_action::ClusterSpecifier::Cluster(
                cluster.into(),
            )),
            timeout: Some(Duration {
                seconds: 0,
                nanos: 0,
            }),
            max_grpc_timeout: Some(Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    hcm::HttpConnectionManager {
        codec_type: CodecType::Auto as i32,
        stat_prefix: chain.into(),
        route_specifier: Some(RouteSpecifier::RouteConfig(route::RouteConfiguration {
            name: chain.into(),
            virtual_hosts: vec![route::VirtualHost {
                name: "inbound|http|80".into(),
                domains: vec!["*".into()],
                routes: vec![route],
            }],
            validate_clusters: Some(BoolValue { value: false }),
            ..Default::default()
        })),
        http_filters: vec![hcm::HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(any(
                &router::Router::default(),
            ))),
            ..Default::default()
        }],
        use_remote_address: Some(BoolValue { value: false }),
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        normalize_path: Some(BoolValue { value: true }),
        ..Default::default()
    }
}

/// A waypoint's main listener: an internal listener whose filter chain is chosen by
/// destination IP (a CIDR trie), then destination port.
fn waypoint_listener() -> listener::Listener {
    let chain = "inbound-vip|80|http|reviews.default.svc.cluster.local";
    let by_port = xds_matcher::Matcher {
        matcher_type: Some(xds_matcher::matcher::MatcherType::MatcherTree(
            xds_matcher::matcher::MatcherTree {
                input: Some(extension(
                    "port",
                    any(&network_inputs::DestinationPortInput {}),
                )),
                tree_type: Some(xds_matcher::matcher::matcher_tree::TreeType::ExactMatchMap(
                    xds_matcher::matcher::matcher_tree::MatchMap {
                        map: BTreeMap::from([("80".to_string(), select_chain(chain))]),
                    },
                )),
            },
        )),
        on_no_match: None,
    };
    let by_ip = xds_matcher::IpMatcher {
        range_matchers: vec![xds_matcher::ip_matcher::IpRangeMatcher {
            ranges: vec![xds_core::CidrRange {
                address_prefix: "10.96.0.10".into(),
                prefix_len: Some(UInt32Value { value: 32 }),
            }],
            on_match: Some(xds_matcher::matcher::OnMatch {
                on_match: Some(xds_matcher::matcher::on_match::OnMatch::Matcher(Box::new(
                    by_port,
                ))),
                keep_matching: false,
            }),
            exclusive: false,
        }],
    };
    let matcher = xds_matcher::Matcher {
        matcher_type: Some(xds_matcher::matcher::MatcherType::MatcherTree(
            xds_matcher::matcher::MatcherTree {
                input: Some(extension("ip", any(&network_inputs::DestinationIpInput {}))),
                tree_type: Some(xds_matcher::matcher::matcher_tree::TreeType::CustomMatch(
                    extension("ip", any(&by_ip)),
                )),
            },
        )),
        on_no_match: Some(Box::new(select_chain("passthrough"))),
    };
    listener::Listener {
        name: "main_internal".into(),
        filter_chains: vec![listener::FilterChain {
            name: chain.into(),
            filters: vec![listener::Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(listener::filter::ConfigType::TypedConfig(any(
                    &http_connection_manager(
                        chain,
                        "inbound-vip|80|http|reviews.default.svc.cluster.local",
                    ),
                ))),
            }],
            ..Default::default()
        }],
        filter_chain_matcher: Some(matcher),
        use_original_dst: Some(BoolValue { value: false }),
        listener_filters: vec![listener::ListenerFilter {
            name: "envoy.filters.listener.original_dst".into(),
            config_type: Some(listener::listener_filter::ConfigType::TypedConfig(any(
                &original_dst::OriginalDst {},
            ))),
            filter_disabled: None,
        }],
        traffic_direction: envoy_core::TrafficDirection::Inbound as i32,
        listener_specifier: Some(listener::listener::ListenerSpecifier::InternalListener(
            listener::listener::InternalListenerConfig {},
        )),
        ..Default::default()
    }
}

#[test]
fn a_waypoint_listener_round_trips() {
    let listener = waypoint_listener();
    let bytes = listener.encode_to_vec();
    let decoded = listener::Listener::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(decoded, listener);
    // Maps are BTreeMaps: the same content is the same bytes.
    assert_eq!(decoded.encode_to_vec(), bytes);
    assert_eq!(
        any(&listener).type_url,
        "type.googleapis.com/envoy.config.listener.v3.Listener"
    );

    // The HCM comes back out of its Any.
    let Some(listener::filter::ConfigType::TypedConfig(config)) =
        &decoded.filter_chains[0].filters[0].config_type
    else {
        panic!("no typed_config");
    };
    assert_eq!(
        config.type_url,
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
    );
    let manager: hcm::HttpConnectionManager = unpack(config);
    assert_eq!(
        manager,
        http_connection_manager(
            &manager.stat_prefix,
            "inbound-vip|80|http|reviews.default.svc.cluster.local"
        )
    );

    // So does the IP matcher, and the port tree under it selects the chain.
    let Some(xds_matcher::matcher::MatcherType::MatcherTree(tree)) =
        &decoded.filter_chain_matcher.as_ref().unwrap().matcher_type
    else {
        panic!("no matcher tree");
    };
    let Some(xds_matcher::matcher::matcher_tree::TreeType::CustomMatch(custom)) = &tree.tree_type
    else {
        panic!("no custom match");
    };
    let ip: xds_matcher::IpMatcher = unpack(custom.typed_config.as_ref().unwrap());
    let on_match = ip.range_matchers[0].on_match.as_ref().unwrap();
    let Some(xds_matcher::matcher::on_match::OnMatch::Matcher(by_port)) = &on_match.on_match else {
        panic!("no nested matcher");
    };
    let Some(xds_matcher::matcher::MatcherType::MatcherTree(ports)) = &by_port.matcher_type else {
        panic!("no port tree");
    };
    let Some(xds_matcher::matcher::matcher_tree::TreeType::ExactMatchMap(map)) = &ports.tree_type
    else {
        panic!("no exact match map");
    };
    assert_eq!(map.map["80"], select_chain(&manager.stat_prefix));
}

/// A few fields, byte for byte: their tags carry upstream's numbers, and a oneof member holding
/// its zero value is still sent (a plain proto3 field would not be).
#[test]
fn tags_are_upstreams() {
    // Listener.filter_chain_matcher = 32: tag (32 << 3) | 2 = 258, varint 0x82 0x02.
    let listener = listener::Listener {
        filter_chain_matcher: Some(xds_matcher::Matcher::default()),
        ..Default::default()
    };
    assert_eq!(listener.encode_to_vec(), [0x82, 0x02, 0x00]);
    // Listener.internal_listener = 27 (oneof listener_specifier): (27 << 3) | 2 = 218.
    let listener = listener::Listener {
        listener_specifier: Some(listener::listener::ListenerSpecifier::InternalListener(
            Default::default(),
        )),
        ..Default::default()
    };
    assert_eq!(listener.encode_to_vec(), [0xda, 0x01, 0x00]);
    // Cluster.type = 2 is in the oneof cluster_discovery_type: STATIC (0) is on the wire.
    let cluster = cluster::Cluster {
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Static as i32,
        )),
        ..Default::default()
    };
    assert_eq!(cluster.encode_to_vec(), [0x10, 0x00]);
    // SocketAddress.port_value = 3 is in the oneof port_specifier.
    let address = envoy_core::SocketAddress {
        port_specifier: Some(envoy_core::socket_address::PortSpecifier::PortValue(0)),
        ..Default::default()
    };
    assert_eq!(address.encode_to_vec(), [0x18, 0x00]);
    // Node.extensions = 9, Extension.type_urls = 6.
    let node = crate::pb::xds::Node {
        extensions: vec![envoy_core::Extension {
            type_urls: vec!["t".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(node.encode_to_vec(), [0x4a, 0x03, 0x32, 0x01, b't']);
    // Cluster.load_assignment = 33, ClusterLoadAssignment.cluster_name = 1.
    let cluster = cluster::Cluster {
        load_assignment: Some(endpoint::ClusterLoadAssignment {
            cluster_name: "c".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        cluster.encode_to_vec(),
        [0x8a, 0x02, 0x03, 0x0a, 0x01, b'c']
    );
}

/// The fields of `jwt_authn`, the metadata matchers, and RBAC's JWT and template fields, by
/// upstream's numbers.
#[test]
fn jwt_and_metadata_tags_are_upstreams() {
    use crate::pb::google::protobuf::Empty;
    let provider = jwt_authn::JwtProvider {
        jwks_source_specifier: Some(jwt_authn::jwt_provider::JwksSourceSpecifier::LocalJwks(
            envoy_core::DataSource::default(),
        )),
        ..Default::default()
    };
    // local_jwks = 4.
    assert_eq!(provider.encode_to_vec(), [0x22, 0x00]);
    let provider = jwt_authn::JwtProvider {
        payload_in_metadata: "p".into(),
        clear_route_cache: true,
        normalize_payload_in_metadata: Some(Default::default()),
        from_cookies: vec!["c".into()],
        ..Default::default()
    };
    // payload_in_metadata = 9, from_cookies = 13, clear_route_cache = 17,
    // normalize_payload_in_metadata = 18.
    assert_eq!(
        provider.encode_to_vec(),
        [
            0x4a, 0x01, b'p', 0x6a, 0x01, b'c', 0x88, 0x01, 0x01, 0x92, 0x01, 0x00
        ]
    );
    let requirement = |r| jwt_authn::JwtRequirement {
        requires_type: Some(r),
    };
    use jwt_authn::jwt_requirement::RequiresType;
    // allow_missing = 6, allow_missing_or_failed = 5, requires_all = 4.
    assert_eq!(
        requirement(RequiresType::AllowMissing(Empty {})).encode_to_vec(),
        [0x32, 0x00]
    );
    assert_eq!(
        requirement(RequiresType::AllowMissingOrFailed(Empty {})).encode_to_vec(),
        [0x2a, 0x00]
    );
    assert_eq!(
        requirement(RequiresType::RequiresAll(Default::default())).encode_to_vec(),
        [0x22, 0x00]
    );
    // JwtAuthentication.bypass_cors_preflight = 4.
    let config = jwt_authn::JwtAuthentication {
        bypass_cors_preflight: true,
        ..Default::default()
    };
    assert_eq!(config.encode_to_vec(), [0x20, 0x01]);
    // Principal.metadata = 7; ValueMatcher.list_match = 6, or_match = 7.
    let principal = rbac::Principal {
        identifier: Some(rbac::principal::Identifier::Metadata(Default::default())),
    };
    assert_eq!(principal.encode_to_vec(), [0x3a, 0x00]);
    let list = matcher::ValueMatcher {
        match_pattern: Some(matcher::value_matcher::MatchPattern::ListMatch(
            Box::default(),
        )),
    };
    assert_eq!(list.encode_to_vec(), [0x32, 0x00]);
    let or = matcher::ValueMatcher {
        match_pattern: Some(matcher::value_matcher::MatchPattern::OrMatch(
            Default::default(),
        )),
    };
    assert_eq!(or.encode_to_vec(), [0x3a, 0x00]);
    // Permission.uri_template = 13.
    let permission = rbac::Permission {
        rule: Some(rbac::permission::Rule::UriTemplate(Default::default())),
    };
    assert_eq!(permission.encode_to_vec(), [0x6a, 0x00]);
    // The HTTP RBAC filter's track_per_rule_stats = 7.
    let filter = http_rbac::Rbac {
        track_per_rule_stats: true,
        ..Default::default()
    };
    assert_eq!(filter.encode_to_vec(), [0x38, 0x01]);
}

#[test]
fn an_sds_secret_round_trips() {
    let secret = tls::Secret {
        name: "default".into(),
        r#type: Some(tls::secret::Type::TlsCertificate(tls::TlsCertificate {
            certificate_chain: Some(envoy_core::DataSource {
                specifier: Some(envoy_core::data_source::Specifier::InlineBytes(
                    Bytes::from_static(b"-----BEGIN CERTIFICATE-----"),
                )),
            }),
            private_key: Some(envoy_core::DataSource {
                specifier: Some(envoy_core::data_source::Specifier::InlineBytes(
                    Bytes::from_static(b"-----BEGIN PRIVATE KEY-----"),
                )),
            }),
        })),
    };
    let packed = any(&secret);
    assert_eq!(
        packed.type_url,
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    );
    assert_eq!(unpack::<tls::Secret>(&packed), secret);
}

fn check<T: Name>(full_name: &str) {
    assert_eq!(T::full_name(), full_name);
    assert_eq!(T::type_url(), format!("type.googleapis.com/{full_name}"));
}

/// Every top-level message of the trimmed packages has upstream's type URL (nested messages
/// are named the same way: `listener::listener::InternalListenerConfig` is
/// `envoy.config.listener.v3.Listener.InternalListenerConfig`).
#[test]
fn type_urls_are_upstreams() {
    check::<cluster::Cluster>("envoy.config.cluster.v3.Cluster");
    check::<cluster::CircuitBreakers>("envoy.config.cluster.v3.CircuitBreakers");
    check::<envoy_core::Pipe>("envoy.config.core.v3.Pipe");
    check::<envoy_core::EnvoyInternalAddress>("envoy.config.core.v3.EnvoyInternalAddress");
    check::<envoy_core::SocketAddress>("envoy.config.core.v3.SocketAddress");
    check::<envoy_core::Address>("envoy.config.core.v3.Address");
    check::<envoy_core::CidrRange>("envoy.config.core.v3.CidrRange");
    check::<envoy_core::Locality>("envoy.config.core.v3.Locality");
    check::<envoy_core::Extension>("envoy.config.core.v3.Extension");
    check::<envoy_core::Metadata>("envoy.config.core.v3.Metadata");
    check::<envoy_core::DataSource>("envoy.config.core.v3.DataSource");
    check::<envoy_core::TransportSocket>("envoy.config.core.v3.TransportSocket");
    check::<envoy_core::TypedExtensionConfig>("envoy.config.core.v3.TypedExtensionConfig");
    check::<envoy_core::GrpcService>("envoy.config.core.v3.GrpcService");
    check::<envoy_core::ApiConfigSource>("envoy.config.core.v3.ApiConfigSource");
    check::<envoy_core::AggregatedConfigSource>("envoy.config.core.v3.AggregatedConfigSource");
    check::<envoy_core::SelfConfigSource>("envoy.config.core.v3.SelfConfigSource");
    check::<envoy_core::PathConfigSource>("envoy.config.core.v3.PathConfigSource");
    check::<envoy_core::ConfigSource>("envoy.config.core.v3.ConfigSource");
    check::<envoy_core::HttpProtocolOptions>("envoy.config.core.v3.HttpProtocolOptions");
    check::<envoy_core::Http1ProtocolOptions>("envoy.config.core.v3.Http1ProtocolOptions");
    check::<envoy_core::KeepaliveSettings>("envoy.config.core.v3.KeepaliveSettings");
    check::<envoy_core::Http2ProtocolOptions>("envoy.config.core.v3.Http2ProtocolOptions");
    check::<envoy_core::SubstitutionFormatString>("envoy.config.core.v3.SubstitutionFormatString");
    check::<endpoint::ClusterLoadAssignment>("envoy.config.endpoint.v3.ClusterLoadAssignment");
    check::<endpoint::Endpoint>("envoy.config.endpoint.v3.Endpoint");
    check::<endpoint::LbEndpoint>("envoy.config.endpoint.v3.LbEndpoint");
    check::<endpoint::LocalityLbEndpoints>("envoy.config.endpoint.v3.LocalityLbEndpoints");
    check::<listener::AdditionalAddress>("envoy.config.listener.v3.AdditionalAddress");
    check::<listener::Listener>("envoy.config.listener.v3.Listener");
    check::<listener::Filter>("envoy.config.listener.v3.Filter");
    check::<listener::FilterChainMatch>("envoy.config.listener.v3.FilterChainMatch");
    check::<listener::FilterChain>("envoy.config.listener.v3.FilterChain");
    check::<listener::ListenerFilterChainMatchPredicate>(
        "envoy.config.listener.v3.ListenerFilterChainMatchPredicate",
    );
    check::<listener::ListenerFilter>("envoy.config.listener.v3.ListenerFilter");
    check::<rbac::Rbac>("envoy.config.rbac.v3.RBAC");
    check::<rbac::Policy>("envoy.config.rbac.v3.Policy");
    check::<rbac::Permission>("envoy.config.rbac.v3.Permission");
    check::<rbac::Principal>("envoy.config.rbac.v3.Principal");
    check::<route::RouteConfiguration>("envoy.config.route.v3.RouteConfiguration");
    check::<route::VirtualHost>("envoy.config.route.v3.VirtualHost");
    check::<route::Route>("envoy.config.route.v3.Route");
    check::<route::WeightedCluster>("envoy.config.route.v3.WeightedCluster");
    check::<route::RouteMatch>("envoy.config.route.v3.RouteMatch");
    check::<route::RouteAction>("envoy.config.route.v3.RouteAction");
    check::<route::RetryPolicy>("envoy.config.route.v3.RetryPolicy");
    check::<route::RedirectAction>("envoy.config.route.v3.RedirectAction");
    check::<route::DirectResponseAction>("envoy.config.route.v3.DirectResponseAction");
    check::<route::Decorator>("envoy.config.route.v3.Decorator");
    check::<route::HeaderMatcher>("envoy.config.route.v3.HeaderMatcher");
    check::<route::QueryParameterMatcher>("envoy.config.route.v3.QueryParameterMatcher");
    check::<set_filter_state::FilterStateValue>(
        "envoy.extensions.filters.common.set_filter_state.v3.FilterStateValue",
    );
    check::<cors::Cors>("envoy.extensions.filters.http.cors.v3.Cors");
    check::<fault::HttpFault>("envoy.extensions.filters.http.fault.v3.HTTPFault");
    check::<grpc_stats::FilterConfig>("envoy.extensions.filters.http.grpc_stats.v3.FilterConfig");
    check::<jwt_authn::JwtAuthentication>(
        "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
    );
    check::<jwt_authn::JwtProvider>("envoy.extensions.filters.http.jwt_authn.v3.JwtProvider");
    check::<jwt_authn::JwtRequirement>("envoy.extensions.filters.http.jwt_authn.v3.JwtRequirement");
    check::<jwt_authn::RequirementRule>(
        "envoy.extensions.filters.http.jwt_authn.v3.RequirementRule",
    );
    check::<uri_template::UriTemplateMatchConfig>(
        "envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig",
    );
    check::<http_rbac::Rbac>("envoy.extensions.filters.http.rbac.v3.RBAC");
    check::<router::Router>("envoy.extensions.filters.http.router.v3.Router");
    check::<http_set_filter_state::Config>(
        "envoy.extensions.filters.http.set_filter_state.v3.Config",
    );
    check::<http_inspector::HttpInspector>(
        "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector",
    );
    check::<original_dst::OriginalDst>(
        "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
    );
    check::<tls_inspector::TlsInspector>(
        "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
    );
    check::<hcm::HttpConnectionManager>(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
    );
    check::<hcm::Rds>("envoy.extensions.filters.network.http_connection_manager.v3.Rds");
    check::<hcm::HttpFilter>(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
    );
    check::<hcm::RequestIdExtension>(
        "envoy.extensions.filters.network.http_connection_manager.v3.RequestIDExtension",
    );
    check::<network_rbac::Rbac>("envoy.extensions.filters.network.rbac.v3.RBAC");
    check::<network_set_filter_state::Config>(
        "envoy.extensions.filters.network.set_filter_state.v3.Config",
    );
    check::<tcp_proxy::TcpProxy>("envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy");
    check::<network_inputs::DestinationIpInput>(
        "envoy.extensions.matching.common_inputs.network.v3.DestinationIPInput",
    );
    check::<network_inputs::DestinationPortInput>(
        "envoy.extensions.matching.common_inputs.network.v3.DestinationPortInput",
    );
    check::<network_inputs::ApplicationProtocolInput>(
        "envoy.extensions.matching.common_inputs.network.v3.ApplicationProtocolInput",
    );
    check::<internal_upstream::InternalUpstreamTransport>(
        "envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport",
    );
    check::<raw_buffer::RawBuffer>("envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer");
    check::<tls::UpstreamTlsContext>(
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
    );
    check::<tls::DownstreamTlsContext>(
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
    );
    check::<tls::CommonTlsContext>("envoy.extensions.transport_sockets.tls.v3.CommonTlsContext");
    check::<tls::TlsParameters>("envoy.extensions.transport_sockets.tls.v3.TlsParameters");
    check::<tls::TlsCertificate>("envoy.extensions.transport_sockets.tls.v3.TlsCertificate");
    check::<tls::SubjectAltNameMatcher>(
        "envoy.extensions.transport_sockets.tls.v3.SubjectAltNameMatcher",
    );
    check::<tls::CertificateValidationContext>(
        "envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext",
    );
    check::<tls::SdsSecretConfig>("envoy.extensions.transport_sockets.tls.v3.SdsSecretConfig");
    check::<tls::Secret>("envoy.extensions.transport_sockets.tls.v3.Secret");
    check::<upstream_http::HttpProtocolOptions>(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    );
    check::<matcher::StringMatcher>("envoy.type.matcher.v3.StringMatcher");
    check::<matcher::RegexMatcher>("envoy.type.matcher.v3.RegexMatcher");
    check::<matcher::FilterStateMatcher>("envoy.type.matcher.v3.FilterStateMatcher");
    check::<matcher::PathMatcher>("envoy.type.matcher.v3.PathMatcher");
    check::<matcher::MetadataMatcher>("envoy.type.matcher.v3.MetadataMatcher");
    check::<matcher::ValueMatcher>("envoy.type.matcher.v3.ValueMatcher");
    check::<matcher::ListMatcher>("envoy.type.matcher.v3.ListMatcher");
    check::<matcher::OrMatcher>("envoy.type.matcher.v3.OrMatcher");
    check::<metadata::MetadataKey>("envoy.type.metadata.v3.MetadataKey");
    check::<metadata::MetadataKind>("envoy.type.metadata.v3.MetadataKind");
    check::<types::Int64Range>("envoy.type.v3.Int64Range");
    check::<types::Int32Range>("envoy.type.v3.Int32Range");
    check::<udpa_type::TypedStruct>("udpa.type.v1.TypedStruct");
    check::<xds_core::TypedExtensionConfig>("xds.core.v3.TypedExtensionConfig");
    check::<xds_core::CidrRange>("xds.core.v3.CidrRange");
    check::<xds_matcher::Matcher>("xds.type.matcher.v3.Matcher");
    check::<xds_matcher::IpMatcher>("xds.type.matcher.v3.IPMatcher");
    check::<xds_type::TypedStruct>("xds.type.v3.TypedStruct");
    check::<listener::listener::InternalListenerConfig>(
        "envoy.config.listener.v3.Listener.InternalListenerConfig",
    );
    check::<xds_matcher::matcher::matcher_tree::MatchMap>(
        "xds.type.matcher.v3.Matcher.MatcherTree.MatchMap",
    );
}
