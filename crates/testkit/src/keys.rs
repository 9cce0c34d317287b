use redis::{ErrorKind, RedisError, RedisResult};

/// Keys asked for per SCAN call, and the most keys deleted per UNLINK call:
/// big enough to clean up thousands of keys in a few round trips, small
/// enough that no single command blocks the shared Redis noticeably.
const DELETE_BATCH: usize = 500;

/// Returns a fresh key prefix `fs_test_<random hex>:`.
///
/// Why: tests share one Redis; if every key a test writes starts with its own
/// prefix, tests cannot see or break each other's keys, and
/// [`delete_prefix`] can clean up exactly what the test wrote.
pub fn redis_prefix() -> String {
    format!("fs_test_{:016x}:", rand::random::<u64>())
}

/// Deletes every key starting with `prefix` on the Redis at `redis_url`,
/// walking the keyspace with SCAN and deleting with UNLINK in batches of at
/// most `DELETE_BATCH` (500) keys.
///
/// Why: tests clean up their keys on the shared Redis without `FLUSHDB`
/// (which would wipe other tests' keys) and without `KEYS` (which blocks the
/// server). Glob characters in `prefix` are escaped, so only keys that
/// literally start with it are matched. An empty prefix is refused, since it
/// would delete everything.
pub async fn delete_prefix(redis_url: &str, prefix: &str) -> RedisResult<()> {
    if prefix.is_empty() {
        return Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "delete_prefix refuses an empty prefix: it would delete every key",
        )));
    }
    let client = redis::Client::open(redis_url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let pattern = format!("{}*", escape_glob(prefix));
    let mut cursor: u64 = 0;
    // SCAN's contract is that a full iteration ends with cursor 0 after a
    // finite number of calls, so this loop ends without an extra bound.
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(DELETE_BATCH)
            .query_async(&mut conn)
            .await?;
        for batch in keys.chunks(DELETE_BATCH) {
            let _: i64 = redis::cmd("UNLINK")
                .arg(batch)
                .query_async(&mut conn)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Escapes Redis glob metacharacters (`*?[]\`) so `s` matches itself (the tests' key
/// cleanup, and the bench's probes of one run's keys).
pub fn escape_glob(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_unique_and_well_formed() {
        let a = redis_prefix();
        let b = redis_prefix();
        assert_ne!(a, b);
        assert!(a.starts_with("fs_test_") && a.ends_with(':'));
        assert_eq!(a.len(), "fs_test_".len() + 16 + 1);
    }

    #[test]
    fn escapes_glob_characters() {
        assert_eq!(escape_glob("a*b?[c]\\:"), "a\\*b\\?\\[c\\]\\\\:");
        assert_eq!(escape_glob("fs_test_ab:"), "fs_test_ab:");
    }
}
