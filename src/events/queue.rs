//! The refusals waiting to be written to the database, fair per actor.
//!
//! One actor's flood of refused writes must not crowd out another actor's record. So the queue
//! keeps a line per actor (`None`, auth off, is one actor): when it is full, the oldest
//! refusal of the actor with the most waiting is dropped (counted in
//! `fencegate_refusals_unrecorded_total`), never one of an actor with fewer; and the writer
//! takes refusals from the actors in turn, one each, so a long line does not delay a short one.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;

use super::{Event, What};

pub struct RefusalQueue {
    lines: Mutex<Lines>,
    ready: Notify,
    capacity: usize,
}

#[derive(Default)]
struct Lines {
    /// Each actor's refusals, oldest first; no line is empty.
    by_actor: HashMap<Option<String>, VecDeque<Arc<Event>>>,
    /// The actors with a line, in the order the writer serves them.
    turn: VecDeque<Option<String>>,
    len: usize,
}

fn actor(event: &Event) -> Option<String> {
    match &event.what {
        What::Refusal(r) => r.actor.clone(),
        _ => None,
    }
}

impl RefusalQueue {
    /// Holds at most `capacity` refusals in all.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(RefusalQueue {
            lines: Mutex::default(),
            ready: Notify::new(),
            capacity: capacity.max(1),
        })
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Lines> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a refusal; when the queue is full, drops the oldest refusal of the actor with
    /// the most waiting (which may be this one's own).
    pub fn push(&self, event: Arc<Event>) {
        let who = actor(&event);
        {
            let mut lines = self.lines();
            if lines.len >= self.capacity {
                let longest = lines
                    .by_actor
                    .iter()
                    .max_by_key(|(_, line)| line.len())
                    .map(|(actor, _)| actor.clone());
                if let Some(longest) = longest {
                    let line = lines.by_actor.get_mut(&longest).expect("a line");
                    line.pop_front();
                    if line.is_empty() {
                        lines.by_actor.remove(&longest);
                        lines.turn.retain(|a| *a != longest);
                    }
                    lines.len -= 1;
                    metrics::counter!("fencegate_refusals_unrecorded_total").increment(1);
                }
            }
            let lines = &mut *lines;
            let line = lines.by_actor.entry(who.clone()).or_insert_with(|| {
                lines.turn.push_back(who);
                VecDeque::new()
            });
            line.push_back(event);
            lines.len += 1;
        }
        self.ready.notify_one();
    }

    /// Takes up to `max` refusals, one from each actor in turn, waiting until there is one.
    pub async fn take(&self, max: usize) -> Vec<Arc<Event>> {
        loop {
            let ready = self.ready.notified();
            let taken = self.take_now(max);
            if !taken.is_empty() {
                return taken;
            }
            ready.await;
        }
    }

    fn take_now(&self, max: usize) -> Vec<Arc<Event>> {
        let mut lines = self.lines();
        let mut taken = Vec::with_capacity(max.min(lines.len));
        while taken.len() < max {
            let Some(who) = lines.turn.pop_front() else {
                break;
            };
            let line = lines
                .by_actor
                .get_mut(&who)
                .expect("every actor in turn has a line");
            taken.push(line.pop_front().expect("no line is empty"));
            if line.is_empty() {
                lines.by_actor.remove(&who);
            } else {
                lines.turn.push_back(who);
            }
        }
        lines.len -= taken.len();
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Origin, Refused};
    use crate::fence::{Fenced, FencingToken, Key, Stale};

    fn refusal(actor: &str, key: &str) -> Arc<Event> {
        let refused = Refused::Stale(vec![Stale {
            row: None,
            fenced: Fenced::Key(Key::parse(key, 64).unwrap()),
            presented: FencingToken::from_db(1).unwrap(),
            current: FencingToken::from_db(2).unwrap(),
        }]);
        let origin = Origin {
            route: "/v1/kv/{key}",
            actor: Some(actor.to_owned()),
            request_id: "r".into(),
        };
        Arc::new(Event {
            id: 0,
            at_ms: 0,
            what: What::Refusal(refused.into_refusal("put", origin, "u".into())),
        })
    }

    fn key(event: &Event) -> String {
        match &event.what {
            What::Refusal(r) => r.key.clone().unwrap(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_flood_drops_its_own_oldest_and_never_another_actors() {
        let queue = RefusalQueue::new(8);
        queue.push(refusal("key:victim", "v1"));
        for i in 0..20 {
            queue.push(refusal("key:flood", &format!("f{i}")));
        }
        queue.push(refusal("key:victim", "v2"));
        for i in 20..40 {
            queue.push(refusal("key:flood", &format!("f{i}")));
        }
        // Taken in turns: the victim's come out among the first, none was dropped; the
        // flood keeps its newest.
        let taken: Vec<String> = queue.take_now(100).iter().map(|e| key(e)).collect();
        assert_eq!(taken.len(), 8, "{taken:?}");
        assert_eq!(&taken[..4], ["v1", "f34", "v2", "f35"], "{taken:?}");
        assert_eq!(&taken[4..], ["f36", "f37", "f38", "f39"], "{taken:?}");
        assert!(queue.take_now(100).is_empty());
    }
}
