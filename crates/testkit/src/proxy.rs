use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

/// Most connections one proxy forwards at the same time.
///
/// Each proxied connection holds two file descriptors and a task. A test that
/// leaks connections (a retry loop gone wrong, a pool that never closes)
/// would otherwise exhaust the process's descriptors and fail far away from
/// the bug; past this bound new connections are closed at once and a warning
/// is logged instead. 1024 is far above what any test here opens.
const MAX_CONNECTIONS: usize = 1024;

/// How long a proxied connection waits for the upstream to accept before
/// giving up and closing the client side, so a dead upstream cannot leave
/// connection tasks hanging.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause after a failed `accept` (e.g. out of file descriptors), so the
/// accept loop does not spin at full speed on a persistent error.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Size of the copy buffer for each direction of each connection.
const BUF_SIZE: usize = 16 * 1024;

/// What the proxy currently does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forward bytes both ways.
    Forward,
    /// Close live connections, close new ones right after accepting them.
    Cut,
    /// Keep connections open but forward nothing.
    Blackhole,
    /// The proxy was dropped: every task ends.
    Shutdown,
}

/// Mode plus a counter bumped on every change, so a connection can tell
/// "still the mode I started in" from "changed and changed back".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    mode: Mode,
    epoch: u64,
}

/// A TCP proxy on 127.0.0.1 in front of one upstream, for fault injection.
///
/// Why: the service must survive its Redis, MariaDB or NATS connection being
/// cut (server crash, network reset) or going silent (paused server, lost
/// packets). Killing or pausing the shared services would break every other
/// test, and `tc netem` is not available here; so a test points its client at
/// [`TcpProxy::addr`] instead of the real server and flips the proxy between
/// [`cut`](TcpProxy::cut), [`blackhole`](TcpProxy::blackhole) and
/// [`restore`](TcpProxy::restore).
///
/// Once a mode-changing method has returned, no byte that arrives afterwards
/// is forwarded in the old way; closing the sockets of live connections
/// happens in their tasks a moment later (microseconds, not a timeout).
///
/// Dropping the proxy stops its listener and every connection task.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accept_task: JoinHandle<()>,
}

impl TcpProxy {
    /// Binds `127.0.0.1:0` and starts forwarding every accepted connection to
    /// `upstream`, in both directions.
    ///
    /// Why: a test needs a fresh address whose behaviour it controls, in
    /// front of a server it must not touch. The upstream is connected to
    /// lazily, once per accepted connection, so the proxy can be started
    /// before the upstream is up.
    pub async fn start(upstream: SocketAddr) -> io::Result<TcpProxy> {
        // Not a port a private server of this process had (`port::free_port` says why):
        // a proxy on a killed server's port would answer in its place.
        let mut listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        for _ in 0..64 {
            if crate::port::claim(listener.local_addr()?.port()) {
                break;
            }
            listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        }
        let addr = listener.local_addr()?;
        let (state, state_rx) = watch::channel(State {
            mode: Mode::Forward,
            epoch: 0,
        });
        let accept_task = tokio::spawn(accept_loop(listener, upstream, state_rx));
        Ok(TcpProxy {
            addr,
            state,
            accept_task,
        })
    }

    /// The address clients should connect to instead of the upstream.
    ///
    /// Why: it is chosen by the OS at [`start`](TcpProxy::start), so tests
    /// must ask for it to build their client URLs.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every live connection (both the client and the upstream side)
    /// and, until [`restore`](TcpProxy::restore), closes every new connection
    /// right after accepting it.
    ///
    /// Why: simulates a crashed server or a reset network: the client must
    /// see fast connection errors (EOF / reset), never a hang.
    pub fn cut(&self) {
        self.set_mode(Mode::Cut);
    }

    /// From now on live and new connections stay open but no byte is
    /// forwarded in either direction.
    ///
    /// Why: simulates a paused server or a network that drops packets: the
    /// client's writes succeed and its reads never complete, so only its own
    /// timeouts can save it. [`restore`](TcpProxy::restore) or
    /// [`cut`](TcpProxy::cut) close the connections held this way.
    pub fn blackhole(&self) {
        self.set_mode(Mode::Blackhole);
    }

    /// Back to normal forwarding for new connections.
    ///
    /// Why: tests must check that the client recovers once the fault is
    /// gone. Connections that were cut stay closed, and connections that
    /// were blackholed are closed now (their byte streams have holes, so
    /// they can never be used again): clients have to reconnect.
    pub fn restore(&self) {
        self.set_mode(Mode::Forward);
    }

    /// Switches the mode and bumps the epoch, unless nothing changes (so a
    /// repeated `restore` does not kill healthy connections).
    fn set_mode(&self, mode: Mode) {
        self.state.send_if_modified(|s| {
            if s.mode == mode || s.mode == Mode::Shutdown {
                false
            } else {
                s.mode = mode;
                s.epoch += 1;
                true
            }
        });
    }
}

