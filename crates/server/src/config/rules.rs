//! flashsale's own rules on the settings: the bounds of each value and the rules between
//! values, each refused under the name of the setting the user chose, with the value
//! given; and the settings that become something else (the buyer authentication, the
//! rate limits, the stores' targets).

use std::path::Path;
use std::time::Duration;

use flashsale_api::auth::{BuyerAuth, ExpectedClaims, JwtVerifier};
use flashsale_app::limit::Rate;
use humantime::format_duration;

use super::settings::{BuyerMode, Settings};
use super::sources::Origin;
use super::ConfigError;

/// A duration's bounds, and their reason (shown after a refusal).
#[derive(Clone, Copy)]
struct Span {
    min: Duration,
    max: Duration,
    why: &'static str,
}

const fn span(min: Duration, max: Duration, why: &'static str) -> Span {
    Span { min, max, why }
}

/// The shortest duration of most settings: zero would time out at once, or spin a
/// worker.
const NANO: Duration = Duration::from_nanos(1);
/// Any duration but zero.
const POSITIVE: Span = span(NANO, Duration::MAX, "");
/// `FLASHSALE_AUDIT_EVERY`: more often than a minute an audit of every product (each
/// one's facts read from both stores) would weigh on a sale for little news; a month
/// apart it would find a problem too late to act on.
const AUDIT_EVERY: Span = span(
    Duration::from_secs(60),
    Duration::from_secs(30 * 86_400),
    " (or off)",
);
/// `FLASHSALE_SALE_RETIRE_AFTER`: at least a second (zero is refused rather than read
/// as "off", which is spelled `off`: a zero grace is easily a typo); at most a month,
/// past which the records' own TTL is the nearer bound for most deployments.
const SALE_RETIRE_AFTER: Span = span(
    Duration::from_secs(1),
    Duration::from_secs(30 * 86_400),
    " (or off)",
);
/// `FLASHSALE_DATABASE_FAILBACK_AFTER`: meanwhile an instance started after a failover
/// writes through another node than the older ones, which costs retries.
const DATABASE_FAILBACK: Span = span(NANO, Duration::from_secs(3600), "");
/// `FLASHSALE_FALLBACK_AFTER` and `…_RECOVER_AFTER`: at least two probes of the
/// fallback worker, so one lost probe never switches a product; an hour of a sale lost
/// to waiting is no fallback.
const FALLBACK: Span = span(Duration::from_millis(500), Duration::from_secs(3600), "");
/// `FLASHSALE_HEADER_TIMEOUT`: a slow client holds its connection this long.
const HEADER_TIMEOUT: Span = span(
    NANO,
    Duration::from_secs(300),
    " (a slow client holds its connection this long)",
);
/// `FLASHSALE_SOLD_OUT_LEASE`: units given back during a lease wait for its end, so a
/// longer one would hold stock back where buyers notice.
const SOLD_OUT_LEASE: Span = span(
    Duration::ZERO,
    Duration::from_secs(5),
    " (units given back wait for the lease's end); 0 turns sold-out leases off",
);
/// `FLASHSALE_REDIS_RECORD_TTL`: a year outlives any payment window and any sale by far,
/// and each record holds its bytes for its whole lifetime, so a slip of the unit
/// (`24000h`) is refused at startup instead of filling Redis.
const REDIS_RECORD_TTL: Span = span(NANO, Duration::from_secs(365 * 86_400), "");

impl Span {
    /// What is wrong with `d`, if anything.
    fn refusal(&self, d: Duration) -> Option<String> {
        let (min, max, why) = (
            format_duration(self.min),
            format_duration(self.max),
            self.why,
        );
        if d.is_zero() && self.min == NANO {
            Some("is not longer than zero".to_owned())
        } else if d > self.max && self.min <= NANO {
            Some(format!("is longer than {max}{why}"))
        } else if d < self.min || d > self.max {
            Some(format!("is not between {min} and {max}{why}"))
        } else {
            None
        }
    }
}

