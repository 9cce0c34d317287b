//! The load itself: open loop (attempts on a fixed timeline, latency from the intended
//! send time, a cap on requests in flight beyond which attempts are dropped and counted)
//! or closed loop (N connections, each sending as soon as its previous answer arrived),
//! spread round-robin over one or more servers of the same sale ([`Targets`]).

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use hyper::{Method, Uri};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cli::Target;
use crate::http::Client;
use crate::schedule::Schedule;
use crate::sql::{Answer as SqlAnswer, Purchase, SqlTarget};
use crate::stats::{Op, Recorder};
use crate::tokens::BuyerTokens;
use crate::workload::{FollowUp, Workload};

/// The client's deadline for one exchange: well above the server's own request deadline
/// (10 s by default, after which it answers 503), so a timeout here means the server or
/// the network is stuck, not merely slow.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on opening a connection to the server (127.0.0.1: a slow connect is a stuck
/// accept queue).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Re-sends of one request after a 503 or no answer, with the same request_id: a client
/// that gives up after a few tries, so a down server ends the run instead of looping.
pub const RETRIES_503_MAX: u32 = 3;
/// Longest pause before such a re-send, whatever Retry-After says: the bench measures a
/// sale of seconds, a longer pause would only idle the connection.
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// Pause when a 503 carries no usable Retry-After (and after a transport error).
const RETRY_PAUSE_DEFAULT: Duration = Duration::from_millis(100);
/// Shards of the recorder: enough that concurrent tasks on a few cores rarely wait on
/// the same lock.
const SHARDS: usize = 32;
/// After the last attempt is dispatched, how long in-flight requests may take to finish
/// before they are abandoned: one exchange with all its re-sends and pauses, plus the
/// follow-up (pay or cancel) with its own.
pub const DRAIN_MAX: Duration = Duration::from_secs(
    2 * (RETRIES_503_MAX as u64 + 1) * (CLIENT_TIMEOUT.as_secs() + RETRY_PAUSE_MAX.as_secs()),
);
/// How often the progress bar and the memory sample are refreshed.
const TICK: Duration = Duration::from_millis(250);

/// How the load is driven.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    Closed { connections: u64 },
    Open { rate: f64, max_in_flight: u64 },
}

/// What to send and how long.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub mode: Mode,
    pub attempts: u64,
    pub duration: Duration,
    pub workload: Workload,
    pub product_id: i64,
    /// Mixed scenario: pay / cancel / leave each new order.
    pub follow_ups: bool,
    /// Purchase attempts, or `GET /healthz` for the HTTP ceiling (same driver, same
    /// pacing: only the request differs).
    pub target: Target,
    /// Each user's bearer token, for a server that authenticates buyers (None: the body's
    /// user_id is the buyer).
    pub tokens: Option<Arc<BuyerTokens>>,
}

/// Counters read by the progress bar while the load runs.
#[derive(Debug, Default)]
pub struct Live {
    pub taken: AtomicU64,
    pub answers: AtomicU64,
    pub orders: AtomicU64,
    pub rejected: AtomicU64,
    pub unavailable: AtomicU64,
    pub transport: AtomicU64,
    pub dropped: AtomicU64,
    /// Set to stop dispatching (Ctrl-C).
    pub stop: AtomicBool,
}

/// What the load produced.
pub struct LoadOutcome {
    pub recorder: Recorder,
    pub elapsed: Duration,
    /// Attempts taken (sent or dropped).
    pub taken: u64,
    pub new_intents: u64,
    pub client_retries: u64,
    pub stopped_early: Option<String>,
    /// Requests still in flight when the drain bound ran out (abandoned).
    pub abandoned: u64,
}

struct Shared {
    plan: LoadPlan,
    targets: Targets,
    purchase_path: Uri,
    healthz_path: Uri,
    shards: Vec<Mutex<Recorder>>,
    live: Arc<Live>,
    start: Instant,
    new_intents: AtomicU64,
    client_retries: AtomicU64,
}

/// The JSON fields the bench reads from any answer, the error code borrowed from the body
/// when it has no escape (every code of ours): a rush's refusals then cost no allocation
/// for it.
#[derive(Debug, Default, Deserialize)]
struct Answer<'a> {
    order_id: Option<i64>,
    #[serde(borrow)]
    error: Option<Code<'a>>,
}

