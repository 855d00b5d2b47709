//! SQL writers fenced too (docs/tables.md, *Fencing SQL writers*): what fencegate keeps in the
//! database for `fencegate.fence(scope, token)` and the guard triggers.
//!
//! - [`sync`], at every start on a primary, in one transaction (several processes may start at
//!   once: an advisory lock serializes them): the configuration's guards where `fence()` reads
//!   them, the bodies of `fence()` and of the guard's function written from the Rust rules
//!   ([`functions`]), the `[[auth.roles]]` and EXECUTE on `fence()` granted to exactly them;
//! - [`guards`]: each `[[resources]]` table's row in `fencegate_guards` (mode, scope), and its
//!   trigger checked (or installed where fencegate's role can, else start-up stops with the
//!   owner's DDL);
//! - [`seen`]: what SQL writers ran into, for the metrics, the log and the console: refusals
//!   counted by sequences (not undone by the refusing transaction's rollback), and the
//!   unfenced writes audit mode let through; [`forget_finished`] deletes the marks `fence()`
//!   left for transactions that have ended.

mod functions;
pub mod guards;

use sqlx::{Connection, PgPool, Row};

use super::tables::sql::quote_ident;

use crate::store::{Checks, SqlWriters};

pub use self::functions::REFUSALS;

/// The advisory lock that serializes [`sync`] between processes starting together (the function
/// bodies and the grants are catalog rows: two concurrent writers of one would fail).
const SYNC_LOCK: i64 = 0x6665_6e63_6567_6174; // "fencegat"

/// What [`sync`] needs besides the connection.
pub struct Sync<'a> {
    pub schema: &'a str,
    pub checks: &'a Checks,
    pub issuer_scopes: &'a [String],
    pub max_scope_bytes: usize,
    pub writers: &'a SqlWriters,
}

/// Writes what `fence()` and the guards need from the configuration (module docs). A standby
/// cannot take the writes: skipped there (the primary's last start wrote them). An unmigrated
/// database (`database.migrate_on_start = false`) is skipped with a warning: the server starts
/// not ready, and the next start after `fencegate migrate` writes them.
pub async fn sync(pool: &PgPool, what: Sync<'_>) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&mut *conn)
        .await?;
    if standby {
        return Ok(());
    }
    let migrated: bool = sqlx::query_scalar(
        "SELECT to_regclass(format('%I.fencegate_sql_marks', $1::text)) IS NOT NULL",
    )
    .bind(what.schema)
    .fetch_one(&mut *conn)
    .await?;
    if !migrated {
        tracing::warn!("the database is not migrated: fencegate.fence() gets its rules at the next start after `fencegate migrate`");
        return Ok(());
    }
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SYNC_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "UPDATE fencegate_sql_guards SET max_token_jump = $1, reserved = $2, issuer_scopes = $3, own_role = current_user,
                max_scope_bytes = $4, strict_scopes = $5, kv_strict = $6, idle_timeout_ms = $7",
    )
    .bind(what.checks.jump.0 as i64)
    .bind(what.checks.reserved.prefixes())
    .bind(what.issuer_scopes)
    .bind(what.max_scope_bytes as i32)
    .bind(&what.writers.strict_scopes)
    .bind(what.writers.kv_strict)
    .bind(what.writers.idle_timeout_ms.min(i32::MAX as u64) as i32)
    .execute(&mut *tx)
    .await
    .map_err(|e| anyhow::anyhow!("cannot record the rules of fencegate.fence(): {e}"))?;
    for (name, body) in [
        ("fence", functions::fence_function(what.schema, what.checks)),
        ("fencegate_guard", functions::guard_function(what.schema)),
    ] {
        sqlx::query(&body).persistent(false).execute(&mut *tx).await.map_err(|e| {
            anyhow::anyhow!(
                "cannot write the function {}.{name}(): {e}. fencegate's role must own the functions of its schema \
                 (the migrations create them: apply them as fencegate's role)",
                what.schema
            )
        })?;
    }
    sync_roles(&mut tx, what.schema, &what.writers.roles).await?;
    tx.commit().await?;
    Ok(())
}

