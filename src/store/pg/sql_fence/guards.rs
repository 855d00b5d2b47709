//! The guard triggers of `[[resources]]` tables: installed once (by the table's owner, or by
//! fencegate where its role can), then only checked at each start.
//!
//! The trigger's one argument is the resource; its mode (`enforce`, `audit`, `off`) and scope
//! are in `fencegate_guards`, written here at every start, so changing a guard's mode is a
//! configuration change and a restart, never DDL. A guard that must work but whose trigger is
//! missing, calls another function or does not fire `ALWAYS` stops start-up with the exact DDL
//! for the table's owner to run once ([`ddl`], also printed by `fencegate guard sql`): a
//! configured guard is never silently absent. A trigger left on a table whose guard was
//! removed is inert (mode `off`); start-up logs the owner's `DROP TRIGGER`.

use sqlx::{Connection, PgPool, Row};

use crate::tables::Resource;

/// The trigger's name on every guarded table.
pub const TRIGGER: &str = "fencegate_guard";

/// What one relation's guard trigger looks like in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// No trigger of that name.
    Missing,
    /// A trigger of that name that is not fencegate's guard for this resource (another
    /// function, other events, another resource): dropped and created again.
    Foreign(String),
    /// fencegate's guard, not firing `ALWAYS` (so `session_replication_role = replica` would
    /// skip it).
    NotAlways,
    /// fencegate's guard, firing always.
    Ready,
}

/// A relation the guard must cover: the resource's table, and each partition of a partitioned
/// one (a row trigger on a partitioned table is cloned onto its partitions).
#[derive(Debug, Clone)]
pub struct Covered {
    /// Schema-qualified and quoted, as the catalog spells it.
    pub relation: String,
    pub owner: String,
    pub installed: Installed,
    /// The resource's own table (the others are its partitions).
    pub root: bool,
}

/// BEFORE, ROW, INSERT, DELETE, UPDATE in `pg_trigger.tgtype` (PostgreSQL's `TRIGGER_TYPE_*`).
const TGTYPE: i16 = 1 | 2 | 4 | 8 | 16;

/// The guard's state on the resource's table and every partition under it.
pub async fn inspect(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    resource: &Resource,
) -> Result<Vec<Covered>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), pg_get_userbyid(c.relowner)::text,
                c.oid = $1::regclass, t.tgfoid = $2::regprocedure, t.tgtype, t.tgenabled::text, t.tgnargs, t.tgargs,
                t.oid IS NOT NULL
         FROM (SELECT $1::regclass AS relid, 0 AS level
               UNION SELECT relid, level FROM pg_partition_tree($1::regclass)) AS tree
         JOIN pg_class c ON c.oid = tree.relid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         LEFT JOIN pg_trigger t ON t.tgrelid = c.oid AND t.tgname = $3
         WHERE c.relkind IN ('r', 'p')
         ORDER BY tree.level, 1",
    )
    .bind(&resource.relation)
    .bind(format!("\"{schema}\".fencegate_guard()"))
    .bind(TRIGGER)
    .fetch_all(&mut *conn)
    .await?;
    let mut covered = Vec::with_capacity(rows.len());
    for row in rows {
        let exists: bool = row.try_get(8)?;
        let installed = if !exists {
            Installed::Missing
        } else {
            let ours: bool = row.try_get(3)?;
            let tgtype: i16 = row.try_get(4)?;
            let enabled: String = row.try_get(5)?;
            let nargs: i16 = row.try_get(6)?;
            let args: Vec<u8> = row.try_get(7)?;
            // tgargs: each argument followed by a NUL byte. A trigger made by an older
            // fencegate has more arguments after the resource; they are ignored.
            let first = args.split(|b| *b == 0).next().unwrap_or_default();
            if !ours {
                Installed::Foreign("it calls another function".into())
            } else if tgtype & TGTYPE != TGTYPE {
                Installed::Foreign(
                    "it does not fire BEFORE INSERT OR UPDATE OR DELETE FOR EACH ROW".into(),
                )
            } else if nargs < 1 || first != resource.name.as_bytes() {
                Installed::Foreign(format!(
                    "its argument is not the resource name {:?}",
                    resource.name
                ))
            } else if enabled != "A" {
                Installed::NotAlways
            } else {
                Installed::Ready
            }
        };
        covered.push(Covered {
            relation: row.try_get(0)?,
            owner: row.try_get(1)?,
            root: row.try_get(2)?,
            installed,
        });
    }
    Ok(covered)
}

