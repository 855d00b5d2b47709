//! The queue behind write and read coalescing: callers queue a request and wait for its reply;
//! a few worker tasks each take whole batches of waiting requests and serve them together.
//!
//! No timer: a worker takes whatever is queued the moment it is free, so a lone request goes
//! out at once and batches grow only while the database is busy. The queue is bounded (callers
//! wait when it is full) and so is a batch (`max_rows`). A worker owns the database work of its
//! batch, and a caller that runs its own request hands what is left of it to a task of its own
//! if it goes away ([`FinishOnDrop`]), so a timeout or a disconnect abandons nothing.
//!
//! At most `workers` batches run at once, each under a run permit. A caller that finds nothing
//! queued, a permit free and the last batch a lone request ([`WorkQueue::idle`]) would be a
//! batch of one, sent at once: it may run its work itself under that permit, instead of handing
//! it to a worker task and being woken back (`coalesce::Coalescer::write`). A worker takes its
//! permit after its first request arrives and before it collects the rest, so a batch still
//! forms while the database is busy. Under load, requests arrive in bursts (every client
//! answered by one statement sends its next request at once): the burst's first request finds
//! the queue empty, and running it alone would send a one-row statement ahead of every batch,
//! which cost a quarter to a half of the writes per second over HTTP/2 (bench/RESULTS.md). So a
//! caller runs its own request only while the batches have been lone requests.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::Poll,
};

use tokio::sync::{mpsc, oneshot, Mutex, OwnedSemaphorePermit, Semaphore};

use crate::store::StoreError;

pub(super) struct WorkQueue<J> {
    queue: mpsc::Sender<J>,
    /// One permit per batch that may run at once (`workers`).
    running: Arc<Semaphore>,
    /// How many requests the last batch a worker took held.
    last_batch: Arc<AtomicUsize>,
}

impl<J> Clone for WorkQueue<J> {
    fn clone(&self) -> Self {
        WorkQueue {
            queue: self.queue.clone(),
            running: self.running.clone(),
            last_batch: self.last_batch.clone(),
        }
    }
}

impl<J: Send + 'static> WorkQueue<J> {
    /// Starts `workers` tasks, each calling `serve` with up to `max_rows` waiting requests.
    /// `serve` must answer every request of its batch.
    pub(super) fn start<F, Fut>(workers: usize, max_rows: usize, serve: F) -> Self
    where
        F: Fn(Vec<J>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (workers, max_rows) = (workers.max(1), max_rows.max(1));
        let (queue, rx) = mpsc::channel::<J>(max_rows * workers * 4);
        let (rx, serve) = (Arc::new(Mutex::new(rx)), Arc::new(serve));
        let running = Arc::new(Semaphore::new(workers));
        let last_batch = Arc::new(AtomicUsize::new(0));
        for _ in 0..workers {
            let (rx, serve, running, last_batch) = (
                rx.clone(),
                serve.clone(),
                running.clone(),
                last_batch.clone(),
            );
            tokio::spawn(async move {
                while let Some((batch, _permit)) = next_batch(&rx, &running, max_rows).await {
                    last_batch.store(batch.len(), Ordering::Relaxed);
                    survive_panic(serve(batch)).await;
                }
            });
        }
        WorkQueue {
            queue,
            running,
            last_batch,
        }
    }

    /// A run permit, if nothing is queued, no more than `workers - 1` batches are running and
    /// the last batch was a lone request: then a request sent now would be a batch of one, sent
    /// at once, and its caller may run it itself while it holds the permit (module docs).
    pub(super) fn idle(&self) -> Option<OwnedSemaphorePermit> {
        if self.queue.capacity() != self.queue.max_capacity() {
            return None; // something is queued: a batch is forming
        }
        if self.last_batch.load(Ordering::Relaxed) > 1 {
            return None; // under load: the rest of a burst may be on its way
        }
        self.running.clone().try_acquire_owned().ok()
    }

    /// Queues the request `job` builds around its reply channel, and waits for the reply.
    pub(super) async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> J,
    ) -> Result<T, StoreError> {
        let (reply, outcome) = oneshot::channel();
        self.send(job(reply), outcome).await
    }

    /// Queues `job`, built around the sender of `outcome`, and waits for the reply.
    pub(super) async fn send<T>(
        &self,
        job: J,
        outcome: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if self.queue.send(job).await.is_err() {
            return Err(StoreError::unavailable(
                "the work queue is closed (shutting down)",
            ));
        }
        outcome.await.unwrap_or(Err(StoreError::unavailable(
            "the worker running this statement is gone",
        )))
    }
}

/// Work a caller runs itself (`WorkQueue::idle`) that must not be abandoned half-way, as a
/// worker's never is: if the caller goes away before it is done, the rest of it runs on a task
/// of its own. Boxed so that it can move there; a drop before the end is rare (a timeout, a
/// disconnect), so the common path pays one allocation and no task.
pub(super) struct FinishOnDrop(Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>);

impl FinishOnDrop {
    pub(super) fn new(work: impl Future<Output = ()> + Send + 'static) -> Self {
        FinishOnDrop(Some(Box::pin(work)))
    }
}

