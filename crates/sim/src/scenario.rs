//! What one seed simulates: the products, the clients and what they do, the settings, and
//! how hostile the world is. Drawn from its own RNG (derived from the seed), so the
//! scenario does not change when the run's own decisions do.

use std::fmt;
use std::time::Duration;

use chrono::TimeDelta;
use flashsale_core::{ProductId, PurchaseRequest, Quantity, RequestId, UserId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use flashsale_app::FallbackSettings;

use crate::ctx::FaultProfile;

/// Most units one purchase may take in the simulation (`max_quantity_per_order`).
pub const QUANTITY_MAX: u32 = 3;
/// Most purchase intents per run: enough to oversubscribe every product several times
/// over, few enough that a run takes about a millisecond.
const INTENTS_MAX: u64 = 28;
/// Most units per product: small stocks make sold-out races and exact sell-outs common.
const STOCK_MAX: u64 = 10;
/// `FLASHSALE_FALLBACK_AFTER` and `FLASHSALE_FALLBACK_RECOVER_AFTER` of a seed, scaled
/// down from production's 3 s and 30 s to a sale of seconds (the way back is never
/// quicker than the way in, as the server's configuration requires).
const FALLBACK_AFTER_MS: [u64; 4] = [500, 1_000, 1_000, 2_000];
const FALLBACK_RECOVER_MS: [u64; 3] = [2_000, 4_000, 4_000];
/// Share of the (not calm) seeds with a long Redis outage, when it starts (while the
/// clients arrive) and how long it lasts (around `FALLBACK_AFTER_MS`: some end before
/// the switch).
const REDIS_DOWN_SHARE: f64 = 0.3;
const REDIS_DOWN_BY_STEP: u64 = 300;
const REDIS_DOWN_MS: std::ops::Range<i64> = 500..6_000;

#[derive(Debug, Clone)]
pub struct ProductSpec {
    pub id: ProductId,
    pub stock: i64,
    pub limit: Option<u32>,
}

/// What a client does after its purchase is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    Pay,
    /// Pays after a long while (often past the payment deadline).
    PayLate,
    Cancel,
    /// Pays and cancels at the same time (two tabs).
    PayAndCancel,
    Nothing,
}

#[derive(Debug, Clone)]
pub struct Intent {
    pub request: PurchaseRequest,
    /// Extra clients sending the very same request concurrently (duplicates).
    pub copies: u32,
    /// A client that reuses the request_id with another payload (a client bug).
    pub conflict: Option<PurchaseRequest>,
    pub then: Then,
    /// Yield points to wait before the first attempt (arrival time).
    pub arrive: u64,
}

#[derive(Debug, Clone)]
pub struct RestockSpec {
    pub product_id: ProductId,
    pub restock_id: RequestId,
    pub quantity: i64,
    pub arrive: u64,
}

/// Share of the runs whose Redis count of a product drifts (`Chaos::drift`).
const DRIFT_SHARE: f64 = 0.25;
/// Most units a drift moves a count by: a few, as a bad edit or a lost write would.
const DRIFT_UNITS_MAX: i64 = 4;

/// The chaos outside the calls: per-step chances and scheduled events.
#[derive(Debug, Clone, Copy, Default)]
pub struct Chaos {
    /// Per step: the clock moves by a few ms.
    pub tick: f64,
    pub tick_max_ms: i64,
    /// Per step: the true clock jumps (the whole system stalls, or a long pause).
    pub jump: f64,
    /// Per step: one instance's clock jumps (faketime on one host).
    pub instance_clock_jump: f64,
    /// Per step: the database's clock moves ahead of true time.
    pub ledger_clock_jump: f64,
    /// Per step: an instance crashes and restarts (every request and pass on it dropped,
    /// its in-process state lost).
    pub crash: f64,
    /// At this step Redis restarts empty.
    pub wipe_at: Option<u64>,
    /// Redis fails over to a replica that missed everything after the first step: the
    /// writes between the two steps are lost.
    pub rollback: Option<(u64, u64)>,
    /// A long Redis outage: long enough, in most seeds that draw one, for the products
    /// being bought to switch to ledger mode, and early enough for the sale to go on
    /// there (and, in some, to come back before it ends).
    pub redis_down: Option<RedisDown>,
    /// At this step a product's count in Redis moves by this many units behind the
    /// service's back (a bad manual edit, a lost write): the reconciliation workers must
    /// repair it, during the sale or once it is over, with every invariant kept.
    pub drift: Option<(u64, i64)>,
}

