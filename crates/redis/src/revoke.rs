//! The instance's subscription to sold-out lease revocations and changed products.
//!
//! Every script that adds units to a product ends its sold-out lease and publishes
//! `<product id>:<generation>` on [`channel`] in the same atomic step; an operator's
//! change to a product (a pause) is announced as `<product id>` on [`changes`]. One task
//! per instance keeps a dedicated pub/sub connection subscribed to both and reports to a
//! [`LeaseListener`] (the sold-out board and the catalog): listening once the
//! subscription is confirmed, each revocation and change, and deaf as soon as the
//! subscription is lost — the connection closed, or a PING unanswered — so that no lease
//! is trusted across a gap in which a revocation may have been missed. Then it
//! reconnects, with a bounded backoff.

use std::sync::Arc;
use std::time::Duration;

use flashsale_app::ports::LeaseListener;
use flashsale_core::ProductId;
use futures::StreamExt;
use redis::Value;
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tracing::{info, warn};

/// How often the subscription's connection is checked with a PING: a connection that
/// died silently (a network that drops packets, a paused Redis) is noticed within this
/// plus [`REPLY_TIMEOUT`], and until then a revocation lost with it can leave a false
/// `sold_out`. A PING a second per instance costs Redis nothing.
const PING_EVERY: Duration = Duration::from_secs(1);
/// How long connecting, subscribing or a PING may take before the subscription is
/// called lost: a healthy Redis answers in well under a millisecond.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// First pause before reconnecting after a loss, doubled on each failure in a row.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// Longest pause between reconnect attempts: while deaf every purchase asks Redis, so the
/// subscription should come back soon after Redis does; a try every two seconds at most
/// costs a down Redis nothing.
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The channel revocations are published on, under the deployment's key prefix.
pub fn channel(prefix: &str) -> String {
    format!("{prefix}lease:revoked")
}

/// The channel changed product definitions are announced on, under the key prefix.
pub fn changes(prefix: &str) -> String {
    format!("{prefix}product:changed")
}

/// The product a revocation names, if its payload can be read.
pub fn product_of(payload: &[u8]) -> Option<ProductId> {
    let text = std::str::from_utf8(payload).ok()?;
    let (product, _generation) = text.split_once(':')?;
    changed_product(product.as_bytes())
}

/// The product a change announcement names (its id in decimal), if it can be read.
pub fn changed_product(payload: &[u8]) -> Option<ProductId> {
    let text = std::str::from_utf8(payload).ok()?;
    ProductId::parse(text.parse().ok()?).ok()
}

/// The two channels, revocations first.
type Channels = [String; 2];

/// A subscription: the connection's command side (for PINGs) and its messages.
type Subscription = (redis::aio::PubSubSink, redis::aio::PubSubStream);

/// Starts the subscriber for the gate's Redis, deployment `prefix`. The first
/// subscription is made before this returns (bounded by [`REPLY_TIMEOUT`] twice), so a
/// server started with Redis up trusts leases from its first purchase; then the
/// subscriber runs as long as the runtime does. Until a subscription is confirmed the
/// listener has heard nothing, and trusts no lease.
///
/// On a cluster it subscribes on one node at a time, the next seed node after each
/// loss: a cluster passes every PUBLISH to all its nodes, so one node hears every
/// product's revocations.
pub async fn listen(
    target: &crate::Target,
    prefix: &str,
    listener: Arc<dyn LeaseListener>,
) -> Result<JoinHandle<()>, redis::RedisError> {
    let clients = match target {
        crate::Target::Node(url) => vec![redis::Client::open(url.as_str())?],
        crate::Target::Cluster(nodes) => nodes
            .iter()
            .map(|node| redis::Client::open(format!("redis://{node}/")))
            .collect::<Result<_, _>>()?,
    };
    let channel = [channel(prefix), changes(prefix)];
    let Some(client) = clients.first() else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "no Redis node to subscribe on",
        )));
    };
    let first = subscribe(client, &channel).await;
    if first.is_ok() {
        listener.listening();
        info!(channels = ?channel, "listening for lease revocations and product changes");
    }
    Ok(tokio::spawn(run(clients, channel, listener, first)))
}

