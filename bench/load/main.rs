//! `cargo bench --bench load`: fenced writes per second through fencegate versus the same
//! upsert sent straight to PostgreSQL by pgbench, on one machine, in one run.
//!
//! What it does (bench/README.md explains every figure):
//! 1. creates a fresh database on the server in `DATABASE_URL` (an admin URL; default
//!    `postgres://postgres@127.0.0.1:5432/postgres`) and starts the real fencegate binary on it;
//! 2. for each step, resets the table to 10 000 live keys, then drives fencegate with N tokio
//!    tasks, each on ONE keep-alive HTTP/1.1 connection (hyper, no pool in between), doing
//!    `PUT /v1/kv/{key}` with a token from a global, increasing counter;
//! 3. runs pgbench with the identical fenced statement (`fencegate::store::kv_put_sql`, the
//!    function the store itself builds it with) at the same concurrency against the same database;
//! 4. adds a hot-key run, a hot-scope run (one lock holder, one token, random keys; pgbench runs
//!    the scoped statement with the same fixed token), a 90% GET / 10% PUT mix and an RSS soak,
//!    and prints one markdown table;
//! 5. only when BENCH_ONLY names it, the keyspace step (`keyspace`): for each size of
//!    BENCH_KEYSPACE, the table loaded server-side with N live keys and N/10 tombstones, then
//!    64 connections of random-key PUTs over all N keys, through fencegate and through pgbench.
//!
//! Environment: `DATABASE_URL` (admin URL), `BENCH_SECONDS` (per step, default 10),
//! `BENCH_SOAK_SECONDS` (default 60), `PGBENCH` (path to pgbench; default: PATH, then
//! /usr/lib/postgresql/*/bin), `BENCH_AUTH=1` (fencegate with one API key configured, and every
//! request sending it: the cost of authentication), `BENCH_ISSUER=1` (an Ed25519 `[[issuers]]`
//! entry for every scope; the hot-scope step's writes send their proof: the cost of proofs),
//! `BENCH_PROCESSES=N` (default 1: N fencegate processes on the one database, the client
//! connections dealt round-robin across them, as behind a load balancer; docs/scale-out.md),
//! `BENCH_KEYSPACE` (the keyspace step's sizes, default `10000,100000,1000000,10000000`).
//!
//! The modules, in the order a run uses them: `settings` (the environment), `machine` (facts
//! printed with the table), `database` (admin connection, table reset), `pgbench` (its scripts
//! and runs), `relay` (pgbench through a byte-copying relay: the floor of one more hop),
//! `server` (fencegate, the process under test), `load_generator` (the HTTP clients),
//! `steps` (the sequence of measured steps and the soak), `keyspace` (the keyspace step, its
//! loading and its tables), `report` (figures and the table).

mod database;
mod h2c;
mod keyspace;
mod load_generator;
mod machine;
mod pg_cpu;
mod pgbench;
#[path = "../support/process.rs"]
mod process;
mod relay;
mod report;
mod server;
mod settings;
mod steps;

// One copy of the URL helper, shared with the test binaries.
#[path = "../../tests/support/db_url.rs"]
mod db_url;
// PgBouncer in front of fencegate's database (BENCH_PGBOUNCER), as the pooler tests start it.
#[path = "../../tests/support/pgbouncer.rs"]
mod pgbouncer;
#[path = "../../tests/support/postgres.rs"]
mod support_pg;

use std::time::Duration;

use anyhow::{Context, Result};
use fencegate::redact::redact_url;
use sqlx::{Connection, PgConnection};

use crate::{
    database::connect_admin,
    machine::{machine_facts, Machine},
    pgbench::pgbench_scripts,
    server::{rss_kib, start_fencegate, stop_fencegate},
    settings::Settings,
    steps::measure,
};

