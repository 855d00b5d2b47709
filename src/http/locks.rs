//! `/v1/locks/{name}`: the built-in lease service over HTTP.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use super::{
    extract::{JsonBody, ScopePath, Token},
    problem::ApiError,
    AppState,
};
use crate::locks::{parse_owner, AcquireRequest, Acquired, Held, Lease, RenewRequest, Ttl};

fn lease_body(lease: &Lease, ttl_ms: Option<i64>) -> Json<serde_json::Value> {
    Json(json!({
        "name": lease.name,
        "token": lease.token,
        "owner": lease.owner,
        "expires_at": lease.expires_at,
        "ttl_ms": ttl_ms,
        // Writes guarded by this lock send X-Fencing-Scope: <name> with X-Fencing-Token: <token>.
        "scope": lease.name,
    }))
}

pub async fn acquire(
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Response, ApiError> {
    let owner = parse_owner(&request.owner).map_err(ApiError::InvalidRequest)?;
    let ttl = Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.acquire(&name, owner, ttl).await? {
        Acquired::Granted(lease) => Ok((StatusCode::CREATED, lease_body(&lease, Some(ttl.ms()))).into_response()),
        Acquired::Held(holder) => Err(ApiError::LockHeld { owner: holder.owner, remaining_ms: holder.remaining_ms }),
        Acquired::Exhausted => Err(ApiError::LockExhausted),
    }
}

pub async fn renew(
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
    JsonBody(request): JsonBody<RenewRequest>,
) -> Result<Response, ApiError> {
    let ttl = Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.renew(&name, token, ttl).await? {
        Held::Yes(lease) => Ok(lease_body(&lease, Some(ttl.ms())).into_response()),
        Held::Lost { current } => Err(ApiError::LockLost { current }),
    }
}

pub async fn release(
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
) -> Result<Response, ApiError> {
    match state.store.release(&name, token).await? {
        Held::Yes(lease) => Ok(Json(json!({"name": lease.name, "token": lease.token, "released": true})).into_response()),
        Held::Lost { current } => Err(ApiError::LockLost { current }),
    }
}
