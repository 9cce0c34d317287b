//! Read-only looks at the stores and the server process: Redis `INFO commandstats` and
//! `used_memory`, the keys under a prefix, MariaDB's commit counters, and the server's
//! resident memory from /proc. Every counter read here is server-wide: other work on
//! the same Redis or MariaDB shows up in the deltas.

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

async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// A connection to the Redis the server uses.
pub struct RedisProbe {
    conn: MultiplexedConnection,
}

/// What Redis's INFO says at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RedisSnapshot {
    /// Command (lower case, subcommands as `client|setname`) → calls since start.
    pub calls: BTreeMap<String, u64>,
    pub used_memory: Option<u64>,
}

impl RedisProbe {
    pub async fn connect(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("redis {url}: {e}"))?;
        let conn = bounded(
            "connect to redis",
            client.get_multiplexed_async_connection(),
        )
        .await?;
        Ok(Self { conn })
    }

    pub async fn snapshot(&mut self) -> Result<RedisSnapshot, String> {
        let stats: String = bounded(
            "INFO commandstats",
            redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut self.conn),
        )
        .await?;
        let memory: String = bounded(
            "INFO memory",
            redis::cmd("INFO").arg("memory").query_async(&mut self.conn),
        )
        .await?;
        Ok(RedisSnapshot {
            calls: parse_commandstats(&stats),
            used_memory: info_field(&memory, "used_memory"),
        })
    }

    /// How many keys start with `prefix` (None if the walk hit its bound).
    pub async fn count_keys(&mut self, prefix: &str) -> Result<Option<u64>, String> {
        let pattern = format!("{}*", escape_glob(prefix));
        let mut cursor: u64 = 0;
        let mut count = 0u64;
        for _ in 0..SCAN_CALLS_MAX {
            let (next, keys): (u64, Vec<Vec<u8>>) = bounded(
                "SCAN",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut self.conn),
            )
            .await?;
            count += keys.len() as u64;
            if next == 0 {
                return Ok(Some(count));
            }
            cursor = next;
        }
        Ok(None)
    }

    /// Deletes every key starting with `prefix` (a spawned server's own prefix); refuses
    /// an empty prefix. Returns how many were deleted.
    pub async fn delete_prefix(&mut self, prefix: &str) -> Result<u64, String> {
        if prefix.is_empty() {
            return Err("refusing to delete with an empty prefix".into());
        }
        let pattern = format!("{}*", escape_glob(prefix));
        let mut cursor: u64 = 0;
        let mut deleted = 0u64;
        for _ in 0..SCAN_CALLS_MAX {
            let (next, keys): (u64, Vec<Vec<u8>>) = bounded(
                "SCAN",
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut self.conn),
            )
            .await?;
            for batch in keys.chunks(UNLINK_BATCH) {
                let n: u64 = bounded(
                    "UNLINK",
                    redis::cmd("UNLINK").arg(batch).query_async(&mut self.conn),
                )
                .await?;
                deleted += n;
            }
            if next == 0 {
                return Ok(deleted);
            }
            cursor = next;
        }
        Err(format!(
            "stopped after {SCAN_CALLS_MAX} SCAN calls; some keys under {prefix} may remain"
        ))
    }
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

fn escape_glob(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
}
