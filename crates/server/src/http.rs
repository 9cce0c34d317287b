//! The HTTP listener: every connection, and what a slow, idle or malicious client can
//! hold, bounded.
//!
//! `axum::serve` bounds none of it: a client could hold a connection open forever by
//! sending nothing, or a header a byte at a time, and enough of them exhaust the process's
//! file descriptors, after which `accept` fails for everyone. Here each connection is
//! served by hyper's HTTP/1.1 server with:
//!
//! - a header deadline: a request's head must arrive within `header_timeout` of the
//!   connection opening or of the previous answer (hyper's header read timeout, which
//!   also closes an idle keep-alive connection then);
//! - a cap on a request head's bytes ([`HEADER_BYTES_MAX`], answered 431 by hyper) and
//!   on its header count ([`HEADERS_MAX`]);
//! - a write deadline ([`WRITE_STALL_MAX`]): a client that stops reading its answers is
//!   dropped instead of holding the connection;
//! - a cap on open connections (`connections_max`). At the cap a new connection first
//!   evicts the oldest connection that is not inside a request (idle, or still sending
//!   its head: slowloris), so an attacker's idle sockets cannot lock real buyers out; if
//!   every connection is inside a request, the newcomer is answered 503 and closed.
//!
//! Request bodies are read before a request takes one of the API's in-flight slots, by
//! the API's own layer (`flashsale_api`), under the request deadline.
//!
//! HTTP/1.1 only: HTTP/2 is for the proxy in front to terminate.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;
use tower::Service;
use tracing::{info, warn};

/// Most bytes of one request head (request line and headers): hyper answers 431 past it.
/// The API's requests carry a few short headers (a bearer token is under 2 KiB); the
/// cap also bounds the read buffer a connection holds (hyper's default grows to about
/// 400 KiB, which let 500 slow headers take 185 MiB).
pub const HEADER_BYTES_MAX: usize = 16 * 1024;
/// Most header fields in one request head, answered 431 past it: hyper's own cap (its
/// default, `DEFAULT_MAX_HEADERS`), which the builder leaves alone. Set through
/// `Builder::max_headers`, any cap makes hyper fill two arrays of that many entries for
/// every request it parses, about 1,400 instructions a request; its default uses arrays it
/// leaves uninitialized (BENCHMARKS.md, ablation row S20). A browser sends about 20.
pub const HEADERS_MAX: usize = 100;
/// How long a write to a client may stall before the connection is dropped: an answer is
/// a few hundred bytes, so a client that has not taken it in this time is not reading.
pub const WRITE_STALL_MAX: Duration = Duration::from_secs(10);
/// Connections refused at the cap that may be answered at once (each reads the request
/// head briefly, then gets 503); past it a refused connection is closed unanswered, so a
/// connect flood cannot turn the refusals themselves into unbounded work.
const REFUSALS_IN_FLIGHT_MAX: usize = 256;
/// How long a refused connection may take to send its request head before its 503: long
/// enough for a client on a slow link, short enough that refusals stay few.
const REFUSAL_READ_MAX: Duration = Duration::from_millis(500);
/// The wait after `accept` fails for want of resources (too many open files), so the loop
/// does not spin while connections close; it never gives up.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);
/// How long, once the server stops, a connection with no request in flight waits for one
/// before it is closed: a client that connected, or reused a keep-alive connection, just
/// before the stop has its request on the wire, and closing first would leave it with an
/// empty reply or a reset. Short, so that the stop is not held up: the balancer in front
/// has stopped sending new clients.
const STOP_IDLE_GRACE: Duration = Duration::from_millis(250);
/// Past the longest a request in flight at the stop can still take, for its answer to be
/// written (a client that does not read it is [`WRITE_STALL_MAX`]'s business).
const DRAIN_MARGIN: Duration = Duration::from_secs(1);

/// How long a graceful stop waits for the requests in flight, with `request_timeout` the
/// deadline of each of a request's two phases: a request may begin up to
/// [`STOP_IDLE_GRACE`] after the stop, read its body for up to `request_timeout`
/// (`flashsale_api`'s body reader) and then run its use case for up to `request_timeout`
/// more, whose deadline answers 503 itself. Waiting less cut such a request off with an
/// empty reply instead of its answer.
pub fn drain_timeout(request_timeout: Duration) -> Duration {
    STOP_IDLE_GRACE + request_timeout.saturating_mul(2) + DRAIN_MARGIN
}

