//! What the console shows, read from PostgreSQL: the built-in locks, the most recently raised
//! scope fences, the newest refusals, and the guarded tables' unfenced writes (see
//! `store::overview` for the bounds and the cost).

use sqlx::Row;

use super::PgStore;
use crate::store::{
    backend::OverviewStore,
    decode::overview_from,
    overview::{Overview, UnfencedView, MAX_FENCES, MAX_LOCKS, MAX_REFUSALS},
    StoreError,
};

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

/// One row per configured resource that saw an unfenced write (as many as `[[resources]]` at
/// most: rows for anything else are never shown).
const UNFENCED: &str = "
    SELECT u.resource, u.writes, to_char(u.last_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), u.last_role
    FROM fencegate_unfenced u JOIN fencegate_guards g USING (resource) ORDER BY u.resource";

impl OverviewStore for PgStore {
    async fn overview(&self) -> Result<Overview, StoreError> {
        let mut conn = self.conns.take().await?;
        let locks = sqlx::query(LOCKS)
            .bind(MAX_LOCKS)
            .fetch_all(&mut *conn)
            .await?;
        let fences = sqlx::query(FENCES)
            .bind(MAX_FENCES)
            .fetch_all(&mut *conn)
            .await?;
        let refusals = sqlx::query(super::refusals::SELECT)
            .bind(MAX_REFUSALS)
            .fetch_all(&mut *conn)
            .await?;
        let unfenced = sqlx::query(UNFENCED).fetch_all(&mut *conn).await?;
        conn.done();
        let mut overview = overview_from(locks, fences, refusals)?;
        overview.unfenced = unfenced
            .iter()
            .map(|row| {
                Ok(UnfencedView {
                    resource: row.try_get(0)?,
                    writes: row.try_get(1)?,
                    last_at: row.try_get(2)?,
                    last_role: row.try_get(3)?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(overview)
    }
}
