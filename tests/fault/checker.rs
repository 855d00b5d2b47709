//! The checker: judges the recorded history, the nemesis's log and the final state.
//!
//! Operations are reassembled from their attempts: an op is `ok` if any attempt was
//! acknowledged, else `info` (unknown) if any attempt's outcome is unknown, else `fail`. Real-time
//! order is "completed before the other was invoked" on the shared wall clock; since an invoke is
//! recorded before its request is sent and a completion after its response arrived, the moment
//! the server acted always lies inside the recorded interval, so every rule below is sound:
//! a violation is a real one, not an artefact of timing.
//!
//! 1. Fencing: no accepted write carries a token lower than one already acknowledged for the
//!    fence (an acknowledged grant, which claims the scope, or an acknowledged write). Grants are
//!    unique and increase in real time. A 412 reports a fence above the presented token.
//! 2. No acknowledged write is lost: the final value is the one of the acknowledged write with
//!    the highest token, or of an unknown-outcome write with a higher token. All fencegate
//!    processes and the table itself agree on it; the scope's fence and the lock's token are at
//!    least every acknowledged token.
//! 3. No lost update: acknowledged <= final <= acknowledged + unknown; acknowledged writes,
//!    ordered by token, wrote strictly increasing values; every read saw at least the writes
//!    acknowledged before it began and at most those begun before it ended.
//! 4. Availability: never a 5xx other than 503, every 503 has Retry-After, no request timed out
//!    (unless its worker was frozen meanwhile), no connection failed except to a fencegate being
//!    killed; `/readyz` was 503 while the database was unreachable and 200 again within the
//!    limit; writes succeeded again after every fault, and after healing; no fencegate process
//!    died on its own.
//! 5. No leaked transactions: after every fault (and at the end) no fencegate database session
//!    sits `idle in transaction` (checked by the nemesis in `pg_stat_activity`): such a session
//!    answers the next statements it is given without committing them, and its row locks block
//!    every other writer.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::history::{Event, Kind, Op};
use crate::nemesis::{Fault, FaultKind, NemesisLog};

/// The counter as read at the end, through every fencegate and straight from the table.
#[derive(Debug, Default, Clone)]
pub struct FinalState {
    /// `GET /v1/kv/{key}` through each fencegate.
    pub http: Vec<NodeRead>,
    /// `fencegate_kv` row: (value, fence_token, deleted).
    pub sql: Option<(Option<i64>, u64, bool)>,
    /// `fencegate_fences` for the scope `counter`.
    pub scope_fence: Option<u64>,
    /// `fencegate_locks.token` for the lock `counter` (highest token ever granted).
    pub lock_token: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct NodeRead {
    pub node: String,
    pub status: Option<u16>,
    pub value: Option<i64>,
    pub token: Option<u64>,
}

pub struct Input<'a> {
    pub events: &'a [Event],
    pub nemesis: &'a NemesisLog,
    pub final_state: &'a FinalState,
    /// Violations found outside the history (a worker that crashed, ...).
    pub external: &'a [(&'static str, String)],
    /// All faults were over (healed) at this time.
    pub healed_us: u64,
    pub recovery_limit_ms: f64,
    pub t0_us: u64,
}

#[derive(Debug, Clone)]
struct Attempt {
    invoke: Event,
    done: Option<Event>,
}

#[derive(Debug, Clone)]
struct OpRec {
    process: String,
    op_id: u64,
    op: Op,
    attempts: Vec<Attempt>,
    outcome: Kind,
    /// First attempt's invoke.
    invoke_us: u64,
    /// Completion of the acknowledged attempt.
    ack_us: Option<u64>,
    token: Option<u64>,
    write: Option<i64>,
    read: Option<i64>,
}

pub struct Report {
    pub violations: Vec<String>,
    /// Violations per rule (e.g. `1-fencing` -> 3).
    pub rules: BTreeMap<&'static str, usize>,
    pub summary: String,
}

const MAX_LISTED: usize = 20;

struct Violations {
    by_rule: BTreeMap<&'static str, Vec<String>>,
}

impl Violations {
    fn add(&mut self, rule: &'static str, msg: String) {
        self.by_rule.entry(rule).or_default().push(msg);
    }

