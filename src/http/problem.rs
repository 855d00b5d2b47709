//! Every error a client can see, as RFC 9457 `application/problem+json`.
//!
//! 5xx details are logged (`observe` logs them with the request id) and never sent: a client
//! learns that the database is unavailable, not the text of a driver error.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use serde_json::{json, Map, Value};

use crate::{
    fence::{Fenced, Jump, NameError, NotIssued, Outcome, ScopeMismatch, Stale, TokenError},
    store::{StoreError, TableError},
    tables::RowError,
};

const TYPE_BASE: &str = "https://fencegate.dev/problems/";

/// A problem type: the status it comes with, the last segment of its `type` URI, its title.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    pub status: u16,
    pub slug: &'static str,
    pub title: &'static str,
}

impl ProblemType {
    /// The `type` URI of the problem.
    pub fn uri(&self) -> String {
        format!("{TYPE_BASE}{}", self.slug)
    }
}

/// Every problem type a client can see (`ApiError::kind` maps each error to one of them; the
/// OpenAPI document lists them all).
pub mod kinds {
    use super::{ProblemType, StatusCode};

    pub const MISSING_TOKEN: ProblemType =
        ProblemType { status: StatusCode::PRECONDITION_REQUIRED.as_u16(), slug: "missing-token", title: "Fencing token required" };
    pub const MALFORMED_TOKEN: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "malformed-token", title: "Malformed fencing token" };
    pub const INVALID_KEY: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-key", title: "Invalid key" };
    pub const INVALID_SCOPE: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-scope", title: "Invalid scope" };
    pub const INVALID_JSON: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-json", title: "Invalid JSON body" };
    pub const INVALID_BATCH: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-batch", title: "Invalid batch" };
    pub const PAYLOAD_TOO_LARGE: ProblemType =
        ProblemType { status: StatusCode::PAYLOAD_TOO_LARGE.as_u16(), slug: "payload-too-large", title: "Request body too large" };
    pub const UNSUPPORTED_MEDIA_TYPE: ProblemType =
        ProblemType { status: StatusCode::UNSUPPORTED_MEDIA_TYPE.as_u16(), slug: "unsupported-media-type", title: "Request body must be JSON" };
    pub const MISDIRECTED_REQUEST: ProblemType =
        ProblemType { status: StatusCode::MISDIRECTED_REQUEST.as_u16(), slug: "misdirected-request", title: "Host not served" };
    /// 501, not 400: the request is well formed, but uses a transfer coding this server does
    /// not implement — what RFC 9112 §6.1 says a server answers to a coding it does not
    /// understand; it tells the client to send the body uncompressed, not that it is broken.
    pub const UNSUPPORTED_TRANSFER_CODING: ProblemType =
        ProblemType { status: StatusCode::NOT_IMPLEMENTED.as_u16(), slug: "unsupported-transfer-coding", title: "Transfer coding not supported" };
    pub const BODY_TIMEOUT: ProblemType =
        ProblemType { status: StatusCode::REQUEST_TIMEOUT.as_u16(), slug: "body-timeout", title: "Request body too slow" };
    pub const NOT_FOUND: ProblemType =
        ProblemType { status: StatusCode::NOT_FOUND.as_u16(), slug: "not-found", title: "Not found" };
    pub const METHOD_NOT_ALLOWED: ProblemType =
        ProblemType { status: StatusCode::METHOD_NOT_ALLOWED.as_u16(), slug: "method-not-allowed", title: "Method not allowed" };
    pub const STALE_TOKEN: ProblemType =
        ProblemType { status: StatusCode::PRECONDITION_FAILED.as_u16(), slug: "stale-token", title: "Stale fencing token" };
    pub const SCOPE_MISMATCH: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "scope-mismatch", title: "Scope mismatch" };
    pub const TOKEN_NOT_ISSUED: ProblemType =
        ProblemType { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), slug: "token-not-issued", title: "Token never issued" };
    pub const TOKEN_JUMP: ProblemType =
        ProblemType { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), slug: "token-jump", title: "Token jumps too far" };
    pub const MISSING_TOKEN_PROOF: ProblemType =
        ProblemType { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), slug: "missing-token-proof", title: "Token proof required" };
    pub const INVALID_TOKEN_PROOF: ProblemType =
        ProblemType { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), slug: "invalid-token-proof", title: "Invalid token proof" };
    pub const INVALID_ROW: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-row", title: "Invalid row" };
    pub const INVALID_VALUE: ProblemType =
        ProblemType { status: StatusCode::UNPROCESSABLE_ENTITY.as_u16(), slug: "invalid-value", title: "Value refused by the table" };
    pub const INVALID_REQUEST: ProblemType =
        ProblemType { status: StatusCode::BAD_REQUEST.as_u16(), slug: "invalid-request", title: "Invalid request" };
    pub const RESET_NOT_BELOW: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "reset-not-below", title: "A reset only lowers a fence" };
    pub const LOCK_HELD: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "lock-held", title: "Lock is held" };
    pub const LOCK_EXHAUSTED: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "lock-exhausted", title: "No token left to grant" };
    pub const SCOPE_HAS_ISSUER: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "scope-has-issuer", title: "Scope's tokens come from an issuer" };
    pub const BINDING_CONFLICT: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "binding-conflict", title: "Contradicts a configured binding" };
    pub const LOCK_LOST: ProblemType =
        ProblemType { status: StatusCode::CONFLICT.as_u16(), slug: "lock-lost", title: "Lease lost" };
    pub const UNAUTHENTICATED: ProblemType =
        ProblemType { status: StatusCode::UNAUTHORIZED.as_u16(), slug: "unauthenticated", title: "Authentication required" };
    pub const FORBIDDEN: ProblemType =
        ProblemType { status: StatusCode::FORBIDDEN.as_u16(), slug: "forbidden", title: "Forbidden" };
    pub const UNAVAILABLE: ProblemType =
        ProblemType { status: StatusCode::SERVICE_UNAVAILABLE.as_u16(), slug: "unavailable", title: "Service temporarily unavailable" };
    pub const INTERNAL: ProblemType =
        ProblemType { status: StatusCode::INTERNAL_SERVER_ERROR.as_u16(), slug: "internal", title: "Internal server error" };
    pub const ALL: &[ProblemType] = &[
        MISSING_TOKEN, MALFORMED_TOKEN, INVALID_KEY, INVALID_SCOPE, INVALID_JSON, INVALID_BATCH,
        PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE, UNSUPPORTED_TRANSFER_CODING, MISDIRECTED_REQUEST, BODY_TIMEOUT, NOT_FOUND,
        METHOD_NOT_ALLOWED, STALE_TOKEN, SCOPE_MISMATCH, TOKEN_NOT_ISSUED, TOKEN_JUMP, MISSING_TOKEN_PROOF,
        INVALID_TOKEN_PROOF, INVALID_ROW, INVALID_VALUE, INVALID_REQUEST, RESET_NOT_BELOW, LOCK_HELD,
        LOCK_EXHAUSTED, SCOPE_HAS_ISSUER, BINDING_CONFLICT, LOCK_LOST, UNAUTHENTICATED, FORBIDDEN, UNAVAILABLE, INTERNAL,
    ];
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing X-Fencing-Token header")]
    MissingToken,
    #[error("malformed X-Fencing-Token: {0}")]
    MalformedToken(String),
    #[error("invalid key: {0}")]
    InvalidKey(String),
    #[error("invalid scope: {0}")]
    InvalidScope(String),
    #[error("invalid JSON body: {0}")]
    InvalidJson(String),
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    #[error("request body larger than {limit} bytes (server.body_limit_bytes)")]
    PayloadTooLarge { limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A `Transfer-Encoding` other than plain `chunked` (see `edge`).
    #[error("{0}")]
    UnsupportedTransferCoding(String),
    /// The `Host` is not one this server answers for (DNS rebinding; see `edge`).
    #[error("{0}")]
    Misdirected(String),
    #[error("the request body did not arrive within {} ms (server.body_timeout_ms)", .0.as_millis())]
    BodyTimeout(std::time::Duration),
    /// The body fell below `server.min_body_rate_bytes_per_s` (bytes a second).
    #[error("the request body arrived slower than {0} bytes a second (server.min_body_rate_bytes_per_s)")]
    BodyTooSlow(u64),
    #[error("too many request bodies buffered at once (server.max_buffered_bytes); retry shortly")]
    BufferFull,
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("stale fencing token")]
    Stale(Vec<Stale>),
    #[error("scope mismatch")]
    ScopeMismatch(ScopeMismatch),
    #[error("token not issued")]
    NotIssued(NotIssued),
    #[error("token jump")]
    Jump(Jump),
    #[error(transparent)]
    Proof(#[from] crate::issuers::ProofError),
    #[error("{0}")]
    ResetNotBelow(String),
    #[error("the lock's scope fence is at 9223372036854775807, the largest token: no grant can exceed it; an admin reset of the fence (POST /v1/admin/fences/{{name}}/reset) frees the name")]
    LockExhausted,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A lock grant on a scope an `[[issuers]]` entry signs for: each scope has one source of
    /// tokens, and a built-in lock's grants would make the issuer's tokens "not issued".
    #[error("the scope {scope:?} takes only tokens signed by issuer {issuer:?} ([[issuers]]): no built-in lock is granted on it; take the lock from that lock service")]
    ScopeHasIssuer { scope: String, issuer: String },
    /// An admin rebind to another scope than `[[scopes]]` (or a resource's `scope`) binds the
    /// key to: every later write would be refused under both.
    #[error("{0}")]
    BindingConflict(String),
    #[error("lock is held by {owner:?} for {remaining_ms} ms more")]
    LockHeld { owner: String, remaining_ms: i64 },
    #[error("the lease is lost: it expired, was released, or was taken over")]
    LockLost { current: Option<crate::locks::Holder> },
    /// A legacy-table request refused for what it sent (see `tables::RowError`).
    #[error(transparent)]
    Row(#[from] RowError),
    /// No valid credential (auth on): 401 with `WWW-Authenticate: Bearer`.
    #[error("{}", .0.detail())]
    Unauthenticated(crate::auth::Unauthenticated),
    /// A valid credential without `right` on the name (`None`: on everything, e.g. admin).
    #[error("forbidden")]
    Forbidden { right: crate::auth::Right, refused: Option<(super::auth::Named, String)> },
    /// A renew or release of the live lease of `lock`, which another actor took (auth on).
    #[error("the lease of lock {0:?} was taken by another actor; only that actor (or an admin) may renew or release it; nothing was changed")]
    ForeignLease(String),
    #[error("request timed out")]
    Timeout,
    #[error("too many requests in flight")]
    Overloaded,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<TokenError> for ApiError {
    fn from(err: TokenError) -> Self {
        ApiError::MalformedToken(err.to_string())
    }
}

impl From<TableError> for ApiError {
    fn from(err: TableError) -> Self {
        match err {
            TableError::Row(err) => ApiError::Row(err),
            TableError::Store(err) => ApiError::Store(err),
        }
    }
}

impl From<ScopeMismatch> for ApiError {
    fn from(mismatch: ScopeMismatch) -> Self {
        ApiError::ScopeMismatch(mismatch)
    }
}

/// What was accepted, or the refusal as the client sees it (412 stale, 409 scope mismatch).
pub fn accepted<T>(outcome: Outcome<T>) -> Result<T, ApiError> {
    match outcome {
        Outcome::Accepted(done) => Ok(done),
        Outcome::Stale(stale) => Err(ApiError::Stale(stale)),
        Outcome::Mismatch(mismatch) => Err(ApiError::ScopeMismatch(mismatch)),
        Outcome::NotIssued(refused) => Err(ApiError::NotIssued(refused)),
        Outcome::Jump(refused) => Err(ApiError::Jump(refused)),
    }
}

impl ApiError {
    pub fn invalid_key(err: NameError) -> Self {
        ApiError::InvalidKey(format!("the key {err}"))
    }

    pub fn invalid_scope(err: NameError) -> Self {
        ApiError::InvalidScope(format!("the scope {err}"))
    }

    /// The problem type of this error: its status, slug and title.
    pub fn kind(&self) -> ProblemType {
        use ApiError::*;
        match self {
            MissingToken => kinds::MISSING_TOKEN,
            MalformedToken(_) => kinds::MALFORMED_TOKEN,
            InvalidKey(_) => kinds::INVALID_KEY,
            InvalidScope(_) => kinds::INVALID_SCOPE,
            InvalidJson(_) | Store(StoreError::Refused(_)) => kinds::INVALID_JSON,
            InvalidBatch(_) => kinds::INVALID_BATCH,
            PayloadTooLarge { .. } => kinds::PAYLOAD_TOO_LARGE,
            UnsupportedMediaType(_) => kinds::UNSUPPORTED_MEDIA_TYPE,
            UnsupportedTransferCoding(_) => kinds::UNSUPPORTED_TRANSFER_CODING,
            Misdirected(_) => kinds::MISDIRECTED_REQUEST,
            BodyTimeout(_) | BodyTooSlow(_) => kinds::BODY_TIMEOUT,
            NotFound(_) => kinds::NOT_FOUND,
            MethodNotAllowed => kinds::METHOD_NOT_ALLOWED,
            Stale(_) => kinds::STALE_TOKEN,
            ScopeMismatch(_) => kinds::SCOPE_MISMATCH,
            NotIssued(_) => kinds::TOKEN_NOT_ISSUED,
            Jump(_) => kinds::TOKEN_JUMP,
            Proof(crate::issuers::ProofError::Missing { .. }) => kinds::MISSING_TOKEN_PROOF,
            Proof(crate::issuers::ProofError::Invalid { .. }) => kinds::INVALID_TOKEN_PROOF,
            Row(RowError::Key { .. }) => kinds::INVALID_KEY,
            Row(RowError::Row { .. }) => kinds::INVALID_ROW,
            Row(RowError::Value { .. }) => kinds::INVALID_VALUE,
            Row(RowError::NoRow(_)) => kinds::NOT_FOUND,
            Row(RowError::Token(_)) => kinds::MALFORMED_TOKEN,
            InvalidRequest(_) => kinds::INVALID_REQUEST,
            ResetNotBelow(_) => kinds::RESET_NOT_BELOW,
            LockHeld { .. } => kinds::LOCK_HELD,
            LockExhausted => kinds::LOCK_EXHAUSTED,
            ScopeHasIssuer { .. } => kinds::SCOPE_HAS_ISSUER,
            BindingConflict(_) => kinds::BINDING_CONFLICT,
            LockLost { .. } => kinds::LOCK_LOST,
            Unauthenticated(_) => kinds::UNAUTHENTICATED,
            Forbidden { .. } | ForeignLease(_) => kinds::FORBIDDEN,
            Timeout | Overloaded | BufferFull | Store(StoreError::Unavailable(_)) | Store(StoreError::Raced(_)) | Store(StoreError::NotReady(_)) => kinds::UNAVAILABLE,
            Store(_) | Internal(_) => kinds::INTERNAL,
        }
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        let kind = self.kind();
        (StatusCode::from_u16(kind.status).expect("problem statuses are valid"), kind.slug, kind.title)
    }

    fn detail(&self) -> String {
        match self {
            ApiError::MissingToken => {
                "every write needs the X-Fencing-Token header: the fencing token of the lock you hold".into()
            }
            ApiError::Stale(stale) => describe_stale(stale),
            ApiError::Forbidden { right, refused: Some((named, name)) } => {
                format!("this credential lacks the {right} right on the {} {name:?}; nothing was changed", named.field())
            }
            ApiError::Forbidden { right, refused: None } => {
                format!("this credential lacks the {right} right; nothing was changed")
            }
            ApiError::ScopeMismatch(mismatch) => describe_mismatch(mismatch),
            ApiError::NotIssued(n) => format!(
                "token {} is above {}, the latest token the built-in lock {:?} has granted: no holder of that \
                 lock can have it (a buggy client or a forged token); nothing was written",
                n.presented,
                n.latest,
                n.scope.as_str()
            ),
            ApiError::Jump(j) => format!(
                "token {} would raise the fence of {} from {} by more than kv.max_token_jump ({}): refused as a \
                 likely bad token (a timestamp in the wrong unit?); nothing was written",
                j.presented,
                fenced_name(&j.fenced),
                j.current,
                j.max_jump
            ),
            ApiError::Timeout => "the request took too long; retry it with the same token (a retry is safe)".into(),
            ApiError::Overloaded => "too many requests in flight (server.max_in_flight); retry shortly".into(),
            ApiError::Store(StoreError::Refused(why)) => {
                format!("the value cannot be stored ({why}); nothing was written")
            }
            ApiError::Store(StoreError::Unavailable(_)) => {
                "the database is unreachable or overloaded; retry with the same token (a retry is safe)".into()
            }
            ApiError::Store(StoreError::Raced(why)) => format!("{why}; retry with the same token (a retry is safe)"),
            ApiError::Store(StoreError::NotReady(why)) => format!("{why}; retry later"),
            // Never leak internals; the log has them, under the request id.
            ApiError::Store(_) | ApiError::Internal(_) => {
                "the server failed to handle the request; see the server log for this request id".into()
            }
            other => other.to_string(),
        }
    }
}

fn describe_stale(stale: &[Stale]) -> String {
    match stale {
        [one] => {
            let what = match &one.fenced {
                Fenced::Key(key) => format!("key {:?}", key.as_str()),
                Fenced::Scope(scope) => format!("scope {:?}", scope.as_str()),
                Fenced::Row { resource, key } => format!("row {key:?} of {resource:?}"),
            };
            format!(
                "token {} is older than the fence {} of {what}: a newer lock holder exists; nothing was written",
                one.presented, one.current
            )
        }
        many => format!(
            "token {} is older than the fence of {} keys: a newer lock holder exists; nothing was written",
            many.first().map(|s| s.presented.to_string()).unwrap_or_default(),
            many.len()
        ),
    }
}

fn fenced_name(fenced: &Fenced) -> String {
    match fenced {
        Fenced::Key(key) => format!("key {:?}", key.as_str()),
        Fenced::Row { resource, key } => format!("row {key:?} of {resource:?}"),
        Fenced::Scope(scope) => format!("scope {:?}", scope.as_str()),
    }
}

/// `key`, `scope`, or `resource` + `key`: the fields naming what a problem is about.
fn insert_fenced(body: &mut Map<String, Value>, fenced: &Fenced) {
    match fenced {
        Fenced::Key(key) => body.insert("key".into(), json!(key)),
        Fenced::Scope(scope) => body.insert("scope".into(), json!(scope)),
        Fenced::Row { resource, key } => {
            body.insert("resource".into(), json!(resource));
            body.insert("key".into(), json!(key))
        }
    };
}

fn describe_mismatch(m: &ScopeMismatch) -> String {
    let what = fenced_name(&m.fenced);
    let name = |scope: Option<&str>| match scope {
        Some(scope) => format!("scope {scope:?}"),
        None => "no scope".to_owned(),
    };
    let send = match m.scope.as_deref() {
        Some(scope) => format!("send X-Fencing-Scope: {scope} with that lock's token"),
        None => "write it without X-Fencing-Scope (and outside any [[scopes]] binding)".to_owned(),
    };
    // The other way out: the key was written before a binding (or a resource's `scope`) put
    // it under the presented scope, which leaving the header out cannot undo.
    let rebind = match &m.fenced {
        Fenced::Row { resource, .. } => format!("POST /v1/admin/tables/{resource}/rebind"),
        _ => "POST /v1/admin/kv/rebind (a prefix), or the key's reset with \"scope\"".to_owned(),
    };
    format!(
        "{what} is bound to {} but the write came under {}: {send}; or, if it belongs under {} now (a binding \
         added after it was written), an admin rebinds it: {rebind}; nothing was written",
        name(m.scope.as_deref()),
        name(m.presented.as_ref().map(|s| s.as_str())),
        name(m.presented.as_ref().map(|s| s.as_str())),
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, slug, title) = self.parts();
        // Never sent: the request's log line (`observe`) carries it, under the request id.
        let failure = status.is_server_error().then(|| {
            let text = self.to_string();
            // The source's text, unless the message already quotes it (most do).
            match std::error::Error::source(&self).map(|source| source.to_string()) {
                Some(source) if !text.contains(&source) => super::ServerFailure(format!("{text}: {source}")),
                _ => super::ServerFailure(text),
            }
        });
        let mut body = Map::new();
        body.insert("type".into(), json!(format!("{TYPE_BASE}{slug}")));
        body.insert("title".into(), json!(title));
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), json!(self.detail()));
        match &self {
            ApiError::Stale(stale) => add_stale_fields(&mut body, stale),
            ApiError::ScopeMismatch(m) => {
                insert_fenced(&mut body, &m.fenced);
                body.insert("scope".into(), json!(m.scope));
                body.insert("presented_scope".into(), json!(m.presented));
            }
            ApiError::NotIssued(n) => {
                body.insert("scope".into(), json!(n.scope));
                body.insert("presented_token".into(), json!(n.presented));
                body.insert("latest_issued".into(), json!(n.latest));
            }
            ApiError::Jump(j) => {
                insert_fenced(&mut body, &j.fenced);
                body.insert("presented_token".into(), json!(j.presented));
                body.insert("current_token".into(), json!(j.current));
                body.insert("max_jump".into(), json!(j.max_jump.to_string()));
            }
            ApiError::Row(err) => {
                if let Some(column) = err.column() {
                    body.insert("column".into(), json!(column));
                }
                if let RowError::Value { constraint: Some(constraint), .. } = err {
                    body.insert("constraint".into(), json!(constraint));
                }
            }
            ApiError::ScopeHasIssuer { scope, issuer } => {
                body.insert("scope".into(), json!(scope));
                body.insert("issuer".into(), json!(issuer));
            }
            ApiError::LockHeld { owner, remaining_ms } => {
                body.insert("holder".into(), json!(owner));
                body.insert("remaining_ms".into(), json!(remaining_ms));
            }
            ApiError::Unauthenticated(why) => {
                metrics::counter!("fencegate_auth_failures_total", "reason" => why.reason()).increment(1);
            }
            ApiError::ForeignLease(lock) => {
                metrics::counter!("fencegate_auth_failures_total", "reason" => "forbidden").increment(1);
                body.insert("right".into(), json!("lock"));
                body.insert("lock".into(), json!(lock));
            }
            ApiError::Forbidden { right, refused } => {
                metrics::counter!("fencegate_auth_failures_total", "reason" => "forbidden").increment(1);
                body.insert("right".into(), json!(right.as_str()));
                if let Some((named, name)) = refused {
                    body.insert(named.field().into(), json!(name));
                }
            }
            ApiError::LockLost { current: Some(holder) } => {
                body.insert("holder".into(), json!(holder.owner));
                body.insert("remaining_ms".into(), json!(holder.remaining_ms));
            }
            _ => {}
        }
        let mut response = (status, axum::Json(Value::Object(body))).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // Refused before its body was read (or while it trickled in): the rest of the body
        // would be taken for the next request, so the connection ends with this response.
        let body_unread = matches!(
            self,
            ApiError::PayloadTooLarge { .. }
                | ApiError::BodyTimeout(_)
                | ApiError::BodyTooSlow(_)
                | ApiError::BufferFull
                | ApiError::UnsupportedMediaType(_)
                | ApiError::UnsupportedTransferCoding(_)
        );
        // A 401 or 403 ends its connection too: a client without a (good enough) credential
        // must not keep a connection, and the cap's slot it holds, by sending nothing more
        // (DESIGN: unauthenticated connections never hold the cap).
        let refused_caller = status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
        if body_unread || refused_caller {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(failure) = failure {
            response.extensions_mut().insert(failure);
        }
        let outcome = match &self {
            ApiError::NotIssued(_) => Some("not_issued"),
            ApiError::Jump(_) => Some("jump"),
            ApiError::ScopeMismatch(_) => Some("scope_mismatch"),
            ApiError::Proof(_) => Some("bad_proof"),
            _ => None,
        };
        if let Some(outcome) = outcome {
            response.extensions_mut().insert(super::WriteOutcome(outcome));
        }
        if let Some(refused) = self.refused() {
            // For the console's events (`observe` takes it out): moved, not copied.
            response.extensions_mut().insert(refused);
        }
        response
    }
}

