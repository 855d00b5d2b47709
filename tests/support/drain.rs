//! A child's output pipe read to the end in the background, kept for failure messages and
//! assertions. Shared by the test binaries (`#[path]`-included as `drain`): a child whose
//! stderr nobody reads blocks once the pipe is full, and its last words are what a failing test
//! most needs to show.
#![allow(dead_code)] // each test binary uses a different part

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::task::JoinHandle;

pub struct Drain {
    text: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

impl Drain {
    /// Starts reading `pipe` (e.g. `child.stderr.take().unwrap()`) until it closes.
    pub fn start(mut pipe: impl AsyncRead + Unpin + Send + 'static) -> Drain {
        let text = Arc::new(Mutex::new(String::new()));
        let sink = text.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Drain { text, task }
    }

    /// Everything read so far.
    pub fn text(&self) -> String {
        self.text.lock().unwrap().clone()
    }

    /// Everything the child wrote, once the pipe is closed (after its exit), waiting at most
    /// `limit`: a grandchild that inherited the pipe may keep it open.
    pub async fn finish(&mut self, limit: Duration) -> String {
        let _ = tokio::time::timeout(limit, &mut self.task).await;
        self.text()
    }
}