/// The header naming the buyer in the `header` mode, unless `FLASHSALE_BUYER_HEADER`
/// names another.
const BUYER_HEADER_DEFAULT: &str = "x-user-id";
/// Largest public key file read: a 4096-bit RSA key's PEM is about 800 bytes.
const PUBLIC_KEY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Every rule on the settings but the buyer authentication's ([`buyer_auth`]) and the
/// whole numbers' bounds (their types', `settings.rs`).
pub(super) fn check(s: &Settings, o: &Origin) -> Result<(), ConfigError> {
    periods(s, o)?;
    listeners(s, o)?;
    admins(s, o)?;
    if s.redis_record_ttl.0 <= s.payment_timeout.0 {
        return Err(record_outlives_payment(o));
    }
    if s.recovery_after.0 <= s.request_timeout.0 {
        // An attempt may still be working on its hold until its deadline; recovery must
        // not fence it before then.
        let timeout = o.given("request_timeout");
        let message = format!("is not longer than the request timeout ({timeout})");
        return Err(refuse(o, "recovery_after", &message));
    }
    if s.fallback_after
        .0
        .is_some_and(|after| s.fallback_recover_after.0 < after)
    {
        let message = "is shorter than FLASHSALE_FALLBACK_AFTER (the way back no quicker than \
                       the way in, or a Redis that drops out for a moment makes the mode thrash)";
        return Err(refuse(o, "fallback_recover_after", message));
    }
    proxy(s, o)
}

/// The one admin token beside the named ones: named `admin`, so no named token may take
/// that name, and no named token may be it (it would log the wrong admin). The messages
/// quote no token.
fn admins(s: &Settings, o: &Origin) -> Result<(), ConfigError> {
    let (Some(single), Some(named)) = (&s.admin_token, &s.admin_tokens) else {
        return Ok(());
    };
    let admin = flashsale_core::AdminName::default();
    if named.0.iter().any(|(name, _)| *name == admin) {
        let message = format_args!("names `{admin}`, the name of FLASHSALE_ADMIN_TOKEN's token");
        return Err(o.refuse("admin_tokens", message));
    }
    if named.0.iter().any(|(_, token)| *token == single.0) {
        let message = "holds FLASHSALE_ADMIN_TOKEN's token under another name";
        return Err(o.refuse("admin_tokens", message));
    }
    Ok(())
}

/// The refusal of `key`: its name, the value given, and `message`.
fn refuse(o: &Origin, key: &str, message: &str) -> ConfigError {
    o.refuse(key, format_args!("{} {message}", o.given(key)))
}

/// Each duration within its [`Span`].
fn periods(s: &Settings, o: &Origin) -> Result<(), ConfigError> {
    // One row a duration: its key, its value (None: off), its span.
    #[rustfmt::skip]
    let bounds = [
        ("payment_timeout", Some(s.payment_timeout.0), POSITIVE),
        ("redis_record_ttl", Some(s.redis_record_ttl.0), REDIS_RECORD_TTL),
        ("sold_out_lease", Some(s.sold_out_lease.0), SOLD_OUT_LEASE),
        ("database_failback_after", Some(s.database_failback_after.0), DATABASE_FAILBACK),
        ("request_timeout", Some(s.request_timeout.0), POSITIVE),
        ("header_timeout", Some(s.header_timeout.0), HEADER_TIMEOUT),
        ("recovery_after", Some(s.recovery_after.0), POSITIVE),
        ("expiry_interval", Some(s.expiry_interval.0), POSITIVE),
        ("recovery_interval", Some(s.recovery_interval.0), POSITIVE),
        ("gate_watch_interval", Some(s.gate_watch_interval.0), POSITIVE),
        ("reconcile_interval", Some(s.reconcile_interval.0), POSITIVE),
        ("outbox_pending_max", Some(s.outbox_pending_max.0), POSITIVE),
        ("audit_every", s.audit_every.0, AUDIT_EVERY),
        ("sale_retire_after", s.sale_retire_after.0, SALE_RETIRE_AFTER),
        ("fallback_after", s.fallback_after.0, FALLBACK),
        ("fallback_recover_after", Some(s.fallback_recover_after.0), FALLBACK),
    ];
    for (key, d, span) in bounds {
        if let Some(refusal) = d.and_then(|d| span.refusal(d)) {
            return Err(refuse(o, key, &refusal));
        }
    }
    Ok(())
}

