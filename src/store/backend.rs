//! What the [`Store`](super::Store) asks of a database backend, and the one place it picks the
//! backend in use.
//!
//! [`Backend`] is split by feature, and each backend implements each part in the file of the
//! same name: [`KvStore`] in `pg/kv.rs` and `sqlite/kv.rs`, [`LockStore`] in `locks.rs`, and
//! so on. Each backend owns all of its SQL there; what they share is above them (the fence
//! rules' SQL spelling in `store::sql`, the refusal's explanation, row decoding, the pure
//! decisions of `store::admin`). A backend that cannot do something (SQLite has no legacy
//! tables, no replication) implements that part too, saying why, so a difference is written
//! where it is.
//!
//! Native `async fn` in traits: the facade calls them on the concrete backend (through
//! [`on_backend!`]), where the compiler sees that each future is `Send`, so the trait needs no
//! boxing and no `Send` bounds of its own.

use std::sync::Arc;

use serde_json::Value;

use super::{
    admin::{AuditEntry, Rebind, RebindDone, Reset, ResetDone, ResetRefused},
    decode::ScopeState,
    idempotency::{IdemId, Keep, Kept},
    overview::Overview,
    refusals::RefusalFilter,
    BatchOp, BatchWritten, Claimed, Entry, RowEntry, RowWritten, SqlSeen, StoreError, TableError,
    Write, Written,
};
use crate::{
    events::Event,
    fence::{FencingToken, Guard, HighWater, Key, Outcome, Scope},
    locks::{Acquired, Holder, Lease, Ttl},
    tables::{Resource, ResourceSettings, Resources, RowKey, TableOp},
};

/// The backend in use. An enum rather than a trait object: the set is closed and small, and
/// the trait's `async fn`s stay plain. Private to the store: every caller goes through
/// [`Store`](super::Store), so nothing can bypass the reject-only cache or the detaching of
/// database work.
#[derive(Clone)]
pub(super) enum AnyBackend {
    Postgres(super::pg::PgStore),
    /// The embedded default (no server needed): see `sqlite/mod.rs` for what differs.
    Sqlite(super::sqlite::SqliteStore),
}

/// Evaluates `$call` with `$b` bound to the backend in use: the only `match` on
/// [`AnyBackend`], so each facade method is written once for both backends.
macro_rules! on_backend {
    ($backend:expr, $b:ident => $call:expr) => {
        match $backend {
            $crate::store::backend::AnyBackend::Postgres($b) => $call,
            $crate::store::backend::AnyBackend::Sqlite($b) => $call,
        }
    };
}

/// [`on_backend!`] on a task of its own (see [`run_detached`](super::run_detached)): for
/// database work that must finish even if the request that started it goes away. What
/// `$call` uses must be owned (cloned) before the macro.
macro_rules! detached {
    ($self:ident, $b:ident => $call:expr) => {{
        let backend = $self.backend.clone();
        $crate::store::run_detached($self.give_up_after, async move {
            on_backend!(&backend, $b => $call)
        })
        .await
    }};
}

/// A database backend: every part below, plus how it is kept (`mod.rs` of each backend).
pub(super) trait Backend:
    KvStore
    + LockStore
    + AdminStore
    + OverviewStore
    + RefusalStore
    + TableStore
    + HighAvailability
    + IdempotencyStore
    + Clone
    + Send
    + Sync
    + 'static
{
    /// Reachable, able to take writes, every migration this binary knows applied.
    async fn ready(&self) -> Result<(), StoreError>;

    /// (open, idle) connections, for the pool gauges.
    fn pool_stats(&self) -> (u32, usize);

    /// Gives idle connections' buffers back (the tick calls this once a second).
    fn shrink_idle_connections(&self);
}

/// Fenced kv writes, scope claims and reads (`kv.rs`).
pub(super) trait KvStore {
    /// A write's statement is run by a worker of the backend's, not by the caller's future:
    /// then the caller may await it on its own task (a dropped request abandons nothing).
    fn writes_on_workers(&self) -> bool;

    /// Likewise for reads.
    fn reads_on_workers(&self) -> bool;

    async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError>;

