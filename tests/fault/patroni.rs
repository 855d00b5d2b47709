//! A real Patroni cluster under fenced load: a switchover, then `kill -9` of the leader, while
//! lock holders are frozen past their lease (zombies). Nothing acknowledged may be lost, no stale
//! write may be accepted, and writes must resume after each fault.
//!
//! The setup (patroni_cluster.rs, haproxy.rs): one etcd, two (or more) Patroni 3 nodes with
//! `synchronous_mode: true` and short timings, PostgreSQL bootstrapped by Patroni with initdb.
//! Two `fencegate serve` processes reach the leader by one of two routes:
//! - `haproxy`: through HAProxy checking each node's `GET /primary`;
//! - `hosts`: through a libpq host list,
//!   `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/postgres?target_session_attrs=read-write`.
//!
//! The schedule (about 45 s per route, after 12-16 s of cluster start): the main harness's
//! workers increment the counter under the built-in lock and the nemesis's pause loop freezes
//! lock holders; after `BEFORE`, `patronictl switchover` from the leader to its synchronous
//! standby; once the old leader streams again as the synchronous standby (and at least
//! `SETTLE` later), `kill -9` of the leader's Patroni and postmaster; `/readyz` must be 503
//! while no member leads; then the killed member's Patroni is started again and must rejoin as
//! a standby the leader streams to (pg_rewind; with two members, the synchronous one), and the
//! run goes on for at least `AFTER`.
//!
//! For each fault the run prints when writes resumed: the time from the fault to the
//! acknowledged write that ended the outage it caused (the longest stretch without one;
//! asserted below `RESUME_LIMIT`), and, from the moment a new leader answers `/primary`, the
//! time until each fencegate is ready again (the checker holds it to `FAULT_RECOVERY_MS`).
//!
//! Settings: main.rs's `FAULT_WORKERS`, `FAULT_LEASE_MS`, `FAULT_SEED`, `FAULT_CLIENT_TIMEOUT_MS`,
//! `FAULT_REQUEST_TIMEOUT_MS`, `FAULT_RECOVERY_MS`, `FAULT_QUIET_SECONDS` and `FAULT_KEEP`
//! apply; `FAULT_PATRONI_ROUTES` (default `haproxy,hosts`): the routes to run, in order;
//! `FAULT_PATRONI_MEMBERS` (default 2): Patroni nodes (one leader, one synchronous standby, the
//! rest asynchronous replicas).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::checker;
use crate::cluster::free_port;
use crate::haproxy::Haproxy;
use crate::history::{now_us, Event, Kind, Op};
use crate::nemesis::{self, stamp, Fault, FaultKind, NemesisLog, Probe, Recovery};
use crate::node::Node;
use crate::patroni_cluster::PatroniCluster;
use crate::{
    read_final_state, read_histories, spawn_worker, stop_workers, worker, worker_refs, Config, Job,
};

/// Fenced load with pauses only, before the first fault.
const BEFORE: Duration = Duration::from_secs(4);
/// At least this long between the switchover and the kill (also until the cluster is healthy).
const SETTLE: Duration = Duration::from_secs(4);
/// The run goes on this long after the kill.
const AFTER: Duration = Duration::from_secs(5);
/// When `/readyz` is probed after the kill: HAProxy has marked the dead leader down by then
/// (2 checks of 300 ms), and the standby is not promoted before the leader key's 5 s ttl.
const PROBE_AFTER_KILL: Duration = Duration::from_millis(1500);
/// Writes must be acknowledged again this soon after each fault began (generous: measured
/// 1-7 s on a loaded 2-core machine).
pub const RESUME_LIMIT: Duration = Duration::from_secs(30);

/// How fencegate reaches the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Haproxy,
    HostList,
}

impl Route {
    pub fn name(self) -> &'static str {
        match self {
            Route::Haproxy => "haproxy",
            Route::HostList => "hosts",
        }
    }

    /// `FAULT_PATRONI_ROUTES` (default `haproxy,hosts`: both, one after the other).
    pub fn from_env() -> Vec<Route> {
        let list = std::env::var("FAULT_PATRONI_ROUTES").unwrap_or_default();
        let list = if list.trim().is_empty() {
            "haproxy,hosts".to_string()
        } else {
            list
        };
        list.split(',')
            .map(|r| match r.trim() {
                "haproxy" => Route::Haproxy,
                "hosts" => Route::HostList,
                other => {
                    panic!("FAULT_PATRONI_ROUTES: unknown route {other:?} (haproxy, hosts)")
                }
            })
            .collect()
    }
}

