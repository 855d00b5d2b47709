//! High availability: the database's role (primary or standby) and how its commits are
//! replicated. PostgreSQL's alone: an embedded SQLite file has no standby (`sqlite/mod.rs`).
//!
//! A fence is only as durable as the commit under it. fencegate therefore
//! - takes no writes from a standby: `/readyz` is 503 while the database is in recovery, and
//!   `serve` started against a standby does not migrate (that would fail on a read-only
//!   server): it starts, waits, and migrates once the database is primary (promoted, or the
//!   URL now routes to the primary);
//! - says when a failover could lose acknowledged fences: at start and every minute it reads
//!   `pg_stat_replication` and warns (once per change, and `fencegate_replication_synchronous
//!   0`) when the primary has streaming replicas but none synchronous;
//! - never keeps a connection that found the server is no longer primary: the pool's release
//!   check (`after_release`, see [`keep_on_release`]) closes it. That check runs only where the
//!   pool's own ping already runs (a failed statement, a connection handed back after
//!   `connections::HOLD_FOR`): a successful write pays nothing for it.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::Duration,
};

use sqlx::{pool::PoolConnectionMetadata, PgConnection};

use super::{hosts::AtStart, PgStore};
use crate::store::{backend::HighAvailability, StoreError};

/// What `/readyz` says while the database is a standby.
pub(super) const IN_RECOVERY: &str =
    "the database is in recovery (a standby): fencegate takes no writes from it; it \
     becomes ready when the database is promoted or the database URL routes to the primary";

/// What `/readyz` says while the database refuses writes without being a standby.
pub(super) const READ_ONLY: &str =
    "the database refuses writes: default_transaction_read_only is on for fencegate's \
     database or role (ALTER DATABASE/ROLE ... SET); fencegate becomes ready when it is off";

/// `pg_is_in_recovery()` and whether this session's transactions are read-only: a standby's
/// always are, and so are a primary's when `default_transaction_read_only` is set for the
/// database or role (a maintenance switch, or a read-only endpoint of a managed service). Either
/// way every write fails with 25006.
pub(super) const WRITABLE: &str =
    "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";

/// How long the release check waits for its answer before closing the connection.
const RELEASE_CHECK_WITHIN: Duration = Duration::from_secs(2);
/// How often a process that started against a standby checks whether it is primary now.
const PROMOTION_POLL: Duration = Duration::from_secs(1);
/// How often the replication of the primary's commits is checked.
const REPLICATION_POLL: Duration = Duration::from_secs(60);

/// The role and replication state this process has seen.
#[derive(Default)]
pub(super) struct Replication {
    /// `serve` started against a standby: the migrations it skipped run once the database is
    /// primary.
    owed: AtomicBool,
    /// One migration run at a time (the poll and `/readyz` may both find the promotion).
    migrating: tokio::sync::Mutex<()>,
    /// The last state reported, so the log says each change once.
    reported: Mutex<Option<Durability>>,
}

/// How the primary's commits reach its standbys.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Durability {
    /// At least one streaming standby confirms each commit before it is acknowledged.
    Synchronous { standbys: i64 },
    /// Streaming replicas, none confirming commits: a failover can lose acknowledged fences.
    Asynchronous {
        replicas: i64,
        names: String,
        commit: String,
    },
    /// No streaming replica: the fences are as durable as this one server.
    Alone { names: String },
    /// The role fencegate connects as cannot read the replication state.
    Hidden,
    /// The database is a standby itself: nothing to say about its primary from here.
    Standby,
}

impl Durability {
    /// `fencegate_replication_synchronous`: only where there are replicas to speak of (a lone
    /// server is not "asynchronous"; an alert on 0 must not fire for it).
    fn gauge(&self) -> Option<f64> {
        match self {
            Durability::Synchronous { .. } => Some(1.0),
            Durability::Asynchronous { .. } => Some(0.0),
            Durability::Alone { .. } | Durability::Hidden | Durability::Standby => None,
        }
    }

    /// `fencegate_replication_replicas`: how many streaming replicas (`None`: unknown).
    fn replicas(&self) -> Option<f64> {
        match self {
            Durability::Synchronous { standbys } => Some(*standbys as f64),
            Durability::Asynchronous { replicas, .. } => Some(*replicas as f64),
            Durability::Alone { .. } => Some(0.0),
            Durability::Hidden | Durability::Standby => None,
        }
    }

