//! What the watchdog knows of one connection — its phase, its last progress, a blocked write —
//! and the two views of it that others hold: the connection cap's [`Handle`] (how long idle;
//! close if idle) and the request's [`Watch`] (the body has been read).

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::Timeouts;

pub(super) const IDLE: u8 = 0;
pub(super) const HEADERS: u8 = 1;
pub(super) const BODY: u8 = 2;
pub(super) const HANDLING: u8 = 3;

/// What the watchdog knows of one connection. Times are milliseconds since `epoch`.
pub(super) struct State {
    epoch: Instant,
    pub(super) phase: AtomicU8,
    /// Last byte read or written.
    last_io: AtomicU64,
    /// The first byte of the request whose headers are awaited.
    headers_since: AtomicU64,
    /// When a write first found the socket full (0: not blocked).
    write_blocked_since: AtomicU64,
    /// The connection cap asks the connection to close (see [`Handle::close_if_idle`]).
    pub(super) reap: Notify,
    /// Set before `reap` is notified, and left set until the watchdog has seen the
    /// notification: the watchdog polls `reap` only then (and once, to be woken by it).
    pub(super) reap_asked: AtomicBool,
    /// HTTP/2 (from its first request on): reads and writes are frames, not progress.
    pub(super) multiplexed: AtomicBool,
    /// Requests being handled (HTTP/1: 0 or 1).
    pub(super) active: AtomicU32,
    /// HTTP/2: bytes of responses produced and not yet handed over (`unread`).
    pub(super) unread: AtomicUsize,
    /// HTTP/2: when the client last made room for a held response (a piece of it was handed
    /// over), or when the connection started holding one.
    unread_progress: AtomicU64,
}

impl State {
    fn now(&self) -> u64 {
        // +1 so that 0 can mean "never".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms.saturating_sub(1))
    }

    pub(super) fn read(&self, n: usize) {
        if n == 0 || self.multiplexed.load(Ordering::Relaxed) {
            return;
        }
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self
            .phase
            .compare_exchange(IDLE, HEADERS, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.headers_since.store(now, Ordering::Relaxed);
        }
    }

    pub(super) fn wrote(&self) {
        if !self.multiplexed.load(Ordering::Relaxed) {
            self.last_io.store(self.now(), Ordering::Relaxed);
        }
        self.write_blocked_since.store(0, Ordering::Relaxed);
    }

    /// HTTP/2: a response of `n` bytes was produced (`unread`). A connection that held none
    /// gives its client `server.write_timeout_ms` from now to make room for some of it.
    pub(super) fn charged(&self, n: usize) {
        if self.unread.fetch_add(n, Ordering::AcqRel) == 0 {
            self.unread_progress.store(self.now(), Ordering::Relaxed);
        }
    }

    /// HTTP/2: the client made room for a held response (its flow-control window let a piece
    /// of it be handed over). Frames the server writes on its own (HEADERS, RST_STREAM, PONG)
    /// are no such progress.
    pub(super) fn unread_progressed(&self) {
        self.unread_progress.store(self.now(), Ordering::Relaxed);
    }

