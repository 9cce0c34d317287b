//! Where each store is, as a person reading a startup message needs it: its address
//! (credentials left out) and the setting that chose it; and the startup's word on a
//! store that does not answer.
//!
//! MariaDB is needed before serving (the migrations): `build` tries it
//! [`STARTUP_DATABASE_ATTEMPTS`] times, then stops naming it. Redis and NATS are not:
//! the service starts without them, says so once naming each, and their clients keep
//! retrying in the background (purchases meanwhile: docs/operations.md).

use std::time::Duration;

use flashsale_app::ports::StockGate;
use flashsale_redis::RedisGate;
use tracing::warn;

use crate::Config;

/// Attempts to reach the database for the migrations at startup, one second apart
/// ([`STARTUP_DATABASE_RETRY`]): rides out a database that starts alongside the service
/// (a container's takes a few seconds, a Galera node's SST longer), then gives up loudly.
pub const STARTUP_DATABASE_ATTEMPTS: u32 = 30;
/// The wait between two of those attempts.
pub const STARTUP_DATABASE_RETRY: Duration = Duration::from_secs(1);
/// How long the startup's look at Redis and NATS may take: a store on this machine or the
/// next answers in milliseconds, so a second without an answer is worth a warning.
const STARTUP_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A store's URL without its credentials, for printing.
pub fn redacted(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut url) => {
            let _ = url.set_password(None);
            let _ = url.set_username("");
            url.to_string()
        }
        Err(_) => "(a URL that does not parse)".to_owned(),
    }
}

/// MariaDB: the URL's server, or a Galera cluster's nodes, with the setting that named it.
pub fn database(config: &Config) -> String {
    match &config.database_cluster {
        Some(cluster) => format!(
            "MariaDB nodes {} (FLASHSALE_DATABASE_NODES; user and database from \
             FLASHSALE_DATABASE_URL)",
            cluster
                .nodes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        None => format!(
            "MariaDB at {} (FLASHSALE_DATABASE_URL)",
            redacted(&config.database_url)
        ),
    }
}

/// Redis: the URL's server, or a Redis Cluster's seed nodes.
pub fn redis(config: &Config) -> String {
    match &config.redis {
        flashsale_redis::Target::Node(url) => {
            format!("Redis at {} (FLASHSALE_REDIS_URL)", redacted(url))
        }
        flashsale_redis::Target::Cluster(nodes) => format!(
            "Redis Cluster at {} (FLASHSALE_REDIS_CLUSTER_NODES)",
            nodes.join(",")
        ),
    }
}

/// NATS: its servers.
pub fn nats(config: &Config) -> String {
    let urls: Vec<String> = config.nats_urls.iter().map(|u| redacted(u)).collect();
    format!("NATS at {} (FLASHSALE_NATS_URL)", urls.join(","))
}

/// The message that stops startup when the database never answered.
pub fn database_gave_up(config: &Config, error: &str) -> String {
    format!(
        "{} did not answer in {STARTUP_DATABASE_ATTEMPTS} attempts, {} apart: {error}",
        database(config),
        humantime::format_duration(STARTUP_DATABASE_RETRY)
    )
}

/// Looks once at Redis and NATS and warns, naming each, when one does not answer: the
/// service serves without them, so nothing else would say at startup where it looked.
pub async fn warn_unreachable(config: &Config, gate: &RedisGate) {
    let redis_error = match tokio::time::timeout(STARTUP_PROBE_TIMEOUT, gate.ping()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no answer within {}",
            humantime::format_duration(STARTUP_PROBE_TIMEOUT)
        )),
    };
    if let Some(error) = redis_error {
        warn!(
            %error,
            "{} does not answer: /readyz answers 503 until it does, and the products being \
             bought switch to ledger mode after FLASHSALE_FALLBACK_AFTER; retried in the \
             background",
            redis(config)
        );
    }
    if !nats_answers(config).await {
        warn!(
            "{} does not answer: orders are still sold, and their events wait in the outbox \
             until it does; retried in the background",
            nats(config)
        );
    }
}

/// Whether a TCP connection to one of the NATS servers opens (the client itself connects
/// in the background and would only say so later).
async fn nats_answers(config: &Config) -> bool {
    for url in &config.nats_urls {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            continue;
        };
        let (Some(host), port) = (parsed.host_str(), parsed.port().unwrap_or(4222)) else {
            continue;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let connect = tokio::net::TcpStream::connect((host, port));
        if let Ok(Ok(_)) = tokio::time::timeout(STARTUP_PROBE_TIMEOUT, connect).await {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    // Checks each store is named by its address, without credentials, and by the setting
    // that chose it; and the database's last word names the attempts and their spacing.
    #[test]
    fn each_store_is_named_with_its_setting() {
        let env: HashMap<String, String> = [
            (
                "FLASHSALE_DATABASE_URL",
                "mysql://app:secret@db.internal:3307/shop",
            ),
            ("FLASHSALE_REDIS_URL", "redis://:pw@cache:6380"),
            ("FLASHSALE_NATS_URL", "nats://bus:4223"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let config = Config::from_parts(None, &env).expect("valid");
        let db = database(&config);
        assert!(db.contains("db.internal:3307") && db.contains("FLASHSALE_DATABASE_URL"));
        assert!(!db.contains("secret") && !db.contains("app"), "{db}");
        let r = redis(&config);
        assert!(
            r.contains("cache:6380") && r.contains("FLASHSALE_REDIS_URL"),
            "{r}"
        );
        assert!(!r.contains("pw"), "{r}");
        let n = nats(&config);
        assert!(
            n.contains("bus:4223") && n.contains("FLASHSALE_NATS_URL"),
            "{n}"
        );
        let last = database_gave_up(&config, "Connection refused");
        assert!(
            last.contains("30 attempts, 1s apart: Connection refused"),
            "{last}"
        );
        assert!(last.contains("FLASHSALE_DATABASE_URL"), "{last}");
    }
}
