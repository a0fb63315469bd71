//! Small constructors for the Envoy messages every builder uses: typed configs, addresses,
//! durations, SDS references and string matchers. Type URLs are spelled once, here.

use prost::Message;

use crate::pb::envoy::config::core::v3 as core;
use crate::pb::envoy::config::listener::v3::Filter;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use crate::pb::envoy::extensions::transport_sockets::tls::v3 as tls;
use crate::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use crate::pb::google::protobuf::{Any, BoolValue, Duration, Struct, UInt32Value, Value, value};
use crate::pb::udpa::r#type::v1::TypedStruct;

pub(crate) const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
pub(crate) const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
pub(crate) const ROUTER: &str = "envoy.extensions.filters.http.router.v3.Router";
pub(crate) const HTTP_SET_FILTER_STATE: &str =
    "envoy.extensions.filters.http.set_filter_state.v3.Config";
pub(crate) const NETWORK_SET_FILTER_STATE: &str =
    "envoy.extensions.filters.network.set_filter_state.v3.Config";
pub(crate) const HTTP_RBAC: &str = "envoy.extensions.filters.http.rbac.v3.RBAC";
pub(crate) const JWT_AUTHN: &str = "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
pub(crate) const URI_TEMPLATE_MATCH: &str =
    "envoy.extensions.path.match.uri_template.v3.UriTemplateMatchConfig";
pub(crate) const NETWORK_RBAC: &str = "envoy.extensions.filters.network.rbac.v3.RBAC";
pub(crate) const GRPC_STATS: &str = "envoy.extensions.filters.http.grpc_stats.v3.FilterConfig";
pub(crate) const FAULT: &str = "envoy.extensions.filters.http.fault.v3.HTTPFault";
pub(crate) const CORS: &str = "envoy.extensions.filters.http.cors.v3.Cors";
pub(crate) const ORIGINAL_DST: &str =
    "envoy.extensions.filters.listener.original_dst.v3.OriginalDst";
pub(crate) const HTTP_INSPECTOR: &str =
    "envoy.extensions.filters.listener.http_inspector.v3.HttpInspector";
pub(crate) const DOWNSTREAM_TLS: &str =
    "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
pub(crate) const UPSTREAM_TLS: &str =
    "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
pub(crate) const INTERNAL_UPSTREAM: &str =
    "envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport";
pub(crate) const RAW_BUFFER: &str = "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer";
pub(crate) const UPSTREAM_HTTP_OPTIONS: &str =
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
pub(crate) const IP_MATCHER: &str = "xds.type.matcher.v3.IPMatcher";
pub(crate) const DESTINATION_IP: &str =
    "envoy.extensions.matching.common_inputs.network.v3.DestinationIPInput";
pub(crate) const DESTINATION_PORT: &str =
    "envoy.extensions.matching.common_inputs.network.v3.DestinationPortInput";
pub(crate) const APPLICATION_PROTOCOL: &str =
    "envoy.extensions.matching.common_inputs.network.v3.ApplicationProtocolInput";
pub(crate) const STRING_VALUE: &str = "google.protobuf.StringValue";
pub(crate) const PREVIOUS_HOSTS: &str =
    "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate";
pub(crate) const TYPED_STRUCT: &str = "udpa.type.v1.TypedStruct";
pub(crate) const PEER_METADATA: &str = "io.istio.http.peer_metadata.Config";
pub(crate) const METADATA_EXCHANGE: &str = "envoy.tcp.metadataexchange.config.MetadataExchange";
pub(crate) const ISTIO_STATS: &str = "stats.PluginConfig";

/// `message` as an `Any` of `type.googleapis.com/<type_name>`.
pub(crate) fn any<M: Message>(type_name: &str, message: &M) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: message.encode_to_vec().into(),
    }
}

/// An Istio-only config as istiod sends it: a `udpa.type.v1.TypedStruct` naming the type,
/// with the fields as JSON-like values (Istio's Envoy converts it to the real message).
pub(crate) fn typed_struct(type_name: &str, fields: Vec<(&str, Value)>) -> Any {
    any(
        TYPED_STRUCT,
        &TypedStruct {
            type_url: format!("type.googleapis.com/{type_name}"),
            value: Some(object(fields)),
        },
    )
}

pub(crate) fn object(fields: Vec<(&str, Value)>) -> Struct {
    Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    }
}

pub(crate) fn struct_value(fields: Vec<(&str, Value)>) -> Value {
    Value {
        kind: Some(value::Kind::StructValue(object(fields))),
    }
}

pub(crate) fn list_value(values: Vec<Value>) -> Value {
    Value {
        kind: Some(value::Kind::ListValue(
            crate::pb::google::protobuf::ListValue { values },
        )),
    }
}

pub(crate) fn string_value(s: impl Into<String>) -> Value {
    Value {
        kind: Some(value::Kind::StringValue(s.into())),
    }
}

pub(crate) fn bool_value(b: bool) -> Value {
    Value {
        kind: Some(value::Kind::BoolValue(b)),
    }
}

