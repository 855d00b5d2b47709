//! Start-up and shutdown: connect, migrate, serve on an already-bound listener, drain; and on
//! SIGHUP, reload the credentials and the TLS certificate (see [`reload`]).

pub mod settings;

pub use settings::ServerSettings;

use std::{future::Future, sync::Arc, time::Duration};

use anyhow::Context;
use tokio::{net::TcpListener, sync::watch, task::JoinSet};

use crate::{
    config::Settings,
    conn,
    http::{app, AppState, Limits},
    slots::Slots,
    store::Store,
    task::AbortOnDrop,
    telemetry,
};

/// Opens the configured store (running migrations if configured), for a one-off command
/// (`migrate`, `admin`, `guard sql`): it leaves what only `serve` writes alone (the rules of
/// `fencegate.fence()`, its grants, the guards' modes), so a command run with a partial
/// configuration or as another role cannot rewrite them.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    let mut store_settings = store_settings(settings)?;
    store_settings.sql_writers = None;
    Store::open(&store_settings).await
}

/// How much longer than `server.request_timeout_ms` database work may go unanswered before it
/// is given up and its connection closed.
const GIVE_UP_MARGIN_MS: u64 = 2_000;

/// What the store needs from the configuration (the store does not read it itself).
fn store_settings(settings: &Settings) -> anyhow::Result<crate::store::Settings> {
    let db = &settings.database;
    Ok(crate::store::Settings {
        url: db.effective_url(),
        max_connections: db.max_connections,
        min_connections: db.min_connections,
        acquire_timeout_ms: db.acquire_timeout_ms,
        max_lifetime_secs: db.max_lifetime_secs,
        migrate_on_start: db.migrate_on_start,
        coalesce_workers: db.coalesce_workers(),
        coalesce_max_rows: db.coalesce_max_rows,
        schema: db.schema.clone(),
        lock_timeout_ms: db.lock_timeout_ms,
        tcp_user_timeout_ms: db.tcp_user_timeout_ms,
        pooler: db.pooler,
        listen_url: db.listen_url.clone(),
        checks: crate::store::Checks {
            reserved: settings.locks.reserved()?,
            ..settings.kv.checks()
        },
        issuer_scopes: settings
            .issuers
            .iter()
            .flat_map(|i| i.scopes.iter().cloned())
            .collect(),
        max_scope_bytes: settings.kv.max_key_bytes,
        sql_writers: Some(crate::store::SqlWriters {
            roles: settings
                .auth
                .roles
                .iter()
                .map(|r| (r.name.clone(), r.prefixes.clone()))
                .collect(),
            kv_strict: settings.kv.strict,
            strict_scopes: settings
                .resources
                .iter()
                .filter(|r| r.strict)
                .filter_map(|r| r.scope.clone())
                .collect(),
            idle_timeout_ms: db.sql_fence_idle_timeout_ms,
        }),
        fence_cache_capacity: settings.kv.fence_cache_capacity,
        // Past the request timeout the client has its 503; a margin lets a statement that is
        // merely slow finish (docs/operations.md, When the network to PostgreSQL fails).
        give_up_after_ms: settings.server.request_timeout_ms + GIVE_UP_MARGIN_MS,
    })
}

/// Connects, migrates, then serves on `listener` until `shutdown` resolves; requests being
/// handled then get `server.shutdown_grace_ms` to finish, and connections without one (idle,
/// or a request still arriving) are closed at once. Takes a bound listener so callers (tests,
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
    serve_reloadable(settings, listener, shutdown, ready, None).await
}

/// Reads the settings again (the config file, the environment, the flags) for SIGHUP.
pub type Reload = Box<dyn Fn() -> anyhow::Result<Settings> + Send + Sync>;

