//! Proves each testkit piece against real processes: the shared Redis and
//! MariaDB of this machine (used read-mostly, with private prefixes and
//! databases) and private redis-server / mariadbd children.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flashsale_testkit::{
    delete_prefix, free_port, redis_prefix, PrivateMariadb, PrivateRedis, TcpProxy, TestDb,
};
use sqlx::{Connection, MySqlConnection, Row};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The shared Redis (never flushed, killed or paused by these tests).
const SHARED_REDIS_ADDR: &str = "127.0.0.1:6379";
const SHARED_REDIS_URL: &str = "redis://127.0.0.1:6379/";
/// The shared MariaDB, as a server URL without a database.
const SHARED_MARIADB_URL: &str = "mysql://root@127.0.0.1:3306";

/// What "fails fast" means: a cut connection must error well within this.
const FAST: Duration = Duration::from_secs(2);
/// How long a blackholed request is given before we call it hung.
const HANG: Duration = Duration::from_millis(300);

fn shared_redis() -> SocketAddr {
    SHARED_REDIS_ADDR.parse().unwrap()
}

/// Sends a plain-text PING on `stream` and reads the reply.
/// Ok(true) = PONG; Ok(false) = EOF or anything else; Err = I/O error.
async fn ping(stream: &mut TcpStream) -> io::Result<bool> {
    stream.write_all(b"PING\r\n").await?;
    let mut reply = [0u8; 7];
    match stream.read_exact(&mut reply).await {
        Ok(_) => Ok(&reply == b"+PONG\r\n"),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Connects to `addr` and PINGs, all bounded by `bound`.
/// Some(true) = PONG, Some(false) = failed (refused, EOF, reset), None = hung.
async fn ping_new(addr: SocketAddr, bound: Duration) -> Option<bool> {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await?;
        ping(&mut s).await
    };
    match tokio::time::timeout(bound, attempt).await {
        Ok(Ok(pong)) => Some(pong),
        Ok(Err(_)) => Some(false),
        Err(_) => None,
    }
}

/// Waits (bounded by FAST) until the peer closes `stream`; true if it did.
async fn closed_by_peer(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(FAST, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

/// A proxy in front of the shared Redis, and a connection through it that answered PING.
async fn proxied_live() -> (TcpProxy, TcpStream) {
    let proxy = TcpProxy::start(shared_redis()).await.unwrap();
    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(ping(&mut live).await.unwrap());
    (proxy, live)
}

/// Connects to `url`, runs each of `statements` in order (each must succeed), and
/// closes the connection.
async fn run_all(url: &str, statements: &[&str]) {
    let mut conn = MySqlConnection::connect(url).await.unwrap();
    for sql in statements {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
}

// Checks: the proxy forwards both ways to the shared Redis, for raw TCP and
// for the real `redis` client. How: PING through the proxy, by hand and with
// redis::Client, and expect PONG.
#[tokio::test]
async fn proxy_forwards_to_shared_redis() {
    let proxy = TcpProxy::start(shared_redis()).await.unwrap();
    assert_eq!(ping_new(proxy.addr(), FAST).await, Some(true));

    let client = redis::Client::open(format!("redis://{}/", proxy.addr())).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

// Checks: cut() kills a live connection and makes new ones fail fast (no
// hang), and restore() brings forwarding back for new connections while the
// cut one stays dead. How: hold a connection that answered PING, cut, expect
// the peer to close it within FAST and a new connect+PING to fail within
// FAST; restore, expect a new connection to get PONG.
#[tokio::test]
async fn proxy_cut_then_restore() {
    let (proxy, mut live) = proxied_live().await;

    proxy.cut();
    let started = Instant::now();
    assert!(
        closed_by_peer(&mut live).await,
        "live connection survived cut"
    );
    assert_eq!(ping_new(proxy.addr(), FAST).await, Some(false));
    assert!(
        started.elapsed() < FAST,
        "cut was not fast: {:?}",
        started.elapsed()
    );

    proxy.restore();
    assert_eq!(ping_new(proxy.addr(), FAST).await, Some(true));
    // The connection cut before stays dead.
    assert!(!matches!(ping(&mut live).await, Ok(true)));
}

// Checks: blackhole() makes live and new connections hang (open, but no
// reply) so only client timeouts help, and restore() closes the blackholed
// connections and forwards new ones again. How: PING on a live connection
// and on a new one, each under a short tokio timeout that must elapse; after
// restore the held connection is closed by the proxy and a new PING works.
#[tokio::test]
async fn proxy_blackhole_then_restore() {
    let (proxy, mut live) = proxied_live().await;

    proxy.blackhole();
    assert!(
        tokio::time::timeout(HANG, ping(&mut live)).await.is_err(),
        "live connection answered while blackholed"
    );
    assert_eq!(
        ping_new(proxy.addr(), HANG).await,
        None,
        "new connection answered while blackholed"
    );

    proxy.restore();
    assert!(
        closed_by_peer(&mut live).await,
        "blackholed connection not closed on restore"
    );
    assert_eq!(ping_new(proxy.addr(), FAST).await, Some(true));
}

// Checks: dropping the proxy stops its listener and its connection tasks.
// How: hold a live connection, drop the proxy, expect that connection to be
// closed and a new connect to its address to fail.
#[tokio::test]
async fn proxy_drop_stops_everything() {
    let proxy = TcpProxy::start(shared_redis()).await.unwrap();
    let addr = proxy.addr();
    let mut live = TcpStream::connect(addr).await.unwrap();
    assert!(ping(&mut live).await.unwrap());

    drop(proxy);
    assert!(
        closed_by_peer(&mut live).await,
        "connection outlived the proxy"
    );
    assert_eq!(ping_new(addr, FAST).await, Some(false));
}

// Checks: TestDb creates a private database on the shared MariaDB that is
// usable directly and through a TcpProxy (url_via), and drop_db removes it.
// How: create, write and read a row via url(), read it via url_via(proxy),
// check SHOW DATABASES before and after drop_db.
#[tokio::test]
async fn test_db_create_use_and_drop() {
    let db = TestDb::create(SHARED_MARIADB_URL).await.unwrap();
    let name = db.name().to_owned();
    assert!(name.starts_with("fs_test_"));
    assert_eq!(db.url(), format!("{SHARED_MARIADB_URL}/{name}"));

    run_all(
        &db.url(),
        &[
            "CREATE TABLE t (id INT PRIMARY KEY)",
            "INSERT INTO t VALUES (7)",
        ],
    )
    .await;

    let proxy = TcpProxy::start("127.0.0.1:3306".parse().unwrap())
        .await
        .unwrap();
    let via = db.url_via(proxy.addr());
    assert_eq!(via, format!("mysql://root@{}/{name}", proxy.addr()));
    let mut conn = MySqlConnection::connect(&via).await.unwrap();
    let row = sqlx::query("SELECT DATABASE() AS db, (SELECT id FROM t) AS id")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(row.get::<String, _>("db"), name);
    assert_eq!(row.get::<i32, _>("id"), 7);
    conn.close().await.unwrap();

    assert!(database_exists(&name).await);
    db.drop_db().await.unwrap();
    assert!(!database_exists(&name).await);
}

// Checks: a TestDb dropped without drop_db (as when a test panics) still
// removes its database. How: create one, drop the value, check SHOW
// DATABASES.
#[tokio::test]
async fn test_db_dropped_without_drop_db_is_cleaned_up() {
    let db = TestDb::create(SHARED_MARIADB_URL).await.unwrap();
    let name = db.name().to_owned();
    assert!(database_exists(&name).await);
    drop(db);
    assert!(!database_exists(&name).await);
}

async fn database_exists(name: &str) -> bool {
    let mut conn = MySqlConnection::connect(SHARED_MARIADB_URL).await.unwrap();
    let found =
        sqlx::query("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?")
            .bind(name)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .is_some();
    conn.close().await.unwrap();
    found
}

// Checks: delete_prefix deletes every key of its prefix on the shared Redis
// (more than one SCAN/UNLINK batch of them) and nothing else: not another
// test's prefix, not a key that merely starts with the same letters, and
// glob characters in a prefix are taken literally; an empty prefix is
// refused. How: write such keys under fresh redis_prefix() values, delete,
// count what is left, then clean up the survivors.
#[tokio::test]
async fn delete_prefix_deletes_only_its_own_keys() {
    let mine = redis_prefix();
    let other = redis_prefix();
    assert_ne!(mine, other);
    let client = redis::Client::open(SHARED_REDIS_URL).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();

    let mut mset = redis::cmd("MSET");
    for i in 0..1_200 {
        mset.arg(format!("{mine}k{i}")).arg(i);
    }
    let lookalike = format!("{}X", mine.trim_end_matches(':'));
    let star_base = format!("{other}a");
    mset.arg(format!("{other}k1")).arg(1);
    mset.arg(&lookalike).arg(1);
    mset.arg(format!("{star_base}*1")).arg(1);
    mset.arg(format!("{star_base}b1")).arg(1);
    let () = mset.query_async(&mut conn).await.unwrap();

    delete_prefix(SHARED_REDIS_URL, &mine).await.unwrap();
    assert_eq!(count_keys(&mut conn, &format!("{mine}*")).await, 0);
    let exists: i64 = redis::cmd("EXISTS")
        .arg(format!("{other}k1"))
        .arg(&lookalike)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 2, "delete_prefix deleted keys outside its prefix");

    // `*` in the prefix matches only a literal `*`.
    delete_prefix(SHARED_REDIS_URL, &format!("{star_base}*"))
        .await
        .unwrap();
    let left: (i64, i64) = redis::pipe()
        .cmd("EXISTS")
        .arg(format!("{star_base}*1"))
        .cmd("EXISTS")
        .arg(format!("{star_base}b1"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, (0, 1));

    assert!(delete_prefix(SHARED_REDIS_URL, "").await.is_err());

    delete_prefix(SHARED_REDIS_URL, &other).await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(&lookalike)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count_keys(&mut conn, &format!("{other}*")).await, 0);
}

async fn count_keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> usize {
    let mut cursor = 0u64;
    let mut n = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        n += keys.len();
        if next == 0 {
            return n;
        }
        cursor = next;
    }
}

// Checks: PrivateRedis starts a usable server, kill9 really kills it (the
// port refuses connections), restart brings it back on the same port and
// empty, and Drop kills it. How: SET a key, kill9, PING must fail fast,
// restart, GET must return nil, drop, PING must fail.
#[tokio::test]
async fn private_redis_kill9_restart_drop() {
    let mut server = PrivateRedis::start().await.unwrap();
    let addr = server.addr();
    assert_eq!(server.url(), format!("redis://{addr}/"));
    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut conn)
        .await
        .unwrap();

    server.kill9().unwrap();
    assert_eq!(ping_new(addr, FAST).await, Some(false));

    server.restart().await.unwrap();
    assert_eq!(server.addr(), addr);
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let v: Option<String> = redis::cmd("GET")
        .arg("k")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, None, "data survived a restart of a non-persistent redis");

    drop(server);
    assert_eq!(ping_new(addr, FAST).await, Some(false));
}

// Checks: PrivateMariadb starts a server root can use over TCP, committed
// rows survive kill -9 + restart on the same data directory (InnoDB crash
// recovery), starting it leaves other servers' temp files in /tmp alone,
// and Drop kills the server. How: create a TestDb on it, insert a row, kill9
// (connecting must fail), restart, read the row back, check a `#sql` canary
// file in the system temp dir survived both starts, drop.
#[tokio::test]
async fn private_mariadb_row_survives_kill9() {
    // mariadbd deletes `#sql*` files in its tmpdir at every start; a private
    // server must use its own tmpdir, never the shared server's /tmp.
    let canary = std::env::temp_dir().join(format!("#sql-{}canary", redis_prefix()));
    std::fs::write(&canary, b"").unwrap();

    let mut server = PrivateMariadb::start().await.unwrap();
    let addr = server.addr();
    assert_eq!(server.url(), format!("mysql://root@{addr}"));
    let db = TestDb::create(&server.url()).await.unwrap();
    run_all(
        &db.url(),
        &[
            "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB",
            "INSERT INTO t VALUES (1, 'kept')",
        ],
    )
    .await;

    server.kill9().unwrap();
    assert!(MySqlConnection::connect(&db.url()).await.is_err());

    server.restart().await.unwrap();
    assert_eq!(server.addr(), addr);
    let mut conn = MySqlConnection::connect(&db.url()).await.unwrap();
    let v: String = sqlx::query_scalar("SELECT v FROM t WHERE id = 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "kept");
    conn.close().await.unwrap();
    assert!(
        canary.exists(),
        "private mariadbd cleaned the system temp dir"
    );
    std::fs::remove_file(&canary).unwrap();
    db.drop_db().await.unwrap();

    drop(server);
    assert!(TcpStream::connect(addr).await.is_err());
}

// Checks: sigstop pauses the private MariaDB (a query on an open connection
// hangs) and sigcont resumes it (new connections and queries are answered
// again). How: run SELECT 1 under a short tokio timeout while stopped,
// expect the timeout, then resume and expect SELECT 1 to answer on a new
// connection within FAST; finally a paused server is dropped, which must
// kill it quickly.
#[tokio::test]
async fn private_mariadb_sigstop_sigcont() {
    let server = PrivateMariadb::start().await.unwrap();
    let mut conn = MySqlConnection::connect(&server.url()).await.unwrap();

    server.sigstop().unwrap();
    let paused = tokio::time::timeout(HANG, sqlx::query("SELECT 1").execute(&mut conn)).await;
    assert!(paused.is_err(), "stopped server answered");

    server.sigcont().unwrap();
    // The timed-out query left the connection mid-exchange: use a new one.
    let mut conn = tokio::time::timeout(FAST, MySqlConnection::connect(&server.url()))
        .await
        .expect("resumed server did not answer")
        .unwrap();
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(one, 1);

    // Dropping a paused server must not hang, and must kill it.
    let addr = server.addr();
    server.sigstop().unwrap();
    let started = Instant::now();
    drop(server);
    assert!(
        started.elapsed() < FAST,
        "dropping a stopped server was slow"
    );
    assert!(TcpStream::connect(addr).await.is_err());
}

// Checks: free_port returns a port that can actually be bound. How: bind it.
#[test]
fn free_port_is_bindable() {
    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
}
