//! One client connection: HTTP/1.1 or HTTP/2 (over TLS when configured) served by hyper, watched
//! so that a slow or silent client cannot hold it (and the memory behind it) for ever.
//!
//! **TLS.** With `[server.tls]`, the handshake comes first and must finish within
//! `server.header_timeout_ms` of the connection's acceptance (a client that opens TCP and never
//! completes it is closed then, and the connection cap may close it sooner to make room, as an
//! idle connection). A plain HTTP request sent to the TLS port is answered with a plain 400
//! saying to use `https://`. ALPN decides the protocol: `h2`, else HTTP/1.1. On a plain
//! listener, HTTP/2 is spoken by a client that starts with its preface (h2c with prior
//! knowledge), HTTP/1.1 otherwise.
//!
//! **HTTP/1.** The watchdog knows the connection's phase from its I/O and from the request it
//! serves:
//! - **idle** (no byte of a next request yet): closed after `server.idle_timeout_ms`;
//! - **headers** (a request's first byte came, its headers are not complete): closed
//!   `server.header_timeout_ms` after that first byte. hyper's own `header_read_timeout` starts
//!   when it *waits* for headers, idle keep-alive included, so it cannot tell the two apart;
//! - **body**: the edge reads it within `server.body_timeout_ms` (`http::edge`);
//! - **handling**: bounded by `server.request_timeout_ms` in the router.
//!
//! **HTTP/2.** Phases per connection do not fit: many requests (streams) share it, and its
//! bytes are frames, not requests. So per request, the gate's protections apply to each stream
//! exactly as to an HTTP/1 request (the edge's Host check, 415/413, the body's timeout, minimum
//! rate and budget, an in-flight slot, the request timeout); and per connection:
//! - before its first request, the connection is in the **headers** phase from its first byte
//!   (the preface): no request within `server.header_timeout_ms`, closed;
//! - after it, it is **handling** while any stream is, and otherwise **idle** since its last
//!   stream ended: frames that are not requests (PING, SETTINGS, WINDOW_UPDATE, a header block
//!   never finished) are not progress, so a client that only sends those is closed after
//!   `server.idle_timeout_ms`, and the cap may close it first;
//! - HTTP/2's own limits are hyper's (`h2`): at most `server.http2_max_concurrent_streams`
//!   streams at once, header lists up to `server.http2_max_header_list_bytes` (a header block
//!   sent in endless CONTINUATION frames is cut there: the connection is closed), streams
//!   reset by the client before they are answered (rapid reset, CVE-2023-44487) and streams
//!   the server had to reset both capped per connection (then GOAWAY), one PONG owed at a time
//!   (a PING flood that does not read its PONGs stops being read, then the write timeout
//!   closes it), and SETTINGS acknowledged one at a time likewise.
//!
//! In every phase and protocol, a response the client does not read (no byte written for
//! `server.write_timeout_ms`) closes the connection, freeing the response it held. On HTTP/2,
//! where a zero flow-control window holds responses without ever blocking a write, the bytes
//! of responses not yet handed over are a budget per connection and in all, past which new
//! streams are refused, and a connection that makes no room for them for
//! `server.write_timeout_ms` is closed ([`unread`]).
//!
//! On shutdown, a connection that is not handling a request is closed at once — a half-sent
//! request has touched nothing — and one that is gets to finish it (hyper's graceful shutdown;
//! for HTTP/2, a GOAWAY and the streams open finish). The connection cap (`slots`) closes
//! connections for the same reason: through a [`Handle`], it asks the one that made no
//! progress the longest to close, which it does unless it is handling a request by then.

mod handshake;
mod service;
mod state;
mod unread;
mod watched;

pub use state::{Handle, Watch};
pub use unread::Unread;

use std::{
    future::Future,
    sync::{atomic::Ordering, Arc},
    task::Poll,
    time::Duration,
};

use crate::http::App;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
    time::Instant,
};

use handshake::{refuse_plain_http, tls_record_first, Closed};
use service::Serve;
use state::State;
use watched::Watched;

/// Timeouts of a connection (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub write: Duration,
}

/// How every connection is served.
pub struct Options {
    pub timeouts: Timeouts,
    /// HTTPS; `None`: plain HTTP.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// `server.http2_max_concurrent_streams`.
    pub http2_max_concurrent_streams: u32,
    /// `server.http2_max_header_list_bytes`.
    pub http2_max_header_list_bytes: u32,
    /// HTTP/2 response bytes the clients have not read, per connection and in all (`unread`).
    pub unread: Arc<Unread>,
}

/// Streams a client reset before they were answered, at most, per connection (then GOAWAY):
/// rapid reset (CVE-2023-44487) makes the server start work for requests it cancels at once.
const HTTP2_MAX_PENDING_RESET_STREAMS: usize = 20;
/// Streams the server had to reset (a protocol error of the client's) at most, per connection.
const HTTP2_MAX_LOCAL_ERROR_RESETS: usize = 100;
/// Bytes of a stream's response buffered in the protocol at most (hyper's default: 400 KiB).
const HTTP2_MAX_SEND_BUF: usize = 4 * unread::CHUNK;

