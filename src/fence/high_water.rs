//! A reject-only cache of fences: refuses obviously stale tokens without a database round trip.
//!
//! Safe because a fence never goes down: every value cached here was a fence's value at some
//! moment, so the fence now is at least as high. If [`Rule::accepts`] refuses the token against
//! the cached value, it refuses it against the real fence too. The cache never *accepts*
//! anything: a token that passes the cache still goes to the database, which decides. That is
//! also why several fencegate processes may each keep their own cache.
//!
//! Bounded: a shard that reaches its capacity is cleared (forgetting only costs round trips).

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    sync::Mutex,
};

use super::{Fenced, FencingToken, Guard, Key, Rule, Stale, Target};

const SHARDS: usize = 32;

pub struct HighWater {
    shards: Vec<Mutex<HashMap<Fenced, FencingToken>>>,
    per_shard: usize,
    hasher: RandomState,
}

impl HighWater {
    /// A cache holding at most about `capacity` fences (0 disables it).
    pub fn new(capacity: usize) -> Self {
        HighWater {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, fence: &Fenced) -> &Mutex<HashMap<Fenced, FencingToken>> {
        &self.shards[(self.hasher.hash_one(fence) as usize) % SHARDS]
    }

    /// The fence guarding a write of `key` under `guard`.
    pub fn fence_of(guard: &Guard, key: &Key) -> Fenced {
        match &guard.target {
            Target::Key => Fenced::Key(key.clone()),
            Target::Scope(scope) => Fenced::Scope(scope.clone()),
        }
    }

    /// `Some(refusal)` if the cached fence already refuses the token; `None` means "ask the
    /// database" (never "accepted").
    pub fn refuse(&self, fence: &Fenced, token: FencingToken, rule: Rule) -> Option<Stale> {
        if self.per_shard == 0 {
            return None;
        }
        let cached = *self.shard(fence).lock().unwrap_or_else(|p| p.into_inner()).get(fence)?;
        (!rule.accepts(token, cached)).then(|| Stale { presented: token, current: cached, fenced: fence.clone() })
    }

    /// Forgets every cached fence: after a reset lowered one (`store::admin`), a cached value
    /// could refuse a token the fence now admits. Forgetting only costs round trips.
    pub fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|p| p.into_inner()).clear();
        }
    }

    /// Records that `fence` was at least `token` (after an accepted write, a claim, or a
    /// refusal that reported the current value). Only ever raises the cached value.
    pub fn observe(&self, fence: &Fenced, token: FencingToken) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(fence).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cached) = shard.get_mut(fence) {
            *cached = (*cached).max(token);
            return;
        }
        if shard.len() >= self.per_shard {
            shard.clear();
        }
        shard.insert(fence.clone(), token);
    }
}

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
        assert!(cache.refuse(&k, t(1), Rule::Inclusive).is_none(), "unknown fence: ask the database");
        cache.observe(&k, t(10));
        cache.observe(&k, t(5)); // an older observation must not lower it
        assert!(cache.refuse(&k, t(10), Rule::Inclusive).is_none());
        assert!(cache.refuse(&k, t(11), Rule::Inclusive).is_none());
        let stale = cache.refuse(&k, t(9), Rule::Inclusive).unwrap();
        assert_eq!((stale.presented, stale.current), (t(9), t(10)));
        assert!(cache.refuse(&k, t(10), Rule::Strict).is_some());
    }

    #[test]
    fn stays_bounded() {
        let cache = HighWater::new(64);
        for i in 0..10_000 {
            cache.observe(&Fenced::Key(Key::parse(&i.to_string(), 10).unwrap()), t(i));
        }
        let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert!(total <= 64, "{total}");
    }

    #[test]
    fn disabled_cache_refuses_nothing() {
        let cache = HighWater::new(0);
        let k = Fenced::Key(Key::parse("k", 10).unwrap());
        cache.observe(&k, t(10));
        assert!(cache.refuse(&k, t(1), Rule::Inclusive).is_none());
    }
}