impl ApiError {
    /// The fencing refusal this error answers, if it is one.
    fn refused(self) -> Option<crate::events::Refused> {
        use crate::{events::Refused, issuers::ProofError};
        Some(match self {
            ApiError::Stale(stale) => Refused::Stale(stale),
            ApiError::NotIssued(refused) => Refused::NotIssued(refused),
            ApiError::Jump(refused) => Refused::Jump(refused),
            ApiError::ScopeMismatch(mismatch) => Refused::Mismatch(mismatch),
            ApiError::Proof(ProofError::Missing { scope, issuer }) => {
                Refused::BadProof { scope: Some(scope), issuer, why: "no X-Fencing-Proof".into() }
            }
            ApiError::Proof(ProofError::Invalid { issuer, why }) => Refused::BadProof { scope: None, issuer, why: why.into() },
            _ => return None,
        })
    }
}

/// A 412 carries `presented_token`, `current_token` and the `key` or `scope` of the first
/// refusal; a batch refused on several keys also lists them all in `stale_keys`.
fn add_stale_fields(body: &mut Map<String, Value>, stale: &[Stale]) {
    let Some(first) = stale.first() else { return };
    body.insert("presented_token".into(), json!(first.presented));
    body.insert("current_token".into(), json!(first.current));
    match &first.fenced {
        Fenced::Key(key) => body.insert("key".into(), json!(key)),
        Fenced::Scope(scope) => body.insert("scope".into(), json!(scope)),
        Fenced::Row { resource, key } => {
            body.insert("resource".into(), json!(resource));
            body.insert("key".into(), json!(key))
        }
    };
    let keys: Vec<Value> = stale
        .iter()
        .filter_map(|s| match &s.fenced {
            Fenced::Key(key) => Some(json!({"key": key, "current_token": s.current})),
            Fenced::Row { resource, key } => {
                Some(json!({"resource": resource, "key": key, "current_token": s.current}))
            }
            Fenced::Scope(_) => None,
        })
        .collect();
    if !keys.is_empty() {
        body.insert("stale_keys".into(), Value::Array(keys));
    }
}
