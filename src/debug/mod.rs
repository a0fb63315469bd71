//! The debug HTTP endpoint (15014). It reads published snapshots, the connection registry and
//! metrics, and never mutates the mesh.
//!
//! Open to everyone: `/ready` (200 with no body once the first snapshot is built, 503 before),
//! `/version`, `/metrics`. `/debug/*` and `/logging` are open on loopback; other callers must
//! present a token (or, through a proxy, nothing else) that the CA's authenticators accept for
//! an identity in the root namespace, as istiod requires.

mod explain;
mod logging;
mod page;
pub mod render;
mod views;
pub mod xds;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;

pub use logging::LogControl;

use crate::discovery::Settings;
use crate::metrics::Metrics;
use crate::push::{Registry, Snapshots};

/// What the debug server reads.
#[derive(Clone, Debug)]
pub struct DebugState {
    pub snapshots: Snapshots,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub log_filter: Option<LogControl>,
    /// The CA's authenticators, for callers that are not on loopback; `None` without a CA.
    pub authenticators: Option<crate::ca::Authenticators>,
    /// The Kubernetes source's watch health (`None` for a manifests directory), for
    /// `/debug/syncz`.
    pub source_health: Option<std::sync::Arc<crate::kube::cluster::ClusterHealth>>,
}

/// Every endpoint, as listed by `/debug/list`.
const ENDPOINTS: &[&str] = &[
    "/ready",
    "/version",
    "/metrics",
    "/logging",
    "/debug",
    "/debug/list",
    "/debug/syncz",
    "/debug/connections",
    "/debug/adsz",
    "/debug/config_dump",
    "/debug/ambientz",
    "/debug/authorize",
];

/// The debug router. Serve it with `into_make_service_with_connect_info::<SocketAddr>()` so
/// the loopback check can see the caller.
pub fn router(state: DebugState) -> Router {
    let private = Router::new()
        .route("/debug", get(page::page))
        .route("/debug/", get(page::page))
        .route("/debug/list", get(list))
        .route("/debug/syncz", get(views::syncz))
        .route("/debug/connections", get(views::connections))
        .route("/debug/adsz", get(views::adsz))
        .route("/debug/config_dump", get(views::config_dump))
        .route("/debug/ambientz", get(views::ambientz))
        .route("/debug/authorize", get(explain::authorize))
        .route("/logging", get(logging_level).post(logging_level))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard));
    Router::new()
        .route("/ready", get(ready))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .merge(private)
        .with_state(state)
}

/// Loopback callers pass; others need an identity in the root namespace.
async fn guard(State(state): State<DebugState>, request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    match peer {
        // Without connect info (a router used in-process) there is no remote caller.
        None => return next.run(request).await,
        Some(ip) if ip.is_loopback() => return next.run(request).await,
        Some(_) => {}
    }
    let Some(authenticators) = &state.authenticators else {
        return (
            StatusCode::FORBIDDEN,
            "debug endpoints are served to loopback callers only (no CA to authenticate others)\n",
        )
            .into_response();
    };
    let metadata = tonic::metadata::MetadataMap::from_headers(request.headers().clone());
    let context = crate::ca::AuthContext {
        metadata: &metadata,
        peer_certs: None,
    };
    match authenticators.authenticate(&context).await {
        Ok(caller) if caller.identity.namespace == state.settings.root_namespace => {
            next.run(request).await
        }
        Ok(caller) => {
            tracing::warn!(caller = %caller.identity, "debug request refused: not in the root namespace");
            (
                StatusCode::FORBIDDEN,
                "debug endpoints need an identity in the root namespace\n",
            )
                .into_response()
        }
        Err(failure) => {
            tracing::warn!(reason = %failure, "debug request refused: authentication failed");
            (StatusCode::UNAUTHORIZED, "authentication required\n").into_response()
        }
    }
}

/// istiod's readiness: 200 with no body when ready; 503 (here with a short reason) before.
async fn ready(State(state): State<DebugState>) -> (StatusCode, &'static str) {
    if state.snapshots.borrow().is_some() {
        (StatusCode::OK, "")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the first full load of every source\n",
        )
    }
}

async fn version() -> String {
    format!("ambientd {}\n", env!("CARGO_PKG_VERSION"))
}

