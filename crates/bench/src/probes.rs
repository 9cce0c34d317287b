//! Read-only looks at the stores and the server process: Redis `INFO commandstats` and
//! `used_memory`, the keys under a prefix, MariaDB's commit counters, and the server's
//! resident memory from /proc. Every counter read here is server-wide: other work on
//! the same Redis or MariaDB shows up in the deltas. On a Redis Cluster the Redis
//! figures are summed over its primaries.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sqlx::{Connection, MySqlConnection};

/// Keys asked for per SCAN call: few enough that no call blocks the shared Redis
/// noticeably, enough to walk a large keyspace in a reasonable number of calls.
const SCAN_COUNT: u64 = 1000;
/// Most SCAN calls per count (10 million keys looked at): bounds the walk on a huge
/// shared keyspace; a count cut short is reported as unknown.
const SCAN_CALLS_MAX: u64 = 10_000;
/// Most keys deleted per UNLINK call when cleaning up a spawned server's prefix.
const UNLINK_BATCH: usize = 500;
/// Bound on connecting to / querying Redis or MariaDB for a probe, so a hanging store
/// makes the probe report "n/a" instead of hanging the bench.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Commands the bench itself sends to Redis; left out of the server's call count.
const OWN_COMMANDS: [&str; 3] = ["info", "scan", "unlink"];

/// `fut`, bounded by [`PROBE_TIMEOUT`], its error or timeout said with `what`.
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// Connections to the Redis the server uses: the one node, or each primary of a Redis
/// Cluster.
pub struct RedisProbe {
    /// The nodes probed, each by its address (for errors); on a cluster, the primaries
    /// `CLUSTER NODES` named when the probe connected (a failover during the run makes
    /// later figures miss the promoted replica's share).
    nodes: Vec<(String, MultiplexedConnection)>,
    /// A Redis Cluster: keys of different hash slots cannot share one UNLINK.
    cluster: bool,
}

/// What Redis's INFO says at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RedisSnapshot {
    /// Command (lower case, subcommands as `client|setname`) → calls since start.
    pub calls: BTreeMap<String, u64>,
    pub used_memory: Option<u64>,
}

async fn connect_node(url: &str) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|e| format!("redis {url}: {e}"))?;
    bounded(
        &format!("connect to redis {url}"),
        client.get_multiplexed_async_connection(),
    )
    .await
}

impl RedisProbe {
    /// Probes the one Redis at `url`.
    pub async fn connect(url: &str) -> Result<Self, String> {
        let conn = connect_node(url).await?;
        Ok(Self {
            nodes: vec![(url.to_owned(), conn)],
            cluster: false,
        })
    }

    /// Probes the primaries of the Redis Cluster seeded by `seeds` (`host:port`,
    /// comma-separated, as `FLASHSALE_REDIS_CLUSTER_NODES` has them): the first seed
    /// that answers names them (`CLUSTER NODES`), and each is connected to.
    ///
    /// Why every primary: the keys of a sale, and the commands the server sends, are
    /// spread over them by hash slot; replicas hold copies and would count twice.
    pub async fn connect_cluster(seeds: &str) -> Result<Self, String> {
        let mut last = format!("no seed node in {seeds:?}");
        for seed in seeds.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let url = format!("redis://{seed}/");
            let answer = async {
                let mut conn = connect_node(&url).await?;
                bounded(
                    &format!("CLUSTER NODES at {seed}"),
                    redis::cmd("CLUSTER")
                        .arg("NODES")
                        .query_async::<String>(&mut conn),
                )
                .await
            };
            let nodes = match answer.await {
                Ok(text) => text,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let mut probe = Self {
                nodes: Vec::new(),
                cluster: true,
            };
            for addr in cluster_primaries(&nodes) {
                let url = format!("redis://{addr}/");
                probe.nodes.push((addr, connect_node(&url).await?));
            }
            if probe.nodes.is_empty() {
                return Err(format!("CLUSTER NODES at {seed} names no healthy primary"));
            }
            return Ok(probe);
        }
        Err(format!("Redis Cluster {seeds}: {last}"))
    }

