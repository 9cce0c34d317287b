//! Proves [`NatsCluster`] against real processes: three private nats-server children
//! per test, routed into one JetStream cluster (the shared nats-server on 4222 is not
//! touched).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use flashsale_testkit::NatsCluster;
use tokio::net::TcpStream;

/// Messages published before the kill, and again after it.
const MESSAGES: u64 = 10;
/// Longest a publish is retried while the stream elects a leader (4–10 s), or the
/// restarted server takes to hold what the leader holds: room for a busy machine.
const SETTLE_MAX: Duration = Duration::from_secs(30);

/// Publishes `n` messages to `subject`, each retried until JetStream acknowledges it
/// (bounded by [`SETTLE_MAX`]).
async fn publish(js: &jetstream::Context, subject: &str, n: u64) {
    for i in 0..n {
        let started = Instant::now();
        loop {
            match js.publish(subject.to_owned(), i.to_string().into()).await {
                Ok(ack) => match ack.await {
                    Ok(_) => break,
                    Err(e) => assert!(started.elapsed() < SETTLE_MAX, "{e}"),
                },
                Err(e) => assert!(started.elapsed() < SETTLE_MAX, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

// Checks: a started cluster takes a stream of three replicas through a client seeded
// with `urls()`, and every server names its leader; kill9 of the leader gets another
// elected (wait_stream_leader) while the killed one is not running; publishing goes on;
// the killed server restarted holds the stream as the leader does (stream_copy), every
// message included; dropping the cluster kills every server. How: create the stream,
// publish, kill the leader, wait for another, publish again, restart, compare the
// copies, drop and connect to each client port expecting a refusal. Prints the start,
// election and restart times.
#[tokio::test]
async fn a_killed_stream_leader_is_replaced_and_catches_up_when_restarted() {
    let started = Instant::now();
    let mut cluster = NatsCluster::start().await.unwrap();
    let start_time = started.elapsed();
    let urls = cluster.urls();
    assert_eq!(urls.split(',').count(), 3);
    let client = async_nats::connect(urls.split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let js = jetstream::new(client);
    js.create_stream(stream::Config {
        name: "T".into(),
        subjects: vec!["t.>".into()],
        num_replicas: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    publish(&js, "t.x", MESSAGES).await;
    let leader = cluster.wait_stream_leader("T", None).await.unwrap();
    assert_eq!(cluster.stream_leader("T").await.unwrap(), Some(leader));
    assert_eq!(cluster.stream_leader("missing").await.unwrap(), None);

    let killed = Instant::now();
    cluster.kill9(leader).unwrap();
    assert!(!cluster.is_running(leader));
    let next = cluster.wait_stream_leader("T", Some(leader)).await.unwrap();
    let election = killed.elapsed();
    assert_ne!(next, leader);
    publish(&js, "t.x", MESSAGES).await;

    let restarting = Instant::now();
    cluster.restart(leader).await.unwrap();
    let restart_time = restarting.elapsed();
    assert!(cluster.is_running(leader));
    let deadline = Instant::now() + SETTLE_MAX;
    loop {
        let copy = cluster.stream_copy(leader, "T").await.unwrap();
        if copy.is_some() && copy == cluster.stream_copy(next, "T").await.unwrap() {
            assert_eq!(copy.map(|c| c.messages), Some(2 * MESSAGES));
            break;
        }
        assert!(Instant::now() < deadline, "{copy:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "cluster formed in {start_time:?}; new leader {election:?} after the kill; \
         restarted in {restart_time:?}"
    );

    let ports: Vec<SocketAddr> = urls
        .split(',')
        .map(|u| u.trim_start_matches("nats://").parse().unwrap())
        .collect();
    drop(cluster);
    for addr in ports {
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "{addr} still answers"
        );
    }
}
