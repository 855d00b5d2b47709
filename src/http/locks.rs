//! `/v1/locks/{name}`: the built-in lease service over HTTP.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use super::{
    auth::{check, Named},
    extract::{JsonBody, ScopePath, Token},
    problem::ApiError,
    AppState,
};
use crate::auth::{Actor, Right};
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
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Response, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    let owner = parse_owner(&request.owner).map_err(ApiError::InvalidRequest)?;
    let ttl = Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.acquire(&name, owner, ttl, actor.name()).await? {
        Acquired::Granted(lease) => Ok((StatusCode::CREATED, lease_body(&lease, Some(ttl.ms()))).into_response()),
        Acquired::Held(holder) => Err(ApiError::LockHeld { owner: holder.owner, remaining_ms: holder.remaining_ms }),
        Acquired::Exhausted => Err(ApiError::LockExhausted),
    }
}

pub async fn renew(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
    JsonBody(request): JsonBody<RenewRequest>,
) -> Result<Response, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    let ttl = Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.renew(&name, token, ttl, actor.lease_must_match()).await? {
        Held::Yes(lease) => Ok(lease_body(&lease, Some(ttl.ms())).into_response()),
        Held::Lost { current } => Err(ApiError::LockLost { current }),
        Held::Foreign => Err(foreign(&name)),
    }
}

pub async fn release(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
) -> Result<Response, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    match state.store.release(&name, token, actor.lease_must_match()).await? {
        Held::Yes(lease) => Ok(Json(json!({"name": lease.name, "token": lease.token, "released": true})).into_response()),
        Held::Lost { current } => Err(ApiError::LockLost { current }),
        Held::Foreign => Err(foreign(&name)),
    }
}

/// Another actor's lease: 403 naming the `lock` right and the lock, as for a missing right.
fn foreign(name: &crate::fence::Scope) -> ApiError {
    ApiError::ForeignLease(name.as_str().to_owned())
}
