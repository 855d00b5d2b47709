//! `POST /v1/batch`: several kv writes (and legacy-table writes) under one token, all or nothing.

use axum::{extract::State, http::StatusCode, response::Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::openapi as doc;
use super::{
    auth::{check, check_table, Named},
    extract::{Proof, ScopeHeader, Token},
    idempotency::{finish, json_answer, respond, IdemKey, KeyedJson, Pending, Render},
    kv::guard,
    problem::{accepted, ApiError},
    report::Accepted,
    tables::table_scope,
    AppState,
};
use crate::{
    auth::{Actor, Right},
    fence::{FencingToken, Guard, Key, Rule, Scope, ScopeMismatch, Target},
    store::{Answer, BatchOp as Op, BatchWritten, Document, Done, RowWritten, Write, Written},
    tables::{RowBody, RowKey, RowWrite, TableOp},
};

/// `{"ops": [...]}`: 1..=kv.max_batch_ops ops, applied all or nothing.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    ops: Vec<OpRequest>,
}

/// One op: `{"op": "put", "key", "value"}`, `{"op": "delete", "key"}`, or a table op with
/// `resource` (then `key` is the row key's URL form) and `row` (put, patch).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct OpRequest {
    /// put, delete, or patch (tables only).
    op: String,
    key: String,
    // `Option<Value>` cannot tell a missing value from `null`; a JSON null is a legal value.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    value: Option<Box<RawValue>>,
    /// A table op: the resource name; `key` is then the URL form of the row key.
    #[serde(default)]
    resource: Option<String>,
    /// A table op's row (put) or columns (patch).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    row: Option<RowBody>,
}

// Fields in alphabetical order, as `json!` wrote them.

/// The body of an applied batch.
#[derive(Serialize, ToSchema)]
pub struct BatchDone {
    fence_token: FencingToken,
    /// One per op, in the order of the request.
    results: Vec<OpResult>,
    /// The scope the batch was under (null: each key's own fence).
    #[schema(value_type = Option<String>, required = true)]
    scope: Option<Scope>,
}

/// What one op of a batch did.
#[derive(Serialize, ToSchema)]
pub struct OpResult {
    /// The kv key, or a table op's canonical row key.
    key: String,
    /// put, delete (or patch for a table op).
    op: &'static str,
    /// A table op's resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    resource: Option<String>,
    /// What the op alone would have answered: 201 created, 200 otherwise.
    status: u16,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

#[utoipa::path(
    operation_id = "batch",
    post,
    path = super::routes::BATCH,
    tag = "kv",
    summary = "Several writes under one token: all or nothing",
    params(Token, ScopeHeader, Proof, IdemKey),
    request_body(content = BatchRequest, content_type = "application/json"),
    responses((status = 200, description = "Every op applied", body = BatchDone), doc::Batch)
)]
pub async fn batch(
    actor: Actor,
    State(state): State<AppState>,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
    body: KeyedJson<BatchRequest>,
) -> Result<Accepted<Response>, ApiError> {
    let ops = parse_ops(&state, body.value)?;
    // `write` on every op's key (or table) and on the batch's effective scope, before anything
    // is written: one refused op refuses the batch.
    for op in &ops {
        match op {
            Op::Kv(write) => check(&actor, Right::Write, Named::Key, write.key().as_str())?,
            Op::Row(op) => check_table(&actor, Right::Write, &op.resource.name)?,
        }
    }
    let (scope, mismatch) = batch_scope(&state, &ops, scope.0);
    if let Some(scope) = &scope {
        check(&actor, Right::Write, Named::Scope, scope.as_str())?;
        state.issuers.check(scope, token.0, proof.bytes())?;
    }
    if let Some(mismatch) = mismatch {
        // Refused in the verdict's order: the batch's scope's fence first, under the rule the
        // store would claim it with (the strictest of its ops' rules, kv's only if it has kv ops).
        let rule = Rule::strictest(ops.iter().map(|op| match op {
            Op::Kv(_) => state.kv.rule(),
            Op::Row(r) => r.resource.rule,
        }));
        let guard = Guard {
            token: token.0,
            target: scope.map_or(Target::Key, Target::Scope),
            rule,
        };
        return Err(super::binding::refused(&state, &guard, mismatch).await);
    }
    if ops.iter().any(|op| matches!(op, Op::Row(_))) {
        let pending = idem.0.map(|p| (p, &actor, body.digest));
        return batch_tables(&state, token, scope, ops, pending).await;
    }
    let writes: Vec<Write> = ops
        .into_iter()
        .filter_map(|op| if let Op::Kv(w) = op { Some(w) } else { None })
        .collect();
    let guard = guard(&state, token, scope);
    let (token, scope) = (guard.token, guard.scope().cloned());
    let Some(pending) = idem.0 else {
        let written = accepted(state.store.batch(&writes, &guard).await?)?;
        return Ok(Accepted(respond(
            kv_answer(token, scope, &writes, &written),
            false,
        )));
    };
    let render = {
        let (writes, scope) = (writes.clone(), scope.clone());
        Render::new(move |done| match done {
            Done::Kv(written) => kv_answer(token, scope.clone(), &writes, written),
            _ => unreachable!("a kv batch is kept as one"),
        })
    };
    let keep = pending.keep(&state, &actor, body.digest, render);
    // Boxed, so that an unkeyed batch's future does not carry the keyed path's state (kv::put).
    let keyed = Box::pin(state.store.batch_keyed(&writes, &guard, &keep)).await?;
    finish(keyed, |written| kv_answer(token, scope, &writes, written))
}