/// [`serve_announced`]; with `reload`, each SIGHUP reads the settings again and applies their
/// `[[auth.keys]]`, `[[auth.certs]]`, `[auth.jwt]` and `[server.tls]` files, all or nothing.
pub async fn serve_reloadable(
    settings: Settings,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    ready: impl FnOnce(),
    reload: Option<Reload>,
) -> anyhow::Result<()> {
    // The safe default, before anything else: no open server on a reachable address.
    let addr = listener
        .local_addr()
        .context("listener has no local address")?;
    settings.check_exposure(addr)?;
    let auth = crate::auth::Authenticator::new(&settings.auth, |var| std::env::var(var).ok())?
        .map(|auth| Arc::new(crate::auth::Live::new(auth)));
    let tls = settings
        .server
        .tls
        .as_ref()
        .map(crate::tls::Tls::new)
        .transpose()?
        .map(Arc::new);
    let store = Store::open(&store_settings(&settings)?).await?;
    // Resources are checked against the catalog before the first request: a bad one fails start.
    let tables = store.resources(&settings.resources).await?;
    let state = AppState::new(crate::http::Shared {
        store,
        kv: Arc::new(settings.kv.clone()),
        locks: Arc::new(settings.locks.clone()),
        tables,
        bindings: Arc::new(settings.bindings()?),
        issuers: Arc::new(
            crate::issuers::Issuers::new(&settings.issuers, |var| std::env::var(var).ok())
                .map_err(|e| anyhow::anyhow!("invalid [[issuers]]: {e}"))?,
        ),
        metrics: telemetry::metrics_handle(),
        auth: auth.clone(),
        events: crate::events::Events::new(),
    });
    let events = state.events.clone();
    // Refused writes, recorded in the database for operators (`store::refusals`).
    let refusals = crate::events::RefusalQueue::new(crate::events::SINK_CAPACITY);
    events.record_to(refusals.clone());
    let _refusals = AbortOnDrop(tokio::spawn(
        state
            .store
            .clone()
            .record_refusals(refusals, settings.database.refusals_kept),
    ));
    let addr = listener
        .local_addr()
        .context("listener has no local address")?;
    let limits = limits(&settings, addr);
    // Aborted when this function returns or its future is dropped (an embedding caller may
    // cancel `serve`): the tick holds a `Store`, which would keep the pool and workers alive.
    let _ticker = AbortOnDrop(tokio::spawn(tick(state.store.clone())));
    // Resets made by other processes serving the same database (see `store::admin`).
    let _resets = AbortOnDrop(tokio::spawn(state.store.clone().watch_resets()));
    // The database's role (a standby it started against being promoted) and replication.
    let _replication = AbortOnDrop(tokio::spawn(state.store.clone().watch_replication()));
    let app = app(state, limits);
    // Listening for SIGHUP before announcing: a reload sent once the address is known is
    // never the signal's default action (exit).
    let _reloads = match reload {
        Some(reload) => Some(AbortOnDrop(tokio::spawn(reloads(
            reload,
            auth,
            tls.clone(),
        )?))),
        None => None,
    };

    tracing::info!(%addr, tls = tls.is_some(), "listening");
    ready();

    let server = &settings.server;
    let options = Arc::new(conn::Options {
        timeouts: conn::Timeouts {
            header: Duration::from_millis(server.header_timeout_ms),
            idle: Duration::from_millis(server.idle_timeout_ms),
            write: Duration::from_millis(server.write_timeout_ms),
        },
        tls,
        http2_max_concurrent_streams: server.http2_max_concurrent_streams,
        http2_max_header_list_bytes: server.http2_max_header_list_bytes,
        unread: Arc::new(conn::Unread::new(
            server.http2_max_unread_bytes_per_connection,
            server.http2_max_unread_bytes,
        )),
    });
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    let slots = Slots::new(server.max_connections, server.max_connections_per_client);
    accept(
        &listener,
        &app,
        &options,
        &slots,
        &stopped,
        &mut connections,
        shutdown,
    )
    .await;
    drop(listener);
    tracing::info!(
        connections = connections.len(),
        "shutting down: draining in-flight requests"
    );
    let _ = stop.send(true);
    // Event streams never end by themselves: end them, so that their connections (handling a
    // response until its body ends) finish it within the grace, and their clients see the end
    // of the stream rather than a cut connection.
    events.close();
    let grace = settings.server.shutdown_grace();
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?grace,
            requests = connections.len(),
            "requests being handled did not finish within the shutdown grace period; exiting anyway"
        );
    }
    Ok(())
}

