//! The SQLite statements of fenced kv writes and scope claims, built once per rule from the
//! shared spelling of the fence rules (`store::sql`), as PostgreSQL's are (`pg/sql.rs`).
//!
//! The jump cap is checked once here, on the statement's snapshot (the row to insert exists
//! only if the cap admits the token), where PostgreSQL checks it a second time in the
//! `DO UPDATE .. WHERE`, on the row as locked. PostgreSQL needs the second check because its
//! statement reads a snapshot taken before it locks the row, and an admin reset (which lowers
//! fences) can commit in between. SQLite cannot interleave so: every statement here writes, and
//! a writing statement takes SQLite's one write lock before it reads anything (in WAL mode a
//! stale snapshot cannot become a writer: SQLITE_BUSY_SNAPSHOT, a 503 the client retries). The
//! store's single connection runs one statement or transaction at a time, and another process
//! on the same file (`fencegate admin reset`) waits for the lock too. So what the check reads
//! is the row the update then changes: a second check could never refuse anything the first
//! admitted.

use super::NOW_TEXT;
use crate::{
    fence::Rule,
    store::{
        sql::{fence_admits, sql_issued_check, sql_jump_check, sql_scope_check},
        Checks,
    },
};

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

pub(super) struct Statements {
    /// ?1 key, ?2 value, ?3 deleted, ?4 token: the fenced single statement.
    pub(super) put_key: String,
    /// ?1 key, ?2 value, ?3 deleted, ?4 token, ?5 scope: runs after a successful scope claim.
    pub(super) put_scoped: String,
    /// ?1 scope, ?2 token: raises the scope's fence if the rule and the poisoning guards
    /// admit the token (see `PgStore`'s `scope_gate`).
    pub(super) claim: String,
    /// ?1 scope, ?2 token: the claim of a lock grant, which issues the token itself.
    pub(super) grant_claim: String,
}

impl Statements {
    pub(super) fn new(rule: Rule, checks: &Checks) -> Self {
        let on_conflict = kv_on_conflict();
        let scope_check = sql_scope_check(checks.scopes, "kv.scope", "excluded.scope");
        let key_jump = sql_jump_check(
            checks.jump,
            "(SELECT key_fence FROM fencegate_kv AS jf WHERE jf.key = ?1)",
            "?4",
        );
        let scope_gate = format!(
            "{} AND {}",
            sql_issued_check("?1", "?2", &checks.reserved),
            sql_jump_check(
                checks.jump,
                "(SELECT fence_token FROM fencegate_fences AS jf WHERE jf.scope = ?1)",
                "?2"
            )
        );
        // INSERT .. SELECT needs a WHERE before ON CONFLICT (SQLite's parser), gate or not.
        // The jump cap is in the gate only: see the module docs.
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
            // The jump cap in the row to insert only: see the module docs.
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
