//! A TCP proxy between fencegate and PostgreSQL that a test can break, without root networking.
//! One copy for the test binaries (`#[path]`-included as `proxy`): tests/api's outage test and
//! tests/fault's nemesis drive it:
//! - `cut`: every proxied connection is reset (RST) at once and new ones are closed as soon as
//!   they are accepted, until `heal` (a firewall rejecting the traffic, a pooler restart);
//! - `stall`: bytes stop flowing in both directions and new connections wait, until `heal`
//!   (a partition that drops packets: nothing fails, everything just waits);
//! - `heal`: back to forwarding (stalled bytes are then delivered);
//! - `switch`: new connections go to another server, and every existing one is reset (what
//!   HAProxy or a DNS change does at a failover: the old primary is gone).
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Stall,
    Cut,
}

/// Mode, and an epoch that grows with every cut: connections opened before a cut never resume.
type State = (Mode, u64);

pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    upstream: Arc<Mutex<SocketAddr>>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let (state, rx) = watch::channel((Mode::Pass, 0u64));
        let upstream = Arc::new(Mutex::new(upstream));
        let task = tokio::spawn(accept_loop(listener, upstream.clone(), rx));
        Proxy {
            port,
            state,
            upstream,
            task,
        }
    }

    /// From now on, connections go to `upstream`; the existing ones are reset.
    pub fn switch(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
        self.state.send_modify(|s| *s = (Mode::Pass, s.1 + 1));
    }

    pub fn cut(&self) {
        self.state.send_modify(|s| *s = (Mode::Cut, s.1 + 1));
    }

    pub fn stall(&self) {
        self.state.send_modify(|s| s.0 = Mode::Stall);
    }

    pub fn heal(&self) {
        self.state.send_modify(|s| s.0 = Mode::Pass);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        // Existing connections end too: a cut with no way back.
        self.cut();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: Arc<Mutex<SocketAddr>>,
    rx: watch::Receiver<State>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let upstream = *upstream.lock().unwrap();
        tokio::spawn(connection(client, upstream, rx.clone()));
    }
}

/// Waits until bytes may flow. `false`: a cut happened (or is in force): drop the connection.
async fn wait_pass(rx: &mut watch::Receiver<State>, epoch: u64) -> bool {
    loop {
        let (mode, now) = *rx.borrow_and_update();
        if now != epoch || mode == Mode::Cut {
            return false;
        }
        if mode == Mode::Pass {
            return true;
        }
        if rx.changed().await.is_err() {
            return false;
        }
    }
}

/// Resolves when a cut happens after `epoch`.
async fn cut_after(rx: &mut watch::Receiver<State>, epoch: u64) {
    loop {
        if rx.borrow_and_update().1 != epoch {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut rx: watch::Receiver<State>) {
    let epoch = rx.borrow().1;
    if !wait_pass(&mut rx, epoch).await {
        reset_on_close(&client);
        return;
    }
    let server =
        match tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(upstream)).await {
            Ok(Ok(server)) => server,
            // PostgreSQL is down: the client sees its connection closed, as behind any TCP proxy.
            _ => return,
        };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_r, client_w) = client.into_split();
    let (server_r, server_w) = server.into_split();
    let cut = tokio::select! {
        cut = pump(client_r, server_w, rx.clone(), epoch) => cut,
        cut = pump(server_r, client_w, rx.clone(), epoch) => cut,
    };
    let _ = cut; // both halves of both sockets are dropped here: the connection is closed
}

/// Copies one direction. Returns `true` if it ended because of a cut (then the socket it writes
/// to has been set to reset on close).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut rx: watch::Receiver<State>,
    epoch: u64,
) -> bool {
    let mut buf = vec![0u8; 32 * 1024];
    let reset = |from: &OwnedReadHalf, to: &OwnedWriteHalf| {
        reset_on_close(from.as_ref());
        reset_on_close(to.as_ref());
        true
    };
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            },
            () = cut_after(&mut rx, epoch) => return reset(&from, &to),
        };
        if !wait_pass(&mut rx, epoch).await {
            return reset(&from, &to);
        }
        tokio::select! {
            written = to.write_all(&buf[..n]) => if written.is_err() { return false },
            () = cut_after(&mut rx, epoch) => return reset(&from, &to),
        }
    }
}

/// SO_LINGER 0: closing sends a RST instead of a FIN (the peer sees "connection reset").
/// (Deprecated in tokio because a *non-zero* linger blocks the thread on drop; zero does not.)
#[allow(deprecated)]
fn reset_on_close(socket: &TcpStream) {
    let _ = socket.set_linger(Some(Duration::ZERO));
}
