//! The debug HTTP endpoint (15014). It reads published snapshots, the connection registry and
//! metrics, and never mutates the mesh.
//!
//! Open to everyone: `/ready` (200 once the first snapshot is built, 503 before), `/version`,
//! `/metrics`. Open on loopback only: `/debug/*` and `/logging` (istiod also lets
//! authenticated root-namespace callers in; until the CA's authenticators back this server,
//! other callers get 403).

mod explain;
mod logging;
mod page;
pub mod render;
mod views;

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
        .route_layer(middleware::from_fn(loopback_only));
    Router::new()
        .route("/ready", get(ready))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .merge(private)
        .with_state(state)
}

async fn loopback_only(request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    match peer {
        Some(ip) if ip.is_loopback() => next.run(request).await,
        // Without connect info (a router used in-process) there is no remote caller.
        None => next.run(request).await,
        Some(_) => (
            StatusCode::FORBIDDEN,
            "debug endpoints are only served to loopback callers\n",
        )
            .into_response(),
    }
}

async fn ready(State(state): State<DebugState>) -> (StatusCode, &'static str) {
    if state.snapshots.borrow().is_some() {
        (StatusCode::OK, "ready\n")
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
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
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
        }
    }

    #[tokio::test]
    async fn ready_is_503_until_the_first_snapshot_then_200() {
        let (publish, snapshots) = tokio::sync::watch::channel(None);
        let (code, body) = ready(State(state(snapshots.clone()))).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not ready"));
        publish.send_replace(Some(Arc::new(crate::discovery::Snapshot::default())));
        let (code, _) = ready(State(state(snapshots))).await;
        assert_eq!(code, StatusCode::OK);
    }
}
