//! The HTTP surface: routes, the middleware stack, and the state handlers share.

mod admin;
pub mod auth;
mod batch;
mod binding;
mod console;
mod edge;
mod extract;
mod fences;
mod gate;
mod kv;
mod locks;
mod observe;
mod openapi;
mod ops;
mod tables;
pub mod problem;

use std::{sync::Arc, time::Duration};

use axum::{
    extract::DefaultBodyLimit,
    http::{header, HeaderName, HeaderValue, Method},
    Extension, Router,
};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::ServiceBuilder;
use tower_http::cors::CorsLayer;

use crate::{
    config::{KvSettings, LockSettings},
    fence::Bindings,
    store::Store,
    tables::Resources,
};
pub use edge::check_numbers;
pub use extract::{SCOPE_HEADER, TOKEN_HEADER};
pub use observe::{ServerFailure, WriteOutcome};
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

impl Limits {
    /// The limits `settings` ask for. `listen` is the address actually bound.
    pub fn from_settings(settings: &crate::config::Settings, listen: std::net::SocketAddr) -> Self {
        let server = &settings.server;
        Limits {
            body_bytes: server.body_limit_bytes,
            request_timeout: settings.request_timeout(),
            max_in_flight: server.max_in_flight,
            body_timeout: Duration::from_millis(server.body_timeout_ms),
            min_body_rate: server.min_body_rate_bytes_per_s,
            max_buffered_bytes: server.max_buffered_bytes,
            max_number_digits: settings.kv.max_number_digits,
            // With credentials, a rebound page cannot send the bearer it does not have.
            loopback_hosts_only: listen.ip().is_loopback() && !settings.auth_enabled(),
            cors_origins: server
                .cors_origins
                .iter()
                .map(|o| HeaderValue::from_str(o).expect("origins are checked by Settings::validate"))
                .collect(),
        }
    }
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
    pub const ADMIN_FENCE_RESET: &str = "/v1/admin/fences/{scope}/reset";
    pub const ADMIN_KV_RESET: &str = "/v1/admin/kv/{key}/reset";
    pub const ADMIN_TABLE_RESET: &str = "/v1/admin/tables/{resource}/{key}/reset";
    pub const ADMIN_AUDIT: &str = "/v1/admin/audit";
    pub const ADMIN_LOCK_RETIRE: &str = "/v1/admin/locks/{name}/retire";
    pub const ADMIN_KV_REBIND: &str = "/v1/admin/kv/rebind";
    pub const ADMIN_REFUSALS: &str = "/v1/admin/refusals";
    pub const ADMIN_TABLE_REBIND: &str = "/v1/admin/tables/{resource}/rebind";
    pub const OPENAPI: &str = "/openapi.json";
    pub const DOCS: &str = "/docs";
    pub const ADMIN_OVERVIEW: &str = "/v1/admin/overview";
    pub const ADMIN_EVENTS: &str = "/v1/admin/events";
    /// The console's page and assets: open without a credential (they hold no data).
    pub const UI: &str = "/ui";
    pub const UI_SCRIPT: &str = "/ui/console.js";
    pub const UI_STYLE: &str = "/ui/console.css";
    pub const ALL: &[&str] = &[
        KV, TABLES, BATCH, FENCES, LOCKS, LOCK_RENEW, HEALTHZ, READYZ, METRICS,
        ADMIN_FENCE_RESET, ADMIN_KV_RESET, ADMIN_TABLE_RESET, ADMIN_AUDIT, ADMIN_LOCK_RETIRE, ADMIN_KV_REBIND, ADMIN_TABLE_REBIND, ADMIN_REFUSALS, OPENAPI, DOCS,
        ADMIN_OVERVIEW, ADMIN_EVENTS, UI, UI_SCRIPT, UI_STYLE,
    ];

    pub fn is_console_asset(path: &str) -> bool {
        path == UI || path == UI_SCRIPT || path == UI_STYLE
    }
}

/// Every route, registered from the `#[utoipa::path]` of its handler: the open routes (probes
/// and this API's description: no credential, never shed), the API, and the OpenAPI document
/// of both. The document is made of exactly what the routers serve.
fn routers() -> (Router<AppState>, Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi as _;
    use utoipa_axum::{router::OpenApiRouter, routes};
    let (open, mut doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(openapi::openapi_json))
        .routes(routes!(openapi::docs))
        .split_for_parts();
    let (api, api_doc) = OpenApiRouter::new()
        .routes(routes!(kv::put, kv::get, kv::delete))
        .routes(routes!(tables::put, tables::patch, tables::get, tables::delete))
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
    doc.merge(api_doc);
    (open, api, doc)
}

