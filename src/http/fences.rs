//! `/v1/fences/{scope}`: claim (raise) a scope's fence without writing data, and read it.

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
    extract::{Proof, ScopePath, Token},
    idempotency::{finish, json_answer, respond, IdemKey, Render},
    problem::{accepted, ApiError},
    report::Accepted,
    AppState,
};
use crate::{
    auth::{Actor, Right},
    fence::{FencingToken, Scope},
    store::{Answer, Claimed, Done},
};

/// A scope's fence: the body of a claim and of a read.
#[derive(Serialize, ToSchema)]
pub struct Fence<'a> {
    fence_token: FencingToken,
    #[schema(value_type = String)]
    scope: &'a Scope,
}

#[utoipa::path(
    operation_id = "fence_claim",
    post,
    path = super::routes::FENCES,
    tag = "fences",
    summary = "Raise a scope's fence to the token without writing data",
    params(ScopePath, Token, Proof, IdemKey),
    responses(
        (status = 201, description = "The scope had no fence", body = Fence),
        (status = 200, description = "Raised, or already there", body = Fence),
        doc::FenceClaim
    )
)]
pub async fn claim(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(scope): ScopePath,
    Token(token): Token,
    proof: Proof,
    idem: IdemKey,
) -> Result<Accepted<Response>, ApiError> {
    check(&actor, Right::Fence, Named::Scope, scope.as_str())?;
    state.issuers.check(&scope, token, proof.bytes())?;
    let Some(pending) = idem.0 else {
        let claimed = accepted(state.store.claim(&scope, token).await?)?;
        return Ok(Accepted(respond(
            claim_answer(token, &scope, &claimed),
            false,
        )));
    };
    let render = {
        let scope = scope.clone();
        Render::new(move |done| match done {
            Done::Claim(claimed) => claim_answer(token, &scope, claimed),
            _ => unreachable!("a claim is kept as a claim"),
        })
    };
    let keep = pending.keep(&state, &actor, None, render);
    // Boxed, so that an unkeyed claim's future does not carry the keyed path's state (kv::put).
    let keyed = Box::pin(state.store.claim_keyed(&scope, token, &keep)).await?;
    finish(keyed, |claimed| claim_answer(token, &scope, claimed))
}

/// The answer to a claim: 201 if the scope had no fence, else 200.
fn claim_answer(token: FencingToken, scope: &Scope, claimed: &Claimed) -> Answer {
    let status = if claimed.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_answer(
        status,
        &Fence {
            fence_token: token,
            scope,
        },
    )
}

#[utoipa::path(
    operation_id = "fence_get",
    get,
    path = super::routes::FENCES,
    tag = "fences",
    summary = "Read a scope's fence",
    params(ScopePath),
    responses((status = 200, description = "The fence", body = Fence), doc::FenceGet)
)]
pub async fn get(
    actor: Actor,
    State(state): State<AppState>,
    ScopePath(scope): ScopePath,
) -> Result<Response, ApiError> {
    check(&actor, Right::Read, Named::Scope, scope.as_str())?;
    match state.store.fence(&scope).await? {
        Some(token) => Ok(Json(Fence {
            fence_token: token,
            scope: &scope,
        })
        .into_response()),
        None => Err(ApiError::NotFound(format!(
            "no fence for scope {:?}",
            scope.as_str()
        ))),
    }
}
