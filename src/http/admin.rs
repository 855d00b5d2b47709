//! `/v1/admin/*`: the audited way back (`store::admin`). Resets lower a fence, or rebind a
//! key's or row's sticky scope, with a reason, in one transaction with their audit row; the
//! audit log reads newest first. A built-in lock can be retired (its old grants stop speaking
//! for its scope's tokens), audited the same way. Every route needs the `admin` right; the actor (key name or
//! JWT subject; `anonymous` with auth off) is what the audit log records.

use axum::{
    extract::{FromRequestParts, Query, State},
    http::request::Parts,
    response::{IntoResponse, Response},
    Json,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::openapi as doc;
use super::{
    auth::check_admin,
    extract::{JsonBody, KeyPath, ScopePath},
    problem::ApiError,
    AppState,
};
use crate::{
    auth::Actor,
    fence::{FencingToken, Scope},
    store::{
        admin::{
            AuditEntry, Rebind, RebindDone, RebindTarget, Reset, ResetDone, ResetRefused,
            ResetTarget,
        },
        RefusalFilter,
    },
    tables::RowKey,
};

/// `{"to": "N", "reason": "why", "scope": "S" | null}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetRequest {
    /// The new fence, a token as a JSON string, below the current one.
    #[serde(default)]
    #[schema(value_type = Option<FencingToken>)]
    to: Option<String>,
    /// Why (1..=1000 bytes): recorded in the audit log. Required.
    #[serde(default)]
    reason: Option<String>,
    /// Keys and rows only. Present (a name or null): rebind the sticky scope. Absent: leave it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    scope: Option<Option<String>>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// The name the audit log records: the authenticated actor, or `anonymous` with auth off
/// (nothing a client could forge).
fn actor_name(actor: &Actor) -> String {
    actor.name().unwrap_or("anonymous").to_owned()
}

fn reset_of(
    state: &AppState,
    target: ResetTarget,
    request: ResetRequest,
    actor: Actor,
) -> Result<Reset, ApiError> {
    check_admin(&actor)?;
    let to = request
        .to
        .map(|to| {
            FencingToken::parse(to.as_bytes())
                .map_err(|e| ApiError::InvalidRequest(format!("\"to\": {e}")))
        })
        .transpose()?;
    let scope = request
        .scope
        .map(|scope| {
            scope
                .map(|s| {
                    Scope::parse(&s, state.kv.max_key_bytes)
                        .map_err(|e| ApiError::InvalidRequest(format!("\"scope\": the scope {e}")))
                })
                .transpose()
        })
        .transpose()?;
    Ok(Reset {
        target,
        to,
        scope,
        reason: request.reason.unwrap_or_default(),
        actor: actor_name(&actor),
    })
}

async fn run(state: &AppState, reset: Reset) -> Result<Response, ApiError> {
    match state.store.reset(reset).await? {
        Ok(done) => Ok(Json(done).into_response()),
        Err(ResetRefused::NotFound(why)) => Err(ApiError::NotFound(why)),
        Err(refused @ ResetRefused::NotBelow { .. }) => {
            Err(ApiError::ResetNotBelow(refused.to_string()))
        }
        Err(ResetRefused::Invalid(why)) => Err(ApiError::InvalidRequest(why)),
    }
}

#[utoipa::path(
    operation_id = "reset_fence",
    post,
    path = super::routes::ADMIN_FENCE_RESET,
    tag = "admin",
    summary = "Lower a scope's fence (audited)",
    params(ScopePath),
    request_body(content = ResetRequest, content_type = "application/json"),
    responses((status = 200, description = "Lowered; the audit log has the row", body = ResetDone), doc::Reset)
)]
pub async fn reset_fence(
    State(state): State<AppState>,
    actor: Actor,
    ScopePath(scope): ScopePath,
    JsonBody(request): JsonBody<ResetRequest>,
) -> Result<Response, ApiError> {
    let reset = reset_of(&state, ResetTarget::Scope(scope), request, actor)?;
    run(&state, reset).await
}

