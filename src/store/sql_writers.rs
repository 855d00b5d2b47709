//! What SQL writers ran into, across every process serving the database (PostgreSQL): the
//! refusals of `fencegate.fence()` and of the guard triggers, and the writes guards in audit
//! mode let through. Read once a second by the tick; exported as metrics, logged when they
//! grow, and shown in the console.

use serde::Serialize;

use super::{tables::TableStore as _, Store};

/// Counts since the database was migrated (they survive restarts; metrics are set to them).
#[derive(Debug, Default, Clone, Serialize)]
pub struct SqlSeen {
    /// (kind, count): the HTTP problem type the same refusal gets over HTTP (`stale-token`,
    /// `token-not-issued`, `token-jump`, `scope-has-issuer`, `forbidden`), or `unfenced` for a
    /// guard in enforce mode refusing a write without `fence()`.
    pub refusals: Vec<(&'static str, i64)>,
    /// (resource, writes) guards in audit mode let through, for configured resources only.
    pub unfenced: Vec<(String, i64)>,
}

impl Store {
    /// `fencegate_sql_refusals_total{kind}` and `fencegate_unfenced_writes_total{resource}`,
    /// and a log line for each kind of refusal that grew since the last call (the refusing
    /// transactions' own sessions are not fencegate's: this is where fencegate sees them).
    pub async fn record_sql_writers(&self) {
        let seen = match on_backend!(&self.backend, b => b.sql_writers().await) {
            Ok(seen) => seen,
            Err(err) => {
                tracing::debug!(error = %err, "cannot read what SQL writers ran into");
                return;
            }
        };
        let before = std::mem::replace(
            &mut *self.sql_seen.lock().unwrap_or_else(|e| e.into_inner()),
            seen.clone(),
        );
        for &(kind, count) in &seen.refusals {
            metrics::counter!("fencegate_sql_refusals_total", "kind" => kind)
                .absolute(count as u64);
            // The first reading after start is a baseline, not news.
            if let Some(&(_, was)) = before.refusals.iter().find(|(k, _)| *k == kind) {
                if count > was {
                    tracing::warn!(
                        kind,
                        refused = count - was,
                        total = count,
                        "SQL writers refused (fencegate.fence() or a guard trigger)"
                    );
                }
            }
        }
        for (resource, writes) in seen.unfenced {
            metrics::counter!("fencegate_unfenced_writes_total", "resource" => resource)
                .absolute(writes as u64);
        }
    }

    /// The counts as last read, for the console.
    pub fn sql_seen(&self) -> SqlSeen {
        self.sql_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
