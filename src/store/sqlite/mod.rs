//! The embedded SQLite backend: the zero-setup default when no PostgreSQL is configured, so
//! `fencegate serve` and `fencegate demo` work on a fresh machine with nothing but Rust.
//!
//! The files are laid out as PostgreSQL's (`pg/`), each implementing the same part of
//! `store::backend::Backend`: this file (opening, readiness, and the parts SQLite does not
//! have), [`sql`] (the kv and claim statements), [`kv`], [`locks`], [`admin`], [`overview`],
//! [`refusals`], and [`unfenced`] (the demo). PostgreSQL's other files have no counterpart
//! here: no legacy tables (`pg/tables/`, `catalog`, `sql_fence`), no standby (`replication`),
//! no TLS, no schema of its own, and no coalescing or connection stack (see below).
//!
//! The fence rules are the PostgreSQL backend's, spelled by the same functions (`store::sql`)
//! and explained by the same code (`store::explain_refusal`): an unscoped write is one
//! `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE <fence check> RETURNING`. What differs:
//! - SQLite has no data-modifying CTEs, so scoped writes and batches run as a transaction;
//! - the pool has ONE connection (SQLite has a single writer anyway), so transactions are
//!   serialized and cannot interleave, and there is no coalescing: writes to one key are
//!   applied in arrival order;
//! - every statement that writes takes SQLite's one write lock before it reads anything, so
//!   a check on the statement's snapshot is a check on the row it updates (`sql.rs`: why the
//!   jump cap is checked once here and twice on PostgreSQL);
//! - no legacy tables (`[[resources]]` is refused at start-up);
//! - lock leases run on this machine's clock; a reset made by another process reaches the
//!   reject-only cache through the audit-log poll (0.5 s), not a notification.
//!
//! Durability: WAL with `synchronous = FULL`, so a 2xx means on disk.

mod admin;
pub(super) mod errors;
mod idempotency;
mod kv;
mod locks;
mod overview;
mod refusals;
mod sql;
pub(super) mod unfenced;

use std::{str::FromStr, sync::Arc, time::Duration};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    SqlitePool,
};

use self::sql::Statements;
use super::{
    backend::{Backend, HighAvailability, TableStore},
    sql::{ByRule, MIGRATIONS_APPLIED},
    BatchOp, BatchWritten, Checks, RowEntry, RowWritten, Settings, SqlSeen, StoreError, TableError,
};
use crate::{
    fence::{Guard, Outcome, Rule},
    tables::{Resource, ResourceSettings, Resources, RowKey, TableOp},
};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Now, as RFC 3339 UTC text / as integer milliseconds (SQLite's clock is this machine's).
const NOW_TEXT: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A column of milliseconds since the epoch as RFC 3339 UTC text, as the API shows times.
fn ms_to_text(col: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', {col} / 1000.0, 'unixepoch')")
}

#[derive(Clone)]
pub(super) struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<ByRule<Statements>>,
    /// Built into the statements; needed again to explain a refusal.
    checks: Checks,
}

impl SqliteStore {
    /// Opens (creating it if missing) and, if asked, migrates the database file.
    pub(super) async fn open(settings: &Settings) -> anyhow::Result<Self> {
        let (url, checks) = (&settings.url, settings.checks.clone());
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| anyhow::anyhow!("invalid SQLite URL {url}: {e}"))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
            .connect_with(options)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot open the SQLite database {url}: {e} (check database.sqlite_path)"
                )
            })?;
        let store = SqliteStore {
            pool,
            sql: ByRule::build(|rule| Statements::new(rule, &checks)).into(),
            checks,
        };
        if settings.migrate_on_start {
            store.migrate().await?;
        }
        Ok(store)
    }

    async fn migrate(&self) -> anyhow::Result<()> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))
    }

    fn statements(&self, rule: Rule) -> &Statements {
        self.sql.get(rule)
    }
}

impl Backend for SqliteStore {
    /// Ready = every migration this binary knows is applied. A file is always "primary".
    async fn ready(&self) -> Result<(), StoreError> {
        let applied: i64 = sqlx::query_scalar(MIGRATIONS_APPLIED)
            .fetch_one(&self.pool)
            .await?;
        super::migrated(applied, &MIGRATOR)
    }

    fn pool_stats(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    /// Nothing to give back: the buffers PostgreSQL's connections grow are the wire
    /// protocol's, and SQLite runs in this process, with no wire.
    fn shrink_idle_connections(&self) {}
}

/// An embedded file has no standby and no replicas: nothing is owed, nothing to watch.
impl HighAvailability for SqliteStore {
    fn awaits_primary(&self) -> bool {
        false
    }

    async fn watch_replication(self) {}
}

/// Legacy tables are PostgreSQL tables: `[[resources]]` is refused at start-up, so no table
/// request can reach this backend; if one did, it is refused the same way.
impl TableStore for SqliteStore {
    async fn resources(&self, settings: &[ResourceSettings]) -> anyhow::Result<Resources> {
        anyhow::bail!(
            "invalid resource: {}: legacy tables need PostgreSQL; set DATABASE_URL / --database-url",
            settings[0].label(0)
        )
    }

    async fn table_write(
        &self,
        _op: &TableOp,
        _guard: &Guard,
    ) -> Result<Outcome<RowWritten>, TableError> {
        Err(not_postgres())
    }

    async fn batch_tables(
        &self,
        _ops: &[BatchOp],
        _guard: &Guard,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        Err(not_postgres())
    }

    async fn table_get(
        &self,
        _resource: &Resource,
        _key: &RowKey,
    ) -> Result<Option<RowEntry>, TableError> {
        Err(not_postgres())
    }

    /// No legacy tables and no `fencegate.fence()`: SQL writers have nothing to count.
    async fn sql_writers(&self) -> Result<SqlSeen, StoreError> {
        Ok(SqlSeen::default())
    }
}

fn not_postgres() -> TableError {
    TableError::Store(StoreError::Corrupt(
        "legacy tables need the PostgreSQL store".into(),
    ))
}