    /// A request is answered; the last one: idle from now, and the watchdog has a deadline
    /// again (it had none while requests were handled).
    pub(super) fn handled(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.last_io.store(self.now(), Ordering::Relaxed);
            self.phase.store(IDLE, Ordering::Release);
        }
    }

    /// Handling a request: HTTP/1 once its body is read, HTTP/2 while any stream is open.
    pub(super) fn handling(&self) -> bool {
        if self.multiplexed.load(Ordering::Relaxed) {
            self.active.load(Ordering::Acquire) > 0
        } else {
            self.phase.load(Ordering::Acquire) == HANDLING
        }
    }

    pub(super) fn write_blocked(&self) {
        let _ = self.write_blocked_since.compare_exchange(
            0,
            self.now(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// The next moment the connection may have to close, and why; `None`: nothing due (a
    /// request is being read or handled, and its own timeouts bound it).
    pub(super) fn deadline(&self, t: &Timeouts) -> Option<(Instant, &'static str)> {
        let blocked = self.write_blocked_since.load(Ordering::Relaxed);
        // HTTP/2: responses held and nothing written; a zero flow-control window never blocks
        // a write, so this is how a client that reads nothing shows.
        let held = (self.unread.load(Ordering::Relaxed) > 0)
            .then(|| self.unread_progress.load(Ordering::Relaxed));
        let write = match (blocked, held) {
            (0, None) => None,
            (0, Some(since)) => Some(since),
            (blocked, None) => Some(blocked),
            (blocked, Some(since)) => Some(blocked.min(since)),
        }
        .map(|since| {
            (
                self.at(since) + t.write,
                "the client did not read its response",
            )
        });
        let phase = match self.phase.load(Ordering::Acquire) {
            _ if self.handling() => None,
            IDLE => Some((
                self.at(self.last_io.load(Ordering::Relaxed)) + t.idle,
                "idle",
            )),
            HEADERS => Some((
                self.at(self.headers_since.load(Ordering::Relaxed)) + t.header,
                "headers too slow",
            )),
            _ => None,
        };
        match (write, phase) {
            (Some(w), Some(p)) => Some(if w.0 <= p.0 { w } else { p }),
            (w, p) => w.or(p),
        }
    }
}

/// The connection as the connection cap sees it: how long it has made no progress, and a way
/// to ask it to close. Made before the connection is served ([`Handle::new`], then
/// [`serve`](super::serve)).
#[derive(Clone)]
pub struct Handle(pub(super) Arc<State>);

impl Handle {
    pub fn new() -> Self {
        Handle(Arc::new(State {
            epoch: Instant::now(),
            phase: AtomicU8::new(IDLE),
            last_io: AtomicU64::new(1),
            headers_since: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
            reap: Notify::new(),
            reap_asked: AtomicBool::new(false),
            multiplexed: AtomicBool::new(false),
            active: AtomicU32::new(0),
            unread: AtomicUsize::new(0),
            unread_progress: AtomicU64::new(1),
        }))
    }

    /// Since when the connection has made no progress, if it is not handling a request: idle
    /// since its last byte, or its request's headers arriving since their first byte (headers
    /// trickled a byte at a time are no progress: that is slowloris), or its body arriving
    /// since its last byte (the minimum body rate bounds the rest). Closing such a connection
    /// loses nothing that was acted on. `None`: a request is being handled.
    pub fn idle_since(&self) -> Option<Instant> {
        let state = &self.0;
        if state.handling() {
            return None;
        }
        match state.phase.load(Ordering::Acquire) {
            HEADERS => Some(state.at(state.headers_since.load(Ordering::Relaxed))),
            _ => Some(state.at(state.last_io.load(Ordering::Relaxed))),
        }
    }

    /// Asks the connection to close unless it is handling a request when it gets to it (it
    /// may have started one since [`Handle::idle_since`]). Counted as
    /// `fencegate_connections_closed_total{reason="reaped at the connection cap"}`.
    pub fn close_if_idle(&self) {
        // Set first: the watchdog woken by the notification finds it set.
        self.0.reap_asked.store(true, Ordering::Release);
        self.0.reap.notify_one();
    }
}

#[cfg(test)]
impl Handle {
    /// Resolves once [`Handle::close_if_idle`] was called (for the cap's tests).
    pub(crate) async fn asked_to_close(&self) {
        self.0.reap.notified().await
    }
}

impl Default for Handle {
    fn default() -> Self {
        Handle::new()
    }
}

/// The connection as the request sees it (a request extension): the edge says when the body
/// has been read.
#[derive(Clone)]
pub struct Watch(pub(super) Arc<State>);

impl Watch {
    pub fn body_read(&self) {
        let _ = self
            .0
            .phase
            .compare_exchange(BODY, HANDLING, Ordering::AcqRel, Ordering::Relaxed);
    }
}
