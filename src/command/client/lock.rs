//! `fencegate lock NAME -- CMD ARGS...`: run a command while holding the built-in lock NAME,
//! and stop it when the lease is lost, like `etcdctl lock` / `consul lock`, but with the
//! fencing token in the command's environment so its writes are fenced too.
//!
//! Timing, all on the monotonic clock and measured from just *before* the acquire or the last
//! successful renew was sent (the server's lease began no earlier than that):
//! - `expiry = sent + ttl`; the server may grant the lock to someone else after it.
//! - `hard stop = expiry - margin`, `margin = max(ttl/10, 100 ms)` (at most ttl/2): by then
//!   CMD's whole process group has been sent SIGKILL, so it is gone before the lease could have
//!   been granted to anyone else, even when the server is unreachable. The margin covers signal
//!   delivery and exit, and the two clocks' rates.
//! - `soft stop = max(hard stop - kill grace, sent + ttl/2)`: no successful renew by then and
//!   CMD gets SIGTERM, then SIGKILL at the hard stop. Renews go out every ttl/3, and after a
//!   failed one every ttl/10, so a server that stays away for ~ttl/6 does not cost the job.
//! - A renew answered 409 (`lock-lost`), or a deadline found already passed (the wrapper itself
//!   was paused: SIGSTOP, a VM stall): SIGTERM now, SIGKILL after `--kill-grace-ms`. The lease
//!   may already be someone else's; CMD's writes under the stale token are refused (412).
//!
//! The deadline is checked before anything else on every turn of the loop, so a wrapper
//! resumed after a pause acts on the lost lease before it renews or does anything else.

use std::{
    future::Future,
    os::unix::process::ExitStatusExt,
    pin::Pin,
    process::ExitStatus,
    time::{Duration, Instant},
};

use clap::Args;
use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};
use reqwest::Method;
use serde_json::json;
use tokio::{
    process::{Child, Command},
    signal::unix::{signal, SignalKind},
    time::sleep_until,
};

use super::{
    http::{exit, segment, Answer, Api, TOKEN},
    Endpoint,
};

/// The lease was lost while CMD ran (EX_SOFTWARE).
pub const EXIT_LOST: u8 = 70;
/// The lock stayed held by another owner past `--wait-ms` (EX_TEMPFAIL).
pub const EXIT_HELD: u8 = 75;

#[derive(Args, Debug)]
pub struct LockArgs {
    /// The built-in lock to hold; also the scope its token fences (FENCEGATE_SCOPE).
    pub name: String,
    #[command(flatten)]
    pub endpoint: Endpoint,
    /// The lease's length; it is renewed every third of it.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub ttl_ms: u64,
    /// Who holds the lock, as others see it in a 409 (default: HOSTNAME:PID).
    #[arg(long)]
    pub owner: Option<String>,
    /// Keep retrying this long while the lock is held by someone else (then exit 75).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub wait_ms: u64,
    /// After SIGTERM to CMD's process group, wait this long before SIGKILL.
    #[arg(long, default_value_t = 2_000, value_name = "MS")]
    pub kill_grace_ms: u64,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The shortest lease the wrapper takes: below it the margin and the renew cadence are noise.
const MIN_TTL_MS: u64 = 200;
const MIN_MARGIN: Duration = Duration::from_millis(100);

/// When to renew, to stop, and to kill, for one `--ttl-ms` and `--kill-grace-ms`.
#[derive(Debug, Clone, Copy)]
struct Timing {
    ttl: Duration,
    margin: Duration,
    grace: Duration,
}

impl Timing {
    fn new(ttl_ms: u64, grace_ms: u64) -> Timing {
        let ttl = Duration::from_millis(ttl_ms);
        Timing {
            ttl,
            margin: (ttl / 10).max(MIN_MARGIN).min(ttl / 2),
            grace: Duration::from_millis(grace_ms),
        }
    }

    fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    fn retry_every(&self) -> Duration {
        self.ttl / 10
    }

    /// CMD's group has had SIGKILL by then.
    fn hard_stop(&self, sent: Instant) -> Instant {
        sent + (self.ttl - self.margin)
    }

