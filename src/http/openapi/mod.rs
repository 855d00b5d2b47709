//! `GET /openapi.json` and `GET /docs`: the API described by the code itself.
//!
//! Every route is registered through `utoipa_axum::routes!` from the `#[utoipa::path]`
//! attribute on its handler (see `routers` in `http/mod.rs`): the router and the document come
//! out of the same `OpenApiRouter`, so a route cannot be served without being described. The
//! extractors describe their own parameters (`params`), each handler lists the problem types
//! it can answer (`problems`), the problem types are `problem::kinds`, and the bodies' schemas
//! are derived from the types the handlers serialize (a token's is `token`).

mod params;
mod problems;
mod replay;
mod rules;
mod token;

use std::sync::OnceLock;

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
    Extension,
};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use utoipa::{
    openapi::{
        schema::Schema,
        security::{Http, HttpAuthScheme, SecurityScheme},
        RefOr,
    },
    Modify, OpenApi,
};

pub use params::{LockName, RowParams};
pub use problems::*;
pub use replay::describe_replays;

use super::problem::{kinds, Problem};
use crate::fence::FencingToken;

/// The document's frame; the paths are added by the router (`http::routers`).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "fencegate",
        description = "A fencing-aware storage proxy: writes carry the fencing token of the lock their \
                       writer holds, and a token older than the fence is refused (412) in the same \
                       transaction as the write. Tokens are JSON strings of canonical decimals. Errors \
                       are RFC 9457 application/problem+json. See docs/wire.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    components(schemas(Problem, FencingToken)),
    modifiers(&Security),
    security(("bearer" = [])),
    tags(
        (name = "kv", description = "Fenced values"),
        (name = "fences", description = "A scope's fence, raised without writing data"),
        (name = "locks", description = "The built-in lease service; a grant raises the fence of scope {name}"),
        (name = "tables", description = "Legacy PostgreSQL tables fenced in place ([[resources]])"),
        (name = "admin", description = "Audited resets; the admin right"),
        (name = "ops", description = "Probes, metrics, and this description; no credential needed")
    )
)]
pub struct ApiDoc;

/// `Authorization: Bearer <API key or JWT>`: required on every operation but the open ones
/// (once any credential is configured; with auth off, none is).
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        let mut bearer = Http::new(HttpAuthScheme::Bearer);
        bearer.description = Some(
            "An API key ([[auth.keys]]) or a JWT ([auth.jwt]). Needed once any credential is configured; \
             missing or invalid: 401 unauthenticated; lacking the right or the name: 403 forbidden."
                .into(),
        );
        components.add_security_scheme("bearer", SecurityScheme::Http(bearer));
        // Every problem type there is, as the values of `type` (per response: the ones it has).
        if let Some(RefOr::T(Schema::Object(problem))) = components.schemas.get_mut("Problem") {
            problem
                .properties
                .insert("type".into(), type_enum(kinds::ALL).into());
        }
    }
}

/// The document as served: built once per router, shared by every request.
#[derive(Clone)]
pub struct Served(pub axum::body::Bytes);

pub use rules::Bounds;

impl Served {
    /// The document with what the server enforces written in (`rules`): the validators'
    /// patterns and the configured bounds.
    pub fn new(doc: &utoipa::openapi::OpenApi, bounds: &Bounds) -> Self {
        let mut value = serde_json::to_value(doc).expect("the document serializes");
        rules::apply(&mut value, bounds);
        Served(
            serde_json::to_vec_pretty(&value)
                .expect("the document serializes")
                .into(),
        )
    }
}

#[utoipa::path(
    operation_id = "openapi_json",
    get,
    path = super::routes::OPENAPI,
    tag = "ops",
    summary = "This document (OpenAPI 3.1)",
    responses((status = 200, description = "The OpenAPI 3.1 document of every route", content_type = "application/json"), Edge)
)]
pub async fn openapi_json(Extension(doc): Extension<Served>) -> Response {
    // A clone of `Bytes` shares the one document: an open route must not copy it per request.
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        doc.0,
    )
        .into_response()
}

const DOCS_HTML: &str = include_str!("docs/index.html");
const DOCS_JS: &str = include_str!("docs/render.js");
const DOCS_CSS: &str = include_str!("docs/style.css");

/// The page and its Content-Security-Policy: the inline script and style are allowed by their
/// sha256 and nothing else may load, from anywhere but `/openapi.json` (`connect-src 'self'`).
fn docs_page() -> &'static (String, String) {
    static PAGE: OnceLock<(String, String)> = OnceLock::new();
    PAGE.get_or_init(|| {
        let hash = |text: &str| base64::engine::general_purpose::STANDARD.encode(Sha256::digest(text.as_bytes()));
        let page = DOCS_HTML.replace("/*STYLE*/", DOCS_CSS).replace("/*SCRIPT*/", DOCS_JS);
        let csp = format!(
            "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; connect-src 'self'; \
             img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash(DOCS_JS),
            hash(DOCS_CSS)
        );
        (page, csp)
    })
}

#[utoipa::path(
    operation_id = "docs",
    get,
    path = super::routes::DOCS,
    tag = "ops",
    summary = "This document as a page (every asset in the binary)",
    responses((status = 200, description = "An HTML page rendering /openapi.json", content_type = "text/html"), Edge)
)]
pub async fn docs() -> Response {
    let (page, csp) = docs_page();
    super::embedded::page(
        page,
        "text/html; charset=utf-8",
        HeaderValue::from_str(csp).expect("the policy is ASCII"),
    )
}
