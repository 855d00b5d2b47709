//! What a run is asked to do: the environment variables of the crate docs (main.rs).

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};

pub struct Settings {
    pub admin_url: String,
    pub step: Duration,
    pub warmup: Duration,
    pub soak: Duration,
    /// BENCH_ONLY: run only these steps (ids: random1 random16 random64 hot scope mix soak).
    pub only: Option<Vec<String>>,
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
        let admin_url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let step = env_secs("BENCH_SECONDS", 10)?;
        let soak = env_secs("BENCH_SOAK_SECONDS", 60)?;
        Ok(Settings {
            admin_url,
            step: Duration::from_secs(step),
            warmup: Duration::from_millis((step * 1000 / 5).clamp(1000, 2000)),
            soak: Duration::from_secs(soak),
            only: std::env::var("BENCH_ONLY").ok().map(|v| {
                v.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_owned).collect()
            }),
            scrape_every: match std::env::var("BENCH_SCRAPE_SECONDS") {
                Ok(_) => Some(Duration::from_secs(env_secs("BENCH_SCRAPE_SECONDS", 0)?)),
                Err(_) => None,
            },
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

    /// Whether step `id` is to run (BENCH_ONLY).
    pub fn runs(&self, id: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.iter().any(|o| o == id))
    }
}

fn env_secs(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => {
            let n: u64 = v.trim().parse().with_context(|| format!("{name}={v:?} is not a number of seconds"))?;
            if n == 0 || n > 3600 {
                bail!("{name}={n}: choose 1..=3600 seconds");
            }
            Ok(n)
        }
        Err(_) => Ok(default),
    }
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
        let mut versions: Vec<PathBuf> = dirs.flatten().map(|d| d.path().join("bin/pgbench")).collect();
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