impl Drop for TcpProxy {
    /// Stops the listener and every connection task, so a test's proxy never
    /// outlives it.
    fn drop(&mut self) {
        self.set_mode(Mode::Shutdown);
        // Aborting the accept task drops its JoinSet, which aborts every
        // connection task; the Shutdown mode makes them exit even sooner.
        self.accept_task.abort();
    }
}

/// Accepts connections and spawns one task per connection, until shutdown.
async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mut state: watch::Receiver<State>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            // Reap finished connection tasks so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            changed = state.changed() => {
                if changed.is_err() || state.borrow().mode == Mode::Shutdown {
                    return;
                }
            }
            accepted = listener.accept() => {
                let (client, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "proxy accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                        continue;
                    }
                };
                let now = *state.borrow();
                if matches!(now.mode, Mode::Cut | Mode::Shutdown) {
                    tracing::debug!(%peer, "proxy is cut: closing new connection");
                    drop(client);
                    continue;
                }
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, MAX_CONNECTIONS, "proxy connection limit reached: closing new connection");
                    drop(client);
                    continue;
                };
                let conn_state = state.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    handle_conn(client, upstream, now, conn_state).await;
                });
            }
        }
    }
}

/// Why a connection stopped forwarding.
enum Outcome {
    /// One side closed or failed: nothing to hold on to.
    Closed,
    /// The proxy's mode changed.
    StateChanged,
}

/// Runs one proxied connection from accept to close.
async fn handle_conn(
    mut client: TcpStream,
    upstream: SocketAddr,
    start: State,
    mut state: watch::Receiver<State>,
) {
    let _ = client.set_nodelay(true);
    // Held only so that a blackholed connection keeps its upstream side open.
    let mut _upstream_conn = None;
    let outcome = if start.mode == Mode::Forward {
        match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, TcpStream::connect(upstream)).await {
            Ok(Ok(mut up)) => {
                let _ = up.set_nodelay(true);
                let outcome = forward(&mut client, &mut up, start, &mut state).await;
                _upstream_conn = Some(up);
                outcome
            }
            Ok(Err(e)) => {
                tracing::debug!(%upstream, error = %e, "proxy could not reach upstream");
                Outcome::Closed
            }
            Err(_) => {
                tracing::debug!(%upstream, "proxy timed out connecting to upstream");
                Outcome::Closed
            }
        }
    } else {
        // Accepted while blackholed: hold it without an upstream.
        Outcome::StateChanged
    };
    if let Outcome::StateChanged = outcome {
        let now = *state.borrow();
        if now.mode == Mode::Blackhole {
            // Keep both sockets open, read nothing, until the mode changes
            // again (restore, cut or shutdown) or the proxy is gone.
            let _ = state.wait_for(|s| *s != now).await;
        }
    }
    // Dropping `client` and `_upstream_conn` closes both sides.
}

/// Copies bytes both ways until both directions are done, one fails, or the
/// proxy's state moves away from `start`.
async fn forward(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    start: State,
    state: &mut watch::Receiver<State>,
) -> Outcome {
    let gate = state.clone();
    let (mut client_read, mut client_write) = client.split();
    let (mut up_read, mut up_write) = upstream.split();
    let to_upstream = pump(&mut client_read, &mut up_write, start, &gate);
    let to_client = pump(&mut up_read, &mut client_write, start, &gate);
    tokio::select! {
        // Biased: when a mode change and data are ready together, the mode
        // change wins, so no byte is forwarded after it.
        biased;
        _ = state.wait_for(|s| *s != start) => Outcome::StateChanged,
        done = async { tokio::try_join!(to_upstream, to_client) } => match done {
            Ok(_) | Err(Stop::Io) => Outcome::Closed,
            Err(Stop::StateChanged) => Outcome::StateChanged,
        },
    }
}

/// Why one direction of a connection stopped.
enum Stop {
    /// A read or write failed.
    Io,
    /// The proxy's mode changed: the bytes just read were dropped.
    StateChanged,
}

/// Copies one direction, checking the proxy's state between every read and
/// its write, so bytes read after a mode change are never forwarded.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    start: State,
    gate: &watch::Receiver<State>,
) -> Result<(), Stop>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = from.read(&mut buf).await.map_err(|_| Stop::Io)?;
        if *gate.borrow() != start {
            return Err(Stop::StateChanged);
        }
        if n == 0 {
            // Half-close: pass the EOF on, keep the other direction going.
            to.shutdown().await.map_err(|_| Stop::Io)?;
            return Ok(());
        }
        to.write_all(&buf[..n]).await.map_err(|_| Stop::Io)?;
    }
}