/// The operator's listener apart from the API's: the same port on the same address, or
/// on any address when either binds them all (0.0.0.0, ::), would fail to bind after
/// startup's work.
fn listeners(s: &Settings, o: &Origin) -> Result<(), ConfigError> {
    let (listen, Some(metrics)) = (s.listen.0, s.metrics_listen.as_ref().map(|m| m.0)) else {
        return Ok(());
    };
    let overlap = metrics.ip() == listen.ip()
        || metrics.ip().is_unspecified()
        || listen.ip().is_unspecified();
    if metrics.port() != 0 && metrics.port() == listen.port() && overlap {
        let message = format!("overlaps the API's listen address {listen}");
        return Err(refuse(o, "metrics_listen", &message));
    }
    Ok(())
}

/// The refusal of a Redis record TTL not longer than the payment timeout, under the name
/// of the setting the user chose: the TTL when it was set, else the payment timeout (a
/// user who set only `FLASHSALE_PAYMENT_TIMEOUT=2y` is told about that one), with the
/// rule between the two. A hold record must outlive its order's payment window:
/// returning the stock of an unpaid order exactly once relies on the record.
fn record_outlives_payment(o: &Origin) -> ConfigError {
    let (timeout_name, timeout) = (o.name("payment_timeout"), o.given("payment_timeout"));
    let (ttl_name, ttl) = (o.name("redis_record_ttl"), o.given("redis_record_ttl"));
    let rule = format!(
        "a purchase's hold record in Redis must outlive its order's payment window, so \
         the payment timeout must be shorter than FLASHSALE_REDIS_RECORD_TTL, which is at \
         most {}",
        format_duration(REDIS_RECORD_TTL.max)
    );
    if o.is_set("redis_record_ttl") {
        let message =
            format!("is not longer than the payment timeout ({timeout_name}={timeout}): {rule}");
        refuse(o, "redis_record_ttl", &message)
    } else {
        let message = format!("is not shorter than {ttl_name} ({ttl}, its default): {rule}");
        refuse(o, "payment_timeout", &message)
    }
}

/// The client address header and the per-address connection limit, both about clients
/// behind a proxy: the header is read only for the per-address purchase rate, and the
/// connection limit counts each connection's peer, which behind the proxy the header
/// implies is the proxy itself (a share would throttle it; only 0, off, is taken).
fn proxy(s: &Settings, o: &Origin) -> Result<(), ConfigError> {
    if s.client_ip_header.is_none() {
        return Ok(());
    }
    if s.ip_purchase_rate.0 == 0 {
        return Err(o.refuse(
            "client_ip_header",
            "is read only for the per-address limit: set FLASHSALE_IP_PURCHASE_RATE too",
        ));
    }
    if s.connections_per_address_max
        .as_ref()
        .is_some_and(|n| n.0 > 0)
    {
        let message = "counts connections by their peer, which with FLASHSALE_CLIENT_IP_HEADER \
                       set is the proxy in front: limit each client's connections at the \
                       proxy (0 turns this off)";
        return Err(refuse(o, "connections_per_address_max", message));
    }
    Ok(())
}

/// A rate limit: attempts a second (0: no limit) and the burst.
pub(super) fn rate(per_second: u64, burst: u64) -> Option<Rate> {
    // Both within RATE_LIMIT_MAX, as read: they fit in u32.
    (per_second > 0).then_some(Rate {
        per_second: per_second as u32,
        burst: burst as u32,
    })
}