    /// Without a successful renew by then, CMD gets SIGTERM.
    fn soft_stop(&self, sent: Instant) -> Instant {
        let hard = self.hard_stop(sent);
        let by_grace = hard.checked_sub(self.grace).unwrap_or(sent);
        by_grace.max(sent + self.ttl / 2).min(hard)
    }
}

/// The lease as the wrapper knows it: its token, and when the request that granted or last
/// renewed it was sent.
struct Lease {
    token: String,
    sent: Instant,
}

/// Why the command is being stopped.
enum Loss {
    /// The server said so (renew answered 409).
    Refused(String),
    /// The soft stop passed without a successful renew, the hard stop not yet.
    NoRenew,
    /// Already past the hard stop when the wrapper looked (it was paused or starved).
    Overslept(Duration),
}

pub async fn run(args: LockArgs) -> u8 {
    if args.ttl_ms < MIN_TTL_MS {
        eprintln!("fencegate lock: --ttl-ms must be at least {MIN_TTL_MS}");
        return exit::USAGE;
    }
    let api = match Api::new(
        &args.endpoint.url,
        Duration::from_millis(args.endpoint.timeout_ms.max(1)),
        &args.endpoint.tls,
    ) {
        Ok(api) => api,
        Err(e) => {
            eprintln!("fencegate lock: {e}");
            return exit::USAGE;
        }
    };
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("fencegate lock: cannot handle signals: {e}");
            return exit::UNAVAILABLE;
        }
    };
    let timing = Timing::new(args.ttl_ms, args.kill_grace_ms);
    let lease = match acquire(&api, &args, &mut signals).await {
        Ok(lease) => lease,
        Err(code) => return code,
    };
    let lock = Held {
        api,
        path: format!("/v1/locks/{}", segment(&args.name)),
        timing,
    };
    if Instant::now() >= timing.soft_stop(lease.sent) {
        eprintln!(
            "fencegate lock: the grant of {:?} took too long to arrive to run anything under it",
            args.name
        );
        lock.release(&lease).await;
        return exit::UNAVAILABLE;
    }
    let mut child = Command::new(&args.command[0]);
    // The wrapped command reaches fencegate as this one does (a `fencegate kv put` in it included).
    for (name, file) in [
        ("FENCEGATE_CACERT", &args.endpoint.tls.cacert),
        ("FENCEGATE_CERT", &args.endpoint.tls.cert),
        ("FENCEGATE_KEY", &args.endpoint.tls.key),
    ] {
        if let Some(file) = file {
            child.env(
                name,
                std::path::absolute(file).unwrap_or_else(|_| file.clone()),
            );
        }
    }
    let child = child
        .args(&args.command[1..])
        .env("FENCEGATE_URL", lock.api.url())
        .env("FENCEGATE_TOKEN", &lease.token)
        .env("FENCEGATE_SCOPE", &args.name)
        // Its own group: a lost lease stops CMD and everything it started, with one signal.
        .process_group(0)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("fencegate lock: cannot run {:?}: {e}", args.command[0]);
            lock.release(&lease).await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
        }
    };
    lock.supervise(child, lease, &mut signals).await
}

/// Acquires NAME, retrying while it is held until `--wait-ms` has passed.
async fn acquire(api: &Api, args: &LockArgs, signals: &mut Signals) -> Result<Lease, u8> {
    let owner = match &args.owner {
        Some(owner) => owner.clone(),
        None => {
            let host = nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default();
            format!(
                "{}:{}",
                if host.is_empty() { "localhost" } else { &host },
                std::process::id()
            )
        }
    };
    let path = format!("/v1/locks/{}", segment(&args.name));
    let give_up = Instant::now() + Duration::from_millis(args.wait_ms);
    loop {
        let sent = Instant::now();
        let rb = api
            .request(Method::POST, &path)
            .json(&json!({"owner": owner, "ttl_ms": args.ttl_ms}));
        let answer = tokio::select! {
            answer = api.send(rb) => answer,
            signal = signals.next() => return Err(128 + signal as u8),
        };
        let pause = match &answer {
            Answer::Status { status: 201, .. } => {
                match answer
                    .field("token")
                    .and_then(|t| t.as_str().map(str::to_owned))
                {
                    Some(token) => return Ok(Lease { token, sent }),
                    None => {
                        eprintln!("fencegate lock: the grant carries no token: {answer:?}");
                        return Err(exit::UNAVAILABLE);
                    }
                }
            }
            Answer::Status { status: 409, .. } if is_problem(&answer, "lock-held") => {
                if Instant::now() >= give_up {
                    eprintln!("fencegate lock: {}", answer.summary());
                    return Err(EXIT_HELD);
                }
                // Try again when the holder's lease would end, but look in now and then.
                let remaining = answer
                    .field("remaining_ms")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0);
                Duration::from_millis(remaining.clamp(10, 250))
            }
            Answer::Status {
                status: 500..=599, ..
            }
            | Answer::None(_)
                if Instant::now() < give_up =>
            {
                Duration::from_millis(250)
            }
            _ => {
                eprintln!("fencegate lock: {}", answer.summary());
                return Err(answer.exit_code());
            }
        };
        let wake = (Instant::now() + pause).min(give_up.max(Instant::now()));
        tokio::select! {
            _ = sleep_until(wake.into()) => {}
            signal = signals.next() => return Err(128 + signal as u8),
        }
    }
}

