//! The console page in chromium: it loads with no console error, shows a lock and its holder,
//! shows a write refused after it loaded within seconds, plays the zombie scenario to the 412
//! from the keyboard, fits a phone's width, and with auth on asks for a credential it keeps
//! only for the tab. Screenshots go to target/console.png and target/console-phone.png.

use std::time::{Duration, Instant};

use fantoccini::{
    actions::{InputSource, KeyAction, KeyActions},
    key::Key,
};
use reqwest::Method;
use serde_json::json;

use crate::browser::{target_dir, Browser};
use crate::helpers::{enc, spawn_app, spawn_app_with, TestApp, TOKEN};

async fn acquire(app: &TestApp, name: &str, owner: &str, ttl_ms: u64) -> String {
    let body = app
        .send(
            app.req(Method::POST, &format!("/v1/locks/{}", enc(name)))
                .json(&json!({"owner": owner, "ttl_ms": ttl_ms})),
        )
        .await
        .expect(201);
    body["token"].as_str().unwrap().to_owned()
}

/// A string as a JavaScript literal.
fn js_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// `document.querySelector` of `selector`, with `attr` = `value` (quoted).
fn query(selector: &str, attr: &str, value: &str) -> String {
    format!(
        "document.querySelector({})",
        js_str(&format!("{selector}[{attr}={}]", js_str(value)))
    )
}

/// Waits for the page's event stream to be open ("live").
async fn connected(browser: &Browser) {
    let live = "return document.getElementById('status').dataset.kind === 'ok'";
    browser
        .until(Duration::from_secs(10), "the event stream connected", live)
        .await;
}

async fn press(browser: &Browser, key: Key) {
    let c: char = key.into();
    let keys = KeyActions::new("keyboard".into())
        .then(KeyAction::Down { value: c })
        .then(KeyAction::Up { value: c });
    browser
        .client
        .perform_actions(keys)
        .await
        .expect("key press");
}