/// Why [`serve`] stopped polling the connection.
enum Exit {
    /// hyper is done: the client closed, or an error.
    Ended(Result<(), Box<dyn std::error::Error + Send + Sync>>),
    /// The watchdog closes it.
    Closed(&'static str),
    /// Shutdown, with no request being handled.
    Shutdown,
}

/// Serves one connection until the client closes it, the watchdog does, or shutdown does (at
/// once, or once the request being handled is answered).
///
/// The watchdog needs no wake-ups: every change of the connection's phase (a read, a write,
/// hyper calling the router, the edge reading the body, the response finishing) happens while
/// the connection is polled, in this task. So the deadline is recomputed after each poll, and
/// the timer is moved only when the deadline comes EARLIER than the one it is set for (a
/// request's first byte, a blocked write). A later deadline (every answered request) leaves it
/// be: when it fires early, the deadline is recomputed and the timer set again. A busy
/// connection thus touches its timer about once per timeout, not twice per request.
pub async fn serve(
    stream: TcpStream,
    handle: Handle,
    app: App,
    options: Arc<Options>,
    mut shutdown: watch::Receiver<bool>,
) {
    let state = handle.0;
    if *shutdown.borrow() {
        return;
    }
    let Some(tls) = &options.tls else {
        return watch(
            stream,
            state,
            app,
            None,
            &options,
            Protocol::Detect,
            shutdown,
        )
        .await;
    };
    let accepted = Instant::now();
    let handshake = async {
        if !tls_record_first(&stream).await? {
            refuse_plain_http(stream).await;
            return Err(Closed("plain HTTP on the TLS port"));
        }
        let stream = tls.acceptor().accept(stream).await.map_err(|err| {
            tracing::debug!(%err, "TLS handshake failed");
            Closed("TLS handshake failed")
        })?;
        Ok(stream)
    };
    let outcome = tokio::select! {
        outcome = tokio::time::timeout_at(accepted + options.timeouts.header, handshake) => {
            outcome.unwrap_or(Err(Closed("TLS handshake too slow")))
        }
        () = state.reap.notified() => Err(Closed("reaped at the connection cap")),
        _ = shutdown.changed() => return,
    };
    let stream = match outcome {
        Ok(stream) => stream,
        Err(Closed(why)) => {
            tracing::debug!(why, "closing a connection");
            metrics::counter!("fencegate_connections_closed_total", "reason" => why).increment(1);
            return;
        }
    };
    let session = stream.get_ref().1;
    let protocol = if session.alpn_protocol() == Some(b"h2") {
        Protocol::Http2
    } else {
        Protocol::Http1
    };
    let cert = session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|der| Arc::new(crate::tls::client_cert(der)));
    watch(stream, state, app, cert, &options, protocol, shutdown).await
}

/// One poll outside tokio's cooperative budget. The watchdog polls its timer and the shutdown
/// signal once and then relies on their wake-ups: a poll that the budget refused (hyper may
/// have spent it on the same pass) would register nothing, and nothing would poll them again.
fn unconstrained_poll<T>(
    cx: &mut std::task::Context<'_>,
    poll: impl FnMut(&mut std::task::Context<'_>) -> Poll<T>,
) -> Poll<T> {
    std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(poll))).poll(cx)
}

/// The protocol of a connection: decided by ALPN on TLS, by the first bytes on plain HTTP.
#[derive(Clone, Copy)]
enum Protocol {
    /// HTTP/2 if it starts with the HTTP/2 preface (h2c with prior knowledge), else HTTP/1.
    Detect,
    Http1,
    Http2,
}

