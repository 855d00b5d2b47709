//! PostgreSQL's CPU time, so that a step can report the whole system's CPU per write
//! (fencegate + PostgreSQL) against PostgreSQL's alone under pgbench.
//!
//! Read from /proc, so only for a server on this machine, readable by this user: the sum of
//! user + system time of every live `postgres` process, plus the postmaster's reaped children
//! (cutime + cstime: backends and autovacuum workers that exited, pgbench's connections
//! included once pgbench ends). A window is [`before`] .. [`settle`] + [`after`]: the settle
//! runs the step's VACUUM and CHECKPOINT inside the window, so each side pays for the dead rows
//! and dirty pages it made, not the next side. `None` when no postmaster is visible (a remote
//! server, or another user's): the report then says so instead of printing a figure.

use sqlx::PgConnection;

/// PostgreSQL's CPU time so far, in clock ticks (1/100 s), or `None` if no postmaster is
/// visible here.
pub fn ticks() -> Option<u64> {
    let mut procs = Vec::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = crate::process::stat(pid) {
            if stat.comm == "postgres" || stat.comm == "postmaster" {
                procs.push((pid, stat.ppid, stat.utime + stat.stime, stat.reaped));
            }
        }
    }
    let pids: std::collections::HashSet<u32> = procs.iter().map(|p| p.0).collect();
    // Postmasters: postgres processes whose parent is not one (one per cluster on the machine).
    let postmasters: Vec<_> = procs.iter().filter(|p| !pids.contains(&p.1)).collect();
    if postmasters.is_empty() {
        return None;
    }
    let live: u64 = procs.iter().map(|p| p.2).sum();
    let reaped: u64 = postmasters.iter().map(|p| p.3).sum();
    Some(live + reaped)
}

/// The deferred work of a step, done inside its window: VACUUM of the table it wrote and a
/// CHECKPOINT (superuser or pg_checkpoint; without it, only the VACUUM), then a moment for the
/// postmaster to reap exited backends.
pub async fn settle(db: &mut PgConnection) {
    let _ = sqlx::raw_sql("VACUUM fencegate.fencegate_kv")
        .execute(&mut *db)
        .await;
    let _ = sqlx::raw_sql("CHECKPOINT").execute(&mut *db).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

/// PostgreSQL's CPU per applied write over a window, in microseconds.
pub fn per_write(before: Option<u64>, after: Option<u64>, applied: i64) -> Option<f64> {
    Some(after?.saturating_sub(before?) as f64 * 10_000.0 / applied.max(1) as f64)
}
