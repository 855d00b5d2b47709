//! Every PostgreSQL statement fencegate runs, and the shapes of the rows they return.
//!
//! Built once at start-up from fixed text and validated configuration, never from request
//! data; every value is a bound parameter. The fence check is spelled once for both rules
//! (`store::sql::fence_admits`), and so are the scope and poisoning checks; each
//! statement below is assembled from them.
//!
//! - unscoped write: `INSERT .. ON CONFLICT (key) DO UPDATE .. WHERE kv.key_fence <= $token
//!   AND kv.scope IS NOT DISTINCT FROM NULL`; no row back means the key refused it;
//! - scoped write: a data-modifying CTE raises the scope's fence (with the same kind of `WHERE`),
//!   and the kv upsert selects `FROM` that CTE, so it writes nothing if the claim was refused.
//!   The claim itself only runs if the key is not bound to another scope, and the upsert's
//!   `WHERE` checks the binding again on the row it locked. The fence row stays locked until
//!   commit, which serializes writers of one scope;
//! - batch: the same statements over `unnest(..)` arrays; an unscoped batch runs in a
//!   transaction that is rolled back if any key was refused (all or nothing).
//!
//! The jump cap of a scope is checked twice in each statement, where SQLite's (`sqlite/sql.rs`)
//! check it once: in the row to insert, on the statement's snapshot, and again in the
//! `DO UPDATE .. WHERE`, on the row as locked. Under READ COMMITTED the snapshot is taken when
//! the statement starts, before it waits for the row lock, and an admin reset (the only thing
//! that lowers a fence) may commit in between: the first check would then measure the jump from
//! the old, higher fence and admit a token the lowered fence must refuse. The second sees the
//! row as the reset left it. SQLite needs no second check: a writing statement there holds the
//! database's one write lock from before it reads anything, so its snapshot is the locked row.
//!
//! A key's own jump cap is checked on the row as locked (`DO UPDATE .. WHERE`) and, for a key
//! the write creates, by the trigger `fencegate_kv_created` (migrations `kv_jump_on_insert`, `kv_jump_typed`):
//! a new key's fence counts as 0, so its token may not exceed the cap. The statement tells the
//! trigger the cap (the setting `fencegate.kv_jump_cap`, transaction-local, set in the
//! statement itself so that a pooler cannot lose it, and only if the trigger is there and
//! enabled: otherwise the statement writes nothing; without a cap, set to nothing, so that a
//! value left on the role or database never applies), and the trigger refuses with SQLSTATE
//! [`KEY_JUMP_SQLSTATE`](super::errors::KEY_JUMP_SQLSTATE) (the token and the key in the error's
//! own fields: `pg/errors.rs`), which aborts the statement:
//! nothing of it is committed; the coalescer answers that write and applies the others again.
//! Checking new keys in the row to insert instead would look every key up once more before the
//! upsert's own lookup, and that was most of what the cap cost a coalesced write (one index
//! lookup per row).

use sqlx::{types::Json, Row};

use crate::{
    fence::{JumpCap, Rule, ScopeRule},
    store::{
        sql::{fence_admits, sql_issued_check, sql_jump_check, sql_scope_check},
        token_from_db, Checks, Entry, StoreError,
    },
};

/// A timestamptz column as RFC 3339 UTC text, as the API shows it.
macro_rules! utc {
    ($col:literal) => {
        concat!(
            "to_char(",
            $col,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        )
    };
}

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
/// statement's snapshot, and a reset may lower the fence in between: module docs);
/// `JumpCap(0)` for grants.
fn scope_claim_rows(rule: Rule, jump: JumpCap, rows: &str, returning: &str) -> String {
    format!(
        "INSERT INTO fencegate_fences AS f (scope, fence_token) {rows}
         ON CONFLICT (scope) DO UPDATE SET
             fence_token = EXCLUDED.fence_token, version = f.version + 1, updated_at = now()
         WHERE {admits} AND {jump}
         RETURNING {returning}",
        admits = fence_admits(rule, "f.fence_token", "EXCLUDED.fence_token"),
        jump = sql_jump_check(jump, "f.fence_token", "EXCLUDED.fence_token"),
    )
}

/// The poisoning guards of a write or claim under scope `scope` with token `token`: a token
/// the built-in lock of that name never issued, or one that jumps too far past the fence, may
/// not raise it.
fn scope_gate(checks: &Checks, scope: &str, token: &str) -> String {
    let fence =
        format!("(SELECT fence_token FROM fencegate_fences AS jf WHERE jf.scope = {scope})");
    format!(
        "{} AND {}",
        sql_issued_check(scope, token, &checks.reserved),
        sql_jump_check(checks.jump, &fence, token)
    )
}

