//! The debug HTTP endpoint (15014). It reads published snapshots and never mutates anything.
//!
//! `GET /ready`: 200 once the first snapshot is built, 503 before.

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::push::Snapshots;

/// The debug router, over the published snapshots.
pub fn router(snapshots: Snapshots) -> Router {
    Router::new()
        .route("/ready", get(ready))
        .with_state(snapshots)
}

async fn ready(State(snapshots): State<Snapshots>) -> (StatusCode, &'static str) {
    if snapshots.borrow().is_some() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: waiting for the first full load of every source\n",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn ready_is_503_until_the_first_snapshot_then_200() {
        let (publish, snapshots) = tokio::sync::watch::channel(None);
        let (code, body) = ready(State(snapshots.clone())).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("not ready"));
        publish.send_replace(Some(Arc::new(crate::discovery::Snapshot::default())));
        let (code, _) = ready(State(snapshots)).await;
        assert_eq!(code, StatusCode::OK);
    }
}
