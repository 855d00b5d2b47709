//! THE verdict on a fenced write: accepted, or refused for one reason, in one precedence.
//!
//! The database decides a write atomically (the store's SQL is built from the same rules:
//! `store::sql`), but it only says "no row". Why a write was refused is decided here, from what
//! the database held, by [`verdict`]; every write path (kv, batch, legacy tables, claims) and
//! the reject-only cache ([`HighWater`](super::HighWater), which answers [`stale`]) explain
//! through it, so a refused write gets the same answer whichever path it took.
//!
//! The precedence, also in docs/wire.md:
//! 1. **stale** (412): a fence the write had to pass refuses the token. First, because a zombie
//!    must hear "you lost the lock" whatever else is wrong with its write, and because the
//!    reject-only cache answers exactly this without asking the database: the answer does not
//!    depend on what the cache holds.
//! 2. **not issued** (422): a scoped write's token is above what the built-in lock of that name
//!    granted ([`issued`](super::issued)).
//! 3. **jump** (422): the token would raise a fence by more than `kv.max_token_jump`.
//! 4. **scope mismatch** (409): a configured binding names another scope than the one the write
//!    came under; else the key or row remembers another scope (sticky scope).
//!
//! A binding is decided from configuration alone ([`binding`]), before anything is read; a
//! mismatch found there is reported only after steps 1-3 have been checked against the fence
//! of the scope the write was *presented* under (the header's, or for a batch without one its
//! first bound op's: the lock whose token the client holds; tokens of different scopes are
//! never compared).

use super::{
    issued, FenceRef, Fenced, FencingToken, Guard, Jump, JumpCap, NotIssued, Outcome, Reserved,
    Rule, Scope, ScopeMismatch, ScopeRule, Stale,
};

/// The checks every fenced write makes besides the accept rule, fixed by configuration when
/// the store is opened (`kv.sticky_scope`, `kv.max_token_jump`, `[locks] names`).
#[derive(Debug, Clone, Default)]
pub struct Checks {
    pub scopes: ScopeRule,
    pub jump: JumpCap,
    pub reserved: Reserved,
}

/// One key or row a write changes, as the database held it.
#[derive(Debug, Clone)]
pub struct Held<'a> {
    pub fenced: Fenced,
    /// Its own fence (`None`: never written). Checked only by an unscoped write.
    pub fence: Option<FencingToken>,
    /// The scope of its last accepted write: `None` if never written, `Some(None)` unscoped.
    pub remembered: Option<Option<&'a str>>,
}

/// The scope side of a scoped write, as the database held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeHeld {
    /// The scope's fence (`None`: never raised) and the latest token the built-in lock of that
    /// name granted (`None`: no such lock).
    Read {
        fence: Option<FencingToken>,
        latest_issued: Option<FencingToken>,
    },
    /// The scope's fence already admitted this token earlier in the same transaction (a
    /// table write claims its scope first): steps 1-3 passed for it.
    Admitted,
}

/// What a refused (or to-be-explained) write ran into.
#[derive(Debug, Clone)]
pub struct Seen<'a> {
    pub held: Vec<Held<'a>>,
    /// For a scoped write (ignored for an unscoped one).
    pub scope: ScopeHeld,
    /// A configured binding the write contradicts ([`binding`]), found before the database.
    pub binding: Option<ScopeMismatch>,
}

/// A refused write, explained: what the client is told. Nothing was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Stale(Vec<Stale>),
    NotIssued(NotIssued),
    Jump(Jump),
    Mismatch(ScopeMismatch),
}

impl Refusal {
    /// Its place in the precedence (lower wins).
    fn rank(&self) -> u8 {
        match self {
            Refusal::Stale(_) => 0,
            Refusal::NotIssued(_) => 1,
            Refusal::Jump(_) => 2,
            Refusal::Mismatch(_) => 3,
        }
    }

    /// Of two refusals of one request (parts decided separately, e.g. a batch's kv keys and its
    /// table rows), the one to report: the first in the precedence; `a` on a tie.
    pub fn first(a: Option<Refusal>, b: Refusal) -> Option<Refusal> {
        Some(match a {
            Some(a) if a.rank() <= b.rank() => a,
            _ => b,
        })
    }

    pub fn outcome<T>(self) -> Outcome<T> {
        match self {
            Refusal::Stale(stale) => Outcome::Stale(stale),
            Refusal::NotIssued(refused) => Outcome::NotIssued(refused),
            Refusal::Jump(refused) => Outcome::Jump(refused),
            Refusal::Mismatch(mismatch) => Outcome::Mismatch(mismatch),
        }
    }
}