/// The answer to an applied kv batch.
fn kv_answer(
    token: FencingToken,
    scope: Option<Scope>,
    writes: &[Write],
    written: &[Written],
) -> Answer {
    json_answer(
        StatusCode::OK,
        &BatchDone {
            fence_token: token,
            results: op_results(writes, written),
            scope,
        },
    )
}

/// The one scope a batch is under: the header's if sent, else the scope its bound keys and
/// tables share (`[[scopes]]`, a resource's `scope`), else none; and the first op bound to
/// another scope, if any (a mismatch: a batch has one token, and tokens of different scopes are
/// never compared). Unbound keys in a batch are written under the batch's scope, as with the
/// header.
fn batch_scope(
    state: &AppState,
    ops: &[Op],
    header: Option<Scope>,
) -> (Option<Scope>, Option<ScopeMismatch>) {
    let bound = |op: &Op| match op {
        Op::Kv(write) => state.bindings.of(write.key().as_str()).cloned(),
        Op::Row(op) => op.resource.scope.clone(),
    };
    let scope = header.or_else(|| ops.iter().find_map(bound));
    let mismatch = ops.iter().find_map(|op| {
        match op {
            Op::Kv(write) => state.bindings.resolve(write.key(), scope.clone()),
            Op::Row(op) => table_scope(&op.resource, &op.key, scope.clone()),
        }
        .err()
    });
    (scope, mismatch)
}

/// A batch with table ops: kv and table writes in one transaction.
async fn batch_tables(
    state: &AppState,
    token: Token,
    scope: Option<Scope>,
    ops: Vec<Op>,
    idem: Option<(Pending, &Actor, Option<[u8; 32]>)>,
) -> Result<Accepted<Response>, ApiError> {
    let guard = Guard {
        token: token.0,
        target: scope.clone().map_or(Target::Key, Target::Scope),
        rule: state.kv.rule(),
    };
    let token = token.0;
    let Some((pending, actor, digest)) = idem else {
        let written = accepted(state.store.batch_tables(&ops, &guard).await?)?;
        return Ok(Accepted(respond(
            mixed_answer(token, scope, &ops, &written),
            false,
        )));
    };
    let render = {
        let (ops, scope) = (ops.clone(), scope.clone());
        Render::new(move |done| match done {
            Done::Mixed(written) => mixed_answer(token, scope.clone(), &ops, written),
            _ => unreachable!("a batch with table ops is kept as one"),
        })
    };
    let keep = pending.keep(state, actor, digest, render);
    // Boxed, as above.
    let keyed = Box::pin(state.store.batch_tables_keyed(&ops, &guard, &keep)).await?;
    finish(keyed, |written| mixed_answer(token, scope, &ops, written))
}

/// The answer to an applied batch with table ops.
fn mixed_answer(
    token: FencingToken,
    scope: Option<Scope>,
    ops: &[Op],
    (kv_written, rows_written): &BatchWritten,
) -> Answer {
    // kv results as for a kv-only batch, then interleaved with the table results in request order.
    let kv: Vec<Write> = ops
        .iter()
        .filter_map(|op| {
            if let Op::Kv(w) = op {
                Some(w.clone())
            } else {
                None
            }
        })
        .collect();
    let rows = ops
        .iter()
        .filter_map(|op| if let Op::Row(r) = op { Some(r) } else { None });
    let mut kv_results = op_results(&kv, kv_written).into_iter();
    let mut row_results = rows
        .zip(rows_written)
        .map(|(op, written)| row_result(op, written));
    let results: Vec<OpResult> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Kv(_) => kv_results.next(),
            Op::Row(_) => row_results.next(),
        })
        .collect();
    json_answer(
        StatusCode::OK,
        &BatchDone {
            fence_token: token,
            results,
            scope,
        },
    )
}

fn row_result(op: &TableOp, written: &RowWritten) -> OpResult {
    let status = match op.write {
        RowWrite::Put(_) if !written.existed => 201,
        _ => 200,
    };
    OpResult {
        key: written.key.clone(),
        op: op.write.op(),
        resource: Some(op.resource.name.clone()),
        status,
    }
}

