//! Write coalescing: concurrent single-key writes, unscoped and scoped, share statements.
//!
//! A PostgreSQL client that sends one upsert per request pays one round trip and one commit
//! (an fsync) per write. fencegate sees many concurrent writers at once, so it can do what no
//! single client can: combine the writes that are waiting into ONE multi-row fenced upsert
//! (`unnest` arrays, per-row tokens), committed once. Each request still gets its own outcome:
//! a row comes back for each key the fence admitted; a missing row means that write was stale.
//!
//! - Batches come from [`super::batching::WorkQueue`]: no timer (a lone write goes out at once,
//!   as a one-row statement), at most `max_rows` writes per batch, a bounded queue.
//! - A batch is split into rounds, one statement each. A round holds each key at most once (ON
//!   CONFLICT cannot touch a row twice in one statement), and each scope with one token: the
//!   statement claims that scope's fence once, and every write of the group is applied iff the
//!   claim was. Under the inclusive rule that is what applying them one by one would do (the
//!   first raises the fence to the token, the rest are equal to it); under the strict rule a
//!   token writes once, so there a scope takes one write per round.
//! - Unscoped rounds run in one transaction and share one commit, which is what makes a hot
//!   key fast. Scoped rounds run each as its own statement (autocommit): a hot scope needs only
//!   one round, and a statement of its own keeps the lock order of every statement "fences,
//!   then rows", so no two can deadlock.
//! - Writes to one key or scope that wait together are applied in token order (equal tokens
//!   in arrival order). Every write in a drained batch is in flight at once, none has been
//!   answered, so any order among them is a valid (linearizable) history; token order is the
//!   one in which the fence refuses the fewest. In arrival order, concurrent writers with
//!   climbing tokens (a hot key) saw most of their writes refused only because a higher token
//!   overtook them in the queue. A write answered before another was sent is still applied
//!   before it: it was in an earlier batch. Each write is still checked by the fence in the
//!   database.
//! - If the database refuses a combined statement, its writes are retried one by one, so one
//!   bad value cannot fail its neighbours. Only a refusal is retried: it committed nothing,
//!   whereas after a lost connection or an undecodable reply the writes may have been applied.
//! - 2xx only after commit: replies are sent after the statement or transaction committed.
//! - A fence row held by another transaction (a SQL writer's after `fencegate.fence()`) holds up
//!   only the writes under that scope. A worker's scoped statement waits at most
//!   [`BRIEF_LOCK_WAIT_MS`](super::sql::BRIEF_LOCK_WAIT_MS) for a lock; if it gives up, nothing
//!   of it was written, and the writes of each scope it held are tried again on their own, so
//!   one held scope does not hold up the other scopes of its round. A scope still locked then
//!   gets a lane ([`lanes`]): its writes, and every write under it that arrives while the lane
//!   is open, wait there (at most `database.lock_timeout_ms`, then 503) instead of in the
//!   worker's queue.

mod lanes;

use std::{
    collections::hash_map::Entry,
    sync::Arc,
    time::{Duration, Instant},
};

use sqlx::{
    postgres::{PgArguments, Postgres},
    types::Json,
    Arguments as _, Connection, PgConnection, Row,
};
use tokio::sync::oneshot;

use self::lanes::Lanes;
use super::{
    batching::{FinishOnDrop, WorkQueue},
    connections::Connections,
    sql::Statements,
};
use crate::{
    fence::{FencingToken, Key, Rule, Scope},
    store::{sql::ByRule, StoreError},
};

/// The maps and sets of one batch: foldhash, not the std SipHash, which was the largest hash
/// cost per coalesced write (callgrind). Keys come from requests, but a batch holds at most
/// `database.coalesce_max_rows` of them and lives for one statement, so a flood of colliding
/// keys could cost no more than that batch's own work.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// One queued write. `value: None` is a delete (a tombstone).
pub struct Job {
    pub key: Key,
    pub value: Option<crate::store::Document>,
    pub token: FencingToken,
    pub rule: Rule,
    /// The scope whose fence guards the write; `None`: the key's own fence.
    pub scope: Option<Scope>,
    /// `Some(version)` if applied, `None` if the fence refused it.
    pub reply: oneshot::Sender<Result<Option<i64>, StoreError>>,
}

#[derive(Clone)]
pub struct Coalescer {
    queue: WorkQueue<Job>,
    shared: Arc<Shared>,
}

/// What the workers and the lanes run their statements with.
struct Shared {
    conns: Arc<Connections>,
    sql: Arc<ByRule<Statements>>,
    lanes: Lanes,
}

