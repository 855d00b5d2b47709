//! The HTTP surface: routes, the middleware stack, and the state handlers share.

mod batch;
mod extract;
mod fences;
mod kv;
mod locks;
mod ops;
mod tables;
pub mod problem;

use std::{sync::Arc, time::Duration};

use axum::{
    error_handling::HandleErrorLayer,
    extract::{DefaultBodyLimit, MatchedPath, Request},
    http::HeaderName,
    middleware,
    response::{IntoResponse, Response},
    routing::{get, post, put},
    BoxError, Extension, Router,
};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::{limit::GlobalConcurrencyLimitLayer, ServiceBuilder};
use tower_http::{
    catch_panic::CatchPanicLayer,
    request_id::{PropagateRequestIdLayer, SetRequestIdLayer},
    trace::TraceLayer,
};

use crate::{
    config::{KvSettings, LockSettings},
    store::Store,
    tables::Resources,
};
pub use extract::{SCOPE_HEADER, TOKEN_HEADER};
use problem::ApiError;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub kv: Arc<KvSettings>,
    pub locks: Arc<LockSettings>,
    /// The legacy tables of `[[resources]]`, validated against the catalog at start-up.
    pub tables: Resources,
    pub metrics: PrometheusHandle,
}

/// Limits of the middleware stack.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub body_bytes: usize,
    pub request_timeout: Duration,
    /// Requests handled at once; beyond it new requests are shed with 503 + Retry-After
    /// rather than queued without bound.
    pub max_in_flight: usize,
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole application as a `Router`; tests build exactly this.
pub fn app(state: AppState, limits: Limits) -> Router {
    let api = Router::new()
        .route("/v1/kv/{key}", put(kv::put).get(kv::get).delete(kv::delete))
        .route(
            "/v1/tables/{resource}/{key}",
            put(tables::put).patch(tables::patch).get(tables::get).delete(tables::delete),
        )
        .route("/v1/batch", post(batch::batch))
        .route("/v1/fences/{scope}", post(fences::claim).get(fences::get))
        .route("/v1/locks/{name}", post(locks::acquire).delete(locks::release))
        .route("/v1/locks/{name}/renew", post(locks::renew))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .fallback(|| async { ApiError::NotFound("no such endpoint; see the README for the API".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state);

    // Outermost first: request id, trace span, metrics, panic guard, load shedding and the
    // in-flight limit, timeout, body limit. The limit is global (one semaphore for all routes).
    api.layer(
        ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(REQUEST_ID, crate::telemetry::RequestIds::new()))
            .layer(PropagateRequestIdLayer::new(REQUEST_ID))
            .layer(TraceLayer::new_for_http().make_span_with(crate::telemetry::request_span))
            .layer(middleware::from_fn(crate::telemetry::track_request))
            .layer(CatchPanicLayer::custom(|_| ApiError::Internal("handler panicked".into()).into_response()))
            .layer(HandleErrorLayer::new(middleware_error))
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::new(limits.max_in_flight))
            .timeout(limits.request_timeout)
            .layer(Extension(extract::BodyLimit(limits.body_bytes)))
            .layer(DefaultBodyLimit::max(limits.body_bytes)),
    )
}

async fn middleware_error(err: BoxError) -> Response {
    if err.is::<tower::timeout::error::Elapsed>() {
        ApiError::Timeout.into_response()
    } else if err.is::<tower::load_shed::error::Overloaded>() {
        metrics::counter!("fencegate_shed_requests_total").increment(1);
        ApiError::Overloaded.into_response()
    } else {
        ApiError::Internal(err.to_string()).into_response()
    }
}

/// The route template a request matched, for bounded metric and span labels.
pub(crate) fn route_of(req: &Request) -> &str {
    req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str)
}
