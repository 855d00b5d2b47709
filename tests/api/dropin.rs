//! Drop-in for real (docs/tables.md, *Sharing a database*): fencegate in front of an application
//! database it does not own. Its tables and migration history live in its own schema; the
//! application's `public` (its own sqlx history included) is never touched; an install from
//! before, in `public`, is moved at start with nothing lost. PostgreSQL only: the embedded
//! SQLite file is fencegate's alone and has no schemas (tests/sqlite does not include this).

use std::time::{Duration, Instant};

use fencegate::tables::{FenceMode, GuardMode, ResourceSettings};
use reqwest::Method;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::helpers::{spawn_app_on, unique, TestApp, TOKEN};
use crate::pg;

/// The table sqlx keeps its history in, as an application using sqlx migrations has it.
const APP_HISTORY: &str = "
    CREATE TABLE public._sqlx_migrations (
        version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
        success BOOLEAN NOT NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL);
    INSERT INTO public._sqlx_migrations VALUES (20240101000000, 'app init', now(), true, '\\x00', 1);
    CREATE TABLE public.orders (id int PRIMARY KEY, total int)";

pub async fn sql(conn: &mut PgConnection, text: &str) {
    sqlx::raw_sql(text)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{text}: {e}"));
}

async fn count(conn: &mut PgConnection, query: &str) -> i64 {
    sqlx::query_scalar(query)
        .fetch_one(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// What of fencegate's is in `public`: tables named fencegate_*, and history rows not the app's.
async fn fencegate_in_public(conn: &mut PgConnection) -> (i64, i64) {
    let tables = count(conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE 'fencegate%'").await;
    let history = count(
        conn,
        "SELECT count(*) FROM public._sqlx_migrations WHERE version <> 20240101000000",
    )
    .await;
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
async fn fencegate_starts_beside_an_application_with_its_own_sqlx_history_as_a_role_owning_only_its_schema(
) {
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
    let err = format!(
        "{:#}",
        fencegate::serve(settings, listener, async {})
            .await
            .unwrap_err()
    );
    assert!(
        err.contains("CREATE SCHEMA fencegate AUTHORIZATION"),
        "{err}"
    );

    sql(
        &mut admin,
        &format!("CREATE SCHEMA fencegate AUTHORIZATION {role}"),
    )
    .await;
    let app = spawn_app_on(url, |_| {}).await;
    app.kv_put("k", "5", &json!("v")).await.expect(201);
    app.kv_put("k", "4", &json!("zombie"))
        .await
        .problem(412, "stale-token");
    app.get("/readyz").await.expect(200);
    assert_eq!(
        fencegate_in_public(&mut admin).await,
        (0, 0),
        "fencegate left something in public"
    );
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM public._sqlx_migrations").await,
        1,
        "the app's history was touched"
    );
    assert!(
        count(
            &mut admin,
            "SELECT count(*) FROM fencegate._sqlx_migrations"
        )
        .await
            > 0
    );
    drop(app);
    let _ = sqlx::raw_sql(&format!(
        "DROP SCHEMA fencegate CASCADE; DROP OWNED BY {role}; DROP ROLE {role}"
    ))
    .execute(&mut admin)
    .await;
}

/// An install from before the schema setting: the migrations released then, applied in
/// `public` with their history rows (as sqlx records them, checksums included).
async fn old_install_in_public(conn: &mut PgConnection) {
    use sha2::Digest;
    const LAST_BEFORE_SCHEMAS: i64 = 20261123000001;
    sql(conn, "CREATE TABLE public._sqlx_migrations (
        version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMPTZ NOT NULL DEFAULT now(),
        success BOOLEAN NOT NULL, checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)").await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let (version, description) = name.trim_end_matches(".sql").split_once('_').unwrap();
        let version: i64 = version.parse().unwrap();
        if version > LAST_BEFORE_SCHEMAS {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        sqlx::raw_sql(&format!("SET search_path = public; {text}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        sqlx::query("INSERT INTO public._sqlx_migrations VALUES ($1, $2, now(), true, $3, 1)")
            .bind(version)
            .bind(description.replace('_', " "))
            .bind(sha2::Sha384::digest(text.as_bytes()).to_vec())
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    sql(conn, "RESET search_path").await;
}

/// An install from before the schema setting, with data, beside an application's own sqlx
/// history in the same `public._sqlx_migrations`: moved at start, nothing lost, the
/// application's row left alone, and the newer migrations applied in the schema.
#[tokio::test]
async fn an_install_in_public_is_moved_into_its_schema_with_nothing_lost() {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    old_install_in_public(&mut admin).await;
    sql(&mut admin, "
        INSERT INTO public._sqlx_migrations VALUES (20240101000000, 'app init', now(), true, '\\x00', 1);
        INSERT INTO public.fencegate_kv (key, value, key_fence, fence_token) VALUES ('k', '{\"kept\": true}', 7, 7);
        INSERT INTO public.fencegate_locks (name, owner, token) VALUES ('nightly', NULL, 1);
        INSERT INTO public.fencegate_fences (scope, fence_token) VALUES ('nightly', 1);
        INSERT INTO public.fencegate_audit (at, actor, action, target, name, from_token, to_token, reason)
            VALUES (now(), 'key:ops', 'reset', 'key', 'k', 9, 7, 'before the move')").await;

    let app = spawn_app_on(db.clone(), |_| {}).await;
    app.get("/readyz").await.expect(200);
    assert_eq!(
        fencegate_in_public(&mut admin).await,
        (0, 0),
        "left in public"
    );
    assert_eq!(
        count(&mut admin, "SELECT count(*) FROM public._sqlx_migrations").await,
        1,
        "the app's row must stay"
    );
    // Nothing lost: the value and its fence, the lock's counter, the audit log.
    app.assert_value("k", &json!({"kept": true}), "7").await;
    app.kv_put("k", "6", &json!("zombie"))
        .await
        .problem(412, "stale-token");
    app.kv_put("k", "7", &json!("next")).await.expect(200);
    assert_eq!(
        grant(&app, "nightly", 1000).await,
        2,
        "the lock's counter moved with it"
    );
    let audit = app.get("/v1/admin/audit?limit=10").await.expect(200);
    assert_eq!(
        audit["entries"][0]["reason"],
        json!("before the move"),
        "{audit}"
    );
    drop(app);

    // An install made in public on purpose (schema = "public", newer migrations) is not moved.
    let db = pg::fresh_database().await;
    let on_purpose = spawn_app_on(db.clone(), |s| s.database.schema = "public".into()).await;
    on_purpose.kv_put("k", "1", &json!(1)).await.expect(201);
    drop(on_purpose);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(db);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = format!(
        "{:#}",
        fencegate::serve(settings, listener, async {})
            .await
            .unwrap_err()
    );
    assert!(err.contains("database.schema = \"public\""), "{err}");
}

// --- SQL writers: fencegate.fence(scope, token) -------------------------------------------------

/// The SQLSTATE and the message of a refused statement.
pub fn sqlstate(err: sqlx::Error) -> (String, String) {
    match err {
        sqlx::Error::Database(db) => (
            db.code().unwrap_or_default().into_owned(),
            db.message().to_owned(),
        ),
        other => panic!("not a database refusal: {other}"),
    }
}

/// Runs `BEGIN; SELECT fencegate.fence(scope, token); <then>; COMMIT` on `conn`: `Ok` if it
/// committed, else the SQLSTATE and message (the transaction then rolled back).
pub async fn fenced_tx(
    conn: &mut PgConnection,
    scope: &str,
    token: i64,
    then: &str,
) -> Result<(), (String, String)> {
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT fencegate.fence($1, $2)")
        .bind(scope)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(sqlstate)?;
    if !then.is_empty() {
        sqlx::raw_sql(then)
            .execute(&mut *tx)
            .await
            .map_err(sqlstate)?;
    }
    tx.commit().await.map_err(sqlstate)
}

pub async fn grant(app: &TestApp, name: &str, ttl_ms: u64) -> i64 {
    let r = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{name}"))
                .json(&json!({"owner": "w", "ttl_ms": ttl_ms})),
        )
        .await;
    r.expect(201)["token"].as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_sql_transaction_is_fenced_by_one_call_against_the_same_fences_as_http() {
    let db = pg::fresh_database().await;
    let mut conn = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut conn,
        "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, 'nobody')",
    )
    .await;
    let app = spawn_app_on(db.clone(), |s| s.kv.max_token_jump = 1000).await;
    let first = grant(&app, "billing", 60_000).await;
    fenced_tx(
        &mut conn,
        "billing",
        first,
        "UPDATE jobs SET owner = 'first' WHERE id = 1",
    )
    .await
    .unwrap();
    assert_eq!(
        app.fence("billing").await.expect(200)["fence_token"],
        json!(first.to_string())
    );

    // HTTP raises the fence (a claim with a newer token): SQL with the old one is refused,
    // FG412 with both tokens, and nothing of its transaction commits.
    app.claim("billing", &(first + 1).to_string())
        .await
        .problem(422, "token-not-issued");
    app.send(
        app.req(Method::DELETE, "/v1/locks/billing")
            .header(TOKEN, first.to_string()),
    )
    .await
    .expect(200);
    let second = grant(&app, "billing", 60_000).await;
    let (code, message) = fenced_tx(
        &mut conn,
        "billing",
        first,
        "UPDATE jobs SET owner = 'zombie' WHERE id = 1",
    )
    .await
    .unwrap_err();
    assert_eq!(code, "FG412", "{message}");
    let owner: String = sqlx::query_scalar("SELECT owner FROM jobs WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, "first");
    // The same refusal over HTTP, against the fence SQL raised.
    app.kv_put_scoped("k", &first.to_string(), "billing", &json!(1))
        .await
        .stale_scope("billing", &first.to_string(), &second.to_string());

    // The guards are HTTP's: a token the lock never issued, a jump past the cap.
    let (code, message) = fenced_tx(&mut conn, "billing", second + 1, "")
        .await
        .unwrap_err();
    assert_eq!(code, "FG422", "{message}");
    assert!(message.contains("never issued"), "{message}");
    let (code, message) = fenced_tx(&mut conn, "open-scope", 5000, "")
        .await
        .unwrap_err();
    assert_eq!(code, "FG422", "{message}");
    assert!(message.contains("max_token_jump"), "{message}");
    let (code, _) = fenced_tx(&mut conn, "", 1, "").await.unwrap_err();
    assert_eq!(code, "22023");
    // Equal tokens pass (the holder writes many times), and SQL's fence is HTTP's fence.
    fenced_tx(
        &mut conn,
        "billing",
        second,
        "UPDATE jobs SET owner = 'second' WHERE id = 1",
    )
    .await
    .unwrap();
    app.kv_put_scoped("k", &second.to_string(), "billing", &json!(2))
        .await
        .expect(201);
    fenced_tx(&mut conn, "open-scope", 900, "").await.unwrap();
    app.claim("open-scope", "899")
        .await
        .stale_scope("open-scope", "899", "900");
}

#[tokio::test]
async fn an_issuers_scope_cannot_be_fenced_in_sql() {
    let db = pg::fresh_database().await;
    let var = unique("FENCEGATE_TEST_SQL_ISSUER").replace('-', "_");
    std::env::set_var(&var, "an-issuer-secret-of-at-least-32-bytes");
    let _app = spawn_app_on(db.clone(), |s| {
        s.issuers = vec![fencegate::issuers::IssuerSettings {
            name: "redis".into(),
            scopes: vec!["signed/".into()],
            ed25519_public_key: None,
            hmac_sha256_secret_env: Some(var),
        }]
    })
    .await;
    _app.get("/readyz").await.expect(200);
    let mut conn = PgConnection::connect(&db).await.unwrap();
    let (code, message) = fenced_tx(&mut conn, "signed/job", 5, "").await.unwrap_err();
    assert_eq!(code, "FG422", "{message}");
    assert!(message.contains("issuer"), "{message}");
}

/// A SQL transaction that fenced a scope and then stalls holds the fence row: a newer holder's
/// grant waits for it at most `database.lock_timeout_ms`, then gets a 503 (retry), and is
/// granted once the transaction ends. fencegate's connection is never held longer.
#[tokio::test]
async fn a_stalled_sql_transaction_delays_a_grant_at_most_the_lock_timeout() {
    let db = pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |s| s.database.lock_timeout_ms = 400).await;
    let first = grant(&app, "job", 100).await;
    let mut conn = PgConnection::connect(&db).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT fencegate.fence('job', $1)")
        .bind(first)
        .execute(&mut *tx)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the lease lapses meanwhile
    let started = Instant::now();
    let r = app
        .send(
            app.req(Method::POST, "/v1/locks/job")
                .json(&json!({"owner": "new", "ttl_ms": 60_000})),
        )
        .await;
    r.problem(503, "unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the grant waited {:?}",
        started.elapsed()
    );
    tx.commit().await.unwrap();
    assert_eq!(grant(&app, "job", 60_000).await, first + 1);
}

/// A real SQL client process (psql) takes the lock's token, is frozen with SIGSTOP past its
/// lease, and resumes after a new holder wrote: its late transaction is refused (FG412) and the
/// new holder's row is intact.
#[tokio::test]
async fn a_frozen_psql_client_is_refused_when_it_wakes() {
    use nix::{
        sys::signal::{kill, Signal},
        unistd::Pid,
    };
    use tokio::io::AsyncWriteExt;
    let psql = psql_binary();
    let db = pg::fresh_database().await;
    let mut conn = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut conn,
        "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, 'nobody')",
    )
    .await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    let old = grant(&app, "job", 300).await;

    let mut zombie = tokio::process::Command::new(psql)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &db])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start psql");
    let mut stdin = zombie.stdin.take().unwrap();
    stdin.write_all(b"BEGIN;\n").await.unwrap();
    stdin.flush().await.unwrap();
    let pid = Pid::from_raw(zombie.id().unwrap() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();

    tokio::time::sleep(Duration::from_millis(500)).await; // past the zombie's lease
    let new = grant(&app, "job", 60_000).await;
    fenced_tx(
        &mut conn,
        "job",
        new,
        "UPDATE jobs SET owner = 'new holder' WHERE id = 1",
    )
    .await
    .unwrap();

    kill(pid, Signal::SIGCONT).unwrap();
    let late = format!("SELECT fencegate.fence('job', {old});\nUPDATE jobs SET owner = 'zombie' WHERE id = 1;\nCOMMIT;\n");
    stdin.write_all(late.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(20), zombie.wait_with_output())
        .await
        .expect("psql ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the zombie's transaction went through: {stderr}"
    );
    assert!(stderr.contains("is older than the fence"), "{stderr}");
    let owner: String = sqlx::query_scalar("SELECT owner FROM jobs WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(owner, "new holder");
}

/// psql: on PATH, or next to the PostgreSQL server binaries the tests use.
fn psql_binary() -> String {
    let candidates = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("psql"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let versioned = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.flatten()
                .map(|d| d.path().join("bin/psql"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    candidates.into_iter().chain(versioned).find(|p| p.is_file()).map(|p| p.display().to_string()).unwrap_or_else(|| {
        panic!("psql not found on PATH or in /usr/lib/postgresql/*/bin: install the PostgreSQL client (apt-get install postgresql-client)")
    })
}

// --- Guarded legacy tables ----------------------------------------------------------------------

/// A database with a legacy table written by an application role, and a role of fencegate's
/// own (owning its schema, with the table's rights and TRIGGER): (admin connection, fencegate's
/// URL, the application's URL, the roles to drop).
pub async fn guarded_setup(
    table_sql: &str,
    table: &str,
) -> (PgConnection, String, String, [String; 2]) {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    let (fg, app) = (
        unique("fg").replace('-', "_"),
        unique("app").replace('-', "_"),
    );
    sql(&mut admin, table_sql).await;
    sql(&mut admin, &format!(
        "CREATE ROLE {fg} LOGIN; CREATE ROLE {app} LOGIN; CREATE SCHEMA fencegate AUTHORIZATION {fg};
         GRANT SELECT, INSERT, UPDATE, DELETE, TRIGGER ON {table} TO {fg};
         GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {app};"
    ))
    .await;
    (admin, as_user(&db, &fg), as_user(&db, &app), [fg, app])
}

pub fn guarded(name: &str, table: &str, fence: FenceMode, guard: GuardMode) -> ResourceSettings {
    ResourceSettings {
        name: name.into(),
        table: table.into(),
        key: vec!["id".into()],
        fence,
        fence_column: (fence == FenceMode::Column).then(|| "fence".into()),
        strict: false,
        scope: Some("job".into()),
        guard: Some(guard),
    }
}

/// Starts fencegate with `settings` and expects start-up to stop because a guard trigger is not
/// ready, with the DDL for the table's owner: returns the DDL statements it printed.
pub async fn guard_ddl_from_start(settings: fencegate::config::Settings) -> Vec<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = match fencegate::serve(settings, listener, async {}).await {
        Ok(()) => panic!("fencegate started with a guard trigger missing"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("Run once, as the table's owner"), "{err}");
    let ddl: Vec<String> = err
        .lines()
        .filter(|l| l.starts_with("    "))
        .map(|l| l.trim().to_owned())
        .collect();
    assert!(!ddl.is_empty(), "no DDL in: {err}");
    ddl
}

/// Settings for fencegate's role on `url` (a role of its own), configured by `configure`.
pub fn settings_on(
    url: &str,
    configure: impl FnOnce(&mut fencegate::config::Settings),
) -> fencegate::config::Settings {
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(url.to_owned());
    configure(&mut settings);
    settings
}

/// The first start of a guarded table: start-up stops with the owner's DDL, the owner (the
/// admin connection) runs it, and fencegate then starts with the same configuration.
pub async fn spawn_guarded(
    admin: &mut PgConnection,
    url: &str,
    configure: impl Fn(&mut fencegate::config::Settings),
) -> TestApp {
    for statement in guard_ddl_from_start(settings_on(url, &configure)).await {
        sql(admin, &statement).await;
    }
    spawn_app_on(url.to_owned(), configure).await
}

/// `[[auth.roles]]`: `name` may fence the scopes under `prefixes`.
pub fn sql_role(name: &str, prefixes: &[&str]) -> fencegate::auth::RoleSettings {
    fencegate::auth::RoleSettings {
        name: name.to_owned(),
        prefixes: prefixes.iter().map(|p| p.to_string()).collect(),
    }
}

pub async fn drop_roles(admin: &mut PgConnection, roles: &[String; 2]) {
    for role in roles {
        let _ = sqlx::raw_sql(&format!("DROP OWNED BY {role} CASCADE; DROP ROLE {role}"))
            .execute(&mut *admin)
            .await;
    }
}

#[tokio::test]
async fn an_enforced_table_refuses_every_unfenced_write_from_other_roles() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(
        "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, 'seed')",
        "jobs",
    )
    .await;
    let app = spawn_guarded(&mut admin, &fg_url, |s| {
        s.resources = vec![guarded(
            "jobs",
            "public.jobs",
            FenceMode::Ledger,
            GuardMode::Enforce,
        )];
        s.auth.roles = vec![sql_role(&roles[1], &["job"])];
    })
    .await;
    let token = grant(&app, "job", 60_000).await;
    let mut writer = PgConnection::connect(&app_url).await.unwrap();

    // Unfenced: autocommit INSERT, UPDATE, DELETE, COPY, and an explicit transaction: FG428.
    for statement in [
        "INSERT INTO jobs VALUES (2, 'x')",
        "UPDATE jobs SET owner = 'x' WHERE id = 1",
        "DELETE FROM jobs WHERE id = 1",
        "BEGIN; UPDATE jobs SET owner = 'x' WHERE id = 1; COMMIT",
    ] {
        let (code, message) = sqlstate(
            sqlx::raw_sql(statement)
                .execute(&mut writer)
                .await
                .unwrap_err(),
        );
        assert_eq!(code, "FG428", "{statement}: {message}");
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut writer).await;
    }
    let mut copy = writer
        .copy_in_raw("COPY jobs (id, owner) FROM STDIN")
        .await
        .unwrap();
    copy.send(b"3\tcopied\n".as_slice()).await.unwrap();
    let (code, _) = sqlstate(copy.finish().await.unwrap_err());
    assert_eq!(code, "FG428", "COPY");
    // A fenced transaction goes through; a stale one stops at fence() (FG412).
    fenced_tx(
        &mut writer,
        "job",
        token,
        "UPDATE jobs SET owner = 'holder' WHERE id = 1; INSERT INTO jobs VALUES (4, 'new')",
    )
    .await
    .unwrap();
    fenced_tx(
        &mut writer,
        "job",
        token - 1,
        "UPDATE jobs SET owner = 'zombie' WHERE id = 1",
    )
    .await
    .unwrap_err();
    // fencegate's own writes are fenced in their statement, and pass the trigger.
    let put = app
        .req(Method::PUT, "/v1/tables/jobs/5")
        .header(TOKEN, token.to_string())
        .json(&json!({"owner": "via http"}));
    app.send(put).await.expect(201);
    let rows: Vec<(i32, String)> = sqlx::query_as("SELECT id, owner FROM jobs ORDER BY id")
        .fetch_all(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, "holder".into()),
            (4, "new".into()),
            (5, "via http".into())
        ]
    );
    drop(app);
    drop(writer);
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn an_audited_table_lets_unfenced_writes_through_and_counts_them() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance int, fence bigint); INSERT INTO accounts VALUES (1, 0, NULL)",
        "accounts",
    )
    .await;
    let app = spawn_guarded(&mut admin, &fg_url, |s| {
        s.resources = vec![guarded(
            "accounts",
            "public.accounts",
            FenceMode::Column,
            GuardMode::Audit,
        )];
        s.auth.roles = vec![sql_role(&roles[1], &["job"])];
    })
    .await;
    let token = grant(&app, "job", 60_000).await;
    let mut writer = PgConnection::connect(&app_url).await.unwrap();
    sqlx::raw_sql("UPDATE accounts SET balance = 10 WHERE id = 1")
        .execute(&mut writer)
        .await
        .unwrap();
    sqlx::raw_sql("INSERT INTO accounts VALUES (2, 5, NULL)")
        .execute(&mut writer)
        .await
        .unwrap();
    fenced_tx(
        &mut writer,
        "job",
        token,
        "UPDATE accounts SET balance = 20 WHERE id = 1",
    )
    .await
    .unwrap();
    // Two unfenced writes counted, the fenced one not: in the metric, within a few ticks.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = app.get("/metrics").await.text;
        if text
            .lines()
            .any(|l| l.starts_with("fencegate_unfenced_writes_total{resource=\"accounts\"} 2"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no unfenced count of 2 after 5 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The console shows them too (its overview), with the role that wrote last.
    let overview = app.get("/v1/admin/overview").await.expect(200);
    let unfenced = &overview["unfenced"][0];
    assert_eq!(
        (
            &unfenced["resource"],
            &unfenced["writes"],
            &unfenced["last_role"]
        ),
        (&json!("accounts"), &json!(2), &json!(roles[1])),
        "{overview}"
    );
    drop(app);
    drop(writer);
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn a_guard_needs_a_role_of_fencegates_own_and_says_so() {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut admin,
        "CREATE TABLE jobs (id int PRIMARY KEY, owner text)",
    )
    .await;
    // The test server's user is a superuser, as an application's often is.
    let mut settings = fencegate::config::Settings::default();
    settings.database.url = Some(db.clone());
    settings.resources = vec![guarded(
        "jobs",
        "public.jobs",
        FenceMode::Ledger,
        GuardMode::Enforce,
    )];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = format!(
        "{:#}",
        fencegate::serve(settings, listener, async {})
            .await
            .unwrap_err()
    );
    assert!(err.contains("a role of its own"), "{err}");
    // Without a scope, no guard (SQL writers fence a scope).
    let mut settings = fencegate::config::Settings::default();
    let mut resource = guarded("jobs", "public.jobs", FenceMode::Ledger, GuardMode::Audit);
    resource.scope = None;
    settings.resources = vec![resource];
    settings.database.url = Some(db);
    assert!(settings
        .validate()
        .unwrap_err()
        .to_string()
        .contains("guard needs scope"));
}

/// SQL writers (`fencegate.fence()` in their transaction) and HTTP writers racing on one scope,
/// with tokens drawn at random: the history must be that of one fence. Checked like the
/// concurrency suite: no write accepted with a token below one whose acceptance was
/// acknowledged before it started, and the fence ends at the highest token accepted.
#[tokio::test]
async fn sql_and_http_writers_racing_on_one_scope_share_one_fence() {
    use rand::Rng;
    let db = pg::fresh_database().await;
    let mut setup = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut setup,
        "CREATE TABLE ledger (n int PRIMARY KEY, token bigint)",
    )
    .await;
    let app = std::sync::Arc::new(spawn_app_on(db.clone(), |_| {}).await);
    app.get("/readyz").await.expect(200); // migrated: fencegate.fence() exists
    let epoch = Instant::now();
    // Concurrent on one task (join_all): the writers interleave at every await.
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (app, db) = (app.clone(), db.clone());
        tasks.push(async move {
            let mut conn = PgConnection::connect(&db).await.unwrap();
            let mut ops = Vec::new();
            for i in 0..25 {
                // Rising with jitter: some writes overtake others, some come late (stale).
                let token: i64 = i * 4 + rand::thread_rng().gen_range(1..=12);
                let start = epoch.elapsed();
                let accepted = if worker % 2 == 0 {
                    let n = worker * 100 + i;
                    let then = format!("INSERT INTO ledger VALUES ({n}, {token})");
                    match fenced_tx(&mut conn, "race", token, &then).await {
                        Ok(()) => true,
                        Err((code, message)) => {
                            assert!(
                                code == "FG412" || code == "40P01" || code == "55P03",
                                "{code}: {message}"
                            );
                            false
                        }
                    }
                } else {
                    let r = app
                        .kv_put_scoped(
                            &format!("w{worker}-{i}"),
                            &token.to_string(),
                            "race",
                            &json!(token),
                        )
                        .await;
                    assert!(matches!(r.status, 201 | 412), "{}", r.text);
                    r.status == 201
                };
                ops.push((start, epoch.elapsed(), token, accepted));
            }
            ops
        });
    }
    let history: Vec<_> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .flatten()
        .collect();
    let accepted: Vec<_> = history.iter().filter(|op| op.3).collect();
    assert!(
        accepted.len() > 8,
        "too few writes were accepted to say anything: {}",
        accepted.len()
    );
    assert!(
        accepted.len() < history.len(),
        "no write was refused: the race did not race"
    );
    for b in &accepted {
        for a in &accepted {
            assert!(
                !(a.1 < b.0 && a.2 > b.2),
                "token {} was accepted after token {} had been acknowledged ({:?} < {:?})",
                b.2,
                a.2,
                a.1,
                b.0
            );
        }
    }
    let highest = accepted.iter().map(|op| op.2).max().unwrap();
    assert_eq!(
        app.fence("race").await.expect(200)["fence_token"],
        json!(highest.to_string())
    );
    let sql_tokens: Vec<i64> = sqlx::query_scalar("SELECT token FROM ledger")
        .fetch_all(&mut setup)
        .await
        .unwrap();
    assert!(sql_tokens.iter().all(|t| *t <= highest));
}

/// Several processes starting at once on a fresh database (replicas rolled out together) all
/// come up: the schema is created once, under a lock, and not by each of them racing.
/// `CREATE SCHEMA IF NOT EXISTS` alone failed one of two processes now and then.
#[tokio::test]
async fn processes_starting_together_on_a_fresh_database_all_come_up() {
    for _ in 0..10 {
        let db = pg::fresh_database().await;
        let apps = futures::future::join_all(
            (0..6).map(|_| spawn_app_on(db.clone(), |s| s.database.max_connections = 2)),
        )
        .await;
        for (n, app) in apps.iter().enumerate() {
            app.kv_put(&format!("k{n}"), "1", &json!(n))
                .await
                .expect(201);
        }
    }
}
