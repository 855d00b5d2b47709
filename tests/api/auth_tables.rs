//! Auth on legacy tables: `read`/`write` and the resource in `tables` (PostgreSQL only, as
//! every legacy-table test: not in the SQLite suite). Helpers are the auth tests' own.

use reqwest::Method;
use serde_json::json;

use fencegate::auth::ApiKeySettings;

use crate::auth::{api_key, bearer, forbidden, KeySpec, RIGHTS};
use crate::helpers::TOKEN;
use crate::pg;

/// Auth on legacy tables: `read`/`write` and the resource in `tables` (PostgreSQL only, as every
/// test in this file).
#[tokio::test]
async fn tables_need_the_right_and_the_resource() {
    let url = pg::fresh_database().await;
    {
        use sqlx::Connection;
        let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("CREATE TABLE orders (id bigint PRIMARY KEY, note text); CREATE TABLE other (id bigint PRIMARY KEY)")
            .execute(&mut db)
            .await
            .unwrap();
    }
    let resource = |name: &str| crate::helpers::ledger_table(name, name);
    let all: &[&str] = &[""];
    let orders: &[&str] = &["orders"];
    let keys: Vec<KeySpec<'_>> = RIGHTS
        .iter()
        .map(|r| (*r, std::slice::from_ref(r), all, orders))
        .collect();
    let made: Vec<(String, ApiKeySettings)> = keys
        .iter()
        .map(|(n, r, p, t)| api_key(n, r, p, t))
        .collect();
    let secret = |name: &str| made.iter().find(|(_, s)| s.name == name).unwrap().0.clone();
    let settings: Vec<ApiKeySettings> = made.iter().map(|(_, s)| s.clone()).collect();
    let app = crate::helpers::spawn_app_on(url, |s| {
        s.auth.keys = settings;
        s.resources = vec![resource("orders"), resource("other")];
        s.database.max_connections = 4;
    })
    .await;
    let row = json!({"note": "x"});
    let mut id = 0;
    for who in RIGHTS {
        let key = secret(who);
        id += 1;
        let path = format!("/v1/tables/orders/{id}");
        let write = |method: Method| bearer(app.req(method, &path), &key).header(TOKEN, "1");
        let allowed_write = who == "write" || who == "admin";
        let allowed_read = who == "read" || who == "admin";
        let resp = app.send(write(Method::PUT).json(&row)).await;
        if allowed_write {
            resp.expect(201);
        } else {
            forbidden(&resp, "write", "resource", "orders");
            app.send(
                bearer(app.req(Method::PUT, &path), &secret("admin"))
                    .header(TOKEN, "1")
                    .json(&row),
            )
            .await
            .expect(201);
        }
        let resp = app.send(write(Method::PATCH).json(&row)).await;
        if allowed_write {
            resp.expect(200);
        } else {
            forbidden(&resp, "write", "resource", "orders");
        }
        let resp = app.send(bearer(app.req(Method::GET, &path), &key)).await;
        if allowed_read {
            resp.expect(200);
        } else {
            forbidden(&resp, "read", "resource", "orders");
        }
        let resp = app.send(write(Method::DELETE)).await;
        if allowed_write {
            resp.expect(200);
        } else {
            forbidden(&resp, "write", "resource", "orders");
            // Refused: the row is still there.
            app.send(bearer(app.req(Method::GET, &path), &secret("admin")))
                .await
                .expect(200);
        }
        // A resource not in `tables`: refused for everyone but admin.
        let resp = app
            .send(
                bearer(
                    app.req(Method::PUT, &format!("/v1/tables/other/{id}")),
                    &key,
                )
                .header(TOKEN, "1")
                .json(&json!({})),
            )
            .await;
        if who == "admin" {
            resp.expect(201);
        } else if who == "write" {
            forbidden(&resp, "write", "resource", "other");
        } else {
            resp.problem(403, "forbidden");
        }
        // A batch with a table op needs the resource too.
        let body = json!({"ops": [{"op": "put", "resource": "other", "key": format!("{}", id + 100), "row": {}}]});
        let resp = app
            .send(
                bearer(app.req(Method::POST, "/v1/batch"), &key)
                    .header(TOKEN, "1")
                    .json(&body),
            )
            .await;
        if who == "admin" {
            resp.expect(200);
        } else {
            resp.problem(403, "forbidden");
        }
    }
}
