//! istiod's debug over xDS: the `istio.io/debug` types on state-of-the-world ADS, which
//! `istioctl proxy-status`, `istioctl version` and `istioctl x internal-debug` use instead of
//! the HTTP port.
//!
//! - `istio.io/debug/syncz`: one `envoy.service.status.v3.ClientConfig` per connected proxy
//!   (its node, and per type SYNCED, STALE or NOT_SENT), with the control plane's identity in
//!   `control_plane`, as istiod's `StatusGen` answers.
//! - `istio.io/debug/config_dump`, resource name = a proxy id: the resources that proxy holds,
//!   each as an `Any` (nothing when it is not connected here: istioctl asks every replica).
//! - `istio.io/debug`, resource names = debug endpoints (`syncz`, `adsz`,
//!   `config_dump?proxyID=…`): each endpoint's JSON, as `Any{type_url: "istio.io/debug"}`, as
//!   istiod's `DebugGen` answers.
//!
//! As in istiod, only an authenticated caller (the TLS port) with an identity in the root
//! namespace is answered: the same rule as the HTTP debug endpoints for remote callers.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use prost::Message;
use serde_json::json;
use tonic::Status;
use tower::ServiceExt;

use crate::debug::{DebugState, router, views};
use crate::discovery::names::TypeKind;
use crate::pb::csds::client_config::GenericXdsConfig;
use crate::pb::csds::{ClientConfig, ConfigStatus};
use crate::pb::google::protobuf::{Any, Struct, Value, value::Kind};
use crate::pb::xds::{ControlPlane, DiscoveryRequest, DiscoveryResponse, Node};
use crate::push::registry::{ConnectionStatus, TypeStatus};
use crate::push::server::{DEBUG_TYPE, DebugResponder, VerifiedCaller};

/// `istio.io/debug/syncz`.
pub const SYNCZ_TYPE: &str = "istio.io/debug/syncz";
/// `istio.io/debug/config_dump`.
pub const CONFIG_DUMP_TYPE: &str = "istio.io/debug/config_dump";
const CLIENT_CONFIG_TYPE: &str = "type.googleapis.com/envoy.service.status.v3.ClientConfig";
/// The largest debug endpoint body passed on (a config dump of a big mesh is tens of MB).
const MAX_ENDPOINT_BYTES: usize = 256 * 1024 * 1024;

/// Answers debug requests from the debug state, calling the HTTP debug views in process.
pub struct DebugXds {
    state: DebugState,
    router: Router,
    /// istiod's `IstioControlPlaneInstance` JSON, for `control_plane.identifier`.
    identifier: String,
}

impl DebugXds {
    /// `state.authenticators` is not used: the TLS port's guard authenticated the caller.
    pub fn new(state: DebugState) -> Self {
        let state = DebugState {
            authenticators: None,
            ..state
        };
        let id = std::env::var("POD_NAME")
            .ok()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "ambientd".to_string());
        let version = env!("CARGO_PKG_VERSION");
        let identifier = json!({
            "Component": "istiod",
            "ID": id,
            "Info": {
                "version": version,
                "revision": "",
                "golang_version": "",
                "status": "Clean",
                "tag": version,
            },
        })
        .to_string();
        DebugXds {
            router: router(state.clone()),
            state,
            identifier,
        }
    }

    fn authorize(&self, caller: Option<&VerifiedCaller>) -> Result<(), Status> {
        let root = &self.state.settings.root_namespace;
        match caller {
            None => Err(Status::unauthenticated(
                "debug over xDS needs an authenticated caller: connect to the TLS port (15012) \
                 with a token or a client certificate",
            )),
            Some(caller) if caller.namespace != *root => Err(Status::permission_denied(format!(
                "debug over xDS needs an identity in the root namespace {root:?}, not {}",
                caller.identity
            ))),
            Some(_) => Ok(()),
        }
    }

    /// One `ClientConfig` per proxy connected here.
    fn syncz(&self) -> Vec<Any> {
        self.state
            .registry
            .list()
            .iter()
            .filter(|c| c.proxy.is_some())
            .map(|c| Any {
                type_url: CLIENT_CONFIG_TYPE.to_string(),
                value: client_config(c).encode_to_vec().into(),
            })
            .collect()
    }

    /// The resources the proxy `id` holds (Address, then Authorization), or nothing when it is
    /// not connected to this replica.
    fn config_dump(&self, request: &DiscoveryRequest) -> Result<Vec<Any>, Status> {
        let [id] = &request.resource_names[..] else {
            return Err(Status::invalid_argument(format!(
                "{CONFIG_DUMP_TYPE} takes one resource name, the proxy id; got {}",
                request.resource_names.len()
            )));
        };
        let Some(connection) = self.state.registry.find(id).into_iter().next() else {
            return Ok(Vec::new());
        };
        let latest = self.state.snapshots.borrow().clone();
        Ok(TypeKind::ALL
            .into_iter()
            .flat_map(|kind| views::held(&connection, kind, latest.as_deref()))
            .map(|(_, resource)| Any {
                type_url: resource.kind.type_url().to_string(),
                value: bytes::Bytes::copy_from_slice(resource.value()),
            })
            .collect())
    }

    /// Each named debug endpoint's body, as istiod's `DebugGen` wraps it.
    async fn endpoints(&self, request: &DiscoveryRequest) -> Result<Vec<Any>, Status> {
        if request.resource_names.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{DEBUG_TYPE} takes the debug endpoints as resource names (for example syncz, \
                 adsz or config_dump?proxyID=<id>)"
            )));
        }
        let mut out = Vec::new();
        for name in &request.resource_names {
            let path = format!("/debug/{}", name.trim_start_matches('/'));
            let http = Request::get(&path)
                .body(Body::empty())
                .map_err(|e| Status::invalid_argument(format!("{name:?}: {e}")))?;
            let response = self
                .router
                .clone()
                .oneshot(http)
                .await
                .map_err(|e| Status::internal(format!("{path}: {e}")))?;
            let code = response.status();
            let body = axum::body::to_bytes(response.into_body(), MAX_ENDPOINT_BYTES)
                .await
                .map_err(|e| Status::internal(format!("{path}: {e}")))?;
            if code != StatusCode::OK {
                let text = String::from_utf8_lossy(&body);
                let message = format!("{path}: {code}: {}", text.trim());
                return Err(if code == StatusCode::NOT_FOUND {
                    Status::not_found(message)
                } else {
                    Status::invalid_argument(message)
                });
            }
            out.push(Any {
                type_url: DEBUG_TYPE.to_string(),
                value: body,
            });
        }
        Ok(out)
    }
}

