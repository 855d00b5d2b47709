//! The PostgreSQL backend: the production store. Every statement it runs is in this
//! directory. The files both backends have (`mod.rs`, `sql.rs`, `kv.rs`, `locks.rs`,
//! `admin.rs`, `overview.rs`, `refusals.rs`, `unfenced.rs`) implement the same part of
//! `store::backend::Backend` as SQLite's of the same name; the rest is PostgreSQL's alone.
//!
//! - this file: connecting, migrating, readiness;
//! - [`sql`]: the kv, claim and lock statements; [`kv`]: fenced kv writes, batches, claims,
//!   reads, and the explanation of a refusal; [`locks`]: the built-in lease service;
//! - [`admin`]: resets, retires, rebinds, the audit log and the reset listener (`NOTIFY`);
//!   [`overview`] and [`refusals`]: what the console shows;
//! - [`coalesce`] and [`reads`]: concurrent writes and reads combined into shared statements,
//!   on the work queue of [`batching`];
//! - [`connections`]: the connections every call takes (cheaper than the sqlx pool's);
//! - [`replication`]: primary or standby, and how commits are replicated; [`tls`]: libpq's
//!   TLS settings; [`schema`]: fencegate's own schema; [`pooler`]: behind PgBouncer;
//! - [`tables`] (legacy tables, `[[resources]]`), validated against the [`catalog`], and
//!   [`sql_fence`]: SQL writers fenced by `fencegate.fence()` and guard triggers;
//! - [`unfenced`]: the demo's unfenced writer.

mod admin;
mod batching;
mod catalog;
mod coalesce;
mod connections;
pub(super) mod errors;
mod gates;
mod hosts;
mod idempotency;
mod kv;
mod locks;
mod overview;
mod pooler;
mod reads;
mod refusals;
mod replication;
mod schema;
mod sql;
mod sql_fence;
mod tables;
pub(super) mod tls;
pub(super) mod unfenced;

use std::{sync::Arc, time::Duration};

use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    ConnectOptions, PgPool,
};

use self::replication::Replication;
pub use self::sql::KV_GET;
use self::{
    coalesce::Coalescer, connections::Connections, gates::ScopeGates, reads::Reads, sql::Statements,
};
use super::{backend::Backend, sql::ByRule, Checks, Settings, StoreError};
use crate::fence::Rule;

/// The statement fencegate runs for an unscoped `PUT /v1/kv/{key}` (`$1` key, `$2` value, `$3`
/// deleted, `$4` token) and for a lone scoped one (`$5` scope): the load bench runs exactly
/// these against PostgreSQL directly, to compare like with like.
pub fn kv_put_sql(rule: Rule, checks: &Checks) -> String {
    Statements::new(rule, checks).put_key
}

/// See [`kv_put_sql`].
pub fn kv_put_scoped_sql(rule: Rule, checks: &Checks) -> String {
    Statements::new(rule, checks).put_scope
}

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The transaction-scoped advisory lock processes take while they migrate ("fgmigrat").
const MIGRATE_LOCK: i64 = 0x6667_6d69_6772_6174;

