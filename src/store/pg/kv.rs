//! Fenced kv writes (single, coalesced, batched), scope claims and reads, and why a refused
//! write was refused.
//!
//! Differences from SQLite (`sqlite/kv.rs`), and why: a scoped write is one statement (the
//! scope's claim is a data-modifying CTE, which SQLite lacks: there it is a transaction of two);
//! concurrent writes and reads are combined into shared statements (`coalesce`, `reads`), which
//! SQLite's single connection and single writer would gain nothing from; and a refusal is
//! explained by reads that other writers may overtake (see `refusal`).

use std::collections::{BTreeMap, HashMap};

use sqlx::{types::Json, Connection, Row};

use super::{
    idempotency::keep_in,
    sql::{self, entry_from, KV_GET},
    PgStore,
};
use crate::{
    fence::{FencingToken, Guard, JumpCap, Key, Outcome, Rule, Scope, Target},
    store::{
        backend::KvStore, decode::ScopeState, explain_refusal, scope_state_from, token_from_db,
        Claimed, Document, Done, Entry, Keep, KeyState, Refusal, Seen, StoreError, Write, Written,
        SCOPE_STATE,
    },
};

/// What the kv part of a batch did (`PgStore::batch_in`).
pub(super) enum BatchKv {
    Written(Vec<Written>),
    /// These keys were refused, and the transaction is still usable (a batch with table rows goes
    /// on to judge them, to report every stale one); it must not be committed.
    Refused(Vec<Key>),
    /// These keys were refused by aborting the statement (the new-key trigger): the transaction
    /// can only be rolled back.
    Aborted(Vec<Key>),
}

impl KvStore for PgStore {
    /// With coalescing on (`database.coalesce_workers > 0`), a coalescer worker runs every
    /// write's statement (see `write`).
    fn writes_on_workers(&self) -> bool {
        self.coalescer.is_some()
    }

    /// Likewise, the coalescing reader runs every read's statement.
    fn reads_on_workers(&self) -> bool {
        self.reads.is_some()
    }

    /// Applies one fenced write. Coalesced writes may run on the request's task (the
    /// coalescer finishes the statement even if the request goes away; only the refusal's
    /// explanation, a plain read, runs here unguarded); every other path must run detached
    /// (`Store` does both).
    async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError> {
        let (key, value) = match write {
            Write::Put { key, value } => (key, Some(value)),
            Write::Delete { key } => (key, None),
        };
        // The paths off the coalescer are boxed: this future is held inline by every write
        // request's, which is moved whole into a box or two on its way through axum, so its
        // size is paid on every request (~1.9 KB with them inline, callgrind: memcpy).
        let version: Option<i64> = match &self.coalescer {
            Some(coalescer) => {
                coalescer
                    .write(
                        key.clone(),
                        value,
                        guard.token,
                        guard.rule,
                        guard.scope().cloned(),
                    )
                    .await?
            }
            None => Box::pin(self.write_uncoalesced(&key, value, guard)).await?,
        };
        match version {
            Some(version) => Ok(Outcome::Accepted(Written {
                key,
                was_live: version != 1,
                version,
            })),
            None => Ok(Box::pin(self.refusal(std::slice::from_ref(&key), guard))
                .await?
                .outcome()),
        }
    }

