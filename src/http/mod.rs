//! The HTTP surface: routes, the middleware stack, and the state handlers share.

pub mod auth;
mod batch;
mod extract;
mod fences;
mod kv;
mod locks;
mod observe;
mod ops;
mod tables;
pub mod problem;

use std::{sync::Arc, time::Duration};

use axum::{
    error_handling::HandleErrorLayer,
    extract::DefaultBodyLimit,
    response::{IntoResponse, Response},
    routing::{get, post, put},
    BoxError, Extension, Router,
};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::{limit::GlobalConcurrencyLimitLayer, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;

use crate::{
    config::{KvSettings, LockSettings},
    fence::Bindings,
    store::Store,
    tables::Resources,
};
pub use extract::{SCOPE_HEADER, TOKEN_HEADER};
pub use observe::ServerFailure;
use problem::ApiError;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub kv: Arc<KvSettings>,
    pub locks: Arc<LockSettings>,
    /// The legacy tables of `[[resources]]`, validated against the catalog at start-up.
    pub tables: Resources,
    /// `[[scopes]]`: the scope of bound keys, decided by configuration, not by the client.
    pub bindings: Arc<Bindings>,
    pub metrics: PrometheusHandle,
    /// The configured credentials; `None`: auth is off and every request has every right.
    pub auth: Option<Arc<crate::auth::Authenticator>>,
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

/// The route templates: the router's paths and the `route` label of metrics and logs.
mod routes {
    pub const KV: &str = "/v1/kv/{key}";
    pub const TABLES: &str = "/v1/tables/{resource}/{key}";
    pub const BATCH: &str = "/v1/batch";
    pub const FENCES: &str = "/v1/fences/{scope}";
    pub const LOCKS: &str = "/v1/locks/{name}";
    pub const LOCK_RENEW: &str = "/v1/locks/{name}/renew";
    pub const HEALTHZ: &str = "/healthz";
    pub const READYZ: &str = "/readyz";
    pub const METRICS: &str = "/metrics";
    pub const ALL: &[&str] = &[KV, TABLES, BATCH, FENCES, LOCKS, LOCK_RENEW, HEALTHZ, READYZ, METRICS];
}

/// The whole application as a `Router`; tests build exactly this.
pub fn app(state: AppState, limits: Limits) -> Router {
    use routes::*;
    let api = Router::new()
        .route(KV, put(kv::put).get(kv::get).delete(kv::delete))
        .route(TABLES, put(tables::put).patch(tables::patch).get(tables::get).delete(tables::delete))
        .route(BATCH, post(batch::batch))
        .route(FENCES, post(fences::claim).get(fences::get))
        .route(LOCKS, post(locks::acquire).delete(locks::release))
        .route(LOCK_RENEW, post(locks::renew))
        .route(HEALTHZ, get(ops::healthz))
        .route(READYZ, get(ops::readyz))
        .route(METRICS, get(ops::metrics))
        .fallback(|| async { ApiError::NotFound("no such endpoint; see the README for the API".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state.clone());
    // Every route, the fallbacks included, needs a credential once one is configured (the
    // open routes are let through by `authenticate` itself). Not installed with auth off.
    let api = match state.auth {
        Some(auth) => api.layer(axum::middleware::from_fn_with_state(auth, auth::authenticate)),
        None => api,
    };

    // Outermost first: request id, span, metrics and error log (`observe`), panic guard, load
    // shedding and the in-flight limit, timeout, body limit. The limit is global (one
    // semaphore for all routes).
    api.layer(
        ServiceBuilder::new()
            .layer(observe::ObserveLayer::new(routes::ALL))
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