#[utoipa::path(
    operation_id = "reset_key",
    post,
    path = super::routes::ADMIN_KV_RESET,
    tag = "admin",
    summary = "Lower a key's fence, or rebind its sticky scope (audited)",
    params(KeyPath),
    request_body(content = ResetRequest, content_type = "application/json"),
    responses((status = 200, description = "Done; the audit log has the row", body = ResetDone), doc::Reset)
)]
pub async fn reset_key(
    State(state): State<AppState>,
    actor: Actor,
    KeyPath(key): KeyPath,
    JsonBody(request): JsonBody<ResetRequest>,
) -> Result<Response, ApiError> {
    let configured = state.bindings.of(key.as_str()).cloned();
    let reset = reset_of(&state, ResetTarget::Key(key), request, actor)?;
    check_binding(&reset, configured.as_ref())?;
    run(&state, reset).await
}

/// A rebind to another scope than the configuration binds the key (or the table) to would
/// leave it unwritable under both: every write is under the configured scope, which the new
/// binding then refuses. 409, nothing changed.
fn check_binding(reset: &Reset, configured: Option<&Scope>) -> Result<(), ApiError> {
    let (Some(configured), Some(new)) = (configured, &reset.scope) else {
        return Ok(());
    };
    if new.as_ref() == Some(configured) {
        return Ok(());
    }
    let shown = new.as_ref().map_or_else(
        || "no scope".to_owned(),
        |s| format!("scope {:?}", s.as_str()),
    );
    Err(ApiError::BindingConflict(format!(
        "the configuration binds this {} to scope {:?} ([[scopes]] or the resource's `scope`): rebinding it to {shown} \
         would refuse every later write; change the configuration instead; nothing was changed",
        if matches!(reset.target, ResetTarget::Row { .. }) { "table" } else { "key" },
        configured.as_str()
    )))
}

/// `/v1/admin/tables/{resource}/{key}/reset`: the row key is read from the raw path, as for
/// `/v1/tables` (a `%2C` inside a value must not split it).
pub struct AdminRowPath(ResetTarget);

impl FromRequestParts<AppState> for AdminRowPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let path = parts.uri.path().strip_suffix("/reset").unwrap_or_default();
        let mut segments = path.rsplit('/');
        let (Some(key), Some(name)) = (segments.next(), segments.next()) else {
            return Err(ApiError::NotFound(
                "no such endpoint; see docs/api.md or GET /openapi.json".into(),
            ));
        };
        let resource = super::tables::resource(state, name)?;
        let key = RowKey::parse(&resource, key, state.kv.max_key_bytes)?;
        Ok(AdminRowPath(ResetTarget::Row { resource, key }))
    }
}

#[utoipa::path(
    operation_id = "reset_row",
    post,
    path = super::routes::ADMIN_TABLE_RESET,
    tag = "admin",
    summary = "Lower a table row's fence, or rebind its sticky scope (audited)",
    params(doc::RowParams),
    request_body(content = ResetRequest, content_type = "application/json"),
    responses((status = 200, description = "Done; the audit log has the row", body = ResetDone), doc::Reset)
)]
pub async fn reset_row(
    State(state): State<AppState>,
    actor: Actor,
    AdminRowPath(target): AdminRowPath,
    JsonBody(request): JsonBody<ResetRequest>,
) -> Result<Response, ApiError> {
    let reset = reset_of(&state, target, request, actor)?;
    let configured = match &reset.target {
        ResetTarget::Row { resource, .. } => resource.scope.clone(),
        _ => None,
    };
    check_binding(&reset, configured.as_ref())?;
    run(&state, reset).await
}

/// `{"reason": "why"}`: the body of a retire.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetireRequest {
    /// Why (1..=1000 bytes, no control characters): recorded in the audit log. Required.
    reason: String,
}