    /// Calls per command and used memory, each summed over the nodes probed.
    pub async fn snapshot(&mut self) -> Result<RedisSnapshot, String> {
        let mut sum = RedisSnapshot {
            calls: BTreeMap::new(),
            used_memory: Some(0),
        };
        for (addr, conn) in &mut self.nodes {
            let stats: String = bounded(
                &format!("INFO commandstats at {addr}"),
                redis::cmd("INFO").arg("commandstats").query_async(conn),
            )
            .await?;
            let memory: String = bounded(
                &format!("INFO memory at {addr}"),
                redis::cmd("INFO").arg("memory").query_async(conn),
            )
            .await?;
            for (name, calls) in parse_commandstats(&stats) {
                *sum.calls.entry(name).or_default() += calls;
            }
            sum.used_memory = sum
                .used_memory
                .zip(info_field(&memory, "used_memory"))
                .map(|(a, b)| a + b);
        }
        Ok(sum)
    }

    /// How many keys start with `prefix` (None if a walk hit its bound).
    pub async fn count_keys(&mut self, prefix: &str) -> Result<Option<u64>, String> {
        let pattern = format!("{}*", flashsale_testkit::escape_glob(prefix));
        let mut count = 0u64;
        for (addr, conn) in &mut self.nodes {
            let finished =
                scan_node(addr, conn, &pattern, |keys| count += keys.len() as u64).await?;
            if !finished {
                return Ok(None);
            }
        }
        Ok(Some(count))
    }

    /// Deletes every key starting with `prefix` (a spawned server's own prefix); refuses
    /// an empty prefix. Returns how many were deleted.
    pub async fn delete_prefix(&mut self, prefix: &str) -> Result<u64, String> {
        if prefix.is_empty() {
            return Err("refusing to delete with an empty prefix".into());
        }
        let pattern = format!("{}*", flashsale_testkit::escape_glob(prefix));
        let cluster = self.cluster;
        let mut deleted = 0u64;
        for (addr, conn) in &mut self.nodes {
            let mut found: Vec<Vec<u8>> = Vec::new();
            let finished = scan_node(addr, conn, &pattern, |keys| found.extend(keys)).await?;
            for batch in unlink_batches(found, cluster) {
                let n: u64 = bounded(
                    &format!("UNLINK at {addr}"),
                    redis::cmd("UNLINK").arg(&batch).query_async(conn),
                )
                .await?;
                deleted += n;
            }
            if !finished {
                return Err(format!(
                    "stopped after {SCAN_CALLS_MAX} SCAN calls at {addr}; some keys under {prefix} may remain"
                ));
            }
        }
        Ok(deleted)
    }
}

/// Walks the keys of one node matching `pattern`, handing each SCAN reply's keys to
/// `each`; false when the walk hit its bound before the end.
async fn scan_node(
    addr: &str,
    conn: &mut MultiplexedConnection,
    pattern: &str,
    mut each: impl FnMut(Vec<Vec<u8>>),
) -> Result<bool, String> {
    let mut cursor: u64 = 0;
    for _ in 0..SCAN_CALLS_MAX {
        let (next, keys): (u64, Vec<Vec<u8>>) = bounded(
            &format!("SCAN at {addr}"),
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(conn),
        )
        .await?;
        each(keys);
        if next == 0 {
            return Ok(true);
        }
        cursor = next;
    }
    Ok(false)
}

/// `keys` in UNLINK calls of at most `UNLINK_BATCH`; on a cluster, each call's keys of
/// one hash slot (a multi-key command across slots is refused with CROSSSLOT).
fn unlink_batches(keys: Vec<Vec<u8>>, cluster: bool) -> Vec<Vec<Vec<u8>>> {
    let mut groups: BTreeMap<u16, Vec<Vec<u8>>> = BTreeMap::new();
    for key in keys {
        let slot = if cluster {
            flashsale_testkit::RedisCluster::slot_of(&String::from_utf8_lossy(&key))
        } else {
            0
        };
        groups.entry(slot).or_default().push(key);
    }
    groups
        .into_values()
        .flat_map(|keys| {
            keys.chunks(UNLINK_BATCH)
                .map(<[Vec<u8>]>::to_vec)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The `host:port` of each healthy primary in a `CLUSTER NODES` answer: flagged
/// `master`, not failing (`fail`, `fail?`) nor joining (`handshake`, `noaddr`).
fn cluster_primaries(nodes: &str) -> Vec<String> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags: Vec<&str> = fields.get(2)?.split(',').collect();
            let unhealthy = ["fail", "fail?", "handshake", "noaddr"];
            if !flags.contains(&"master") || flags.iter().any(|f| unhealthy.contains(f)) {
                return None;
            }
            // `ip:port@cport[,hostname]`
            let addr = fields.get(1)?.split(['@', ',']).next()?;
            Some(addr.to_owned())
        })
        .collect()
}

