//! The PostgreSQL connections fencegate keeps between statements.
//!
//! Every database call takes a connection here rather than from the sqlx pool directly. The
//! reason is measured, not taste: sqlx 0.8 pings every connection returned to its pool (an
//! extra round trip, on a spawned task), which costs PostgreSQL and fencegate about as much as
//! the statement itself. A connection that finished its work cleanly comes back here instead,
//! to the top of a stack, and the next caller takes the most recently used one: at low
//! concurrency every statement then lands on the same PostgreSQL backend, still on CPU and in
//! cache (rotating over idle backends measurably slowed single-connection writes).
//!
//! The sqlx pool still opens connections, bounds their number (`database.max_connections`,
//! `acquire_timeout_ms`) and closes the ones past `max_lifetime_secs`: each connection is
//! handed back to it after [`HOLD_FOR`].
//!
//! Safety: a [`Borrowed`] goes back on the stack only if its user called [`Borrowed::done`]
//! after the work succeeded. One dropped any other way (an error, or a caller that went away
//! mid-statement) goes back to the sqlx pool instead, whose release check (that ping) flushes
//! the ROLLBACK of a dropped transaction and closes a broken connection: errors pay the
//! ping, the common path does not. What that check cannot see, a BEGIN abandoned half-way,
//! cannot happen: transactions run on detached tasks or coalescer workers, which always
//! finish them (see `store::run_detached`), or are given up whole after
//! `Settings::give_up_after_ms` (`store::give_up`): a connection dropped that way is closed at
//! once, never returned, since its transaction may have been cut anywhere.
//!
//! The connections in use are known with the time they were taken, so readiness can say when
//! statements are stuck ([`Connections::stuck`]): a pool whose connections wait for answers that
//! do not come cannot take writes, however well a fresh connection answers. Each connection in
//! use stamps its own slot (one atomic per permit): this runs for every statement, and the map
//! behind one lock it replaced cost every statement a lock, a hash and an allocation.

use std::{
    ops::{Deref, DerefMut},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use sqlx::{pool::PoolConnection, PgConnection, PgPool, Postgres};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::store::StoreError;

/// How long fencegate keeps one connection before handing it back to the pool: long enough
/// that the pool's costs are off the per-statement path, short enough that connections are
/// recycled (`max_lifetime_secs`) and follow a failover.
const HOLD_FOR: Duration = Duration::from_secs(30);

pub(in crate::store) struct Connections {
    pool: PgPool,
    /// Connections not in use, most recently used last.
    idle: Mutex<Vec<Held>>,
    /// One permit per connection in use, `max_connections` in all. Callers wait here, not in
    /// the pool: a connection that is done comes back to `idle`, which the pool's own waiters
    /// would never hear of. A permit holder that finds `idle` empty can ask the pool: the other
    /// holders use at most `max_connections - 1` connections, so the pool has room, or will
    /// as soon as a connection on its way back to it (an error's, an old one's) arrives.
    permits: Arc<Semaphore>,
    acquire_timeout: Duration,
    /// `Settings::give_up_after_ms`, for the coalescer's and readers' statements.
    give_up_after: Option<Duration>,
    /// When each connection in use was taken: µs since `epoch`, plus one; 0 is a free slot.
    /// One slot per permit, so a permit holder always finds a free one.
    busy: Box<[AtomicU64]>,
    epoch: Instant,
}

struct Held {
    conn: PoolConnection<Postgres>,
    since: Instant,
}

impl Held {
    fn is_old(&self) -> bool {
        self.since.elapsed() >= HOLD_FOR
    }
}

/// One connection in use. Derefs to the connection; call [`Borrowed::done`] when the work
/// succeeded, else it goes back to the sqlx pool (and its release check) on drop.
pub(in crate::store) struct Borrowed<'a> {
    conns: &'a Connections,
    held: Option<Held>,
    clean: bool,
    /// Its slot in `Connections::busy`.
    slot: usize,
    /// Released after `drop` put the connection back (fields drop after `Drop::drop`).
    _permit: OwnedSemaphorePermit,
}

