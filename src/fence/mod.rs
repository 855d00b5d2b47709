//! The core of fencegate: what a fencing token is, what it guards, and the rules that decide.
//!
//! Nothing here knows about HTTP or SQL. The store enforces the rules inside the database
//! (where the check must happen, atomically with the write); when the database refuses, the
//! store asks [`verdict`] why, from what the database held, and the HTTP layer turns the
//! [`Refusal`] into a response. Every write path (kv, batch, claims, legacy tables) and the
//! reject-only cache answer through the same function, in one precedence: [`Rule`] compares a
//! token with a fence, [`issued`] and [`JumpCap`] refuse tokens that would poison a fence,
//! [`binding`] and [`ScopeRule`] say whether a write's scope may write a key at all.

mod high_water;
mod name;
mod poison;
mod rule;
mod scoping;
mod settings;
mod token;
mod verdict;

pub use high_water::{HighWater, Slot};
pub use name::{Key, NameError, Scope};
pub use poison::{issued, Jump, JumpCap, NotIssued, Reserved};
pub use rule::{FenceRef, Fenced, Guard, Outcome, RowRef, Rule, Stale, Target};
pub use scoping::{Bindings, ScopeMismatch, ScopeRule};
pub use settings::{bindings, KvSettings, ScopeBinding};
pub use token::{FencingToken, TokenError};
pub use verdict::{binding, stale, verdict, Checks, Held, Refusal, ScopeHeld, Seen};