/// Calls per command from `INFO commandstats` text
/// (`cmdstat_get:calls=12,usec=…`).
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(calls) = calls {
            out.insert(name.to_ascii_lowercase(), calls);
        }
    }
    out
}

/// A numeric `field:value` line of INFO output.
pub fn info_field(info: &str, field: &str) -> Option<u64> {
    info.lines().find_map(|line| {
        let (name, value) = line.trim().split_once(':')?;
        (name == field).then(|| value.parse().ok())?
    })
}

/// Calls made between two snapshots, per command, without the bench's own commands.
pub fn calls_delta(before: &RedisSnapshot, after: &RedisSnapshot) -> BTreeMap<String, u64> {
    after
        .calls
        .iter()
        .filter(|(name, _)| !OWN_COMMANDS.contains(&name.as_str()))
        .filter_map(|(name, &n)| {
            let d = n.saturating_sub(before.calls.get(name).copied().unwrap_or(0));
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// Commands that run a script (one round trip each, however many commands the script
/// runs inside).
const SCRIPT_COMMANDS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// Script invocations in a per-command count.
pub fn script_calls(calls: &BTreeMap<String, u64>) -> u64 {
    SCRIPT_COMMANDS.iter().filter_map(|c| calls.get(*c)).sum()
}

/// A MySQL URL split into the server part and the database name:
/// `mysql://root@h:3306/db?x=1` → (`mysql://root@h:3306`, `db`, `?x=1`).
pub fn split_database_url(url: &str) -> Result<(String, String, String), String> {
    let scheme_end = url.find("://").ok_or_else(|| format!("not a URL: {url}"))? + 3;
    let (base, query) = match url.find('?') {
        Some(q) => (&url[..q], &url[q..]),
        None => (url, ""),
    };
    let after_scheme = &base[scheme_end..];
    let (server, db) = match after_scheme.find('/') {
        Some(slash) => (&base[..scheme_end + slash], &after_scheme[slash + 1..]),
        None => (base, ""),
    };
    Ok((server.to_owned(), db.to_owned(), query.to_owned()))
}

/// A connection to the MariaDB server (no database selected).
pub struct MysqlProbe {
    conn: MySqlConnection,
}

/// MariaDB's global commit counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommitCounters {
    pub com_commit: u64,
    pub handler_commit: u64,
}

impl MysqlProbe {
    /// Connects to the server of `database_url` (the database itself need not exist).
    pub async fn connect(database_url: &str) -> Result<Self, String> {
        let (server, _, query) = split_database_url(database_url)?;
        let url = format!("{server}{query}");
        let conn = bounded("connect to MariaDB", MySqlConnection::connect(&url)).await?;
        Ok(Self { conn })
    }

    pub async fn commits(&mut self) -> Result<CommitCounters, String> {
        let rows: Vec<(String, String)> = bounded(
            "SHOW GLOBAL STATUS",
            sqlx::query_as(
                "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Handler_commit')",
            )
            .fetch_all(&mut self.conn),
        )
        .await?;
        let mut c = CommitCounters::default();
        for (name, value) in rows {
            let v: u64 = value
                .parse()
                .map_err(|_| format!("{name} is not a number: {value}"))?;
            match name.as_str() {
                "Com_commit" => c.com_commit = v,
                "Handler_commit" => c.handler_commit = v,
                _ => {}
            }
        }
        Ok(c)
    }

    pub async fn execute(&mut self, sql: &str) -> Result<(), String> {
        bounded(sql, sqlx::query(sql).execute(&mut self.conn))
            .await
            .map(|_| ())
    }

    pub async fn close(self) {
        let _ = tokio::time::timeout(PROBE_TIMEOUT, self.conn.close()).await;
    }
}

/// Most request_ids with several orders listed by [`OrdersProbe::facts`]: any is a
/// violation, a few are enough to investigate.
const DUPLICATES_SHOWN_MAX: u64 = 10;

/// A connection to the server's own database, to read its orders table: the checks that
/// hold for every strategy, the baselines included (no oversell, one order per
/// request_id, acknowledged orders exist).
pub struct OrdersProbe {
    conn: MySqlConnection,
}

/// What the orders table holds for one product.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrderFacts {
    /// Order rows, whatever their status.
    pub orders: u64,
    /// Units in orders not cancelled (PENDING_PAYMENT or PAID).
    pub live_units: i64,
    /// request_ids with more than one order (at most `DUPLICATES_SHOWN_MAX`).
    pub duplicates: Vec<String>,
}

impl OrdersProbe {
    /// Connects to the database of `database_url` (the server's own).
    pub async fn connect(database_url: &str) -> Result<Self, String> {
        let conn = bounded(
            "connect to the server's database",
            MySqlConnection::connect(database_url),
        )
        .await?;
        Ok(Self { conn })
    }

    pub async fn facts(&mut self, product_id: i64) -> Result<OrderFacts, String> {
        let (orders, live_units): (i64, i64) = bounded(
            "count orders",
            sqlx::query_as(
                "SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN status <> 'CANCELLED' \
                 THEN quantity ELSE 0 END), 0) AS SIGNED) FROM orders WHERE product_id = ?",
            )
            .bind(product_id)
            .fetch_one(&mut self.conn),
        )
        .await?;
        let duplicates: Vec<(Vec<u8>,)> = bounded(
            "find request_ids with several orders",
            sqlx::query_as(
                "SELECT request_id FROM orders WHERE product_id = ? GROUP BY request_id \
                 HAVING COUNT(*) > 1 LIMIT ?",
            )
            .bind(product_id)
            .bind(DUPLICATES_SHOWN_MAX)
            .fetch_all(&mut self.conn),
        )
        .await?;
        Ok(OrderFacts {
            orders: u64::try_from(orders).unwrap_or(0),
            live_units,
            duplicates: duplicates
                .into_iter()
                .map(|(r,)| String::from_utf8_lossy(&r).into_owned())
                .collect(),
        })
    }

    /// Up to `limit` (order id, request_id) of the product with ids above `after_id`,
    /// by id.
    pub async fn orders_after(
        &mut self,
        product_id: i64,
        after_id: i64,
        limit: u64,
    ) -> Result<Vec<(i64, String)>, String> {
        let rows: Vec<(i64, Vec<u8>)> = bounded(
            "read orders",
            sqlx::query_as(
                "SELECT id, request_id FROM orders WHERE product_id = ? AND id > ? \
                 ORDER BY id LIMIT ?",
            )
            .bind(product_id)
            .bind(after_id)
            .bind(limit)
            .fetch_all(&mut self.conn),
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, r)| (id, String::from_utf8_lossy(&r).into_owned()))
            .collect())
    }

    pub async fn close(self) {
        let _ = tokio::time::timeout(PROBE_TIMEOUT, self.conn.close()).await;
    }
}

