//! The settings whose values have rules of their own: each is a newtype that serde
//! reads from the setting's [`Text`] by `TryFrom`, and a bad one is refused with a
//! message that quotes it and says what is allowed.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::HeaderName;
use flashsale_app::baseline::Strategy;
use flashsale_core::AdminName;
use serde::de::{self, Deserialize, Deserializer, Visitor};

/// A setting's text: a variable's, a string in the file, or a whole number in the file
/// as its digits.
pub(super) struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl Visitor<'_> for TextVisitor {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or a whole number")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Text, E> {
        Ok(Text(text.to_owned()))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Text, E> {
        Ok(Text(n.to_string()))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Text, E> {
        Ok(Text(n.to_string()))
    }
}

/// A whole number from `LO` to `HI`.
pub(super) struct Count<const LO: u64, const HI: u64>(pub u64);

impl<'de, const LO: u64, const HI: u64> Deserialize<'de> for Count<LO, HI> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Text(text) = Text::deserialize(deserializer)?;
        let n: u64 =
            (text.trim().parse()).map_err(|_| de::Error::custom(not(&text, "a whole number")))?;
        if n < LO || n > HI {
            return Err(de::Error::custom(format!(
                "{text} is not between {LO} and {HI}"
            )));
        }
        Ok(Self(n))
    }
}

