//! Which fence guards a key: sticky scopes and configured bindings.
//!
//! Scope fences and key fences are separate high-water marks, and tokens of different fences
//! are never compared. Left at that, a zombie holding an old token for lock `billing` could
//! write a key the new holder wrote under `billing` by leaving the scope out (the key's own
//! fence was never raised), or by naming another scope (whose fence starts at 0). Two rules
//! close that; in which order they and the fence are reported is [`super::verdict`]'s:
//!
//! - **Sticky scope** ([`ScopeRule`]): a key (or a legacy-table row) remembers the scope of its
//!   last accepted write, `None` for an unscoped one, tombstones included. A write under any
//!   other scope — also none where one is remembered, and one where none is — is refused with
//!   a [`ScopeMismatch`] (reported only once the fence and the poisoning guards admit its
//!   token: a stale token is stale whatever its scope). A key never written has
//!   nothing to remember: its first write binds it. The store evaluates this inside the same
//!   statement or transaction as the fence check ([`ScopeRule::admits`] is the Rust form of the
//!   SQL the store builds with `store::sql::sql_scope_check`).
//! - **Bindings** ([`Bindings`]): configuration, not the client, says the scope of keys with
//!   given prefixes (and of whole legacy tables): a write to a bound key is under that scope
//!   whether or not the client sent one; a different scope is a mismatch.

use super::{Fenced, Key, Scope};

/// Whether a key stays bound to the scope of its last accepted write (`kv.sticky_scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScopeRule {
    /// The default: a write must name the scope the key remembers.
    #[default]
    Sticky,
    /// Any scope may write any key (each write is still checked by its own fence).
    Free,
}

impl ScopeRule {
    pub fn from_sticky(sticky: bool) -> Self {
        if sticky {
            ScopeRule::Sticky
        } else {
            ScopeRule::Free
        }
    }

    /// THE scope decision. `remembered`: `None` if the key was never written, else the scope of
    /// its last accepted write (`Some(None)`: unscoped). `presented`: the write's scope.
    pub fn admits(self, remembered: Option<Option<&str>>, presented: Option<&str>) -> bool {
        match (self, remembered) {
            (ScopeRule::Free, _) | (ScopeRule::Sticky, None) => true,
            (ScopeRule::Sticky, Some(remembered)) => remembered == presented,
        }
    }
}

/// A write refused because its scope is not the one its key or row is bound to. Nothing was
/// changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeMismatch {
    /// The key or row (never [`Fenced::Scope`]).
    pub fenced: Fenced,
    /// The scope the key or row is bound to (`None`: unscoped).
    pub scope: Option<String>,
    /// The scope the write came under (`None`: unscoped).
    pub presented: Option<Scope>,
}

/// `[[scopes]]` bindings: key prefixes whose writes are always under a given scope.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    /// (prefix, scope). Validated so that no key matches prefixes of two different scopes.
    prefixes: Vec<(String, Scope)>,
}

impl Bindings {
    /// Builds the bindings, refusing prefixes that would bind one key to two scopes.
    pub fn new(bindings: impl IntoIterator<Item = (Scope, Vec<String>)>) -> Result<Self, String> {
        let mut prefixes: Vec<(String, Scope)> = Vec::new();
        for (scope, keys) in bindings {
            if keys.is_empty() {
                return Err(format!(
                    "scope {:?} binds no keys; list at least one prefix in `keys`",
                    scope.as_str()
                ));
            }
            for prefix in keys {
                if let Some((other, theirs)) = prefixes.iter().find(|(p, s)| {
                    s != &scope
                        && (p.starts_with(prefix.as_str()) || prefix.starts_with(p.as_str()))
                }) {
                    return Err(format!(
                        "key prefix {prefix:?} of scope {:?} overlaps prefix {other:?} of scope {:?}: a key \
                         would be bound to two scopes; make the prefixes disjoint",
                        scope.as_str(),
                        theirs.as_str()
                    ));
                }
                prefixes.push((prefix, scope.clone()));
            }
        }
        Ok(Bindings { prefixes })
    }