/// How long a statement may wait for a row lock.
#[derive(Clone, Copy)]
enum Wait {
    /// A worker's: a scoped statement waits at most
    /// [`BRIEF_LOCK_WAIT_MS`](super::sql::BRIEF_LOCK_WAIT_MS) (module docs); an unscoped one,
    /// which locks only kv rows, `database.lock_timeout_ms`.
    Brief,
    /// A lane's: until this instant at most (its oldest write's `database.lock_timeout_ms`).
    Until(Instant),
}

/// The statement for one round: the one-row forms are cheaper to plan and execute when only
/// one write is waiting.
fn statement<'a>(sql: &'a ByRule<Statements>, round: &Round, wait: Wait) -> &'a str {
    let sql = sql.get(round.rule);
    match (round.scoped(), round.jobs.len(), wait) {
        (false, 1, _) => &sql.put_key,
        (false, _, _) => &sql.rows,
        (true, 1, Wait::Brief) => &sql.put_scope_brief,
        (true, _, Wait::Brief) => &sql.scoped_rows_brief,
        (true, 1, Wait::Until(_)) => &sql.put_scope,
        (true, _, Wait::Until(_)) => &sql.scoped_rows,
    }
}

impl Coalescer {
    /// `lock_timeout`: `database.lock_timeout_ms`, the longest a write under a held scope
    /// waits; `lane_connections`: how many held scopes' lanes may wait on the database at once
    /// (each holds a connection while it waits).
    pub(super) fn start(
        conns: Arc<Connections>,
        sql: Arc<ByRule<Statements>>,
        workers: usize,
        max_rows: usize,
        lock_timeout: Duration,
        lane_connections: usize,
    ) -> Self {
        let shared = Arc::new(Shared {
            conns,
            sql,
            lanes: Lanes::new(lock_timeout, lane_connections, max_rows),
        });
        let queue = WorkQueue::start(workers, max_rows, {
            let shared = shared.clone();
            move |jobs: Vec<Job>| serve(shared.clone(), jobs)
        });
        Coalescer { queue, shared }
    }

    /// Queues a write and waits for its outcome.
    pub async fn write(
        &self,
        key: Key,
        value: Option<crate::store::Document>,
        token: FencingToken,
        rule: Rule,
        scope: Option<Scope>,
    ) -> Result<Option<i64>, StoreError> {
        let (reply, outcome) = oneshot::channel();
        let job = Job {
            key,
            value,
            token,
            rule,
            scope,
            reply,
        };
        // A write under a scope that has a lane (its fence is held) waits there, not here.
        let job = match self.shared.lanes.join(job) {
            Ok(()) => {
                return outcome.await.unwrap_or(Err(StoreError::unavailable(
                    "the lane of a held scope running this write is gone",
                )))
            }
            Err(job) => job,
        };
        // Nothing queued and a worker free: this write would go out at once as a batch of one.
        // It is sent from here, the same way a worker would (`settle`), without the hand-off
        // to the worker's task and back: at low load that hand-off was a sizeable part of a
        // lone write's CPU (bench/RESULTS.md). Writes that arrive meanwhile queue for a worker,
        // which takes a permit before it collects them, so a batch still forms behind this one.
        // As a worker's, the work is never abandoned half-way: if this request goes away (a
        // timeout, a disconnect), the rest of it runs on a task of its own (`FinishOnDrop`).
        if let Some(permit) = self.queue.idle() {
            // `serve` is called inside the block, so the block holds its future once (made
            // outside and awaited inside, it held it twice: 9 KB boxed per lone write).
            let shared = self.shared.clone();
            FinishOnDrop::new(async move {
                let _permit = permit;
                serve(shared, vec![job]).await;
            })
            .await;
            return outcome.await.unwrap_or(Err(StoreError::unavailable(
                "the worker running this statement is gone",
            )));
        }
        self.queue.send(job, outcome).await
    }
}

/// Serves a batch of waiting writes, whether a worker took it or a lone write runs itself
/// (`Coalescer::write`): each is answered after its commit.
async fn serve(shared: Arc<Shared>, jobs: Vec<Job>) {
    crate::telemetry::coalesced_rows().record(jobs.len() as f64);
    run_rounds(&shared, split_rounds(jobs)).await;
}

/// A statement's worth of writes: one rule, all scoped or all unscoped, each key at most once
/// and each scope with one token. Never empty.
struct Round {
    rule: Rule,
    jobs: Vec<Job>,
}

