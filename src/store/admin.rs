//! Recovery, audited: the only way a fence goes down, and the log that records it.
//!
//! A reset lowers a scope's, a key's or a table row's fence (after a poisoned token got
//! through, say), and may rebind a key's or row's sticky scope. It runs in one transaction with
//! its audit row, so there is no reset without a record and no record without a reset. Every
//! fencegate process must then forget what its reject-only cache knew about fences: the one
//! that made the reset does at once, the others hear of it through `watch_resets` (PostgreSQL
//! `NOTIFY`, with a poll of the audit log as the fallback that also serves SQLite).
//!
//! This module holds what a reset is and may do, for both backends; the statements are in
//! `pg/admin.rs` and `sqlite/admin.rs`.
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
    fence::{FencingToken, HighWater, Key, Scope},
    tables::{Resource, RowKey},
};

/// What a reset is about.
#[derive(Debug, Clone)]
pub enum ResetTarget {
    Scope(Scope),
    Key(Key),
    Row {
        resource: Arc<Resource>,
        key: RowKey,
    },
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
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResetDone {
    /// scope, key, table, or lock (a retired lock: `from` and `to` are its latest grant).
    pub target: &'static str,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub resource: Option<String>,
    pub from: FencingToken,
    pub to: FencingToken,
    /// Present when the binding was changed: the new sticky scope (null: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Option<String>>,
    pub audit_id: String,
}

/// Why a reset was not done. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefused {
    #[error("{0}")]
    NotFound(String),
    #[error(
        "`to` ({to}) must be below the current fence ({current}): a reset only lowers a fence"
    )]
    NotBelow {
        to: FencingToken,
        current: FencingToken,
    },
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
    Keys {
        prefix: String,
    },
    Table(Arc<Resource>),
}

/// A rebind that was done: the response body of the rebind endpoints.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RebindDone {
    /// `kv` or `table`.
    pub target: &'static str,
    /// kv: the prefix rebound.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub prefix: Option<String>,
    /// table: the resource rebound.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub resource: Option<String>,
    /// The new binding (null: none).
    pub scope: Option<String>,
    /// Keys or rows whose binding changed.
    pub rebound: u64,
    pub audit_id: String,
}

/// An audit log row, as `GET /v1/admin/audit` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub id: String,
    /// RFC 3339, the database's clock.
    pub at: String,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub resource: Option<String>,
    pub from: FencingToken,
    pub to: FencingToken,
    pub from_scope: Option<String>,
    pub to_scope: Option<String>,
    pub reason: String,
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
    /// The answer to the reset that made this change, recorded as audit row `audit_id`.
    pub fn done(self, reset: &Reset, audit_id: i64) -> ResetDone {
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
        return Err(ResetRefused::Invalid(
            "\"reason\" is required: 1..=1000 bytes saying why".into(),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(ResetRefused::Invalid(
            "\"reason\" must not contain control characters (newlines, escapes)".into(),
        ));
    }
    Ok(())
}

/// Checks what a reset asks before any database work.
pub fn validate(reset: &Reset) -> Result<(), ResetRefused> {
    validate_reason(&reset.reason)?;
    match (&reset.target, reset.to, &reset.scope) {
        (ResetTarget::Lock(_), None, None) => Ok(()),
        (ResetTarget::Lock(_), _, _) => Err(ResetRefused::Invalid(
            "retiring a lock takes only \"reason\"".into(),
        )),
        (ResetTarget::Scope(_), None, _) => Err(ResetRefused::Invalid(
            "\"to\" is required for a scope's fence".into(),
        )),
        (ResetTarget::Scope(_), _, Some(_)) => Err(ResetRefused::Invalid(
            "\"scope\" rebinds a key or a table row; a scope has no binding".into(),
        )),
        (_, None, None) => Err(ResetRefused::Invalid(
            "give \"to\" (the new fence), \"scope\" (a new binding), or both".into(),
        )),
        _ => Ok(()),
    }
}

/// What the audit-log poll compares between readings: the rows committed and the newest id.
/// The newest id alone misses a reset on PostgreSQL: ids are taken when a row is inserted, so
/// a transaction holding id 5 can commit after another's id 6 was already read, leaving the
/// newest id at 6. The count still moves (audit rows are never deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store) struct AuditMark {
    pub rows: i64,
    pub newest: i64,
}