#[derive(Clone)]
pub(super) struct PgStore {
    /// Opens, bounds and recycles connections; used directly only to start up (migrations,
    /// catalog). Everything else takes its connection from `conns`.
    pool: PgPool,
    /// Opens start-up's pools (migrations, catalog, guards, `fence()`'s rules): like `pool`, but
    /// they take a standby when no host takes writes, to read there (see `hosts`).
    startup: StartupPools,
    conns: Arc<Connections>,
    sql: Arc<ByRule<Statements>>,
    /// `None` when `database.coalesce_workers = 0`: each write is its own statement.
    coalescer: Option<Coalescer>,
    /// `None` when `database.coalesce_workers = 0`: each read is its own statement.
    reads: Option<Reads>,
    /// Claims, grants and scoped batches wait here, one per scope at a time (`gates`).
    gates: Arc<ScopeGates>,
    /// Built into the statements; needed again to explain a refusal.
    checks: Checks,
    /// How to connect, for connections outside the pool (the start-up lock of `pooler`).
    options: Arc<PgConnectOptions>,
    /// The database URL's hosts, tried in order for every new connection (`hosts`).
    hosts: Arc<hosts::HostList>,
    /// How the reset listener connects, and whether through the host list (not for
    /// `database.listen_url`, a URL of its own); `None`: no listener (`pooler`).
    listener: Option<(Arc<PgConnectOptions>, bool)>,
    /// `database.pooler`: names the setting in errors that look like a pooler's.
    pooler: super::Pooler,
    /// The database's role and replication, as seen (`replication`).
    replication: Arc<Replication>,
    /// fencegate's own schema (`schema`).
    schema: Arc<str>,
    /// A statement in flight longer than this makes `/readyz` 503: longer than a healthy one
    /// waits (a row lock at most `lock_timeout_ms`, then it fails), plus a second.
    stuck_after: Duration,
    /// A serving process: it writes the guards' modes and checks their triggers at start
    /// (`sql_fence`); a one-off command does neither.
    serving: bool,
}

/// Start-up's reads work on a standby too (a process started against one waits for its
/// promotion), so start-up has small pools of its own that take one when no host takes
/// writes. Each is opened for one piece of start-up work and closed after it: outside start-up,
/// fencegate holds at most `database.max_connections` backends.
#[derive(Clone)]
struct StartupPools {
    hosts: Arc<hosts::HostList>,
    options: Arc<PgConnectOptions>,
    acquire_timeout: Duration,
}

impl StartupPools {
    /// A pool of at most two connections, opened as they are needed; `close()` it when done.
    fn open(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(self.acquire_timeout)
            .test_before_acquire(false)
            .after_release(replication::keep_on_release)
            .connector(self.hosts.connector(true))
            .connect_lazy_with((*self.options).clone())
    }
}

impl PgStore {
    /// Connects, migrates if asked, and writes `fencegate.fence()` and its rules (`sql_fence`).
    pub(super) async fn open(settings: &Settings) -> anyhow::Result<Self> {
        let pg = PgStore::connect(settings, &settings.url, settings.checks.clone()).await?;
        if let Some(writers) = &settings.sql_writers {
            let startup = pg.startup.open();
            let synced = sql_fence::sync(
                &startup,
                sql_fence::Sync {
                    schema: &settings.schema,
                    checks: &settings.checks,
                    issuer_scopes: &settings.issuer_scopes,
                    max_scope_bytes: settings.max_scope_bytes,
                    writers,
                },
            )
            .await;
            startup.close().await;
            synced?;
        }
        Ok(pg)
    }

