//! Read coalescing: concurrent `GET /v1/kv/{key}` share one `SELECT .. WHERE key = ANY($1)`.
//!
//! The same idea as write coalescing (`coalesce.rs`), for reads: while the database is busy,
//! reads queue up, and a worker that comes free sends all of them as one statement (one round
//! trip, one plan) and gives each caller its own row. A lone read goes out at once as the
//! one-key statement, so it pays nothing for this.
//!
//! Freshness: a read is queued before its statement starts, so the statement's snapshot is
//! taken after the read arrived; every write acknowledged before the read was sent is visible.

use std::{collections::HashMap, sync::Arc};

use futures_util::StreamExt as _;
use sqlx::{PgConnection, Row};
use tokio::sync::oneshot;

use super::{
    batching::WorkQueue,
    connections::Connections,
    sql::{entry_from, KV_GET, KV_GET_MANY},
};
use crate::{
    fence::Key,
    store::{Entry, StoreError},
};

struct ReadJob {
    key: Key,
    reply: oneshot::Sender<Result<Option<Entry>, StoreError>>,
}

#[derive(Clone)]
pub(super) struct Reads {
    queue: WorkQueue<ReadJob>,
}

impl Reads {
    pub(super) fn start(conns: Arc<Connections>, workers: usize, max_rows: usize) -> Self {
        let queue = WorkQueue::start(workers, max_rows, move |jobs: Vec<ReadJob>| {
            let conns = conns.clone();
            async move {
                crate::telemetry::coalesced_reads().record(jobs.len() as f64);
                answer(&conns, jobs).await;
            }
        });
        Reads { queue }
    }

    /// Queues a read and waits for its row. Safe to drop at any point: the worker owns the
    /// statement.
    pub(super) async fn get(&self, key: Key) -> Result<Option<Entry>, StoreError> {
        self.queue.ask(|reply| ReadJob { key, reply }).await
    }
}

/// Reads the batch's keys in one statement and answers every read.
async fn answer(conns: &Connections, jobs: Vec<ReadJob>) {
    match fetch(conns, &jobs).await {
        Ok(found) => {
            for job in jobs {
                // A key read twice in one batch: each read shares its value (`Entry`).
                let answer = match found.get(job.key.as_str()) {
                    None => Ok(None),
                    Some(Ok(entry)) => Ok(Some(entry.clone())),
                    Some(Err(err)) => Err(err.clone()),
                };
                let _ = job.reply.send(answer);
            }
        }
        Err(err) => {
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}

/// The live entries of the jobs' keys, by key. A row that cannot be decoded fails only the
/// reads of its own key, as it would uncoalesced.
type Found = HashMap<String, Result<Entry, StoreError>>;

async fn fetch(conns: &Connections, jobs: &[ReadJob]) -> Result<Found, StoreError> {
    crate::store::give_up(conns.give_up_after(), async {
        let mut conn = conns.take().await?;
        let found = fetch_on(&mut conn, jobs).await?;
        conn.done();
        Ok(found)
    })
    .await
}

async fn fetch_on(conn: &mut PgConnection, jobs: &[ReadJob]) -> Result<Found, StoreError> {
    if let [job] = jobs {
        // Alone: the one-key statement, exactly what an uncoalesced GET runs.
        let row = sqlx::query(KV_GET)
            .bind(job.key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        return Ok(row
            .map(|row| (job.key.as_str().to_owned(), entry_from(&row, 0)))
            .into_iter()
            .collect());
    }
    let mut keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    // Row by row: each row's bytes are freed once decoded, so a batch of large values is in
    // memory once (decoded), not twice (as received, and decoded).
    let mut rows = sqlx::query(KV_GET_MANY).bind(&keys).fetch(&mut *conn);
    let mut found = Found::with_capacity(keys.len());
    while let Some(row) = rows.next().await.transpose()? {
        found.insert(row.try_get::<String, _>(0)?, entry_from(&row, 1));
    }
    Ok(found)
}
