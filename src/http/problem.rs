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
    /// The `Host` is not one this server answers for (DNS rebinding; see `edge`).
    #[error("{0}")]
    Misdirected(String),
    #[error("the request body did not arrive within {} ms (server.body_timeout_ms)", .0.as_millis())]
    BodyTimeout(std::time::Duration),
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

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            MissingToken => (StatusCode::PRECONDITION_REQUIRED, "missing-token", "Fencing token required"),
            MalformedToken(_) => (StatusCode::BAD_REQUEST, "malformed-token", "Malformed fencing token"),
            InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid-key", "Invalid key"),
            InvalidScope(_) => (StatusCode::BAD_REQUEST, "invalid-scope", "Invalid scope"),
            InvalidJson(_) | Store(StoreError::Refused(_)) => (StatusCode::BAD_REQUEST, "invalid-json", "Invalid JSON body"),
            InvalidBatch(_) => (StatusCode::BAD_REQUEST, "invalid-batch", "Invalid batch"),
            PayloadTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", "Request body too large"),
            UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Request body must be JSON")
            }
            Misdirected(_) => (StatusCode::MISDIRECTED_REQUEST, "misdirected-request", "Host not served"),
            BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body-timeout", "Request body too slow"),
            NotFound(_) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed"),
            Stale(_) => (StatusCode::PRECONDITION_FAILED, "stale-token", "Stale fencing token"),
            ScopeMismatch(_) => (StatusCode::CONFLICT, "scope-mismatch", "Scope mismatch"),
            NotIssued(_) => (StatusCode::UNPROCESSABLE_ENTITY, "token-not-issued", "Token never issued"),
            Jump(_) => (StatusCode::UNPROCESSABLE_ENTITY, "token-jump", "Token jumps too far"),
            Proof(crate::issuers::ProofError::Missing { .. }) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "missing-token-proof", "Token proof required")
            }
            Proof(crate::issuers::ProofError::Invalid { .. }) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid-token-proof", "Invalid token proof")
            }
            Row(RowError::Key { .. }) => (StatusCode::BAD_REQUEST, "invalid-key", "Invalid key"),
            Row(RowError::Row { .. }) => (StatusCode::BAD_REQUEST, "invalid-row", "Invalid row"),
            Row(RowError::Value { .. }) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid-value", "Value refused by the table"),
            Row(RowError::NoRow(_)) => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            Row(RowError::Token(_)) => (StatusCode::BAD_REQUEST, "malformed-token", "Malformed fencing token"),
            InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid-request", "Invalid request"),
            ResetNotBelow(_) => (StatusCode::CONFLICT, "reset-not-below", "A reset only lowers a fence"),
            LockHeld { .. } => (StatusCode::CONFLICT, "lock-held", "Lock is held"),
            LockExhausted => (StatusCode::CONFLICT, "lock-exhausted", "No token left to grant"),
            LockLost { .. } => (StatusCode::CONFLICT, "lock-lost", "Lease lost"),
            Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated", "Authentication required"),
            Forbidden { .. } | ForeignLease(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            Timeout | Overloaded | BufferFull | Store(StoreError::Unavailable(_)) | Store(StoreError::Raced(_)) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service temporarily unavailable")
            }
            Store(_) | Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal server error"),
        }
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
    format!(
        "{what} is bound to {} but the write came under {}: send X-Fencing-Scope: {} with that lock's token \
         (an admin reset rebinds a key); nothing was written",
        name(m.scope.as_deref()),
        name(m.presented.as_ref().map(|s| s.as_str())),
        m.scope.as_deref().unwrap_or("(none: leave the header out)"),
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
        if matches!(self, ApiError::PayloadTooLarge { .. } | ApiError::BodyTimeout(_) | ApiError::UnsupportedMediaType(_)) {
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
        response
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