    fn log(&self) {
        match self {
            Durability::Synchronous { standbys } => tracing::info!(
                standbys,
                "replication is synchronous: every acknowledged fence is on a standby too, and survives a failover to it"
            ),
            Durability::Asynchronous { replicas, names, commit } => tracing::warn!(
                replicas,
                synchronous_standby_names = %names,
                synchronous_commit = %commit,
                "the primary has streaming replicas but none is synchronous: a failover can lose acknowledged fences \
                 and let a zombie back in. Configure a synchronous standby (synchronous_standby_names, \
                 synchronous_commit = on) before relying on failover (docs/operations.md: High availability)"
            ),
            Durability::Alone { names } if !names.is_empty() => tracing::warn!(
                synchronous_standby_names = %names,
                "synchronous_standby_names is set but no standby is streaming: every commit waits until one \
                 connects (writes answer 503 meanwhile)"
            ),
            Durability::Alone { .. } => tracing::info!(
                "the database has no streaming replicas: fences are as durable as this one server (no failover)"
            ),
            Durability::Hidden => tracing::warn!(
                "cannot see the state of replication (pg_stat_replication hides it from this role): \
                 GRANT pg_monitor to fencegate's database user so it can warn about asynchronous replication"
            ),
            Durability::Standby => {}
        }
    }
}

/// The pool's release check (`PgPoolOptions::after_release`): keep a connection only if it can
/// write. A connection to a server that went into recovery (demoted, or the URL now leads to a
/// standby) fails every write with 25006; it is closed, and the pool opens a new one through
/// the URL, which leads to the primary again after a failover. So is a session opened while
/// `default_transaction_read_only` was on: the setting is read when a session starts, so such a
/// session stays read-only after the switch is turned off, until it is replaced.
pub(super) fn keep_on_release(
    conn: &mut PgConnection,
    _meta: PoolConnectionMetadata,
) -> Pin<Box<dyn Future<Output = Result<bool, sqlx::Error>> + Send + '_>> {
    Box::pin(async move {
        // A connection whose statement never got an answer (a stalled network) would wait here
        // as long: after this long it is closed instead of kept.
        let (in_recovery, read_only): (bool, bool) = tokio::time::timeout(
            RELEASE_CHECK_WITHIN,
            sqlx::query_as(WRITABLE).fetch_one(conn),
        )
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer to the release check",
            ))
        })??;
        if in_recovery || read_only {
            // Debug: against a standby this is every returned connection, until promotion.
            tracing::debug!(
                in_recovery,
                read_only,
                "closing a database connection: its session cannot write"
            );
        }
        Ok(!in_recovery && !read_only)
    })
}

impl HighAvailability for PgStore {
    /// `serve` started against a standby and has not migrated since.
    fn awaits_primary(&self) -> bool {
        self.replication.owed.load(Ordering::Acquire)
    }

    /// Runs for as long as `serve` does: migrates once a standby it started against is
    /// promoted, and reports how the primary replicates (at start and every minute).
    async fn watch_replication(self) {
        let mut next_check = tokio::time::Instant::now();
        loop {
            let owed = self.awaits_primary();
            if owed {
                if let Err(err) = self.check_primary().await {
                    tracing::debug!(error = %err, "still waiting for the database to be primary");
                }
            }
            if owed && !self.awaits_primary() {
                // Promoted (found here or by /readyz): how it replicates now is news.
                next_check = tokio::time::Instant::now();
            }
            if tokio::time::Instant::now() >= next_check {
                match self.replication_state().await {
                    Ok(state) => self.report(state),
                    Err(err) => tracing::debug!(error = %err, "cannot read the replication state"),
                }
                next_check = tokio::time::Instant::now() + REPLICATION_POLL;
            }
            tokio::time::sleep(PROMOTION_POLL).await;
        }
    }
}

impl PgStore {
    /// The start-up migration (`database.migrate_on_start`), unless the database is a standby:
    /// then it is owed until the database is primary, and `serve` starts anyway, not ready.
    /// A primary with `default_transaction_read_only` on fails the migration, and `serve` with
    /// it, saying so: its tables may not exist yet, and nothing could create them.
    pub(super) async fn migrate_unless_standby(&self, found: AtStart) -> anyhow::Result<()> {
        match found {
            AtStart::Writable => self.migrate().await,
            AtStart::Standby => {
                self.replication.owed.store(true, Ordering::Release);
                tracing::warn!(
                    "the database is in recovery (a standby): not migrating now; /readyz is 503 until it is promoted \
                     or the database URL routes to the primary"
                );
                Ok(())
            }
            AtStart::ReadOnly => anyhow::bail!(
                "applying migrations failed: the database refuses writes (is default_transaction_read_only on for \
                 fencegate's database or role?). Turn it off, or, if the schema is already migrated, set \
                 database.migrate_on_start = false: fencegate then starts, not ready until the database takes writes"
            ),
        }
    }

