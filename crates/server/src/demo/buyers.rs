//! The demo's buyers. Each presses "buy" once: one request_id, sent again with the same
//! request_id after every 503, 429 or lost answer (bounded, with backoff). One buyer in
//! ten double-clicks (the same request twice at once); one in ten gives up on its first
//! try almost at once and sends it again, as after a timeout. A buyer who gets an order
//! pays for it, cancels it or walks away (the order then expires), as the wave says.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use flashsale_core::{OrderId, OrderStatus, ProductId, RequestId, UserId};
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;

use super::client::{Answer, Order, Shop, Status, Unexpected, Unknown};
use super::count;
use super::progress::{Display, Progress};

/// Buyers in flight at once: enough to keep the service's batches full on a laptop, and
/// with a double-clicker's two connections each, well inside the default open-files
/// limit of a process that also serves them (the demo's own service).
pub const BUYERS_AT_ONCE: usize = 128;
/// Attempts of one request before its outcome is left unknown: a service that is up
/// answers the first; eight ride out a restart of a store with the waits below.
const ATTEMPTS_MAX: u32 = 8;
/// The first wait before a retry, doubled each time up to `BACKOFF_MAX`, unless the
/// service's `Retry-After` says otherwise.
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long an impatient buyer waits for its first answer before sending the request
/// again: about a purchase's own time under load, so some first tries were done and
/// their retry is answered from the record (200), and some were not.
pub const IMPATIENT_AFTER: Duration = Duration::from_millis(5);
/// One buyer in this many sends its request twice at once, and one other gives up on
/// its first try (`IMPATIENT_AFTER`).
pub const ODD_ONE_IN: u64 = 10;
/// Of every 20 orders a first-wave buyer gets, this many are paid and this many
/// cancelled at once; the rest are left unpaid to expire.
pub const PAY_OF_20: u64 = 14;
pub const CANCEL_OF_20: u64 = 3;
/// Request_ids shown when a check fails: enough to look a few up.
pub(super) const IDS_SHOWN_MAX: usize = 5;

/// What a buyer does with an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkout {
    /// First wave: 14 in 20 pay, 3 cancel, 3 walk away.
    Mixed,
    /// Every order paid (the buyers who wait for units to come back).
    Pay,
}

/// How a buyer sends its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Manner {
    Once,
    Twice,
    Impatient,
}

fn manner(n: u64) -> Manner {
    match n % ODD_ONE_IN {
        3 => Manner::Twice,
        7 => Manner::Impatient,
        _ => Manner::Once,
    }
}

/// What happened to one order after the purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    Paid,
    /// Paid, then refunded by the operator, its unit put back on sale.
    Refunded,
    Cancelled,
    /// Walked away: the order waits for its payment deadline.
    Left,
    /// The pay or cancel was refused, with this code (`order_expired`, say).
    Refused(String),
    /// No answer to the pay or cancel, even after retries.
    Unknown,
}

/// What a request's answers said in the end.
#[derive(Debug, Clone)]
pub enum Final {
    Order(Order),
    Refused(String),
    /// No answer, even after retries.
    Unknown,
}

/// How a double-click's two final answers compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Copies {
    /// The same order, or both refused.
    Alike,
    /// One got the order, the other a refusal with this code: the service decided each
    /// copy as it found the stock when that copy arrived (units can come back between
    /// two copies), and the request still has one order.
    OrderAndRefusal(String),
    /// Two different orders for one request_id: what one order per request forbids.
    TwoOrders(OrderId, OrderId),
}

/// One buyer's request and what came of it.
#[derive(Debug, Clone)]
pub struct Buyer {
    pub request_id: RequestId,
    pub user: UserId,
    pub last: Final,
    /// A double-click's two copies' answers, compared; None when sent once or a copy's
    /// answer stayed unknown.
    pub copies: Option<Copies>,
    pub settled: Option<Settled>,
}

impl Buyer {
    pub fn order(&self) -> Option<&Order> {
        match &self.last {
            Final::Order(order) => Some(order),
            _ => None,
        }
    }
}

