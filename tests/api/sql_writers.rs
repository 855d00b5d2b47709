//! SQL writers, first-class (docs/tables.md): guards that survive restarts under a role that
//! owns no application table, `fence()` only for declared roles and their prefixes, one rule
//! with HTTP (checked case by case against the HTTP write path), a guard that trusts only what
//! `fence()` recorded, and SQL refusals that are counted although their transaction rolls back.
//! Real roles on a real PostgreSQL; PostgreSQL only (tests/sqlite does not include this).

use std::time::{Duration, Instant};

use fencegate::tables::{FenceMode, GuardMode};
use reqwest::Method;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::dropin::{
    drop_roles, fenced_tx, grant, guard_ddl_from_start, guarded, guarded_setup, settings_on,
    spawn_guarded, sql, sql_role, sqlstate,
};
use crate::helpers::{spawn_app_on, TestApp, TOKEN};
use crate::pg;

const JOBS: &str =
    "CREATE TABLE jobs (id int PRIMARY KEY, owner text); INSERT INTO jobs VALUES (1, 'seed')";

/// Runs `statement` (autocommit) as `conn`: Ok, or the SQLSTATE and message.
async fn try_sql(conn: &mut PgConnection, statement: &str) -> Result<(), (String, String)> {
    let result = sqlx::raw_sql(statement)
        .execute(&mut *conn)
        .await
        .map(|_| ())
        .map_err(sqlstate);
    if result.is_err() {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
    }
    result
}

/// The SQLSTATE `statement` is refused with (it must be refused).
async fn refused(conn: &mut PgConnection, statement: &str) -> String {
    match try_sql(conn, statement).await {
        Ok(()) => panic!("{statement}: committed"),
        Err((code, _)) => code,
    }
}

/// The guard of `jobs` in `mode` (none: no guard), with the app role allowed to fence `job`.
fn jobs_guard(
    mode: Option<GuardMode>,
    app_role: &str,
) -> impl Fn(&mut fencegate::config::Settings) {
    let app_role = app_role.to_owned();
    move |s| {
        let mut resource = guarded(
            "jobs",
            "public.jobs",
            FenceMode::Ledger,
            mode.unwrap_or(GuardMode::Audit),
        );
        resource.guard = mode;
        s.resources = vec![resource];
        s.auth.roles = vec![sql_role(&app_role, &["job"])];
    }
}

