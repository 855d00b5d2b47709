//! `GET /openapi.json` and `GET /docs`: the API described by the code itself.
//!
//! Every route is registered through `utoipa_axum::routes!` from the `#[utoipa::path]`
//! attribute on its handler (see `routers` in `http/mod.rs`): the router and the document come
//! out of the same `OpenApiRouter`, so a route cannot be served without being described. The
//! extractors describe their own parameters ([`IntoParams`] below), each handler lists the
//! problem types it can answer ([`problems!`]), and the problem types are `problem::kinds`.

use std::{borrow::Cow, collections::BTreeMap, sync::OnceLock};

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
    Extension,
};
use base64::Engine as _;
use sha2::{Digest, Sha256};
use utoipa::{
    openapi::{
        content::ContentBuilder,
        path::{Parameter, ParameterBuilder, ParameterIn},
        response::ResponseBuilder,
        schema::{AllOfBuilder, ObjectBuilder, Schema, Type},
        security::{Http, HttpAuthScheme, SecurityScheme},
        Ref, RefOr, Required, Response as ApiResponse,
    },
    IntoParams, Modify, OpenApi, PartialSchema, ToSchema,
};

use super::{
    extract::{KeyPath, Proof, ScopeHeader, ScopePath, Token},
    problem::{kinds, ProblemType},
};

/// `^(0|[1-9][0-9]*)$`, at most 9223372036854775807 (PostgreSQL `bigint`).
const TOKEN_PATTERN: &str = "^(0|[1-9][0-9]*)$";

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
    components(schemas(Problem, TokenText)),
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
            problem.properties.insert("type".into(), type_enum(kinds::ALL).into());
        }
    }
}

/// A string that is one of these problem types' URIs.
fn type_enum(kinds: &[ProblemType]) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).enum_values(Some(kinds.iter().map(ProblemType::uri)))
}

// ---- Parameters: each extractor says what it reads. ----

fn header_param(name: &str, required: bool, schema: impl Into<RefOr<Schema>>, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(if required { Required::True } else { Required::False })
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

fn path_param(name: &str, description: &str) -> Parameter {
    ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Path)
        .required(Required::True)
        .description(Some(description))
        .schema(Some(ObjectBuilder::new().schema_type(Type::String).min_length(Some(1))))
        .build()
}

impl IntoParams for Token {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Token",
            true,
            TokenText::schema(),
            "The fencing token of the lock the writer holds: a canonical decimal in 0..=9223372036854775807, \
             exactly one header. Missing: 428 missing-token; anything else: 400 malformed-token.",
        )]
    }
}

impl IntoParams for ScopeHeader {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Scope",
            false,
            ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)),
            "Write under this scope's fence (normally the lock's name) instead of the key's own. \
             Percent-decoded like a path segment (caf%C3%A9 is café). Invalid: 400 invalid-scope.",
        )]
    }
}

impl IntoParams for Proof {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![header_param(
            "X-Fencing-Proof",
            false,
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[A-Za-z0-9_-]+$")),
            "Required under a scope an [[issuers]] entry covers: base64url (no padding) of the issuer's \
             signature over \"fencegate-token-v1\\n{scope}\\n{token}\". Missing: 422 missing-token-proof; \
             wrong: 422 invalid-token-proof.",
        )]
    }
}

impl IntoParams for KeyPath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param(
            "key",
            "The key: one percent-decoded path segment (%2F is '/'), UTF-8, 1..=kv.max_key_bytes bytes, \
             no control characters. Invalid: 400 invalid-key.",
        )]
    }
}

impl IntoParams for ScopePath {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param("scope", "The scope: one percent-decoded path segment, the rules of a key.")]
    }
}

/// `{name}` of `/v1/locks/{name}` (a `ScopePath` too: a lock's name is its scope).
pub struct LockName;

impl IntoParams for LockName {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![path_param("name", "The lock's name, also the scope its tokens fence: the rules of a key.")]
    }
}

/// `{resource}/{key}` of the legacy-table routes.
pub struct RowParams;