impl Round {
    fn scoped(&self) -> bool {
        self.jobs[0].scope.is_some()
    }
}

/// Splits waiting writes into rounds (module docs: what a round may hold), so that writes to
/// one key or scope apply in token order (module docs: why that order is a valid one).
fn split_rounds(mut jobs: Vec<Job>) -> Vec<Round> {
    if jobs.len() == 1 {
        // A lone write, the usual case at low load: nothing to order or split.
        return vec![Round {
            rule: jobs[0].rule,
            jobs,
        }];
    }
    jobs.sort_by_key(|job| job.token); // stable: equal tokens keep their arrival order
    let mut rounds = Vec::new();
    while !jobs.is_empty() {
        let (rule, scoped) = (jobs[0].rule, jobs[0].scope.is_some());
        // Which jobs join this round, decided on borrowed keys and scopes (no copy of either
        // per write), then the jobs split by it.
        let joins: Vec<bool> = {
            let mut keys: HashSet<&str> = HashSet::default();
            let mut claims: HashMap<&Scope, FencingToken> = HashMap::default();
            jobs.iter()
                .map(|job| {
                    if job.rule != rule
                        || job.scope.is_some() != scoped
                        || keys.contains(job.key.as_str())
                    {
                        return false;
                    }
                    if let Some(scope) = &job.scope {
                        match claims.entry(scope) {
                            Entry::Vacant(claim) => {
                                claim.insert(job.token);
                            }
                            // The scope's claim in this round is for this token: one more write
                            // under it, if the rule admits a token equal to the fence the claim
                            // leaves.
                            Entry::Occupied(claim)
                                if *claim.get() == job.token
                                    && rule.accepts(job.token, *claim.get()) => {}
                            Entry::Occupied(_) => return false,
                        }
                    }
                    keys.insert(job.key.as_str());
                    true
                })
                .collect()
        };
        let mut joins = joins.into_iter();
        let (round, rest): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|_| joins.next().unwrap_or(false));
        rounds.push(Round { rule, jobs: round });
        jobs = rest;
    }
    rounds
}

/// Applies the rounds and replies to every write, each only after its commit: the unscoped
/// rounds together (one transaction), then each scoped round on its own.
async fn run_rounds(shared: &Arc<Shared>, rounds: Vec<Round>) {
    let (unscoped, scoped): (Vec<Round>, Vec<Round>) =
        rounds.into_iter().partition(|round| !round.scoped());
    if !unscoped.is_empty() {
        settle(shared, unscoped, Wait::Brief).await;
    }
    for round in scoped {
        settle(shared, vec![round], Wait::Brief).await;
    }
}

/// A worker's scoped round gave up waiting for a lock (a fence row held by another
/// transaction): nothing of it was written. The writes of each scope are tried again on their
/// own, briefly; a scope that is still locked (or a round of one scope) goes to its lane.
async fn divert(shared: &Arc<Shared>, rounds: Vec<Round>) {
    for round in rounds {
        let rule = round.rule;
        let mut by_scope: Vec<(Scope, Vec<Job>)> = Vec::new();
        for job in round.jobs {
            let scope = job
                .scope
                .clone()
                .expect("a scoped round's writes have a scope");
            match by_scope.iter_mut().find(|(s, _)| *s == scope) {
                Some((_, jobs)) => jobs.push(job),
                None => by_scope.push((scope, vec![job])),
            }
        }
        if let [_] = by_scope.as_slice() {
            let (scope, jobs) = by_scope.pop().expect("one scope");
            shared.lanes.open(shared, scope, jobs);
            continue;
        }
        for (_, jobs) in by_scope {
            // One scope, one token, each key once: still a round.
            Box::pin(settle(shared, vec![Round { rule, jobs }], Wait::Brief)).await;
        }
    }
}

