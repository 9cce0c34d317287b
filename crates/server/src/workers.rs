//! Runs the background workers: each runs one bounded pass of its reconciler every
//! period (at once again after a full batch; the gate watch also when nudged), logs what
//! it did, and stops on shutdown.
//! The audit also runs by itself: each sale once it has ended and settled, every product
//! once a day (`audit`); operators run it on demand with `flashsale audit`, and
//! `reconcile`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use flashsale_app::{
    Destocking, Fallback, Maintenance, Metrics, Repair, SaleRetirement, REPAIR_SETTLE,
    REPAIR_UNITS_PER_PASS,
};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::{Config, WORKER_BATCH_SIZE};

/// How often the scheduled audits' worker looks for a sale that has ended and settled, or
/// a period whose audit of every product is due: an ended sale is audited within this,
/// and each look is one indexed query on the products and one on the claims.
const AUDIT_SCHEDULE_INTERVAL: Duration = Duration::from_secs(30);

/// The least time between the end of a pass and a pass started by a nudge: the nudges
/// of one rush of purchases, arriving while a pass runs, start one more pass, not one
/// after another.
const NUDGED_PASS_GAP_MIN: Duration = Duration::from_millis(50);

/// How often the retirement worker looks for ended sales to retire: the grace
/// (`FLASHSALE_SALE_RETIRE_AFTER`, minutes) is kept to within these seconds, and each
/// look is one query over the loaded products whose sale has ended, on every instance.
const SALE_RETIRE_INTERVAL: Duration = Duration::from_secs(5);

/// Most sales one retirement pass retires: each is a short transaction and a SCAN of the
/// product's keys, so a pass stays well under a second; a full batch starts the next pass
/// at once, so a backlog (the first start after many sales) still drains quickly.
const SALE_RETIRE_BATCH: usize = 32;

/// Running workers and the means to stop them.
pub struct Workers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    metrics: Arc<Metrics>,
}

impl Workers {
    /// Starts the workers; each pass is counted in `metrics` by result, and the last
    /// reconciliation's drift set there (what the passes do, `maintenance` counts itself
    /// as it happens).
    /// `gate_watch` wakes the gate watch between its periods. `fallback` probes Redis,
    /// follows the products' stock modes and switches them.
    pub fn spawn(
        maintenance: Arc<Maintenance>,
        config: &Config,
        metrics: Arc<Metrics>,
        gate_watch: Arc<Notify>,
        fallback: Arc<Fallback>,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let start = Starter {
            stopped,
            metrics: metrics.clone(),
        };
        let modes = start.worker(
            "fallback",
            flashsale_app::modes::FOLLOW_INTERVAL,
            None,
            move || {
                let f = fallback.clone();
                // Never "busy": each pass makes a bounded number of switches.
                async move { f.pass().await.map(|_| false) }
            },
        );
        let m = maintenance.clone();
        let watch = start.worker(
            "gate-watch",
            config.gate_watch_interval,
            Some(gate_watch),
            move || {
                let m = m.clone();
                // Never "busy": one pass rebuilds every product that needs it.
                async move { m.watch_once().await.map(|_| false) }
            },
        );
        let mut tasks = vec![modes, watch];
        tasks.extend(start.maintenance(&maintenance, config));
        Self {
            stop,
            tasks,
            metrics,
        }
    }

    /// Adds the destocks' worker: every `every` (recovery's period: a pending destock is
    /// a crash's leftover, as a stale hold), it settles the destocks recorded and not
    /// settled, a batch a pass (`Destocking::settle_pending`).
    pub fn with_destocks(self, destocking: Arc<Destocking>, every: Duration) -> Self {
        self.batched(
            "destock",
            every,
            destocking,
            WORKER_BATCH_SIZE,
            |d, n| async move { d.settle_pending(n).await },
        )
    }

    /// Adds the retirement of ended sales' Redis state: every
    /// [`SALE_RETIRE_INTERVAL`], at most [`SALE_RETIRE_BATCH`] sales a pass
    /// (`SaleRetirement::retire_pass`).
    pub fn with_retirement(self, retirement: Arc<SaleRetirement>) -> Self {
        self.batched(
            "retire",
            SALE_RETIRE_INTERVAL,
            retirement,
            SALE_RETIRE_BATCH,
            |r, n| async move { r.retire_pass(n).await },
        )
    }

