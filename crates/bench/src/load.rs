//! The load itself: open loop (attempts on a fixed timeline, latency from the intended
//! send time, a cap on requests in flight beyond which attempts are dropped and counted)
//! or closed loop (N connections, each sending as soon as its previous answer arrived).

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
    pub base_url: String,
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
    http: Client,
    purchase_path: Uri,
    healthz_path: Uri,
    shards: Vec<Mutex<Recorder>>,
    live: Arc<Live>,
    start: Instant,
    new_intents: AtomicU64,
    client_retries: AtomicU64,
}

/// The JSON fields the bench reads from any answer.
#[derive(Debug, Default, Deserialize)]
struct Answer {
    order_id: Option<i64>,
    error: Option<String>,
}

/// One exchange's result.
struct Exchange {
    /// 0: no HTTP answer.
    status: u16,
    answer: Answer,
    retry_after: Option<Duration>,
}

/// Builds the HTTP client for the load (`crate::http`): keep-alive connections reused
/// across requests, as many idle ones kept as the load has concurrent requests.
pub fn load_client(base_url: &str, pool: usize) -> Result<Client, String> {
    Client::new(base_url, pool, CONNECT_TIMEOUT, CLIENT_TIMEOUT)
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
    fn second(&self, at: Instant) -> usize {
        at.saturating_duration_since(self.start).as_secs() as usize
    }

    fn shard(&self, intent: u64) -> std::sync::MutexGuard<'_, Recorder> {
        lock(&self.shards[(intent % SHARDS as u64) as usize])
    }

    /// One exchange: a POST of `body` as JSON, or a GET when there is no body. No whole
    /// answer (a transport failure, a timeout, a body cut short): status 0, as unknown as
    /// no answer at all.
    async fn send(&self, path: &Uri, body: Option<&Bytes>, user: Option<i64>) -> Exchange {
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
            .http
            .send(method, path, body.cloned(), authorization)
            .await
        {
            Ok(answer) => Exchange {
                status: answer.status,
                answer: serde_json::from_slice(&answer.body).unwrap_or_default(),
                retry_after: answer.retry_after,
            },
            Err(_) => Exchange {
                status: 0,
                answer: Answer::default(),
                retry_after: None,
            },
        }
    }

    /// Sends `body` to `path` (a GET when `None`), re-sending after a 503 or no answer (at most
    /// `RETRIES_503_MAX` times), and records every exchange. The first exchange's latency
    /// counts from `intended` (open loop: its place on the timeline).
    async fn exchange(
        &self,
        op: Op,
        intent: u64,
        path: &Uri,
        body: Option<&Bytes>,
        user: Option<i64>,
        intended: Instant,
    ) -> Exchange {
        let mut sent_at = intended;
        let mut tries = 0;
        loop {
            let ex = self.send(path, body, user).await;
            let now = Instant::now();
            let retry = ex.status == 0 || ex.status == 503;
            {
                let mut shard = self.shard(intent);
                shard.record(
                    op,
                    ex.status,
                    ex.answer.error.as_deref(),
                    now.saturating_duration_since(sent_at),
                    self.second(now),
                );
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
                return ex;
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

    /// One attempt of the plan's target.
    async fn attempt(&self, k: u64, intended: Instant) {
        match self.plan.target {
            Target::Purchase => self.purchase(k, intended).await,
            Target::Healthz => {
                // Every ceiling request is a new one: no request_id, nothing to repeat.
                self.new_intents.fetch_add(1, Ordering::Relaxed);
                self.exchange(Op::Healthz, k, &self.healthz_path, None, None, intended)
                    .await;
            }
        }
    }

    /// One purchase attempt, with its mixed-scenario follow-up.
    async fn purchase(&self, k: u64, intended: Instant) {
        let plan = &self.plan;
        let a = plan.workload.attempt(k);
        if a.is_retry {
            self.client_retries.fetch_add(1, Ordering::Relaxed);
        } else {
            self.new_intents.fetch_add(1, Ordering::Relaxed);
        }
        let body = Bytes::from(format!(
            r#"{{"request_id":"{}","user_id":{},"product_id":{},"quantity":1}}"#,
            plan.workload.request_id(a.intent),
            a.user_id,
            plan.product_id
        ));
        let ex = self
            .exchange(
                Op::Purchase,
                a.intent,
                &self.purchase_path,
                Some(&body),
                Some(a.user_id),
                intended,
            )
            .await;
        let Some(order_id) = ex
            .answer
            .order_id
            .filter(|_| ex.status == 200 || ex.status == 201)
        else {
            return;
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
        if !plan.follow_ups || ex.status != 201 {
            return;
        }
        let (op, verb) = match plan.workload.follow_up(a.intent) {
            FollowUp::Pay => (Op::Pay, "pay"),
            FollowUp::Cancel => (Op::Cancel, "cancel"),
            FollowUp::Expire => {
                self.shard(a.intent).leave_to_expire(order_id, a.user_id);
                return;
            }
        };
        let Ok(path) = format!("/v1/orders/{order_id}/{verb}").parse::<Uri>() else {
            // An order id is digits: its path always parses.
            return;
        };
        let body = Bytes::from(format!(r#"{{"user_id":{}}}"#, a.user_id));
        let ex = self
            .exchange(
                op,
                a.intent,
                &path,
                Some(&body),
                Some(a.user_id),
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
    }

    fn dropped(&self, k: u64) {
        self.shard(k).record_dropped(self.second(Instant::now()));
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

/// Something that watches the load while it runs (the progress bar, memory samples).
pub trait Watcher: Send + Sync {
    /// Called every `TICK` with the live counters and the seconds since the start.
    fn tick(&self, live: &Live, elapsed: Duration);
    /// The server's resident memory now, if measured.
    fn rss_kb(&self) -> Option<u64> {
        None
    }
}

/// Runs the load to completion (every attempt taken, the duration cap, or Ctrl-C).
pub async fn run(
    plan: LoadPlan,
    http: Client,
    live: Arc<Live>,
    watcher: Arc<dyn Watcher>,
) -> LoadOutcome {
    let shared = Arc::new(Shared {
        plan,
        http,
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
            let mut last_second = usize::MAX;
            loop {
                interval.tick().await;
                let now = Instant::now();
                watcher.tick(&shared.live, now - shared.start);
                let second = shared.second(now);
                if second != last_second {
                    last_second = second;
                    if let Some(kb) = watcher.rss_kb() {
                        lock(&shared.shards[0]).note_rss(second, kb);
                    }
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
        lock(&shared.shards[0]).note_rss(shared.second(Instant::now()), kb);
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

/// Starts the closed loop's workers; each stops when the attempts are all taken, the
/// duration cap passes or the stop flag is set, and notes the first such reason in
/// `stop_reason`.
fn closed_loop(
    shared: &Arc<Shared>,
    connections: u64,
    tasks: &mut JoinSet<()>,
    stop_reason: &Arc<Mutex<Option<String>>>,
) {
    for _ in 0..connections {
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
                shared.attempt(k, Instant::now()).await;
            }
        });
    }
}

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
                    tasks.spawn(async move {
                        shared.attempt(k, intended).await;
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