    /// Every write or none, under one token.
    async fn batch(
        &self,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Outcome<Vec<Written>>, StoreError>;

    async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError>;

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError>;

    async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError>;

    /// A scope's fence and the latest token granted by the built-in lock of that name: what
    /// the verdict reads to explain a refusal without a write.
    async fn scope_state(&self, scope: &Scope) -> Result<ScopeState, StoreError>;
}

/// The built-in lease service (`locks.rs`).
pub(super) trait LockStore {
    /// Grants the lock if it is free or its lease lapsed, claiming the scope of its name in
    /// the same transaction.
    async fn acquire(
        &self,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError>;

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    async fn renew(
        &self,
        name: &Scope,
        token: FencingToken,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Option<Lease>, StoreError>;

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    async fn release(
        &self,
        name: &Scope,
        token: FencingToken,
        actor: Option<&str>,
    ) -> Result<Option<Lease>, StoreError>;

    /// Who holds the lock now (a live lease), if anyone.
    async fn holder(&self, name: &Scope) -> Result<Option<Holder>, StoreError>;
}

/// The audited admin actions and the audit log (`admin.rs`).
pub(super) trait AdminStore {
    /// A reset and its audit row, in one transaction.
    async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError>;

    /// A bulk rebind and its audit row, in one transaction.
    async fn rebind(&self, rebind: &Rebind)
        -> Result<Result<RebindDone, ResetRefused>, StoreError>;

    /// The newest audit rows first, at most `limit`.
    async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError>;

    /// The newest audit row's id (0: none): a change means another process reset a fence.
    async fn newest_audit_id(&self) -> Result<i64, StoreError>;

    /// A task that clears `high_water` as soon as another process resets a fence, if the
    /// backend can be told (else the audit-log poll is the only way to hear of it).
    fn listen_resets(&self, high_water: Arc<HighWater>) -> Option<tokio::task::JoinHandle<()>>;
}

/// What the console shows from the database (`overview.rs`).
pub(super) trait OverviewStore {
    async fn overview(&self) -> Result<Overview, StoreError>;
}

/// Refused writes kept for operators (`refusals.rs`).
pub(super) trait RefusalStore {
    /// Records the queued refusals, in one transaction.
    async fn insert_refusals(&self, events: &[Arc<Event>]) -> Result<(), StoreError>;

    /// Deletes any older than `refusals::KEPT_DAYS`, and all but `kept`, fairly per actor
    /// (`refusals::prune_sql`).
    async fn prune_refusals(&self, kept: i64) -> Result<(), StoreError>;

    /// The newest refusals first that `filter` admits, at most its `limit`.
    async fn refusals(&self, filter: &RefusalFilter) -> Result<Vec<Value>, StoreError>;
}

/// Legacy tables fenced in place (`[[resources]]`: `pg/tables/`).
pub(super) trait TableStore {
    /// Validates `[[resources]]` against the database; a bad resource fails start-up.
    async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources>;

    async fn table_write(
        &self,
        op: &TableOp,
        guard: &Guard,
    ) -> Result<Outcome<RowWritten>, TableError>;

    /// Every kv write and table op or none, under one token.
    async fn batch_tables(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
    ) -> Result<Outcome<BatchWritten>, TableError>;

    async fn table_get(
        &self,
        resource: &Resource,
        key: &RowKey,
    ) -> Result<Option<RowEntry>, TableError>;

    /// What SQL writers ran into: refusals by `fencegate.fence()` and the guards, and writes
    /// guards in audit mode let through without a fence.
    async fn sql_writers(&self) -> Result<SqlSeen, StoreError>;
}

/// Writes sent with an `Idempotency-Key`: each a transaction with its outcome row
/// (`idempotency.rs`; `store::idempotency` says how).
pub(super) trait IdempotencyStore {
    /// The unexpired outcome kept under `id`, if any.
    async fn kept(&self, id: &IdemId) -> Result<Option<Kept>, StoreError>;

    /// A kv batch (or a single write: a batch of one) and, if accepted, its outcome.
    async fn batch_kept(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<Vec<Written>>, StoreError>;

    async fn claim_kept(
        &self,
        scope: &Scope,
        token: FencingToken,
        keep: &Keep,
    ) -> Result<Outcome<Claimed>, StoreError>;

    async fn table_write_kept(
        &self,
        op: &TableOp,
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<RowWritten>, TableError>;

    async fn batch_tables_kept(
        &self,
        ops: &[BatchOp],
        guard: &Guard,
        keep: &Keep,
    ) -> Result<Outcome<BatchWritten>, TableError>;

    /// Deletes at most `limit` expired outcome rows; how many it deleted.
    async fn sweep_idempotency(&self, limit: i64) -> Result<u64, StoreError>;
}

/// The database's role and how its commits are replicated (`pg/replication.rs`).
pub(super) trait HighAvailability {
    /// `serve` started against a standby and has not migrated since.
    fn awaits_primary(&self) -> bool;

    /// Runs for as long as `serve` does: migrations owed after a promotion, and warnings
    /// about replication that could lose acknowledged fences.
    async fn watch_replication(self);
}
