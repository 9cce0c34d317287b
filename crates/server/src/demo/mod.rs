//! `flashsale demo`: one command runs a whole flash sale and checks what happened. It
//! creates a product, sends a flood of buyers (double-clicks and retries included), pays
//! for some orders, cancels some and leaves some to expire, sells the units that come
//! back to a second wave, and ends with a summary whose every line is a check it made:
//! the product's counters, one order per request (each request sent again), and the
//! audit of the product.
//!
//! It talks to the service over HTTP only, as any client does: a running one (the
//! configured listen address or `--base-url`), or `serve` started in this process on the
//! configured stores with a short payment timeout. The audit runs in process, as
//! `flashsale audit --product` does, on the configured stores.

mod buyers;
mod client;
mod progress;
mod service;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flashsale_api::auth::BuyerAuth;
use flashsale_core::{OrderId, ProductId, RequestId, UserId};
use rand::Rng;
use reqwest::StatusCode;

use self::buyers::{
    until_known, Buyer, Checkout, Copies, Final, Known, Settled, Tally, Wave, IDS_SHOWN_MAX,
};
use self::client::{BuyerIdentity, Inventory, Shop, Unexpected};
use self::progress::{Display, Progress};
use self::service::OwnService;
use crate::reach::redacted;
use crate::Config;

/// Most units a demo sells: a demo, not a benchmark (`flashsale-bench` is the load
/// generator); every order is paid or cancelled and sent again one by one.
pub const STOCK_MAX: u32 = 100_000;
/// Most buyers of the first wave: each is a task and a record of about 200 bytes.
pub const BUYERS_MAX: u32 = 1_000_000;
/// The demo's own service's payment timeout unless `--payment-timeout` says otherwise:
/// long enough to pay at once, short enough to watch the unpaid orders expire.
const PAYMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Bounds of `--payment-timeout`: the demo waits for it, and the service's expiry worker
/// looks once a second.
const PAYMENT_TIMEOUT_MIN: Duration = Duration::from_secs(1);
const PAYMENT_TIMEOUT_MAX: Duration = Duration::from_secs(600);
/// Longest `--flood-duration`: the demo is something to watch, not a soak test; the
/// service's live page keeps five minutes of history.
const FLOOD_DURATION_MAX: Duration = Duration::from_secs(600);
/// The demo waits for the unpaid orders to expire when the last one does within this
/// time; a longer wait (a service with the default 15 minutes) is only announced.
const EXPIRY_WAIT_MAX: Duration = Duration::from_secs(120);
/// How long after the last deadline the expiry worker may take to cancel the orders: it
/// runs every second by default, 500 orders a pass.
const EXPIRY_GRACE: Duration = Duration::from_secs(30);
/// How often the expiry wait reads the product's counters.
const EXPIRY_POLL: Duration = Duration::from_millis(500);
/// The first product id tried; the next one after each 409 product_exists, at most
/// `PRODUCT_ATTEMPTS_MAX` of them.
const PRODUCT_ID_FIRST: i64 = 1001;
const PRODUCT_ATTEMPTS_MAX: i64 = 1000;
/// Rounds of buyers for the units that came back: a round's buyers may meet a stale
/// sold-out lease for a few milliseconds (docs/api.md), so a unit can be left for the
/// next round; a few rounds sell them all.
const COMEBACK_ROUNDS_MAX: u32 = 5;
/// Buyers per unit that came back, and at least this many per round.
const COMEBACK_BUYERS_PER_UNIT: u64 = 2;
const COMEBACK_BUYERS_MIN: u64 = 10;
/// How long the audit is given for work in flight to settle (events the relay has not
/// published yet, say) before its report is taken as it is.
const AUDIT_SETTLE_MAX: Duration = Duration::from_secs(15);
const AUDIT_SETTLE_POLL: Duration = Duration::from_secs(1);

/// `flashsale demo`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// The service to run the sale against, http://host:port (default: the configured
    /// FLASHSALE_LISTEN; if nothing answers there, the demo starts a service itself).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Start a service in this process even if one answers (on the configured stores;
    /// on a free port if the configured one is taken). It stops when the demo ends.
    #[arg(long, conflicts_with = "base_url")]
    pub spawn: bool,
    /// The running service's admin token (default: FLASHSALE_ADMIN_TOKEN).
    #[arg(long, value_name = "TOKEN")]
    pub admin_token: Option<String>,
    /// Units on sale.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=i64::from(STOCK_MAX)))]
    pub stock: u32,
    /// Buyers in the flood, one unit each (more than the units: it is a flash sale).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(2..=i64::from(BUYERS_MAX)))]
    pub buyers: u32,
    /// How long the demo's own service lets an order stay unpaid (default 10s; a running
    /// service keeps its own FLASHSALE_PAYMENT_TIMEOUT).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub payment_timeout: Option<Duration>,
    /// How long the flood's buyers take to arrive, evenly spread (at most 10 minutes),
    /// so that the live page can be watched while the sale runs; 0s sends them as fast
    /// as the service answers.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = flood_duration)]
    pub flood_duration: Duration,
}

/// `--flood-duration`: a duration within [`FLOOD_DURATION_MAX`].
fn flood_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration > FLOOD_DURATION_MAX {
        return Err(format!(
            "at most {}",
            humantime::format_duration(FLOOD_DURATION_MAX)
        ));
    }
    Ok(duration)
}

/// Why the demo stopped before its checks: exit 2.
#[derive(Debug)]
pub enum DemoError {
    /// The command line or the configuration cannot run a demo.
    Setup(String),
    /// The service did not answer, or answered what a flashsale service never does.
    Service(String),
    /// Ctrl-C.
    Interrupted,
}

impl std::fmt::Display for DemoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Setup(e) | Self::Service(e) => f.write_str(e),
            Self::Interrupted => f.write_str("interrupted: nothing checked"),
        }
    }
}

impl From<Unexpected> for DemoError {
    fn from(e: Unexpected) -> Self {
        Self::Service(e.0)
    }
}

/// The exit code of a demo that stopped before its checks, as for any error of the
/// binary's commands.
const EXIT_ERROR: u8 = 2;
/// The exit code of a demo whose checks ran and one failed.
const EXIT_CHECK_FAILED: u8 = 1;

