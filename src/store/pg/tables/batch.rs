//! A batch that writes legacy tables (and maybe kv keys) under one token: all or nothing.

use std::collections::{BTreeMap, HashMap};

use sqlx::Connection;

use super::{
    explain::check_token_fits,
    rows::{fence_row, write_row},
};
use crate::{
    fence::{Guard, Outcome, Rule, Target},
    store::{
        pg::{idempotency::keep_in, kv::BatchKv, PgStore},
        BatchOp, BatchWritten, Done, Keep, Refusal, RowWritten, StoreError, TableError,
    },
    tables::{RowWrite, TableOp},
};

impl PgStore {
    /// A batch with table ops (and maybe kv writes) under one token: all or nothing.
    ///
    /// Lock order, the same in every batch so batches cannot deadlock each other: the scope,
    /// then kv keys (sorted), then ledger rows sorted by (table, key); row writes then follow in
    /// request order (so a parent row can be inserted before its children).
    ///
    /// With `keep` (an `Idempotency-Key`), the outcome row is written before the commit.
    pub(in crate::store::pg) async fn apply_batch(
        &self,
        batch: &[BatchOp],
        guard: &Guard,
        keep: Option<&Keep>,
    ) -> Result<Outcome<BatchWritten>, TableError> {
        let (token, scope, kv_rule) = (guard.token, guard.scope(), guard.rule);
        let mut kv = Vec::new();
        // Table ops with their index in the request, for error messages.
        let mut ops: Vec<(usize, &TableOp)> = Vec::new();
        for (i, op) in batch.iter().enumerate() {
            match op {
                BatchOp::Kv(write) => kv.push(write.clone()),
                BatchOp::Row(op) => ops.push((i, op)),
            }
        }
        let in_op = |i: usize| {
            move |err: TableError| match err {
                TableError::Row(err) => TableError::Row(err.in_op(i)),
                other => other,
            }
        };
        let scope_rule = Rule::strictest(
            ops.iter()
                .map(|(_, op)| op.resource.rule)
                .chain((!kv.is_empty()).then_some(kv_rule)),
        );
        let guard_for = |rule: Rule| Guard {
            token,
            target: scope.map_or(Target::Key, |s| Target::Scope(s.clone())),
            rule: if scope.is_some() { scope_rule } else { rule },
        };
        let mut keys = Vec::with_capacity(ops.len());
        for &(i, op) in &ops {
            check_token_fits(&op.resource, token, scope.is_some()).map_err(in_op(i))?;
            keys.push(
                self.canonical(&op.resource, &op.key, &op.write)
                    .await
                    .map_err(in_op(i))?,
            );
        }

        let mut conn = self.conns.take().await?;
        let mut tx = conn.begin().await.map_err(StoreError::from)?;
        let kv_guard = guard_for(kv_rule);
        let mut kv_written = Vec::new();
        let mut kv_refused = Vec::new();
        if !kv.is_empty() {
            // A scoped kv batch claims the scope itself (with `scope_rule`).
            match self.batch_in(&mut tx, &kv, &kv_guard).await? {
                BatchKv::Written(written) => kv_written = written,
                BatchKv::Refused(refused) if scope.is_none() => kv_refused = refused,
                // Scoped: the scope's claim was refused, or undone with the key. Aborted: the
                // transaction cannot go on to judge the rows (any stale ones go unreported).
                BatchKv::Refused(refused) | BatchKv::Aborted(refused) => {
                    tx.rollback().await.map_err(StoreError::from)?;
                    conn.done();
                    return Ok(self.refusal(&refused, &kv_guard).await?.outcome());
                }
            }
        } else if let Some(scope) = scope {
            if let Err(refusal) = self.claim_scope(&mut tx, scope, token, scope_rule).await? {
                tx.rollback().await.map_err(StoreError::from)?;
                conn.done();
                return Ok(refusal.outcome());
            }
        }

        // Each row's fence once, in (table, key) order.
        let mut rows: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for (n, ((_, op), key)) in ops.iter().zip(&keys).enumerate() {
            rows.entry((op.resource.relation.as_str(), key.text.as_str()))
                .or_insert(n);
        }
        let mut live: HashMap<(&str, &str), bool> = HashMap::new();
        let mut stale = Vec::new();
        // Stale refusals are reported first, then the first other refusal (`Refusal::first`).
        let mut other: Option<Refusal> = None;
        for (&row, &first) in &rows {
            let resource = &ops[first].1.resource;
            let deletes = ops.iter().zip(&keys).any(|((_, op), key)| {
                (op.resource.relation.as_str(), key.text.as_str()) == row
                    && matches!(op.write, RowWrite::Delete)
            });
            match fence_row(
                &mut tx,
                resource,
                &keys[first],
                &guard_for(resource.rule),
                deletes,
                self.checks(),
            )
            .await?
            {
                Ok(existed) => {
                    live.insert(row, existed);
                }
                Err(Refusal::Stale(refused)) => stale.extend(refused),
                Err(refused) => other = Refusal::first(other, refused),
            }
        }
        if !kv_refused.is_empty() || !stale.is_empty() || other.is_some() {
            tx.rollback().await.map_err(StoreError::from)?;
            conn.done();
            let mut all = Vec::new();
            if !kv_refused.is_empty() {
                match self.refusal(&kv_refused, &kv_guard).await? {
                    Refusal::Stale(refused) => all = refused,
                    // The kv keys come first in the lock order, and so win a tie.
                    refused => {
                        other = match other {
                            Some(row) => Refusal::first(Some(refused), row),
                            None => Some(refused),
                        }
                    }
                }
            }
            all.extend(stale);
            return Ok(match other {
                Some(other) if all.is_empty() => other.outcome(),
                _ => Outcome::Stale(all),
            });
        }

        let mut row_written = Vec::with_capacity(ops.len());
        for (&(i, op), key) in ops.iter().zip(&keys) {
            let row = (op.resource.relation.as_str(), key.text.as_str());
            let existed = live[&row];
            let guard = guard_for(op.resource.rule);
            if let Err(failure) =
                write_row(&mut tx, &op.resource, key, &op.write, &guard, existed).await
            {
                drop(tx);
                drop(conn); // before explaining, as in `table_write`
                return Err(in_op(i)(
                    self.explain(failure, &op.resource, &op.write).await,
                ));
            }
            live.insert(row, !matches!(op.write, RowWrite::Delete));
            row_written.push(RowWritten {
                key: key.text.clone(),
                existed,
            });
        }
        let written = (kv_written, row_written);
        if let Some(keep) = keep {
            keep_in(&mut tx, keep, Done::Mixed(&written)).await?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        conn.done();
        Ok(Outcome::Accepted(written))
    }
}
