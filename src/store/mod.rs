//! Storage: the [`Store`] facade every handler uses, in front of one of two backends. All SQL
//! lives below this module, with every value bound as a parameter.
//!
//! The store does not decide anything about HTTP. It applies a write only if the fence admits it
//! ([`crate::fence::Rule`], evaluated by the database inside the same statement or transaction
//! as the write) and reports an [`Outcome`].
//!
//! - [`Store`] (here): the reject-only fence cache, database work detached from requests, and
//!   readiness under pressure, in front of whichever backend is in use;
//! - `backend`: the `Backend` trait, whose parts are declared beside each feature (`kv`,
//!   `admin`, `tables`, ...); the backend in use is picked here (`AnyBackend`, `on_backend!`);
//! - `pg/` (PostgreSQL, production) and `sqlite/` (embedded, the zero-setup default): one
//!   implementation each, in the same file layout, each owning all of its SQL;
//! - backend-neutral: the fence rules' SQL spelling (`sql`), the refusal's explanation (here),
//!   row decoding (`decode`), errors (`errors`), the kv values (`kv`), and the types and pure
//!   decisions of each feature (`admin`, `overview`, `refusals`, `tables`, `pressure`).

// The backend in use, and the one `match` on it (every facade method is written once for
// both backends). Defined before the modules that use the macros.
/// The backend in use. An enum rather than a trait object: the set is closed and small, and
/// the trait's `async fn`s stay plain. Private to the store: every caller goes through
/// [`Store`](super::Store), so nothing can bypass the reject-only cache or the detaching of
/// database work.
#[derive(Clone)]
enum AnyBackend {
    Postgres(pg::PgStore),
    /// The embedded default (no server needed): see `sqlite/mod.rs` for what differs.
    Sqlite(sqlite::SqliteStore),
}

/// Evaluates `$call` with `$b` bound to the backend in use: the only `match` on
/// [`AnyBackend`], so each facade method is written once for both backends.
macro_rules! on_backend {
    ($backend:expr, $b:ident => $call:expr) => {
        match $backend {
            $crate::store::AnyBackend::Postgres($b) => $call,
            $crate::store::AnyBackend::Sqlite($b) => $call,
        }
    };
}

/// [`on_backend!`] on a task of its own (see [`run_detached`](super::run_detached)): for
/// database work that must finish even if the request that started it goes away. What
/// `$call` uses must be owned (cloned) before the macro.
macro_rules! detached {
    ($self:ident, $b:ident => $call:expr) => {{
        let backend = $self.backend.clone();
        // Boxed: until it is spawned the work sits in the caller's future, whose size (the
        // largest of its arms, paid on every request that builds it) it would double.
        Box::pin($crate::store::run_detached($self.give_up_after, async move {
            on_backend!(&backend, $b => $call)
        }))
        .await
    }};
}

pub mod admin;
mod backend;
mod classify;
mod decode;
mod errors;
mod idempotency;
mod kv;
pub mod overview;
mod pg;
mod pressure;
mod refusals;
mod settings;
mod sql;
mod sql_writers;
mod sqlite;
mod tables;
pub mod unfenced;

use std::sync::Arc;

use crate::{
    fence::{
        self, FenceRef, Fenced, FencingToken, Guard, HighWater, Key, Outcome, Rule, Scope, Stale,
    },
    locks::{Acquired, Held, Ttl},
};

pub(crate) use crate::fence::Refusal;
use backend::{Backend as _, HighAvailability as _, KvStore as _, LockStore as _};
pub(crate) use decode::{holder_from, scope_state_from, token_from_db};
pub use errors::{Cause, DbKind, Jumper, Lack, StoreError, Unstorable};
pub use idempotency::{Answer, Done, IdemId, Keep, Keyed, Render, MAX_KEPT_BODY};
pub use kv::{Claimed, Document, Entry, Write, Written};
pub use pg::{kv_put_scoped_sql, kv_put_sql, KV_GET};
pub use refusals::RefusalFilter;
pub use settings::{Pooler, Settings, SqlWriters};
pub use sql::Checks;
pub(crate) use sql::SCOPE_STATE;
pub use sql_writers::SqlSeen;
pub use tables::{BatchOp, BatchWritten, RowEntry, RowWritten, TableError};