/// An answer's error code. A newtype because serde borrows a `Cow<str>` only when it is
/// the field itself: inside an `Option` it always owns.
#[derive(Debug, PartialEq, Deserialize)]
struct Code<'a>(#[serde(borrow)] Cow<'a, str>);

impl Answer<'_> {
    fn code(&self) -> Option<&str> {
        self.error.as_ref().map(|Code(c)| &**c)
    }
}

/// What an exchange brought back: a server's body, parsed where it is recorded, or an
/// answer known already (the SQL target's, or none).
enum Said {
    Json(Bytes),
    Known(Answer<'static>),
}

/// Most bytes of a purchase's body: its fixed text (55), the longest request_id (64,
/// `workload.rs`) and two `i64`s (20 each). The buffer is allocated at this size once, so
/// writing the body never grows it.
const PURCHASE_BODY_MAX: usize = 55 + 64 + 2 * 20;

/// One request as the load sends it: to which target, where, what, for which buyer.
struct Request<'a> {
    /// The target's index in [`Targets`].
    target: usize,
    path: &'a Uri,
    /// The JSON body of a POST; None for a GET.
    body: Option<&'a Bytes>,
    /// The buyer, whose token (if the plan has tokens) authorizes the request.
    user: Option<i64>,
    /// The purchase itself, for the SQL target (which takes no HTTP).
    purchase: Option<&'a Purchase>,
}

/// One exchange's result.
struct Exchange {
    /// 0: no HTTP answer.
    status: u16,
    said: Said,
    retry_after: Option<Duration>,
}

impl Exchange {
    fn none() -> Self {
        Exchange {
            status: 0,
            said: Said::Known(Answer::default()),
            retry_after: None,
        }
    }

    /// The answer's fields; none when the body is not JSON of that shape.
    fn answer(&self) -> Answer<'_> {
        match &self.said {
            Said::Json(body) => serde_json::from_slice(body).unwrap_or_default(),
            Said::Known(answer) => Answer {
                order_id: answer.order_id,
                error: answer.error.as_ref().map(|Code(c)| Code(Cow::Borrowed(c))),
            },
        }
    }
}

/// A request's last exchange, as the attempt that sent it needs it.
struct Outcome {
    /// 0: no HTTP answer.
    status: u16,
    order_id: Option<i64>,
}

/// The servers the load is spread over, in the order given (never none): several
/// instances of one sale, each with its own HTTP client (`crate::http`: keep-alive
/// connections reused across requests); or, for the SQL run, the one database the
/// purchases are called on (`crate::sql`).
pub struct Targets {
    base_urls: Vec<String>,
    clients: Vec<Client>,
    /// The SQL run's target, instead of HTTP clients.
    sql: Option<Arc<SqlTarget>>,
}

impl Targets {
    /// A client for each of `base_urls`, keeping at most `pool` idle connections each (the
    /// load's concurrency: a target never has more requests in flight than that). Fails on
    /// an empty list or a URL that is not a plain `http://host:port` root.
    pub fn new(base_urls: &[String], pool: usize) -> Result<Self, String> {
        if base_urls.is_empty() {
            return Err("no base URL to send the load to".into());
        }
        let base_urls = base_urls
            .iter()
            .map(|url| crate::http::parse_base_url(url))
            .collect::<Result<Vec<_>, _>>()?;
        let clients = base_urls
            .iter()
            .map(|url| Client::new(url, pool, CONNECT_TIMEOUT, CLIENT_TIMEOUT))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Targets {
            base_urls,
            clients,
            sql: None,
        })
    }

    /// The SQL run's one target: every purchase a CALL on `sql`'s connections.
    pub fn sql(sql: Arc<SqlTarget>) -> Self {
        Targets {
            base_urls: vec![sql.name().to_owned()],
            clients: Vec::new(),
            sql: Some(sql),
        }
    }

    /// How many targets there are (at least one).
    pub fn count(&self) -> usize {
        self.base_urls.len()
    }

    pub fn base_urls(&self) -> &[String] {
        &self.base_urls
    }

    /// The first target: the one the product is created through.
    pub fn first(&self) -> &str {
        // `new` refuses an empty list.
        &self.base_urls[0]
    }

    /// The target of the `n`th worker (closed loop) or attempt (open loop).
    pub fn of(&self, n: u64) -> usize {
        round_robin(n, self.count())
    }

    fn client(&self, target: usize) -> &Client {
        &self.clients[target]
    }
}