/// The libpq host list of members listening on 127.0.0.1:`ports`, asking for the read-write one.
pub fn host_list_url(ports: &[u16]) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!(
        "postgres://postgres@{}/postgres?target_session_attrs=read-write",
        hosts.join(",")
    )
}

/// fencegate's settings besides its database URL: answer 503 before the client gives up.
pub fn fencegate_toml(request_timeout_ms: u64) -> String {
    format!("[server]\nrequest_timeout_ms = {request_timeout_ms}\nshutdown_grace_ms = 1000\n")
}

/// What one route's run measured.
pub struct Outcome {
    pub route: Route,
    pub report: checker::Report,
    /// Logical writes acknowledged.
    pub acknowledged: usize,
    /// Logical writes refused as stale (412): zombies fenced out.
    pub refused_stale: usize,
    /// Per fault: ms from its start until writes were acknowledged again after the outage it
    /// caused, and the outage's length (the longest stretch without an acknowledged write).
    pub resume_ms: Vec<(FaultKind, Option<(f64, f64)>)>,
    /// Per fault and fencegate: ms from a new leader answering `/primary` to `/readyz` 200.
    pub ready_ms: Vec<(FaultKind, String, Option<f64>)>,
    pub runtime: Duration,
}

/// Polls each node's `/readyz` until 200 from `back` on; one [`Recovery`] per node.
async fn measure_ready(
    client: &reqwest::Client,
    nodes: &[Node],
    after: FaultKind,
    back: Instant,
    limit: Duration,
) -> Vec<Recovery> {
    let mut out = Vec::new();
    for node in nodes {
        let ms = loop {
            if let (Some(200), ..) = nemesis::readyz(client, &node.url).await {
                break Some(back.elapsed().as_secs_f64() * 1000.0);
            }
            if back.elapsed() > limit {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        out.push(Recovery {
            after,
            node: node.name.clone(),
            ms,
        });
    }
    out
}

pub async fn run(cfg: &Config, route: Route, t0: u64) -> Outcome {
    let began = Instant::now();
    let say = |msg: &str| {
        println!(
            "[{}] patroni ({}): {msg}",
            stamp(t0, now_us()),
            route.name()
        )
    };
    let root = tempfile::Builder::new()
        .prefix("fencegate-patroni-")
        .tempdir()
        .expect("create a scratch directory")
        .keep();
    crate::daemon::watch_scratch(&root, cfg.keep);
    let members = crate::env_u64("FAULT_PATRONI_MEMBERS", 2) as usize;
    assert!(members >= 2, "FAULT_PATRONI_MEMBERS must be at least 2");
    let mut cluster = PatroniCluster::start(&root, members)
        .await
        .unwrap_or_else(|e| panic!("the Patroni cluster did not start: {e}"));
    let (leader, sync) = cluster
        .await_healthy(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    say(&format!(
        "etcd on :{}, {members} Patroni nodes: {} (leader, :{}), {} (synchronous standby, :{}); scratch {}",
        cluster.etcd_port,
        leader,
        cluster.node(&leader).pg_port,
        sync,
        cluster.node(&sync).pg_port,
        root.display()
    ));
    let mut haproxy = None;
    let db_url = match route {
        Route::Haproxy => {
            let proxy = Haproxy::start(&root, &cluster)
                .await
                .unwrap_or_else(|e| panic!("HAProxy did not start: {e}"));
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);
            say(&format!(
                "HAProxy on :{} checking GET /primary on each Patroni ({})",
                proxy.port,
                proxy.config.display()
            ));
            haproxy = Some(proxy);
            url
        }
        Route::HostList => {
            host_list_url(&cluster.nodes.iter().map(|n| n.pg_port).collect::<Vec<_>>())
        }
    };
    say(&format!("fencegate's database: {db_url}"));

    let config = root.join("fencegate.toml");
    std::fs::write(&config, fencegate_toml(cfg.request_timeout_ms))
        .expect("write the fencegate config");
    let mut nodes: Vec<Node> = (0..2)
        .map(|i| {
            Node::new(
                i,
                free_port(),
                true,
                db_url.clone(),
                config.clone(),
                root.join(format!("n{i}.log")),
            )
        })
        .collect();
    for node in &mut nodes {
        node.start().await.unwrap_or_else(|e| panic!("{e}"));
    }
    let mut problems: Vec<(&'static str, String)> = Vec::new();
    let client = nemesis::probe_client();

    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let start_us = now_us();
    // The pauses run until here; the scripted faults take about as long.
    let end_us = start_us + 30_000_000;
    let job = Job {
        prefix: if route == Route::Haproxy { "ph" } else { "pl" },
        key: worker::KEY,
        lock: worker::LOCK,
        unfenced: false,
        stop_file: root.join("workers.stop"),
        hard_deadline_us: end_us + 120 * 1_000_000,
    };
    let mut workers: Vec<_> = (1..=cfg.workers)
        .map(|i| spawn_worker(i, cfg, &root, &urls, &job))
        .collect();
    say(&format!(
        "n0, n1 up; {} workers increment the counter under the lock (lease {} ms) while lock holders are frozen",
        workers.len(),
        cfg.lease_ms
    ));
    let refs = worker_refs(&workers);
    let log = Mutex::new(NemesisLog::default());
    let settings = nemesis::Settings {
        kinds: Vec::new(),
        pauses: true,
        db_url: cluster.node(&leader).url(),
        lease_ms: cfg.lease_ms,
        fault_end_us: end_us,
        t0_us: t0,
        recovery_limit: Duration::from_millis(cfg.recovery_ms),
    };
    let pauses = nemesis::pause_loop(
        &refs,
        &settings,
        &log,
        rand::SeedableRng::seed_from_u64(cfg.seed ^ 0x9a7),
    );
    let ready_limit = Duration::from_millis(cfg.recovery_ms) * 3;
    let faults = async {
        tokio::time::sleep(BEFORE).await;

        // 1. Switchover to the synchronous standby.
        let start = now_us();
        let switched = Instant::now();
        cluster
            .switchover(&leader, &sync)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let now_leader = cluster
            .await_primary(Some(&leader), Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("after the switchover: {e}"));
        let back = Instant::now();
        say(&format!(
            "patronictl switchover {leader} -> {sync}: {now_leader} answers /primary {} ms after the command",
            switched.elapsed().as_millis()
        ));
        let recoveries =
            measure_ready(&client, &nodes, FaultKind::Switchover, back, ready_limit).await;
        {
            let mut log = log.lock().unwrap();
            log.faults.push(Fault {
                kind: FaultKind::Switchover,
                target: format!("{leader}->{now_leader}"),
                start_us: start,
                end_us: now_us(),
                held_token: None,
            });
            log.recoveries.extend(recoveries);
        }
        let (leader2, sync2) = cluster
            .await_healthy(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("after the switchover: {e}"));
        let settle_left = SETTLE.saturating_sub(switched.elapsed());
        tokio::time::sleep(settle_left).await;
        say(&format!(
            "{leader2} leads, {sync2} streams as its synchronous standby again"
        ));

        // 2. kill -9 of the leader's Patroni and postmaster.
        let start = now_us();
        let killed = Instant::now();
        let postmaster = cluster.kill9(&leader2);
        say(&format!(
            "kill -9 of {leader2}'s Patroni and postmaster (pid {postmaster:?})"
        ));
        tokio::time::sleep(PROBE_AFTER_KILL.saturating_sub(killed.elapsed())).await;
        let mut probes = Vec::new();
        for node in &nodes {
            let t_us = now_us();
            let (status, retry_after, error, latency_ms) =
                nemesis::readyz(&client, &node.url).await;
            say(&format!(
                "  /readyz on {} with no leader: {status:?}{}",
                node.name,
                error
                    .as_deref()
                    .map(|e| format!(" {e}"))
                    .unwrap_or_default()
            ));
            probes.push(Probe {
                t_us,
                node: node.name.clone(),
                during: FaultKind::KillLeader,
                // Unless the standby was promoted meanwhile (a loaded machine: the probe was late).
                must_be_503: killed.elapsed() < Duration::from_secs(4),
                status,
                retry_after,
                error,
                latency_ms,
            });
        }
        let new_leader = cluster
            .await_primary(Some(&leader2), Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("after kill -9 of the leader: {e}"));
        let back = Instant::now();
        say(&format!(
            "{new_leader} answers /primary {} ms after the kill",
            killed.elapsed().as_millis()
        ));
        let recoveries =
            measure_ready(&client, &nodes, FaultKind::KillLeader, back, ready_limit).await;
        for r in &recoveries {
            say(&format!(
                "  {} ready {}",
                r.node,
                r.ms.map_or("NEVER".into(), |ms| format!(
                    "{ms:.0} ms after the new leader"
                ))
            ));
        }
        {
            let mut log = log.lock().unwrap();
            log.faults.push(Fault {
                kind: FaultKind::KillLeader,
                target: format!("{leader2}->{new_leader}"),
                start_us: start,
                end_us: now_us(),
                held_token: None,
            });
            log.probes.extend(probes);
            log.recoveries.extend(recoveries);
        }
        // 3. The killed member comes back and must rejoin as the synchronous standby (pg_rewind).
        let after = Instant::now();
        cluster
            .restart(&leader2)
            .unwrap_or_else(|e| panic!("restart {leader2}'s Patroni: {e}"));
        let (leader3, sync_state) = cluster
            .await_streaming_to(&leader2, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("after {leader2} was restarted: {e}"));
        let ms = after.elapsed().as_millis();
        let (leader4, sync4) = cluster
            .await_healthy(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("after {leader2} was restarted: {e}"));
        say(&format!(
            "{leader2} restarted: {leader3} streams to it ({sync_state}) {ms} ms later; \
             {leader4} leads with {sync4} as its synchronous standby"
        ));
        tokio::time::sleep(AFTER.saturating_sub(after.elapsed())).await;
        new_leader
    };
    let ((), new_leader) = tokio::join!(pauses, faults);
    let healed_us = now_us();
    say(&format!(
        "faults over; {} s of quiet running",
        cfg.quiet_secs
    ));
    tokio::time::sleep(Duration::from_secs(cfg.quiet_secs)).await;
    problems.extend(stop_workers(&mut workers, &job.stop_file).await);

    for node in &mut nodes {
        if let Err(e) = node.check_alive() {
            problems.push(("4-process", e));
        }
    }
    if let Some(status) = cluster.etcd_exited() {
        problems.push(("4-process", format!("etcd exited on its own ({status})")));
    }
    if let Some(status) = haproxy.as_mut().and_then(Haproxy::exited) {
        problems.push(("4-process", format!("HAProxy exited on its own ({status})")));
    }
    let leader_url = cluster.node(&new_leader).url();
    let final_state = read_final_state(&nodes, &leader_url, job.key, job.lock)
        .await
        .unwrap_or_else(|e| {
            problems.push(("2-final", format!("cannot read the final state: {e}")));
            checker::FinalState::default()
        });
    match nemesis::leaked_transactions(&leader_url).await {
        Ok(leaks) if !leaks.is_empty() => problems.push(("5-leaked-transaction", leaks.join("; "))),
        Ok(_) => {}
        Err(e) => problems.push((
            "5-leaked-transaction",
            format!("cannot query pg_stat_activity: {e}"),
        )),
    }
    let events = read_histories(&workers, &mut problems);
    let log = log.into_inner().unwrap();
    let report = checker::check(&checker::Input {
        events: &events,
        nemesis: &log,
        final_state: &final_state,
        external: &problems,
        healed_us,
        recovery_limit_ms: cfg.recovery_ms as f64,
        t0_us: t0,
    });
    let resume_ms = log
        .faults
        .iter()
        .filter(|f| FaultKind::HA.contains(&f.kind))
        .map(|f| (f.kind, resumed_after(&events, f.start_us, f.end_us)))
        .collect();
    let ready_ms = log
        .recoveries
        .iter()
        .map(|r| (r.after, r.node.clone(), r.ms))
        .collect();
    if !report.violations.is_empty() {
        for node in &nodes {
            println!("\n-- {} log (tail) --\n{}", node.name, node.log_tail(12));
            // A 500 is a violation of its own; its cause is in the log, maybe far from the tail.
            for line in node
                .error_lines()
                .iter()
                .filter(|l| l.contains("status=500"))
                .take(10)
            {
                println!("{} answered 500: {line}", node.name);
            }
        }
        println!("\n{}", cluster.logs(15));
        if let Some(proxy) = &haproxy {
            println!("-- HAProxy (tail) --\n{}", proxy.log_tail(15));
        }
    }
    for node in &mut nodes {
        node.kill().await;
    }
    drop(haproxy);
    drop(cluster);
    if !cfg.keep {
        remove_dir(&root);
    }
    Outcome {
        route,
        report,
        acknowledged: logical(&events, |e| e.op == Op::Write && e.kind == Kind::Ok),
        refused_stale: logical(&events, |e| e.op == Op::Write && e.status == Some(412)),
        resume_ms,
        ready_ms,
        runtime: began.elapsed(),
    }
}

/// Removes the scratch directory; a PostgreSQL backend of a killed postmaster may still be
/// writing for a moment, so it is tried for a few seconds.
fn remove_dir(root: &std::path::Path) {
    for _ in 0..50 {
        if std::fs::remove_dir_all(root).is_ok() || !root.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("could not remove {}", root.display());
}

/// Distinct logical operations (process, op id) with an event matching `pred`.
fn logical(events: &[Event], pred: impl Fn(&Event) -> bool) -> usize {
    events
        .iter()
        .filter(|e| pred(e))
        .map(|e| (e.process.as_str(), e.op_id))
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// When writes resumed after a fault that began at `start_us` and was over at `end_us`: the
/// longest stretch without an acknowledged write from the fault's start until 10 s after its
/// end, as (ms from the fault's start to the acknowledgement that ended it, its length in ms).
/// A switchover lets writes go on for a moment before the leader is demoted, so the first
/// acknowledgement after the fault's start would say nothing; the longest gap is the outage.
fn resumed_after(events: &[Event], start_us: u64, end_us: u64) -> Option<(f64, f64)> {
    let mut acks: Vec<u64> = events
        .iter()
        .filter(|e| e.op == Op::Write && e.kind == Kind::Ok && e.t >= start_us)
        .filter(|e| e.t <= end_us + 10_000_000)
        .map(|e| e.t)
        .collect();
    acks.sort_unstable();
    let mut previous = start_us;
    let mut longest: Option<(u64, u64)> = None;
    for t in acks {
        if longest.is_none_or(|(from, to)| t - previous > to - from) {
            longest = Some((previous, t));
        }
        previous = t;
    }
    longest.map(|(from, to)| ((to - start_us) as f64 / 1000.0, (to - from) as f64 / 1000.0))
}

impl Outcome {
    pub fn print(&self) {
        let resume: Vec<String> = self
            .resume_ms
            .iter()
            .map(|(kind, ms)| {
                format!(
                    "{} {}",
                    kind.name(),
                    ms.map_or("never".into(), |(resumed, gap)| format!(
                        "{:.1} s (no write acknowledged for {:.1} s)",
                        resumed / 1000.0,
                        gap / 1000.0
                    ))
                )
            })
            .collect();
        let ready: Vec<String> = self
            .ready_ms
            .iter()
            .map(|(kind, node, ms)| {
                format!(
                    "{node} after {} {}",
                    kind.name(),
                    ms.map_or("never".into(), |ms| format!("{ms:.0} ms"))
                )
            })
            .collect();
        println!(
            "\n== Patroni through {}: {} writes acknowledged, {} zombie writes refused (412); writes resumed after: {}; ready after the new leader: {}; {:.1} s ==",
            match self.route {
                Route::Haproxy => "HAProxy",
                Route::HostList => "a host list",
            },
            self.acknowledged,
            self.refused_stale,
            resume.join(", "),
            ready.join(", "),
            self.runtime.as_secs_f64()
        );
        print!("{}", self.report.summary);
        for v in &self.report.violations {
            println!("  {v}");
        }
    }
}

/// docs/operations.md shows the configurations this run generates, as generated (with the
/// example's ports and paths), so what it documents is what was tested.
#[test]
fn the_docs_show_the_tested_configs() {
    let docs = include_str!("../../docs/operations.md");
    let bindir = std::path::Path::new("/usr/lib/postgresql/15/bin");
    let dir = std::path::Path::new("/var/lib/patroni/pg1");
    let members = [
        ("pg1".to_string(), 5432, 8008),
        ("pg2".to_string(), 5433, 8009),
    ];
    for (what, text) in [
        (
            "Patroni's YAML",
            crate::patroni_cluster::patroni_yaml("pg1", 8008, 5432, dir, bindir, 2379),
        ),
        (
            "patronictl's YAML",
            crate::patroni_cluster::patronictl_yaml(2379),
        ),
        ("haproxy.cfg", crate::haproxy::config_text(5000, &members)),
        (
            "fencegate's settings",
            format!(
                "[database]\nurl = \"postgres://postgres@127.0.0.1:5000/postgres\"\n\n{}",
                fencegate_toml(3000)
            ),
        ),
        (
            "the host-list URL",
            format!("[database]\nurl = \"{}\"\n", host_list_url(&[5432, 5433])),
        ),
    ] {
        assert!(
            docs.contains(&format!("\n{text}```\n")),
            "docs/operations.md (Patroni + HAProxy) must show {what} as the Patroni run generates it:\n{text}"
        );
    }
}
