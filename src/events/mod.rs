//! Fencing as it happens, for the console (`/ui`): lock grants and releases, refused writes,
//! and writes per second, seen by this process.
//!
//! Publishing is meant to cost nothing on the write path when nobody watches:
//! - an accepted or refused write is one atomic update of a per-second bucket ([`Rate`]);
//! - a refusal is kept in a small ring of the latest ([`REFUSALS_KEPT`]) for the overview, and
//!   sent to subscribers only if there are any (refusals are the slow path anyway);
//! - a grant or release is built and sent only when someone subscribed.
//!
//! Subscribers read from one `tokio::sync::broadcast` channel of [`CHANNEL_CAPACITY`] events:
//! memory is bounded whatever the subscribers do. One that falls further behind than that is
//! told so and dropped (its stream ends); it never holds events for itself. At most
//! [`MAX_SUBSCRIBERS`] streams are open at once: a new one evicts the slowest reader (the one
//! that took its last event longest ago, the oldest among equals), so readers that never read
//! cannot lock the console out.
//!
//! Events are per process: with several processes in front of one database, each one's stream
//! shows the writes it served. Locks and fences in the overview come from the database.

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use serde::Serialize;
use tokio::sync::{broadcast, watch};

mod queue;
mod rate;
mod refusal;

use crate::fence::FencingToken;
pub use queue::RefusalQueue;
pub use rate::Second;
use rate::{Column, Rate};
use refusal::log_refusal;
pub use refusal::{Origin, Refusal, Refused};

/// Events buffered for subscribers; one that lags further is dropped.
pub const CHANNEL_CAPACITY: usize = 1024;
/// Open event streams at once (a console tab holds one); a new one evicts the slowest.
pub const MAX_SUBSCRIBERS: usize = 64;
/// Refused writes kept for the overview, newest first.
pub const REFUSALS_KEPT: usize = 50;
/// Seconds of writes/s kept (10 minutes).
pub const RATE_SECONDS: usize = 600;

/// One event, as the stream's `data:` JSON and an overview's `refusals` entry.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Increasing within a process: the SSE `id:`.
    pub id: u64,
    /// Milliseconds since the Unix epoch, this process's clock.
    pub at_ms: u64,
    #[serde(flatten)]
    pub what: What,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum What {
    /// A built-in lock granted (`POST /v1/locks/{name}`).
    Grant(LeaseEvent),
    /// A lease extended.
    Renew(LeaseEvent),
    /// A lock released by its holder.
    Release { name: String, token: FencingToken },
    /// A fenced write refused: `kind` is `stale`, `not_issued`, `jump`, `scope_mismatch` or
    /// `bad_proof`; `op` the write (`put`, `delete`, `batch`, `claim`, `table_put`, ...).
    Refusal(Refusal),
}

impl What {
    /// The event's type: the SSE `event:` field and the data's `type`.
    pub fn name(&self) -> &'static str {
        match self {
            What::Grant(_) => "grant",
            What::Renew(_) => "renew",
            What::Release { .. } => "release",
            What::Refusal(_) => "refusal",
        }
    }
}

/// A lease as granted or renewed.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseEvent {
    pub name: String,
    pub holder: String,
    pub token: FencingToken,
    pub expires_at: String,
    pub ttl_ms: i64,
}

impl LeaseEvent {
    pub fn of(lease: &crate::locks::Lease, ttl_ms: i64) -> Self {
        LeaseEvent {
            name: lease.name.as_str().to_owned(),
            holder: lease.owner.clone(),
            token: lease.token,
            expires_at: lease.expires_at.clone(),
            ttl_ms,
        }
    }
}

/// The bus of one process (one router). Cheap to clone.
#[derive(Clone)]
pub struct Events(Arc<Inner>);

struct Inner {
    sender: broadcast::Sender<Arc<Event>>,
    next_id: AtomicU64,
    /// The open streams, oldest first.
    open: Mutex<Vec<Arc<Slot>>>,
    refusals: Mutex<VecDeque<Arc<Event>>>,
    rate: Rate,
    totals: Totals,
    /// Flips to `true` on shutdown: every stream ends (a stream would otherwise hold its
    /// connection through the whole shutdown grace period).
    closed: watch::Sender<bool>,
    /// Where refusals are kept for operators (the database), once the server wired it.
    sink: Mutex<Option<Arc<RefusalQueue>>>,
    /// Names this process in a refusal's `uid`.
    process: String,
}

