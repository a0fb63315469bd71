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
        pub mod cluster {
            pub mod v3 {
                tonic::include_proto!("envoy.config.cluster.v3");
            }
        }
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
        pub mod endpoint {
            pub mod v3 {
                tonic::include_proto!("envoy.config.endpoint.v3");
            }
        }
        pub mod listener {
            pub mod v3 {
                tonic::include_proto!("envoy.config.listener.v3");
            }
        }
        pub mod rbac {
            pub mod v3 {
                tonic::include_proto!("envoy.config.rbac.v3");
            }
        }
        pub mod route {
            pub mod v3 {
                tonic::include_proto!("envoy.config.route.v3");
            }
        }
    }
    pub mod extensions {
        pub mod filters {
            pub mod common {
                pub mod set_filter_state {
                    pub mod v3 {
                        tonic::include_proto!(
                            "envoy.extensions.filters.common.set_filter_state.v3"
                        );
                    }
                }
            }
            pub mod http {
                pub mod cors {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.cors.v3");
                    }
                }
                pub mod fault {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.fault.v3");
                    }
                }
                pub mod grpc_stats {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.grpc_stats.v3");
                    }
                }
                pub mod jwt_authn {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.jwt_authn.v3");
                    }
                }
                pub mod rbac {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.rbac.v3");
                    }
                }
                pub mod router {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.router.v3");
                    }
                }
                pub mod set_filter_state {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.http.set_filter_state.v3");
                    }
                }
            }
            pub mod listener {
                pub mod http_inspector {
                    pub mod v3 {
                        tonic::include_proto!(
                            "envoy.extensions.filters.listener.http_inspector.v3"
                        );
                    }
                }
                pub mod original_dst {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.listener.original_dst.v3");
                    }
                }
                pub mod tls_inspector {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.listener.tls_inspector.v3");
                    }
                }
            }
            pub mod network {
                pub mod http_connection_manager {
                    pub mod v3 {
                        tonic::include_proto!(
                            "envoy.extensions.filters.network.http_connection_manager.v3"
                        );
                    }
                }
                pub mod rbac {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.network.rbac.v3");
                    }
                }
                pub mod set_filter_state {
                    pub mod v3 {
                        tonic::include_proto!(
                            "envoy.extensions.filters.network.set_filter_state.v3"
                        );
                    }
                }
                pub mod tcp_proxy {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.filters.network.tcp_proxy.v3");
                    }
                }
            }
        }
        pub mod matching {
            pub mod common_inputs {
                pub mod network {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.matching.common_inputs.network.v3");
                    }
                }
            }
        }
        pub mod path {
            pub mod r#match {
                pub mod uri_template {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.path.r#match.uri_template.v3");
                    }
                }
            }
        }
        pub mod transport_sockets {
            pub mod internal_upstream {
                pub mod v3 {
                    tonic::include_proto!(
                        "envoy.extensions.transport_sockets.internal_upstream.v3"
                    );
                }
            }
            pub mod raw_buffer {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.transport_sockets.raw_buffer.v3");
                }
            }
            pub mod tls {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.transport_sockets.tls.v3");
                }
            }
        }
        pub mod upstreams {
            pub mod http {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.upstreams.http.v3");
                }
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
    pub mod r#type {
        pub mod matcher {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.matcher.v3");
            }
        }
        pub mod metadata {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.metadata.v3");
            }
        }
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

pub mod udpa {
    pub mod r#type {
        pub mod v1 {
            tonic::include_proto!("udpa.r#type.v1");
        }
    }
}

pub mod xds {
    // `pb::xds` is also the ADS messages (`pb::xds::DeltaDiscoveryRequest`...): the name
    // ambientd has always used for them. The cncf/xds packages (`xds.core.v3`,
    // `xds.type.matcher.v3`...) live beside them, where the generated code looks for them.
    pub use super::envoy::service::discovery::v3::*;

    pub mod core {
        pub mod v3 {
            tonic::include_proto!("xds.core.v3");
        }
    }
    pub mod r#type {
        pub mod matcher {
            pub mod v3 {
                tonic::include_proto!("xds.r#type.matcher.v3");
            }
        }
        pub mod v3 {
            tonic::include_proto!("xds.r#type.v3");
        }
    }
}

pub use envoy::service::status::v3 as csds;
pub use istio::security;
pub use istio::workload;

#[cfg(test)]
mod tests;