/// A process's memory figures from /proc/<pid>/status.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcMemory {
    pub vm_hwm_kb: Option<u64>,
    pub vm_rss_kb: Option<u64>,
}

/// Parses `VmHWM:  1234 kB` and `VmRSS:  1234 kB` out of /proc/<pid>/status text.
pub fn parse_proc_status(text: &str) -> ProcMemory {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
    };
    ProcMemory {
        vm_hwm_kb: field("VmHWM"),
        vm_rss_kb: field("VmRSS"),
    }
}

/// The memory of process `pid`, if it is readable (Linux, same user, still running).
pub fn proc_memory(pid: u32) -> Option<ProcMemory> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .map(|t| parse_proc_status(&t))
}

/// The memory of several server instances together: each figure summed over the
/// processes that could be read (one that has exited is left out; a peak sum bounds
/// their peak together from above). None when none could be read.
pub fn servers_memory(pids: &[u32]) -> Option<ProcMemory> {
    let read: Vec<ProcMemory> = pids.iter().filter_map(|&pid| proc_memory(pid)).collect();
    if read.is_empty() {
        return None;
    }
    let sum =
        |field: fn(&ProcMemory) -> Option<u64>| read.iter().filter_map(field).reduce(|a, b| a + b);
    Some(ProcMemory {
        vm_hwm_kb: sum(|m| m.vm_hwm_kb),
        vm_rss_kb: sum(|m| m.vm_rss_kb),
    })
}