/// How often a connection waiting out [`STOP_IDLE_GRACE`] looks whether its request began.
const STOP_POLL: Duration = Duration::from_millis(2);
/// Most connections taken from the listen backlog after the stop: connections the kernel
/// completed before it would be reset when the listener closes, so each is taken in and
/// answered like the rest: as many as the backlog can hold.
const BACKLOG_DRAIN_MAX: usize = LISTEN_BACKLOG as usize;
/// How long the stop waits for one more queued connection: the backlog's connections are
/// there at once, so a short wait finds them all.
const BACKLOG_DRAIN_WAIT: Duration = Duration::from_millis(2);
/// The listen backlog asked of the kernel: connections it completes before the accept
/// loop takes them. A flash sale opens with thousands of buyers connecting in the same
/// second, and a full queue drops their SYNs; each dropped one costs its client a
/// retransmission a second later (then 3 s, then 7 s). The standard library's and
/// tokio's `bind` ask for 128, which 256 connections opened at once overflowed on every
/// run (`TcpExtListenOverflows`; BENCHMARKS.md, ablation row S27). The kernel caps it at
/// `net.core.somaxconn` (4096 by default since Linux 5.4); each queued connection is a
/// socket the kernel holds, the same as an accepted one.
pub const LISTEN_BACKLOG: u32 = 4096;
/// Descriptors kept free of client connections: the stores' pools, the metrics listener,
/// logs and the refusals' sockets need some (`connections_max` is lowered to fit).
pub const DESCRIPTORS_RESERVED: u64 = 512;

/// The answer to a connection refused at the cap (the API's JSON error shape).
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 76\r\n\r\n\
{\"error\":\"unavailable\",\"message\":\"too many connections; retry in a moment\"}";

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// Most connections open at once.
    pub connections_max: usize,
    /// A request head must arrive within this time of the connection opening or of the
    /// previous answer; an idle keep-alive connection is closed after it.
    pub header_timeout: Duration,
    /// How long a graceful shutdown waits for requests in flight before closing the
    /// connections still open.
    pub drain_timeout: Duration,
    /// Whether requests carry their peer's address (`ConnectInfo<SocketAddr>`), which the
    /// per-address rate limit keys by.
    pub connect_info: bool,
}

/// The most connections this process can hold: `wanted`, lowered to what the descriptor
/// limit leaves after [`DESCRIPTORS_RESERVED`], once the soft limit is raised to the hard
/// one (as Go's runtime does). Returns the cap and the limit it was fitted to.
pub fn fit_connections(wanted: usize) -> (usize, u64) {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|e| {
        warn!(error = %e, "could not read or raise the open-files limit");
        rlimit::getrlimit(rlimit::Resource::NOFILE)
            .map(|(soft, _)| soft)
            .unwrap_or(1024)
    });
    let room = limit.saturating_sub(DESCRIPTORS_RESERVED).max(1);
    let cap = usize::try_from(room).unwrap_or(usize::MAX).min(wanted);
    (cap, limit)
}

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Requests of this connection inside the router now (HTTP/1.1: 0 or 1).
    busy: AtomicUsize,
    /// Requests this connection has begun, ever: a stopping connection closes once one
    /// begins after the stop (answered first).
    begun: AtomicU64,
    /// Told to close at once: the loop needs its place for a newcomer.
    evict: Notify,
}

/// The open connections by age (ids only grow, so the first idle one is the oldest).
#[derive(Default)]
struct Registry {
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(self: &Arc<Self>) -> (u64, Arc<Conn>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            evict: Notify::new(),
        });
        self.lock().insert(id, conn.clone());
        (id, conn)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Tells the oldest connection outside a request to close, and forgets it (so two
    /// newcomers never pick the same one); false when every connection is in a request.
    fn evict_oldest_idle(&self) -> bool {
        let mut conns = self.lock();
        let idle = conns
            .iter()
            .find(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id);
        match idle.and_then(|id| conns.remove(&id)) {
            Some(conn) => {
                conn.evict.notify_one();
                true
            }
            None => false,
        }
    }
}

/// Removes its connection from the registry when the connection's task ends, however.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}

/// Counts a request as inside the router until dropped (its answer produced).
struct Busy(Arc<Conn>);

