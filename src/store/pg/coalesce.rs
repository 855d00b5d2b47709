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

use std::{collections::hash_map::Entry, sync::Arc};

use sqlx::{types::Json, Connection, PgConnection, Row};
use tokio::sync::oneshot;

use super::{batching::WorkQueue, connections::Connections, sql::Statements};
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
    pub value: Option<serde_json::Value>,
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
}

/// The statement for one round: the one-row forms are cheaper to plan and execute when only
/// one write is waiting.
fn statement<'a>(sql: &'a ByRule<Statements>, round: &Round) -> &'a str {
    let sql = sql.get(round.rule);
    match (round.scoped(), round.jobs.len()) {
        (false, 1) => &sql.put_key,
        (false, _) => &sql.rows,
        (true, 1) => &sql.put_scope,
        (true, _) => &sql.scoped_rows,
    }
}

impl Coalescer {
    pub(super) fn start(
        conns: Arc<Connections>,
        sql: Arc<ByRule<Statements>>,
        workers: usize,
        max_rows: usize,
    ) -> Self {
        let queue = WorkQueue::start(workers, max_rows, move |jobs: Vec<Job>| {
            let (conns, sql) = (conns.clone(), sql.clone());
            async move {
                metrics::histogram!("fencegate_coalesced_rows").record(jobs.len() as f64);
                run_rounds(&conns, &sql, split_rounds(jobs)).await;
            }
        });
        Coalescer { queue }
    }

    /// Queues a write and waits for its outcome.
    pub async fn write(
        &self,
        key: Key,
        value: Option<serde_json::Value>,
        token: FencingToken,
        rule: Rule,
        scope: Option<Scope>,
    ) -> Result<Option<i64>, StoreError> {
        self.queue
            .ask(|reply| Job {
                key,
                value,
                token,
                rule,
                scope,
                reply,
            })
            .await
    }
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
        let mut keys = HashSet::default();
        let mut claims: HashMap<Scope, FencingToken> = HashMap::default();
        let (round, rest): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|job| {
            if job.rule != rule || job.scope.is_some() != scoped || keys.contains(&job.key) {
                return false;
            }
            if let Some(scope) = &job.scope {
                match claims.entry(scope.clone()) {
                    Entry::Vacant(claim) => {
                        claim.insert(job.token);
                    }
                    // The scope's claim in this round is for this token: one more write under
                    // it, if the rule admits a token equal to the fence the claim leaves.
                    Entry::Occupied(claim)
                        if *claim.get() == job.token && rule.accepts(job.token, *claim.get()) => {}
                    Entry::Occupied(_) => return false,
                }
            }
            keys.insert(job.key.clone());
            true
        });
        rounds.push(Round { rule, jobs: round });
        jobs = rest;
    }
    rounds
}

/// Applies the rounds and replies to every write, each only after its commit: the unscoped
/// rounds together (one transaction), then each scoped round on its own.
async fn run_rounds(conns: &Connections, sql: &ByRule<Statements>, rounds: Vec<Round>) {
    let (unscoped, scoped): (Vec<Round>, Vec<Round>) =
        rounds.into_iter().partition(|round| !round.scoped());
    if !unscoped.is_empty() {
        settle(conns, sql, unscoped).await;
    }
    for round in scoped {
        settle(conns, sql, vec![round]).await;
    }
}

/// Applies `rounds` atomically (one statement, or one transaction) and replies to their writes.
/// If the database refuses it, nothing was committed, and each write is tried again on its own
/// so that one bad write cannot fail the others.
async fn settle(conns: &Connections, sql: &ByRule<Statements>, rounds: Vec<Round>) {
    let writes: usize = rounds.iter().map(|round| round.jobs.len()).sum();
    match apply(conns, sql, &rounds).await {
        Ok(applied) => {
            for (round, applied) in rounds.into_iter().zip(applied) {
                for job in round.jobs {
                    let _ = job.reply.send(Ok(applied.get(job.key.as_str()).copied()));
                }
            }
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
                        Box::pin(settle(conns, sql, rest)).await;
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
                                conns,
                                sql,
                                vec![Round {
                                    rule: round.rule,
                                    jobs: vec![job],
                                }],
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
                        conns,
                        sql,
                        vec![Round {
                            rule: round.rule,
                            jobs: vec![job],
                        }],
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

/// Splits off the writes a key-jump refusal names (the trigger's DETAIL: the token, a space, the
/// key): the write of that key with that token, in every round it is in. `None` if the detail
/// names none of them (it could not be read).
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
        StoreError::Refused(_) => true,
        _ => false,
    }
}

/// One round: a single autocommit statement. Several rounds (a key written more than once
/// while the database was busy, e.g. a hot key): one transaction, so they share one commit
/// instead of paying an fsync each. Returns, per round, the version of every key applied.
async fn apply(
    conns: &Connections,
    sql: &ByRule<Statements>,
    rounds: &[Round],
) -> Result<Vec<HashMap<String, i64>>, StoreError> {
    let mut conn = conns.take().await?;
    let applied = apply_on(&mut conn, sql, rounds).await?;
    conn.done();
    Ok(applied)
}

async fn apply_on(
    conn: &mut PgConnection,
    sql: &ByRule<Statements>,
    rounds: &[Round],
) -> Result<Vec<HashMap<String, i64>>, StoreError> {
    if let [round] = rounds {
        return Ok(vec![execute(conn, sql, round).await?]);
    }
    let mut tx = conn.begin().await?;
    let mut applied = Vec::with_capacity(rounds.len());
    for round in rounds {
        applied.push(execute(&mut tx, sql, round).await?);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Runs the statement for one round; returns the version of every key it applied.
async fn execute(
    conn: &mut PgConnection,
    sql: &ByRule<Statements>,
    round: &Round,
) -> Result<HashMap<String, i64>, StoreError> {
    let statement = statement(sql, round);
    if let [job] = round.jobs.as_slice() {
        let mut query = sqlx::query_scalar(statement)
            .bind(job.key.as_str())
            .bind(job.value.as_ref().map(Json))
            .bind(job.value.is_none())
            .bind(job.token.get());
        if let Some(scope) = &job.scope {
            query = query.bind(scope.as_str());
        }
        let version: Option<i64> = query.fetch_optional(&mut *conn).await?;
        return Ok(version
            .map(|v| (job.key.as_str().to_owned(), v))
            .into_iter()
            .collect());
    }
    let jobs = &round.jobs;
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let values: Vec<Option<Json<&serde_json::Value>>> =
        jobs.iter().map(|j| j.value.as_ref().map(Json)).collect();
    let deleted: Vec<bool> = jobs.iter().map(|j| j.value.is_none()).collect();
    let tokens: Vec<i64> = jobs.iter().map(|j| j.token.get()).collect();
    let mut query = sqlx::query(statement)
        .bind(&keys)
        .bind(&values)
        .bind(&deleted)
        .bind(&tokens);
    let scopes: Vec<&str>;
    if round.scoped() {
        scopes = jobs
            .iter()
            .map(|j| j.scope.as_ref().map_or("", Scope::as_str))
            .collect();
        query = query.bind(&scopes);
    }
    let rows = query.fetch_all(&mut *conn).await?;
    let mut applied = HashMap::with_capacity_and_hasher(rows.len(), Default::default());
    for row in rows {
        applied.insert(row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(key: &str, token: i64, scope: Option<&str>, rule: Rule) -> Job {
        let (reply, _) = oneshot::channel();
        Job {
            key: Key::parse(key, 64).unwrap(),
            value: Some(serde_json::json!(token)),
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