    fn flatten(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (rule, list) in &self.by_rule {
            for msg in list.iter().take(MAX_LISTED) {
                out.push(format!("[{rule}] {msg}"));
            }
            if list.len() > MAX_LISTED {
                out.push(format!("[{rule}] ... and {} more", list.len() - MAX_LISTED));
            }
        }
        out
    }

    fn count(&self) -> usize {
        self.by_rule.values().map(Vec::len).sum()
    }
}

fn assemble(events: &[Event]) -> (Vec<OpRec>, Vec<String>) {
    let mut problems = Vec::new();
    let mut attempts: BTreeMap<(String, u64, Op, u32), Attempt> = BTreeMap::new();
    for ev in events {
        let key = (ev.process.clone(), ev.op_id, ev.op, ev.attempt);
        match ev.kind {
            Kind::Invoke => {
                if attempts
                    .insert(
                        key,
                        Attempt {
                            invoke: ev.clone(),
                            done: None,
                        },
                    )
                    .is_some()
                {
                    problems.push(format!(
                        "{} op {} {} attempt {}: invoked twice",
                        ev.process,
                        ev.op_id,
                        ev.op.name(),
                        ev.attempt
                    ));
                }
            }
            _ => match attempts.get_mut(&key) {
                Some(a) if a.done.is_none() => a.done = Some(ev.clone()),
                _ => problems.push(format!(
                    "{} op {} {} attempt {}: completion without a pending invoke",
                    ev.process,
                    ev.op_id,
                    ev.op.name(),
                    ev.attempt
                )),
            },
        }
    }
    let mut ops: BTreeMap<(String, u64, Op), Vec<Attempt>> = BTreeMap::new();
    for ((process, op_id, op, _), a) in attempts {
        ops.entry((process, op_id, op)).or_default().push(a);
    }
    let recs = ops
        .into_iter()
        .map(|((process, op_id, op), attempts)| {
            let ok = attempts
                .iter()
                .find(|a| a.done.as_ref().is_some_and(|d| d.kind == Kind::Ok));
            let outcome = if ok.is_some() {
                Kind::Ok
            } else if attempts
                .iter()
                .any(|a| !matches!(&a.done, Some(d) if d.kind != Kind::Info))
            {
                // (no completion at all, a process that ended mid-request, is unknown too)
                Kind::Info
            } else {
                Kind::Fail
            };
            let ack = ok.and_then(|a| a.done.clone());
            OpRec {
                invoke_us: attempts.iter().map(|a| a.invoke.t).min().unwrap_or(0),
                ack_us: ack.as_ref().map(|d| d.t),
                token: ack
                    .as_ref()
                    .and_then(|d| d.token)
                    .or(attempts[0].invoke.token),
                write: attempts[0].invoke.write,
                read: ack.as_ref().and_then(|d| d.read),
                process,
                op_id,
                op,
                attempts,
                outcome,
            }
        })
        .collect();
    (recs, problems)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Max token among (ack_us, token) acknowledged strictly before `t`; `acks` sorted by ack_us,
/// `prefix_max[i]` = max token of acks[..=i].
fn max_acked_before(acks: &[(u64, u64)], prefix_max: &[u64], t: u64) -> Option<u64> {
    let n = acks.partition_point(|&(ack, _)| ack < t);
    (n > 0).then(|| prefix_max[n - 1])
}

fn sorted_with_prefix_max(mut acks: Vec<(u64, u64)>) -> (Vec<(u64, u64)>, Vec<u64>) {
    acks.sort();
    let mut prefix = Vec::with_capacity(acks.len());
    let mut m = 0;
    for &(_, tok) in &acks {
        m = m.max(tok);
        prefix.push(m);
    }
    (acks, prefix)
}

pub fn check(input: &Input) -> Report {
    let mut v = Violations {
        by_rule: BTreeMap::new(),
    };
    let t0 = input.t0_us;
    let at = |t: u64| crate::nemesis::stamp(t0, t);
    let (ops, problems) = assemble(input.events);
    for p in problems {
        v.add("history", p);
    }
    for (rule, msg) in input.external {
        v.add(rule, msg.clone());
    }
    for (rule, msg) in &input.nemesis.violations {
        v.add(rule, msg.clone());
    }
    let faults = &input.nemesis.faults;
    let pauses_of = |process: &str| -> Vec<&Fault> {
        faults
            .iter()
            .filter(|f| f.kind == FaultKind::Pause && f.target == process)
            .collect()
    };
    let paused_during = |process: &str, from: u64, to: u64| {
        pauses_of(process)
            .iter()
            .any(|f| overlaps((f.start_us, f.end_us), (from, to)))
    };

    // ---------- 4 (client side): every response, every failed request ----------
    let mut timeouts_excused = 0usize;
    let mut conn_errors_excused = 0usize;
    let mut n503 = 0usize;
    let mut max_latency: f64 = 0.0;
    for op in &ops {
        for a in &op.attempts {
            let Some(d) = &a.done else { continue };
            let what = format!(
                "{} op {} {} attempt {} on n{} at {}",
                op.process,
                op.op_id,
                op.op.name(),
                a.invoke.attempt,
                a.invoke.node.unwrap_or(99),
                at(a.invoke.t)
            );
            if let Some(ms) = d.latency_ms {
                if !paused_during(&op.process, a.invoke.t, d.t) {
                    max_latency = max_latency.max(ms);
                }
            }
            if let Some(status) = d.status {
                let expected: &[u16] = match op.op {
                    Op::Acquire => &[201, 409, 503],
                    Op::Read => &[200, 404, 503],
                    Op::Write => &[200, 201, 412, 503],
                    Op::Release => &[200, 409, 503],
                };
                if status == 503 {
                    n503 += 1;
                    if d.retry_after != Some(true) {
                        v.add(
                            "4-503-retry-after",
                            format!("{what}: 503 without Retry-After"),
                        );
                    }
                } else if status >= 500 {
                    v.add("4-no-500", format!("{what}: HTTP {status}"));
                } else if !expected.contains(&status) {
                    v.add("4-unexpected-status", format!("{what}: HTTP {status}"));
                }
            }
            if let Some(err) = &d.error {
                if err == "timeout" {
                    if paused_during(&op.process, a.invoke.t, d.t) {
                        timeouts_excused += 1;
                    } else {
                        v.add(
                            "4-no-hang",
                            format!("{what}: no answer within the client timeout ({err})"),
                        );
                    }
                } else if err.starts_with("connect") || err.starts_with("io") {
                    let node = format!("n{}", a.invoke.node.unwrap_or(99));
                    let killed = faults.iter().any(|f| {
                        f.kind == FaultKind::KillNode
                            && f.target == node
                            && overlaps(
                                (f.start_us.saturating_sub(200_000), f.end_us + 1_000_000),
                                (a.invoke.t, d.t),
                            )
                    });
                    if killed {
                        conn_errors_excused += 1;
                    } else {
                        v.add(
                            "4-connection",
                            format!("{what}: {err} (that fencegate was not being killed)"),
                        );
                    }
                } else {
                    v.add("4-bad-body", format!("{what}: {err}"));
                }
            }
        }
    }

    // ---------- tokens: grants unique and increasing in real time ----------
    let grants: Vec<&OpRec> = ops
        .iter()
        .filter(|o| o.op == Op::Acquire && o.outcome == Kind::Ok)
        .collect();
    let mut seen: HashMap<u64, &OpRec> = HashMap::new();
    for g in &grants {
        let tok = g.token.unwrap_or(0);
        if let Some(other) = seen.insert(tok, g) {
            v.add(
                "1-grants",
                format!(
                    "token {tok} granted twice: to {} op {} and {} op {}",
                    other.process, other.op_id, g.process, g.op_id
                ),
            );
        }
    }
    let (grant_acks, grant_max) = sorted_with_prefix_max(
        grants
            .iter()
            .map(|g| (g.ack_us.unwrap(), g.token.unwrap_or(0)))
            .collect(),
    );
    for g in &grants {
        let tok = g.token.unwrap_or(0);
        if let Some(m) = max_acked_before(&grant_acks, &grant_max, g.invoke_us) {
            if m >= tok {
                v.add(
                    "1-grants",
                    format!(
                        "{} op {} was granted token {tok} at {} after token {m} had been granted",
                        g.process,
                        g.op_id,
                        at(g.invoke_us)
                    ),
                );
            }
        }
    }

    // ---------- 1: fencing ----------
    let writes: Vec<&OpRec> = ops.iter().filter(|o| o.op == Op::Write).collect();
    let ok_writes: Vec<&OpRec> = writes
        .iter()
        .copied()
        .filter(|o| o.outcome == Kind::Ok)
        .collect();
    let info_writes: Vec<&OpRec> = writes
        .iter()
        .copied()
        .filter(|o| o.outcome == Kind::Info)
        .collect();
    let mut fence_acks: Vec<(u64, u64)> = grant_acks.clone();
    fence_acks.extend(
        ok_writes
            .iter()
            .map(|w| (w.ack_us.unwrap(), w.token.unwrap_or(0))),
    );
    let (fence_acks, fence_max) = sorted_with_prefix_max(fence_acks);
    let mut zombies_accepted = 0usize;
    for w in &ok_writes {
        let tok = w.token.unwrap_or(0);
        if let Some(m) = max_acked_before(&fence_acks, &fence_max, w.invoke_us) {
            if tok < m {
                zombies_accepted += 1;
                v.add(
                    "1-fencing",
                    format!(
                        "{} op {} wrote {:?} with token {tok} (invoked {}, acknowledged {}) although token {m} had already been acknowledged for its fence: a zombie write was accepted",
                        w.process, w.op_id, w.write, at(w.invoke_us), at(w.ack_us.unwrap())
                    ),
                );
            }
        }
    }
    let mut stale_412 = 0usize;
    for w in &writes {
        for a in &w.attempts {
            let Some(d) = &a.done else { continue };
            if d.status == Some(412) {
                stale_412 += 1;
                match d.current_token {
                    Some(cur) if cur > w.token.unwrap_or(0) => {}
                    other => v.add(
                        "1-fencing",
                        format!("{} op {}: 412 for token {:?} reports current_token {other:?} (must be higher)", w.process, w.op_id, w.token),
                    ),
                }
            }
        }
    }

    // ---------- 3: no lost update (chain and reads) ----------
    let mut by_token: Vec<&OpRec> = ok_writes.clone();
    by_token.sort_by_key(|w| (w.token, w.write));
    for pair in by_token.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.token == b.token && a.write == b.write {
            continue;
        }
        if a.token == b.token {
            v.add(
                "3-lost-update",
                format!(
                    "token {:?} acknowledged two different values {:?} and {:?}",
                    a.token, a.write, b.write
                ),
            );
        } else if a.write >= b.write {
            v.add(
                "3-lost-update",
                format!(
                    "acknowledged writes out of order: {} op {} wrote {:?} with token {:?}, then {} op {} wrote {:?} with the higher token {:?} (a lost update)",
                    a.process, a.op_id, a.write, a.token, b.process, b.op_id, b.write, b.token
                ),
            );
        }
    }
    let mut acked_times: Vec<u64> = ok_writes.iter().map(|w| w.ack_us.unwrap()).collect();
    acked_times.sort_unstable();
    let mut maybe_times: Vec<u64> = ok_writes
        .iter()
        .chain(info_writes.iter())
        .map(|w| w.invoke_us)
        .collect();
    maybe_times.sort_unstable();
    for r in ops
        .iter()
        .filter(|o| o.op == Op::Read && o.outcome == Kind::Ok)
    {
        let a = r
            .attempts
            .iter()
            .find(|a| a.done.as_ref().is_some_and(|d| d.kind == Kind::Ok))
            .unwrap();
        let (from, to) = (a.invoke.t, a.done.as_ref().unwrap().t);
        let value = r.read.unwrap_or(-1);
        let at_least = acked_times.partition_point(|&t| t < from) as i64;
        let at_most = maybe_times.partition_point(|&t| t < to) as i64;
        if value < at_least {
            v.add("3-reads", format!("{} op {} read {value} at {} but {at_least} increments had been acknowledged before (a lost write)", r.process, r.op_id, at(from)));
        }
        if value > at_most {
            v.add(
                "3-reads",
                format!(
                    "{} op {} read {value} at {} but only {at_most} increments had been attempted",
                    r.process,
                    r.op_id,
                    at(from)
                ),
            );
        }
    }

    // ---------- 2 and 3: the final state ----------
    let fs = input.final_state;
    let acked = ok_writes.len() as i64;
    let unknown = info_writes.len() as i64;
    let final_value;
    let final_token;
    match &fs.sql {
        Some((value, token, deleted)) => {
            final_value = *value;
            final_token = Some(*token);
            if *deleted || value.is_none() {
                v.add(
                    "2-final",
                    format!("the counter row is deleted or empty: {:?}", fs.sql),
                );
            }
        }
        None => {
            final_value = None;
            final_token = None;
            if acked > 0 {
                v.add("2-final", format!("the counter does not exist in fencegate_kv after {acked} acknowledged writes"));
            }
        }
    }
    for r in &fs.http {
        if r.status != Some(200) || r.value != final_value || r.token != final_token {
            v.add(
                "2-final",
                format!(
                    "{} serves the counter as (HTTP {:?}, value {:?}, token {:?}), the table holds (value {final_value:?}, token {final_token:?})",
                    r.node, r.status, r.value, r.token
                ),
            );
        }
    }
    let hi_ok = ok_writes.iter().max_by_key(|w| w.token);
    if ok_writes.is_empty() {
        v.add(
            "2-final",
            "no write was acknowledged at all: the run proves nothing".into(),
        );
    }
    if let (Some(hi), Some(tf), Some(value)) = (hi_ok, final_token, final_value) {
        let hi_tok = hi.token.unwrap_or(0);
        if tf < hi_tok {
            v.add(
                "2-lost-write",
                format!("final token {tf} (value {value}) is below the acknowledged write of token {hi_tok} (value {:?}): an acknowledged write was lost", hi.write),
            );
        } else if tf == hi_tok {
            if hi.write != Some(value) {
                v.add("2-lost-write", format!("final value {value} under token {tf}, but the acknowledged write with that token wrote {:?}", hi.write));
            }
        } else if !info_writes
            .iter()
            .any(|w| w.token == Some(tf) && w.write == Some(value))
        {
            v.add(
                "2-final",
                format!("final state (value {value}, token {tf}) is explained by no write in the history (highest acknowledged: token {hi_tok}, value {:?})", hi.write),
            );
        }
    }
    if let Some(value) = final_value {
        if value < acked || value > acked + unknown {
            v.add(
                "3-lost-update",
                format!("final counter {value}, but {acked} increments were acknowledged and {unknown} had an unknown outcome: expected {acked} <= final <= {}", acked + unknown),
            );
        }
    }
    let max_grant = grants.iter().filter_map(|g| g.token).max().unwrap_or(0);
    let max_written = ok_writes.iter().filter_map(|w| w.token).max().unwrap_or(0);
    match fs.scope_fence {
        Some(f) if f >= max_grant.max(max_written) => {}
        other => v.add("2-final", format!("the fence of scope counter is {other:?}, below acknowledged tokens (grant {max_grant}, write {max_written})")),
    }
    match fs.lock_token {
        Some(t) if t >= max_grant => {}
        other => v.add("2-final", format!("fencegate_locks.token for counter is {other:?}, below the acknowledged grant {max_grant}")),
    }

    // ---------- 4 (server side): readiness during and after outages, progress after healing ----------
    for p in &input.nemesis.probes {
        let what = format!(
            "/readyz on {} during {} at {}",
            p.node,
            p.during.name(),
            at(p.t_us)
        );
        match (p.status, &p.error) {
            (_, Some(err)) => v.add(
                "4-no-hang",
                format!("{what}: {err} after {:.0} ms", p.latency_ms),
            ),
            (Some(503), None) if !p.retry_after => v.add(
                "4-503-retry-after",
                format!("{what}: 503 without Retry-After"),
            ),
            (Some(503), None) => {}
            (Some(s), None) if p.must_be_503 => v.add(
                "4-readyz",
                format!("{what}: HTTP {s} while the database was unreachable (expected 503)"),
            ),
            (Some(s), None) if s != 200 => v.add("4-readyz", format!("{what}: HTTP {s}")),
            _ => {}
        }
    }
    for r in &input.nemesis.recoveries {
        match r.ms {
            Some(ms) if ms <= input.recovery_limit_ms => {}
            Some(ms) => v.add(
                "4-recovery",
                format!(
                    "{} was ready {ms:.0} ms after {} ended (limit {:.0} ms)",
                    r.node,
                    r.after.name(),
                    input.recovery_limit_ms
                ),
            ),
            None => v.add(
                "4-recovery",
                format!("{} never became ready after {}", r.node, r.after.name()),
            ),
        }
    }
    // Progress between faults: once an infrastructure fault is over, writes must succeed again
    // before the next one begins (a wedge that outlives its fault is a violation of its own,
    // even if the service looks "ready").
    let mut infra: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.kind != FaultKind::Pause)
        .collect();
    infra.sort_by_key(|f| f.start_us);
    let mut ok_acks: Vec<u64> = ok_writes.iter().map(|w| w.ack_us.unwrap()).collect();
    ok_acks.sort_unstable();
    for (i, f) in infra.iter().enumerate() {
        let until = infra
            .get(i + 1)
            .map_or(input.healed_us, |next| next.start_us);
        if until <= f.end_us || until - f.end_us < 2_000_000 {
            continue;
        }
        let first = ok_acks.partition_point(|&t| t < f.end_us);
        if !matches!(ok_acks.get(first), Some(&t) if t <= until) {
            v.add(
                "4-progress",
                format!(
                    "no write was acknowledged in the {:.1} s between the end of {} on {} at {} and {}: the service did not recover",
                    (until - f.end_us) as f64 / 1e6,
                    f.kind.name(),
                    f.target,
                    at(f.end_us),
                    if i + 1 < infra.len() { "the next fault" } else { "healing" }
                ),
            );
        }
    }
    let after_heal = ok_writes
        .iter()
        .filter(|w| w.invoke_us >= input.healed_us)
        .count();
    if after_heal == 0 {
        v.add(
            "4-progress",
            "no write was acknowledged after the faults were healed".into(),
        );
    }

    // ---------- summary ----------
    let mut s = String::new();
    let count = |op: Op, kind: Kind| {
        ops.iter()
            .filter(|o| o.op == op && o.outcome == kind)
            .count()
    };
    writeln!(s, "operations (logical; retries of one write count once):").unwrap();
    let reasons = |op: Op, kind: Kind| -> String {
        let mut by: BTreeMap<String, usize> = BTreeMap::new();
        for o in ops.iter().filter(|o| o.op == op && o.outcome == kind) {
            let last = o
                .attempts
                .iter()
                .rev()
                .find_map(|a| a.done.as_ref().filter(|d| d.kind == kind));
            let why = match last {
                None => "no answer".to_string(),
                Some(d) => match (d.status, &d.error) {
                    (Some(st), _) => st.to_string(),
                    (None, Some(e)) => e.split(':').next().unwrap_or("").to_string(),
                    (None, None) => "?".into(),
                },
            };
            *by.entry(why).or_default() += 1;
        }
        if by.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                by.iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    };
    for op in Op::ALL {
        writeln!(
            s,
            "  {:<8} ok {:>6}   fail {:>5}{}   unknown {:>4}{}",
            op.name(),
            count(op, Kind::Ok),
            count(op, Kind::Fail),
            reasons(op, Kind::Fail),
            count(op, Kind::Info),
            reasons(op, Kind::Info),
        )
        .unwrap();
    }
    let retried = writes.iter().filter(|w| w.attempts.len() > 1).count();
    writeln!(
        s,
        "  write attempts {} ({} writes retried after an unknown outcome)",
        writes.iter().map(|w| w.attempts.len()).sum::<usize>(),
        retried
    )
    .unwrap();

    writeln!(s, "faults injected:").unwrap();
    for kind in FaultKind::ALL.into_iter().chain(FaultKind::HA) {
        let list: Vec<&Fault> = faults.iter().filter(|f| f.kind == kind).collect();
        if FaultKind::HA.contains(&kind) && list.is_empty() {
            continue;
        }
        let extra = match kind {
            FaultKind::Pause => format!(
                " ({} while holding the lock)",
                list.iter().filter(|f| f.held_token.is_some()).count()
            ),
            _ => String::new(),
        };
        let total_ms: u64 = list.iter().map(|f| (f.end_us - f.start_us) / 1000).sum();
        writeln!(
            s,
            "  {:<15} {:>3}{extra}, {:.1} s in total",
            kind.name(),
            list.len(),
            total_ms as f64 / 1000.0
        )
        .unwrap();
    }

    // Zombies: writes refused as stale; "after a pause" if the worker was frozen between its
    // grant and that write.
    let grant_of: HashMap<(&str, u64), &OpRec> = grants
        .iter()
        .map(|g| ((g.process.as_str(), g.op_id), *g))
        .collect();
    let mut zombie_after_pause = 0usize;
    let mut zombie_other = 0usize;
    for w in writes.iter().filter(|w| {
        w.attempts
            .iter()
            .any(|a| a.done.as_ref().is_some_and(|d| d.status == Some(412)))
    }) {
        let since = grant_of
            .get(&(w.process.as_str(), w.op_id))
            .and_then(|g| g.ack_us)
            .unwrap_or(w.invoke_us);
        let refused_at = w
            .attempts
            .iter()
            .find(|a| a.done.as_ref().is_some_and(|d| d.status == Some(412)))
            .unwrap()
            .invoke
            .t;
        if paused_during(&w.process, since, refused_at) {
            zombie_after_pause += 1;
        } else {
            zombie_other += 1;
        }
    }
    writeln!(
        s,
        "zombie writes rejected (412): {zombie_after_pause} after a pause past the lease, {zombie_other} others (lease lost while retrying); 412 responses {stale_412}; zombie writes ACCEPTED: {zombies_accepted}"
    )
    .unwrap();
    let timeouts = ops
        .iter()
        .flat_map(|o| &o.attempts)
        .filter(|a| {
            a.done
                .as_ref()
                .is_some_and(|d| d.error.as_deref() == Some("timeout"))
        })
        .count();
    let conn = ops
        .iter()
        .flat_map(|o| &o.attempts)
        .filter(|a| {
            a.done.as_ref().is_some_and(|d| {
                d.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("connect") || e.starts_with("io"))
            })
        })
        .count();
    let n5xx = ops
        .iter()
        .flat_map(|o| &o.attempts)
        .filter(|a| {
            a.done
                .as_ref()
                .is_some_and(|d| d.status.is_some_and(|st| st >= 500 && st != 503))
        })
        .count();
    writeln!(
        s,
        "client view: {n503} x 503 (all must carry Retry-After), {n5xx} x other 5xx, {timeouts} timeouts ({timeouts_excused} while the worker was frozen), {conn} connection failures ({conn_errors_excused} to a fencegate being killed); slowest answer {max_latency:.0} ms (frozen workers excluded)"
    )
    .unwrap();
    let probes = &input.nemesis.probes;
    let p503 = probes.iter().filter(|p| p.status == Some(503)).count();
    writeln!(
        s,
        "/readyz during outages: {} probes, {p503} x 503, slowest {:.0} ms",
        probes.len(),
        probes.iter().map(|p| p.latency_ms).fold(0.0, f64::max)
    )
    .unwrap();
    for kind in [
        FaultKind::CrashPg,
        FaultKind::ProxyCut,
        FaultKind::ProxyStall,
        FaultKind::KillNode,
        FaultKind::Failover,
        FaultKind::Switchover,
        FaultKind::KillLeader,
    ] {
        let times: Vec<f64> = input
            .nemesis
            .recoveries
            .iter()
            .filter(|r| r.after == kind)
            .filter_map(|r| r.ms)
            .collect();
        if !times.is_empty() {
            let max = times.iter().cloned().fold(0.0, f64::max);
            let mean = times.iter().sum::<f64>() / times.len() as f64;
            writeln!(
                s,
                "  ready again after {:<15} {} measurements, mean {mean:.0} ms, max {max:.0} ms",
                kind.name(),
                times.len()
            )
            .unwrap();
        }
    }
    writeln!(
        s,
        "final: counter {final_value:?} under token {final_token:?}; acknowledged increments {acked}, unknown {unknown}: {acked} <= {} <= {}; scope fence {:?}, lock token {:?}; {after_heal} writes acknowledged after healing",
        final_value.map_or("?".into(), |x| x.to_string()),
        acked + unknown,
        fs.scope_fence,
        fs.lock_token
    )
    .unwrap();
    writeln!(s, "violations: {}", v.count()).unwrap();
    for (rule, list) in &v.by_rule {
        writeln!(s, "  {rule}: {}", list.len()).unwrap();
    }
    let rules = v
        .by_rule
        .iter()
        .map(|(rule, list)| (*rule, list.len()))
        .collect();
    Report {
        violations: v.flatten(),
        rules,
        summary: s,
    }
}
