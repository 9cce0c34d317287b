use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// Checks the documented defaults apply when nothing is set.
#[test]
fn defaults() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults are valid");
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.metrics_listen, None);
    // A metrics listener of its own: another port, or another address; not one the
    // API's listener overlaps (the same address and port, or an unspecified address).
    for (metrics, ok) in [
        ("127.0.0.1:9100", true),
        ("127.0.0.2:8080", true),
        ("127.0.0.1:0", true),
        ("127.0.0.1:8080", false),
        ("0.0.0.0:8080", false),
        ("[::]:8080", false),
    ] {
        let env = HashMap::from([("FLASHSALE_METRICS_LISTEN".to_owned(), metrics.to_owned())]);
        let parsed = Config::from_parts(None, &env);
        assert_eq!(parsed.is_ok(), ok, "{metrics}: {parsed:?}");
    }
    assert_eq!(
        c.redis,
        flashsale_redis::Target::Node("redis://127.0.0.1:6379".into())
    );
    let cluster = Config::from_parts(
        None,
        &env(&[(
            "FLASHSALE_REDIS_CLUSTER_NODES",
            "127.0.0.1:7000, redis-a.internal:7001",
        )]),
    )
    .expect("a cluster by its seed nodes");
    assert_eq!(
        cluster.redis,
        flashsale_redis::Target::Cluster(vec![
            "127.0.0.1:7000".into(),
            "redis-a.internal:7001".into()
        ])
    );
    assert_eq!(c.database_url, "mysql://root@127.0.0.1:3306/flashsale");
    assert_eq!(c.payment_timeout, Duration::from_secs(15 * 60));
    assert_eq!(c.max_quantity_per_order, 5);
    assert_eq!(c.redis_record_ttl, Duration::from_secs(24 * 3600));
    assert_eq!(c.admin_token, None);
    assert!(!c.log_json);
    assert_eq!(c.sold_out_lease, Duration::from_millis(250));
    let off = Config::from_parts(None, &env(&[("FLASHSALE_SOLD_OUT_LEASE", "0")]))
        .expect("0 turns leases off");
    assert_eq!(off.sold_out_lease, Duration::ZERO);
    assert_eq!(
        c.user_purchase_rate,
        Some(Rate {
            per_second: 10,
            burst: 20
        })
    );
    assert_eq!(c.ip_purchase_rate, None);
    assert_eq!(c.client_ip_header, None);
    assert_eq!(c.connections_per_address_max, None);
}

// Checks FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX: unset by default, a number from 0
// (off) up to the connection bound taken as given, 0 taken behind a proxy; refused,
// naming the variable: not a number, past the bound, and a share behind a proxy
// (FLASHSALE_CLIENT_IP_HEADER set), where it would count the proxy's connections.
#[test]
fn connections_per_address_settings() {
    let var = "FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX";
    let proxy = [
        ("FLASHSALE_IP_PURCHASE_RATE", "50"),
        ("FLASHSALE_CLIENT_IP_HEADER", "X-Forwarded-For"),
    ];
    for (value, want) in [("0", 0), ("1", 1), ("250", 250), ("1000000", 1_000_000)] {
        let c = Config::from_parts(None, &env(&[(var, value)])).expect(value);
        assert_eq!(c.connections_per_address_max, Some(want), "{value}");
    }
    let behind = Config::from_parts(None, &env(&[proxy[0], proxy[1], (var, "0")]))
        .expect("0 behind a proxy");
    assert_eq!(behind.connections_per_address_max, Some(0));
    for pairs in [
        vec![(var, "many")],
        vec![(var, "-1")],
        vec![(var, "1000001")],
        vec![proxy[0], proxy[1], (var, "100")],
    ] {
        let err = Config::from_parts(None, &env(&pairs)).unwrap_err();
        assert!(err.0.starts_with(var), "{pairs:?}: {err}");
    }
}

