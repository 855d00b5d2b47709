//! `/v1/kv/{key}`: fenced single-key writes and reads. Thin: parse, call the store, answer.

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
    extract::{KeyPath, Proof, ScopeHeader, Token},
    idempotency::{finish, json_answer, json_text_answer, respond, IdemKey, KeyedJson, Render},
    problem::{accepted, ApiError},
    report::Accepted,
    AppState,
};
use crate::{
    auth::{Actor, Right},
    fence::{FencingToken, Guard, Key, Scope, Target},
    store::{Answer, Document, Done, Write, Written},
};

/// Builds the guard for a kv write under `scope` (already resolved against the bindings):
/// the scope's fence, or the key's own.
pub(super) fn guard(state: &AppState, token: Token, scope: Option<Scope>) -> Guard {
    Guard {
        token: token.0,
        target: scope.map_or(Target::Key, Target::Scope),
        rule: state.kv.rule(),
    }
}

/// The guard of a write to `key`: under the key's bound scope if `[[scopes]]` binds it, else
/// under the header's scope, if any. The actor needs `write` on the key and on that scope (the
/// effective one, so a binding is no way around it), and the write the proof an issuer of that
/// scope requires. A header that contradicts the binding is refused in the verdict's order
/// (`binding`), after the same checks on the presented scope.
async fn key_guard(
    state: &AppState,
    actor: &Actor,
    key: &Key,
    token: Token,
    scope: ScopeHeader,
    proof: &Proof,
) -> Result<Guard, ApiError> {
    check(actor, Right::Write, Named::Key, key.as_str())?;
    let (guard, mismatch) = match state.bindings.resolve(key, scope.0.clone()) {
        Ok(effective) => (guard(state, token, effective), None),
        Err(mismatch) => (guard(state, token, scope.0), Some(mismatch)),
    };
    if let Some(scope) = guard.scope() {
        check(actor, Right::Write, Named::Scope, scope.as_str())?;
    }
    proof.check(state, &guard)?;
    match mismatch {
        // Boxed: a rare path, whose future would otherwise make every PUT's ~2 KB larger.
        Some(mismatch) => Err(Box::pin(super::binding::refused(state, &guard, mismatch)).await),
        None => Ok(guard),
    }
}

// Response bodies as structs rather than `json!`: built straight into the response buffer
// instead of through a map of owned `Value`s (~4% of a lone PUT's instructions), and described
// by the OpenAPI document as they are. Fields in alphabetical order, as `json!` wrote them.

/// The body of an accepted PUT, as the OpenAPI document describes it; the handler writes the
/// same bytes out by hand ([`written_body`]).
#[derive(Serialize, ToSchema)]
pub struct KvWritten<'a> {
    fence_token: FencingToken,
    #[schema(value_type = String)]
    key: &'a Key,
    /// The scope the write was under (null: the key's own fence).
    #[schema(value_type = Option<String>, required = true)]
    scope: Option<&'a Scope>,
    version: i64,
}

/// The body of an accepted DELETE.
#[derive(Serialize, ToSchema)]
pub struct KvDeleted<'a> {
    /// Always true.
    deleted: bool,
    fence_token: FencingToken,
    #[schema(value_type = String)]
    key: &'a Key,
    /// The scope the write was under (null: the key's own fence).
    #[schema(value_type = Option<String>, required = true)]
    scope: Option<&'a Scope>,
}

/// The body of a GET.
#[derive(Serialize, ToSchema)]
pub struct KvRead<'a> {
    fence_token: FencingToken,
    #[schema(value_type = String)]
    key: &'a Key,
    /// The scope of the last write (null: the key's own fence).
    #[schema(required = true)]
    scope: Option<&'a str>,
    /// RFC 3339, the database's clock.
    updated_at: &'a str,
    /// The value, any JSON.
    #[schema(value_type = Value)]
    value: &'a serde_json::Value,
    version: i64,
}

