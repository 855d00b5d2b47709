//! Recovery, audited: the only way a fence goes down, and the log that records it.
//!
//! A reset lowers a scope's, a key's or a table row's fence (after a poisoned token got
//! through, say), and may rebind a key's or row's sticky scope. It runs in one transaction with
//! its audit row, so there is no reset without a record and no record without a reset. Every
//! fencegate process must then forget what its reject-only cache knew about fences: the one
//! that made the reset does at once, the others hear of it through `watch_resets` (PostgreSQL
//! `NOTIFY`, with a poll of the audit log as the fallback that also serves SQLite).
//!
//! A built-in lock's counter is never reset: the next grant is still above every token the
//! lock ever issued (`GREATEST(l.token, fence) + 1`), whatever a reset did to the fence.
//! What an admin may do to a lock is *retire* it: its old grants stop speaking for the scope's
//! tokens (a scope bricked by a grant made before an issuer took it over), its lease ends, and
//! its row stays with its counter, so a later grant still never reissues a token.

use std::{sync::Arc, time::Duration};

use serde::Serialize;

use super::{Store, StoreError};
use crate::{
    fence::{FencingToken, Key, Scope},
    tables::{Resource, RowKey},
};

/// What a reset is about.
#[derive(Debug, Clone)]
pub enum ResetTarget {
    Scope(Scope),
    Key(Key),
    Row { resource: Arc<Resource>, key: RowKey },
    /// Retire the built-in lock of this name (no `to`, no `scope`).
    Lock(Scope),
}

impl ResetTarget {
    pub fn kind(&self) -> &'static str {
        match self {
            ResetTarget::Scope(_) => "scope",
            ResetTarget::Key(_) => "key",
            ResetTarget::Row { .. } => "table",
            ResetTarget::Lock(_) => "lock",
        }
    }

    /// The audit log's `action`.
    pub fn action(&self) -> &'static str {
        match self {
            ResetTarget::Lock(_) => "retire",
            _ => "reset",
        }
    }
}

/// One reset, as asked.
#[derive(Debug, Clone)]
pub struct Reset {
    pub target: ResetTarget,
    /// The new fence, below the current one; `None`: leave the fence (only rebind).
    pub to: Option<FencingToken>,
    /// `Some(new binding)` to rebind a key's or row's sticky scope (`Some(None)`: unscoped).
    pub scope: Option<Option<Scope>>,
    pub reason: String,
    pub actor: String,
}

/// A reset that was done: the response body of the reset endpoints.
#[derive(Debug, Clone, Serialize)]
pub struct ResetDone {
    pub target: &'static str,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    pub from: FencingToken,
    pub to: FencingToken,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Option<String>>,
    pub audit_id: String,
}

/// Why a reset was not done. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefused {
    #[error("{0}")]
    NotFound(String),
    #[error("`to` ({to}) must be below the current fence ({current}): a reset only lowers a fence")]
    NotBelow { to: FencingToken, current: FencingToken },
    #[error("{0}")]
    Invalid(String),
}

/// A bulk rebind: every key under a prefix, or every row of a legacy table fencegate has a
/// fence for, moved under another sticky scope (or none). The fences are not touched.
#[derive(Debug, Clone)]
pub struct Rebind {
    pub target: RebindTarget,
    pub scope: Option<Scope>,
    pub reason: String,
    pub actor: String,
}

#[derive(Debug, Clone)]
pub enum RebindTarget {
    /// Keys starting with the prefix (`""`: every key).
    Keys { prefix: String },
    Table(Arc<Resource>),
}

/// A rebind that was done: the response body of the rebind endpoints.
#[derive(Debug, Clone, Serialize)]
pub struct RebindDone {
    /// `kv` or `table`.
    pub target: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The new binding (null: none).
    pub scope: Option<String>,
    /// Keys or rows whose binding changed.
    pub rebound: u64,
    pub audit_id: String,
}

/// An audit log row, as `GET /v1/admin/audit` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry {
    pub id: String,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    pub from: FencingToken,
    pub to: FencingToken,
    pub from_scope: Option<String>,
    pub to_scope: Option<String>,
    pub reason: String,
}

/// The state after a reset of a fence at `current` bound to `bound`: the new fence and binding.
/// The one place the reset rule is decided, for every target and backend.
pub(crate) fn decide(
    reset: &Reset,
    current: FencingToken,
    bound: Option<String>,
) -> Result<(FencingToken, Option<String>), ResetRefused> {
    let to = match reset.to {
        Some(to) if to >= current => return Err(ResetRefused::NotBelow { to, current }),
        Some(to) => to,
        None => current,
    };
    let scope = match &reset.scope {
        Some(new) => new.as_ref().map(|s| s.as_str().to_owned()),
        None => bound,
    };
    Ok((to, scope))
}

/// An audit reason: required, 1..=1000 bytes, no control characters. The audit log is read
/// in terminals and on the console: a newline or an escape sequence in a reason could forge a
/// line or repaint the screen.
pub fn validate_reason(reason: &str) -> Result<(), ResetRefused> {
    if reason.trim().is_empty() || reason.len() > 1000 {
        return Err(ResetRefused::Invalid("\"reason\" is required: 1..=1000 bytes saying why".into()));
    }
    if reason.chars().any(char::is_control) {
        return Err(ResetRefused::Invalid("\"reason\" must not contain control characters (newlines, escapes)".into()));
    }
    Ok(())
}