// Checks the rate limits' settings: 0 turns one off, the burst and the header are
// taken as given (the header in lower case), and bad values (not a number, a burst of
// 0, past the bound, a header that is no header name, a header without the
// per-address limit it is for) stop startup naming the variable.
#[test]
fn rate_limit_settings() {
    let c = Config::from_parts(
        None,
        &env(&[
            ("FLASHSALE_USER_PURCHASE_RATE", "0"),
            ("FLASHSALE_IP_PURCHASE_RATE", "50"),
            ("FLASHSALE_IP_PURCHASE_BURST", "1"),
            ("FLASHSALE_CLIENT_IP_HEADER", "X-Forwarded-For"),
        ]),
    )
    .expect("valid");
    assert_eq!(c.user_purchase_rate, None);
    assert!(!c.user_purchase_rate_shared);
    let shared = Config::from_parts(
        None,
        &env(&[("FLASHSALE_USER_PURCHASE_RATE_SCOPE", "shared")]),
    )
    .expect("valid");
    assert!(shared.user_purchase_rate_shared);
    assert!(Config::from_parts(
        None,
        &env(&[("FLASHSALE_USER_PURCHASE_RATE_SCOPE", "global")])
    )
    .is_err());
    assert_eq!(
        c.ip_purchase_rate,
        Some(Rate {
            per_second: 50,
            burst: 1
        })
    );
    assert_eq!(
        c.client_ip_header.as_ref().map(|h| h.as_str()),
        Some("x-forwarded-for")
    );
    for (var, value) in [
        ("FLASHSALE_USER_PURCHASE_RATE", "fast"),
        ("FLASHSALE_USER_PURCHASE_RATE", "-1"),
        ("FLASHSALE_USER_PURCHASE_RATE", "1000001"),
        ("FLASHSALE_USER_PURCHASE_BURST", "0"),
        ("FLASHSALE_IP_PURCHASE_BURST", "x"),
        ("FLASHSALE_CLIENT_IP_HEADER", "x forwarded"),
        ("FLASHSALE_CLIENT_IP_HEADER", "x-real-ip"),
    ] {
        let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
        assert!(err.0.starts_with(var), "{var}={value}: {err}");
    }
}