/// The DDL that makes the guard of `resource` ready on every relation of `covered`, for their
/// owners to run once (nothing for relations already ready). Creating the trigger on a
/// partitioned table creates it on its partitions; each is then set to fire always.
pub fn ddl(schema: &str, resource: &Resource, covered: &[Covered]) -> Vec<String> {
    let mut out = Vec::new();
    let root = covered.iter().find(|c| c.root);
    let create = format!(
        "CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OR DELETE ON {} FOR EACH ROW EXECUTE FUNCTION \"{schema}\".fencegate_guard('{}');",
        resource.relation,
        resource.name.replace('\'', "''")
    );
    if let Some(root) = root {
        match &root.installed {
            Installed::Missing => out.push(create),
            Installed::Foreign(_) => {
                out.push(format!("DROP TRIGGER {TRIGGER} ON {};", root.relation));
                out.push(create);
            }
            Installed::NotAlways | Installed::Ready => {}
        }
    }
    for relation in covered {
        if relation.installed != Installed::Ready {
            out.push(format!(
                "ALTER TABLE {} ENABLE ALWAYS TRIGGER {TRIGGER};",
                relation.relation
            ));
        }
    }
    out
}

/// Writes each resource's row in `fencegate_guards` (mode `off` without a guard), deletes the
/// rows of resources no longer configured (their triggers, if any, are then inert), and checks
/// each guarded table's trigger: where it is not ready, fencegate tries the DDL itself (it can
/// where its role is a member of the table's owner) and otherwise stops start-up with the
/// owner's DDL, after granting the owner EXECUTE on the guard's function (CREATE TRIGGER needs
/// it; the trigger then runs whatever the writer's rights). Once every trigger is ready, EXECUTE
/// is revoked from everyone again. Refuses a guard that cannot work: fencegate's role would be
/// the application's too (a superuser, or the table's owner, which applications usually
/// connect as).
///
/// `side`: the connection that holds the start-up lock (`pooler::exclusively`).
pub async fn check(
    pool: &PgPool,
    side: sqlx::PgConnection,
    schema: &str,
    resources: &[&Resource],
) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await?;
    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&mut *conn)
        .await?;
    if standby {
        return check_locked(&mut conn, schema, resources, true).await;
    }
    // Processes starting together check (and install) one after the other: one that finds a
    // trigger missing must not fail while another is installing it. A transaction-scoped lock
    // on a connection of its own (a pooler in transaction mode cannot hold a session lock);
    // not SYNC_LOCK, which `check_locked` takes on `conn`.
    super::super::pooler::exclusively(
        side,
        CHECK_LOCK,
        check_locked(&mut conn, schema, resources, false),
    )
    .await
}

/// The lock processes take while they check the guards' triggers ("fgguards").
const CHECK_LOCK: i64 = 0x6667_6775_6172_6473;

