//! pgbench's side of every step: the very statement fencegate runs, as pgbench scripts, and
//! a timed pgbench run with its per-transaction latencies.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use sqlx::PgConnection;
use tokio::process::Command;

use crate::{
    database::version_sum, settings::Settings, HOT_KEY, HOT_SCOPE, KEYS, SCOPE_KEYS, VALUE,
};

/// pgbench's token: microseconds since the epoch at the start of the statement. statement_timestamp()
/// is stable within a statement, so both uses of `$4` (key_fence, fence_token) get one value, as
/// they do when fencegate binds one token; and it grows over time, so writes are accepted.
const PGBENCH_TOKEN: &str = "(extract(epoch from statement_timestamp()) * 1000000)::bigint";

// The statement pgbench runs

fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The put statement as pgbench runs it: $1 key -> `:k`, $2 -> the jsonb value, $3 -> false
/// (not a delete), $4 -> the time-based token.
fn pgbench_put(put_key: &str) -> String {
    let sql = one_line(put_key)
        .replace("$1", ":k")
        .replace("$2", &format!("'{VALUE}'::jsonb"))
        .replace("$3", "false")
        .replace("$4", PGBENCH_TOKEN);
    format!("{sql};\n")
}

/// The scoped put as pgbench runs it: the holder's token is `:t` (pgbench `-D t=..`), fixed
/// for the step as it is for the HTTP clients, and the scope is [`HOT_SCOPE`].
fn pgbench_put_scoped(put_scoped: &str) -> String {
    let sql = one_line(put_scoped)
        .replace("$1", ":k")
        .replace("$2", &format!("'{VALUE}'::jsonb"))
        .replace("$3", "false")
        .replace("$4", ":t")
        .replace("$5", &format!("'{HOT_SCOPE}'"));
    format!("{sql};\n")
}

pub struct Scripts {
    /// The put statement as pgbench runs it (`:k` the key), for scripts made later.
    put: String,
    pub random: PathBuf,
    pub hot: PathBuf,
    pub mix: PathBuf,
    pub scope: PathBuf,
}

pub fn pgbench_scripts(put_key: &str, put_scoped: &str, dir: &Path) -> Result<Scripts> {
    let put = pgbench_put(put_key);
    let random = random_script(&put, KEYS, dir)?;
    let hot = dir.join("put_hot.sql");
    std::fs::write(&hot, format!("\\set k {HOT_KEY}\n{put}"))?;
    let mix = dir.join("mix.sql");
    // pgbench would take `:MI` in the to_char format for a variable: spell the colons chr(58),
    // which the planner folds into the same constant once per prepared statement.
    let get = one_line(fencegate::store::KV_GET)
        .replace("HH24:MI:SS", "HH24' || chr(58) || 'MI' || chr(58) || 'SS")
        .replace("$1", ":k");
    std::fs::write(
        &mix,
        format!("\\set k random(1, {KEYS})\n\\set r random(1, 100)\n\\if :r <= 90\n{get};\n\\else\n{put}\\endif\n"),
    )?;
    let scope = dir.join("put_scope.sql");
    std::fs::write(
        &scope,
        format!(
            "\\set k random({}, {})\n{}",
            SCOPE_KEYS + 1,
            SCOPE_KEYS + KEYS,
            pgbench_put_scoped(put_scoped)
        ),
    )?;
    Ok(Scripts {
        put,
        random,
        hot,
        mix,
        scope,
    })
}

/// PUTs on random keys of `1 ..= keys`.
fn random_script(put: &str, keys: u64, dir: &Path) -> Result<PathBuf> {
    let path = match keys {
        KEYS => dir.join("put_random.sql"),
        _ => dir.join(format!("put_random_{keys}.sql")),
    };
    std::fs::write(&path, format!("\\set k random(1, {keys})\n{put}"))?;
    Ok(path)
}

impl Scripts {
    /// The random-key script over `1 ..= keys` (the keyspace step's sizes).
    pub fn random_over(&self, keys: u64, dir: &Path) -> Result<PathBuf> {
        random_script(&self.put, keys, dir)
    }
}

// Running pgbench

pub struct PgRun {
    pub processed: u64,
    pub tps: f64,
    pub failed: u64,
    pub lat: Vec<u32>,
    pub db_applied: i64,
    /// PostgreSQL's CPU per applied write (`pg_cpu`), in µs.
    pub pg_cpu_us: Option<f64>,
}

/// `defines`: pgbench `-D name=value` variables for the script.
#[allow(clippy::too_many_arguments)]
pub async fn pgbench_step(
    s: &Settings,
    label: &str,
    conns: usize,
    script: &Path,
    defines: &[String],
    db_url: &str,
    dur: Duration,
    db: &mut PgConnection,
) -> Result<PgRun> {
    let prefix = format!("pgbench_{label}");
    for entry in std::fs::read_dir(&s.out_dir)?.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{prefix}."))
        {
            std::fs::remove_file(entry.path())?;
        }
    }
    let before = version_sum(db).await?;
    let pg_before = crate::pg_cpu::ticks();
    let out = tokio::time::timeout(
        dur + Duration::from_secs(120),
        Command::new(&s.pgbench)
            .current_dir(&s.out_dir)
            .args(["-M", "prepared", "-n"])
            .args(["-c", &conns.to_string(), "-j", &conns.min(2).to_string()])
            .args(["-T", &dur.as_secs().to_string()])
            .args(["--log", &format!("--log-prefix={prefix}")])
            .args(defines.iter().flat_map(|d| ["-D", d.as_str()]))
            .arg("-f")
            .arg(script)
            .arg(db_url)
            // fencegate's tables are in its own schema; the statements name them unqualified.
            .env(
                "PGOPTIONS",
                format!(
                    "{} -c search_path=fencegate",
                    std::env::var("PGOPTIONS").unwrap_or_default()
                ),
            )
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("pgbench did not finish in time")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || stdout.contains("aborted") {
        bail!("pgbench failed ({}):\n{stdout}\n{stderr}", out.status);
    }
    let db_applied = version_sum(db).await? - before;
    crate::pg_cpu::settle(db).await;
    let pg_cpu_us = crate::pg_cpu::per_write(pg_before, crate::pg_cpu::ticks(), db_applied);
    let number = |marker: &str| -> Option<f64> {
        let line = stdout.lines().find(|l| l.contains(marker))?;
        line.split(marker)
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let processed = number("number of transactions actually processed:")
        .context("pgbench output has no transaction count")? as u64;
    let tps = stdout
        .lines()
        .find(|l| l.starts_with("tps = ") && l.contains("without initial connection time"))
        .and_then(|l| l["tps = ".len()..].split_whitespace().next()?.parse().ok())
        .with_context(|| format!("pgbench output has no tps line:\n{stdout}"))?;
    let failed = number("number of failed transactions:").unwrap_or(0.0) as u64;
    // Per-transaction log: client_id transaction_no time script_no time_epoch time_us [...];
    // `time` is the transaction's latency in µs.
    let mut lat = Vec::with_capacity(processed as usize);
    for entry in std::fs::read_dir(&s.out_dir)?.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{prefix}."))
        {
            continue;
        }
        let text = std::fs::read_to_string(entry.path())?;
        lat.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u32>().ok()),
        );
    }
    if lat.is_empty() {
        bail!(
            "pgbench wrote no per-transaction log lines (prefix {prefix} in {})",
            s.out_dir.display()
        );
    }
    Ok(PgRun {
        processed,
        tps,
        failed,
        lat,
        db_applied,
        pg_cpu_us,
    })
}