/// The store every handler uses: a backend, plus the reject-only fence cache in front of it.
#[derive(Clone)]
pub struct Store {
    backend: AnyBackend,
    high_water: Arc<HighWater>,
    /// Writes refused for lack of resources lately (a full disk): readiness says so.
    pressure: Arc<pressure::Pressure>,
    /// The console's overview, bounded in cost (`overview`).
    overview: Arc<overview::Latest>,
    /// What SQL writers ran into, as last seen (`sql_writers`).
    sql_seen: Arc<std::sync::Mutex<SqlSeen>>,
    /// What the verdict checks besides the rule (the backends build their SQL from the same).
    checks: Arc<Checks>,
    /// Database work with no answer after this long is given up ([`give_up`]).
    give_up_after: Option<std::time::Duration>,
}

/// Runs database work to completion on its own task, whatever happens to the request that
/// started it. An HTTP request future can be dropped at any await point (request timeout,
/// client disconnect); if it owned the database work, a transaction could be abandoned
/// half-way: sqlx 0.8 returns a connection whose `BEGIN` was cancelled to the pool still inside
/// the transaction, and later writes on it would be acknowledged but never committed. Detached,
/// the work always ends in COMMIT or ROLLBACK and the connection goes back clean; the caller
/// that went away just never hears the outcome (which is "unknown" for it, as with any 503).
async fn run_detached<T, E>(
    give_up_after: Option<std::time::Duration>,
    work: impl std::future::Future<Output = Result<T, E>> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<StoreError> + Send + 'static,
{
    match tokio::spawn(give_up(give_up_after, work)).await {
        Ok(result) => result,
        Err(err) => Err(StoreError::Task(err.to_string()).into()),
    }
}

tokio::task_local! {
    /// Set while [`give_up`] drops work whose statement got no answer in time.
    static GIVEN_UP: std::cell::Cell<bool>;
}

/// Runs `work` for at most `limit` (`Settings::give_up_after_ms`), then drops it: 503, outcome
/// unknown. A statement that never gets an answer (a partition that drops packets, a frozen
/// server) would otherwise hold its connection, and the writes queued behind it, until TCP
/// gives up. Every connection the dropped work held is closed, never reused: its transaction
/// may have been cut anywhere, even inside `BEGIN` (`pg::connections`, [`given_up`]).
///
/// A future of its own rather than an `async fn`: an `async fn` keeps its argument and the
/// future it awaits side by side, so `work` was held (and moved) two and three times over, and
/// the coalescer's statement future, boxed once per lone write, was 9 KB (bench/RESULTS.md).
pub(crate) fn give_up<T, E, F>(
    limit: Option<std::time::Duration>,
    work: F,
) -> tokio::task::futures::TaskLocalFuture<std::cell::Cell<bool>, GivingUp<F>>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: From<StoreError>,
{
    GIVEN_UP.scope(
        std::cell::Cell::new(false),
        GivingUp {
            work: Some(work),
            limit,
            deadline: None,
        },
    )
}

pin_project_lite::pin_project! {
    /// `work` until it ends or `limit` has passed since its first poll ([`give_up`]); polled
    /// inside the scope of [`GIVEN_UP`], so the work is dropped there when it is given up.
    pub(crate) struct GivingUp<F> {
        #[pin]
        work: Option<F>,
        limit: Option<std::time::Duration>,
        // Set at the first poll, as `tokio::time::timeout` inside an `async fn` was; outside
        // tokio's cooperative budget, so that work which spends the task's budget on every
        // poll cannot hold the deadline off (`timeout` polls its delay the same way).
        #[pin]
        deadline: Option<tokio::task::Unconstrained<tokio::time::Sleep>>,
    }
}

impl<T, E, F> std::future::Future for GivingUp<F>
where
    F: std::future::Future<Output = Result<T, E>>,
    E: From<StoreError>,
{
    type Output = Result<T, E>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let mut this = self.project();
        if let (Some(limit), None) = (*this.limit, this.deadline.as_ref().as_pin_ref()) {
            this.deadline
                .set(Some(tokio::task::unconstrained(tokio::time::sleep(limit))));
        }
        let Some(work) = this.work.as_mut().as_pin_mut() else {
            panic!("GivingUp polled after it ended");
        };
        if let std::task::Poll::Ready(done) = work.poll(cx) {
            this.work.set(None);
            return std::task::Poll::Ready(done);
        }
        let due = this
            .deadline
            .as_pin_mut()
            .is_some_and(|deadline| deadline.poll(cx).is_ready());
        if due {
            // Dropped here, inside the scope, so its connections see the flag as they go.
            GIVEN_UP.with(|given_up| given_up.set(true));
            this.work.set(None);
            std::task::Poll::Ready(Err(StoreError::unavailable(
                    "the database did not answer in time; the statement was given up and its outcome is unknown",
                )
                .into()))
        } else {
            std::task::Poll::Pending
        }
    }
}