#[tokio::test]
async fn the_console_shows_fencing_live_and_plays_the_zombie_scenario() {
    let app = spawn_app().await;
    // The server is this test's alone (its own database): plain names.
    let lock = "billing-nightly".to_owned();
    let token = acquire(&app, &lock, "billing-worker-7", 120_000).await;
    // Something to draw before the page opens: accepted and refused writes.
    let warm = "invoice-1042";
    app.kv_put_scoped(
        &enc(&format!("{lock}/{warm}")),
        &token,
        &enc(&lock),
        &json!({"total": 12}),
    )
    .await
    .expect(201);

    // Traffic for the chart while the test runs: a worker writing orders ~5/s, and a zombie
    // of an older token refused about once a second.
    let traffic = {
        let (client, address) = (app.client.clone(), app.address.clone());
        tokio::spawn(async move {
            for n in 1u64.. {
                let put = |key: String, token: u64| {
                    client
                        .put(format!("{address}/v1/kv/{key}"))
                        .header(TOKEN, token.to_string())
                        .json(&json!({"n": n}))
                        .send()
                };
                let _ = put(format!("orders%2F{}", n % 7), 100 + n).await;
                if n % 5 == 0 {
                    let _ = put(format!("orders%2F{}", n % 7), 90).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    let browser = Browser::start(1280, 1000).await;
    browser
        .client
        .goto(&format!("{}/ui", app.address))
        .await
        .expect("open /ui");
    assert_eq!(browser.client.title().await.unwrap(), "fencegate console");

    // The lock, its holder and its token, with the lease counting down.
    let row = query("#locks tr", "data-lock", &lock);
    browser
        .until(
            Duration::from_secs(10),
            "the lock's row",
            &format!("return {row} !== null"),
        )
        .await;
    let holder = browser
        .js(&format!(
            "return {row}.querySelector('.holder').textContent"
        ))
        .await;
    assert_eq!(holder, "billing-worker-7");
    assert_eq!(
        browser
            .js(&format!("return {row}.querySelector('.token').textContent"))
            .await,
        token.as_str()
    );
    let left = format!("return {row}.querySelector('progress').value");
    let first = browser.js(&left).await.as_f64().unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = browser.js(&left).await.as_f64().unwrap();
    assert!(
        later < first && first <= 120_000.0 && later > 100_000.0,
        "the lease counts down: {first} then {later}"
    );
    connected(&browser).await;
    let errors = browser.errors().await;
    assert!(
        errors.is_empty(),
        "console errors while loading the page: {errors:#?}"
    );

    // Names come from clients: a right-to-left override or a zero-width space is shown as
    // ⟨U+XXXX⟩, never rendered (a look-alike of another name).
    let spoof = "billing\u{202E}ylthgin".to_owned();
    acquire(&app, &spoof, "worker\u{200B}7", 120_000).await;
    let row = query("#locks tr", "data-lock", &spoof);
    browser
        .until(
            Duration::from_secs(10),
            "the look-alike lock's row",
            &format!("return {row} !== null"),
        )
        .await;
    let shown = browser.js(&format!("return [{row}.querySelector('.name').textContent, {row}.querySelector('.holder').textContent]")).await;
    assert_eq!(shown, json!(["billing⟨U+202E⟩ylthgin", "worker⟨U+200B⟩7"]));

    // A write refused after the page loaded shows within a few seconds, presented vs current.
    let key = "ledger/2026-11".to_owned();
    app.kv_put(&enc(&key), "41", &json!(1)).await.expect(201);
    let refused_at = Instant::now();
    app.kv_put(&enc(&key), "40", &json!(1))
        .await
        .problem(412, "stale-token");
    let refusal = query("#refusals tr", "data-key", &key);
    browser
        .until(
            Duration::from_secs(5),
            "the refused write",
            &format!("return {refusal} !== null"),
        )
        .await;
    let shown_in = refused_at.elapsed();
    let cells = browser
        .js(&format!(
            "const r = {refusal}; return [r.dataset.kind, r.querySelector('.presented').textContent, r.querySelector('.current').textContent]"
        ))
        .await;
    assert_eq!(cells, json!(["stale", "40", "41"]));
    eprintln!("the refused write was on the page {shown_in:?} after the 412");

    // The chart is drawn: accepted and refused series over the last minutes.
    browser
        .until(
            Duration::from_secs(5),
            "a refused write on the chart",
            "return document.querySelectorAll('#chart polyline.series').length === 2 && Number(document.getElementById('rate-refused').textContent) >= 0 \
             && document.querySelector('#chart polyline.refused').getAttribute('points').split(' ').some(p => Number(p.split(',')[1]) < 130)",
        )
        .await;

    // The scenario, from the keyboard: Tab to the button, Enter.
    browser
        .js("document.activeElement.blur(); window.scrollTo(0, 0); return true")
        .await;
    let mut focused = false;
    for _ in 0..40 {
        press(&browser, Key::Tab).await;
        if browser
            .js("return document.activeElement && document.activeElement.id === 'play'")
            .await
            == json!(true)
        {
            focused = true;
            break;
        }
    }
    assert!(focused, "the play button is reachable with Tab");
    press(&browser, Key::Enter).await;
    let stale = browser
        .until(
            Duration::from_secs(20),
            "the zombie's 412 on the timeline",
            "const li = document.querySelector('#timeline li[data-status=\"412\"]'); return li && li.textContent",
        )
        .await;
    let stale = stale.as_str().unwrap().to_owned();
    assert!(
        stale.contains("old token") && stale.contains("presented"),
        "{stale}"
    );
    browser
        .until(
            Duration::from_secs(10),
            "the scenario's end",
            "return document.getElementById('play').disabled === false",
        )
        .await;
    let steps = browser
        .js("return [...document.querySelectorAll('#timeline li')].map(li => li.dataset.status)")
        .await;
    assert_eq!(
        steps,
        json!(["", "201", "201", "", "201", "200", "412", "200"]),
        "acquire, write, freeze, take over, write, zombie, release"
    );
    // The zombie's refusal also came through the event stream into the table: stale against
    // the scope's fence, which B's grant raised.
    let scope = browser
        .until(
            Duration::from_secs(5),
            "the zombie's refusal in the table",
            "const r = [...document.querySelectorAll('#refusals tbody tr')].find(r => r.dataset.scope === 'fencegate-console-demo'); \
             return r && r.dataset.kind === 'stale' && r.dataset.scope",
        )
        .await;
    // B's write stands, through the public API.
    let stored = app
        .kv_get(&enc(&format!("{}/report", scope.as_str().unwrap())))
        .await
        .expect(200);
    assert_eq!(stored["value"]["by"], "B");

    // The only errors the browser logged since: the zombie's refused write (a 412 is a failed
    // request to chromium), nothing else.
    let errors = browser.errors().await;
    assert!(
        errors
            .iter()
            .all(|e| e.contains("/v1/kv/fencegate-console-demo") && e.contains("412")),
        "console errors: {errors:#?}"
    );

    // The whole page in one picture.
    let height = browser
        .js("return document.documentElement.scrollHeight")
        .await
        .as_u64()
        .unwrap() as u32;
    browser
        .client
        .set_window_size(1280, height + 140)
        .await
        .expect("resize");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let png = browser.client.screenshot().await.expect("a screenshot");
    let path = target_dir().join("console.png");
    std::fs::create_dir_all(target_dir()).unwrap();
    std::fs::write(&path, &png).unwrap();
    eprintln!("screenshot: {}", path.display());

    // A phone's width: nothing wider than the screen.
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("resize");
    browser.js("window.scrollTo(0, 0); return true").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (scroll, inner) = (
        browser
            .js("return document.documentElement.scrollWidth")
            .await
            .as_f64()
            .unwrap(),
        browser
            .js("return window.innerWidth")
            .await
            .as_f64()
            .unwrap(),
    );
    assert!(
        scroll <= inner + 1.0,
        "the page is {scroll}px wide on a {inner}px screen"
    );
    let png = browser.client.screenshot().await.expect("a screenshot");
    std::fs::write(target_dir().join("console-phone.png"), &png).unwrap();
    let errors = browser.errors().await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    traffic.abort();
    browser.close().await;
}

#[tokio::test]
async fn with_auth_on_the_page_asks_for_a_credential_and_keeps_it_for_the_tab() {
    let secret = fencegate::auth::new_key().unwrap();
    let app = spawn_app_with(|s| {
        s.auth.keys = vec![fencegate::auth::ApiKeySettings {
            name: "ops".into(),
            sha256: fencegate::auth::digest_hex(&secret),
            rights: vec!["admin".into()],
            prefixes: vec![String::new()],
            tables: vec![],
        }];
    })
    .await;
    let lock = "payroll".to_owned();
    let bearer = format!("Bearer {secret}");
    app.send(
        app.req(Method::POST, &format!("/v1/locks/{lock}"))
            .header("authorization", &bearer)
            .json(&json!({"owner": "payroll-runner", "ttl_ms": 60_000})),
    )
    .await
    .expect(201);

    let browser = Browser::start(1024, 900).await;
    browser
        .client
        .goto(&format!("{}/ui", app.address))
        .await
        .expect("open /ui");
    browser
        .until(
            Duration::from_secs(10),
            "the credential form",
            "return !document.getElementById('login').hidden",
        )
        .await;
    // The 401s of the first requests are the only errors.
    let errors = browser.errors().await;
    assert!(errors.iter().all(|e| e.contains("401")), "{errors:#?}");

    // A wrong credential is refused and the form stays.
    let field = browser
        .client
        .find(fantoccini::Locator::Id("credential"))
        .await
        .unwrap();
    field.send_keys("not-a-key").await.unwrap();
    press(&browser, Key::Enter).await;
    browser
        .until(
            Duration::from_secs(10),
            "the refusal of a wrong key",
            "return document.getElementById('login-error').textContent",
        )
        .await;
    let field = browser
        .client
        .find(fantoccini::Locator::Id("credential"))
        .await
        .unwrap();
    field.send_keys(&secret).await.unwrap();
    press(&browser, Key::Enter).await;
    let row = query("#locks tr", "data-lock", &lock);
    browser
        .until(
            Duration::from_secs(10),
            "the lock, read with the credential",
            &format!("return {row} !== null"),
        )
        .await;
    assert_eq!(
        browser
            .js(&format!(
                "return {row}.querySelector('.holder').textContent"
            ))
            .await,
        "payroll-runner"
    );
    connected(&browser).await;
    // The stream carries the bearer too: a refusal made now shows.
    let key = "payslip-7".to_owned();
    let put = |token: &str| {
        app.req(Method::PUT, &format!("/v1/kv/{key}"))
            .header("authorization", &bearer)
            .header(TOKEN, token)
            .json(&json!(1))
    };
    app.send(put("7")).await.expect(201);
    app.send(put("6")).await.problem(412, "stale-token");
    browser
        .until(
            Duration::from_secs(5),
            "the refusal, streamed with the credential",
            &format!(
                "return {} !== null",
                query("#refusals tr", "data-key", &key)
            ),
        )
        .await;
    // Kept for the tab only.
    assert_eq!(
        browser
            .js("return sessionStorage.getItem('fencegate.credential')")
            .await,
        secret.as_str()
    );
    assert_eq!(browser.js("return localStorage.length").await, 0);
    assert_eq!(browser.js("return document.cookie").await, "");
    browser.close().await;
}