#[utoipa::path(
    operation_id = "kv_put",
    put,
    path = super::routes::KV,
    tag = "kv",
    summary = "Write a value, fenced by the token (and the scope, if any)",
    params(KeyPath, Token, ScopeHeader, Proof, IdemKey),
    request_body(content = serde_json::Value, description = "The value: any JSON document", content_type = "application/json"),
    responses(
        (status = 201, description = "Created: the key was absent or deleted", body = KvWritten),
        (status = 200, description = "Updated", body = KvWritten),
        doc::KvPut
    )
)]
// One argument per extractor: the request's parts, each parsed and refused on its own.
#[allow(clippy::too_many_arguments)]
pub async fn put(
    actor: Actor,
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
    body: KeyedJson<Box<serde_json::value::RawValue>>,
) -> Result<Accepted<Response>, ApiError> {
    // Checked, not parsed: the text goes to the database as sent (`Document`).
    let value = Document::new(body.value).map_err(ApiError::InvalidJson)?;
    let guard = key_guard(&state, &actor, &key, token, scope, &proof).await?;
    let (token, scope) = (guard.token, guard.scope().cloned());
    let Some(pending) = idem.0 else {
        let written = accepted(state.store.write(Write::Put { key, value }, &guard).await?)?;
        return Ok(Accepted(respond(
            put_answer(token, scope.as_ref(), &written),
            false,
        )));
    };
    let render = {
        let scope = scope.clone();
        Render::new(move |done| match done {
            Done::Kv([written, ..]) => put_answer(token, scope.as_ref(), written),
            _ => unreachable!("a kv write is kept as a batch of one"),
        })
    };
    let keep = pending.keep(&state, &actor, body.digest, render);
    // Boxed: axum moves every request's handler future into a box, so state held across this
    // await would make each write bigger, keyed or not (bench/RESULTS.md: +8.4k instructions
    // a plain PUT). Only a keyed write pays for this allocation.
    let keyed = Box::pin(
        state
            .store
            .write_keyed(Write::Put { key, value }, &guard, &keep),
    )
    .await?;
    finish(keyed, |written| put_answer(token, scope.as_ref(), written))
}