// Checks the buyer authentication settings: none by default; header mode with its
// default and a configured header; jwt with an HS256 secret, an RS256 or Ed25519
// public key file, issuer and audience. Refused, naming the variable: an unknown
// mode, a short secret, a missing, private, small or damaged key file, both a secret
// and a key, neither, a setting of another mode, a blank issuer; and an admin token
// that is short or holds whitespace (it could never be sent).
#[test]
fn buyer_auth_settings() {
    let fixture = |name: &str| format!("{}/tests/it/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let secret = "0123456789abcdef0123456789abcdef";
    let c = Config::from_parts(None, &env(&[])).expect("defaults");
    assert!(c.buyer_auth.is_none());
    let header = |pairs: &[(&str, &str)]| match Config::from_parts(None, &env(pairs)) {
        Ok(Config {
            buyer_auth: BuyerAuth::Header(h),
            ..
        }) => Some(h.as_str().to_owned()),
        _ => None,
    };
    assert_eq!(
        header(&[("FLASHSALE_BUYER_AUTH", "header")]).as_deref(),
        Some("x-user-id")
    );
    assert_eq!(
        header(&[
            ("FLASHSALE_BUYER_AUTH", "header"),
            ("FLASHSALE_BUYER_HEADER", "X-Buyer")
        ])
        .as_deref(),
        Some("x-buyer")
    );
    let algorithm = |pairs: &[(&str, &str)]| match Config::from_parts(None, &env(pairs)) {
        Ok(Config {
            buyer_auth: BuyerAuth::Jwt(v),
            ..
        }) => Some(v.algorithm()),
        _ => None,
    };
    use jsonwebtoken::Algorithm;
    let (rsa, ed) = (
        fixture("buyer_rsa_public.pem"),
        fixture("buyer_ed25519_public.pem"),
    );
    for (pairs, want) in [
        (
            vec![("FLASHSALE_BUYER_JWT_SECRET", secret)],
            Algorithm::HS256,
        ),
        (
            vec![("FLASHSALE_BUYER_JWT_PUBLIC_KEY", rsa.as_str())],
            Algorithm::RS256,
        ),
        (
            vec![("FLASHSALE_BUYER_JWT_PUBLIC_KEY", ed.as_str())],
            Algorithm::EdDSA,
        ),
        (
            vec![
                ("FLASHSALE_BUYER_JWT_SECRET", secret),
                ("FLASHSALE_BUYER_JWT_ISSUER", "https://id.example"),
                ("FLASHSALE_BUYER_JWT_AUDIENCE", "flashsale"),
            ],
            Algorithm::HS256,
        ),
    ] {
        let mut pairs = pairs;
        pairs.push(("FLASHSALE_BUYER_AUTH", "jwt"));
        assert_eq!(algorithm(&pairs), Some(want), "{pairs:?}");
    }
    let (private, small, missing) = (
        fixture("buyer_rsa_private.pem"),
        fixture("rsa_1024_public.pem"),
        fixture("no_such.pem"),
    );
    let readme = fixture("README.md");
    let jwt = ("FLASHSALE_BUYER_AUTH", "jwt");
    for (pairs, blamed) in [
        (
            vec![("FLASHSALE_BUYER_AUTH", "oauth")],
            "FLASHSALE_BUYER_AUTH",
        ),
        (vec![jwt], "FLASHSALE_BUYER_JWT_SECRET"),
        (
            vec![jwt, ("FLASHSALE_BUYER_JWT_SECRET", "short")],
            "FLASHSALE_BUYER_JWT_SECRET",
        ),
        (
            vec![
                jwt,
                ("FLASHSALE_BUYER_JWT_SECRET", secret),
                ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", rsa.as_str()),
            ],
            "FLASHSALE_BUYER_JWT_SECRET",
        ),
        (
            vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", private.as_str())],
            "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
        ),
        (
            vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", small.as_str())],
            "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
        ),
        (
            vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", missing.as_str())],
            "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
        ),
        (
            vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", readme.as_str())],
            "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
        ),
        (
            vec![
                jwt,
                ("FLASHSALE_BUYER_JWT_SECRET", secret),
                ("FLASHSALE_BUYER_JWT_ISSUER", " "),
            ],
            "FLASHSALE_BUYER_JWT_ISSUER",
        ),
        (
            vec![
                jwt,
                ("FLASHSALE_BUYER_JWT_SECRET", secret),
                ("FLASHSALE_BUYER_HEADER", "x-user-id"),
            ],
            "FLASHSALE_BUYER_HEADER",
        ),
        (
            vec![("FLASHSALE_BUYER_JWT_SECRET", secret)],
            "FLASHSALE_BUYER_JWT_SECRET",
        ),
        (
            vec![
                ("FLASHSALE_BUYER_AUTH", "header"),
                ("FLASHSALE_BUYER_JWT_AUDIENCE", "a"),
            ],
            "FLASHSALE_BUYER_JWT_AUDIENCE",
        ),
        (
            vec![
                ("FLASHSALE_BUYER_AUTH", "header"),
                ("FLASHSALE_BUYER_HEADER", "x user"),
            ],
            "FLASHSALE_BUYER_HEADER",
        ),
        (
            vec![("FLASHSALE_ADMIN_TOKEN", "        ")],
            "FLASHSALE_ADMIN_TOKEN",
        ),
        (
            vec![("FLASHSALE_ADMIN_TOKEN", "secret token")],
            "FLASHSALE_ADMIN_TOKEN",
        ),
        (
            vec![("FLASHSALE_ADMIN_TOKEN", "1234567")],
            "FLASHSALE_ADMIN_TOKEN",
        ),
    ] {
        let err = Config::from_parts(None, &env(&pairs)).unwrap_err();
        assert!(err.0.starts_with(blamed), "{pairs:?}: {err}");
    }
    let ok = Config::from_parts(None, &env(&[("FLASHSALE_ADMIN_TOKEN", "s3cret-t0ken")]));
    assert_eq!(
        ok.map(|c| c.admin_token),
        Ok(Some("s3cret-t0ken".to_owned()))
    );
}

// Checks FLASHSALE_ADMIN_TOKENS: name:token pairs read in order beside
// FLASHSALE_ADMIN_TOKEN; a pair without a colon, a bad name, a short token, a name or a
// token given twice, the name `admin` or the single token's value under another name,
// and more than 32 pairs are refused naming the variable, and no message quotes a token.
#[test]
fn named_admin_tokens() {
    let c = Config::from_parts(
        None,
        &env(&[
            (
                "FLASHSALE_ADMIN_TOKENS",
                "alice:alice-s3cret, bob:bob-s3cret",
            ),
            ("FLASHSALE_ADMIN_TOKEN", "the-admins-token"),
        ]),
    )
    .expect("valid");
    let names: Vec<&str> = c.admin_tokens.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["alice", "bob"]);
    assert_eq!(c.admin_tokens[1].1, "bob-s3cret");
    assert_eq!(c.any_admin_token().as_deref(), Some("the-admins-token"));
    let only = Config::from_parts(None, &env(&[("FLASHSALE_ADMIN_TOKENS", "ops:0ps-s3cret")]));
    assert_eq!(
        only.expect("valid").any_admin_token().as_deref(),
        Some("0ps-s3cret")
    );
    let many = (0..33)
        .map(|i| format!("a{i}:token-{i:04}"))
        .collect::<Vec<_>>()
        .join(",");
    for (tokens, single) in [
        ("alice-s3cret", None),
        ("al ice:alice-s3cret", None),
        ("alice:short", None),
        ("alice:alice-s3cret,alice:other-s3cret", None),
        ("alice:alice-s3cret,bob:alice-s3cret", None),
        ("admin:alice-s3cret", Some("the-admins-token")),
        ("alice:the-admins-token", Some("the-admins-token")),
        (many.as_str(), None),
    ] {
        let mut pairs = vec![("FLASHSALE_ADMIN_TOKENS", tokens)];
        pairs.extend(single.map(|t| ("FLASHSALE_ADMIN_TOKEN", t)));
        let err = Config::from_parts(None, &env(&pairs)).unwrap_err();
        assert!(
            err.0.starts_with("FLASHSALE_ADMIN_TOKENS"),
            "{tokens}: {err}"
        );
        for secret in ["alice-s3cret", "the-admins-token", "other-s3cret"] {
            assert!(!err.0.contains(secret), "{tokens}: a token quoted: {err}");
        }
    }
}