async fn check_locked(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    resources: &[&Resource],
    standby: bool,
) -> anyhow::Result<()> {
    let (me, superuser): (String, bool) = sqlx::query_as(
        "SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(&mut *conn)
    .await?;
    let mut problems = Vec::new();
    // The owners of guarded tables keep EXECUTE on the guard's function: CREATE TRIGGER needs it,
    // and so does creating or attaching a partition (the trigger is cloned onto it). Anywhere
    // else the function does nothing (it checks its resource's table).
    let mut owners_needing_execute = Vec::new();
    if !standby {
        let mut tx = (*conn).begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(super::SYNC_LOCK)
            .execute(&mut *tx)
            .await?;
        let names: Vec<String> = resources.iter().map(|r| r.name.clone()).collect();
        sqlx::query("DELETE FROM fencegate_guards WHERE resource <> ALL($1)")
            .bind(&names)
            .execute(&mut *tx)
            .await?;
        for resource in resources {
            let mode = resource.guard.map(|g| g.as_str()).unwrap_or("off");
            sqlx::query(
                "INSERT INTO fencegate_guards (resource, relid, scope, mode) VALUES ($1, $2::regclass, $3, $4)
                 ON CONFLICT (resource) DO UPDATE SET relid = EXCLUDED.relid, scope = EXCLUDED.scope, mode = EXCLUDED.mode",
            )
            .bind(&resource.name)
            .bind(&resource.relation)
            .bind(resource.scope.as_ref().map(|s| s.as_str()))
            .bind(mode)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
    }
    for resource in resources {
        let covered = inspect(&mut *conn, schema, resource).await?;
        let name = &resource.name;
        let relation = &resource.relation;
        let Some(guard) = resource.guard else {
            if covered.iter().any(|c| c.installed != Installed::Missing) {
                tracing::warn!(
                    resource = name.as_str(),
                    "guard off: the trigger left on the table does nothing now; its owner may drop it: DROP TRIGGER {TRIGGER} ON {relation};"
                );
            }
            continue;
        };
        // The catalog always lists the table itself: without it, nothing could be checked.
        let Some(owner) = covered.iter().find(|c| c.root).map(|c| c.owner.clone()) else {
            anyhow::bail!("resource {name:?}: {relation} is not in the catalog");
        };
        if superuser {
            problems.push(format!(
                "resource {name:?}: guard needs fencegate to connect as a role of its own, not a superuser ({me}): \
                 CREATE ROLE fencegate LOGIN; GRANT SELECT, INSERT, UPDATE, DELETE ON {relation} TO fencegate"
            ));
            continue;
        }
        if owner == me {
            problems.push(format!(
                "resource {name:?}: guard needs fencegate to connect as a role of its own, not the table's owner ({owner}), \
                 which the application writes as: its writes would pass as fencegate's"
            ));
            continue;
        }
        owners_needing_execute.extend(covered.iter().map(|c| c.owner.clone()));
        let statements = ddl(schema, resource, &covered);
        if statements.is_empty() {
            tracing::info!(
                resource = name.as_str(),
                mode = guard.as_str(),
                "guard trigger checked"
            );
            continue;
        }
        if standby {
            problems.push(format!(
                "resource {name:?}: the guard trigger is not ready and a standby cannot install it; on the primary, as {owner}:\n    {}",
                statements.join("\n    ")
            ));
            continue;
        }
        // fencegate may be able to run it (its role a member of the owner's).
        let mut tx = (*conn).begin().await?;
        let mut tried = Ok(());
        for statement in &statements {
            tried = sqlx::query(statement)
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map(|_| ());
            if tried.is_err() {
                break;
            }
        }
        match tried {
            Ok(()) => {
                tx.commit().await?;
                tracing::info!(
                    resource = name.as_str(),
                    mode = guard.as_str(),
                    "guard trigger installed"
                );
            }
            Err(e) => {
                tx.rollback().await?;
                tracing::debug!(resource = name.as_str(), error = %e, "cannot install the guard trigger");
                let reason = covered
                    .iter()
                    .find_map(|c| match &c.installed {
                        Installed::Missing => Some(format!("{} has no guard trigger", c.relation)),
                        Installed::Foreign(why) => Some(format!(
                            "{} has a trigger named {TRIGGER} that is not fencegate's guard ({why})",
                            c.relation
                        )),
                        Installed::NotAlways => Some(format!(
                            "{}'s guard trigger does not fire ALWAYS (session_replication_role = replica would skip it)",
                            c.relation
                        )),
                        Installed::Ready => None,
                    })
                    .unwrap_or_default();
                problems.push(format!(
                    "resource {name:?}: {reason}, and fencegate's role ({me}) cannot change that. Run once, as the table's owner ({owner}):\n    {}\n  (`fencegate guard sql --resource {name}` prints this again)",
                    statements.join("\n    ")
                ));
            }
        }
    }
    if !standby {
        owners_needing_execute.sort();
        owners_needing_execute.dedup();
        grant_guard_execute(&mut *conn, schema, &owners_needing_execute, true).await?;
    }
    match problems.len() {
        0 => Ok(()),
        _ => anyhow::bail!("{}", problems.join("\n")),
    }
}

/// EXECUTE on the guard's function for `owners` (the guarded tables' owners: CREATE TRIGGER and
/// new partitions need it); with `exactly`, revoked from everyone else, PUBLIC included.
pub async fn grant_guard_execute(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    owners: &[String],
    exactly: bool,
) -> anyhow::Result<()> {
    let function = format!("\"{schema}\".fencegate_guard()");
    Ok(super::grant_execute(conn, &function, owners, exactly).await?)
}