/// Keys written by the random-key steps: `1` ..= `KEYS`, as decimal strings (pgbench's `:k`).
const KEYS: u64 = 10_000;
/// The hot key of the hot-key steps.
const HOT_KEY: u64 = 1;
/// The scope of the hot-scope step: one lock whose holder writes random keys from many tasks.
const HOT_SCOPE: &str = "bench-lock";
/// The hot-scope step writes keys of its own (`SCOPE_KEYS + 1 ..= SCOPE_KEYS + KEYS`): a key
/// the unscoped steps wrote is bound to no scope (sticky scope), so a scoped write of it is a
/// 409, on both sides.
const SCOPE_KEYS: u64 = 1_000_000;
/// The value every PUT writes, as the HTTP body and as pgbench's jsonb literal.
const VALUE: &str = r#"{"n": 42, "by": "bench"}"#;
/// Per-request bound; a request that takes longer counts as a transport error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Per-task bound on requests in one phase, beside the time bound.
const MAX_REQUESTS_PER_TASK: u64 = 5_000_000;

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: do nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("bench/load/main.rs: run it with `cargo bench --bench load`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("\nload bench FAILED: {err:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let s = Settings::from_env()?;
    let _ = std::fs::remove_dir_all(&s.out_dir);
    std::fs::create_dir_all(&s.out_dir)?;

    let mut admin = connect_admin(&s.admin_url).await?;
    let machine = machine_facts(&mut admin, &s.pgbench).await?;
    let db_name = format!("fencegate_bench_{}", std::process::id());
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db_name}"))
        .execute(&mut admin)
        .await?;
    sqlx::raw_sql(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await
        .with_context(|| {
            format!(
                "CREATE DATABASE {db_name} on {} (the DATABASE_URL role needs CREATEDB)",
                redact_url(&s.admin_url)
            )
        })?;
    let db_url = db_url::with_database(&s.admin_url, &db_name);

    let result = run_on(&s, &machine, &db_url, &mut admin).await;

    // Always clean up the database, also after a failure.
    if let Err(e) = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db_name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
    {
        eprintln!("warning: could not drop database {db_name}: {e}");
    }
    result
}

async fn run_on(s: &Settings, m: &Machine, db_url: &str, admin: &mut PgConnection) -> Result<()> {
    // The very statement fencegate runs for an unscoped PUT (kv.strict = false).
    // The checks of fencegate's configuration for this run (BENCH_TRUST: sticky scope, jump cap).
    let checks = server::kv_settings().checks();
    let put_key = fencegate::store::kv_put_sql(fencegate::fence::Rule::Inclusive, &checks);
    let put_scoped =
        fencegate::store::kv_put_scoped_sql(fencegate::fence::Rule::Inclusive, &checks);
    let scripts = pgbench_scripts(&put_key, &put_scoped, &s.out_dir)?;

    println!(
        "fencegate load bench: {} s per step (+{:.1} s warm-up for fencegate), soak {} s",
        s.step.as_secs(),
        s.warmup.as_secs_f64(),
        s.soak.as_secs()
    );
    println!("  binary   {}", server::fencegate_binary());
    println!("  pgbench  {} ({})", s.pgbench.display(), m.pgbench_version);
    println!("  database {}", redact_url(db_url));
    println!(
        "  pgbench statement (fencegate::store::kv_put_sql):\n    {}",
        std::fs::read_to_string(&scripts.random)?
            .trim()
            .replace('\n', "\n    ")
    );
    println!("  files    {}", s.out_dir.display());

    // BENCH_PGBOUNCER=transaction|session: fencegate (not pgbench) goes through PgBouncer 1.18
    // with default_pool_size 16 (fencegate's pool size), to measure what the pooler costs.
    let bouncer = server::pgbouncer();
    let fg_url = bouncer
        .as_ref()
        .map_or(db_url.to_owned(), |b| b.url(db_url));
    if let Some(b) = &bouncer {
        println!(
            "  pgbouncer 127.0.0.1:{} in front of fencegate (BENCH_PGBOUNCER)",
            b.port
        );
    }
    let fg = start_fencegate(&fg_url, &s.out_dir, 0).await?;
    println!("  fencegate pid {} listening on {}", fg.pid, fg.addr);
    let mut more = Vec::new();
    for i in 1..s.processes {
        let other = start_fencegate(&fg_url, &s.out_dir, i).await?;
        println!(
            "  fencegate pid {} listening on {} (BENCH_PROCESSES)",
            other.pid, other.addr
        );
        more.push(other);
    }
    let addrs: Vec<std::net::SocketAddr> = std::iter::once(fg.addr)
        .chain(more.iter().map(|f| f.addr))
        .collect();
    let mut db = PgConnection::connect(db_url)
        .await
        .context("connecting to the bench database")?;

    let mut outcome = measure(s, &fg, &addrs, db_url, &mut db, admin, &scripts).await;
    let mut sizes = Vec::new();
    if outcome.is_ok() && s.runs("keyspace") {
        match keyspace::measure(s, &addrs, db_url, &mut db, admin, &scripts).await {
            Ok(measured) => sizes = measured,
            Err(e) => outcome = Err(e),
        }
    }
    let (_, hwm_end) = rss_kib(fg.pid);
    stop_fencegate(fg).await;
    for other in more {
        stop_fencegate(other).await;
    }
    let (rows, h2c, soak) = outcome?;
    let keyspace_table = match sizes.is_empty() {
        true => String::new(),
        false => keyspace::table(s, &keyspace::server_facts(admin).await?, &sizes),
    };

    let table = report::table(
        s,
        m,
        &rows,
        h2c.as_ref(),
        &keyspace_table,
        soak.as_ref(),
        hwm_end,
    );
    println!("\n{table}");
    Ok(())
}
