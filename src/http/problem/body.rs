//! The body of a problem as it goes on the wire, and as the OpenAPI document describes it
//! (the `Problem` schema is derived from [`Problem`] itself).
//!
//! Fields in alphabetical order: the order the map this replaced wrote them in.

use serde::Serialize;
use utoipa::ToSchema;

use super::ApiError;
use crate::{
    fence::{Fenced, FencingToken, Stale},
    tables::RowError,
};

/// An RFC 9457 problem. Besides `type`, `title`, `status` and `detail`, a problem carries the
/// fields of its type: a 412 `presented_token`, `current_token`, and the `key` (with
/// `stale_keys` for a batch) or `scope`; a 409 `lock-held` `holder` and `remaining_ms`; a 403
/// the `right` and the name refused.
#[derive(Serialize, ToSchema, Default)]
pub struct Problem<'a> {
    /// The legacy-table column a refused row or value names.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    column: Option<&'a str>,
    /// The table constraint that refused a value.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    constraint: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    current_token: Option<FencingToken>,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    holder: Option<&'a str>,
    /// The `[[issuers]]` entry whose scope a built-in lock may not be granted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    issuer: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    latest_issued: Option<FencingToken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    lock: Option<&'a str>,
    /// `kv.max_token_jump`, a token-sized decimal string like the tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<FencingToken>)]
    max_jump: Option<String>,
    /// The scope a refused write came under (null: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    presented_scope: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    presented_token: Option<FencingToken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    remaining_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    resource: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    right: Option<&'a str>,
    /// The fenced or remembered scope (null: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    scope: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    stale_keys: Option<Vec<StaleKey<'a>>>,
    status: u16,
    title: &'static str,
    /// `https://fencegate.dev/problems/<slug>`: one of the types below, and per response the
    /// types that operation can answer with that status.
    #[serde(rename = "type")]
    r#type: String,
}

/// One key (or row) of a batch refused as stale, with its fence.
#[derive(Serialize, ToSchema)]
pub struct StaleKey<'a> {
    current_token: FencingToken,
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    resource: Option<&'a str>,
}

impl ApiError {
    /// The problem this error answers with.
    pub(super) fn body(&self) -> Problem<'_> {
        let kind = self.kind();
        let mut body = Problem {
            r#type: kind.uri(),
            title: kind.title,
            status: kind.status,
            detail: self.detail(),
            ..Problem::default()
        };
        match self {
            ApiError::Stale(stale) => body.stale(stale),
            ApiError::ScopeMismatch(m) => {
                body.fenced(&m.fenced);
                body.scope = Some(m.scope.as_deref());
                body.presented_scope = Some(m.presented.as_ref().map(|s| s.as_str()));
            }
            ApiError::NotIssued(n) => {
                body.scope = Some(Some(n.scope.as_str()));
                body.presented_token = Some(n.presented);
                body.latest_issued = Some(n.latest);
            }
            ApiError::Jump(j) => {
                body.fenced(&j.fenced);
                body.presented_token = Some(j.presented);
                body.current_token = Some(j.current);
                body.max_jump = Some(j.max_jump.to_string());
            }
            ApiError::Row(err) => {
                body.column = err.column();
                if let RowError::Value {
                    constraint: Some(constraint),
                    ..
                } = err
                {
                    body.constraint = Some(constraint);
                }
            }
            ApiError::ScopeHasIssuer { scope, issuer } => {
                body.scope = Some(Some(scope));
                body.issuer = Some(issuer);
            }
            ApiError::LockHeld {
                owner,
                remaining_ms,
            } => {
                body.holder = Some(owner);
                body.remaining_ms = Some(*remaining_ms);
            }
            ApiError::ForeignLease(lock) => {
                body.right = Some("lock");
                body.lock = Some(lock);
            }
            ApiError::Forbidden { right, refused } => {
                body.right = Some(right.as_str());
                if let Some((named, name)) = refused {
                    use crate::auth::Named;
                    match named {
                        Named::Key => body.key = Some(name),
                        Named::Scope => body.scope = Some(Some(name)),
                        Named::Lock => body.lock = Some(name),
                        Named::Resource => body.resource = Some(name),
                    }
                }
            }
            ApiError::LockLost {
                current: Some(holder),
            } => {
                body.holder = Some(&holder.owner);
                body.remaining_ms = Some(holder.remaining_ms);
            }
            _ => {}
        }
        body
    }
}

impl<'a> Problem<'a> {
    /// `key`, `scope`, or `resource` + `key`: the fields naming what a problem is about.
    fn fenced(&mut self, fenced: &'a Fenced) {
        match fenced {
            Fenced::Key(key) => self.key = Some(key.as_str()),
            Fenced::Scope(scope) => self.scope = Some(Some(scope.as_str())),
            Fenced::Row { resource, key } => {
                self.resource = Some(resource);
                self.key = Some(key);
            }
        }
    }

    /// A 412 carries `presented_token`, `current_token` and the `key` or `scope` of the first
    /// refusal; a batch refused on several keys also lists them all in `stale_keys`.
    fn stale(&mut self, stale: &'a [Stale]) {
        let Some(first) = stale.first() else { return };
        self.presented_token = Some(first.presented);
        self.current_token = Some(first.current);
        self.fenced(&first.fenced);
        if let Some(row) = &first.row {
            self.resource = Some(&row.resource);
            self.key = Some(&row.key);
        }
        let keys: Vec<StaleKey> = stale
            .iter()
            .filter_map(|s| match &s.fenced {
                Fenced::Key(key) => Some(StaleKey {
                    current_token: s.current,
                    key: key.as_str(),
                    resource: None,
                }),
                Fenced::Row { resource, key } => Some(StaleKey {
                    current_token: s.current,
                    key,
                    resource: Some(resource),
                }),
                Fenced::Scope(_) => None,
            })
            .collect();
        if !keys.is_empty() {
            self.stale_keys = Some(keys);
        }
    }
}