/// Waits until `/metrics` has a line starting with `line`.
async fn wait_for_metric(app: &TestApp, line: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = app.get("/metrics").await.text;
        if text.lines().any(|l| l.starts_with(line)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "no {line:?} in /metrics after 30 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_guarded_table_survives_restarts_and_changes_mode_without_ddl_under_a_role_owning_no_table(
) {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(JOBS, "jobs").await;
    // First start: the trigger is missing and fencegate's role (not the owner) cannot create
    // it ALWAYS: start-up stops with the owner's DDL, which `fencegate guard sql` prints too.
    let ddl = guard_ddl_from_start(settings_on(
        &fg_url,
        jobs_guard(Some(GuardMode::Audit), &roles[1]),
    ))
    .await;
    assert_eq!(
        ddl,
        vec![
            "CREATE TRIGGER fencegate_guard BEFORE INSERT OR UPDATE OR DELETE ON public.jobs FOR EACH ROW EXECUTE FUNCTION \"fencegate\".fencegate_guard('jobs');".to_owned(),
            "ALTER TABLE public.jobs ENABLE ALWAYS TRIGGER fencegate_guard;".to_owned(),
        ]
    );
    // The owner (here the admin connection) runs it once.
    for statement in &ddl {
        sql(&mut admin, statement).await;
    }
    let mut writer = PgConnection::connect(&app_url).await.unwrap();
    // Audit, restarted twice with the same configuration.
    for _ in 0..2 {
        let app = spawn_app_on(
            fg_url.clone(),
            jobs_guard(Some(GuardMode::Audit), &roles[1]),
        )
        .await;
        app.get("/readyz").await.expect(200);
        try_sql(
            &mut writer,
            "UPDATE jobs SET owner = 'audited' WHERE id = 1",
        )
        .await
        .unwrap();
        drop(app);
    }
    // Enforce: a restart, no DDL.
    let app = spawn_app_on(
        fg_url.clone(),
        jobs_guard(Some(GuardMode::Enforce), &roles[1]),
    )
    .await;
    app.get("/readyz").await.expect(200);
    assert_eq!(
        refused(&mut writer, "UPDATE jobs SET owner = 'x' WHERE id = 1").await,
        "FG428"
    );
    let token = grant(&app, "job", 60_000).await;
    fenced_tx(
        &mut writer,
        "job",
        token,
        "UPDATE jobs SET owner = 'fenced' WHERE id = 1",
    )
    .await
    .unwrap();
    drop(app);
    // Off: the trigger stays, inert; the owner's DROP TRIGGER is only advice.
    let app = spawn_app_on(fg_url.clone(), jobs_guard(None, &roles[1])).await;
    app.get("/readyz").await.expect(200);
    try_sql(
        &mut writer,
        "UPDATE jobs SET owner = 'unguarded' WHERE id = 1",
    )
    .await
    .unwrap();
    drop(app);
    // And back to enforce, still without DDL.
    let app = spawn_app_on(
        fg_url.clone(),
        jobs_guard(Some(GuardMode::Enforce), &roles[1]),
    )
    .await;
    app.get("/readyz").await.expect(200);
    assert_eq!(
        refused(&mut writer, "DELETE FROM jobs WHERE id = 1").await,
        "FG428"
    );
    drop(app);
    drop(writer);
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn guard_sql_prints_the_owners_ddl() {
    let (mut admin, fg_url, _app_url, roles) = guarded_setup(JOBS, "jobs").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fencegate.toml");
    std::fs::write(
        &config,
        format!(
            "[[resources]]\nname = \"jobs\"\ntable = \"public.jobs\"\nkey = [\"id\"]\nscope = \"job\"\nguard = \"enforce\"\n\n\
             [[auth.roles]]\nname = \"{}\"\nprefixes = [\"job\"]\n",
            roles[1]
        ),
    )
    .unwrap();
    let run = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
            .args(["guard", "sql", "--resource", "jobs", "--config"])
            .arg(&config)
            .env("DATABASE_URL", &fg_url)
            .output()
            .unwrap()
    };
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let statements: Vec<&str> = stdout.lines().filter(|l| !l.starts_with("--")).collect();
    assert_eq!(statements.len(), 2, "{stdout}");
    for statement in statements {
        sql(&mut admin, statement).await;
    }
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("the trigger is ready; nothing to run"),
        "{stdout}"
    );
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn fence_is_executable_only_by_declared_roles_and_only_within_their_prefixes() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(JOBS, "jobs").await;
    let outsider = crate::helpers::unique("outsider").replace('-', "_");
    sql(&mut admin, &format!("CREATE ROLE {outsider} LOGIN")).await;
    let outsider_url = {
        let mut u = url::Url::parse(&app_url).unwrap();
        u.set_username(&outsider).unwrap();
        u.to_string()
    };
    let app = spawn_app_on(fg_url.clone(), |s| {
        s.auth.roles = vec![sql_role(&roles[1], &["billing/"])];
    })
    .await;
    app.get("/readyz").await.expect(200);
    // Not declared: no EXECUTE at all (not even through PUBLIC).
    let mut stranger = PgConnection::connect(&outsider_url).await.unwrap();
    let (code, message) = fenced_tx(&mut stranger, "billing/a", i64::MAX, "")
        .await
        .unwrap_err();
    assert_eq!(code, "42501", "{message}");
    // Declared: within its prefixes yes, outside FG403, and nothing was raised.
    let mut app_conn = PgConnection::connect(&app_url).await.unwrap();
    fenced_tx(&mut app_conn, "billing/a", 5, "").await.unwrap();
    let (code, message) = fenced_tx(&mut app_conn, "payroll", 9, "")
        .await
        .unwrap_err();
    assert_eq!(code, "FG403", "{message}");
    app.fence("payroll").await.expect(404);
    // A one-off command with another configuration (here none) leaves the rules and grants
    // that serving wrote alone.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("migrate")
        .env("DATABASE_URL", &fg_url)
        .env_remove("FENCEGATE_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fenced_tx(&mut app_conn, "billing/a", 5, "").await.unwrap();
    drop(app);
    // The role removed from the configuration: its EXECUTE is revoked at the next start.
    let app = spawn_app_on(fg_url.clone(), |_| {}).await;
    app.get("/readyz").await.expect(200);
    let mut app_conn = PgConnection::connect(&app_url).await.unwrap();
    let (code, _) = fenced_tx(&mut app_conn, "billing/a", 6, "")
        .await
        .unwrap_err();
    assert_eq!(code, "42501");
    let public: bool = sqlx::query_scalar(
        "SELECT has_function_privilege('public', 'fencegate.fence(text, bigint)', 'EXECUTE')",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(!public, "PUBLIC may execute fence()");
    drop(app);
    // A declared role that does not exist stops start-up, naming it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = fencegate::serve(
        settings_on(&fg_url, |s| {
            s.auth.roles = vec![sql_role("no_such_role", &[""])]
        }),
        listener,
        async {},
    )
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("no PostgreSQL role named no_such_role"),
        "{err:#}"
    );
    drop((stranger, app_conn));
    let _ = sqlx::raw_sql(&format!("DROP ROLE {outsider}"))
        .execute(&mut admin)
        .await;
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn the_guard_cannot_be_walked_around() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(JOBS, "jobs").await;
    let app = spawn_guarded(
        &mut admin,
        &fg_url,
        jobs_guard(Some(GuardMode::Enforce), &roles[1]),
    )
    .await;
    app.get("/readyz").await.expect(200);
    let mut writer = PgConnection::connect(&app_url).await.unwrap();
    // A hand-set setting is no fence: only what fence() recorded counts.
    assert_eq!(refused(&mut writer, "BEGIN; SELECT set_config('fencegate.fenced', '{\"job\": 999}', true); UPDATE jobs SET owner = 'forged' WHERE id = 1; COMMIT").await, "FG428", "a forged setting admitted a write");
    // Replica mode does not skip an ALWAYS trigger.
    sql(
        &mut admin,
        &format!(
            "GRANT SET ON PARAMETER session_replication_role TO {}",
            roles[1]
        ),
    )
    .await;
    assert_eq!(refused(&mut writer, "BEGIN; SET LOCAL session_replication_role = replica; UPDATE jobs SET owner = 'replica' WHERE id = 1; COMMIT").await, "FG428", "replica mode skipped the guard");
    // The guard's function is not anyone's to attach to a table of their own (and its counter
    // of unfenced writes cannot be grown for resources that do not exist).
    sql(
        &mut admin,
        &format!(
            "CREATE TABLE mine (id int); ALTER TABLE mine OWNER TO {}",
            roles[1]
        ),
    )
    .await;
    assert_eq!(refused(&mut writer, "CREATE TRIGGER fake BEFORE INSERT ON mine FOR EACH ROW EXECUTE FUNCTION fencegate.fencegate_guard('mine')").await, "42501");
    // Even attached by someone who may (a superuser), it does nothing for another table.
    sql(&mut admin, "CREATE TRIGGER fake BEFORE INSERT ON mine FOR EACH ROW EXECUTE FUNCTION fencegate.fencegate_guard('jobs')").await;
    try_sql(&mut writer, "INSERT INTO mine VALUES (1)")
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM fencegate.fencegate_unfenced")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    let rows: String = sqlx::query_scalar("SELECT owner FROM jobs WHERE id = 1")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(rows, "seed");
    drop((app, writer));
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn a_table_with_inheritance_children_is_refused_at_start() {
    let db = pg::fresh_database().await;
    let mut admin = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut admin,
        "CREATE TABLE jobs (id int PRIMARY KEY, owner text); CREATE TABLE old_jobs () INHERITS (jobs)",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let settings = settings_on(&db, |s| {
        s.resources = vec![crate::helpers::ledger_table("jobs", "public.jobs")]
    });
    let err = format!(
        "{:#}",
        fencegate::serve(settings, listener, async {})
            .await
            .unwrap_err()
    );
    assert!(
        err.contains("has inheritance children (public.old_jobs)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_strict_resources_scope_refuses_an_equal_token_in_sql_as_over_http() {
    let db = pg::fresh_database().await;
    let mut conn = PgConnection::connect(&db).await.unwrap();
    sql(
        &mut conn,
        "CREATE TABLE invoices (id int PRIMARY KEY, total int)",
    )
    .await;
    let app = spawn_app_on(db.clone(), |s| {
        let mut resource = crate::helpers::ledger_table("invoices", "public.invoices");
        resource.strict = true;
        resource.scope = Some("inv".into());
        s.resources = vec![resource];
    })
    .await;
    app.get("/readyz").await.expect(200); // migrated: fencegate.fence() exists
    fenced_tx(&mut conn, "inv", 7, "UPDATE invoices SET total = 1")
        .await
        .unwrap();
    // The same token again, in a new transaction: refused as HTTP refuses it.
    let (code, message) = fenced_tx(&mut conn, "inv", 7, "").await.unwrap_err();
    assert_eq!(code, "FG412");
    assert!(message.contains("is not above the fence 7"), "{message}");
    // ... but twice in one transaction is one fence.
    let mut tx = conn.begin().await.unwrap();
    for _ in 0..2 {
        sqlx::query("SELECT fencegate.fence('inv', 8)")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    // Over HTTP, the equal token: 412 naming the row as well as the scope, and "not above".
    let put = app
        .req(Method::PUT, "/v1/tables/invoices/1")
        .header(TOKEN, "8")
        .json(&json!({"total": 2}));
    let body = app.send(put).await.problem(412, "stale-token");
    assert_eq!(
        (&body["scope"], &body["resource"], &body["key"]),
        (&json!("inv"), &json!("invoices"), &json!("1")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("is not above the fence 8"), "{detail}");
    // The refusal record names them too.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = app.get("/v1/admin/refusals").await.expect(200);
        let found = records["refusals"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| {
                r["resource"] == json!("invoices")
                    && r["key"] == json!("1")
                    && r["scope"] == json!("inv")
            });
        if found {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refusal record naming the row: {records}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn sql_refusals_are_counted_although_their_transactions_roll_back() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(JOBS, "jobs").await;
    let configure = {
        let base = jobs_guard(Some(GuardMode::Enforce), &roles[1]);
        move |s: &mut fencegate::config::Settings| {
            base(s);
            s.kv.max_token_jump = 1000;
        }
    };
    let app = spawn_guarded(&mut admin, &fg_url, configure).await;
    let token = grant(&app, "job", 60_000).await;
    let mut writer = PgConnection::connect(&app_url).await.unwrap();
    fenced_tx(&mut writer, "job", token, "").await.unwrap();
    // stale, forbidden, unfenced (enforce), and a jump on a free scope (app may fence job*).
    fenced_tx(&mut writer, "job", token - 1, "")
        .await
        .unwrap_err();
    fenced_tx(&mut writer, "other", 1, "").await.unwrap_err();
    try_sql(&mut writer, "UPDATE jobs SET owner = 'x'")
        .await
        .unwrap_err();
    try_sql(&mut writer, "UPDATE jobs SET owner = 'y'")
        .await
        .unwrap_err();
    fenced_tx(&mut writer, "jobless", 5000, "")
        .await
        .unwrap_err();
    // The counts, as this server's store read them (the console's overview). /metrics is one
    // recorder for the whole test process, where other tests' servers report their own
    // databases' counts too: there, only the families are checked.
    let deadline = Instant::now() + Duration::from_secs(30);
    let overview = loop {
        let overview = app.get("/v1/admin/overview").await.expect(200);
        if overview["sql_refusals"]["unfenced"] == json!(2) {
            break overview;
        }
        assert!(
            Instant::now() < deadline,
            "the overview did not count 2 unfenced SQL writes in 30 s: {overview}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (kind, count) in [
        ("stale-token", 1),
        ("forbidden", 1),
        ("token-jump", 1),
        ("token-not-issued", 0),
    ] {
        assert_eq!(
            overview["sql_refusals"][kind],
            json!(count),
            "{kind}: {overview}"
        );
    }
    let text = wait_for_metric(&app, "fencegate_sql_refusals_total{kind=\"unfenced\"} ").await;
    for kind in ["stale-token", "forbidden", "token-jump", "token-not-issued"] {
        let family = format!("fencegate_sql_refusals_total{{kind=\"{kind}\"}} ");
        assert!(
            text.lines().any(|l| l.starts_with(&family)),
            "no {family:?} in:\n{text}"
        );
    }
    drop((app, writer));
    drop_roles(&mut admin, &roles).await;
}

#[tokio::test]
async fn a_transaction_idle_after_fence_holds_the_fence_at_most_the_idle_timeout() {
    let db = pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |s| {
        s.database.sql_fence_idle_timeout_ms = 1000;
        s.database.lock_timeout_ms = 20_000;
    })
    .await;
    app.get("/readyz").await.expect(200); // migrated: fencegate.fence() exists
                                          // A stricter bound the session already has is kept.
    let mut strict = PgConnection::connect(&db).await.unwrap();
    sqlx::raw_sql(
        "SET idle_in_transaction_session_timeout = '700ms'; BEGIN; SELECT fencegate.fence('other', 1)",
    )
    .execute(&mut strict)
    .await
    .unwrap();
    let shown: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(&mut strict)
        .await
        .unwrap();
    assert_eq!(shown, "700ms");
    drop(strict);
    let mut zombie = PgConnection::connect(&db).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT fencegate.fence('held', 1)")
        .execute(&mut zombie)
        .await
        .unwrap();
    // The zombie now sits idle in its transaction, holding the fence row. A write under the
    // scope waits for it, but no longer than the idle timeout (not the 20 s lock timeout).
    let started = Instant::now();
    app.kv_put_scoped("k", "2", "held", &json!(1))
        .await
        .expect(201);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(15),
        "the idle transaction held the fence for {waited:?}"
    );
    // The zombie's session was ended by the server: its transaction is gone.
    assert!(sqlx::query("SELECT 1").execute(&mut zombie).await.is_err());
    app.fence("held").await.expect(200);
}

/// One rule: the HTTP write path and `fence()` give the same answer to the same case (the
/// verdict's cases that a scope can meet: the rule, the fence below, at and above the token,
/// a built-in lock's latest grant, a reserved scope, the jump cap), and leave the same fence.
#[tokio::test]
async fn fence_and_http_writes_give_the_same_verdict_on_every_case() {
    for strict in [false, true] {
        let db = pg::fresh_database().await;
        let mut conn = PgConnection::connect(&db).await.unwrap();
        let app = spawn_app_on(db.clone(), |s| {
            s.kv.strict = strict;
            s.kv.max_token_jump = 100;
            s.locks.names = vec!["res/".into()];
        })
        .await;
        // (case, setup, token): each case runs on two scopes prepared alike, one written over
        // HTTP, one fenced in SQL.
        enum Setup {
            Fresh,
            Fence(u64),
            Lock(u32),
            Reserved,
        }
        let cases: Vec<(&str, Setup, i64)> = vec![
            ("fresh-0", Setup::Fresh, 0),
            ("fresh-5", Setup::Fresh, 5),
            ("fresh-jump", Setup::Fresh, 101),
            ("fence-below", Setup::Fence(10), 9),
            ("fence-equal", Setup::Fence(10), 10),
            ("fence-above", Setup::Fence(10), 11),
            ("fence-cap", Setup::Fence(10), 110),
            ("fence-jump", Setup::Fence(10), 111),
            ("lock-below", Setup::Lock(3), 2),
            ("lock-equal", Setup::Lock(3), 3),
            ("lock-unissued", Setup::Lock(3), 4),
            ("reserved-0", Setup::Reserved, 0),
            ("reserved-1", Setup::Reserved, 1),
        ];
        for (case, setup, token) in cases {
            let mut outcomes = Vec::new();
            for via in ["http", "sql"] {
                let scope = match setup {
                    Setup::Reserved => format!("res/{case}-{via}"),
                    _ => format!("{case}-{via}"),
                };
                match setup {
                    Setup::Fresh | Setup::Reserved => {}
                    Setup::Fence(f) => {
                        app.claim(&scope, &f.to_string()).await.expect(201);
                    }
                    Setup::Lock(n) => {
                        for _ in 0..n {
                            let t = grant(&app, &scope, 60_000).await;
                            let release = app
                                .req(Method::DELETE, &format!("/v1/locks/{scope}"))
                                .header(TOKEN, t.to_string());
                            app.send(release).await.expect_any(&[200, 204]);
                        }
                    }
                }
                let outcome = if via == "http" {
                    let r = app
                        .kv_put_scoped(
                            &format!("key-{case}"),
                            &token.to_string(),
                            &scope,
                            &json!(1),
                        )
                        .await;
                    match r.status {
                        200 | 201 => "accepted".to_owned(),
                        _ => r.json()["type"]
                            .as_str()
                            .unwrap_or_default()
                            .rsplit('/')
                            .next()
                            .unwrap_or_default()
                            .to_owned(),
                    }
                } else {
                    match fenced_tx(&mut conn, &scope, token, "").await {
                        Ok(()) => "accepted".to_owned(),
                        Err((code, message)) => match code.as_str() {
                            "FG412" => "stale-token".to_owned(),
                            "FG422" if message.contains("never issued") => {
                                "token-not-issued".to_owned()
                            }
                            "FG422" if message.contains("max_token_jump") => {
                                "token-jump".to_owned()
                            }
                            other => format!("{other}: {message}"),
                        },
                    }
                };
                let fence = app.fence(&scope).await;
                let fence = (fence.status == 200).then(|| fence.json()["fence_token"].clone());
                outcomes.push((outcome, fence));
            }
            assert_eq!(
                outcomes[0], outcomes[1],
                "strict = {strict}, case {case} (token {token}): HTTP then SQL"
            );
        }
    }
}

#[tokio::test]
async fn a_transaction_that_called_fence_cannot_be_prepared() {
    let db = pg::fresh_database().await;
    let app = spawn_app_on(db.clone(), |_| {}).await;
    app.get("/readyz").await.expect(200); // migrated: fencegate.fence() exists
    let mut conn = PgConnection::connect(&db).await.unwrap();
    for round in 0..2 {
        let (code, message) = try_sql(
            &mut conn,
            &format!(
                "BEGIN; SELECT fencegate.fence('prepared', 3); PREPARE TRANSACTION 'fg-{round}'"
            ),
        )
        .await
        .unwrap_err();
        assert!(message.contains("temporary objects"), "{code}: {message}");
    }
    // Nothing of it stayed: the scope was never fenced.
    app.fence("prepared").await.expect(404);
    // A caller's own temporary object of that name is refused, never read.
    let mut other = PgConnection::connect(&db).await.unwrap();
    sqlx::raw_sql("CREATE TEMP VIEW fencegate_no_prepare AS SELECT 1")
        .execute(&mut other)
        .await
        .unwrap();
    let (code, _) = fenced_tx(&mut other, "prepared", 3, "").await.unwrap_err();
    assert_eq!(code, "42P07");
}

#[tokio::test]
async fn a_partitioned_tables_guard_covers_every_partition() {
    let (mut admin, fg_url, app_url, roles) = guarded_setup(
        "CREATE TABLE events (region text, id int, what text, PRIMARY KEY (region, id)) PARTITION BY LIST (region);
         CREATE TABLE events_eu PARTITION OF events FOR VALUES IN ('eu');
         CREATE TABLE events_us PARTITION OF events FOR VALUES IN ('us');
         INSERT INTO events VALUES ('eu', 1, 'seed'), ('us', 1, 'seed')",
        "events",
    )
    .await;
    // The application's role owns the tables, as it usually does.
    sql(
        &mut admin,
        &format!(
            "ALTER TABLE events OWNER TO {app}; ALTER TABLE events_eu OWNER TO {app}; ALTER TABLE events_us OWNER TO {app};
             GRANT SELECT, INSERT, UPDATE, DELETE ON events_eu, events_us TO {fg}; GRANT CREATE ON SCHEMA public TO {app}",
            app = roles[1],
            fg = roles[0]
        ),
    )
    .await;
    let mut owner = PgConnection::connect(&app_url).await.unwrap();
    let app_role = roles[1].clone();
    let configure = move |s: &mut fencegate::config::Settings| {
        let mut resource = guarded(
            "events",
            "public.events",
            FenceMode::Ledger,
            GuardMode::Enforce,
        );
        resource.key = vec!["region".into(), "id".into()];
        s.resources = vec![resource];
        s.auth.roles = vec![sql_role(&app_role, &["job"])];
    };
    let ddl = guard_ddl_from_start(settings_on(&fg_url, &configure)).await;
    for partition in ["public.events", "public.events_eu", "public.events_us"] {
        assert!(
            ddl.contains(&format!(
                "ALTER TABLE {partition} ENABLE ALWAYS TRIGGER fencegate_guard;"
            )),
            "{ddl:?}"
        );
    }
    for statement in &ddl {
        sql(&mut owner, statement).await;
    }
    let app = spawn_app_on(fg_url.clone(), &configure).await;
    app.get("/readyz").await.expect(200);
    // The owner can still add a partition (its trigger is cloned from the table's).
    sql(
        &mut owner,
        "CREATE TABLE events_asia PARTITION OF events FOR VALUES IN ('asia')",
    )
    .await;
    let mut writer = owner;
    // Through the parent and straight into a partition: both refused without fence().
    for statement in [
        "UPDATE events SET what = 'x' WHERE id = 1",
        "UPDATE events_us SET what = 'x' WHERE id = 1",
        "INSERT INTO events_eu VALUES ('eu', 2, 'x')",
        "INSERT INTO events_asia VALUES ('asia', 1, 'x')",
    ] {
        let (code, message) = try_sql(&mut writer, statement).await.unwrap_err();
        assert_eq!(code, "FG428", "{statement}: {message}");
    }
    let token = grant(&app, "job", 60_000).await;
    fenced_tx(
        &mut writer,
        "job",
        token,
        "UPDATE events_us SET what = 'fenced' WHERE id = 1",
    )
    .await
    .unwrap();
    drop((app, writer));
    drop_roles(&mut admin, &roles).await;
}
