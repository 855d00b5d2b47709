//! A reject-only cache of fences: refuses obviously stale tokens without a database round trip.
//!
//! Safe because a fence never goes down: every value cached here was a fence's value at some
//! moment, so the fence now is at least as high. If [`Rule::accepts`] refuses the token against
//! the cached value, it refuses it against the real fence too. The cache never *accepts*
//! anything: a token that passes the cache still goes to the database, which decides. That is
//! also why several fencegate processes may each keep their own cache.
//!
//! Bounded: a shard that reaches its capacity is cleared (forgetting only costs round trips).
//!
//! A fence's name is hashed once per write (keyed SipHash: names come from requests): the
//! [`Slot`] taken before the database work serves the lookup and the update after it, and that
//! one hash picks both the shard and the place in it. Lookups are by [`FenceRef`], so a write's
//! key is not copied to look it up (only to insert it, the first time its fence is seen).
//!
//! The one exception to "a fence never goes down" is an audited admin reset
//! (`store::admin`), after which every process clears its cache. A value read from the
//! database before the reset but observed after the clear would bring the old fence back, so
//! the cache has an epoch, bumped by every clear: callers take [`HighWater::epoch`] before
//! their database work and pass it to [`HighWater::observe`], which drops observations from an
//! older epoch.

use std::{
    hash::{BuildHasher, RandomState},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
};

use hashbrown::HashTable;

use super::{FenceRef, Fenced, FencingToken, Guard, Key, Rule, Stale, Target};

const SHARDS: usize = 32;

/// One shard: fences and their highest seen token, slotted by the hash that chose the shard.
type Shard = HashTable<(Fenced, FencingToken)>;

pub struct HighWater {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hasher: RandomState,
    epoch: AtomicU64,
}

impl HighWater {
    /// A cache holding at most about `capacity` fences (0 disables it).
    pub fn new(capacity: usize) -> Self {
        HighWater {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
            epoch: AtomicU64::new(0),
        }
    }

    /// Where `fence` is (or would be) in the cache: its hash, computed once. Take it before the
    /// write, pass it to [`HighWater::refuse_at`] and, after the database work, to
    /// [`HighWater::observe_at`] with the same fence.
    pub fn slot(&self, fence: FenceRef<'_>) -> Slot {
        if self.per_shard == 0 {
            return Slot(0);
        }
        Slot(self.hasher.hash_one(fence))
    }

    /// The shard a slot falls in. The shard is taken from bits 32..37 of the hash, which the
    /// table inside does not use to place or tell apart entries (it uses the low bits and the
    /// top seven), so entries of one shard still spread over all of its places.
    fn shard(&self, slot: Slot) -> &Mutex<Shard> {
        &self.shards[((slot.0 >> 32) as usize) % SHARDS]
    }

    /// The fence guarding a write of `key` under `guard`.
    pub fn guarding<'a>(guard: &'a Guard, key: &'a Key) -> FenceRef<'a> {
        match &guard.target {
            Target::Key => FenceRef::Key(key),
            Target::Scope(scope) => FenceRef::Scope(scope),
        }
    }

    /// `Some(refusal)` if the cached fence already refuses the token; `None` means "ask the
    /// database" (never "accepted").
    pub fn refuse(&self, fence: FenceRef<'_>, token: FencingToken, rule: Rule) -> Option<Stale> {
        self.refuse_at(self.slot(fence), fence, token, rule)
    }

    /// [`HighWater::refuse`] at a slot taken for `fence`.
    pub fn refuse_at(
        &self,
        slot: Slot,
        fence: FenceRef<'_>,
        token: FencingToken,
        rule: Rule,
    ) -> Option<Stale> {
        if self.per_shard == 0 {
            return None;
        }
        debug_assert_eq!(self.slot(fence), slot, "a slot taken for another fence");
        let cached = self
            .shard(slot)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .find(slot.0, |(f, _)| f.borrowed() == fence)?
            .1;
        super::stale(rule, token, cached, fence)
    }