impl Connections {
    pub(in crate::store) fn new(
        pool: PgPool,
        max_connections: u32,
        acquire_timeout: Duration,
        give_up_after: Option<Duration>,
    ) -> Self {
        Connections {
            pool,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(max_connections.max(1) as usize)),
            acquire_timeout,
            give_up_after,
            busy: (0..max_connections.max(1))
                .map(|_| AtomicU64::new(0))
                .collect(),
            epoch: Instant::now(),
        }
    }

    /// `Settings::give_up_after_ms` (see `store::give_up`).
    pub(in crate::store) fn give_up_after(&self) -> Option<Duration> {
        self.give_up_after
    }

    /// How many connections have been in use for longer than `after` (waiting for an answer,
    /// as a statement never does for that long when the database and the network are well).
    pub(in crate::store) fn stuck(&self, after: Duration) -> usize {
        let now = self.stamp();
        let after = after.as_micros() as u64;
        self.busy
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|&since| since != 0 && now.saturating_sub(since) > after)
            .count()
    }

    /// Now, as a slot holds it: µs since `epoch`, plus one (never 0, which means free).
    fn stamp(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64 + 1
    }

    /// The most recently used idle connection if it is still young, else one from the pool.
    /// Waits at most `acquire_timeout_ms` for a free connection; then 503.
    pub(in crate::store) async fn take(&self) -> Result<Borrowed<'_>, StoreError> {
        // A free permit is taken at once; only a caller that must wait arms a timer (this runs
        // for every statement).
        let permit =
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => permit,
                Err(_) => match tokio::time::timeout(
                    self.acquire_timeout,
                    self.permits.clone().acquire_owned(),
                )
                .await
                {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_closed)) => {
                        return Err(StoreError::unavailable(
                            "the connection pool is closed (shutting down)",
                        ))
                    }
                    Err(_elapsed) => return Err(StoreError::unavailable(
                        "no database connection came free in time (database.acquire_timeout_ms)",
                    )),
                },
            };
        let top = self.idle.lock().expect("idle connections lock").pop();
        let held = match top {
            Some(held) if !held.is_old() => held,
            old => {
                // An old one goes back to the pool (which closes it if past its lifetime)
                // BEFORE asking the pool for another: held, it could be the very connection the
                // pool is waiting for, and after an idle spell every stacked one is old.
                drop(old);
                Held {
                    conn: self.pool.acquire().await?,
                    since: Instant::now(),
                }
            }
        };
        // Permits never outnumber slots and a slot is freed before its permit (`Drop`), so a
        // free one is there; at low load the first.
        let stamp = self.stamp();
        let slot = self
            .busy
            .iter()
            .position(|slot| {
                slot.compare_exchange(0, stamp, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            })
            .expect("a permit holder finds a free slot");
        Ok(Borrowed {
            conns: self,
            held: Some(held),
            clean: false,
            slot,
            _permit: permit,
        })
    }

    /// Connections kept here, not in use.
    pub(in crate::store) fn idle_count(&self) -> usize {
        self.idle.lock().expect("idle connections lock").len()
    }

    fn put_back(&self, held: Held) {
        let aged = {
            let mut idle = self.idle.lock().expect("idle connections lock");
            idle.push(held);
            // The bottom of the stack is the least recently used: hand it back once old, so
            // connections a past burst opened do not stay held for good.
            if idle.first().is_some_and(Held::is_old) {
                Some(idle.remove(0))
            } else {
                None
            }
        };
        // Outside the lock: dropping spawns the pool's return task. Its buffers go back to
        // their default size first, or the pool would keep them as large as its biggest message.
        drop(aged.map(|mut held| {
            sqlx::Connection::shrink_buffers(&mut *held.conn);
            held
        }));
    }

    /// Gives the idle connections' buffers back (the tick calls this once a second). A
    /// connection's read and write buffers grow to the largest message it carried and never
    /// shrink by themselves: after a burst of 1 MiB values, every pooled connection kept
    /// megabytes (RSS stayed at 420-440 MB for half an hour). Shrinking on every statement
    /// would reallocate them on the hot path (a coalesced statement outgrows the default
    /// 8 KiB); once a second, on the connections not in use, costs nothing measurable.
    pub(in crate::store) fn shrink_idle(&self) {
        let mut idle = self.idle.lock().expect("idle connections lock");
        for held in idle.iter_mut() {
            sqlx::Connection::shrink_buffers(&mut *held.conn);
        }
    }
}

impl Borrowed<'_> {
    /// The work on this connection succeeded: it goes back on the stack for the next caller.
    pub(in crate::store) fn done(mut self) {
        self.clean = true;
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        self.conns.busy[self.slot].store(0, Ordering::Relaxed);
        if let Some(held) = self.held.take() {
            if self.clean {
                self.conns.put_back(held);
            } else if crate::store::given_up() {
                // Cut off mid-statement (`store::give_up`): closed now, without a word to a
                // server that is not answering; the pool opens a replacement.
                drop(held.conn.detach());
            }
            // else: dropped here, back to the pool and its release check (module docs).
        }
    }
}

impl Deref for Borrowed<'_> {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.held.as_ref().expect("held until dropped").conn
    }
}

impl DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.held.as_mut().expect("held until dropped").conn
    }
}