/// Applies `rounds` atomically (one statement, or one transaction) and replies to their writes.
/// If the database refuses it, nothing was committed, and each write is tried again on its own
/// so that one bad write cannot fail the others.
async fn settle(shared: &Arc<Shared>, rounds: Vec<Round>, wait: Wait) {
    let (conns, sql) = (&*shared.conns, &*shared.sql);
    let writes: usize = rounds.iter().map(|round| round.jobs.len()).sum();
    match apply(conns, sql, &rounds, wait).await {
        Ok(applied) => {
            for (round, applied) in rounds.into_iter().zip(applied) {
                for (i, job) in round.jobs.into_iter().enumerate() {
                    let _ = job.reply.send(Ok(applied.version(i)));
                }
            }
        }
        // A worker's scoped statement found a fence row held (module docs).
        Err(err)
            if matches!(wait, Wait::Brief)
                && err.is_lock_timeout()
                && rounds.iter().all(Round::scoped) =>
        {
            tracing::debug!(error = %err, writes, "a coalesced scoped write found a fence held; its scopes go on apart");
            divert(shared, rounds).await;
        }
        // A write would create a key above the jump cap: the trigger aborted the statement, so
        // nothing was committed. That write is refused (and explained as a jump); the others go
        // out again together, not one by one, so a client sending such writes cannot make
        // everyone's writes cost a statement each. Each pass answers at least one write.
        Err(err) if err.is_key_jump() => {
            tracing::debug!(error = %err, writes, "a coalesced write would create a key above the jump cap");
            let mut rest = rounds;
            match take_jumper(&mut rest, &err) {
                Some(refused) => {
                    for job in refused {
                        let _ = job.reply.send(Ok(None));
                    }
                    if !rest.is_empty() {
                        Box::pin(settle(shared, rest, wait)).await;
                    }
                }
                // The detail names no waiting write: a lone write is the one refused; several are
                // tried one by one, as any other refused statement's.
                None if writes == 1 => {
                    for job in rest.into_iter().flat_map(|round| round.jobs) {
                        let _ = job.reply.send(Ok(None));
                    }
                }
                None => {
                    for round in rest {
                        for job in round.jobs {
                            Box::pin(settle(
                                shared,
                                vec![Round {
                                    rule: round.rule,
                                    jobs: vec![job],
                                }],
                                wait,
                            ))
                            .await;
                        }
                    }
                }
            }
        }
        // Only a statement the database refused is retried: then nothing of it was committed.
        // Any other failure (the connection, or decoding the reply of an autocommit statement
        // that did commit) may have applied the writes, and a retry could apply them twice or,
        // under the strict rule, refuse a write that is in fact applied.
        Err(err) if writes > 1 && refused_whole(&err) => {
            tracing::warn!(error = %err, writes, "combined write failed; retrying its writes one by one");
            for round in rounds {
                for job in round.jobs {
                    // A lone write is never retried again: this recursion is one level deep.
                    Box::pin(settle(
                        shared,
                        vec![Round {
                            rule: round.rule,
                            jobs: vec![job],
                        }],
                        wait,
                    ))
                    .await;
                }
            }
        }
        Err(err) => {
            let mut jobs: Vec<Job> = rounds.into_iter().flat_map(|round| round.jobs).collect();
            // Every caller gets the whole error (the driver's error is shared, not copied).
            let last = jobs.pop();
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
            if let Some(job) = last {
                let _ = job.reply.send(Err(err));
            }
        }
    }
}

/// Splits off the writes a key-jump refusal names (its token and key, read from the error's
/// own fields): the write of that key with that token, in every round it is in. `None` if it
/// names none of them (or none could be read).
fn take_jumper(rounds: &mut Vec<Round>, err: &StoreError) -> Option<Vec<Job>> {
    let (token, key) = err.key_jump_detail()?;
    let mut refused = Vec::new();
    for round in rounds.iter_mut() {
        let jobs = std::mem::take(&mut round.jobs);
        let (out, kept): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|job| job.token.get() == token && job.key.as_str() == key);
        refused.extend(out);
        round.jobs = kept;
    }
    rounds.retain(|round| !round.jobs.is_empty());
    (!refused.is_empty()).then_some(refused)
}

/// Whether the database refused the combined statement itself (so nothing of it was
/// committed, and its writes may be retried one by one): a database error, or a value it
/// cannot store (SQLSTATE class 22).
fn refused_whole(err: &StoreError) -> bool {
    match err {
        StoreError::Internal(cause) => cause.is_database_refusal(),
        StoreError::Refused { .. } => true,
        _ => false,
    }
}