/// The server's own count of its answers to `endpoint` by outcome, out of `GET /metrics`
/// text (`flashsale_http_responses_total{endpoint="…",outcome="…"} N` lines).
pub fn responses_by_outcome(text: &str, endpoint: &str) -> BTreeMap<String, u64> {
    let prefix = format!("flashsale_http_responses_total{{endpoint=\"{endpoint}\",outcome=\"");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (outcome, value) = rest.split_once("\"} ")?;
            // Counters encode as integers, or as floats ("3.0") in some encoders.
            let n = value.trim().parse::<f64>().ok()?;
            Some((outcome.to_owned(), n as u64))
        })
        .collect()
}

/// The processes whose CPU time a run reads, by name, each with the names its processes
/// go by in `/proc/<pid>/comm`: every process of those names on the machine counts (the
/// stores are the shared ones, whoever else uses them).
pub const CPU_SERVICES: [(&str, &[&str]); 3] = [
    ("redis", &["redis-server"]),
    ("mariadb", &["mariadbd", "mysqld"]),
    ("nats", &["nats-server"]),
];

/// CPU time used so far, in clock ticks (`utime` + `stime`, every thread, from
/// `/proc/<pid>/stat`): the server's, the generator's own, each of `CPU_SERVICES`, and
/// the whole machine's busy time (`/proc/stat`: every CPU's time but idle, iowait and
/// steal).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuSnapshot {
    /// ("server" | "generator" | a name of `CPU_SERVICES`, pid) → ticks; a process that
    /// could not be read is left out.
    pub ticks: BTreeMap<(String, u32), u64>,
    pub machine_busy: Option<u64>,
}

/// Clock ticks per second of `/proc`'s CPU times (`sysconf(_SC_CLK_TCK)`; the kernel's
/// `USER_HZ`, 100 on every Linux this runs on, when it cannot be read).
pub fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf reads a constant of the C library; no memory is touched.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0).unwrap_or(100)
}

