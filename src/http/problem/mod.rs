//! Every error a client can see, as RFC 9457 `application/problem+json`: [`ApiError`], the
//! problem type each one is (`kinds`), its body (`body`) and words (`detail`), and how the
//! errors of the layers below become one (`convert`).
//!
//! 5xx details are logged (`observe` logs them with the request id) and never sent: a client
//! learns that the database is unavailable, not the text of a driver error.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};

use crate::{
    fence::{Jump, NotIssued, ScopeMismatch, Stale},
    store::StoreError,
    tables::RowError,
};

mod body;
mod convert;
mod detail;
pub mod kinds;

pub use body::{Problem, StaleKey};
pub use convert::accepted;
pub use kinds::ProblemType;

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
    LockLost {
        current: Option<crate::locks::Holder>,
    },
    /// A legacy-table request refused for what it sent (see `tables::RowError`).
    #[error(transparent)]
    Row(#[from] RowError),
    /// No valid credential (auth on): 401 with `WWW-Authenticate: Bearer`.
    #[error("{}", .0.detail())]
    Unauthenticated(crate::auth::Unauthenticated),
    /// A valid credential without `right` on the name (`None`: on everything, e.g. admin).
    #[error("forbidden")]
    Forbidden {
        right: crate::auth::Right,
        refused: Option<(crate::auth::Named, String)>,
    },
    /// A renew or release of the live lease of `lock`, which another actor took (auth on).
    #[error("the lease of lock {0:?} was taken by another actor; only that actor (or an admin) may renew or release it; nothing was changed")]
    ForeignLease(String),
    /// A bad `Idempotency-Key` header (400; nothing was done).
    #[error("invalid Idempotency-Key: {0}")]
    InvalidIdempotencyKey(String),
    /// An `Idempotency-Key` already kept for another request (422; nothing was done).
    #[error("this Idempotency-Key was already used for a different request (another body, token, scope, proof or path) within kv.idempotency_ttl_ms; nothing was done: send a new key for a new write, the same request to retry")]
    IdempotencyKeyReused,
    #[error("request timed out")]
    Timeout,
    #[error("too many requests in flight")]
    Overloaded,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The problem type of this error: its status, slug and title.
    pub fn kind(&self) -> ProblemType {
        use ApiError::*;
        match self {
            MissingToken => kinds::MISSING_TOKEN,
            MalformedToken(_) => kinds::MALFORMED_TOKEN,
            InvalidKey(_) => kinds::INVALID_KEY,
            InvalidScope(_) => kinds::INVALID_SCOPE,
            InvalidJson(_) | Store(StoreError::Refused { .. }) => kinds::INVALID_JSON,
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
            InvalidRequest(_) | InvalidIdempotencyKey(_) | Store(StoreError::Unkeepable(_)) => {
                kinds::INVALID_REQUEST
            }
            IdempotencyKeyReused => kinds::IDEMPOTENCY_KEY_REUSED,
            ResetNotBelow(_) => kinds::RESET_NOT_BELOW,
            LockHeld { .. } => kinds::LOCK_HELD,
            LockExhausted => kinds::LOCK_EXHAUSTED,
            ScopeHasIssuer { .. } => kinds::SCOPE_HAS_ISSUER,
            BindingConflict(_) => kinds::BINDING_CONFLICT,
            LockLost { .. } => kinds::LOCK_LOST,
            Unauthenticated(_) => kinds::UNAUTHENTICATED,
            Forbidden { .. } | ForeignLease(_) => kinds::FORBIDDEN,
            Timeout
            | Overloaded
            | BufferFull
            | Store(StoreError::Unavailable(_))
            | Store(StoreError::Raced(_))
            | Store(StoreError::NotReady(_)) => kinds::UNAVAILABLE,
            Store(_) | Internal(_) => kinds::INTERNAL,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.kind();
        let status = StatusCode::from_u16(kind.status).expect("problem statuses are valid");
        // Never sent: the request's log line (`observe`) carries it, under the request id.
        let failure = if status.is_server_error() {
            let text = self.to_string();
            // The source's text, unless the message already quotes it (most do).
            Some(
                match std::error::Error::source(&self).map(|source| source.to_string()) {
                    Some(source) if !text.contains(&source) => {
                        super::ServerFailure(format!("{text}: {source}"))
                    }
                    _ => super::ServerFailure(text),
                },
            )
        } else {
            // A value the database refused: the client is told what, in fencegate's words;
            // the database's own message is for the log line.
            self.database_said().map(super::ServerFailure)
        };
        match &self {
            ApiError::Unauthenticated(why) => {
                metrics::counter!("fencegate_auth_failures_total", "reason" => why.reason())
                    .increment(1);
            }
            ApiError::ForeignLease(_) | ApiError::Forbidden { .. } => {
                metrics::counter!("fencegate_auth_failures_total", "reason" => "forbidden")
                    .increment(1);
            }
            _ => {}
        }
        let mut response = (status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
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
        // (docs/security.md: unauthenticated connections never hold the cap).
        let refused_caller = status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN;
        if body_unread || refused_caller {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(failure) = failure {
            response.extensions_mut().insert(failure);
        }
        // How a write refused with this problem ended, for `observe` (`report`).
        response.extensions_mut().insert(kind.outcome);
        if let Some(refused) = self.refused() {
            // For the console's events (`observe` takes it out): moved, not copied.
            response.extensions_mut().insert(refused);
        }
        response
    }
}

impl ApiError {
    /// What the database said when it refused a value of a 4xx request (never sent).
    fn database_said(&self) -> Option<String> {
        match self {
            ApiError::Store(StoreError::Refused { cause, .. }) => Some(cause.to_string()),
            ApiError::Row(RowError::Value {
                said: Some(said), ..
            }) => Some(said.clone()),
            _ => None,
        }
    }

    /// The fencing refusal this error answers, if it is one.
    fn refused(self) -> Option<crate::events::Refused> {
        use crate::{events::Refused, issuers::ProofError};
        Some(match self {
            ApiError::Stale(stale) => Refused::Stale(stale),
            ApiError::NotIssued(refused) => Refused::NotIssued(refused),
            ApiError::Jump(refused) => Refused::Jump(refused),
            ApiError::ScopeMismatch(mismatch) => Refused::Mismatch(mismatch),
            ApiError::Proof(ProofError::Missing { scope, issuer }) => Refused::BadProof {
                scope: Some(scope),
                issuer,
                why: "no X-Fencing-Proof".into(),
            },
            ApiError::Proof(ProofError::Invalid { issuer, why }) => Refused::BadProof {
                scope: None,
                issuer,
                why: why.into(),
            },
            _ => return None,
        })
    }
}
