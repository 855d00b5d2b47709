//! Writes per second, accepted and refused, for the console's chart: lock-free counters of the
//! last [`RATE_SECONDS`](super::RATE_SECONDS).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::RATE_SECONDS;

/// Writes of one second.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Second {
    /// Seconds since the Unix epoch.
    pub second: u64,
    pub accepted: u64,
    pub refused: u64,
}

#[derive(Clone, Copy)]
pub(super) enum Column {
    Accepted,
    Refused,
}

/// Per-second counts of the last [`RATE_SECONDS`], lock-free: each slot packs the second it
/// counts (high 32 bits, Unix seconds) with the count (low 32 bits), so a slot that still
/// holds an older second is reset by the same compare-and-swap that counts.
pub(super) struct Rate {
    slots: Box<[[AtomicU64; 2]]>,
}

impl Rate {
    pub(super) fn new() -> Self {
        Rate {
            slots: (0..RATE_SECONDS)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
        }
    }

    pub(super) fn add(&self, second: u64, column: Column) {
        let slot = &self.slots[second as usize % RATE_SECONDS][column as usize];
        let tag = second << 32;
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |packed| {
            Some(if packed >> 32 == second {
                packed + 1
            } else {
                tag | 1
            })
        });
    }

    pub(super) fn second(&self, second: u64) -> Second {
        let [accepted, refused] = &self.slots[second as usize % RATE_SECONDS];
        let count = |slot: &AtomicU64| {
            let packed = slot.load(Ordering::Relaxed);
            if packed >> 32 == second {
                packed & 0xFFFF_FFFF
            } else {
                0
            }
        };
        Second {
            second,
            accepted: count(accepted),
            refused: count(refused),
        }
    }
}
