use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::net::TcpStream;

use crate::io::ReadBuf;
use crate::net::Socket;

/// The two tokio streams sqlx reads from, as [`read_noting_drained`] needs them.
trait ReadyStream {
    fn try_read_buf_dyn(&self, buf: &mut dyn ReadBuf) -> io::Result<usize>;
    fn try_io_readable(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>;
}

macro_rules! ready_stream {
    ($stream:ty) => {
        impl ReadyStream for $stream {
            fn try_read_buf_dyn(&self, mut buf: &mut dyn ReadBuf) -> io::Result<usize> {
                self.try_read_buf(&mut buf)
            }

            fn try_io_readable(
                &self,
                f: &mut dyn FnMut() -> io::Result<usize>,
            ) -> io::Result<usize> {
                self.try_io(tokio::io::Interest::READABLE, f)
            }
        }
    };
}

ready_stream!(TcpStream);
#[cfg(unix)]
ready_stream!(tokio::net::UnixStream);

/// fencegate's patch (FENCEGATE.md): a read that did not fill the buffer drained the socket
/// (epoll is edge-triggered, so data arriving later sets readiness again), so readiness is
/// cleared, as tokio's own `poll_read` does. Without it, the next read after every reply was a
/// `recvfrom` that returned `EAGAIN`: one wasted system call per statement (TLS reads after
/// each write) before sqlx waited for readiness.
///
/// The read runs inside `try_io`, whose closure reports a short read as `WouldBlock`: tokio then
/// clears the readiness it saw *before* the read, and keeps any that the I/O driver recorded
/// since (on another thread, data that arrived after the read). Clearing after the read instead
/// could erase that, and with edge-triggered epoll no new event would come: the statement would
/// wait for a reply already there. Not on Windows (level-triggered), as in tokio.
fn read_noting_drained(stream: &impl ReadyStream, buf: &mut dyn ReadBuf) -> io::Result<usize> {
    if cfg!(windows) {
        return stream.try_read_buf_dyn(buf);
    }
    let room = buf.chunk_mut().len();
    let mut short = 0;
    let read = stream.try_io_readable(&mut || {
        let n = stream.try_read_buf_dyn(&mut *buf)?;
        if n > 0 && n < room {
            short = n;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match read {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && short > 0 => Ok(short),
        other => other,
    }
}

impl Socket for TcpStream {
    fn try_read(&mut self, buf: &mut dyn ReadBuf) -> io::Result<usize> {
        read_noting_drained(self, buf)
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (*self).try_write(buf)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (*self).poll_read_ready(cx)
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (*self).poll_write_ready(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self).poll_shutdown(cx)
    }
}

#[cfg(unix)]
impl Socket for tokio::net::UnixStream {
    fn try_read(&mut self, buf: &mut dyn ReadBuf) -> io::Result<usize> {
        read_noting_drained(self, buf)
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (*self).try_write(buf)
    }

    fn poll_read_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (*self).poll_read_ready(cx)
    }

    fn poll_write_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        (*self).poll_write_ready(cx)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self).poll_shutdown(cx)
    }
}