/// Newtypes `Name(Value)` read from a setting's [`Text`] by `parse` (`&str` to the value,
/// or what is wrong with it).
macro_rules! read_by {
    ($($(#[$doc:meta])* $name:ident($value:ty) = $parse:expr;)*) => {$(
        $(#[$doc])*
        #[derive(serde::Deserialize)]
        #[serde(try_from = "Text")]
        pub(super) struct $name(pub $value);

        impl TryFrom<Text> for $name {
            type Error = String;

            fn try_from(text: Text) -> Result<Self, String> {
                let parse: fn(&str) -> Result<$value, String> = $parse;
                parse(&text.0).map(Self)
            }
        }
    )*};
}

read_by! {
    /// A duration as humantime reads it: `2s`, `500ms`, `1h30m`.
    Period(Duration) = duration;
    /// A duration, or `off` (None).
    OrOff(Option<Duration>) = |text| {
        if text.trim() == "off" {
            return Ok(None);
        }
        duration(text).map(Some)
    };
    Addr(SocketAddr) = |text| {
        text.parse().map_err(|_| not(text, "an address like 127.0.0.1:8080"))
    };
    Header(HeaderName) = |text| {
        HeaderName::from_bytes(text.trim().as_bytes()).map_err(|_| not(text, "a header name"))
    };
    Strat(Strategy) = |text| Strategy::parse(text).ok_or_else(|| not(text, STRATEGIES));
    /// `FLASHSALE_REDIS_URL`: one Redis server.
    RedisUrl(String) = |text| url_of(text, &["redis://", "rediss://"]);
    /// `FLASHSALE_DATABASE_URL`: MariaDB, with the user, password and database.
    DatabaseUrl(String) = |text| url_of(text, &["mysql://"]);
    /// `FLASHSALE_REDIS_CLUSTER_NODES`: `host:port` seed nodes, comma-separated, at least
    /// one and at most [`flashsale_redis::CLUSTER_SEEDS_MAX`].
    RedisNodes(Vec<String>) = redis_nodes;
    /// `FLASHSALE_DATABASE_NODES`: a Galera cluster's nodes in order of preference.
    DatabaseNodes(Vec<flashsale_mysql::NodeAddr>) = |text| {
        let most = flashsale_mysql::NODES_MAX;
        flashsale_mysql::NodeAddr::parse_list(text)
            .map_err(|message| format!("{message} (comma-separated, at most {most})"))
    };
    /// `FLASHSALE_NATS_URL`: the servers of one NATS deployment.
    NatsUrls(Vec<String>) = flashsale_nats::server_urls;
    /// `FLASHSALE_REDIS_PREFIX`: braces would make it a cluster hash tag, and it is
    /// repeated in every key.
    RedisPrefix(String) = |text| {
        let bad = text.contains(['{', '}', ' ']) || text.len() > REDIS_PREFIX_LEN_MAX;
        let allowed = "characters, without braces or spaces";
        given(text, bad, format!("{text:?}: at most {REDIS_PREFIX_LEN_MAX} {allowed}"))
    };
    /// `FLASHSALE_NATS_SUBJECT_PREFIX`: dot-separated tokens, no wildcards.
    SubjectPrefix(String) = |text| nats_name(text, true, ", in tokens separated by single dots");
    /// `FLASHSALE_NATS_STREAM`: one token (a dot would be read as a subject).
    StreamName(String) = |text| nats_name(text, false, "");
    /// `FLASHSALE_ADMIN_TOKEN`. Only visible ASCII can be sent in an Authorization header
    /// as it is: a token with whitespace or other characters could never be presented.
    /// The message does not quote it: it is a secret.
    AdminToken(String) = admin_token;
    /// `FLASHSALE_ADMIN_TOKENS`: `name:token` pairs, comma-separated, each admin named in
    /// the operator's log by its token's name. Tokens are secrets: never quoted.
    AdminTokenList(Vec<(AdminName, String)>) = admin_tokens;
    /// `FLASHSALE_BUYER_JWT_ISSUER` and `…_AUDIENCE`: compared with the token's claim as
    /// they are, so a blank one or one with surrounding spaces is a typo no token matches.
    Claim(String) = |text| {
        let bad = text.trim().is_empty() || text.trim() != text;
        given(text, bad, format!("{text:?} must be non-empty, without surrounding spaces"))
    };
}

/// What `FLASHSALE_STRATEGY` takes.
const STRATEGIES: &str = "flashsale, or a benchmark baseline: db-pessimistic, \
     db-conditional, db-optimistic, redis-lock, redis-lua, http-post-ceiling";
/// Longest Redis key prefix: it is repeated in every key.
const REDIS_PREFIX_LEN_MAX: usize = 64;
/// Longest NATS subject prefix and stream name: both are repeated in every subject or
/// API request, and JetStream stores the stream name in its file paths.
const NATS_NAME_LEN_MAX: usize = 64;
/// Shortest admin token: a guessable one would hand out the shop.
const ADMIN_TOKEN_LEN_MIN: usize = 8;

/// Most named admin tokens: every admin request compares each of them (a SHA-256 of a
/// few bytes, about a quarter of a microsecond), and a shop has a few operators.
pub(super) const ADMIN_TOKENS_MAX: usize = 32;

/// An admin token: visible ASCII (only that can be sent in an Authorization header as
/// it is) and not short. The message does not quote it: it is a secret.
fn admin_token(text: &str) -> Result<String, String> {
    let bad = text.len() < ADMIN_TOKEN_LEN_MIN || !text.bytes().all(|b| b.is_ascii_graphic());
    let allowed = "characters, visible ASCII only (no whitespace)";
    given(
        text,
        bad,
        format!("must be at least {ADMIN_TOKEN_LEN_MIN} {allowed}"),
    )
}

/// `name:token,name:token…`: at most [`ADMIN_TOKENS_MAX`], names and tokens each
/// distinct (a token that named two admins would log the wrong one).
fn admin_tokens(text: &str) -> Result<Vec<(AdminName, String)>, String> {
    let pairs: Vec<&str> = text.split(',').map(str::trim).collect();
    if pairs.len() > ADMIN_TOKENS_MAX {
        return Err(format!(
            "at most {ADMIN_TOKENS_MAX} name:token pairs, not {}",
            pairs.len()
        ));
    }
    let mut tokens: Vec<(AdminName, String)> = Vec::with_capacity(pairs.len());
    for (i, pair) in pairs.into_iter().enumerate() {
        let n = i + 1;
        let (name, token) = pair
            .split_once(':')
            .ok_or_else(|| format!("pair {n} is not name:token (comma-separated pairs)"))?;
        let name = AdminName::parse("name", name).map_err(|e| format!("pair {n}: {}", e.reason))?;
        let token = admin_token(token).map_err(|e| format!("pair {n}'s token {e}"))?;
        if tokens.iter().any(|(other, _)| *other == name) {
            return Err(format!("the name {name} is given twice"));
        }
        if tokens.iter().any(|(_, other)| *other == token) {
            return Err(format!("pair {n}'s token is another pair's too"));
        }
        tokens.push((name, token));
    }
    Ok(tokens)
}

/// `text` as it is, unless `bad`: then `refusal`.
fn given(text: &str, bad: bool, refusal: String) -> Result<String, String> {
    if bad {
        return Err(refusal);
    }
    Ok(text.to_owned())
}

/// The refusal of `text`, which is not `expected`.
fn not(text: &str, expected: &str) -> String {
    format!("{text:?} is not {expected}")
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{} ({e})", not(text, "a duration like 15m, 2s, 500ms")))
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

fn redis_nodes(text: &str) -> Result<Vec<String>, String> {
    let nodes: Vec<&str> = text.split(',').map(str::trim).collect();
    let most = flashsale_redis::CLUSTER_SEEDS_MAX;
    if nodes.len() > most {
        return Err(format!("at most {most} seed nodes, not {}", nodes.len()));
    }
    let node = |node: &str| {
        let bad =
            || format!("{node:?} is not a node like 127.0.0.1:7000 (host:port, comma-separated)");
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
    nodes.into_iter().map(node).collect()
}

/// `text` if it is 1..=NATS_NAME_LEN_MAX letters, digits, `_` and `-`, with single dots
/// between such tokens when `dots` (a subject prefix; never wildcards or spaces).
fn nats_name(text: &str, dots: bool, tokens: &str) -> Result<String, String> {
    let token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    let ok = text.len() <= NATS_NAME_LEN_MAX
        && if dots {
            text.split('.').all(token)
        } else {
            token(text)
        };
    let allowed = "characters: letters, digits, _ and -";
    given(
        text,
        !ok,
        format!("{text:?}: at most {NATS_NAME_LEN_MAX} {allowed}{tokens}"),
    )
}
