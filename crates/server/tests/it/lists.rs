//! The lists: `GET /v1/products` (admin) and `GET /v1/orders` (a buyer's own; anyone's
//! with the admin token), a page at a time with cursors, each page one indexed query.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{as_buyer, buy_as, code, jwt_buyers, order_id, TestApp, ADMIN_TOKEN};
use crate::invariants;

/// Orders of the buyer whose list is paged.
const ORDERS: i64 = 5;

async fn get(app: &TestApp, path: &str, auth: &str) -> (StatusCode, Value) {
    let (s, b, _) = app
        .send_with(Method::GET, path, None, &[("authorization", auth)])
        .await;
    (s, b)
}

/// One unit of product 9611 for `auth`'s buyer: the new order's id.
async fn buy(app: &TestApp, auth: &str, request_id: &str) -> i64 {
    let (s, b) = buy_as(app, auth, request_id, 9611).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    order_id(&b)
}

/// Asserts that `path` is refused as a bad request.
async fn refused(app: &TestApp, path: &str, auth: &str) {
    let (s, b) = get(app, path, auth).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{path}: {b}"
    );
}

/// Every page of `path` (which ends with its other parameters) from `cursor` on,
/// following the cursors: the ids of `key`'s items, page by page.
async fn pages(
    app: &TestApp,
    path: &str,
    mut cursor: Option<String>,
    (auth, key, id): (&str, &str, &str),
) -> Vec<Vec<i64>> {
    let mut all = Vec::new();
    loop {
        let url = match &cursor {
            Some(c) => format!("{path}&cursor={c}"),
            None => path.to_owned(),
        };
        let (s, b) = get(app, &url, auth).await;
        assert_eq!(s, StatusCode::OK, "{url}: {b}");
        let ids = b[key]
            .as_array()
            .expect("items")
            .iter()
            .map(|item| item[id].as_i64().expect("id"))
            .collect();
        all.push(ids);
        match b["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return all,
        }
        assert!(all.len() < 100, "the cursors go on forever");
    }
}

// Checks the products list: pages of two in id order cover the five products exactly,
// the last page has no cursor, each item carries its inventory; without the admin token
// it is 401, and a bad page size, cursor or parameter is 400 naming it.
#[tokio::test]
async fn products_are_listed_a_page_at_a_time() {
    let app = TestApp::spawn().await;
    for id in 9601..=9605 {
        app.create_product(id, 10, None).await;
    }
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let got = pages(
        &app,
        "/v1/products?limit=2",
        None,
        (&admin, "products", "product_id"),
    )
    .await;
    assert_eq!(got, [vec![9601, 9602], vec![9603, 9604], vec![9605]]);
    let (s, b) = get(&app, "/v1/products?limit=1", &admin).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["products"][0]["inventory"]["total"], 10, "{b}");
    let (s, b) = get(&app, "/v1/products", "Bearer wrong").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::UNAUTHORIZED, "unauthorized"),
        "{b}"
    );
    for bad in [
        "limit=0",
        "limit=101",
        "limit=x",
        "cursor=abc",
        "cursor=0",
        "cursor=01",
        "page=2",
    ] {
        refused(&app, &format!("/v1/products?{bad}"), &admin).await;
    }
    app.cleanup().await;
}