// Checks the fallback settings: 3 s and 30 s by default, `off` turns the switch to
// ledger mode off (the way back stays), and values out of bounds, unparsable, or a
// way back quicker than the way in stop startup naming the variable.
#[test]
fn fallback_settings() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults");
    assert_eq!(
        c.fallback,
        flashsale_app::FallbackSettings {
            after: Some(Duration::from_secs(3)),
            recover_after: Duration::from_secs(30),
        }
    );
    let off = Config::from_parts(None, &env(&[("FLASHSALE_FALLBACK_AFTER", "off")])).expect("off");
    assert_eq!(off.fallback.after, None);
    let quick = Config::from_parts(
        None,
        &env(&[
            ("FLASHSALE_FALLBACK_AFTER", "500ms"),
            ("FLASHSALE_FALLBACK_RECOVER_AFTER", "2s"),
        ]),
    )
    .expect("quick");
    assert_eq!(quick.fallback.after, Some(Duration::from_millis(500)));
    assert_eq!(quick.fallback.recover_after, Duration::from_secs(2));
    for (var, value) in [
        ("FLASHSALE_FALLBACK_AFTER", "never"),
        ("FLASHSALE_FALLBACK_AFTER", "100ms"),
        ("FLASHSALE_FALLBACK_AFTER", "2h"),
        ("FLASHSALE_FALLBACK_RECOVER_AFTER", "off"),
        ("FLASHSALE_FALLBACK_RECOVER_AFTER", "2s"),
    ] {
        let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
        assert!(err.0.starts_with(var), "{var}={value}: {err}");
    }
}

// Checks the database cluster settings: none by default (the URL's node alone), the
// nodes in their order with the failback time (10 s by default), and node lists or
// failback times out of bounds stopping startup naming the variable.
#[test]
fn database_cluster_settings() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults");
    assert_eq!(c.database_cluster, None);
    let c = Config::from_parts(
        None,
        &env(&[(
            "FLASHSALE_DATABASE_NODES",
            "db-2:3306,db-1:3306,10.0.0.3:3307",
        )]),
    )
    .expect("nodes");
    let cluster = c.database_cluster.expect("a cluster");
    let nodes: Vec<String> = cluster.nodes.iter().map(ToString::to_string).collect();
    assert_eq!(nodes, ["db-2:3306", "db-1:3306", "10.0.0.3:3307"]);
    assert_eq!(cluster.failback_after, Duration::from_secs(10));
    let c = Config::from_parts(
        None,
        &env(&[
            ("FLASHSALE_DATABASE_NODES", "a:1"),
            ("FLASHSALE_DATABASE_FAILBACK_AFTER", "2m"),
        ]),
    )
    .expect("failback");
    let failback = c.database_cluster.map(|c| c.failback_after);
    assert_eq!(failback, Some(Duration::from_secs(120)));
    for (var, value) in [
        ("FLASHSALE_DATABASE_NODES", ""),
        ("FLASHSALE_DATABASE_NODES", "a"),
        ("FLASHSALE_DATABASE_NODES", "a:1,a:1"),
        ("FLASHSALE_DATABASE_NODES", "mysql://a:1"),
        ("FLASHSALE_DATABASE_FAILBACK_AFTER", "0s"),
        ("FLASHSALE_DATABASE_FAILBACK_AFTER", "2h"),
    ] {
        let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
        assert!(err.0.starts_with(var), "{var}={value}: {err}");
    }
}

