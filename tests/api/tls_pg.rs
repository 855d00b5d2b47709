//! PostgreSQL over TLS (docs/operations.md, *PostgreSQL over TLS*): the libpq URL parameters
//! `sslmode`, `sslrootcert`, `sslcert`, `sslkey` and a Unix-socket host, against a throwaway
//! cluster of this module's own with `ssl = on` that refuses every TCP connection without TLS
//! (`hostnossl ... reject`), with certificates made here by `openssl`. A certificate that does
//! not verify, or a TLS file that cannot be used, stops start-up with a message naming it.
//! PostgreSQL only (tests/sqlite does not include this module).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use fencegate::config::Settings;
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};

use crate::helpers::{spawn_app_on, unique, TestApp};
use crate::support_pg::{self, Cluster, TlsFiles};

/// The role that logs in with its client certificate (`cert` in pg_hba.conf): the CN of the
/// test client certificate.
const CERT_USER: &str = "fg_cert_user";

struct TlsCluster {
    cluster: Cluster,
    dir: PathBuf,
    files: TlsFiles,
}

/// One cluster per run of this test binary: TLS on, listening on 127.0.0.1 and 127.0.0.2 (the
/// server certificate names only the first), TCP without TLS refused.
fn tls_cluster() -> &'static TlsCluster {
    static CLUSTER: OnceLock<TlsCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let bindir = support_pg::bindir(
            None,
            "PostgreSQL server binaries not found: install them (Debian: apt-get install postgresql); \
             the TLS tests start a cluster of their own",
        );
        let dir = tempfile::Builder::new().prefix("fencegate-pg-tls-").tempdir().expect("a temporary directory").keep();
        let files = TlsFiles::make(&dir.join("tls"), CERT_USER);
        let hba = format!(
            "local all all trust\n\
             hostssl all {CERT_USER} 127.0.0.0/8 cert\n\
             hostssl all all 127.0.0.0/8 trust\n\
             hostnossl all all 0.0.0.0/0 reject\n\
             hostnossl all all ::/0 reject\n"
        );
        let settings = format!(
            "-c fsync=off -c synchronous_commit=off -c max_connections=200 -c listen_addresses=127.0.0.1,127.0.0.2 {}",
            files.server_settings(&dir.join("pg_hba.conf"), &hba)
        );
        let cleanup = format!("rm -rf {}", support_pg::shell_quote(&dir));
        let cluster = Cluster::new(&bindir, &dir, &settings, &cleanup, "");
        TlsCluster { cluster, dir, files }
    })
}

impl TlsCluster {
    /// A new database (owned by the client certificate's role), made through the Unix socket.
    async fn fresh_database(&self) -> String {
        let name = format!("fg_tls_{}", uuid::Uuid::new_v4().simple());
        let mut conn = self.admin().await;
        let _ = conn
            .execute(format!("CREATE ROLE {CERT_USER} LOGIN").as_str())
            .await;
        conn.execute(format!("CREATE DATABASE {name} OWNER {CERT_USER} TEMPLATE template0 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C'").as_str())
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        name
    }

    async fn admin(&self) -> PgConnection {
        let url = self.cluster.socket_url(&self.dir, "postgres");
        PgConnection::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the TLS test cluster by its socket: {e}"))
    }

    /// `postgres://USER@HOST:PORT/DB?QUERY`
    fn url(&self, user: &str, host: &str, db: &str, query: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/{db}?{query}",
            self.cluster.port
        )
    }

    fn ca(&self) -> String {
        self.files.ca.display().to_string()
    }
}

/// fencegate refuses to start on `url`; its error, as printed.
async fn start_up_error(url: String) -> String {
    let mut settings = Settings::default();
    settings.database.url = Some(url);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        fencegate::serve(settings, listener, async {}),
    )
    .await
    .expect("start-up must fail at once, not wait");
    format!("{:#}", result.expect_err("fencegate must refuse to start"))
}

/// A fenced write and its read-back.
async fn writes(app: &TestApp) {
    let key = unique("tls");
    app.kv_put(&key, "7", &json!({"over": "tls"}))
        .await
        .expect(201);
    app.assert_value(&key, &json!({"over": "tls"}), "7").await;
}