/// Whether the work running now is being dropped by [`give_up`].
pub(crate) fn given_up() -> bool {
    GIVEN_UP.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// What a refused key looked like when the refusal was explained: the scope of its last
/// accepted write and its own fence.
pub(crate) struct KeyState {
    pub scope: Option<String>,
    pub key_fence: FencingToken,
}

/// What the database held after a refused kv write, read to explain it: each refused key's
/// state (`keys`: only keys that have a row) and, for a scoped write, the scope's fence and the
/// latest token granted by the built-in lock of that name.
pub(crate) struct Seen<'a> {
    pub keys: std::collections::HashMap<&'a str, KeyState>,
    pub scope_fence: Option<FencingToken>,
    pub latest_issued: Option<FencingToken>,
}

/// Why the writes of `keys` under `guard` were refused: [`crate::fence::verdict`] on what the
/// database holds after the refused statement. Fences and lock counters never go down (but for
/// an audited admin reset) and a key's scope changes only under the rule that refused, so what
/// is read still refuses the write; if nothing does, a concurrent change (a grant, a reset)
/// explains it (below).
pub(crate) fn explain_refusal(
    keys: &[Key],
    seen: &Seen,
    guard: &Guard,
    checks: &Checks,
) -> Result<Refusal, StoreError> {
    let held = keys
        .iter()
        .map(|key| {
            let state = seen.keys.get(key.as_str());
            fence::Held {
                fenced: Fenced::Key(key.clone()),
                fence: state.map(|s| s.key_fence),
                remembered: state.map(|s| s.scope.as_deref()),
            }
        })
        .collect();
    let seen = fence::Seen {
        held,
        scope: fence::ScopeHeld::Read {
            fence: seen.scope_fence,
            latest_issued: seen.latest_issued,
        },
        binding: None,
    };
    match fence::verdict(&seen, guard, checks) {
        Err(refusal) => Ok(refusal),
        Ok(()) => Err(raced(guard.token, guard.scope(), keys.len())),
    }
}

/// No check refuses now what the database refused then. The guards read a snapshot (see
/// `sql_issued_check`, `sql_jump_check`), so a grant or a fence raise that committed in
/// between explains it: e.g. a write carrying the token a grant was issuing at that moment.
/// Nothing was written, and a retry with the same token may now be accepted.
pub(crate) fn raced(token: FencingToken, scope: Option<&Scope>, things: usize) -> StoreError {
    metrics::counter!("fencegate_raced_refusals_total").increment(1);
    tracing::info!(%token, ?scope, things, "a refused write raced a concurrent change; answering 503");
    StoreError::Raced(
        "a concurrent change (a lock grant, a fence raised) landed while the write was checked; nothing was written".into(),
    )
}

/// Ready as far as the schema goes: every migration this binary knows (`migrator`) is applied.
fn migrated(applied: i64, migrator: &sqlx::migrate::Migrator) -> Result<(), StoreError> {
    let known = migrator.iter().count() as i64;
    if applied < known {
        return Err(StoreError::Corrupt(format!(
            "{applied} of {known} migrations applied; run `fencegate migrate`"
        )));
    }
    Ok(())
}

/// A grant over a lease that lapsed without a release (both backends call this once the grant
/// is decided; it is committed with the acquire or not at all, which a metric can ignore).
pub(crate) fn count_takeover() {
    metrics::counter!("fencegate_lock_takeovers_total").increment(1);
    metrics::counter!("fencegate_lease_expiries_total").increment(1);
}

