//! Drop-in for real (docs/tables.md, *Sharing a database*): fencegate in front of an application
//! database it does not own. Its tables and migration history live in its own schema; the
//! application's `public` (its own sqlx history included) is never touched; an install from
//! before, in `public`, is moved at start with nothing lost. PostgreSQL only: the embedded
//! SQLite file is fencegate's alone and has no schemas (tests/sqlite does not include this).

use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::helpers::{spawn_app_on, unique};
use crate::pg;

/// The table sqlx keeps its history in, as an application using sqlx migrations has it.
const APP_HISTORY: &str = "
    CREATE TABLE public._sqlx_migrations (
        version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
        success BOOLEAN NOT NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL);
    INSERT INTO public._sqlx_migrations VALUES (20240101000000, 'app init', now(), true, '\\x00', 1);
    CREATE TABLE public.orders (id int PRIMARY KEY, total int)";

async fn sql(conn: &mut PgConnection, text: &str) {
    sqlx::raw_sql(text).execute(&mut *conn).await.unwrap_or_else(|e| panic!("{text}: {e}"));
}

async fn count(conn: &mut PgConnection, query: &str) -> i64 {
    sqlx::query_scalar(query).fetch_one(&mut *conn).await.unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// What of fencegate's is in `public`: tables named fencegate_*, and history rows not the app's.
async fn fencegate_in_public(conn: &mut PgConnection) -> (i64, i64) {
    let tables = count(conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'fencegate%'").await;
    let history = count(conn, "SELECT count(*) FROM public._sqlx_migrations WHERE version <> 20240101000000").await;
    (tables, history)
}

/// `url` with another user (and no password: the test servers trust local connections).
fn as_user(url: &str, user: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a database URL");
    parsed.set_username(user).unwrap();
    parsed.set_password(None).unwrap();
    parsed.to_string()
}

#[tokio::test]
async fn fencegate_starts_beside_an_application_with_its_own_sqlx_history_as_a_role_owning_only_its_schema() {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    sql(&mut admin, APP_HISTORY).await;
    let role = unique("fg_role").replace('-', "_");
    sql(&mut admin, &format!("CREATE ROLE {role} LOGIN")).await;
    // PostgreSQL 15's default, stated for older servers: nobody else creates in public.
    sql(&mut admin, "REVOKE CREATE ON SCHEMA public FROM PUBLIC").await;

    // No schema yet, and the role may not create one: start-up says what to do.
    let url = as_user(&db, &role);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(url.clone());
    let err = format!("{:#}", fencegate::serve(settings, listener, async {}).await.unwrap_err());
    assert!(err.contains("CREATE SCHEMA fencegate AUTHORIZATION"), "{err}");

    sql(&mut admin, &format!("CREATE SCHEMA fencegate AUTHORIZATION {role}")).await;
    let app = spawn_app_on(url, |_| {}).await;
    app.kv_put("k", "5", &json!("v")).await.expect(201);
    app.kv_put("k", "4", &json!("zombie")).await.problem(412, "stale-token");
    app.get("/readyz").await.expect(200);
    assert_eq!(fencegate_in_public(&mut admin).await, (0, 0), "fencegate left something in public");
    assert_eq!(count(&mut admin, "SELECT count(*) FROM public._sqlx_migrations").await, 1, "the app's history was touched");
    assert!(count(&mut admin, "SELECT count(*) FROM fencegate._sqlx_migrations").await > 0);
    drop(app);
    let _ = sqlx::raw_sql(&format!("DROP SCHEMA fencegate CASCADE; DROP OWNED BY {role}; DROP ROLE {role}")).execute(&mut admin).await;
}

/// An install from before the schema setting, with its tables and history in `public` (made
/// here by a server configured with `schema = "public"`, which is that very layout), beside an
/// application's own history: moved at start, nothing lost, the application's row left alone.
#[tokio::test]
async fn an_install_in_public_is_moved_into_its_schema_with_nothing_lost() {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    let old = spawn_app_on(db.clone(), |s| s.database.schema = "public".into()).await;
    old.kv_put("k", "7", &json!({"kept": true})).await.expect(201);
    let lock = old.send(old.req(reqwest::Method::POST, "/v1/locks/nightly").json(&json!({"owner": "w", "ttl_ms": 1000}))).await;
    assert_eq!(lock.expect(201)["token"], json!("1"));
    old.send(old.req(reqwest::Method::DELETE, "/v1/locks/nightly").header(crate::helpers::TOKEN, "1")).await.expect(200);
    let reset = old.req(reqwest::Method::POST, "/v1/admin/kv/k/reset").json(&json!({"to": "6", "reason": "before the move"}));
    old.send(reset).await.expect(200);
    drop(old);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    sql(&mut admin, "INSERT INTO public._sqlx_migrations VALUES (20240101000000, 'app init', now(), true, '\\x00', 1)").await;
    assert!(fencegate_in_public(&mut admin).await.0 >= 4, "the old layout was not made");

    let app = spawn_app_on(db, |_| {}).await;
    app.get("/readyz").await.expect(200);
    assert_eq!(fencegate_in_public(&mut admin).await, (0, 0), "left in public");
    assert_eq!(count(&mut admin, "SELECT count(*) FROM public._sqlx_migrations").await, 1, "the app's row must stay");
    // Nothing lost: the value, its fence (as reset), the lock's counter, the audit log.
    app.assert_value("k", &json!({"kept": true}), "7").await;
    app.kv_put("k", "5", &json!("zombie")).await.problem(412, "stale-token");
    app.kv_put("k", "6", &json!("next")).await.expect(200);
    let lock = app.send(app.req(reqwest::Method::POST, "/v1/locks/nightly").json(&json!({"owner": "w", "ttl_ms": 1000}))).await;
    assert_eq!(lock.expect(201)["token"], json!("2"), "the lock's counter moved with it");
    let audit = app.get("/v1/admin/audit?limit=10").await.expect(200);
    assert_eq!(audit["entries"][0]["reason"], json!("before the move"), "{audit}");
}
