//! `/v1/tables/{resource}/{key}`: fenced writes and reads of legacy PostgreSQL tables.
//! Thin: parse the path and body against the resource, call the store, answer as for kv.

use std::sync::Arc;

use axum::{
    extract::{FromRequestParts, State},
    http::{request::Parts, StatusCode},
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::openapi as doc;
use super::{
    auth::{check, check_table, Named},
    extract::{Proof, ScopeHeader, Token},
    idempotency::{finish, json_answer, respond, IdemKey, KeyedJson, Render},
    problem::{accepted, ApiError},
    report::Accepted,
    AppState,
};
use crate::{
    auth::{Actor, Right},
    fence::{binding, Fenced, FencingToken, Guard, Scope, ScopeMismatch, Target},
    store::{Answer, Done},
    tables::{canonical_key, Resource, RowBody, RowKey, RowWrite, TableOp},
};

/// The configured resource called `name`, or 404.
pub(super) fn resource(state: &AppState, name: &str) -> Result<Arc<Resource>, ApiError> {
    state.tables.get(name).cloned().ok_or_else(|| {
        ApiError::NotFound(format!(
            "no resource {name:?} is configured ([[resources]] in the config file)"
        ))
    })
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
            return Err(ApiError::NotFound(
                "no such endpoint; see docs/api.md or GET /openapi.json".into(),
            ));
        };
        let resource = resource(state, name)?;
        let key = RowKey::parse(&resource, key, state.kv.max_key_bytes)?;
        Ok(RowPath { resource, key })
    }
}

/// The scope of a write to `resource`: its bound `scope` if configured (a different header is
/// a mismatch, named by `key`), else the header's.
pub(super) fn table_scope(
    resource: &Resource,
    key: &RowKey,
    scope: Option<Scope>,
) -> Result<Option<Scope>, ScopeMismatch> {
    let fenced = || Fenced::Row {
        resource: resource.name.clone(),
        key: canonical_key(key.values()),
    };
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
    let guard = Guard {
        token: token.0,
        target: scope.map_or(Target::Key, Target::Scope),
        rule: resource.rule,
    };
    proof.check(state, &guard)?;
    match mismatch {
        Some(mismatch) => Err(super::binding::refused(state, &guard, mismatch).await),
        None => Ok(guard),
    }
}

// Fields in alphabetical order, as `json!` wrote them.

/// The body of an accepted table write.
#[derive(Serialize, ToSchema)]
pub struct RowWritten<'a> {
    /// A delete's: always true.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    deleted: Option<bool>,
    fence_token: FencingToken,
    /// The canonical row key (docs/tables.md).
    key: &'a str,
    resource: &'a str,
    /// The scope the write was under (null: the row's own fence).
    #[schema(value_type = Option<String>, required = true)]
    scope: Option<&'a Scope>,
}

async fn write(
    state: &AppState,
    actor: &Actor,
    op: TableOp,
    guard: Guard,
    idem: IdemKey,
    digest: Option<[u8; 32]>,
) -> Result<Accepted<Response>, ApiError> {
    let (token, scope) = (guard.token, guard.scope().cloned());
    let Some(pending) = idem.0 else {
        let written = accepted(state.store.table_write(&op, &guard).await?)?;
        return Ok(Accepted(respond(
            row_answer(&op, token, scope.as_ref(), &written),
            false,
        )));
    };
    let render = {
        let (op, scope) = (op.clone(), scope.clone());
        Render::new(move |done| match done {
            Done::Row(written) => row_answer(&op, token, scope.as_ref(), written),
            _ => unreachable!("a table write is kept as a row"),
        })
    };
    let keep = pending.keep(state, actor, digest, render);
    // Boxed, so that an unkeyed write's future does not carry the keyed path's state (kv::put).
    let keyed = Box::pin(state.store.table_write_keyed(&op, &guard, &keep)).await?;
    finish(keyed, |written| {
        row_answer(&op, token, scope.as_ref(), written)
    })
}

/// The answer to an accepted table write: 201 for a PUT that created the row, else 200.
fn row_answer(
    op: &TableOp,
    token: FencingToken,
    scope: Option<&Scope>,
    written: &crate::store::RowWritten,
) -> Answer {
    let (status, deleted) = match op.write {
        RowWrite::Put(_) if !written.existed => (StatusCode::CREATED, None),
        RowWrite::Delete => (StatusCode::OK, Some(true)),
        _ => (StatusCode::OK, None),
    };
    let body = RowWritten {
        deleted,
        fence_token: token,
        key: &written.key,
        resource: &op.resource.name,
        scope,
    };
    json_answer(status, &body)
}