/// The one-scope claim, `$1` scope and `$2` token unless the caller's statement numbers them
/// otherwise; returns the fence's version. `gated`: false only for a lock grant (which issues
/// the token itself, one step at a time, so neither guard applies).
fn scope_claim(rule: Rule, checks: &Checks, scope: &str, token: &str, gated: bool) -> String {
    let gate = if gated {
        scope_gate(checks, scope, token)
    } else {
        "TRUE".to_owned()
    };
    let jump = if gated { checks.jump } else { JumpCap(0) };
    scope_claim_rows(
        rule,
        jump,
        &format!("SELECT {scope}::text, {token}::int8 WHERE {gate}"),
        "version",
    )
}

/// Reads a live value: `$1` key.
pub const KV_GET: &str = concat!(
    "SELECT value, fence_token, scope, version, ",
    utc!("updated_at"),
    " FROM fencegate_kv WHERE key = $1 AND NOT deleted"
);

/// The live values of several keys at once (`$1` the keys): `KV_GET`'s columns, key first.
/// Used by read coalescing (`reads`).
pub(super) const KV_GET_MANY: &str = concat!(
    "SELECT key, value, fence_token, scope, version, ",
    utc!("updated_at"),
    " FROM fencegate_kv WHERE key = ANY($1) AND NOT deleted"
);

/// The fenced statements for one rule, built once from fixed text (no request data): every
/// kv write path (lone, coalesced, batched) and every claim takes its statement from here.
pub(super) struct Statements {
    /// $1 key, $2 value, $3 deleted, $4 token: one unscoped write (lone or coalesced alone).
    pub put_key: String,
    /// $1 key, $2 value, $3 deleted, $4 token, $5 scope: one scoped write.
    pub put_scope: String,
    /// $1 keys, $2 values, $3 deleted flags, $4 tokens: unscoped writes, each with its own
    /// token (a coalesced round). A key it would create above the jump cap aborts it (SQLSTATE
    /// [`KEY_JUMP_SQLSTATE`](super::errors::KEY_JUMP_SQLSTATE)).
    pub rows: String,
    /// As `rows`, for an unscoped batch (one token for every row): a key it would create above
    /// the jump cap is left out (a missing row), and the transaction stays usable; unless the
    /// key was deleted concurrently, after the statement's snapshot: then it aborts, as `rows`.
    pub batch_rows: String,
    /// $1 keys, $2 values, $3 deleted flags, $4 tokens, $5 scopes: a coalesced round of scoped
    /// writes, each scope with one token.
    pub scoped_rows: String,
    /// `put_scope` and `scoped_rows` as a coalescing worker runs them: they wait at most
    /// [`BRIEF_LOCK_WAIT_MS`] for a row lock (then SQLSTATE 55P03, nothing written), so a fence
    /// row held by another transaction never holds up the worker and the writes queued behind
    /// it (`coalesce`: the writes under a held scope go on in a lane of their own).
    pub put_scope_brief: String,
    pub scoped_rows_brief: String,
    /// $1 keys, $2 values, $3 deleted flags, $4 token, $5 scope: a scoped batch.
    pub batch_scope: String,
    /// $1 scope, $2 token: raises the scope's fence for `POST /v1/fences` and table writes.
    pub claim: String,
    /// $1 scope, $2 token: the claim of a lock grant (no poisoning guards: see [`scope_claim`]).
    pub grant_claim: String,
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
fn write_claim_gate(checks: &Checks, key: &str, scope: &str, token: &str) -> String {
    format!(
        "{} AND {}",
        kv_unbound(checks.scopes, key, scope),
        scope_gate(checks, scope, token)
    )
}

/// The longest a coalesced scoped statement waits for a row lock, in milliseconds. A fence row
/// that fencegate's own statements hold is free again within a commit; one held longer is held by
/// another transaction (a SQL writer's after `fencegate.fence()`, or a lock grant's).
pub(super) const BRIEF_LOCK_WAIT_MS: u64 = 20;

/// A CTE `brief` that sets the transaction's `lock_timeout` to [`BRIEF_LOCK_WAIT_MS`]: a
/// statement whose claim selects its rows `FROM brief` (directly or through a CTE that does)
/// sets it before it takes its first lock. Local to the statement's own transaction: an
/// autocommit statement leaves the session's `lock_timeout` as it was.
fn brief_lock_wait_cte() -> String {
    format!(
        "brief AS MATERIALIZED (SELECT pg_catalog.set_config('lock_timeout', '{BRIEF_LOCK_WAIT_MS}ms', true))"
    )
}

/// The `pg_catalog.pg_trigger` row of the trigger that applies the jump cap to new keys: read by
/// every unscoped statement with a cap ([`key_jump_cte`]) and by [`NEW_KEY_TRIGGER_STATE`].
macro_rules! new_key_trigger {
    () => {
        "pg_catalog.pg_trigger WHERE tgrelid = 'fencegate_kv'::regclass AND tgname = 'fencegate_kv_created'"
    };
}

/// `tgenabled` of the trigger that applies the jump cap to new keys (no row: missing): what
/// explains an unscoped write that was not written and that nothing else refuses.
pub(super) const NEW_KEY_TRIGGER_STATE: &str =
    concat!("SELECT tgenabled::text FROM ", new_key_trigger!());

/// The jump cap of the keys an unscoped kv upsert creates, told to the trigger (module docs): a
/// `WITH` to put before the `INSERT`, whose one-row CTE `cap` the statement's rows must be
/// selected `FROM`. It sets `fencegate.kv_jump_cap` once, before the first row is read
/// (`MATERIALIZED`). Every unscoped statement sets it, to nothing without a cap: a value the
/// setting has for fencegate's role or database (`ALTER ROLE .. SET`) never applies to
/// fencegate's writes. With a cap, the CTE yields its row only if the trigger is there and
/// enabled ALWAYS: if it was dropped or disabled, or the migration is not applied, the CTE is
/// empty and so is the statement's row source, so nothing is written (fail closed; the writes
/// are answered 503, naming the trigger: `kv.rs`, `refusal`). The statement holds its lock on
/// `fencegate_kv` from before this reads the catalog, and `DISABLE TRIGGER` must wait for it.
/// The cap is a number from the validated configuration, never request text.
fn key_jump_cte(checks: &Checks) -> String {
    match checks.jump {
        JumpCap(0) => "WITH cap AS MATERIALIZED (SELECT pg_catalog.set_config('fencegate.kv_jump_cap', '', true)) ".to_owned(),
        JumpCap(cap) => format!(
            "WITH cap AS MATERIALIZED (
                 SELECT pg_catalog.set_config('fencegate.kv_jump_cap', '{cap}', true) FROM {trigger} AND tgenabled = 'A') ",
            trigger = new_key_trigger!()
        ),
    }
}

