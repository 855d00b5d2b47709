//! Many concurrent writers with random tokens, through two servers on one database, while
//! readers watch. The outcome must be explainable by the accept rule applied atomically, one
//! write at a time.
//!
//! Half the writers draw tokens uniformly from 0..1000 (mostly zombies once the fence is high);
//! the other half draw from a window that climbs with each write (still within 0..1000), so
//! accepted writes keep overlapping all through the run: that is where a check-then-write race
//! would show.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::helpers::{kv, spawn_app_on, TestApp, TOKEN};
use crate::pg::fresh_database as pg_fresh;

const WRITERS: usize = 32;
const WRITES_EACH: usize = 40;
const KEYS: [&str; 3] = ["alpha", "beta", "gamma"];
const READERS: usize = 4;

#[derive(Debug, Clone)]
struct Rec {
    key: usize,
    token: i64,
    id: String,
    start: Instant,
    end: Instant,
    status: u16,
    /// `current_token` of a 412.
    current: Option<i64>,
}

#[derive(Debug)]
struct Read {
    key: usize,
    token: Option<i64>,
    start: Instant,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_writers_obey_the_accept_rule() {
    run(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_writers_obey_the_strict_accept_rule() {
    run(true).await;
}

async fn run(strict: bool) {
    let seed: u64 = rand::random();
    let ctx = format!("(strict={strict}, seed={seed})");
    let db = pg_fresh().await;
    let one = spawn_app_on(db.clone(), |s| s.kv.strict = strict).await;
    // Let the first server migrate before the second starts: this test is about writes.
    one.get("/readyz").await.expect(200);
    let two = spawn_app_on(db, |s| s.kv.strict = strict).await;
    let apps: Arc<[TestApp; 2]> = Arc::new([one, two]);

    let mut rng = StdRng::seed_from_u64(seed);
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let plan: Vec<(usize, i64)> = (0..WRITES_EACH)
            .map(|i| {
                let token = if w % 2 == 0 {
                    rng.gen_range(0..1000)
                } else {
                    (i as i64) * 20 + rng.gen_range(0..200)
                };
                (rng.gen_range(0..KEYS.len()), token)
            })
            .collect();
        let apps = apps.clone();
        tasks.push(tokio::spawn(async move {
            let app = &apps[w % 2];
            let mut recs = Vec::with_capacity(plan.len());
            for (i, (key, token)) in plan.into_iter().enumerate() {
                let id = format!("w{w}-{i}");
                let rb = app
                    .req(reqwest::Method::PUT, &kv(KEYS[key]))
                    .header(TOKEN, token.to_string())
                    .json(&json!({"id": id, "token": token.to_string()}));
                let start = Instant::now();
                let r = app.send(rb).await;
                let end = Instant::now();
                let current = (r.status == 412).then(|| {
                    let body = r.json();
                    body["current_token"]
                        .as_str()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or_else(|| panic!("412 without a string current_token: {r:?}"))
                });
                assert!(
                    matches!(r.status, 200 | 201 | 412),
                    "only 200/201/412 are acceptable under contention: {r:?}"
                );
                recs.push(Rec {
                    key,
                    token,
                    id,
                    start,
                    end,
                    status: r.status,
                    current,
                });
            }
            recs
        }));
    }
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for r in 0..READERS {
        let (apps, done) = (apps.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = Vec::new();
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                let key = (r + i) % KEYS.len();
                i += 1;
                let start = Instant::now();
                let resp = apps[r % 2].kv_get(KEYS[key]).await;
                let token = match resp.status {
                    404 => None,
                    200 => Some(
                        resp.json()["fence_token"]
                            .as_str()
                            .and_then(|t| t.parse::<i64>().ok())
                            .unwrap_or_else(|| {
                                panic!("GET without a string fence_token: {resp:?}")
                            }),
                    ),
                    _ => panic!("GET under contention: {resp:?}"),
                };
                reads.push(Read { key, token, start });
            }
            reads
        }));
    }

    let mut recs: Vec<Rec> = Vec::new();
    for t in futures::future::join_all(tasks).await {
        recs.extend(t.expect("writer task panicked"));
    }
    done.store(true, Ordering::Relaxed);
    assert_eq!(recs.len(), WRITERS * WRITES_EACH);
    let mut reads: Vec<Read> = Vec::new();
    for t in futures::future::join_all(readers).await {
        reads.extend(t.expect("reader task panicked"));
    }

    for (k, name) in KEYS.iter().enumerate() {
        let mine: Vec<&Rec> = recs.iter().filter(|r| r.key == k).collect();
        let accepted: Vec<&Rec> = mine.iter().copied().filter(|r| r.status != 412).collect();
        let rejected: Vec<&Rec> = mine.iter().copied().filter(|r| r.status == 412).collect();
        assert!(!accepted.is_empty(), "{name}: no write was accepted {ctx}");

        // Exactly one create: there are no deletes, so the key is absent only once.
        let creates = accepted.iter().filter(|r| r.status == 201).count();
        assert_eq!(creates, 1, "{name}: {creates} writes answered 201 {ctx}");

        // (a) Once a write with token t is acknowledged, no write with a lower token that
        //     starts afterwards may be accepted.
        for w in &accepted {
            for a in &accepted {
                assert!(
                    !(a.token > w.token && w.start > a.end),
                    "{name}: {} (token {}) was accepted although it started after {} (token {}) \
                     had been acknowledged {ctx}",
                    w.id,
                    w.token,
                    a.id,
                    a.token
                );
            }
        }

        // (b) Every rejection is explained by an accepted write that was already under way,
        //     and the reported current token is such a write's token.
        for r in &rejected {
            let current = r.current.unwrap();
            let explains = |a: &&&Rec| {
                a.start < r.end
                    && if strict {
                        a.token >= r.token
                    } else {
                        a.token > r.token
                    }
            };
            assert!(
                accepted.iter().any(|a| explains(&a)),
                "{name}: {} (token {}) was rejected, but no accepted write with a higher token \
                 had started before it ended {ctx}",
                r.id,
                r.token
            );
            let ok = if strict {
                current >= r.token
            } else {
                current > r.token
            };
            assert!(
                ok,
                "{name}: {} (token {}) rejected with current_token {current} {ctx}",
                r.id, r.token
            );
            assert!(
                accepted
                    .iter()
                    .any(|a| a.token == current && a.start < r.end),
                "{name}: {} was rejected with current_token {current}, which no accepted write \
                 under way at the time carried {ctx}",
                r.id
            );
        }

        // Reads never go back in time: a read that starts after a write with token t was
        // acknowledged sees a fence token >= t (any later accepted write carries >= t).
        for rd in reads.iter().filter(|rd| rd.key == k) {
            for a in accepted.iter().filter(|a| a.end < rd.start) {
                assert!(
                    rd.token.is_some_and(|t| t >= a.token),
                    "{name}: a GET that started after {} (token {}) was acknowledged saw {:?} {ctx}",
                    a.id, a.token, rd.token
                );
            }
        }

        // Strict: one token is accepted at most once per key.
        if strict {
            let mut seen: HashMap<i64, &str> = HashMap::new();
            for a in &accepted {
                if let Some(prev) = seen.insert(a.token, &a.id) {
                    panic!(
                        "{name}: token {} accepted twice in strict mode ({prev}, {}) {ctx}",
                        a.token, a.id
                    );
                }
            }
        }

        // (c) The final state is the highest accepted token and one of its writes' values.
        let max = accepted.iter().map(|a| a.token).max().unwrap();
        let body = apps[0].kv_get(name).await.expect(200);
        assert_eq!(
            body["fence_token"],
            json!(max.to_string()),
            "{name}: final state {body} {ctx}"
        );
        let id = body["value"]["id"].as_str().unwrap_or_default();
        assert!(
            accepted.iter().any(|a| a.token == max && a.id == id),
            "{name}: final value {body} is not from an accepted write with token {max} {ctx}"
        );
        assert_eq!(
            body["value"]["token"],
            json!(max.to_string()),
            "{name}: {body} {ctx}"
        );
    }
}
