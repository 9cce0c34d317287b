//! The settings whose values have rules of their own: each is read from its text (a
//! variable's, or a string in the file; a whole number in the file is read as its
//! digits), and a bad one is refused with a message that quotes it and says what is
//! allowed.

use std::fmt;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderName;
use flashsale_app::baseline::Strategy;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// How a kind of setting is read from its text: a type that reads itself, or a rule
/// (an empty enum) that reads a `String` or a list.
pub(super) trait FromText {
    /// What it reads into.
    type Value;
    /// What a good value looks like: the message for a value of another type (a table
    /// or a boolean in the file).
    const EXPECTED: &'static str;

    /// The value, or what is wrong with `text`, quoting it.
    fn from_text(text: &str) -> Result<Self::Value, String>;
}

/// A setting read by the rule `T`.
pub(super) struct Parsed<T: FromText>(pub T::Value);

impl<'de, T: FromText> Deserialize<'de> for Parsed<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(TextVisitor::<T>(PhantomData))
            .map(Parsed)
    }
}

struct TextVisitor<T>(PhantomData<T>);

impl<T: FromText> Visitor<'_> for TextVisitor<T> {
    type Value = T::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T::Value, E> {
        T::from_text(text).map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T::Value, E> {
        self.visit_str(&n.to_string())
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T::Value, E> {
        self.visit_str(&n.to_string())
    }
}

/// A duration as humantime reads it: `2s`, `500ms`, `1h30m`.
impl FromText for Duration {
    type Value = Self;
    const EXPECTED: &'static str = "a duration like 15m, 2s, 500ms";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        humantime::parse_duration(text.trim())
            .map_err(|e| format!("{text:?} is not {} ({e})", Self::EXPECTED))
    }
}

/// A duration, or `off` (None).
pub(super) enum OrOff {}

impl FromText for OrOff {
    type Value = Option<Duration>;
    const EXPECTED: &'static str = "off, or a duration like 15m, 2s, 500ms";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if text.trim() == "off" {
            return Ok(None);
        }
        Duration::from_text(text).map(Some)
    }
}

/// A whole number (its bounds are the rules' business).
impl FromText for u64 {
    type Value = Self;
    const EXPECTED: &'static str = "a whole number";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        text.trim()
            .parse()
            .map_err(|_| format!("{text:?} is not {}", Self::EXPECTED))
    }
}

impl FromText for SocketAddr {
    type Value = Self;
    const EXPECTED: &'static str = "an address like 127.0.0.1:8080";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        text.parse()
            .map_err(|_| format!("{text:?} is not {}", Self::EXPECTED))
    }
}

impl FromText for HeaderName {
    type Value = Self;
    const EXPECTED: &'static str = "a header name";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        HeaderName::from_bytes(text.trim().as_bytes())
            .map_err(|_| format!("{text:?} is not {}", Self::EXPECTED))
    }
}

impl FromText for Strategy {
    type Value = Self;
    const EXPECTED: &'static str = "flashsale, or a benchmark baseline: db-pessimistic, \
         db-conditional, db-optimistic, redis-lock, redis-lua, http-post-ceiling";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        Strategy::parse(text).ok_or_else(|| format!("{text:?} is not {}", Self::EXPECTED))
    }
}

/// `text` if it starts with one of `schemes`.
fn url_of(text: &str, schemes: &[&str]) -> Result<String, String> {
    if schemes.iter().any(|scheme| text.starts_with(scheme)) {
        return Ok(text.to_owned());
    }
    Err(format!(
        "{text:?} does not start with {}",
        schemes.join(" or ")
    ))
}

/// `FLASHSALE_REDIS_URL`: one Redis server.
pub(super) enum RedisUrl {}

impl FromText for RedisUrl {
    type Value = String;
    const EXPECTED: &'static str = "a URL starting with redis:// or rediss://";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        url_of(text, &["redis://", "rediss://"])
    }
}

/// `FLASHSALE_DATABASE_URL`: MariaDB, with the user, password and database.
pub(super) enum DatabaseUrl {}

impl FromText for DatabaseUrl {
    type Value = String;
    const EXPECTED: &'static str = "a URL starting with mysql://";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        url_of(text, &["mysql://"])
    }
}

/// `FLASHSALE_REDIS_CLUSTER_NODES`: `host:port` seed nodes, comma-separated, at least
/// one and at most [`flashsale_redis::CLUSTER_SEEDS_MAX`].
pub(super) enum RedisNodes {}

impl FromText for RedisNodes {
    type Value = Vec<String>;
    const EXPECTED: &'static str = "host:port nodes, comma-separated";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        let nodes: Vec<&str> = text.split(',').map(str::trim).collect();
        let most = flashsale_redis::CLUSTER_SEEDS_MAX;
        if nodes.len() > most {
            return Err(format!("at most {most} seed nodes, not {}", nodes.len()));
        }
        let node = |node: &str| {
            let bad = || {
                format!("{node:?} is not a node like 127.0.0.1:7000 (host:port, comma-separated)")
            };
            let (host, port) = node.rsplit_once(':').ok_or_else(bad)?;
            let host_ok = !host.is_empty()
                && host.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':')
                });
            match port.parse::<u16>() {
                Ok(p) if p > 0 && host_ok => Ok(node.to_owned()),
                _ => Err(bad()),
            }
        };
        nodes.into_iter().map(node).collect::<Result<_, _>>()
    }
}

