//! HTTP/2: the bytes of responses a client has not read yet are a budget, per connection and
//! across all connections.
//!
//! On HTTP/1 a response the client does not read fills the socket, the write blocks, and the
//! write timeout closes the connection. On HTTP/2 a client can hold responses without ever
//! blocking a write: it announces a flow-control window of zero (or a tiny one), and the
//! server keeps each stream's response in memory, waiting for a WINDOW_UPDATE that never comes,
//! while the streams' slots are already free for the next requests. So every HTTP/2 response
//! body is charged here from the moment it is produced until the last of it is handed to the
//! protocol (or the stream is gone):
//! - a new stream on a connection whose charge, or the process's, is at its limit is refused
//!   (`RST_STREAM REFUSED_STREAM`: nothing was done, the client may retry) before any work;
//! - a GET or HEAD response that would take either charge past its limit is dropped and its
//!   stream refused the same way (a read has no effect to lose). A write's response is always
//!   sent: the write took effect, so a refusal would tell the client something false;
//! - a connection holding a charge whose client makes no room for any of it (no piece handed
//!   over) for `server.write_timeout_ms` is closed (`state`), which frees everything it held.
//!
//! The body handed to hyper ([`Charged`]) gives a large body out in copies of [`CHUNK`] bytes:
//! hyper asks for the next piece only once the stream's window has room, so a stream the
//! client does not read keeps at most one piece in the protocol's buffers, outside the charge,
//! and the whole body stays charged until the last piece is handed over.

use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use axum::body::{Body, Bytes, HttpBody};
use hyper::body::Frame;

use super::state::State;

/// The largest piece of a response body handed to HTTP/2 at once: its default frame size.
pub(super) const CHUNK: usize = 16 * 1024;

/// The budgets of unread HTTP/2 response bytes (module docs).
pub struct Unread {
    total: AtomicUsize,
    max_total: usize,
    max_per_connection: usize,
}

impl Unread {
    /// `server.http2_max_unread_bytes_per_connection` and `server.http2_max_unread_bytes`.
    pub fn new(max_per_connection: usize, max_total: usize) -> Self {
        Unread {
            total: AtomicUsize::new(0),
            max_total,
            max_per_connection,
        }
    }

    /// Whether a new stream on the connection must be refused: its charge or the process's is
    /// at its limit.
    pub(super) fn full(&self, conn: &State) -> bool {
        conn.unread.load(Ordering::Relaxed) >= self.max_per_connection
            || self.total.load(Ordering::Relaxed) >= self.max_total
    }

    /// Charges a response body of `n` bytes to the connection and the process. `None` if it
    /// does not fit and `force` is false. A body fits a connection or process that holds
    /// nothing yet, whatever its size, so a value larger than a budget can still be read.
    pub(super) fn charge(
        self: &Arc<Self>,
        conn: &Arc<State>,
        n: usize,
        force: bool,
    ) -> Option<Charge> {
        let held = conn.unread.load(Ordering::Relaxed);
        if !force && held > 0 && held + n > self.max_per_connection {
            return None;
        }
        let total = self.total.fetch_add(n, Ordering::AcqRel);
        if !force && total > 0 && total + n > self.max_total {
            self.total.fetch_sub(n, Ordering::AcqRel);
            return None;
        }
        conn.charged(n);
        Some(Charge {
            unread: self.clone(),
            conn: conn.clone(),
            n,
        })
    }
}

/// A response body's bytes, charged until it is dropped.
pub(super) struct Charge {
    unread: Arc<Unread>,
    conn: Arc<State>,
    n: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.unread.total.fetch_sub(self.n, Ordering::AcqRel);
        self.conn.unread.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// An HTTP/2 response body whose bytes are charged until the last of it is handed over
/// (module docs).
pub(super) struct Charged {
    body: Body,
    /// What is left of a data frame larger than [`CHUNK`], given out a copy at a time.
    rest: Bytes,
    charge: Option<Charge>,
}

impl Charged {
    pub(super) fn new(body: Body, charge: Charge) -> Self {
        Charged {
            body,
            rest: Bytes::new(),
            charge: Some(charge),
        }
    }

    /// The next piece of `rest`: a copy, so that the protocol's buffer does not keep the whole
    /// body's allocation alive once the charge is released.
    fn piece(&mut self) -> Bytes {
        let n = self.rest.len().min(CHUNK);
        let piece = Bytes::copy_from_slice(&self.rest[..n]);
        self.rest = self.rest.slice(n..);
        if self.rest.is_empty() {
            self.rest = Bytes::new();
        }
        piece
    }
}

impl HttpBody for Charged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        // hyper asks for more only when the stream's window has room: the client made some.
        if let Some(charge) = &this.charge {
            charge.conn.unread_progressed();
        }
        if !this.rest.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(this.piece()))));
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) if data.len() > CHUNK => {
                    this.rest = data;
                    Poll::Ready(Some(Ok(Frame::data(this.piece()))))
                }
                Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(None) => {
                // All of it is handed over: what is left in the protocol's buffers is at most
                // a piece per stream.
                this.charge = None;
                Poll::Ready(None)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let mut hint = self.body.size_hint();
        if !self.rest.is_empty() {
            let rest = self.rest.len() as u64;
            hint = match hint.exact() {
                Some(n) => hyper::body::SizeHint::with_exact(n + rest),
                None => {
                    let mut h = hyper::body::SizeHint::new();
                    h.set_lower(hint.lower() + rest);
                    h
                }
            };
        }
        hint
    }
}
