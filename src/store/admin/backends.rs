//! The SQL of the audited admin actions, on both backends: resets, retires, rebinds and the
//! audit log (statements that are the same on both are written once, in `reset_targets!`).

use super::*;

/// The audit row of a reset: `$1` actor, `$2` target, `$3` name, `$4` resource, `$5` from,
/// `$6` to, `$7` from_scope, `$8` to_scope, `$9` reason, `$10` action (the same numbering on
/// both backends).
const AUDIT_INSERT: &str = "
    INSERT INTO fencegate_audit (at, actor, action, target, name, resource, from_token, to_token, from_scope, to_scope, reason)
    VALUES (NOW_AT, $1, $10, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

fn audit_insert(now: &str) -> String {
    AUDIT_INSERT.replace("NOW_AT", now)
}

const AUDIT_SELECT: &str = "
    SELECT id, AT_TEXT, actor, action, target, name, resource, from_token, to_token, from_scope, to_scope, reason
    FROM fencegate_audit ORDER BY id DESC LIMIT $1";

/// One audit row from `AUDIT_SELECT` (either backend's row type).
fn audit_entry<'r, R: sqlx::Row>(row: &'r R) -> Result<AuditEntry, StoreError>
where
    usize: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(AuditEntry {
        id: row.try_get::<i64, _>(0)?.to_string(),
        at: row.try_get(1)?,
        actor: row.try_get(2)?,
        action: row.try_get(3)?,
        target: row.try_get(4)?,
        name: row.try_get(5)?,
        resource: row.try_get(6)?,
        from: crate::store::token_from_db(row.try_get(7)?)?,
        to: crate::store::token_from_db(row.try_get(8)?)?,
        from_scope: row.try_get(9)?,
        to_scope: row.try_get(10)?,
        reason: row.try_get(11)?,
    })
}

/// What a reset changed, ready for its audit row and its answer.
pub(in crate::store) struct Change {
    pub name: String,
    pub resource: Option<String>,
    pub from: FencingToken,
    pub to: FencingToken,
    pub from_scope: Option<String>,
    pub to_scope: Option<String>,
}

impl Change {
    fn done(self, reset: &Reset, audit_id: i64) -> ResetDone {
        let rebinds = reset.scope.is_some();
        ResetDone {
            target: reset.target.kind(),
            name: self.name,
            resource: self.resource,
            from: self.from,
            to: self.to,
            scope: rebinds.then_some(self.to_scope),
            audit_id: audit_id.to_string(),
        }
    }
}