/// Step 1 for one fence: `Some` if `fence` (its value `current`) refuses `token` under `rule`.
/// The reject-only cache answers with exactly this.
pub fn stale(
    rule: Rule,
    token: FencingToken,
    current: FencingToken,
    fenced: FenceRef<'_>,
) -> Option<Stale> {
    (!rule.accepts(token, current)).then(|| Stale {
        row: None,
        presented: token,
        current,
        fenced: fenced.owned(),
    })
}

/// The binding step, decided from configuration before anything is read: the scope of a write
/// to something bound to `bound` (a key's `[[scopes]]` binding, or a table's `scope`) when the
/// client presented `presented`. A different presented scope is a mismatch, which [`verdict`]
/// reports after the fence and the guards of the presented scope.
pub fn binding(
    bound: Option<&Scope>,
    presented: Option<Scope>,
    fenced: impl FnOnce() -> Fenced,
) -> Result<Option<Scope>, ScopeMismatch> {
    match (bound, presented) {
        (None, presented) => Ok(presented),
        (Some(bound), None) => Ok(Some(bound.clone())),
        (Some(bound), Some(presented)) if &presented == bound => Ok(Some(presented)),
        (Some(bound), Some(presented)) => Err(ScopeMismatch {
            fenced: fenced(),
            scope: Some(bound.as_str().to_owned()),
            presented: Some(presented),
        }),
    }
}

