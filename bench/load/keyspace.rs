//! The keyspace step (issue 19): what a write costs as the keys already stored grow. For each
//! size N of BENCH_KEYSPACE, the table is loaded server-side with N live keys and N/10
//! tombstones, rows exactly as fencegate's own PUTs and DELETEs leave them; then 64
//! connections of random-key PUTs over all N live keys go through fencegate, and pgbench runs
//! the same statement over the same keys. The table of this step says what the database
//! holds per key and how writes/s at each size compare with the smallest size's.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use sqlx::{PgConnection, Row as _};

use crate::{
    database::version_sum,
    load_generator::{fencegate_step, Workload, TOKENS},
    pgbench::{pgbench_step, Scripts},
    report::{errors_cell, fmt_ms, report_fg, report_pg, Lat},
    settings::Settings,
    VALUE,
};

/// Client connections of every size's runs, as in the issue: "writes/s at 64 connections".
const CONNS: usize = 64;
/// The share of the smallest size's fencegate writes/s the largest size must keep (issue 19).
const TARGET: f64 = 0.8;

/// What one size of the keyspace cost and measured.
pub struct Size {
    live: u64,
    tombstones: u64,
    /// The server-side INSERT of every row.
    insert: Duration,
    /// VACUUM ANALYZE and CHECKPOINT after it.
    settle: Duration,
    loaded: Sizes,
    /// The kv table after each run, fencegate's and pgbench's: a write that does not fit on
    /// its row's page moves the row, and the old version stays until a vacuum.
    fg_after: i64,
    pg_after: i64,
    fg_rate: f64,
    fg: Lat,
    fg_errors: String,
    fg_cpu_us: f64,
    fg_db: DbCost,
    pg_rate: f64,
    pg: Lat,
    pg_errors: String,
    pg_db: DbCost,
}

/// Bytes on disk, from PostgreSQL's own size functions.
#[derive(Clone, Copy)]
struct Sizes {
    /// pg_database_size of the bench database (the kv table, the other tables, the catalog).
    database: i64,
    /// pg_total_relation_size('fencegate.fencegate_kv'): heap, TOAST and the primary key index.
    table: i64,
    heap: i64,
    index: i64,
}

async fn sizes(db: &mut PgConnection) -> Result<Sizes> {
    let row = sqlx::query(
        "SELECT pg_database_size(current_database()), pg_total_relation_size('fencegate.fencegate_kv'),
                pg_relation_size('fencegate.fencegate_kv'), pg_indexes_size('fencegate.fencegate_kv')",
    )
    .fetch_one(&mut *db)
    .await?;
    Ok(Sizes {
        database: row.try_get(0)?,
        table: row.try_get(1)?,
        heap: row.try_get(2)?,
        index: row.try_get(3)?,
    })
}

/// Counters read before and after a run, to say where a write's cost went.
struct Counters {
    /// WAL position in bytes: exact.
    wal: i64,
    /// Sum of `version`: the writes applied in between (every one adds exactly 1).
    versions: i64,
    /// pg_stat_wal (PostgreSQL 14 and later): full-page images written to the WAL.
    fpi: Option<i64>,
    /// Buffers PostgreSQL had to find room for in shared_buffers: pages it did not hold (read
    /// from the OS page cache or the disk, or new at the table's end). Unlike
    /// pg_stat_database's block reads, this leaves out most of the bench's own sequential
    /// scans (`version_sum`): a scan of a table bigger than a quarter of shared_buffers reuses a
    /// small ring of buffers.
    buffers_alloc: i64,
    tup_upd: i64,
    tup_hot_upd: i64,
}

/// Backends report their statistics at most once a second, and an idle one within a second:
/// read them this long after a run (or a load) ends, so each run's own are complete.
const STATS_LAG: Duration = Duration::from_millis(1200);

async fn counters(db: &mut PgConnection) -> Result<Counters> {
    tokio::time::sleep(STATS_LAG).await;
    let row = sqlx::query(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8, b.buffers_alloc, t.n_tup_upd, t.n_tup_hot_upd
         FROM pg_stat_bgwriter AS b, pg_stat_user_tables AS t
         WHERE t.relid = 'fencegate.fencegate_kv'::regclass",
    )
    .fetch_one(&mut *db)
    .await?;
    // Absent before PostgreSQL 14; the column is left empty then.
    let fpi = sqlx::query_scalar("SELECT wal_fpi FROM pg_stat_wal")
        .fetch_one(&mut *db)
        .await
        .ok();
    Ok(Counters {
        wal: row.try_get(0)?,
        versions: version_sum(db).await?,
        fpi,
        buffers_alloc: row.try_get(1)?,
        tup_upd: row.try_get(2)?,
        tup_hot_upd: row.try_get(3)?,
    })
}

