//! The accept rule and the outcomes of a fenced write.

use super::{FencingToken, Jump, Key, NotIssued, Scope, ScopeMismatch};

/// How a presented token is compared with a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rule {
    /// `token >= fence`: the holder may write many times under one token (the default).
    #[default]
    Inclusive,
    /// `token > fence`: each token may write once (one-write-per-token resources).
    Strict,
}

impl Rule {
    pub fn from_strict(strict: bool) -> Self {
        if strict {
            Rule::Strict
        } else {
            Rule::Inclusive
        }
    }

    /// THE fencing decision. The store evaluates exactly this comparison inside the database
    /// (see `store::sql::fence_admits`), so it can be applied atomically with the write; this Rust
    /// form is used by anything that decides outside SQL (a reject-only cache, tests) and to
    /// double-check what the database reported.
    pub fn accepts(self, presented: FencingToken, fence: FencingToken) -> bool {
        match self {
            Rule::Inclusive => presented >= fence,
            Rule::Strict => presented > fence,
        }
    }

    /// The rule a scope is claimed with for writes under several rules at once (a batch of
    /// kv and table ops): strict if any of them is.
    pub fn strictest(rules: impl IntoIterator<Item = Rule>) -> Rule {
        if rules.into_iter().any(|r| r == Rule::Strict) {
            Rule::Strict
        } else {
            Rule::Inclusive
        }
    }
}

/// Which high-water mark guards a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The key's own fence (no `X-Fencing-Scope`).
    Key,
    /// A scope's fence, shared by every key written under it.
    Scope(Scope),
}

/// Everything needed to decide a write: the token presented, the fence it must pass, and the
/// rule. Write paths in the store take a `Guard`; there is no way to write without one.
#[derive(Debug, Clone)]
pub struct Guard {
    pub token: FencingToken,
    pub target: Target,
    pub rule: Rule,
}

impl Guard {
    pub fn scope(&self) -> Option<&Scope> {
        match &self.target {
            Target::Key => None,
            Target::Scope(scope) => Some(scope),
        }
    }
}

/// A refused write: the token presented and the fence that refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    pub presented: FencingToken,
    pub current: FencingToken,
    pub fenced: Fenced,
    /// The legacy-table row a write under a scope was for, when the scope's fence refused it
    /// (the client is told the resource and key as well as the scope).
    pub row: Option<RowRef>,
}

/// A row of a legacy table: its resource and canonical key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RowRef {
    pub resource: String,
    pub key: String,
}

impl<T> Outcome<T> {
    /// This outcome, a write to `row`: a refusal by its scope's fence names the row too.
    pub fn for_row(self, row: &RowRef) -> Self {
        match self {
            Outcome::Stale(mut stale) => {
                for s in &mut stale {
                    if matches!(s.fenced, Fenced::Scope(_)) {
                        s.row = Some(row.clone());
                    }
                }
                Outcome::Stale(stale)
            }
            other => other,
        }
    }
}

/// What a stale write ran into: a fence, named.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fenced {
    Key(Key),
    Scope(Scope),
    /// A row of a legacy table: the resource's name and the row's canonical key.
    Row {
        resource: String,
        key: String,
    },
}

impl Fenced {
    /// This fence, borrowed: how the reject-only cache looks it up without copying a name.
    pub fn borrowed(&self) -> FenceRef<'_> {
        match self {
            Fenced::Key(key) => FenceRef::Key(key),
            Fenced::Scope(scope) => FenceRef::Scope(scope),
            Fenced::Row { resource, key } => FenceRef::Row { resource, key },
        }
    }
}

/// A [`Fenced`] by reference. Equal and hashed alike exactly when the owned fences are equal,
/// so a cache keyed by it can find a fence from a write's borrowed key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceRef<'a> {
    Key(&'a Key),
    Scope(&'a Scope),
    Row { resource: &'a str, key: &'a str },
}

impl FenceRef<'_> {
    pub fn owned(self) -> Fenced {
        match self {
            FenceRef::Key(key) => Fenced::Key(key.clone()),
            FenceRef::Scope(scope) => Fenced::Scope(scope.clone()),
            FenceRef::Row { resource, key } => Fenced::Row {
                resource: resource.to_owned(),
                key: key.to_owned(),
            },
        }
    }
}

/// The result of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    Accepted(T),
    /// Nothing was applied. One entry per fence that refused (several for a batch of keys);
    /// never empty.
    Stale(Vec<Stale>),
    /// Nothing was applied: the write's scope is not the one its key or row is bound to
    /// (sticky scope or a configured binding; see `fence::scoping`). Reported only when the
    /// fence and the poisoning guards admit the token: a stale token is reported as stale.
    Mismatch(ScopeMismatch),
    /// Nothing was applied: the token is above the latest the built-in lock of the write's
    /// scope has granted (`fence::poison`).
    NotIssued(NotIssued),
    /// Nothing was applied: the token would raise a fence by more than `kv.max_token_jump`.
    Jump(Jump),
}

impl Stale {
    /// Builds the refusal the database reported, checking that it agrees with [`Rule::accepts`].
    /// A disagreement would be a bug in the SQL, so it is logged loudly; the write was not
    /// applied either way, so rejecting remains the safe answer.
    pub fn reported(
        rule: Rule,
        presented: FencingToken,
        current: FencingToken,
        fenced: Fenced,
    ) -> Self {
        if rule.accepts(presented, current) {
            tracing::error!(
                %presented, %current, ?fenced, ?rule,
                "database refused a write the rule accepts; treating it as stale (please report)"
            );
        }
        Stale {
            row: None,
            presented,
            current,
            fenced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: i64) -> FencingToken {
        FencingToken::from_db(v).unwrap()
    }

    #[test]
    fn inclusive_accepts_equal_and_higher() {
        assert!(Rule::Inclusive.accepts(t(5), t(5)));
        assert!(Rule::Inclusive.accepts(t(6), t(5)));
        assert!(!Rule::Inclusive.accepts(t(4), t(5)));
    }

    #[test]
    fn strict_accepts_only_higher() {
        assert!(!Rule::Strict.accepts(t(5), t(5)));
        assert!(Rule::Strict.accepts(t(6), t(5)));
        assert!(!Rule::Strict.accepts(t(4), t(5)));
    }

    #[test]
    fn a_shared_scope_takes_the_strictest_rule() {
        assert_eq!(
            Rule::strictest([Rule::Inclusive, Rule::Inclusive]),
            Rule::Inclusive
        );
        assert_eq!(
            Rule::strictest([Rule::Inclusive, Rule::Strict]),
            Rule::Strict
        );
        assert_eq!(Rule::strictest([]), Rule::Inclusive);
    }
}
