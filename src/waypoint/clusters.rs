//! A waypoint's clusters (istio/istio `pilot/pkg/networking/core/cluster_waypoint.go`): the fixed `main_internal`, `encap` and
//! `connect_originate`, and one EDS cluster `inbound-vip|<port>|<http|tcp>|<host>` per bound
//! service port and protocol, with its DestinationRule's policy ([`traffic_policy`]).

use std::collections::BTreeMap;

use crate::pb::envoy::config::cluster::v3::{self as cluster, CircuitBreakers, Cluster};
use crate::pb::envoy::config::core::v3::{self as core, RoutingPriority};
use crate::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use crate::pb::envoy::extensions::transport_sockets::internal_upstream::v3::{
    InternalUpstreamTransport, internal_upstream_transport,
};
use crate::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use crate::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use crate::pb::envoy::r#type::metadata::v3::{
    MetadataKey, MetadataKind, metadata_key, metadata_kind,
};
use crate::pb::google::protobuf::Any;
use crate::waypoint::envoy::{self, any, seconds, uint32};
use crate::waypoint::listeners::{
    CONNECT_ORIGINATE, ENCAP, HBONE_PORT, MAIN_INTERNAL, PortProtocol,
};
use crate::waypoint::traffic_policy::{self, AppliedPolicy, raw_buffer};

/// The host metadata key that carries an HBONE endpoint's `ip:port` to `connect_originate`.
pub(crate) const ORIGINAL_DST_METADATA: &str = "envoy.filters.listener.original_dst";

/// istiod's default circuit breakers: every threshold at its maximum.
fn circuit_breakers() -> CircuitBreakers {
    CircuitBreakers {
        thresholds: vec![cluster::circuit_breakers::Thresholds {
            priority: RoutingPriority::Default as i32,
            max_connections: uint32(u32::MAX),
            max_pending_requests: uint32(u32::MAX),
            max_requests: uint32(u32::MAX),
            max_retries: uint32(u32::MAX),
            ..Default::default()
        }],
    }
}

fn upstream_options(options: &HttpProtocolOptions) -> BTreeMap<String, Any> {
    [(
        envoy::UPSTREAM_HTTP_OPTIONS.to_string(),
        any(envoy::UPSTREAM_HTTP_OPTIONS, options),
    )]
    .into()
}

/// A STATIC cluster whose one endpoint is the internal listener `listener` (§3.1).
fn internal_upstream_cluster(name: &str, listener: &str) -> Cluster {
    Cluster {
        name: name.into(),
        alt_stat_name: format!("{name};"),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Static as i32,
        )),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: Some(envoy::internal_address(listener, "")),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }),
        circuit_breakers: Some(circuit_breakers()),
        transport_socket: Some(envoy::transport_socket(
            "internal_upstream",
            any(
                envoy::INTERNAL_UPSTREAM,
                &InternalUpstreamTransport {
                    transport_socket: Some(raw_buffer()),
                    ..Default::default()
                },
            ),
        )),
        typed_extension_protocol_options: upstream_options(&HttpProtocolOptions {
            common_http_protocol_options: Some(core::HttpProtocolOptions {
                idle_timeout: seconds(300),
                ..Default::default()
            }),
            upstream_protocol_options: Some(
                http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
                    http_protocol_options::UseDownstreamHttpConfig {
                        http_protocol_options: Some(Default::default()),
                        http2_protocol_options: Some(Default::default()),
                    },
                ),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn main_internal() -> Cluster {
    internal_upstream_cluster(MAIN_INTERNAL, MAIN_INTERNAL)
}

pub(crate) fn encap() -> Cluster {
    internal_upstream_cluster(ENCAP, CONNECT_ORIGINATE)
}

/// `connect_originate` (§3.1): HBONE to the original destination's IP on 15008, mTLS with the
/// waypoint's certificate, accepting peers of the trust domain.
pub(crate) fn connect_originate(trust_domain: &str, namespace: &str) -> Cluster {
    let tls = UpstreamTlsContext {
        common_tls_context: Some(envoy::hbone_tls(&[
            format!("spiffe://{trust_domain}/"),
            format!("spiffe://{trust_domain}/ns/{namespace}/sa/"),
        ])),
        ..Default::default()
    };
    Cluster {
        name: CONNECT_ORIGINATE.into(),
        alt_stat_name: format!("{CONNECT_ORIGINATE};"),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: cluster::cluster::LbPolicy::ClusterProvided as i32,
        connect_timeout: seconds(10),
        cleanup_interval: seconds(60),
        circuit_breakers: Some(circuit_breakers()),
        lb_config: Some(cluster::cluster::LbConfig::OriginalDstLbConfig(
            cluster::cluster::OriginalDstLbConfig {
            upstream_port_override: uint32(HBONE_PORT),
            metadata_key: Some(MetadataKey {
                key: ORIGINAL_DST_METADATA.into(),
                path: vec![metadata_key::PathSegment {
                    segment: Some(metadata_key::path_segment::Segment::Key("waypoint".into())),
                }],
            }),
            ..Default::default()
            },
        )),
        typed_extension_protocol_options: upstream_options(&HttpProtocolOptions {
            common_http_protocol_options: Some(core::HttpProtocolOptions {
                idle_timeout: seconds(3600),
                ..Default::default()
            }),
            upstream_protocol_options: Some(
                http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                core::Http2ProtocolOptions {
                                    allow_connect: true,
                                    ..Default::default()
                                },
                            ),
                        ),
                    },
                ),
            ),
            ..Default::default()
        }),
        transport_socket: Some(envoy::transport_socket(
            "tls",
            any(envoy::UPSTREAM_TLS, &tls),
        )),
        ..Default::default()
    }
}