/// The settings of each buyer mode, refused in the other modes.
const MODE_KEYS: [(&str, BuyerMode); 5] = [
    ("buyer_header", BuyerMode::Header),
    ("buyer_jwt_secret", BuyerMode::Jwt),
    ("buyer_jwt_public_key", BuyerMode::Jwt),
    ("buyer_jwt_issuer", BuyerMode::Jwt),
    ("buyer_jwt_audience", BuyerMode::Jwt),
];

/// The buyer authentication of `FLASHSALE_BUYER_AUTH` and the settings of its mode; a
/// setting of another mode is refused rather than silently ignored (a JWT secret set
/// while buyers go unauthenticated is a deployment that believes it is safe).
pub(super) fn buyer_auth(s: &Settings, o: &Origin) -> Result<BuyerAuth, ConfigError> {
    let foreign = MODE_KEYS
        .iter()
        .find(|(key, mode)| *mode != s.buyer_auth && o.is_set(key));
    if let Some((key, _)) = foreign {
        let mode = o.given("buyer_auth");
        return Err(o.refuse(
            key,
            format_args!("is not read with FLASHSALE_BUYER_AUTH={mode}"),
        ));
    }
    match s.buyer_auth {
        BuyerMode::None => Ok(BuyerAuth::None),
        BuyerMode::Header => {
            let header = s.buyer_header.as_ref().map(|h| h.0.clone());
            let default = axum::http::HeaderName::from_static(BUYER_HEADER_DEFAULT);
            Ok(BuyerAuth::Header(header.unwrap_or(default)))
        }
        BuyerMode::Jwt => jwt(s, o),
    }
}

/// The JWT verifier: an HS256 secret or a public key file, exactly one.
fn jwt(s: &Settings, o: &Origin) -> Result<BuyerAuth, ConfigError> {
    let expected = ExpectedClaims {
        issuer: s.buyer_jwt_issuer.as_ref().map(|c| c.0.clone()),
        audience: s.buyer_jwt_audience.as_ref().map(|c| c.0.clone()),
    };
    let verifier = match (&s.buyer_jwt_secret, &s.buyer_jwt_public_key) {
        (Some(secret), None) => JwtVerifier::hs256(secret.as_bytes(), &expected)
            .map_err(|e| o.refuse("buyer_jwt_secret", e))?,
        (None, Some(path)) => {
            let refuse = |e| o.refuse("buyer_jwt_public_key", e);
            let pem = read_key_file(Path::new(path)).map_err(refuse)?;
            JwtVerifier::from_public_pem(&pem, &expected)
                .map_err(|e| refuse(format!("{path}: {e}")))?
        }
        (Some(_), Some(_)) => {
            return Err(o.refuse(
                "buyer_jwt_secret",
                "give either it (HS256) or FLASHSALE_BUYER_JWT_PUBLIC_KEY (RS256, EdDSA), not \
                 both",
            ))
        }
        (None, None) => {
            return Err(ConfigError(
                "FLASHSALE_BUYER_JWT_SECRET or FLASHSALE_BUYER_JWT_PUBLIC_KEY: one is needed \
                 with FLASHSALE_BUYER_AUTH=jwt"
                    .to_owned(),
            ))
        }
    };
    Ok(BuyerAuth::Jwt(std::sync::Arc::new(verifier)))
}

/// A key file's bytes, refused past [`PUBLIC_KEY_FILE_BYTES_MAX`].
fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut pem = Vec::new();
    file.take(PUBLIC_KEY_FILE_BYTES_MAX + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if pem.len() as u64 > PUBLIC_KEY_FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {PUBLIC_KEY_FILE_BYTES_MAX} bytes, no public key",
            path.display()
        ));
    }
    Ok(pem)
}