impl Store {
    /// Opens the configured database (running migrations if configured): PostgreSQL when a
    /// URL is set, else the embedded SQLite file.
    pub async fn open(settings: &Settings) -> anyhow::Result<Self> {
        let backend = if settings.is_sqlite() {
            let url = &settings.url;
            tracing::info!(%url, "using the embedded SQLite database (set DATABASE_URL for PostgreSQL)");
            AnyBackend::Sqlite(sqlite::SqliteStore::open(settings).await?)
        } else {
            AnyBackend::Postgres(pg::PgStore::open(settings).await?)
        };
        Ok(Store {
            checks: Arc::new(settings.checks.clone()),
            backend,
            high_water: Arc::new(HighWater::new(settings.fence_cache_capacity)),
            pressure: Arc::default(),
            overview: Arc::default(),
            sql_seen: Arc::default(),
            give_up_after: settings.give_up_after(),
        })
    }

    /// Ready to take writes: reachable, primary, writable, migrated, and no write refused for
    /// lack of resources lately ([`pressure`]).
    pub async fn ready(&self) -> Result<(), StoreError> {
        if let Some(why) = self.pressure.recent() {
            return Err(StoreError::NotReady(why));
        }
        detached!(self, b => b.ready().await)
    }

    /// For as long as `serve` runs: migrations owed since a start against a standby, and
    /// warnings about replication (`pg/replication.rs`; SQLite has nothing to watch).
    pub async fn watch_replication(self) {
        on_backend!(self.backend, b => b.watch_replication().await)
    }

    /// `serve` started against a standby and has not migrated since (`fencegate migrate`
    /// refuses to report success then).
    pub fn awaits_primary(&self) -> bool {
        on_backend!(&self.backend, b => b.awaits_primary())
    }

    /// A fenced single-key write. The cache may refuse it outright; otherwise the database
    /// decides, and what it reports raises the cache.
    /// Takes the write by value: it moves onto the database task (and into the coalescer)
    /// without copying the value.
    pub async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError> {
        let since = self.high_water.epoch();
        // The fence's place in the cache, taken once: the write's key moves on with it, and
        // what the database reports is learnt at the same place (below).
        let fence = HighWater::guarding(guard, write.key());
        let slot = self.high_water.slot(fence);
        if let Some(stale) = self
            .high_water
            .refuse_at(slot, fence, guard.token, guard.rule)
        {
            metrics::counter!("fencegate_cache_refusals_total").increment(1);
            return Ok(Outcome::Stale(vec![stale]));
        }
        // A write run by a backend's coalescer needs no task of its own: a worker owns the
        // statement (and any transaction), or the request sends it itself and hands what is
        // left to a task of its own if it goes away (`pg::batching::FinishOnDrop`); either way
        // it is finished whether or not this request is still waiting. Skipping the extra task
        // saves a cross-thread hop per write.
        let outcome = if on_backend!(&self.backend, b => b.writes_on_workers()) {
            on_backend!(&self.backend, b => b.write(write, guard).await)
        } else {
            let owned_guard = guard.clone();
            detached!(self, b => b.write(write, &owned_guard).await)
        };
        self.pressure.observe(&outcome);
        let outcome = outcome?;
        // The written key is the write's, so its fence is at the slot taken above.
        self.learn(since, &outcome, |written| {
            let fence = HighWater::guarding(guard, &written.key);
            self.high_water.observe_at(since, slot, fence, guard.token)
        });
        Ok(outcome)
    }

