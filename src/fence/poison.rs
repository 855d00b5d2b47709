//! Poisoning guards: tokens a fence refuses although the accept rule alone would admit them.
//!
//! A fence only ever rises, so one wrong token — a timestamp in nanoseconds, a bug that sends
//! `9223372036854775807`, an attacker with write access — would brick a key or scope for good.
//! Two guards refuse such tokens before they can raise a fence; the store evaluates both inside
//! the same statement or transaction as the fence check (`store::sql::sql_issued_check`,
//! `store::sql::sql_jump_check` are their SQL spellings), and these Rust forms explain a refusal:
//!
//! - **Issued** ([`issued`]): a scope that names a built-in lock (one ever granted, and not
//!   retired by an admin) admits no token above the latest the lock service granted for it.
//!   Unlike a fence, the lock's counter is fencegate's own, so a token above it cannot have come
//!   from that lock. A scope under `[locks] names` ([`Reserved`]) is a built-in lock's from the
//!   start: before its first grant its latest issued token is 0, so it admits no token at all
//!   (nobody can exhaust a lock before it exists).
//! - **Jump cap** ([`JumpCap`], `kv.max_token_jump`): no write or claim may raise a fence by
//!   more than the cap at once (a fence that does not exist counts as 0). Lock grants step by
//!   one and are exempt.

use super::{Fenced, FencingToken, Scope};

/// `true` if `presented` could have been granted by the built-in lock whose latest grant is
/// `latest` (`None`: the scope is not a built-in lock's, so nothing is known about its tokens).
/// Grants start at 1, so a lock admits `1..=latest`; a reserved scope never granted has
/// `latest` 0 and admits nothing.
pub fn issued(presented: FencingToken, latest: Option<FencingToken>) -> bool {
    latest.is_none_or(|latest| presented.get() >= 1 && presented <= latest)
}

/// `[locks] names`: scope prefixes reserved for the built-in lock service. Under them, only a
/// token the lock service granted may raise a fence, from before the first grant on.
///
/// The prefixes are spelled into SQL as literals (a statement is built once, with no room for a
/// parameter per prefix), so [`Reserved::new`] refuses quotes, backslashes and control
/// characters: what is left cannot end a SQL string literal on either backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved(std::sync::Arc<[String]>);

impl Reserved {
    pub fn new(prefixes: &[String]) -> Result<Reserved, String> {
        for prefix in prefixes {
            if prefix
                .chars()
                .any(|c| c == '\'' || c == '\\' || c.is_control())
            {
                return Err(format!(
                    "the prefix {prefix:?} holds a quote, a backslash or a control character; lock names under [locks] names cannot"
                ));
            }
        }
        Ok(Reserved(prefixes.iter().cloned().collect()))
    }

    /// The prefixes, as configured.
    pub fn prefixes(&self) -> &[String] {
        &self.0
    }

    pub fn covers(&self, scope: &str) -> bool {
        self.0.iter().any(|p| scope.starts_with(p.as_str()))
    }

    /// What the scope's latest issued token is when no grant says otherwise: 0 (nothing
    /// issued) for a reserved scope, `None` (unknown: any lock service's) for the others.
    pub fn latest_without_grant(&self, scope: &str) -> Option<FencingToken> {
        self.covers(scope).then_some(FencingToken::ZERO)
    }
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
        assert!(
            issued(t(i64::MAX), None),
            "no built-in lock: nothing to compare with"
        );
        assert!(
            !issued(t(0), Some(t(7))),
            "grants start at 1: 0 was never issued"
        );
        assert!(
            !issued(t(0), Some(t(0))),
            "a reserved scope never granted admits nothing"
        );
        assert!(!issued(t(1), Some(t(0))));
    }

    #[test]
    fn reserved_prefixes_cover_their_scopes_and_refuse_what_would_end_a_literal() {
        let reserved = Reserved::new(&["jobs/".into(), "nightly".into()]).unwrap();
        assert!(reserved.covers("jobs/a") && reserved.covers("nightly-2"));
        assert!(!reserved.covers("job") && !reserved.covers("other"));
        assert_eq!(
            reserved.latest_without_grant("jobs/a"),
            Some(FencingToken::ZERO)
        );
        assert_eq!(reserved.latest_without_grant("other"), None);
        assert!(Reserved::new(&["".into()]).unwrap().covers("anything"));
        for bad in ["it's", "a\\b", "x\n"] {
            assert!(Reserved::new(&[bad.into()]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_jump_cap_counts_from_the_fence_or_zero() {
        let cap = JumpCap(100);
        assert!(cap.admits(t(100), None), "exactly the cap from nothing");
        assert!(!cap.admits(t(101), None), "one past it");
        assert!(cap.admits(t(150), Some(t(50))));
        assert!(!cap.admits(t(151), Some(t(50))));
        assert!(
            cap.admits(t(3), Some(t(50))),
            "below the fence: stale, not a jump"
        );
        assert!(!cap.admits(t(i64::MAX), Some(t(0))));
        assert!(cap.admits(t(i64::MAX), Some(t(i64::MAX - 100))));
        assert!(JumpCap(0).admits(t(i64::MAX), None), "0 = off");
    }
}