/// An empty typed config of `type_name` (filters whose defaults are all istiod sets).
pub(crate) fn empty(type_name: &str) -> Any {
    Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: Default::default(),
    }
}

pub(crate) fn network_filter(name: &str, typed_config: Any) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(
            crate::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(typed_config),
        ),
    }
}

pub(crate) fn http_filter(name: &str, typed_config: Any) -> HttpFilter {
    HttpFilter {
        name: name.into(),
        config_type: Some(
            crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(typed_config),
        ),
        ..Default::default()
    }
}

pub(crate) fn seconds(seconds: i64) -> Option<Duration> {
    Some(Duration { seconds, nanos: 0 })
}

pub(crate) fn uint32(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

pub(crate) fn boolean(value: bool) -> Option<BoolValue> {
    Some(BoolValue { value })
}

pub(crate) fn socket_address(ip: &str, port: u32) -> core::Address {
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: ip.into(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// The address of an internal listener, with an endpoint id when several endpoints share it.
pub(crate) fn internal_address(listener: &str, endpoint_id: &str) -> core::Address {
    core::Address {
        address: Some(core::address::Address::EnvoyInternalAddress(
            core::EnvoyInternalAddress {
                address_name_specifier: Some(
                    core::envoy_internal_address::AddressNameSpecifier::ServerListenerName(
                        listener.into(),
                    ),
                ),
                endpoint_id: endpoint_id.into(),
            },
        )),
    }
}

pub(crate) fn transport_socket(name: &str, typed_config: Any) -> core::TransportSocket {
    core::TransportSocket {
        name: name.into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(
            typed_config,
        )),
    }
}

/// The delta ADS config source (EDS of `inbound-vip` clusters).
pub(crate) fn ads() -> core::ConfigSource {
    core::ConfigSource {
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource {},
        )),
        initial_fetch_timeout: seconds(0),
        resource_api_version: core::ApiVersion::V3 as i32,
    }
}

/// SDS secret `name` from the agent's static cluster `sds-grpc` (istiod's prebuilt config:
/// gRPC, node on the first message only, no initial fetch timeout).
pub(crate) fn sds(name: &str) -> tls::SdsSecretConfig {
    tls::SdsSecretConfig {
        name: name.into(),
        sds_config: Some(core::ConfigSource {
            config_source_specifier: Some(
                core::config_source::ConfigSourceSpecifier::ApiConfigSource(
                    core::ApiConfigSource {
                        api_type: core::api_config_source::ApiType::Grpc as i32,
                        transport_api_version: core::ApiVersion::V3 as i32,
                        set_node_on_first_message_only: true,
                        grpc_services: vec![core::GrpcService {
                            target_specifier: Some(core::grpc_service::TargetSpecifier::EnvoyGrpc(
                                core::grpc_service::EnvoyGrpc {
                                    cluster_name: "sds-grpc".into(),
                                    ..Default::default()
                                },
                            )),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                ),
            ),
            initial_fetch_timeout: seconds(0),
            resource_api_version: core::ApiVersion::V3 as i32,
        }),
    }
}

/// The common TLS context of both HBONE ends (§2.1): the workload certificate and the roots
/// from SDS, peers whose URI SAN starts with one of `san_prefixes`, ALPN h2, TLS 1.3 only.
pub(crate) fn hbone_tls(san_prefixes: &[String]) -> tls::CommonTlsContext {
    tls::CommonTlsContext {
        tls_params: Some(tls::TlsParameters {
            tls_minimum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv13 as i32,
            tls_maximum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        tls_certificate_sds_secret_configs: vec![sds("default")],
        validation_context_type: Some(
            tls::common_tls_context::ValidationContextType::CombinedValidationContext(
                tls::common_tls_context::CombinedCertificateValidationContext {
                    default_validation_context: Some(tls::CertificateValidationContext {
                        match_typed_subject_alt_names: san_prefixes
                            .iter()
                            .map(|prefix| tls::SubjectAltNameMatcher {
                                san_type: tls::subject_alt_name_matcher::SanType::Uri as i32,
                                matcher: Some(prefix_match(prefix)),
                            })
                            .collect(),
                        ..Default::default()
                    }),
                    validation_context_sds_secret_config: Some(sds("ROOTCA")),
                },
            ),
        ),
        alpn_protocols: vec!["h2".into()],
        ..Default::default()
    }
}

pub(crate) fn exact(value: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Exact(value.into()))
}

pub(crate) fn prefix_match(value: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Prefix(value.into()))
}

pub(crate) fn suffix_match(value: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::Suffix(value.into()))
}

pub(crate) fn regex_match(regex: &str) -> StringMatcher {
    matcher(string_matcher::MatchPattern::SafeRegex(
        crate::pb::envoy::r#type::matcher::v3::RegexMatcher {
            regex: regex.into(),
        },
    ))
}

fn matcher(pattern: string_matcher::MatchPattern) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    }
}