impl Busy {
    fn enter(conn: &Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::AcqRel);
        conn.begun.fetch_add(1, Ordering::AcqRel);
        Self(conn.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A listener on `addr` with a backlog of [`LISTEN_BACKLOG`] and, as `bind` sets it,
/// `SO_REUSEADDR` (a restarted server rebinds at once, its old connections in TIME_WAIT).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Where Linux keeps its cap on every listen backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// The backlog the kernel grants [`listen`]: [`LISTEN_BACKLOG`], or `net.core.somaxconn`
/// where that is lower. `None` where the cap cannot be read (not Linux).
pub fn granted_backlog() -> Option<u32> {
    std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|cap| granted(&cap))
}

/// [`LISTEN_BACKLOG`] capped by a `somaxconn` as the kernel prints it.
fn granted(somaxconn: &str) -> Option<u32> {
    let cap: u32 = somaxconn.trim().parse().ok()?;
    Some(cap.min(LISTEN_BACKLOG))
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting, lets
/// requests in flight finish (within `drain_timeout`) and closes every connection.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: HttpSettings,
    shutdown: impl Future<Output = ()>,
) {
    let registry = Arc::new(Registry::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let refusals = Arc::new(tokio::sync::Semaphore::new(REFUSALS_IN_FLIGHT_MAX));
    let mut tasks = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        .max_buf_size(HEADER_BYTES_MAX);
    let mut accept_errors = ErrorLog::default();
    let admission = Admission {
        registry,
        refusals,
        router,
        builder,
        settings,
        stop: stop_rx,
    };
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_errors.note(&e);
                    if !is_connection_error(&e) {
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            // Reaps finished connections' tasks, so the set holds only live ones.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        admission.admit(&mut tasks, stream, peer);
    }
    let _ = stop_tx.send(true);
    // Connections the kernel completed before the stop wait in the listen backlog, and
    // closing the listener would reset them: they are taken in and answered like the
    // connections already open (each then closes after its request).
    for _ in 0..BACKLOG_DRAIN_MAX {
        match tokio::time::timeout(BACKLOG_DRAIN_WAIT, listener.accept()).await {
            Ok(Ok((stream, peer))) => admission.admit(&mut tasks, stream, peer),
            Ok(Err(e)) if is_connection_error(&e) => {}
            _ => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(settings.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            connections = tasks.len(),
            "requests still in flight after the drain timeout; closing their connections"
        );
        tasks.shutdown().await;
    }
}

/// What a new connection is served with.
struct Admission {
    registry: Arc<Registry>,
    refusals: Arc<tokio::sync::Semaphore>,
    router: Router,
    builder: hyper::server::conn::http1::Builder,
    settings: HttpSettings,
    stop: watch::Receiver<bool>,
}

impl Admission {
    /// Serves `stream` on a task of `tasks`, or refuses it at the connection cap when no
    /// idle connection can make room.
    fn admit(&self, tasks: &mut JoinSet<()>, stream: TcpStream, peer: SocketAddr) {
        if self.registry.len() >= self.settings.connections_max
            && !self.registry.evict_oldest_idle()
        {
            refuse(stream, &self.refusals);
            return;
        }
        let _ = stream.set_nodelay(true);
        let (id, conn) = self.registry.open();
        let registered = Registered {
            registry: self.registry.clone(),
            id,
        };
        tasks.spawn(connection(
            stream,
            peer,
            conn,
            registered,
            self.router.clone(),
            self.builder.clone(),
            self.settings,
            self.stop.clone(),
        ));
    }
}

/// Serves one connection until the client closes it, a bound closes it, it is evicted,
/// or the server stops (then it finishes the request in flight, or one that begins
/// within [`STOP_IDLE_GRACE`], and closes).
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    conn: Arc<Conn>,
    _registered: Registered,
    router: Router,
    builder: hyper::server::conn::http1::Builder,
    settings: HttpSettings,
    mut stop: watch::Receiver<bool>,
) {
    let mut io = TimeoutStream::new(stream);
    io.set_write_timeout(Some(WRITE_STALL_MAX));
    let io = TokioIo::new(Box::pin(io));
    let in_request = conn.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let busy = Busy::enter(&in_request);
        if settings.connect_info {
            request.extensions_mut().insert(ConnectInfo(peer));
        }
        let answer = router.clone().call(request);
        async move {
            let response = answer.await;
            drop(busy);
            response
        }
    });
    let served = builder.serve_connection(io, service);
    let mut served = pin!(served);
    tokio::select! {
        _ = served.as_mut() => return,
        () = conn.evict.notified() => return,
        _ = stop.wait_for(|stop| *stop) => {}
    }
    // Stopping. Without a request in flight, wait (bounded) for one already on its way;
    // then close, after the answer to the request in flight if there is one (a stopping
    // connection answers without keep-alive).
    let begun = conn.begun.load(Ordering::Acquire);
    let grace = tokio::time::Instant::now() + STOP_IDLE_GRACE;
    while conn.busy.load(Ordering::Acquire) == 0
        && conn.begun.load(Ordering::Acquire) == begun
        && tokio::time::Instant::now() < grace
    {
        tokio::select! {
            _ = served.as_mut() => return,
            () = tokio::time::sleep(STOP_POLL) => {}
        }
    }
    served.as_mut().graceful_shutdown();
    let _ = served.await;
}

