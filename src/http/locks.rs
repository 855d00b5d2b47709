//! `/v1/locks/{name}`: the built-in lease service over HTTP.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;
use utoipa::ToSchema;

use super::openapi as doc;
use super::{
    auth::{check, Named},
    extract::{JsonBody, ScopePath, Token},
    problem::ApiError,
    report::Accepted,
    AppState,
};
use crate::auth::{Actor, Right};
use crate::events::{LeaseEvent, What};
use crate::fence::{FencingToken, Scope};
use crate::locks::{parse_owner, AcquireRequest, Acquired, Held, Lease, RenewRequest, Ttl};

// Bodies in alphabetical field order, as `json!` wrote them.

/// A granted or renewed lease.
#[derive(Serialize, ToSchema)]
#[schema(as = Lease)]
pub struct LeaseBody<'a> {
    /// RFC 3339, the database's clock.
    expires_at: &'a str,
    #[schema(value_type = String)]
    name: &'a Scope,
    owner: &'a str,
    /// The lock's name: the scope its token fences. Writes guarded by this lock send
    /// X-Fencing-Scope: <name> with X-Fencing-Token: <token>.
    #[schema(value_type = String)]
    scope: &'a Scope,
    /// Send it as X-Fencing-Token, with X-Fencing-Scope: {name}.
    token: FencingToken,
    ttl_ms: i64,
}

fn lease_body(lease: &Lease, ttl_ms: i64) -> Json<LeaseBody<'_>> {
    Json(LeaseBody {
        expires_at: &lease.expires_at,
        name: &lease.name,
        owner: &lease.owner,
        scope: &lease.name,
        token: lease.token,
        ttl_ms,
    })
}

/// Who holds a lock (never the lease's token: with it, anyone could renew or release it).
#[derive(Serialize, ToSchema)]
pub struct LockHolder<'a> {
    #[schema(value_type = String)]
    name: &'a Scope,
    /// The holder's owner label, as it was granted.
    owner: &'a str,
    /// How long the lease runs unless renewed (the database's clock).
    remaining_ms: i64,
}

/// A released lease.
#[derive(Serialize, ToSchema)]
pub struct Released<'a> {
    #[schema(value_type = String)]
    name: &'a Scope,
    /// Always true.
    released: bool,
    token: FencingToken,
}

#[utoipa::path(
    operation_id = "lock_acquire",
    post,
    path = super::routes::LOCKS,
    tag = "locks",
    summary = "Take the lock: a token above every token granted for it, and the scope's fence raised to it",
    params(doc::LockName),
    request_body(content = AcquireRequest, content_type = "application/json"),
    responses((status = 201, description = "Granted", body = LeaseBody), doc::LockAcquire)
)]
pub async fn acquire(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    JsonBody(request): JsonBody<AcquireRequest>,
) -> Result<Accepted<Response>, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    // One source of tokens per scope: an issuer's scope takes only its signed tokens, and a
    // grant here would make every later one of them "not issued" (whatever rights ask).
    if let Some(issuer) = state.issuers.covering(&name) {
        return Err(ApiError::ScopeHasIssuer {
            scope: name.as_str().to_owned(),
            issuer: issuer.to_owned(),
        });
    }
    let owner = parse_owner(&request.owner).map_err(ApiError::InvalidRequest)?;
    let ttl =
        Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state.store.acquire(&name, owner, ttl, actor.name()).await? {
        Acquired::Granted(lease) => {
            state
                .events
                .publish(|| What::Grant(LeaseEvent::of(&lease, ttl.ms())));
            Ok(Accepted(
                (StatusCode::CREATED, lease_body(&lease, ttl.ms())).into_response(),
            ))
        }
        Acquired::Held(holder) => Err(ApiError::LockHeld {
            owner: holder.owner,
            remaining_ms: holder.remaining_ms,
        }),
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
    responses((status = 200, description = "Renewed", body = LeaseBody), doc::LockRenew)
)]
pub async fn renew(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
    JsonBody(request): JsonBody<RenewRequest>,
) -> Result<Accepted<Response>, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    let ttl =
        Ttl::parse(request.ttl_ms, state.locks.max_ttl_ms).map_err(ApiError::InvalidRequest)?;
    match state
        .store
        .renew(&name, token, ttl, actor.lease_must_match())
        .await?
    {
        Held::Yes(lease) => {
            state
                .events
                .publish(|| What::Renew(LeaseEvent::of(&lease, ttl.ms())));
            Ok(Accepted(lease_body(&lease, ttl.ms()).into_response()))
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
    responses((status = 200, description = "Released", body = Released), doc::LockRelease)
)]
pub async fn release(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
    Token(token): Token,
) -> Result<Accepted<Response>, ApiError> {
    check(&actor, Right::Lock, Named::Lock, name.as_str())?;
    match state
        .store
        .release(&name, token, actor.lease_must_match())
        .await?
    {
        Held::Yes(lease) => {
            state.events.publish(|| What::Release {
                name: lease.name.as_str().to_owned(),
                token: lease.token,
            });
            Ok(Accepted(
                Json(Released {
                    name: &lease.name,
                    released: true,
                    token: lease.token,
                })
                .into_response(),
            ))
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
    responses((status = 200, description = "Held", body = LockHolder), doc::LockGet)
)]
pub async fn get(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(name): ScopePath,
) -> Result<Response, ApiError> {
    check(&actor, Right::Read, Named::Lock, name.as_str())?;
    match state.store.holder(&name).await? {
        // The token is never shown: with it, anyone could renew or release the lease.
        Some(holder) => Ok(Json(LockHolder {
            name: &name,
            owner: &holder.owner,
            remaining_ms: holder.remaining_ms,
        })
        .into_response()),
        None => Err(ApiError::NotFound(format!(
            "lock {:?} is free (never taken, released, or expired)",
            name.as_str()
        ))),
    }
}

/// Another actor's lease: 403 naming the `lock` right and the lock, as for a missing right.
fn foreign(name: &crate::fence::Scope) -> ApiError {
    ApiError::ForeignLease(name.as_str().to_owned())
}
