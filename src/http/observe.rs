//! The outermost layer of every request: its id, its log span, its metrics, and the log line of
//! a server error, in one service.
//!
//! This was four layers (tower-http's request-id pair and `TraceLayer`, and an axum `from_fn`
//! middleware). Each boxed or wrapped the request, the response or its body again; together
//! with an INFO span formatted for every request they came to about a sixth of the
//! instructions of a lone PUT (callgrind, bench/RESULTS.md). Here: one boxed future per request,
//! static metric labels, and the span only when DEBUG logging is on.
//!
//! - **Request id**: the client's `x-request-id` if it sent an acceptable one (1..=128 of
//!   `[A-Za-z0-9._:-]`), else `<prefix>-<counter>`; echoed on the response.
//! - **Server errors** (5xx) are logged at ERROR with the request id, method, route and the
//!   error's detail (which [`super::problem`] leaves in the response's extensions and never
//!   sends to the client).
//! - **Metrics**: every request by method, route and status; a fenced write by its
//!   [`Report`]: the op its route names (`routes::ALL`), and the [`Outcome`] its handler or
//!   problem set on the response (`report`).
//! - **Console events**: an accepted fenced write is counted, a refused one (the problem leaves
//!   it in the response's extensions) is published ([`crate::events`]).
//! - **DEBUG**: a `request` span (method, route, request id) around the handler, so every event
//!   logged while serving carries them, and one event per response with status and latency.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Instant,
};

use axum::{
    extract::Request,
    http::{HeaderName, HeaderValue, Method, Response, StatusCode},
};
use futures_util::FutureExt as _;
use tower::{Layer, Service};

use super::{
    report::{Outcome, Report},
    routes,
};
use crate::events::{Events, Refused};
use tracing::Instrument;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What a 5xx response's handler knew about the failure, or what the database said when it
/// refused a 4xx request's data: for the log line only.
#[derive(Clone, Debug)]
pub struct ServerFailure(pub String);

#[derive(Clone)]
pub struct ObserveLayer {
    ids: RequestIds,
    events: Events,
    metrics: Metrics,
}

impl ObserveLayer {
    pub fn new(events: Events) -> Self {
        ObserveLayer {
            ids: RequestIds::new(),
            events,
            metrics: Metrics::default(),
        }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            ids: self.ids.clone(),
            events: self.events.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    ids: RequestIds,
    events: Events,
    metrics: Metrics,
}

impl<S, B> Service<Request> for Observe<S>
where
    S: Service<Request, Response = Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let started = Instant::now();
        let id = match req
            .headers()
            .get(REQUEST_ID)
            .filter(|id| acceptable_id(id.as_bytes()))
        {
            Some(id) => id.clone(),
            None => {
                let id = self.ids.next();
                req.headers_mut().insert(REQUEST_ID, id.clone());
                id
            }
        };
        let method = method_label(req.method());
        let matched = routes::template(req.extensions()).map(routes::find);
        let route = match matched {
            None => "unmatched",
            Some(None) => "other",
            Some(Some(route)) => route.path,
        };
        let op = matched.flatten().and_then(|r| r.write(method));
        let span = tracing::debug_span!(
            "request",
            method,
            route,
            request_id = %String::from_utf8_lossy(id.as_bytes()),
            // The key name or JWT `sub`, recorded by `auth::authenticate` (empty with auth off).
            actor = tracing::field::Empty,
        );
        // The clone that was made ready serves this request; the fresh one waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (events, metrics) = (self.events.clone(), self.metrics.clone());
        // The inner future is made here and what follows it is a `map`, not an `async` block
        // that calls it: a block holds what it captures (the request, the inner service) for
        // its whole life beside the future it awaits, and the box is copied at its full size.
        let handled = inner.call(req).instrument(span.clone());
        Box::pin(handled.map(move |Ok(mut response)| {
            let status = response.status();
            let elapsed = started.elapsed();
            let failure = response.extensions().get::<ServerFailure>();
            if status.is_server_error() || failure.is_some() {
                let detail = failure.map_or("", |f| f.0.as_str());
                let actor = response
                    .extensions()
                    .get::<crate::auth::Actor>()
                    .and_then(|a| a.name())
                    .unwrap_or("");
                let request_id = String::from_utf8_lossy(id.as_bytes());
                if status.is_server_error() {
                    tracing::error!(%request_id, method, route, actor, status = status.as_u16(), error = detail, "request failed");
                } else {
                    // A 4xx the database refused (a value it cannot store): the client was told
                    // what in fencegate's words; the database's own are here only.
                    tracing::warn!(%request_id, method, route, actor, status = status.as_u16(), error = detail, "the database refused the request's data");
                }
            }
            span.in_scope(|| {
                tracing::debug!(
                    status = status.as_u16(),
                    latency_us = elapsed.as_micros() as u64,
                    "response"
                )
            });
            // Never indexed by HTTP/2's header compression: an id is unique to its response, so
            // the HPACK table would only ever store it, compare every later id with every stored
            // one (the same name), and evict the entries that do repeat (content-type, date).
            // The price: the name goes as a literal too, about 10 bytes more per response.
            let mut id = id;
            id.set_sensitive(true);
            response.headers_mut().insert(REQUEST_ID, id);
            let report = op.map(|op| Report {
                op,
                outcome: outcome_of(&response),
            });
            metrics.record(method, route, status, report, elapsed.as_secs_f64());
            if let Some(report) = report.filter(|r| !r.op.is_lock()) {
                match response.extensions_mut().remove::<Refused>() {
                    Some(refused) => {
                        let actor = response
                            .extensions()
                            .get::<crate::auth::Actor>()
                            .and_then(|a| a.name())
                            .map(str::to_owned);
                        let request_id =
                            String::from_utf8_lossy(response.headers()[&REQUEST_ID].as_bytes())
                                .into_owned();
                        events.refused(
                            refused,
                            report.op.label(),
                            crate::events::Origin {
                                route,
                                actor,
                                request_id,
                            },
                        )
                    }
                    None if report.outcome == Outcome::Accepted => events.accepted(),
                    None => {}
                }
            }
            Ok(response)
        }))
    }
}

