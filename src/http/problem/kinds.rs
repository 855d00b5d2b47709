//! Every problem type a client can see: its status, the last segment of its `type` URI, its
//! title, and the outcome a fenced write refused with it is counted under. `ApiError::kind`
//! maps each error to one of them; the OpenAPI document lists them all.

use axum::http::StatusCode;

use crate::http::report::Outcome;

const TYPE_BASE: &str = "https://fencegate.dev/problems/";

/// A problem type: the status it comes with, the last segment of its `type` URI, its title,
/// and the `outcome` label of `fencegate_writes_total` for a write refused with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProblemType {
    pub status: u16,
    pub slug: &'static str,
    pub title: &'static str,
    pub outcome: Outcome,
}

impl ProblemType {
    /// The `type` URI of the problem.
    pub fn uri(&self) -> String {
        format!("{TYPE_BASE}{}", self.slug)
    }
}

const fn kind(
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
    outcome: Outcome,
) -> ProblemType {
    ProblemType {
        status: status.as_u16(),
        slug,
        title,
        outcome,
    }
}

use Outcome::{BadProof, Conflict, Error, Invalid, Jump, NotIssued, ScopeMismatch, Stale};

pub const MISSING_TOKEN: ProblemType = kind(
    StatusCode::PRECONDITION_REQUIRED,
    "missing-token",
    "Fencing token required",
    Invalid,
);
pub const MALFORMED_TOKEN: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "malformed-token",
    "Malformed fencing token",
    Invalid,
);
pub const INVALID_KEY: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-key",
    "Invalid key",
    Invalid,
);
pub const INVALID_SCOPE: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-scope",
    "Invalid scope",
    Invalid,
);
pub const INVALID_JSON: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-json",
    "Invalid JSON body",
    Invalid,
);
pub const INVALID_BATCH: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-batch",
    "Invalid batch",
    Invalid,
);
pub const PAYLOAD_TOO_LARGE: ProblemType = kind(
    StatusCode::PAYLOAD_TOO_LARGE,
    "payload-too-large",
    "Request body too large",
    Invalid,
);
pub const UNSUPPORTED_MEDIA_TYPE: ProblemType = kind(
    StatusCode::UNSUPPORTED_MEDIA_TYPE,
    "unsupported-media-type",
    "Request body must be JSON",
    Invalid,
);
pub const MISDIRECTED_REQUEST: ProblemType = kind(
    StatusCode::MISDIRECTED_REQUEST,
    "misdirected-request",
    "Host not served",
    Invalid,
);
/// 501, not 400: the request is well formed, but uses a transfer coding this server does
/// not implement — what RFC 9112 §6.1 says a server answers to a coding it does not
/// understand; it tells the client to send the body uncompressed, not that it is broken.
pub const UNSUPPORTED_TRANSFER_CODING: ProblemType = kind(
    StatusCode::NOT_IMPLEMENTED,
    "unsupported-transfer-coding",
    "Transfer coding not supported",
    Error,
);
pub const BODY_TIMEOUT: ProblemType = kind(
    StatusCode::REQUEST_TIMEOUT,
    "body-timeout",
    "Request body too slow",
    Invalid,
);
pub const NOT_FOUND: ProblemType = kind(StatusCode::NOT_FOUND, "not-found", "Not found", Invalid);
pub const METHOD_NOT_ALLOWED: ProblemType = kind(
    StatusCode::METHOD_NOT_ALLOWED,
    "method-not-allowed",
    "Method not allowed",
    Invalid,
);
pub const STALE_TOKEN: ProblemType = kind(
    StatusCode::PRECONDITION_FAILED,
    "stale-token",
    "Stale fencing token",
    Stale,
);
pub const SCOPE_MISMATCH: ProblemType = kind(
    StatusCode::CONFLICT,
    "scope-mismatch",
    "Scope mismatch",
    ScopeMismatch,
);
pub const TOKEN_NOT_ISSUED: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "token-not-issued",
    "Token never issued",
    NotIssued,
);
pub const TOKEN_JUMP: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "token-jump",
    "Token jumps too far",
    Jump,
);
pub const MISSING_TOKEN_PROOF: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "missing-token-proof",
    "Token proof required",
    BadProof,
);
pub const INVALID_TOKEN_PROOF: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "invalid-token-proof",
    "Invalid token proof",
    BadProof,
);
pub const INVALID_ROW: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-row",
    "Invalid row",
    Invalid,
);
pub const INVALID_VALUE: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "invalid-value",
    "Value refused by the table",
    Invalid,
);
pub const INVALID_REQUEST: ProblemType = kind(
    StatusCode::BAD_REQUEST,
    "invalid-request",
    "Invalid request",
    Invalid,
);
/// The same `Idempotency-Key` with another request (the IETF httpapi draft's 422).
pub const IDEMPOTENCY_KEY_REUSED: ProblemType = kind(
    StatusCode::UNPROCESSABLE_ENTITY,
    "idempotency-key-reused",
    "Idempotency key reused for another request",
    Invalid,
);
pub const RESET_NOT_BELOW: ProblemType = kind(
    StatusCode::CONFLICT,
    "reset-not-below",
    "A reset only lowers a fence",
    Conflict,
);
pub const LOCK_HELD: ProblemType =
    kind(StatusCode::CONFLICT, "lock-held", "Lock is held", Conflict);
