//! The console: `GET /ui` (one page, its script and style, all inside the binary),
//! `GET /v1/admin/overview` and the event stream `GET /v1/admin/events` (admin right).
//!
//! The page is static and holds no data: it is served without a credential, and asks for one
//! (kept in the tab's sessionStorage) when the data routes answer 401.

use std::{convert::Infallible, time::Duration};

use axum::{
    extract::State,
    http::{HeaderName, HeaderValue},
    response::{
        sse::{Event as SseEvent, Sse},
        IntoResponse, Response,
    },
    Json,
};
use futures_util::stream::{self, Stream};
use serde_json::json;

use super::{auth::check_admin, problem::ApiError, AppState};
use crate::{
    auth::Actor,
    events::{Next, Subscription},
};

/// Seconds of writes/s the overview returns (the page's chart).
const RATE_HISTORY_SECONDS: usize = 300;

/// `GET /v1/admin/overview`: locks, fences and refused writes from the database (every
/// process's), merged with this process's latest refusals (which may not be written yet);
/// counters and writes/s from this process.
#[utoipa::path(
    operation_id = "admin_overview",
    get,
    path = super::routes::ADMIN_OVERVIEW,
    tag = "admin",
    summary = "The console's data: locks, fences and refusals (database, every process), writes/s (this process)",
    responses((status = 200, description = "locks, fences, refusals, counters, rate (docs/wire.md)", content_type = "application/json"), super::openapi::Edge)
)]
pub async fn overview(State(state): State<AppState>, actor: Actor) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let db = state.store.overview().await?;
    let mut refusals: Vec<serde_json::Value> = db.refusals;
    for local in state.events.recent_refusals() {
        let local = serde_json::to_value(&*local).unwrap_or_default();
        if !refusals.iter().any(|r| r["uid"] == local["uid"]) {
            refusals.push(local);
        }
    }
    refusals.sort_by_key(|r| std::cmp::Reverse(r["at_ms"].as_u64().unwrap_or(0)));
    refusals.truncate(crate::store::overview::MAX_REFUSALS as usize);
    Ok(Json(json!({
        "locks": db.locks,
        "fences": db.fences,
        "refusals": refusals,
        "unfenced": db.unfenced,
        // Refusals of SQL writers (fencegate.fence() and guard triggers), every process's,
        // by kind: counted in the database, as of the last tick.
        "sql_refusals": state
            .store
            .sql_seen()
            .refusals
            .into_iter()
            .map(|(kind, count)| (kind.to_owned(), json!(count)))
            .collect::<serde_json::Map<_, _>>(),
        "counters": state.events.counters(),
        "rate": state.events.rate(RATE_HISTORY_SECONDS),
        "limits": {
            "locks": crate::store::overview::MAX_LOCKS,
            "fences": crate::store::overview::MAX_FENCES,
            "refusals": crate::store::overview::MAX_REFUSALS,
        },
    }))
    .into_response())
}

/// `GET /v1/admin/events`: `text/event-stream` of `grant`, `renew`, `release` and `refusal`
/// events (with an `id:`), a `tick` after every second, and `dropped` before the stream ends
/// for a subscriber that fell too far behind.
#[utoipa::path(
    operation_id = "admin_events",
    get,
    path = super::routes::ADMIN_EVENTS,
    tag = "admin",
    summary = "Server-sent events of fencing: grant, renew, release, refusal, tick, dropped (docs/wire.md)",
    responses((status = 200, description = "An event stream; a subscriber that falls behind gets `dropped` and the stream ends", content_type = "text/event-stream"), super::openapi::Edge)
)]
pub async fn events(State(state): State<AppState>, actor: Actor) -> Result<Response, ApiError> {
    check_admin(&actor)?;
    let subscription = state.events.subscribe();
    // A stream outlives the request that opened it: it ends when its credential expires, as a
    // new request with that credential would be refused then.
    let ends = actor.expires_at().map(|exp| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        tokio::time::Instant::now() + Duration::from_secs(exp + 1).saturating_sub(now)
    });
    let mut response = Sse::new(stream_of(subscription, ends)).into_response();
    // Reverse proxies (nginx) would otherwise buffer the stream.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    Ok(response)
}

enum Phase {
    Open,
    /// The stream ends after the `dropped` event.
    Ending,
}

