//! The demo's own service: `serve` in this process, on the configured stores, with the
//! demo's payment timeout and admin token, stopped (drained) when the demo ends.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::client::{answers, url_of};
use crate::Config;

/// How long the service may take to answer `/readyz`: it creates its database and runs
/// the migrations first (retrying a database that is still starting for up to 30 s).
const READY_MAX: Duration = Duration::from_secs(60);
/// Pause between readiness polls.
const READY_POLL: Duration = Duration::from_millis(100);
/// How long the service may take to drain and stop: above its request deadline (10 s by
/// default) and a second, which bound its drain.
const STOP_MAX: Duration = Duration::from_secs(20);

/// A service the demo started.
pub struct OwnService {
    pub config: Config,
    pub base: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), String>>,
}

/// `addr` if it is free to listen on, else a free port on its address: a service already
/// listening there is left alone.
fn free_or_other(addr: SocketAddr) -> Result<SocketAddr, String> {
    TcpListener::bind(addr)
        .or_else(|_| TcpListener::bind(SocketAddr::new(addr.ip(), 0)))
        .and_then(|listener| listener.local_addr())
        .map_err(|e| format!("no free port on {}: {e}", addr.ip()))
}

impl OwnService {
    /// The configuration of the demo's service: `config`'s stores, on the configured
    /// listen address or a free port beside it, with `payment_timeout` and `admin_token`.
    pub fn configure(
        config: &Config,
        payment_timeout: Duration,
        admin_token: String,
    ) -> Result<Config, String> {
        if payment_timeout >= config.redis_record_ttl {
            return Err(format!(
                "the payment timeout ({}) must be below FLASHSALE_REDIS_RECORD_TTL ({})",
                humantime::format_duration(payment_timeout),
                humantime::format_duration(config.redis_record_ttl)
            ));
        }
        let mut config = config.clone();
        config.listen = free_or_other(config.listen)?;
        // The metrics' own listener is kept where it is free; otherwise they are served on
        // the API's address, as when it is unset.
        config.metrics_listen = config
            .metrics_listen
            .and_then(|addr| TcpListener::bind(addr).ok())
            .and_then(|listener| listener.local_addr().ok())
            .filter(|addr| *addr != config.listen);
        config.payment_timeout = payment_timeout;
        config.admin_token = Some(admin_token);
        Ok(config)
    }

    /// Starts `serve` with `config` in this process and waits until it is ready.
    pub async fn start(config: Config) -> Result<Self, String> {
        let (stop, stopped) = oneshot::channel::<()>();
        let served = config.clone();
        let mut task = tokio::spawn(async move {
            crate::serve_until(&served, async {
                let _ = stopped.await;
            })
            .await
        });
        let base = url_of(config.listen);
        let started = Instant::now();
        loop {
            if answers(&base, "/readyz").await {
                return Ok(Self {
                    config,
                    base,
                    stop,
                    task,
                });
            }
            if task.is_finished() {
                return Err(match (&mut task).await {
                    Ok(Err(e)) => format!("the demo's service did not start: {e}"),
                    Ok(Ok(())) => "the demo's service stopped as it started".to_owned(),
                    Err(e) => format!("the demo's service failed: {e}"),
                });
            }
            if started.elapsed() > READY_MAX {
                let _ = stop.send(());
                return Err(format!(
                    "the demo's service was not ready within {}s ({base}/readyz): are Redis and MariaDB up? (scripts/services.sh)",
                    READY_MAX.as_secs()
                ));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Stops the service: it finishes the requests in flight, stops its workers and
    /// returns.
    pub async fn stop(self) -> Result<(), String> {
        let _ = self.stop.send(());
        match tokio::time::timeout(STOP_MAX, self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(format!("the demo's service failed: {e}")),
            Err(_) => Err(format!(
                "the demo's service did not stop within {}s",
                STOP_MAX.as_secs()
            )),
        }
    }
}
