//! The OpenAPI document says exactly what the server enforces: schemathesis (the property-based
//! API tester, PyPI) generates requests from `/openapi.json`, valid and invalid, and checks
//! each answer against the document: no 5xx, only documented statuses, content types, headers
//! and bodies, valid data accepted and invalid data refused. A real server with auth on (an
//! admin key and a write key), on PostgreSQL; a fixed seed and a bounded number of examples,
//! so a run is the same every time and stays within about two minutes on a loaded 2-core
//! machine. Any finding fails the test, with schemathesis's report.

use std::{path::Path, process::Command};

use crate::helpers::spawn_app_with;

/// Examples per operation and phase: enough to reach every parameter's edges (the coverage
/// phase adds the boundary values of each schema on top).
const EXAMPLES: &str = "25";
const SEED: &str = "20261127";

/// What schemathesis would call a finding but is fencegate's documented behaviour, each with
/// its reason. Nothing else is excluded.
///
/// - Fenced writes answer 412 to a token below the fence (stale) and 422 to a token a built-in
///   lock never issued: the generator writes one key or scope with several tokens, and the
///   document cannot say which token is current. Both are the contract (docs/api.md).
/// - Retiring a lock twice is 400 "retired already" (docs/api.md), and a generated name is
///   often retired by an earlier example.
/// - `/v1/admin/events` is a stream that does not end; its status and content type are
///   checked by `openapi::every_documented_operation_is_served_with_a_documented_status`.
/// - Strings are generated as ASCII (`--generation-codec ascii`): fencegate's limits count
///   UTF-8 bytes and JSON Schema's `maxLength` counts characters (each description says so),
///   which agree only on ASCII. Control characters are still generated.
/// - No `\u0000` in generated strings (`--generation-allow-x00 false`): PostgreSQL's jsonb
///   cannot store it, a value holding one is refused 400, as the body's description says, and
///   JSON Schema has no way to say "anywhere inside any value".
const CONFIG: &str = r#"
[[operations]]
include-operation-id-regex = "^(kv_put|kv_delete|batch|fence_claim|table_put|table_patch|table_delete)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "412", "422", "429", "5xx"]

[[operations]]
include-operation-id = "retire_lock"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]
"#;

const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_schema_conformance,response_headers_conformance,\
                      negative_data_rejection,positive_data_acceptance";

/// `st`, or a failure that says how to install it.
fn schemathesis() -> String {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/schemathesis-venv/bin/st");
    if venv.exists() {
        return venv.display().to_string();
    }
    match Command::new("st").arg("--version").output() {
        Ok(out) if out.status.success() => "st".into(),
        _ => panic!(
            "schemathesis is not installed: run tests/run.sh (it installs it), or: pip install schemathesis"
        ),
    }
}

#[tokio::test]
async fn the_document_holds_against_schemathesis() {
    let st = schemathesis();
    let admin = fencegate::auth::new_key().unwrap();
    let writer = fencegate::auth::new_key().unwrap();
    let key = |name: &str, secret: &str, rights: &[&str]| fencegate::auth::ApiKeySettings {
        name: name.into(),
        sha256: fencegate::auth::digest_hex(secret),
        rights: rights.iter().map(|r| r.to_string()).collect(),
        prefixes: vec![String::new()],
        tables: vec![],
    };
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![
            key("admin", &admin, &["admin"]),
            key("writer", &writer, &["read", "write", "lock", "fence"]),
        ];
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("schemathesis.toml"), CONFIG).unwrap();
    // Every operation with the admin key, then the data operations with the write key (whose
    // admin calls must be 403, which the document says too).
    for (secret, only) in [
        (&admin, None),
        (&writer, Some("^/v1/(kv|batch|fences|locks)")),
    ] {
        let mut command = Command::new(&st);
        command
            .current_dir(dir.path())
            .args(["--config-file", "schemathesis.toml", "--no-color", "run"])
            .arg(format!("{}/openapi.json", app.address))
            .args([
                "--checks", CHECKS, "--seed", SEED, "-n", EXAMPLES, "-w", "1",
            ])
            .args([
                "--generation-codec",
                "ascii",
                "--generation-allow-x00",
                "false",
            ])
            .args(["--generation-database", "none", "--request-timeout", "30"])
            .args(["--exclude-path", "/v1/admin/events"])
            .args(["-H", &format!("Authorization: Bearer {secret}")]);
        if let Some(paths) = only {
            command.args(["--include-path-regex", paths]);
        }
        // The server runs on this test's runtime: wait for schemathesis off it.
        let out = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .expect("run schemathesis");
        let report = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "schemathesis found the document and the server disagreeing:\n{report}"
        );
        assert!(
            report.contains(" passed") && !report.contains(" failed"),
            "schemathesis ran no test, or reported a failure:\n{report}"
        );
    }
}
