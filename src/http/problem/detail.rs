//! The `detail` of a problem: what happened and what to do, in words. A 5xx says only that
//! the server failed: its cause goes to the log (`observe`), never to the client.

use super::ApiError;
use crate::{
    fence::{Fenced, ScopeMismatch, Stale},
    store::StoreError,
};

impl ApiError {
    pub(super) fn detail(&self) -> String {
        match self {
            ApiError::MissingToken => {
                "every write needs the X-Fencing-Token header: the fencing token of the lock you hold".into()
            }
            ApiError::Stale(stale) => describe_stale(stale),
            ApiError::Forbidden { right, refused: Some((named, name)) } => {
                format!("this credential lacks the {right} right on the {} {name:?}; nothing was changed", named.field())
            }
            ApiError::Forbidden { right, refused: None } => {
                format!("this credential lacks the {right} right; nothing was changed")
            }
            ApiError::ScopeMismatch(mismatch) => describe_mismatch(mismatch),
            ApiError::NotIssued(n) => format!(
                "token {} is above {}, the latest token the built-in lock {:?} has granted: no holder of that \
                 lock can have it (a buggy client or a forged token); nothing was written",
                n.presented,
                n.latest,
                n.scope.as_str()
            ),
            ApiError::Jump(j) => format!(
                "token {} would raise the fence of {} from {} by more than kv.max_token_jump ({}): refused as a \
                 likely bad token (a timestamp in the wrong unit?); nothing was written",
                j.presented,
                fenced_name(&j.fenced),
                j.current,
                j.max_jump
            ),
            ApiError::Timeout => "the request took too long; retry it with the same token (a retry is safe)".into(),
            ApiError::Overloaded => "too many requests in flight (server.max_in_flight); retry shortly".into(),
            ApiError::Store(StoreError::Refused { what, .. }) => {
                format!("the value cannot be stored: it holds {what}; nothing was written")
            }
            ApiError::Store(err @ StoreError::Unavailable(_)) => err.unavailable_words().into(),
            ApiError::Store(StoreError::Unkeepable(why)) => format!("{why}; nothing was written"),
            ApiError::Store(StoreError::Raced(why)) => format!("{why}; retry with the same token (a retry is safe)"),
            ApiError::Store(StoreError::NotReady(why)) => format!("{why}; retry later"),
            // Never leak internals; the log has them, under the request id.
            ApiError::Store(_) | ApiError::Internal(_) => {
                "the server failed to handle the request; see the server log for this request id".into()
            }
            other => other.to_string(),
        }
    }
}

fn describe_stale(stale: &[Stale]) -> String {
    match stale {
        [one] => {
            let mut what = match &one.fenced {
                Fenced::Key(key) => format!("key {:?}", key.as_str()),
                Fenced::Scope(scope) => format!("scope {:?}", scope.as_str()),
                Fenced::Row { resource, key } => format!("row {key:?} of {resource:?}"),
            };
            if let Some(row) = &one.row {
                what.push_str(&format!(" (writing row {:?} of {:?})", row.key, row.resource));
            }
            // Only the strict rule (one write per token) refuses a token equal to the fence.
            if one.presented == one.current {
                return format!(
                    "token {} is not above the fence {} of {what} (strict: one write per token); nothing was written",
                    one.presented, one.current
                );
            }
            format!(
                "token {} is older than the fence {} of {what}: a newer lock holder exists; nothing was written",
                one.presented, one.current
            )
        }
        many => format!(
            "token {} is older than the fence of {} keys: a newer lock holder exists; nothing was written",
            many.first().map(|s| s.presented.to_string()).unwrap_or_default(),
            many.len()
        ),
    }
}

fn fenced_name(fenced: &Fenced) -> String {
    match fenced {
        Fenced::Key(key) => format!("key {:?}", key.as_str()),
        Fenced::Row { resource, key } => format!("row {key:?} of {resource:?}"),
        Fenced::Scope(scope) => format!("scope {:?}", scope.as_str()),
    }
}

fn describe_mismatch(m: &ScopeMismatch) -> String {
    let what = fenced_name(&m.fenced);
    let name = |scope: Option<&str>| match scope {
        Some(scope) => format!("scope {scope:?}"),
        None => "no scope".to_owned(),
    };
    let send = match m.scope.as_deref() {
        Some(scope) => format!("send X-Fencing-Scope: {scope} with that lock's token"),
        None => "write it without X-Fencing-Scope (and outside any [[scopes]] binding)".to_owned(),
    };
    // The other way out: the key was written before a binding (or a resource's `scope`) put
    // it under the presented scope, which leaving the header out cannot undo.
    let rebind = match &m.fenced {
        Fenced::Row { resource, .. } => format!("POST /v1/admin/tables/{resource}/rebind"),
        _ => "POST /v1/admin/kv/rebind (a prefix), or the key's reset with \"scope\"".to_owned(),
    };
    format!(
        "{what} is bound to {} but the write came under {}: {send}; or, if it belongs under {} now (a binding \
         added after it was written), an admin rebinds it: {rebind}; nothing was written",
        name(m.scope.as_deref()),
        name(m.presented.as_ref().map(|s| s.as_str())),
        name(m.presented.as_ref().map(|s| s.as_str())),
    )
}