/// The whole application as a `Router`; tests build exactly this.
pub fn app(state: AppState, limits: Limits) -> Router {
    let (open, api, doc) = routers();
    let served = openapi::Served(doc.to_pretty_json().expect("the document serializes").into());
    let edge = edge::Edge {
        body_limit: limits.body_bytes,
        body_timeout: limits.body_timeout,
        min_body_rate: limits.min_body_rate,
        max_number_digits: limits.max_number_digits,
        buffered: Arc::new(tokio::sync::Semaphore::new(limits.max_buffered_bytes)),
        loopback_hosts_only: limits.loopback_hosts_only,
    };
    // The gate (edge, in-flight limit, timeout, auth: `gate`) is one service per route. The
    // open routes' gate never sheds: a load balancer that sees /healthz 503 under load
    // restarts a healthy process. axum's own body limit stays in step with the edge's.
    let body_limit = DefaultBodyLimit::max(limits.body_bytes);
    let probes = open
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state.clone())
        .layer(Extension(served))
        .layer(ServiceBuilder::new().layer(gate::GateLayer::open(edge.clone(), limits.request_timeout)).layer(body_limit));
    let api = api
        .fallback(|| async { ApiError::NotFound("no such endpoint; see docs/api.md or GET /openapi.json".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state.clone())
        .layer(
            ServiceBuilder::new()
                .layer(gate::GateLayer::api(edge, limits.max_in_flight, limits.request_timeout, state.auth.clone()))
                .layer(body_limit),
        );
    // Outermost last: CORS if configured, then the request id, span, metrics and error log
    // (`observe`).
    let app = probes.merge(api);
    let app = match cors(&limits.cors_origins) {
        Some(cors) => app.layer(cors),
        None => app,
    };
    app.layer(observe::ObserveLayer::new(routes::ALL, state.events.clone()))
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
            .allow_methods([Method::GET, Method::PUT, Method::POST, Method::DELETE, Method::PATCH])
            .allow_headers([
                header::CONTENT_TYPE,
                HeaderName::from_static(TOKEN_HEADER),
                HeaderName::from_static(SCOPE_HEADER),
                HeaderName::from_static("x-request-id"),
            ])
            .expose_headers([HeaderName::from_static(TOKEN_HEADER), HeaderName::from_static("x-request-id")]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routers and the document come from the same `OpenApiRouter`s; this holds the route
    /// templates of metrics and logs (`routes::ALL`) to them: a route served but not
    /// documented, or documented but unlabelled, fails here.
    #[test]
    fn every_route_is_documented_and_labelled() {
        let (_, _, doc) = routers();
        let documented: std::collections::BTreeSet<&str> = doc.paths.paths.keys().map(String::as_str).collect();
        let labelled: std::collections::BTreeSet<&str> = routes::ALL.iter().copied().collect();
        assert_eq!(documented, labelled, "routes::ALL and the OpenAPI document disagree");
        assert_eq!(routes::ALL.len(), labelled.len(), "a route template is listed twice");
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
            assert!(text.contains(&kind.uri()), "no operation answers {}", kind.slug);
        }
        let slugs: std::collections::BTreeSet<_> = problem::kinds::ALL.iter().map(|k| k.slug).collect();
        assert_eq!(slugs.len(), problem::kinds::ALL.len(), "a problem type is listed twice");
    }

    #[test]
    fn the_host_check_is_on_only_for_a_loopback_listener() {
        let settings = crate::config::Settings::default();
        let on = |addr: &str| Limits::from_settings(&settings, addr.parse().unwrap()).loopback_hosts_only;
        assert!(on("127.0.0.1:8080"));
        assert!(on("[::1]:8080"));
        assert!(!on("0.0.0.0:8080"), "a non-loopback listener serves any Host");
        assert!(!on("192.168.1.5:8080"));
        // With credentials configured, no Host check (docs/security.md, *The edge*: with auth off).
        let mut with_auth = crate::config::Settings::default();
        with_auth.auth.keys = vec![crate::config::ApiKeySettings {
            name: "k".into(),
            sha256: "0".repeat(64),
            rights: vec!["read".into()],
            prefixes: vec![],
            tables: vec![],
        }];
        assert!(!Limits::from_settings(&with_auth, "127.0.0.1:8080".parse().unwrap()).loopback_hosts_only);
    }
}