/// The events of `subscription`, until shutdown, a lag, or `ends` (the credential's expiry),
/// which sends `expired` and ends the stream.
fn stream_of(
    subscription: Subscription,
    ends: Option<tokio::time::Instant>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let first = SseEvent::default()
        .event("hello")
        .retry(Duration::from_secs(2))
        .data(
            json!({"type": "hello", "channel_capacity": crate::events::CHANNEL_CAPACITY})
                .to_string(),
        );
    // The last second ticked: none yet, so the first tick is for the second the stream opened in.
    let before_open = crate::events::now_secs().saturating_sub(1);
    let rest = stream::unfold(
        (subscription, Phase::Open, before_open),
        move |(mut sub, phase, mut ticked)| async move {
            if let Phase::Ending = phase {
                return None;
            }
            loop {
                // A tick for every second that ended, from the one the stream opened in, each once
                // and in order, even when this task wakes late (a loaded machine): a reader summing
                // ticks misses no write. Overdue ticks follow on at once, else the next comes just
                // after the next whole second.
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let overdue = ticked + 1 < now.as_secs();
                let to_next = if overdue {
                    Duration::ZERO
                } else {
                    Duration::from_millis(1000 - (now.as_millis() % 1000) as u64 + 20)
                };
                let event = tokio::select! {
                    next = sub.next() => match next {
                        Next::Event(event) => {
                            let name = event.what.name();
                            let data = serde_json::to_string(&*event).unwrap_or_default();
                            return Some((Ok(SseEvent::default().event(name).id(event.id.to_string()).data(data)), (sub, Phase::Open, ticked)));
                        }
                        Next::Lagged { skipped } => {
                            let data = json!({"type": "dropped", "skipped": skipped,
                                "detail": "this stream fell too far behind and is closed; reconnect and read the overview again"});
                            return Some((Ok(SseEvent::default().event("dropped").data(data.to_string())), (sub, Phase::Ending, ticked)));
                        }
                        Next::Evicted => {
                            let data = json!({"type": "dropped", "skipped": 0,
                                "detail": "more event streams were opened than this server keeps, and this one read slowest: it is closed; reconnect when needed"});
                            return Some((Ok(SseEvent::default().event("dropped").data(data.to_string())), (sub, Phase::Ending, ticked)));
                        }
                        Next::Closed => return None,
                    },
                    () = async { tokio::time::sleep_until(ends.unwrap_or_else(tokio::time::Instant::now)).await }, if ends.is_some() => {
                        let data = json!({"type": "expired", "detail": "the credential of this stream expired; reconnect with a valid one"});
                        return Some((Ok(SseEvent::default().event("expired").data(data.to_string())), (sub, Phase::Ending, ticked)));
                    }
                    () = tokio::time::sleep(to_next) => {
                        let ended = crate::events::now_secs().saturating_sub(1);
                        // Seconds older than the window have no counts left to report.
                        let oldest = ended.saturating_sub(crate::events::RATE_SECONDS as u64 - 2);
                        let due = (ticked + 1).max(oldest);
                        if due > ended || due <= ticked {
                            continue;
                        }
                        ticked = due;
                        let second = sub.events().second(due);
                        let data = json!({"type": "tick", "second": second.second, "accepted": second.accepted, "refused": second.refused});
                        SseEvent::default().event("tick").data(data.to_string())
                    }
                };
                return Some((Ok(event), (sub, Phase::Open, ticked)));
            }
        },
    );
    stream::once(async move { Ok(first) }).chain(rest)
}

use futures_util::StreamExt as _;

/// `default-src 'none'`: the page loads only its own script and style, talks only to this
/// server, and cannot be framed. No inline script or style anywhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("../../ui/console.html");
const SCRIPT: &str = include_str!("../../ui/console.js");
const STYLE: &str = include_str!("../../ui/console.css");

fn asset(body: &'static str, content_type: &'static str) -> Response {
    super::embedded::page(body, content_type, HeaderValue::from_static(CSP))
}

#[utoipa::path(
    operation_id = "console",
    get,
    path = super::routes::UI,
    tag = "console",
    summary = "The console: one page, embedded in the binary",
    responses((status = 200, description = "The page", content_type = "text/html"), super::openapi::Edge)
)]
pub async fn page() -> Response {
    asset(PAGE, "text/html; charset=utf-8")
}

#[utoipa::path(
    operation_id = "console_script",
    get,
    path = super::routes::UI_SCRIPT,
    tag = "console",
    summary = "The console's script",
    responses((status = 200, description = "The script", content_type = "text/javascript"), super::openapi::Edge)
)]
pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

#[utoipa::path(
    operation_id = "console_style",
    get,
    path = super::routes::UI_STYLE,
    tag = "console",
    summary = "The console's style sheet",
    responses((status = 200, description = "The style sheet", content_type = "text/css"), super::openapi::Edge)
)]
pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}
