//! Behind a connection pooler (`database.pooler`, DESIGN.md "Where PostgreSQL really runs"):
//! what a connection may rely on, and how fencegate gets by without the rest.
//!
//! PgBouncer refuses startup parameters it does not know (`options`, `extra_float_digits`), and
//! in transaction mode hands a server connection to another client after every transaction. So
//! behind a pooler:
//! - the startup packet carries only what every pooler passes through, and `search_path`,
//!   `lock_timeout` and `idle_in_transaction_session_timeout` are set at the start of every
//!   transaction, in the same round trip (`local_settings` of the vendored sqlx-postgres): every
//!   object fencegate creates, `_sqlx_migrations` included, lands in its schema;
//! - in transaction mode no statement is named (`unnamed_statements`: Parse + Bind + Execute +
//!   Sync in one flush), and mutual exclusion is a `pg_advisory_xact_lock` held in a transaction
//!   on a connection of its own ([`exclusively`]), never a session lock;
//! - the reset listener connects to `database.listen_url` when set; in transaction mode without
//!   it there is no `LISTEN` (a pooler would hand the listening session to others), and resets
//!   reach other processes through the audit-log poll (`store::admin::watch_resets`).

use std::future::Future;

use sqlx::{postgres::PgConnectOptions, ConnectOptions, Connection, PgConnection, PgPool};

use crate::store::{Pooler, Settings};

/// What every fencegate session needs: its schema, a bound on row-lock waits, and no
/// transaction idle for long (see `PgStore::connect`).
fn settings(schema: &str, lock_timeout_ms: u64) -> [(&'static str, String); 3] {
    [
        ("idle_in_transaction_session_timeout", "30s".to_owned()),
        ("search_path", schema.to_owned()),
        ("lock_timeout", format!("{lock_timeout_ms}ms")),
    ]
}

/// The connection options for `pooler`: session settings in the startup packet on a direct
/// connection; behind a pooler none of that, settings per transaction, and in transaction mode
/// unnamed statements.
pub fn apply(
    options: PgConnectOptions,
    pooler: Pooler,
    schema: &str,
    lock_timeout_ms: u64,
) -> PgConnectOptions {
    let settings = settings(schema, lock_timeout_ms);
    match pooler {
        Pooler::None => options.options(settings),
        Pooler::Session | Pooler::Transaction => options
            .extra_float_digits(None)
            .without_startup_options()
            .local_settings(settings)
            .unnamed_statements(pooler == Pooler::Transaction),
    }
}

/// How the reset listener connects: to `database.listen_url` when set (a direct or
/// session-pool URL: a session pool refuses the same startup parameters), else to the main URL,
/// except through a pooler in transaction mode, which would hand the listening session to other
/// clients: then no listener (`None`).
pub async fn listener_options(
    settings: &Settings,
    main: &PgConnectOptions,
) -> anyhow::Result<Option<PgConnectOptions>> {
    let options = match &settings.listen_url {
        Some(url) => {
            let (options, mut tls) = super::tls::options(url)
                .map_err(|e| anyhow::anyhow!("database.listen_url: {e}"))?;
            let options = tls
                .resolve_allow(options)
                .await
                .log_statements(tracing::log::LevelFilter::Trace);
            match settings.pooler {
                Pooler::None => options,
                Pooler::Session | Pooler::Transaction => {
                    options.extra_float_digits(None).without_startup_options()
                }
            }
        }
        None if settings.pooler == Pooler::Transaction => return Ok(None),
        None => main.clone(),
    };
    Ok(Some(options.application_name("fencegate-listener")))
}

/// The sentence to add to a database error that looks like a pooler's, when fencegate was not
/// told about one (or was told the wrong mode).
pub fn hint(err: &sqlx::Error, pooler: Pooler) -> Option<&'static str> {
    let text = err.to_string();
    let refused_parameter = text.contains("unsupported startup parameter");
    let named_statement = text.contains("prepared statement")
        && (text.contains("already exists") || text.contains("does not exist"));
    match pooler {
        Pooler::None if refused_parameter || named_statement => Some(
            "this looks like a connection pooler (PgBouncer?) between fencegate and PostgreSQL: \
             set database.pooler = \"transaction\" or \"session\" (FENCEGATE_DATABASE_POOLER), as the pooler's pool_mode",
        ),
        Pooler::Session if named_statement => Some(
            "prepared statements are lost between transactions: the pooler is in transaction mode, \
             set database.pooler = \"transaction\" (FENCEGATE_DATABASE_POOLER)",
        ),
        _ => None,
    }
}

/// Refuses to go on when statements do not run in fencegate's schema: behind a pooler the
/// schema comes from the per-transaction settings, and anything created elsewhere would land in
/// another schema (`public`).
pub async fn check_schema(pool: &PgPool, schema: &str) -> anyhow::Result<()> {
    let current: Option<String> = sqlx::query_scalar("SELECT current_schema()::text")
        .fetch_one(pool)
        .await?;
    if current.as_deref() != Some(schema) {
        anyhow::bail!(
            "fencegate's statements run in the schema {current:?}, not in database.schema {schema:?}: nothing is \
             created outside it. Behind a connection pooler set database.pooler (\"session\" or \"transaction\"), \
             so fencegate sets search_path per transaction; otherwise check that the role can use the schema"
        );
    }
    Ok(())
}

/// Runs `work` while holding the transaction-scoped advisory lock `key` in a transaction on
/// `conn`, a connection of its own (outside the pools), so processes starting together do it one at a
/// time. Works through a pooler in transaction mode: the transaction keeps its server
/// connection, and the lock ends with it, whatever happens to this process.
pub async fn exclusively<T>(
    mut conn: PgConnection,
    key: i64,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let mut tx = conn.begin().await?;
    // The lock is held while `work` runs on other connections: this transaction sits idle
    // meanwhile, and must not be ended by the idle timeout every other one gets.
    sqlx::query(
        "SELECT set_config('idle_in_transaction_session_timeout', '0', true), pg_advisory_xact_lock($1)",
    )
    .bind(key)
    .execute(&mut *tx)
    .await?;
    let out = work.await;
    // Nothing was written: ending the transaction releases the lock.
    let _ = tx.rollback().await;
    let _ = conn.close().await;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db_error(message: &str) -> sqlx::Error {
        sqlx::Error::Protocol(message.to_owned())
    }

    #[test]
    fn a_pooler_refusal_names_the_setting_only_when_it_is_missing_or_wrong() {
        let startup = db_error("unsupported startup parameter: extra_float_digits");
        let named = db_error("prepared statement \"sqlx_s_1\" already exists");
        let other = db_error("connection refused");
        for err in [&startup, &named] {
            assert!(hint(err, Pooler::None).unwrap().contains("database.pooler"));
            assert!(hint(err, Pooler::Transaction).is_none());
        }
        assert!(hint(&named, Pooler::Session)
            .unwrap()
            .contains("\"transaction\""));
        assert!(hint(&other, Pooler::None).is_none());
    }

    #[test]
    fn behind_a_pooler_the_startup_packet_carries_no_refused_parameter() {
        let base = PgConnectOptions::new().host("h").database("d");
        for pooler in [Pooler::Session, Pooler::Transaction] {
            let shown = format!("{:?}", apply(base.clone(), pooler, "fg", 100));
            assert!(shown.contains("extra_float_digits: None"), "{shown}");
            assert!(shown.contains("options: None"), "{shown}");
            assert!(shown.contains("search_path"), "{shown}");
        }
        let direct = format!("{:?}", apply(base, Pooler::None, "fg", 100));
        assert!(direct.contains("search_path=fg"), "{direct}");
    }
}
