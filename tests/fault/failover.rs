//! A PostgreSQL failover (issue 17): fences survive it with synchronous replication, and the
//! same checker catches the acknowledged fences an asynchronous one loses.
//!
//! The scenario: a primary and a standby made with `pg_basebackup -R`, the standby streaming
//! through a proxy (`link`); two `fencegate serve` processes reaching the primary through a
//! second proxy (the clients' route: HAProxy, a DNS name); a third started directly against
//! the standby before anything was migrated (it must start, answer `/readyz` 503 "in
//! recovery", and become ready once the standby is promoted). Workers increment the counter
//! under the built-in lock while the nemesis freezes lock holders (zombies). Then:
//! 1. the standby falls behind: the replication link stalls for `LAG` (with synchronous
//!    replication commits now wait, and requests answer 503 after the request timeout; with
//!    asynchronous replication the primary goes on acknowledging);
//! 2. `pg_ctl stop -m immediate` on the primary (the replication link is cut with it);
//! 3. `/readyz` on the proxied processes must be 503;
//! 4. the clients' proxy switches to the standby a second BEFORE it is promoted (writes then
//!    reach a server in recovery: 503, never 500; `/readyz` says "in recovery"), then
//!    `pg_ctl promote`;
//! 5. the time from the promotion until each process is ready again, then the run goes on, and the checker judges
//!    it all (no acknowledged write lost, no lost update, no stale write accepted, readiness
//!    back, writes acknowledged again after the failover).
//!
//! Synchronous: no violation. Asynchronous (the negative control): the checker must find the
//! lost acknowledged writes, else it is blind to what the synchronous run is said to prevent.
//!
//! Settings: main.rs's `FAULT_WORKERS`, `FAULT_LEASE_MS`, `FAULT_SEED`, `FAULT_CLIENT_TIMEOUT_MS`,
//! `FAULT_REQUEST_TIMEOUT_MS`, `FAULT_RECOVERY_MS`, `FAULT_QUIET_SECONDS` and `FAULT_KEEP` apply;
//! the schedule itself is fixed (about 20 s per run, two runs).
//!
//! A delayed standby (`recovery_min_apply_delay`) alone would not do for the control: on
//! promotion, PostgreSQL applies all the WAL the standby has received before it ends recovery,
//! delay or not (measured with PostgreSQL 15). What loses acknowledged commits is WAL the
//! standby never received, so the control's standby lags on the network instead.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::cluster::{free_port, Replicated};
use crate::history::now_us;
use crate::nemesis::{self, stamp, Fault, FaultKind, NemesisLog, Probe, Recovery};
use crate::node::Node;
use crate::proxy::Proxy;
use crate::{
    checker, read_final_state, read_histories, spawn_worker, stop_workers, worker, worker_refs,
    Config, Job,
};

/// How long before the failover the workers run undisturbed but for pauses.
const BEFORE: Duration = Duration::from_secs(4);
/// How long the standby falls behind before the primary crashes.
const LAG: Duration = Duration::from_millis(2500);
/// How long the clients' route leads to the standby before it is promoted.
const MISROUTED: Duration = Duration::from_millis(1000);
/// How long the run goes on after the failover.
const AFTER: Duration = Duration::from_secs(6);

/// What a failover run measured, for the summary and the assertions.
pub struct Outcome {
    pub synchronous: bool,
    pub report: checker::Report,
    /// Writes acknowledged (logical: retries of one write count once).
    pub acknowledged: usize,
    /// Acknowledged increments missing from the final counter (at least this many were lost).
    pub lost: i64,
    /// Per process: ms from the standby's promotion until `/readyz` 200.
    pub ready_ms: Vec<(String, Option<f64>)>,
    pub runtime: Duration,
}

/// `/readyz` once: status, whether it carries Retry-After, and its body's `detail` (or the
/// error).
async fn readyz_detail(client: &reqwest::Client, url: &str) -> (Option<u16>, bool, String) {
    match client.get(format!("{url}/readyz")).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let retry_after = resp.headers().contains_key(reqwest::header::RETRY_AFTER);
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            (
                Some(status),
                retry_after,
                body["detail"].as_str().unwrap_or_default().to_string(),
            )
        }
        Err(e) => (None, false, e.to_string()),
    }
}

