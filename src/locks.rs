//! The built-in lease service: named locks with fencing tokens.
//!
//! A grant returns a token strictly greater than every token ever granted for the name (and
//! than the scope's fence), and raises the scope `{name}` to it in the same transaction: the
//! moment a new holder exists, every write of the previous holder under that scope is stale,
//! even to keys the new holder has not written yet. Lease time is the database's clock, never a
//! client's or fencegate's, so several fencegate processes agree on who holds a lock.
//!
//! This module holds the domain types and input rules; the SQL is in `store`.

use serde::Deserialize;
use utoipa::ToSchema;

use crate::fence::{FencingToken, Reserved, Scope};

/// Longest owner label, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;

/// `[locks]`: the built-in lease service.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LockSettings {
    /// Longest lease a client may ask for (`ttl_ms`), in milliseconds.
    pub max_ttl_ms: u64,
    /// Scope prefixes reserved for the built-in lock service (`""`: every scope): under them a
    /// write or claim needs a token a grant issued, from before the first grant on.
    pub names: Vec<String>,
}

impl Default for LockSettings {
    fn default() -> Self {
        LockSettings {
            max_ttl_ms: 3_600_000,
            names: Vec::new(),
        }
    }
}

impl LockSettings {
    /// `names`, validated (see [`Reserved`]).
    pub fn reserved(&self) -> anyhow::Result<Reserved> {
        Reserved::new(&self.names).map_err(|e| anyhow::anyhow!("locks.names: {e}"))
    }

    /// Refuses settings that cannot work, naming the one to fix. Whether `names` overlaps an
    /// issuer's scopes is the config's check (it needs `[[issuers]]`).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_ttl_ms == 0 {
            anyhow::bail!("locks.max_ttl_ms must be at least 1");
        }
        self.reserved()?;
        Ok(())
    }
}

/// A granted or renewed lease.
#[derive(Debug, Clone)]
pub struct Lease {
    pub name: Scope,
    pub owner: String,
    pub token: FencingToken,
    /// RFC 3339, UTC, from the database's clock.
    pub expires_at: String,
}

/// Who holds a lock now, for a 409.
#[derive(Debug, Clone)]
pub struct Holder {
    pub owner: String,
    pub remaining_ms: i64,
    /// The lease's token (never sent in a 409: it would let anyone renew the lease).
    pub token: FencingToken,
    /// The authenticated actor that took the lease (`None`: taken with auth off).
    pub actor: Option<String>,
}

#[derive(Debug)]
pub enum Acquired {
    Granted(Lease),
    Held(Holder),
    /// The scope's fence is at the largest token there is (9223372036854775807): no grant
    /// can exceed it. Only an audited reset of the fence frees the lock's name again.
    Exhausted,
}

/// Result of renew or release with a token.
#[derive(Debug)]
pub enum Held {
    /// The presented token holds the lease (renewed: new expiry; released: now free).
    Yes(Lease),
    /// It does not (expired, released, or taken over). `current` is the holder, if any.
    Lost { current: Option<Holder> },
    /// The token holds the lease, but another actor took it (auth on): nothing was changed.
    Foreign,
}

impl Held {
    /// What a renew or release that changed nothing means: `Foreign` when the presented token
    /// is the live lease's but `actor` is not the one that took it (a lease with no recorded
    /// actor was taken with auth off and belongs to no one in particular).
    pub fn refused(current: Option<Holder>, token: FencingToken, actor: Option<&str>) -> Held {
        match (&current, actor) {
            (Some(holder), Some(actor))
                if holder.token == token && holder.actor.as_deref().is_some_and(|a| a != actor) =>
            {
                Held::Foreign
            }
            _ => Held::Lost { current },
        }
    }
}

/// The body of a grant: who asks (shown to others in a 409), for how long.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// 1..=256 printable bytes.
    pub owner: String,
    /// 1..=locks.max_ttl_ms.
    #[schema(minimum = 1)]
    #[serde(deserialize_with = "whole_number")]
    pub ttl_ms: u64,
}

/// The body of a renew: the new lease, from now.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// 1..=locks.max_ttl_ms.
    #[schema(minimum = 1)]
    #[serde(deserialize_with = "whole_number")]
    pub ttl_ms: u64,
}

/// A JSON number that is a whole number, spelled as JSON Schema's `integer` allows: `1500`,
/// and also `1500.0` or `1.5e3` (the OpenAPI document says `integer`, so a client generated
/// from it may send either).
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(d)?;
    if let Some(n) = number.as_u64() {
        return Ok(n);
    }
    number
        .as_f64()
        .filter(|f| f.fract() == 0.0 && (0.0..=u64::MAX as f64).contains(f))
        .map(|f| f as u64)
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "ttl_ms must be a whole number of milliseconds, got {number}"
            ))
        })
}

/// A lease duration within `1..=max_ttl_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Ttl(i64);

impl Ttl {
    pub fn parse(ms: u64, max_ms: u64) -> Result<Self, String> {
        if ms == 0 || ms > max_ms {
            return Err(format!(
                "ttl_ms must be between 1 and {max_ms} (locks.max_ttl_ms), got {ms}"
            ));
        }
        i64::try_from(ms)
            .map(Ttl)
            .map_err(|_| format!("ttl_ms {ms} is too large"))
    }

    pub fn ms(self) -> i64 {
        self.0
    }
}

/// Owner labels are for humans (who holds this lock?): non-empty, bounded, printable.
pub fn parse_owner(owner: &str) -> Result<&str, String> {
    if owner.is_empty() || owner.len() > MAX_OWNER_BYTES {
        return Err(format!("owner must be 1 to {MAX_OWNER_BYTES} bytes"));
    }
    if owner.chars().any(char::is_control) {
        return Err("owner must not contain control characters".into());
    }
    Ok(owner)
}
