//! Liveness, readiness and metrics.

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use super::{problem::ApiError, AppState};
use crate::store::StoreError;

/// The process is up and serving HTTP. Does not touch the database: a database outage must not
/// get healthy fencegate processes restarted.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// Ready to take writes: the database answers and is fully migrated.
pub async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.ready().await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "not ready");
            // Always 503 (never 500): readiness is about "not now", whatever the cause.
            let err = match err {
                StoreError::Unavailable(e) | StoreError::Internal(e) => ApiError::Store(StoreError::Unavailable(e)),
                StoreError::Corrupt(msg) | StoreError::Task(msg) | StoreError::Refused(msg) | StoreError::Raced(msg) => {
                    ApiError::Store(StoreError::Unavailable(sqlx::Error::Protocol(msg)))
                }
            };
            err.into_response()
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    crate::telemetry::record_pool(&state.store);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    )
        .into_response()
}