/// Refusals waiting to be written to the database; past that, the oldest of the actor with
/// the most waiting is dropped (counted in `fencegate_refusals_unrecorded_total`) rather than
/// slow the refused requests down ([`RefusalQueue`]).
pub const SINK_CAPACITY: usize = 4096;

#[derive(Default)]
struct Totals {
    accepted: AtomicU64,
    stale: AtomicU64,
    not_issued: AtomicU64,
    jump: AtomicU64,
    scope_mismatch: AtomicU64,
    bad_proof: AtomicU64,
}

/// Writes since this process started, by outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Counters {
    pub accepted: u64,
    pub refused: u64,
    pub stale: u64,
    pub not_issued: u64,
    pub jump: u64,
    pub scope_mismatch: u64,
    pub bad_proof: u64,
    /// Event streams open now.
    pub subscribers: usize,
}

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    pub fn new() -> Self {
        let (sender, _) = broadcast::channel(CHANNEL_CAPACITY);
        Events(Arc::new(Inner {
            sender,
            next_id: AtomicU64::new(1),
            open: Mutex::new(Vec::with_capacity(MAX_SUBSCRIBERS)),
            refusals: Mutex::new(VecDeque::with_capacity(REFUSALS_KEPT)),
            rate: Rate::new(),
            totals: Totals::default(),
            closed: watch::channel(false).0,
            sink: Mutex::new(None),
            process: format!("{:08x}", {
                let mut bytes = [0u8; 4];
                let _ = getrandom::getrandom(&mut bytes);
                u32::from_le_bytes(bytes)
            }),
        }))
    }

    /// An accepted fenced write: one atomic update.
    pub fn accepted(&self) {
        self.0.rate.add(now_secs(), Column::Accepted);
        self.0.totals.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals go to `sink` from now on (the database's writer: `Store::record_refusals`).
    pub fn record_to(&self, sink: Arc<RefusalQueue>) {
        *self.0.sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// A refused fenced write: counted, logged (one line at INFO: an operator sees every
    /// refusal with what to look for), kept among the latest, sent to subscribers, and
    /// recorded in the database.
    pub fn refused(&self, refused: Refused, op: &'static str, origin: Origin) {
        self.0.rate.add(now_secs(), Column::Refused);
        let t = &self.0.totals;
        let total = match refused {
            Refused::Stale(_) => &t.stale,
            Refused::NotIssued(_) => &t.not_issued,
            Refused::Jump(_) => &t.jump,
            Refused::Mismatch(_) => &t.scope_mismatch,
            Refused::BadProof { .. } => &t.bad_proof,
        };
        total.fetch_add(1, Ordering::Relaxed);
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        let refusal = refused.into_refusal(op, origin, format!("{}-{id}", self.0.process));
        log_refusal(&refusal);
        let event = Arc::new(Event {
            id,
            at_ms: now_ms(),
            what: What::Refusal(refusal),
        });
        if let Some(sink) = self
            .0
            .sink
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            sink.push(event.clone());
        }
        {
            let mut kept = self.0.refusals.lock().unwrap_or_else(|p| p.into_inner());
            if kept.len() == REFUSALS_KEPT {
                kept.pop_back();
            }
            kept.push_front(event.clone());
        }
        // Err: nobody subscribed.
        let _ = self.0.sender.send(event);
    }

    /// Builds and sends an event only if someone listens (`what` is not even built otherwise).
    pub fn publish(&self, what: impl FnOnce() -> What) {
        if self.0.sender.receiver_count() > 0 {
            let _ = self.0.sender.send(self.event(what()));
        }
    }

    fn event(&self, what: What) -> Arc<Event> {
        Arc::new(Event {
            id: self.0.next_id.fetch_add(1, Ordering::Relaxed),
            at_ms: now_ms(),
            what,
        })
    }

    /// The latest refusals, newest first.
    pub fn recent_refusals(&self) -> Vec<Arc<Event>> {
        self.0
            .refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    pub fn counters(&self) -> Counters {
        let t = &self.0.totals;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (stale, not_issued, jump, scope_mismatch, bad_proof) = (
            get(&t.stale),
            get(&t.not_issued),
            get(&t.jump),
            get(&t.scope_mismatch),
            get(&t.bad_proof),
        );
        Counters {
            accepted: get(&t.accepted),
            refused: stale + not_issued + jump + scope_mismatch + bad_proof,
            stale,
            not_issued,
            jump,
            scope_mismatch,
            bad_proof,
            subscribers: self.0.open.lock().unwrap_or_else(|p| p.into_inner()).len(),
        }
    }

    /// Writes per second over the last `seconds` whole seconds (oldest first), ending with the
    /// second before `now`.
    pub fn rate(&self, seconds: usize) -> Vec<Second> {
        let now = now_secs();
        let seconds = seconds.min(RATE_SECONDS - 1) as u64;
        (now.saturating_sub(seconds)..now)
            .map(|s| self.0.rate.second(s))
            .collect()
    }

    /// The counts of second `second` (Unix seconds); zeros once it is older than the window.
    pub fn second(&self, second: u64) -> Second {
        self.0.rate.second(second)
    }

    /// A new subscriber. When [`MAX_SUBSCRIBERS`] are open already, the slowest reader among
    /// them is evicted to make room: its stream ends (with `dropped`) when next polled, and it
    /// stops counting at once, whether or not its client ever reads again.
    pub fn subscribe(&self) -> Subscription {
        static NEXT_SLOT: AtomicU64 = AtomicU64::new(1);
        let inner = &self.0;
        let slot = Arc::new(Slot {
            id: NEXT_SLOT.fetch_add(1, Ordering::Relaxed),
            last_read: AtomicU64::new(now_secs()),
            evicted: std::sync::atomic::AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        });
        let mut open = inner.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_SUBSCRIBERS {
            let slowest = (0..open.len())
                .min_by_key(|&i| (open[i].last_read.load(Ordering::Relaxed), open[i].id))
                .expect("the list is full");
            let evicted = open.remove(slowest);
            evicted.evicted.store(true, Ordering::Release);
            evicted.wake.notify_one();
        }
        open.push(slot.clone());
        drop(open);
        Subscription {
            receiver: inner.sender.subscribe(),
            closed: inner.closed.subscribe(),
            events: self.clone(),
            slot,
        }
    }

    /// Ends every stream (shutdown): each ends when it is next polled, and its connection,
    /// still handling that response (`conn`), finishes writing it within the shutdown grace.
    pub fn close(&self) {
        let _ = self.0.closed.send(true);
    }
}

/// One subscriber's view of the bus; counted until dropped (the client went away, lagged, or
/// the server shut down) or evicted.
pub struct Subscription {
    receiver: broadcast::Receiver<Arc<Event>>,
    closed: watch::Receiver<bool>,
    events: Events,
    slot: Arc<Slot>,
}

/// An open stream, as the eviction sees it.
struct Slot {
    id: u64,
    /// The second the stream last asked for its next event: a stream whose client does not
    /// read stops asking once its socket is full.
    last_read: AtomicU64,
    evicted: std::sync::atomic::AtomicBool,
    wake: tokio::sync::Notify,
}

/// What a subscriber gets next.
pub enum Next {
    Event(Arc<Event>),
    /// It fell more than [`CHANNEL_CAPACITY`] events behind: `skipped` were lost. The stream
    /// ends after telling the client.
    Lagged {
        skipped: u64,
    },
    /// Shutdown: the stream ends.
    Closed,
    /// More streams were wanted than [`MAX_SUBSCRIBERS`], and this was the slowest reader: the
    /// stream ends after telling the client.
    Evicted,
}

impl Subscription {
    pub async fn next(&mut self) -> Next {
        if *self.closed.borrow() {
            return Next::Closed;
        }
        self.slot.last_read.store(now_secs(), Ordering::Relaxed);
        if self.slot.evicted.load(Ordering::Acquire) {
            return Next::Evicted;
        }
        tokio::select! {
            () = self.slot.wake.notified() => Next::Evicted,
            received = self.receiver.recv() => match received {
                Ok(event) => Next::Event(event),
                Err(broadcast::error::RecvError::Lagged(skipped)) => Next::Lagged { skipped },
                Err(broadcast::error::RecvError::Closed) => Next::Closed,
            },
            _ = self.closed.wait_for(|closed| *closed) => Next::Closed,
        }
    }

    pub fn events(&self) -> &Events {
        &self.events
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut open = self.events.0.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|slot| slot.id != self.slot.id);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::{Fenced, Key, Stale};

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    fn origin() -> Origin {
        Origin {
            route: "/v1/kv/{key}",
            actor: Some("key:w".into()),
            request_id: "r-1".into(),
        }
    }

    fn stale(key: &str) -> Refused {
        Refused::Stale(vec![Stale {
            row: None,
            presented: t(3),
            current: t(4),
            fenced: Fenced::Key(Key::parse(key, 64).unwrap()),
        }])
    }

    #[test]
    fn seconds_are_counted_apart_and_a_slot_is_reused_a_lap_later() {
        let rate = Rate::new();
        rate.add(100, Column::Accepted);
        rate.add(100, Column::Accepted);
        rate.add(100, Column::Refused);
        rate.add(101, Column::Refused);
        assert_eq!(
            rate.second(100),
            Second {
                second: 100,
                accepted: 2,
                refused: 1
            }
        );
        assert_eq!(
            rate.second(101),
            Second {
                second: 101,
                accepted: 0,
                refused: 1
            }
        );
        // Same slot, one lap later: the old count is not carried over, nor read as this second's.
        let later = 100 + RATE_SECONDS as u64;
        assert_eq!(
            rate.second(later),
            Second {
                second: later,
                accepted: 0,
                refused: 0
            }
        );
        rate.add(later, Column::Accepted);
        assert_eq!(
            rate.second(later),
            Second {
                second: later,
                accepted: 1,
                refused: 0
            }
        );
        assert_eq!(rate.second(100).accepted, 0);
    }

    #[test]
    fn the_latest_refusals_are_kept_newest_first_and_bounded() {
        let events = Events::new();
        for i in 0..REFUSALS_KEPT + 7 {
            events.refused(stale(&format!("k{i}")), "put", origin());
        }
        let kept = events.recent_refusals();
        assert_eq!(kept.len(), REFUSALS_KEPT);
        let key = |e: &Event| match &e.what {
            What::Refusal(r) => r.key.clone().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(key(&kept[0]), format!("k{}", REFUSALS_KEPT + 6));
        assert!(kept.windows(2).all(|w| w[0].id > w[1].id));
        let c = events.counters();
        assert_eq!(
            (c.stale, c.refused, c.accepted),
            ((REFUSALS_KEPT + 7) as u64, (REFUSALS_KEPT + 7) as u64, 0)
        );
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_and_holds_nothing() {
        let events = Events::new();
        let mut slow = events.subscribe();
        let mut fast = events.subscribe();
        assert_eq!(events.counters().subscribers, 2);
        for i in 0..CHANNEL_CAPACITY + 10 {
            events.refused(stale(&format!("k{i}")), "put", origin());
            // The fast one keeps up.
            assert!(matches!(fast.next().await, Next::Event(_)));
        }
        match slow.next().await {
            Next::Lagged { skipped } => assert_eq!(skipped, 10),
            _ => panic!("the slow subscriber must be told it lagged"),
        }
        drop(slow);
        assert_eq!(events.counters().subscribers, 1);
        events.close();
        assert!(matches!(fast.next().await, Next::Closed));
    }

    #[tokio::test]
    async fn a_new_subscriber_past_the_cap_evicts_the_slowest_reader() {
        let events = Events::new();
        let mut held: Vec<_> = (0..MAX_SUBSCRIBERS).map(|_| events.subscribe()).collect();
        // The third read last long ago; the others just now.
        held[2]
            .slot
            .last_read
            .store(now_secs() - 30, Ordering::Relaxed);
        let _newest = events.subscribe();
        assert_eq!(
            events.counters().subscribers,
            MAX_SUBSCRIBERS,
            "one in, one out"
        );
        assert!(matches!(held[2].next().await, Next::Evicted));
        // Among equals, the oldest goes: held[0].
        let _another = events.subscribe();
        assert!(matches!(held[0].next().await, Next::Evicted));
        assert_eq!(events.counters().subscribers, MAX_SUBSCRIBERS);
        // Dropping an evicted subscription does not count it out twice.
        drop(held.remove(2));
        drop(held.remove(0));
        assert_eq!(events.counters().subscribers, MAX_SUBSCRIBERS);
        drop(held);
        assert_eq!(events.counters().subscribers, 2);
    }

    #[test]
    fn nothing_is_built_for_nobody() {
        let events = Events::new();
        events.publish(|| panic!("built with no subscriber"));
        let _s = events.subscribe();
        let mut built = false;
        events.publish(|| {
            built = true;
            What::Release {
                name: "n".into(),
                token: t(1),
            }
        });
        assert!(built);
    }
}