impl IntoParams for RowParams {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            path_param("resource", "A [[resources]] name from the config file; unknown: 404 not-found."),
            path_param(
                "key",
                "The row key: the key columns' values in order, joined by ',', each percent-encoded \
                 (docs/tables.md). Invalid: 400 invalid-key.",
            ),
        ]
    }
}

// ---- Problems: which types an operation can answer, grouped by status. ----

/// Each operation's security and its credential's refusals (401, 403), from its route's
/// access (`routes::ALL`): the one place a route is open or guarded, here as in the gate.
/// Guarded operations inherit the document's `bearer` requirement.
pub fn describe_access(doc: &mut utoipa::openapi::OpenApi) {
    use super::routes::{self, Access};
    use utoipa::openapi::security::SecurityRequirement;
    for (path, item) in doc.paths.paths.iter_mut() {
        let access = routes::access(Some(path));
        let operations = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for operation in operations.into_iter().flatten() {
            let open = SecurityRequirement::default();
            match access {
                Access::Probe | Access::Open => operation.security = Some(vec![open]),
                Access::Metrics => {
                    operation.security = Some(vec![open, SecurityRequirement::new("bearer", Vec::<String>::new())])
                }
                Access::Guarded => {}
            }
            if matches!(access, Access::Metrics | Access::Guarded) {
                for (status, response) in problem_responses(&[kinds::UNAUTHENTICATED, kinds::FORBIDDEN]) {
                    let listed = operation.responses.responses.insert(status, response);
                    assert!(listed.is_none(), "{path}: the credential's refusals are the route's access, not its handler's");
                }
            }
        }
    }
}