/// `/readyz` on each node while its database is unreachable or a standby: probes that must be
/// 503 (the checker judges them), each with its `detail` (or error).
async fn probe_readyz(client: &reqwest::Client, nodes: &[Node]) -> Vec<(Probe, String)> {
    let mut probes = Vec::new();
    for node in nodes {
        let (t_us, started) = (now_us(), Instant::now());
        let (status, retry_after, detail) = readyz_detail(client, &node.url).await;
        let probe = Probe {
            t_us,
            node: node.name.clone(),
            during: FaultKind::Failover,
            must_be_503: true,
            status,
            retry_after,
            error: status.is_none().then(|| detail.clone()),
            latency_ms: started.elapsed().as_secs_f64() * 1000.0,
        };
        probes.push((probe, detail));
    }
    probes
}

/// The `fencegate_replication_synchronous` sample of a process's `/metrics`, once it is there
/// (the check runs at start, on its own task).
async fn sync_gauge(client: &reqwest::Client, url: &str) -> Option<String> {
    for _ in 0..50 {
        if let Ok(resp) = client.get(format!("{url}/metrics")).send().await {
            let text = resp.text().await.unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.starts_with("fencegate_replication_synchronous "))
            {
                return Some(line.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

pub async fn run(cfg: &Config, synchronous: bool, t0: u64) -> Outcome {
    let began = Instant::now();
    let mode = if synchronous {
        "synchronous"
    } else {
        "ASYNCHRONOUS (negative control)"
    };
    let say = |msg: &str| println!("[{}] failover ({mode}): {msg}", stamp(t0, now_us()));
    let root = tempfile::Builder::new()
        .prefix("fencegate-failover-")
        .tempdir()
        .expect("create a scratch directory")
        .keep();
    let pair = Replicated::create(&root, cfg.keep, synchronous).await;
    say(&format!(
        "primary on :{}, standby on :{} streaming {mode} through a proxy; scratch {}",
        pair.primary.port,
        pair.standby.port,
        root.display()
    ));
    let route = Proxy::start(([127, 0, 0, 1], pair.primary.port).into()).await;
    let config = root.join("fencegate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nrequest_timeout_ms = {}\nshutdown_grace_ms = 1000\n",
            cfg.request_timeout_ms
        ),
    )
    .expect("write the fencegate config");
    let db = |port: u16| format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    let client = nemesis::probe_client();

    // Started against the standby before anything is migrated: it must start anyway.
    let mut on_standby = Node::new(
        2,
        free_port(),
        false,
        db(pair.standby.port),
        config.clone(),
        root.join("s0.log"),
    );
    on_standby.name = "s0".into();
    if let Err(e) = on_standby.start().await {
        panic!("fencegate did not start against a standby: {e}");
    }
    match readyz_detail(&client, &on_standby.url).await {
        (Some(503), true, detail) if detail.contains("in recovery") => {
            say(&format!("s0 started against the standby: /readyz 503 \"{detail}\""))
        }
        other => problems.push((
            "4-readyz",
            format!(
                "s0 against a standby: /readyz answered {other:?}, expected 503 saying the database is in recovery"
            ),
        )),
    }
    // A write that reaches it anyway (nothing is migrated there yet) is 503, never 500.
    let write = client
        .put(format!("{}/v1/kv/not-yet", on_standby.url))
        .header("X-Fencing-Token", "1")
        .json(&serde_json::json!(1))
        .send()
        .await;
    match write.as_ref().map(|r| (r.status().as_u16(), r.headers().contains_key(reqwest::header::RETRY_AFTER))) {
        Ok((503, true)) => say("a write sent to s0 anyway: 503 + Retry-After"),
        other => problems.push((
            "4-no-500",
            format!("a write to s0 against an unmigrated standby answered {other:?}, expected 503 + Retry-After"),
        )),
    }

    let mut nodes: Vec<Node> = (0..2)
        .map(|i| {
            Node::new(
                i,
                free_port(),
                true,
                db(route.port),
                config.clone(),
                root.join(format!("n{i}.log")),
            )
        })
        .collect();
    for node in &mut nodes {
        node.start().await.unwrap_or_else(|e| panic!("{e}"));
    }
    let want = if synchronous {
        "fencegate_replication_synchronous 1"
    } else {
        "fencegate_replication_synchronous 0"
    };
    match sync_gauge(&client, &nodes[0].url).await {
        Some(line) if line == want => say(&format!(
            "n0, n1 up through the clients' proxy; n0 reports `{line}`"
        )),
        other => problems.push((
            "replication-gauge",
            format!("n0 reports {other:?}, expected `{want}`"),
        )),
    }

    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let start_us = now_us();
    let end_us =
        start_us + (BEFORE + LAG + MISROUTED + AFTER + Duration::from_secs(2)).as_micros() as u64;
    let job = Job {
        prefix: if synchronous { "fs" } else { "fa" },
        key: worker::KEY,
        lock: worker::LOCK,
        unfenced: false,
        stop_file: root.join("workers.stop"),
        hard_deadline_us: end_us + 120 * 1_000_000,
    };
    let mut workers: Vec<_> = (1..=cfg.workers)
        .map(|i| spawn_worker(i, cfg, &root, &urls, &job))
        .collect();
    let refs = worker_refs(&workers);
    let log = Mutex::new(NemesisLog::default());
    let settings = nemesis::Settings {
        kinds: Vec::new(),
        pauses: true,
        db_url: pair.standby.url(),
        lease_ms: cfg.lease_ms,
        fault_end_us: end_us,
        t0_us: t0,
        recovery_limit: Duration::from_millis(cfg.recovery_ms),
    };
    let pauses = nemesis::pause_loop(
        &refs,
        &settings,
        &log,
        rand::SeedableRng::seed_from_u64(cfg.seed ^ 0xfa11),
    );
    let failover = async {
        tokio::time::sleep(BEFORE).await;
        pair.link.stall();
        say(&format!(
            "the standby falls behind: replication link stalled for {} ms",
            LAG.as_millis()
        ));
        tokio::time::sleep(LAG).await;
        let fault_start = now_us();
        if let Err(e) = pair.primary.crash().await {
            panic!("could not crash the primary: {e}");
        }
        pair.link.cut();
        say("primary crashed (pg_ctl stop -m immediate)");
        let mut probes = Vec::new();
        for (probe, detail) in probe_readyz(&client, &nodes).await {
            say(&format!(
                "  /readyz on {} with the primary gone: {:?} {detail}",
                probe.node, probe.status
            ));
            probes.push(probe);
        }
        // The route reaches the standby before its promotion (a health check or a DNS change
        // ahead of it): writes reach a server in recovery and must be 503 (25006), never 500,
        // and the connections they used must not stay in the pools.
        route.switch(([127, 0, 0, 1], pair.standby.port).into());
        say(&format!(
            "clients' proxy switched to the standby BEFORE its promotion, for {} ms",
            MISROUTED.as_millis()
        ));
        tokio::time::sleep(MISROUTED).await;
        let mut misrouted = Vec::new();
        for (probe, detail) in probe_readyz(&client, &nodes).await {
            say(&format!(
                "  /readyz on {} routed to the standby: {:?} \"{detail}\"",
                probe.node, probe.status
            ));
            if !detail.contains("in recovery") {
                misrouted.push(format!(
                    "{}: /readyz routed to a standby answered {:?} {detail:?}",
                    probe.node, probe.status
                ));
            }
            probes.push(probe);
        }
        let promoting = Instant::now();
        if let Err(e) = pair.promote().await {
            panic!("could not promote the standby: {e}");
        }
        let back = Instant::now();
        say(&format!(
            "standby promoted (pg_ctl promote took {} ms)",
            back.duration_since(promoting).as_millis()
        ));
        let fault = Fault {
            kind: FaultKind::Failover,
            target: "primary->standby".into(),
            start_us: fault_start,
            end_us: now_us(),
            held_token: None,
        };
        let limit = Duration::from_millis(cfg.recovery_ms) * 3;
        let mut recoveries = Vec::new();
        for node in nodes.iter().chain([&on_standby]) {
            let ms = loop {
                if let (Some(200), ..) = readyz_detail(&client, &node.url).await {
                    break Some(back.elapsed().as_secs_f64() * 1000.0);
                }
                if back.elapsed() > limit {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            say(&format!(
                "  {} ready {}",
                node.name,
                ms.map_or("NEVER".into(), |ms| format!(
                    "{ms:.0} ms after the promotion"
                ))
            ));
            recoveries.push(Recovery {
                after: FaultKind::Failover,
                node: node.name.clone(),
                ms,
            });
        }
        let mut log = log.lock().unwrap();
        log.violations
            .extend(misrouted.into_iter().map(|m| ("4-readyz", m)));
        log.faults.push(fault);
        log.probes.extend(probes);
        log.recoveries.extend(recoveries);
    };
    tokio::join!(pauses, failover);
    let healed_us = now_us();
    say(&format!(
        "failover over; {} s of quiet running",
        cfg.quiet_secs
    ));
    tokio::time::sleep(Duration::from_secs(cfg.quiet_secs)).await;
    problems.extend(stop_workers(&mut workers, &job.stop_file).await);

    let mut all = nodes;
    all.push(on_standby);
    for node in &mut all {
        if let Err(e) = node.check_alive() {
            problems.push(("4-process", e));
        }
    }
    let final_state = read_final_state(&all, &pair.standby.url(), job.key, job.lock)
        .await
        .unwrap_or_else(|e| {
            problems.push(("2-final", format!("cannot read the final state: {e}")));
            checker::FinalState::default()
        });
    match nemesis::leaked_transactions(&pair.standby.url()).await {
        Ok(leaks) if !leaks.is_empty() => problems.push(("5-leaked-transaction", leaks.join("; "))),
        Ok(_) => {}
        Err(e) => problems.push((
            "5-leaked-transaction",
            format!("cannot query pg_stat_activity: {e}"),
        )),
    }
    let events = read_histories(&workers, &mut problems);
    let log = log.into_inner().unwrap();
    let ready_ms = log
        .recoveries
        .iter()
        .map(|r| (r.node.clone(), r.ms))
        .collect();
    let report = checker::check(&checker::Input {
        events: &events,
        nemesis: &log,
        final_state: &final_state,
        external: &problems,
        healed_us,
        recovery_limit_ms: cfg.recovery_ms as f64,
        t0_us: t0,
    });
    let acknowledged = acknowledged_writes(&events);
    let final_value = final_state.sql.and_then(|(value, ..)| value).unwrap_or(0);
    if !report.violations.is_empty() && synchronous {
        for node in &all {
            println!("\n-- {} log (tail) --\n{}", node.name, node.log_tail(12));
        }
    }
    for node in &mut all {
        node.kill().await;
    }
    pair.standby.stop().await;
    drop(route);
    Outcome {
        synchronous,
        report,
        acknowledged,
        lost: (acknowledged as i64 - final_value).max(0),
        ready_ms,
        runtime: began.elapsed(),
    }
}

/// Logical writes with an acknowledged attempt.
fn acknowledged_writes(events: &[crate::history::Event]) -> usize {
    use crate::history::{Kind, Op};
    let acked: std::collections::HashSet<(&str, u64)> = events
        .iter()
        .filter(|e| e.op == Op::Write && e.kind == Kind::Ok)
        .map(|e| (e.process.as_str(), e.op_id))
        .collect();
    acked.len()
}

impl Outcome {
    pub fn print(&self) {
        let ready: Vec<String> = self
            .ready_ms
            .iter()
            .map(|(node, ms)| {
                format!(
                    "{node} {}",
                    ms.map_or("never".into(), |ms| format!("{ms:.0} ms"))
                )
            })
            .collect();
        println!(
            "\n== failover, {} replication: {} writes acknowledged, {} acknowledged increments lost; ready after the promotion: {}; {:.1} s ==",
            if self.synchronous { "synchronous" } else { "asynchronous" },
            self.acknowledged,
            self.lost,
            ready.join(", "),
            self.runtime.as_secs_f64()
        );
        print!("{}", self.report.summary);
        for v in self
            .report
            .violations
            .iter()
            .take(if self.synchronous { usize::MAX } else { 4 })
        {
            println!("  {}{v}", if self.synchronous { "" } else { "e.g. " });
        }
    }
}