async fn metrics(State(state): State<DebugState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn list() -> axum::Json<&'static [&'static str]> {
    axum::Json(ENDPOINTS)
}

#[derive(Debug, Deserialize)]
struct LevelQuery {
    level: Option<String>,
}

async fn logging_level(State(state): State<DebugState>, Query(q): Query<LevelQuery>) -> Response {
    let Some(level) = q.level else {
        return (
            StatusCode::BAD_REQUEST,
            "level is required, e.g. /logging?level=debug\n",
        )
            .into_response();
    };
    let Some(control) = &state.log_filter else {
        return (
            StatusCode::NOT_IMPLEMENTED,
            "this process does not own its logging\n",
        )
            .into_response();
    };
    match control.set(&level) {
        Ok(()) => {
            tracing::info!(level, "log filter changed");
            (StatusCode::OK, format!("log filter set to {level}\n")).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(snapshots: Snapshots) -> DebugState {
        DebugState {
            snapshots,
            registry: Arc::new(Registry::default()),
            metrics: Arc::new(Metrics::new()),
            settings: Settings::default(),
            log_filter: None,
            authenticators: None,
            source_health: None,
        }
    }

    /// Requests from a non-loopback peer need a root-namespace identity.
    #[tokio::test]
    async fn remote_debug_callers_need_a_root_namespace_identity() {
        use crate::ca::token::{LocalKey, Subject, local_claims};
        use axum::body::Body;
        use tower::ServiceExt;

        let dir = tempfile::tempdir().unwrap();
        let key = LocalKey::load_or_create(dir.path()).unwrap();
        let jwt = crate::ca::JwtAuthenticator::new("cluster.local", vec!["istio-ca".into()], &key);
        let mint = |namespace: &str| {
            let subject = Subject {
                namespace: namespace.into(),
                service_account: "admin".into(),
                pod: None,
                node: None,
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            key.mint(&local_claims(
                &subject,
                &["istio-ca".into()],
                now,
                std::time::Duration::from_secs(600),
            ))
            .unwrap()
        };
        let (_publish, snapshots) = tokio::sync::watch::channel(None);
        let mut state = state(snapshots);
        state.authenticators = Some(crate::ca::Authenticators::new(vec![Arc::new(jwt)]));
        let app = router(state);
        let call = |peer: [u8; 4], token: Option<String>| {
            let mut request = axum::http::Request::get("/debug/list");
            if let Some(token) = token {
                request = request.header("authorization", format!("Bearer {token}"));
            }
            let mut request = request.body(Body::empty()).unwrap();
            request
                .extensions_mut()
                .insert(ConnectInfo(SocketAddr::from((peer, 40000))));
            let app = app.clone();
            async move { app.oneshot(request).await.unwrap().status() }
        };
        assert_eq!(call([127, 0, 0, 1], None).await, StatusCode::OK);
        assert_eq!(call([10, 1, 2, 3], None).await, StatusCode::UNAUTHORIZED);
        assert_eq!(
            call([10, 1, 2, 3], Some(mint("demo"))).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            call([10, 1, 2, 3], Some(mint("istio-system"))).await,
            StatusCode::OK
        );
        // /metrics stays open.
        let request = axum::http::Request::get("/metrics")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            app.clone().oneshot(request).await.unwrap().status(),
            StatusCode::OK
        );
    }

    #[tokio::test]
    async fn ready_is_503_until_the_first_snapshot_then_200() {
        let (publish, snapshots) = tokio::sync::watch::channel(None);
        let (code, body) = ready(State(state(snapshots.clone()))).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not ready"));
        publish.send_replace(Some(Arc::new(crate::discovery::Snapshot::default())));
        let (code, body) = ready(State(state(snapshots))).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body, "", "istiod's 200 has no body");
    }

    #[test]
    fn a_manifests_source_is_always_current_and_a_healthy_cluster_too() {
        let (_publish, snapshots) = tokio::sync::watch::channel(None);
        let manifests = state(snapshots.clone());
        let current = serde_json::json!({"current": true, "failing": []});
        assert_eq!(views::source_status(&manifests), current);
        let cluster = DebugState {
            source_health: Some(Arc::new(crate::kube::cluster::ClusterHealth::default())),
            ..state(snapshots)
        };
        assert_eq!(views::source_status(&cluster), current);
    }
}
