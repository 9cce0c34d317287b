//! What the private clusters (Galera, Redis Cluster, NATS JetStream) share.

use std::io;
use std::time::{Duration, Instant};

/// Nodes of a Galera or NATS JetStream cluster: the fewest of which one may die, or be
/// cut off, and the two others are still a majority, which keeps Galera's Primary
/// Component taking writes and lets JetStream's servers elect new leaders. (A Redis
/// Cluster needs that of its primaries, each with a replica.)
pub(crate) const QUORUM_NODE_COUNT: usize = 3;

/// Pause between two checks of a Redis or NATS cluster's state while waiting for it
/// ([`poll_until`]): short next to the seconds a cluster takes to form, fail over or
/// elect a leader, long enough not to load its nodes (six for a Redis Cluster).
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Polls `check` every [`POLL_INTERVAL`] until it returns Ok, for at most `bound`;
/// on timeout, the error names `what` and the last reason `check` gave.
pub(crate) async fn poll_until<T, F, Fut>(
    bound: Duration,
    what: &str,
    mut check: F,
) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + bound;
    loop {
        let reason = match check().await {
            Ok(done) => return Ok(done),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("waited {bound:?} for {what}; last: {reason}"),
            ));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
