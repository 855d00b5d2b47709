//! Logs (tracing) and metrics (Prometheus). Labels are bounded: route templates, method names
//! from a fixed set, status codes, outcomes; never a key, scope or raw path.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Instant,
};

use axum::{
    extract::Request,
    http::{HeaderValue, Method},
    middleware::Next,
    response::Response,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower_http::request_id::{MakeRequestId, RequestId};
use tracing::Span;

use crate::{config::LogSettings, store::Store};

/// Installs the global tracing subscriber (once; later calls are no-ops, so tests may call it).
pub fn init_logging(settings: &LogSettings) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.filter));
    // Colour codes only for a terminal: in a log file or journal they are noise, and styling
    // every span's fields cost ~6% of a lone PUT's instructions (callgrind, bench/README.md).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if settings.format == "json" { builder.json().try_init() } else { builder.try_init() };
}

/// The process-wide Prometheus recorder. The `metrics` facade has one global recorder per
/// process, so every app in the process (tests start many) shares this handle.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("fencegate_http_request_duration_seconds".into()),
                    &[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
                )
                .expect("bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Histogram samples accumulate in the recorder until upkeep drains them into the
            // buckets; scrapes do it too, but an unscraped process must not grow. A plain thread:
            // the recorder outlives any one tokio runtime (tests start many).
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
                std::thread::sleep(std::time::Duration::from_secs(5));
                upkeep.run_upkeep();
            });
            // Another recorder may already be installed (e.g. by an embedding application);
            // then our handle renders nothing, which is preferable to failing start-up.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a global metrics recorder was already installed; /metrics will be empty");
            }
            handle
        })
        .clone()
}

/// Request ids: a random prefix chosen at start-up, then a counter (`1b4e28ba2fa1-42`).
/// Unique within a process and, with 48 random bits, across processes in practice; a UUID per
/// request cost a `getrandom` system call per request, which a lone write pays in full.
#[derive(Clone)]
pub struct RequestIds {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl RequestIds {
    pub fn new() -> Self {
        let random = uuid::Uuid::new_v4().simple().to_string();
        RequestIds { prefix: random[..12].into(), next: Arc::new(AtomicU64::new(1)) }
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = HeaderValue::from_str(&format!("{}-{n}", self.prefix)).expect("hex digits and a dash are a valid header value");
        Some(RequestId::new(id))
    }
}

pub fn request_span(req: &Request) -> Span {
    let request_id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
    // Display (`%`) rather than Debug for the strings: no quoting and escaping to do, per request.
    tracing::info_span!(
        "request",
        method = %req.method(),
        route = %crate::http::route_of(req),
        request_id = %request_id,
    )
}

/// Counts requests and writes by outcome and records latency, for every request.
pub async fn track_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(req.method());
    let route = crate::http::route_of(&req).to_owned();
    let op = write_op(method, &route);
    let response = next.run(req).await;
    let status = response.status();
    let elapsed = started.elapsed().as_secs_f64();

    metrics::counter!("fencegate_http_requests_total",
        "method" => method, "route" => route.clone(), "status" => status.as_str().to_owned())
    .increment(1);
    metrics::histogram!("fencegate_http_request_duration_seconds", "method" => method, "route" => route)
        .record(elapsed);
    if let Some(op) = op {
        let outcome = match status.as_u16() {
            200..=299 => "accepted",
            412 => "stale",
            409 => "conflict",
            500..=599 => "error",
            _ => "invalid",
        };
        metrics::counter!("fencegate_writes_total", "op" => op, "outcome" => outcome).increment(1);
    }
    response
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

/// Which fenced write a request is, if any.
fn write_op(method: &str, route: &str) -> Option<&'static str> {
    match (method, route) {
        ("PUT", "/v1/kv/{key}") => Some("put"),
        ("DELETE", "/v1/kv/{key}") => Some("delete"),
        ("POST", "/v1/batch") => Some("batch"),
        ("POST", "/v1/fences/{scope}") => Some("claim"),
        ("PUT", "/v1/tables/{resource}/{key}") => Some("table_put"),
        ("PATCH", "/v1/tables/{resource}/{key}") => Some("table_patch"),
        ("DELETE", "/v1/tables/{resource}/{key}") => Some("table_delete"),
        ("POST", "/v1/locks/{name}") => Some("lock_acquire"),
        ("POST", "/v1/locks/{name}/renew") => Some("lock_renew"),
        ("DELETE", "/v1/locks/{name}") => Some("lock_release"),
        _ => None,
    }
}

pub fn record_pool(store: &Store) {
    let (open, idle) = store.pool_stats();
    metrics::gauge!("fencegate_db_pool_connections", "state" => "open").set(f64::from(open));
    metrics::gauge!("fencegate_db_pool_connections", "state" => "idle").set(idle as f64);
    let in_use = (open as usize).saturating_sub(idle);
    metrics::gauge!("fencegate_db_pool_connections", "state" => "in_use").set(in_use as f64);
}
