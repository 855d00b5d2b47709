//! Small helpers for spawned tasks, shared by the server and the store (neither imports the
//! other for them).

/// Aborts its task when dropped: a background task (a ticker, a listener, a watcher) lives
/// exactly as long as whoever holds this, and ends with it even on an early return or a panic.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
