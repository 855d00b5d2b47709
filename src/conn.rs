//! One client connection: HTTP/1 served by hyper, watched so that a slow or silent client cannot
//! hold it (and the memory behind it) for ever.
//!
//! The watchdog knows the connection's phase from its I/O and from the request it serves:
//! - **idle** (no byte of a next request yet): closed after `server.idle_timeout_ms`;
//! - **headers** (a request's first byte came, its headers are not complete): closed
//!   `server.header_timeout_ms` after that first byte. hyper's own `header_read_timeout` starts
//!   when it *waits* for headers, idle keep-alive included, so it cannot tell the two apart;
//! - **body**: the edge reads it within `server.body_timeout_ms` (`http::edge`);
//! - **handling**: bounded by `server.request_timeout_ms` in the router.
//!
//! In every phase, a response the client does not read (no byte written for
//! `server.write_timeout_ms`) closes the connection, freeing the response it held.
//!
//! On shutdown, a connection that is not handling a request is closed at once — a half-sent
//! request has touched nothing — and one that is gets to finish it (hyper's graceful shutdown).
//! The connection cap (`slots`) closes connections for the same reason: through a [`Handle`],
//! it asks the one that made no progress the longest to close, which it does unless it is
//! handling a request by then.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicU8, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{body::Body, extract::Request, response::Response, Router};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::{watch, Notify},
    time::Instant,
};
use tower::ServiceExt;

/// Timeouts of a connection (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub write: Duration,
}

const IDLE: u8 = 0;
const HEADERS: u8 = 1;
const BODY: u8 = 2;
const HANDLING: u8 = 3;

/// What the watchdog knows of one connection. Times are milliseconds since `epoch`.
struct State {
    epoch: Instant,
    phase: AtomicU8,
    /// Last byte read or written.
    last_io: AtomicU64,
    /// The first byte of the request whose headers are awaited.
    headers_since: AtomicU64,
    /// When a write first found the socket full (0: not blocked).
    write_blocked_since: AtomicU64,
    /// The connection cap asks the connection to close (see [`Handle::close_if_idle`]).
    reap: Notify,
}

impl State {
    fn now(&self) -> u64 {
        // +1 so that 0 can mean "never".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms.saturating_sub(1))
    }