/// Runs the demo; 0 when every check passed, 1 when one failed, 2 when it could not
/// check (an error, or Ctrl-C). `log` is where this process's log goes.
pub async fn run(config: &Config, args: DemoArgs, log: Option<&Path>) -> ExitCode {
    let mut own = None;
    let result = tokio::select! {
        result = demo(config, &args, log, &mut own) => result,
        _ = tokio::signal::ctrl_c() => Err(DemoError::Interrupted),
    };
    let announced = own.is_some();
    if let Some(service) = own.take() {
        println!("service   stopping the demo's service (draining its requests)");
        if let Err(e) = service.stop().await {
            eprintln!("flashsale demo: {e}");
        }
    }
    if let Some(log) = log {
        keep_log_if_written(log, announced);
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_CHECK_FAILED),
        Err(e) => {
            eprintln!("flashsale demo: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Removes the demo's log file when nothing was written to it (a run against a service
/// already running logs nothing of its own); names it when something was and it was not
/// named at the start (only a service the demo starts is announced with its log).
fn keep_log_if_written(log: &Path, announced: bool) {
    match std::fs::metadata(log).map(|m| m.len()) {
        Ok(0) => {
            let _ = std::fs::remove_file(log);
        }
        Ok(_) if !announced => println!("log       {}", log.display()),
        _ => {}
    }
}

/// `n` with thousands separators, as people read counts.
fn count(n: impl Into<u64>) -> String {
    let digits = n.into().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn clock(t: DateTime<Utc>) -> String {
    t.format("%H:%M:%S UTC").to_string()
}

fn stores(config: &Config) -> String {
    let redis = match &config.redis {
        flashsale_redis::Target::Node(url) => redacted(url),
        flashsale_redis::Target::Cluster(nodes) => format!("Redis Cluster {}", nodes.join(",")),
    };
    format!(
        "{}, {redis} (key prefix {}), NATS stream {}",
        redacted(&config.database_url),
        config.redis_prefix,
        config.nats_stream
    )
}

/// Where the service is, and whose it is.
struct Target {
    shop: Shop,
    /// The stores' configuration: the audit reads them.
    config: Config,
}

async fn target(
    config: &Config,
    args: &DemoArgs,
    log: Option<&Path>,
    own: &mut Option<OwnService>,
) -> Result<Target, DemoError> {
    let buyers = match &config.buyer_auth {
        BuyerAuth::None => BuyerIdentity::Body,
        BuyerAuth::Header(name) => BuyerIdentity::Header(name.clone()),
        BuyerAuth::Jwt(_) => {
            return Err(DemoError::Setup(
                "FLASHSALE_BUYER_AUTH=jwt: the demo cannot sign its buyers' tokens; run it \
                 against a service with FLASHSALE_BUYER_AUTH=none or header"
                    .into(),
            ))
        }
    };
    let connections = buyers::BUYERS_AT_ONCE * 2;
    let base = match &args.base_url {
        Some(url) => client::parse_base_url(url).map_err(DemoError::Setup)?,
        None => client::url_of(config.listen),
    };
    if !args.spawn && client::answers(&base, "/healthz").await {
        if args.payment_timeout.is_some() {
            return Err(DemoError::Setup(format!(
                "--payment-timeout is for the demo's own service; the service at {base} keeps \
                 its own (add --spawn to start one)"
            )));
        }
        let Some(token) = args.admin_token.clone().or(config.any_admin_token()) else {
            return Err(DemoError::Setup(format!(
                "a service answers at {base}: the demo needs its admin token to create a \
                 product (FLASHSALE_ADMIN_TOKEN or --admin-token), or --spawn to start its own"
            )));
        };
        if !client::answers(&base, "/readyz").await {
            return Err(DemoError::Service(format!(
                "the service at {base} is not ready (GET /readyz): Redis or MariaDB does not answer it"
            )));
        }
        println!("service   {base} answers: the sale runs there");
        println!(
            "          the audit reads this configuration's stores: {}",
            stores(config)
        );
        let shop = Shop::new(&base, &token, buyers, connections).map_err(DemoError::Setup)?;
        return Ok(Target {
            shop,
            config: config.clone(),
        });
    }
    if args.base_url.is_some() {
        return Err(DemoError::Service(format!(
            "nothing answers at {base}/healthz (leave --base-url out to let the demo start a service)"
        )));
    }
    let payment_timeout = args.payment_timeout.unwrap_or(PAYMENT_TIMEOUT_DEFAULT);
    if !(PAYMENT_TIMEOUT_MIN..=PAYMENT_TIMEOUT_MAX).contains(&payment_timeout) {
        return Err(DemoError::Setup(format!(
            "--payment-timeout: between {} and {}",
            humantime::format_duration(PAYMENT_TIMEOUT_MIN),
            humantime::format_duration(PAYMENT_TIMEOUT_MAX)
        )));
    }
    let token = args
        .admin_token
        .clone()
        .or(config.any_admin_token())
        .unwrap_or_else(|| {
            let bytes: [u8; 16] = rand::rng().random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        });
    let own_config =
        OwnService::configure(config, payment_timeout, token.clone()).map_err(DemoError::Setup)?;
    if args.spawn {
        println!("service   starting one in this process (--spawn)");
    } else {
        println!("service   nothing answers at {base}: starting one in this process");
    }
    println!(
        "          payment timeout {}, on {}",
        humantime::format_duration(payment_timeout),
        stores(&own_config)
    );
    if let Some(log) = log {
        println!(
            "log       {} (the service's, and the demo's)",
            log.display()
        );
    }
    let service = OwnService::start(own_config)
        .await
        .map_err(DemoError::Service)?;
    println!("          ready at {}", service.base);
    let shop = Shop::new(&service.base, &token, buyers, connections).map_err(DemoError::Setup)?;
    let config = service.config.clone();
    *own = Some(service);
    Ok(Target { shop, config })
}

/// Prints where the live dashboard is, if a page answers there.
async fn dashboard(target: &Target) {
    let mut places = Vec::new();
    if let Some(addr) = target.config.metrics_listen {
        places.push(client::url_of(addr));
    }
    places.push(target.shop.base().to_owned());
    for place in &places {
        if client::answers(place, "/dashboard").await {
            println!("dashboard {place}/dashboard  (live: open it now)");
            return;
        }
    }
    println!(
        "dashboard none: no page answers at {}",
        places
            .iter()
            .map(|p| format!("{p}/dashboard"))
            .collect::<Vec<_>>()
            .join(" or ")
    );
}

/// Creates the demo's product on the first free id from `PRODUCT_ID_FIRST`.
async fn create_product(shop: &Shop, name: &str, stock: u32) -> Result<ProductId, DemoError> {
    let tally = Tally::default();
    for raw in PRODUCT_ID_FIRST..PRODUCT_ID_FIRST + PRODUCT_ATTEMPTS_MAX {
        let id = ProductId::parse(raw).map_err(|e| DemoError::Setup(e.to_string()))?;
        match buyers::until_known(&tally, |_| shop.create_product(id, name, stock, 1)).await? {
            Known::Done(..) => return Ok(id),
            Known::Refused(StatusCode::CONFLICT, code) if code == "product_exists" => {
                // Ours, when an attempt that got no answer created it: the name is the
                // run's own.
                if let Known::Done(_, product) =
                    buyers::until_known(&tally, |_| shop.product(id)).await?
                {
                    if product.name == name {
                        return Ok(id);
                    }
                }
            }
            Known::Refused(StatusCode::UNAUTHORIZED, _) => {
                return Err(DemoError::Setup(format!(
                    "the service at {} refused the admin token (401)",
                    shop.base()
                )))
            }
            Known::Refused(status, code) => {
                return Err(DemoError::Service(format!(
                    "creating product {id}: {status} {code}"
                )))
            }
            Known::Unknown => {
                return Err(DemoError::Service(format!(
                    "creating product {id}: no answer, even after retries"
                )))
            }
        }
    }
    Err(DemoError::Service(format!(
        "products {PRODUCT_ID_FIRST} to {} all exist",
        PRODUCT_ID_FIRST + PRODUCT_ATTEMPTS_MAX - 1
    )))
}

async fn inventory(shop: &Shop, id: ProductId) -> Result<Inventory, DemoError> {
    match buyers::until_known(&Tally::default(), |_| shop.product(id)).await? {
        Known::Done(_, product) => Ok(product.inventory),
        Known::Refused(status, code) => Err(DemoError::Service(format!(
            "GET /v1/products/{id}: {status} {code}"
        ))),
        Known::Unknown => Err(DemoError::Service(format!(
            "GET /v1/products/{id}: no answer, even after retries"
        ))),
    }
}

fn show_inventory(label: &str, inv: &Inventory) {
    println!(
        "{label:<9} {} available · {} reserved (unpaid orders) · {} sold (paid), of {}",
        count(inv.available.max(0).unsigned_abs()),
        count(inv.reserved.max(0).unsigned_abs()),
        count(inv.sold.max(0).unsigned_abs()),
        count(inv.total.max(0).unsigned_abs()),
    );
}

/// The purchase answers by outcome: orders first, then refusals, then what was retried.
fn show_answers(tally: &Tally) {
    let answers = tally.answers();
    let rank = |what: &str| match what {
        "created" => 0,
        "replayed" => 1,
        w if w.ends_with("retried") => 3,
        _ => 2,
    };
    let mut sorted: Vec<(&String, &u64)> = answers.iter().collect();
    sorted.sort_by_key(|(what, _)| (rank(what), what.as_str()));
    let text: Vec<String> = sorted
        .iter()
        .map(|(what, n)| format!("{what} {}", count(**n)))
        .collect();
    println!("          answers: {}", text.join(" · "));
}

/// One line of the summary: a check made (passed or failed), or one not made and why.
struct Check {
    passed: Option<bool>,
    text: String,
}

impl Check {
    fn made(passed: bool, text: String) -> Self {
        Self {
            passed: Some(passed),
            text,
        }
    }

    fn not_made(text: String) -> Self {
        Self { passed: None, text }
    }
}

/// The orders left unpaid, and whether the demo waited for them to expire.
struct Expiry {
    left: Vec<(OrderId, UserId, DateTime<Utc>)>,
    waited: Option<buyers::Expired>,
}

async fn demo(
    config: &Config,
    args: &DemoArgs,
    log: Option<&Path>,
    own: &mut Option<OwnService>,
) -> Result<bool, DemoError> {
    if args.buyers <= args.stock {
        return Err(DemoError::Setup(format!(
            "--buyers ({}) must be more than --stock ({}): a flash sale has more buyers than units",
            args.buyers, args.stock
        )));
    }
    let display = Display::detect();
    println!(
        "flashsale demo: a flash sale of {} units to {} buyers",
        count(args.stock),
        count(args.buyers)
    );
    let target = target(config, args, log, own).await?;
    let shop = &target.shop;
    let maintenance = crate::connect_maintenance(&target.config)
        .await
        .map_err(|e| DemoError::Service(format!("the audit's stores: {e}")))?;
    dashboard(&target).await;
    let product = open_sale(&target, &maintenance, args.stock).await?;
    let paused = pause_once(shop, product).await?;

    let Flood {
        mut all,
        tally,
        next_user,
        payment_timeout,
    } = flood(shop, product, args, display).await?;
    // The unpaid orders' deadline.
    let left: Vec<(OrderId, UserId, DateTime<Utc>)> = all
        .iter()
        .filter(|b| b.settled == Some(Settled::Left))
        .filter_map(|b| b.order().map(|o| (o.order_id, b.user, o.expires_at)))
        .collect();
    let expiry = expire(shop, product, left, payment_timeout, display).await?;
    let refunded = refund_once(shop, product, &mut all).await?;
    comeback(shop, product, next_user, &mut all, display).await?;

    // One order per request: every request that got an order, sent again.
    let with_orders: Vec<&Buyer> = all.iter().filter(|b| b.order().is_some()).collect();
    println!(
        "replay    every request that got an order, sent again with its request_id ({})",
        count(with_orders.len() as u64)
    );
    let replays = buyers::replay(shop, product, &with_orders, display).await?;

    let end = inventory(shop, product).await?;
    show_inventory("stock", &end);

    // The audit, as `flashsale audit --product` runs it.
    println!("audit     product {product}, as `flashsale audit --product {product}` runs it:");
    let (totals, report) = audit(&maintenance, product).await?;
    for line in report.lines() {
        println!("          {line}");
    }

    let mut checks = checks(
        args, product, &all, &expiry, &replays, &end, &totals, &tally,
    );
    checks.insert(checks.len() - 1, paused);
    checks.insert(checks.len() - 1, refunded);
    println!("summary   product {product}, {} units", count(args.stock));
    Ok(summary(&checks))
}

/// Creates the sale's product, named after the time it opens, and makes sure the audit
/// sees it.
async fn open_sale(
    target: &Target,
    maintenance: &flashsale_app::Maintenance,
    stock: u32,
) -> Result<ProductId, DemoError> {
    let started_at = Utc::now();
    let tag: u16 = rand::rng().random();
    let name = format!("Demo sale {} #{tag:04x}", clock(started_at));
    let product = create_product(&target.shop, &name, stock).await?;
    println!(
        "product   {product} \"{name}\": {} units, 1 per buyer",
        count(stock)
    );
    // The audit must see the product the service created: else the configuration's
    // stores are not the service's, and no audit at the end would mean anything.
    match maintenance.audit(product).await {
        Ok(report) if report.violations.is_empty() => Ok(product),
        Ok(report) => Err(DemoError::Setup(format!(
            "the new product's audit fails before the sale: are this configuration's \
             stores ({}) the service's?\n{report}",
            stores(&target.config)
        ))),
        Err(flashsale_app::Error::ProductNotFound) => Err(DemoError::Setup(format!(
            "the service created product {product}, but this configuration's stores ({}) \
             do not hold it: give the demo the service's configuration (--config or \
             FLASHSALE_*) so that its audit reads the same stores",
            stores(&target.config)
        ))),
        Err(e) => Err(DemoError::Service(format!("the audit: {e}"))),
    }
}

/// A buyer outside every wave (users count up from 1), who tries to buy while the sale
/// is paused.
const PAUSED_BUYER: i64 = 999_999_999;

/// Pauses the sale before the flood, tries to buy while it is paused, and resumes it,
/// each step retried while its outcome is unknown: the check that the purchase was
/// refused with `sale_paused` and the sale is on again. A refused purchase writes
/// nothing, so the flood's counts are untouched.
async fn pause_once(shop: &Shop, product: ProductId) -> Result<Check, DemoError> {
    let tally = Tally::default();
    let id = |what: &str| {
        RequestId::parse("request_id", &format!("demo{product}-{what}"))
            .map_err(|e| DemoError::Setup(e.to_string()))
    };
    let (pause, resume, buy) = (id("pause")?, id("resume")?, id("paused-buy")?);
    let user = UserId::parse(PAUSED_BUYER).map_err(|e| DemoError::Setup(e.to_string()))?;
    let paused = until_known(&tally, |_| shop.switch_sale(product, "pause", &pause)).await?;
    let refused = until_known(&tally, |_| shop.purchase(&buy, user, product, None)).await?;
    let resumed = until_known(&tally, |_| shop.switch_sale(product, "resume", &resume)).await?;
    let flag = |k: &Known<serde_json::Value>| match k {
        Known::Done(_, v) => v["paused"].as_bool(),
        _ => None,
    };
    let code = match &refused {
        Known::Refused(status, code) => format!("{} {code}", status.as_u16()),
        Known::Done(status, _) => format!("{} (sold)", status.as_u16()),
        Known::Unknown => "no answer".to_owned(),
    };
    let passed =
        flag(&paused) == Some(true) && code == "409 sale_paused" && flag(&resumed) == Some(false);
    println!("pause     the sale paused, a purchase tried ({code}), and resumed before the flood");
    Ok(Check::made(
        passed,
        format!("a paused sale refused a purchase ({code}) and was resumed"),
    ))
}

/// Refunds the first paid order with its unit put back on sale, once no purchase runs
/// (after the flood and the expiry, before the waves that buy what came back): the check
/// that the order reads REFUNDED and that its unit moved from sold to available. The
/// buyer is then counted as refunded, not paid; the next wave buys the unit again.
async fn refund_once(
    shop: &Shop,
    product: ProductId,
    all: &mut [Buyer],
) -> Result<Check, DemoError> {
    let Some(buyer) = all.iter_mut().find(|b| b.settled == Some(Settled::Paid)) else {
        println!("refund    no order was paid: nothing to refund");
        return Ok(Check::not_made("refund: no order was paid".to_owned()));
    };
    let Some(order) = buyer.order().map(|o| o.order_id) else {
        debug_assert!(false, "a paid buyer has an order");
        return Err(DemoError::Service("a paid buyer without an order".into()));
    };
    let request_id = RequestId::parse("request_id", &format!("demo{product}-refund"))
        .map_err(|e| DemoError::Setup(e.to_string()))?;
    let before = inventory(shop, product).await?;
    let tally = Tally::default();
    let answer = until_known(&tally, |_| shop.refund(order, &request_id, true)).await?;
    let after = inventory(shop, product).await?;
    let status = match &answer {
        Known::Done(_, v) => v["status"].as_str().unwrap_or("?").to_owned(),
        Known::Refused(status, code) => format!("{} {code}", status.as_u16()),
        Known::Unknown => "no answer".to_owned(),
    };
    if status == "REFUNDED" {
        buyer.settled = Some(Settled::Refunded);
    }
    let moved = after.sold == before.sold - 1 && after.available == before.available + 1;
    println!(
        "refund    order {order} refunded ({status}), its unit back on sale: sold {} → {}",
        count(before.sold.max(0).unsigned_abs()),
        count(after.sold.max(0).unsigned_abs())
    );
    Ok(Check::made(
        status == "REFUNDED" && moved && after.total == before.total,
        format!(
            "a paid order refunded ({status}) put its unit back on sale: sold {} → {}, \
             available {} → {}",
            before.sold, after.sold, before.available, after.available
        ),
    ))
}

/// What the flood left: every buyer's record, the answers it got, the first user of
/// the waves after it, and the service's payment timeout as its orders show it.
struct Flood {
    all: Vec<Buyer>,
    tally: Tally,
    next_user: i64,
    payment_timeout: Option<Duration>,
}

/// The flood: the first wave of buyers, who pay, cancel or walk away; what they got,
/// and the stock after them.
async fn flood(
    shop: &Shop,
    product: ProductId,
    args: &DemoArgs,
    display: Display,
) -> Result<Flood, DemoError> {
    announce_flood(args);
    let tally = Tally::default();
    let wave = Wave {
        tag: "w1".to_owned(),
        first_user: 1,
        buyers: u64::from(args.buyers),
        checkout: Checkout::Mixed,
        over: args.flood_duration,
    };
    let progress = Progress::start(display, "flood", wave.buyers, "buyers");
    let flood_started = Instant::now();
    let mut all = buyers::run_wave(shop, product, &wave, &tally, &progress).await?;
    progress.finish().await;
    let next_user = wave.first_user.saturating_add(i64::from(args.buyers));
    println!(
        "          {} buyers in {:.1} s",
        count(args.buyers),
        flood_started.elapsed().as_secs_f64()
    );
    show_answers(&tally);
    let resolved = buyers::look_up(shop, &mut all).await?;
    if resolved > 0 {
        println!(
            "          {} requests whose answers stayed unknown looked up (GET /v1/purchases/…)",
            count(resolved)
        );
    }
    let payment_timeout = all
        .iter()
        .find_map(Buyer::order)
        .and_then(|o| (o.expires_at - o.created_at).to_std().ok());
    let settled = |all: &[Buyer], what: &Settled| {
        all.iter()
            .filter(|b| b.settled.as_ref() == Some(what))
            .count() as u64
    };
    println!(
        "orders    {} placed: {} paid, {} cancelled by their buyers, {} left unpaid",
        count(all.iter().filter(|b| b.order().is_some()).count() as u64),
        count(settled(&all, &Settled::Paid)),
        count(settled(&all, &Settled::Cancelled)),
        count(settled(&all, &Settled::Left)),
    );
    show_inventory("stock", &inventory(shop, product).await?);
    Ok(Flood {
        all,
        tally,
        next_user,
        payment_timeout,
    })
}

/// Says how the flood's buyers behave.
fn announce_flood(args: &DemoArgs) {
    let pace = match args.flood_duration.is_zero() {
        true => "as fast as the service answers".to_owned(),
        false => format!(
            "arriving over {}",
            humantime::format_duration(args.flood_duration)
        ),
    };
    println!(
        "flood     {} buyers {pace}, {} at once, one unit each. 1 in {} double-clicks (the \
         same request twice at once);",
        count(args.buyers),
        buyers::BUYERS_AT_ONCE,
        buyers::ODD_ONE_IN,
    );
    println!(
        "          1 in {} gives up after {} ms and sends it again; every 503, 429 or lost \
         answer is sent again with the same request_id.",
        buyers::ODD_ONE_IN,
        buyers::IMPATIENT_AFTER.as_millis()
    );
    println!(
        "          Of those who get an order, {} in 20 pay, {} cancel at once (the unit goes \
         back on sale), {} walk away (the order expires).",
        buyers::PAY_OF_20,
        buyers::CANCEL_OF_20,
        20 - buyers::PAY_OF_20 - buyers::CANCEL_OF_20
    );
}

/// The units that came back go to buyers who waited for them, round after round while
/// some are on sale; their records join `all`.
async fn comeback(
    shop: &Shop,
    product: ProductId,
    mut next_user: i64,
    all: &mut Vec<Buyer>,
    display: Display,
) -> Result<(), DemoError> {
    for round in 1..=COMEBACK_ROUNDS_MAX {
        let available = inventory(shop, product).await?.available;
        if available <= 0 {
            if round == 1 {
                println!("wave 2    no unit is back on sale: nothing to sell");
            }
            break;
        }
        let units = available.unsigned_abs();
        let wave = Wave {
            tag: format!("w{}", round + 1),
            first_user: next_user,
            buyers: (units * COMEBACK_BUYERS_PER_UNIT).max(COMEBACK_BUYERS_MIN),
            checkout: Checkout::Pay,
            over: Duration::ZERO,
        };
        next_user = next_user.saturating_add_unsigned(wave.buyers);
        println!(
            "wave {}    {} units back on sale (cancelled, expired or refunded): {} buyers who waited, each paying at once",
            round + 1,
            count(units),
            count(wave.buyers)
        );
        let tally = Tally::default();
        let progress = Progress::start(
            display,
            &format!("wave {}", round + 1),
            wave.buyers,
            "buyers",
        );
        let mut waited = buyers::run_wave(shop, product, &wave, &tally, &progress).await?;
        progress.finish().await;
        show_answers(&tally);
        buyers::look_up(shop, &mut waited).await?;
        all.extend(waited);
    }
    Ok(())
}

/// Prints the summary's checks, one a line, and how many passed; true when none failed.
fn summary(checks: &[Check]) -> bool {
    let mut failed = 0;
    let mut not_made = 0;
    for check in checks {
        let mark = match check.passed {
            Some(true) => "ok  ",
            Some(false) => {
                failed += 1;
                "FAIL"
            }
            None => {
                not_made += 1;
                "--  "
            }
        };
        println!("  {mark}  {}", check.text);
    }
    let made = checks.len() - not_made;
    let not_made_note = if not_made > 0 {
        format!("; {not_made} not made (--)")
    } else {
        String::new()
    };
    if failed == 0 {
        println!("all {made} checks passed{not_made_note}");
    } else {
        println!("{failed} of {made} checks FAILED{not_made_note}");
    }
    failed == 0
}

/// Waits for the unpaid orders to expire when their deadline is near, showing them go;
/// else says when they will.
async fn expire(
    shop: &Shop,
    product: ProductId,
    left: Vec<(OrderId, UserId, DateTime<Utc>)>,
    payment_timeout: Option<Duration>,
    display: Display,
) -> Result<Expiry, DemoError> {
    let Some(last) = left.iter().map(|(_, _, at)| *at).max() else {
        println!("expiry    no order was left unpaid");
        return Ok(Expiry { left, waited: None });
    };
    let timeout = payment_timeout
        .map(|d| humantime::format_duration(d).to_string())
        .unwrap_or_else(|| "?".to_owned());
    let until_last = (last - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    if until_last > EXPIRY_WAIT_MAX {
        println!(
            "expiry    {} orders left unpaid expire at their deadline, {timeout} after they were \
             placed (the last at {}): the demo does not wait for them",
            count(left.len() as u64),
            clock(last)
        );
        return Ok(Expiry { left, waited: None });
    }
    println!(
        "expiry    {} orders left unpaid: the service cancels each at its deadline, {timeout} \
         after it was placed (the last at {})",
        count(left.len() as u64),
        clock(last)
    );
    let progress = Progress::start(display, "expiry", left.len() as u64, "orders");
    let give_up = Instant::now() + until_last + EXPIRY_GRACE;
    loop {
        let inv = inventory(shop, product).await?;
        let gone = (left.len() as i64 - inv.reserved).clamp(0, left.len() as i64);
        progress.set_position(gone.unsigned_abs());
        progress.set_message(format!(
            "{} units back on sale; the last deadline {}",
            count(inv.available.max(0).unsigned_abs()),
            clock(last)
        ));
        if inv.reserved <= 0 || Instant::now() > give_up {
            break;
        }
        tokio::time::sleep(EXPIRY_POLL).await;
    }
    progress.finish().await;
    let order_ids: Vec<(OrderId, UserId)> = left.iter().map(|(o, u, _)| (*o, *u)).collect();
    let found = buyers::read_expired(shop, &order_ids).await?;
    println!(
        "          {} of {} read back CANCELLED with cancel_reason payment_timeout",
        count(found.expired),
        count(left.len() as u64)
    );
    Ok(Expiry {
        left,
        waited: Some(found),
    })
}

/// Runs the product's audit, giving work in flight (events not yet published, say) up
/// to `AUDIT_SETTLE_MAX` to settle; the last run's totals and report.
async fn audit(
    maintenance: &flashsale_app::Maintenance,
    product: ProductId,
) -> Result<(crate::AuditTotals, String), DemoError> {
    let give_up = Instant::now() + AUDIT_SETTLE_MAX;
    loop {
        let mut out = Vec::new();
        let totals = crate::audit_products(maintenance, &[product], Some(product), &mut out)
            .await
            .map_err(|e| DemoError::Service(format!("the audit: {e}")))?;
        if totals.pending == 0 || Instant::now() > give_up {
            return Ok((totals, String::from_utf8_lossy(&out).into_owned()));
        }
        tokio::time::sleep(AUDIT_SETTLE_POLL).await;
    }
}

/// The summary's checks, each from what the demo saw.
#[allow(clippy::too_many_arguments)]
fn checks(
    args: &DemoArgs,
    product: ProductId,
    all: &[Buyer],
    expiry: &Expiry,
    replays: &buyers::Replays,
    end: &Inventory,
    audit: &crate::AuditTotals,
    flood: &Tally,
) -> Vec<Check> {
    let mut checks = counter_checks(args.stock, product, all, expiry, end);
    checks.extend(expiry_check(expiry));
    checks.push(one_order_check(all, replays));
    checks.push(double_click_check(all));
    checks.push(answered_check(all, flood));
    checks.push(audit_check(product, audit));
    checks
}

/// The product's counters at the end: they add up, every unit is sold (or held by an
/// order not yet expired), and as many are sold as the buyers paid for.
fn counter_checks(
    stock_units: u32,
    product: ProductId,
    all: &[Buyer],
    expiry: &Expiry,
    end: &Inventory,
) -> Vec<Check> {
    let stock = i64::from(stock_units);
    let mut checks = Vec::new();
    let paid = all
        .iter()
        .filter(|b| b.settled == Some(Settled::Paid))
        .count() as i64;
    let held = end.reserved;

    checks.push(Check::made(
        end.sold + end.reserved + end.available == stock && end.total == stock,
        format!(
            "the counters add up: sold {} + reserved {} + available {} == stock {} (GET /v1/products/{product})",
            count(end.sold.max(0).unsigned_abs()),
            count(end.reserved.max(0).unsigned_abs()),
            count(end.available.max(0).unsigned_abs()),
            count(stock_units)
        ),
    ));
    if expiry.left.is_empty() || expiry.waited.is_some() {
        checks.push(Check::made(
            end.sold == stock && end.available == 0 && end.reserved == 0,
            format!(
                "sold == stock: {} of {} units sold, none held or left",
                count(end.sold.max(0).unsigned_abs()),
                count(stock_units)
            ),
        ));
    } else {
        checks.push(Check::made(
            end.available == 0 && held == expiry.left.len() as i64,
            format!(
                "sold out: none available; {} units held by the {} orders left unpaid",
                count(held.max(0).unsigned_abs()),
                count(expiry.left.len() as u64)
            ),
        ));
        checks.push(Check::not_made(format!(
            "sold == stock: not yet; the unpaid orders' units come back at their deadline \
                 (the last at {})",
            expiry
                .left
                .iter()
                .map(|(_, _, at)| *at)
                .max()
                .map(clock)
                .unwrap_or_default()
        )));
    }
    checks.push(Check::made(
        end.sold == paid,
        format!(
            "sold == the orders paid: {} units sold, {} orders paid by the demo's buyers (1 unit each)",
            count(end.sold.max(0).unsigned_abs()),
            count(paid.unsigned_abs())
        ),
    ));
    checks
}

/// The orders left unpaid expired, when the demo waited for them; none when none was
/// left.
fn expiry_check(expiry: &Expiry) -> Option<Check> {
    match &expiry.waited {
        Some(found) => Some(Check::made(
            found.expired == expiry.left.len() as u64,
            format!(
                "every order left unpaid expired: {} of {} read back CANCELLED (payment_timeout){}",
                count(found.expired),
                count(expiry.left.len() as u64),
                listed(
                    "; not: ",
                    found.other.iter().map(|(o, s)| format!("order {o} {s}"))
                )
            ),
        )),
        None if expiry.left.is_empty() => None,
        None => Some(Check::not_made(format!(
            "every order left unpaid expired: not waited for ({} orders)",
            count(expiry.left.len() as u64)
        ))),
    }
}

/// `label` and `items` joined by commas; empty when there are none.
fn listed(label: &str, items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        return String::new();
    }
    format!("{label}{}", items.join(", "))
}

/// One order per request, from the answers: no order id for two requests, and every
/// request sent again got its order back.
fn one_order_check(all: &[Buyer], replays: &buyers::Replays) -> Check {
    let mut orders = HashSet::new();
    let mut shared = 0u64;
    for order in all.iter().filter_map(Buyer::order) {
        if !orders.insert(order.order_id) {
            shared += 1;
        }
    }
    let with_orders = all.iter().filter(|b| b.order().is_some()).count() as u64;
    let replays_ok = replays.same == replays.sent && replays.sent == with_orders;
    Check::made(
        shared == 0 && replays_ok,
        format!(
            "one order per request: {} requests got {} distinct orders; sent again, {} of {} \
             answered 200 with the same order{}{}",
            count(with_orders),
            count(orders.len() as u64),
            count(replays.same),
            count(replays.sent),
            if replays.unknown > 0 {
                format!(", {} unanswered", count(replays.unknown))
            } else {
                String::new()
            },
            listed(
                "; other answers: ",
                replays.other.iter().map(|(r, what)| format!("{r}: {what}"))
            )
        ),
    )
}

/// Double-clicks: never two orders for one request. A copy refused while the other got
/// the order is counted, not failed: each copy was decided on the stock as it found it,
/// and the replays check the request's one order.
fn double_click_check(all: &[Buyer]) -> Check {
    let pairs: Vec<(&Buyer, &Copies)> = all
        .iter()
        .filter_map(|b| b.copies.as_ref().map(|c| (b, c)))
        .collect();
    let two_orders: Vec<String> = pairs
        .iter()
        .filter_map(|(b, c)| match c {
            Copies::TwoOrders(x, y) => Some(format!("{}: orders {x} and {y}", b.request_id)),
            _ => None,
        })
        .collect();
    let split: BTreeMap<&str, Vec<String>> = pairs.iter().fold(BTreeMap::new(), |mut m, (b, c)| {
        if let Copies::OrderAndRefusal(code) = c {
            m.entry(code.as_str())
                .or_default()
                .push(b.request_id.to_string());
        }
        m
    });
    let alike = pairs.iter().filter(|(_, c)| **c == Copies::Alike).count() as u64;
    Check::made(
        two_orders.is_empty(),
        format!(
            "double-clicks never got two orders: {} pairs, {} answered alike{}{}",
            count(pairs.len() as u64),
            count(alike),
            split
                .iter()
                .map(|(code, ids)| format!(
                    ", {} answered one order and one {code} ({})",
                    count(ids.len() as u64),
                    ids[..ids.len().min(IDS_SHOWN_MAX)].join(", ")
                ))
                .collect::<String>(),
            listed(
                "; TWO ORDERS: ",
                two_orders.iter().take(IDS_SHOWN_MAX).cloned()
            )
        ),
    )
}

/// Every buyer got a known outcome, and every pay and cancel an answer.
fn answered_check(all: &[Buyer], flood: &Tally) -> Check {
    let unknown = all
        .iter()
        .filter(|b| matches!(b.last, Final::Unknown))
        .count() as u64;
    let unsettled = all
        .iter()
        .filter(|b| b.settled == Some(Settled::Unknown))
        .count() as u64;
    let refused_settling: BTreeMap<String, u64> = all.iter().fold(BTreeMap::new(), |mut m, b| {
        if let Some(Settled::Refused(code)) = &b.settled {
            *m.entry(code.clone()).or_default() += 1;
        }
        m
    });
    let retried: u64 = flood
        .answers()
        .iter()
        .filter(|(k, _)| k.ends_with("retried"))
        .map(|(_, v)| v)
        .sum();
    Check::made(
        unknown == 0 && unsettled == 0 && refused_settling.is_empty(),
        format!(
            "every buyer got an answer: {} buyers, {} without a known outcome after retries; \
             every pay and cancel answered{} (the flood sent {} requests again)",
            count(all.len() as u64),
            count(unknown),
            if unsettled == 0 && refused_settling.is_empty() {
                String::new()
            } else {
                format!(
                    " but {} unanswered and {:?} refused",
                    count(unsettled),
                    refused_settling
                )
            },
            count(retried)
        ),
    )
}

/// The product's audit found no violation.
fn audit_check(product: ProductId, audit: &crate::AuditTotals) -> Check {
    Check::made(
        audit.violations == 0,
        format!(
            "the audit of product {product}: {} violations (I1 I2 I3 I4 I6 I7){}",
            count(audit.violations as u64),
            if audit.pending > 0 {
                format!(
                    ", {} findings pending (work in flight within its bound)",
                    count(audit.pending as u64)
                )
            } else {
                String::new()
            }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::RequestId;

    fn order(id: i64) -> client::Order {
        serde_json::from_value(serde_json::json!({
            "order_id": id, "request_id": format!("r{id}"), "status": "PENDING_PAYMENT",
            "created_at": "2030-01-01T00:00:00Z", "expires_at": "2030-01-01T00:00:10Z",
        }))
        .expect("an order")
    }

    /// Buyer `n`: with `order` its order id (None: refused sold_out), what it did with it,
    /// and its double-click's comparison.
    fn buyer(
        n: i64,
        order_id: Option<i64>,
        settled: Option<Settled>,
        copies: Option<Copies>,
    ) -> Buyer {
        Buyer {
            request_id: RequestId::parse("request_id", &format!("r{n}")).expect("request id"),
            user: UserId::parse(n).expect("user"),
            last: order_id.map_or(Final::Refused("sold_out".into()), |id| {
                Final::Order(order(id))
            }),
            copies,
            settled,
        }
    }

    fn args(stock: u32) -> DemoArgs {
        DemoArgs {
            base_url: None,
            spawn: false,
            admin_token: None,
            stock,
            buyers: 10,
            payment_timeout: None,
            flood_duration: Duration::ZERO,
        }
    }

    fn inventory(total: i64, available: i64, reserved: i64, sold: i64) -> Inventory {
        Inventory {
            total,
            available,
            reserved,
            sold,
        }
    }

    fn replays(n: u64) -> buyers::Replays {
        buyers::Replays {
            sent: n,
            same: n,
            ..Default::default()
        }
    }

    /// The verdict of the check whose line starts with `start`: Some(passed), or None
    /// when it was not made; panics when there is no such line.
    fn verdict(checks: &[Check], start: &str) -> Option<bool> {
        checks
            .iter()
            .find(|c| c.text.starts_with(start))
            .unwrap_or_else(|| panic!("no check {start:?}"))
            .passed
    }

    const CLEAN: crate::AuditTotals = crate::AuditTotals {
        products: 1,
        violations: 0,
        pending: 0,
    };

    // Checks the summary of a sale where everything went right (two units, both sold and
    // paid, a third buyer refused) passes every check, and that the same answers with
    // counters that do not match them (one unit still reserved, a violation in the audit)
    // fail exactly the checks they contradict.
    #[test]
    fn checks_pass_on_a_clean_sale_and_fail_on_the_counters_that_contradict_it() {
        let product = ProductId::parse(1001).expect("product");
        let all = vec![
            buyer(1, Some(1), Some(Settled::Paid), None),
            buyer(2, Some(2), Some(Settled::Paid), Some(Copies::Alike)),
            buyer(3, None, None, None),
        ];
        let expiry = Expiry {
            left: vec![],
            waited: None,
        };
        let tally = Tally::default();
        let clean = checks(
            &args(2),
            product,
            &all,
            &expiry,
            &replays(2),
            &inventory(2, 0, 0, 2),
            &CLEAN,
            &tally,
        );
        assert!(
            clean.iter().all(|c| c.passed == Some(true)),
            "{:?}",
            clean.iter().map(|c| &c.text).collect::<Vec<_>>()
        );

        let audit = crate::AuditTotals {
            violations: 1,
            ..CLEAN
        };
        let bad = checks(
            &args(2),
            product,
            &all,
            &expiry,
            &replays(2),
            &inventory(2, 0, 1, 1),
            &audit,
            &tally,
        );
        assert_eq!(verdict(&bad, "the counters add up"), Some(true));
        assert_eq!(verdict(&bad, "sold == stock"), Some(false));
        assert_eq!(verdict(&bad, "sold == the orders paid"), Some(false));
        assert_eq!(verdict(&bad, "the audit of product"), Some(false));
        assert_eq!(verdict(&bad, "one order per request"), Some(true));

        let lost = checks(
            &args(2),
            product,
            &all,
            &expiry,
            &replays(1),
            &inventory(3, 0, 0, 2),
            &CLEAN,
            &tally,
        );
        assert_eq!(verdict(&lost, "the counters add up"), Some(false));
        assert_eq!(verdict(&lost, "one order per request"), Some(false));
    }

    // Checks a sale whose unpaid orders were not waited for never claims "sold == stock":
    // that line is not made, and "sold out" (none available, the units held by exactly
    // the orders left unpaid) is checked instead, failing when the held units differ.
    #[test]
    fn checks_not_waited_for_are_not_made() {
        let product = ProductId::parse(1001).expect("product");
        let all = vec![
            buyer(1, Some(1), Some(Settled::Paid), None),
            buyer(2, Some(2), Some(Settled::Left), None),
        ];
        let deadline = "2030-01-01T00:00:10Z".parse().expect("time");
        let left = vec![(
            OrderId::parse(2).expect("id"),
            UserId::parse(2).expect("user"),
            deadline,
        )];
        let expiry = Expiry { left, waited: None };
        let tally = Tally::default();
        let run = |inv| {
            checks(
                &args(2),
                product,
                &all,
                &expiry,
                &replays(2),
                &inv,
                &CLEAN,
                &tally,
            )
        };
        let held = run(inventory(2, 0, 1, 1));
        assert_eq!(verdict(&held, "sold == stock"), None);
        assert_eq!(verdict(&held, "every order left unpaid expired"), None);
        assert_eq!(verdict(&held, "sold out"), Some(true));
        assert!(held
            .iter()
            .filter(|c| c.passed.is_some())
            .all(|c| c.passed == Some(true)));
        assert_eq!(
            verdict(&run(inventory(2, 1, 0, 1)), "sold out"),
            Some(false)
        );
    }

    // Checks a double-click's answers: an order and a refusal pass (counted in the line),
    // two orders for one request fail, naming them.
    #[test]
    fn a_double_click_fails_only_on_two_orders() {
        let product = ProductId::parse(1001).expect("product");
        let expiry = Expiry {
            left: vec![],
            waited: None,
        };
        let tally = Tally::default();
        let split = vec![buyer(
            1,
            Some(1),
            Some(Settled::Paid),
            Some(Copies::OrderAndRefusal("sold_out".into())),
        )];
        let c = checks(
            &args(1),
            product,
            &split,
            &expiry,
            &replays(1),
            &inventory(1, 0, 0, 1),
            &CLEAN,
            &tally,
        );
        assert_eq!(
            verdict(&c, "double-clicks never got two orders"),
            Some(true)
        );
        assert!(c.iter().any(|c| c
            .text
            .contains("1 answered one order and one sold_out (r1)")));
        let two = vec![buyer(
            1,
            Some(1),
            Some(Settled::Paid),
            Some(Copies::TwoOrders(
                OrderId::parse(1).expect("id"),
                OrderId::parse(7).expect("id"),
            )),
        )];
        let c = checks(
            &args(1),
            product,
            &two,
            &expiry,
            &replays(1),
            &inventory(1, 0, 0, 1),
            &CLEAN,
            &tally,
        );
        assert_eq!(
            verdict(&c, "double-clicks never got two orders"),
            Some(false)
        );
        assert!(c.iter().any(|c| c.text.contains("orders 1 and 7")));
    }

    // Checks counts read as people write them, and a store URL loses its credentials.
    #[test]
    fn counts_and_urls_for_people() {
        assert_eq!(count(0u64), "0");
        assert_eq!(count(999u64), "999");
        assert_eq!(count(1000u64), "1,000");
        assert_eq!(count(20_000u64), "20,000");
        assert_eq!(count(1_234_567u64), "1,234,567");
        assert_eq!(
            redacted("mysql://root:secret@127.0.0.1:3306/flashsale"),
            "mysql://127.0.0.1:3306/flashsale"
        );
        assert!(!redacted("redis://:pw@10.0.0.1:6379").contains("pw"));
    }
}
