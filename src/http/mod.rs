//! The HTTP surface: routes, the middleware stack, and the state handlers share.

mod admin;
pub mod auth;
mod batch;
mod binding;
mod console;
mod dispatch;
mod edge;
mod embedded;
mod extract;
mod fences;
mod gate;
mod idempotency;
mod kv;
mod locks;
mod observe;
mod openapi;
mod ops;
pub mod problem;
mod report;
mod routes;
mod tables;

pub use dispatch::App;

use std::{sync::Arc, time::Duration};

use axum::{
    http::{header, HeaderName, HeaderValue, Method},
    Extension, Router,
};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;

use crate::{
    fence::{Bindings, KvSettings},
    locks::LockSettings,
    store::Store,
    tables::Resources,
};
pub use edge::check_numbers;
pub use extract::{SCOPE_HEADER, TOKEN_HEADER};
pub use observe::ServerFailure;
use problem::ApiError;

/// What every handler can reach: one `Arc`, because axum clones the state for every extractor
/// of every request (cloning the fields one by one was ~2.4% of fencegate's CPU at 64
/// connections: a dozen reference counts up and down per request). Fields through `Deref`.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The contents of [`AppState`].
pub struct Shared {
    pub store: Store,
    pub kv: Arc<KvSettings>,
    pub locks: Arc<LockSettings>,
    /// The legacy tables of `[[resources]]`, validated against the catalog at start-up.
    pub tables: Resources,
    /// `[[scopes]]`: the scope of bound keys, decided by configuration, not by the client.
    pub bindings: Arc<Bindings>,
    /// `[[issuers]]`: signed tokens, checked before any database work.
    pub issuers: Arc<crate::issuers::Issuers>,
    pub metrics: PrometheusHandle,
    /// The configured credentials; `None`: auth is off and every request has every right.
    pub auth: Option<Arc<crate::auth::Live>>,
    /// Grants, releases, refusals and writes/s of this process, for the console.
    pub events: crate::events::Events,
}

/// Limits of the middleware stack.
#[derive(Debug, Clone)]
pub struct Limits {
    pub body_bytes: usize,
    pub request_timeout: Duration,
    /// Requests handled at once; beyond it new requests are shed with 503 + Retry-After
    /// rather than queued without bound. Probes are never counted (nor shed).
    pub max_in_flight: usize,
    /// A body must arrive within this long of its headers.
    pub body_timeout: Duration,
    /// After a body's first second, the bytes a second it must keep up; 0: none.
    pub min_body_rate: u64,
    /// Body bytes held in memory at once across all requests.
    pub max_buffered_bytes: usize,
    pub max_number_digits: usize,
    /// Serve only `Host: localhost` or a loopback IP (auth off on a loopback listener).
    pub loopback_hosts_only: bool,
    /// Origins allowed cross-origin (CORS); empty: no CORS headers at all.
    pub cors_origins: Vec<HeaderValue>,
}

/// Every route, registered from the `#[utoipa::path]` of its handler, and the OpenAPI document
/// of them all: the document is made of exactly what the routers serve. `/openapi.json` is
/// apart only because it serves the finished document. Who may call each route is
/// `routes::ALL`, which the gate and the document's security read.
fn routers() -> (Router<AppState>, Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi as _;
    use utoipa_axum::{router::OpenApiRouter, routes};
    let (described, mut doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(openapi::openapi_json))
        .split_for_parts();
    let (rest, rest_doc) = OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(openapi::docs))
        // `dispatch::KvRoute` calls these three without the router: change both together.
        .routes(routes!(kv::put, kv::get, kv::delete))
        .routes(routes!(
            tables::put,
            tables::patch,
            tables::get,
            tables::delete
        ))
        .routes(routes!(batch::batch))
        .routes(routes!(fences::claim, fences::get))
        .routes(routes!(locks::acquire, locks::get, locks::release))
        .routes(routes!(locks::renew))
        .routes(routes!(ops::metrics))
        .routes(routes!(admin::reset_fence))
        .routes(routes!(admin::reset_key))
        .routes(routes!(admin::reset_row))
        .routes(routes!(admin::audit))
        .routes(routes!(admin::retire_lock))
        .routes(routes!(admin::rebind_keys))
        .routes(routes!(admin::rebind_table))
        .routes(routes!(admin::refusals))
        .routes(routes!(console::overview))
        .routes(routes!(console::events))
        .routes(routes!(console::page))
        .routes(routes!(console::script))
        .routes(routes!(console::style))
        .split_for_parts();
    doc.merge(rest_doc);
    openapi::describe_access(&mut doc);
    openapi::describe_replays(&mut doc);
    (described, rest, doc)
}