/// Where the database's share of the writes went between two [`Counters`], per applied write
/// (fencegate's warm-up included). The counters are server-wide: anything else running on the
/// server adds to them.
struct DbCost {
    wal: f64,
    fpi: Option<f64>,
    /// Pages read into shared_buffers (from the OS page cache or the disk).
    misses: f64,
    /// Share of updates that were HOT: the new row version fit on its page, so the index
    /// was not touched.
    hot_pct: f64,
    /// PostgreSQL's CPU per applied write over the run, its VACUUM and CHECKPOINT included
    /// (`pg_cpu`; None: no local server to read): what a write costs the database as the
    /// keyspace grows, for coalesced statements and for pgbench's one row each.
    cpu_us: Option<f64>,
}

/// `cpu_us`: PostgreSQL's CPU per applied write, as the run measured it (`pg_cpu`).
fn db_cost(a: &Counters, b: &Counters, cpu_us: Option<f64>) -> DbCost {
    let writes = (b.versions - a.versions).max(1) as f64;
    let updates = (b.tup_upd - a.tup_upd).max(1) as f64;
    DbCost {
        wal: (b.wal - a.wal) as f64 / writes,
        fpi: a.fpi.zip(b.fpi).map(|(a, b)| (b - a) as f64 / writes),
        misses: (b.buffers_alloc - a.buffers_alloc) as f64 / writes,
        hot_pct: 100.0 * (b.tup_hot_upd - a.tup_hot_upd) as f64 / updates,
        cpu_us,
    }
}

impl DbCost {
    fn fpi_cell(&self) -> String {
        self.fpi
            .map_or_else(|| "–".to_owned(), |f| format!("{f:.2}"))
    }

    fn cpu_cell(&self) -> String {
        self.cpu_us
            .map_or_else(|| "–".to_owned(), |c| format!("{c:.1}"))
    }
}

