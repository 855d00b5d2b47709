//! Values read back from either backend, checked on the way in: a token the database holds is
//! still a [`FencingToken`] (never negative), and a row of a query both backends share is
//! decoded once, for both.

use super::StoreError;
use crate::fence::FencingToken;

/// A token as the database holds it; a negative one means the database was written by
/// something other than fencegate (or is corrupt), never a token to act on.
pub(crate) fn token_from_db(value: i64) -> Result<FencingToken, StoreError> {
    FencingToken::from_db(value).ok_or_else(|| StoreError::Corrupt(format!("negative fence token {value}")))
}

/// A scope's fence and the latest token granted by the built-in lock of that name.
pub(crate) type ScopeState = (Option<FencingToken>, Option<FencingToken>);

/// Decodes a row of [`super::SCOPE_STATE`].
pub(crate) fn scope_state_from((fence, latest): (Option<i64>, Option<i64>)) -> Result<ScopeState, StoreError> {
    Ok((fence.map(token_from_db).transpose()?, latest.map(token_from_db).transpose()?))
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
