//! The core of fencegate: what a fencing token is, what it guards, and the rule that decides.
//!
//! Nothing here knows about HTTP or SQL. The store enforces [`Rule`] inside the database (where
//! the check must happen, atomically with the write) and reports back an [`Outcome`]; the HTTP
//! layer turns that into a response. Keeping the rules here means every write path (kv, batch,
//! claims, legacy tables, lock grants) is decided by the same few lines: [`Rule`] compares a
//! token with a fence, [`ScopeRule`] says whether a write's scope may write a key at all, and
//! [`issued`] and [`JumpCap`] refuse tokens that would poison a fence.

mod high_water;
mod name;
mod poison;
mod rule;
mod scoping;
mod settings;
mod token;

pub use high_water::HighWater;
pub use name::{Key, NameError, Scope};
pub use poison::{issued, Jump, JumpCap, NotIssued, Reserved};
pub use rule::{Fenced, Guard, Outcome, Rule, Stale, Target};
pub use scoping::{bound_scope, Bindings, ScopeMismatch, ScopeRule};
pub use settings::{bindings, KvSettings, ScopeBinding};
pub use token::{FencingToken, TokenError};