/// Checks what a reset asks before any database work.
pub fn validate(reset: &Reset) -> Result<(), ResetRefused> {
    validate_reason(&reset.reason)?;
    match (&reset.target, reset.to, &reset.scope) {
        (ResetTarget::Lock(_), None, None) => Ok(()),
        (ResetTarget::Lock(_), _, _) => Err(ResetRefused::Invalid("retiring a lock takes only \"reason\"".into())),
        (ResetTarget::Scope(_), None, _) => Err(ResetRefused::Invalid("\"to\" is required for a scope's fence".into())),
        (ResetTarget::Scope(_), _, Some(_)) => {
            Err(ResetRefused::Invalid("\"scope\" rebinds a key or a table row; a scope has no binding".into()))
        }
        (_, None, None) => Err(ResetRefused::Invalid("give \"to\" (the new fence), \"scope\" (a new binding), or both".into())),
        _ => Ok(()),
    }
}

/// How often each process checks the audit log for resets made elsewhere (the fallback to
/// PostgreSQL's `NOTIFY`, and SQLite's only way to hear of them).
pub const RESET_POLL: Duration = Duration::from_millis(500);

impl Store {
    /// Applies a reset and its audit row in one transaction, then forgets every cached fence
    /// (resets are rare; a cold cache only costs round trips).
    pub async fn reset(&self, reset: Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
        if let Err(refused) = validate(&reset) {
            return Ok(Err(refused));
        }
        let backend = self.backend.clone();
        let done = super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.reset(&reset).await,
                super::Backend::Sqlite(db) => db.reset(&reset).await,
            }
        })
        .await?;
        if done.is_ok() {
            self.high_water.clear();
        }
        Ok(done)
    }

    /// Rebinds every key under a prefix, or every fenced row of a table, with its audit row, in
    /// one transaction. Nothing about fences changes, so the cache stays as it is.
    pub async fn rebind(&self, rebind: Rebind) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
        if let Err(refused) = validate_reason(&rebind.reason) {
            return Ok(Err(refused));
        }
        let backend = self.backend.clone();
        super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.rebind(&rebind).await,
                super::Backend::Sqlite(db) => db.rebind(&rebind).await,
            }
        })
        .await
    }

    /// The newest audit rows first, at most `limit`.
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let backend = self.backend.clone();
        super::run_detached(async move {
            match &backend {
                super::Backend::Postgres(pg) => pg.audit(limit).await,
                super::Backend::Sqlite(db) => db.audit(limit).await,
            }
        })
        .await
    }

    /// Forgets cached fences whenever another process resets one: on PostgreSQL at once
    /// (`LISTEN fencegate_reset`), and on every backend within [`RESET_POLL`] by watching the
    /// audit log's newest id (the fallback for a lost notification or listener connection).
    /// Runs until aborted.
    pub async fn watch_resets(self) {
        let listener = match &self.backend {
            super::Backend::Postgres(pg) => Some(pg.listen_resets(self.high_water.clone())),
            super::Backend::Sqlite(_) => None,
        };
        let _listener = listener.map(crate::server::AbortOnDrop);
        let mut seen: Option<i64> = None;
        let mut tick = tokio::time::interval(RESET_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let backend = self.backend.clone();
            let newest = super::run_detached(async move {
                match &backend {
                    super::Backend::Postgres(pg) => pg.newest_audit_id().await,
                    super::Backend::Sqlite(db) => db.newest_audit_id().await,
                }
            })
            .await;
            match newest {
                Ok(newest) => {
                    if seen.is_some() && seen != Some(newest) {
                        tracing::info!(audit_id = newest, "a fence was reset: forgetting cached fences");
                        self.high_water.clear();
                    }
                    seen = Some(newest);
                }
                // Unreachable database: nothing can be written now either; try again later.
                Err(err) => tracing::debug!(error = %err, "cannot read the audit log"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    fn reset(to: Option<i64>, scope: Option<Option<&str>>) -> Reset {
        Reset {
            target: ResetTarget::Key(Key::parse("k", 8).unwrap()),
            to: to.map(t),
            scope: scope.map(|s| s.map(|s| Scope::parse(s, 8).unwrap())),
            reason: "poisoned by a bad client".into(),
            actor: "test".into(),
        }
    }

    #[test]
    fn a_reset_only_lowers_and_rebinds_when_asked() {
        assert_eq!(decide(&reset(Some(5), None), t(10), Some("s".into())), Ok((t(5), Some("s".into()))));
        assert!(matches!(decide(&reset(Some(10), None), t(10), None), Err(ResetRefused::NotBelow { .. })));
        assert!(matches!(decide(&reset(Some(11), None), t(10), None), Err(ResetRefused::NotBelow { .. })));
        assert_eq!(decide(&reset(None, Some(None)), t(10), Some("s".into())), Ok((t(10), None)));
        assert_eq!(decide(&reset(None, Some(Some("x"))), t(10), None), Ok((t(10), Some("x".into()))));
    }

    #[test]
    fn a_reset_needs_a_reason_and_something_to_do() {
        assert!(validate(&reset(Some(1), None)).is_ok());
        assert!(validate(&reset(None, None)).is_err());
        let mut r = reset(Some(1), None);
        r.reason = " ".into();
        assert!(validate(&r).is_err());
        r.reason = "x".repeat(1001);
        assert!(validate(&r).is_err());
        for forged in ["ok\nforged line", "\u{1b}[2J", "tab\there"] {
            r.reason = forged.into();
            assert!(validate(&r).is_err(), "{forged:?}");
        }
        let scope = Reset { target: ResetTarget::Scope(Scope::parse("s", 8).unwrap()), ..reset(None, None) };
        assert!(validate(&scope).is_err(), "a scope reset needs `to`");
    }
}

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
        from: super::token_from_db(row.try_get(7)?)?,
        to: super::token_from_db(row.try_get(8)?)?,
        from_scope: row.try_get(9)?,
        to_scope: row.try_get(10)?,
        reason: row.try_get(11)?,
    })
}

/// What a reset changed, ready for its audit row and its answer.
pub(super) struct Change {
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
