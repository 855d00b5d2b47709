//! `[kv]` and `[[scopes]]` as written in the config file: which rules decide a write, and
//! which keys configuration binds to a scope. Errors are plain messages naming the setting, as
//! elsewhere in `fence`; the config adds nothing to them.

use serde::Deserialize;

use super::{Bindings, Checks, JumpCap, Rule, Scope, ScopeRule};

/// `[kv]`: the fencing rules every write is decided by, and the bounds on what a request holds.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvSettings {
    /// `true`: a write needs a token strictly greater than the fence (one write per token).
    pub strict: bool,
    /// Longest key or scope name, in UTF-8 bytes (it is a btree index key: at most 2048).
    pub max_key_bytes: usize,
    /// Most operations in one `POST /v1/batch`.
    pub max_batch_ops: usize,
    /// Fences kept in each process's reject-only cache (0 disables it). The cache only ever
    /// refuses tokens below a fence it has seen; it never accepts, so it is safe with any number
    /// of fencegate processes.
    pub fence_cache_capacity: usize,
    /// `true` (the default): a key, and a legacy-table row, stays bound to the scope of its
    /// last accepted write (none for unscoped); a write under another scope, or without the one
    /// it is bound to, is 409 `scope-mismatch`. `false`: any scope may write any key (then a
    /// zombie can step around a scope fence by leaving the scope out).
    pub sticky_scope: bool,
    /// The largest step one write or claim may raise a fence by (a fence not yet written
    /// counts as 0); a bigger jump is 422 `token-jump`. 0 = no cap. Lock grants are exempt.
    pub max_token_jump: u64,
    /// Longest decimal expansion of a JSON number in a request body (digits PostgreSQL would
    /// print): `1e131071` is 9 bytes sent but 131,072 digits on every read. Longer: 400.
    pub max_number_digits: usize,
    /// How long the outcome of a write sent with an `Idempotency-Key` is kept, in
    /// milliseconds: a retry with the same key within it gets the first outcome back.
    pub idempotency_ttl_ms: u64,
}

/// The longest `kv.idempotency_ttl_ms`: 30 days. A retry comes within minutes or hours; the
/// rows live in the database until the sweep deletes them.
pub const MAX_IDEMPOTENCY_TTL_MS: u64 = 30 * 86_400_000;

impl Default for KvSettings {
    fn default() -> Self {
        KvSettings {
            strict: false,
            max_key_bytes: 512,
            max_batch_ops: 1000,
            fence_cache_capacity: 100_000,
            sticky_scope: true,
            max_token_jump: 0,
            max_number_digits: 1000,
            idempotency_ttl_ms: 86_400_000,
        }
    }
}

impl KvSettings {
    pub fn rule(&self) -> Rule {
        Rule::from_strict(self.strict)
    }

    pub fn scope_rule(&self) -> ScopeRule {
        ScopeRule::from_sticky(self.sticky_scope)
    }

    /// The checks every fenced statement makes besides the accept rule (`reserved` comes from
    /// `[locks]`, which the store adds).
    pub fn checks(&self) -> Checks {
        Checks {
            scopes: self.scope_rule(),
            jump: JumpCap(self.max_token_jump),
            reserved: Default::default(),
        }
    }

    /// Refuses settings that cannot work, naming the one to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_number_digits == 0 {
            return Err("kv.max_number_digits must be at least 1".into());
        }
        if !(1..=2048).contains(&self.max_key_bytes) {
            return Err(format!(
                "kv.max_key_bytes must be between 1 and 2048 (it is a btree index key), got {}",
                self.max_key_bytes
            ));
        }
        if self.max_token_jump > i64::MAX as u64 {
            return Err(format!(
                "kv.max_token_jump must be at most {} (0 = no cap), got {}",
                i64::MAX,
                self.max_token_jump
            ));
        }
        if !(1..=MAX_IDEMPOTENCY_TTL_MS).contains(&self.idempotency_ttl_ms) {
            return Err(format!(
                "kv.idempotency_ttl_ms must be between 1 and {MAX_IDEMPOTENCY_TTL_MS} (30 days), got {}",
                self.idempotency_ttl_ms
            ));
        }
        if !(1..=100_000).contains(&self.max_batch_ops) {
            return Err(format!(
                "kv.max_batch_ops must be between 1 and 100000, got {}",
                self.max_batch_ops
            ));
        }
        Ok(())
    }
}

/// One `[[scopes]]` entry: every key starting with one of `keys` is written under the scope
/// `name` (normally a lock's name), with or without an `X-Fencing-Scope` header; a different
/// header is 409 `scope-mismatch`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeBinding {
    pub name: String,
    /// Key prefixes (`""` binds every key). Prefixes of two different scopes must not overlap.
    pub keys: Vec<String>,
}

/// The `[[scopes]]` bindings, validated: each name is a valid scope, each prefix fits a key of
/// at most `max_key_bytes` (`kv.max_key_bytes`), and no key is bound to two scopes.
pub fn bindings(scopes: &[ScopeBinding], max_key_bytes: usize) -> Result<Bindings, String> {
    let mut parsed = Vec::with_capacity(scopes.len());
    for (i, binding) in scopes.iter().enumerate() {
        let scope = Scope::parse(&binding.name, max_key_bytes)
            .map_err(|e| format!("scopes[{i}]: the name {:?} {e}", binding.name))?;
        for prefix in &binding.keys {
            if prefix.len() > max_key_bytes || prefix.chars().any(char::is_control) {
                return Err(format!(
                    "scopes[{i}] ({:?}): key prefix {prefix:?} is longer than kv.max_key_bytes or holds a control character",
                    binding.name
                ));
            }
        }
        parsed.push((scope, binding.keys.clone()));
    }
    Bindings::new(parsed).map_err(|e| format!("[[scopes]]: {e}"))
}