/// Target index of the `n`th of a series dealt round-robin over `targets` (at least
/// one): 0, 1, …, targets − 1, 0, 1, … — any `targets` consecutive ones cover each
/// target once, so every server gets an equal share (±1).
pub fn round_robin(n: u64, targets: usize) -> usize {
    debug_assert!(targets > 0, "round-robin over no target");
    let targets = u64::try_from(targets.max(1)).unwrap_or(u64::MAX);
    // Below `targets`, itself a usize.
    (n % targets) as usize
}

/// Builds the client of the run's few other calls (creating the product, the checks, the
/// metrics): reqwest, whose cost per request does not matter there.
pub fn control_client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .build()
        .map_err(|e| format!("http client: {e}"))
}

fn lock(m: &Mutex<Recorder>) -> std::sync::MutexGuard<'_, Recorder> {
    // A task that panicked while recording leaves counts that are still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.start)
    }

    fn shard(&self, intent: u64) -> std::sync::MutexGuard<'_, Recorder> {
        lock(&self.shards[(intent % SHARDS as u64) as usize])
    }

    /// One exchange of `req` with its target: a POST of the body as JSON, or a GET when
    /// there is no body. No whole answer (a refused connection, a transport failure, a
    /// timeout, a body cut short): status 0, as unknown as no answer at all.
    async fn send(&self, req: &Request<'_>) -> Exchange {
        let Request {
            target,
            path,
            body,
            user,
            purchase,
        } = *req;
        if let Some(sql) = &self.targets.sql {
            return match purchase {
                Some(p) => sql_exchange(sql.purchase(p).await),
                None => Exchange::none(),
            };
        }
        let method = match body {
            Some(_) => Method::POST,
            None => Method::GET,
        };
        let authorization = self
            .plan
            .tokens
            .as_ref()
            .zip(user)
            .and_then(|(tokens, user)| tokens.of(user));
        match self
            .targets
            .client(target)
            .send(method, path, body.cloned(), authorization)
            .await
        {
            Ok(answer) => Exchange {
                status: answer.status,
                said: Said::Json(answer.body),
                retry_after: answer.retry_after,
            },
            Err(_) => Exchange::none(),
        }
    }

    /// Sends `req`, re-sending it after a 503 or no answer (at most `RETRIES_503_MAX`
    /// times, to the same target: its instance may have taken the request before the
    /// answer was lost), and records every exchange. The first exchange's latency counts
    /// from `intended` (open loop: its place on the timeline).
    async fn exchange(&self, op: Op, intent: u64, req: Request<'_>, intended: Instant) -> Outcome {
        let mut sent_at = intended;
        let mut tries = 0;
        loop {
            let ex = self.send(&req).await;
            let now = Instant::now();
            let retry = ex.status == 0 || ex.status == 503;
            let answer = ex.answer();
            let code = answer.code();
            {
                let mut shard = self.shard(intent);
                shard.record(
                    op,
                    ex.status,
                    code,
                    now.saturating_duration_since(sent_at),
                    self.since_start(now),
                );
                if matches!(op, Op::Purchase | Op::Healthz) {
                    shard.record_target_exchange(req.target, ex.status, code);
                }
                if retry && tries < RETRIES_503_MAX {
                    shard.retries_503 += 1;
                } else if retry {
                    shard.gave_up += 1;
                }
            }
            let live = &self.live;
            live.answers.fetch_add(1, Ordering::Relaxed);
            match ex.status {
                0 => live.transport.fetch_add(1, Ordering::Relaxed),
                201 if op == Op::Purchase => live.orders.fetch_add(1, Ordering::Relaxed),
                400..=499 => live.rejected.fetch_add(1, Ordering::Relaxed),
                500..=599 => live.unavailable.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
            if !retry || tries >= RETRIES_503_MAX {
                return Outcome {
                    status: ex.status,
                    order_id: answer.order_id,
                };
            }
            tries += 1;
            let pause = ex
                .retry_after
                .unwrap_or(RETRY_PAUSE_DEFAULT)
                .min(RETRY_PAUSE_MAX);
            tokio::time::sleep(pause).await;
            sent_at = Instant::now();
        }
    }

    /// Attempt `k` of the plan's kind, sent to `target`; recorded against the target with
    /// the status its last exchange ended with.
    async fn attempt(&self, k: u64, target: usize, intended: Instant) {
        let status = match self.plan.target {
            Target::Purchase | Target::Sql => self.purchase(k, target, intended).await,
            Target::Healthz => {
                // Every ceiling request is a new one: no request_id, nothing to repeat.
                self.new_intents.fetch_add(1, Ordering::Relaxed);
                let req = Request {
                    target,
                    path: &self.healthz_path,
                    body: None,
                    user: None,
                    purchase: None,
                };
                self.exchange(Op::Healthz, k, req, intended).await.status
            }
        };
        self.shard(k).record_target_attempt(target, status);
    }

    /// One purchase attempt sent to `target`, with its mixed-scenario follow-up (to the
    /// same target); returns the purchase's last status (0: no answer).
    async fn purchase(&self, k: u64, target: usize, intended: Instant) -> u16 {
        let plan = &self.plan;
        let a = plan.workload.attempt(k);
        if a.is_retry {
            self.client_retries.fetch_add(1, Ordering::Relaxed);
        } else {
            self.new_intents.fetch_add(1, Ordering::Relaxed);
        }
        // What the SQL target calls, or the body posted to a server.
        let (purchase, body) = if self.targets.sql.is_some() {
            let purchase = Purchase {
                request_id: plan.workload.request_id(a.intent),
                user_id: a.user_id,
                product_id: plan.product_id,
                quantity: 1,
            };
            (Some(purchase), None)
        } else {
            let body = purchase_body(&plan.workload, a.intent, a.user_id, plan.product_id);
            (None, Some(body))
        };
        let ex = self
            .exchange(
                Op::Purchase,
                a.intent,
                Request {
                    target,
                    path: &self.purchase_path,
                    body: body.as_ref(),
                    user: Some(a.user_id),
                    purchase: purchase.as_ref(),
                },
                intended,
            )
            .await;
        let status = ex.status;
        // Only an answer naming an order acknowledges one: no answer (status 0) is
        // neither an order nor a refusal, and is counted as unknown.
        let Some(order_id) = ex.order_id.filter(|_| status == 200 || status == 201) else {
            return status;
        };
        {
            let mut shard = self.shard(a.intent);
            shard.acknowledge(a.intent, order_id);
            if ex.status == 201 {
                shard.created += 1;
            } else {
                shard.replayed += 1;
            }
        }
        // Only the attempt that created the order decides its fate, once.
        if !plan.follow_ups || status != 201 {
            return status;
        }
        let (op, verb) = match plan.workload.follow_up(a.intent) {
            FollowUp::Pay => (Op::Pay, "pay"),
            FollowUp::Cancel => (Op::Cancel, "cancel"),
            FollowUp::Expire => {
                self.shard(a.intent).leave_to_expire(order_id, a.user_id);
                return status;
            }
        };
        let Ok(path) = format!("/v1/orders/{order_id}/{verb}").parse::<Uri>() else {
            // An order id is digits: its path always parses.
            return status;
        };
        let body = Bytes::from(format!(r#"{{"user_id":{}}}"#, a.user_id));
        let ex = self
            .exchange(
                op,
                a.intent,
                Request {
                    target,
                    path: &path,
                    body: Some(&body),
                    user: Some(a.user_id),
                    purchase: None,
                },
                Instant::now(),
            )
            .await;
        if ex.status == 200 {
            let mut shard = self.shard(a.intent);
            match op {
                Op::Pay => shard.paid += 1,
                _ => shard.cancelled += 1,
            }
        }
        status
    }

    fn dropped(&self, k: u64) {
        self.shard(k)
            .record_dropped(self.since_start(Instant::now()));
        self.live.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn should_stop(&self) -> Option<String> {
        if self.live.stop.load(Ordering::Relaxed) {
            Some("interrupted".into())
        } else if self.start.elapsed() >= self.plan.duration {
            Some(format!(
                "duration cap {:.0}s reached",
                self.plan.duration.as_secs_f64()
            ))
        } else {
            None
        }
    }
}

/// A purchase's JSON body, written into one buffer of its final size: the generator's own
/// cost per POST is part of what a rush on a shared box measures, and `format!` spent
/// about 1,900 instructions on it.
fn purchase_body(workload: &Workload, intent: u64, user_id: i64, product_id: i64) -> Bytes {
    let mut ints = itoa::Buffer::new();
    let mut body = Vec::with_capacity(PURCHASE_BODY_MAX);
    body.extend_from_slice(br#"{"request_id":""#);
    workload.push_request_id(intent, &mut body);
    body.extend_from_slice(br#"","user_id":"#);
    body.extend_from_slice(ints.format(user_id).as_bytes());
    body.extend_from_slice(br#","product_id":"#);
    body.extend_from_slice(ints.format(product_id).as_bytes());
    body.extend_from_slice(br#","quantity":1}"#);
    Bytes::from(body)
}

/// A CALL's answer as the exchange a server would have answered it with: a new order 201,
/// a replay 200 (both with the order's id), sold out 409 `sold_out`, a database error 503
/// `unavailable` (re-sent like a server's 503), a lost connection no answer at all.
fn sql_exchange(answer: SqlAnswer) -> Exchange {
    let (status, order_id, error) = match answer {
        SqlAnswer::Created(id) => (201, Some(id), None),
        SqlAnswer::Replay(id) => (200, Some(id), None),
        SqlAnswer::SoldOut => (409, None, Some("sold_out")),
        SqlAnswer::Refused(_) => (503, None, Some("unavailable")),
        SqlAnswer::Lost(_) => (0, None, None),
    };
    Exchange {
        status,
        said: Said::Known(Answer {
            order_id,
            error: error.map(|code| Code(Cow::Borrowed(code))),
        }),
        retry_after: None,
    }
}

/// Something that watches the load while it runs (the progress bar, memory samples).
pub trait Watcher: Send + Sync {
    /// Called every `TICK` with the live counters and the seconds since the start.
    fn tick(&self, live: &Live, elapsed: Duration);
    /// The server's resident memory now, if measured.
    fn rss_kb(&self) -> Option<u64> {
        None
    }
}

/// Runs the load over `targets` to completion (every attempt taken, the duration cap,
/// or Ctrl-C). A target that stops answering does not stop it: its attempts end with no
/// answer, counted against it.
pub async fn run(
    plan: LoadPlan,
    targets: Targets,
    live: Arc<Live>,
    watcher: Arc<dyn Watcher>,
) -> LoadOutcome {
    let shared = Arc::new(Shared {
        plan,
        targets,
        purchase_path: Uri::from_static("/v1/purchases"),
        healthz_path: Uri::from_static("/healthz"),
        shards: (0..SHARDS)
            .map(|_| Mutex::new(Recorder::default()))
            .collect(),
        live: live.clone(),
        start: Instant::now(),
        new_intents: AtomicU64::new(0),
        client_retries: AtomicU64::new(0),
    });
    let ticker = {
        let shared = shared.clone();
        let watcher = watcher.clone();
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            loop {
                interval.tick().await;
                let now = Instant::now();
                watcher.tick(&shared.live, now - shared.start);
                if let Some(kb) = watcher.rss_kb() {
                    lock(&shared.shards[0]).note_rss(shared.since_start(now), kb);
                }
            }
        })
    };

    let mut tasks = JoinSet::new();
    let closed_stop: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let open_stop = match shared.plan.mode {
        Mode::Closed { connections } => {
            closed_loop(&shared, connections, &mut tasks, &closed_stop);
            None
        }
        Mode::Open {
            rate,
            max_in_flight,
        } => open_loop(&shared, rate, max_in_flight, &mut tasks).await,
    };
    let abandoned = drain(&mut tasks).await;
    let stopped_early =
        open_stop.or_else(|| closed_stop.lock().unwrap_or_else(|p| p.into_inner()).take());
    let elapsed = shared.start.elapsed();
    ticker.abort();
    watcher.tick(&live, elapsed);
    if let Some(kb) = watcher.rss_kb() {
        lock(&shared.shards[0]).note_rss(shared.since_start(Instant::now()), kb);
    }

    let mut recorder = Recorder::default();
    for shard in &shared.shards {
        let part = std::mem::take(&mut *lock(shard));
        recorder.merge(part);
    }
    let taken = live.taken.load(Ordering::Relaxed).min(shared.plan.attempts);
    // Closed loop: a stop noticed after the last attempt was taken is no early stop.
    let stopped_early = stopped_early.filter(|_| taken < shared.plan.attempts);
    LoadOutcome {
        recorder,
        elapsed,
        taken,
        new_intents: shared.new_intents.load(Ordering::Relaxed),
        client_retries: shared.client_retries.load(Ordering::Relaxed),
        stopped_early,
        abandoned,
    }
}

/// Waits for the tasks, at most `DRAIN_MAX`; returns how many had to be abandoned.
async fn drain(tasks: &mut JoinSet<()>) -> u64 {
    let finished = tokio::time::timeout(DRAIN_MAX, async {
        while let Some(done) = tasks.join_next().await {
            if let Err(e) = done {
                if e.is_panic() {
                    eprintln!("flashsale-bench: a load task panicked: {e}");
                }
            }
        }
    })
    .await;
    if finished.is_ok() {
        return 0;
    }
    let abandoned = tasks.len() as u64;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    abandoned
}

/// Starts the closed loop's workers, dealt round-robin over the targets (worker `w`
/// sends to target `w mod targets` for the whole run, so each target gets an equal
/// share of the connections); each stops when the attempts are all taken, the duration
/// cap passes or the stop flag is set, and notes the first such reason in `stop_reason`.
fn closed_loop(
    shared: &Arc<Shared>,
    connections: u64,
    tasks: &mut JoinSet<()>,
    stop_reason: &Arc<Mutex<Option<String>>>,
) {
    for worker in 0..connections {
        let target = shared.targets.of(worker);
        let shared = shared.clone();
        let stop_reason = stop_reason.clone();
        tasks.spawn(async move {
            // Bounded by the attempts cap (each pass takes one attempt), the duration
            // cap and the stop flag.
            loop {
                if let Some(reason) = shared.should_stop() {
                    stop_reason
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(reason);
                    return;
                }
                let k = shared.live.taken.fetch_add(1, Ordering::Relaxed);
                if k >= shared.plan.attempts {
                    return;
                }
                shared.attempt(k, target, Instant::now()).await;
            }
        });
    }
}

/// Dispatches the attempts on the schedule, attempt `k` to target `k mod targets`;
/// returns why it stopped before the end, if it did.
async fn open_loop(
    shared: &Arc<Shared>,
    rate: f64,
    max_in_flight: u64,
    tasks: &mut JoinSet<()>,
) -> Option<String> {
    let Some(schedule) = Schedule::new(rate, shared.plan.attempts) else {
        return Some(format!("invalid rate {rate}"));
    };
    let permits = Arc::new(Semaphore::new(
        usize::try_from(max_in_flight)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS),
    ));
    let mut next = 0u64;
    // Bounded by the schedule's length: each pass dispatches every attempt due by now
    // and sleeps until the next one is due.
    while next < schedule.attempts() {
        if let Some(reason) = shared.should_stop() {
            return Some(reason);
        }
        let due = schedule.due_by(shared.start.elapsed());
        while next < due {
            let k = next;
            next += 1;
            shared.live.taken.store(next, Ordering::Relaxed);
            match permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let shared = shared.clone();
                    let intended = shared.start + schedule.intended(k);
                    // Attempts, not connections, are dealt round-robin here: the open
                    // loop has no workers, and k mod targets spreads them evenly.
                    let target = shared.targets.of(k);
                    tasks.spawn(async move {
                        shared.attempt(k, target, intended).await;
                        drop(permit);
                    });
                }
                Err(_) => shared.dropped(k),
            }
        }
        // Reap finished tasks so the set holds at most the in-flight cap.
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done {
                if e.is_panic() {
                    eprintln!("flashsale-bench: a load task panicked: {e}");
                }
            }
        }
        if next < schedule.attempts() {
            tokio::time::sleep_until((shared.start + schedule.intended(next)).into()).await;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    // What: how the load deals its attempts over several servers, and what it counts
    // when one of them stops answering. How: the round-robin by itself, then whole loads
    // against tiny hand-written HTTP/1.1 servers on 127.0.0.1 — one that answers every
    // purchase with a new order, one that answers a few and then "dies" (closes its
    // listener and every connection, as a kill -9 would).
    use super::*;
    use std::collections::BTreeMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Notify;

    // Checks a purchase's body is the JSON the API takes, with the attempt's request_id
    // and ids, and that the largest ids and intent fit the buffer it is written in (so it
    // never grows): parsed back with serde_json and compared field by field.
    #[test]
    fn a_purchase_body_is_the_purchase_as_json() {
        let w = Workload {
            tag: "B0123abcd".into(),
            seed: 1,
            users: 10,
            retry_share: 0.0,
            pay_share: 0.0,
            cancel_share: 0.0,
        };
        for (intent, user, product) in [(7, 42, 1), (u64::MAX, i64::MIN, i64::MAX)] {
            let body = purchase_body(&w, intent, user, product);
            assert!(body.len() <= PURCHASE_BODY_MAX, "{} bytes", body.len());
            let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(
                v,
                serde_json::json!({
                    "request_id": w.request_id(intent),
                    "user_id": user,
                    "product_id": product,
                    "quantity": 1,
                })
            );
        }
    }

    // Checks an answer's fields are read from a server's body: the code borrowed when it
    // has no escape, still read when it has one, an order id, and nothing from a body
    // that is not JSON; the SQL target's answer reads the same.
    #[test]
    fn an_answer_is_read_from_the_body() {
        let json = |body: &'static str| Exchange {
            status: 409,
            said: Said::Json(Bytes::from_static(body.as_bytes())),
            retry_after: None,
        };
        let ex = json(r#"{"error":"sold_out","message":"no unit left"}"#);
        let a = ex.answer();
        assert!(matches!(a.error, Some(Code(Cow::Borrowed("sold_out")))));
        assert_eq!(a.order_id, None);
        let ex = json(r#"{"error":"sold\u005fout"}"#);
        assert_eq!(ex.answer().code(), Some("sold_out"));
        let ex = json(r#"{"error":null,"order_id":17,"status":"reserved"}"#);
        let a = ex.answer();
        assert_eq!((a.order_id, a.error), (Some(17), None));
        let ex = json("<html>busy</html>");
        let a = ex.answer();
        assert_eq!((a.order_id, a.error), (None, None));
        let sql = sql_exchange(SqlAnswer::SoldOut);
        assert_eq!((sql.status, sql.answer().code()), (409, Some("sold_out")));
    }

    // Checks the round-robin: 64 workers over 3 servers are 22, 21 and 21; any run of
    // `targets` consecutive indices covers every server once; one server takes all.
    #[test]
    fn round_robin_spreads_evenly() {
        let mut share = [0u64; 3];
        for worker in 0..64 {
            share[round_robin(worker, 3)] += 1;
        }
        assert_eq!(share, [22, 21, 21]);
        for start in [0, 5, 1_000_003] {
            let mut seen: Vec<usize> = (start..start + 4).map(|n| round_robin(n, 4)).collect();
            seen.sort_unstable();
            assert_eq!(seen, [0, 1, 2, 3], "from {start}");
        }
        assert!((0..10).all(|n| round_robin(n, 1) == 0));
    }

    // Checks the targets are built from the URLs in the order given (a trailing slash
    // dropped), and that none or a bad one is refused.
    #[test]
    fn targets_need_at_least_one_plain_http_root() {
        let urls = |list: &[&str]| list.iter().map(|u| (*u).to_owned()).collect::<Vec<_>>();
        let t = Targets::new(&urls(&["http://127.0.0.1:1/", "http://127.0.0.1:2"]), 4)
            .expect("two targets");
        assert_eq!(t.count(), 2);
        assert_eq!(t.first(), "http://127.0.0.1:1");
        assert_eq!(t.base_urls(), ["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        assert_eq!(t.of(3), 1);
        assert!(Targets::new(&[], 4).is_err());
        assert!(Targets::new(&urls(&["http://127.0.0.1:1", "ftp://x"]), 4).is_err());
    }

    /// Reads one request (headers and a Content-Length body) from `socket`; false at the
    /// end of the connection.
    async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + length {
                    buf.drain(..end + 4 + length);
                    return true;
                }
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// A server answering every request with a new order (201 and a fresh order id from
    /// `orders`), until it has taken `dies_after` requests (if given): then it closes its
    /// listener and every connection without answering, as a server killed with SIGKILL.
    async fn fake_server(orders: Arc<AtomicU64>, dies_after: Option<u64>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let taken = Arc::new(AtomicU64::new(0));
        let died = Arc::new(Notify::new());
        tokio::spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let socket = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((socket, _)) => socket,
                        Err(_) => break,
                    },
                    () = died.notified() => break,
                };
                let (orders, taken, died) = (orders.clone(), taken.clone(), died.clone());
                connections.spawn(async move {
                    let mut socket = socket;
                    let mut buf = Vec::new();
                    while read_request(&mut socket, &mut buf).await {
                        let n = taken.fetch_add(1, Ordering::SeqCst);
                        if dies_after.is_some_and(|max| n >= max) {
                            died.notify_one();
                            return;
                        }
                        let body = format!(
                            r#"{{"order_id":{}}}"#,
                            orders.fetch_add(1, Ordering::SeqCst) + 1
                        );
                        let answer = format!(
                            "HTTP/1.1 201 Created\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
            // Dead: the listener is dropped here and every connection with it.
            connections.abort_all();
        });
        url
    }

    struct Quiet;
    impl Watcher for Quiet {
        fn tick(&self, _: &Live, _: Duration) {}
    }

    fn plan(mode: Mode, attempts: u64) -> LoadPlan {
        LoadPlan {
            mode,
            attempts,
            duration: Duration::from_secs(30),
            workload: Workload {
                tag: "T".into(),
                seed: 1,
                users: 1000,
                // Every attempt a request_id of its own: each 201 a distinct order.
                retry_share: 0.0,
                pay_share: 0.0,
                cancel_share: 0.0,
            },
            product_id: 1,
            follow_ups: false,
            target: Target::Purchase,
            tokens: None,
        }
    }

    // Checks a load over two servers, one of which dies after 10 requests, in the closed
    // and the open loop: the run goes on to its last attempt; the attempts split over
    // both servers (the closed loop's 4 connections 2 and 2); every attempt is counted
    // against one server and ends in an order or in no answer; the dead server's last
    // attempts end with no answer, which is neither an order nor a refusal (every
    // acknowledged order is one the servers created, and no 4xx is recorded); and its
    // exchanges without an answer include the re-sends.
    #[tokio::test]
    async fn a_server_that_dies_mid_run_costs_only_its_own_attempts() {
        for mode in [
            Mode::Closed { connections: 4 },
            Mode::Open {
                rate: 2000.0,
                max_in_flight: 64,
            },
        ] {
            const ATTEMPTS: u64 = 120;
            let orders = Arc::new(AtomicU64::new(0));
            let urls = vec![
                fake_server(orders.clone(), None).await,
                fake_server(orders.clone(), Some(10)).await,
            ];
            let targets = Targets::new(&urls, 8).expect("targets");
            let out = run(
                plan(mode, ATTEMPTS),
                targets,
                Arc::new(Live::default()),
                Arc::new(Quiet),
            )
            .await;
            let rec = &out.recorder;
            assert_eq!(out.taken, ATTEMPTS, "{mode:?}");
            assert_eq!(out.stopped_early, None, "{mode:?}");
            let [alive, dead] = [&rec.targets[0], &rec.targets[1]];
            assert_eq!(alive.attempts + dead.attempts, ATTEMPTS, "{mode:?}");
            assert!(alive.attempts > 0 && dead.attempts > 0, "{mode:?}");
            assert_eq!(alive.outcomes, BTreeMap::from([(201, alive.attempts)]));
            let dead_orders = dead.outcomes.get(&201).copied().unwrap_or(0);
            let unknown = dead.outcomes.get(&0).copied().unwrap_or(0);
            assert!(dead_orders <= 10, "{mode:?}: {dead:?}");
            assert!(unknown > 0, "{mode:?}: {dead:?}");
            assert_eq!(dead_orders + unknown, dead.attempts, "{mode:?}: {dead:?}");
            // Each unknown attempt was sent 1 + RETRIES_503_MAX times without an answer.
            assert_eq!(
                dead.statuses.get(&0).copied(),
                Some(unknown * u64::from(RETRIES_503_MAX + 1)),
                "{mode:?}: {dead:?}"
            );
            // Only answered orders are acknowledged: as many as the servers created.
            assert_eq!(rec.created, alive.attempts + dead_orders, "{mode:?}");
            assert_eq!(rec.acks.len() as u64, rec.created, "{mode:?}");
            assert_eq!(rec.created, orders.load(Ordering::SeqCst), "{mode:?}");
            assert_eq!(rec.gave_up, unknown, "{mode:?}");
            let purchases = rec.op(Op::Purchase);
            assert!(
                !purchases.statuses.keys().any(|s| (400..500).contains(s)),
                "{mode:?}: {:?}",
                purchases.statuses
            );
            if mode == (Mode::Closed { connections: 4 }) {
                // The dead server's two connections each lose one attempt per
                // 1 + RETRIES_503_MAX tries: the live one takes most of the run.
                assert!(alive.attempts > dead.attempts, "{alive:?} {dead:?}");
            }
        }
    }
}
