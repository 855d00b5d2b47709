//! The audited admin actions on SQLite: resets, retires, rebinds of keys, and the audit log.
//! What a reset may do is decided in `store::admin` (`decide`), for both backends; the
//! statements are here.
//!
//! Differences from PostgreSQL (`pg/admin.rs`), and why:
//! - no row locks (`FOR UPDATE`; SQLite has no such syntax): the store's one connection runs
//!   one transaction at a time, and the first write of a transaction takes SQLite's single
//!   write lock, so what a reset read stays as read until it commits;
//! - no notification: other processes on the same file (`fencegate admin`) hear of a reset
//!   through the audit-log poll (`store::admin::RESET_POLL`);
//! - no legacy tables: a table row's reset or a table's rebind is refused.

use sqlx::{Row, SqliteConnection};

use super::{SqliteStore, NOW_TEXT};
use crate::{
    fence::{FencingToken, HighWater, Key, Scope},
    store::{
        admin::{
            decide, AuditEntry, AuditMark, Change, Rebind, RebindDone, RebindTarget, Reset,
            ResetDone, ResetRefused, ResetTarget,
        },
        backend::AdminStore,
        decode::audit_entry,
        token_from_db, StoreError,
    },
};

/// The newest audit rows, `$1` at most, as `decode::audit_entry` reads them (`at` is RFC 3339
/// text already).
const AUDIT_SELECT: &str = "
    SELECT id, at, actor, action, target, name, resource, from_token, to_token, from_scope, to_scope, reason
    FROM fencegate_audit ORDER BY id DESC LIMIT $1";

/// Legacy tables are PostgreSQL tables.
const NO_TABLES: &str = "legacy tables need the PostgreSQL store";

impl AdminStore for SqliteStore {
    async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
        // The single connection serializes transactions: what is read below stays true
        // until the commit.
        let mut tx = self.pool.begin().await?;
        let change = match &reset.target {
            ResetTarget::Scope(scope) => reset_scope(&mut tx, reset, scope).await?,
            ResetTarget::Key(key) => reset_key(&mut tx, reset, key).await?,
            ResetTarget::Row { .. } => Err(ResetRefused::NotFound(NO_TABLES.into())),
            ResetTarget::Lock(name) => retire_lock(&mut tx, name).await?,
        };
        let change = match change {
            Ok(change) => change,
            Err(refused) => {
                tx.rollback().await?;
                return Ok(Err(refused));
            }
        };
        let audit_id = insert_audit(&mut tx, reset, &change).await?;
        tx.commit().await?;
        Ok(Ok(change.done(reset, audit_id)))
    }

    async fn rebind(
        &self,
        rebind: &Rebind,
    ) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
        let RebindTarget::Keys { prefix } = &rebind.target else {
            return Ok(Err(ResetRefused::NotFound(NO_TABLES.into())));
        };
        let mut tx = self.pool.begin().await?;
        let done = rebind_keys(&mut tx, rebind, prefix).await?;
        tx.commit().await?;
        Ok(Ok(done))
    }

    async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(AUDIT_SELECT)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(audit_entry).collect()
    }

    async fn audit_mark(&self) -> Result<AuditMark, StoreError> {
        let (rows, newest): (i64, i64) =
            sqlx::query_as("SELECT count(*), COALESCE(max(id), 0) FROM fencegate_audit")
                .fetch_one(&self.pool)
                .await?;
        Ok(AuditMark { rows, newest })
    }

    /// SQLite cannot notify: the audit-log poll is how every process hears of a reset.
    fn listen_resets(
        &self,
        _high_water: std::sync::Arc<HighWater>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        None
    }
}

/// Retires the lock `name`: its grants no longer speak for the scope's tokens, its lease
/// (if any) ends. The token stays: `from` and `to` are both the lock's latest grant.
async fn retire_lock(
    tx: &mut SqliteConnection,
    name: &Scope,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let row = sqlx::query("SELECT token, retired FROM fencegate_locks WHERE name = $1")
        .bind(name.as_str())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        return Ok(Err(ResetRefused::NotFound(format!(
            "the built-in lock {:?} was never granted",
            name.as_str()
        ))));
    };
    let token = token_from_db(row.try_get(0)?)?;
    if row.try_get::<bool, _>(1)? {
        return Ok(Err(ResetRefused::Invalid(format!(
            "the lock {:?} is retired already",
            name.as_str()
        ))));
    }
    sqlx::query("UPDATE fencegate_locks SET retired = TRUE, owner = NULL, actor = NULL, expires_at_ms = NULL WHERE name = $1")
    .bind(name.as_str())
    .execute(&mut *tx)
    .await?;
    let name = name.as_str().to_owned();
    Ok(Ok(Change {
        name,
        resource: None,
        from: token,
        to: token,
        from_scope: None,
        to_scope: None,
    }))
}

