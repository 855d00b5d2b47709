//! SQL writers fenced too (docs/tables.md, *Fencing SQL writers*): what fencegate keeps in the
//! database for `fencegate.fence(scope, token)` and the guard triggers (both defined by the
//! migrations, in fencegate's schema).
//!
//! - [`sync_guards`]: at start, the guards HTTP takes from the configuration (jump cap, reserved
//!   lock names, issuers' scopes) are written where `fence()` reads them, with fencegate's own
//!   role (whose writes the triggers let by: they are fenced in their own statement).
//! - [`install_guards`]: the trigger on every `[[resources]]` table with `guard`, and none on
//!   the others; start-up says what is missing (a role of fencegate's own, TRIGGER).
//! - [`unfenced_writes`]: what the triggers counted in audit mode.

use sqlx::{PgPool, Row};

use crate::{store::Checks, tables::Resource};

/// Writes the configuration's guards for `fence()`. A standby cannot take the write: skipped
/// there (the primary's last start wrote them).
pub async fn sync_guards(
    pool: &PgPool,
    checks: &Checks,
    issuer_scopes: &[String],
    max_scope_bytes: usize,
) -> anyhow::Result<()> {
    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(pool)
        .await?;
    if standby {
        return Ok(());
    }
    let written = sqlx::query(
        "UPDATE fencegate_sql_guards SET max_token_jump = $1, reserved = $2, issuer_scopes = $3, own_role = current_user,
                max_scope_bytes = $4",
    )
    .bind(checks.jump.0 as i64)
    .bind(checks.reserved.prefixes())
    .bind(issuer_scopes)
    .bind(max_scope_bytes as i32)
    .execute(pool)
    .await;
    match written {
        Ok(_) => Ok(()),
        // Not migrated (database.migrate_on_start = false): the server starts not ready, and
        // the guards are written at its next start after `fencegate migrate`.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01") => {
            tracing::warn!("the database is not migrated: fencegate.fence() gets its guards at the next start after `fencegate migrate`");
            Ok(())
        }
        Err(e) => Err(anyhow::anyhow!(
            "cannot record the guards of fencegate.fence(): {e}"
        )),
    }
}

/// Installs the guard trigger on each guarded table and removes it from the others. Refuses to
/// start when a guard cannot work: fencegate's role would be the application's too (a
/// superuser, or the table's owner, which applications usually connect as), or lacks TRIGGER.
pub async fn install_guards(pool: &PgPool, resources: &[&Resource]) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for resource in resources {
        let row = sqlx::query(
            "SELECT c.oid::int8, pg_get_userbyid(c.relowner), current_user,
                    (SELECT rolsuper FROM pg_roles WHERE rolname = current_user),
                    has_table_privilege(c.oid, 'TRIGGER'),
                    EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'fencegate_guard')
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
        )
        .bind(&resource.schema)
        .bind(&resource.table)
        .fetch_one(pool)
        .await?;
        let (oid, owner, me, superuser, trigger, installed): (
            i64,
            String,
            String,
            bool,
            bool,
            bool,
        ) = (
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
            row.try_get(4)?,
            row.try_get(5)?,
        );
        let Some(guard) = resource.guard else {
            if installed {
                sqlx::query(&format!(
                    "DROP TRIGGER fencegate_guard ON {}",
                    resource.relation
                ))
                .execute(pool)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "resource {:?}: guard is off, but its trigger cannot be removed ({e})",
                        resource.name
                    )
                })?;
                tracing::warn!(
                    resource = resource.name,
                    "guard off: removed the guard trigger"
                );
            }
            continue;
        };
        let name = &resource.name;
        let relation = &resource.relation;
        if superuser {
            problems.push(format!(
                "resource {name:?}: guard needs fencegate to connect as a role of its own, not a superuser ({me}): \
                 CREATE ROLE fencegate LOGIN; GRANT SELECT, INSERT, UPDATE, DELETE, TRIGGER ON {relation} TO fencegate"
            ));
        } else if owner == me {
            problems.push(format!(
                "resource {name:?}: guard needs fencegate to connect as a role of its own, not the table's owner ({owner}), \
                 which the application writes as: its writes would pass as fencegate's"
            ));
        } else if !trigger {
            problems.push(format!("resource {name:?}: guard needs the TRIGGER privilege: GRANT TRIGGER ON {relation} TO {me}"));
        } else {
            let scope = resource
                .scope
                .as_ref()
                .map(|s| s.as_str())
                .unwrap_or_default();
            sqlx::query("SELECT fencegate_install_guard($1::oid::regclass, $2, $3, $4)")
                .bind(oid)
                .bind(name)
                .bind(scope)
                .bind(guard.as_str())
                .execute(pool)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("resource {name:?}: cannot install the guard trigger: {e}")
                })?;
            tracing::info!(
                resource = name,
                mode = guard.as_str(),
                scope,
                "guard trigger installed"
            );
        }
    }
    match problems.len() {
        0 => Ok(()),
        _ => anyhow::bail!("{}", problems.join("\n")),
    }
}

/// Unfenced writes counted by the triggers in audit mode, per resource.
pub async fn unfenced_writes(pool: &PgPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as("SELECT resource, writes FROM fencegate_unfenced")
        .fetch_all(pool)
        .await
}