fn is_problem(answer: &Answer, slug: &str) -> bool {
    answer
        .field("type")
        .and_then(|t| t.as_str().map(|t| t.ends_with(&format!("/{slug}"))))
        .unwrap_or(false)
}

/// A granted lock, while CMD runs under it.
struct Held {
    api: Api,
    path: String,
    timing: Timing,
}

type Renewal = Pin<Box<dyn Future<Output = (Instant, Answer)>>>;

impl Held {
    /// Renews until CMD exits (then releases and passes its status on) or the lease is lost
    /// (then stops CMD and exits 70). SIGINT, SIGTERM and SIGHUP go on to CMD's group.
    async fn supervise(&self, mut child: Child, mut lease: Lease, signals: &mut Signals) -> u8 {
        let group = Pid::from_raw(
            child
                .id()
                .expect("a child that was not waited for has an id") as i32,
        );
        let mut next_renew = lease.sent + self.timing.renew_every();
        let mut renewing: Option<Renewal> = None;
        loop {
            // First, always: has the lease run out while we were away (paused, or starved)?
            let now = Instant::now();
            if now >= self.timing.soft_stop(lease.sent) {
                let loss = match now.checked_duration_since(self.timing.hard_stop(lease.sent)) {
                    Some(late) => Loss::Overslept(late),
                    None => Loss::NoRenew,
                };
                return self.lost(loss, &mut child, group, &lease).await;
            }
            let soft_stop = self.timing.soft_stop(lease.sent);
            tokio::select! {
                biased;
                _ = sleep_until(soft_stop.into()) => {}
                status = child.wait() => {
                    let status = match status {
                        Ok(status) => status,
                        Err(e) => {
                            eprintln!("fencegate lock: cannot wait for the command: {e}");
                            self.release(&lease).await;
                            return exit::UNAVAILABLE;
                        }
                    };
                    // Exited after the lease ran out: its last writes may have come too late.
                    if Instant::now() >= self.timing.soft_stop(lease.sent) {
                        continue;
                    }
                    // What CMD started and left running (`worker &`) must not outlive the lock.
                    self.stop_leftovers(group, &lease).await;
                    self.release(&lease).await;
                    return status_code(status);
                }
                signal = signals.next() => {
                    // CMD decides what a signal means; the lock is released once it has exited.
                    let _ = killpg(group, signal);
                }
                (sent, answer) = async { renewing.as_mut().expect("guarded by is_some").await }, if renewing.is_some() => {
                    renewing = None;
                    match answer {
                        Answer::Status { status: 200, .. } => {
                            lease.sent = sent;
                            next_renew = sent + self.timing.renew_every();
                        }
                        Answer::Status { status: 409, .. } => {
                            return self.lost(Loss::Refused(answer.summary()), &mut child, group, &lease).await;
                        }
                        other => {
                            eprintln!("fencegate lock: renew failed ({}); retrying", other.summary());
                            next_renew = Instant::now() + self.timing.retry_every();
                        }
                    }
                }
                _ = sleep_until(next_renew.into()), if renewing.is_none() => {
                    renewing = Some(self.renew(&lease, soft_stop));
                }
            }
        }
    }

    /// One renew, given up at `until` (no answer by the soft stop is as good as none).
    fn renew(&self, lease: &Lease, until: Instant) -> Renewal {
        let sent = Instant::now();
        let rb = self
            .api
            .request(Method::POST, &format!("{}/renew", self.path))
            .header(TOKEN, &lease.token)
            .json(&json!({"ttl_ms": self.timing.ttl.as_millis() as u64}))
            .timeout(
                until
                    .saturating_duration_since(sent)
                    .max(Duration::from_millis(1)),
            );
        let api = self.api.clone();
        Box::pin(async move { (sent, api.send(rb).await) })
    }