    async fn batch(
        &self,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<Outcome<Vec<Written>>, StoreError> {
        self.batch_with(writes, guard, None).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Entry>, StoreError> {
        if let Some(reads) = &self.reads {
            return reads.get(key.clone()).await;
        }
        let mut conn = self.conns.take().await?;
        let row = sqlx::query(KV_GET)
            .bind(key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        row.map(|row| entry_from(&row, 0)).transpose()
    }

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError> {
        let gate = self.gates.pass(scope).await?;
        let mut conn = self.conns.take().await?;
        let claimed = self
            .claim_scope(&mut conn, scope, token, Rule::Inclusive)
            .await?;
        conn.done();
        drop(gate);
        Ok(match claimed {
            Ok(version) => Outcome::Accepted(Claimed {
                created: version == 1,
            }),
            Err(refusal) => refusal.outcome(),
        })
    }

    async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError> {
        let mut conn = self.conns.take().await?;
        let current: Option<i64> = sqlx::query_scalar(sql::FENCE)
            .bind(scope.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        current.map(token_from_db).transpose()
    }

    async fn scope_state(&self, scope: &Scope) -> Result<ScopeState, StoreError> {
        let mut conn = self.conns.take().await?;
        let state = scope_state(&mut conn, scope).await?;
        conn.done();
        Ok(state)
    }
}

impl PgStore {
    /// One write as its own statement (`database.coalesce_workers = 0`): the version it left,
    /// or `None` if the fence refused it.
    async fn write_uncoalesced(
        &self,
        key: &Key,
        value: Option<Document>,
        guard: &Guard,
    ) -> Result<Option<i64>, StoreError> {
        let sql = self.statements(guard.rule);
        let (statement, scope) = match &guard.target {
            Target::Key => (&sql.put_key, None),
            Target::Scope(scope) => (&sql.put_scope, Some(scope)),
        };
        let mut query = sqlx::query_scalar(statement)
            .bind(key.as_str())
            .bind(value.as_ref().map(Json))
            .bind(value.is_none())
            .bind(guard.token.get());
        if let Some(scope) = scope {
            query = query.bind(scope.as_str());
        }
        let mut conn = self.conns.take().await?;
        let version = match query
            .fetch_optional(&mut *conn)
            .await
            .map_err(StoreError::from)
        {
            // A key this write would create, above the jump cap: nothing was written, and the
            // refusal explains it (the key has no fence).
            Err(err) if err.is_key_jump() => None,
            version => version?,
        };
        conn.done();
        Ok(version)
    }

    /// A kv batch in one transaction; with `keep` (an `Idempotency-Key`), its outcome row is
    /// written in the same transaction before the commit.
    pub(super) async fn batch_with(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: Option<&Keep>,
    ) -> Result<Outcome<Vec<Written>>, StoreError> {
        let gate = match guard.scope() {
            Some(scope) => Some(self.gates.pass(scope).await?),
            None => None,
        };
        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await?;
        let outcome = self.batch_in(&mut tx, writes, guard).await?;
        match &outcome {
            BatchKv::Written(written) => {
                if let Some(keep) = keep {
                    keep_in(&mut tx, keep, Done::Kv(written)).await?;
                }
                tx.commit().await?
            }
            BatchKv::Refused(_) | BatchKv::Aborted(_) => tx.rollback().await?,
        }
        conn.done();
        drop(gate);
        match outcome {
            BatchKv::Written(written) => Ok(Outcome::Accepted(written)),
            BatchKv::Refused(refused) | BatchKv::Aborted(refused) => {
                Ok(self.refusal(&refused, guard).await?.outcome())
            }
        }
    }

    /// Raises `scope`'s fence to `token` inside the caller's transaction (or as an autocommit
    /// statement) if `rule` and the poisoning guards admit it: `Ok(Some(version))`; else the
    /// refusal, explained from what the same connection reads next.
    pub(super) async fn claim_scope(
        &self,
        conn: &mut sqlx::PgConnection,
        scope: &Scope,
        token: FencingToken,
        rule: Rule,
    ) -> Result<Result<i64, Refusal>, StoreError> {
        let claimed: Option<i64> = sqlx::query_scalar(&self.statements(rule).claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(version) = claimed {
            return Ok(Ok(version));
        }
        let (scope_fence, latest_issued) = scope_state(conn, scope).await?;
        let guard = Guard {
            token,
            target: Target::Scope(scope.clone()),
            rule,
        };
        let seen = Seen {
            keys: HashMap::new(),
            scope_fence,
            latest_issued,
        };
        explain_refusal(&[], &seen, &guard, &self.checks).map(Err)
    }

    /// The kv part of a batch, inside the caller's transaction (a batch may also write legacy
    /// tables, see `tables`). Unless every key was written, nothing may be committed.
    pub(super) async fn batch_in(
        &self,
        tx: &mut sqlx::PgConnection,
        writes: &[Write],
        guard: &Guard,
    ) -> Result<BatchKv, StoreError> {
        // One row per key (ON CONFLICT cannot touch a row twice in a statement): the last
        // write to a key is its effect on the store. BTreeMap also sorts keys for lock order.
        let mut last: BTreeMap<&Key, &Write> = BTreeMap::new();
        for write in writes {
            last.insert(write.key(), write);
        }
        let mut keys = Vec::with_capacity(last.len());
        let mut values = Vec::with_capacity(last.len());
        let mut deleted = Vec::with_capacity(last.len());
        for (key, write) in &last {
            keys.push(key.as_str());
            match write {
                Write::Put { value, .. } => {
                    values.push(Some(Json(value)));
                    deleted.push(false);
                }
                Write::Delete { .. } => {
                    values.push(None);
                    deleted.push(true);
                }
            }
        }
        let sql = self.statements(guard.rule);
        let rows = match &guard.target {
            Target::Key => {
                let rows = sqlx::query(&sql.batch_rows)
                    .bind(&keys)
                    .bind(&values)
                    .bind(&deleted)
                    .bind(vec![guard.token.get(); keys.len()])
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(StoreError::from);
                match rows {
                    // A key deleted after the statement's lookup, created again above the jump
                    // cap (`sql.rs`, `batch_rows`): the trigger aborted the transaction. That key
                    // is refused (explained as a jump); if its name cannot be read, every key is
                    // (and whatever explains none of them is answered "raced, retry").
                    Err(err) if err.is_key_jump() => {
                        let named = err
                            .key_jump_detail()
                            .and_then(|(_, key)| last.keys().find(|k| k.as_str() == key));
                        return Ok(BatchKv::Aborted(match named {
                            Some(key) => vec![(*key).clone()],
                            None => last.keys().map(|k| (*k).clone()).collect(),
                        }));
                    }
                    rows => rows?,
                }
            }
            Target::Scope(scope) => {
                sqlx::query(&sql.batch_scope)
                    .bind(&keys)
                    .bind(&values)
                    .bind(&deleted)
                    .bind(guard.token.get())
                    .bind(scope.as_str())
                    .fetch_all(&mut *tx)
                    .await?
            }
        };
        if rows.len() != keys.len() {
            let mut applied = std::collections::HashSet::with_capacity(rows.len());
            for row in &rows {
                applied.insert(row.try_get::<&str, _>(0)?);
            }
            let refused: Vec<Key> = last
                .keys()
                .filter(|k| !applied.contains(k.as_str()))
                .map(|k| (*k).clone())
                .collect();
            return Ok(BatchKv::Refused(refused));
        }
        // Rows come back in no guaranteed order: map each to its key by name, not by position.
        let by_name: HashMap<&str, &Key> = last.keys().map(|k| (k.as_str(), *k)).collect();
        let mut written = Vec::with_capacity(rows.len());
        for row in rows {
            let key: &str = row.try_get(0)?;
            let version: i64 = row.try_get(1)?;
            let key = by_name.get(key).map(|k| (*k).clone()).ok_or_else(|| {
                StoreError::Corrupt(format!("batch returned an unknown key {key:?}"))
            })?;
            written.push(Written {
                key,
                was_live: version != 1,
                version,
            });
        }
        Ok(BatchKv::Written(written))
    }

    /// Explains a refusal: reads the refused keys (their scope and own fence) and, for a scoped
    /// write, the scope's fence, and lets [`explain_refusal`] decide. The reads come after the
    /// refused statement, on any connection, so a concurrent change may land in between:
    /// `explain_refusal` then answers that the write raced it (503, retry). On SQLite nothing
    /// can land in between (one connection).
    pub(super) async fn refusal(&self, keys: &[Key], guard: &Guard) -> Result<Refusal, StoreError> {
        let names: Vec<&str> = keys.iter().map(Key::as_str).collect();
        let mut conn = self.conns.take().await?;
        let rows = sqlx::query(sql::KV_REFUSED)
            .bind(&names)
            .fetch_all(&mut *conn)
            .await?;
        conn.done();
        let mut seen = Seen {
            keys: HashMap::with_capacity(rows.len()),
            scope_fence: None,
            latest_issued: None,
        };
        for row in &rows {
            let key: &str = row.try_get(0)?;
            seen.keys.insert(
                key,
                KeyState {
                    key_fence: token_from_db(row.try_get(1)?)?,
                    scope: row.try_get(2)?,
                },
            );
        }
        if let Some(scope) = guard.scope() {
            let mut conn = self.conns.take().await?;
            (seen.scope_fence, seen.latest_issued) = scope_state(&mut conn, scope).await?;
            conn.done();
        }
        let explained = explain_refusal(keys, &seen, guard, &self.checks);
        // Nothing explains an unscoped write that was not written: with a jump cap, that is also
        // what a missing or disabled new-key trigger does (its statement writes nothing, see
        // `sql.rs`). Say so, to the client and the operator, rather than "raced".
        if matches!(explained, Err(StoreError::Raced(_))) && guard.scope().is_none() {
            if let Some(why) = self.new_key_check_missing().await? {
                tracing::error!("{why}");
                return Err(StoreError::NotReady(why));
            }
        }
        explained
    }

    /// `Some(what to do)` if the trigger that applies the jump cap to new keys is missing or
    /// not enabled ALWAYS, so that unscoped writes with a jump cap write nothing.
    async fn new_key_check_missing(&self) -> Result<Option<String>, StoreError> {
        if self.checks.jump == JumpCap(0) {
            return Ok(None);
        }
        let mut conn = self.conns.take().await?;
        let enabled: Option<String> = sqlx::query_scalar(sql::NEW_KEY_TRIGGER_STATE)
            .fetch_optional(&mut *conn)
            .await?;
        conn.done();
        Ok(match enabled.as_deref() {
            Some("A") => None,
            state => Some(format!(
                "the trigger fencegate_kv_created on fencegate's kv table is {}: without it kv.max_token_jump cannot be \
                 applied to new keys, so unscoped writes are not written; enable it: ALTER TABLE fencegate_kv ENABLE \
                 ALWAYS TRIGGER fencegate_kv_created (in fencegate's schema), or apply fencegate's migrations",
                if state.is_some() { "not enabled ALWAYS" } else { "missing" }
            )),
        })
    }
}

/// A scope's fence and the latest token granted by the built-in lock of that name, if any:
/// what explains a refused claim.
pub(super) async fn scope_state(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
) -> Result<(Option<FencingToken>, Option<FencingToken>), StoreError> {
    scope_state_from(
        sqlx::query_as(SCOPE_STATE)
            .bind(scope.as_str())
            .fetch_one(&mut *conn)
            .await?,
    )
}
