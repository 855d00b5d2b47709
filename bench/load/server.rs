//! The process under test: the real fencegate binary (release build) on the bench database,
//! configured by BENCH_AUTH / BENCH_ISSUER / BENCH_TRUST, and what /proc says about it (RSS, CPU
//! time). Starting and stopping it is `bench/support/process.rs`, shared with the idle bench.

use std::{
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
};

use anyhow::Result;

use crate::HOT_SCOPE;

pub use crate::process::Fencegate;

/// `BENCH_TRUST`: every trust feature on (`on`: API key, issuer proofs, sticky scope, a jump
/// cap) or off (`off`: none of them, sticky scope off too); unset: fencegate's defaults
/// (sticky scope on, no cap) plus whatever BENCH_AUTH / BENCH_ISSUER ask for.
pub fn bench_trust() -> Option<bool> {
    match std::env::var("BENCH_TRUST").as_deref() {
        Ok("on") => Some(true),
        Ok("off") => Some(false),
        Ok(other) => panic!("BENCH_TRUST={other:?}: say on or off (or leave it unset)"),
        Err(_) => None,
    }
}

/// The jump cap with `BENCH_TRUST=on`: an hour of the run's microsecond tokens. The table reset
/// puts every fence at the clock (database::reset_table), so the run's tokens stay within it.
pub const TRUST_JUMP_CAP: u64 = 3_600_000_000;

/// fencegate's `[kv]` settings for this run, as far as the fenced statement depends on them.
pub fn kv_settings() -> fencegate::fence::KvSettings {
    let mut kv = fencegate::fence::KvSettings::default();
    match bench_trust() {
        Some(true) => kv.max_token_jump = TRUST_JUMP_CAP,
        Some(false) => kv.sticky_scope = false,
        None => {}
    }
    kv
}

/// With `BENCH_AUTH=1` (or `BENCH_TRUST=on`): the API key every request sends
/// (`Authorization: Bearer ...`).
pub fn bench_key() -> Option<&'static str> {
    static KEY: OnceLock<Option<String>> = OnceLock::new();
    KEY.get_or_init(|| {
        let on = match bench_trust() {
            Some(trust) => trust,
            None => std::env::var("BENCH_AUTH").as_deref() == Ok("1"),
        };
        on.then(|| fencegate::auth::new_key().expect("a random key"))
    })
    .as_deref()
}

/// With `BENCH_ISSUER=1` (or `BENCH_TRUST=on`): fencegate has an Ed25519 `[[issuers]]` entry
/// covering every scope, and every scoped write sends the proof of its token (one signature per
/// token, made by the client once: a lock holder's signer signs each token once).
pub fn bench_issuer() -> bool {
    match bench_trust() {
        Some(trust) => trust,
        None => std::env::var("BENCH_ISSUER").as_deref() == Ok("1"),
    }
}

const ISSUER_SEED: [u8; 32] = [3; 32];

/// The proof of `token` for the bench scope, signed once per token.
pub fn proof_of(token: i64) -> String {
    static LAST: std::sync::Mutex<Option<(i64, String)>> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap();
    match &*last {
        Some((t, proof)) if *t == token => proof.clone(),
        _ => {
            let proof = fencegate::issuers::sign(
                HOT_SCOPE,
                fencegate::fence::FencingToken::from_db(token).expect("a bench token"),
                fencegate::issuers::SigningKey::Ed25519(&ISSUER_SEED),
            );
            *last = Some((token, proof.clone()));
            proof
        }
    }
}

/// Where the stderr of fencegate process number `index` goes (its log, at level warn).
pub fn stderr_log(out_dir: &Path, index: usize) -> PathBuf {
    match index {
        0 => out_dir.join("fencegate.stderr.log"),
        _ => out_dir.join(format!("fencegate-{index}.stderr.log")),
    }
}

/// The fencegate binary to measure: `BENCH_FENCEGATE` if set (another build of it, say an older
/// commit's, so that two builds are compared by one harness, interleaved: bench/scripts/ab.sh),
/// else the release binary this bench was built with.
pub fn fencegate_binary() -> String {
    std::env::var("BENCH_FENCEGATE").unwrap_or_else(|_| env!("CARGO_BIN_EXE_fencegate").to_owned())
}

/// `BENCH_PGBOUNCER`: `transaction` or `session` puts PgBouncer in front of fencegate.
fn pgbouncer_mode() -> Option<crate::pgbouncer::PoolMode> {
    match std::env::var("BENCH_PGBOUNCER").ok()?.as_str() {
        "transaction" => Some(crate::pgbouncer::PoolMode::Transaction),
        "session" => Some(crate::pgbouncer::PoolMode::Session),
        other => panic!("BENCH_PGBOUNCER={other:?}: use transaction or session"),
    }
}