impl Statements {
    pub fn new(rule: Rule, checks: &Checks) -> Self {
        let admits = fence_admits(rule, "kv.key_fence", "EXCLUDED.key_fence");
        let scope_check = kv_scope_check(checks.scopes);
        // The jump cap of a key that exists, on the row as locked (module docs).
        let key_jump = sql_jump_check(checks.jump, "kv.key_fence", "EXCLUDED.key_fence");
        // In an unscoped write, key_fence is set to the token: the WHERE admits it only when
        // the fence admits the token, so GREATEST in KV_ON_CONFLICT keeps it monotone either way.
        // A key this creates is checked against the jump cap by the trigger (module docs).
        let cap = key_jump_cte(checks);
        let put_key = format!(
            "{cap}INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
             SELECT $1::text, $2::jsonb, $3::bool, $4::int8, $4::int8, NULL::text FROM cap
             {KV_ON_CONFLICT}
             WHERE {admits} AND {scope_check} AND {key_jump}
             RETURNING version"
        );
        // A scoped write leaves the key's own fence alone (key_fence 0 on insert, GREATEST on
        // update): tokens of different fences are never compared.
        let put_scope_with = |brief: bool| {
            let (with, from) = if brief {
                (format!("{}, ", brief_lock_wait_cte()), " FROM brief")
            } else {
                (String::new(), "")
            };
            format!(
                "WITH {with}claim AS ({claim})
                 INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
                 SELECT $1, $2, $3, 0, $4, $5 FROM claim
                 {KV_ON_CONFLICT}
                 WHERE {scope_check}
                 RETURNING version",
                claim = scope_claim_rows(
                    rule,
                    checks.jump,
                    &format!(
                        "SELECT $5::text, $4::int8{from} WHERE {}",
                        write_claim_gate(checks, "$1", "$5::text", "$4::int8")
                    ),
                    "version"
                ),
            )
        };
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
            put_scope: put_scope_with(false),
            put_scope_brief: put_scope_with(true),
            rows: upsert_rows(rule, checks, NewKeys::Trigger),
            batch_rows: upsert_rows(rule, checks, NewKeys::LookupThenTrigger),
            scoped_rows: upsert_scoped_rows(rule, checks, false),
            scoped_rows_brief: upsert_scoped_rows(rule, checks, true),
            batch_scope,
            claim: scope_claim(rule, checks, "$1", "$2", true),
            grant_claim: scope_claim(rule, checks, "$1", "$2", false),
        }
    }
}