/// THE verdict: `Ok` if nothing in `seen` refuses the write under `guard`, else the refusal to
/// report, first in the precedence (module docs). Pure: the store reads `seen` (after the
/// database refused, under the locks the refused statement took where it took any) and asks.
pub fn verdict(seen: &Seen, guard: &Guard, checks: &Checks) -> Result<(), Refusal> {
    let token = guard.token;
    // The fences this write had to pass: its scope's (unless already passed), or each thing's own.
    let fences: Vec<(Fenced, Option<FencingToken>)> = match (guard.scope(), seen.scope) {
        (Some(_), ScopeHeld::Admitted) => vec![],
        (Some(scope), ScopeHeld::Read { fence, .. }) => vec![(Fenced::Scope(scope.clone()), fence)],
        (None, _) => seen
            .held
            .iter()
            .map(|held| (held.fenced.clone(), held.fence))
            .collect(),
    };
    // 1. Stale: every fence that refuses, so a batch names all of its stale keys.
    let refused: Vec<Stale> = fences
        .iter()
        .filter_map(|(fenced, fence)| {
            fence.and_then(|current| stale(guard.rule, token, current, fenced.borrowed()))
        })
        .collect();
    if !refused.is_empty() {
        return Err(Refusal::Stale(refused));
    }
    // 2. Not issued. A scope reserved for the built-in locks with no grant yet has issued
    //    nothing (latest 0).
    if let (Some(scope), ScopeHeld::Read { latest_issued, .. }) = (guard.scope(), seen.scope) {
        if let Some(latest) =
            latest_issued.or_else(|| checks.reserved.latest_without_grant(scope.as_str()))
        {
            if !issued(token, Some(latest)) {
                return Err(Refusal::NotIssued(NotIssued {
                    scope: scope.clone(),
                    presented: token,
                    latest,
                }));
            }
        }
    }
    // 3. Jump.
    if let Some((fenced, fence)) = fences
        .iter()
        .find(|(_, fence)| !checks.jump.admits(token, *fence))
    {
        return Err(Refusal::Jump(Jump {
            fenced: fenced.clone(),
            presented: token,
            current: fence.unwrap_or(FencingToken::ZERO),
            max_jump: checks.jump.0,
        }));
    }
    // 4. Scope: the binding (configuration), then what each key or row remembers.
    if let Some(mismatch) = &seen.binding {
        return Err(Refusal::Mismatch(mismatch.clone()));
    }
    let presented = guard.scope().map(Scope::as_str);
    for held in &seen.held {
        if !checks.scopes.admits(held.remembered, presented) {
            return Err(Refusal::Mismatch(ScopeMismatch {
                fenced: held.fenced.clone(),
                scope: held.remembered.flatten().map(str::to_owned),
                presented: guard.scope().cloned(),
            }));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::{Key, Target};

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    fn scope(s: &str) -> Scope {
        Scope::parse(s, 64).unwrap()
    }

    fn key() -> Fenced {
        Fenced::Key(Key::parse("k", 64).unwrap())
    }

    /// What a row of the table expects.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Expect {
        Ok,
        Stale,
        NotIssued,
        Jump,
        Binding,
        Sticky,
    }

    fn kind(result: &Result<(), Refusal>) -> Expect {
        match result {
            Ok(()) => Expect::Ok,
            Err(Refusal::Stale(_)) => Expect::Stale,
            Err(Refusal::NotIssued(_)) => Expect::NotIssued,
            Err(Refusal::Jump(_)) => Expect::Jump,
            Err(Refusal::Mismatch(m)) if m.scope.as_deref() == Some("bound") => Expect::Binding,
            Err(Refusal::Mismatch(_)) => Expect::Sticky,
        }
    }

    /// Every combination of: rule (inclusive, strict) x scoped or not x sticky scope (on/off,
    /// remembered scope right or wrong) x binding (none, agrees, contradicts) x issued (no lock,
    /// issued, not issued, reserved and never granted) x jump (off, within, past) x the token
    /// against the fence (below, equal, above). The expected answer is computed by the
    /// precedence written out independently below, and a few rows are spelled out by hand.
    #[test]
    fn every_combination_gets_the_first_refusal_in_the_precedence() {
        let mut checked = 0;
        for rule in [Rule::Inclusive, Rule::Strict] {
            for scoped in [false, true] {
                for sticky in [ScopeRule::Sticky, ScopeRule::Free] {
                    for remembered_right in [None, Some(true), Some(false)] {
                        for bound in [None, Some(true), Some(false)] {
                            for lock in ["none", "issued", "not-issued", "reserved"] {
                                for cap in [0u64, 10] {
                                    for (fence, token) in [(5, 4), (5, 5), (5, 6), (5, 40)] {
                                        checked += 1;
                                        let presented = scoped.then(|| scope("s"));
                                        // The binding step: `bound` Some(true) binds to the presented scope.
                                        let binding_result = match bound {
                                            None => Ok(presented.clone()),
                                            Some(true) => binding(
                                                presented.as_ref().or(Some(&scope("s"))),
                                                presented.clone(),
                                                key,
                                            ),
                                            Some(false) => binding(
                                                Some(&scope("bound")),
                                                presented.clone(),
                                                key,
                                            ),
                                        };
                                        // With no header, a binding supplies the scope.
                                        let (effective, mismatch) = match binding_result {
                                            Ok(effective) => (effective, None),
                                            Err(m) => (presented.clone(), Some(m)),
                                        };
                                        let guard = Guard {
                                            token: t(token),
                                            target: effective
                                                .clone()
                                                .map_or(Target::Key, Target::Scope),
                                            rule,
                                        };
                                        let latest_issued = match lock {
                                            "issued" => Some(t(100)),
                                            "not-issued" => Some(t(3)),
                                            _ => None,
                                        };
                                        let reserved = if lock == "reserved" {
                                            Reserved::new(&["s".into()]).unwrap()
                                        } else {
                                            Reserved::default()
                                        };
                                        let remembered = remembered_right.map(|right| {
                                            if right {
                                                effective.as_ref().map(Scope::as_str)
                                            } else {
                                                Some("elsewhere")
                                            }
                                        });
                                        let seen = Seen {
                                            held: vec![Held {
                                                fenced: key(),
                                                fence: Some(t(fence)),
                                                remembered,
                                            }],
                                            scope: ScopeHeld::Read {
                                                fence: Some(t(fence)),
                                                latest_issued,
                                            },
                                            binding: mismatch.clone(),
                                        };
                                        let checks = Checks {
                                            scopes: sticky,
                                            jump: JumpCap(cap),
                                            reserved,
                                        };
                                        let got = verdict(&seen, &guard, &checks);

                                        // The precedence, written out on its own.
                                        let is_scoped = effective.is_some();
                                        let expect = if !rule.accepts(t(token), t(fence)) {
                                            Expect::Stale
                                        } else if is_scoped
                                            && (lock == "not-issued"
                                                || lock == "reserved"
                                                    && effective
                                                        .as_ref()
                                                        .is_some_and(|s| s.as_str() == "s"))
                                        {
                                            Expect::NotIssued
                                        } else if cap != 0 && (token - fence) as u64 > cap {
                                            Expect::Jump
                                        } else if mismatch.is_some() {
                                            Expect::Binding
                                        } else if sticky == ScopeRule::Sticky
                                            && remembered_right == Some(false)
                                        {
                                            Expect::Sticky
                                        } else {
                                            Expect::Ok
                                        };
                                        assert_eq!(
                                            kind(&got),
                                            expect,
                                            "rule {rule:?} scoped {scoped} sticky {sticky:?} remembered right {remembered_right:?} \
                                             bound {bound:?} lock {lock} cap {cap} fence {fence} token {token}: {got:?}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 2 * 2 * 3 * 3 * 4 * 2 * 4);
    }

    #[test]
    fn by_hand_a_stale_token_under_a_wrong_scope_is_stale_and_names_the_fence() {
        let guard = Guard {
            token: t(3),
            target: Target::Scope(scope("s")),
            rule: Rule::Inclusive,
        };
        let mismatch = binding(Some(&scope("bound")), Some(scope("s")), key).unwrap_err();
        let seen = Seen {
            held: vec![],
            scope: ScopeHeld::Read {
                fence: Some(t(7)),
                latest_issued: None,
            },
            binding: Some(mismatch.clone()),
        };
        let refusal = verdict(&seen, &guard, &Checks::default()).unwrap_err();
        assert_eq!(
            refusal,
            Refusal::Stale(vec![Stale {
                row: None,
                presented: t(3),
                current: t(7),
                fenced: Fenced::Scope(scope("s"))
            }])
        );
        // The same token, once the fence admits it: the binding.
        let seen = Seen {
            scope: ScopeHeld::Read {
                fence: Some(t(2)),
                latest_issued: None,
            },
            ..seen
        };
        assert_eq!(
            verdict(&seen, &guard, &Checks::default()).unwrap_err(),
            Refusal::Mismatch(mismatch)
        );
    }

    #[test]
    fn by_hand_an_unscoped_batch_names_every_stale_key_and_a_scope_already_claimed_checks_only_scopes(
    ) {
        let k = |name: &str| Fenced::Key(Key::parse(name, 64).unwrap());
        let held = |name: &str, fence: i64| Held {
            fenced: k(name),
            fence: Some(t(fence)),
            remembered: Some(None),
        };
        let guard = Guard {
            token: t(5),
            target: Target::Key,
            rule: Rule::Inclusive,
        };
        let seen = Seen {
            held: vec![held("a", 9), held("b", 1), held("c", 6)],
            scope: ScopeHeld::Admitted,
            binding: None,
        };
        let Err(Refusal::Stale(stale)) = verdict(&seen, &guard, &Checks::default()) else {
            panic!()
        };
        assert_eq!(
            stale.iter().map(|s| s.fenced.clone()).collect::<Vec<_>>(),
            vec![k("a"), k("c")]
        );
        // Scoped, the scope's fence already passed in this transaction: only what rows remember.
        let guard = Guard {
            token: t(5),
            target: Target::Scope(scope("s")),
            rule: Rule::Strict,
        };
        let seen = Seen {
            held: vec![held("a", 9)],
            scope: ScopeHeld::Admitted,
            binding: None,
        };
        let Err(Refusal::Mismatch(m)) = verdict(&seen, &guard, &Checks::default()) else {
            panic!()
        };
        assert_eq!((m.scope, m.presented), (None, Some(scope("s"))));
        let free = Checks {
            scopes: ScopeRule::Free,
            ..Checks::default()
        };
        assert_eq!(
            verdict(&seen, &guard, &free),
            Ok(()),
            "nothing refuses: the store calls that a race"
        );
    }

    #[test]
    fn a_key_never_written_has_no_fence_to_be_stale_against_but_the_jump_counts_from_zero() {
        let guard = Guard {
            token: t(50),
            target: Target::Key,
            rule: Rule::Strict,
        };
        let seen = Seen {
            held: vec![Held {
                fenced: key(),
                fence: None,
                remembered: None,
            }],
            scope: ScopeHeld::Admitted,
            binding: None,
        };
        assert_eq!(verdict(&seen, &guard, &Checks::default()), Ok(()));
        let capped = Checks {
            jump: JumpCap(10),
            ..Checks::default()
        };
        let Err(Refusal::Jump(jump)) = verdict(&seen, &guard, &capped) else {
            panic!()
        };
        assert_eq!((jump.current, jump.max_jump), (FencingToken::ZERO, 10));
    }

    #[test]
    fn of_two_refusals_the_first_in_the_precedence_is_reported() {
        let mismatch = Refusal::Mismatch(ScopeMismatch {
            fenced: key(),
            scope: None,
            presented: None,
        });
        let stale = Refusal::Stale(vec![]);
        assert_eq!(
            Refusal::first(Some(mismatch.clone()), stale.clone()),
            Some(stale.clone())
        );
        assert_eq!(
            Refusal::first(Some(stale.clone()), mismatch.clone()),
            Some(stale)
        );
        assert_eq!(Refusal::first(None, mismatch.clone()), Some(mismatch));
    }
}
