//! `/v1/tables/{resource}/{key}`: fenced writes and reads of legacy PostgreSQL tables.
//! Thin: parse the path and body against the resource, call the store, answer as for kv.

use std::sync::Arc;

use axum::{
    extract::{FromRequestParts, State},
    http::{request::Parts, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;
use serde_json::{json, value::RawValue};

use super::openapi::{self as doc, schemas as body};
use super::{
    auth::{check, check_table, Named},
    extract::{JsonBody, Proof, ScopeHeader, Token},
    problem::{accepted, ApiError},
    AppState,
};
use crate::{
    auth::{Actor, Right},
    fence::{binding, Fenced, FencingToken, Guard, Scope, ScopeMismatch, Target},
    tables::{canonical_key, Resource, RowBody, RowKey, RowWrite, TableOp},
};

/// The configured resource called `name`, or 404.
pub(super) fn resource(state: &AppState, name: &str) -> Result<Arc<Resource>, ApiError> {
    state
        .tables
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::NotFound(format!("no resource {name:?} is configured ([[resources]] in the config file)")))
}

/// `{resource}/{key}` of the path: the resource (404 if not configured) and the row key, parsed
/// from the raw segment (docs/tables.md: values joined by ',', each percent-encoded).
pub struct RowPath {
    resource: Arc<Resource>,
    key: RowKey,
}

impl FromRequestParts<AppState> for RowPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // The raw path, not axum's decoded parameters: a %2C inside a value must not split it.
        // The route is /v1/tables/{resource}/{key}, so these are the last two segments.
        let mut segments = parts.uri.path().rsplit('/');
        let (Some(key), Some(name)) = (segments.next(), segments.next()) else {
            return Err(ApiError::NotFound("no such endpoint; see docs/api.md or GET /openapi.json".into()));
        };
        let resource = resource(state, name)?;
        let key = RowKey::parse(&resource, key, state.kv.max_key_bytes)?;
        Ok(RowPath { resource, key })
    }
}

/// The scope of a write to `resource`: its bound `scope` if configured (a different header is
/// a mismatch, named by `key`), else the header's.
pub(super) fn table_scope(resource: &Resource, key: &RowKey, scope: Option<Scope>) -> Result<Option<Scope>, ScopeMismatch> {
    let fenced = || Fenced::Row { resource: resource.name.clone(), key: canonical_key(key.values()) };
    binding(resource.scope.as_ref(), scope, fenced)
}

/// The guard of a table write: the scope's fence if the write is under one, else the row's own,
/// under the resource's rule. The actor needs `write` on the resource and on that scope, and
/// the write the proof an issuer of that scope requires. A header that contradicts the
/// resource's `scope` is refused in the verdict's order (`binding`), after the same checks on
/// the presented scope.
async fn guard(
    state: &AppState,
    actor: &Actor,
    resource: &Resource,
    key: &RowKey,
    token: Token,
    scope: ScopeHeader,
    proof: &Proof,
) -> Result<Guard, ApiError> {
    check_table(actor, Right::Write, &resource.name)?;
    let (scope, mismatch) = match table_scope(resource, key, scope.0.clone()) {
        Ok(effective) => (effective, None),
        Err(mismatch) => (scope.0, Some(mismatch)),
    };
    if let Some(scope) = &scope {
        check(actor, Right::Write, Named::Scope, scope.as_str())?;
    }
    let guard = Guard { token: token.0, target: scope.map_or(Target::Key, Target::Scope), rule: resource.rule };
    proof.check(state, &guard)?;
    match mismatch {
        Some(mismatch) => Err(super::binding::refused(state, &guard, mismatch).await),
        None => Ok(guard),
    }
}

async fn write(state: &AppState, op: TableOp, guard: Guard) -> Result<Response, ApiError> {
    let written = accepted(state.store.table_write(&op, &guard).await?)?;
    let mut body = json!({
        "resource": op.resource.name,
        "key": written.key,
        "fence_token": guard.token,
        "scope": guard.scope(),
    });
    let status = match op.write {
        RowWrite::Put(_) if !written.existed => StatusCode::CREATED,
        RowWrite::Delete => {
            body["deleted"] = true.into();
            StatusCode::OK
        }
        _ => StatusCode::OK,
    };
    Ok((status, Json(body)).into_response())
}

/// Replaces the row (creating it if absent); columns left out get their default.
#[utoipa::path(
    operation_id = "table_put",
    put,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof),
    request_body(content = Object, description = "The row: column name -> value (JSON), as docs/tables.md maps them", content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = body::RowWritten),
        (status = 200, description = "Replaced", body = body::RowWritten),
        doc::TableWrite
    )
)]
pub async fn put(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    JsonBody(body): JsonBody<RowBody>,
) -> Result<Response, ApiError> {
    let write = RowWrite::Put(resource.check_row(body, false)?);
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(&state, TableOp { resource, key, write }, guard).await
}

/// Updates the named columns of an existing row.
#[utoipa::path(
    operation_id = "table_patch",
    patch,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof),
    request_body(content = Object, description = "The row: column name -> value (JSON), as docs/tables.md maps them", content_type = "application/json"),
    responses((status = 200, description = "Updated", body = body::RowWritten), doc::TableWrite)
)]
pub async fn patch(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    JsonBody(body): JsonBody<RowBody>,
) -> Result<Response, ApiError> {
    let write = RowWrite::Patch(resource.check_row(body, true)?);
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(&state, TableOp { resource, key, write }, guard).await
}

/// Deletes the row; its fence stays (a tombstone in the ledger).
#[utoipa::path(
    operation_id = "table_delete",
    delete,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof),
    responses((status = 200, description = "Deleted", body = body::RowWritten), doc::TableDelete)
)]
pub async fn delete(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
) -> Result<Response, ApiError> {
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(&state, TableOp { resource, key, write: RowWrite::Delete }, guard).await
}

#[derive(Serialize)]
struct RowResponse<'a> {
    resource: &'a str,
    key: &'a str,
    /// Serialized verbatim: numerics keep every digit PostgreSQL printed.
    row: &'a RawValue,
    fence_token: Option<FencingToken>,
    scope: Option<&'a str>,
}

#[utoipa::path(
    operation_id = "table_get",
    get,
    path = super::routes::TABLES,
    tag = "tables",
    summary = "Read a row and its fence",
    params(doc::RowParams),
    responses(
        (status = 200, description = "The row", body = body::RowRead,
         headers(("X-Fencing-Token" = String, description = "The row's fence token, when it has one"))),
        doc::TableGet
    )
)]
pub async fn get(actor: Actor, State(state): State<AppState>, RowPath { resource, key }: RowPath) -> Result<Response, ApiError> {
    check_table(&actor, Right::Read, &resource.name)?;
    let Some(entry) = state.store.table_get(&resource, &key).await? else {
        return Err(ApiError::NotFound(format!("resource {:?} has no such row (never written, or deleted)", resource.name)));
    };
    let mut headers = HeaderMap::new();
    if let Some(token) = entry.fence_token {
        headers.insert(
            super::extract::TOKEN_HEADER,
            HeaderValue::from_str(&token.to_string()).expect("digits are a valid header value"),
        );
    }
    let body = RowResponse {
        resource: &resource.name,
        key: &entry.key,
        row: &entry.row,
        fence_token: entry.fence_token,
        scope: entry.scope.as_deref(),
    };
    Ok((headers, Json(body)).into_response())
}
