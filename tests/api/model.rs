//! Property tests: random sequences of fenced operations (puts, deletes, batches, claims,
//! scoped and unscoped, inclusive and strict, sticky scopes on and off) against a tiny
//! in-memory model of the fence rules (docs/api.md, *How fencegate decides*; docs/wire.md). Every outcome (accepted, stale with the fence
//! reported, or a scope mismatch with the key and both scopes), and the final state of every
//! key and scope, must match the model. Scoped and unscoped writes share keys, so sticky scope
//! is exercised on every path. Runs on the real store (cache included), on whichever backend
//! this test binary targets.

use std::collections::{BTreeMap, HashMap};

use fencegate::{
    config::Settings,
    fence::{Fenced, FencingToken, Guard, Key, Outcome, Rule, Scope, ScopeRule, Target},
    store::{Document, Store, Write},
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        token: i64,
        scope: Option<u8>,
    },
    Delete {
        key: u8,
        token: i64,
        scope: Option<u8>,
    },
    Batch {
        ops: Vec<(u8, bool)>,
        token: i64,
        scope: Option<u8>,
    },
    Claim {
        scope: u8,
        token: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..4;
    let token = 0i64..12;
    let scope = prop::option::weighted(0.4, 0u8..2);
    prop_oneof![
        4 => (key.clone(), token.clone(), scope.clone()).prop_map(|(key, token, scope)| Op::Put { key, token, scope }),
        1 => (key.clone(), token.clone(), scope.clone()).prop_map(|(key, token, scope)| Op::Delete { key, token, scope }),
        2 => (prop::collection::vec((key, any::<bool>()), 1..5), token.clone(), scope)
            .prop_map(|(ops, token, scope)| Op::Batch { ops, token, scope }),
        1 => (0u8..2, token).prop_map(|(scope, token)| Op::Claim { scope, token }),
    ]
}

/// The fence rules (docs/api.md, *How fencegate decides*), written as plainly as possible.
#[derive(Default)]
struct Model {
    rule: Option<Rule>,
    scopes_rule: ScopeRule,
    /// key -> (live value, key's own fence, token of last write, scope of last write)
    kv: HashMap<String, (Option<Value>, i64, i64, Option<String>)>,
    scopes: HashMap<String, i64>,
}

#[derive(Debug, PartialEq)]
enum Seen {
    Accepted,
    /// (fence, current value reported)
    Stale(Vec<(String, i64)>),
    /// (key, scope the key is bound to, scope presented)
    Mismatch(String, Option<String>, Option<String>),
    /// A refusal the model never expects (no built-in locks, no jump cap here): fails the case.
    Unexpected(String),
}

impl Model {
    fn admits(&self, fence: Option<i64>, token: i64) -> bool {
        // An absent fence admits anything (the first write inserts the row).
        fence.is_none_or(|f| match self.rule.unwrap() {
            Rule::Inclusive => token >= f,
            Rule::Strict => token > f,
        })
    }

    fn apply(
        &mut self,
        writes: &[(String, Option<Value>)],
        token: i64,
        scope: Option<String>,
    ) -> Seen {
        let mut last: BTreeMap<&String, &Option<Value>> = BTreeMap::new();
        for (k, v) in writes {
            last.insert(k, v);
        }
        // The fence first: a stale token is stale whatever its scope.
        match &scope {
            Some(s) => {
                let fence = self.scopes.get(s).copied();
                if !self.admits(fence, token) {
                    return Seen::Stale(vec![(format!("scope:{s}"), fence.unwrap())]);
                }
            }
            None => {
                let stale: Vec<(String, i64)> = last
                    .keys()
                    .filter_map(|k| {
                        let fence = self.kv.get(*k).map(|e| e.1);
                        (!self.admits(fence, token)).then(|| (format!("key:{k}"), fence.unwrap()))
                    })
                    .collect();
                if !stale.is_empty() {
                    return Seen::Stale(stale);
                }
            }
        }
        // Then sticky scope: a key written before keeps the scope of its last write
        // (tombstones too); the first key (in key order) bound to another scope is reported.
        if self.scopes_rule == ScopeRule::Sticky {
            for k in last.keys() {
                if let Some((_, _, _, bound)) = self.kv.get(*k) {
                    if bound != &scope {
                        return Seen::Mismatch(format!("key:{k}"), bound.clone(), scope.clone());
                    }
                }
            }
        }
        if let Some(s) = &scope {
            self.scopes.insert(s.clone(), token);
        }
        for (k, v) in last {
            let key_fence = self.kv.get(k).map_or(0, |e| e.1);
            let key_fence = if scope.is_none() {
                key_fence.max(token)
            } else {
                key_fence
            };
            self.kv
                .insert(k.clone(), ((*v).clone(), key_fence, token, scope.clone()));
        }
        Seen::Accepted
    }

    fn claim(&mut self, scope: String, token: i64) -> Seen {
        match self.scopes.get(&scope) {
            Some(&f) if token < f => Seen::Stale(vec![(format!("scope:{scope}"), f)]),
            _ => {
                self.scopes.insert(scope, token);
                Seen::Accepted
            }
        }
    }
}