/// `(utime, stime)` out of a `/proc/<pid>/stat` line (fields 14 and 15, counted after
/// the command name, which may itself hold spaces and parentheses): the time in user
/// space and in the kernel on the process's behalf.
pub fn parse_stat_times(text: &str) -> Option<(u64, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After ")": field 3 (state) is the first; utime is field 14, stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// `utime + stime` out of a `/proc/<pid>/stat` line ([`parse_stat_times`]).
pub fn parse_stat_ticks(text: &str) -> Option<u64> {
    parse_stat_times(text).map(|(user, kernel)| user + kernel)
}

/// The machine's busy ticks out of `/proc/stat`'s first line (`cpu  user nice system
/// idle iowait irq softirq steal guest guest_nice`): user, nice, system, irq and softirq;
/// not idle or iowait, not steal (time the host gave to someone else), not guest time
/// (`user` already holds it).
pub fn parse_machine_busy(text: &str) -> Option<u64> {
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let field = |i: usize| v.get(i).copied().unwrap_or(0);
    Some(field(0) + field(1) + field(2) + field(5) + field(6))
}

fn stat_times(pid: &str) -> Option<(u64, u64)> {
    parse_stat_times(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn stat_ticks(pid: &str) -> Option<u64> {
    stat_times(pid).map(|(user, kernel)| user + kernel)
}

/// The name under which [`cpu_snapshot`] also counts the servers' kernel time alone
/// (`stime`: system calls, the network stack, scheduling on their behalf): what
/// instruction counts of the server's own code never see.
pub const SERVER_KERNEL: &str = "server-kernel";

/// Most `/proc` entries looked at for the stores' processes: a bound on the walk on a
/// machine with a huge process table.
const PROC_ENTRIES_MAX: usize = 100_000;

/// The CPU ticks used so far by the servers (`server_pids`: none, one, or several
/// instances, summed under "server" by [`cpu_seconds`]), each of the processes `named`
/// under its own name (a private database's nodes: left out of `CPU_SERVICES`' count),
/// this process, every other process of each of `CPU_SERVICES`, and the whole machine.
/// Linux only; elsewhere it is empty.
pub fn cpu_snapshot(server_pids: &[u32], named: &[(String, u32)]) -> CpuSnapshot {
    let mut ticks = BTreeMap::new();
    for &pid in server_pids {
        if let Some((user, kernel)) = stat_times(&pid.to_string()) {
            ticks.insert(("server".to_owned(), pid), user + kernel);
            ticks.insert((SERVER_KERNEL.to_owned(), pid), kernel);
        }
    }
    for (name, pid) in named {
        if let Some(t) = stat_ticks(&pid.to_string()) {
            ticks.insert((name.clone(), *pid), t);
        }
    }
    if let Some(t) = stat_ticks("self") {
        ticks.insert(("generator".to_owned(), std::process::id()), t);
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten().take(PROC_ENTRIES_MAX) {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if named.iter().any(|(_, p)| *p == pid) {
                continue;
            }
            let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
                continue;
            };
            let Some((service, _)) = CPU_SERVICES
                .iter()
                .find(|(_, names)| names.contains(&comm.trim_end()))
            else {
                continue;
            };
            if let Some(t) = stat_ticks(&pid.to_string()) {
                ticks.insert(((*service).to_owned(), pid), t);
            }
        }
    }
    let machine_busy = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_machine_busy(&t));
    CpuSnapshot {
        ticks,
        machine_busy,
    }
}

/// The pid of the `mariadbd` started with `--port=<port>` (a private server of the
/// bench's, whose handle does not say it), if one runs.
pub fn mariadbd_on_port(port: u16) -> Option<u32> {
    let wanted = format!("--port={port}");
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.flatten().take(PROC_ENTRIES_MAX).find_map(|entry| {
        let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        if comm.trim_end() != "mariadbd" {
            return None;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        cmdline
            .split(|&b| b == 0)
            .any(|arg| arg == wanted.as_bytes())
            .then_some(pid)
    })
}

/// CPU seconds per process name between two snapshots ("machine" for the whole
/// machine's busy time), summed over the name's processes: each one's ticks since the
/// first snapshot, or all of them for a process that started since (or whose pid was
/// reused: its ticks went down). A process that exited in between is lost, its last
/// ticks unread; a name with no process in the second snapshot is left out.
pub fn cpu_seconds(before: &CpuSnapshot, after: &CpuSnapshot, hz: u64) -> BTreeMap<String, f64> {
    let hz = hz.max(1) as f64;
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    for ((name, pid), &a) in &after.ticks {
        let b = before.ticks.get(&(name.clone(), *pid)).copied();
        *used.entry(name.clone()).or_insert(0) += b.and_then(|b| a.checked_sub(b)).unwrap_or(a);
    }
    let mut out: BTreeMap<String, f64> = used
        .into_iter()
        .map(|(name, t)| (name, t as f64 / hz))
        .collect();
    if let (Some(b), Some(a)) = (before.machine_busy, after.machine_busy) {
        if let Some(d) = a.checked_sub(b) {
            out.insert("machine".to_owned(), d as f64 / hz);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks parsing of INFO commandstats: calls per command (subcommands kept, names
    // lower-cased), other lines ignored; the delta leaves out the bench's own INFO and
    // SCAN calls and commands that did not move; script calls are counted apart.
    #[test]
    fn commandstats_and_delta() {
        let before = RedisSnapshot {
            calls: parse_commandstats(
                "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=3,usec=1\r\ncmdstat_get:calls=7,usec=1\r\n",
            ),
            used_memory: None,
        };
        assert_eq!(before.calls["evalsha"], 10);
        let after = RedisSnapshot {
            calls: parse_commandstats(
                "cmdstat_evalsha:calls=25,usec=90\ncmdstat_info:calls=9,usec=1\ncmdstat_get:calls=7,usec=1\ncmdstat_client|setname:calls=2,usec=1\ncmdstat_scan:calls=4,usec=1\n",
            ),
            used_memory: None,
        };
        let d = calls_delta(&before, &after);
        assert_eq!(
            d,
            BTreeMap::from([("client|setname".to_owned(), 2), ("evalsha".to_owned(), 15)])
        );
        assert_eq!(script_calls(&d), 15);
    }

    // Checks INFO memory's used_memory is found exactly (not used_memory_rss or
    // used_memory_human).
    #[test]
    fn info_field_is_exact() {
        let info = "# Memory\r\nused_memory_human:1.00M\r\nused_memory:1048576\r\nused_memory_rss:2000000\r\n";
        assert_eq!(info_field(info, "used_memory"), Some(1_048_576));
        assert_eq!(info_field(info, "missing"), None);
    }

    // Checks splitting a database URL into server and database, with and without a
    // query string or a database.
    #[test]
    fn database_url_split() {
        assert_eq!(
            split_database_url("mysql://root@127.0.0.1:3306/flashsale").expect("ok"),
            (
                "mysql://root@127.0.0.1:3306".into(),
                "flashsale".into(),
                String::new()
            )
        );
        assert_eq!(
            split_database_url("mysql://u:p@h/db?ssl-mode=disabled").expect("ok"),
            (
                "mysql://u:p@h".into(),
                "db".into(),
                "?ssl-mode=disabled".into()
            )
        );
        assert_eq!(
            split_database_url("mysql://h:1").expect("ok"),
            ("mysql://h:1".into(), String::new(), String::new())
        );
        assert!(split_database_url("nonsense").is_err());
    }

    // Checks /proc/<pid>/status parsing on a real-looking excerpt, and on this test's
    // own process (which must have a resident size).
    #[test]
    fn proc_status() {
        let text =
            "Name:\tflashsale\nVmPeak:\t  900000 kB\nVmHWM:\t   51234 kB\nVmRSS:\t   40000 kB\n";
        assert_eq!(
            parse_proc_status(text),
            ProcMemory {
                vm_hwm_kb: Some(51_234),
                vm_rss_kb: Some(40_000)
            }
        );
        let me = proc_memory(std::process::id()).expect("own /proc entry");
        assert!(me.vm_rss_kb.unwrap_or(0) > 0);
    }

    // Checks the CPU figures' parsing on real-shaped /proc text: utime + stime of a
    // process whose name holds spaces and a parenthesis; the machine's busy time leaves
    // idle, iowait and steal out; the seconds between two snapshots per name, summed over
    // its processes: one that went on counts its ticks since, one that started since all
    // of its ticks, one that exited nothing; a name seen only before is left out.
    #[test]
    fn cpu_ticks_and_seconds() {
        let stat = "1234 (tokio (rt) 1) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 9 0 100 1000 100 18446744073709551615";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_times(stat), Some((250, 75)));
        assert_eq!(parse_stat_ticks("garbage"), None);
        let proc_stat = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(parse_machine_busy(proc_stat), Some(160));
        let before = CpuSnapshot {
            ticks: BTreeMap::from([
                (("server".into(), 10), 100),
                (("generator".into(), 11), 50),
                (("redis".into(), 12), 900),
                (("redis".into(), 13), 40),
            ]),
            machine_busy: Some(1000),
        };
        let after = CpuSnapshot {
            ticks: BTreeMap::from([
                (("server".into(), 10), 350),
                (("generator".into(), 11), 150),
                // Redis 12 went on, 13 exited, 14 started since; NATS only now.
                (("redis".into(), 12), 960),
                (("redis".into(), 14), 30),
                (("nats".into(), 15), 5),
            ]),
            machine_busy: Some(1600),
        };
        let s = cpu_seconds(&before, &after, 100);
        assert_eq!(
            s,
            BTreeMap::from([
                ("generator".into(), 1.0),
                ("machine".into(), 6.0),
                ("nats".into(), 0.05),
                ("redis".into(), 0.9),
                ("server".into(), 2.5)
            ])
        );
        // This process itself is readable, and counts up.
        let me = std::process::id();
        let snap = cpu_snapshot(&[me], &[("node0".to_owned(), me)]);
        assert!(snap.ticks.contains_key(&("node0".to_owned(), me)));
        assert!(snap.ticks.contains_key(&("server".to_owned(), me)));
        assert!(
            snap.ticks[&(SERVER_KERNEL.to_owned(), me)] <= snap.ticks[&("server".to_owned(), me)]
        );
        assert!(snap.ticks.contains_key(&("generator".to_owned(), me)));
        assert!(snap.machine_busy.is_some());
        assert!(clock_ticks_per_s() > 0);
    }

    // Checks reading the server's answer counts out of /metrics text: only the lines of
    // the endpoint asked for, by outcome, other metrics and comments ignored.
    #[test]
    fn answer_counts_from_metrics_text() {
        let text = "# TYPE flashsale_http_responses counter\n\
            flashsale_http_responses_total{endpoint=\"purchase\",outcome=\"sold_out\"} 1999\n\
            flashsale_http_responses_total{endpoint=\"purchase\",outcome=\"created\"} 100\n\
            flashsale_http_responses_total{endpoint=\"get_order\",outcome=\"ok\"} 5\n\
            flashsale_store_up{store=\"redis\"} 1\n# EOF\n";
        assert_eq!(
            responses_by_outcome(text, "purchase"),
            BTreeMap::from([("created".into(), 100), ("sold_out".into(), 1999)])
        );
    }

    // Checks the primaries a cluster probe connects to are the healthy masters of
    // CLUSTER NODES, addresses without the bus port or hostname: replicas, failed,
    // suspected and joining nodes are left out, and so is a line that does not parse.
    #[test]
    fn healthy_primaries_of_cluster_nodes() {
        let nodes = "\
            a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
            b2 127.0.0.1:7001@17001,host.example master - 0 0 2 connected 5461-10922\n\
            c3 127.0.0.1:7002@17002 master,fail - 0 0 3 disconnected\n\
            d4 127.0.0.1:7003@17003 slave a1 0 0 1 connected\n\
            e5 127.0.0.1:7004@17004 master,fail? - 0 0 5 connected 10923-16383\n\
            f6 :0@0 master,noaddr - 0 0 6 disconnected\n\
            garbage\n";
        assert_eq!(
            cluster_primaries(nodes),
            vec!["127.0.0.1:7000".to_owned(), "127.0.0.1:7001".to_owned()]
        );
    }

    // Checks the cleanup's UNLINK calls: on a cluster each call holds keys of one hash
    // slot (keys of a product share its `{p:<id>}` tag, those of two products do not),
    // no call exceeds UNLINK_BATCH, and every key is deleted once; on one Redis the
    // slots do not matter.
    #[test]
    fn unlink_batches_stay_within_a_slot_on_a_cluster() {
        let key = |p: u32, i: usize| format!("fs_bench_x:{{p:{p}}}:r:{i}").into_bytes();
        let keys: Vec<Vec<u8>> = (0..UNLINK_BATCH + 3)
            .flat_map(|i| [key(1, i), key(2, i)])
            .collect();
        let batches = unlink_batches(keys.clone(), true);
        assert_eq!(batches.len(), 4);
        for batch in &batches {
            assert!(batch.len() <= UNLINK_BATCH);
            let slot =
                |k: &Vec<u8>| flashsale_testkit::RedisCluster::slot_of(&String::from_utf8_lossy(k));
            assert!(batch.iter().all(|k| slot(k) == slot(&batch[0])));
        }
        let mut all: Vec<Vec<u8>> = batches.into_iter().flatten().collect();
        let mut want = keys.clone();
        all.sort();
        want.sort();
        assert_eq!(all, want);
        assert_eq!(unlink_batches(keys, false).len(), 3);
    }
}
