//! Compiles our own `.proto` files with protox (pure Rust), so a fresh machine needs no `protoc`.
//!
//! Well-known types are generated too, so that every `bytes` field (including
//! `google.protobuf.Any.value`) is a `bytes::Bytes`: a resource encoded once is shared by every
//! connection that sends it, without copying.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/workload.proto",
        "proto/authorization.proto",
        "proto/citadel.proto",
        "proto/discovery.proto",
        "proto/status.proto",
        // Envoy's and xDS's own APIs, trimmed to what ambientd sets (waypoints' config, SDS).
        "proto/envoy/config/cluster/v3/cluster.proto",
        "proto/envoy/config/core/v3/core.proto",
        "proto/envoy/config/endpoint/v3/endpoint.proto",
        "proto/envoy/config/listener/v3/listener.proto",
        "proto/envoy/config/rbac/v3/rbac.proto",
        "proto/envoy/config/route/v3/route.proto",
        "proto/envoy/extensions/filters/common/set_filter_state/v3/value.proto",
        "proto/envoy/extensions/filters/http/cors/v3/cors.proto",
        "proto/envoy/extensions/filters/http/fault/v3/fault.proto",
        "proto/envoy/extensions/filters/http/grpc_stats/v3/config.proto",
        "proto/envoy/extensions/filters/http/rbac/v3/rbac.proto",
        "proto/envoy/extensions/filters/http/router/v3/router.proto",
        "proto/envoy/extensions/filters/http/set_filter_state/v3/set_filter_state.proto",
        "proto/envoy/extensions/filters/listener/http_inspector/v3/http_inspector.proto",
        "proto/envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
        "proto/envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
        "proto/envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
        "proto/envoy/extensions/filters/network/rbac/v3/rbac.proto",
        "proto/envoy/extensions/filters/network/set_filter_state/v3/set_filter_state.proto",
        "proto/envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
        "proto/envoy/extensions/matching/common_inputs/network/v3/network_inputs.proto",
        "proto/envoy/extensions/transport_sockets/internal_upstream/v3/internal_upstream.proto",
        "proto/envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto",
        "proto/envoy/extensions/transport_sockets/tls/v3/tls.proto",
        "proto/envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
        "proto/envoy/service/secret/v3/sds.proto",
        "proto/envoy/type/matcher/v3/matcher.proto",
        "proto/envoy/type/metadata/v3/metadata.proto",
        "proto/envoy/type/v3/percent.proto",
        "proto/envoy/type/v3/range.proto",
        "proto/udpa/type/v1/typed_struct.proto",
        "proto/xds/core/v3/core.proto",
        "proto/xds/type/matcher/v3/matcher.proto",
        "proto/xds/type/v3/typed_struct.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // Every message implements `prost::Name`: its type URL is `Name::type_url()`, for `Any`.
    let mut config = tonic_prost_build::Config::new();
    config
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_well_known_types(true)
        .bytes(".")
        // Maps encode in key order, so the same content always has the same bytes and version.
        .btree_map(".")
        // The node rides in every request's decoded form (and in src/ca/xds_guard.rs's `Scan`):
        // its locality, three strings seldom set, stays out of line.
        .boxed(".envoy.service.discovery.v3.Node.locality")
        .compile_fds_with_config(descriptors, config)?;
    Ok(())
}
