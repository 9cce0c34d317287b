//! Proves [`RedisCluster`] against real processes: six private redis-server children
//! per test, joined into a cluster of three primaries and three replicas (the shared
//! Redis on 6379 is not touched).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_testkit::RedisCluster;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::AsyncCommands;
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Bound on one reply through the cluster client: generous, a machine busy compiling
/// is slow, and a slow reply is not what these tests look for.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A plain (not cluster-aware) connection to the node on `port`.
async fn node(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A cluster-aware connection seeded with every node of `cluster`.
async fn cluster_conn(cluster: &RedisCluster) -> redis::cluster_async::ClusterConnection {
    ClusterClientBuilder::new(cluster.urls())
        .connection_timeout(CLIENT_TIMEOUT)
        .response_timeout(CLIENT_TIMEOUT)
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

// Checks: a started cluster has three primaries, every primary serves the keys of its
// slots (directly and through a cluster client), `slot_of` agrees with the cluster,
// `product_on` gives a product on each primary, and dropping the cluster kills every
// node. How: for each primary, find its product, SET/GET a key of that product on the
// primary and through a cluster connection, compare with CLUSTER KEYSLOT; after drop,
// connect to every port and expect a refusal.
#[tokio::test]
async fn cluster_starts_with_three_primaries_serving_their_slots() {
    let started = Instant::now();
    let cluster = RedisCluster::start().await.unwrap();
    eprintln!("cluster formed in {:?}", started.elapsed());
    assert_eq!(cluster.urls().len(), 6);
    assert_eq!(cluster.seed_nodes().split(',').count(), 6);
    let ports = cluster.ports();
    assert_eq!(ports.iter().collect::<HashSet<_>>().len(), 6);
    assert!(ports.iter().all(|&p| p < 55_535), "{ports:?}");

    let primaries = cluster.primaries().await.unwrap();
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let mut conn = cluster_conn(&cluster).await;
    let mut products = HashSet::new();
    for &port in &primaries {
        let product = cluster.product_on(port).await.unwrap();
        assert!(
            products.insert(product),
            "product {product} on two primaries"
        );
        let key = format!("{{p:{product}}}:inv");
        let slot = RedisCluster::slot_of(&key);
        assert_eq!(cluster.primary_of(slot).await.unwrap(), port);

        let mut direct = node(port).await;
        let asked: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query_async(&mut direct)
            .await
            .unwrap();
        assert_eq!(asked, slot, "slot of {key}");
        // Directly on the owner: no redirection.
        let _: () = direct.set(&key, port).await.unwrap();
        let got: u16 = direct.get(&key).await.unwrap();
        assert_eq!(got, port);
        // Through the cluster client, which routes by slot.
        let via_cluster: u16 = conn.get(&key).await.unwrap();
        assert_eq!(via_cluster, port);
        let other = format!("{{p:{product}}}:users");
        let _: () = conn.set(&other, "x").await.unwrap();
        let got: String = direct.get(&other).await.unwrap();
        assert_eq!(got, "x");
    }
    eprintln!("test took {:?}", started.elapsed());

    drop(conn);
    drop(cluster);
    for port in ports {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "node {port} still answers after drop"
        );
    }
}

// Checks: after kill -9 of a primary, `wait_failover` returns the port of one of the
// original replicas, which now serves the slot with the keys written before the kill.
// How: write 100 keys of one product on the primary, WAIT for one replica to have
// them, kill the primary, wait for the failover, read the keys on the new primary.
#[tokio::test]
async fn a_replica_takes_over_a_killed_primary_with_its_keys() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start().await.unwrap();
    let formed = started.elapsed();
    let before = cluster.primaries().await.unwrap();
    let victim = before[0];
    let product = cluster.product_on(victim).await.unwrap();
    let slot = RedisCluster::slot_of(&format!("{{p:{product}}}"));
    let keys: Vec<String> = (0..100).map(|i| format!("{{p:{product}}}:k:{i}")).collect();

    let mut direct = node(victim).await;
    for (i, key) in keys.iter().enumerate() {
        let _: () = direct.set(key, i).await.unwrap();
    }
    let acked: u64 = redis::cmd("WAIT")
        .arg(1)
        .arg(1_000)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the writes");
    drop(direct);

    cluster.kill(victim).unwrap();
    let killed = Instant::now();
    let new_primary = cluster.wait_failover(slot, victim).await.unwrap();
    eprintln!(
        "cluster formed in {formed:?}; failover took {:?}",
        killed.elapsed()
    );
    assert!(
        !before.contains(&new_primary),
        "{new_primary} was a primary"
    );
    assert!(cluster.ports().contains(&new_primary));
    assert_eq!(cluster.primary_of(slot).await.unwrap(), new_primary);
    let after = cluster.primaries().await.unwrap();
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(!after.contains(&victim) && after.contains(&new_primary));

    let mut direct = node(new_primary).await;
    for (i, key) in keys.iter().enumerate() {
        let got: Option<usize> = direct.get(key).await.unwrap();
        assert_eq!(got, Some(i), "{key} on the new primary");
    }
    eprintln!("test took {:?}", started.elapsed());
}

