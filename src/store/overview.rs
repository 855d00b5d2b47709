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
//!
//! The statements are in `pg/overview.rs` and `sqlite/overview.rs`; rows are decoded by
//! `decode::overview_from`.

use serde::Serialize;

use super::{Store, StoreError};
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
        let overview = detached!(self, b => b.overview().await)?;
        *latest = Some((std::time::Instant::now(), overview.clone()));
        Ok(overview)
    }
}

/// What the console shows from the database (`overview.rs`).
pub(in crate::store) trait OverviewStore {
    async fn overview(&self) -> Result<Overview, StoreError>;
}
