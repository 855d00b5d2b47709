//! How the errors and refusals of the layers below (tokens, names, the store, the fence's
//! verdict) become problems.

use super::ApiError;
use crate::{
    fence::{NameError, Outcome, ScopeMismatch, TokenError},
    store::TableError,
};

impl ApiError {
    pub fn invalid_key(err: NameError) -> Self {
        ApiError::InvalidKey(format!("the key {err}"))
    }

    pub fn invalid_scope(err: NameError) -> Self {
        ApiError::InvalidScope(format!("the scope {err}"))
    }
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