/// Replaces the table with `live` live keys (`"1"` ..= `"live"`, each written once by an
/// unscoped PUT of [`VALUE`]: version 1) and `live / 10` tombstones (the next keys, each PUT
/// once and then DELETEd: value NULL, deleted, version 2). Key `g` was written with token
/// `base + g`, so key_fence = fence_token = that token, every one below any token the run
/// presents later. One server-side statement; the heap pages are filled to the table's
/// fillfactor, as inserts through fencegate fill them. In key order, so the primary key grows
/// at its right edge: 1.6 times as fast as in generate_series order (1.1 M rows: 5.2 s against
/// 8.5 s) and packed as after a REINDEX (in that other order, leaf pages split half full and
/// the index came out 41 MiB instead of 24).
/// Returns the time of the INSERT, then that of VACUUM ANALYZE and CHECKPOINT.
async fn load(
    db: &mut PgConnection,
    admin: &mut PgConnection,
    live: u64,
) -> Result<(Duration, Duration)> {
    let total = live + live / 10;
    let base = TOKENS.next() - total as i64 - 1;
    let started = Instant::now();
    sqlx::raw_sql("TRUNCATE fencegate.fencegate_kv")
        .execute(&mut *db)
        .await?;
    sqlx::query(
        "INSERT INTO fencegate.fencegate_kv (key, value, deleted, key_fence, fence_token, scope, version)
         SELECT g::text, CASE WHEN g <= $1 THEN $3::jsonb END, g > $1, $4 + g, $4 + g, NULL,
                CASE WHEN g <= $1 THEN 1 ELSE 2 END
         FROM generate_series(1, $2::int8) AS g
         ORDER BY g::text",
    )
    .bind(live as i64)
    .bind(total as i64)
    .bind(VALUE)
    .bind(base)
    .execute(&mut *db)
    .await
    .with_context(|| format!("loading {live} keys and {} tombstones", live / 10))?;
    let insert = started.elapsed();
    let started = Instant::now();
    sqlx::raw_sql("VACUUM ANALYZE fencegate.fencegate_kv")
        .execute(&mut *db)
        .await?;
    // Superuser (or pg_checkpoint) only; without it the runs start with the load's dirty pages.
    let _ = sqlx::raw_sql("CHECKPOINT").execute(&mut *admin).await;
    Ok((insert, started.elapsed()))
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// 10k, 1M, 1.5M: a size in a step's name.
fn short(n: u64) -> String {
    match n {
        1_000_000.. => format!("{}M", n as f64 / 1e6),
        1_000.. => format!("{}k", n as f64 / 1e3),
        _ => n.to_string(),
    }
}

fn print_db(c: &DbCost) {
    println!(
        "             database per write: WAL {:.0} B, full-page images {}, pages read into shared_buffers {:.2}; HOT updates {:.1}%; PostgreSQL CPU {} µs",
        c.wal,
        c.fpi_cell(),
        c.misses,
        c.hot_pct,
        c.cpu_cell()
    );
}

/// Every size of BENCH_KEYSPACE in turn: load, fencegate's run, the same load again,
/// pgbench's run.
pub async fn measure(
    s: &Settings,
    addrs: &[SocketAddr],
    db_url: &str,
    db: &mut PgConnection,
    admin: &mut PgConnection,
    scripts: &Scripts,
) -> Result<Vec<Size>> {
    let mut out = Vec::new();
    for &live in &s.keyspace {
        let tombstones = live / 10;
        println!(
            "keyspace: loading {} live keys and {} tombstones",
            thousands(live),
            thousands(tombstones)
        );
        let (insert, settled) = load(db, admin, live).await?;
        let loaded = sizes(db).await?;
        println!(
            "  loaded in {:.1} s (+{:.1} s VACUUM ANALYZE, CHECKPOINT): table {:.1} MiB (heap {:.1}, index {:.1}), {:.0} bytes per key; database {:.1} MiB",
            insert.as_secs_f64(),
            settled.as_secs_f64(),
            mib(loaded.table),
            mib(loaded.heap),
            mib(loaded.index),
            loaded.table as f64 / (live + tombstones) as f64,
            mib(loaded.database),
        );
        let name = short(live);
        let before = counters(db).await?;
        let r =
            fencegate_step(addrs, CONNS, Workload::Random { keys: live }, s, s.step, db).await?;
        let fg_db = db_cost(&before, &counters(db).await?, r.pg_cpu_us);
        let (fg_rate, fg) = report_fg(&name, CONNS, &r);
        print_db(&fg_db);
        let fg_cpu_us = r.cpu_ticks.per(r.stats.put_ok).0;
        let fg_after = sizes(db).await?.table;
        // Reloaded, not just vacuumed: fencegate's run left dead row versions (and, where an
        // update was not HOT, rows moved off their pages), and pgbench would find the room.
        let (again, _) = load(db, admin, live).await?;
        println!("  reloaded in {:.1} s for pgbench", again.as_secs_f64());
        let script = scripts.random_over(live, &s.out_dir)?;
        let before = counters(db).await?;
        let p = pgbench_step(
            s,
            &format!("keyspace_{live}"),
            CONNS,
            &script,
            &[],
            db_url,
            s.step,
            db,
        )
        .await?;
        let pg_db = db_cost(&before, &counters(db).await?, p.pg_cpu_us);
        let (pg_rate, pg, pg_errors) = report_pg(&name, CONNS, &p, true);
        print_db(&pg_db);
        println!(
            "  ratio      fencegate/pgbench: ok/s {:.2}×\n",
            fg_rate / pg_rate
        );
        out.push(Size {
            live,
            tombstones,
            insert,
            settle: settled,
            loaded,
            fg_after,
            pg_after: sizes(db).await?.table,
            fg_rate,
            fg,
            fg_errors: errors_cell(&r.stats),
            fg_cpu_us,
            fg_db,
            pg_rate,
            pg,
            pg_errors,
            pg_db,
        });
    }
    Ok(out)
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Settings of the server that decide what a big keyspace costs, printed with the table.
pub async fn server_facts(admin: &mut PgConnection) -> Result<String> {
    let mut facts = Vec::new();
    for name in [
        "shared_buffers",
        "max_wal_size",
        "checkpoint_timeout",
        "wal_compression",
        "full_page_writes",
        "autovacuum",
    ] {
        let v: String = sqlx::query_scalar("SELECT current_setting($1)")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?;
        facts.push(format!("{name}={v}"));
    }
    Ok(facts.join(", "))
}

/// The markdown tables of the keyspace step: the figures, then where the database's work went.
pub fn table(s: &Settings, server: &str, sizes: &[Size]) -> String {
    let Some(first) = sizes.first() else {
        return String::new();
    };
    let mut t = String::new();
    let _ = writeln!(
        t,
        "#### Keyspace: {CONNS} connections of random-key PUTs over N live keys (+ N/10 tombstones), {} s per run",
        s.step.as_secs()
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "Each size loaded server-side (INSERT .. SELECT generate_series, in key order), then VACUUM ANALYZE and CHECKPOINT; \
         fencegate runs first, then the same load again, then pgbench. PostgreSQL: {server}.  "
    );
    let _ = writeln!(
        t,
        "bytes/key: the kv table (heap and primary key index) after loading, over live keys and tombstones. \
         CPU µs/write: fencegate's own CPU time per 2xx."
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "| keys (live + tombstones) | load s (+vacuum, checkpoint) | table MiB (heap + index) | bytes/key | database MiB | \
         fencegate ok/s | vs {} keys | p50 ms | p99 ms | 412 / other / transport | CPU µs/write | \
         pgbench ok/s | vs {} keys | p99 ms | stale / failed | **ok/s fg÷pg** |",
        thousands(first.live),
        thousands(first.live)
    );
    let _ = writeln!(
        t,
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
    );
    for z in sizes {
        let _ = writeln!(
            t,
            "| {} + {} | {:.1} (+{:.1}) | {:.0} ({:.0} + {:.0}) | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {} | {} | **{:.2}×** |",
            thousands(z.live),
            thousands(z.tombstones),
            z.insert.as_secs_f64(),
            z.settle.as_secs_f64(),
            mib(z.loaded.table),
            mib(z.loaded.heap),
            mib(z.loaded.index),
            z.loaded.table as f64 / (z.live + z.tombstones) as f64,
            mib(z.loaded.database),
            z.fg_rate,
            z.fg_rate / first.fg_rate,
            fmt_ms(z.fg.p50),
            fmt_ms(z.fg.p99),
            z.fg_errors,
            z.fg_cpu_us,
            z.pg_rate,
            z.pg_rate / first.pg_rate,
            fmt_ms(z.pg.p99),
            z.pg_errors,
            z.fg_rate / z.pg_rate,
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "Where the database's work went, per applied write, fencegate / pgbench (server-wide counters over each run, \
         fencegate's warm-up included): WAL bytes, full-page images (the first change of a page after a checkpoint \
         logs the whole 8 KiB page), pages read into shared_buffers (from the OS page cache or the disk), and the \
         share of HOT updates (the new row version fit on its page, so the index was not touched), and PostgreSQL's \
         CPU per applied write (its processes' user + system time over the run, the run's VACUUM and CHECKPOINT included)."
    );
    let _ = writeln!(t);
    let _ = writeln!(t, "| keys | WAL B/write | full-page images/write | pages read/write | HOT updates % | table MiB after the run | PostgreSQL CPU µs/write |");
    let _ = writeln!(t, "|--:|--:|--:|--:|--:|--:|--:|");
    for z in sizes {
        let _ = writeln!(
            t,
            "| {} | {:.0} / {:.0} | {} / {} | {:.2} / {:.2} | {:.0} / {:.0} | {:.1} / {:.1} | {} / {} |",
            thousands(z.live),
            z.fg_db.wal,
            z.pg_db.wal,
            z.fg_db.fpi_cell(),
            z.pg_db.fpi_cell(),
            z.fg_db.misses,
            z.pg_db.misses,
            z.fg_db.hot_pct,
            z.pg_db.hot_pct,
            mib(z.fg_after),
            mib(z.pg_after),
            z.fg_db.cpu_cell(),
            z.pg_db.cpu_cell(),
        );
    }
    if let Some(last) = sizes.last().filter(|_| sizes.len() > 1) {
        let share = last.fg_rate / first.fg_rate;
        let _ = writeln!(
            t,
            "\nfencegate writes/s at {} keys: {share:.2} of the figure at {} keys (target: at least {TARGET:.2}): **{}**.",
            thousands(last.live),
            thousands(first.live),
            if share >= TARGET { "met" } else { "not met" }
        );
        // The database's throughput falls with the keyspace whoever sends the writes, so the
        // comparison that isolates fencegate is its ratio to pgbench at each size.
        let (small, large) = (first.fg_rate / first.pg_rate, last.fg_rate / last.pg_rate);
        let _ = writeln!(
            t,
            "fencegate ÷ pgbench at {} keys: {large:.2}× against {small:.2}× at {} keys (target: at least the same): **{}**.",
            thousands(last.live),
            thousands(first.live),
            if large >= small { "met" } else { "not met" }
        );
    }
    t
}