/// How often each process checks the audit log for resets made elsewhere (the fallback to
/// PostgreSQL's `NOTIFY`, and SQLite's only way to hear of them).
pub const RESET_POLL: Duration = Duration::from_millis(500);

/// Why a process forgot its cached fences: the `reason` label of
/// `fencegate_cache_clears_total`.
#[derive(Debug, Clone, Copy)]
pub(in crate::store) enum Forget {
    /// A reset: made here, notified, or seen in the audit log.
    Reset,
    /// The audit log's first reading (a reset may have come before it).
    Start,
    /// The reset listener (re)connected or lost its connection: a notification may be lost.
    Listener,
    /// The audit log could not be read (a reset may go unheard).
    Unheard,
}

impl Forget {
    fn label(self) -> &'static str {
        match self {
            Forget::Reset => "reset",
            Forget::Start => "start",
            Forget::Listener => "listener",
            Forget::Unheard => "unheard",
        }
    }
}

/// Forgets every cached fence of this process, counted by reason.
pub(in crate::store) fn forget(high_water: &HighWater, why: Forget) {
    metrics::counter!("fencegate_cache_clears_total", "reason" => why.label()).increment(1);
    high_water.clear();
}

impl Store {
    /// Applies a reset and its audit row in one transaction, then forgets every cached fence
    /// (resets are rare; a cold cache only costs round trips).
    pub async fn reset(&self, reset: Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError> {
        if let Err(refused) = validate(&reset) {
            return Ok(Err(refused));
        }
        let done = detached!(self, b => b.reset(&reset).await)?;
        if done.is_ok() {
            forget(&self.high_water, Forget::Reset);
        }
        Ok(done)
    }

    /// Rebinds every key under a prefix, or every fenced row of a table, with its audit row, in
    /// one transaction. Nothing about fences changes, so the cache stays as it is.
    pub async fn rebind(
        &self,
        rebind: Rebind,
    ) -> Result<Result<RebindDone, ResetRefused>, StoreError> {
        if let Err(refused) = validate_reason(&rebind.reason) {
            return Ok(Err(refused));
        }
        detached!(self, b => b.rebind(&rebind).await)
    }

    /// The newest audit rows first, at most `limit`.
    pub async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        detached!(self, b => b.audit(limit).await)
    }