/// Counts of everything the buyers saw, read by the progress display as they grow.
#[derive(Default)]
pub struct Tally {
    pub buyers: AtomicU64,
    pub orders: AtomicU64,
    pub paid: AtomicU64,
    pub cancelled: AtomicU64,
    pub left: AtomicU64,
    /// Winners so far, for the checkout's mix.
    winners: AtomicU64,
    /// Every purchase answer by outcome: `created`, `replayed`, an error code, and the
    /// answers retried (`503 retried`, `429 retried`, `no answer, retried`, `gave up, retried`).
    answers: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn count(&self, what: &str) {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        *answers.entry(what.to_owned()).or_default() += 1;
    }

    pub fn answers(&self) -> BTreeMap<String, u64> {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn retried(&self, why: Unknown) {
        self.count(match why {
            Unknown::Unavailable(_) => "503, retried",
            Unknown::RateLimited(_) => "429, retried",
            Unknown::NoAnswer => "no answer, retried",
            Unknown::GaveUp => "gave up waiting, retried",
        });
    }

    /// The running counts for a progress line.
    pub fn line(&self) -> String {
        let answers = self.answers();
        let retried: u64 = answers
            .iter()
            .filter(|(k, _)| k.ends_with("retried"))
            .map(|(_, v)| v)
            .sum();
        format!(
            "{} orders (paid {}, cancelled {}, unpaid {}) · {} sold out · {} sent again",
            count(self.orders.load(Ordering::Relaxed)),
            count(self.paid.load(Ordering::Relaxed)),
            count(self.cancelled.load(Ordering::Relaxed)),
            count(self.left.load(Ordering::Relaxed)),
            count(answers.get("sold_out").copied().unwrap_or(0)),
            count(retried),
        )
    }
}

/// An answer as the retry loop leaves it.
pub enum Known<T> {
    Done(StatusCode, T),
    Refused(StatusCode, String),
    Unknown,
}

/// Sends a request (`send(attempt)`) until its answer is known: a success or a refusal;
/// a 503, a 429 or no answer is retried after the service's `Retry-After` or a doubling
/// backoff (at once after a try the buyer gave up on), at most `ATTEMPTS_MAX` times.
pub async fn until_known<T, F, Fut>(tally: &Tally, mut send: F) -> Result<Known<T>, Unexpected>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<Answer<T>, Unexpected>>,
{
    let mut backoff = BACKOFF_FIRST;
    for attempt in 1..=ATTEMPTS_MAX {
        match send(attempt).await? {
            Answer::Done(status, value) => return Ok(Known::Done(status, value)),
            Answer::Refused(status, code) => return Ok(Known::Refused(status, code)),
            Answer::Retry(why) => {
                tally.retried(why);
                if attempt == ATTEMPTS_MAX {
                    break;
                }
                let wait = match why {
                    Unknown::GaveUp => Duration::ZERO,
                    why => why.retry_after().unwrap_or(backoff),
                };
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
    Ok(Known::Unknown)
}

/// Sends `ask(item)` for every item until its answer is known (`until_known`),
/// `BUYERS_AT_ONCE` at a time, and hands each item with what became known to `each`, in
/// the order the answers come.
async fn ask_each<I, T, A, Fut>(
    items: impl IntoIterator<Item = I>,
    ask: A,
    mut each: impl FnMut(I, Known<T>),
) -> Result<(), Unexpected>
where
    I: Copy,
    A: Fn(I) -> Fut,
    Fut: Future<Output = Result<Answer<T>, Unexpected>>,
{
    let tally = Tally::default();
    let mut answers = stream::iter(items)
        .map(|item| {
            let (tally, ask) = (&tally, &ask);
            async move {
                let known = until_known(tally, |_| ask(item)).await?;
                Ok::<_, Unexpected>((item, known))
            }
        })
        .buffer_unordered(BUYERS_AT_ONCE);
    while let Some(answer) = answers.next().await {
        let (item, known) = answer?;
        each(item, known);
    }
    Ok(())
}

/// A refusal that says the demo cannot act as a buyer here, whatever it retries.
fn buyers_refused(status: StatusCode, code: &str) -> Option<Unexpected> {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN).then(|| {
        Unexpected(format!(
            "the service refused the demo's buyer ({status} {code}): it authenticates buyers \
             in another way than this configuration says (the demo acts as buyers with \
             FLASHSALE_BUYER_AUTH=none or header)"
        ))
    })
}

/// A wave of buyers of one product.
pub struct Wave {
    /// Names the request_ids: `demo<product>-<tag>-<n>`.
    pub tag: String,
    /// The wave's buyers are users first_user, first_user + 1, …
    pub first_user: i64,
    pub buyers: u64,
    pub checkout: Checkout,
    /// The buyers arrive evenly over this time (buyer n at n/buyers of it, or later when
    /// all `BUYERS_AT_ONCE` are still busy); zero: as fast as the service answers.
    pub over: Duration,
}

/// Runs `wave` against `product`, `BUYERS_AT_ONCE` buyers at a time, showing progress;
/// each buyer's record, in no particular order.
pub async fn run_wave(
    shop: &Shop,
    product: ProductId,
    wave: &Wave,
    tally: &Tally,
    progress: &Progress,
) -> Result<Vec<Buyer>, Unexpected> {
    let start = tokio::time::Instant::now();
    let gap = wave
        .over
        .checked_div(u32::try_from(wave.buyers).unwrap_or(u32::MAX));
    let mut buyers = stream::iter(0..wave.buyers)
        .map(|n| async move {
            if let Some(gap) = gap.filter(|g| !g.is_zero()) {
                let after = gap.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
                tokio::time::sleep_until(start + after).await;
            }
            buy(shop, product, wave, n, tally).await
        })
        .buffer_unordered(BUYERS_AT_ONCE);
    let mut out = Vec::new();
    while let Some(buyer) = buyers.next().await {
        out.push(buyer?);
        progress.inc(1);
        progress.set_message(tally.line());
    }
    Ok(out)
}

async fn buy(
    shop: &Shop,
    product: ProductId,
    wave: &Wave,
    n: u64,
    tally: &Tally,
) -> Result<Buyer, Unexpected> {
    let raw_user = wave.first_user.saturating_add_unsigned(n);
    let user = UserId::parse(raw_user).map_err(|e| Unexpected(e.to_string()))?;
    let request_id = RequestId::parse("request_id", &format!("demo{product}-{}-{n}", wave.tag))
        .map_err(|e| Unexpected(e.to_string()))?;
    let once = |give_up: Option<Duration>| {
        let request_id = &request_id;
        async move {
            let known = until_known(tally, |attempt| {
                shop.purchase(request_id, user, product, give_up.filter(|_| attempt == 1))
            })
            .await?;
            Ok::<_, Unexpected>(match known {
                Known::Done(status, order) => {
                    tally.count(if status == StatusCode::CREATED {
                        "created"
                    } else {
                        "replayed"
                    });
                    if order.request_id != request_id.as_str() {
                        return Err(Unexpected(format!(
                            "purchase {request_id} answered with the order of {}",
                            order.request_id
                        )));
                    }
                    Final::Order(order)
                }
                Known::Refused(status, code) => {
                    if let Some(e) = buyers_refused(status, &code) {
                        return Err(e);
                    }
                    tally.count(&code);
                    Final::Refused(code)
                }
                Known::Unknown => {
                    tally.count("unknown after retries");
                    Final::Unknown
                }
            })
        }
    };
    let (last, copies) = match manner(n) {
        Manner::Once => (once(None).await?, None),
        Manner::Impatient => (once(Some(IMPATIENT_AFTER)).await?, None),
        Manner::Twice => {
            let (a, b) = tokio::join!(once(None), once(None));
            merge(a?, b?)
        }
    };
    tally.buyers.fetch_add(1, Ordering::Relaxed);
    let settled = match &last {
        Final::Order(order) => {
            tally.orders.fetch_add(1, Ordering::Relaxed);
            Some(checkout(shop, order.order_id, user, wave.checkout, tally).await?)
        }
        _ => None,
    };
    Ok(Buyer {
        request_id,
        user,
        last,
        copies,
        settled,
    })
}

/// A double-click's two final answers as one, and how they compare.
fn merge(a: Final, b: Final) -> (Final, Option<Copies>) {
    match (a, b) {
        (Final::Order(x), Final::Order(y)) => {
            let copies = if x.order_id == y.order_id {
                Copies::Alike
            } else {
                Copies::TwoOrders(x.order_id, y.order_id)
            };
            (Final::Order(x), Some(copies))
        }
        (Final::Refused(x), Final::Refused(_)) => (Final::Refused(x), Some(Copies::Alike)),
        (Final::Order(x), Final::Refused(code)) | (Final::Refused(code), Final::Order(x)) => {
            (Final::Order(x), Some(Copies::OrderAndRefusal(code)))
        }
        (Final::Unknown, other) | (other, Final::Unknown) => (other, None),
    }
}

/// What a winner does with its order: pay, cancel at once, or walk away.
async fn checkout(
    shop: &Shop,
    order: OrderId,
    user: UserId,
    policy: Checkout,
    tally: &Tally,
) -> Result<Settled, Unexpected> {
    let pay = match policy {
        Checkout::Pay => true,
        Checkout::Mixed => match tally.winners.fetch_add(1, Ordering::Relaxed) % 20 {
            k if k < PAY_OF_20 => true,
            k if k < PAY_OF_20 + CANCEL_OF_20 => false,
            _ => {
                tally.left.fetch_add(1, Ordering::Relaxed);
                return Ok(Settled::Left);
            }
        },
    };
    let want = if pay {
        OrderStatus::Paid
    } else {
        OrderStatus::Cancelled
    };
    // Pay and cancel answers are not purchase answers: their retries are not counted
    // with the purchases'.
    let quiet = Tally::default();
    Ok(
        match until_known(&quiet, |_| shop.settle(order, user, pay)).await? {
            Known::Done(_, answer) if answer.status == Status(want) => {
                let counter = if pay { &tally.paid } else { &tally.cancelled };
                counter.fetch_add(1, Ordering::Relaxed);
                if pay {
                    Settled::Paid
                } else {
                    Settled::Cancelled
                }
            }
            Known::Done(_, answer) => {
                return Err(Unexpected(format!(
                    "order {order}: {} answered 200 with status {}",
                    if pay { "pay" } else { "cancel" },
                    answer.status.0.as_str()
                )))
            }
            Known::Refused(status, code) => {
                if let Some(e) = buyers_refused(status, &code) {
                    return Err(e);
                }
                Settled::Refused(code)
            }
            Known::Unknown => Settled::Unknown,
        },
    )
}

/// What sending every order's request again said.
#[derive(Debug, Default)]
pub struct Replays {
    pub sent: u64,
    /// Answered 200 with the same order.
    pub same: u64,
    /// Answered anything else: (request_id, what).
    pub other: Vec<(String, String)>,
    pub unknown: u64,
}

/// Sends the purchase of every buyer that got an order again, as a client retrying
/// after a lost answer would: each must be answered 200 with the same order.
pub async fn replay(
    shop: &Shop,
    product: ProductId,
    buyers: &[&Buyer],
    display: Display,
) -> Result<Replays, Unexpected> {
    let progress = Progress::start(display, "replay", buyers.len() as u64, "requests");
    let mut replays = Replays::default();
    ask_each(
        buyers.iter().copied(),
        |buyer| shop.purchase(&buyer.request_id, buyer.user, product, None),
        |buyer, known| {
            replays.sent += 1;
            let expected = buyer.order().map(|o| o.order_id);
            match known {
                Known::Done(StatusCode::OK, order) if Some(order.order_id) == expected => {
                    replays.same += 1;
                }
                Known::Done(status, order) => replays.other.push((
                    buyer.request_id.to_string(),
                    format!("{status} with order {}", order.order_id),
                )),
                Known::Refused(status, code) => replays
                    .other
                    .push((buyer.request_id.to_string(), format!("{status} {code}"))),
                Known::Unknown => replays.unknown += 1,
            }
            progress.inc(1);
            progress.set_message(format!(
                "{} answered with the same order",
                count(replays.same)
            ));
        },
    )
    .await?;
    progress.finish().await;
    replays.other.truncate(IDS_SHOWN_MAX);
    Ok(replays)
}

/// What reading the orders left unpaid found.
#[derive(Debug, Default)]
pub struct Expired {
    pub read: u64,
    /// CANCELLED with cancel_reason payment_timeout.
    pub expired: u64,
    /// Anything else: (order id, status and reason).
    pub other: Vec<(OrderId, String)>,
    pub unknown: u64,
}

/// Reads every order in `left` (order, buyer): each must be CANCELLED by its payment
/// deadline (`cancel_reason` payment_timeout).
pub async fn read_expired(shop: &Shop, left: &[(OrderId, UserId)]) -> Result<Expired, Unexpected> {
    let mut found = Expired::default();
    ask_each(
        left.iter().copied(),
        |(order, user)| shop.order(order, user),
        |(order, _), known| {
            found.read += 1;
            match known {
                Known::Done(_, o)
                    if o.status == Status(OrderStatus::Cancelled)
                        && o.cancel_reason.as_deref() == Some("payment_timeout") =>
                {
                    found.expired += 1;
                }
                Known::Done(_, o) => found.other.push((
                    order,
                    format!(
                        "{} ({})",
                        o.status.0.as_str(),
                        o.cancel_reason.as_deref().unwrap_or("no cancel reason")
                    ),
                )),
                Known::Refused(status, code) => {
                    found.other.push((order, format!("{status} {code}")))
                }
                Known::Unknown => found.unknown += 1,
            }
        },
    )
    .await?;
    found.other.truncate(IDS_SHOWN_MAX);
    Ok(found)
}

/// Asks the service what became of requests whose answers stayed unknown: the order of
/// each, if it has one (`GET /v1/purchases/{request_id}`). A buyer who never heard of
/// its order does not pay for it: such an order is left unpaid, to expire.
pub async fn look_up(shop: &Shop, buyers: &mut [Buyer]) -> Result<u64, Unexpected> {
    let tally = Tally::default();
    let mut resolved = 0;
    for buyer in buyers
        .iter_mut()
        .filter(|b| matches!(b.last, Final::Unknown))
    {
        match until_known(&tally, |_| shop.purchase_of(&buyer.request_id, buyer.user)).await? {
            Known::Done(_, order) => {
                buyer.last = Final::Order(order);
                buyer.settled = Some(Settled::Left);
                resolved += 1;
            }
            Known::Refused(StatusCode::NOT_FOUND, _) => {
                buyer.last = Final::Refused("no order (looked up)".to_owned());
                resolved += 1;
            }
            Known::Refused(..) | Known::Unknown => {}
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the buyers' manners: one in ten of each odd kind, the rest sending once.
    #[test]
    fn one_in_ten_double_clicks_and_one_in_ten_is_impatient() {
        let count = |m: Manner| (0..1000).filter(|&n| manner(n) == m).count();
        assert_eq!(count(Manner::Twice), 100);
        assert_eq!(count(Manner::Impatient), 100);
        assert_eq!(count(Manner::Once), 800);
    }

    // Checks how a double-click's two answers compare: the same order or two refusals
    // are alike, two orders are two orders, an order and a refusal are told apart from
    // both (in either order), and an unknown copy leaves the other's answer uncompared.
    #[test]
    fn a_double_clicks_answers_agree_only_on_one_outcome() {
        let order = |id: i64| {
            Final::Order(
                serde_json::from_value(serde_json::json!({
                    "order_id": id, "request_id": "r", "status": "PENDING_PAYMENT",
                    "created_at": "2030-01-01T00:00:00Z", "expires_at": "2030-01-01T00:00:10Z",
                }))
                .expect("an order"),
            )
        };
        let refused = || Final::Refused("sold_out".into());
        let id = |n| OrderId::parse(n).expect("an order id");
        assert_eq!(merge(order(1), order(1)).1, Some(Copies::Alike));
        assert_eq!(
            merge(order(1), order(2)).1,
            Some(Copies::TwoOrders(id(1), id(2)))
        );
        assert_eq!(
            merge(order(1), refused()).1,
            Some(Copies::OrderAndRefusal("sold_out".into()))
        );
        assert_eq!(
            merge(refused(), order(1)).1,
            Some(Copies::OrderAndRefusal("sold_out".into()))
        );
        assert_eq!(merge(refused(), refused()).1, Some(Copies::Alike));
        assert_eq!(merge(Final::Unknown, order(1)).1, None);
        assert!(matches!(merge(Final::Unknown, order(1)).0, Final::Order(_)));
    }
}
