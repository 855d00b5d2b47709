//! Logs (tracing) and metrics (Prometheus). Labels are bounded: route templates, method names
//! from a fixed set, status codes, outcomes; never a key, scope or raw path.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;

use crate::store::Store;

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A `tracing` filter, e.g. `info` or `fencegate=debug,tower_http=info` (`RUST_LOG` wins).
    pub filter: String,
    /// `text` or `json`.
    pub format: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            filter: "info".into(),
            format: "text".into(),
        }
    }
}

impl LogSettings {
    /// Refuses a format [`init_logging`] does not know (anything else would silently log text).
    pub fn validate(&self) -> anyhow::Result<()> {
        if !matches!(self.format.as_str(), "text" | "json") {
            anyhow::bail!(
                "log.format must be \"text\" or \"json\", got {:?}",
                self.format
            );
        }
        Ok(())
    }
}

/// Installs the global tracing subscriber (once; later calls are no-ops, so tests may call it).
pub fn init_logging(settings: &LogSettings) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.filter));
    // Colour codes only for a terminal: in a log file or journal they are noise, and styling
    // every span's fields cost ~6% of a lone PUT's instructions (callgrind, bench/RESULTS.md).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = if settings.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
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
                    &[
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                        5.0, 10.0,
                    ],
                )
                .expect("bucket list is not empty")
                // Requests per statement as buckets, not a summary: a summary's quantiles
                // cannot be added up across processes, and each sample cost the recorder's
                // sketch about 500 instructions, one per statement (a lone write's).
                .set_buckets_for_metric(
                    Matcher::Prefix("fencegate_coalesced_".into()),
                    &[
                        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                    ],
                )
                .expect("bucket list is not empty")
                .build_recorder();
            let handle = recorder.handle();
            // Histogram samples accumulate in the recorder until upkeep drains them into the
            // buckets; scrapes do it too, but an unscraped process must not grow. A plain thread:
            // the recorder outlives any one tokio runtime (tests start many).
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(std::time::Duration::from_secs(5));
                    upkeep.run_upkeep();
                });
            // Another recorder may already be installed (e.g. by an embedding application);
            // then our handle renders nothing, which is preferable to failing start-up.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "a global metrics recorder was already installed; /metrics will be empty"
                );
            }
            describe();
            handle
        })
        .clone()
}

