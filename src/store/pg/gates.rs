//! One statement per scope at a time waits on a fence row from this process.
//!
//! Claims, lock grants and scoped batches lock their scope's fence row in the database, each on
//! a connection of the pool. A fence row held by another transaction (a SQL writer's after
//! `fencegate.fence()`) makes each of them wait up to `database.lock_timeout_ms` on its
//! connection, and enough of them under one held scope would take every connection, and stop
//! every other write. So they pass a gate per scope first: one of them at a time takes a
//! connection and waits in the database; the others wait here, holding nothing, at most
//! `database.lock_timeout_ms` (then 503). One scope's statements wait on its row one after the
//! other anyway, so the gate costs them no concurrency. (Coalesced kv writes have lanes of their
//! own: `coalesce/lanes.rs`.)

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::{fence::Scope, store::StoreError};

pub(super) struct ScopeGates {
    gates: Mutex<HashMap<Scope, Arc<AsyncMutex<()>>>>,
    wait: Duration,
}

/// The gate of one scope, passed (or given up on): released when dropped, and forgotten when
/// nobody else waits for it.
pub(super) struct Passed<'a> {
    gates: &'a ScopeGates,
    scope: Scope,
    gate: Arc<AsyncMutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl ScopeGates {
    /// `wait`: `database.lock_timeout_ms`.
    pub(super) fn new(wait: Duration) -> Self {
        ScopeGates {
            gates: Mutex::default(),
            wait,
        }
    }

    fn gates(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, Arc<AsyncMutex<()>>>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for `scope`'s gate, at most `database.lock_timeout_ms`.
    pub(super) async fn pass(&self, scope: &Scope) -> Result<Passed<'_>, StoreError> {
        let gate = self.gates().entry(scope.clone()).or_default().clone();
        let mut passed = Passed {
            gates: self,
            scope: scope.clone(),
            gate: gate.clone(),
            guard: None,
        };
        match tokio::time::timeout(self.wait, gate.lock_owned()).await {
            Ok(guard) => {
                passed.guard = Some(guard);
                Ok(passed)
            }
            Err(_) => Err(StoreError::unavailable(
                "the scope's fence is held by another transaction (e.g. a SQL writer's after fencegate.fence()); \
                 database.lock_timeout_ms passed",
            )),
        }
    }
}

impl Drop for Passed<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut gates = self.gates.gates();
        // Nobody else waits for it or holds it (only the map's reference and this one).
        if Arc::strong_count(&self.gate) == 2 {
            gates.remove(&self.scope);
        }
    }
}
