//! The PostgreSQL backend.
//!
//! Every fenced write is a single statement whose `WHERE` clause is the fence check (and the
//! sticky-scope check, `fence::scoping`), so the checks and the write are atomic without
//! explicit locking:
//! - unscoped write: `INSERT .. ON CONFLICT (key) DO UPDATE .. WHERE kv.key_fence <= $token
//!   AND kv.scope IS NOT DISTINCT FROM NULL`; no row back means the key refused it;
//! - scoped write: a data-modifying CTE raises the scope's fence (with the same kind of `WHERE`),
//!   and the kv upsert selects `FROM` that CTE, so it writes nothing if the claim was refused.
//!   The claim itself only runs if the key is not bound to another scope, and the upsert's
//!   `WHERE` checks the binding again on the row it locked. The fence row stays locked until
//!   commit, which serializes writers of one scope;
//! - batch: the same statements over `unnest(..)` arrays; an unscoped batch runs in a
//!   transaction that is rolled back if any key was refused (all or nothing).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use sqlx::{
    postgres::{PgConnectOptions, PgPoolOptions},
    types::Json,
    ConnectOptions, Connection, PgPool, Row,
};

use super::{
    coalesce::{Coalescer, Upserts},
    connections::Connections,
    reads::Reads,
    explain_refusal, scope_state_from, sql_fence_op, sql_issued_check, sql_jump_check, sql_scope_check, token_from_db, Checks, Claimed,
    Entry, KeyState, Refusal, Seen, StoreError, Write, Written, SCOPE_STATE,
};
use crate::{
    config::DatabaseSettings,
    fence::{FencingToken, Guard, JumpCap, Key, Outcome, Rule, Scope, ScopeRule, Target},
    locks::{Acquired, Holder, Lease, Ttl},
};

