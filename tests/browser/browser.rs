//! A headless chromium behind a chromedriver this test starts on a free port, and the browser's
//! console log (chromedriver's `goog:loggingPrefs` + `POST /session/{id}/se/log`).

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{wd::WebDriverCompatibleCommand, Client, ClientBuilder};
use serde_json::{json, Value};

const INSTALL: &str =
    "install them: apt-get install -y chromium chromium-driver (Debian), or run .ci/run";

/// One browser at a time in this process: two would share 2 CPUs with the server under test.
/// (An async mutex: each test has its own runtime, and the turn is held across awaits.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A chromedriver process and a session in a fresh headless chromium profile.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

fn find(names: &[&str], fixed: &[&str]) -> Option<PathBuf> {
    for path in fixed {
        if Path::new(path).exists() {
            return Some(PathBuf::from(path));
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.exists())
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a `width`x`height` window.
    pub async fn start(width: u32, height: u32) -> Browser {
        let turn = ONE_AT_A_TIME.lock().await;
        let chromium = find(
            &["chromium", "chromium-browser", "google-chrome"],
            &["/usr/bin/chromium"],
        )
        .unwrap_or_else(|| {
            panic!(
                "no chromium found (looked for /usr/bin/chromium and chromium on PATH); {INSTALL}"
            )
        });
        let chromedriver = find(&["chromedriver"], &["/usr/bin/chromedriver"])
            .unwrap_or_else(|| panic!("no chromedriver found (looked for /usr/bin/chromedriver and on PATH); {INSTALL}"));
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().unwrap().port()
        };
        let driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", chromedriver.display()));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let http = reqwest::Client::new();
        loop {
            let ready = http
                .get(format!("{url}/status"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success());
            if ready.is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on {url} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().expect("a temporary profile directory");
        let mut args = vec![
            "--headless=new".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-extensions".to_owned(),
            "--no-first-run".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        // chromium's sandbox refuses to run as root (CI runs as root).
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if root {
            args.push("--no-sandbox".to_owned());
        }
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let Value::Object(caps) = caps else {
            unreachable!()
        };
        let mut driver = driver;
        let client =
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(caps)
                .connect(&url)
                .await
            {
                Ok(client) => client,
                Err(err) => {
                    let _ = driver.kill();
                    panic!("chromedriver could not start {}: {err}", chromium.display());
                }
            };
        Browser {
            client,
            driver,
            _profile: profile,
            _turn: turn,
        }
    }

    /// The browser's console entries since the last call: (level, source-prefixed message).
    pub async fn console(&self) -> Vec<(String, String)> {
        let logs = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("chromedriver's browser log");
        logs.as_array()
            .expect("a log is a list")
            .iter()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or("").to_owned(),
                    e["message"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// The console's errors since the last call.
    pub async fn errors(&self) -> Vec<String> {
        self.console()
            .await
            .into_iter()
            .filter(|(level, _)| level == "SEVERE")
            .map(|(_, m)| m)
            .collect()
    }

    /// Evaluates `script` (a function body: `return ...`).
    pub async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits up to `within` for `script` to return a truthy value; returns it.
    pub async fn until(&self, within: Duration, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.js(script).await;
            let truthy =
                !matches!(&v, Value::Null | Value::Bool(false)) && v != json!("") && v != json!(0);
            if truthy {
                return v;
            }
            if Instant::now() >= deadline {
                let body = self.js("return document.body.innerText").await;
                panic!(
                    "{what}: not seen within {within:?}\nthe page shows:\n{}",
                    body.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// chromedriver's log endpoint (not in the W3C spec; chromedriver serves it in W3C mode).
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base: &url::Url,
        session: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base.join(&format!("session/{}/se/log", session.unwrap_or_default()))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.to_owned()))
    }
}

/// `target/` of this build (where `cargo test` writes), for artefacts people look at.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}