    /// `Ok` if the database is primary and takes writes (running the migrations owed, if
    /// any); else why not. Part of readiness.
    pub(super) async fn check_primary(&self) -> Result<(), StoreError> {
        let mut conn = self.conns.take().await?;
        let (in_recovery, read_only): (bool, bool) =
            sqlx::query_as(WRITABLE).fetch_one(&mut *conn).await?;
        if in_recovery {
            // Not `done`: a session on a standby is never used again (the release check
            // closes it); new connections find the primary through the URL's hosts.
            return Err(StoreError::NotReady(IN_RECOVERY.into()));
        }
        if read_only {
            // Not `done`: back to the pool, whose release check closes it. The session stays
            // read-only after the switch is turned off, so each check replaces one such session
            // until the answer can change.
            return Err(StoreError::NotReady(READ_ONLY.into()));
        }
        conn.done();
        if !self.awaits_primary() {
            return Ok(());
        }
        let Ok(_one) = self.replication.migrating.try_lock() else {
            return Err(StoreError::NotReady(
                "the database was promoted; applying migrations".into(),
            ));
        };
        if !self.awaits_primary() {
            return Ok(()); // migrated by whoever held the lock
        }
        self.migrate().await.map_err(|e| {
            // The driver's words go to the log only: /readyz is open, and says what to do.
            tracing::warn!(error = %e, "the database is primary now, but applying migrations failed");
            StoreError::NotReady("the database is primary now, but applying migrations failed (see the server log)".into())
        })?;
        self.replication.owed.store(false, Ordering::Release);
        tracing::info!("the database is primary now: migrations applied, ready");
        Ok(())
    }

    fn report(&self, state: Durability) {
        if let Some(value) = state.gauge() {
            metrics::gauge!("fencegate_replication_synchronous").set(value);
        }
        if let Some(replicas) = state.replicas() {
            metrics::gauge!("fencegate_replication_replicas").set(replicas);
        }
        let mut reported = self
            .replication
            .reported
            .lock()
            .expect("replication state lock");
        if reported.as_ref() != Some(&state) {
            state.log();
            *reported = Some(state);
        }
    }

    /// Reads how the primary's commits are replicated, on the connection settings fencegate
    /// writes with (`synchronous_commit` may be set per role or database).
    async fn replication_state(&self) -> Result<Durability, StoreError> {
        let mut conn = self.conns.take().await?;
        let (in_recovery, streaming, synchronous, hidden, names, commit): (bool, i64, i64, i64, String, String) =
            sqlx::query_as(
                "SELECT pg_is_in_recovery(),
                        count(*) FILTER (WHERE state = 'streaming'),
                        count(*) FILTER (WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')),
                        count(*) FILTER (WHERE state IS NULL),
                        current_setting('synchronous_standby_names'),
                        current_setting('synchronous_commit')
                 FROM pg_stat_replication",
            )
            .fetch_one(&mut *conn)
            .await?;
        conn.done();
        Ok(Durability::classify(Seen {
            in_recovery,
            streaming,
            synchronous,
            hidden,
            names,
            commit,
        }))
    }
}

/// One reading of the replication state (`replication_state`'s query).
struct Seen {
    in_recovery: bool,
    /// Standbys streaming now, and how many of them confirm commits (sync or quorum).
    streaming: i64,
    synchronous: i64,
    /// Rows whose state this role may not see.
    hidden: i64,
    /// `synchronous_standby_names`, `synchronous_commit`.
    names: String,
    commit: String,
}

impl Durability {
    fn classify(seen: Seen) -> Durability {
        let Seen {
            in_recovery,
            streaming,
            synchronous,
            hidden,
            names,
            commit,
        } = seen;
        // Commits wait for the standby only with these; `local` and `off` acknowledge first.
        let waits = matches!(commit.as_str(), "on" | "remote_write" | "remote_apply");
        if in_recovery {
            Durability::Standby
        } else if hidden > 0 {
            Durability::Hidden
        } else if synchronous > 0 && waits {
            Durability::Synchronous {
                standbys: synchronous,
            }
        } else if streaming > 0 {
            Durability::Asynchronous {
                replicas: streaming,
                names,
                commit,
            }
        } else {
            Durability::Alone { names }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Durability, Seen};

    fn seen(streaming: i64, synchronous: i64, commit: &str) -> Seen {
        Seen {
            in_recovery: false,
            streaming,
            synchronous,
            hidden: 0,
            names: "*".into(),
            commit: commit.into(),
        }
    }

    #[test]
    fn synchronous_only_when_a_streaming_standby_confirms_and_commits_wait_for_it() {
        assert_eq!(Durability::classify(seen(1, 1, "on")).gauge(), Some(1.0));
        assert_eq!(
            Durability::classify(seen(2, 1, "remote_apply")).gauge(),
            Some(1.0)
        );
        // A synchronous standby, but commits acknowledged before it has them.
        assert_eq!(Durability::classify(seen(1, 1, "local")).gauge(), Some(0.0));
        assert_eq!(Durability::classify(seen(1, 1, "off")).gauge(), Some(0.0));
        assert!(matches!(
            Durability::classify(seen(2, 0, "on")),
            Durability::Asynchronous { replicas: 2, .. }
        ));
        assert!(matches!(
            Durability::classify(seen(0, 0, "on")),
            Durability::Alone { .. }
        ));
    }

    #[test]
    fn nothing_is_claimed_when_the_state_cannot_be_seen() {
        assert_eq!(
            Durability::classify(Seen {
                hidden: 1,
                ..seen(1, 0, "on")
            })
            .gauge(),
            None
        );
        assert_eq!(
            Durability::classify(Seen {
                in_recovery: true,
                ..seen(0, 0, "on")
            })
            .gauge(),
            None
        );
    }
}