// Checks a buyer's orders list, with jwt buyers: the buyer's five orders come newest
// first in pages of two that cover them exactly; an order bought between two pages does
// not shift the next page (the cursor is an id); `status` filters; another buyer sees
// none of them and naming the first buyer is 403; the admin token reads them with
// `user_id` (400 without it); a bad status is 400.
#[tokio::test]
async fn a_buyer_lists_their_own_orders_newest_first() {
    let app = TestApp::selling_with(&jwt_buyers(), (9611, 100, None)).await;
    let (alice, bob) = (as_buyer(61), as_buyer(62));
    let mut bought = Vec::new();
    for i in 0..ORDERS {
        bought.push(buy(&app, &alice, &format!("LIST_{i}")).await);
    }
    let cancel = format!("/v1/orders/{}/cancel", bought[1]);
    let (s, _, _) = app
        .send_with(Method::POST, &cancel, None, &[("authorization", &alice)])
        .await;
    assert_eq!(s, StatusCode::OK);
    let newest_first: Vec<i64> = bought.iter().rev().copied().collect();

    let (s, first) = get(&app, "/v1/orders?limit=2", &alice).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    buy(&app, &alice, "LIST_late").await;
    let cursor = first["next_cursor"].as_str().expect("a next page");
    let rest = pages(
        &app,
        "/v1/orders?limit=2",
        Some(cursor.to_owned()),
        (&alice, "orders", "order_id"),
    )
    .await;
    let mut seen: Vec<i64> = first["orders"]
        .as_array()
        .expect("orders")
        .iter()
        .map(order_id)
        .collect();
    seen.extend(rest.into_iter().flatten());
    assert_eq!(
        seen, newest_first,
        "pages cover the orders once, newest first"
    );

    let (_, b) = get(&app, "/v1/orders?status=CANCELLED", &alice).await;
    assert_eq!(b["orders"].as_array().map(Vec::len), Some(1), "{b}");
    assert_eq!(order_id(&b["orders"][0]), bought[1]);
    let (s, b) = get(&app, "/v1/orders", &bob).await;
    assert_eq!(
        (s, b["orders"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0)),
        "{b}"
    );
    let (s, b) = get(&app, "/v1/orders?user_id=61", &bob).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "forbidden"), "{b}");
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let (s, b) = get(&app, "/v1/orders?user_id=61&limit=100", &admin).await;
    assert_eq!(
        (s, b["orders"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(6)),
        "{b}"
    );
    refused(&app, "/v1/orders", &admin).await;
    refused(&app, "/v1/orders?status=LOST", &alice).await;
    app.cleanup().await;
}

// Checks that each page is one indexed query, on 20,000 orders of 2,000 buyers: MariaDB's
// plan for a buyer's page (with and without a status) reads `idx_orders_user` backwards
// from the cursor, and the products' page reads the primary key, neither with a sort
// (no "Using filesort"). docs/api.md gives the plan on a million orders.
#[tokio::test]
async fn a_page_is_one_indexed_query() {
    let app = TestApp::spawn().await;
    filled(
        &app,
        "orders",
        "INSERT INTO orders (request_id, user_id, product_id, quantity, status, created_at, \
         expires_at) SELECT CONCAT('EXPLAIN_', seq), seq % 2000 + 1, 1, 1, \
         IF(seq % 3 = 0, 'PAID', 'PENDING_PAYMENT'), NOW(6), NOW(6) FROM seq_1_to_20000",
    )
    .await;
    let orders = flashsale_mysql::lists::orders_sql();
    let plans: [(&str, &str, Vec<Option<String>>, &str); 3] = [
        (
            "orders of a buyer",
            &orders,
            vec![None, None],
            "idx_orders_user",
        ),
        (
            "paid orders of a buyer",
            &orders,
            vec![Some("PAID".into()), Some("PAID".into())],
            "idx_orders_user",
        ),
        (
            "products",
            flashsale_mysql::lists::PRODUCTS_AFTER,
            vec![],
            "PRIMARY",
        ),
    ];
    for (what, sql, status, key) in plans {
        let text = format!("EXPLAIN {sql}");
        let mut explain = sqlx::query(&text);
        explain = if status.is_empty() {
            explain.bind(0_i64)
        } else {
            explain
                .bind(7_i64)
                .bind(15_000_i64)
                .bind(&status[0])
                .bind(&status[1])
        };
        assert_indexed(app_plan(&app, explain.bind(21_i64)).await, what, key);
    }
    app.cleanup().await;
}

/// An EXPLAIN with its binds.
type Explain<'q> = sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>;

/// The plan MariaDB makes for `explain`: each table's key and its Extra.
async fn app_plan(app: &TestApp, explain: Explain<'_>) -> Vec<(Option<String>, String)> {
    let rows = explain.fetch_all(&app.pool).await.expect("explain");
    rows.iter()
        .map(|r| {
            let key: Option<String> = sqlx::Row::try_get_unchecked(r, "key").expect("key");
            let extra: Option<String> = sqlx::Row::try_get_unchecked(r, "Extra").expect("extra");
            (key, extra.unwrap_or_default())
        })
        .collect()
}