    /// The scope `key` is bound to, if any.
    pub fn of(&self, key: &str) -> Option<&Scope> {
        self.prefixes
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix.as_str()))
            .map(|(_, scope)| scope)
    }

    /// A binding that some key under `prefix` falls under and that names another scope than
    /// `scope`: (its prefix, its scope). What a bulk rebind of `prefix` to `scope` contradicts.
    pub fn contradicting(&self, prefix: &str, scope: Option<&Scope>) -> Option<(&str, &Scope)> {
        self.prefixes
            .iter()
            .find(|(p, s)| {
                (p.starts_with(prefix) || prefix.starts_with(p.as_str())) && Some(s) != scope
            })
            .map(|(p, s)| (p.as_str(), s))
    }

    /// The scope a write of `key` is under: the binding's if the key is bound (a different
    /// presented scope is a mismatch), else the presented one.
    pub fn resolve(
        &self,
        key: &Key,
        presented: Option<Scope>,
    ) -> Result<Option<Scope>, ScopeMismatch> {
        super::binding(self.of(key.as_str()), presented, || {
            Fenced::Key(key.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(s: &str) -> Scope {
        Scope::parse(s, 64).unwrap()
    }

    fn key(s: &str) -> Key {
        Key::parse(s, 64).unwrap()
    }

    #[test]
    fn sticky_admits_only_the_remembered_scope() {
        let sticky = ScopeRule::Sticky;
        assert!(sticky.admits(None, None), "a new key takes any scope");
        assert!(sticky.admits(None, Some("billing")));
        assert!(sticky.admits(Some(Some("billing")), Some("billing")));
        assert!(sticky.admits(Some(None), None));
        assert!(
            !sticky.admits(Some(Some("billing")), None),
            "leaving the scope out"
        );
        assert!(
            !sticky.admits(Some(Some("billing")), Some("billingX")),
            "another scope"
        );
        assert!(
            !sticky.admits(Some(None), Some("billing")),
            "a scope where none is remembered"
        );
        for (remembered, presented) in [(Some(Some("a")), None), (Some(None), Some("b"))] {
            assert!(ScopeRule::Free.admits(remembered, presented));
        }
    }

    #[test]
    fn bindings_decide_the_scope_of_bound_keys() {
        let b = Bindings::new([(scope("billing"), vec!["invoice-".into(), "billing/".into()])])
            .unwrap();
        assert_eq!(
            b.resolve(&key("invoice-1"), None),
            Ok(Some(scope("billing")))
        );
        assert_eq!(
            b.resolve(&key("invoice-1"), Some(scope("billing"))),
            Ok(Some(scope("billing")))
        );
        let refused = b
            .resolve(&key("billing/x"), Some(scope("billingX")))
            .unwrap_err();
        assert_eq!(refused.scope.as_deref(), Some("billing"));
        assert_eq!(refused.presented, Some(scope("billingX")));
        assert_eq!(refused.fenced, Fenced::Key(key("billing/x")));
        // Unbound keys keep what the client sent; a prefix must match from the start.
        assert_eq!(
            b.resolve(&key("other"), Some(scope("s"))),
            Ok(Some(scope("s")))
        );
        assert_eq!(b.resolve(&key("my-invoice-1"), None), Ok(None));
        assert_eq!(
            b.resolve(&key("invoice"), None),
            Ok(None),
            "shorter than the prefix"
        );
    }

    #[test]
    fn overlapping_prefixes_of_two_scopes_are_refused() {
        let err = Bindings::new([
            (scope("a"), vec!["inv".into()]),
            (scope("b"), vec!["invoice-".into()]),
        ])
        .unwrap_err();
        assert!(err.contains("overlaps"), "{err}");
        assert!(Bindings::new([
            (scope("a"), vec!["".into()]),
            (scope("b"), vec!["x".into()])
        ])
        .is_err());
        assert!(Bindings::new([(scope("a"), vec![])]).is_err());
        // One scope may list overlapping prefixes; two scopes may have disjoint ones.
        assert!(Bindings::new([
            (scope("a"), vec!["inv".into(), "invoice".into()]),
            (scope("b"), vec!["x".into()])
        ])
        .is_ok());
    }
}
