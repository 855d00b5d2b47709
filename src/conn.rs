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
//! `server.write_timeout_ms`) closes the connection, freeing the response it held.
//!
//! On shutdown, a connection that is not handling a request is closed at once — a half-sent
//! request has touched nothing — and one that is gets to finish it (hyper's graceful shutdown;
//! for HTTP/2, a GOAWAY and the streams open finish). The connection cap (`slots`) closes
//! connections for the same reason: through a [`Handle`], it asks the one that made no
//! progress the longest to close, which it does unless it is handling a request by then.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::{body::Body, extract::Request, response::Response, Router};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
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

/// How every connection is served.
pub struct Options {
    pub timeouts: Timeouts,
    /// HTTPS; `None`: plain HTTP.
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// `server.http2_max_concurrent_streams`.
    pub http2_max_concurrent_streams: u32,
    /// `server.http2_max_header_list_bytes`.
    pub http2_max_header_list_bytes: u32,
}

/// Streams a client reset before they were answered, at most, per connection (then GOAWAY):
/// rapid reset (CVE-2023-44487) makes the server start work for requests it cancels at once.
const HTTP2_MAX_PENDING_RESET_STREAMS: usize = 20;
/// Streams the server had to reset (a protocol error of the client's) at most, per connection.
const HTTP2_MAX_LOCAL_ERROR_RESETS: usize = 100;

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
    /// HTTP/2 (from its first request on): reads and writes are frames, not progress.
    multiplexed: AtomicBool,
    /// Requests being handled (HTTP/1: 0 or 1).
    active: AtomicU32,
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
        if n == 0 || self.multiplexed.load(Ordering::Relaxed) {
            return;
        }
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if self.phase.compare_exchange(IDLE, HEADERS, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.headers_since.store(now, Ordering::Relaxed);
        }
    }

    fn wrote(&self) {
        if !self.multiplexed.load(Ordering::Relaxed) {
            self.last_io.store(self.now(), Ordering::Relaxed);
        }
        self.write_blocked_since.store(0, Ordering::Relaxed);
    }

    /// A request is answered; the last one: idle from now, and the watchdog has a deadline
    /// again (it had none while requests were handled).
    fn handled(&self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.last_io.store(self.now(), Ordering::Relaxed);
            self.phase.store(IDLE, Ordering::Release);
        }
    }

    /// Handling a request: HTTP/1 once its body is read, HTTP/2 while any stream is open.
    fn handling(&self) -> bool {
        if self.multiplexed.load(Ordering::Relaxed) {
            self.active.load(Ordering::Acquire) > 0
        } else {
            self.phase.load(Ordering::Acquire) == HANDLING
        }
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
            _ if self.handling() => None,
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
            multiplexed: AtomicBool::new(false),
            active: AtomicU32::new(0),
        }))
    }

    /// Since when the connection has made no progress, if it is not handling a request: idle
    /// since its last byte, or its request's headers arriving since their first byte (headers
    /// trickled a byte at a time are no progress: that is slowloris), or its body arriving
    /// since its last byte (the minimum body rate bounds the rest). Closing such a connection
    /// loses nothing that was acted on. `None`: a request is being handled.
    pub fn idle_since(&self) -> Option<Instant> {
        let state = &self.0;
        if state.handling() {
            return None;
        }
        match state.phase.load(Ordering::Acquire) {
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

/// The connection (a socket, or TLS over one: then what it reports is plaintext), reporting its
/// progress to the watchdog.
struct Watched<I> {
    io: I,
    state: Arc<State>,
}

impl<I: AsyncRead + Unpin> AsyncRead for Watched<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.state.read(buf.filled().len() - before);
        }
        polled
    }
}

impl<I> Watched<I> {
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

impl<I: AsyncWrite + Unpin> AsyncWrite for Watched<I> {
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
    _request: InFlight,
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

/// A request being handled: counted from hyper calling the router until its response is ready
/// (or, a stream, has ended), or until its future is dropped (the client went away, or reset
/// the HTTP/2 stream).
struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.handled();
    }
}

/// The router for one connection: marks the phase of each request, and gives it the
/// connection's verified client certificate.
#[derive(Clone)]
struct Serve {
    router: Router,
    state: Arc<State>,
    cert: Option<Arc<crate::auth::ClientCert>>,
}

