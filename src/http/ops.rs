//! Liveness, readiness and metrics.

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;
use utoipa::ToSchema;

use super::openapi as doc;
use super::{problem::ApiError, AppState};
use crate::store::StoreError;

/// The body of a probe that passed.
#[derive(Serialize, ToSchema)]
pub struct Status {
    /// ok (healthz) or ready (readyz).
    status: &'static str,
}

/// The process is up and serving HTTP. Does not touch the database: a database outage must not
/// get healthy fencegate processes restarted.
#[utoipa::path(
    operation_id = "healthz",
    get,
    path = super::routes::HEALTHZ,
    tag = "ops",
    responses((status = 200, description = "Serving HTTP", body = Status), doc::Edge)
)]
pub async fn healthz() -> Json<Status> {
    Json(Status { status: "ok" })
}

/// How long `/readyz` waits for the database before answering 503.
const READY_WITHIN: std::time::Duration = std::time::Duration::from_millis(800);

/// Ready to take writes: the database answers within [`READY_WITHIN`], is a writable primary,
/// fully migrated, and refused no write for lack of resources lately.
#[utoipa::path(
    operation_id = "readyz",
    get,
    path = super::routes::READYZ,
    tag = "ops",
    responses((status = 200, description = "The database answers and is migrated", body = Status), doc::Readiness)
)]
pub async fn readyz(State(state): State<AppState>) -> Response {
    // A probe usually gives up after 1 s: a database that does not answer in time (frozen, or
    // every connection busy) is a 503 that says so, never a probe timeout.
    let ready = tokio::time::timeout(READY_WITHIN, state.store.ready())
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::NotReady(format!(
                "the database did not answer within {} ms",
                READY_WITHIN.as_millis()
            )))
        });
    match ready {
        Ok(()) => Json(Status { status: "ready" }).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "not ready");
            // Always 503 (never 500): readiness is about "not now", whatever the cause.
            let err = match err {
                StoreError::Unavailable(e) | StoreError::Internal(e) => {
                    ApiError::Store(StoreError::Unavailable(e))
                }
                // Says why (a standby, migrations owed): fencegate's own words, safe to send.
                StoreError::NotReady(why) => ApiError::Store(StoreError::NotReady(why)),
                StoreError::Refused { cause, .. } | StoreError::KeyJump { cause, .. } => {
                    ApiError::Store(StoreError::Unavailable(cause))
                }
                StoreError::Corrupt(msg)
                | StoreError::Task(msg)
                | StoreError::Raced(msg)
                | StoreError::Unkeepable(msg) => ApiError::Store(StoreError::unavailable(msg)),
            };
            err.into_response()
        }
    }
}

/// Prometheus text. Open unless `auth.protect_metrics`, then it needs the admin right.
#[utoipa::path(
    operation_id = "metrics",
    get,
    path = super::routes::METRICS,
    tag = "ops",
    responses((status = 200, description = "Prometheus exposition format", content_type = "text/plain"), doc::Edge)
)]
pub async fn metrics(State(state): State<AppState>) -> Response {
    crate::telemetry::record_pool(&state.store);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