    /// Adds a worker whose pass asks `pass(target, batch)` to do at most `batch` of
    /// `target`'s work and answers how much it did: a full batch is "busy" (more may
    /// wait), so the next pass starts at once.
    fn batched<T, F, Fut>(
        self,
        name: &'static str,
        every: Duration,
        target: Arc<T>,
        batch: usize,
        pass: F,
    ) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>, usize) -> Fut + Send + 'static,
        Fut: Future<Output = Result<usize, flashsale_app::Error>> + Send + 'static,
    {
        self.added(name, every, move || {
            let done = pass(target.clone(), batch);
            async move { done.await.map(|n| n >= batch) }
        })
    }

    /// Adds one more worker, named `name`, running `pass` every `every` (at once again
    /// after a pass that answers "busy", true), stopped with the others.
    fn added<F, Fut>(mut self, name: &'static str, every: Duration, pass: F) -> Self
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, flashsale_app::Error>> + Send + 'static,
    {
        let start = Starter {
            stopped: self.stop.subscribe(),
            metrics: self.metrics.clone(),
        };
        self.tasks.push(start.worker(name, every, None, pass));
        self
    }

    /// Asks every worker to stop after its current pass, and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// When `serve` audits by itself: a sale once every unpaid order can have expired and
/// every abandoned hold been recovered after its end, and every product each
/// `FLASHSALE_AUDIT_EVERY`.
fn audit_schedule(config: &Config) -> flashsale_app::AuditScheduleSettings {
    flashsale_app::AuditScheduleSettings {
        settled_for: config
            .payment_timeout
            .saturating_add(crate::audit_bounds(config).workers),
        every: config.audit_every,
    }
}

/// This instance's name among the others, in the scheduled audits' claims: random, so two
/// instances on one host are told apart.
fn instance_name() -> String {
    use rand::Rng;
    let bytes: [u8; 8] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What every worker starts with: the stop signal and the metrics its passes count in.
struct Starter {
    stopped: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
}

impl Starter {
    /// Starts one worker: `pass` every `every` (and when `nudge` is notified).
    fn worker<F, Fut>(
        &self,
        name: &'static str,
        every: Duration,
        nudge: Option<Arc<Notify>>,
        pass: F,
    ) -> JoinHandle<()>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, flashsale_app::Error>> + Send + 'static,
    {
        let (stopped, metrics) = (self.stopped.clone(), self.metrics.clone());
        tokio::spawn(run(name, every, nudge, stopped, metrics, pass))
    }

    /// The maintenance workers: expiry, reconciliation, the scheduled audits, recovery.
    fn maintenance(&self, maintenance: &Arc<Maintenance>, config: &Config) -> Vec<JoinHandle<()>> {
        let m = maintenance.clone();
        let expiry = self.worker("expiry", config.expiry_interval, None, move || {
            let m = m.clone();
            async move { m.expire_once().await.map(|n| n >= WORKER_BATCH_SIZE) }
        });
        let (m, k) = (maintenance.clone(), self.metrics.clone());
        // Repairs what two looks agree on, a bounded number of units a pass
        // (`flashsale_app::maintenance::reconcile`), unless set to report only.
        let repair = match config.reconcile_repair {
            true => Repair::UpTo(REPAIR_UNITS_PER_PASS),
            false => Repair::Off,
        };
        let reconcile = self.worker("reconcile", config.reconcile_interval, None, move || {
            let (m, k) = (m.clone(), k.clone());
            async move {
                k.reconciled(&m.reconcile_all(repair, REPAIR_SETTLE).await?);
                Ok(false)
            }
        });
        let (m, schedule) = (maintenance.clone(), audit_schedule(config));
        let holder = instance_name();
        let audits = self.worker("audit", AUDIT_SCHEDULE_INTERVAL, None, move || {
            let (m, holder) = (m.clone(), holder.clone());
            // Never "busy": a pass audits a bounded number of ended sales.
            async move {
                m.scheduled_audits_once(&holder, &schedule)
                    .await
                    .map(|_| false)
            }
        });
        let m = maintenance.clone();
        let recovery = self.worker("recovery", config.recovery_interval, None, move || {
            let m = m.clone();
            async move {
                m.recover_once().await.map(|r| {
                    r.aligned
                        + r.released
                        + r.orphans_released
                        + r.returns_completed
                        + r.restocks_completed
                        >= WORKER_BATCH_SIZE
                })
            }
        });
        vec![expiry, reconcile, recovery, audits]
    }
}

/// One worker's loop. `pass` returns whether it filled a whole batch (then the next pass
/// runs at once, to drain a backlog in bounded steps) or an error (logged; retried next
/// period). Work it could not finish waits for the next period, so a store that is down
/// is never hammered. A `nudge` starts the next pass before the period ends: Notify
/// keeps at most one wake-up, so however many nudges arrive during a pass, they cost
/// one more pass. Every pass is counted in `metrics`, by result.
async fn run<F, Fut>(
    name: &'static str,
    every: Duration,
    nudge: Option<Arc<Notify>>,
    mut stopped: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    pass: F,
) where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<bool, flashsale_app::Error>>,
{
    info!(worker = name, every = ?every, "worker started");
    loop {
        let result = pass().await;
        metrics.worker_pass(name, result.is_ok());
        let ok = result.is_ok();
        if let Err(e) = &result {
            metrics.failed(e);
        }
        let busy = match result {
            Ok(busy) => busy,
            Err(e) => {
                warn!(worker = name, error = %e, "worker pass failed; retrying next period");
                false
            }
        };
        if *stopped.borrow() {
            break;
        }
        if busy {
            // Yield between consecutive passes so a backlog never starves requests.
            tokio::task::yield_now().await;
            continue;
        }
        let ended = tokio::time::Instant::now();
        let nudged = async {
            match &nudge {
                // After a failed pass only the period starts the next one: nudges from
                // a flood of purchases must not turn a store that is down into a loop.
                Some(n) if ok => {
                    n.notified().await;
                    tokio::time::sleep_until(ended + NUDGED_PASS_GAP_MIN).await;
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = nudged => {}
            _ = stopped.changed() => break,
        }
    }
    info!(worker = name, "worker stopped");
}