/// Redis unreachable from a step for a while of true time (the fallback's hysteresis is
/// measured in time, not steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisDown {
    pub at_step: u64,
    pub for_ms: i64,
    /// It comes back empty (a restart without persistence), not with its keys.
    pub empty: bool,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub instances: usize,
    pub products: Vec<ProductSpec>,
    pub intents: Vec<Intent>,
    pub restocks: Vec<RestockSpec>,
    pub faults: FaultProfile,
    pub chaos: Chaos,
    pub payment_timeout: Duration,
    pub recovery_after: Duration,
    pub request_timeout: Duration,
    pub record_ttl: TimeDelta,
    /// The gate's sold-out lease (zero: none), see reserve.lua.
    pub sold_out_lease: TimeDelta,
    pub batch_size: usize,
    /// Each instance's clock offset at the start.
    pub instance_skew: Vec<TimeDelta>,
    pub ledger_skew: TimeDelta,
    /// Whether the periodic reconciliation worker (which repairs) runs during the sale.
    pub reconcile: bool,
    /// Whether, after the sale, clients replay old requests once their Redis records
    /// have expired.
    pub late_replays: bool,
    /// Every instance's fallback worker (`flashsale_app::fallback`); None: no instance
    /// runs one (`--without fallback`), and no product ever leaves gate mode.
    pub fallback: Option<FallbackSettings>,
}

/// Parts of the world a run may include, all on by default. Switching one off keeps
/// every other draw of a seed the same (the draw is made, then ignored), so a failure
/// can be narrowed down to one ingredient.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Redis restarts empty.
    pub wipe: bool,
    /// Redis fails over to a replica that missed the last writes.
    pub rollback: bool,
    /// The periodic reconciliation worker repairs Redis during the sale.
    pub reconcile: bool,
    /// Clients replay old requests after their Redis records expired.
    pub late_replays: bool,
    /// Clients reuse a request_id with another payload or on another product.
    pub misuse: bool,
    /// An admin restocks during the sale.
    pub restock: bool,
    /// Instances crash and restart.
    pub crash: bool,
    /// Each instance runs the fallback worker: products switch to ledger mode while Redis
    /// is down and back when it answers again.
    pub fallback: bool,
    /// Redis is unreachable for seconds (long enough for the fallback to switch).
    pub redis_down: bool,
}

/// The names of the features, as `--without` takes them.
pub const FEATURES: &[&str] = &[
    "wipe",
    "rollback",
    "reconcile",
    "late-replays",
    "misuse",
    "restock",
    "crash",
    "fallback",
    "redis-down",
];

impl Default for Features {
    fn default() -> Self {
        Self {
            wipe: true,
            rollback: true,
            reconcile: true,
            late_replays: true,
            misuse: true,
            restock: true,
            crash: true,
            fallback: true,
            redis_down: true,
        }
    }
}