fn parse_ops(state: &AppState, request: BatchRequest) -> Result<Vec<Op>, ApiError> {
    let (max_key_bytes, max_ops) = (state.kv.max_key_bytes, state.kv.max_batch_ops);
    if request.ops.is_empty() {
        return Err(ApiError::InvalidBatch(
            "\"ops\" is empty; send at least one operation".into(),
        ));
    }
    if request.ops.len() > max_ops {
        return Err(ApiError::InvalidBatch(format!(
            "{} operations; at most {max_ops} are allowed in one batch (kv.max_batch_ops)",
            request.ops.len()
        )));
    }
    request
        .ops
        .into_iter()
        .enumerate()
        .map(|(i, op)| {
            if op.resource.is_some() {
                return parse_table_op(state, i, op).map(Op::Row);
            }
            if op.row.is_some() {
                return Err(ApiError::InvalidBatch(format!(
                    "ops[{i}]: \"row\" belongs to a table op, which also names its \"resource\"; a kv op takes \"value\""
                )));
            }
            let key = Key::parse(&op.key, max_key_bytes)
                .map_err(|e| ApiError::InvalidBatch(format!("ops[{i}]: the key {e}")))?;
            let write = match (op.op.as_str(), op.value) {
                ("put", Some(value)) => {
                    let value = Document::new(value)
                        .map_err(|e| ApiError::InvalidBatch(format!("ops[{i}]: {e}")))?;
                    Ok(Write::Put { key, value })
                }
                ("put", None) => Err(ApiError::InvalidBatch(format!("ops[{i}]: a put needs a \"value\""))),
                ("delete", None) => Ok(Write::Delete { key }),
                ("delete", Some(_)) => Err(ApiError::InvalidBatch(format!("ops[{i}]: a delete takes no \"value\""))),
                (other, _) => Err(ApiError::InvalidBatch(format!(
                    "ops[{i}]: unknown op {other:?}; use \"put\" or \"delete\""
                ))),
            };
            write.map(Op::Kv)
        })
        .collect()
}

/// `{"op": "put"|"patch"|"delete", "resource": "orders", "key": "42,EU", "row": {...}}`.
fn parse_table_op(state: &AppState, i: usize, op: OpRequest) -> Result<TableOp, ApiError> {
    let name = op.resource.as_deref().unwrap_or_default();
    let resource = super::tables::resource(state, name).map_err(|e| match e {
        ApiError::NotFound(detail) => ApiError::NotFound(format!("ops[{i}]: {detail}")),
        other => other,
    })?;
    if op.value.is_some() {
        return Err(ApiError::InvalidBatch(format!(
            "ops[{i}]: a table op takes \"row\" (the columns), not \"value\""
        )));
    }
    let key = RowKey::parse(&resource, &op.key, state.kv.max_key_bytes).map_err(|e| e.in_op(i))?;
    let write = match (op.op.as_str(), op.row) {
        ("put", Some(row)) => {
            RowWrite::Put(resource.check_row(row, false).map_err(|e| e.in_op(i))?)
        }
        ("patch", Some(row)) => {
            RowWrite::Patch(resource.check_row(row, true).map_err(|e| e.in_op(i))?)
        }
        ("put" | "patch", None) => {
            return Err(ApiError::InvalidBatch(format!(
                "ops[{i}]: a table {} needs a \"row\" object",
                op.op
            )))
        }
        ("delete", None) => RowWrite::Delete,
        ("delete", Some(_)) => {
            return Err(ApiError::InvalidBatch(format!(
                "ops[{i}]: a delete takes no \"row\""
            )))
        }
        (other, _) => {
            return Err(ApiError::InvalidBatch(format!(
                "ops[{i}]: unknown table op {other:?}; use \"put\", \"patch\" or \"delete\""
            )))
        }
    };
    Ok(TableOp {
        resource,
        key,
        write,
    })
}

/// Per-op statuses, as if the ops ran one after another: a put is 201 when its key was not live
/// just before it (absent, deleted before the batch, or deleted earlier in the batch), else 200.
fn op_results(writes: &[Write], written: &[Written]) -> Vec<OpResult> {
    let mut live: std::collections::HashMap<&Key, bool> =
        written.iter().map(|w| (&w.key, w.was_live)).collect();
    writes
        .iter()
        .map(|write| {
            let key = write.key();
            let was_live = live.get(key).copied().unwrap_or(false);
            let (op, status, now_live) = match write {
                Write::Put { .. } => ("put", if was_live { 200 } else { 201 }, true),
                Write::Delete { .. } => ("delete", 200, false),
            };
            live.insert(key, now_live);
            OpResult {
                key: key.as_str().to_owned(),
                op,
                resource: None,
                status,
            }
        })
        .collect()
}
