//! `POST /v1/batch`: several kv writes under one token, all or nothing.

use axum::{extract::State, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{
    extract::{JsonBody, ScopeHeader, Token},
    kv::guard,
    problem::ApiError,
    AppState,
};
use crate::{
    fence::{Key, Outcome},
    store::{Write, Written},
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    ops: Vec<OpRequest>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpRequest {
    op: String,
    key: String,
    // `Option<Value>` cannot tell a missing value from `null`; a JSON null is a legal value.
    #[serde(default, deserialize_with = "present")]
    value: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

pub async fn batch(
    State(state): State<AppState>,
    token: Token,
    scope: ScopeHeader,
    JsonBody(request): JsonBody<BatchRequest>,
) -> Result<Json<Value>, ApiError> {
    let writes = parse_ops(request, state.kv.max_key_bytes, state.kv.max_batch_ops)?;
    let guard = guard(&state, token, scope);
    let written = match state.store.batch(&writes, &guard).await? {
        Outcome::Accepted(written) => written,
        Outcome::Stale(stale) => return Err(ApiError::Stale(stale)),
    };
    Ok(Json(json!({
        "fence_token": guard.token,
        "scope": guard.scope(),
        "results": op_results(&writes, &written),
    })))
}

fn parse_ops(request: BatchRequest, max_key_bytes: usize, max_ops: usize) -> Result<Vec<Write>, ApiError> {
    if request.ops.is_empty() {
        return Err(ApiError::InvalidBatch("\"ops\" is empty; send at least one operation".into()));
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
            let key = Key::parse(&op.key, max_key_bytes)
                .map_err(|e| ApiError::InvalidBatch(format!("ops[{i}]: the key {e}")))?;
            match (op.op.as_str(), op.value) {
                ("put", Some(value)) => {
                    crate::store::check_storable(&value)
                        .map_err(|e| ApiError::InvalidBatch(format!("ops[{i}]: {e}")))?;
                    Ok(Write::Put { key, value })
                }
                ("put", None) => Err(ApiError::InvalidBatch(format!("ops[{i}]: a put needs a \"value\""))),
                ("delete", None) => Ok(Write::Delete { key }),
                ("delete", Some(_)) => Err(ApiError::InvalidBatch(format!("ops[{i}]: a delete takes no \"value\""))),
                (other, _) => Err(ApiError::InvalidBatch(format!(
                    "ops[{i}]: unknown op {other:?}; use \"put\" or \"delete\""
                ))),
            }
        })
        .collect()
}

/// Per-op statuses, as if the ops ran one after another: a put is 201 when its key was not live
/// just before it (absent, deleted before the batch, or deleted earlier in the batch), else 200.
fn op_results(writes: &[Write], written: &[Written]) -> Vec<Value> {
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
            json!({"op": op, "key": key, "status": status})
        })
        .collect()
}
