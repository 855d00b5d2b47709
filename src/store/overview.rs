//! What the console shows from the database (shared by every process serving it): the built-in
//! locks and the most recently raised scope fences, each list bounded. Times are the
//! database's clock; `remaining_ms` is computed by the database, so a page can count a lease
//! down from it without trusting its own clock.
//!
//! Both lists scan their table (no index is kept for them: an index on `updated_at` would be
//! rewritten by every scoped write, to serve an admin page). So the cost is bounded per process
//! instead: one query at a time, and an answer at most [`FRESH_FOR`] old is served again
//! (a database with 476,000 scopes took 160-180 ms a call, and 16 clients asking in a loop
//! held the writers back). Any number of consoles cost one scan per second.

use serde::Serialize;

use super::{token_from_db, Store, StoreError};
use crate::fence::FencingToken;

/// Locks listed at most.
pub const MAX_LOCKS: i64 = 100;
/// Scope fences listed at most.
pub const MAX_FENCES: i64 = 50;
/// How long an overview is served again instead of asking the database.
pub const FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The last overview and when it was read; the lock is held while one is read, so callers
/// that come meanwhile wait for it rather than run their own.
#[derive(Default)]
pub(crate) struct Latest(tokio::sync::Mutex<Option<(std::time::Instant, Overview)>>);

/// A built-in lock that is held, or whose lease lapsed without a release.
#[derive(Debug, Clone, Serialize)]
pub struct LockView {
    pub name: String,
    pub holder: String,
    pub token: FencingToken,
    /// RFC 3339, UTC.
    pub expires_at: String,
    /// 0 once lapsed.
    pub remaining_ms: i64,
}

/// A scope's fence.
#[derive(Debug, Clone, Serialize)]
pub struct FenceView {
    pub scope: String,
    pub fence_token: FencingToken,
    /// When it was last raised (RFC 3339, UTC).
    pub updated_at: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    /// Live leases first (by name), then lapsed ones (newest grant first).
    pub locks: Vec<LockView>,
    /// Most recently raised first.
    pub fences: Vec<FenceView>,
    /// The newest refused writes of every process (`store::refusals`), newest first.
    pub refusals: Vec<serde_json::Value>,
    /// Writes to guarded tables without `fencegate.fence()` (audit mode), by resource
    /// (PostgreSQL; empty on SQLite, which has no legacy tables).
    pub unfenced: Vec<UnfencedView>,
}

/// A guarded table's unfenced writes.
#[derive(Debug, Clone, Serialize)]
pub struct UnfencedView {
    pub resource: String,
    pub writes: i64,
    /// RFC 3339, UTC.
    pub last_at: String,
    pub last_role: String,
}

/// Refused writes listed at most.
pub const MAX_REFUSALS: i64 = 50;

impl Store {
    /// The locks and fences, at most [`FRESH_FOR`] old.
    pub async fn overview(&self) -> Result<Overview, StoreError> {
        let mut latest = self.overview.0.lock().await;
        if let Some((at, overview)) = latest.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return Ok(overview.clone());
            }
        }
        let backend = self.backend.clone();
        let overview = super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.overview().await,
                super::Backend::Sqlite(db) => db.overview().await,
            }
        })
        .await?;
        *latest = Some((std::time::Instant::now(), overview.clone()));
        Ok(overview)
    }
}

/// Rows of (name, owner, token, expires_at text, remaining ms) and (scope, fence, updated_at text).
fn overview_from<R: sqlx::Row>(locks: Vec<R>, fences: Vec<R>, refusals: Vec<R>) -> Result<Overview, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let refusals = refusals.iter().map(super::refusals::refusal_json).collect::<Result<_, StoreError>>()?;
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
            Ok(FenceView { scope: row.try_get(0)?, fence_token: token_from_db(row.try_get(1)?)?, updated_at: row.try_get(2)? })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Overview { locks, fences, refusals, unfenced: Vec::new() })
}

mod pg {
    use sqlx::Row;

    use super::*;
    use crate::store::postgres::PgStore;

    const LOCKS: &str = "
        SELECT name, owner, token, expires, remaining FROM (
            SELECT name, owner, token, granted_at,
                   to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"') AS expires,
                   GREATEST(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint AS remaining
            FROM fencegate_locks WHERE owner IS NOT NULL) AS l
        ORDER BY remaining = 0, CASE WHEN remaining > 0 THEN name END, granted_at DESC LIMIT $1";

    const FENCES: &str = "
        SELECT scope, fence_token, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
        FROM fencegate_fences ORDER BY updated_at DESC, scope LIMIT $1";

    /// One row per guarded resource that saw an unfenced write (a handful at most).
    const UNFENCED: &str = "
        SELECT resource, writes, to_char(last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), last_role
        FROM fencegate_unfenced ORDER BY resource";

    impl PgStore {
        pub(crate) async fn overview(&self) -> Result<Overview, StoreError> {
            let mut conn = self.conns.take().await?;
            let locks = sqlx::query(LOCKS).bind(MAX_LOCKS).fetch_all(&mut *conn).await?;
            let fences = sqlx::query(FENCES).bind(MAX_FENCES).fetch_all(&mut *conn).await?;
            let refusals = sqlx::query(&crate::store::refusals::select_pg()).bind(MAX_REFUSALS).fetch_all(&mut *conn).await?;
            let unfenced = sqlx::query(UNFENCED).fetch_all(&mut *conn).await?;
            conn.done();
            let mut overview = overview_from(locks, fences, refusals)?;
            overview.unfenced = unfenced
                .iter()
                .map(|row| {
                    Ok(UnfencedView { resource: row.try_get(0)?, writes: row.try_get(1)?, last_at: row.try_get(2)?, last_role: row.try_get(3)? })
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(overview)
        }
    }
}

mod sqlite {
    use super::*;
    use crate::store::sqlite::SqliteStore;

    const LOCKS: &str = "
        SELECT name, owner, token, expires, remaining FROM (
            SELECT name, owner, token, granted_at,
                   strftime('%Y-%m-%dT%H:%M:%fZ', expires_at_ms / 1000.0, 'unixepoch') AS expires,
                   max(0, expires_at_ms - CAST(unixepoch('subsec') * 1000 AS INTEGER)) AS remaining
            FROM fencegate_locks WHERE owner IS NOT NULL) AS l
        ORDER BY remaining = 0, CASE WHEN remaining > 0 THEN name END, granted_at DESC LIMIT $1";

    const FENCES: &str = "
        SELECT scope, fence_token, updated_at FROM fencegate_fences ORDER BY updated_at DESC, scope LIMIT $1";

    impl SqliteStore {
        pub(crate) async fn overview(&self) -> Result<Overview, StoreError> {
            let locks = sqlx::query(LOCKS).bind(MAX_LOCKS).fetch_all(&self.pool).await?;
            let fences = sqlx::query(FENCES).bind(MAX_FENCES).fetch_all(&self.pool).await?;
            let refusals =
                sqlx::query(&crate::store::refusals::select_sqlite()).bind(MAX_REFUSALS).fetch_all(&self.pool).await?;
            overview_from(locks, fences, refusals)
        }
    }
}