    /// Forgets every cached fence: after a reset lowered one (`store::admin`), a cached value
    /// could refuse a token the fence now admits. Forgetting only costs round trips.
    pub fn clear(&self) {
        // Bumped before any shard is cleared: an observation that checks the epoch under a
        // shard's lock either sees the new epoch (and is dropped) or lands before that shard
        // is cleared (and is cleared with it).
        self.epoch.fetch_add(1, Ordering::SeqCst);
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// The current epoch: take it before reading a fence from the database.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Records that `fence` was at least `token` (after an accepted write, a claim, or a
    /// refusal that reported the current value), unless the cache was cleared since `since`
    /// (the epoch taken before the database work). Only ever raises the cached value.
    pub fn observe(&self, since: u64, fence: FenceRef<'_>, token: FencingToken) {
        self.observe_at(since, self.slot(fence), fence, token)
    }

    /// [`HighWater::observe`] at a slot taken for `fence`.
    pub fn observe_at(&self, since: u64, slot: Slot, fence: FenceRef<'_>, token: FencingToken) {
        if self.per_shard == 0 {
            return;
        }
        debug_assert_eq!(self.slot(fence), slot, "a slot taken for another fence");
        let mut shard = self.shard(slot).lock().unwrap_or_else(|p| p.into_inner());
        if self.epoch.load(Ordering::SeqCst) != since {
            return;
        }
        if let Some((_, cached)) = shard.find_mut(slot.0, |(f, _)| f.borrowed() == fence) {
            *cached = (*cached).max(token);
            return;
        }
        if shard.len() >= self.per_shard {
            shard.clear();
        }
        shard.insert_unique(slot.0, (fence.owned(), token), |(f, _)| {
            self.hasher.hash_one(f.borrowed())
        });
    }
}

/// A fence's place in the cache ([`HighWater::slot`]): its keyed hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot(u64);

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    #[test]
    fn refuses_only_what_the_rule_refuses_and_never_lowers() {
        let cache = HighWater::new(1000);
        let k = Fenced::Key(Key::parse("k", 10).unwrap());
        assert!(
            cache.refuse(k.borrowed(), t(1), Rule::Inclusive).is_none(),
            "unknown fence: ask the database"
        );
        cache.observe(0, k.borrowed(), t(10));
        cache.observe(0, k.borrowed(), t(5)); // an older observation must not lower it
        assert!(cache.refuse(k.borrowed(), t(10), Rule::Inclusive).is_none());
        assert!(cache.refuse(k.borrowed(), t(11), Rule::Inclusive).is_none());
        let stale = cache.refuse(k.borrowed(), t(9), Rule::Inclusive).unwrap();
        assert_eq!((stale.presented, stale.current), (t(9), t(10)));
        assert!(cache.refuse(k.borrowed(), t(10), Rule::Strict).is_some());
    }

    #[test]
    fn a_borrowed_fence_at_its_slot_is_the_owned_fence() {
        let cache = HighWater::new(1000);
        let key = Key::parse("k", 10).unwrap();
        let owned = Fenced::Key(key.clone());
        cache.observe(0, owned.borrowed(), t(10));
        let fence = FenceRef::Key(&key);
        let slot = cache.slot(fence);
        assert!(cache
            .refuse_at(slot, fence, t(9), Rule::Inclusive)
            .is_some());
        assert!(cache
            .refuse_at(slot, fence, t(10), Rule::Inclusive)
            .is_none());
        cache.observe_at(0, slot, fence, t(20));
        let stale = cache
            .refuse(owned.borrowed(), t(19), Rule::Inclusive)
            .unwrap();
        assert_eq!(stale.fenced, owned, "the refusal names the fence, owned");
        // A scope of the same name is another fence.
        let scope = super::super::Scope::parse("k", 10).unwrap();
        let other = FenceRef::Scope(&scope);
        assert!(cache
            .refuse_at(cache.slot(other), other, t(1), Rule::Inclusive)
            .is_none());
    }

    #[test]
    fn stays_bounded() {
        let cache = HighWater::new(64);
        for i in 0..10_000 {
            cache.observe(
                0,
                Fenced::Key(Key::parse(&i.to_string(), 10).unwrap()).borrowed(),
                t(i),
            );
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= 64, "{total}");
    }

    #[test]
    fn disabled_cache_refuses_nothing() {
        let cache = HighWater::new(0);
        let k = Fenced::Key(Key::parse("k", 10).unwrap());
        cache.observe(0, k.borrowed(), t(10));
        assert!(cache.refuse(k.borrowed(), t(1), Rule::Inclusive).is_none());
    }

    #[test]
    fn a_value_read_before_a_clear_is_not_cached_after_it() {
        let cache = HighWater::new(1000);
        let k = Fenced::Key(Key::parse("k", 10).unwrap());
        let since = cache.epoch(); // a write starts; the database says the fence is 1000...
        cache.clear(); // ...while a reset lowers it and clears the cache
        cache.observe(since, k.borrowed(), t(1000)); // the write's late observation
        assert!(
            cache
                .refuse(k.borrowed(), t(500), Rule::Inclusive)
                .is_none(),
            "the old fence came back"
        );
        cache.observe(cache.epoch(), k.borrowed(), t(1000));
        assert!(cache
            .refuse(k.borrowed(), t(500), Rule::Inclusive)
            .is_some());
    }
}