// Checks the retirement of ended sales' Redis state: ten minutes by default, `off`
// turns it off, and zero is refused (not read as off), naming the variable. How: three
// configurations from the environment alone.
#[test]
fn sale_retire_after_settings() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults");
    assert_eq!(c.sale_retire_after, Some(Duration::from_secs(600)));
    let off = Config::from_parts(None, &env(&[("FLASHSALE_SALE_RETIRE_AFTER", "off")]));
    assert_eq!(off.expect("off").sale_retire_after, None);
    let err = Config::from_parts(None, &env(&[("FLASHSALE_SALE_RETIRE_AFTER", "0s")])).unwrap_err();
    assert!(err.0.starts_with("FLASHSALE_SALE_RETIRE_AFTER"), "{err}");
}

// Checks the scheduled audit's period: a day by default, `off` turns it off, and a
// period out of bounds or unparsable stops startup naming the variable; and the
// reconciliation's repair, `auto` by default, `report` to only log.
#[test]
fn audit_every_settings() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults");
    assert_eq!(c.audit_every, Some(Duration::from_secs(24 * 3600)));
    let off = Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", "off")]));
    assert_eq!(off.expect("off").audit_every, None);
    let hourly = Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", "1h")]));
    assert_eq!(
        hourly.expect("1h").audit_every,
        Some(Duration::from_secs(3600))
    );
    let c = Config::from_parts(None, &env(&[("FLASHSALE_RECONCILE_REPAIR", "report")]));
    assert!(!c.expect("report").reconcile_repair);
    assert!(
        Config::from_parts(None, &env(&[]))
            .expect("defaults")
            .reconcile_repair
    );
    let err = Config::from_parts(None, &env(&[("FLASHSALE_RECONCILE_REPAIR", "yes")])).unwrap_err();
    assert!(err.0.starts_with("FLASHSALE_RECONCILE_REPAIR"), "{err}");
    for value in ["10s", "60d", "daily", "0s"] {
        let err = Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", value)])).unwrap_err();
        assert!(err.0.starts_with("FLASHSALE_AUDIT_EVERY"), "{value}: {err}");
    }
}

// Checks that the file sets values and the environment overrides the file.
#[test]
fn env_overrides_file() {
    let file =
        "listen = \"127.0.0.1:9000\"\npayment_timeout = \"2s\"\nmax_quantity_per_order = 3\n";
    let c = Config::from_parts(Some(file), &env(&[("FLASHSALE_PAYMENT_TIMEOUT", "500ms")]))
        .expect("valid");
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.max_quantity_per_order, 3);
    assert_eq!(c.payment_timeout, Duration::from_millis(500));
}