/// The problem types of an operation as responses, one per status, each naming its types.
pub fn problem_responses(kinds: &[ProblemType]) -> BTreeMap<String, RefOr<ApiResponse>> {
    let mut by_status: BTreeMap<u16, Vec<ProblemType>> = BTreeMap::new();
    for kind in kinds {
        let list = by_status.entry(kind.status).or_default();
        if !list.contains(kind) {
            list.push(*kind);
        }
    }
    by_status
        .into_iter()
        .map(|(status, kinds)| {
            let names: Vec<String> = kinds.iter().map(|k| format!("{} ({})", k.slug, k.title)).collect();
            let schema = AllOfBuilder::new()
                .item(Ref::from_schema_name("Problem"))
                .item(ObjectBuilder::new().property("type", type_enum(&kinds)))
                .build();
            let response = ResponseBuilder::new()
                .description(names.join("; "))
                .content("application/problem+json", ContentBuilder::new().schema(Some(Schema::AllOf(schema))).build())
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// `problems!(Name: KIND, ...)`: a type listing those problem types as responses, for the
/// `responses(...)` of a `#[utoipa::path]`.
macro_rules! problems {
    ($($(#[$doc:meta])* $name:ident: [$($kind:ident),* $(,)?] $(+ $more:ident)*;)*) => {$(
        $(#[$doc])*
        pub struct $name;
        impl $name {
            pub fn kinds() -> Vec<ProblemType> {
                #[allow(unused_mut)]
                let mut kinds = vec![$(kinds::$kind),*];
                $(kinds.extend($more::kinds());)*
                kinds
            }
        }
        impl utoipa::IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<ApiResponse>> {
                problem_responses(&Self::kinds())
            }
        }
    )*};
}

problems! {
    /// Anything the edge refuses on any route (Host check, overload, failure). The credential's
    /// refusals (401, 403) are added from the route's access by [`describe_access`].
    Edge: [MISDIRECTED_REQUEST, METHOD_NOT_ALLOWED, UNAVAILABLE, INTERNAL];
    /// A route with a JSON body.
    Body: [INVALID_JSON, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, UNSUPPORTED_TRANSFER_CODING, BODY_TIMEOUT];
    /// A fenced write's refusals (nothing is written).
    Fenced: [MISSING_TOKEN, MALFORMED_TOKEN, INVALID_SCOPE, STALE_TOKEN, SCOPE_MISMATCH, TOKEN_NOT_ISSUED,
             TOKEN_JUMP, MISSING_TOKEN_PROOF, INVALID_TOKEN_PROOF];
    KvPut: [INVALID_KEY] + Edge + Body + Fenced;
    KvDelete: [INVALID_KEY] + Edge + Fenced;
    KvGet: [INVALID_KEY, NOT_FOUND] + Edge;
    Batch: [INVALID_BATCH, INVALID_KEY, INVALID_ROW, INVALID_VALUE, NOT_FOUND] + Edge + Body + Fenced;
    FenceClaim: [MISSING_TOKEN, MALFORMED_TOKEN, INVALID_SCOPE, STALE_TOKEN, TOKEN_NOT_ISSUED, TOKEN_JUMP,
                 MISSING_TOKEN_PROOF, INVALID_TOKEN_PROOF] + Edge;
    FenceGet: [INVALID_SCOPE, NOT_FOUND] + Edge;
    LockAcquire: [INVALID_SCOPE, INVALID_REQUEST, LOCK_HELD, LOCK_EXHAUSTED, SCOPE_HAS_ISSUER] + Edge + Body;
    LockRenew: [INVALID_SCOPE, MISSING_TOKEN, MALFORMED_TOKEN, INVALID_REQUEST, LOCK_LOST] + Edge + Body;
    LockRelease: [INVALID_SCOPE, MISSING_TOKEN, MALFORMED_TOKEN, LOCK_LOST] + Edge;
    LockGet: [INVALID_SCOPE, NOT_FOUND] + Edge;
    TableWrite: [NOT_FOUND, INVALID_KEY, INVALID_ROW, INVALID_VALUE] + Edge + Body + Fenced;
    TableDelete: [NOT_FOUND, INVALID_KEY] + Edge + Fenced;
    TableGet: [NOT_FOUND, INVALID_KEY] + Edge;
    Reset: [INVALID_REQUEST, INVALID_KEY, INVALID_SCOPE, INVALID_ROW, NOT_FOUND, RESET_NOT_BELOW, BINDING_CONFLICT] + Edge + Body;
    Retire: [INVALID_REQUEST, INVALID_SCOPE, NOT_FOUND] + Edge + Body;
    Rebind: [INVALID_REQUEST, INVALID_SCOPE, NOT_FOUND, BINDING_CONFLICT] + Edge + Body;
    Audit: [INVALID_REQUEST] + Edge;
    Readiness: [UNAVAILABLE] + Edge;
}

// ---- Schemas of the bodies (docs/wire.md). ----

/// A fencing token in a JSON body: a string, never a number (JSON numbers lose precision).
pub struct TokenText;

impl PartialSchema for TokenText {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(TOKEN_PATTERN))
            .max_length(Some(19))
            .description(Some("A fencing token: a canonical decimal in 0..=9223372036854775807, as a string."))
            .examples(["42"])
            .into()
    }
}

impl ToSchema for TokenText {
    fn name() -> Cow<'static, str> {
        "FencingToken".into()
    }
}

/// An RFC 9457 problem. Besides these, a problem carries the fields of its type: a 412
/// `presented_token`, `current_token`, and the `key` (with `stale_keys` for a batch) or `scope`;
/// a 409 `lock-held` `holder` and `remaining_ms`; a 403 the `right` and the name refused.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Problem {
    /// `https://fencegate.dev/problems/<slug>`: one of the types below, and per response the
    /// types that operation can answer with that status.
    r#type: String,
    title: String,
    status: u16,
    detail: String,
    #[schema(nullable = false)]
    presented_token: Option<TokenText>,
    #[schema(nullable = false)]
    current_token: Option<TokenText>,
    #[schema(nullable = false)]
    latest_issued: Option<TokenText>,
    #[schema(nullable = false)]
    max_jump: Option<TokenText>,
    #[schema(nullable = false)]
    key: Option<String>,
    /// The fenced or remembered scope (null: none).
    scope: Option<String>,
    presented_scope: Option<String>,
    #[schema(nullable = false)]
    resource: Option<String>,
    #[schema(nullable = false)]
    stale_keys: Option<Vec<StaleKey>>,
    #[schema(nullable = false)]
    holder: Option<String>,
    #[schema(nullable = false)]
    remaining_ms: Option<i64>,
    #[schema(nullable = false)]
    right: Option<String>,
    #[schema(nullable = false)]
    lock: Option<String>,
    #[schema(nullable = false)]
    column: Option<String>,
    #[schema(nullable = false)]
    constraint: Option<String>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StaleKey {
    key: String,
    #[schema(nullable = false)]
    resource: Option<String>,
    current_token: TokenText,
}

/// Response bodies. Mirrors of the JSON the handlers build (docs/wire.md).
pub mod schemas {
    use serde_json::Value;
    use utoipa::ToSchema;

    use super::TokenText;

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct KvWritten {
        key: String,
        fence_token: TokenText,
        /// The scope the write was under (null: the key's own fence).
        scope: Option<String>,
        version: i64,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct KvRead {
        key: String,
        /// The value, any JSON.
        value: Value,
        fence_token: TokenText,
        scope: Option<String>,
        version: i64,
        /// RFC 3339, the database's clock.
        updated_at: String,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct KvDeleted {
        key: String,
        fence_token: TokenText,
        scope: Option<String>,
        deleted: bool,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct BatchDone {
        fence_token: TokenText,
        scope: Option<String>,
        results: Vec<OpResult>,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct OpResult {
        /// put, delete (or patch for a table op).
        op: String,
        key: String,
        #[schema(nullable = false)]
        resource: Option<String>,
        /// What the op alone would have answered: 201 created, 200 otherwise.
        status: u16,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct Fence {
        scope: String,
        fence_token: TokenText,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct Lease {
        name: String,
        /// Send it as X-Fencing-Token, with X-Fencing-Scope: {name}.
        token: TokenText,
        owner: String,
        /// RFC 3339, the database's clock.
        expires_at: String,
        ttl_ms: i64,
        /// The lock's name: the scope its token fences.
        scope: String,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct LockHolder {
        name: String,
        /// The holder's owner label, as it was granted.
        owner: String,
        /// How long the lease runs unless renewed (the database's clock).
        remaining_ms: i64,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct Released {
        name: String,
        token: TokenText,
        released: bool,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct RowWritten {
        resource: String,
        key: String,
        fence_token: TokenText,
        scope: Option<String>,
        #[schema(nullable = false)]
        deleted: Option<bool>,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct RowRead {
        resource: String,
        key: String,
        /// The row's columns, as PostgreSQL printed them.
        row: Value,
        /// Null for a row never written through fencegate.
        fence_token: Option<TokenText>,
        scope: Option<String>,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct ResetDone {
        /// scope, key, table, or lock (a retired lock: `from` and `to` are its latest grant).
        target: String,
        name: String,
        #[schema(nullable = false)]
        resource: Option<String>,
        from: TokenText,
        to: TokenText,
        /// Present when the binding was changed: the new sticky scope (null: none).
        #[schema(nullable = false)]
        scope: Option<Option<String>>,
        audit_id: String,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct RebindDone {
        /// kv or table.
        target: String,
        /// kv: the prefix rebound.
        #[schema(nullable = false)]
        prefix: Option<String>,
        /// table: the resource rebound.
        #[schema(nullable = false)]
        resource: Option<String>,
        /// The new binding (null: none).
        scope: Option<String>,
        /// Keys or rows whose binding changed.
        rebound: u64,
        audit_id: String,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct AuditLog {
        /// Newest first.
        entries: Vec<AuditEntry>,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct AuditEntry {
        id: String,
        /// RFC 3339, the database's clock.
        at: String,
        actor: String,
        action: String,
        target: String,
        name: String,
        #[schema(nullable = false)]
        resource: Option<String>,
        from: TokenText,
        to: TokenText,
        from_scope: Option<String>,
        to_scope: Option<String>,
        reason: String,
    }

    #[derive(ToSchema)]
    #[allow(dead_code)]
    pub struct Status {
        /// ok (healthz) or ready (readyz).
        status: String,
    }
}

// ---- The two routes. ----

/// The document as served: built once per router, shared by every request.
#[derive(Clone)]
pub struct Served(pub axum::body::Bytes);

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
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], doc.0).into_response()
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
    super::console::embedded(page, "text/html; charset=utf-8", HeaderValue::from_str(csp).expect("the policy is ASCII"))
}