#[utoipa::path(
    operation_id = "retire_lock",
    post,
    path = super::routes::ADMIN_LOCK_RETIRE,
    tag = "admin",
    summary = "Retire a built-in lock: its grants no longer speak for the scope's tokens (audited)",
    params(doc::LockName),
    request_body(content = RetireRequest, content_type = "application/json"),
    responses((status = 200, description = "Retired; the audit log has the row", body = ResetDone), doc::Retire)
)]
pub async fn retire_lock(
    State(state): State<AppState>,
    actor: Actor,
    ScopePath(name): ScopePath,
    JsonBody(request): JsonBody<RetireRequest>,
) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let reset = Reset {
        target: ResetTarget::Lock(name),
        to: None,
        scope: None,
        reason: request.reason,
        actor: actor_name(&actor),
    };
    run(&state, reset).await
}

/// `{"prefix": "P", "scope": "S" | null, "reason": "why"}` (`prefix` for keys only).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RebindRequest {
    /// Keys only: every key starting with it (`""`: every key). Required for keys.
    #[serde(default)]
    prefix: Option<String>,
    /// The new sticky scope, or null for none. Required.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    scope: Option<Option<String>>,
    /// Why (1..=1000 bytes, no control characters): recorded in the audit log. Required.
    reason: String,
}

fn rebind_scope(state: &AppState, request: &RebindRequest) -> Result<Option<Scope>, ApiError> {
    let Some(scope) = &request.scope else {
        return Err(ApiError::InvalidRequest(
            "\"scope\" is required: the new binding, or null for none".into(),
        ));
    };
    scope
        .as_deref()
        .map(|s| {
            Scope::parse(s, state.kv.max_key_bytes)
                .map_err(|e| ApiError::InvalidRequest(format!("\"scope\": the scope {e}")))
        })
        .transpose()
}

async fn rebind(state: &AppState, rebind: Rebind) -> Result<Response, ApiError> {
    match state.store.rebind(rebind).await? {
        Ok(done) => Ok(Json(done).into_response()),
        Err(ResetRefused::NotFound(why)) => Err(ApiError::NotFound(why)),
        Err(refused) => Err(ApiError::InvalidRequest(refused.to_string())),
    }
}

/// `POST /v1/admin/kv/rebind`: every key under a prefix moves under another sticky scope (or
/// none), e.g. once `[[scopes]]` binds keys written before the binding existed. Refused (409)
/// when it contradicts a binding of the configuration.
#[utoipa::path(
    operation_id = "rebind_keys",
    post,
    path = super::routes::ADMIN_KV_REBIND,
    tag = "admin",
    summary = "Rebind every key under a prefix to a sticky scope (audited)",
    request_body(content = RebindRequest, content_type = "application/json"),
    responses((status = 200, description = "Rebound; the audit log has the row", body = RebindDone), doc::Rebind)
)]
pub async fn rebind_keys(
    State(state): State<AppState>,
    actor: Actor,
    JsonBody(request): JsonBody<RebindRequest>,
) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let scope = rebind_scope(&state, &request)?;
    let Some(prefix) = request.prefix else {
        return Err(ApiError::InvalidRequest(
            "\"prefix\" is required: the keys to rebind (\"\" for every key)".into(),
        ));
    };
    if prefix.len() > state.kv.max_key_bytes || prefix.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(
            "\"prefix\" is longer than kv.max_key_bytes or holds a control character".into(),
        ));
    }
    if let Some((bound, to)) = state.bindings.contradicting(&prefix, scope.as_ref()) {
        return Err(ApiError::BindingConflict(format!(
            "the configuration binds keys starting with {bound:?} to scope {:?} ([[scopes]]), and some of them are under \
             {prefix:?}: rebinding them elsewhere would refuse every later write; nothing was changed",
            to.as_str()
        )));
    }
    let target = RebindTarget::Keys { prefix };
    rebind(
        &state,
        Rebind {
            target,
            scope,
            reason: request.reason,
            actor: actor_name(&actor),
        },
    )
    .await
}