async fn reset_scope(
    tx: &mut SqliteConnection,
    reset: &Reset,
    scope: &Scope,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let current: Option<i64> =
        sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = $1")
            .bind(scope.as_str())
            .fetch_optional(&mut *tx)
            .await?;
    let Some(current) = current else {
        return Ok(Err(ResetRefused::NotFound(format!(
            "no fence for scope {:?}",
            scope.as_str()
        ))));
    };
    let from = token_from_db(current)?;
    let (to, _) = match decide(reset, from, None) {
        Ok(next) => next,
        Err(refused) => return Ok(Err(refused)),
    };
    sqlx::query(&format!(
        "UPDATE fencegate_fences SET fence_token = $2, version = version + 1, updated_at = {NOW_TEXT} WHERE scope = $1"
    ))
    .bind(scope.as_str())
    .bind(to.get())
    .execute(&mut *tx)
    .await?;
    Ok(Ok(Change {
        name: scope.as_str().to_owned(),
        resource: None,
        from,
        to,
        from_scope: None,
        to_scope: None,
    }))
}

async fn reset_key(
    tx: &mut SqliteConnection,
    reset: &Reset,
    key: &Key,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let row = sqlx::query("SELECT key_fence, scope FROM fencegate_kv WHERE key = $1")
        .bind(key.as_str())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        return Ok(Err(ResetRefused::NotFound(format!(
            "key {:?} was never written",
            key.as_str()
        ))));
    };
    let from = token_from_db(row.try_get(0)?)?;
    let from_scope: Option<String> = row.try_get(1)?;
    let (to, to_scope) = match decide(reset, from, from_scope.clone()) {
        Ok(next) => next,
        Err(refused) => return Ok(Err(refused)),
    };
    sqlx::query("UPDATE fencegate_kv SET key_fence = $2, scope = $3 WHERE key = $1")
        .bind(key.as_str())
        .bind(to.get())
        .bind(&to_scope)
        .execute(&mut *tx)
        .await?;
    Ok(Ok(Change {
        name: key.as_str().to_owned(),
        resource: None,
        from,
        to,
        from_scope,
        to_scope,
    }))
}

/// The reset's audit row, in the reset's transaction; its id.
async fn insert_audit(
    tx: &mut SqliteConnection,
    reset: &Reset,
    change: &Change,
) -> Result<i64, StoreError> {
    audit_row(
        tx,
        &reset.actor,
        reset.target.action(),
        reset.target.kind(),
        change,
        &reset.reason,
    )
    .await
}

async fn audit_row(
    tx: &mut SqliteConnection,
    actor: &str,
    action: &str,
    target: &str,
    change: &Change,
    reason: &str,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(&format!(
        "INSERT INTO fencegate_audit (at, actor, action, target, name, resource, from_token, to_token, from_scope, to_scope, reason)
         VALUES ({NOW_TEXT}, $1, $10, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id"
    ))
        .bind(actor)
        .bind(target)
        .bind(&change.name)
        .bind(&change.resource)
        .bind(change.from.get())
        .bind(change.to.get())
        .bind(&change.from_scope)
        .bind(&change.to_scope)
        .bind(reason)
        .bind(action)
        .fetch_one(&mut *tx)
        .await?)
}

/// Rebinds the keys under `prefix` and audits, in `tx` (not committed here).
async fn rebind_keys(
    tx: &mut SqliteConnection,
    rebind: &Rebind,
    prefix: &str,
) -> Result<RebindDone, StoreError> {
    let scope = rebind.scope.as_ref().map(|s| s.as_str());
    let done = sqlx::query("UPDATE fencegate_kv SET scope = $2 WHERE substr(key, 1, length($1)) = $1 AND scope IS DISTINCT FROM $2")
        .bind(prefix)
        .bind(scope)
        .execute(&mut *tx)
        .await?;
    // The tokens of a rebind are not changed: 0 and 0 in the audit row.
    let change = Change {
        name: prefix.to_owned(),
        resource: None,
        from: FencingToken::ZERO,
        to: FencingToken::ZERO,
        from_scope: None,
        to_scope: scope.map(str::to_owned),
    };
    let audit_id = audit_row(tx, &rebind.actor, "rebind", "kv", &change, &rebind.reason).await?;
    Ok(RebindDone {
        target: "kv",
        prefix: Some(prefix.to_owned()),
        resource: None,
        scope: scope.map(str::to_owned),
        rebound: done.rows_affected(),
        audit_id: audit_id.to_string(),
    })
}
