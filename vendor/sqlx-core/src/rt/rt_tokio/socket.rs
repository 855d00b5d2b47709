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
    fn forget_readable(&self);
}

macro_rules! ready_stream {
    ($stream:ty) => {
        impl ReadyStream for $stream {
            fn try_read_buf_dyn(&self, mut buf: &mut dyn ReadBuf) -> io::Result<usize> {
                self.try_read_buf(&mut buf)
            }

            fn forget_readable(&self) {
                // `try_io` clears the readiness its closure reports `WouldBlock` for, without a
                // system call: tokio's public way to say "this socket is drained".
                let _ = self.try_io(tokio::io::Interest::READABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
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
fn read_noting_drained(stream: &impl ReadyStream, buf: &mut dyn ReadBuf) -> io::Result<usize> {
    let room = buf.chunk_mut().len();
    let n = stream.try_read_buf_dyn(buf)?;
    if n > 0 && n < room {
        stream.forget_readable();
    }
    Ok(n)
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