impl Features {
    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "wipe" => &mut self.wipe,
            "rollback" => &mut self.rollback,
            "reconcile" => &mut self.reconcile,
            "late-replays" => &mut self.late_replays,
            "misuse" => &mut self.misuse,
            "restock" => &mut self.restock,
            "crash" => &mut self.crash,
            "fallback" => &mut self.fallback,
            "redis-down" => &mut self.redis_down,
            _ => return None,
        })
    }

    /// All features but those named (comma-separated).
    pub fn without(names: &str) -> Result<Self, String> {
        let mut f = Self::default();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match f.flag(name) {
                Some(flag) => *flag = false,
                None => {
                    return Err(format!(
                        "unknown feature {name:?}; known: {}",
                        FEATURES.join(", ")
                    ))
                }
            }
        }
        Ok(f)
    }

    /// The names of the features switched off.
    pub fn disabled(&self) -> Vec<&'static str> {
        let mut copy = *self;
        FEATURES
            .iter()
            .copied()
            .filter(|n| copy.flag(n).is_some_and(|on| !*on))
            .collect()
    }
}

fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> T {
    items[rng.random_range(0..items.len())]
}

fn rid(raw: String) -> Option<RequestId> {
    RequestId::parse("request_id", &raw).ok()
}

impl Scenario {
    /// The scenario of a seed. None only if a generated id is invalid (a bug here).
    ///
    /// Each part is drawn in turn from the seed's stream (the order of the draws is the
    /// scenario: a part drawn elsewhere would change every seed).
    pub fn generate(seed: u64, features: Features) -> Option<Self> {
        // A different stream from the run's, so the scenario is stable.
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5ce7_a710_5eed_0001);
        let instances = pick(&mut rng, &[1, 2, 2, 3]);
        let products = products(&mut rng)?;
        let intents = intents(&mut rng, &products, features)?;
        let restocks = restocks(&mut rng, &products)?;
        let calm = rng.random_bool(0.1);
        let faults = faults(&mut rng, calm);
        let chaos = chaos(&mut rng, calm);
        let skew = |rng: &mut StdRng| {
            let ms = pick(rng, &[0, 0, 0, 500, 3_000, 3_600_000]);
            TimeDelta::milliseconds(if rng.random_bool(0.5) { ms } else { -ms })
        };
        let instance_skew = (0..instances).map(|_| skew(&mut rng)).collect();
        let ledger_skew = skew(&mut rng);
        let mut sc = Self {
            instances,
            products,
            intents,
            restocks,
            faults,
            chaos,
            payment_timeout: Duration::from_millis(rng.random_range(2_000..=20_000)),
            // Must exceed the request timeout (the server refuses such a configuration).
            recovery_after: Duration::from_millis(rng.random_range(3_000..=8_000)),
            request_timeout: Duration::from_secs(2),
            record_ttl: TimeDelta::minutes(30),
            // Drawn from a stream of its own, so every other draw of a seed stays what it
            // was before leases existed.
            sold_out_lease: TimeDelta::milliseconds(pick(
                &mut StdRng::seed_from_u64(seed ^ 0x1ea5_e000_5eed_0002),
                &[0, 50, 250, 1_000],
            )),
            batch_size: pick(&mut rng, &[1, 2, 5, 100]),
            instance_skew,
            ledger_skew,
            reconcile: rng.random_bool(0.7),
            late_replays: rng.random_bool(0.3),
            fallback: None,
        };
        sc.draw_modes(seed, calm);
        sc.keep_only(features);
        Some(sc)
    }

    /// The fallback's settings, the long Redis outage and the drift, from a stream of
    /// their own, so every draw of [`Scenario::generate`] stays what it was before ledger
    /// mode existed.
    fn draw_modes(&mut self, seed: u64, calm: bool) {
        let mut modes = StdRng::seed_from_u64(seed ^ 0xfa11_bac4_5eed_0003);
        self.fallback = Some(FallbackSettings {
            after: Some(Duration::from_millis(pick(&mut modes, &FALLBACK_AFTER_MS))),
            recover_after: Duration::from_millis(pick(&mut modes, &FALLBACK_RECOVER_MS)),
        });
        self.chaos.redis_down = (!calm && modes.random_bool(REDIS_DOWN_SHARE)).then(|| RedisDown {
            at_step: modes.random_range(0..REDIS_DOWN_BY_STEP),
            for_ms: modes.random_range(REDIS_DOWN_MS),
            empty: modes.random_bool(0.3),
        });
        // Drawn last from the same stream: the draws before it stay what they were.
        self.chaos.drift = (!calm && modes.random_bool(DRIFT_SHARE)).then(|| {
            let by = modes.random_range(1..=DRIFT_UNITS_MAX);
            let by = if modes.random_bool(0.5) { by } else { -by };
            (modes.random_range(20..1200), by)
        });
    }

    /// Leaves out what `features` switch off, once everything is drawn.
    fn keep_only(&mut self, features: Features) {
        if !features.wipe {
            self.chaos.wipe_at = None;
        }
        if !features.rollback {
            self.chaos.rollback = None;
        }
        if !features.crash {
            self.chaos.crash = 0.0;
        }
        if !features.fallback {
            self.fallback = None;
        }
        if !features.redis_down {
            self.chaos.redis_down = None;
        }
        self.reconcile &= features.reconcile;
        // Only the reconciliation workers repair a drift: without them it is no fault the
        // service claims to survive.
        if !self.reconcile {
            self.chaos.drift = None;
        }
        self.late_replays &= features.late_replays;
        if !features.misuse {
            for intent in &mut self.intents {
                intent.conflict = None;
            }
        }
        if !features.restock {
            self.restocks.clear();
        }
    }
}