impl hyper::service::Service<Request<Incoming>> for Serve {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        use axum::body::HttpBody;
        let multiplexed = req.version() == hyper::Version::HTTP_2;
        self.state.active.fetch_add(1, Ordering::AcqRel);
        let request = InFlight(self.state.clone());
        if multiplexed {
            // Streams overlap: the connection is handling while any is (the edge's body
            // timeout and rate bound each stream's body).
            self.state.multiplexed.store(true, Ordering::Relaxed);
            self.state.phase.store(HANDLING, Ordering::Release);
        } else {
            let phase = if req.body().is_end_stream() { HANDLING } else { BODY };
            self.state.phase.store(phase, Ordering::Release);
        }
        let mut req = req.map(Body::new);
        req.extensions_mut().insert(Watch(self.state.clone()));
        if let Some(cert) = &self.cert {
            req.extensions_mut().insert(cert.clone());
        }
        let router = self.router.clone();
        Box::pin(async move {
            let Ok(mut response) = router.oneshot(req).await;
            if multiplexed {
                // `Connection: close` (after a 401, or a body left unread) means nothing in
                // HTTP/2, where a refused stream leaves the others and the connection whole.
                response.headers_mut().remove(axum::http::header::CONNECTION);
            }
            if response.body().size_hint().exact().is_some() {
                // The whole body is at hand (every response but a stream): it is written next,
                // under the write timeout, and the request is done.
                drop(request);
                return Ok(response);
            }
            // A stream (the console's events): the request is handled until its body ends, so
            // that shutdown lets it finish rather than cutting it as an idle connection.
            Ok(response.map(|body| Body::new(Streaming { body, _request: request })))
        })
    }
}

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
pub async fn serve(stream: TcpStream, handle: Handle, router: Router, options: Arc<Options>, mut shutdown: watch::Receiver<bool>) {
    let state = handle.0;
    if *shutdown.borrow() {
        return;
    }
    let Some(tls) = &options.tls else {
        return watch(stream, state, router, None, &options, Protocol::Detect, shutdown).await;
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
    let protocol = if session.alpn_protocol() == Some(b"h2") { Protocol::Http2 } else { Protocol::Http1 };
    let cert = session.peer_certificates().and_then(|chain| chain.first()).map(|der| Arc::new(crate::tls::client_cert(der)));
    watch(stream, state, router, cert, &options, protocol, shutdown).await
}

/// Why a connection was closed before it was served (the metric's reason).
struct Closed(&'static str);

/// Whether the connection starts with a TLS record (a handshake: byte 0x16) rather than, say,
/// a plain HTTP request. Waits for its first byte.
async fn tls_record_first(stream: &TcpStream) -> Result<bool, Closed> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => Err(Closed("closed before the TLS handshake")),
        Ok(_) => Ok(!first[0].is_ascii_uppercase()),
    }
}

/// A plain HTTP request on the TLS port: answered in plain HTTP, saying what to do, then closed.
async fn refuse_plain_http(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    const BODY: &str = "this port serves HTTPS: use an https:// URL\n";
    let response = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
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
    router: Router,
    cert: Option<Arc<crate::auth::ClientCert>>,
    options: &Options,
    protocol: Protocol,
    mut shutdown: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let now = Instant::now();
    let timeouts = options.timeouts;
    let io = TokioIo::new(Watched { io, state: state.clone() });
    let service = Serve { router, state: state.clone(), cert };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The watchdog times headers (from their first byte) and idleness separately.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.http2_max_concurrent_streams)
        .max_header_list_size(options.http2_max_header_list_bytes)
        .max_pending_accept_reset_streams(HTTP2_MAX_PENDING_RESET_STREAMS)
        .max_local_error_reset_streams(HTTP2_MAX_LOCAL_ERROR_RESETS);
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
            if !state.handling() {
                return Poll::Ready(Exit::Closed("reaped at the connection cap"));
            }
            // Too late: it took a request meanwhile. The cap picks another.
            reaped.set(state.reap.notified());
            continue;
        }
        if !draining {
            if let Poll::Ready(changed) = stop.as_mut().poll(cx) {
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