/// The whole application: the router, and the kv route beside it (`dispatch`); the server and
/// the tests build exactly this.
pub fn app(state: AppState, limits: Limits) -> App {
    let (described, rest, doc) = routers();
    let served = openapi::Served::new(
        &doc,
        &openapi::Bounds {
            max_key_bytes: state.kv.max_key_bytes,
            max_batch_ops: state.kv.max_batch_ops,
            max_ttl_ms: state.locks.max_ttl_ms,
        },
    );
    let edge = edge::Edge {
        body_limit: limits.body_bytes,
        body_timeout: limits.body_timeout,
        min_body_rate: limits.min_body_rate,
        max_number_digits: limits.max_number_digits,
        buffered: Arc::new(tokio::sync::Semaphore::new(limits.max_buffered_bytes)),
        loopback_hosts_only: limits.loopback_hosts_only,
    };
    // The gate (edge, in-flight limit, timeout, auth: `gate`) is one service per route, and
    // asks of each request what its route's access says (`routes`). The edge reads every body
    // within the limit and hands it to the handlers' extractors (`extract::Admitted`), so
    // axum's own body limit has nothing to do.
    let gate = gate::GateLayer::new(
        edge,
        limits.max_in_flight,
        limits.request_timeout,
        state.auth.clone(),
    );
    let app = described
        .layer(Extension(served))
        .merge(rest)
        .fallback(|| async {
            ApiError::NotFound("no such endpoint; see docs/api.md or GET /openapi.json".into())
        })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state.clone());
    // One `layer` call with the whole stack: axum wraps every route once per call (a boxed
    // service cloned, and its future boxed, for each request), so layering them one call at a
    // time cost a lone PUT that much again per layer. Outermost first: the request id, span,
    // metrics and error log (`observe`), CORS if configured, the gate. The kv route gets the
    // same layers, the same values, over its handlers (`dispatch`).
    let layers = ServiceBuilder::new()
        .layer(observe::ObserveLayer::new(state.events.clone()))
        .option_layer(cors(&limits.cors_origins))
        .layer(gate);
    let kv = layers.service(dispatch::KvRoute(state.clone()));
    App::new(app.layer(layers), kv)
}

/// CORS for exactly the listed origins, allowing the fencing headers and Content-Type; none
/// when no origin is listed (no `Access-Control-*` header is ever sent then).
fn cors(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(origins.to_vec())
            .allow_methods([
                Method::GET,
                Method::PUT,
                Method::POST,
                Method::DELETE,
                Method::PATCH,
            ])
            .allow_headers([
                header::CONTENT_TYPE,
                HeaderName::from_static(TOKEN_HEADER),
                HeaderName::from_static(SCOPE_HEADER),
                HeaderName::from_static("x-request-id"),
            ])
            .expose_headers([
                HeaderName::from_static(TOKEN_HEADER),
                HeaderName::from_static("x-request-id"),
            ]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routers and the document come from the same `OpenApiRouter`s; this holds the route
    /// table (`routes::ALL`: metric labels, and who may call each route) to them: a route
    /// served but not documented, or documented but not in the table, fails here.
    #[test]
    fn every_route_is_documented_and_in_the_table() {
        let (_, _, doc) = routers();
        let documented: std::collections::BTreeSet<&str> =
            doc.paths.paths.keys().map(String::as_str).collect();
        let listed: std::collections::BTreeSet<&str> = routes::ALL.iter().map(|r| r.path).collect();
        assert_eq!(
            documented, listed,
            "routes::ALL and the OpenAPI document disagree"
        );
        assert_eq!(
            routes::ALL.len(),
            listed.len(),
            "a route template is listed twice"
        );
    }

    /// Every problem type is named in the document: in the `Problem` schema, and in the
    /// responses of at least one operation (405 method-not-allowed answers any route).
    #[test]
    fn every_problem_type_is_documented() {
        let doc = serde_json::to_value(routers().2).unwrap();
        let all: Vec<String> = problem::kinds::ALL.iter().map(|k| k.uri()).collect();
        let listed = &doc["components"]["schemas"]["Problem"]["properties"]["type"]["enum"];
        assert_eq!(listed, &serde_json::json!(all));
        let text = doc["paths"].to_string();
        for kind in problem::kinds::ALL {
            assert!(
                text.contains(&kind.uri()),
                "no operation answers {}",
                kind.slug
            );
        }
        let slugs: std::collections::BTreeSet<_> =
            problem::kinds::ALL.iter().map(|k| k.slug).collect();
        assert_eq!(
            slugs.len(),
            problem::kinds::ALL.len(),
            "a problem type is listed twice"
        );
    }
}