// Checks that each kind of bad value is refused with a message naming its source:
// the variable when it came from the environment, the key when from the file.
#[test]
fn bad_values_name_their_source() {
    let cases = [
        ("FLASHSALE_PAYMENT_TIMEOUT", "soon"),
        ("FLASHSALE_PAYMENT_TIMEOUT", "0s"),
        ("FLASHSALE_MAX_QUANTITY_PER_ORDER", "0"),
        ("FLASHSALE_LISTEN", "nowhere"),
        ("FLASHSALE_REDIS_URL", "http://x"),
        ("FLASHSALE_REDIS_CLUSTER_NODES", ""),
        ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1"),
        (
            "FLASHSALE_REDIS_CLUSTER_NODES",
            "127.0.0.1:7000,,127.0.0.1:7001",
        ),
        ("FLASHSALE_REDIS_CLUSTER_NODES", "redis://127.0.0.1:7000"),
        ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1:0"),
        ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1:70000"),
        ("FLASHSALE_DATABASE_URL", "postgres://x"),
        ("FLASHSALE_ADMIN_TOKEN", "short"),
        ("FLASHSALE_LOG_FORMAT", "xml"),
        ("FLASHSALE_REDIS_PREFIX", "a{b}"),
        ("FLASHSALE_REDIS_RECORD_TTL", "1m"),
        ("FLASHSALE_REDIS_RECORD_TTL", "366days"),
        ("FLASHSALE_SOLD_OUT_LEASE", "6s"),
        ("FLASHSALE_SOLD_OUT_LEASE", "-1"),
    ];
    for (var, value) in cases {
        let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
        assert!(err.0.starts_with(var), "{var}={value}: {err}");
    }
    // Each side of the rule between the payment timeout and the record TTL is told
    // under the name the user set, with the rule.
    let long = env(&[("FLASHSALE_PAYMENT_TIMEOUT", "2y")]);
    let err = Config::from_parts(None, &long).unwrap_err();
    assert!(err.0.starts_with("FLASHSALE_PAYMENT_TIMEOUT: 2y"), "{err}");
    assert!(err.0.contains("FLASHSALE_REDIS_RECORD_TTL (24h"), "{err}");
    let err = Config::from_parts(Some("payment_timeout = \"2y\""), &env(&[])).unwrap_err();
    assert!(err.0.starts_with("payment_timeout (config file)"), "{err}");
    let both = env(&[
        ("FLASHSALE_PAYMENT_TIMEOUT", "2h"),
        ("FLASHSALE_REDIS_RECORD_TTL", "1h"),
    ]);
    let err = Config::from_parts(None, &both).unwrap_err();
    assert!(err.0.starts_with("FLASHSALE_REDIS_RECORD_TTL: 1h"), "{err}");
    assert!(err.0.contains("FLASHSALE_PAYMENT_TIMEOUT=2h"), "{err}");
    let err = Config::from_parts(Some("payment_timeout = \"x\""), &env(&[])).unwrap_err();
    assert!(err.0.starts_with("payment_timeout (config file)"), "{err}");
    let err = Config::from_parts(Some("colour = 1"), &env(&[])).unwrap_err();
    assert!(err.0.contains("unknown key \"colour\""), "{err}");
}

// Checks the NATS settings' defaults, several servers and a replica count taken, and
// that subject prefixes and stream names that NATS would refuse or misread
// (wildcards, spaces, empty tokens, dots in a stream name), non-nats URLs (alone or
// among others: the message names the bad one), events per message outside 1..=128
// and replicas outside 1..=5 stop startup naming the variable.
#[test]
fn nats_settings() {
    let c = Config::from_parts(None, &env(&[])).expect("defaults are valid");
    assert_eq!(c.nats_urls, ["nats://127.0.0.1:4222"]);
    assert_eq!(c.nats_subject_prefix, "flashsale");
    assert_eq!(c.nats_stream, "FLASHSALE_EVENTS");
    assert_eq!(c.nats_events_per_message, 128);
    assert_eq!(c.nats_stream_replicas, 1);
    assert_eq!(c.events_max_deliver, 5);
    let ok = env(&[
        (
            "FLASHSALE_NATS_URL",
            "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
        ),
        ("FLASHSALE_NATS_SUBJECT_PREFIX", "shop.eu-1"),
        ("FLASHSALE_NATS_STREAM", "T_1-a"),
        ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "1"),
        ("FLASHSALE_NATS_STREAM_REPLICAS", "3"),
        ("FLASHSALE_EVENTS_MAX_DELIVER", "3"),
    ]);
    let c = Config::from_parts(None, &ok).expect("valid");
    assert_eq!(
        c.nats_urls,
        ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
    );
    assert_eq!(c.nats_events_per_message, 1);
    assert_eq!(c.nats_stream_replicas, 3);
    assert_eq!(c.events_max_deliver, 3);
    let err = Config::from_parts(
        None,
        &env(&[("FLASHSALE_NATS_URL", "nats://a:4222,http://b:4222")]),
    )
    .unwrap_err();
    assert!(
        err.0.starts_with("FLASHSALE_NATS_URL: \"http://b:4222\""),
        "{err}"
    );
    for (var, value) in [
        ("FLASHSALE_NATS_URL", "http://x"),
        ("FLASHSALE_NATS_URL", "nats://"),
        ("FLASHSALE_NATS_URL", "nats://a:4222,"),
        ("FLASHSALE_NATS_STREAM_REPLICAS", "0"),
        ("FLASHSALE_NATS_STREAM_REPLICAS", "6"),
        ("FLASHSALE_NATS_SUBJECT_PREFIX", ""),
        ("FLASHSALE_NATS_SUBJECT_PREFIX", "a..b"),
        ("FLASHSALE_NATS_SUBJECT_PREFIX", "a.*"),
        ("FLASHSALE_NATS_SUBJECT_PREFIX", "a >"),
        ("FLASHSALE_NATS_STREAM", "A.B"),
        ("FLASHSALE_NATS_STREAM", ""),
        ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "0"),
        ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "129"),
        ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "many"),
        ("FLASHSALE_EVENTS_MAX_DELIVER", "0"),
        ("FLASHSALE_EVENTS_MAX_DELIVER", "101"),
    ] {
        let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
        assert!(err.0.starts_with(var), "{var}={value}: {err}");
    }
}

