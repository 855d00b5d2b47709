//! The real binary: state lives in the database, so it survives a graceful restart.

use serde_json::json;

use crate::helpers::spawn_binary;
use crate::pg;

#[tokio::test]
async fn values_fences_and_tombstones_survive_a_restart() {
    let db = pg::fresh_database().await;

    let first = spawn_binary(&db).await;
    {
        let app = first.view();
        app.kv_put("a", "10", &json!({"v": "a"})).await.expect(201);
        app.kv_put_scoped("b", "20", "S", &json!("b"))
            .await
            .expect(201);
        app.claim("T", "30").await.expect(201);
        app.kv_put("c", "5", &json!("c")).await.expect(201);
        app.kv_delete("c", "40").await.expect(200);
    }
    let (status, stderr) = first.terminate().await;
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM must drain and exit 0 (got {status:?})\nstderr:\n{stderr}"
    );

    let second = spawn_binary(&db).await;
    let app = second.view();
    app.assert_value("a", &json!({"v": "a"}), "10").await;
    let b = app.kv_get("b").await.expect(200);
    assert_eq!(b["value"], json!("b"), "{b}");
    assert_eq!(b["scope"], json!("S"), "{b}");
    assert_eq!(
        app.fence("S").await.expect(200),
        json!({"scope": "S", "fence_token": "20"})
    );
    assert_eq!(
        app.fence("T").await.expect(200),
        json!({"scope": "T", "fence_token": "30"})
    );
    app.assert_absent("c").await;

    // The fences still bite after the restart.
    app.kv_put("a", "9", &json!("zombie"))
        .await
        .stale_key("a", "9", "10");
    app.kv_put("c", "39", &json!("zombie"))
        .await
        .stale_key("c", "39", "40");
    app.kv_put_scoped("new", "19", "S", &json!("zombie"))
        .await
        .stale_scope("S", "19", "20");
    app.kv_put_scoped("new", "29", "T", &json!("zombie"))
        .await
        .stale_scope("T", "29", "30");
    app.assert_absent("new").await;
    app.kv_put("a", "10", &json!("holder")).await.expect(200);

    let (status, stderr) = second.terminate().await;
    assert_eq!(
        status.code(),
        Some(0),
        "second process exit: {status:?}\nstderr:\n{stderr}"
    );
}

#[tokio::test]
async fn two_processes_share_one_database() {
    // fencegate is stateless: a fence raised through one process binds the other at once.
    let db = pg::fresh_database().await;
    let one = spawn_binary(&db).await;
    let two = spawn_binary(&db).await;
    let (a, b) = (one.view(), two.view());

    a.kv_put("k", "10", &json!("via one")).await.expect(201);
    b.kv_put("k", "9", &json!("zombie via two"))
        .await
        .stale_key("k", "9", "10");
    b.claim("S", "5").await.expect(201);
    a.kv_put_scoped("x", "4", "S", &json!("zombie via one"))
        .await
        .stale_scope("S", "4", "5");
    b.assert_value("k", &json!("via one"), "10").await;
}
