//! Start-up and shutdown: connect, migrate, serve on an already-bound listener, drain.

use std::{future::Future, sync::Arc};

use anyhow::Context;
use tokio::{net::TcpListener, sync::Notify};

use crate::{
    config::Settings,
    http::{app, AppState, Limits},
    store::{Backend, PgStore, SqliteStore, Store},
    telemetry,
};

/// Opens the configured store (running migrations if configured).
pub async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    let url = settings.database.effective_url();
    let backend = if settings.database.is_sqlite() {
        tracing::info!(%url, "using the embedded SQLite database (set DATABASE_URL for PostgreSQL)");
        Backend::Sqlite(SqliteStore::connect(&settings.database, &url, settings.kv.scope_rule()).await?)
    } else {
        Backend::Postgres(PgStore::connect(&settings.database, &url, settings.kv.scope_rule()).await?)
    };
    Ok(Store::new(backend, settings.kv.fence_cache_capacity))
}

/// Connects, migrates, then serves on `listener` until `shutdown` resolves; in-flight requests
/// then get `server.shutdown_grace_ms` to finish. Takes a bound listener so callers (tests,
/// `main`) choose the port, and port 0 works.
pub async fn serve(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_announced(settings, listener, shutdown, || {}).await
}

/// [`serve`], calling `ready` once the store is open and migrated, just before accepting.
pub async fn serve_announced(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(),
) -> anyhow::Result<()> {
    // The safe default, before anything else: no open server on a reachable address.
    let addr = listener.local_addr().context("listener has no local address")?;
    settings.check_exposure(addr)?;
    let auth = crate::auth::Authenticator::new(&settings.auth, |var| std::env::var(var).ok())?.map(Arc::new);
    let store = open_store(&settings).await?;
    // Resources are checked against the catalog before the first request: a bad one fails start.
    let tables = store.resources(&settings.resources).await?;
    let state = AppState {
        store,
        kv: Arc::new(settings.kv.clone()),
        locks: Arc::new(settings.locks.clone()),
        tables,
        bindings: Arc::new(settings.bindings()?),
        metrics: telemetry::metrics_handle(),
        auth,
    };
    let limits = Limits {
        body_bytes: settings.server.body_limit_bytes,
        request_timeout: settings.request_timeout(),
        max_in_flight: settings.server.max_in_flight,
    };
    // Aborted when this function returns or its future is dropped (an embedding caller may
    // cancel `serve`): the tick holds a `Store`, which would keep the pool and workers alive.
    let _ticker = AbortOnDrop(tokio::spawn(tick(state.store.clone())));
    let router = app(state, limits);

    tracing::info!(%addr, "listening");
    ready();

    let draining = Arc::new(Notify::new());
    let signal = draining.clone();
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight requests");
        signal.notify_one();
    });
    let grace = settings.shutdown_grace();
    tokio::select! {
        result = std::future::IntoFuture::into_future(server) => result.context("server error"),
        () = async { draining.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "in-flight requests did not finish within the shutdown grace period; exiting anyway");
            Ok(())
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Once a second: refreshes the pool gauges, and keeps the timer driver's next wake-up
/// within a second.
///
/// The second part is for speed. tokio's time driver interrupts its own sleep (an eventfd
/// write, then an extra `epoll_wait`) whenever a new timer is due before its next planned
/// wake-up. Every request arms one (the `request_timeout_ms` deadline), so on a runtime with
/// nothing else due, every lone request paid those two system calls (strace: 1 write and
/// 2.8 `epoll_wait` per request without the tick, in bench/README.md). With a tick due within
/// a second, a later deadline is never the earliest, and arming it is only a wheel insert.
async fn tick(store: Store) {
    let mut every_second = tokio::time::interval(std::time::Duration::from_secs(1));
    every_second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every_second.tick().await;
        telemetry::record_pool(&store);
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(err) => {
                tracing::error!(%err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