/// `application_name` and whether TLS is on, for every connection to `db`.
async fn sessions(tls: &TlsCluster, db: &str) -> Vec<(String, bool)> {
    let mut conn = tls.admin().await;
    sqlx::query_as(
        "SELECT a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.datname = $1 ORDER BY 1",
    )
    .bind(db)
    .fetch_all(&mut conn)
    .await
    .expect("read pg_stat_ssl")
}

#[tokio::test]
async fn verify_full_with_sslrootcert_serves_writes_and_every_connection_is_tls() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let app = spawn_app_on(
        tls.url(
            "postgres",
            "127.0.0.1",
            &db,
            &format!("sslmode=verify-full&sslrootcert={}", tls.ca()),
        ),
        |_| {},
    )
    .await;
    writes(&app).await;
    // The pool's connections and the reset listener's (cloned options): all over TLS.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = sessions(tls, &db).await;
        if seen.iter().any(|(name, _)| name == "fencegate-listener") {
            assert!(seen.iter().any(|(name, _)| name == "fencegate"), "{seen:?}");
            assert!(
                seen.iter().all(|(_, ssl)| *ssl),
                "a connection without TLS: {seen:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reset listener never connected: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // By name as well as by address.
    let db = tls.fresh_database().await;
    let app = spawn_app_on(
        tls.url(
            "postgres",
            "localhost",
            &db,
            &format!("sslmode=verify-full&sslrootcert={}", tls.ca()),
        ),
        |_| {},
    )
    .await;
    writes(&app).await;
}

#[tokio::test]
async fn require_encrypts_without_checking_the_certificate() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let app = spawn_app_on(
        tls.url("postgres", "127.0.0.1", &db, "sslmode=require"),
        |_| {},
    )
    .await;
    writes(&app).await;
    // `allow` and `prefer` (the default) end up on TLS too: this server refuses anything else.
    for query in ["sslmode=allow", "sslmode=prefer", ""] {
        let db = tls.fresh_database().await;
        let app = spawn_app_on(tls.url("postgres", "127.0.0.1", &db, query), |_| {}).await;
        writes(&app).await;
    }
}

#[tokio::test]
async fn sslmode_disable_is_refused_by_the_server_and_start_up_says_so() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let msg = start_up_error(tls.url("postgres", "127.0.0.1", &db, "sslmode=disable")).await;
    assert!(msg.contains("refused a connection without TLS"), "{msg}");
    assert!(msg.contains("sslmode=disable"), "{msg}");
    assert!(
        msg.contains("sslmode=verify-full"),
        "must say what to set: {msg}"
    );
}

#[tokio::test]
async fn a_wrong_ca_stops_start_up_naming_the_ca_file() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let other = tls.files.other_ca.display().to_string();
    let msg = start_up_error(tls.url(
        "postgres",
        "127.0.0.1",
        &db,
        &format!("sslmode=verify-full&sslrootcert={other}"),
    ))
    .await;
    assert!(
        msg.contains(&format!("does not verify against sslrootcert={other}")),
        "{msg}"
    );
    assert!(msg.contains("sslmode=verify-full"), "{msg}");
    // verify-ca checks the CA just the same; require with sslrootcert is verify-ca (as in libpq).
    for mode in ["verify-ca", "require"] {
        let msg = start_up_error(tls.url(
            "postgres",
            "127.0.0.1",
            &db,
            &format!("sslmode={mode}&sslrootcert={other}"),
        ))
        .await;
        assert!(
            msg.contains(&format!("does not verify against sslrootcert={other}")),
            "{mode}: {msg}"
        );
    }
    // No sslrootcert: the bundled public roots, which did not sign this test CA.
    let msg = start_up_error(tls.url("postgres", "127.0.0.1", &db, "sslmode=verify-full")).await;
    assert!(msg.contains("no sslrootcert"), "{msg}");
}

