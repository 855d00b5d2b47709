//! The connection cap: `server.max_connections` open at once, `server.max_connections_per_client`
//! from one peer address.
//!
//! A cap that only makes new connections wait can be held by anyone: sockets that sent one
//! request and stay idle, or that send their headers a byte at a time, keep every client and
//! the load balancer's probes out until their timeouts (a minute idle, ten seconds a header).
//! So at the cap, a new connection makes room: the open connection that has made no progress
//! the longest *among those not handling a request* is closed. Nothing of its request (if any)
//! was acted on — it was idle, or its headers or body were still arriving — so closing it is
//! as safe as a client hanging up, and the oldest goes first, so an active keep-alive client is
//! the last to lose its connection. Only when every connection is handling a request does the
//! new one wait (in the accept loop, which waits with it: the rest wait in the kernel's backlog).
//!
//! The per-client cap (0: off) closes a peer's connections beyond it at once, without making
//! room: one address cannot take the whole cap, even by reconnecting.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::Notify;

use crate::conn::Handle;

/// How often a new connection at the cap looks again for a connection to close, when none could
/// be (all handling a request) or the one asked took a request instead.
const RETRY: Duration = Duration::from_millis(50);

/// A connection that made progress this recently is never closed to make room. A new
/// connection looks exactly like an attacker's until its request is read; without this, under
/// a flood of reconnecting attackers (each new one closing the oldest), a probe accepted a few
/// milliseconds earlier could become the oldest before its request was read (seen in the
/// slowloris test). With it, each place under the cap is held at least this long.
const GRACE: Duration = Duration::from_millis(100);

/// The open connections, shared by the accept loop and the connections' [`Slot`]s.
pub struct Slots {
    max: usize,
    per_client: usize,
    open: Mutex<Open>,
    /// A connection closed: room for the one waiting.
    freed: Notify,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    connections: HashMap<u64, Handle>,
    per_ip: HashMap<IpAddr, usize>,
}

/// One open connection's place under the cap; dropping it (the connection ended) frees it.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    ip: IpAddr,
}

impl Slots {
    /// `per_client` 0: no per-client cap.
    pub fn new(max: usize, per_client: usize) -> Arc<Self> {
        Arc::new(Slots {
            max,
            per_client,
            open: Mutex::new(Open::default()),
            freed: Notify::new(),
        })
    }

    fn open(&self) -> std::sync::MutexGuard<'_, Open> {
        // Nothing panics while holding it; if something did, the counts are still whole.
        self.open
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `ip` already has its share of connections (its next one is to be closed).
    pub fn over_client_cap(&self, ip: IpAddr) -> bool {
        self.per_client > 0
            && self
                .open()
                .per_ip
                .get(&ip)
                .is_some_and(|&n| n >= self.per_client)
    }

    /// Waits until there is room for one more connection, closing the longest-idle connection
    /// not handling a request if the cap is reached.
    pub async fn make_room(&self) {
        // The connection asked to close, while it has not closed yet (and is still closable):
        // one at a time, so a new connection closes one other, not one per retry.
        let mut asked: Option<u64> = None;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a connection closing in between is not missed.
            freed.as_mut().enable();
            {
                let open = self.open();
                if open.connections.len() < self.max {
                    return;
                }
                let pending = asked
                    .and_then(|id| open.connections.get(&id))
                    .is_some_and(|h| h.idle_since().is_some());
                if !pending {
                    let settled = tokio::time::Instant::now().checked_sub(GRACE);
                    let oldest = open
                        .connections
                        .iter()
                        .filter_map(|(id, handle)| {
                            handle.idle_since().map(|since| (since, *id, handle))
                        })
                        .filter(|(since, _, _)| settled.is_some_and(|settled| *since <= settled))
                        .min_by_key(|(since, id, _)| (*since, *id));
                    asked = oldest.map(|(_, id, handle)| {
                        handle.close_if_idle();
                        id
                    });
                }
            }
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// Takes a place for a connection from `ip` (after [`Slots::make_room`]).
    pub fn take(self: &Arc<Self>, ip: IpAddr, handle: Handle) -> Slot {
        let mut open = self.open();
        let id = open.next_id;
        open.next_id += 1;
        open.connections.insert(id, handle);
        *open.per_ip.entry(ip).or_default() += 1;
        Slot {
            slots: self.clone(),
            id,
            ip,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut open = self.slots.open();
            open.connections.remove(&self.id);
            if let Some(n) = open.per_ip.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    open.per_ip.remove(&self.ip);
                }
            }
        }
        self.slots.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[tokio::test]
    async fn the_per_client_cap_counts_open_connections_of_one_address() {
        let slots = Slots::new(10, 2);
        let a = slots.take(ip(1), Handle::new());
        let _b = slots.take(ip(1), Handle::new());
        assert!(slots.over_client_cap(ip(1)));
        assert!(!slots.over_client_cap(ip(2)));
        drop(a);
        assert!(!slots.over_client_cap(ip(1)));
        assert!(!Slots::new(10, 0).over_client_cap(ip(1)), "0 is no cap");
    }

    #[tokio::test]
    async fn below_the_cap_there_is_room_at_once() {
        let slots = Slots::new(2, 0);
        let _a = slots.take(ip(1), Handle::new());
        tokio::time::timeout(Duration::from_millis(100), slots.make_room())
            .await
            .expect("room");
    }

    /// At the cap, the connection idle the longest is asked to close, and its place comes back
    /// when its connection ends (here: when the test drops its slot, as the connection would).
    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_is_asked_to_close() {
        let slots = Slots::new(2, 0);
        let (older, newer) = (Handle::new(), Handle::new());
        let a = slots.take(ip(1), older.clone());
        let _b = slots.take(ip(1), newer);
        let room = tokio::spawn({
            let slots = slots.clone();
            async move { slots.make_room().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!room.is_finished(), "room before anything closed");
        // `older` was asked: its notification is stored for its connection.
        tokio::time::timeout(Duration::from_millis(100), older.asked_to_close())
            .await
            .expect("the oldest was asked");
        drop(a);
        tokio::time::timeout(Duration::from_millis(500), room)
            .await
            .expect("room once it closed")
            .unwrap();
    }
}