/// `POST /v1/admin/tables/{resource}/rebind`: every row of the table fencegate holds a fence
/// for moves under another sticky scope (or none); 409 against the resource's `scope`.
#[utoipa::path(
    operation_id = "rebind_table",
    post,
    path = super::routes::ADMIN_TABLE_REBIND,
    tag = "admin",
    summary = "Rebind every fenced row of a legacy table to a sticky scope (audited)",
    params(("resource" = String, Path, description = "A configured [[resources]] name")),
    request_body(content = RebindRequest, content_type = "application/json"),
    responses((status = 200, description = "Rebound; the audit log has the row", body = RebindDone), doc::Rebind)
)]
pub async fn rebind_table(
    State(state): State<AppState>,
    actor: Actor,
    axum::extract::Path(name): axum::extract::Path<String>,
    JsonBody(request): JsonBody<RebindRequest>,
) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let resource = super::tables::resource(&state, &name)?;
    let scope = rebind_scope(&state, &request)?;
    if request.prefix.is_some() {
        return Err(ApiError::InvalidRequest(
            "a table is rebound whole: leave \"prefix\" out".into(),
        ));
    }
    if let Some(configured) = &resource.scope {
        if scope.as_ref() != Some(configured) {
            return Err(ApiError::BindingConflict(format!(
                "the configuration puts every write to {name:?} under scope {:?}: rebinding its rows elsewhere would \
                 refuse every later write; nothing was changed",
                configured.as_str()
            )));
        }
    }
    let target = RebindTarget::Table(resource);
    rebind(
        &state,
        Rebind {
            target,
            scope,
            reason: request.reason,
            actor: actor_name(&actor),
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    limit: Option<u32>,
}

/// `?limit=N`: 1..=1000, default 100.
fn limit_of(
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<u32, ApiError> {
    let Query(query) = query
        .map_err(|e| ApiError::InvalidRequest(format!("query: {}; use ?limit=N", e.body_text())))?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be 1..=1000, got {limit}"
        )));
    }
    Ok(limit)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalQuery {
    limit: Option<u32>,
    key: Option<String>,
    scope: Option<String>,
    actor: Option<String>,
    kind: Option<String>,
    since: Option<String>,
}

/// The kinds of refusal a record can have.
const REFUSAL_KINDS: [&str; 5] = ["stale", "not_issued", "jump", "scope_mismatch", "bad_proof"];

