//! The lists: `GET /v1/products` (admin) and `GET /v1/orders` (a buyer's own; anyone's
//! with the admin token), a page at a time with cursors, each page one indexed query.

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::{as_buyer, buy_as, code, jwt_buyers, order_id, TestApp, ADMIN_TOKEN};

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
    let app = TestApp::spawn_with(Default::default(), &jwt_buyers()).await;
    app.create_product(9611, 100, None).await;
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
    sqlx::query(
        "INSERT INTO orders (request_id, user_id, product_id, quantity, status, created_at, \
         expires_at) SELECT CONCAT('EXPLAIN_', seq), seq % 2000 + 1, 1, 1, \
         IF(seq % 3 = 0, 'PAID', 'PENDING_PAYMENT'), NOW(6), NOW(6) FROM seq_1_to_20000",
    )
    .execute(&app.pool)
    .await
    .expect("orders");
    sqlx::query("ANALYZE TABLE orders")
        .execute(&app.pool)
        .await
        .expect("analyze");
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
        let rows = explain
            .bind(21_i64)
            .fetch_all(&app.pool)
            .await
            .expect("explain");
        let plan: Vec<(Option<String>, String)> = rows
            .iter()
            .map(|r| {
                let key: Option<String> = sqlx::Row::try_get_unchecked(r, "key").expect("key");
                let extra: Option<String> =
                    sqlx::Row::try_get_unchecked(r, "Extra").expect("extra");
                (key, extra.unwrap_or_default())
            })
            .collect();
        println!("{what}: {plan:?}");
        assert_eq!(plan[0].0.as_deref(), Some(key), "{what}: {plan:?}");
        assert!(
            plan.iter().all(|(_, extra)| !extra.contains("filesort")),
            "{what}: {plan:?}"
        );
    }
    app.cleanup().await;
}
