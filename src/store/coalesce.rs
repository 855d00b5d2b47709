//! Write coalescing: concurrent unscoped single-key writes share one statement.
//!
//! A PostgreSQL client that sends one upsert per request pays one round trip and one commit
//! (an fsync) per write. fencegate sees many concurrent writers at once, so it can do what no
//! single client can: combine the writes that are waiting into ONE multi-row fenced upsert
//! (`unnest` arrays, per-row tokens), committed once. Each request still gets its own outcome:
//! a row comes back for each key the fence admitted; a missing row means that write was stale.
//!
//! - Batches come from [`super::batching::WorkQueue`]: no timer (a lone write goes out at once,
//!   as a one-row statement), at most `max_rows` writes per batch, a bounded queue.
//! - A key that appears twice goes in the next statement (ON CONFLICT cannot touch a row twice
//!   in one statement); such statements run in one transaction and share one commit, which is
//!   what makes a hot key fast.
//! - Writes to one key that wait together are applied in token order (equal tokens in arrival
//!   order). Every write in a drained batch is in flight at once, none has been answered, so
//!   any order among them is a valid (linearizable) history; token order is the one in which
//!   the fence refuses the fewest. In arrival order, concurrent writers with climbing tokens
//!   (a hot key) saw most of their writes refused only because a higher token overtook them in
//!   the queue. A write answered before another was sent is still applied before it: it was in
//!   an earlier batch. Each write is still checked by the fence in the database.
//! - If a combined statement fails for a reason other than the connection, its writes are
//!   retried one by one, so one bad value cannot fail its neighbours.
//! - 2xx only after commit: replies are sent after the statement (autocommit) returned.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use sqlx::{types::Json, Connection, PgConnection, Row};
use tokio::sync::oneshot;

use super::{batching::WorkQueue, connections::Connections, StoreError};
use crate::fence::{FencingToken, Key, Rule};

/// One queued write. `value: None` is a delete (a tombstone).
pub struct Job {
    pub key: Key,
    pub value: Option<serde_json::Value>,
    pub token: FencingToken,
    pub rule: Rule,
    /// `Some(version)` if applied, `None` if the key's fence refused it.
    pub reply: oneshot::Sender<Result<Option<i64>, StoreError>>,
}

#[derive(Clone)]
pub struct Coalescer {
    queue: WorkQueue<Job>,
}

/// The fenced upserts, per rule. `rows`: the multi-row form, `$1` keys, `$2` values, `$3`
/// deleted flags, `$4` tokens (shared with `POST /v1/batch`, which passes one token for every
/// row). `single`: the one-row form (`$1` key, `$2` value, `$3` deleted, `$4` token), cheaper to
/// plan and execute when only one write is waiting.
pub struct Upserts {
    pub rows: [String; 2],
    pub single: [String; 2],
}

fn index(rule: Rule) -> usize {
    match rule {
        Rule::Inclusive => 0,
        Rule::Strict => 1,
    }
}

impl Upserts {
    pub fn for_rule(&self, rule: Rule) -> &str {
        &self.rows[index(rule)]
    }

    fn single_for_rule(&self, rule: Rule) -> &str {
        &self.single[index(rule)]
    }
}