/// `since`: milliseconds since the Unix epoch (as a record's `at_ms`), or an RFC 3339 UTC time
/// (`2026-11-27T10:00:00Z`, fractional seconds allowed, as a record's `at`).
fn since_ms(since: &str) -> Option<i64> {
    if !since.is_empty() && since.bytes().all(|b| b.is_ascii_digit()) {
        return since.parse().ok();
    }
    let b = since.as_bytes();
    let digits = |from: usize, n: usize| -> Option<i64> {
        let part = since.get(from..from + n)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    let mut millis = 0;
    let rest = match &since[19..] {
        fraction if fraction.starts_with('.') => {
            let digits_end = fraction[1..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(fraction.len(), |i| i + 1);
            let fraction_digits = &fraction[1..digits_end];
            if fraction_digits.is_empty() {
                return None;
            }
            for (i, c) in fraction_digits.bytes().take(3).enumerate() {
                millis += i64::from(c - b'0') * [100, 10, 1][i];
            }
            &fraction[digits_end..]
        }
        rest => rest,
    };
    if rest != "Z"
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

/// `GET /v1/admin/refusals?limit=N&key=&scope=&actor=&kind=&since=`: refused writes of every
/// process serving the database, newest first (at most `database.refusals_kept`, fair per
/// actor, of the last 7 days are kept); each filter that is given must match.
#[utoipa::path(
    operation_id = "refusals",
    get,
    path = super::routes::ADMIN_REFUSALS,
    tag = "admin",
    summary = "Refused writes (412, 409, 422) of every process, newest first",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "How many (1..=1000, default 100)"),
        ("key" = Option<String>, Query, description = "Only refusals of this key"),
        ("scope" = Option<String>, Query, description = "Only refusals naming this scope"),
        ("actor" = Option<String>, Query, description = "Only refusals of this actor (`key:NAME`, `jwt:SUB`, ...)"),
        ("kind" = Option<String>, Query, description = "Only this kind: stale, not_issued, jump, scope_mismatch, bad_proof"),
        ("since" = Option<String>, Query, description = "Only refusals at or after this time: RFC 3339 UTC (`2026-11-27T10:00:00Z`) or milliseconds since the epoch"),
    ),
    responses((status = 200, description = "`{\"refusals\": [...]}` (docs/wire.md)", content_type = "application/json"), doc::Audit)
)]
pub async fn refusals(
    State(state): State<AppState>,
    actor: Actor,
    query: Result<Query<RefusalQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let Query(query) = query.map_err(|e| {
        ApiError::InvalidRequest(format!(
            "query: {}; use ?limit=N&key=&scope=&actor=&kind=&since=",
            e.body_text()
        ))
    })?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be 1..=1000, got {limit}"
        )));
    }
    if let Some(kind) = &query.kind {
        if !REFUSAL_KINDS.contains(&kind.as_str()) {
            return Err(ApiError::InvalidRequest(format!(
                "kind must be one of {}",
                REFUSAL_KINDS.join(", ")
            )));
        }
    }
    let since_ms = match &query.since {
        None => None,
        Some(since) => Some(since_ms(since).ok_or_else(|| {
            ApiError::InvalidRequest(
                "since must be an RFC 3339 UTC time (2026-11-27T10:00:00Z) or milliseconds since the epoch".into(),
            )
        })?),
    };
    for (name, value) in [
        ("key", &query.key),
        ("scope", &query.scope),
        ("actor", &query.actor),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > 4096) {
            return Err(ApiError::InvalidRequest(format!("{name} is too long")));
        }
    }
    // A time after the year 9999 selects what 9999 does (nothing: refusals carry the
    // database's clock), and every backend can compare with it.
    const LAST_MS: i64 = 253_402_300_799_999;
    let since_ms = since_ms.map(|ms| ms.min(LAST_MS));
    let filter = RefusalFilter {
        limit,
        key: query.key,
        scope: query.scope,
        actor: query.actor,
        kind: query.kind,
        since_ms,
    };
    let refusals = state.store.refusals(filter).await?;
    Ok(Json(json!({ "refusals": refusals })).into_response())
}

#[cfg(test)]
mod since_tests {
    use super::since_ms;

    #[test]
    fn since_reads_rfc3339_utc_and_milliseconds() {
        assert_eq!(since_ms("0"), Some(0));
        assert_eq!(since_ms("1700000000123"), Some(1_700_000_000_123));
        assert_eq!(since_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            since_ms("2023-11-14T22:13:20.123Z"),
            Some(1_700_000_000_123)
        );
        assert_eq!(since_ms("2024-02-29T00:00:00.5Z"), Some(1_709_164_800_500));
        for bad in [
            "",
            "x",
            "2024-02-29",
            "2024-02-29T00:00:00",
            "2024-02-29T00:00:00+01:00",
            "2024-13-01T00:00:00Z",
            "2024-02-29T00:00:00.Z",
            "-5",
        ] {
            assert_eq!(since_ms(bad), None, "{bad}");
        }
    }
}

/// The body of `GET /v1/admin/audit`.
#[derive(Serialize, ToSchema)]
pub struct AuditLog {
    /// Newest first.
    entries: Vec<AuditEntry>,
}

/// `GET /v1/admin/audit?limit=N` (1..=1000, default 100): newest first.
#[utoipa::path(
    operation_id = "audit",
    get,
    path = super::routes::ADMIN_AUDIT,
    tag = "admin",
    summary = "The audit log, newest first",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "How many entries (1..=1000, default 100)")),
    responses((status = 200, description = "The entries", body = AuditLog), doc::Audit)
)]
pub async fn audit(
    State(state): State<AppState>,
    actor: Actor,
    query: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let limit = limit_of(query)?;
    let entries = state.store.audit(limit).await?;
    Ok(Json(AuditLog { entries }).into_response())
}