// Checks that an unknown FLASHSALE_ variable stops startup naming it and the nearest
// known one (a typo), or no suggestion when none is near; that the project's tool
// variables (FLASHSALE_IT_BIN …) and names with lower-case letters are passed over.
#[test]
fn unknown_variable_refused_with_suggestion() {
    let err = Config::from_parts(None, &env(&[("FLASHSALE_REDIS_ULR", "x")])).unwrap_err();
    assert_eq!(
        err.0,
        "unknown variable FLASHSALE_REDIS_ULR; did you mean FLASHSALE_REDIS_URL?"
    );
    let err = Config::from_parts(None, &env(&[("FLASHSALE_PAYMNET_TIMEOUT", "2s")])).unwrap_err();
    assert!(
        err.0.ends_with("did you mean FLASHSALE_PAYMENT_TIMEOUT?"),
        "{err}"
    );
    let err = Config::from_parts(None, &env(&[("FLASHSALE_COLOUR", "blue")])).unwrap_err();
    assert!(
        err.0.starts_with("unknown variable FLASHSALE_COLOUR ("),
        "{err}"
    );
    let passed_over = env(&[
        ("FLASHSALE_IT_BIN", "target/release/flashsale"),
        ("FLASHSALE_SIM_SEEDS", "20"),
        ("FLASHSALE_BIN", "flashsale"),
        ("FLASHSALE_redis_url", "x"),
    ]);
    assert!(Config::from_parts(None, &passed_over).is_ok());
}

// Checks that an unknown key in the file stops startup naming it and the nearest known
// key, also when the environment sets the key it meant (the file is wrong all the same).
#[test]
fn unknown_file_key_refused_with_suggestion() {
    let file = Some("redis_ulr = \"redis://10.0.0.1:6379\"");
    let err = Config::from_parts(file, &env(&[])).unwrap_err();
    assert_eq!(
        err.0,
        "config file: unknown key \"redis_ulr\"; did you mean \"redis_url\"?"
    );
    let err = Config::from_parts(file, &env(&[("FLASHSALE_REDIS_URL", "redis://a:1")]));
    assert!(err.is_err_and(|e| e.0.contains("\"redis_ulr\"")));
}

// Checks that a bad duration is refused naming its source, quoting the value and saying
// what a duration looks like: from the environment under the variable, from the file
// under the key.
#[test]
fn bad_duration_names_variable_and_value() {
    let want = "\"soon\" is not a duration like 15m, 2s, 500ms";
    let err = Config::from_parts(None, &env(&[("FLASHSALE_REQUEST_TIMEOUT", "soon")])).unwrap_err();
    assert!(
        err.0
            .starts_with(&format!("FLASHSALE_REQUEST_TIMEOUT: {want}")),
        "{err}"
    );
    let err = Config::from_parts(Some("request_timeout = \"soon\""), &env(&[])).unwrap_err();
    assert!(
        err.0
            .starts_with(&format!("request_timeout (config file): {want}")),
        "{err}"
    );
    let err = Config::from_parts(None, &env(&[("FLASHSALE_HEADER_TIMEOUT", "6m")])).unwrap_err();
    assert!(
        err.0
            .starts_with("FLASHSALE_HEADER_TIMEOUT: 6m is longer than 5m"),
        "{err}"
    );
}