/// How an unscoped upsert checks the jump cap of the keys it creates (module docs).
#[derive(Clone, Copy)]
enum NewKeys {
    /// The trigger refuses them, aborting the statement: for the coalescer's statements, which
    /// answer per row (an abort answers the write it names and applies the others again). A lone
    /// write's statement (`put_key`) checks new keys the same way.
    Trigger,
    /// A lookup of every key before the insert leaves a refused one out of the rows, so it comes
    /// back as a missing row and the transaction stays usable: for a batch, whose transaction
    /// goes on to judge its table rows and decides all or nothing. One index lookup per row more.
    /// The lookup reads the statement's snapshot: a key it sees that another transaction deletes
    /// before the insert is created after all, and the trigger refuses it (aborting the batch's
    /// transaction, which is then refused whole).
    LookupThenTrigger,
}

/// The fenced multi-row upsert of unscoped writes, each row with its own token: used by the
/// coalescer (per-row outcomes, `NewKeys::Trigger`) and by unscoped batches (in a transaction,
/// all or nothing, `NewKeys::LookupThenTrigger`).
/// ORDER BY key: concurrent statements lock rows in the same order, so they cannot deadlock.
fn upsert_rows(rule: Rule, checks: &Checks, new_keys: NewKeys) -> String {
    let admits = fence_admits(rule, "kv.key_fence", "EXCLUDED.key_fence");
    let scope_check = kv_scope_check(checks.scopes);
    let key_jump = sql_jump_check(checks.jump, "kv.key_fence", "EXCLUDED.key_fence");
    let cap = key_jump_cte(checks);
    let filter = match new_keys {
        NewKeys::Trigger => String::new(),
        NewKeys::LookupThenTrigger => {
            let fence = "(SELECT key_fence FROM fencegate_kv AS jf WHERE jf.key = w.key)";
            format!("WHERE {}", sql_jump_check(checks.jump, fence, "w.token"))
        }
    };
    format!(
        "{cap}INSERT INTO fencegate_kv AS kv (key, value, deleted, key_fence, fence_token, scope)
         SELECT w.key, w.value, w.deleted, w.token, w.token, NULL
         FROM unnest($1::text[], $2::jsonb[], $3::bool[], $4::int8[]) AS w(key, value, deleted, token), cap
         {filter}
         ORDER BY w.key
         {KV_ON_CONFLICT}
         WHERE {admits} AND {scope_check} AND {key_jump}
         RETURNING key, version"
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
/// that fence alone. `brief`: the coalescing worker's form, which waits at most
/// [`BRIEF_LOCK_WAIT_MS`] for a lock (`w` reads `brief` first).
fn upsert_scoped_rows(rule: Rule, checks: &Checks, brief: bool) -> String {
    let (with, from) = if brief {
        (format!("{}, ", brief_lock_wait_cte()), "brief, ")
    } else {
        (String::new(), "")
    };
    format!(
        "WITH {with}w AS (
             SELECT w.* FROM {from}unnest($1::text[], $2::jsonb[], $3::bool[], $4::int8[], $5::text[])
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
            &format!(
                "SELECT DISTINCT scope, token FROM w WHERE {} ORDER BY scope",
                write_claim_gate(checks, "w.key", "w.scope", "w.token")
            ),
            "scope"
        ),
        scope_check = kv_scope_check(checks.scopes),
    )
}

/// Grants a free or expired lock. `$4` is the scope's current fence, so the new token exceeds
/// both every earlier grant and the fence (the claim that follows must succeed).
/// `$6`: the instant of the decision ([`LOCK_TOKEN_AND_CLOCK`], read once the fence row is locked, so a
/// grant that waited for the row does not start its lease in the past).
pub(super) const ACQUIRE: &str = concat!("
    INSERT INTO fencegate_locks AS l (name, owner, token, expires_at, granted_at, actor)
    VALUES ($1, $2, $4 + 1, to_timestamp($6 / 1000000.0) + $3 * interval '1 millisecond', to_timestamp($6 / 1000000.0), $5)
    ON CONFLICT (name) DO UPDATE SET
        owner = EXCLUDED.owner,
        actor = EXCLUDED.actor,
        token = GREATEST(l.token, $4) + 1,
        expires_at = EXCLUDED.expires_at,
        granted_at = EXCLUDED.granted_at,
        retired = false
    WHERE l.owner IS NULL OR l.expires_at <= to_timestamp($6 / 1000000.0)
    RETURNING token, ", utc!("expires_at"));

/// Creates a scope's fence at 0 if it has none, so that an acquire can lock it (undone with
/// the acquire's transaction unless it grants).
pub(super) const ENSURE_FENCE: &str = "INSERT INTO fencegate_fences (scope, fence_token) VALUES ($1, 0) ON CONFLICT (scope) DO NOTHING";

/// Held: judged at `$2` ([`LOCK_TOKEN_AND_CLOCK`] microseconds: in an acquire, the instant its grant was
/// refused) or, when `$2` is NULL, at `now()`; the time left is counted from the clock as it is,
/// so it never exceeds the lease.
pub(super) const HOLDER: &str = "
    SELECT owner, GREATEST(0, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000))::bigint, token, actor
    FROM fencegate_locks
    WHERE name = $1 AND owner IS NOT NULL AND expires_at > COALESCE(to_timestamp($2 / 1000000.0), now())";

pub(super) const RENEW: &str = concat!(
    "
    UPDATE fencegate_locks SET expires_at = now() + $3 * interval '1 millisecond'
    WHERE name = $1 AND token = $2 AND owner IS NOT NULL AND expires_at > now()
        AND ($4::text IS NULL OR actor IS NULL OR actor = $4)
    RETURNING owner, ",
    utc!("expires_at")
);

/// Frees the lock (the row stays: its token keeps later grants increasing). The CTE reads the
/// owner before the UPDATE clears it.
pub(super) const RELEASE: &str = concat!(
    "
    WITH held AS (
        SELECT owner FROM fencegate_locks
        WHERE name = $1 AND token = $2 AND owner IS NOT NULL AND expires_at > now()
            AND ($3::text IS NULL OR actor IS NULL OR actor = $3)
        FOR UPDATE
    )
    UPDATE fencegate_locks AS l SET owner = NULL, expires_at = NULL, actor = NULL
    FROM held WHERE l.name = $1
    RETURNING held.owner, ",
    utc!("now()")
);

/// An [`Entry`] from a row of `KV_GET` (`first` = 0) or `KV_GET_MANY` (`first` = 1, after
/// the key): value, fence_token, scope, version, updated_at.
pub(super) fn entry_from(row: &sqlx::postgres::PgRow, first: usize) -> Result<Entry, StoreError> {
    let Json(value): Json<serde_json::Value> = row.try_get(first)?;
    Ok(Entry {
        value: std::sync::Arc::new(value),
        fence_token: token_from_db(row.try_get(first + 1)?)?,
        scope: row.try_get(first + 2)?,
        version: row.try_get(first + 3)?,
        updated_at: row.try_get(first + 4)?,
    })
}

/// A scope's fence: `$1` the scope.
pub(super) const FENCE: &str = "SELECT fence_token FROM fencegate_fences WHERE scope = $1";

/// Read by an acquire once the fence row is held, in one round trip: the latest token the
/// built-in lock `$1` granted (NULL: never), the database's clock now, in microseconds since
/// the epoch (the instant the grant is decided at), and whether the lock still names an owner
/// (a grant then takes over a lease that lapsed without a release: `fencegate_lock_takeovers_total`).
pub(super) const LOCK_TOKEN_AND_CLOCK: &str =
    "SELECT (SELECT token FROM fencegate_locks WHERE name = $1),
    (extract(epoch FROM clock_timestamp()) * 1000000)::int8,
    COALESCE((SELECT owner IS NOT NULL FROM fencegate_locks WHERE name = $1), false)";

/// A scope's fence, locked until the transaction ends (an acquire: claims of the scope wait).
pub(super) const FENCE_FOR_UPDATE: &str =
    "SELECT fence_token FROM fencegate_fences WHERE scope = $1 FOR UPDATE";

/// What explains a refused kv write: the refused keys' own fences and scopes (`$1` the keys).
pub(super) const KV_REFUSED: &str =
    "SELECT key, key_fence, scope FROM fencegate_kv WHERE key = ANY($1)";