/// How a fenced write ended, as its handler ([`super::report::Accepted`]) or its problem
/// (`problem::kinds`) said on the response. Every answer to a write carries one: the handlers'
/// both arms, and every refusal before them, are one or the other.
fn outcome_of<B>(response: &Response<B>) -> Outcome {
    let outcome = response.extensions().get::<Outcome>().copied();
    debug_assert!(
        outcome.is_some(),
        "an answer to a fenced write that says nothing of how it ended"
    );
    outcome.unwrap_or(Outcome::Error)
}

/// A client's own request id is used (echoed and logged) only if it is 1..=128 characters of
/// `[A-Za-z0-9._:-]`: a 60 KB id would be logged verbatim on every line, and quotes or spaces
/// in it could forge log fields. Otherwise the request gets a fresh id.
fn acceptable_id(id: &[u8]) -> bool {
    (1..=128).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(b))
}

/// The metric handles of one label set (method, route, status, and the write's report).
struct Handles {
    requests: metrics::Counter,
    duration: metrics::Histogram,
    /// The `fencegate_writes_total` counter of the write's op and outcome.
    write: Option<metrics::Counter>,
}

/// A label set: method, route, status and, for a fenced write, its report (all static).
type LabelSet = (&'static str, &'static str, u16, Option<Report>);

/// Metric handles by label set. A `counter!` with labels builds its key (allocating the label
/// list) and looks it up in the recorder's registry on every call: three of them were about 4%
/// of a lone PUT's instructions (callgrind). A handle is one atomic add. Bounded: the labels
/// are static strings of known routes, methods, statuses and outcomes (so foldhash, not SipHash:
/// no request chooses them).
#[derive(Clone, Default)]
struct Metrics(
    Arc<
        std::sync::Mutex<std::collections::HashMap<LabelSet, Handles, foldhash::fast::RandomState>>,
    >,
);