    /// Applies every write or none, under one token. Always asks the database, so a refusal
    /// names every stale key, not just the ones the cache knows.
    pub async fn batch(
        &self,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Outcome<Vec<Written>>, StoreError> {
        let since = self.high_water.epoch();
        let (owned_writes, owned_guard) = (writes.to_vec(), guard.clone());
        let outcome = detached!(self, b => b.batch(&owned_writes, &owned_guard).await);
        self.pressure.observe(&outcome);
        let outcome = outcome?;
        match &outcome {
            Outcome::Accepted(written) => {
                for w in written {
                    let fence = HighWater::guarding(guard, &w.key);
                    self.high_water.observe(since, fence, guard.token);
                }
            }
            Outcome::Stale(stale) => self.learn_refusals(since, stale),
            // These say nothing about any fence's value.
            Outcome::Mismatch(_) | Outcome::NotIssued(_) | Outcome::Jump(_) => {}
        }
        Ok(outcome)
    }

    /// What the database said of a write's fences, into the cache: `accepted` records an
    /// accepted write's. `since`: the cache's epoch before the database work (see
    /// `HighWater::observe`).
    fn learn<T>(&self, since: u64, outcome: &Outcome<T>, accepted: impl FnOnce(&T)) {
        match outcome {
            Outcome::Accepted(done) => accepted(done),
            Outcome::Stale(stale) => self.learn_refusals(since, stale),
            Outcome::Mismatch(_) | Outcome::NotIssued(_) | Outcome::Jump(_) => {}
        }
    }

    fn learn_refusals(&self, since: u64, stale: &[Stale]) {
        for s in stale {
            self.high_water
                .observe(since, s.fenced.borrowed(), s.current);
        }
    }

    /// The answer to a write whose presented scope contradicts a configured binding
    /// ([`fence::binding`]): the verdict on what the presented scope's fence holds, so a stale
    /// (or unissued, or jumping) token is told so before the binding, as on every path. Nothing
    /// is written; the caller checked the actor's rights on that scope first (this reads its
    /// fence).
    pub async fn refuse_binding(
        &self,
        guard: &Guard,
        mismatch: fence::ScopeMismatch,
    ) -> Result<Refusal, StoreError> {
        let scope = guard.scope().cloned();
        let (fence, latest_issued) = match &scope {
            Some(scope) => {
                if let Some(stale) =
                    self.high_water
                        .refuse(FenceRef::Scope(scope), guard.token, guard.rule)
                {
                    metrics::counter!("fencegate_cache_refusals_total").increment(1);
                    return Ok(Refusal::Stale(vec![stale]));
                }
                let scope = scope.clone();
                detached!(self, b => b.scope_state(&scope).await)?
            }
            // A binding mismatch always has a presented scope; without one there is no fence.
            None => (None, None),
        };
        let seen = fence::Seen {
            held: vec![],
            scope: fence::ScopeHeld::Read {
                fence,
                latest_issued,
            },
            binding: Some(mismatch),
        };
        Ok(fence::verdict(&seen, guard, &self.checks)
            .expect_err("a binding mismatch refuses whatever else admits"))
    }

    pub async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        // Like writes: a read worker owns the statement, no task of our own.
        if on_backend!(&self.backend, b => b.reads_on_workers()) {
            return on_backend!(&self.backend, b => b.get(key).await);
        }
        let key = key.clone();
        detached!(self, b => b.get(&key).await)
    }

    /// Raises a scope's fence to `token` (a claim: QJM's newEpoch). Claims use the inclusive
    /// rule whatever `kv.strict` says: a claim consumes nothing, it only shuts out lower tokens.
    pub async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError> {
        let since = self.high_water.epoch();
        let fence = FenceRef::Scope(scope);
        if let Some(stale) = self.high_water.refuse(fence, token, Rule::Inclusive) {
            metrics::counter!("fencegate_cache_refusals_total").increment(1);
            return Ok(Outcome::Stale(vec![stale]));
        }
        let owned_scope = scope.clone();
        let outcome = detached!(self, b => b.claim(&owned_scope, token).await);
        self.pressure.observe(&outcome);
        let outcome = outcome?;
        self.learn(since, &outcome, |_| {
            self.high_water.observe(since, fence, token)
        });
        Ok(outcome)
    }

    pub async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError> {
        let scope = scope.clone();
        detached!(self, b => b.fence(&scope).await)
    }