impl Coalescer {
    pub(super) fn start(conns: Arc<Connections>, sql: Arc<Upserts>, workers: usize, max_rows: usize) -> Self {
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
    pub async fn write(&self, key: Key, value: Option<serde_json::Value>, token: FencingToken, rule: Rule) -> Result<Option<i64>, StoreError> {
        self.queue.ask(|reply| Job { key, value, token, rule, reply }).await
    }
}

/// A statement's worth of writes: one rule, each key at most once.
type Round = (Rule, Vec<Job>);

/// Splits waiting writes into rounds, each taking one write per (rule, key), so that writes
/// to one key apply in token order (module docs: why that order is a valid one).
fn split_rounds(mut jobs: Vec<Job>) -> Vec<Round> {
    if jobs.len() == 1 {
        // A lone write, the usual case at low load: nothing to order or split.
        return vec![(jobs[0].rule, jobs)];
    }
    jobs.sort_by_key(|job| job.token); // stable: equal tokens keep their arrival order
    let mut rounds = Vec::new();
    while !jobs.is_empty() {
        let rule = jobs[0].rule;
        let mut seen = HashSet::new();
        let (round, rest): (Vec<Job>, Vec<Job>) =
            jobs.into_iter().partition(|j| j.rule == rule && seen.insert(j.key.clone()));
        rounds.push((rule, round));
        jobs = rest;
    }
    rounds
}

/// Applies the rounds and replies to every write, only after the commit.
async fn run_rounds(conns: &Connections, sql: &Upserts, rounds: Vec<Round>) {
    let writes: usize = rounds.iter().map(|(_, jobs)| jobs.len()).sum();
    let views: Vec<(Rule, &[Job])> = rounds.iter().map(|(rule, jobs)| (*rule, jobs.as_slice())).collect();
    let outcome = apply(conns, sql, &views).await;
    match outcome {
        Ok(applied) => {
            for ((_, jobs), applied) in rounds.into_iter().zip(applied) {
                for job in jobs {
                    let _ = job.reply.send(Ok(applied.get(job.key.as_str()).copied()));
                }
            }
        }
        Err(err) if writes > 1 && !matches!(err, StoreError::Unavailable(_)) => {
            tracing::warn!(error = %err, writes, "combined write failed; retrying its writes one by one");
            for (rule, jobs) in rounds {
                for job in jobs {
                    let result = apply(conns, sql, &[(rule, std::slice::from_ref(&job))])
                        .await
                        .map(|applied| applied[0].get(job.key.as_str()).copied());
                    let _ = job.reply.send(result);
                }
            }
        }
        Err(err) => {
            for job in rounds.into_iter().flat_map(|(_, jobs)| jobs) {
                let _ = job.reply.send(Err(err.duplicate()));
            }
        }
    }
}

/// One round: a single autocommit statement. Several rounds (a key written more than once
/// while the database was busy, e.g. a hot key): one transaction, so they share one commit
/// instead of paying an fsync each. Returns, per round, the version of every key applied.
async fn apply(conns: &Connections, sql: &Upserts, rounds: &[(Rule, &[Job])]) -> Result<Vec<HashMap<String, i64>>, StoreError> {
    let mut conn = conns.take().await?;
    let applied = apply_on(&mut conn, sql, rounds).await?;
    conn.done();
    Ok(applied)
}

async fn apply_on(conn: &mut PgConnection, sql: &Upserts, rounds: &[(Rule, &[Job])]) -> Result<Vec<HashMap<String, i64>>, StoreError> {
    if let [(rule, jobs)] = rounds {
        return Ok(vec![execute(conn, sql, *rule, jobs).await?]);
    }
    let mut tx = conn.begin().await?;
    let mut applied = Vec::with_capacity(rounds.len());
    for (rule, jobs) in rounds {
        applied.push(execute(&mut tx, sql, *rule, jobs).await?);
    }
    tx.commit().await?;
    Ok(applied)
}

/// Runs the statement for `jobs`; returns the version of every key it applied.
async fn execute(conn: &mut PgConnection, sql: &Upserts, rule: Rule, jobs: &[Job]) -> Result<HashMap<String, i64>, StoreError> {
    if let [job] = jobs {
        let version: Option<i64> = sqlx::query_scalar(sql.single_for_rule(rule))
            .bind(job.key.as_str())
            .bind(job.value.as_ref().map(Json))
            .bind(job.value.is_none())
            .bind(job.token.get())
            .fetch_optional(&mut *conn)
            .await?;
        return Ok(version.map(|v| (job.key.as_str().to_owned(), v)).into_iter().collect());
    }
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let values: Vec<Option<Json<&serde_json::Value>>> = jobs.iter().map(|j| j.value.as_ref().map(Json)).collect();
    let deleted: Vec<bool> = jobs.iter().map(|j| j.value.is_none()).collect();
    let tokens: Vec<i64> = jobs.iter().map(|j| j.token.get()).collect();
    let rows = sqlx::query(sql.for_rule(rule)).bind(&keys).bind(&values).bind(&deleted).bind(&tokens).fetch_all(&mut *conn).await?;
    let mut applied = HashMap::with_capacity(rows.len());
    for row in rows {
        applied.insert(row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: &str, token: i64) -> Job {
        let (reply, _) = oneshot::channel();
        Job {
            key: Key::parse(key, 64).unwrap(),
            value: Some(serde_json::json!(token)),
            token: FencingToken::from_db(token).unwrap(),
            rule: Rule::Inclusive,
            reply,
        }
    }

    fn shape(rounds: &[Round]) -> Vec<Vec<(String, i64)>> {
        rounds
            .iter()
            .map(|(_, jobs)| jobs.iter().map(|j| (j.key.as_str().to_owned(), j.token.get())).collect())
            .collect()
    }

    #[test]
    fn one_key_per_round_in_token_order() {
        // Arrival order: the hot key's tokens overtook each other in the queue.
        let jobs = vec![job("hot", 9), job("a", 5), job("hot", 3), job("hot", 7), job("b", 1), job("hot", 3)];
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
}