/// Accepts connections until `shutdown` resolves, within the connection caps (`slots`): a peer
/// over its own cap is closed at once; at the overall cap, room is made (the longest-idle
/// connection not handling a request is closed) or, if every connection is handling one, this
/// loop waits with the new connection, and the next ones wait in the kernel's backlog. Backs
/// off when accept fails.
async fn accept(
    listener: &TcpListener,
    app: &crate::http::App,
    options: &Arc<conn::Options>,
    slots: &Arc<Slots>,
    stopped: &watch::Receiver<bool>,
    connections: &mut JoinSet<()>,
    shutdown: impl Future<Output = ()>,
) {
    let mut backoff = Backoff::default();
    tokio::pin!(shutdown);
    loop {
        // Finished connections are reaped as the loop goes, so the set stays as large as the
        // number of open connections.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        match accepted {
            Ok((stream, peer)) => {
                if slots.over_client_cap(peer.ip()) {
                    tracing::debug!(%peer, "closing a connection over server.max_connections_per_client");
                    metrics::counter!("fencegate_connections_closed_total", "reason" => "over the per-client cap").increment(1);
                    continue; // dropped: closed
                }
                tokio::select! {
                    () = &mut shutdown => return,
                    () = slots.make_room() => {}
                }
                let handle = conn::Handle::new();
                let slot = slots.take(peer.ip(), handle.clone());
                let (app, options, stopped) = (app.clone(), options.clone(), stopped.clone());
                connections.spawn(async move {
                    conn::serve(stream, handle, app, options, stopped).await;
                    drop(slot);
                });
            }
            Err(err) if is_connection_error(&err) => {}
            Err(err) => {
                // EMFILE, ENFILE, ENOMEM...: retrying at once would spin and log without end;
                // wait for connections (and file descriptors) to be freed.
                let (wait, log) = backoff.failed();
                if let Some(failures) = log {
                    tracing::warn!(%err, ?wait, failures, "accept failed; backing off (logged at most once a second)");
                }
                metrics::counter!("fencegate_accept_errors_total").increment(1);
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// The SIGHUP listener: on each signal, [`reload`] (a failure is logged, and what was in
/// force stays). Registered at once, so that an error (no signal handling) stops start-up.
fn reloads(
    settings: Reload,
    auth: Option<Arc<crate::auth::Live>>,
    tls: Option<Arc<crate::tls::Tls>>,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("cannot listen for SIGHUP (configuration reloads)")?;
    Ok(async move {
        #[cfg(unix)]
        while hangups.recv().await.is_some() {
            match settings().and_then(|new| reload(&new, auth.as_deref(), tls.as_deref())) {
                Ok(what) => {
                    tracing::info!(reloaded = %what, "SIGHUP: configuration reloaded; connections already open are kept");
                    metrics::counter!("fencegate_config_reloads_total", "result" => "ok")
                        .increment(1);
                }
                Err(err) => {
                    tracing::error!(
                        error = %format!("{err:#}"),
                        "SIGHUP: the configuration was NOT reloaded; the one in force is kept. Fix the error and send SIGHUP again"
                    );
                    metrics::counter!("fencegate_config_reloads_total", "result" => "error")
                        .increment(1);
                }
            }
        }
        #[cfg(not(unix))]
        let _ = (settings, auth, tls);
    })
}

/// Applies what a reload may change — `[[auth.keys]]`, `[[auth.certs]]`, `[auth.jwt]` (its key
/// file or secret) and `[server.tls]` (certificate, key, client CAs) — all or nothing: every
/// file is read and checked before anything is replaced. Turning authentication or TLS on or
/// off needs a restart (the edge and the listener were set up for one or the other). Returns
/// what is now in force, for the log.
pub fn reload(
    new: &Settings,
    auth: Option<&crate::auth::Live>,
    tls: Option<&crate::tls::Tls>,
) -> anyhow::Result<String> {
    if new.auth.enabled() != auth.is_some() {
        anyhow::bail!(
            "the new configuration turns authentication {}; that needs a restart of fencegate",
            if new.auth.enabled() { "on" } else { "off" }
        );
    }
    if new.server.tls.is_some() != tls.is_some() {
        anyhow::bail!(
            "the new configuration turns TLS (server.tls) {}; that needs a restart of fencegate",
            if new.server.tls.is_some() {
                "on"
            } else {
                "off"
            }
        );
    }
    let authenticator = crate::auth::Authenticator::new(&new.auth, |var| std::env::var(var).ok())?;
    let tls_config = new
        .server
        .tls
        .as_ref()
        .map(crate::tls::server_config)
        .transpose()?;
    if let (Some(live), Some(authenticator)) = (auth, authenticator) {
        live.replace(authenticator);
    }
    if let (Some(tls), Some(config)) = (tls, tls_config) {
        tls.replace(config);
    }
    Ok(format!(
        "{} API keys, {} client certificate identities, JWT {}, TLS certificate {}",
        new.auth.keys.len(),
        new.auth.certs.len(),
        if new.auth.jwt.is_some() { "on" } else { "off" },
        new.server
            .tls
            .as_ref()
            .map_or("none".to_owned(), |t| t.cert_file.display().to_string())
    ))
}

/// Errors of one connection that the client gave up on: accept the next at once.
fn is_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        err.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// 10 ms, doubling up to 1 s while failures keep coming (a success in between, one freed
/// descriptor, does not start it over); again from 10 ms after a second without failure.
#[derive(Default)]
struct Backoff {
    wait: Duration,
    last_failure: Option<std::time::Instant>,
    last_log: Option<std::time::Instant>,
    unlogged: u64,
}

impl Backoff {
    /// How long to wait, and the failures to log now (at most once a second), if any.
    fn failed(&mut self) -> (Duration, Option<u64>) {
        let now = std::time::Instant::now();
        let streak = self
            .last_failure
            .is_some_and(|at| now - at < Duration::from_secs(1) + self.wait);
        self.wait = if streak {
            (self.wait * 2).min(Duration::from_secs(1))
        } else {
            Duration::from_millis(10)
        };
        self.last_failure = Some(now);
        self.unlogged += 1;
        if self
            .last_log
            .is_some_and(|at| now - at < Duration::from_secs(1))
        {
            return (self.wait, None);
        }
        self.last_log = Some(now);
        (self.wait, Some(std::mem::take(&mut self.unlogged)))
    }
}

/// Once a second: refreshes the pool gauges, and keeps the timer driver's next wake-up
/// within a second.
///
/// The second part is for speed. tokio's time driver interrupts its own sleep (an eventfd
/// write, then an extra `epoll_wait`) whenever a new timer is due before its next planned
/// wake-up. Every request arms one (the `request_timeout_ms` deadline), so on a runtime with
/// nothing else due, every lone request paid those two system calls (strace: 1 write and
/// 2.8 `epoll_wait` per request without the tick, in bench/RESULTS.md). With a tick due within
/// a second, a later deadline is never the earliest, and arming it is only a wheel insert.
async fn tick(store: Store) {
    let mut every_second = tokio::time::interval(std::time::Duration::from_secs(1));
    every_second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut swept = tokio::time::Instant::now();
    loop {
        every_second.tick().await;
        telemetry::record_pool(&store);
        store.shrink_idle_connections();
        store.record_sql_writers().await;
        // Expired Idempotency-Key outcomes: a bounded sweep, every `IDEMPOTENCY_SWEEP_EVERY`.
        if swept.elapsed() >= IDEMPOTENCY_SWEEP_EVERY {
            swept = tokio::time::Instant::now();
            match store.sweep_idempotency().await {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(deleted, "expired Idempotency-Key outcomes deleted"),
                Err(err) => {
                    tracing::warn!(error = %err, "expired Idempotency-Key outcomes could not be deleted")
                }
            }
        }
    }
}

/// How often the tick deletes expired Idempotency-Key outcomes (in bounded batches).
const IDEMPOTENCY_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

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

/// The HTTP layer's limits that `settings` ask for. `listen` is the address actually bound.
/// Built here, where the whole configuration is at hand, so `http` never imports `config`.
pub(crate) fn limits(settings: &Settings, listen: std::net::SocketAddr) -> Limits {
    let server = &settings.server;
    Limits {
        body_bytes: server.body_limit_bytes,
        request_timeout: settings.request_timeout(),
        max_in_flight: server.max_in_flight,
        body_timeout: Duration::from_millis(server.body_timeout_ms),
        min_body_rate: server.min_body_rate_bytes_per_s,
        max_buffered_bytes: server.max_buffered_bytes,
        max_number_digits: settings.kv.max_number_digits,
        // With credentials, a rebound page cannot send the bearer it does not have.
        loopback_hosts_only: listen.ip().is_loopback() && !settings.auth_enabled(),
        cors_origins: server
            .cors_origins
            .iter()
            .map(|o| {
                axum::http::HeaderValue::from_str(o)
                    .expect("origins are checked by Settings::validate")
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_check_is_on_only_for_a_loopback_listener() {
        let settings = crate::config::Settings::default();
        let on = |addr: &str| limits(&settings, addr.parse().unwrap()).loopback_hosts_only;
        assert!(on("127.0.0.1:8080"));
        assert!(on("[::1]:8080"));
        assert!(
            !on("0.0.0.0:8080"),
            "a non-loopback listener serves any Host"
        );
        assert!(!on("192.168.1.5:8080"));
        // With credentials configured, no Host check (docs/security.md, *The edge*: with auth off).
        let mut with_auth = crate::config::Settings::default();
        with_auth.auth.keys = vec![crate::auth::ApiKeySettings {
            name: "k".into(),
            sha256: "0".repeat(64),
            rights: vec!["read".into()],
            prefixes: vec![],
            tables: vec![],
        }];
        assert!(!limits(&with_auth, "127.0.0.1:8080".parse().unwrap()).loopback_hosts_only);
    }
}