/// The subscriber's loop, from the outcome of a first subscription (already reported).
async fn run(
    clients: Vec<redis::Client>,
    channel: Channels,
    listener: Arc<dyn LeaseListener>,
    first: Result<Subscription, String>,
) {
    let mut attempt = first;
    let mut backoff = BACKOFF_FIRST;
    let mut next = clients.iter().cycle().skip(1);
    loop {
        let why = match attempt {
            Ok((sink, stream)) => {
                backoff = BACKOFF_FIRST;
                let why = hear(sink, stream, &channel, listener.as_ref()).await;
                listener.deaf();
                why
            }
            Err(why) => why,
        };
        warn!(channels = ?channel, error = %why, retry_in = ?backoff,
            "not listening for lease revocations and product changes; sold-out answers \
             ask Redis and product changes are read within a second meanwhile");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
        attempt = match next.next() {
            Some(client) => subscribe(client, &channel).await,
            None => Err("no Redis node to subscribe on".to_owned()),
        };
        if attempt.is_ok() {
            listener.listening();
            info!(channels = ?channel, "listening for lease revocations and product changes again");
        }
    }
}

async fn subscribe(client: &redis::Client, channels: &Channels) -> Result<Subscription, String> {
    let pubsub = timeout(REPLY_TIMEOUT, client.get_async_pubsub())
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let (mut sink, stream) = pubsub.split();
    for channel in channels {
        timeout(REPLY_TIMEOUT, sink.subscribe(channel))
            .await
            .map_err(|_| "subscribing timed out".to_owned())?
            .map_err(|e| e.to_string())?;
    }
    Ok((sink, stream))
}

/// Passes revocations and changes on until the subscription is lost; returns why.
async fn hear(
    mut sink: redis::aio::PubSubSink,
    mut stream: redis::aio::PubSubStream,
    channels: &Channels,
    listener: &dyn LeaseListener,
) -> String {
    let pinger = async move {
        loop {
            tokio::time::sleep(PING_EVERY).await;
            match timeout(REPLY_TIMEOUT, sink.ping::<Value>()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return "no answer to PING".to_owned(),
            }
        }
    };
    tokio::pin!(pinger);
    loop {
        tokio::select! {
            message = stream.next() => match message {
                Some(message) if message.get_channel_name() == channels[1] => {
                    let product_id = changed_product(message.get_payload_bytes());
                    if product_id.is_none() {
                        warn!(payload = ?message.get_payload_bytes(),
                            "unreadable product change; every product is read anew");
                    }
                    listener.changed(product_id);
                }
                Some(message) => {
                    let product_id = product_of(message.get_payload_bytes());
                    if product_id.is_none() {
                        warn!(payload = ?message.get_payload_bytes(),
                            "unreadable lease revocation; every lease is dropped");
                    }
                    listener.revoked(product_id);
                }
                None => return "connection closed".to_owned(),
            },
            why = &mut pinger => return why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a revocation's payload names its product only when it is well formed:
    // product id, a colon, the generation; anything else names none (and the board then
    // drops every lease).
    #[test]
    fn payloads() {
        assert_eq!(product_of(b"42:3").map(ProductId::get), Some(42));
        assert_eq!(product_of(b"42"), None);
        assert_eq!(product_of(b"-1:3"), None);
        assert_eq!(product_of(b"x:3"), None);
        assert_eq!(product_of(&[0xff, b':', b'1']), None);
        assert_eq!(changed_product(b"42").map(ProductId::get), Some(42));
        assert_eq!(changed_product(b"42:3"), None);
        assert_eq!(changed_product(b"0"), None);
    }
}
