//! Writes the database refused for lack of resources, remembered for readiness.
//!
//! A primary that is up, writable and migrated can still refuse every write: a full disk, no
//! memory, too many connections (the backends sort these into [`DbKind::Lacks`]).
//! No cheap query tells that in advance (free disk space is not visible to a plain role), so
//! readiness learns it from the writes themselves: for [`REMEMBERED`] after such a refusal,
//! `/readyz` says 503 and why; a write the database takes clears it at once.
//!
//! On the write path this costs one relaxed atomic load per write while nothing is remembered.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use super::{errors::DbKind, StoreError};

/// How long a refusal for lack of resources keeps the server not ready (unless a write succeeds).
pub const REMEMBERED: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Pressure {
    /// Set while `last` holds something: the fast path reads only this.
    any: AtomicBool,
    last: Mutex<Option<(Instant, String)>>,
}

impl Pressure {
    /// Learns from the outcome of a write: a refusal for lack of resources is remembered, a
    /// success forgets.
    pub fn observe<T, E: AsStoreError>(&self, result: &Result<T, E>) {
        match result {
            Ok(_) => {
                if self.any.load(Ordering::Relaxed) {
                    self.any.store(false, Ordering::Relaxed);
                    *self.last.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
            }
            Err(err) => {
                if let Some(why) = err.as_store_error().and_then(lack_of_resources) {
                    *self.last.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some((Instant::now(), why));
                    self.any.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// Why the database cannot take writes, if it refused one for lack of resources lately.
    pub fn recent(&self) -> Option<String> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let (at, why) = last.as_ref()?;
        let ago = at.elapsed();
        (ago < REMEMBERED).then(|| {
            format!("the database refused a write for lack of resources {} ms ago ({why}); free space or capacity", ago.as_millis())
        })
    }
}

/// What the database lacked, in fencegate's words (its own message is in the request's log line).
fn lack_of_resources(err: &StoreError) -> Option<String> {
    match err.db_kind()? {
        DbKind::Lacks(lack) => Some(lack.words().to_owned()),
        _ => None,
    }
}

/// The store error inside a store call's error type.
pub(crate) trait AsStoreError {
    fn as_store_error(&self) -> Option<&StoreError>;
}

impl AsStoreError for StoreError {
    fn as_store_error(&self) -> Option<&StoreError> {
        Some(self)
    }
}

impl AsStoreError for super::TableError {
    fn as_store_error(&self) -> Option<&StoreError> {
        match self {
            super::TableError::Store(err) => Some(err),
            super::TableError::Row(_) => None,
        }
    }
}
