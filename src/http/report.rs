//! What a request did, as types rather than a status code read back afterwards: the fenced
//! write it is ([`Op`], from its route in `routes::ALL`, so a request refused before its
//! handler has one too) and how it ended ([`Outcome`], set on the response by the handler's
//! [`Accepted`] or by the problem's type, `problem::kinds`). `observe` joins them into a
//! [`Report`]: the labels of `fencegate_writes_total` and the console's events.

use axum::response::{IntoResponse, Response};

/// A fenced write: the `op` label of `fencegate_writes_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Put,
    Delete,
    Batch,
    Claim,
    TablePut,
    TablePatch,
    TableDelete,
    LockAcquire,
    LockRenew,
    LockRelease,
}

impl Op {
    pub fn label(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Delete => "delete",
            Op::Batch => "batch",
            Op::Claim => "claim",
            Op::TablePut => "table_put",
            Op::TablePatch => "table_patch",
            Op::TableDelete => "table_delete",
            Op::LockAcquire => "lock_acquire",
            Op::LockRenew => "lock_renew",
            Op::LockRelease => "lock_release",
        }
    }

    /// A lease operation: the lock handlers publish their own console events (grant, renew,
    /// release), so `observe` publishes none for them.
    pub fn is_lock(self) -> bool {
        matches!(self, Op::LockAcquire | Op::LockRenew | Op::LockRelease)
    }
}

/// How a request ended: the `outcome` label of `fencegate_writes_total`. Every problem type
/// names its own (`problem::kinds`); an accepted write is [`Accepted`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Accepted,
    /// 412: a newer lock holder exists.
    Stale,
    /// 422: above the latest token the built-in lock granted.
    NotIssued,
    /// 422: raises the fence by more than `kv.max_token_jump`.
    Jump,
    /// 409: the write came under another scope than the key is bound to.
    ScopeMismatch,
    /// 422: an issuer's proof missing or wrong.
    BadProof,
    /// Any other 409 (a lock held or lost, a reset not below).
    Conflict,
    /// Refused for what the request is (its input, its credential, its route).
    Invalid,
    /// The server's failure, or too busy to answer (5xx).
    Error,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Stale => "stale",
            Outcome::NotIssued => "not_issued",
            Outcome::Jump => "jump",
            Outcome::ScopeMismatch => "scope_mismatch",
            Outcome::BadProof => "bad_proof",
            Outcome::Conflict => "conflict",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
        }
    }
}

/// A fenced write and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Report {
    pub op: Op,
    pub outcome: Outcome,
}

/// A write handler's answer when the write was done: the response, marked accepted. Write
/// handlers return `Result<Accepted<_>, ApiError>`, so each of their responses says how it
/// ended, whichever arm it came from.
pub struct Accepted<T>(pub T);

impl<T: IntoResponse> IntoResponse for Accepted<T> {
    fn into_response(self) -> Response {
        let mut response = self.0.into_response();
        response.extensions_mut().insert(Outcome::Accepted);
        response
    }
}
