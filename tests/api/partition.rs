//! A cut network heals fast (docs/operations.md, *When the network to PostgreSQL fails*): packets
//! to PostgreSQL silently dropped (iptables DROP of the packets arriving from and at the database's port, as a dead host or a
//! partition does: no reset ever arrives) under a steady write load. While cut, writes are 503
//! with Retry-After; after the heal they succeed again within seconds, not after TCP's
//! retransmission backoff. `/readyz` is 503 during the cut and never 200 while writes cannot
//! succeed: no write started after the first 200 that followed the heal fails. On a cluster of
//! this test's own (its port is the one cut), as root.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::spawn_app_on;
use crate::support_pg::{self, Cluster};

/// iptables rules dropping every packet to and from `port` on this machine, removed on drop
/// (also when the test fails).
struct Cut {
    port: u16,
}

impl Cut {
    fn rules(port: u16) -> [Vec<String>; 2] {
        let p = port.to_string();
        [
            ["INPUT", "-p", "tcp", "--dport", &p, "-j", "DROP"]
                .map(String::from)
                .to_vec(),
            ["INPUT", "-p", "tcp", "--sport", &p, "-j", "DROP"]
                .map(String::from)
                .to_vec(),
        ]
    }

    fn start(port: u16) -> Cut {
        for rule in Self::rules(port) {
            let out = Command::new("iptables")
                .arg("-I")
                .args(&rule)
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run iptables ({e}): install it (Debian: apt-get install iptables); the test needs root")
                });
            assert!(
                out.status.success(),
                "iptables -I {}: {} (the test needs root and iptables)",
                rule.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Cut { port }
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for rule in Self::rules(self.port) {
            let _ = Command::new("iptables").arg("-D").args(&rule).output();
        }
    }
}

#[tokio::test]
async fn writes_succeed_within_seconds_of_a_healed_partition() {
    let bindir = support_pg::bindir(
        None,
        "PostgreSQL server binaries not found: install them (Debian: apt-get install postgresql); \
         the partition test starts a cluster of its own",
    );
    let dir = tempfile::Builder::new()
        .prefix("fencegate-pg-cut-")
        .tempdir()
        .expect("a temporary directory")
        .keep();
    let cleanup = format!("rm -rf {}", support_pg::shell_quote(&dir));
    let cluster = Cluster::new(
        &bindir,
        &dir,
        "-c fsync=off -c synchronous_commit=off",
        &cleanup,
        "",
    );
    // fencegate's defaults, but a shorter request timeout, so the cut's 503s come quickly.
    let app = Arc::new(
        spawn_app_on(cluster.url(), |s| {
            s.server.request_timeout_ms = 4000;
        })
        .await,
    );
    app.get("/readyz").await.expect(200);

    // Four writers, each writing a key of its own with rising tokens, as fast as answers come.
    // (when the write was sent, when it was answered, its status)
    let log: Arc<Mutex<Vec<(Instant, Instant, u16)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4 {
        let (app, log, stop) = (app.clone(), log.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut token = 1u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let sent = Instant::now();
                let r = app
                    .kv_put(&format!("cut-{w}"), &token.to_string(), &json!(token))
                    .await;
                if r.status == 503 {
                    assert!(
                        r.header("retry-after").is_some(),
                        "a 503 without Retry-After"
                    );
                } else {
                    assert!(
                        matches!(r.status, 200 | 201),
                        "unexpected {}: {}",
                        r.status,
                        r.text
                    );
                }
                log.lock().unwrap().push((sent, Instant::now(), r.status));
                token += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cut_at = Instant::now();
    let cut = Cut::start(cluster.port);
    // Readiness during the cut: 503 once the cut is noticed (the request timeout), every time.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut ready_in_cut = 0;
    while cut_at.elapsed() < Duration::from_secs(30) {
        let r = app.get("/readyz").await;
        if r.status == 200 {
            ready_in_cut += 1;
        } else {
            r.problem(503, "unavailable");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    drop(cut);
    let healed_at = Instant::now();
    // After the heal: the first /readyz 200, and the first write answered 200 (a minute at most).
    let deadline = healed_at + Duration::from_secs(60);
    let mut first_ready = None;
    let first_ok = loop {
        if first_ready.is_none() {
            let asked = Instant::now();
            if app.get("/readyz").await.status == 200 {
                first_ready = Some(asked);
            }
        }
        let found = log
            .lock()
            .unwrap()
            .iter()
            .find(|(_, at, status)| *at > healed_at && matches!(status, 200 | 201))
            .map(|(_, at, _)| *at);
        if let (Some(at), Some(_)) = (found, first_ready) {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "within 60 s of the heal: first write ok {found:?}, first ready {first_ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let first_ready = first_ready.expect("ready");
    // Some writes after readiness, to hold it to its word.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }
    let (refused_while_cut, ok_while_cut) = {
        let log = log.lock().unwrap();
        let in_cut = |at: &Instant| *at > cut_at + Duration::from_secs(15) && *at < healed_at;
        (
            log.iter()
                .filter(|(_, at, s)| in_cut(at) && *s == 503)
                .count(),
            log.iter()
                .filter(|(_, at, s)| in_cut(at) && *s != 503)
                .count(),
        )
    };
    let failed_after_ready: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(sent, _, s)| *sent >= first_ready && *s == 503)
        .map(|(sent, _, _)| *sent - healed_at)
        .collect();
    let back_after = first_ok - healed_at;
    let ready_after = first_ready - healed_at;
    println!(
        "partition: {refused_while_cut} writes 503 in the cut's last 15 s, {ok_while_cut} ok; /readyz 200 {ready_in_cut} times \
         in the cut's last 20 s; after the heal: first write ok {back_after:?}, first /readyz 200 {ready_after:?}"
    );
    assert_eq!(
        ready_in_cut, 0,
        "/readyz said 200 while the database was cut off"
    );
    assert!(
        failed_after_ready.is_empty(),
        "writes sent after /readyz said 200 ({ready_after:?} after the heal) failed, sent at {failed_after_ready:?} after the heal"
    );
    assert!(
        refused_while_cut > 0,
        "no 503 while the database was unreachable"
    );
    assert_eq!(
        ok_while_cut, 0,
        "a write succeeded while the database was unreachable"
    );
    assert!(
        back_after < Duration::from_secs(10),
        "writes came back {back_after:?} after the heal (TCP's backoff, not fencegate's own timeouts)"
    );
    // Readiness agrees once writes are back.
    app.get("/readyz").await.expect(200);
}