/// Answers a connection refused at the cap with 503 and closes it, without holding up
/// the accept loop; past [`REFUSALS_IN_FLIGHT_MAX`] such answers at once, closes it
/// unanswered.
fn refuse(mut stream: TcpStream, refusals: &Arc<tokio::sync::Semaphore>) {
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        // Read (and drop) what the client sends first, so that closing does not reset
        // the connection before it reads the answer.
        let mut head = [0u8; 1024];
        let _ = tokio::time::timeout(REFUSAL_READ_MAX, async {
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut head).await;
        })
        .await;
        let _ = tokio::time::timeout(REFUSAL_READ_MAX, async {
            let _ = stream.write_all(REFUSED).await;
            let _ = stream.shutdown().await;
        })
        .await;
        drop(permit);
    });
}

/// Errors of one incoming connection (it was reset before we took it): nothing to wait
/// for, the next one may be fine.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Logs accept failures at most once a second, with how many there were since.
#[derive(Default)]
struct ErrorLog {
    last: Option<Instant>,
    since: u64,
}

impl ErrorLog {
    fn note(&mut self, e: &io::Error) {
        self.since += 1;
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            warn!(error = %e, failures = self.since, "accepting a connection failed; going on");
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

/// Logs the listener's bounds once at startup.
pub fn announce(settings: &HttpSettings, descriptors: u64) {
    info!(
        connections_max = settings.connections_max,
        open_files_limit = descriptors,
        header_timeout = ?settings.header_timeout,
        "HTTP/1.1 listener bounds"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `n` connections, opened at once to `listener` that accepts none, the
    /// kernel completes within `wait`: the ones its accept queue holds.
    async fn completed(listener: &TcpListener, n: usize, wait: Duration) -> usize {
        let addr = listener.local_addr().expect("bound");
        let mut connects = JoinSet::new();
        for _ in 0..n {
            connects.spawn(async move {
                tokio::time::timeout(wait, TcpStream::connect(addr))
                    .await
                    .ok()
                    .and_then(Result::ok)
            });
        }
        // Each completed stream is held until all are counted, so none frees a slot.
        let mut open = Vec::with_capacity(n);
        while let Some(done) = connects.join_next().await {
            if let Some(stream) = done.expect("connect task") {
                open.push(stream);
            }
        }
        open.len()
    }

    // Checks the backlog the kernel grants: LISTEN_BACKLOG under a larger somaxconn, the
    // cap under a smaller one, nothing known from a value that is not a number.
    #[test]
    fn the_backlog_is_capped_by_somaxconn() {
        assert_eq!(granted("65535\n"), Some(LISTEN_BACKLOG));
        assert_eq!(granted("128\n"), Some(128));
        assert_eq!(granted("lots"), None);
    }

    // Checks that the server's listener queues a flash sale's burst of connections
    // instead of dropping them: 600 connections opened at once to a `listen` listener
    // that accepts none all complete (the kernel caps the backlog at
    // net.core.somaxconn, so the burst is no larger than that). The control, a listener
    // with the standard library's and tokio's backlog of 128, completes at most 129 of
    // the same burst, the rest timing out: the count can tell the two apart.
    #[tokio::test]
    async fn the_listener_queues_a_burst_of_connections() {
        let granted = granted_backlog().unwrap_or(LISTEN_BACKLOG);
        let burst = 600.min(usize::try_from(granted).unwrap_or(usize::MAX));
        let wait = Duration::from_millis(1500);
        let ours = listen(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
        assert_eq!(completed(&ours, burst, wait).await, burst);

        let small = TcpSocket::new_v4().expect("socket");
        small
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind");
        let small = small.listen(128).expect("listen");
        if burst > 129 {
            assert!(completed(&small, burst, wait).await <= 129);
        }
    }
}
