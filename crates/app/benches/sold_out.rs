//! The sold-out board's check, which every purchase of a sold-out product makes instead
//! of a Redis call (the rush's hot path): an outsider refused, a holder sent on to the
//! gate, and a product with no lease, each against snapshots of 1,000 and 100,000
//! holders. `cargo bench -p flashsale-app --bench sold_out`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark's failed setup ends it, with the expectation's message"
)]

use std::collections::HashSet;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use flashsale_app::ports::{LeaseListener, SoldOutLease};
use flashsale_app::sold_out::SoldOutBoard;
use flashsale_core::{Generation, ProductId, RequestId};

fn request_id(i: usize) -> RequestId {
    RequestId::parse("request_id", &format!("REQ-{i:012}")).expect("valid request id")
}

fn board(holders: usize) -> SoldOutBoard {
    let board = SoldOutBoard::default();
    board.listening();
    let product = ProductId::parse(1).expect("valid product id");
    let lease = SoldOutLease {
        remaining: Duration::from_secs(3_600),
        generation: Generation::FIRST,
        holds: holders as i64,
    };
    let snapshot = board
        .leased(product, Duration::ZERO, board.heard(product), lease)
        .expect("first lease asks for a snapshot");
    let ids: HashSet<RequestId> = (0..holders).map(request_id).collect();
    board.took(snapshot, Ok(Some(ids)));
    board
}

fn refuses(c: &mut Criterion) {
    let product = ProductId::parse(1).expect("valid product id");
    let other = ProductId::parse(2).expect("valid product id");
    let outsider = request_id(usize::MAX / 2);
    let now = Duration::from_secs(1);
    let mut group = c.benchmark_group("sold_out_refuses");
    for holders in [1_000, 100_000] {
        let b = board(holders);
        let holder = request_id(holders / 2);
        assert!(b.refuses(product, &outsider, now));
        assert!(!b.refuses(product, &holder, now));
        group.bench_with_input(BenchmarkId::new("outsider", holders), &b, |bench, b| {
            bench.iter(|| b.refuses(black_box(product), black_box(&outsider), now))
        });
        group.bench_with_input(BenchmarkId::new("holder", holders), &b, |bench, b| {
            bench.iter(|| b.refuses(black_box(product), black_box(&holder), now))
        });
        group.bench_with_input(BenchmarkId::new("no_lease", holders), &b, |bench, b| {
            bench.iter(|| b.refuses(black_box(other), black_box(&outsider), now))
        });
    }
    group.finish();
}

criterion_group!(benches, refuses);
criterion_main!(benches);
