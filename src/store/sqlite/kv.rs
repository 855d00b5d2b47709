//! Fenced kv writes, batches, scope claims and reads on SQLite, and why a refused write was
//! refused. A write is a transaction of its own (a batch of one): SQLite has no data-modifying
//! CTEs, so a scoped write's claim and upsert are two statements (PostgreSQL: one, `pg/kv.rs`).

use std::collections::BTreeMap;

use sqlx::{Row, SqliteConnection};

use super::{idempotency::keep_in, sql::Statements, SqliteStore};
use crate::{
    fence::{FencingToken, Guard, Key, Outcome, Rule, Scope, Target},
    store::{
        backend::KvStore, decode::ScopeState, explain_refusal, scope_state_from, token_from_db,
        Claimed, Done, Entry, Keep, KeyState, Refusal, Seen, StoreError, Write, Written,
        SCOPE_STATE,
    },
};

impl KvStore for SqliteStore {
    /// No workers: every write and read runs on its caller's (detached) task. One connection
    /// and one writer leave nothing to combine.
    fn writes_on_workers(&self) -> bool {
        false
    }

    fn reads_on_workers(&self) -> bool {
        false
    }

    async fn write(&self, write: Write, guard: &Guard) -> Result<Outcome<Written>, StoreError> {
        // Boxed: `Store::write` holds this future inline beside PostgreSQL's (one `match` on the
        // backend), and every request's future is as large as its largest arm (`pg/kv.rs`).
        let batch = Box::pin(self.batch(std::slice::from_ref(&write), guard));
        match batch.await? {
            Outcome::Accepted(mut written) => Ok(Outcome::Accepted(written.remove(0))),
            Outcome::Stale(stale) => Ok(Outcome::Stale(stale)),
            Outcome::Mismatch(refused) => Ok(Outcome::Mismatch(refused)),
            Outcome::NotIssued(refused) => Ok(Outcome::NotIssued(refused)),
            Outcome::Jump(refused) => Ok(Outcome::Jump(refused)),
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
        let row = sqlx::query(
            "SELECT value, fence_token, scope, version, updated_at FROM fencegate_kv WHERE key = ?1 AND NOT deleted",
        )
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.try_get(0)?;
        let value = serde_json::from_str(&text)
            .map_err(|e| StoreError::Corrupt(format!("stored value is not JSON: {e}")))?;
        Ok(Some(Entry {
            value: std::sync::Arc::new(value),
            fence_token: token_from_db(row.try_get(1)?)?,
            scope: row.try_get(2)?,
            version: row.try_get(3)?,
            updated_at: row.try_get(4)?,
        }))
    }

    /// Raises the scope's fence to `token` (inclusive rule), or says why not.
    async fn claim(
        &self,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<Outcome<Claimed>, StoreError> {
        let version: Option<i64> = sqlx::query_scalar(&self.sql.inclusive.claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&self.pool)
            .await?;
        if let Some(version) = version {
            return Ok(Outcome::Accepted(Claimed {
                created: version == 1,
            }));
        }
        let guard = Guard {
            token,
            target: Target::Scope(scope.clone()),
            rule: Rule::Inclusive,
        };
        Ok(self.refusal(&[], &guard).await?.outcome())
    }

    async fn fence(&self, scope: &Scope) -> Result<Option<FencingToken>, StoreError> {
        let current: Option<i64> =
            sqlx::query_scalar("SELECT fence_token FROM fencegate_fences WHERE scope = ?1")
                .bind(scope.as_str())
                .fetch_optional(&self.pool)
                .await?;
        current.map(token_from_db).transpose()
    }

    async fn scope_state(&self, scope: &Scope) -> Result<ScopeState, StoreError> {
        scope_state_from(
            sqlx::query_as(SCOPE_STATE)
                .bind(scope.as_str())
                .fetch_one(&self.pool)
                .await?,
        )
    }
}

impl SqliteStore {
    /// A kv batch in one transaction; with `keep` (an `Idempotency-Key`), its outcome row is
    /// written in the same transaction before the commit.
    pub(super) async fn batch_with(
        &self,
        writes: &[Write],
        guard: &Guard,
        keep: Option<&Keep>,
    ) -> Result<Outcome<Vec<Written>>, StoreError> {
        let mut last: BTreeMap<&Key, &Write> = BTreeMap::new();
        for write in writes {
            last.insert(write.key(), write);
        }
        let sql = self.statements(guard.rule);
        let mut tx = self.pool.begin().await?;
        if let Target::Scope(scope) = &guard.target {
            if !Self::claim_in(&mut tx, &sql.claim, scope, guard.token).await? {
                tx.rollback().await?;
                // Every key was refused; the explanation says whether by a key's scope or by
                // the scope's fence.
                let keys: Vec<Key> = last.keys().map(|k| (*k).clone()).collect();
                return Ok(self.refusal(&keys, guard).await?.outcome());
            }
        }
        let mut written = Vec::with_capacity(last.len());
        let mut refused = Vec::new();
        for (key, write) in &last {
            match Self::put_one(&mut tx, sql, write, guard).await? {
                Some(version) => written.push(Written {
                    key: (*key).clone(),
                    was_live: version != 1,
                    version,
                }),
                None => refused.push((*key).clone()),
            }
        }
        if !refused.is_empty() {
            tx.rollback().await?;
            return Ok(self.refusal(&refused, guard).await?.outcome());
        }
        if let Some(keep) = keep {
            keep_in(&mut tx, keep, Done::Kv(&written)).await?;
        }
        tx.commit().await?;
        Ok(Outcome::Accepted(written))
    }

    /// fence is decided by the claim that precedes a scoped write).
    async fn put_one(
        conn: &mut SqliteConnection,
        sql: &Statements,
        write: &Write,
        guard: &Guard,
    ) -> Result<Option<i64>, StoreError> {
        let (key, value, deleted) = match write {
            Write::Put { key, value } => (key, Some(value.as_str()), false),
            Write::Delete { key } => (key, None, true),
        };
        let version = match &guard.target {
            Target::Key => {
                sqlx::query_scalar(&sql.put_key)
                    .bind(key.as_str())
                    .bind(value)
                    .bind(deleted)
                    .bind(guard.token.get())
                    .fetch_optional(&mut *conn)
                    .await?
            }
            Target::Scope(scope) => {
                sqlx::query_scalar(&sql.put_scoped)
                    .bind(key.as_str())
                    .bind(value)
                    .bind(deleted)
                    .bind(guard.token.get())
                    .bind(scope.as_str())
                    .fetch_optional(&mut *conn)
                    .await?
            }
        };
        Ok(version)
    }

    /// Claims the guard's scope inside `conn`; `false` if the scope's fence refused the token.
    pub(super) async fn claim_in(
        conn: &mut SqliteConnection,
        claim: &str,
        scope: &Scope,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let version: Option<i64> = sqlx::query_scalar(claim)
            .bind(scope.as_str())
            .bind(token.get())
            .fetch_optional(&mut *conn)
            .await?;
        Ok(version.is_some())
    }

    /// Explains a refusal (as `pg/kv.rs` does, from what the database holds now). The single
    /// connection serializes every transaction, so nothing changed since the refused one rolled
    /// back (PostgreSQL's explanation can be overtaken by another writer; this one cannot).
    pub(super) async fn refusal(&self, keys: &[Key], guard: &Guard) -> Result<Refusal, StoreError> {
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            let row = sqlx::query("SELECT key, key_fence, scope FROM fencegate_kv WHERE key = ?1")
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await?;
            rows.extend(row);
        }
        let mut seen = Seen {
            keys: Default::default(),
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
            (seen.scope_fence, seen.latest_issued) = self.scope_state(scope).await?;
        }
        explain_refusal(keys, &seen, guard, &self.checks)
    }
}
