//! Values read back from either backend, checked on the way in: a token the database holds is
//! still a [`FencingToken`] (never negative), and a row of a query both backends share is
//! decoded once, for both.

use serde_json::{json, Value};

use super::{
    admin::AuditEntry,
    overview::{FenceView, LockView, Overview},
    StoreError,
};
use crate::fence::FencingToken;

/// A token as the database holds it; a negative one means the database was written by
/// something other than fencegate (or is corrupt), never a token to act on.
pub(crate) fn token_from_db(value: i64) -> Result<FencingToken, StoreError> {
    FencingToken::from_db(value)
        .ok_or_else(|| StoreError::Corrupt(format!("negative fence token {value}")))
}

/// A scope's fence and the latest token granted by the built-in lock of that name.
pub(crate) type ScopeState = (Option<FencingToken>, Option<FencingToken>);

/// Decodes a row of [`super::SCOPE_STATE`].
pub(crate) fn scope_state_from(
    (fence, latest): (Option<i64>, Option<i64>),
) -> Result<ScopeState, StoreError> {
    Ok((
        fence.map(token_from_db).transpose()?,
        latest.map(token_from_db).transpose()?,
    ))
}

/// A [`Holder`](crate::locks::Holder) from a row of either backend's holder query: owner, the
/// lease's remaining milliseconds, token, actor.
pub(crate) fn holder_from<R>(row: &R) -> Result<crate::locks::Holder, StoreError>
where
    R: sqlx::Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(crate::locks::Holder {
        owner: row.try_get(0)?,
        remaining_ms: row.try_get(1)?,
        token: token_from_db(row.try_get(2)?)?,
        actor: row.try_get(3)?,
    })
}

/// One audit row from `AUDIT_SELECT` (either backend's row type).
pub(crate) fn audit_entry<'r, R: sqlx::Row>(row: &'r R) -> Result<AuditEntry, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(AuditEntry {
        id: row.try_get::<i64, _>(0)?.to_string(),
        at: row.try_get(1)?,
        actor: row.try_get(2)?,
        action: row.try_get(3)?,
        target: row.try_get(4)?,
        name: row.try_get(5)?,
        resource: row.try_get(6)?,
        from: token_from_db(row.try_get(7)?)?,
        to: token_from_db(row.try_get(8)?)?,
        from_scope: row.try_get(9)?,
        to_scope: row.try_get(10)?,
        reason: row.try_get(11)?,
    })
}

/// Rows of (name, owner, token, expires_at text, remaining ms) and (scope, fence, updated_at text).
pub(crate) fn overview_from<R: sqlx::Row>(
    locks: Vec<R>,
    fences: Vec<R>,
    refusals: Vec<R>,
) -> Result<Overview, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let refusals = refusals
        .iter()
        .map(refusal_json)
        .collect::<Result<_, StoreError>>()?;
    let locks = locks
        .iter()
        .map(|row| {
            Ok(LockView {
                name: row.try_get(0)?,
                holder: row.try_get(1)?,
                token: token_from_db(row.try_get(2)?)?,
                expires_at: row.try_get(3)?,
                remaining_ms: row.try_get(4)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    let fences = fences
        .iter()
        .map(|row| {
            Ok(FenceView {
                scope: row.try_get(0)?,
                fence_token: token_from_db(row.try_get(1)?)?,
                updated_at: row.try_get(2)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Overview {
        locks,
        fences,
        refusals,
        unfenced: Vec::new(),
    })
}

/// A row of a backend's refusal `SELECT` as JSON: the live event's fields, plus `at` (the database's clock) and
/// the record's `id`. Tokens as strings, as everywhere.
pub(crate) fn refusal_json<'r, R: sqlx::Row>(row: &'r R) -> Result<Value, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let token = |v: Option<i64>| v.map(|t| t.to_string());
    let kind: String = row.try_get(3)?;
    let mut value = json!({
        "type": "refusal",
        "id": row.try_get::<i64, _>(0)?,
        "at": row.try_get::<String, _>(1)?,
        "uid": row.try_get::<String, _>(2)?,
        "kind": kind,
        "op": row.try_get::<String, _>(4)?,
        "route": row.try_get::<Option<String>, _>(5)?,
        "key": row.try_get::<Option<String>, _>(6)?,
        "resource": row.try_get::<Option<String>, _>(7)?,
        "scope": row.try_get::<Option<String>, _>(8)?,
        "presented_token": token(row.try_get(10)?),
        "current_token": token(row.try_get(11)?),
        "keys": row.try_get::<i64, _>(12)?,
        "actor": row.try_get::<Option<String>, _>(13)?,
        "request_id": row.try_get::<Option<String>, _>(14)?,
        "detail": row.try_get::<Option<String>, _>(15)?,
        "at_ms": row.try_get::<i64, _>(16)?,
    });
    if kind == "scope_mismatch" {
        value["presented_scope"] = json!(row.try_get::<Option<String>, _>(9)?);
    }
    Ok(value)
}
