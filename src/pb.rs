//! Generated protobuf types: our own `.proto` files in `proto/`, compiled by build.rs.
//!
//! The module tree mirrors the proto packages so that generated cross-package paths resolve.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod google {
    pub mod protobuf {
        tonic::include_proto!("google.protobuf");
    }
}

pub mod istio {
    pub mod workload {
        tonic::include_proto!("istio.workload");
    }
    pub mod security {
        tonic::include_proto!("istio.security");
    }
    pub mod v1 {
        pub mod auth {
            tonic::include_proto!("istio.v1.auth");
        }
    }
}

pub mod envoy {
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod extensions {
        pub mod transport_sockets {
            pub mod tls {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.transport_sockets.tls.v3");
                }
            }
        }
    }
    pub mod r#type {
        pub mod matcher {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.matcher.v3");
            }
        }
    }
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod secret {
            pub mod v3 {
                tonic::include_proto!("envoy.service.secret.v3");
            }
        }
        pub mod status {
            pub mod v3 {
                tonic::include_proto!("envoy.service.status.v3");
            }
        }
    }
}

pub use envoy::service::discovery::v3 as xds;
pub use envoy::service::status::v3 as csds;
pub use istio::security;
pub use istio::workload;