    /// Connects (failing fast with a message that says what to check) and, if asked, migrates.
    async fn connect(settings: &Settings, url: &str, checks: Checks) -> anyhow::Result<Self> {
        let shown = crate::redact::redact_url(url);
        // Every TCP connection from here on: keepalives, and sent data unacknowledged this long
        // ends the connection (vendor/sqlx-core: a partition fails statements in seconds).
        sqlx_core::net::set_tcp_user_timeout(Duration::from_millis(settings.tcp_user_timeout_ms));
        // sslmode, sslrootcert, sslcert, sslkey as libpq has them; their files checked first.
        // A libpq host list: tls.rs reads the URL of its first host, `hosts` tries them all.
        let (url, host_list, target, per_host) = hosts::split(url)?;
        let (options, mut tls) = tls::options(&url)?;
        let options: PgConnectOptions = tls
            .resolve_allow(options)
            .await
            // Statements are logged by our own spans; sqlx's per-statement logs are noise.
            .log_statements(tracing::log::LevelFilter::Trace)
            .application_name("fencegate");
        // Defence in depth: no fencegate transaction is ever idle for long, so a session
        // stuck idle in one (a bug) is ended by the server instead of holding row locks.
        // A SQL writer's transaction that called fencegate.fence() holds the fence row until
        // it ends: fencegate's statements wait for a row lock at most this long (then 503,
        // retry), instead of holding a connection for as long as that transaction lasts.
        // In the startup packet, or per transaction behind a pooler (`pooler`).
        let options = pooler::apply(
            options,
            settings.pooler,
            &settings.schema,
            settings.lock_timeout_ms,
        );
        let listener = pooler::listener_options(settings, &options).await?;
        let hosts = Arc::new(hosts::HostList::new(
            host_list,
            target,
            per_host,
            tls.clone(),
        ));
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .min_connections(settings.min_connections)
            .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
            .max_lifetime(Duration::from_secs(settings.max_lifetime_secs))
            // A ping before every acquire would double the round trips of each write; a dead
            // connection instead fails its statement with a transient error (503, retry) and
            // is dropped by the pool.
            .test_before_acquire(false)
            // Only on the pool's release path (errors, recycling), never per statement: a
            // connection to a server that is no longer primary is closed, not reused.
            .after_release(replication::keep_on_release)
            // Every new connection: the URL's hosts in order, the first that takes writes.
            .connector(hosts.connector(false))
            .connect_lazy_with(options.clone());
        // Start-up's reads (catalog, guards, fence() rules) work on a standby too, so start-up
        // has a small pool of its own that takes one when no host takes writes.
        let startup = StartupPools {
            hosts: hosts.clone(),
            options: Arc::new(options.clone()),
            acquire_timeout: Duration::from_millis(settings.acquire_timeout_ms),
        };
        let at_start = hosts::at_start(&pool).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot connect to PostgreSQL at {shown}: {}",
                tls.describe(&e, || match pooler::hint(&e, settings.pooler) {
                    Some(hint) => format!("{e}: {hint}"),
                    None => format!(
                        "{e}. Is the server running and the URL right? (set DATABASE_URL or --database-url)"
                    ),
                })
            )
        })?;
        let options = options.application_name("fencegate-startup");
        let sql = Arc::new(ByRule::build(|rule| Statements::new(rule, &checks)));
        let conns = Arc::new(Connections::new(
            pool.clone(),
            settings.max_connections,
            Duration::from_millis(settings.acquire_timeout_ms),
            settings.give_up_after(),
        ));
        let coalescer = (settings.coalesce_workers > 0).then(|| {
            Coalescer::start(
                conns.clone(),
                sql.clone(),
                settings.coalesce_workers,
                settings.coalesce_max_rows,
                Duration::from_millis(settings.lock_timeout_ms),
                // The lanes of held scopes: with the workers (a quarter) and the readers (as
                // many), at most three quarters of the connections; claims, grants, table writes
                // and refusal explanations always find one.
                (settings.max_connections as usize / 4).max(1),
            )
        });
        let reads = (settings.coalesce_workers > 0).then(|| {
            Reads::start(
                conns.clone(),
                settings.coalesce_workers,
                settings.coalesce_max_rows,
            )
        });
        let store = PgStore {
            pool,
            startup,
            conns,
            reads,
            gates: Arc::new(ScopeGates::new(Duration::from_millis(
                settings.lock_timeout_ms,
            ))),
            sql,
            coalescer,
            checks,
            options: Arc::new(options),
            hosts,
            // database.listen_url is a URL of its own; the main URL's listener goes through
            // its host list, to the primary, where resets are NOTIFYed.
            listener: listener.map(|o| (Arc::new(o), settings.listen_url.is_none())),
            pooler: settings.pooler,
            stuck_after: Duration::from_millis(settings.lock_timeout_ms) + Duration::from_secs(1),
            replication: Arc::default(),
            schema: settings.schema.as_str().into(),
            serving: settings.sql_writers.is_some(),
        };
        if settings.migrate_on_start {
            store.migrate_unless_standby(at_start).await?;
        }
        Ok(store)
    }

    async fn migrate(&self) -> anyhow::Result<()> {
        // Several fencegate processes may start at once: they migrate one at a time, under a
        // transaction-scoped lock (sqlx's own is a session lock, which a pooler in transaction
        // mode cannot hold).
        let side = self.side_connection().await?;
        let startup = self.startup.open();
        let migrated = pooler::exclusively(side, MIGRATE_LOCK, self.migrate_locked(&startup)).await;
        startup.close().await;
        migrated
    }

    async fn migrate_locked(&self, startup: &PgPool) -> anyhow::Result<()> {
        schema::prepare(startup, &self.schema).await?;
        pooler::check_schema(startup, &self.schema).await?;
        let migrator = sqlx::migrate::Migrator {
            migrations: MIGRATOR.migrations.clone(),
            ignore_missing: MIGRATOR.ignore_missing,
            locking: false,
            no_tx: MIGRATOR.no_tx,
        };
        let pooler = self.pooler;
        migrator.run(startup).await.map_err(|e| {
            use sqlx::migrate::MigrateError::{Execute, ExecuteMigration};
            let read_only = match &e {
                Execute(sqlx::Error::Database(db)) | ExecuteMigration(sqlx::Error::Database(db), _) => db.code().as_deref() == Some("25006"),
                _ => false,
            };
            if read_only {
                anyhow::anyhow!(
                    "applying migrations failed: the database refuses writes (is default_transaction_read_only on for \
                     fencegate's database or role?). Turn it off, or, if the schema is already migrated, set \
                     database.migrate_on_start = false: fencegate then starts, not ready until the database takes writes ({e})"
                )
            } else if let Some(hint) = match &e {
                Execute(err) | ExecuteMigration(err, _) => pooler::hint(err, pooler),
                _ => None,
            } {
                anyhow::anyhow!("applying migrations failed: {e}: {hint}")
            } else {
                anyhow::anyhow!("applying migrations failed: {e}")
            }
        })
    }

    /// Options for a connection of its own, outside the pool and `max_connections` (the reset
    /// listener of `admin`), named `fencegate-listener` in `pg_stat_activity`, and the host
    /// list to open it through (none for `database.listen_url`); `None` behind a pooler in
    /// transaction mode without `database.listen_url`.
    fn listener_options(&self) -> Option<(PgConnectOptions, Option<Arc<hosts::HostList>>)> {
        let (options, through_hosts) = self.listener.as_ref()?;
        Some((
            (**options).clone(),
            through_hosts.then(|| self.hosts.clone()),
        ))
    }

    /// A connection outside the pools that holds a start-up lock (`pooler::exclusively`):
    /// through the host list, like start-up's own reads (a standby when no host takes writes).
    async fn side_connection(&self) -> Result<sqlx::PgConnection, sqlx::Error> {
        self.hosts.open(&self.options, true).await
    }

    /// fencegate's own schema.
    fn schema(&self) -> &str {
        &self.schema
    }

    /// The checks besides the accept rule, which the legacy-table statements follow too.
    fn checks(&self) -> &Checks {
        &self.checks
    }

    fn statements(&self, rule: Rule) -> &Statements {
        self.sql.get(rule)
    }
}