/// `FLASHSALE_DATABASE_NODES`: a Galera cluster's nodes in order of preference.
pub(super) enum DatabaseNodes {}

impl FromText for DatabaseNodes {
    type Value = Vec<flashsale_mysql::NodeAddr>;
    const EXPECTED: &'static str = "host:port nodes, comma-separated";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        let most = flashsale_mysql::NODES_MAX;
        flashsale_mysql::NodeAddr::parse_list(text)
            .map_err(|message| format!("{message} (comma-separated, at most {most})"))
    }
}

/// `FLASHSALE_NATS_URL`: the servers of one NATS deployment.
pub(super) enum NatsUrls {}

impl FromText for NatsUrls {
    type Value = Vec<String>;
    const EXPECTED: &'static str = "nats:// URLs, comma-separated";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        flashsale_nats::server_urls(text)
    }
}

/// Longest Redis key prefix: it is repeated in every key.
const REDIS_PREFIX_LEN_MAX: usize = 64;

/// `FLASHSALE_REDIS_PREFIX`: braces would make it a cluster hash tag, and it is repeated
/// in every key.
pub(super) enum RedisPrefix {}

impl FromText for RedisPrefix {
    type Value = String;
    const EXPECTED: &'static str = "a Redis key prefix";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if text.contains(['{', '}', ' ']) || text.len() > REDIS_PREFIX_LEN_MAX {
            return Err(format!(
                "{text:?}: at most {REDIS_PREFIX_LEN_MAX} characters, without braces or spaces"
            ));
        }
        Ok(text.to_owned())
    }
}

/// Longest NATS subject prefix and stream name: both are repeated in every subject or
/// API request, and JetStream stores the stream name in its file paths.
const NATS_NAME_LEN_MAX: usize = 64;

/// Whether `s` is 1..=NATS_NAME_LEN_MAX letters, digits, `_` and `-`, with single dots
/// between such tokens when `dots` (a subject prefix; never wildcards or spaces).
fn nats_name(s: &str, dots: bool) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    s.len() <= NATS_NAME_LEN_MAX
        && if dots {
            s.split('.').all(token)
        } else {
            token(s)
        }
}

/// `FLASHSALE_NATS_SUBJECT_PREFIX`: dot-separated tokens, no wildcards.
pub(super) enum SubjectPrefix {}

impl FromText for SubjectPrefix {
    type Value = String;
    const EXPECTED: &'static str = "a NATS subject prefix";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if !nats_name(text, true) {
            return Err(format!(
                "{text:?}: at most {NATS_NAME_LEN_MAX} characters: letters, digits, _ and -, \
                 in tokens separated by single dots"
            ));
        }
        Ok(text.to_owned())
    }
}

/// `FLASHSALE_NATS_STREAM`: one token (a dot would be read as a subject).
pub(super) enum StreamName {}

impl FromText for StreamName {
    type Value = String;
    const EXPECTED: &'static str = "a JetStream stream name";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if !nats_name(text, false) {
            return Err(format!(
                "{text:?}: at most {NATS_NAME_LEN_MAX} characters: letters, digits, _ and -"
            ));
        }
        Ok(text.to_owned())
    }
}

/// Shortest admin token: a guessable one would hand out the shop.
const ADMIN_TOKEN_LEN_MIN: usize = 8;

/// `FLASHSALE_ADMIN_TOKEN`. Only visible ASCII can be sent in an Authorization header as
/// it is: a token with whitespace or other characters could never be presented. The
/// message does not quote it: it is a secret.
pub(super) enum AdminToken {}

impl FromText for AdminToken {
    type Value = String;
    const EXPECTED: &'static str = "a token";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if text.len() < ADMIN_TOKEN_LEN_MIN || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "must be at least {ADMIN_TOKEN_LEN_MIN} characters, visible ASCII only (no \
                 whitespace)"
            ));
        }
        Ok(text.to_owned())
    }
}

/// `FLASHSALE_BUYER_JWT_ISSUER` and `…_AUDIENCE`: compared with the token's claim as they
/// are, so a blank one or one with surrounding spaces is a typo no token matches.
pub(super) enum Claim {}

impl FromText for Claim {
    type Value = String;
    const EXPECTED: &'static str = "a claim's value";

    fn from_text(text: &str) -> Result<Self::Value, String> {
        if text.trim().is_empty() || text.trim() != text {
            return Err(format!(
                "{text:?} must be non-empty, without surrounding spaces"
            ));
        }
        Ok(text.to_owned())
    }
}
