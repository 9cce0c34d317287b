//! The statistics consumer's decoding of a delivered message (every event of a sale goes
//! through it once): a pack of 32 `order_created` events as the group commit's procedure
//! writes them, and one event alone. `cargo bench -p flashsale-nats --bench decode`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark's failed setup ends it, with the expectation's message"
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use flashsale_nats::decode_message;

fn event(i: usize) -> String {
    format!(
        r#"{{"event_id": "0193a7c4-5d2e-7f00-8000-{i:012}", "event_type": "order_created", "sequence": 1, "order_id": {order}, "request_id": "REQ-{i:012}", "product_id": 1, "user_id": {user}, "quantity": 1, "reason": null, "occurred_at": "2026-11-29T10:03:12.482113Z"}}"#,
        order = 1_000 + i,
        user = 77 + i,
    )
}

fn decode(c: &mut Criterion) {
    let pack = format!("[{}]", (0..32).map(event).collect::<Vec<_>>().join(", "));
    let one = event(0);
    for body in [&pack, &one] {
        let decoded = decode_message(body.as_bytes()).expect("a message");
        assert!(decoded.iter().all(Result::is_ok), "{decoded:?}");
    }
    let mut group = c.benchmark_group("decode_message");
    group.bench_function("pack_of_32", |b| {
        b.iter(|| decode_message(black_box(pack.as_bytes())))
    });
    group.bench_function("one_event", |b| {
        b.iter(|| decode_message(black_box(one.as_bytes())))
    });
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