// Checks the layers' order key by key: the file's value wins over the default, the
// environment's over the file's; and that a message blames the layer that won (the
// variable when the file's value is good and the environment's bad, and the reverse).
#[test]
fn env_overrides_file_and_blame_follows() {
    let file = "request_timeout = \"4s\"\nheader_timeout = \"20s\"\n";
    let c = Config::from_parts(Some(file), &env(&[("FLASHSALE_REQUEST_TIMEOUT", "3s")]))
        .expect("valid");
    assert_eq!(c.request_timeout, Duration::from_secs(3));
    assert_eq!(c.header_timeout, Duration::from_secs(20));
    assert_eq!(c.expiry_interval, Duration::from_secs(1));
    let err = Config::from_parts(Some(file), &env(&[("FLASHSALE_REQUEST_TIMEOUT", "x")]));
    assert!(err.is_err_and(|e| e.0.starts_with("FLASHSALE_REQUEST_TIMEOUT: \"x\"")));
    let bad_file = "request_timeout = \"x\"\n";
    let err = Config::from_parts(Some(bad_file), &env(&[("FLASHSALE_REQUEST_TIMEOUT", "3s")]));
    assert!(
        err.is_ok(),
        "the environment's value replaces the file's: {err:?}"
    );
    let err = Config::from_parts(Some(bad_file), &env(&[])).unwrap_err();
    assert!(
        err.0.starts_with("request_timeout (config file): \"x\""),
        "{err}"
    );
}

/// The rows of the variables' table in docs/configuration.md: each variable with its
/// documented default as written (`15m`, or words such as "unset").
fn documented() -> Vec<(String, String)> {
    let doc = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ));
    doc.lines()
        .filter(|line| line.starts_with("| `FLASHSALE_"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
        })
        .collect()
}

// Checks that docs/configuration.md and the parser agree, walking the documented table:
// every documented variable is read (set alone to its documented default it is taken,
// set to anything it is never refused as unknown), a default written as a value is the
// parser's default for the key, and every key the parser reads is documented.
#[test]
fn documented_variables_accepted() {
    let rows = documented();
    for (var, default) in &rows {
        let key = var.trim_start_matches("FLASHSALE_").to_ascii_lowercase();
        let err = Config::from_parts(None, &env(&[(var, "")])).err();
        assert!(
            !err.is_some_and(|e| e.0.contains("unknown")),
            "{var} is refused as unknown"
        );
        let literal = default.len() > 2 && default.matches('`').count() == 2;
        let default = default.trim_matches('`');
        match settings::DEFAULTS.iter().find(|(k, _)| *k == key) {
            Some((_, text)) => {
                assert_eq!(*text, default, "{var}: documented default");
                let parsed = Config::from_parts(None, &env(&[(var, default)]));
                assert!(parsed.is_ok(), "{var}={default}: {parsed:?}");
            }
            // Read in the header mode only, where unset means `X-User-Id`.
            None if key == "buyer_header" => {
                let header = Config::from_parts(None, &env(&[("FLASHSALE_BUYER_AUTH", "header")]));
                let Ok(Config {
                    buyer_auth: BuyerAuth::Header(name),
                    ..
                }) = header
                else {
                    panic!("header mode: {header:?}");
                };
                assert!(name.as_str().eq_ignore_ascii_case(default), "{var}: {name}");
            }
            None => assert!(!literal, "{var}: documented `{default}`, not in DEFAULTS"),
        }
    }
    let probe = figment::Figment::from(("no such key", 1)).extract::<settings::Settings>();
    let Err(figment::Error {
        kind: figment::error::Kind::UnknownField(_, keys),
        ..
    }) = probe
    else {
        panic!("an unknown key is refused with the list of known ones");
    };
    for key in keys {
        let var = format!("FLASHSALE_{}", key.to_ascii_uppercase());
        assert!(
            rows.iter().any(|(v, _)| *v == var),
            "{var} is not documented"
        );
    }
}
