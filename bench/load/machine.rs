//! Facts about the machine, PostgreSQL and the code under test, printed above the table so a
//! figure is never read without them.

use std::{collections::BTreeMap, path::Path};

use anyhow::Result;
use sqlx::PgConnection;

pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub mem_gib: f64,
    pub host: String,
    pub kernel: String,
    pub pg_version: String,
    pub synchronous_commit: String,
    pub fsync: String,
    pub shared_buffers: String,
    pub pg_max_connections: String,
    pub pgbench_version: String,
    pub commit: String,
    pub date: String,
    pub load_before: String,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn git_commit() -> String {
    if let Ok(bin) = std::env::var("BENCH_FENCEGATE") {
        // Another build than this tree's: the commit it came from is not known here.
        return format!("(fencegate binary {bin}, BENCH_FENCEGATE)");
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    let Some(head) = command_line("git", &["-C", dir, "rev-parse", "--short=10", "HEAD"]) else {
        return "unknown (no git)".into();
    };
    // The binary under test is built from the working tree: say so if it differs from HEAD.
    match command_line(
        "git",
        &[
            "-C",
            dir,
            "status",
            "--porcelain",
            "--",
            "src",
            "migrations",
            "Cargo.toml",
            "Cargo.lock",
        ],
    ) {
        Some(s) if !s.is_empty() => format!("{head} + uncommitted changes in src/"),
        _ => head,
    }
}

pub async fn machine_facts(admin: &mut PgConnection, pgbench: &Path) -> Result<Machine> {
    let mut fact = BTreeMap::new();
    for name in [
        "server_version",
        "synchronous_commit",
        "fsync",
        "shared_buffers",
        "max_connections",
    ] {
        let v: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?;
        fact.insert(name, v);
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "?".into());
    Ok(Machine {
        nproc: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu,
        mem_gib: mem_kib / 1024.0 / 1024.0,
        host: read_trim("/proc/sys/kernel/hostname"),
        kernel: read_trim("/proc/sys/kernel/osrelease"),
        pg_version: fact["server_version"].clone(),
        synchronous_commit: fact["synchronous_commit"].clone(),
        fsync: fact["fsync"].clone(),
        shared_buffers: fact["shared_buffers"].clone(),
        pg_max_connections: fact["max_connections"].clone(),
        pgbench_version: command_line(pgbench.to_str().unwrap_or("pgbench"), &["--version"])
            .unwrap_or_else(|| "?".into()),
        commit: git_commit(),
        date: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "?".into()),
        load_before: loadavg(),
    })
}

pub fn loadavg() -> String {
    read_trim("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
