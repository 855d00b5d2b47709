//! `/v1/fences/{scope}`: claim (raise) a scope's fence without writing data, and read it.

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
    extract::{Proof, ScopePath, Token},
    problem::{accepted, ApiError},
    AppState,
};
use crate::auth::{Actor, Right};

#[utoipa::path(
    operation_id = "fence_claim",
    post,
    path = super::routes::FENCES,
    tag = "fences",
    summary = "Raise a scope's fence to the token without writing data",
    params(ScopePath, Token, Proof),
    responses(
        (status = 201, description = "The scope had no fence", body = body::Fence),
        (status = 200, description = "Raised, or already there", body = body::Fence),
        doc::FenceClaim
    )
)]
pub async fn claim(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(scope): ScopePath,
    Token(token): Token,
    proof: Proof,
) -> Result<Response, ApiError> {
    check(&actor, Right::Fence, Named::Scope, scope.as_str())?;
    state.issuers.check(&scope, token, proof.bytes())?;
    let claimed = accepted(state.store.claim(&scope, token).await?)?;
    let status = if claimed.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!({"scope": scope, "fence_token": token}))).into_response())
}

#[utoipa::path(
    operation_id = "fence_get",
    get,
    path = super::routes::FENCES,
    tag = "fences",
    summary = "Read a scope's fence",
    params(ScopePath),
    responses((status = 200, description = "The fence", body = body::Fence), doc::FenceGet)
)]
pub async fn get(actor: Actor, State(state): State<AppState>, ScopePath(scope): ScopePath) -> Result<Response, ApiError> {
    check(&actor, Right::Read, Named::Scope, scope.as_str())?;
    match state.store.fence(&scope).await? {
        Some(token) => Ok(Json(json!({"scope": scope, "fence_token": token})).into_response()),
        None => Err(ApiError::NotFound(format!("no fence for scope {:?}", scope.as_str()))),
    }
}