/// The products: one or two, each with its stock and maybe a per-user limit.
fn products(rng: &mut StdRng) -> Option<Vec<ProductSpec>> {
    let n_products = pick(rng, &[1, 1, 2]);
    let mut products = Vec::new();
    for p in 1..=n_products {
        products.push(ProductSpec {
            id: ProductId::parse(p).ok()?,
            stock: rng.random_range(0..=STOCK_MAX) as i64,
            limit: if rng.random_bool(0.4) {
                Some(rng.random_range(1..=QUANTITY_MAX + 1))
            } else {
                None
            },
        });
    }
    Some(products)
}

/// The purchase intents: who buys what, with what copies, and what then.
fn intents(rng: &mut StdRng, products: &[ProductSpec], features: Features) -> Option<Vec<Intent>> {
    let users = rng.random_range(1..=6);
    let n_intents = rng.random_range(2..=INTENTS_MAX);
    let mut intents: Vec<Intent> = Vec::new();
    for n in 0..n_intents {
        let product = products[rng.random_range(0..products.len())].id;
        // Sometimes a request_id is reused on another product (a client bug the
        // ledger's global unique key must catch).
        let request_id = match intents.last() {
            Some(prev) if products.len() > 1 && rng.random_bool(0.05) && features.misuse => {
                prev.request.request_id.clone()
            }
            _ => rid(format!("R{n}"))?,
        };
        let request = PurchaseRequest {
            request_id,
            user_id: UserId::parse(rng.random_range(1..=users)).ok()?,
            product_id: product,
            quantity: Quantity::from_stored(rng.random_range(1..=i64::from(QUANTITY_MAX)))?,
        };
        let conflict = rng.random_bool(0.05).then(|| PurchaseRequest {
            quantity: Quantity::from_stored(i64::from(request.quantity.get() % QUANTITY_MAX) + 1)
                .unwrap_or(request.quantity),
            ..request.clone()
        });
        intents.push(Intent {
            copies: pick(rng, &[0, 0, 0, 0, 0, 1, 1, 2]),
            conflict,
            then: pick(rng, &THEN),
            arrive: rng.random_range(0..400),
            request,
        });
    }
    Some(intents)
}

/// What clients do after a purchase, as often as each is drawn.
const THEN: [Then; 8] = [
    Then::Pay,
    Then::Pay,
    Then::Pay,
    Then::PayLate,
    Then::Cancel,
    Then::PayAndCancel,
    Then::Nothing,
    Then::Nothing,
];

