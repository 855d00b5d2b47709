//! The embedded SQLite backend: the zero-setup default when no PostgreSQL is configured, so
//! `fencegate serve` and `fencegate demo` work on a fresh machine with nothing but Rust.
//!
//! The fence rules are the PostgreSQL backend's, spelled by the same functions (`store::sql`)
//! and explained by the same code (`store::explain_refusal`): an unscoped write is one
//! `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE <fence check> RETURNING`. What differs:
//! - SQLite has no data-modifying CTEs, so scoped writes and batches run as a transaction;
//! - the pool has ONE connection (SQLite has a single writer anyway), so transactions are
//!   serialized and cannot interleave, and there is no coalescing: writes to one key are
//!   applied in arrival order;
//! - no legacy tables (`[[resources]]` is refused at start-up);
//! - lock leases run on this machine's clock; a reset made by another process reaches the
//!   reject-only cache through the audit-log poll (0.5 s), not a notification.
//!
//! Durability: WAL with `synchronous = FULL`, so a 2xx means on disk.
use std::{collections::BTreeMap, str::FromStr, time::Duration};

use sqlx::{
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
    Row, SqliteConnection, SqlitePool,
};

use super::{
    explain_refusal, holder_from, scope_state_from,
    sql::{fence_admits, sql_issued_check, sql_jump_check, sql_scope_check, ByRule, MIGRATIONS_APPLIED},
    token_from_db, Checks, Claimed, Entry, KeyState, Refusal, Seen, StoreError, Write, Written, SCOPE_STATE,
};
use crate::{
    fence::{FencingToken, Guard, Key, Outcome, Rule, Scope, Target},
    locks::{Acquired, Holder, Lease, Ttl},
};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// Now, as RFC 3339 UTC text / as integer milliseconds (SQLite's clock is this machine's).
const NOW_TEXT: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

fn ms_to_text(col: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', {col} / 1000.0, 'unixepoch')")
}

/// What a kv write does to an existing row (mirrors the PostgreSQL backend's KV_ON_CONFLICT).
fn kv_on_conflict() -> String {
    format!(
        "ON CONFLICT (key) DO UPDATE SET
            value = excluded.value,
            deleted = excluded.deleted,
            fence_token = excluded.fence_token,
            scope = excluded.scope,
            key_fence = max(kv.key_fence, excluded.key_fence),
            version = CASE WHEN kv.deleted THEN 1 ELSE kv.version + 1 END,
            updated_at = {NOW_TEXT}"
    )
}

struct Statements {
    /// ?1 key, ?2 value, ?3 deleted, ?4 token: the fenced single statement.
    put_key: String,
    /// ?1 key, ?2 value, ?3 deleted, ?4 token, ?5 scope: runs after a successful scope claim.
    put_scoped: String,
    /// ?1 scope, ?2 token: raises the scope's fence if the rule and the poisoning guards
    /// admit the token (see `PgStore`'s `scope_gate`).
    claim: String,
    /// ?1 scope, ?2 token: the claim of a lock grant, which issues the token itself.
    grant_claim: String,
}

impl Statements {
    fn new(rule: Rule, checks: &Checks) -> Self {
        let on_conflict = kv_on_conflict();
        let scope_check = sql_scope_check(checks.scopes, "kv.scope", "excluded.scope");
        let key_jump = sql_jump_check(checks.jump, "(SELECT key_fence FROM fencegate_kv AS jf WHERE jf.key = ?1)", "?4");
        let scope_gate = format!(
            "{} AND {}",
            sql_issued_check("?1", "?2", &checks.reserved),
            sql_jump_check(checks.jump, "(SELECT fence_token FROM fencegate_fences AS jf WHERE jf.scope = ?1)", "?2")
        );
        // INSERT .. SELECT needs a WHERE before ON CONFLICT (SQLite's parser), gate or not.
        let claim = |gate: &str| {
            format!(
                "INSERT INTO fencegate_fences AS f (scope, fence_token, updated_at) SELECT ?1, ?2, {NOW_TEXT} WHERE {gate}
                 ON CONFLICT (scope) DO UPDATE SET
                     fence_token = excluded.fence_token, version = f.version + 1, updated_at = {NOW_TEXT}
                 WHERE {admits}
                 RETURNING version",
                admits = fence_admits(rule, "f.fence_token", "excluded.fence_token"),
            )
        };
        Statements {
            put_key: format!(
                "INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope, updated_at)
                 SELECT ?1, ?2, ?3, ?4, ?4, NULL, {NOW_TEXT} WHERE {key_jump}
                 {on_conflict}
                 WHERE {admits} AND {scope_check}
                 RETURNING version",
                admits = fence_admits(rule, "kv.key_fence", "excluded.key_fence"),
            ),
            put_scoped: format!(
                "INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope, updated_at)
                 VALUES (?1, ?2, ?3, 0, ?4, ?5, {NOW_TEXT})
                 {on_conflict}
                 WHERE {scope_check}
                 RETURNING version"
            ),
            claim: claim(&scope_gate),
            grant_claim: claim("TRUE"),
        }
    }
}