/// A bound service port's cluster `inbound-vip|<port>|<http|tcp>|<host>` (§3.2): EDS, least
/// request, through `internal_upstream` so that its endpoints may be HBONE (internal
/// addresses, passed their `original_dst` metadata) or plain sockets. A DestinationRule's
/// policy for the port (`applied`) is applied by [`traffic_policy`].
pub(crate) fn inbound_vip(
    name: &str,
    hostname: &str,
    service_name: &str,
    namespace: &str,
    protocol: PortProtocol,
    http: bool,
    applied: Option<AppliedPolicy<'_>>,
) -> Cluster {
    let host = |name: &str| internal_upstream_transport::MetadataValueSource {
        kind: Some(MetadataKind {
            kind: Some(metadata_kind::Kind::Host(Default::default())),
        }),
        name: name.into(),
    };
    let mut options = None;
    if http {
        let upstream = match protocol {
            PortProtocol::Http2 => Some(
                http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                Default::default(),
                            ),
                        ),
                    },
                ),
            ),
            PortProtocol::Auto => Some(
                http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
                    http_protocol_options::UseDownstreamHttpConfig {
                        http_protocol_options: Some(Default::default()),
                        http2_protocol_options: Some(Default::default()),
                    },
                ),
            ),
            PortProtocol::Http | PortProtocol::Tcp => None,
        };
        if let Some(upstream) = upstream {
            options = Some(HttpProtocolOptions {
                upstream_protocol_options: Some(upstream),
                ..Default::default()
            });
        }
    }
    let services = envoy::list_value(vec![envoy::struct_value(vec![
        ("host", envoy::string_value(hostname)),
        ("name", envoy::string_value(service_name)),
        ("namespace", envoy::string_value(namespace)),
    ])]);
    let mut istio = vec![("services", services)];
    if let Some(applied) = &applied {
        istio.push(("config", envoy::string_value(applied.config_path())));
    }
    let mut cluster = Cluster {
        name: name.into(),
        alt_stat_name: format!("{name};"),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig {
            eds_config: Some(envoy::ads()),
            service_name: name.into(),
        }),
        common_lb_config: Some(Default::default()),
        metadata: Some(core::Metadata {
            filter_metadata: [("istio".to_string(), envoy::object(istio))].into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let inner = traffic_policy::apply(&mut cluster, &mut options, applied.map(|a| a.policy));
    cluster.typed_extension_protocol_options = options
        .map(|o| upstream_options(&traffic_policy::finish_options(o)))
        .unwrap_or_default();
    cluster.transport_socket = Some(envoy::transport_socket(
        "internal_upstream",
        any(
            envoy::INTERNAL_UPSTREAM,
            &InternalUpstreamTransport {
                passthrough_metadata: vec![host(ORIGINAL_DST_METADATA), host("istio")],
                transport_socket: Some(inner),
            },
        ),
    ));
    cluster
}

/// An `outbound|<port>||<host>` cluster (§3.3) for a service a route sends to that is not
/// bound to this waypoint: EDS like `inbound-vip`, but as istiod builds a sidecar's outbound
/// cluster with HBONE: endpoints marked `tunnel: http` go through `connect_originate` (an
/// internal upstream passing their metadata on), the others are plain.
pub(crate) fn outbound(
    name: &str,
    hostname: &str,
    service_name: &str,
    namespace: &str,
    protocol: PortProtocol,
) -> Cluster {
    let http = protocol != PortProtocol::Tcp;
    let mut cluster = inbound_vip(
        name,
        hostname,
        service_name,
        namespace,
        protocol,
        http,
        None,
    );
    cluster.alt_stat_name = String::new();
    let source =
        |kind: metadata_kind::Kind, name: &str| internal_upstream_transport::MetadataValueSource {
            kind: Some(MetadataKind { kind: Some(kind) }),
            name: name.into(),
        };
    let hbone = envoy::transport_socket(
        "envoy.transport_sockets.internal_upstream",
        any(
            envoy::INTERNAL_UPSTREAM,
            &InternalUpstreamTransport {
                passthrough_metadata: vec![
                    source(
                        metadata_kind::Kind::Host(Default::default()),
                        ORIGINAL_DST_METADATA,
                    ),
                    source(metadata_kind::Kind::Cluster(Default::default()), "istio"),
                    source(metadata_kind::Kind::Host(Default::default()), "istio"),
                ],
                transport_socket: Some(raw_buffer()),
            },
        ),
    );
    cluster.transport_socket = None;
    cluster.transport_socket_matches = vec![
        cluster::cluster::TransportSocketMatch {
            name: "hbone".into(),
            r#match: Some(envoy::object(vec![(
                TUNNEL_LABEL,
                envoy::string_value(TUNNEL_HTTP),
            )])),
            transport_socket: Some(hbone),
        },
        cluster::cluster::TransportSocketMatch {
            name: "tlsMode-disabled".into(),
            r#match: Some(Default::default()),
            transport_socket: Some(raw_buffer()),
        },
    ];
    cluster
}

/// The endpoint metadata key and value that pick the `hbone` transport socket.
pub(crate) const TUNNEL_LABEL: &str = "tunnel";
pub(crate) const TUNNEL_HTTP: &str = "http";
