//! What a run is asked to do: the environment variables of the crate docs (main.rs).

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};

pub struct Settings {
    pub admin_url: String,
    pub step: Duration,
    pub warmup: Duration,
    pub soak: Duration,
    /// BENCH_ONLY: run only these steps (ids: random1 random16 random64 hot scope mix soak
    /// keyspace). `keyspace` runs only when named here: it loads millions of rows.
    pub only: Option<Vec<String>>,
    /// BENCH_KEYSPACE: the live keys of each size the keyspace step loads, ascending; each
    /// size also gets a tenth as many tombstones.
    pub keyspace: Vec<u64>,
    /// BENCH_SCRAPE_SECONDS: GET /metrics this often during the soak, as Prometheus would.
    pub scrape_every: Option<Duration>,
    pub pgbench: PathBuf,
    /// Scripts, logs and config files of the run (emptied at its start).
    pub out_dir: PathBuf,
    /// BENCH_PROCESSES: fencegate processes serving the one database (default 1), the client
    /// connections dealt round-robin across them, as behind a load balancer (docs/scale-out.md).
    pub processes: usize,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let step = env_secs("BENCH_SECONDS", 10)?;
        let soak = env_secs("BENCH_SOAK_SECONDS", 60)?;
        Ok(Settings {
            admin_url,
            step: Duration::from_secs(step),
            warmup: Duration::from_millis((step * 1000 / 5).clamp(1000, 2000)),
            soak: Duration::from_secs(soak),
            only: std::env::var("BENCH_ONLY").ok().map(|v| {
                v.split([',', ' '])
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            }),
            scrape_every: match std::env::var("BENCH_SCRAPE_SECONDS") {
                Ok(_) => Some(Duration::from_secs(env_secs("BENCH_SCRAPE_SECONDS", 0)?)),
                Err(_) => None,
            },
            keyspace: keyspace_sizes()?,
            pgbench: find_pgbench()?,
            out_dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-load"),
            processes: match std::env::var("BENCH_PROCESSES") {
                Ok(v) => match v.trim().parse::<usize>() {
                    Ok(n @ 1..=16) => n,
                    _ => bail!("BENCH_PROCESSES={v:?}: choose 1..=16 fencegate processes"),
                },
                Err(_) => 1,
            },
        })
    }

    /// Whether step `id` is to run (BENCH_ONLY). The keyspace step only when named: at its
    /// default sizes it loads 11 million rows, several minutes before it measures anything.
    pub fn runs(&self, id: &str) -> bool {
        match &self.only {
            Some(only) => only.iter().any(|o| o == id),
            None => id != "keyspace",
        }
    }
}

/// The most live keys one size may have: 100 M keys (and 10 M tombstones) take about 15 GB
/// of table and index, loaded twice.
const MAX_KEYSPACE: u64 = 100_000_000;

fn keyspace_sizes() -> Result<Vec<u64>> {
    let Ok(v) = std::env::var("BENCH_KEYSPACE") else {
        return Ok(vec![10_000, 100_000, 1_000_000, 10_000_000]);
    };
    let mut sizes = Vec::new();
    for part in v.split([',', ' ']).filter(|s| !s.is_empty()) {
        let n: u64 = part
            .replace('_', "")
            .parse()
            .with_context(|| format!("BENCH_KEYSPACE={v:?}: {part:?} is not a number of keys"))?;
        if !(10..=MAX_KEYSPACE).contains(&n) {
            bail!("BENCH_KEYSPACE={v:?}: choose sizes of 10..={MAX_KEYSPACE} keys");
        }
        sizes.push(n);
    }
    if sizes.is_empty() || !sizes.is_sorted_by(|a, b| a < b) {
        bail!("BENCH_KEYSPACE={v:?}: give one or more sizes, ascending, e.g. 10000,100000,1000000,10000000");
    }
    Ok(sizes)
}

fn env_secs(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => {
            let n: u64 = v
                .trim()
                .parse()
                .with_context(|| format!("{name}={v:?} is not a number of seconds"))?;
            if n == 0 || n > 3600 {
                bail!("{name}={n}: choose 1..=3600 seconds");
            }
            Ok(n)
        }
        Err(_) => Ok(default),
    }
}

/// `tool` in a directory of PATH, if it is there (h2load, haproxy).
pub fn on_path(tool: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

fn find_pgbench() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var("PGBENCH") {
        candidates.push(p.into());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("pgbench")));
    }
    if let Ok(dirs) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = dirs
            .flatten()
            .map(|d| d.path().join("bin/pgbench"))
            .collect();
        versions.sort();
        versions.reverse();
        candidates.extend(versions);
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
    }
    bail!(
        "pgbench not found (looked in $PGBENCH, PATH and /usr/lib/postgresql/*/bin). Install it \
         (Debian/Ubuntu: apt-get install postgresql-client, or postgresql-contrib on older releases) \
         or set PGBENCH=/path/to/pgbench"
    )
}