#[derive(Clone)]
pub(in crate::store) struct SqliteStore {
    pub(super) pool: SqlitePool,
    sql: std::sync::Arc<ByRule<Statements>>,
    /// Built into the statements; needed again to explain a refusal.
    checks: Checks,
}

impl SqliteStore {
    pub async fn connect(settings: &crate::store::Settings, url: &str, checks: Checks) -> anyhow::Result<Self> {
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
            .map_err(|e| anyhow::anyhow!("cannot open the SQLite database {url}: {e} (check database.sqlite_path)"))?;
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

    pub async fn migrate(&self) -> anyhow::Result<()> {
        MIGRATOR.run(&self.pool).await.map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))
    }

    fn statements(&self, rule: Rule) -> &Statements {
        self.sql.get(rule)
    }

    pub fn pool_stats(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    pub async fn ready(&self) -> Result<(), StoreError> {
        let applied: i64 = sqlx::query_scalar(MIGRATIONS_APPLIED).fetch_one(&self.pool).await?;
        super::migrated(applied, &MIGRATOR)
    }

    /// Applies one kv write inside `conn` (a transaction). Returns the new version, or `None`
    /// if the key refused it: its own fence (unscoped), or its scope (sticky scope; the scope's
    /// fence is decided by the claim that precedes a scoped write).
    async fn put_one(conn: &mut SqliteConnection, sql: &Statements, write: &Write, guard: &Guard) -> Result<Option<i64>, StoreError> {
        let (key, value, deleted) = match write {
            Write::Put { key, value } => (key, Some(value.to_string()), false),
            Write::Delete { key } => (key, None, true),
        };
        let version = match &guard.target {
            Target::Key => sqlx::query_scalar(&sql.put_key)
                .bind(key.as_str())
                .bind(value)
                .bind(deleted)
                .bind(guard.token.get())
                .fetch_optional(&mut *conn)
                .await?,
            Target::Scope(scope) => sqlx::query_scalar(&sql.put_scoped)
                .bind(key.as_str())
                .bind(value)
                .bind(deleted)
                .bind(guard.token.get())
                .bind(scope.as_str())
                .fetch_optional(&mut *conn)
                .await?,
        };
        Ok(version)
    }

    /// Claims the guard's scope inside `conn`; `false` if the scope's fence refused the token.
    async fn claim_in(conn: &mut SqliteConnection, claim: &str, scope: &Scope, token: FencingToken) -> Result<bool, StoreError> {
        let version: Option<i64> = sqlx::query_scalar(claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&mut *conn)
            .await?;
        Ok(version.is_some())
    }

    pub async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError> {
        match self.batch(std::slice::from_ref(&write), guard).await? {
            Outcome::Accepted(mut written) => Ok(Outcome::Accepted(written.remove(0))),
            Outcome::Stale(stale) => Ok(Outcome::Stale(stale)),
            Outcome::Mismatch(refused) => Ok(Outcome::Mismatch(refused)),
            Outcome::NotIssued(refused) => Ok(Outcome::NotIssued(refused)),
            Outcome::Jump(refused) => Ok(Outcome::Jump(refused)),
        }
    }

    pub async fn batch(&self, writes: &[Write], guard: &Guard) -> Result<Outcome<Vec<Written>>, StoreError> {
        let mut last: BTreeMap<&Key, &Write> = BTreeMap::new();
        for write in writes {
            last.insert(write.key(), write);
        }
        let sql = self.statements(guard.rule);
        let mut tx = self.pool.begin().await?;
        if let Target::Scope(scope) = &guard.target {
            if !Self::claim_in(&mut tx, &sql.claim, scope, guard.token).await? {
                tx.rollback().await?;
                // Every key was refused; the explanation says whether by a key's scope or by
                // the scope's fence.
                let keys: Vec<Key> = last.keys().map(|k| (*k).clone()).collect();
                return Ok(self.refusal(&keys, guard).await?.outcome());
            }
        }
        let mut written = Vec::with_capacity(last.len());
        let mut refused = Vec::new();
        for (key, write) in &last {
            match Self::put_one(&mut tx, sql, write, guard).await? {
                Some(version) => written.push(Written { key: (*key).clone(), was_live: version != 1, version }),
                None => refused.push((*key).clone()),
            }
        }
        if !refused.is_empty() {
            tx.rollback().await?;
            return Ok(self.refusal(&refused, guard).await?.outcome());
        }
        tx.commit().await?;
        Ok(Outcome::Accepted(written))
    }

    /// Explains a refusal (see `PgStore::refusal`). The single connection serializes every
    /// transaction, so nothing changed since the refused one rolled back.
    async fn refusal(&self, keys: &[Key], guard: &Guard) -> Result<Refusal, StoreError> {
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            let row = sqlx::query("SELECT key, key_fence, scope FROM fencegate_kv WHERE key = ?1")
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await?;
            rows.extend(row);
        }
        let mut seen = Seen { keys: Default::default(), scope_fence: None, latest_issued: None };
        for row in &rows {
            let key: &str = row.try_get(0)?;
            seen.keys.insert(key, KeyState { key_fence: token_from_db(row.try_get(1)?)?, scope: row.try_get(2)? });
        }
        if let Some(scope) = guard.scope() {
            (seen.scope_fence, seen.latest_issued) = self.scope_state(scope).await?;
        }
        explain_refusal(keys, &seen, guard, &self.checks)
    }

    /// A scope's fence and the latest token granted by the built-in lock of that name.
    async fn scope_state(&self, scope: &Scope) -> Result<(Option<FencingToken>, Option<FencingToken>), StoreError> {
        scope_state_from(sqlx::query_as(SCOPE_STATE).bind(scope.as_str()).fetch_one(&self.pool).await?)
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        let row = sqlx::query(
            "SELECT value, fence_token, scope, version, updated_at FROM fencegate_kv WHERE key = ?1 AND NOT deleted",
        )
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get(0)?;
        let value = serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(format!("stored value is not JSON: {e}")))?;
        Ok(Some(Entry {
            value,
            fence_token: token_from_db(row.try_get(1)?)?,
            scope: row.try_get(2)?,
            version: row.try_get(3)?,
            updated_at: row.try_get(4)?,
        }))
    }

    /// Raises the scope's fence to `token` (inclusive rule); `None` if the fence refused it.
    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    pub async fn claim(&self, scope: &Scope, token: FencingToken) -> Result<Outcome<Claimed>, StoreError> {
        let version: Option<i64> = sqlx::query_scalar(&self.sql.inclusive.claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&self.pool)
            .await?;
        if let Some(version) = version {
            return Ok(Outcome::Accepted(Claimed { created: version == 1 }));
        }
        let guard = Guard { token, target: Target::Scope(scope.clone()), rule: Rule::Inclusive };
        Ok(self.refusal(&[], &guard).await?.outcome())
    }

    pub async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError> {
        let current: Option<i64> = sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = ?1")
            .bind(scope.as_str())
            .fetch_optional(&self.pool)
            .await?;
        current.map(token_from_db).transpose()
    }

    /// Grants the lock `name` if it is free or expired, and claims its scope, in one
    /// transaction that reads the clock once: the grant and, if it refuses, the holder are
    /// judged at the same instant, so "not granted" always finds the holder. (The single
    /// connection serializes transactions: nothing else runs in between.)
    pub async fn acquire(&self, name: &Scope, owner: &str, ttl: Ttl, actor: Option<&str>) -> Result<Acquired, StoreError> {
        let mut tx = self.pool.begin().await?;
        let acquired = self.acquire_in(&mut tx, name, owner, ttl, actor).await?;
        match acquired {
            Acquired::Granted(_) => tx.commit().await?,
            Acquired::Held(_) | Acquired::Exhausted => tx.rollback().await?,
        }
        Ok(acquired)
    }

    async fn acquire_in(
        &self,
        tx: &mut SqliteConnection,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        let fence: Option<i64> = sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = ?1")
            .bind(name.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let (latest, owned): (Option<i64>, bool) =
            sqlx::query_as("SELECT token, owner IS NOT NULL FROM fencegate_locks WHERE name = ?1")
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?
                .map_or((None, false), |(token, owned)| (Some(token), owned));
        // The next token is `max(l.token, fence) + 1`. Checked here, not left to SQLite, which
        // would turn the overflow into a float; the lock's own token counts too (an admin
        // reset may have lowered the fence below it).
        if fence.unwrap_or(0).max(latest.unwrap_or(0)) == i64::MAX {
            return Ok(Acquired::Exhausted);
        }
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}")).fetch_one(&mut *tx).await?;
        let acquire = format!(
            "INSERT INTO fencegate_locks AS l (name, owner, token, expires_at_ms, granted_at, actor)
             VALUES (?1, ?2, ?4 + 1, ?6 + ?3, {NOW_TEXT}, ?5)
             ON CONFLICT (name) DO UPDATE SET
                 owner = excluded.owner, actor = excluded.actor, token = max(l.token, ?4) + 1,
                 expires_at_ms = excluded.expires_at_ms, granted_at = {NOW_TEXT}, retired = 0
             WHERE l.owner IS NULL OR l.expires_at_ms <= ?6
             RETURNING token, {}",
            ms_to_text("expires_at_ms")
        );
        let granted = sqlx::query(&acquire)
            .bind(name.as_str())
            .bind(owner)
            .bind(ttl.ms())
            .bind(fence.unwrap_or(0))
            .bind(actor)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = granted else {
            // Refused at `now`: held at `now`, by the row as it is (nothing else ran since).
            return match holder_at(&mut *tx, name, now).await? {
                Some(holder) => Ok(Acquired::Held(holder)),
                None => Err(StoreError::Corrupt(format!("lock {name} is neither free nor held"))),
            };
        };
        let token = token_from_db(row.try_get(0)?)?;
        if !Self::claim_in(&mut *tx, &self.sql.inclusive.grant_claim, name, token).await? {
            return Err(StoreError::Corrupt(format!("the grant of lock {name} could not claim its scope")));
        }
        if owned {
            super::count_takeover();
        }
        Ok(Acquired::Granted(Lease { name: name.clone(), owner: owner.to_owned(), token, expires_at: row.try_get(1)? }))
    }

    pub(crate) async fn holder(&self, name: &Scope) -> Result<Option<Holder>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}")).fetch_one(&mut *conn).await?;
        holder_at(&mut conn, name, now).await
    }

    /// `None` if `token` does not hold the lease (expired, released, taken over), or `actor`
    /// is given and another actor took it.
    pub async fn renew(&self, name: &Scope, token: FencingToken, ttl: Ttl, actor: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let sql = format!(
            "UPDATE fencegate_locks SET expires_at_ms = {NOW_MS} + ?3
             WHERE name = ?1 AND token = ?2 AND owner IS NOT NULL AND expires_at_ms > {NOW_MS}
                 AND (?4 IS NULL OR actor IS NULL OR actor = ?4)
             RETURNING owner, {}",
            ms_to_text("expires_at_ms")
        );
        let row = sqlx::query(&sql)
            .bind(name.as_str())
            .bind(token.get())
            .bind(ttl.ms())
            .bind(actor)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| Ok(Lease { name: name.clone(), owner: row.try_get(0)?, token, expires_at: row.try_get(1)? }))
            .transpose()
    }

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    pub async fn release(&self, name: &Scope, token: FencingToken, actor: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let sql = format!(
            "SELECT owner FROM fencegate_locks WHERE name = ?1 AND token = ?2 AND owner IS NOT NULL AND expires_at_ms > {NOW_MS}
                 AND (?3 IS NULL OR actor IS NULL OR actor = ?3)"
        );
        let owner: Option<String> =
            sqlx::query_scalar(&sql).bind(name.as_str()).bind(token.get()).bind(actor).fetch_optional(&mut *tx).await?;
        let Some(owner) = owner else {
            tx.rollback().await?;
            return Ok(None);
        };
        sqlx::query("UPDATE fencegate_locks SET owner = NULL, expires_at_ms = NULL, actor = NULL WHERE name = ?1")
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
        let now: String = sqlx::query_scalar(&format!("SELECT {NOW_TEXT}")).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        Ok(Some(Lease { name: name.clone(), owner, token, expires_at: now }))
    }
}

/// Who holds the lock `name` at `now_ms`, if anyone.
async fn holder_at(conn: &mut SqliteConnection, name: &Scope, now_ms: i64) -> Result<Option<Holder>, StoreError> {
    let row = sqlx::query(
        "SELECT owner, max(0, expires_at_ms - ?2), token, actor FROM fencegate_locks
         WHERE name = ?1 AND owner IS NOT NULL AND expires_at_ms > ?2",
    )
    .bind(name.as_str())
    .bind(now_ms)
    .fetch_optional(&mut *conn)
    .await?;
    row.as_ref().map(holder_from).transpose()
}