impl Backend for PgStore {
    /// Ready = reachable, primary (not a standby), and every migration this binary knows is
    /// applied.
    async fn ready(&self) -> Result<(), StoreError> {
        // The write path first: connections waiting for answers that do not come (a cut
        // network, a frozen server) take no writes, whatever a fresh connection says.
        let stuck = self.conns.stuck(self.stuck_after);
        if stuck > 0 {
            return Err(StoreError::NotReady(format!(
                "{stuck} database statement(s) have had no answer for more than {} ms: the network to the \
                 database or the database itself is stuck; they are given up after server.request_timeout_ms",
                self.stuck_after.as_millis()
            )));
        }
        self.check_primary().await.map_err(hosts::readiness)?;
        let mut conn = self.conns.take().await?;
        let applied: i64 = sqlx::query_scalar(super::sql::MIGRATIONS_APPLIED)
            .fetch_one(&mut *conn)
            .await?;
        conn.done();
        super::migrated(applied, &MIGRATOR)
    }

    fn pool_stats(&self) -> (u32, usize) {
        (
            self.pool.size(),
            self.pool.num_idle() + self.conns.idle_count(),
        )
    }

    /// See `Connections::shrink_idle`: a connection's buffers keep the size of the largest
    /// message it carried.
    fn shrink_idle_connections(&self) {
        self.conns.shrink_idle();
    }
}