impl Metrics {
    /// Counts the request (and the write, by op and outcome) and records its latency.
    fn record(
        &self,
        method: &'static str,
        route: &'static str,
        status: StatusCode,
        report: Option<Report>,
        seconds: f64,
    ) {
        let set = (method, route, status.as_u16(), report);
        // Recorded under the lock (a few atomic adds) rather than cloning three handles out of
        // it: one thread serves requests by default, so the lock is never contended there.
        let mut cached = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let handles = cached
            .entry(set)
            .or_insert_with(|| handles(method, route, status, report));
        handles.requests.increment(1);
        handles.duration.record(seconds);
        if let Some(writes) = &handles.write {
            writes.increment(1);
        }
    }
}

/// The handles of one label set, from the recorder.
fn handles(
    method: &'static str,
    route: &'static str,
    status: StatusCode,
    report: Option<Report>,
) -> Handles {
    Handles {
        requests: metrics::counter!("fencegate_http_requests_total",
            "method" => method, "route" => route, "status" => status_label(status)),
        duration: metrics::histogram!("fencegate_http_request_duration_seconds", "method" => method, "route" => route),
        write: report.map(|r| metrics::counter!("fencegate_writes_total", "op" => r.op.label(), "outcome" => r.outcome.label())),
    }
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::PUT => "PUT",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The status as a label: the codes fencegate answers with are static strings.
fn status_label(status: StatusCode) -> metrics::SharedString {
    const KNOWN: [&str; 19] = [
        "200", "201", "204", "400", "404", "405", "408", "409", "412", "413", "415", "421", "422",
        "423", "428", "431", "500", "503", "504",
    ];
    let code = status.as_str();
    match KNOWN.iter().find(|k| **k == code) {
        Some(known) => metrics::SharedString::const_str(known),
        None => metrics::SharedString::from_owned(code.to_owned()),
    }
}

/// Hex digits of a request id's random prefix.
const ID_PREFIX: usize = 12;

/// Request ids: a random prefix chosen at start-up, then a counter (`1b4e28ba2fa1-42`).
/// Unique within a process and, with 48 random bits, across processes in practice; a UUID per
/// request cost a `getrandom` system call per request, which a lone write pays in full.
#[derive(Clone)]
struct RequestIds {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl RequestIds {
    fn new() -> Self {
        let random = uuid::Uuid::new_v4().simple().to_string();
        RequestIds {
            prefix: random[..ID_PREFIX].into(),
            next: Arc::new(AtomicU64::new(1)),
        }
    }

    fn next(&self) -> HeaderValue {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Built on the stack and copied once: a `String` handed to `HeaderValue` is a second
        // allocation whenever its capacity is not its length (bytes' shared representation).
        // The prefix, a dash, and a `u64` in at most 20 decimal digits.
        let mut id = [0u8; ID_PREFIX + 1 + 20];
        let mut digits = itoa::Buffer::new();
        let n = digits.format(n).as_bytes();
        let prefix = self.prefix.as_bytes();
        let len = prefix.len() + 1 + n.len();
        id[..prefix.len()].copy_from_slice(prefix);
        id[prefix.len()] = b'-';
        id[prefix.len() + 1..len].copy_from_slice(n);
        HeaderValue::from_bytes(&id[..len])
            .expect("hex digits, a dash and decimal digits are a valid header value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_count_up_under_one_prefix() {
        let ids = RequestIds::new();
        let (a, b) = (ids.next(), ids.next());
        let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
        let (prefix_a, n_a) = a.split_once('-').unwrap();
        let (prefix_b, n_b) = b.split_once('-').unwrap();
        assert_eq!(prefix_a, prefix_b);
        assert_eq!(prefix_a.len(), 12);
        assert_eq!(n_b.parse::<u64>().unwrap(), n_a.parse::<u64>().unwrap() + 1);
        assert_ne!(
            RequestIds::new().prefix,
            ids.prefix,
            "each process (layer) draws its own prefix"
        );
    }

    #[test]
    fn client_request_ids_are_used_only_when_plain_and_short() {
        assert!(acceptable_id(b"abc-123_x.y:z"));
        assert!(acceptable_id("a".repeat(128).as_bytes()));
        assert!(!acceptable_id("a".repeat(129).as_bytes()));
        assert!(!acceptable_id(b""));
        assert!(!acceptable_id(b"a\" b=\"forged"));
        assert!(!acceptable_id(b"a b"));
    }
}