    /// Forgets cached fences whenever another process resets one: on PostgreSQL at once
    /// (`LISTEN fencegate_reset`), and on every backend within [`RESET_POLL`] by watching the
    /// audit log's row count and newest id (the fallback for a lost notification or listener
    /// connection).
    /// Runs until aborted.
    pub async fn watch_resets(self) {
        let listener = on_backend!(&self.backend, b => b.listen_resets(self.high_water.clone()));
        let _listener = listener.map(crate::task::AbortOnDrop);
        let mut seen: Option<AuditMark> = None;
        // A reading that outlived its wait (`read_audit_mark`).
        let mut reading = None;
        let mut tick = tokio::time::interval(RESET_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.read_audit_mark(&mut reading).await {
                Ok(mark) => {
                    match seen {
                        // The first reading is the baseline, but the process may have served
                        // (and cached fences) before it answered: a reset committed in between
                        // is counted in `mark` and would never be seen as a change. Forgetting
                        // once here costs a few round trips at start-up (and after a failed
                        // reading, below).
                        None => forget(&self.high_water, Forget::Start),
                        Some(before) if before != mark => {
                            tracing::info!(
                                audit_id = mark.newest,
                                "a fence was reset: forgetting cached fences"
                            );
                            forget(&self.high_water, Forget::Reset);
                        }
                        Some(_) => {}
                    }
                    seen = Some(mark);
                }
                // No reading: a reset made meanwhile may be unheard (its notification lost on
                // the same cut), and a cached fence would answer 412 "stale" to the token the
                // reset admits, telling its holder it lost the lock. Forget the cache on every
                // failed reading, so that what it refuses was read from the database at most
                // about `RESET_POLL + UNHEARD_AFTER` ago; the next reading starts a new
                // baseline. Under a pool too busy to lend a connection within `UNHEARD_AFTER`
                // this costs a round trip per refused token, no more.
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read the audit log");
                    if seen.take().is_some() {
                        tracing::info!(
                            "cannot read the audit log: forgetting cached fences until it answers"
                        );
                    }
                    forget(&self.high_water, Forget::Unheard);
                }
            }
        }
    }

    /// The audit log's mark, waiting at most [`UNHEARD_AFTER`] for it. `reading` is the
    /// reading still in flight from an earlier call, if one outlived its wait: it is waited for
    /// again rather than joined by another, which would take another connection for as long as
    /// the database stays silent.
    async fn read_audit_mark(
        &self,
        reading: &mut Option<tokio::task::JoinHandle<Result<AuditMark, StoreError>>>,
    ) -> Result<AuditMark, StoreError> {
        let mut pending = reading.take().unwrap_or_else(|| {
            let store = self.clone();
            tokio::spawn(async move { detached!(store, b => b.audit_mark().await) })
        });
        match tokio::time::timeout(UNHEARD_AFTER, &mut pending).await {
            Ok(joined) => joined.map_err(|err| StoreError::Task(err.to_string()))?,
            Err(_) => {
                *reading = Some(pending);
                Err(StoreError::Task(
                    "the audit log did not answer in time".into(),
                ))
            }
        }
    }
}

/// How long the reset watcher waits for a reading of the audit log before it takes the reading
/// as failed (and forgets cached fences).
const UNHEARD_AFTER: Duration = Duration::from_secs(1);

/// The audited admin actions and the audit log (`admin.rs`).
pub(in crate::store) trait AdminStore {
    /// A reset and its audit row, in one transaction.
    async fn reset(&self, reset: &Reset) -> Result<Result<ResetDone, ResetRefused>, StoreError>;

    /// A bulk rebind and its audit row, in one transaction.
    async fn rebind(&self, rebind: &Rebind)
        -> Result<Result<RebindDone, ResetRefused>, StoreError>;

    /// The newest audit rows first, at most `limit`.
    async fn audit(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError>;

    /// How many audit rows there are and the newest one's id: a change means another process
    /// reset a fence.
    async fn audit_mark(&self) -> Result<AuditMark, StoreError>;

    /// A task that clears `high_water` as soon as another process resets a fence, if the
    /// backend can be told (else the audit-log poll is the only way to hear of it).
    fn listen_resets(&self, high_water: Arc<HighWater>) -> Option<tokio::task::JoinHandle<()>>;
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
        assert_eq!(
            decide(&reset(Some(5), None), t(10), Some("s".into())),
            Ok((t(5), Some("s".into())))
        );
        assert!(matches!(
            decide(&reset(Some(10), None), t(10), None),
            Err(ResetRefused::NotBelow { .. })
        ));
        assert!(matches!(
            decide(&reset(Some(11), None), t(10), None),
            Err(ResetRefused::NotBelow { .. })
        ));
        assert_eq!(
            decide(&reset(None, Some(None)), t(10), Some("s".into())),
            Ok((t(10), None))
        );
        assert_eq!(
            decide(&reset(None, Some(Some("x"))), t(10), None),
            Ok((t(10), Some("x".into())))
        );
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
        let scope = Reset {
            target: ResetTarget::Scope(Scope::parse("s", 8).unwrap()),
            ..reset(None, None)
        };
        assert!(validate(&scope).is_err(), "a scope reset needs `to`");
    }
}
