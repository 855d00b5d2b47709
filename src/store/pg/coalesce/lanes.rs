//! Lanes: where the writes under a held scope wait, out of everyone else's way.
//!
//! A scope's fence row held by another transaction (a SQL writer's that called
//! `fencegate.fence()` and stalls) makes every write under that scope wait for it. In the
//! coalescing queue, such a write would hold up every write queued behind it, whatever its key
//! or scope. So once a worker's statement finds a scope's fence held (it gives up after
//! `BRIEF_LOCK_WAIT_MS`), that scope gets a lane: a task of its own that applies the scope's
//! writes one batch at a time, each statement waiting for the fence at most until its oldest
//! write has waited `database.lock_timeout_ms` (then 503, nothing written). While the lane is
//! open, new writes under the scope join it rather than the queue; it closes once it has no
//! write left, and the scope's writes are coalesced again.
//!
//! Bounds: at most `lane_connections` lanes wait on the database at once (each holds a
//! connection while it waits), so held scopes can never take the connections every other
//! write needs; a lane waiting for its turn answers 503 at its oldest write's deadline. A lane
//! holds at most `MAX_QUEUED_PER_ROW` times `coalesce_max_rows` writes; more are answered 503 at
//! once.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::{Duration, Instant},
};

use tokio::sync::Semaphore;

use super::{settle, split_rounds, Job, Shared, Wait};
use crate::{fence::Scope, store::StoreError};

/// A lane holds at most this many times `database.coalesce_max_rows` waiting writes.
const MAX_QUEUED_PER_ROW: usize = 4;

/// The 503 of a write under a held scope that waited its `database.lock_timeout_ms`.
pub(super) fn held_too_long() -> StoreError {
    StoreError::unavailable(
        "the scope's fence is held by another transaction (e.g. a SQL writer's after fencegate.fence()); \
         database.lock_timeout_ms passed",
    )
}

pub(super) struct Lanes {
    /// The waiting writes of every open lane, by scope.
    waiting: Mutex<HashMap<Scope, VecDeque<Waiting>>>,
    /// How many lanes are open: while none is, a write does not look at `waiting`.
    open: AtomicUsize,
    /// One per lane that may wait on the database at once.
    turns: Arc<Semaphore>,
    lock_timeout: Duration,
    max_rows: usize,
}

struct Waiting {
    job: Job,
    /// When it is answered 503 if not applied by then.
    deadline: Instant,
}

impl Lanes {
    pub(super) fn new(lock_timeout: Duration, lane_connections: usize, max_rows: usize) -> Self {
        Lanes {
            waiting: Mutex::default(),
            open: AtomicUsize::new(0),
            turns: Arc::new(Semaphore::new(lane_connections.max(1))),
            lock_timeout,
            max_rows: max_rows.max(1),
        }
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<Scope, VecDeque<Waiting>>> {
        // A panic while the lock is held leaves the map as consistent as before it.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Puts `job` in its scope's lane if that scope has one; else hands it back.
    pub(super) fn join(&self, job: Job) -> Result<(), Job> {
        if self.open.load(Ordering::Acquire) == 0 {
            return Err(job);
        }
        let Some(scope) = job.scope.clone() else {
            return Err(job);
        };
        let mut waiting = self.waiting();
        match waiting.get_mut(&scope) {
            Some(lane) => {
                self.push(lane, job);
                Ok(())
            }
            None => Err(job),
        }
    }

    /// Puts the writes of `scope` (whose fence a worker found held) in its lane, opening one if
    /// it has none.
    pub(super) fn open(&self, shared: &Arc<Shared>, scope: Scope, jobs: Vec<Job>) {
        let opened = {
            let mut waiting = self.waiting();
            let (lane, opened) = match waiting.entry(scope.clone()) {
                std::collections::hash_map::Entry::Occupied(lane) => (lane.into_mut(), false),
                std::collections::hash_map::Entry::Vacant(lane) => {
                    self.open.fetch_add(1, Ordering::AcqRel);
                    (lane.insert(VecDeque::new()), true)
                }
            };
            for job in jobs {
                self.push(lane, job);
            }
            opened
        };
        if opened {
            metrics::counter!("fencegate_held_scope_lanes_total").increment(1);
            tracing::info!(scope = %scope.as_str(), "a scope's fence is held by another transaction: its writes wait apart");
            tokio::spawn(run(shared.clone(), scope));
        }
    }

    fn push(&self, lane: &mut VecDeque<Waiting>, job: Job) {
        if lane.len() >= MAX_QUEUED_PER_ROW * self.max_rows {
            let _ = job.reply.send(Err(StoreError::unavailable(
                "too many writes wait for this scope's fence, held by another transaction",
            )));
            return;
        }
        lane.push_back(Waiting {
            job,
            deadline: Instant::now() + self.lock_timeout,
        });
    }

    /// The next writes of `scope`'s lane, at most `max_rows`; `None` (and the lane closed) if
    /// it has none left.
    fn next(&self, scope: &Scope) -> Option<Vec<Waiting>> {
        let mut waiting = self.waiting();
        let lane = waiting.get_mut(scope)?;
        if lane.is_empty() {
            waiting.remove(scope);
            self.open.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let n = lane.len().min(self.max_rows);
        Some(lane.drain(..n).collect())
    }

    /// Closes `scope`'s lane if it is still open; the writes in it are dropped, so their
    /// callers get 503.
    fn close(&self, scope: &Scope) {
        if self.waiting().remove(scope).is_some() {
            self.open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Closes the lane when its task ends in any way, a panic included: otherwise the scope's
/// writes would join a lane that nobody serves.
struct CloseOnExit<'a> {
    lanes: &'a Lanes,
    scope: &'a Scope,
    /// False once the lane closed itself: the scope may have a new lane by then.
    armed: bool,
}

impl Drop for CloseOnExit<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lanes.close(self.scope);
        }
    }
}

/// A lane's task: applies its scope's writes, a batch at a time, until none is left.
async fn run(shared: Arc<Shared>, scope: Scope) {
    let lanes = &shared.lanes;
    let mut close = CloseOnExit {
        lanes,
        scope: &scope,
        armed: true,
    };
    while let Some(batch) = lanes.next(&scope) {
        let deadline = batch
            .iter()
            .map(|w| w.deadline)
            .min()
            .expect("a batch is never empty");
        let jobs: Vec<Job> = batch.into_iter().map(|w| w.job).collect();
        let turn =
            tokio::time::timeout_at(deadline.into(), lanes.turns.clone().acquire_owned()).await;
        let Ok(Ok(_turn)) = turn else {
            for job in jobs {
                let _ = job.reply.send(Err(held_too_long()));
            }
            continue;
        };
        for round in split_rounds(jobs) {
            settle(&shared, vec![round], Wait::Until(deadline)).await;
        }
    }
    close.armed = false;
}
