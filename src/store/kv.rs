//! What a kv write carries and what it leaves, the same on every backend.

use super::{decode::ScopeState, StoreError};
use crate::fence::{FencingToken, Guard, Key, Outcome, Scope};

/// A kv operation inside a batch (or a single write).
#[derive(Debug, Clone)]
pub enum Write {
    Put { key: Key, value: serde_json::Value },
    Delete { key: Key },
}

impl Write {
    pub fn key(&self) -> &Key {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }
}

/// Refuses JSON values no backend can store: PostgreSQL `jsonb` rejects the NUL character
/// (`\u0000`) in strings and object keys. Checked before any write, so such a value is a 400
/// for the client (and identical on every backend), never a database error.
pub fn check_storable(value: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains('\0') => {
                return Err(
                    "JSON strings must not contain \\u0000 (PostgreSQL jsonb cannot store it)"
                        .into(),
                )
            }
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return Err("JSON object keys must not contain \\u0000 (PostgreSQL jsonb cannot store it)".into());
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    Ok(())
}

/// The stored state a write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub key: Key,
    /// `false` if the key held a live value before this write.
    pub was_live: bool,
    pub version: i64,
}

/// A live value, as read back. The value is shared, not copied, between the reads of one key
/// that a coalesced statement answers together (`pg/reads.rs`): a burst of reads of one large
/// value holds it once.
#[derive(Debug, Clone)]
pub struct Entry {
    pub value: std::sync::Arc<serde_json::Value>,
    pub fence_token: FencingToken,
    pub scope: Option<String>,
    pub version: i64,
    pub updated_at: String,
}

/// Result of a claim: the scope's fence now equals the presented token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub created: bool,
}

/// Fenced kv writes, scope claims and reads (`kv.rs`).
pub(in crate::store) trait KvStore {
    /// A write's statement is run by a worker of the backend's, not by the caller's future:
    /// then the caller may await it on its own task (a dropped request abandons nothing).
    fn writes_on_workers(&self) -> bool;

    /// Likewise for reads.
    fn reads_on_workers(&self) -> bool;

    async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError>;

    /// Every write or none, under one token.
    async fn batch(
        &self,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Outcome<Vec<Written>>, StoreError>;

    async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError>;

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError>;

    async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError>;

    /// A scope's fence and the latest token granted by the built-in lock of that name: what
    /// the verdict reads to explain a refusal without a write.
    async fn scope_state(&self, scope: &Scope) -> Result<ScopeState, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::check_storable;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn has_nul(v: &Value) -> bool {
        match v {
            Value::String(s) => s.contains('\0'),
            Value::Array(a) => a.iter().any(has_nul),
            Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
            _ => false,
        }
    }

    proptest! {
        /// Fuzz: any JSON value is refused exactly when a string or key holds a NUL.
        #[test]
        fn storable_iff_no_nul(v in json_value()) {
            prop_assert_eq!(check_storable(&v).is_ok(), !has_nul(&v));
        }
    }

    #[test]
    fn nul_deep_inside_is_found() {
        assert!(check_storable(&json!({"a": [1, {"b": "x\u{0}"}]})).is_err());
        assert!(check_storable(&json!({"a\u{0}": 1})).is_err());
        assert!(check_storable(&json!({"a": ["fine", 1, null]})).is_ok());
    }
}
