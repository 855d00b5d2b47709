//! `/v1/locks/{name}`: the built-in lease service over HTTP.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde_json::json;

use super::openapi::{self as doc, schemas as body};
use super::{
    auth::{check, Named},
    extract::{JsonBody, ScopePath, Token},
    problem::ApiError,
    AppState,
};
use crate::auth::{Actor, Right};
use crate::events::{LeaseEvent, What};
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

#[utoipa::path(
    operation_id = "lock_acquire",
    post,
    path = super::routes::LOCKS,
    tag = "locks",
    summary = "Take the lock: a token above every token granted for it, and the scope's fence raised to it",
    params(doc::LockName),
    request_body(content = AcquireRequest, content_type = "application/json"),
    responses((status = 201, description = "Granted", body = body::Lease), doc::LockAcquire)
)]
pub async fn acquire(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Response, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    // One source of tokens per scope: an issuer's scope takes only its signed tokens, and a
    // grant here would make every later one of them "not issued" (whatever rights ask).
    if let Some(issuer) = state.issuers.covering(&name) {
        return Err(ApiError::ScopeHasIssuer { scope: name.as_str().to_owned(), issuer: issuer.to_owned() });
    }
    let owner = parse_owner(&request.owner).map_err(ApiError::InvalidRequest)?;
    let ttl = Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.acquire(&name, owner, ttl, actor.name()).await? {
        Acquired::Granted(lease) => {
            state.events.publish(|| What::Grant(LeaseEvent::of(&lease, ttl.ms())));
            Ok((StatusCode::CREATED, lease_body(&lease, Some(ttl.ms()))).into_response())
        }
        Acquired::Held(holder) => Err(ApiError::LockHeld { owner: holder.owner, remaining_ms: holder.remaining_ms }),
        Acquired::Exhausted => Err(ApiError::LockExhausted),
    }
}

#[utoipa::path(
    operation_id = "lock_renew",
    post,
    path = super::routes::LOCK_RENEW,
    tag = "locks",
    summary = "Extend the lease the token holds",
    params(doc::LockName, Token),
    request_body(content = RenewRequest, content_type = "application/json"),
    responses((status = 200, description = "Renewed", body = body::Lease), doc::LockRenew)
)]
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
        Held::Yes(lease) => {
            state.events.publish(|| What::Renew(LeaseEvent::of(&lease, ttl.ms())));
            Ok(lease_body(&lease, Some(ttl.ms())).into_response())
        }
        Held::Lost { current } => Err(ApiError::LockLost { current }),
        Held::Foreign => Err(foreign(&name)),
    }
}

#[utoipa::path(
    operation_id = "lock_release",
    delete,
    path = super::routes::LOCKS,
    tag = "locks",
    summary = "Release the lease the token holds",
    params(doc::LockName, Token),
    responses((status = 200, description = "Released", body = body::Released), doc::LockRelease)
)]
pub async fn release(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
) -> Result<Response, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    match state.store.release(&name, token, actor.lease_must_match()).await? {
        Held::Yes(lease) => {
            state.events.publish(|| What::Release { name: lease.name.as_str().to_owned(), token: lease.token });
            Ok(Json(json!({"name": lease.name, "token": lease.token, "released": true})).into_response())
        }
        Held::Lost { current } => Err(ApiError::LockLost { current }),
        Held::Foreign => Err(foreign(&name)),
    }
}

#[utoipa::path(
    get,
    operation_id = "lock_get",
    path = super::routes::LOCKS,
    tag = "locks",
    summary = "Who holds the lock now (never the lease's token)",
    params(doc::LockName),
    responses((status = 200, description = "Held", body = body::LockHolder), doc::LockGet)
)]
pub async fn get(actor: Actor, State(state): State<AppState>, ScopePath(name): ScopePath) -> Result<Response, ApiError> {
    check(&actor, Right::Read, Named::Lock, name.as_str())?;
    match state.store.holder(&name).await? {
        // The token is never shown: with it, anyone could renew or release the lease.
        Some(holder) => Ok(Json(json!({"name": name, "owner": holder.owner, "remaining_ms": holder.remaining_ms})).into_response()),
        None => Err(ApiError::NotFound(format!("lock {:?} is free (never taken, released, or expired)", name.as_str()))),
    }
}

/// Another actor's lease: 403 naming the `lock` right and the lock, as for a missing right.
fn foreign(name: &crate::fence::Scope) -> ApiError {
    ApiError::ForeignLease(name.as_str().to_owned())
}