pub const LOCK_EXHAUSTED: ProblemType = kind(
    StatusCode::CONFLICT,
    "lock-exhausted",
    "No token left to grant",
    Conflict,
);
pub const SCOPE_HAS_ISSUER: ProblemType = kind(
    StatusCode::CONFLICT,
    "scope-has-issuer",
    "Scope's tokens come from an issuer",
    Conflict,
);
pub const BINDING_CONFLICT: ProblemType = kind(
    StatusCode::CONFLICT,
    "binding-conflict",
    "Contradicts a configured binding",
    Conflict,
);
pub const LOCK_LOST: ProblemType = kind(StatusCode::CONFLICT, "lock-lost", "Lease lost", Conflict);
pub const UNAUTHENTICATED: ProblemType = kind(
    StatusCode::UNAUTHORIZED,
    "unauthenticated",
    "Authentication required",
    Invalid,
);
pub const FORBIDDEN: ProblemType = kind(StatusCode::FORBIDDEN, "forbidden", "Forbidden", Invalid);
pub const UNAVAILABLE: ProblemType = kind(
    StatusCode::SERVICE_UNAVAILABLE,
    "unavailable",
    "Service temporarily unavailable",
    Error,
);
pub const INTERNAL: ProblemType = kind(
    StatusCode::INTERNAL_SERVER_ERROR,
    "internal",
    "Internal server error",
    Error,
);
pub const ALL: &[ProblemType] = &[
    MISSING_TOKEN,
    MALFORMED_TOKEN,
    INVALID_KEY,
    INVALID_SCOPE,
    INVALID_JSON,
    INVALID_BATCH,
    PAYLOAD_TOO_LARGE,
    UNSUPPORTED_MEDIA_TYPE,
    UNSUPPORTED_TRANSFER_CODING,
    MISDIRECTED_REQUEST,
    BODY_TIMEOUT,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    STALE_TOKEN,
    SCOPE_MISMATCH,
    TOKEN_NOT_ISSUED,
    TOKEN_JUMP,
    MISSING_TOKEN_PROOF,
    INVALID_TOKEN_PROOF,
    INVALID_ROW,
    INVALID_VALUE,
    INVALID_REQUEST,
    IDEMPOTENCY_KEY_REUSED,
    RESET_NOT_BELOW,
    LOCK_HELD,
    LOCK_EXHAUSTED,
    SCOPE_HAS_ISSUER,
    BINDING_CONFLICT,
    LOCK_LOST,
    UNAUTHENTICATED,
    FORBIDDEN,
    UNAVAILABLE,
    INTERNAL,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The outcomes are the labels `observe` gave when it read them off the status: 412 stale,
    /// 409 conflict, 5xx error, else invalid, but for the refusals a status does not tell
    /// apart (a 422 is an unissued token, a jump, a bad proof, or a value a table refused).
    #[test]
    fn each_outcome_is_its_status_but_for_the_named_refusals() {
        for kind in ALL {
            let named = match kind.slug {
                "token-not-issued" => Some(NotIssued),
                "token-jump" => Some(Jump),
                "scope-mismatch" => Some(ScopeMismatch),
                "missing-token-proof" | "invalid-token-proof" => Some(BadProof),
                _ => None,
            };
            let by_status = match kind.status {
                412 => Stale,
                409 => Conflict,
                500..=599 => Error,
                _ => Invalid,
            };
            assert_eq!(kind.outcome, named.unwrap_or(by_status), "{}", kind.slug);
        }
    }
}
