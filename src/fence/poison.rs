//! Poisoning guards: tokens a fence refuses although the accept rule alone would admit them.
//!
//! A fence only ever rises, so one wrong token — a timestamp in nanoseconds, a bug that sends
//! `9223372036854775807`, an attacker with write access — would brick a key or scope for good.
//! Two guards refuse such tokens before they can raise a fence; the store evaluates both inside
//! the same statement or transaction as the fence check (`store::sql_issued_check`,
//! `store::sql_jump_check` are their SQL spellings), and these Rust forms explain a refusal:
//!
//! - **Issued** ([`issued`]): a scope that names a built-in lock (one ever granted) admits no
//!   token above the latest the lock service granted for it. Unlike a fence, the lock's counter
//!   is fencegate's own, so a token above it cannot have come from that lock.
//! - **Jump cap** ([`JumpCap`], `kv.max_token_jump`): no write or claim may raise a fence by
//!   more than the cap at once (a fence that does not exist counts as 0). Lock grants step by
//!   one and are exempt.

use super::{Fenced, FencingToken, Scope};

/// `true` if `presented` could have been granted by the built-in lock whose latest grant is
/// `latest` (`None`: the scope is not a built-in lock's, so nothing is known about its tokens).
pub fn issued(presented: FencingToken, latest: Option<FencingToken>) -> bool {
    latest.is_none_or(|latest| presented <= latest)
}

/// The largest step a write or claim may raise a fence by (`kv.max_token_jump`; 0 = no cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JumpCap(pub u64);

impl JumpCap {
    pub fn is_off(self) -> bool {
        self.0 == 0
    }

    /// `true` unless `presented` exceeds the fence (`None`: no fence yet, counted as 0) by
    /// more than the cap. A token below the fence is not a jump (the fence refuses it anyway).
    pub fn admits(self, presented: FencingToken, fence: Option<FencingToken>) -> bool {
        let fence = fence.map_or(0, FencingToken::get) as u64;
        self.is_off() || (presented.get() as u64).saturating_sub(fence) <= self.0
    }
}

/// A token above the latest one the built-in lock `scope` has granted. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotIssued {
    pub scope: Scope,
    pub presented: FencingToken,
    pub latest: FencingToken,
}

/// A token that would raise a fence by more than `kv.max_token_jump`. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    pub fenced: Fenced,
    pub presented: FencingToken,
    /// The fence (0 when there is none).
    pub current: FencingToken,
    pub max_jump: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    #[test]
    fn only_tokens_the_lock_granted_are_issued() {
        assert!(issued(t(7), Some(t(7))));
        assert!(issued(t(1), Some(t(7))));
        assert!(!issued(t(8), Some(t(7))));
        assert!(issued(t(i64::MAX), None), "no built-in lock: nothing to compare with");
    }

    #[test]
    fn the_jump_cap_counts_from_the_fence_or_zero() {
        let cap = JumpCap(100);
        assert!(cap.admits(t(100), None), "exactly the cap from nothing");
        assert!(!cap.admits(t(101), None), "one past it");
        assert!(cap.admits(t(150), Some(t(50))));
        assert!(!cap.admits(t(151), Some(t(50))));
        assert!(cap.admits(t(3), Some(t(50))), "below the fence: stale, not a jump");
        assert!(!cap.admits(t(i64::MAX), Some(t(0))));
        assert!(cap.admits(t(i64::MAX), Some(t(i64::MAX - 100))));
        assert!(JumpCap(0).admits(t(i64::MAX), None), "0 = off");
    }
}