impl Future for FinishOnDrop {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let Some(work) = self.0.as_mut() else {
            return Poll::Ready(());
        };
        // A panic ends the work, as a worker's batch: its reply is dropped with it (503 for the
        // caller), and nothing is left to finish on drop.
        let polled = poll_surviving(work.as_mut(), cx);
        if polled.is_ready() {
            self.0 = None;
        }
        polled
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            // Outside a runtime (a shutdown) there is nowhere to finish it: dropped, like the
            // workers' tasks then.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(survive_panic(work));
            }
        }
    }
}

/// Runs a batch's work; a panic inside it ends that batch, not the worker. The batch's callers
/// whose replies were not sent yet get 503 (their replies are dropped with the work), and
/// whatever connection the work held goes back through the pool's check (which rolls back an
/// open transaction). Without this, each panic would leave one worker fewer until a restart.
///
/// Not an `async fn`, which would hold `work` twice (its argument, and the future it awaits).
fn survive_panic<W: Future<Output = ()>>(work: W) -> SurvivePanic<W> {
    SurvivePanic { work }
}

pin_project_lite::pin_project! {
    /// A batch's work that survives its own panic ([`survive_panic`]).
    struct SurvivePanic<W> {
        #[pin]
        work: W,
    }
}

impl<W: Future<Output = ()>> Future for SurvivePanic<W> {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        poll_surviving(self.project().work, cx)
    }
}

/// Polls a batch's work; a panic inside it ends the work (Ready), counted and logged.
fn poll_surviving(
    work: std::pin::Pin<&mut (impl Future<Output = ()> + ?Sized)>,
    cx: &mut std::task::Context<'_>,
) -> Poll<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work.poll(cx))) {
        Ok(polled) => polled,
        Err(panic) => {
            report_panic(panic);
            Poll::Ready(())
        }
    }
}

/// Counts and logs a panic that ended a batch's work.
fn report_panic(panic: Box<dyn std::any::Any + Send>) {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic".into());
    metrics::counter!("fencegate_worker_panics_total").increment(1);
    tracing::error!(panic = %what, "a coalescing worker panicked in a batch; its waiting requests got 503, the worker goes on");
}

/// The next batch for a worker and its run permit: waits for one request, then for a permit
/// (taken only while a caller runs its own request, [`WorkQueue::idle`]), then takes whatever
/// else is queued by then, up to `max`; `None` once the queue is closed. Whoever holds the
/// receiver collects the next batch while the other workers execute theirs.
async fn next_batch<T>(
    rx: &Mutex<mpsc::Receiver<T>>,
    running: &Arc<Semaphore>,
    max: usize,
) -> Option<(Vec<T>, OwnedSemaphorePermit)> {
    let mut rx = rx.lock().await;
    let mut batch = Vec::with_capacity(max);
    batch.push(rx.recv().await?);
    let permit = running.clone().acquire_owned().await.ok()?;
    while batch.len() < max {
        match rx.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
    Some((batch, permit))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller may run its own request only while the batches are lone requests: the first
    /// request of a burst must not go out alone ahead of the batch behind it.
    #[tokio::test]
    async fn a_caller_runs_its_own_request_only_after_lone_batches() {
        let queue = WorkQueue::start(
            1,
            8,
            |jobs: Vec<(u32, oneshot::Sender<Result<usize, StoreError>>)>| async move {
                let n = jobs.len();
                for (_, reply) in jobs {
                    let _ = reply.send(Ok(n));
                }
            },
        );
        assert!(
            queue.idle().is_some(),
            "nothing ran yet: a lone request may go out at once"
        );
        // Three asks queued before the worker runs (one thread: it runs when this task waits).
        let asks: Vec<_> = (0..3)
            .map(|i| {
                let queue = queue.clone();
                tokio::spawn(async move { queue.ask(|reply| (i, reply)).await })
            })
            .collect();
        for ask in asks {
            assert_eq!(
                ask.await.unwrap().unwrap(),
                3,
                "the three went out together"
            );
        }
        assert!(
            queue.idle().is_none(),
            "after a batch of three: a burst, let it form"
        );
        assert_eq!(queue.ask(|reply| (9, reply)).await.unwrap(), 1);
        let permit = queue
            .idle()
            .expect("after a lone batch: a lone request may go out at once");
        assert!(queue.idle().is_none(), "one worker: one permit");
        drop(permit);
    }

    #[tokio::test]
    async fn a_panicking_batch_fails_its_callers_and_the_worker_serves_the_next() {
        // One worker: if the panic killed it, the second ask would never be answered.
        let queue = WorkQueue::start(
            1,
            8,
            |jobs: Vec<(u32, oneshot::Sender<Result<u32, StoreError>>)>| async move {
                for (n, reply) in jobs {
                    if n == 0 {
                        panic!("job 0 panics");
                    }
                    let _ = reply.send(Ok(n * 2));
                }
            },
        );
        let failed = queue.ask(|reply| (0, reply)).await;
        assert!(
            matches!(failed, Err(StoreError::Unavailable(_))),
            "{failed:?}"
        );
        let served = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            queue.ask(|reply| (21, reply)),
        )
        .await;
        assert_eq!(
            served
                .expect("the worker survived the panic")
                .expect("served"),
            42
        );
    }
}