/// `plan` reads `key` first and sorts nothing (no "Using filesort"); printed.
fn assert_indexed(plan: Vec<(Option<String>, String)>, what: &str, key: &str) {
    println!("{what}: {plan:?}");
    assert_eq!(plan[0].0.as_deref(), Some(key), "{what}: {plan:?}");
    assert!(
        plan.iter().all(|(_, extra)| !extra.contains("filesort")),
        "{what}: {plan:?}"
    );
}

// Checks the operator's log as GET /v1/admin/actions pages it: six actions on two
// products (the creations, then pause, change and resume of one, pause of the other)
// come newest first two a page, the cursor leading to the rest and the last page (the
// creations, without a request_id) without one; one product's filter gives its four
// lines; each line names its admin, request_id and states; no
// token is 401 and a bad limit or product_id 400. Then, on 20,000 lines, MariaDB's plan
// for a page of all (the primary key) and of one product (`idx_admin_action_product`)
// reads its index without a sort.
#[tokio::test]
async fn the_operators_log_is_listed_newest_first() {
    let app = TestApp::spawn().await;
    app.create_product(4301, 5, None).await;
    app.create_product(4302, 5, None).await;
    for (product, what, body) in [
        (4301, "pause", json!({"request_id": "LOG_1"})),
        (
            4301,
            "patch",
            json!({"request_id": "LOG_2", "name": "Renamed"}),
        ),
        (4301, "resume", json!({"request_id": "LOG_3"})),
        (4302, "pause", json!({"request_id": "LOG_4"})),
    ] {
        let (method, path) = match what {
            "patch" => (Method::PATCH, format!("/v1/products/{product}")),
            _ => (
                reqwest::Method::POST,
                format!("/v1/products/{product}/{what}"),
            ),
        };
        let (s, b) = app
            .send(method, &path, Some(&body.to_string()), true)
            .await
            .expect("act");
        assert_eq!(s, StatusCode::OK, "{what}: {b}");
    }
    let (s, first) = admin_get(&app, "/v1/admin/actions?limit=2").await;
    assert_eq!(s, StatusCode::OK, "{first}");
    let ids = |page: &Value| -> Vec<String> {
        page["actions"]
            .as_array()
            .expect("actions")
            .iter()
            .map(|a| a["request_id"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(ids(&first), ["LOG_4", "LOG_3"]);
    let next = first["next_cursor"].as_str().expect("a next page");
    let (_, second) = admin_get(&app, &format!("/v1/admin/actions?limit=2&cursor={next}")).await;
    assert_eq!(ids(&second), ["LOG_2", "LOG_1"]);
    // The creations, logged without a request_id (the product id is their key).
    let next = second["next_cursor"].as_str().expect("the creations' page");
    let (_, third) = admin_get(&app, &format!("/v1/admin/actions?limit=2&cursor={next}")).await;
    assert_eq!(ids(&third), ["", ""]);
    assert_eq!(third["next_cursor"], Value::Null, "{third}");
    let (_, one) = admin_get(&app, "/v1/admin/actions?product_id=4301").await;
    assert_eq!(ids(&one), ["LOG_3", "LOG_2", "LOG_1", ""]);
    let created = &one["actions"][3];
    assert_eq!(
        (
            &created["action"],
            &created["request_id"],
            &created["after"]["stock"]
        ),
        (&json!("create"), &Value::Null, &json!(5)),
        "{created}"
    );
    let patch = &one["actions"][1];
    assert_eq!(
        (&patch["action"], &patch["admin"]),
        (&json!("patch"), &json!("admin")),
        "{patch}"
    );
    assert_eq!(
        (&patch["before"]["name"], &patch["after"]["name"]),
        (&json!("product 4301"), &json!("Renamed"))
    );
    assert_eq!(patch["asked"], json!({"name": "Renamed"}), "{patch}");
    assert_eq!(one["actions"][0]["after"], json!({"paused": false}));
    let (s, _) = app.get("/v1/admin/actions").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    for bad in ["limit=0", "product_id=0", "cursor=x", "other=1"] {
        let (s, b) = admin_get(&app, &format!("/v1/admin/actions?{bad}")).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{bad}: {b}"
        );
    }
    explain_the_log(&app).await;
    app.cleanup().await;
}

// Checks that a creation and a restock are in the operator's log with their admin: the
// creation without a request_id and its stock after; a restock under its request_id with
// the units asked and the totals before and after, once however often it is retried.
// Restocks share the admins' one namespace of request_ids: a restock under a pause's
// request_id, or a pause under a restock's, is 409 request_id_conflict and changes
// nothing. The audit is clean (neither writes an event of its own).
#[tokio::test]
async fn creations_and_restocks_are_logged() {
    const PRODUCT: i64 = 4303;
    let app = TestApp::spawn().await;
    app.create_product(PRODUCT, 10, None).await;
    let restock = json!({"request_id": "OP_rs_1", "quantity": 5});
    for _ in 0..2 {
        let (s, b) = app
            .admin_post(&format!("/v1/products/{PRODUCT}/restock"), restock.clone())
            .await;
        assert_eq!(
            (s, &b["inventory"]["total"]),
            (StatusCode::OK, &json!(15)),
            "{b}"
        );
    }
    let pause = json!({"request_id": "OP_rs_p"});
    let (s, b) = app
        .admin_post(&format!("/v1/products/{PRODUCT}/pause"), pause)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let crossed = [
        ("restock", json!({"request_id": "OP_rs_p", "quantity": 1})),
        ("resume", json!({"request_id": "OP_rs_1"})),
    ];
    for (what, body) in crossed {
        let (s, b) = app
            .admin_post(&format!("/v1/products/{PRODUCT}/{what}"), body)
            .await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::CONFLICT, "request_id_conflict"),
            "{what}: {b}"
        );
    }
    let (_, log) = admin_get(&app, &format!("/v1/admin/actions?product_id={PRODUCT}")).await;
    let lines = log["actions"].as_array().expect("actions");
    let actions: Vec<_> = lines
        .iter()
        .map(|a| a["action"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(actions, ["pause", "restock", "create"], "{log}");
    let (restocked, created) = (&lines[1], &lines[2]);
    assert_eq!(
        (
            &restocked["request_id"],
            &restocked["asked"],
            &restocked["admin"]
        ),
        (&json!("OP_rs_1"), &json!({"quantity": 5}), &json!("admin")),
        "{restocked}"
    );
    assert_eq!(
        (&restocked["before"]["total"], &restocked["after"]["total"]),
        (&json!(10), &json!(15))
    );
    assert_eq!(
        (
            &created["request_id"],
            &created["before"],
            &created["after"]["stock"]
        ),
        (&Value::Null, &Value::Null, &json!(10)),
        "{created}"
    );
    let (_, product) = app.get(&format!("/v1/products/{PRODUCT}")).await;
    assert_eq!(product["inventory"]["total"], json!(15), "{product}");
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

/// Fills `table` by `insert` (rows made up for a plan), then has MariaDB count them
/// (`ANALYZE TABLE`) so that its plans see them.
async fn filled(app: &TestApp, table: &str, insert: &str) {
    sqlx::query(insert)
        .execute(&app.pool)
        .await
        .unwrap_or_else(|e| panic!("fill {table}: {e}"));
    sqlx::query(&format!("ANALYZE TABLE {table}"))
        .execute(&app.pool)
        .await
        .expect("analyze");
}

/// A GET with the admin token.
async fn admin_get(app: &TestApp, path: &str) -> (StatusCode, Value) {
    app.send(Method::GET, path, None, true).await.expect("page")
}

/// The log's two page queries on 20,000 lines: each reads its index, no sort.
async fn explain_the_log(app: &TestApp) {
    filled(
        app,
        "admin_action",
        "INSERT INTO admin_action (request_id, action, product_id, admin, before_state, \
         after_state) SELECT CONCAT('EXPLAIN_', seq), 'pause', seq % 500 + 1, 'admin', \
         '{}', '{}' FROM seq_1_to_20000",
    )
    .await;
    let all = flashsale_mysql::lists::actions_sql(false);
    let one = flashsale_mysql::lists::actions_sql(true);
    for (what, sql, binds, key) in [
        ("every product's actions", &all, vec![15_000, 21], "PRIMARY"),
        (
            "one product's actions",
            &one,
            vec![7, 15_000, 21],
            "idx_admin_action_product",
        ),
    ] {
        let text = format!("EXPLAIN {sql}");
        let explain = binds
            .iter()
            .fold(sqlx::query(&text), |query, b: &i64| query.bind(*b));
        assert_indexed(app_plan(app, explain).await, what, key);
    }
}
