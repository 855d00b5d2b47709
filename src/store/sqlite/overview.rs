//! What the console shows, read from SQLite: the built-in locks, the most recently raised
//! scope fences and the newest refusals (see `store::overview` for the bounds and the cost).
//! Leases are kept in milliseconds on this machine's clock, and `updated_at` is RFC 3339 text
//! already (SQLite has no timestamp type).

use super::SqliteStore;
use crate::store::{
    backend::OverviewStore,
    decode::overview_from,
    overview::{Overview, MAX_FENCES, MAX_LOCKS, MAX_REFUSALS},
    StoreError,
};

const LOCKS: &str = "
    SELECT name, owner, token, expires, remaining FROM (
        SELECT name, owner, token, granted_at,
               strftime('%Y-%m-%dT%H:%M:%fZ', expires_at_ms / 1000.0, 'unixepoch') AS expires,
               max(0, expires_at_ms - CAST(unixepoch('subsec') * 1000 AS INTEGER)) AS remaining
        FROM fencegate_locks WHERE owner IS NOT NULL) AS l
    ORDER BY remaining = 0, CASE WHEN remaining > 0 THEN name END, granted_at DESC LIMIT $1";

const FENCES: &str = "
    SELECT scope, fence_token, updated_at FROM fencegate_fences ORDER BY updated_at DESC, scope LIMIT $1";

impl OverviewStore for SqliteStore {
    /// No unfenced writes to show: SQLite has no legacy tables, so no guard triggers.
    async fn overview(&self) -> Result<Overview, StoreError> {
        let locks = sqlx::query(LOCKS)
            .bind(MAX_LOCKS)
            .fetch_all(&self.pool)
            .await?;
        let fences = sqlx::query(FENCES)
            .bind(MAX_FENCES)
            .fetch_all(&self.pool)
            .await?;
        let refusals = sqlx::query(super::refusals::SELECT)
            .bind(MAX_REFUSALS)
            .fetch_all(&self.pool)
            .await?;
        overview_from(locks, fences, refusals)
    }
}
