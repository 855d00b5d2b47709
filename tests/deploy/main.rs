//! The deployment files (deploy/) are checked by the tools that will read them: Prometheus'
//! `promtool` (the alert rules parse, and each alert fires on what it is about:
//! deploy/prometheus/alerts.test.yml), `systemd-analyze verify` (the unit), and the dashboard
//! and alerts name only metric families fencegate exports (described in src/telemetry.rs).
//!
//! Nothing here skips: without promtool (Debian: prometheus) or systemd-analyze (systemd) the
//! tests fail and say what to install.

use std::{path::Path, process::Command};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn tool(name: &str, package: &str) -> String {
    let found = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_default();
    found.map(|p| p.display().to_string()).unwrap_or_else(|| {
        panic!("{name} not found: install it (Debian: apt-get install {package})")
    })
}

fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_parse_and_fire_on_what_they_are_about() {
    let promtool = tool("promtool", "prometheus");
    let dir = Path::new(ROOT).join("deploy/prometheus");
    let checked = run(&promtool, &["check", "rules", "alerts.yml"], &dir);
    assert!(checked.contains("SUCCESS"), "{checked}");
    run(&promtool, &["test", "rules", "alerts.test.yml"], &dir);
}

#[test]
fn the_systemd_unit_verifies() {
    let analyze = tool("systemd-analyze", "systemd");
    // verify checks that ExecStart's program exists: point it at this build's binary.
    let unit =
        std::fs::read_to_string(Path::new(ROOT).join("deploy/systemd/fencegate.service")).unwrap();
    let unit = unit.replace("/usr/local/bin/fencegate", env!("CARGO_BIN_EXE_fencegate"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fencegate.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Only complaints about this unit count (a container's own units may not verify).
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("fencegate.service"))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify:\n{text}"
    );
}

/// Every `fencegate_*` name in the dashboard and the alerts is a family fencegate describes
/// (`_bucket`/`_sum`/`_count` of a histogram included).
#[test]
fn the_dashboard_and_alerts_name_only_exported_metrics() {
    let telemetry = std::fs::read_to_string(Path::new(ROOT).join("src/telemetry.rs")).unwrap();
    let described: Vec<String> = telemetry
        .split("describe_")
        .skip(1)
        .filter_map(|s| s.split('"').nth(1).map(str::to_owned))
        .filter(|n| n.starts_with("fencegate_"))
        .collect();
    assert!(described.len() > 10, "{described:?}");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("deploy/grafana/fencegate.json")).unwrap(),
    )
    .unwrap();
    assert!(dashboard["panels"].as_array().unwrap().len() >= 6);
    let alerts =
        std::fs::read_to_string(Path::new(ROOT).join("deploy/prometheus/alerts.yml")).unwrap();
    let text = format!("{dashboard}\n{alerts}");
    let mut named = 0;
    for word in text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("fencegate_"))
    {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| word.strip_suffix(s))
            .filter(|f| described.iter().any(|d| d == f));
        let family = family.unwrap_or(word);
        assert!(
            described.iter().any(|d| d == family),
            "{word} is not a metric fencegate exports ({described:?})"
        );
        named += 1;
    }
    assert!(named > 10);
}