/// PgBouncer in front of the bench database's server when `BENCH_PGBOUNCER` asks for it
/// (stopped when dropped).
pub fn pgbouncer() -> Option<crate::pgbouncer::PgBouncer> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    pgbouncer_mode().map(|mode| crate::pgbouncer::PgBouncer::start(&url, mode, 16))
}

/// Starts fencegate process number `index` (0: the one whose memory is reported).
pub async fn start_fencegate(db_url: &str, out_dir: &Path, index: usize) -> Result<Fencegate> {
    let bin = fencegate_binary();
    let log_path = stderr_log(out_dir, index);
    let mut config_text = String::new();
    if let Some(key) = bench_key() {
        config_text.push_str(&format!(
            "[[auth.keys]]\nname = \"bench\"\nsha256 = \"{}\"\nrights = [\"read\", \"write\"]\nprefixes = [\"\"]\n",
            fencegate::auth::digest_hex(key)
        ));
    }
    if bench_issuer() {
        config_text.push_str(&format!(
            "[[issuers]]\nname = \"bench\"\nscopes = [\"\"]\ned25519_public_key = \"{}\"\n",
            fencegate::issuers::ed25519_public_key(&ISSUER_SEED)
        ));
    }
    let kv = kv_settings();
    if bench_trust().is_some() {
        config_text.push_str(&format!(
            "[kv]\nsticky_scope = {}\nmax_token_jump = {}\n",
            kv.sticky_scope, kv.max_token_jump
        ));
    }
    if let Some(mode) = pgbouncer_mode() {
        config_text.push_str(&format!("[database]\npooler = \"{}\"\n", mode.as_str()));
    }
    // More configuration for the measured server, as TOML (e.g. "[database]\ncoalesce_workers = 2"):
    // to compare settings with one harness.
    if let Ok(extra) = std::env::var("BENCH_FENCEGATE_TOML") {
        config_text.push_str(&extra.replace("\\n", "\n"));
        config_text.push('\n');
    }
    let config = match config_text.is_empty() {
        true => None,
        false => {
            let config = out_dir.join("bench.toml");
            std::fs::write(&config, config_text)?;
            Some(config)
        }
    };
    let fg = crate::process::spawn(
        crate::process::command(&bin, db_url, config.as_deref()),
        &log_path,
    )
    .await?;
    FG_PIDS.lock().expect("pids").push(fg.pid);
    Ok(fg)
}

pub use crate::process::stop as stop_fencegate;

/// (VmRSS, VmHWM) in KiB.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let [rss, hwm] = crate::process::status_kib(pid, ["VmRSS:", "VmHWM:"]);
    (rss, hwm)
}

/// The fencegate processes' pids, for their CPU time (set by `start_fencegate`).
static FG_PIDS: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// CPU time in clock ticks (1/100 s on Linux), split as the kernel accounts it: a process's
/// system time includes the loopback TCP work its syscalls do (a send runs the receiver's
/// side of the stack too), which faster user-space code would not remove; fewer syscalls
/// would.
#[derive(Clone, Copy, Default)]
pub struct CpuTicks {
    pub user: u64,
    pub kernel: u64,
}

impl CpuTicks {
    pub fn total(self) -> u64 {
        self.user + self.kernel
    }

    /// µs per item of `total` and of `kernel` over `items`.
    pub fn per(self, items: u64) -> (f64, f64) {
        let us = |ticks: u64| ticks as f64 * 10_000.0 / items.max(1) as f64;
        (us(self.total()), us(self.kernel))
    }
}

impl std::ops::Sub for CpuTicks {
    type Output = CpuTicks;

    fn sub(self, before: CpuTicks) -> CpuTicks {
        // Saturating: a process that exited within the window reads as 0 afterwards.
        CpuTicks {
            user: self.user.saturating_sub(before.user),
            kernel: self.kernel.saturating_sub(before.kernel),
        }
    }
}

/// User and system CPU time of the fencegate processes so far.
pub fn fg_cpu_ticks() -> CpuTicks {
    let pids = FG_PIDS.lock().expect("pids").clone();
    pids.iter()
        .map(|&pid| cpu_ticks_of(pid))
        .fold(CpuTicks::default(), |a, b| CpuTicks {
            user: a.user + b.user,
            kernel: a.kernel + b.kernel,
        })
}

/// User and system CPU time of one process so far (zero once it has exited).
pub fn cpu_ticks_of(pid: u32) -> CpuTicks {
    crate::process::stat(pid).map_or_else(CpuTicks::default, |stat| CpuTicks {
        user: stat.utime,
        kernel: stat.stime,
    })
}