/// An admin's restock of a product, in a fifth of the products.
fn restocks(rng: &mut StdRng, products: &[ProductSpec]) -> Option<Vec<RestockSpec>> {
    let mut restocks = Vec::new();
    for p in products {
        if rng.random_bool(0.2) {
            restocks.push(RestockSpec {
                product_id: p.id,
                restock_id: rid(format!("S{}", p.id))?,
                quantity: rng.random_range(1..=4),
                arrive: rng.random_range(0..600),
            });
        }
    }
    Some(restocks)
}

/// A chance drawn from `levels`, or none in a calm seed (which still draws nothing).
fn rate(rng: &mut StdRng, calm: bool, levels: &[f64]) -> f64 {
    if calm {
        0.0
    } else {
        pick(rng, levels)
    }
}

/// The call faults: how often each store fails, loses replies or runs a call twice.
fn faults(rng: &mut StdRng, calm: bool) -> FaultProfile {
    FaultProfile {
        gate_fail: rate(rng, calm, &[0.0, 0.01, 0.05, 0.15]),
        gate_lose: rate(rng, calm, &[0.0, 0.01, 0.05, 0.15]),
        gate_dup: rate(rng, calm, &[0.0, 0.0, 0.02, 0.1]),
        ledger_fail: rate(rng, calm, &[0.0, 0.01, 0.05, 0.15]),
        ledger_lose: rate(rng, calm, &[0.0, 0.01, 0.05, 0.15]),
        ledger_dup: rate(rng, calm, &[0.0, 0.0, 0.02, 0.1]),
        bus_fail: rate(rng, calm, &[0.0, 0.02, 0.1]),
        bus_lose: rate(rng, calm, &[0.0, 0.02, 0.1]),
        kill: rate(rng, calm, &[0.0, 0.002, 0.01, 0.04]),
        http_lose: rate(rng, calm, &[0.0, 0.02, 0.1]),
        outage: rate(rng, calm, &[0.0, 0.0, 0.002, 0.006]),
    }
}

/// The chaos outside the calls (the outage and the drift are drawn later, from their own
/// stream).
fn chaos(rng: &mut StdRng, calm: bool) -> Chaos {
    // A sale lasts about a thousand steps; events are placed among them.
    let wipe_at = (!calm && rng.random_bool(0.12)).then(|| rng.random_range(20..1200));
    let rollback = (!calm && rng.random_bool(0.08)).then(|| {
        let from = rng.random_range(20..1000);
        (from, from + rng.random_range(1..300))
    });
    Chaos {
        tick: 0.2,
        tick_max_ms: pick(rng, &[20, 50, 100]),
        jump: rate(rng, calm, &[0.0, 0.001, 0.004]),
        instance_clock_jump: rate(rng, calm, &[0.0, 0.0, 0.002]),
        ledger_clock_jump: rate(rng, calm, &[0.0, 0.0, 0.002]),
        crash: rate(rng, calm, &[0.0, 0.0, 0.002, 0.008]),
        wipe_at,
        rollback,
        redis_down: None,
        drift: None,
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stock: Vec<String> = self
            .products
            .iter()
            .map(|p| match p.limit {
                Some(l) => format!("p{}:{} (limit {l})", p.id, p.stock),
                None => format!("p{}:{}", p.id, p.stock),
            })
            .collect();
        write!(
            f,
            "{} instance(s), stock {}, {} purchase intents, {} restock(s), payment timeout {:?}, \
             recovery after {:?}, batch {}, faults {:?}, chaos {:?}, skews {:?} / ledger {}, \
             reconcile {}, late replays {}, fallback {:?}",
            self.instances,
            stock.join(" "),
            self.intents.len(),
            self.restocks.len(),
            self.payment_timeout,
            self.recovery_after,
            self.batch_size,
            self.faults,
            self.chaos,
            self.instance_skew
                .iter()
                .map(|s| s.num_milliseconds())
                .collect::<Vec<_>>(),
            self.ledger_skew.num_milliseconds(),
            self.reconcile,
            self.late_replays,
            self.fallback,
        )
    }
}
