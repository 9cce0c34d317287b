//! Early trims of the pending index. A hold stays in its product's `pending` index until
//! something accounts for it; recovery does so only after `FLASHSALE_RECOVERY_AFTER`, so
//! in a long sale the index held an entry per order for that long, the larger share of
//! Redis's memory per order (trimmed early: 287 → 186–189 B per order). A hold whose
//! order committed is handed to the trimmer instead, which drops it a moment later with
//! `forget.lua`: one call per product per round for everything that committed meanwhile,
//! only while the record is still that hold. Best effort: what it drops or fails to trim,
//! recovery trims later.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flashsale_app::ports::StaleHold;
use flashsale_core::ProductId;
use tokio::sync::mpsc;
use tracing::debug;

use crate::calls::Layout;
use crate::RedisWire;

/// Committed holds waiting for a round; past it new ones are left to recovery, so a
/// Redis outage never grows this queue.
const TRIM_QUEUE_MAX: usize = 16_384;
/// Holds taken into one round: each product's share is one script call, which stays far
/// below a millisecond of Redis's time, and whose one ZREM takes at most this many
/// members (Lua's `unpack` passes up to about 8,000).
const TRIM_BATCH_MAX: usize = 2_048;
/// Pause between rounds. Rounds are paced rather than sized by what queued, as the
/// request path's batches are: nobody waits for a trim, and pacing keeps its calls near
/// ten a second (per product) whatever the order rate, about 0.004 per order at 3,000
/// orders/s, so trimming costs almost nothing of the Redis calls an order may make.
const TRIM_INTERVAL: Duration = Duration::from_millis(100);

/// Takes committed holds; the worker behind it ends when the handle is dropped.
pub(crate) struct Trimmer {
    queue: mpsc::Sender<(ProductId, StaleHold)>,
}

/// What the worker needs of the gate.
pub(crate) struct Forget {
    pub wire: Arc<RedisWire>,
    pub layout: Arc<Layout>,
}

impl Trimmer {
    /// Starts the worker on the current tokio runtime.
    pub(crate) fn start(forget: Forget) -> Self {
        let (queue, rx) = mpsc::channel(TRIM_QUEUE_MAX);
        tokio::spawn(forget.run(rx));
        Self { queue }
    }

    /// Queues a committed hold; never waits.
    pub(crate) fn committed(&self, product_id: ProductId, hold: StaleHold) {
        // Full, or the runtime is going down: recovery trims it later.
        let _ = self.queue.try_send((product_id, hold));
    }
}

impl Forget {
    async fn run(self, mut rx: mpsc::Receiver<(ProductId, StaleHold)>) {
        let mut taken = Vec::with_capacity(TRIM_BATCH_MAX);
        while rx.recv_many(&mut taken, TRIM_BATCH_MAX).await > 0 {
            let mut by_product: BTreeMap<ProductId, Vec<StaleHold>> = BTreeMap::new();
            for (product_id, hold) in taken.drain(..) {
                by_product.entry(product_id).or_default().push(hold);
            }
            for (product_id, holds) in by_product {
                if let Err(e) = self
                    .layout
                    .forget(self.wire.as_ref(), product_id, &holds)
                    .await
                {
                    debug!(%product_id, holds = holds.len(), error = %e, "early trim failed; recovery trims them later");
                }
            }
            tokio::time::sleep(TRIM_INTERVAL).await;
        }
    }
}
