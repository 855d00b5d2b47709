//! The audited admin actions on PostgreSQL: resets, retires, rebinds, the audit log, and the
//! reset listener. What a reset may do is decided in `store::admin` (`decide`), for both
//! backends; the statements are here.
//!
//! Differences from SQLite (`sqlite/admin.rs`), and why:
//! - each reset reads the fence it lowers `FOR UPDATE`: other connections, and other fencegate
//!   processes, write concurrently, and the row must stay as read until the reset commits;
//! - the reset's transaction sends `pg_notify('fencegate_reset')`, delivered to every process
//!   listening when (and only if) it commits, so their caches forget at once, not within the
//!   audit-log poll;
//! - a table row's fence can be reset, and a table's rows rebound (legacy tables are
//!   PostgreSQL tables).

use std::sync::Arc;

use sqlx::{Connection, PgConnection, Row};

use super::PgStore;
use crate::{
    fence::{FencingToken, HighWater, Key, Scope},
    store::{
        admin::{
            decide, forget, AuditEntry, AuditMark, Change, Forget, Rebind, RebindDone,
            RebindTarget, Reset, ResetDone, ResetRefused, ResetTarget, RESET_POLL,
        },
        backend::AdminStore,
        decode::audit_entry,
        token_from_db, StoreError,
    },
};

/// The audit row of a change: `$1` actor, `$2` target, `$3` name, `$4` resource, `$5` from,
/// `$6` to, `$7` from_scope, `$8` to_scope, `$9` reason, `$10` action.
const AUDIT_INSERT: &str = "
    INSERT INTO fencegate_audit (at, actor, action, target, name, resource, from_token, to_token, from_scope, to_scope, reason)
    VALUES (now(), $1, $10, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

/// The newest audit rows, `$1` at most, as `decode::audit_entry` reads them.
const AUDIT_SELECT: &str = "
    SELECT id, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), actor, action, target, name, resource,
           from_token, to_token, from_scope, to_scope, reason
    FROM fencegate_audit ORDER BY id DESC LIMIT $1";

impl AdminStore for PgStore {
    async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
        // A table row's key is parsed and printed by PostgreSQL first (outside the lock).
        let row_key = match &reset.target {
            ResetTarget::Row { resource, key } => match self.canonical_text(resource, key).await? {
                Ok(text) => Some(text),
                Err(refused) => return Ok(Err(refused)),
            },
            _ => None,
        };
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let change = match &reset.target {
            ResetTarget::Scope(scope) => reset_scope(&mut tx, reset, scope).await?,
            ResetTarget::Key(key) => reset_key(&mut tx, reset, key).await?,
            ResetTarget::Row { resource, .. } => {
                self.reset_row(
                    &mut tx,
                    reset,
                    resource,
                    row_key.as_deref().unwrap_or_default(),
                )
                .await?
            }
            ResetTarget::Lock(name) => retire_lock(&mut tx, name).await?,
        };
        let change = match change {
            Ok(change) => change,
            Err(refused) => {
                tx.rollback().await?;
                conn.done();
                return Ok(Err(refused));
            }
        };
        let audit_id = insert_audit(&mut tx, reset, &change).await?;
        // Delivered to every listening process when (and only if) this commits.
        sqlx::query("SELECT pg_notify('fencegate_reset', $1)")
            .bind(audit_id.to_string())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        conn.done();
        Ok(Ok(change.done(reset, audit_id)))
    }

    async fn rebind(
        &self,
        rebind: &Rebind,
    ) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let done = rebind_in(&mut tx, rebind).await?;
        match done {
            Ok(_) => tx.commit().await?,
            Err(_) => tx.rollback().await?,
        }
        conn.done();
        Ok(done)
    }

    async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let mut conn = self.conns.take().await?;
        let rows = sqlx::query(AUDIT_SELECT)
            .bind(i64::from(limit))
            .fetch_all(&mut *conn)
            .await?;
        conn.done();
        rows.iter().map(audit_entry).collect()
    }

    async fn audit_mark(&self) -> Result<AuditMark, StoreError> {
        let mut conn = self.conns.take().await?;
        let (rows, newest): (i64, i64) =
            sqlx::query_as("SELECT count(*), COALESCE(max(id), 0) FROM fencegate_audit")
                .fetch_one(&mut *conn)
                .await?;
        conn.done();
        Ok(AuditMark { rows, newest })
    }

    /// `LISTEN fencegate_reset` on a connection of its own (application_name
    /// `fencegate-listener`, outside `max_connections`), forgetting cached fences on every
    /// notification and whenever the connection was lost (a notification may have been).
    fn listen_resets(&self, high_water: Arc<HighWater>) -> Option<tokio::task::JoinHandle<()>> {
        // None: resets reach this process through the audit-log poll alone (`pooler`).
        let (options, hosts) = self.listener_options()?;
        Some(tokio::spawn(async move {
            loop {
                let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1);
                // The URL's hosts in order, the first that takes writes (`hosts`): resets are
                // NOTIFYed on the primary. database.listen_url is a URL of its own.
                let pool = match &hosts {
                    Some(hosts) => pool.connector(hosts.connector(false)),
                    None => pool,
                }
                .connect_lazy_with(options.clone());
                match sqlx::postgres::PgListener::connect_with(&pool).await {
                    Ok(mut listener) => {
                        if let Err(err) = listener.listen("fencegate_reset").await {
                            tracing::debug!(error = %err, "LISTEN fencegate_reset failed; retrying");
                        } else {
                            forget(&high_water, Forget::Listener);
                            loop {
                                match listener.try_recv().await {
                                    Ok(Some(_)) => forget(&high_water, Forget::Reset),
                                    // The connection was lost: a reset may have gone unheard.
                                    Ok(None) => forget(&high_water, Forget::Listener),
                                    Err(err) => {
                                        tracing::debug!(error = %err, "reset listener failed; reconnecting");
                                        forget(&high_water, Forget::Listener);
                                        break;
                                    }
                                }
                            }
                        }
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "cannot connect the reset listener; retrying")
                    }
                }
                tokio::time::sleep(RESET_POLL).await;
            }
        }))
    }
}

