//! The nemesis: injects faults on a randomized schedule and logs each one with timestamps.
//!
//! Two loops run side by side until the end of the fault phase:
//! - pauses: every 1.2-3 s, SIGSTOP a worker for longer than its lease, then SIGCONT. It
//!   prefers a worker that holds the lock right now (its last history line is a grant or a
//!   read), which makes it a zombie: another worker takes the lock, and the frozen one wakes up
//!   and writes with its old token;
//! - infrastructure, one fault at a time, kinds drawn from a shuffled bag so every kind occurs:
//!   SIGKILL + restart of a fencegate process, crash-restart of PostgreSQL, cut or stall of the
//!   proxied node's database traffic. Around each, `/readyz` is probed: 503 (not 200, not a hang)
//!   while the database is unreachable, and the time until 200 after it is back.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{rngs::StdRng, seq::SliceRandom, Rng};

use crate::cluster::Cluster;
use crate::history::{now_us, tail_events, Kind, Op};
use crate::node::Node;
use crate::proxy::Proxy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Pause,
    KillNode,
    CrashPg,
    ProxyCut,
    ProxyStall,
    /// The primary crashed, its standby was promoted, clients were switched to it
    /// (tests/fault/failover.rs; not one of the random faults).
    Failover,
    /// `patronictl switchover`: Patroni demotes the leader and promotes its synchronous standby
    /// (tests/fault/patroni.rs).
    Switchover,
    /// `kill -9` of the Patroni leader's postmaster and Patroni itself; the synchronous standby
    /// takes over once the leader key expires (tests/fault/patroni.rs).
    KillLeader,
}

impl FaultKind {
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Pause,
        FaultKind::KillNode,
        FaultKind::CrashPg,
        FaultKind::ProxyCut,
        FaultKind::ProxyStall,
    ];

    /// The scripted faults of a replicated database, listed in summaries only when they occur.
    pub const HA: [FaultKind; 3] = [
        FaultKind::Failover,
        FaultKind::Switchover,
        FaultKind::KillLeader,
    ];

    /// Parses `FAULT_KINDS` entries: pause, kill, crash, cut, stall.
    pub fn parse(name: &str) -> Option<FaultKind> {
        Some(match name.trim() {
            "pause" => FaultKind::Pause,
            "kill" => FaultKind::KillNode,
            "crash" => FaultKind::CrashPg,
            "cut" => FaultKind::ProxyCut,
            "stall" => FaultKind::ProxyStall,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause-worker",
            FaultKind::KillNode => "kill-fencegate",
            FaultKind::CrashPg => "crash-postgres",
            FaultKind::ProxyCut => "cut-db-link",
            FaultKind::ProxyStall => "stall-db-link",
            FaultKind::Failover => "failover",
            FaultKind::Switchover => "switchover",
            FaultKind::KillLeader => "kill-9-leader",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: FaultKind,
    /// A worker (`w2`), a node (`n1`), `postgres`, or `n0<->postgres`.
    pub target: String,
    pub start_us: u64,
    /// When the fault was over: SIGCONT sent, process listening again, `pg_ctl start` returned,
    /// link healed.
    pub end_us: u64,
    /// For a pause: the token the worker held when frozen, if it held the lock.
    pub held_token: Option<u64>,
}

/// A `/readyz` answer while the database was unreachable from that node.
#[derive(Debug, Clone)]
pub struct Probe {
    pub t_us: u64,
    pub node: String,
    pub during: FaultKind,
    /// The outage makes 503 the only right answer (a stall may also end while the probe waits).
    pub must_be_503: bool,
    pub status: Option<u16>,
    pub retry_after: bool,
    pub error: Option<String>,
    pub latency_ms: f64,
}

/// Time from the database being reachable again to `/readyz` 200 on a node.
#[derive(Debug, Clone)]
pub struct Recovery {
    pub after: FaultKind,
    pub node: String,
    /// `None`: not ready within the observation limit.
    pub ms: Option<f64>,
}

#[derive(Debug, Default)]
pub struct NemesisLog {
    pub faults: Vec<Fault>,
    pub probes: Vec<Probe>,
    pub recoveries: Vec<Recovery>,
    /// Things that are wrong whatever the history says, by rule: `5-leaked-transaction`,
    /// `4-process` (a fencegate died on its own), `nemesis` (a fault could not be injected/healed).
    pub violations: Vec<(&'static str, String)>,
}

pub struct WorkerRef {
    pub name: String,
    pub pid: u32,
    pub history: PathBuf,
}

pub struct Settings {
    /// Infrastructure fault kinds to inject (pauses are controlled by `pauses`).
    pub kinds: Vec<FaultKind>,
    pub pauses: bool,
    /// Direct URL of the cluster, for the leaked-transaction check.
    pub db_url: String,
    pub lease_ms: u64,
    pub fault_end_us: u64,
    pub t0_us: u64,
    pub recovery_limit: Duration,
}

pub struct Nemesis<'a> {
    pub nodes: &'a mut [Node],
    pub cluster: &'a Cluster,
    pub proxy: &'a Proxy,
    pub workers: &'a [WorkerRef],
    pub settings: Settings,
    pub log: Arc<Mutex<NemesisLog>>,
}

/// `+12.345s` since the start of the run.
pub fn stamp(t0_us: u64, t_us: u64) -> String {
    format!("+{:7.3}s", t_us.saturating_sub(t0_us) as f64 / 1e6)
}

fn say(t0_us: u64, msg: &str) {
    println!("[{}] nemesis: {msg}", stamp(t0_us, now_us()));
}

pub fn probe_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client")
}

/// GET /readyz once: (status, has Retry-After, error, latency ms).
pub async fn readyz(
    client: &reqwest::Client,
    url: &str,
) -> (Option<u16>, bool, Option<String>, f64) {
    let started = Instant::now();
    let result = client.get(format!("{url}/readyz")).send().await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(resp) => {
            let retry = resp.headers().contains_key(reqwest::header::RETRY_AFTER);
            let status = resp.status().as_u16();
            let _ = resp.bytes().await;
            (Some(status), retry, None, ms)
        }
        Err(e) if e.is_timeout() => (None, false, Some("timeout (5 s): a hang".into()), ms),
        Err(e) => (None, false, Some(format!("{e}")), ms),
    }
}