/// The statements of a reset that are the same on both backends (sqlx binds `$n` on SQLite
/// too), written once: `reset_scope`, `reset_key` and the audit row. What differs is passed
/// in: the connection type, the row lock (`FOR UPDATE`; SQLite has no such syntax and needs
/// none, its one connection serializes transactions) and the clock.
macro_rules! reset_targets {
    ($conn:ty, $lock:literal, $now:expr, $expires:literal) => {
        /// Retires the lock `name`: its grants no longer speak for the scope's tokens, its lease
        /// (if any) ends. The token stays: `from` and `to` are both the lock's latest grant.
        async fn retire_lock(tx: &mut $conn, name: &Scope) -> Result<Result<Change, ResetRefused>, StoreError> {
            let row = sqlx::query(concat!("SELECT token, retired FROM fencegate_locks WHERE name = $1", $lock))
                .bind(name.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else {
                return Ok(Err(ResetRefused::NotFound(format!("the built-in lock {:?} was never granted", name.as_str()))));
            };
            let token = token_from_db(row.try_get(0)?)?;
            if row.try_get::<bool, _>(1)? {
                return Ok(Err(ResetRefused::Invalid(format!("the lock {:?} is retired already", name.as_str()))));
            }
            sqlx::query(concat!(
                "UPDATE fencegate_locks SET retired = TRUE, owner = NULL, actor = NULL, ", $expires, " = NULL WHERE name = $1"
            ))
            .bind(name.as_str())
            .execute(&mut *tx)
            .await?;
            let name = name.as_str().to_owned();
            Ok(Ok(Change { name, resource: None, from: token, to: token, from_scope: None, to_scope: None }))
        }

        async fn reset_scope(tx: &mut $conn, reset: &Reset, scope: &Scope) -> Result<Result<Change, ResetRefused>, StoreError> {
            let current: Option<i64> =
                sqlx::query_scalar(concat!("SELECT fence_token FROM fencegate_fences WHERE scope = $1", $lock))
                    .bind(scope.as_str())
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some(current) = current else {
                return Ok(Err(ResetRefused::NotFound(format!("no fence for scope {:?}", scope.as_str()))));
            };
            let from = token_from_db(current)?;
            let (to, _) = match decide(reset, from, None) {
                Ok(next) => next,
                Err(refused) => return Ok(Err(refused)),
            };
            sqlx::query(&format!(
                "UPDATE fencegate_fences SET fence_token = $2, version = version + 1, updated_at = {} WHERE scope = $1",
                $now
            ))
            .bind(scope.as_str())
            .bind(to.get())
            .execute(&mut *tx)
            .await?;
            Ok(Ok(Change { name: scope.as_str().to_owned(), resource: None, from, to, from_scope: None, to_scope: None }))
        }

        async fn reset_key(tx: &mut $conn, reset: &Reset, key: &Key) -> Result<Result<Change, ResetRefused>, StoreError> {
            let row = sqlx::query(concat!("SELECT key_fence, scope FROM fencegate_kv WHERE key = $1", $lock))
                .bind(key.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else {
                return Ok(Err(ResetRefused::NotFound(format!("key {:?} was never written", key.as_str()))));
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
            Ok(Ok(Change { name: key.as_str().to_owned(), resource: None, from, to, from_scope, to_scope }))
        }

        /// The reset's audit row, in the reset's transaction; its id.
        async fn insert_audit(tx: &mut $conn, reset: &Reset, change: &Change) -> Result<i64, StoreError> {
            audit_row(tx, &reset.actor, reset.target.action(), reset.target.kind(), change, &reset.reason).await
        }

        async fn audit_row(
            tx: &mut $conn,
            actor: &str,
            action: &str,
            target: &str,
            change: &Change,
            reason: &str,
        ) -> Result<i64, StoreError> {
            Ok(sqlx::query_scalar(&audit_insert($now))
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

        /// Rebinds and audits, in `tx` (not committed here). Legacy tables exist on PostgreSQL only.
        async fn rebind_in(tx: &mut $conn, rebind: &Rebind) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
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
                    (done.rows_affected(), "table", String::new(), Some(resource.name.clone()))
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
    };
}

mod pg {
    use sqlx::{Connection, PgConnection, Row};

    use super::*;
    use crate::store::{postgres::PgStore, token_from_db};

    impl PgStore {
        pub(crate) async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
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
                    self.reset_row(&mut tx, reset, resource, row_key.as_deref().unwrap_or_default()).await?
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
            sqlx::query("SELECT pg_notify('fencegate_reset', $1)").bind(audit_id.to_string()).execute(&mut *tx).await?;
            tx.commit().await?;
            conn.done();
            Ok(Ok(change.done(reset, audit_id)))
        }

        pub(crate) async fn rebind(&self, rebind: &Rebind) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
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

        pub(crate) async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
            let sql = AUDIT_SELECT.replace("AT_TEXT", "to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')");
            let mut conn = self.conns.take().await?;
            let rows = sqlx::query(&sql).bind(i64::from(limit)).fetch_all(&mut *conn).await?;
            conn.done();
            rows.iter().map(audit_entry).collect()
        }

        pub(crate) async fn newest_audit_id(&self) -> Result<i64, StoreError> {
            let mut conn = self.conns.take().await?;
            let id: i64 = sqlx::query_scalar("SELECT COALESCE(max(id), 0) FROM fencegate_audit").fetch_one(&mut *conn).await?;
            conn.done();
            Ok(id)
        }

        /// `LISTEN fencegate_reset` on a connection of its own (application_name
        /// `fencegate-listener`, outside `max_connections`), forgetting cached fences on every
        /// notification and whenever the connection was lost (a notification may have been).
        pub(crate) fn listen_resets(&self, high_water: std::sync::Arc<crate::fence::HighWater>) -> tokio::task::JoinHandle<()> {
            let options = self.listener_options();
            tokio::spawn(async move {
                loop {
                    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect_lazy_with(options.clone());
                    match sqlx::postgres::PgListener::connect_with(&pool).await {
                        Ok(mut listener) => {
                            if let Err(err) = listener.listen("fencegate_reset").await {
                                tracing::debug!(error = %err, "LISTEN fencegate_reset failed; retrying");
                            } else {
                                high_water.clear();
                                loop {
                                    match listener.try_recv().await {
                                        Ok(Some(_)) => high_water.clear(),
                                        // The connection was lost: a reset may have gone unheard.
                                        Ok(None) => high_water.clear(),
                                        Err(err) => {
                                            tracing::debug!(error = %err, "reset listener failed; reconnecting");
                                            high_water.clear();
                                            break;
                                        }
                                    }
                                }
                            }
                        }
                        Err(err) => tracing::debug!(error = %err, "cannot connect the reset listener; retrying"),
                    }
                    tokio::time::sleep(RESET_POLL).await;
                }
            })
        }
    }

    reset_targets!(PgConnection, " FOR UPDATE", "now()", "expires_at");
}

mod sqlite {
    use sqlx::{Row, SqliteConnection};

    use super::*;
    use crate::store::{sqlite::SqliteStore, token_from_db};

    const NOW_TEXT: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

    impl SqliteStore {
        pub(crate) async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
            // The single connection serializes transactions: what is read below stays true
            // until the commit.
            let mut tx = self.pool.begin().await?;
            let change = match &reset.target {
                ResetTarget::Scope(scope) => reset_scope(&mut tx, reset, scope).await?,
                ResetTarget::Key(key) => reset_key(&mut tx, reset, key).await?,
                ResetTarget::Row { .. } => Err(ResetRefused::NotFound("legacy tables need the PostgreSQL store".into())),
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

        pub(crate) async fn rebind(&self, rebind: &Rebind) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
            if let RebindTarget::Table(_) = rebind.target {
                return Ok(Err(ResetRefused::NotFound("legacy tables need the PostgreSQL store".into())));
            }
            let mut tx = self.pool.begin().await?;
            let done = rebind_in(&mut tx, rebind).await?;
            match done {
                Ok(_) => tx.commit().await?,
                Err(_) => tx.rollback().await?,
            }
            Ok(done)
        }

        pub(crate) async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
            let sql = AUDIT_SELECT.replace("AT_TEXT", "at");
            let rows = sqlx::query(&sql).bind(i64::from(limit)).fetch_all(&self.pool).await?;
            rows.iter().map(audit_entry).collect()
        }

        pub(crate) async fn newest_audit_id(&self) -> Result<i64, StoreError> {
            Ok(sqlx::query_scalar("SELECT COALESCE(max(id), 0) FROM fencegate_audit").fetch_one(&self.pool).await?)
        }
    }

    // No row locks in SQLite: its single connection serializes transactions.
    reset_targets!(SqliteConnection, "", NOW_TEXT, "expires_at_ms");
}