    fn read(&self, n: usize) {
        if n == 0 {
            return;
        }
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.phase.compare_exchange(IDLE, HEADERS, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.headers_since.store(now, Ordering::Relaxed);
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.write_blocked_since.store(0, Ordering::Relaxed);
    }

    /// The request is answered: idle from now, and the watchdog has a deadline again (it had
    /// none while the request was handled).
    fn handled(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.phase.store(IDLE, Ordering::Release);
    }

    fn write_blocked(&self) {
        let _ = self.write_blocked_since.compare_exchange(0, self.now(), Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The next moment the connection may have to close, and why; `None`: nothing due (a
    /// request is being read or handled, and its own timeouts bound it).
    fn deadline(&self, t: &Timeouts) -> Option<(Instant, &'static str)> {
        let blocked = self.write_blocked_since.load(Ordering::Relaxed);
        let write = (blocked != 0).then(|| (self.at(blocked) + t.write, "the client did not read its response"));
        let phase = match self.phase.load(Ordering::Acquire) {
            IDLE => Some((self.at(self.last_io.load(Ordering::Relaxed)) + t.idle, "idle")),
            HEADERS => Some((self.at(self.headers_since.load(Ordering::Relaxed)) + t.header, "headers too slow")),
            _ => None,
        };
        match (write, phase) {
            (Some(w), Some(p)) => Some(if w.0 <= p.0 { w } else { p }),
            (w, p) => w.or(p),
        }
    }
}

/// The connection as the connection cap sees it: how long it has made no progress, and a way
/// to ask it to close. Made before the connection is served ([`Handle::new`], then [`serve`]).
#[derive(Clone)]
pub struct Handle(Arc<State>);

impl Handle {
    pub fn new() -> Self {
        Handle(Arc::new(State {
            epoch: Instant::now(),
            phase: AtomicU8::new(IDLE),
            last_io: AtomicU64::new(1),
            headers_since: AtomicU64::new(0),
            write_blocked_since: AtomicU64::new(0),
            reap: Notify::new(),
        }))
    }

    /// Since when the connection has made no progress, if it is not handling a request: idle
    /// since its last byte, or its request's headers arriving since their first byte (headers
    /// trickled a byte at a time are no progress: that is slowloris), or its body arriving
    /// since its last byte (the minimum body rate bounds the rest). Closing such a connection
    /// loses nothing that was acted on. `None`: a request is being handled.
    pub fn idle_since(&self) -> Option<Instant> {
        let state = &self.0;
        match state.phase.load(Ordering::Acquire) {
            HANDLING => None,
            HEADERS => Some(state.at(state.headers_since.load(Ordering::Relaxed))),
            _ => Some(state.at(state.last_io.load(Ordering::Relaxed))),
        }
    }

    /// Asks the connection to close unless it is handling a request when it gets to it (it
    /// may have started one since [`Handle::idle_since`]). Counted as
    /// `fencegate_connections_closed_total{reason="reaped at the connection cap"}`.
    pub fn close_if_idle(&self) {
        self.0.reap.notify_one();
    }
}

#[cfg(test)]
impl Handle {
    /// Resolves once [`Handle::close_if_idle`] was called (for the cap's tests).
    pub(crate) async fn asked_to_close(&self) {
        self.0.reap.notified().await
    }
}

impl Default for Handle {
    fn default() -> Self {
        Handle::new()
    }
}

/// The connection as the request sees it (a request extension): the edge says when the body
/// has been read.
#[derive(Clone)]
pub struct Watch(Arc<State>);

impl Watch {
    pub fn body_read(&self) {
        let _ = self.0.phase.compare_exchange(BODY, HANDLING, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// The socket, reporting its progress to the watchdog.
struct Watched {
    io: TcpStream,
    state: Arc<State>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.state.read(buf.filled().len() - before);
        }
        polled
    }
}

impl Watched {
    /// Bytes written are progress; a write that finds the socket full starts the write clock.
    /// (Not a flush: hyper flushes whenever the connection is polled, so a flush would make
    /// an idle connection look busy.)
    fn track(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match &polled {
            Poll::Ready(Ok(n)) if *n > 0 => self.state.wrote(),
            Poll::Pending => self.state.write_blocked(),
            _ => {}
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.track(polled)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.track(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A streaming response's body: the connection goes back to idle when it ends (or is dropped,
/// e.g. the client went away).
struct Streaming {
    body: Body,
    state: Arc<State>,
}

impl axum::body::HttpBody for Streaming {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        self.state.handled();
    }
}

/// The router for one connection: marks the phase of each request.
#[derive(Clone)]
struct Serve {
    router: Router,
    state: Arc<State>,
}

impl hyper::service::Service<Request<Incoming>> for Serve {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        use axum::body::HttpBody;
        let phase = if req.body().is_end_stream() { HANDLING } else { BODY };
        self.state.phase.store(phase, Ordering::Release);
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(Watch(self.state.clone()));
        let state = self.state.clone();
        let router = self.router.clone();
        Box::pin(async move {
            let Ok(response) = router.oneshot(req).await;
            if response.body().size_hint().exact().is_some() {
                // The whole body is at hand (every response but a stream): it is written next,
                // under the write timeout, and the request is done.
                state.handled();
                return Ok(response);
            }
            // A stream (the console's events): the request is handled until its body ends, so
            // that shutdown lets it finish rather than cutting it as an idle connection.
            Ok(response.map(|body| Body::new(Streaming { body, state })))
        })
    }
}

/// Why [`serve`] stopped polling the connection.
enum Exit {
    /// hyper is done: the client closed, or an error.
    Ended(hyper::Result<()>),
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
pub async fn serve(stream: TcpStream, handle: Handle, router: Router, timeouts: Timeouts, mut shutdown: watch::Receiver<bool>) {
    let now = Instant::now();
    let state = handle.0;
    let io = TokioIo::new(Watched { io: stream, state: state.clone() });
    let service = Serve { router, state: state.clone() };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog times headers (from their first byte) and idleness separately.
    builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    if *shutdown.borrow() {
        return;
    }
    let timer = tokio::time::sleep_until(now + timeouts.idle);
    tokio::pin!(timer);
    // What the timer is set for; `None` once it fired (nothing set).
    let mut armed = Some(now + timeouts.idle);
    let stop = shutdown.changed();
    tokio::pin!(stop);
    let reaped = state.reap.notified();
    tokio::pin!(reaped);
    let mut draining = false;
    let exit = std::future::poll_fn(|cx| loop {
        if let Poll::Ready(result) = conn.as_mut().poll(cx) {
            return Poll::Ready(Exit::Ended(result));
        }
        // After hyper's poll: a request that arrived in full is being handled by now, and is
        // not cut; a response already answered has been written out (or is blocked).
        if reaped.as_mut().poll(cx).is_ready() {
            if state.phase.load(Ordering::Acquire) != HANDLING {
                return Poll::Ready(Exit::Closed("reaped at the connection cap"));
            }
            // Too late: it took a request meanwhile. The cap picks another.
            reaped.set(state.reap.notified());
            continue;
        }
        if !draining {
            if let Poll::Ready(changed) = stop.as_mut().poll(cx) {
                draining = true;
                if changed.is_err() || state.phase.load(Ordering::Acquire) != HANDLING {
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
            }
        }
        if armed.is_none() || timer.as_mut().poll(cx).is_pending() {
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