fn seen<T>(outcome: Outcome<T>) -> Seen {
    match outcome {
        Outcome::Accepted(_) => Seen::Accepted,
        Outcome::Stale(stale) => {
            let mut v: Vec<(String, i64)> = stale
                .into_iter()
                .map(|s| {
                    let name = match s.fenced {
                        Fenced::Key(k) => format!("key:{k}"),
                        Fenced::Scope(sc) => format!("scope:{sc}"),
                        Fenced::Row { resource, key } => format!("row:{resource}/{key}"),
                    };
                    (name, s.current.get())
                })
                .collect();
            v.sort();
            Seen::Stale(v)
        }
        Outcome::Mismatch(m) => {
            let name = match m.fenced {
                Fenced::Key(k) => format!("key:{k}"),
                other => format!("{other:?}"),
            };
            Seen::Mismatch(name, m.scope, m.presented.map(|s| s.to_string()))
        }
        Outcome::NotIssued(refused) => Seen::Unexpected(format!("{refused:?}")),
        Outcome::Jump(refused) => Seen::Unexpected(format!("{refused:?}")),
    }
}

async fn check(
    store: &Store,
    rule: Rule,
    scopes_rule: ScopeRule,
    prefix: &str,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut model = Model {
        rule: Some(rule),
        scopes_rule,
        ..Model::default()
    };
    let key = |i: u8| format!("{prefix}k{i}");
    let scope = |i: u8| format!("{prefix}s{i}");
    let tok = |t: i64| FencingToken::from_db(t).unwrap();
    let guard = |token: i64, sc: Option<u8>| Guard {
        token: tok(token),
        target: sc.map_or(Target::Key, |s| {
            Target::Scope(Scope::parse(&scope(s), 512).unwrap())
        }),
        rule,
    };
    for (n, op) in ops.iter().enumerate() {
        let (expected, got) = match op {
            Op::Put {
                key: k,
                token,
                scope: sc,
            } => {
                let value = json!({"op": n});
                let write = Write::Put {
                    key: Key::parse(&key(*k), 512).unwrap(),
                    value: Document::from_value(&value).unwrap(),
                };
                let got = seen(store.write(write, &guard(*token, *sc)).await.unwrap());
                (
                    model.apply(&[(key(*k), Some(value))], *token, sc.map(scope)),
                    got,
                )
            }
            Op::Delete {
                key: k,
                token,
                scope: sc,
            } => {
                let write = Write::Delete {
                    key: Key::parse(&key(*k), 512).unwrap(),
                };
                let got = seen(store.write(write, &guard(*token, *sc)).await.unwrap());
                (model.apply(&[(key(*k), None)], *token, sc.map(scope)), got)
            }
            Op::Batch {
                ops: items,
                token,
                scope: sc,
            } => {
                let writes: Vec<(String, Option<Value>)> = items
                    .iter()
                    .enumerate()
                    .map(|(i, (k, put))| (key(*k), put.then(|| json!({"op": n, "item": i}))))
                    .collect();
                let store_writes: Vec<Write> = writes
                    .iter()
                    .map(|(k, v)| {
                        let key = Key::parse(k, 512).unwrap();
                        match v {
                            Some(value) => Write::Put {
                                key,
                                value: Document::from_value(value).unwrap(),
                            },
                            None => Write::Delete { key },
                        }
                    })
                    .collect();
                let got = seen(
                    store
                        .batch(&store_writes, &guard(*token, *sc))
                        .await
                        .unwrap(),
                );
                (model.apply(&writes, *token, sc.map(scope)), got)
            }
            Op::Claim { scope: sc, token } => {
                let got = seen(
                    store
                        .claim(&Scope::parse(&scope(*sc), 512).unwrap(), tok(*token))
                        .await
                        .unwrap(),
                );
                (model.claim(scope(*sc), *token), got)
            }
        };
        let expected = match expected {
            Seen::Stale(mut v) => {
                v.sort();
                Seen::Stale(v)
            }
            other => other,
        };
        prop_assert_eq!(
            &got,
            &expected,
            "op #{} {:?} ({:?}, {:?})",
            n,
            op,
            rule,
            scopes_rule
        );
    }
    for i in 0..4u8 {
        let entry = store.get(&Key::parse(&key(i), 512).unwrap()).await.unwrap();
        let expected = model
            .kv
            .get(&key(i))
            .and_then(|(v, _, t, s)| v.clone().map(|v| (v, *t, s.clone())));
        let got = entry.map(|e| ((*e.value).clone(), e.fence_token.get(), e.scope));
        prop_assert_eq!(got, expected, "final state of {}", key(i));
    }
    for i in 0..2u8 {
        let got = store
            .fence(&Scope::parse(&scope(i), 512).unwrap())
            .await
            .unwrap()
            .map(FencingToken::get);
        prop_assert_eq!(
            got,
            model.scopes.get(&scope(i)).copied(),
            "final fence of {}",
            scope(i)
        );
    }
    Ok(())
}

fn run(rule: Rule, scopes_rule: ScopeRule) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(async {
        let mut settings = Settings::default();
        settings.kv.sticky_scope = scopes_rule == ScopeRule::Sticky;
        settings.database.url = Some(crate::pg::fresh_database().await);
        fencegate::server::open_store(&settings)
            .await
            .expect("open the store")
    });
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU32::new(0);
    runner
        .run(&prop::collection::vec(op(), 1..25), |ops| {
            // Every case (and every shrink step) gets fresh names, so cases share one database
            // without interfering.
            let prefix = format!(
                "c{}-",
                case.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            rt.block_on(check(&store, rule, scopes_rule, &prefix, &ops))
        })
        .unwrap();
}

#[test]
fn the_store_follows_the_model_inclusive() {
    run(Rule::Inclusive, ScopeRule::Sticky);
}

#[test]
fn the_store_follows_the_model_strict() {
    run(Rule::Strict, ScopeRule::Sticky);
}

/// `kv.sticky_scope = false`: scoped and unscoped writes of one key are fenced separately.
#[test]
fn the_store_follows_the_model_with_free_scopes() {
    run(Rule::Inclusive, ScopeRule::Free);
}
