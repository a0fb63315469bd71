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
        // Envoy's own API, trimmed to what ambientd sets (waypoints' config, SDS).
        "proto/envoy/config/core/v3/core.proto",
        "proto/envoy/type/matcher/v3/matcher.proto",
        "proto/envoy/extensions/transport_sockets/tls/v3/tls.proto",
        "proto/envoy/service/secret/v3/sds.proto",
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
        .compile_fds_with_config(descriptors, config)?;
    Ok(())
}
