//! The client commands over https:// (docs/api.md, *The command line as a client*): `--cacert`,
//! `--cert` and `--key` (env `FENCEGATE_CACERT`, `FENCEGATE_CERT`, `FENCEGATE_KEY`), against an
//! HTTPS server that asks for a client certificate (`openssl s_server -www -Verify`, which
//! answers every GET with a page naming the certificate it was shown), with certificates made
//! here by `openssl`. Bad files are named before anything is sent (exit 2); a certificate that
//! does not verify, either way, is said so (exit 1).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support_pg::{free_port, TlsFiles};

const BIN: &str = env!("CARGO_BIN_EXE_fencegate");

/// `openssl s_server` on 127.0.0.1 with the test server certificate, requiring a client
/// certificate signed by the test CA; returns it once it accepts, and its https:// URL.
async fn https_server(files: &TlsFiles) -> (Child, String) {
    let port = free_port();
    let mut child = Command::new("openssl")
        .args([
            "s_server",
            "-www",
            "-Verify",
            "1",
            "-accept",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("-cert")
        .arg(&files.server_cert)
        .arg("-key")
        .arg(&files.server_key)
        .arg("-CAfile")
        .arg(&files.ca)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("cannot run `openssl s_server`: install openssl (Debian: apt-get install openssl)");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("ACCEPT") {
                return true;
            }
        }
        false
    });
    assert!(
        ready.await.unwrap_or(false),
        "openssl s_server did not start"
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("https://127.0.0.1:{port}"))
}

/// `fencegate kv get k` against `url` with `args` and `env`: exit status, stdout, stderr.
async fn kv_get(url: &str, args: &[&str], env: &[(&str, &Path)]) -> (Option<i32>, String, String) {
    let mut command = Command::new(BIN);
    command
        .args(["kv", "get", "k", "--url", url, "--timeout-ms", "10000"])
        .args(args)
        .env_remove("FENCEGATE_CACERT")
        .env_remove("FENCEGATE_CERT")
        .env_remove("FENCEGATE_KEY")
        .env_remove("FENCEGATE_API_KEY")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (name, value) in env {
        command.env(name, value);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("fencegate kv get hung")
        .expect("run fencegate");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[tokio::test]
async fn cacert_cert_and_key_reach_an_https_server_that_checks_them() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let files = TlsFiles::make(&dir.path().join("tls"), "billing-worker");
    let (_server, url) = https_server(&files).await;

    // The server was shown the client certificate (its status page names it).
    let (code, out, err) = kv_get(
        &url,
        &[
            "--cacert",
            s(&files.ca),
            "--cert",
            s(&files.client_cert),
            "--key",
            s(&files.client_key),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("CN=billing-worker") || out.contains("CN = billing-worker"),
        "the server saw no client certificate: {out}"
    );
    // The same from the environment.
    let env = [
        ("FENCEGATE_CACERT", files.ca.as_path()),
        ("FENCEGATE_CERT", &files.client_cert),
        ("FENCEGATE_KEY", &files.client_key),
    ];
    let (code, out, err) = kv_get(&url, &[], &env).await;
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");

    // No client certificate: the server refuses, and the message says what to give.
    let (code, _, err) = kv_get(&url, &["--cacert", s(&files.ca)], &[]).await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("client certificate") && err.contains("--cert"),
        "{err}"
    );

    // A CA that did not sign the server's certificate; no CA at all (the public roots).
    let (code, _, err) = kv_get(
        &url,
        &[
            "--cacert",
            s(&files.other_ca),
            "--cert",
            s(&files.client_cert),
            "--key",
            s(&files.client_key),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "does not verify against --cacert {}",
            s(&files.other_ca)
        )),
        "{err}"
    );
    let (code, _, err) = kv_get(
        &url,
        &[
            "--cert",
            s(&files.client_cert),
            "--key",
            s(&files.client_key),
        ],
        &[],
    )
    .await;
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("bundled public root CAs") && err.contains("--cacert"),
        "{err}"
    );
}

#[tokio::test]
async fn unusable_tls_files_are_named_and_nothing_is_sent() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let files = TlsFiles::make(&dir.path().join("tls"), "billing-worker");
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not PEM\n").unwrap();
    // Nothing listens there: each answer below comes before any connection.
    let url = "https://127.0.0.1:1";
    let cases: [(&[&str], String); 6] = [
        (
            &["--cacert", s(&missing)],
            format!("cannot read --cacert {}", s(&missing)),
        ),
        (
            &["--cacert", s(&not_pem)],
            format!("--cacert {} holds no PEM certificate", s(&not_pem)),
        ),
        (
            &["--cert", s(&files.client_cert)],
            format!("--cert {} needs its private key", s(&files.client_cert)),
        ),
        (
            &["--key", s(&files.client_key)],
            format!("--key {} needs its certificate", s(&files.client_key)),
        ),
        (
            &["--cert", s(&not_pem), "--key", s(&files.client_key)],
            format!("--cert {} holds no PEM certificate", s(&not_pem)),
        ),
        (
            &[
                "--cert",
                s(&files.client_cert),
                "--key",
                s(&files.client_cert),
            ],
            format!(
                "--key {} holds no unencrypted PEM private key",
                s(&files.client_cert)
            ),
        ),
    ];
    for (args, expected) in cases {
        let (code, _, err) = kv_get(url, args, &[]).await;
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&expected),
            "{args:?}: expected {expected:?} in {err}"
        );
    }
}