#[tokio::test]
async fn verify_ca_checks_the_ca_and_verify_full_also_the_host_name() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let ca = tls.ca();
    // 127.0.0.2 is the same server, but its certificate names only 127.0.0.1 and localhost.
    let msg = start_up_error(tls.url(
        "postgres",
        "127.0.0.2",
        &db,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert!(
        msg.contains("not valid for the host \"127.0.0.2\""),
        "{msg}"
    );
    assert!(
        msg.contains("sslmode=verify-ca"),
        "must say what else can be done: {msg}"
    );
    let app = spawn_app_on(
        tls.url(
            "postgres",
            "127.0.0.2",
            &db,
            &format!("sslmode=verify-ca&sslrootcert={ca}"),
        ),
        |_| {},
    )
    .await;
    writes(&app).await;
}

#[tokio::test]
async fn a_client_certificate_logs_in_where_pg_hba_says_cert() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let (ca, cert, key) = (
        tls.ca(),
        tls.files.client_cert.display().to_string(),
        tls.files.client_key.display().to_string(),
    );
    let app = spawn_app_on(
        tls.url(
            CERT_USER,
            "127.0.0.1",
            &db,
            &format!("sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}"),
        ),
        |_| {},
    )
    .await;
    writes(&app).await;
    // Without one, start-up says what is missing.
    let msg = start_up_error(tls.url(
        CERT_USER,
        "127.0.0.1",
        &db,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert!(msg.contains("requires a client certificate"), "{msg}");
    assert!(msg.contains("sslcert") && msg.contains("sslkey"), "{msg}");
}

#[tokio::test]
async fn unusable_tls_files_are_named_before_connecting() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let missing = scratch.path().join("no-such-ca.crt").display().to_string();
    let not_pem = scratch.path().join("not-pem.crt");
    std::fs::write(&not_pem, "this is not a certificate\n").unwrap();
    let not_pem = not_pem.display().to_string();
    let (ca, cert, key) = (
        tls.ca(),
        tls.files.client_cert.display().to_string(),
        tls.files.client_key.display().to_string(),
    );
    let url = |query: String| tls.url(CERT_USER, "127.0.0.1", &db, &query);

    let msg = start_up_error(url(format!("sslmode=verify-full&sslrootcert={missing}"))).await;
    assert!(
        msg.contains(&format!("cannot read sslrootcert={missing}")),
        "{msg}"
    );
    let msg = start_up_error(url(format!("sslmode=verify-full&sslrootcert={not_pem}"))).await;
    assert!(
        msg.contains(&format!("sslrootcert={not_pem} holds no PEM certificate")),
        "{msg}"
    );
    let msg = start_up_error(url(format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={missing}&sslkey={key}"
    )))
    .await;
    assert!(
        msg.contains(&format!("cannot read sslcert={missing}")),
        "{msg}"
    );
    let msg = start_up_error(url(format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={not_pem}"
    )))
    .await;
    assert!(
        msg.contains(&format!("sslkey={not_pem} holds no PEM private key")),
        "{msg}"
    );
    let msg = start_up_error(url(format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={cert}"
    )))
    .await;
    assert!(
        msg.contains("sslcert") && msg.contains("without sslkey"),
        "{msg}"
    );
    let msg = start_up_error(url("sslmode=verify-everything".to_owned())).await;
    assert!(
        msg.contains("sslmode=verify-everything") && msg.contains("verify-full"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_unix_socket_host_connects_locally_whatever_the_sslmode() {
    let tls = tls_cluster();
    let db = tls.fresh_database().await;
    let app = spawn_app_on(tls.cluster.socket_url(&tls.dir, &db), |_| {}).await;
    writes(&app).await;
    // As libpq: sslmode does not apply to a Unix socket (the server never offers TLS there).
    let db = tls.fresh_database().await;
    let url = format!(
        "{}&sslmode=verify-full&sslrootcert={}",
        tls.cluster.socket_url(&tls.dir, &db),
        tls.ca()
    );
    let app = spawn_app_on(url, |_| {}).await;
    writes(&app).await;
    // The socket directory as the URL's host, percent-encoded.
    let db = tls.fresh_database().await;
    let host = tls.dir.display().to_string().replace('/', "%2F");
    let app = spawn_app_on(
        format!("postgres://postgres@{host}:{}/{db}", tls.cluster.port),
        |_| {},
    )
    .await;
    writes(&app).await;
}