// Checks: a slot moves live with its ~2,000 keys while a client keeps using it: the
// client's reads and writes all succeed (it follows ASK and MOVED), every key is on the
// target afterwards, the source has none left, and the slot belongs to the target
// everywhere. How: fill one product's slot on one primary, start a task that writes new
// keys of that slot and reads them and the old ones back through a cluster connection,
// migrate in batches of 100 with a pause between them, stop the task, then check every
// key directly on the target.
#[tokio::test]
async fn a_slot_moves_live_while_a_client_uses_it() {
    const KEYS: usize = 2_000;
    let started = Instant::now();
    let cluster = RedisCluster::start().await.unwrap();
    let formed = started.elapsed();
    let primaries = cluster.primaries().await.unwrap();
    let (from, to) = (primaries[0], primaries[1]);
    let product = cluster.product_on(from).await.unwrap();
    let slot = RedisCluster::slot_of(&format!("{{p:{product}}}"));

    let mut source = node(from).await;
    let mut fill = redis::pipe();
    for i in 0..KEYS {
        fill.set(format!("{{p:{product}}}:k:{i}"), i).ignore();
    }
    let _: () = fill.query_async(&mut source).await.unwrap();

    // The client: a new key per round, read back, and one old key read.
    let ops = Arc::new(AtomicU64::new(0));
    let (stop_tx, mut stop_rx) = watch::channel(false);
    let mut conn = cluster_conn(&cluster).await;
    let client = tokio::spawn({
        let ops = Arc::clone(&ops);
        async move {
            let mut written = 0usize;
            while !*stop_rx.borrow_and_update() {
                let key = format!("{{p:{product}}}:w:{written}");
                let _: () = conn
                    .set(&key, written)
                    .await
                    .map_err(|e| (key.clone(), e))?;
                let got: Option<usize> = conn.get(&key).await.map_err(|e| (key.clone(), e))?;
                assert_eq!(got, Some(written), "{key}");
                let old = written * 7 % KEYS;
                let key = format!("{{p:{product}}}:k:{old}");
                let got: Option<usize> = conn.get(&key).await.map_err(|e| (key.clone(), e))?;
                assert_eq!(got, Some(old), "{key}");
                written += 1;
                ops.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<usize, (String, redis::RedisError)>(written)
        }
    });
    // Let the client run before the migration starts.
    while ops.load(Ordering::Relaxed) < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let ops_before = ops.load(Ordering::Relaxed);
    let migrating = Instant::now();
    let moved = cluster
        .migrate_slot(slot, to, 100, Duration::from_millis(20))
        .await
        .unwrap();
    let took = migrating.elapsed();
    let ops_during = ops.load(Ordering::Relaxed) - ops_before;
    // A few more rounds after the move, which the client learns from MOVED.
    let after_move = ops.load(Ordering::Relaxed);
    while ops.load(Ordering::Relaxed) < after_move + 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop_tx.send(true).unwrap();
    let written = match client.await.unwrap() {
        Ok(written) => written,
        Err((key, e)) => panic!("the client failed on {key}: {e}"),
    };
    eprintln!(
        "cluster formed in {formed:?}; {moved} keys moved in {took:?} with {ops_during} \
         client rounds meanwhile; {written} keys written by the client"
    );
    assert!(
        ops_during > 0,
        "the client did nothing during the migration"
    );
    assert!(
        (KEYS..=KEYS + written).contains(&moved),
        "moved {moved} keys"
    );

    assert_eq!(cluster.primary_of(slot).await.unwrap(), to);
    let mut target = node(to).await;
    let count = |conn: &mut MultiplexedConnection| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("COUNTKEYSINSLOT").arg(slot);
        let mut conn = conn.clone();
        async move { cmd.query_async::<usize>(&mut conn).await.unwrap() }
    };
    assert_eq!(count(&mut source).await, 0, "keys left on the source");
    assert_eq!(count(&mut target).await, KEYS + written);
    for i in 0..KEYS {
        let key = format!("{{p:{product}}}:k:{i}");
        let got: Option<usize> = target.get(&key).await.unwrap();
        assert_eq!(got, Some(i), "{key} on the target");
    }
    for i in 0..written {
        let key = format!("{{p:{product}}}:w:{i}");
        let got: Option<usize> = target.get(&key).await.unwrap();
        assert_eq!(got, Some(i), "{key} on the target");
    }
    eprintln!("test took {:?}", started.elapsed());
}
