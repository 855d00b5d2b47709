//! A write whose presented scope contradicts a configured binding (`[[scopes]]`, a resource's
//! `scope`). Configuration alone finds the mismatch, before anything is read, but the answer
//! follows the verdict's one precedence (`fence::verdict`): the fence of the scope the write was
//! presented under first, so a zombie's stale token is 412 here as everywhere, and only a token
//! that fence admits hears 409 `scope-mismatch`.

use super::{problem::accepted, ApiError, AppState};
use crate::fence::{Guard, ScopeMismatch};

/// The refusal of a write refused by its binding. `guard` is the write under the presented
/// scope; the caller has checked the actor's rights (and any proof) on that scope, since the
/// answer may name its fence.
pub(super) async fn refused(state: &AppState, guard: &Guard, mismatch: ScopeMismatch) -> ApiError {
    match state.store.refuse_binding(guard, mismatch).await {
        Ok(refusal) => accepted::<()>(refusal.outcome()).expect_err("a refusal is never accepted"),
        Err(err) => err.into(),
    }
}