/// One round: a single autocommit statement. Several rounds (a key written more than once
/// while the database was busy, e.g. a hot key): one transaction, so they share one commit
/// instead of paying an fsync each. A lane's rounds run in a transaction that waits for locks
/// until its deadline. Returns, per round, the version of every key applied.
async fn apply(
    conns: &Connections,
    sql: &ByRule<Statements>,
    rounds: &[Round],
    wait: Wait,
) -> Result<Vec<Applied>, StoreError> {
    let left = match wait {
        Wait::Brief => None,
        Wait::Until(deadline) => match deadline.checked_duration_since(Instant::now()) {
            Some(left) if !left.is_zero() => Some(left),
            _ => return Err(lanes::held_too_long()),
        },
    };
    // A held scope's lane may wait for its locks until its deadline: given that, then the margin.
    let limit = conns
        .give_up_after()
        .map(|limit| left.map_or(limit, |left| limit.max(left + limit / 2)));
    crate::store::give_up(limit, async {
        let mut conn = conns.take().await?;
        let applied = apply_on(&mut conn, sql, rounds, wait, left).await?;
        conn.done();
        Ok(applied)
    })
    .await
}

async fn apply_on(
    conn: &mut PgConnection,
    sql: &ByRule<Statements>,
    rounds: &[Round],
    wait: Wait,
    lock_wait: Option<Duration>,
) -> Result<Vec<Applied>, StoreError> {
    if let ([round], None) = (rounds, lock_wait) {
        return Ok(vec![execute(conn, sql, round, wait).await?]);
    }
    let mut tx = conn.begin().await?;
    if let Some(left) = lock_wait {
        sqlx::query("SELECT pg_catalog.set_config('lock_timeout', $1, true)")
            .bind(format!("{}ms", left.as_millis().max(1)))
            .execute(&mut *tx)
            .await?;
    }
    let mut applied = Vec::with_capacity(rounds.len());
    for round in rounds {
        applied.push(execute(&mut tx, sql, round, wait).await?);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Runs the statement for one round; returns the version of every key it applied.
async fn execute(
    conn: &mut PgConnection,
    sql: &ByRule<Statements>,
    round: &Round,
    wait: Wait,
) -> Result<Applied, StoreError> {
    let statement = statement(sql, round, wait);
    if let [job] = round.jobs.as_slice() {
        let mut args = sized_arguments(&round.jobs);
        bind(&mut args, job.key.as_str())?;
        bind(&mut args, job.value.as_ref().map(Json))?;
        bind(&mut args, job.value.is_none())?;
        bind(&mut args, job.token.get())?;
        if let Some(scope) = &job.scope {
            bind(&mut args, scope.as_str())?;
        }
        let version: Option<i64> = sqlx::query_scalar_with(statement, args)
            .fetch_optional(&mut *conn)
            .await?;
        return Ok(Applied::One(version));
    }
    let jobs = &round.jobs;
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let values: Vec<Option<Json<&crate::store::Document>>> =
        jobs.iter().map(|j| j.value.as_ref().map(Json)).collect();
    let deleted: Vec<bool> = jobs.iter().map(|j| j.value.is_none()).collect();
    let tokens: Vec<i64> = jobs.iter().map(|j| j.token.get()).collect();
    let scopes: Option<Vec<&str>> = round.scoped().then(|| {
        jobs.iter()
            .map(|j| j.scope.as_ref().map_or("", Scope::as_str))
            .collect()
    });
    let mut args = sized_arguments(jobs);
    bind(&mut args, &keys)?;
    bind(&mut args, &values)?;
    bind(&mut args, &deleted)?;
    bind(&mut args, &tokens)?;
    if let Some(scopes) = &scopes {
        bind(&mut args, scopes)?;
    }
    let rows = sqlx::query_with(statement, args)
        .fetch_all(&mut *conn)
        .await?;
    // Each returned key is matched to its write by the round's own keys (each at most once
    // in a round), read from the row without a copy. The statement returns only keys it was
    // given.
    let at: HashMap<&str, usize> = keys.iter().enumerate().map(|(i, key)| (*key, i)).collect();
    let mut versions = vec![None; jobs.len()];
    for row in &rows {
        if let Some(&i) = at.get(row.try_get::<&str, _>(0)?) {
            versions[i] = Some(row.try_get::<i64, _>(1)?);
        }
    }
    Ok(Applied::Many(versions))
}

/// What one round's statement applied: the version of each key it wrote.
enum Applied {
    /// A round of one write: its version, or `None` if the fence refused it. Not a map: a lone
    /// write is the common case at low load, and a map of its one key is two allocations.
    One(Option<i64>),
    /// A combined statement's: the version of each of the round's writes, in the round's
    /// order; `None` for those it did not apply.
    Many(Vec<Option<i64>>),
}

impl Applied {
    /// The version the round's `i`-th write was applied at, if it was.
    fn version(&self, i: usize) -> Option<i64> {
        match self {
            Applied::One(version) => *version,
            Applied::Many(versions) => versions.get(i).copied().flatten(),
        }
    }
}

/// Arguments with room for the statement's values for `jobs` (a lone write's five, or the
/// combined statement's five arrays). sqlx's `bind` starts from empty buffers and grows them
/// value by value: three or four reallocations and copies for a lone write (about 1,500
/// instructions of a lone PUT, callgrind).
fn sized_arguments(jobs: &[Job]) -> PgArguments {
    // Per write: its key, value and scope as text, and at most 40 bytes besides (each text's
    // length, the `jsonb` version byte, the flag, the token, an array element's length); per
    // value, its length and an array's header.
    const VALUES: usize = 5;
    let texts: usize = jobs
        .iter()
        .map(|j| {
            j.key.as_str().len()
                + j.value.as_ref().map_or(0, |v| v.as_str().len())
                + j.scope.as_ref().map_or(0, |s| s.as_str().len())
        })
        .sum();
    let mut args = PgArguments::default();
    args.reserve(VALUES, texts + jobs.len() * 40 + VALUES * 32);
    args
}

/// Adds `value` to `args`, as `Query::bind` would (an encoding error fails the statement).
fn bind<'q, T>(args: &mut PgArguments, value: T) -> Result<(), sqlx::Error>
where
    T: sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + 'q,
{
    args.add(value).map_err(sqlx::Error::Encode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, token: i64, scope: Option<&str>, rule: Rule) -> Job {
        let (reply, _) = oneshot::channel();
        Job {
            key: Key::parse(key, 64).unwrap(),
            value: Some(crate::store::Document::from_value(&serde_json::json!(token)).unwrap()),
            token: FencingToken::from_db(token).unwrap(),
            rule,
            scope: scope.map(|s| Scope::parse(s, 64).unwrap()),
            reply,
        }
    }

    fn job(key: &str, token: i64) -> Job {
        write(key, token, None, Rule::Inclusive)
    }

    fn shape(rounds: &[Round]) -> Vec<Vec<(String, i64)>> {
        rounds
            .iter()
            .map(|round| {
                round
                    .jobs
                    .iter()
                    .map(|j| (j.key.as_str().to_owned(), j.token.get()))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn one_key_per_round_in_token_order() {
        // Arrival order: the hot key's tokens overtook each other in the queue.
        let jobs = vec![
            job("hot", 9),
            job("a", 5),
            job("hot", 3),
            job("hot", 7),
            job("b", 1),
            job("hot", 3),
        ];
        let rounds = split_rounds(jobs);
        assert_eq!(
            shape(&rounds),
            vec![
                vec![("b".into(), 1), ("hot".into(), 3), ("a".into(), 5)],
                vec![("hot".into(), 3)],
                vec![("hot".into(), 7)],
                vec![("hot".into(), 9)],
            ]
        );
    }

    #[test]
    fn a_scope_takes_one_token_per_round() {
        let s = Some("lock");
        let jobs = vec![
            write("a", 7, s, Rule::Inclusive),
            write("b", 5, s, Rule::Inclusive),
            write("c", 5, s, Rule::Inclusive),
            write("a", 5, s, Rule::Inclusive),
            write("d", 5, Some("other"), Rule::Inclusive),
            write("e", 5, None, Rule::Inclusive),
        ];
        let rounds = split_rounds(jobs);
        // Token 5's writes share one claim of "lock"; "a" twice, and token 7, wait for later
        // rounds; the unscoped write goes in a round of its own kind.
        assert_eq!(
            shape(&rounds),
            vec![
                vec![
                    ("b".into(), 5),
                    ("c".into(), 5),
                    ("a".into(), 5),
                    ("d".into(), 5)
                ],
                vec![("e".into(), 5)],
                vec![("a".into(), 7)],
            ]
        );
        assert_eq!(
            rounds.iter().map(Round::scoped).collect::<Vec<_>>(),
            [true, false, true]
        );
    }

    #[test]
    fn strict_scope_takes_one_write_per_round() {
        // Under the strict rule a token writes once: applied one by one, the second write with
        // token 5 is refused, so the two must not share a claim.
        let s = Some("lock");
        let jobs = vec![
            write("a", 5, s, Rule::Strict),
            write("b", 5, s, Rule::Strict),
            write("c", 6, Some("x"), Rule::Strict),
        ];
        let rounds = split_rounds(jobs);
        assert_eq!(
            shape(&rounds),
            vec![
                vec![("a".into(), 5), ("c".into(), 6)],
                vec![("b".into(), 5)]
            ]
        );
    }
}