    /// Grants the lock `name` if it is free or expired, claiming the scope `name` in the same
    /// transaction. `actor` (the authenticated actor, if auth is on) is recorded with the lease.
    pub async fn acquire(
        &self,
        name: &Scope,
        owner: &str,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Acquired, StoreError> {
        let since = self.high_water.epoch();
        let (owned_name, owner, actor) = (name.clone(), owner.to_owned(), actor.map(str::to_owned));
        let acquired =
            detached!(self, b => b.acquire(&owned_name, &owner, ttl, actor.as_deref()).await)?;
        if let Acquired::Granted(lease) = &acquired {
            // The grant claimed the scope: this process can refuse the old holder at once.
            self.high_water
                .observe(since, FenceRef::Scope(name), lease.token);
        }
        Ok(acquired)
    }

    /// Extends the lease if `token` still holds it (and, with `actor`, that actor took it);
    /// else who holds the lock now, if anyone.
    pub async fn renew(
        &self,
        name: &Scope,
        token: FencingToken,
        ttl: Ttl,
        actor: Option<&str>,
    ) -> Result<Held, StoreError> {
        let (name, actor) = (name.clone(), actor.map(str::to_owned));
        detached!(self, b => match b.renew(&name, token, ttl, actor.as_deref()).await? {
            Some(lease) => Ok(Held::Yes(lease)),
            None => Ok(Held::refused(b.holder(&name).await?, token, actor.as_deref())),
        })
    }

    /// Frees the lock if `token` still holds it (and, with `actor`, that actor took it); else
    /// who holds the lock now, if anyone.
    pub async fn release(
        &self,
        name: &Scope,
        token: FencingToken,
        actor: Option<&str>,
    ) -> Result<Held, StoreError> {
        let (name, actor) = (name.clone(), actor.map(str::to_owned));
        detached!(self, b => match b.release(&name, token, actor.as_deref()).await? {
            Some(lease) => Ok(Held::Yes(lease)),
            None => Ok(Held::refused(b.holder(&name).await?, token, actor.as_deref())),
        })
    }

    /// Who holds the lock `name` now (a live lease), if anyone.
    pub async fn holder(&self, name: &Scope) -> Result<Option<crate::locks::Holder>, StoreError> {
        let name = name.clone();
        detached!(self, b => b.holder(&name).await)
    }

    /// Gives idle database connections' buffers back (once a second, by the tick).
    pub fn shrink_idle_connections(&self) {
        on_backend!(&self.backend, b => b.shrink_idle_connections())
    }

    /// (open, idle) connections, for the pool gauges.
    pub fn pool_stats(&self) -> (u32, usize) {
        on_backend!(&self.backend, b => b.pool_stats())
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::{
            atomic::{AtomicBool, Ordering},
            Arc,
        },
        time::Duration,
    };

    use super::{give_up, given_up, StoreError};

    /// What `given_up()` said when it was dropped.
    struct Probe(Arc<AtomicBool>);

    /// A probe, and where it will say what it saw (`initially` until it is dropped).
    fn probe(initially: bool) -> (Probe, Arc<AtomicBool>) {
        let seen = Arc::new(AtomicBool::new(initially));
        (Probe(seen.clone()), seen)
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.store(given_up(), Ordering::SeqCst);
        }
    }

    /// Work with no answer is dropped at the deadline inside the scope, with the flag set (so
    /// its connections are closed, never reused), and the caller gets 503.
    #[tokio::test]
    async fn work_past_the_deadline_is_dropped_as_given_up() {
        let (probe, seen) = probe(false);
        let out = give_up(Some(Duration::from_millis(50)), async move {
            let _probe = probe;
            std::future::pending::<()>().await;
            Ok::<(), StoreError>(())
        })
        .await;
        assert!(matches!(out, Err(StoreError::Unavailable(_))), "{out:?}");
        assert!(seen.load(Ordering::SeqCst), "dropped with the flag set");
        assert!(!given_up(), "the flag is the scope's only");
    }

    /// Work that ends in time is its own answer, and dropped without the flag.
    #[tokio::test]
    async fn work_in_time_is_not_given_up() {
        let (probe, seen) = probe(true);
        let out = give_up(Some(Duration::from_secs(5)), async move {
            let _probe = probe;
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<u32, StoreError>(7)
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert!(!seen.load(Ordering::SeqCst));
        assert_eq!(
            give_up(None, async { Ok::<u32, StoreError>(8) })
                .await
                .unwrap(),
            8
        );
    }

    /// Work that spends the task's whole cooperative budget on every poll (rows arriving
    /// without end, say) cannot hold the deadline off.
    #[tokio::test]
    async fn work_that_spends_the_whole_budget_is_still_given_up() {
        let busy = give_up(Some(Duration::from_millis(50)), async {
            loop {
                tokio::task::consume_budget().await;
            }
            #[allow(unreachable_code)]
            Ok::<(), StoreError>(())
        });
        let out = tokio::time::timeout(Duration::from_secs(5), busy)
            .await
            .expect("given up at its deadline, long before 5 s");
        assert!(matches!(out, Err(StoreError::Unavailable(_))), "{out:?}");
    }
}