/// `# HELP` (and the unit) of every metric family fencegate exports: what it counts and what
/// to make of it (docs/operations.md, *Metrics*). A family missing here has no HELP line; the
/// test `every_metric_family_has_help` scrapes a server that produced them all.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "fencegate_http_requests_total",
        Unit::Count,
        "HTTP requests answered, by method, route and status."
    );
    describe_histogram!(
        "fencegate_http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request, by method and route."
    );
    describe_counter!(
        "fencegate_writes_total",
        Unit::Count,
        "Fenced writes by op and outcome: accepted, stale (a zombie), not_issued, jump, scope_mismatch, bad_proof."
    );
    describe_counter!(
        "fencegate_cache_refusals_total",
        Unit::Count,
        "Stale writes refused by the reject-only fence cache, without a database round trip."
    );
    describe_counter!(
        "fencegate_cache_clears_total",
        Unit::Count,
        "Times this process forgot its cached fences, by reason: reset (a reset made here or elsewhere), start, listener (the reset listener reconnected), unheard (the audit log could not be read within a second, so a reset may have gone unheard)."
    );
    describe_counter!(
        "fencegate_raced_refusals_total",
        Unit::Count,
        "Writes refused by a check that a concurrent grant or fence raise made moot before it was explained (answered 503, safe to retry)."
    );
    describe_counter!(
        "fencegate_auth_failures_total",
        Unit::Count,
        "Requests refused 401 or 403, by reason."
    );
    describe_counter!(
        "fencegate_shed_requests_total",
        Unit::Count,
        "Requests answered 503 at once because server.max_in_flight requests were in flight."
    );
    describe_counter!("fencegate_connections_closed_total", Unit::Count, "Client connections closed by fencegate, by reason (idle, too slow, reaped at the cap, ...).");
    describe_counter!(
        "fencegate_accept_errors_total",
        Unit::Count,
        "Failed accepts of new connections (out of file descriptors or memory)."
    );
    describe_counter!(
        "fencegate_worker_panics_total",
        Unit::Count,
        "Coalescing workers that panicked and were restarted (a bug: report it)."
    );
    describe_counter!(
        "fencegate_http2_refused_streams_total",
        Unit::Count,
        "HTTP/2 streams refused (REFUSED_STREAM) because the unread response bytes of their connection, or of all connections, were at the budget."
    );
    describe_counter!(
        "fencegate_held_scope_lanes_total",
        Unit::Count,
        "Scopes whose fence a coalesced write found held by another transaction: their writes waited apart, in a lane of their own (PostgreSQL)."
    );
    describe_counter!(
        "fencegate_unfenced_writes_total",
        Unit::Count,
        "Writes to a guarded table by another role without fencegate.fence() in their transaction (guard = audit), by resource."
    );
    describe_counter!(
        "fencegate_idempotent_replays_total",
        Unit::Count,
        "Writes answered with the kept outcome of an earlier request with the same Idempotency-Key (Idempotent-Replayed: true): retries whose first attempt had landed."
    );
    describe_counter!(
        "fencegate_sql_refusals_total",
        Unit::Count,
        "SQL writers refused by fencegate.fence() or a guard trigger (every session of the database, counted although the refusing transaction rolled back), by kind: stale-token, token-not-issued, token-jump, scope-has-issuer, forbidden, unfenced."
    );
    describe_counter!(
        "fencegate_refusals_unrecorded_total",
        Unit::Count,
        "Refused writes not recorded in the database because its queue was full (the oldest of the actor with the most waiting is dropped)."
    );
    describe_counter!(
        "fencegate_lock_takeovers_total",
        Unit::Count,
        "Built-in lock grants over a lease that expired without a release: its holder may still be running (a zombie)."
    );
    describe_counter!(
        "fencegate_lease_expiries_total",
        Unit::Count,
        "Leases of the built-in locks that ran out without a release (counted when the lock is granted again)."
    );
    describe_gauge!(
        "fencegate_db_pool_connections",
        Unit::Count,
        "Database connections, by state: open, idle, in_use."
    );
    describe_gauge!(
        "fencegate_replication_synchronous",
        "1 if a synchronous standby confirms every commit, 0 if streaming replicas exist but none is synchronous (a failover can lose acknowledged fences). Absent with no replicas."
    );
    describe_gauge!(
        "fencegate_replication_replicas",
        Unit::Count,
        "Streaming replicas of the primary, as pg_stat_replication shows them."
    );
    describe_histogram!(
        "fencegate_coalesced_rows",
        Unit::Count,
        "Writes combined into one statement by the coalescer."
    );
    describe_histogram!(
        "fencegate_coalesced_reads",
        Unit::Count,
        "Reads combined into one statement."
    );
}

/// `fencegate_coalesced_rows`, resolved once (see [`resolved`]).
pub fn coalesced_rows() -> &'static metrics::Histogram {
    static ROWS: OnceLock<metrics::Histogram> = OnceLock::new();
    resolved(&ROWS, "fencegate_coalesced_rows")
}

/// `fencegate_coalesced_reads`, resolved once (see [`resolved`]).
pub fn coalesced_reads() -> &'static metrics::Histogram {
    static READS: OnceLock<metrics::Histogram> = OnceLock::new();
    resolved(&READS, "fencegate_coalesced_reads")
}

/// The histogram `name` without labels, resolved once into `cell`: `histogram!` builds its key
/// and looks it up in the recorder's registry on every call (about 200 instructions per
/// statement). Resolved against the process's recorder, which is installed first if it is not
/// yet: a handle taken before it would record nowhere, for good.
fn resolved(
    cell: &'static OnceLock<metrics::Histogram>,
    name: &'static str,
) -> &'static metrics::Histogram {
    cell.get_or_init(|| {
        metrics_handle();
        metrics::histogram!(name)
    })
}

pub fn record_pool(store: &Store) {
    let (open, idle) = store.pool_stats();
    metrics::gauge!("fencegate_db_pool_connections", "state" => "open").set(f64::from(open));
    metrics::gauge!("fencegate_db_pool_connections", "state" => "idle").set(idle as f64);
    let in_use = (open as usize).saturating_sub(idle);
    metrics::gauge!("fencegate_db_pool_connections", "state" => "in_use").set(in_use as f64);
}