#[tonic::async_trait]
impl DebugResponder for DebugXds {
    async fn respond(
        &self,
        caller: Option<&VerifiedCaller>,
        request: &DiscoveryRequest,
    ) -> Result<DiscoveryResponse, Status> {
        self.authorize(caller)?;
        let generation = self
            .state
            .snapshots
            .borrow()
            .as_ref()
            .map_or(0, |s| s.generation);
        let mut response = DiscoveryResponse {
            version_info: generation.to_string(),
            ..Default::default()
        };
        response.resources = match request.type_url.as_str() {
            SYNCZ_TYPE => {
                response.control_plane = Some(ControlPlane {
                    identifier: self.identifier.clone(),
                });
                self.syncz()
            }
            CONFIG_DUMP_TYPE => self.config_dump(request)?,
            DEBUG_TYPE => self.endpoints(request).await?,
            other => {
                return Err(Status::unimplemented(format!(
                    "unknown debug type {other:?} ({SYNCZ_TYPE}, {CONFIG_DUMP_TYPE} and \
                     {DEBUG_TYPE} are served)"
                )));
            }
        };
        Ok(response)
    }
}

/// A connection as istiod's syncz describes it: the node (id and the metadata ambientd keeps)
/// and, for each type ztunnel uses, SYNCED (the last response was ACKed), STALE (it was not
/// yet) or NOT_SENT.
fn client_config(c: &ConnectionStatus) -> ClientConfig {
    let proxy = c.proxy.clone().unwrap_or_default();
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let mut fields = std::collections::BTreeMap::new();
    for (key, value) in [
        ("NAME", &proxy.name),
        ("NAMESPACE", &proxy.namespace),
        ("NODE_NAME", &proxy.node_name),
        ("CLUSTER_ID", &proxy.cluster_id),
        ("ISTIO_VERSION", &proxy.version),
    ] {
        if !value.is_empty() {
            fields.insert(key.to_string(), text(value));
        }
    }
    let generic_xds_configs = TypeKind::ALL
        .into_iter()
        .map(|kind| GenericXdsConfig {
            type_url: kind.type_url().to_string(),
            config_status: sync_status(c.types.get(&kind)) as i32,
            ..Default::default()
        })
        .collect();
    ClientConfig {
        node: Some(Node {
            id: proxy.id.clone(),
            metadata: Some(Struct { fields }),
            ..Default::default()
        }),
        generic_xds_configs,
        ..Default::default()
    }
}

/// istiod's `debugSyncStatus`.
fn sync_status(status: Option<&TypeStatus>) -> ConfigStatus {
    match status {
        None => ConfigStatus::NotSent,
        Some(t) if t.sent_nonce.is_empty() => ConfigStatus::NotSent,
        Some(t) if t.acked_nonce == t.sent_nonce => ConfigStatus::Synced,
        Some(_) => ConfigStatus::Stale,
    }
}

/// The responder for an app: the debug state's views, with the TLS port's caller.
pub fn responder(state: DebugState) -> Arc<dyn DebugResponder> {
    Arc::new(DebugXds::new(state))
}