/// The answer to an accepted PUT: 201 if the key was absent or deleted, else 200.
fn put_answer(token: FencingToken, scope: Option<&Scope>, written: &Written) -> Answer {
    let status = if written.was_live {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    json_text_answer(
        status,
        written_body(token, &written.key, scope, written.version),
    )
}

/// [`KvWritten`]'s JSON, written out: the same bytes as `serde_json::to_vec` of it (a test holds
/// them equal), in about a third of the instructions, on the path of every accepted PUT (serde's
/// struct serializer spent about 1,100 per PUT on these four fields, callgrind). Strings go
/// through serde_json's own escaping.
fn written_body(token: FencingToken, key: &Key, scope: Option<&Scope>, version: i64) -> Vec<u8> {
    let texts = key.as_str().len() + scope.map_or(0, |scope| scope.as_str().len());
    let mut out = Vec::with_capacity(96 + texts);
    out.extend_from_slice(br#"{"fence_token":""#);
    out.extend_from_slice(itoa::Buffer::new().format(token.get()).as_bytes());
    out.extend_from_slice(br#"","key":"#);
    push_json_str(&mut out, key.as_str());
    out.extend_from_slice(br#","scope":"#);
    match scope {
        Some(scope) => push_json_str(&mut out, scope.as_str()),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(br#","version":"#);
    out.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
    out.push(b'}');
    out
}

/// `text` as a JSON string, escaped as serde_json escapes it.
fn push_json_str(out: &mut Vec<u8>, text: &str) {
    serde_json::to_writer(out, text).expect("a string serializes into a Vec");
}

/// The answer to an accepted DELETE.
fn delete_answer(token: FencingToken, scope: Option<&Scope>, written: &Written) -> Answer {
    let body = KvDeleted {
        deleted: true,
        fence_token: token,
        key: &written.key,
        scope,
    };
    json_answer(StatusCode::OK, &body)
}

#[utoipa::path(
    operation_id = "kv_delete",
    delete,
    path = super::routes::KV,
    tag = "kv",
    summary = "Delete a value; the tombstone keeps the fence",
    params(KeyPath, Token, ScopeHeader, Proof, IdemKey),
    responses((status = 200, description = "Deleted (also for a key never written)", body = KvDeleted), doc::KvDelete)
)]
pub async fn delete(
    actor: Actor,
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    token: Token,
    scope: ScopeHeader,
    proof: Proof,
    idem: IdemKey,
) -> Result<Accepted<Response>, ApiError> {
    let guard = key_guard(&state, &actor, &key, token, scope, &proof).await?;
    let (token, scope) = (guard.token, guard.scope().cloned());
    let Some(pending) = idem.0 else {
        let written = accepted(state.store.write(Write::Delete { key }, &guard).await?)?;
        return Ok(Accepted(respond(
            delete_answer(token, scope.as_ref(), &written),
            false,
        )));
    };
    let render = {
        let scope = scope.clone();
        Render::new(move |done| match done {
            Done::Kv([written, ..]) => delete_answer(token, scope.as_ref(), written),
            _ => unreachable!("a kv write is kept as a batch of one"),
        })
    };
    let keep = pending.keep(&state, &actor, None, render);
    // Boxed, as in `put`.
    let keyed = Box::pin(
        state
            .store
            .write_keyed(Write::Delete { key }, &guard, &keep),
    )
    .await?;
    finish(keyed, |written| {
        delete_answer(token, scope.as_ref(), written)
    })
}

#[utoipa::path(
    operation_id = "kv_get",
    get,
    path = super::routes::KV,
    tag = "kv",
    summary = "Read a value and its fence",
    params(KeyPath),
    responses(
        (status = 200, description = "The value", body = KvRead,
         headers(("X-Fencing-Token" = String, description = "The key's fence token"))),
        doc::KvGet
    )
)]
pub async fn get(
    actor: Actor,
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
) -> Result<Response, ApiError> {
    check(&actor, Right::Read, Named::Key, key.as_str())?;
    let Some(entry) = state.store.get(&key).await? else {
        return Err(ApiError::NotFound(format!(
            "no value for key {:?} (never written, or deleted)",
            key.as_str()
        )));
    };
    let body = KvRead {
        fence_token: entry.fence_token,
        key: &key,
        scope: entry.scope.as_deref(),
        updated_at: &entry.updated_at,
        value: &entry.value,
        version: entry.version,
    };
    let mut response = Json(body).into_response();
    super::extract::answer_token(response.headers_mut(), entry.fence_token);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PUT answer written out is byte for byte what serde writes for [`KvWritten`], the
    /// type the OpenAPI document describes: quotes, backslashes, non-ASCII and the largest
    /// numbers included.
    #[test]
    fn a_written_body_is_serdes_json_of_kv_written() {
        let longest = "x".repeat(512);
        let keys = [
            "k",
            "orders/42",
            r#"a"b\c"#,
            "é ✓ 日本 🦀",
            "</script>",
            longest.as_str(),
        ];
        let scopes = [None, Some("lock/a"), Some(r#"q"s\"#), Some("✓")];
        for key in keys {
            let key = Key::parse(key, 512).unwrap();
            for scope in scopes {
                let scope = scope.map(|s| Scope::parse(s, 512).unwrap());
                for (token, version) in [(0, 1), (7, 42), (i64::MAX, i64::MAX)] {
                    let token = FencingToken::from_db(token).unwrap();
                    let expected = serde_json::to_vec(&KvWritten {
                        fence_token: token,
                        key: &key,
                        scope: scope.as_ref(),
                        version,
                    })
                    .unwrap();
                    let written = written_body(token, &key, scope.as_ref(), version);
                    assert_eq!(
                        String::from_utf8(written).unwrap(),
                        String::from_utf8(expected).unwrap()
                    );
                }
            }
        }
    }
}
