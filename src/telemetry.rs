//! Logs (tracing) and metrics (Prometheus). Labels are bounded: route templates, method names
//! from a fixed set, status codes, outcomes; never a key, scope or raw path.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::{config::LogSettings, store::Store};

/// Installs the global tracing subscriber (once; later calls are no-ops, so tests may call it).
pub fn init_logging(settings: &LogSettings) {
    use tracing_subscriber::{fmt, EnvFilter};
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.filter));
    // Colour codes only for a terminal: in a log file or journal they are noise, and styling
    // every span's fields cost ~6% of a lone PUT's instructions (callgrind, bench/RESULTS.md).
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

pub fn record_pool(store: &Store) {
    let (open, idle) = store.pool_stats();
    metrics::gauge!("fencegate_db_pool_connections", "state" => "open").set(f64::from(open));
    metrics::gauge!("fencegate_db_pool_connections", "state" => "idle").set(idle as f64);
    let in_use = (open as usize).saturating_sub(idle);
    metrics::gauge!("fencegate_db_pool_connections", "state" => "in_use").set(in_use as f64);
}
