//! The recorded history: one JSON object per line, written by every worker process to its own
//! file, read back by the checker.
//!
//! Time is wall-clock microseconds since the Unix epoch (`SystemTime`): every process on the
//! machine reads the same clock, unlike `Instant`, which is only comparable inside one process.
//! Every operation is recorded as an `invoke` before the request is sent and one completion after
//! it: `ok` (it happened), `fail` (it certainly did not happen) or `info` (unknown: a timeout, a
//! 503, a connection lost mid-request). A completion's interval therefore always contains the
//! moment the server acted, even if the worker was frozen in between.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Wall-clock microseconds since the Unix epoch: a clock shared by all processes of the run.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the system clock is before 1970")
        .as_micros() as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Info,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Acquire,
    Read,
    Write,
    Release,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Acquire, Op::Read, Op::Write, Op::Release];

    pub fn name(self) -> &'static str {
        match self {
            Op::Acquire => "acquire",
            Op::Read => "read",
            Op::Write => "write",
            Op::Release => "release",
        }
    }
}

/// One history line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock microseconds (see [`now_us`]).
    pub t: u64,
    /// Worker name, e.g. `w2`.
    pub process: String,
    pub pid: u32,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub op: Op,
    /// The logical operation (one lock cycle) within the process; retries share it.
    pub op_id: u64,
    /// 1-based attempt of this op within the cycle (a write is retried after an unknown outcome).
    pub attempt: u32,
    /// Index of the fencegate process the request went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<usize>,
    pub key: String,
    /// Acquire ok: the granted token; write/release: the presented token; read ok: the
    /// `fence_token` of the value read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Read ok: the counter read (0 when the key does not exist yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<i64>,
    /// Write: the value written (read + 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<i64>,
    /// HTTP status, when a response arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// For a 503: whether it carried `Retry-After`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<bool>,
    /// `timeout`, `connect: ..`, `io: ..`, or a description of an unexpected body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A 412's `current_token` (acquire 409: not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_token: Option<u64>,
    /// Completions: how long the request took, as the worker measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
}

impl Event {
    pub fn new(process: &str, kind: Kind, op: Op, op_id: u64, attempt: u32, key: &str) -> Self {
        Event {
            t: now_us(),
            process: process.to_string(),
            pid: std::process::id(),
            kind,
            op,
            op_id,
            attempt,
            node: None,
            key: key.to_string(),
            token: None,
            read: None,
            write: None,
            status: None,
            retry_after: None,
            error: None,
            current_token: None,
            latency_ms: None,
        }
    }
}

/// Appends events to a history file, one `write(2)` per line, so that nothing buffered is lost
/// if the process is killed and the lines of a frozen process are complete up to the freeze.
pub struct Recorder {
    file: File,
}

impl Recorder {
    pub fn create(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("cannot open the history file {}: {e}", path.display()));
        Recorder { file }
    }

    pub fn record(&mut self, event: &Event) {
        let mut line = serde_json::to_vec(event).expect("an event serializes");
        line.push(b'\n');
        self.file.write_all(&line).expect("write a history line");
    }
}

/// Reads a whole history file. A torn last line (a process killed mid-write) is reported, not
/// silently dropped.
pub fn read_history(path: &Path) -> Result<Vec<Event>, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}: read error: {e}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line).map_err(|e| {
            format!(
                "{}:{}: not a history event ({e}): {line}",
                path.display(),
                n + 1
            )
        })?;
        events.push(event);
    }
    Ok(events)
}

/// The last complete events of a history file, oldest first (the nemesis uses them to find the
/// lock holder).
pub fn tail_events(path: &Path) -> Vec<Event> {
    let mut tail = String::new();
    let read = (|| {
        let mut file = File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(4096))).ok()?;
        file.read_to_string(&mut tail).ok()
    })();
    if read.is_none() {
        return Vec::new();
    }
    // Whole lines only: the first may be cut by the seek, the last may be mid-write.
    let Some(end) = tail.rfind('\n') else {
        return Vec::new();
    };
    tail[..end]
        .split('\n')
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}