/// Serves `io` under the watchdog (see [`serve`]).
async fn watch<I>(
    io: I,
    state: Arc<State>,
    app: App,
    cert: Option<Arc<crate::auth::ClientCert>>,
    options: &Options,
    protocol: Protocol,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let now = Instant::now();
    let timeouts = options.timeouts;
    let io = TokioIo::new(Watched {
        io,
        state: state.clone(),
    });
    let service = Serve {
        app,
        state: state.clone(),
        cert,
        unread: options.unread.clone(),
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The watchdog times headers (from their first byte) and idleness separately.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_concurrent_streams)
        .max_header_list_size(options.http2_max_header_list_bytes)
        .max_pending_accept_reset_streams(HTTP2_MAX_PENDING_RESET_STREAMS)
        .max_local_error_reset_streams(HTTP2_MAX_LOCAL_ERROR_RESETS)
        // What a stream may buffer beyond what its body has handed over: the unread budget
        // charges a body until its last piece is handed over (`unread`), so this is what a
        // stream holds outside it.
        .max_send_buf_size(HTTP2_MAX_SEND_BUF);
    let builder = match protocol {
        Protocol::Detect => builder,
        Protocol::Http1 => builder.http1_only(),
        Protocol::Http2 => builder.http2_only(),
    };
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let timer = tokio::time::sleep_until(now + timeouts.idle);
    tokio::pin!(timer);
    // What the timer is set for; `None` once it fired (nothing set).
    let mut armed = Some(now + timeouts.idle);
    // Whether the timer has been polled since it was last set: once it has, it holds this
    // task's waker, and whether it fired is a load (`is_elapsed`) instead of a poll, which
    // costs about 120 instructions, three times per request (callgrind).
    let mut registered = false;
    // The shutdown signal and the cap's request to close are rare; once polled, each holds
    // this task's waker, and is polled again only when a cheap check says it may be ready
    // (two polls of each per request cost about 300 instructions, callgrind).
    let shutdown_seen = shutdown.clone();
    let stop = shutdown.changed();
    tokio::pin!(stop);
    let mut stop_polled = false;
    let reaped = state.reap.notified();
    tokio::pin!(reaped);
    let mut reaped_polled = false;
    let mut draining = false;
    let exit = std::future::poll_fn(|cx| loop {
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(Exit::Ended(result));
        }
        // After hyper's poll: a request that arrived in full is being handled by now, and is
        // not cut; a response already answered has been written out (or is blocked).
        if !reaped_polled || state.reap_asked.load(Ordering::Acquire) {
            reaped_polled = true;
            if reaped.as_mut().poll(cx).is_ready() {
                // Cleared only once the notification is taken; a later one finds the fresh
                // `Notified` below polled at once.
                state.reap_asked.store(false, Ordering::Release);
                if !state.handling() {
                    return Poll::Ready(Exit::Closed("reaped at the connection cap"));
                }
                // Too late: it took a request meanwhile. The cap picks another.
                reaped.set(state.reap.notified());
                reaped_polled = false;
                continue;
            }
        }
        if !draining && (!stop_polled || shutdown_seen.has_changed().unwrap_or(true)) {
            stop_polled = true;
            if let Poll::Ready(changed) = unconstrained_poll(cx, |cx| stop.as_mut().poll(cx)) {
                draining = true;
                if changed.is_err() || !state.handling() {
                    // Nothing of a request has been acted on: close now.
                    return Poll::Ready(Exit::Shutdown);
                }
                conn.as_mut().graceful_shutdown();
                continue; // hyper acts on it when polled
            }
        }
        if let Some((at, _)) = state.deadline(&timeouts) {
            if armed.is_none_or(|armed| at < armed) {
                timer.as_mut().reset(at);
                armed = Some(at);
                registered = false;
            }
        }
        if armed.is_none() {
            return Poll::Pending;
        }
        let fired = if registered {
            timer.is_elapsed()
        } else {
            registered = true;
            unconstrained_poll(cx, |cx| timer.as_mut().poll(cx)).is_ready()
        };
        if !fired {
            return Poll::Pending;
        }
        // The timer fired: for the deadline it was set for, or for one that has moved since.
        armed = None;
        if let Some((at, why)) = state.deadline(&timeouts) {
            if at <= Instant::now() {
                return Poll::Ready(Exit::Closed(why));
            }
        }
        // Not due (yet, or any more): set it again above, and poll it so that it wakes us.
    })
    .await;
    match exit {
        Exit::Ended(Err(err)) => tracing::debug!(%err, "connection ended with an error"),
        Exit::Ended(Ok(())) | Exit::Shutdown => {}
        Exit::Closed(why) => {
            tracing::debug!(why, "closing a connection");
            metrics::counter!("fencegate_connections_closed_total", "reason" => why).increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future as _, pin::pin, task::Poll, time::Duration};

    /// The watchdog polls its timer once and then only reads whether it fired: that poll must
    /// register the timer even when hyper spent the task's cooperative budget on the same pass
    /// (a poll refused for budget creates no timer, which then never fires).
    #[tokio::test]
    async fn a_timer_polled_once_with_the_budget_spent_still_fires() {
        for outside_the_budget in [true, false] {
            let mut timer = pin!(tokio::time::sleep(Duration::from_millis(20)));
            std::future::poll_fn(|cx| {
                let mut spend = pin!(async {
                    while tokio::task::coop::has_budget_remaining() {
                        tokio::task::coop::consume_budget().await;
                    }
                });
                assert!(spend.as_mut().poll(cx).is_ready(), "spent in this poll");
                let polled = if outside_the_budget {
                    super::unconstrained_poll(cx, |cx| timer.as_mut().poll(cx))
                } else {
                    timer.as_mut().poll(cx)
                };
                assert!(polled.is_pending());
                Poll::Ready(())
            })
            .await;
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(
                timer.is_elapsed(),
                outside_the_budget,
                "a timer polled outside the budget fires; one refused by it was never made"
            );
        }
    }
}