/// A timestamptz column as RFC 3339 UTC text, as the API shows it.
macro_rules! utc {
    ($col:literal) => {
        concat!("to_char(", $col, " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
    };
}

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// The kv upsert shared by single writes and batches: what a write does to an existing row.
/// `version` restarts at 1 when a tombstone comes back to life, so `version = 1` after the write
/// means "the key was not live before".
const KV_ON_CONFLICT: &str = "
    ON CONFLICT (key) DO UPDATE SET
        value = EXCLUDED.value,
        deleted = EXCLUDED.deleted,
        fence_token = EXCLUDED.fence_token,
        scope = EXCLUDED.scope,
        key_fence = GREATEST(kv.key_fence, EXCLUDED.key_fence),
        version = CASE WHEN kv.deleted THEN 1 ELSE kv.version + 1 END,
        updated_at = now()";

/// THE statement that raises a scope's fence: claims, lock grants, scoped kv writes (as a CTE)
/// and scoped table writes all use it. `rows` yields `(scope, token)` pairs, each scope at most
/// once (ON CONFLICT cannot touch a row twice); the fence is raised to the token if `rule`
/// admits it, and the statement returns `returning` for every fence it raised. Callers gate
/// `rows` with [`scope_gate`] (every claim but a lock grant's).
/// `jump`: the cap checked again on the fence row as locked (the gate in `rows` reads the
/// statement's snapshot, and a reset may lower the fence in between); `JumpCap(0)` for grants.
fn scope_claim_rows(rule: Rule, jump: JumpCap, rows: &str, returning: &str) -> String {
    format!(
        "INSERT INTO fencegate_fences AS f (scope, fence_token) {rows}
         ON CONFLICT (scope) DO UPDATE SET
             fence_token = EXCLUDED.fence_token, version = f.version + 1, updated_at = now()
         WHERE f.fence_token {op} EXCLUDED.fence_token AND {jump}
         RETURNING {returning}",
        op = sql_fence_op(rule),
        jump = sql_jump_check(jump, "f.fence_token", "EXCLUDED.fence_token"),
    )
}

/// The poisoning guards of a write or claim under scope `scope` with token `token`: a token
/// the built-in lock of that name never issued, or one that jumps too far past the fence, may
/// not raise it.
fn scope_gate(checks: Checks, scope: &str, token: &str) -> String {
    let fence = format!("(SELECT fence_token FROM fencegate_fences AS jf WHERE jf.scope = {scope})");
    format!("{} AND {}", sql_issued_check(scope, token), sql_jump_check(checks.jump, &fence, token))
}

/// The one-scope claim, `$1` scope and `$2` token unless the caller's statement numbers them
/// otherwise; returns the fence's version. `gated`: false only for a lock grant (which issues
/// the token itself, one step at a time, so neither guard applies).
fn scope_claim(rule: Rule, checks: Checks, scope: &str, token: &str, gated: bool) -> String {
    let gate = if gated { scope_gate(checks, scope, token) } else { "TRUE".to_owned() };
    let jump = if gated { checks.jump } else { JumpCap(0) };
    scope_claim_rows(rule, jump, &format!("SELECT {scope}::text, {token}::int8 WHERE {gate}"), "version")
}

/// Reads a live value: `$1` key.
pub const KV_GET: &str = concat!(
    "SELECT value, fence_token, scope, version, ", utc!("updated_at"),
    " FROM fencegate_kv WHERE key = $1 AND NOT deleted"
);

/// The live values of several keys at once (`$1` the keys): `KV_GET`'s columns, key first.
/// Used by read coalescing (`store::reads`).
pub(super) const KV_GET_MANY: &str = concat!(
    "SELECT key, value, fence_token, scope, version, ", utc!("updated_at"),
    " FROM fencegate_kv WHERE key = ANY($1) AND NOT deleted"
);

/// The fenced single-key upsert of an unscoped write (`$1` key, `$2` value, `$3` deleted,
/// `$4` token): the statement fencegate runs for `PUT /v1/kv/{key}`. Public so the load bench
/// runs exactly this against PostgreSQL directly.
pub fn kv_put_sql(rule: Rule) -> String {
    Statements::new(rule, Checks::default()).put_key
}

/// The fenced one-key write under a scope (`$1` key, `$2` value, `$3` deleted, `$4` token,
/// `$5` scope): what fencegate runs for a lone scoped `PUT /v1/kv/{key}`. Public for the bench.
pub fn kv_put_scoped_sql(rule: Rule) -> String {
    Statements::new(rule, Checks::default()).put_scope
}

/// The fenced statements for one rule, built once from fixed text (no request data).
struct Statements {
    /// $1 key, $2 value, $3 deleted, $4 token
    put_key: String,
    /// $1 key, $2 value, $3 deleted, $4 token, $5 scope
    put_scope: String,
    /// $1 keys, $2 values, $3 deleted flags, $4 token, $5 scope
    batch_scope: String,
    /// $1 scope, $2 token: raises the scope's fence for `POST /v1/fences` and table writes.
    claim: String,
    /// $1 scope, $2 token: the claim of a lock grant (no poisoning guards: see [`scope_claim`]).
    grant_claim: String,
}

/// `WHERE` of a kv upsert's `DO UPDATE`: the row's scope admits the write's ([`sql_scope_check`]).
fn kv_scope_check(scopes: ScopeRule) -> String {
    sql_scope_check(scopes, "kv.scope", "EXCLUDED.scope")
}

/// A condition that holds unless the kv row `key_expr` exists and is bound to another scope
/// than `scope_expr`: it gates the scope claim of a write in an autocommit statement, so a
/// write refused for its scope does not raise the scope's fence either. (The upsert checks the
/// binding again on the row it locks: this is the part that keeps the claim from happening.)
/// A row created by another transaction after this statement's snapshot is not seen here; the
/// upsert then refuses the write, and the claim, made with the client's own token for its own
/// scope, is what `POST /v1/fences` would have done.
fn kv_unbound(scopes: ScopeRule, key_expr: &str, scope_expr: &str) -> String {
    match scopes {
        ScopeRule::Free => "TRUE".to_owned(),
        ScopeRule::Sticky => format!(
            "NOT EXISTS (SELECT 1 FROM fencegate_kv AS b WHERE b.key = {key_expr} AND NOT ({check}))",
            check = sql_scope_check(scopes, "b.scope", scope_expr)
        ),
    }
}

/// What a scoped kv write must pass before its autocommit statement may claim the scope: the
/// key is not bound to another scope, and the poisoning guards admit the token.
fn write_claim_gate(checks: Checks, key: &str, scope: &str, token: &str) -> String {
    format!("{} AND {}", kv_unbound(checks.scopes, key, scope), scope_gate(checks, scope, token))
}

/// The jump cap of an unscoped write of `key` with `token`, against the key's own fence.
fn kv_jump(checks: Checks, key: &str, token: &str) -> String {
    sql_jump_check(checks.jump, &format!("(SELECT key_fence FROM fencegate_kv AS jf WHERE jf.key = {key})"), token)
}

impl Statements {
    fn new(rule: Rule, checks: Checks) -> Self {
        let op = sql_fence_op(rule);
        let scope_check = kv_scope_check(checks.scopes);
        // The jump cap again on the row as locked (see `scope_claim_rows`).
        let key_jump = sql_jump_check(checks.jump, "kv.key_fence", "EXCLUDED.key_fence");
        // In an unscoped write, key_fence is set to the token: the WHERE admits it only when
        // `key_fence <op> token`, so GREATEST in KV_ON_CONFLICT keeps it monotone either way.
        // The row to insert exists only if the jump cap admits the token.
        let row = match checks.jump {
            JumpCap(0) => "VALUES ($1, $2, $3, $4, $4, NULL)".to_owned(),
            _ => format!(
                "SELECT $1::text, $2::jsonb, $3::bool, $4::int8, $4::int8, NULL::text WHERE {}",
                kv_jump(checks, "$1::text", "$4::int8")
            ),
        };
        let put_key = format!(
            "INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
             {row}
             {KV_ON_CONFLICT}
             WHERE kv.key_fence {op} EXCLUDED.key_fence AND {scope_check} AND {key_jump}
             RETURNING version"
        );
        // A scoped write leaves the key's own fence alone (key_fence 0 on insert, GREATEST on
        // update): tokens of different fences are never compared.
        let put_scope = format!(
            "WITH claim AS ({claim})
             INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
             SELECT $1, $2, $3, 0, $4, $5 FROM claim
             {KV_ON_CONFLICT}
             WHERE {scope_check}
             RETURNING version",
            claim = scope_claim_rows(
                rule,
                checks.jump,
                &format!("SELECT $5::text, $4::int8 WHERE {}", write_claim_gate(checks, "$1", "$5::text", "$4::int8")),
                "version"
            ),
        );
        // Runs in a transaction that is rolled back unless every key was written, so the claim
        // needs no binding gate: a refused key undoes it.
        let batch_scope = format!(
            "WITH claim AS ({claim})
             INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
             SELECT w.key, w.value, w.deleted, 0, $4, $5
             FROM unnest($1::text[], $2::jsonb[], $3::bool[]) AS w(key, value, deleted), claim
             ORDER BY w.key
             {KV_ON_CONFLICT}
             WHERE {scope_check}
             RETURNING key, version",
            claim = scope_claim(rule, checks, "$5", "$4", true),
        );
        Statements {
            put_key,
            put_scope,
            batch_scope,
            claim: scope_claim(rule, checks, "$1", "$2", true),
            grant_claim: scope_claim(rule, checks, "$1", "$2", false),
        }
    }
}

/// The fenced multi-row upsert of unscoped writes, each row with its own token: used by the
/// coalescer (per-row outcomes) and by unscoped batches (in a transaction, all or nothing).
/// ORDER BY key: concurrent statements lock rows in the same order, so they cannot deadlock.
fn upsert_rows(rule: Rule, checks: Checks) -> String {
    let op = sql_fence_op(rule);
    let scope_check = kv_scope_check(checks.scopes);
    let key_jump = sql_jump_check(checks.jump, "kv.key_fence", "EXCLUDED.key_fence");
    format!(
        "INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
         SELECT w.key, w.value, w.deleted, w.token, w.token, NULL
         FROM unnest($1::text[], $2::jsonb[], $3::bool[], $4::int8[]) AS w(key, value, deleted, token)
         WHERE {jump}
         ORDER BY w.key
         {KV_ON_CONFLICT}
         WHERE kv.key_fence {op} EXCLUDED.key_fence AND {scope_check} AND {key_jump}
         RETURNING key, version",
        jump = kv_jump(checks, "w.key", "w.token"),
    )
}

/// The fenced multi-row upsert of scoped writes, used by the coalescer: `$1` keys, `$2` values,
/// `$3` deleted flags, `$4` tokens, `$5` scopes, one row per write. Each scope appears with
/// one token (the coalescer groups writes that way), so each fence is claimed once; a write is
/// applied iff its scope's claim was admitted, exactly as [`Statements::put_scope`] decides one.
/// Lock order: the fences, by scope (the claim's ORDER BY), then the rows, by key: the sort
/// before the insert consumes every claim before the first row is written. Every other
/// statement that takes both kinds of lock also takes the fence first, so none can deadlock.
/// A scope is claimed only for writes whose keys are not bound to another scope
/// ([`kv_unbound`]): a round whose every write under a scope is refused for its scope leaves
/// that fence alone.
fn upsert_scoped_rows(rule: Rule, checks: Checks) -> String {
    format!(
        "WITH w AS (
             SELECT * FROM unnest($1::text[], $2::jsonb[], $3::bool[], $4::int8[], $5::text[])
                 AS w(key, value, deleted, token, scope)
         ), claim AS ({claim})
         INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
         SELECT w.key, w.value, w.deleted, 0, w.token, w.scope
         FROM w JOIN claim ON claim.scope = w.scope
         ORDER BY w.key
         {KV_ON_CONFLICT}
         WHERE {scope_check}
         RETURNING key, version",
        claim = scope_claim_rows(
            rule,
            checks.jump,
            &format!("SELECT DISTINCT scope, token FROM w WHERE {} ORDER BY scope", write_claim_gate(checks, "w.key", "w.scope", "w.token")),
            "scope"
        ),
        scope_check = kv_scope_check(checks.scopes),
    )
}