/// Polls /readyz every 100 ms until 200; the time since `from`, or `None` after `limit`.
async fn await_ready(
    client: &reqwest::Client,
    url: &str,
    from: Instant,
    limit: Duration,
) -> Option<f64> {
    loop {
        if let (Some(200), ..) = readyz(client, url).await {
            return Some(from.elapsed().as_secs_f64() * 1000.0);
        }
        if from.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// fencegate sessions left `idle in transaction` for more than a second. fencegate never waits
/// between the statements of a transaction, so outside a stalled link such a session is a
/// connection that went back to the pool inside a transaction nobody will finish: whatever runs
/// on it next is answered 2xx without being committed, and its row locks block everyone.
pub async fn leaked_transactions(db_url: &str) -> Result<Vec<String>, String> {
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(db_url)
        .await
        .map_err(|e| e.to_string())?;
    let rows = sqlx::query(
        "SELECT pid, state, extract(epoch FROM now() - state_change)::float8, \
                regexp_replace(left(query, 120), '\\s+', ' ', 'g') \
         FROM pg_stat_activity \
         WHERE application_name = 'fencegate' AND state LIKE 'idle in transaction%' \
           AND now() - state_change > interval '1 second'",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|e| e.to_string())?;
    let _ = conn.close().await;
    Ok(rows
        .iter()
        .map(|r| {
            let pid: i32 = r.get(0);
            let state: String = r.get(1);
            let secs: f64 = r.get(2);
            let query: String = r.get(3);
            format!(
                "backend pid {pid} {state} for {secs:.1} s, last statement: {}",
                query.trim()
            )
        })
        .collect())
}

/// `Some(token)` if the worker holds the lock right now (its last event is its grant or the
/// read that follows): freezing it now makes it a zombie.
fn holding(path: &std::path::Path) -> Option<u64> {
    let events = tail_events(path);
    let last = events.last()?;
    if !matches!(
        (last.op, last.kind),
        (Op::Acquire, Kind::Ok) | (Op::Read, Kind::Invoke | Kind::Ok)
    ) {
        return None;
    }
    let grant = events
        .iter()
        .rev()
        .find(|e| e.op == Op::Acquire && e.kind == Kind::Ok && e.op_id == last.op_id)?;
    grant.token
}

impl Nemesis<'_> {
    fn violation(&self, rule: &'static str, msg: String) {
        say(self.settings.t0_us, &format!("VIOLATION [{rule}]: {msg}"));
        self.log.lock().unwrap().violations.push((rule, msg));
    }

    pub async fn run(&mut self, seed: u64) {
        use rand::SeedableRng;
        let pause_rng = StdRng::seed_from_u64(seed ^ 0x5eed_0001);
        let infra_rng = StdRng::seed_from_u64(seed ^ 0x5eed_0002);
        let pauses = pause_loop(self.workers, &self.settings, &self.log, pause_rng);
        let mut infra = Infra {
            nodes: &mut *self.nodes,
            cluster: self.cluster,
            proxy: self.proxy,
            settings: &self.settings,
            log: &self.log,
            rng: infra_rng,
            client: probe_client(),
        };
        tokio::join!(pauses, infra.run());
    }

    /// After the fault phase: every worker running, every fencegate up, the link healed.
    pub async fn heal_all(&mut self) {
        self.proxy.heal();
        for w in self.workers {
            let _ = kill(Pid::from_raw(w.pid as i32), Signal::SIGCONT);
        }
        for i in 0..self.nodes.len() {
            if let Err(e) = self.nodes[i].check_alive() {
                if self.nodes[i].starts > 0 && !e.contains("is not running") {
                    self.violation("4-process", e);
                }
                if let Err(e) = self.nodes[i].start().await {
                    self.violation(
                        "4-process",
                        format!(
                            "cannot restart {} after the fault phase: {e}",
                            self.nodes[i].name
                        ),
                    );
                }
            }
        }
    }
}

pub async fn pause_loop(
    workers: &[WorkerRef],
    settings: &Settings,
    log: &Mutex<NemesisLog>,
    mut rng: StdRng,
) {
    let t0 = settings.t0_us;
    loop {
        let gap = rng.gen_range(1200..=3000);
        tokio::time::sleep(Duration::from_millis(gap)).await;
        if now_us() >= settings.fault_end_us || workers.is_empty() || !settings.pauses {
            return;
        }
        // Prefer the current lock holder (found within 600 ms); else anyone.
        let look_until = Instant::now() + Duration::from_millis(600);
        let mut order: Vec<&WorkerRef> = workers.iter().collect();
        let target = loop {
            order.shuffle(&mut rng);
            if let Some(found) = order
                .iter()
                .find_map(|w| holding(&w.history).map(|t| (*w, true, Some(t))))
            {
                break found;
            }
            if Instant::now() >= look_until {
                break (order[0], false, None);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let (w, holder, token) = target;
        let pause = settings.lease_ms + rng.gen_range(150..=1200);
        let pid = Pid::from_raw(w.pid as i32);
        if kill(pid, Signal::SIGSTOP).is_err() {
            continue; // the worker has exited
        }
        let start_us = now_us();
        say(
            t0,
            &format!(
                "SIGSTOP {} for {pause} ms (lease {} ms){}",
                w.name,
                settings.lease_ms,
                match token {
                    Some(t) if holder => format!(", frozen while holding the lock (token {t})"),
                    _ => String::new(),
                }
            ),
        );
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let _ = kill(pid, Signal::SIGCONT);
        let end_us = now_us();
        say(t0, &format!("SIGCONT {}", w.name));
        log.lock().unwrap().faults.push(Fault {
            kind: FaultKind::Pause,
            target: w.name.clone(),
            start_us,
            end_us,
            held_token: token.filter(|_| holder),
        });
    }
}

struct Infra<'n, 'a> {
    nodes: &'n mut [Node],
    cluster: &'a Cluster,
    proxy: &'a Proxy,
    settings: &'n Settings,
    log: &'n Mutex<NemesisLog>,
    rng: StdRng,
    client: reqwest::Client,
}

impl Infra<'_, '_> {
    fn say(&self, msg: &str) {
        say(self.settings.t0_us, msg);
    }

    fn violation(&self, rule: &'static str, msg: String) {
        self.say(&format!("VIOLATION [{rule}]: {msg}"));
        self.log.lock().unwrap().violations.push((rule, msg));
    }

    fn record(&self, kind: FaultKind, target: String, start_us: u64) {
        self.log.lock().unwrap().faults.push(Fault {
            kind,
            target,
            start_us,
            end_us: now_us(),
            held_token: None,
        });
    }

    /// A fencegate that exited by itself is a violation; it is restarted so the run goes on.
    async fn check_nodes(&mut self) {
        for i in 0..self.nodes.len() {
            if let Err(e) = self.nodes[i].check_alive() {
                self.violation("4-process", e);
                if let Err(e) = self.nodes[i].start().await {
                    self.violation(
                        "4-process",
                        format!("cannot restart {}: {e}", self.nodes[i].name),
                    );
                }
            }
        }
    }

    /// Violation if a fencegate session was left inside a transaction (see
    /// [`leaked_transactions`]); `after` names the fault that preceded the check.
    async fn check_leaks(&self, after: &str) {
        match leaked_transactions(&self.settings.db_url).await {
            Ok(leaks) if leaks.is_empty() => {}
            Ok(leaks) => self.violation("5-leaked-transaction", format!(
                "after {after}: {} fencegate database session(s) left inside an open transaction: {}. \
                 A pooled connection went back to the pool mid-transaction: later statements on it are \
                 acknowledged without being committed and its row locks block every other writer",
                leaks.len(),
                leaks.join("; ")
            )),
            Err(e) => self.say(&format!("(could not query pg_stat_activity: {e})")),
        }
    }

    async fn run(&mut self) {
        let kinds = self.settings.kinds.clone();
        let mut bag: Vec<FaultKind> = Vec::new();
        let mut previous = String::from("start-up");
        loop {
            let gap = self.rng.gen_range(2000..=4500);
            tokio::time::sleep(Duration::from_millis(gap)).await;
            self.check_leaks(&previous).await;
            if now_us() >= self.settings.fault_end_us || kinds.is_empty() {
                return;
            }
            self.check_nodes().await;
            if bag.is_empty() {
                bag = kinds.clone();
                bag.shuffle(&mut self.rng);
            }
            let kind = bag.pop().unwrap();
            previous = format!(
                "{} (started {})",
                kind.name(),
                stamp(self.settings.t0_us, now_us())
            );
            match kind {
                FaultKind::KillNode => self.kill_node().await,
                FaultKind::CrashPg => self.crash_pg().await,
                FaultKind::ProxyCut => self.cut_link().await,
                FaultKind::ProxyStall => self.stall_link().await,
                FaultKind::Pause
                | FaultKind::Failover
                | FaultKind::Switchover
                | FaultKind::KillLeader => unreachable!(),
            }
        }
    }

    async fn kill_node(&mut self) {
        let i = self.rng.gen_range(0..self.nodes.len());
        let down = self.rng.gen_range(300..=2000);
        let pid = self.nodes[i].pid();
        self.nodes[i].kill().await;
        let start_us = now_us();
        self.say(&format!(
            "SIGKILL {} (pid {pid:?}); restarting it in {down} ms",
            self.nodes[i].name
        ));
        tokio::time::sleep(Duration::from_millis(down)).await;
        match self.nodes[i].start().await {
            Ok(took) => self.say(&format!(
                "{} restarted on the same port (listening after {} ms)",
                self.nodes[i].name,
                took.as_millis()
            )),
            Err(e) => self.violation(
                "4-process",
                format!("restart of {} failed: {e}", self.nodes[i].name),
            ),
        }
        self.record(FaultKind::KillNode, self.nodes[i].name.clone(), start_us);
        // A fresh process must be ready at once (the database is up).
        let node = self.nodes[i].name.clone();
        let ms = await_ready(
            &self.client,
            &self.nodes[i].url,
            Instant::now(),
            self.settings.recovery_limit * 3,
        )
        .await;
        self.log.lock().unwrap().recoveries.push(Recovery {
            after: FaultKind::KillNode,
            node,
            ms,
        });
    }

    /// Probes /readyz on the given nodes at once, recording each answer.
    async fn probe_during(&self, which: &[usize], during: FaultKind, must_be_503: bool) {
        let probes = which.iter().map(|&i| {
            let url = self.nodes[i].url.clone();
            let client = self.client.clone();
            async move { (i, now_us(), readyz(&client, &url).await) }
        });
        for (i, t_us, (status, retry_after, error, latency_ms)) in join_all(probes).await {
            self.say(&format!(
                "  /readyz on {} during {}: {} in {latency_ms:.0} ms",
                self.nodes[i].name,
                during.name(),
                status.map_or_else(|| error.clone().unwrap_or_default(), |s| s.to_string())
            ));
            self.log.lock().unwrap().probes.push(Probe {
                t_us,
                node: self.nodes[i].name.clone(),
                during,
                must_be_503,
                status,
                retry_after,
                error,
                latency_ms,
            });
        }
    }

    /// Measures, on each given node, the time from `back` until /readyz answers 200.
    async fn measure_recovery(&self, which: &[usize], after: FaultKind, back: Instant) {
        let limit = self.settings.recovery_limit * 3;
        let waits = which.iter().map(|&i| {
            let url = self.nodes[i].url.clone();
            let client = self.client.clone();
            async move { (i, await_ready(&client, &url, back, limit).await) }
        });
        for (i, ms) in join_all(waits).await {
            let node = self.nodes[i].name.clone();
            self.say(&format!(
                "  {node} ready again {}",
                ms.map_or_else(
                    || format!("NOT within {} s", limit.as_secs()),
                    |ms| format!("after {ms:.0} ms")
                )
            ));
            self.log
                .lock()
                .unwrap()
                .recoveries
                .push(Recovery { after, node, ms });
        }
    }

    async fn crash_pg(&mut self) {
        let outage = Duration::from_millis(self.rng.gen_range(1000..=3000));
        if let Err(e) = self.cluster.crash().await {
            self.violation("nemesis", format!("could not crash PostgreSQL: {e}"));
            return;
        }
        let started = Instant::now();
        let start_us = now_us();
        self.say(&format!(
            "PostgreSQL crashed (pg_ctl stop -m immediate); down for {} ms",
            outage.as_millis()
        ));
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        self.probe_during(&all, FaultKind::CrashPg, true).await;
        if let Some(rest) = outage.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        let mut result = self.cluster.start().await;
        for _ in 0..3 {
            if result.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            result = self.cluster.start().await;
        }
        if let Err(e) = result {
            self.violation("nemesis", format!("PostgreSQL did not come back: {e}"));
            return;
        }
        let back = Instant::now();
        self.say(&format!(
            "PostgreSQL restarted (crash recovery done, accepting connections) after {} ms down",
            started.elapsed().as_millis()
        ));
        self.record(FaultKind::CrashPg, "postgres".into(), start_us);
        self.measure_recovery(&all, FaultKind::CrashPg, back).await;
    }

    fn proxied(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].proxied)
            .collect()
    }

    async fn cut_link(&mut self) {
        let proxied = self.proxied();
        if proxied.is_empty() {
            return;
        }
        let outage = Duration::from_millis(self.rng.gen_range(1000..=2500));
        self.proxy.cut();
        let started = Instant::now();
        let start_us = now_us();
        let names: Vec<&str> = proxied
            .iter()
            .map(|&i| self.nodes[i].name.as_str())
            .collect();
        let target = format!("{}<->postgres", names.join(","));
        self.say(&format!(
            "cut {target}: connections reset, new ones closed, for {} ms",
            outage.as_millis()
        ));
        self.probe_during(&proxied, FaultKind::ProxyCut, true).await;
        if let Some(rest) = outage.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        self.proxy.heal();
        let back = Instant::now();
        self.say(&format!(
            "healed {target} after {} ms",
            started.elapsed().as_millis()
        ));
        self.record(FaultKind::ProxyCut, target, start_us);
        self.measure_recovery(&proxied, FaultKind::ProxyCut, back)
            .await;
    }

    async fn stall_link(&mut self) {
        let proxied = self.proxied();
        if proxied.is_empty() {
            return;
        }
        // Long enough, usually, to outlast fencegate's request timeout (3 s here): requests then
        // time out while their statements are stuck on the link, which is the cancellation path.
        let outage = Duration::from_millis(self.rng.gen_range(2000..=6000));
        self.proxy.stall();
        let started = Instant::now();
        let start_us = now_us();
        let names: Vec<&str> = proxied
            .iter()
            .map(|&i| self.nodes[i].name.as_str())
            .collect();
        let target = format!("{}<->postgres", names.join(","));
        self.say(&format!(
            "stall {target}: no bytes delivered either way for {} ms",
            outage.as_millis()
        ));
        // The answer may be 503 or, if the stall ends meanwhile, 200; it must not be a hang.
        self.probe_during(&proxied, FaultKind::ProxyStall, false)
            .await;
        if let Some(rest) = outage.checked_sub(started.elapsed()) {
            tokio::time::sleep(rest).await;
        }
        self.proxy.heal();
        let back = Instant::now();
        self.say(&format!(
            "healed {target} after {} ms",
            started.elapsed().as_millis()
        ));
        self.record(FaultKind::ProxyStall, target, start_us);
        self.measure_recovery(&proxied, FaultKind::ProxyStall, back)
            .await;
    }
}