/// `[[auth.roles]]` into `fencegate_sql_roles`, and EXECUTE on `fence()` granted to exactly
/// those roles: revoked from any other (PUBLIC included). A declared role that does not exist
/// stops start-up, naming it.
async fn sync_roles(
    tx: &mut sqlx::PgConnection,
    schema: &str,
    roles: &[(String, Vec<String>)],
) -> anyhow::Result<()> {
    let names: Vec<String> = roles.iter().map(|(n, _)| n.clone()).collect();
    let known: Vec<String> =
        sqlx::query_scalar("SELECT rolname::text FROM pg_roles WHERE rolname = ANY($1)")
            .bind(&names)
            .fetch_all(&mut *tx)
            .await?;
    let missing: Vec<&str> = names
        .iter()
        .filter(|n| !known.contains(n))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        anyhow::bail!(
            "[[auth.roles]]: no PostgreSQL role named {}: create it (CREATE ROLE <name> LOGIN) or remove the entry",
            missing.join(", ")
        );
    }
    sqlx::query("DELETE FROM fencegate_sql_roles")
        .execute(&mut *tx)
        .await?;
    for (name, prefixes) in roles {
        sqlx::query("INSERT INTO fencegate_sql_roles (role, prefixes) VALUES ($1, $2)")
            .bind(name)
            .bind(prefixes)
            .execute(&mut *tx)
            .await?;
    }
    let fence = format!("\"{schema}\".fence(text, bigint)");
    grant_execute(&mut *tx, &fence, &names, true)
        .await
        .map_err(|e| {
            anyhow::anyhow!("[[auth.roles]]: cannot grant EXECUTE on {fence} to {names:?}: {e}")
        })?;
    Ok(())
}

/// Grants EXECUTE on `function` (a signature, e.g. `"fencegate".fence(text, bigint)`) to each of
/// `roles`; with `exactly`, revokes it from every other grantee but the owner, PUBLIC included.
/// Role names come from the validated configuration or the catalog, never request text.
pub(super) async fn grant_execute(
    conn: &mut sqlx::PgConnection,
    function: &str,
    roles: &[String],
    exactly: bool,
) -> Result<(), sqlx::Error> {
    // Every grantee of EXECUTE but the function's owner (0: PUBLIC).
    let granted: Vec<(bool, String)> = sqlx::query_as(
        "SELECT a.grantee = 0, COALESCE(r.rolname::text, '') FROM pg_proc p
         CROSS JOIN LATERAL aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) AS a
         LEFT JOIN pg_roles r ON r.oid = a.grantee
         WHERE p.oid = $1::regprocedure AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner",
    )
    .bind(function)
    .fetch_all(&mut *conn)
    .await?;
    for (public, name) in granted {
        let grantee = if public {
            "PUBLIC".to_owned()
        } else if exactly && !roles.contains(&name) {
            quote_ident(&name)
        } else {
            continue;
        };
        run(
            &mut *conn,
            &format!("REVOKE EXECUTE ON FUNCTION {function} FROM {grantee}"),
        )
        .await?;
        tracing::info!(function, grantee, "EXECUTE revoked");
    }
    for role in roles {
        run(
            &mut *conn,
            &format!(
                "GRANT EXECUTE ON FUNCTION {function} TO {}",
                quote_ident(role)
            ),
        )
        .await?;
    }
    Ok(())
}

/// What SQL writers ran into, across every process serving the database.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// (kind, count since the database was migrated), every kind of [`REFUSALS`].
    pub refusals: Vec<(&'static str, i64)>,
    /// (resource, writes) let through without `fence()` by guards in audit mode, for the
    /// configured resources only.
    pub unfenced: Vec<(String, i64)>,
}

/// Reads the refusal counters and the unfenced writes of configured resources. The counters are
/// sequences: `last_value` once called, else 0.
pub async fn seen(conn: &mut sqlx::PgConnection) -> Result<Seen, sqlx::Error> {
    let counters: Vec<String> = REFUSALS
        .iter()
        .map(|(kind, _)| {
            format!(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {}",
                functions::counter(kind)
            )
        })
        .collect();
    let row = sqlx::query(&format!(
        "SELECT {}",
        counters
            .iter()
            .map(|c| format!("({c})"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .fetch_one(&mut *conn)
    .await?;
    let mut refusals = Vec::with_capacity(REFUSALS.len());
    for (i, (kind, _)) in REFUSALS.iter().enumerate() {
        refusals.push((*kind, row.try_get::<i64, _>(i)?));
    }
    let unfenced = sqlx::query_as(
        "SELECT u.resource, u.writes FROM fencegate_unfenced u JOIN fencegate_guards g USING (resource) ORDER BY u.resource",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(Seen { refusals, unfenced })
}

/// Deletes the marks of transactions that have ended (every transaction older than the oldest
/// one still running): the table holds at most the marks of running transactions and of those
/// that ended since the last call.
pub async fn forget_finished(conn: &mut sqlx::PgConnection) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM fencegate_sql_marks WHERE xact < pg_snapshot_xmin(pg_current_snapshot())",
    )
    .execute(&mut *conn)
    .await?
    .rows_affected())
}

/// Runs one statement of fencegate's own making (DDL, grants) without caching it as a prepared
/// statement.
pub(super) async fn run(conn: &mut sqlx::PgConnection, sql: &str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).persistent(false).execute(conn).await?;
    Ok(())
}
