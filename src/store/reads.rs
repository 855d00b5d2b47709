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

use sqlx::{PgConnection, Row};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::{
    coalesce::next_batch,
    connections::Connections,
    postgres::{entry_from, KV_GET, KV_GET_MANY},
    Entry, StoreError,
};
use crate::fence::Key;

struct ReadJob {
    key: Key,
    reply: oneshot::Sender<Result<Option<Entry>, StoreError>>,
}

#[derive(Clone)]
pub(super) struct Reads {
    queue: mpsc::Sender<ReadJob>,
}

impl Reads {
    pub(super) fn start(conns: Arc<Connections>, workers: usize, max_rows: usize) -> Self {
        let (queue, rx) = mpsc::channel::<ReadJob>(max_rows.max(1) * workers.max(1) * 4);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers.max(1) {
            tokio::spawn(worker(rx.clone(), conns.clone(), max_rows.max(1)));
        }
        Reads { queue }
    }

    /// Queues a read and waits for its row. Safe to drop at any point: the worker owns the
    /// statement.
    pub(super) async fn get(&self, key: Key) -> Result<Option<Entry>, StoreError> {
        let (reply, outcome) = oneshot::channel();
        if self.queue.send(ReadJob { key, reply }).await.is_err() {
            return Err(StoreError::Unavailable(sqlx::Error::PoolClosed));
        }
        outcome.await.unwrap_or(Err(StoreError::Unavailable(sqlx::Error::WorkerCrashed)))
    }
}

async fn worker(rx: Arc<Mutex<mpsc::Receiver<ReadJob>>>, conns: Arc<Connections>, max_rows: usize) {
    while let Some(jobs) = next_batch(&rx, max_rows).await {
        metrics::histogram!("fencegate_coalesced_reads").record(jobs.len() as f64);
        match fetch(&conns, &jobs).await {
            Ok(found) => {
                for job in jobs {
                    // A key read twice in one batch: each read gets its copy.
                    let answer = match found.get(job.key.as_str()) {
                        None => Ok(None),
                        Some(Ok(entry)) => Ok(Some(entry.clone())),
                        Some(Err(err)) => Err(err.duplicate()),
                    };
                    let _ = job.reply.send(answer);
                }
            }
            Err(err) => {
                for job in jobs {
                    let _ = job.reply.send(Err(err.duplicate()));
                }
            }
        }
    }
}

/// The live entries of the jobs' keys, by key. A row that cannot be decoded fails only the
/// reads of its own key, as it would uncoalesced.
type Found = HashMap<String, Result<Entry, StoreError>>;

async fn fetch(conns: &Connections, jobs: &[ReadJob]) -> Result<Found, StoreError> {
    let mut conn = conns.take().await?;
    let found = fetch_on(&mut conn, jobs).await?;
    conn.done();
    Ok(found)
}

async fn fetch_on(conn: &mut PgConnection, jobs: &[ReadJob]) -> Result<Found, StoreError> {
    if let [job] = jobs {
        // Alone: the one-key statement, exactly what an uncoalesced GET runs.
        let row = sqlx::query(KV_GET).bind(job.key.as_str()).fetch_optional(&mut *conn).await?;
        return Ok(row.map(|row| (job.key.as_str().to_owned(), entry_from(&row, 0))).into_iter().collect());
    }
    let mut keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let rows = sqlx::query(KV_GET_MANY).bind(&keys).fetch_all(&mut *conn).await?;
    rows.iter().map(|row| Ok((row.try_get::<String, _>(0)?, entry_from(row, 1)))).collect()
}
