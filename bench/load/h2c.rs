//! The HTTP/2 step (`BENCH_ONLY=h2c`): h2load (Debian `nghttp2-client`) sends PUTs of random
//! keys over 4 connections × 16 streams with prior knowledge (h2c), against pgbench's 64
//! clients running the same statement. The HTTP/1.1 load generator has no HTTP/2; h2load is
//! the standard one. One token for the whole step (drawn from the run's clock, so above every
//! fence the reset left): every write is accepted, as in the random-key steps.

use std::{net::SocketAddr, path::Path, process::Stdio, time::Duration};

use anyhow::{bail, Context, Result};
use sqlx::PgConnection;
use tokio::process::Command;

use crate::{
    database::version_sum,
    load_generator::TOKENS,
    server::{fg_cpu_ticks, CpuTicks},
    KEYS, VALUE,
};

pub const CONNECTIONS: usize = 4;
pub const STREAMS: usize = 16;

pub struct H2Run {
    pub rate: f64,
    /// 2xx responses.
    pub ok: u64,
    pub applied: i64,
    pub non_2xx: u64,
    /// fencegate's CPU time over the measured window.
    pub cpu: CpuTicks,
    pub pg_cpu_us: Option<f64>,
}

/// One timed h2load run against `addr`.
pub async fn h2c_step(
    addr: SocketAddr,
    dur: Duration,
    out_dir: &Path,
    db: &mut PgConnection,
) -> Result<H2Run> {
    let h2load = crate::settings::on_path("h2load")
        .context("the h2c step needs h2load: apt-get install nghttp2-client")?;
    // 5,000 URIs of random keys out of KEYS (an LCG, so every run asks the same keys).
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let uris: Vec<String> = (0..5_000)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            format!("http://{addr}/v1/kv/{}", (x >> 33) % KEYS + 1)
        })
        .collect();
    let (uri_file, body_file) = (out_dir.join("h2c_uris.txt"), out_dir.join("h2c_body.json"));
    std::fs::write(&uri_file, uris.join("\n") + "\n")?;
    std::fs::write(&body_file, VALUE)?;
    let token = TOKENS.next().to_string();
    let run = |secs: u64| {
        let mut cmd = Command::new(&h2load);
        cmd.args([
            "-c",
            &CONNECTIONS.to_string(),
            "-m",
            &STREAMS.to_string(),
            "-t",
            "1",
        ])
        .args(["-D", &secs.to_string()])
        .arg("-i")
        .arg(&uri_file)
        .arg("-d")
        .arg(&body_file)
        .args([
            "-H",
            ":method: PUT",
            "-H",
            "content-type: application/json",
            "-H",
        ])
        .arg(format!("x-fencing-token: {token}"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
        cmd
    };
    // Warm up (connections, caches, the coalescer), then measure.
    run(1).output().await.context("run h2load")?;
    let before = version_sum(db).await?;
    let (cpu_before, pg_before) = (fg_cpu_ticks(), crate::pg_cpu::ticks());
    let out = tokio::time::timeout(
        dur + Duration::from_secs(60),
        run(dur.as_secs().max(1)).output(),
    )
    .await
    .context("h2load did not finish in time")??;
    let cpu_ticks = fg_cpu_ticks() - cpu_before;
    let applied = version_sum(db).await? - before;
    crate::pg_cpu::settle(db).await;
    let pg_cpu_us = crate::pg_cpu::per_write(pg_before, crate::pg_cpu::ticks(), applied);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "h2load failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // "status codes: 123 2xx, 0 3xx, 4 4xx, 0 5xx"
    let codes = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("status codes:"))
        .context("h2load printed no status codes")?;
    let count = |class: &str| -> u64 {
        codes
            .split(',')
            .find(|p| p.contains(class))
            .and_then(|p| p.split_whitespace().rev().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let ok = count("2xx");
    let non_2xx = count("3xx") + count("4xx") + count("5xx");
    Ok(H2Run {
        rate: ok as f64 / dur.as_secs_f64(),
        ok,
        applied,
        non_2xx,
        cpu: cpu_ticks,
        pg_cpu_us,
    })
}