/// Retires the lock `name`: its grants no longer speak for the scope's tokens, its lease
/// (if any) ends. The token stays: `from` and `to` are both the lock's latest grant.
async fn retire_lock(
    tx: &mut PgConnection,
    name: &Scope,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let row = sqlx::query("SELECT token, retired FROM fencegate_locks WHERE name = $1 FOR UPDATE")
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
    sqlx::query("UPDATE fencegate_locks SET retired = TRUE, owner = NULL, actor = NULL, expires_at = NULL WHERE name = $1")
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
    tx: &mut PgConnection,
    reset: &Reset,
    scope: &Scope,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let current: Option<i64> =
        sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = $1 FOR UPDATE")
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
    sqlx::query("UPDATE fencegate_fences SET fence_token = $2, version = version + 1, updated_at = now() WHERE scope = $1")
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
    tx: &mut PgConnection,
    reset: &Reset,
    key: &Key,
) -> Result<Result<Change, ResetRefused>, StoreError> {
    let row = sqlx::query("SELECT key_fence, scope FROM fencegate_kv WHERE key = $1 FOR UPDATE")
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
    tx: &mut PgConnection,
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
    tx: &mut PgConnection,
    actor: &str,
    action: &str,
    target: &str,
    change: &Change,
    reason: &str,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(AUDIT_INSERT)
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

/// Rebinds and audits, in `tx` (not committed here).
async fn rebind_in(
    tx: &mut PgConnection,
    rebind: &Rebind,
) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
    let scope = rebind.scope.as_ref().map(|s| s.as_str());
    let (rebound, target, name, resource) = match &rebind.target {
        RebindTarget::Keys { prefix } => {
            let done = sqlx::query(
                "UPDATE fencegate_kv SET scope = $2 WHERE substr(key, 1, length($1)) = $1 AND scope IS DISTINCT FROM $2",
            )
            .bind(prefix)
            .bind(scope)
            .execute(&mut *tx)
            .await?;
            (done.rows_affected(), "kv", prefix.clone(), None)
        }
        RebindTarget::Table(resource) => {
            let done = sqlx::query("UPDATE fencegate_ledger SET scope = $2 WHERE relation = $1 AND scope IS DISTINCT FROM $2")
                .bind(&resource.relation)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
            (
                done.rows_affected(),
                "table",
                String::new(),
                Some(resource.name.clone()),
            )
        }
    };
    // The tokens of a rebind are not changed: 0 and 0 in the audit row.
    let change = Change {
        name: name.clone(),
        resource: resource.clone(),
        from: FencingToken::ZERO,
        to: FencingToken::ZERO,
        from_scope: None,
        to_scope: scope.map(str::to_owned),
    };
    let audit_id = audit_row(tx, &rebind.actor, "rebind", target, &change, &rebind.reason).await?;
    Ok(Ok(RebindDone {
        target,
        prefix: (target == "kv").then_some(name),
        resource,
        scope: scope.map(str::to_owned),
        rebound,
        audit_id: audit_id.to_string(),
    }))
}