/// Replaces the row (creating it if absent); columns left out get their default.
#[utoipa::path(
    operation_id = "table_put",
    put,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof, IdemKey),
    request_body(content = Object, description = "The row: column name -> value (JSON), as docs/tables.md maps them", content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = RowWritten),
        (status = 200, description = "Replaced", body = RowWritten),
        doc::TableWrite
    )
)]
// One argument per extractor: the request's parts, each parsed and refused on its own.
#[allow(clippy::too_many_arguments)]
pub async fn put(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
    body: KeyedJson<RowBody>,
) -> Result<Accepted<Response>, ApiError> {
    let (body, digest) = (body.value, body.digest);
    let write = RowWrite::Put(resource.check_row(body, false)?);
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(
        &state,
        &actor,
        TableOp {
            resource,
            key,
            write,
        },
        guard,
        idem,
        digest,
    )
    .await
}

/// Updates the named columns of an existing row.
#[utoipa::path(
    operation_id = "table_patch",
    patch,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof, IdemKey),
    request_body(content = Object, description = "The row: column name -> value (JSON), as docs/tables.md maps them", content_type = "application/json"),
    responses((status = 200, description = "Updated", body = RowWritten), doc::TableWrite)
)]
// One argument per extractor: the request's parts, each parsed and refused on its own.
#[allow(clippy::too_many_arguments)]
pub async fn patch(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
    body: KeyedJson<RowBody>,
) -> Result<Accepted<Response>, ApiError> {
    let (body, digest) = (body.value, body.digest);
    let write = RowWrite::Patch(resource.check_row(body, true)?);
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(
        &state,
        &actor,
        TableOp {
            resource,
            key,
            write,
        },
        guard,
        idem,
        digest,
    )
    .await
}

/// Deletes the row; its fence stays (a tombstone in the ledger).
#[utoipa::path(
    operation_id = "table_delete",
    delete,
    path = super::routes::TABLES,
    tag = "tables",
    params(doc::RowParams, Token, ScopeHeader, Proof, IdemKey),
    responses((status = 200, description = "Deleted", body = RowWritten), doc::TableDelete)
)]
pub async fn delete(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
) -> Result<Accepted<Response>, ApiError> {
    let guard = guard(&state, &actor, &resource, &key, token, scope, &proof).await?;
    self::write(
        &state,
        &actor,
        TableOp {
            resource,
            key,
            write: RowWrite::Delete,
        },
        guard,
        idem,
        None,
    )
    .await
}

/// The body of a GET.
#[derive(Serialize, ToSchema)]
pub struct RowRead<'a> {
    resource: &'a str,
    /// The canonical row key (docs/tables.md).
    key: &'a str,
    /// The row's columns, as PostgreSQL printed them: serialized verbatim, so numerics keep
    /// every digit.
    #[schema(value_type = Object)]
    row: &'a RawValue,
    /// Null for a row never written through fencegate.
    #[schema(required = true)]
    fence_token: Option<FencingToken>,
    /// The row's sticky scope (null: none).
    #[schema(required = true)]
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
        (status = 200, description = "The row", body = RowRead,
         headers(("X-Fencing-Token" = String, description = "The row's fence token, when it has one"))),
        doc::TableGet
    )
)]
pub async fn get(
    actor: Actor,
    State(state): State<AppState>,
    RowPath { resource, key }: RowPath,
) -> Result<Response, ApiError> {
    check_table(&actor, Right::Read, &resource.name)?;
    let Some(entry) = state.store.table_get(&resource, &key).await? else {
        return Err(ApiError::NotFound(format!(
            "resource {:?} has no such row (never written, or deleted)",
            resource.name
        )));
    };
    let body = RowRead {
        resource: &resource.name,
        key: &entry.key,
        row: &entry.row,
        fence_token: entry.fence_token,
        scope: entry.scope.as_deref(),
    };
    let mut response = Json(body).into_response();
    if let Some(token) = entry.fence_token {
        super::extract::answer_token(response.headers_mut(), token);
    }
    Ok(response)
}