    /// Stops CMD's group (SIGTERM, then SIGKILL) and exits 70.
    async fn lost(&self, loss: Loss, child: &mut Child, group: Pid, lease: &Lease) -> u8 {
        let now = Instant::now();
        let (why, kill_at) = match &loss {
            Loss::Refused(summary) => (
                format!("the server refused the renew ({summary})"),
                now + self.timing.grace,
            ),
            Loss::NoRenew => (
                "no successful renew; stopping the command before the lease can expire".to_owned(),
                (now + self.timing.grace).min(self.timing.hard_stop(lease.sent)),
            ),
            Loss::Overslept(late) => (
                format!(
                    "the lease ran out while this process was not running ({} ms past the stop)",
                    late.as_millis()
                ),
                now + self.timing.grace,
            ),
        };
        eprintln!(
            "fencegate lock: lease lost: {why}; SIGTERM to the command, SIGKILL in {} ms",
            kill_at.saturating_duration_since(now).as_millis()
        );
        let _ = killpg(group, Signal::SIGTERM);
        let exited = tokio::time::timeout_at(kill_at.into(), child.wait()).await;
        // Also whatever CMD left behind in its group.
        let _ = killpg(group, Signal::SIGKILL);
        if exited.is_err() {
            let _ = child.wait().await;
        }
        if !matches!(loss, Loss::Refused(_)) {
            // Still ours if the server merely did not answer in time: free it for the next one.
            self.release(lease).await;
        }
        EXIT_LOST
    }

    /// After CMD itself exited: SIGTERM to whatever is left in its process group, SIGKILL to
    /// what is still there after the grace (or at the soft stop, whichever comes first), so
    /// nothing CMD started runs on once the lock is released.
    async fn stop_leftovers(&self, group: Pid, lease: &Lease) {
        // Signal 0: is anyone left in the group? (ESRCH: no one; the group id is not reused
        // while a process still belongs to it.)
        if killpg(group, None).is_err() {
            return;
        }
        eprintln!("fencegate lock: the command exited but left processes in its group; SIGTERM to them before releasing");
        let _ = killpg(group, Signal::SIGTERM);
        let kill_at = (Instant::now() + self.timing.grace).min(self.timing.soft_stop(lease.sent));
        while Instant::now() < kill_at && killpg(group, None).is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = killpg(group, Signal::SIGKILL);
    }

    /// Frees the lock (best effort: an expired lease frees itself).
    async fn release(&self, lease: &Lease) {
        let rb = self
            .api
            .request(Method::DELETE, &self.path)
            .header(TOKEN, &lease.token)
            .timeout(Duration::from_secs(5));
        match self.api.send(rb).await {
            Answer::Status {
                status: 200..=299, ..
            } => {}
            other => eprintln!(
                "fencegate lock: release failed ({}); the lease expires on its own",
                other.summary()
            ),
        }
    }
}

/// CMD's exit status, or 128+N when a signal N ended it (as a shell reports it).
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.wrapping_add(signal as u8),
        (None, None) => exit::UNAVAILABLE,
    }
}

/// SIGINT, SIGTERM and SIGHUP to the wrapper, to be passed on to CMD (a closed terminal must
/// not kill the wrapper and leave CMD running without a lease).
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_stopped_before_the_lease_can_expire() {
        let t0 = Instant::now();
        let ms = |d: Instant| d.duration_since(t0).as_millis();
        // The defaults: 10 s lease, 2 s grace: SIGTERM at 7 s, SIGKILL at 9 s.
        let t = Timing::new(10_000, 2_000);
        assert_eq!((ms(t.soft_stop(t0)), ms(t.hard_stop(t0))), (7_000, 9_000));
        // A grace longer than the lease: SIGTERM no earlier than half the lease.
        let t = Timing::new(1_000, 2_000);
        assert_eq!((ms(t.soft_stop(t0)), ms(t.hard_stop(t0))), (500, 900));
        assert_eq!(ms(t0 + t.renew_every()), 333);
        // Short leases keep a 100 ms margin.
        let t = Timing::new(300, 0);
        assert_eq!((ms(t.soft_stop(t0)), ms(t.hard_stop(t0))), (200, 200));
    }

    #[test]
    fn signals_become_128_plus_n() {
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(libc_sigterm())), 143);
    }

    fn libc_sigterm() -> i32 {
        Signal::SIGTERM as i32
    }
}
