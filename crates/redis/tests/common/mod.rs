//! What the gate's integration tests share: the adapter on a Redis and a prefix, and the
//! purchases they send it. Each test binary uses some of it.

use std::time::Duration;

use flashsale_core::{Generation, ProductId, PurchaseRequest, Quantity, RequestId, UserId};
use flashsale_redis::{GateConfig, RedisGate};

/// The shared Redis (`scripts/services.sh` starts it).
#[allow(dead_code)]
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// A connection to the Redis at `url`.
#[allow(dead_code)]
pub async fn connect(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("connect to {url} (scripts/services.sh starts the shared Redis): {e}")
        })
}

/// The adapter's settings for the single Redis at `url`, its keys under `prefix`, with a
/// sold-out lease of `lease` (zero: none) and no shared per-user rate.
pub fn config(url: &str, prefix: &str, lease: Duration) -> GateConfig {
    GateConfig {
        target: flashsale_redis::Target::Node(url.to_owned()),
        prefix: prefix.to_owned(),
        record_ttl: Duration::from_secs(600),
        response_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        sold_out_lease: lease,
        shared_user_rate: None,
    }
}

/// The adapter with [`config`]'s settings.
pub fn gate(url: &str, prefix: &str, lease: Duration) -> RedisGate {
    RedisGate::new(&config(url, prefix, lease)).expect("gate")
}

/// The adapter on the shared Redis, its keys under a prefix of the test's own (returned,
/// for the test to read the keys and delete them), with no sold-out lease.
#[allow(dead_code)]
pub fn shared_gate() -> (String, RedisGate) {
    let prefix = flashsale_testkit::redis_prefix();
    let gate = gate(REDIS_URL, &prefix, Duration::ZERO);
    (prefix, gate)
}

/// The product every test sells.
pub fn product() -> ProductId {
    ProductId::parse(1).expect("id")
}

#[allow(dead_code)]
pub fn generation(n: i64) -> Generation {
    Generation::from_stored(n).expect("generation")
}

/// One unit of [`product`] for `user` under `id`.
pub fn purchase(id: &str, user: i64) -> PurchaseRequest {
    PurchaseRequest {
        request_id: RequestId::parse("request_id", id).expect("id"),
        user_id: UserId::parse(user).expect("user"),
        product_id: product(),
        quantity: Quantity::from_stored(1).expect("quantity"),
    }
}
