//! A refused write as the console, the log and the database see it: what was refused, why,
//! and where it came from.

use serde::Serialize;

use crate::fence::{Fenced, FencingToken, Jump, NotIssued, ScopeMismatch, Stale};

/// A fenced write refused, as the problem answered it (moved out of the `ApiError`, no copy).
#[derive(Debug, Clone)]
pub enum Refused {
    Stale(Vec<Stale>),
    NotIssued(NotIssued),
    Jump(Jump),
    Mismatch(ScopeMismatch),
    /// `[[issuers]]`: a missing or invalid `X-Fencing-Proof`.
    BadProof {
        scope: Option<String>,
        issuer: String,
        why: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub kind: &'static str,
    pub op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The scope the write came under (a stale or unissued scoped write), or, for a scope
    /// mismatch, the scope the key is bound to (`null`: none).
    pub scope: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presented_scope: Option<Option<String>>,
    pub presented_token: Option<FencingToken>,
    /// The fence the write ran into (stale, jump), or the latest token the lock issued
    /// (not_issued).
    pub current_token: Option<FencingToken>,
    /// Keys of a batch refused together (1 otherwise).
    pub keys: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `<process>-<event id>`: the same refusal in the stream and in the database.
    pub uid: String,
    /// The route template (`/v1/kv/{key}`), the namespaced actor (`None`: auth off), and the
    /// request id: what an operator needs to find the writer.
    pub route: &'static str,
    pub actor: Option<String>,
    pub request_id: String,
}

/// Where a refused write came from: for its log line and its record.
pub struct Origin {
    pub route: &'static str,
    pub actor: Option<String>,
    pub request_id: String,
}

impl Refused {
    /// The metric outcome label of this refusal.
    pub fn kind(&self) -> &'static str {
        match self {
            Refused::Stale(_) => "stale",
            Refused::NotIssued(_) => "not_issued",
            Refused::Jump(_) => "jump",
            Refused::Mismatch(_) => "scope_mismatch",
            Refused::BadProof { .. } => "bad_proof",
        }
    }

    pub(super) fn into_refusal(self, op: &'static str, origin: Origin, uid: String) -> Refusal {
        let kind = self.kind();
        let mut r = Refusal {
            kind,
            op,
            key: None,
            resource: None,
            scope: None,
            presented_scope: None,
            presented_token: None,
            current_token: None,
            keys: 1,
            detail: None,
            uid,
            route: origin.route,
            actor: origin.actor,
            request_id: origin.request_id,
        };
        let name = |r: &mut Refusal, fenced: Fenced| match fenced {
            Fenced::Key(key) => r.key = Some(key.as_str().to_owned()),
            Fenced::Scope(scope) => r.scope = Some(scope.as_str().to_owned()),
            Fenced::Row { resource, key } => {
                r.resource = Some(resource);
                r.key = Some(key);
            }
        };
        match self {
            Refused::Stale(stale) => {
                r.keys = stale.len().max(1);
                if let Some(first) = stale.into_iter().next() {
                    r.presented_token = Some(first.presented);
                    r.current_token = Some(first.current);
                    name(&mut r, first.fenced);
                    if let Some(row) = first.row {
                        r.resource = Some(row.resource);
                        r.key = Some(row.key);
                    }
                }
            }
            Refused::NotIssued(n) => {
                r.scope = Some(n.scope.as_str().to_owned());
                r.presented_token = Some(n.presented);
                r.current_token = Some(n.latest);
            }
            Refused::Jump(j) => {
                r.presented_token = Some(j.presented);
                r.current_token = Some(j.current);
                r.detail = Some(format!("max jump {}", j.max_jump));
                name(&mut r, j.fenced);
            }
            Refused::Mismatch(m) => {
                name(&mut r, m.fenced);
                r.scope = m.scope;
                r.presented_scope = Some(m.presented.map(|s| s.as_str().to_owned()));
            }
            Refused::BadProof { scope, issuer, why } => {
                r.scope = scope;
                r.detail = Some(format!("issuer {issuer:?}: {why}"));
            }
        }
        r
    }
}

/// The log line of a refused write (INFO, target `fencegate::refusal`); its fields are the
/// JSON keys with `log.format = "json"`.
pub(super) fn log_refusal(r: &Refusal) {
    let token = |t: Option<FencingToken>| t.map(|t| t.get()).unwrap_or(-1);
    tracing::info!(
        target: "fencegate::refusal",
        kind = r.kind,
        op = r.op,
        route = r.route,
        key = r.key.as_deref().unwrap_or(""),
        resource = r.resource.as_deref().unwrap_or(""),
        scope = r.scope.as_deref().unwrap_or(""),
        presented_token = token(r.presented_token),
        current_token = token(r.current_token),
        actor = r.actor.as_deref().unwrap_or(""),
        request_id = r.request_id.as_str(),
        "write refused"
    );
}
