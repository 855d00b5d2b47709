//! What the [`Store`](super::Store) asks of a database backend: [`Backend`], split by feature.
//!
//! Each part is declared beside the feature's types and the facade's methods that call it
//! (`KvStore` in `store/kv.rs`, `AdminStore` in `store/admin.rs`, ...; the lease service's and
//! replication's here, their types living in `crate::locks`), and re-exported here for the
//! backends. Each backend implements each part in the file of the same name: `KvStore` in
//! `pg/kv.rs` and `sqlite/kv.rs`, and so on, owning all of its SQL there; what they share is
//! above them (the fence rules' SQL spelling in `store::sql`, the refusal's explanation, row
//! decoding, the pure decisions of `store::admin`). A backend that cannot do something (SQLite
//! has no legacy tables, no replication) implements that part too, saying why, so a difference
//! is written where it is. The backend in use is picked in the facade (`store/mod.rs`).
//!
//! Native `async fn` in traits: the facade calls them on the concrete backend (through
//! `on_backend!`), where the compiler sees that each future is `Send`, so the trait needs no
//! boxing and no `Send` bounds of its own.

use super::StoreError;
pub(super) use super::{
    admin::AdminStore, idempotency::IdempotencyStore, kv::KvStore, overview::OverviewStore,
    refusals::RefusalStore, tables::TableStore,
};
use crate::{
    fence::FencingToken,
    fence::Scope,
    locks::{Acquired, Holder, Lease, Ttl},
};

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

/// The database's role and how its commits are replicated (`pg/replication.rs`).
pub(super) trait HighAvailability {
    /// `serve` started against a standby and has not migrated since.
    fn awaits_primary(&self) -> bool;

    /// Runs for as long as `serve` does: migrations owed after a promotion, and warnings
    /// about replication that could lose acknowledged fences.
    async fn watch_replication(self);
}