#[derive(Clone)]
pub struct PgStore {
    /// Opens, bounds and recycles connections; used directly only to start up (migrations,
    /// catalog). Everything else takes its connection from `conns`.
    pub(super) pool: PgPool,
    pub(super) conns: Arc<Connections>,
    inclusive: Arc<Statements>,
    strict: Arc<Statements>,
    upserts: Arc<Upserts>,
    /// `None` when `database.coalesce_workers = 0`: each write is its own statement.
    coalescer: Option<Coalescer>,
    /// `None` when `database.coalesce_workers = 0`: each read is its own statement.
    reads: Option<Reads>,
    /// Built into the statements; needed again to explain a refusal.
    checks: Checks,
    /// How to connect, for connections outside the pool (the reset listener).
    options: Arc<PgConnectOptions>,
}

impl PgStore {
    /// Connects (failing fast with a message that says what to check) and, if asked, migrates.
    pub async fn connect(settings: &DatabaseSettings, url: &str, checks: Checks) -> anyhow::Result<Self> {
        let shown = crate::config::redact_url(url);
        let options: PgConnectOptions = url
            .parse::<PgConnectOptions>()
            .map_err(|e| anyhow::anyhow!("invalid database URL {shown}: {e}"))?
            // Statements are logged by our own spans; sqlx's per-statement logs are noise.
            .log_statements(tracing::log::LevelFilter::Trace)
            .application_name("fencegate")
            // Defence in depth: no fencegate transaction is ever idle for long, so a session
            // stuck idle in one (a bug) is ended by the server instead of holding row locks.
            .options([("idle_in_transaction_session_timeout", "30s")]);
        let listener_options = options.clone().application_name("fencegate-listener");
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .min_connections(settings.min_connections)
            .acquire_timeout(Duration::from_millis(settings.acquire_timeout_ms))
            .max_lifetime(Duration::from_secs(settings.max_lifetime_secs))
            // A ping before every acquire would double the round trips of each write; a dead
            // connection instead fails its statement with a transient error (503, retry) and
            // is dropped by the pool.
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|e| anyhow::anyhow!(
                "cannot connect to PostgreSQL at {shown}: {e}. Is the server running and the URL right? \
                 (set DATABASE_URL or --database-url)"
            ))?;
        let (inclusive, strict) = (Statements::new(Rule::Inclusive, checks), Statements::new(Rule::Strict, checks));
        let upserts = Arc::new(Upserts {
            rows: [upsert_rows(Rule::Inclusive, checks), upsert_rows(Rule::Strict, checks)],
            single: [inclusive.put_key.clone(), strict.put_key.clone()],
            scoped_rows: [upsert_scoped_rows(Rule::Inclusive, checks), upsert_scoped_rows(Rule::Strict, checks)],
            scoped_single: [inclusive.put_scope.clone(), strict.put_scope.clone()],
        });
        let conns = Arc::new(Connections::new(
            pool.clone(),
            settings.max_connections,
            Duration::from_millis(settings.acquire_timeout_ms),
        ));
        let coalescer = (settings.coalesce_workers > 0).then(|| {
            Coalescer::start(conns.clone(), upserts.clone(), settings.coalesce_workers, settings.coalesce_max_rows)
        });
        let reads = (settings.coalesce_workers > 0)
            .then(|| Reads::start(conns.clone(), settings.coalesce_workers, settings.coalesce_max_rows));
        let store = PgStore {
            pool,
            conns,
            reads,
            inclusive: inclusive.into(),
            strict: strict.into(),
            upserts,
            coalescer,
            checks,
            options: Arc::new(listener_options),
        };
        if settings.migrate_on_start {
            store.migrate().await?;
        }
        Ok(store)
    }

    pub async fn migrate(&self) -> anyhow::Result<()> {
        // sqlx takes an advisory lock, so several fencegate processes may start at once.
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| anyhow::anyhow!("applying migrations failed: {e}"))
    }

    /// Options for a connection of its own, outside the pool and `max_connections` (the reset
    /// listener of `store::admin`), named `fencegate-listener` in `pg_stat_activity`.
    pub(super) fn listener_options(&self) -> PgConnectOptions {
        (*self.options).clone()
    }

    /// The checks besides the accept rule, which the legacy-table statements follow too.
    pub(super) fn checks(&self) -> Checks {
        self.checks
    }

    fn statements(&self, rule: Rule) -> &Statements {
        match rule {
            Rule::Inclusive => &self.inclusive,
            Rule::Strict => &self.strict,
        }
    }

    /// Raises `scope`'s fence to `token` inside the caller's transaction (or as an autocommit
    /// statement) if `rule` and the poisoning guards admit it: `Ok(Some(version))`; else the
    /// refusal, explained from what the same connection reads next.
    pub(super) async fn claim_scope(
        &self,
        conn: &mut sqlx::PgConnection,
        scope: &Scope,
        token: FencingToken,
        rule: Rule,
    ) -> Result<Result<i64, Refusal>, StoreError> {
        let claimed: Option<i64> = sqlx::query_scalar(&self.statements(rule).claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(version) = claimed {
            return Ok(Ok(version));
        }
        let (scope_fence, latest_issued) = scope_state(conn, scope).await?;
        let guard = Guard { token, target: Target::Scope(scope.clone()), rule };
        let seen = Seen { keys: HashMap::new(), scope_fence, latest_issued };
        explain_refusal(&[], &seen, &guard, self.checks).map(Err)
    }

    pub fn pool_stats(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle() + self.conns.idle_count())
    }

    /// Ready = reachable and every migration this binary knows is applied.
    pub async fn ready(&self) -> Result<(), StoreError> {
        let mut conn = self.conns.take().await?;
        let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut *conn)
            .await?;
        conn.done();
        let known = MIGRATOR.iter().count() as i64;
        if applied < known {
            return Err(StoreError::Corrupt(format!(
                "{applied} of {known} migrations applied; run `fencegate migrate`"
            )));
        }
        Ok(())
    }

    /// Whether `write` sends writes through the coalescer (coalescing on). Such a write is
    /// safe to run on the request's own task: see `Store::write`.
    pub(super) fn coalesces(&self) -> bool {
        self.coalescer.is_some()
    }

    /// Applies one fenced write. Coalesced writes may run on the request's task (the
    /// statement runs on a coalescer worker; only the refusal's explanation, a plain read,
    /// runs here); every other path must run detached (`Store` does both).
    pub async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError> {
        let (key, value) = match write {
            Write::Put { key, value } => (key, Some(value)),
            Write::Delete { key } => (key, None),
        };
        let deleted = value.is_none();
        let sql = self.statements(guard.rule);
        let version: Option<i64> = match (&guard.target, &self.coalescer) {
            (_, Some(coalescer)) => {
                coalescer.write(key.clone(), value, guard.token, guard.rule, guard.scope().cloned()).await?
            }
            (target, None) => {
                let (statement, scope) = match target {
                    Target::Key => (&sql.put_key, None),
                    Target::Scope(scope) => (&sql.put_scope, Some(scope)),
                };
                let mut query = sqlx::query_scalar(statement)
                    .bind(key.as_str())
                    .bind(value.as_ref().map(Json))
                    .bind(deleted)
                    .bind(guard.token.get());
                if let Some(scope) = scope {
                    query = query.bind(scope.as_str());
                }
                let mut conn = self.conns.take().await?;
                let version = query.fetch_optional(&mut *conn).await?;
                conn.done();
                version
            }
        };
        match version {
            Some(version) => Ok(Outcome::Accepted(Written { key, was_live: version != 1, version })),
            None => Ok(self.refusal(std::slice::from_ref(&key), guard).await?.outcome()),
        }
    }

    pub async fn batch(&self, writes: &[Write], guard: &Guard) -> Result<Outcome<Vec<Written>>, StoreError> {
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let outcome = self.batch_in(&mut tx, writes, guard).await?;
        match &outcome {
            Ok(_) => tx.commit().await?,
            Err(_) => tx.rollback().await?,
        }
        conn.done();
        match outcome {
            Ok(written) => Ok(Outcome::Accepted(written)),
            Err(refused) => Ok(self.refusal(&refused, guard).await?.outcome()),
        }
    }

    /// The kv part of a batch, inside the caller's transaction (a batch may also write legacy
    /// tables, see `store::tables`). `Err` lists the refused keys: nothing may then be committed.
    pub(super) async fn batch_in(
        &self,
        tx: &mut sqlx::PgConnection,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Result<Vec<Written>, Vec<Key>>, StoreError> {
        // One row per key (ON CONFLICT cannot touch a row twice in a statement): the last
        // write to a key is its effect on the store. BTreeMap also sorts keys for lock order.
        let mut last: BTreeMap<&Key, &Write> = BTreeMap::new();
        for write in writes {
            last.insert(write.key(), write);
        }
        let mut keys = Vec::with_capacity(last.len());
        let mut values = Vec::with_capacity(last.len());
        let mut deleted = Vec::with_capacity(last.len());
        for (key, write) in &last {
            keys.push(key.as_str());
            match write {
                Write::Put { value, .. } => {
                    values.push(Some(Json(value)));
                    deleted.push(false);
                }
                Write::Delete { .. } => {
                    values.push(None);
                    deleted.push(true);
                }
            }
        }
        let sql = self.statements(guard.rule);
        let rows = match &guard.target {
            Target::Key => sqlx::query(self.upserts.for_rule(guard.rule))
                .bind(&keys)
                .bind(&values)
                .bind(&deleted)
                .bind(vec![guard.token.get(); keys.len()])
                .fetch_all(&mut *tx)
                .await?,
            Target::Scope(scope) => sqlx::query(&sql.batch_scope)
                .bind(&keys)
                .bind(&values)
                .bind(&deleted)
                .bind(guard.token.get())
                .bind(scope.as_str())
                .fetch_all(&mut *tx)
                .await?,
        };
        if rows.len() != keys.len() {
            let mut applied = std::collections::HashSet::with_capacity(rows.len());
            for row in &rows {
                applied.insert(row.try_get::<&str, _>(0)?);
            }
            let refused: Vec<Key> =
                last.keys().filter(|k| !applied.contains(k.as_str())).map(|k| (*k).clone()).collect();
            return Ok(Err(refused));
        }
        // Rows come back in no guaranteed order: map each to its key by name, not by position.
        let by_name: HashMap<&str, &Key> = last.keys().map(|k| (k.as_str(), *k)).collect();
        let mut written = Vec::with_capacity(rows.len());
        for row in rows {
            let key: &str = row.try_get(0)?;
            let version: i64 = row.try_get(1)?;
            let key = by_name
                .get(key)
                .map(|k| (*k).clone())
                .ok_or_else(|| StoreError::Corrupt(format!("batch returned an unknown key {key:?}")))?;
            written.push(Written { key, was_live: version != 1, version });
        }
        Ok(Ok(written))
    }

    /// Explains a refusal: reads the refused keys (their scope and own fence) and, for a scoped
    /// write, the scope's fence, and lets [`explain_refusal`] decide.
    pub(super) async fn refusal(&self, keys: &[Key], guard: &Guard) -> Result<Refusal, StoreError> {
        let names: Vec<&str> = keys.iter().map(Key::as_str).collect();
        let mut conn = self.conns.take().await?;
        let rows = sqlx::query("SELECT key, key_fence, scope FROM fencegate_kv WHERE key = ANY($1)")
            .bind(&names)
            .fetch_all(&mut *conn)
            .await?;
        conn.done();
        let mut seen = Seen { keys: HashMap::with_capacity(rows.len()), scope_fence: None, latest_issued: None };
        for row in &rows {
            let key: &str = row.try_get(0)?;
            seen.keys.insert(key, KeyState { key_fence: token_from_db(row.try_get(1)?)?, scope: row.try_get(2)? });
        }
        if let Some(scope) = guard.scope() {
            let mut conn = self.conns.take().await?;
            (seen.scope_fence, seen.latest_issued) = scope_state(&mut conn, scope).await?;
            conn.done();
        }
        explain_refusal(keys, &seen, guard, self.checks)
    }

    /// The coalescing reader, if on (`database.coalesce_workers > 0`). A read through it is
    /// safe to run on the request's own task: a worker owns the statement.
    pub(super) fn reads(&self) -> Option<&Reads> {
        self.reads.as_ref()
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        if let Some(reads) = &self.reads {
            return reads.get(key.clone()).await;
        }
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(KV_GET).bind(key.as_str()).fetch_optional(&mut *conn).await?;
        conn.done();
        row.map(|row| entry_from(&row, 0)).transpose()
    }

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    pub async fn claim(&self, scope: &Scope, token: FencingToken) -> Result<Outcome<Claimed>, StoreError> {
        let mut conn = self.conns.take().await?;
        let claimed = self.claim_scope(&mut conn, scope, token, Rule::Inclusive).await?;
        conn.done();
        Ok(match claimed {
            Ok(version) => Outcome::Accepted(Claimed { created: version == 1 }),
            Err(refusal) => refusal.outcome(),
        })
    }

    pub async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError> {
        let mut conn = self.conns.take().await?;
        let current: Option<i64> = sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = $1")
            .bind(scope.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        current.map(token_from_db).transpose()
    }
}

/// Grants a free or expired lock. `$4` is the scope's current fence, so the new token exceeds
/// both every earlier grant and the fence (the claim that follows must succeed).
const ACQUIRE: &str = concat!("
    INSERT INTO fencegate_locks AS l (name, owner, token, expires_at, granted_at, actor)
    VALUES ($1, $2, $4 + 1, now() + $3 * interval '1 millisecond', now(), $5)
    ON CONFLICT (name) DO UPDATE SET
        owner = EXCLUDED.owner,
        actor = EXCLUDED.actor,
        token = GREATEST(l.token, $4) + 1,
        expires_at = EXCLUDED.expires_at,
        granted_at = now()
    WHERE l.owner IS NULL OR l.expires_at <= now()
    RETURNING token, ", utc!("expires_at"));

const HOLDER: &str = "
    SELECT owner, GREATEST(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint, token, actor
    FROM fencegate_locks WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()";

const RENEW: &str = concat!("
    UPDATE fencegate_locks SET expires_at = now() + $3 * interval '1 millisecond'
    WHERE name = $1 AND token = $2 AND owner IS NOT NULL AND expires_at > now()
        AND ($4::text IS NULL OR actor IS NULL OR actor = $4)
    RETURNING owner, ", utc!("expires_at"));

/// Frees the lock (the row stays: its token keeps later grants increasing). The CTE reads the
/// owner before the UPDATE clears it.
const RELEASE: &str = concat!("
    WITH held AS (
        SELECT owner FROM fencegate_locks
        WHERE name = $1 AND token = $2 AND owner IS NOT NULL AND expires_at > now()
            AND ($3::text IS NULL OR actor IS NULL OR actor = $3)
        FOR UPDATE
    )
    UPDATE fencegate_locks AS l SET owner = NULL, expires_at = NULL, actor = NULL
    FROM held WHERE l.name = $1
    RETURNING held.owner, ", utc!("now()"));

impl PgStore {
    pub async fn acquire(&self, name: &Scope, owner: &str, ttl: Ttl, actor: Option<&str>) -> Result<Acquired, StoreError> {
        // A claim of the same scope running concurrently can raise the fence between our read
        // and our claim; then the claim refuses and we recompute. Bounded: each retry means
        // someone else made progress.
        for _ in 0..5 {
            let mut conn = self.conns.take().await?;
            let mut tx = conn.begin().await?;
            // Locks the fence row (if any) so claims of this scope wait for our grant.
            let fence: Option<i64> =
                sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = $1 FOR UPDATE")
                    .bind(name.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            // The fence row is locked: nobody can raise it to the maximum under us.
            if fence == Some(i64::MAX) {
                tx.rollback().await?;
                conn.done();
                return Ok(Acquired::Exhausted);
            }
            let granted = sqlx::query(ACQUIRE)
                .bind(name.as_str())
                .bind(owner)
                .bind(ttl.ms())
                .bind(fence.unwrap_or(0))
                .bind(actor)
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = granted else {
                tx.rollback().await?;
                conn.done();
                match self.holder(name).await? {
                    Some(holder) => return Ok(Acquired::Held(holder)),
                    None => continue, // expired or released just now: try again
                }
            };
            let token = token_from_db(row.try_get(0)?)?;
            // The grant claims the scope through the same statement as POST /v1/fences.
            let claimed: Option<i64> = sqlx::query_scalar(&self.inclusive.grant_claim)
                .bind(name.as_str())
                .bind(token.get())
                .fetch_optional(&mut *tx)
                .await?;
            if claimed.is_none() {
                tx.rollback().await?;
                conn.done();
                continue;
            }
            tx.commit().await?;
            conn.done();
            return Ok(Acquired::Granted(Lease {
                name: name.clone(),
                owner: owner.to_owned(),
                token,
                expires_at: row.try_get(1)?,
            }));
        }
        Err(StoreError::Unavailable(sqlx::Error::Protocol(
            "lock acquisition kept racing with concurrent claims; retry".into(),
        )))
    }

    pub(crate) async fn holder(&self, name: &Scope) -> Result<Option<Holder>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(HOLDER).bind(name.as_str()).fetch_optional(&mut *conn).await?;
        conn.done();
        row.map(|row| {
            Ok(Holder {
                owner: row.try_get(0)?,
                remaining_ms: row.try_get(1)?,
                token: token_from_db(row.try_get(2)?)?,
                actor: row.try_get(3)?,
            })
        })
        .transpose()
    }

    /// `None` if `token` does not hold the lease (expired, released, taken over), or `actor`
    /// is given and another actor took it.
    pub async fn renew(&self, name: &Scope, token: FencingToken, ttl: Ttl, actor: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(RENEW)
            .bind(name.as_str())
            .bind(token.get())
            .bind(ttl.ms())
            .bind(actor)
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        lease_from(name, token, row)
    }

    /// `None` if `token` does not hold the lease, or `actor` is given and another actor took it.
    pub async fn release(&self, name: &Scope, token: FencingToken, actor: Option<&str>) -> Result<Option<Lease>, StoreError> {
        let mut conn = self.conns.take().await?;
        let row =
            sqlx::query(RELEASE).bind(name.as_str()).bind(token.get()).bind(actor).fetch_optional(&mut *conn).await?;
        conn.done();
        lease_from(name, token, row)
    }
}

/// A scope's fence and the latest token granted by the built-in lock of that name, if any:
/// what explains a refused claim.
async fn scope_state(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
) -> Result<(Option<FencingToken>, Option<FencingToken>), StoreError> {
    scope_state_from(sqlx::query_as(SCOPE_STATE).bind(scope.as_str()).fetch_one(&mut *conn).await?)
}

/// A lease from a RENEW/RELEASE row (owner, expires_at).
fn lease_from(name: &Scope, token: FencingToken, row: Option<sqlx::postgres::PgRow>) -> Result<Option<Lease>, StoreError> {
    row.map(|row| Ok(Lease { name: name.clone(), owner: row.try_get(0)?, token, expires_at: row.try_get(1)? }))
        .transpose()
}

/// An [`Entry`] from a row of `KV_GET` (`first` = 0) or `KV_GET_MANY` (`first` = 1, after
/// the key): value, fence_token, scope, version, updated_at.
pub(super) fn entry_from(row: &sqlx::postgres::PgRow, first: usize) -> Result<Entry, StoreError> {
    let Json(value): Json<serde_json::Value> = row.try_get(first)?;
    Ok(Entry {
        value,
        fence_token: token_from_db(row.try_get(first + 1)?)?,
        scope: row.try_get(first + 2)?,
        version: row.try_get(first + 3)?,
        updated_at: row.try_get(first + 4)?,
    })
}
