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
//! - a cap on open connections (`connections_max`) that no client can capture, and a
//!   share of it per client address (`connections_per_address_max`): see below.
//!
//! Request bodies are read before a request takes one of the API's in-flight slots, by
//! the API's own layer (`flashsale_api`), under the request deadline.
//!
//! # The cap, and why it cannot be captured
//!
//! Each open connection is in one of three phases: waiting for a request head (new, idle
//! between requests, or its head still arriving), waiting for its request's body, or
//! *worked on* (the body whole, or none, and the router answering). At the cap a newcomer
//! evicts a connection waiting for its client: among the [`EVICTION_SCAN`] oldest such
//! connections one waiting for a head (closing it loses no request), else the oldest
//! waiting for a body. Only connections being worked on are safe, and a newcomer is
//! refused (503) only when every open connection is being worked on.
//!
//! That is why no client can hold the cap. To keep a place out of eviction, a connection
//! must have its request worked on, and a request is worked on only once its whole body
//! has arrived; then it takes one of the API's in-flight slots (or is refused 503 at
//! once, or is a probe that answers at once) and ends by the request deadline. Holding
//! places thus costs the server's real work, bounded by the in-flight limit and the rate
//! limits, not a socket and a byte. Sockets that only wait (idle, a head a byte at a
//! time, a body that never comes) are evicted oldest first as newcomers arrive, so an
//! attacker from any number of addresses only pushes other waiting sockets out; to push
//! out a newcomer before its head and body arrive (a round trip or so), it would have to
//! open as many connections as the cap holds within that time, a flood for the
//! network's defences (SYN cookies, filtering upstream) rather than a lockout that a few
//! sockets keep. Eviction loses nothing of the evicted request: the API begins a request
//! only once its body is whole (`flashsale_api`'s body reader), and the phase changes
//! are one atomic step each way, so a request whose body completes is never evicted and
//! an evicted one never begins; its client's retry is as safe as its first try.
//!
//! One address cannot reach the cap at all: past its share a connection is refused (503)
//! as it arrives, so a lone attacker never makes the cap evict anyone, and the honest
//! slow uploads that eviction could cut are cut only by a distributed attack. The share
//! counts the connection's peer (an IPv6 peer's /64): the only address known at accept.
//! `FLASHSALE_CLIENT_IP_HEADER` arrives with a request head, after the connection has
//! taken its place, so it cannot decide admission; where it is set every peer is the
//! proxy in front, which a share per peer would throttle, so the share is off there
//! and the proxy limits its own clients' connections (and buffers their bodies).
//! A shorter body deadline near the cap was the other way: it still lets an attacker
//! keep the cap full, newcomers refused, for that deadline again and again, and it cuts
//! honest slow uploads as well.
//!
//! HTTP/1.1 only: HTTP/2 is for the proxy in front to terminate.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::response::IntoResponse;
use axum::{BoxError, Router};
use flashsale_app::limit::address_key;
use flashsale_app::Metrics;
use hyper::body::{Body as _, Bytes, Frame, Incoming, SizeHint};
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
/// leaves uninitialized. A browser sends about 20.
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
/// retransmission a second later (then 3 s, then 7 s). The standard library's and tokio's
/// `bind` ask for 128, which 256 connections opened at once overflowed on every run
/// (`TcpExtListenOverflows`). The kernel caps it at `net.core.somaxconn` (4096 by default
/// since Linux 5.4); each queued connection is a socket the kernel holds, the same as an
/// accepted one.
pub const LISTEN_BACKLOG: u32 = 4096;
/// Descriptors kept free of client connections: the stores' pools, the metrics listener,
/// logs and the refusals' sockets need some (`connections_max` is lowered to fit).
pub const DESCRIPTORS_RESERVED: u64 = 512;

/// At the cap, how many of the oldest connections waiting for their client a newcomer
/// looks at for one waiting for a request head (closing it loses no request) before it
/// takes the oldest of them waiting for a body instead. Bounded so that a newcomer's
/// search costs at most this many looks past the connections being worked on (which the
/// in-flight limit bounds), however large the cap and whatever the attack.
pub const EVICTION_SCAN: usize = 64;
/// Tries to evict one connection at the cap: a candidate may move on (its head or body
/// arriving) between the look and the eviction, and each failed try means a request
/// moved on, so a few tries find one unless nearly every connection is being worked on.
const EVICTION_TRIES: usize = 8;
/// The share of the cap one client address may hold by default: half (5,000 of the
/// default 10,000). Any share below the cap keeps one address from ever reaching it, and
/// so from making the cap evict anyone; half leaves the rest to everyone else while a
/// NAT with thousands of buyers behind it, or a load generator on one machine, still
/// gets in.
pub const ADDRESS_SHARE_DIVISOR: usize = 2;
/// How often, at most, the listener logs that a connection limit was met (the cap, or an
/// address's share), with the evictions and refusals since its last line: a flood meets
/// it thousands of times a second.
const LIMIT_LOG_EVERY: Duration = Duration::from_secs(10);
/// How often, at most, a failing `accept` is logged, with the failures since.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(1);

/// Why a connection was refused as it arrived, as `flashsale_http_connections_refused_total`
/// labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Every open connection is being worked on: none can be evicted.
    Cap,
    /// Its address holds its share of the cap.
    Address,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Self::Cap => "cap",
            Self::Address => "address",
        }
    }

    /// The answer, 503 `unavailable` in the API's JSON error shape.
    fn answer(self) -> &'static [u8] {
        static CAP: LazyLock<Box<[u8]>> =
            LazyLock::new(|| unavailable("too many connections; retry in a moment"));
        static ADDRESS: LazyLock<Box<[u8]>> = LazyLock::new(|| {
            unavailable("too many connections from your address; retry in a moment")
        });
        match self {
            Self::Cap => &CAP,
            Self::Address => &ADDRESS,
        }
    }
}

/// A whole 503 `unavailable` answer carrying `message`, closing its connection, its
/// `content-length` counted from the body it frames.
fn unavailable(message: &str) -> Box<[u8]> {
    let body = serde_json::json!({"error": "unavailable", "message": message}).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/json\r\n\
         retry-after: 1\r\n\
         connection: close\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into_boxed_slice()
}

/// The listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct HttpSettings {
    /// Most connections open at once.
    pub connections_max: usize,
    /// Most connections one client address (an IPv6 client's /64) holds at once, counted
    /// by the connection's peer (None: no share, behind a proxy).
    pub connections_per_address_max: Option<usize>,
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

/// An address's share of a cap of `connections_max` by default
/// ([`ADDRESS_SHARE_DIVISOR`]), at least one.
pub fn address_share(connections_max: usize) -> usize {
    connections_max.div_ceil(ADDRESS_SHARE_DIVISOR).max(1)
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

/// A connection waits for a request head: new, idle between requests, or its head still
/// arriving. Evictable.
const WAITING_HEAD: u8 = 0;
/// A request's head arrived and its body is not whole yet. Evictable: the API begins
/// nothing of a request before its body is whole.
const WAITING_BODY: u8 = 1;
/// A request's body is whole (or it has none) and the router is answering it: never
/// evicted.
const WORKING: u8 = 2;
/// Evicted at the cap: closing, and no request of it begins any more.
const EVICTED: u8 = 3;

/// One open connection, as the accept loop sees it.
struct Conn {
    /// Where its request is: `WAITING_HEAD`, `WAITING_BODY`, `WORKING` or `EVICTED`.
    /// Each change is one atomic step, so the cap and the request never both win.
    phase: AtomicU8,
    /// Requests this connection has begun, ever: a stopping connection closes once one
    /// begins after the stop (answered first).
    begun: AtomicU64,
    /// Told to close at once: the loop needs its place for a newcomer.
    evict: Notify,
    /// The address whose share it counts in (None: no shares kept).
    address: Option<IpAddr>,
}

impl Conn {
    /// A request's head arrived: it now waits for its body (`body` true) or is worked on.
    /// False once the connection was evicted: the request must not begin.
    fn begin(&self, body: bool) -> bool {
        let next = if body { WAITING_BODY } else { WORKING };
        let begun = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p != EVICTED).then_some(next)
            })
            .is_ok();
        self.begun.fetch_add(1, Ordering::AcqRel);
        begun
    }

    /// The request's body is whole: it is worked on from now. False once the connection
    /// was evicted: the request must not begin.
    fn body_whole(&self) -> bool {
        match self.phase.compare_exchange(
            WAITING_BODY,
            WORKING,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(now) => now != EVICTED,
        }
    }

    /// The request was answered: the connection waits for the next head.
    fn answered(&self) {
        let _ = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p != EVICTED).then_some(WAITING_HEAD)
            });
    }

    /// Whether a request of it has begun and is not answered yet.
    fn in_request(&self) -> bool {
        matches!(self.phase.load(Ordering::Acquire), WAITING_BODY | WORKING)
    }

    /// Evicts it if it is still waiting in `phase`, and tells its task to close.
    fn evict(&self, phase: u8) -> bool {
        let evicted = self
            .phase
            .compare_exchange(phase, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if evicted {
            self.evict.notify_one();
        }
        evicted
    }
}

/// The open connections by age (ids only grow, so the first ones are the oldest), and
/// how many each address holds.
#[derive(Default)]
struct Places {
    conns: BTreeMap<u64, Arc<Conn>>,
    per_address: HashMap<IpAddr, usize>,
    next_id: u64,
}

impl Places {
    /// Forgets connection `id` (and its count in its address's share), if still here.
    fn forget(&mut self, id: u64) {
        let Some(address) = self.conns.remove(&id).map(|c| c.address) else {
            return;
        };
        if let Some(address) = address {
            let counted = self.per_address.get_mut(&address);
            // Every connection kept with an address counts one in that address's share.
            debug_assert!(
                counted.is_some(),
                "connection {id} of {address} not counted"
            );
            if let Some(n) = counted {
                *n -= 1;
                if *n == 0 {
                    self.per_address.remove(&address);
                }
            }
        }
    }

    /// The connection to evict: among the [`EVICTION_SCAN`] oldest waiting for their
    /// client, the first waiting for a head, else the first waiting for a body; with
    /// the phase it was seen in.
    fn candidate(&self) -> Option<(u64, u8)> {
        let mut body = None;
        let waiting = self.conns.iter().filter_map(|(&id, c)| {
            let phase = c.phase.load(Ordering::Acquire);
            matches!(phase, WAITING_HEAD | WAITING_BODY).then_some((id, phase))
        });
        for (id, phase) in waiting.take(EVICTION_SCAN) {
            if phase == WAITING_HEAD {
                return Some((id, phase));
            }
            body.get_or_insert((id, phase));
        }
        body
    }

    /// Evicts one connection waiting for its client and forgets it (so two newcomers
    /// never pick the same one): what it was waiting for, `head` or `body`; None when
    /// every connection is being worked on.
    fn evict_one(&mut self) -> Option<&'static str> {
        for _ in 0..EVICTION_TRIES {
            let (id, phase) = self.candidate()?;
            if self.conns.get(&id).is_some_and(|c| c.evict(phase)) {
                self.forget(id);
                return Some(if phase == WAITING_HEAD {
                    "head"
                } else {
                    "body"
                });
            }
        }
        None
    }
}

/// A place given to a new connection.
struct Place {
    id: u64,
    conn: Arc<Conn>,
    /// What the connection evicted to make room was waiting for, if it evicted one.
    evicted: Option<&'static str>,
}

/// The open connections, the cap and the addresses' shares.
struct Registry {
    places: Mutex<Places>,
    connections_max: usize,
    per_address_max: Option<usize>,
    /// The API listener's metrics (None: another listener's, not counted).
    metrics: Option<Arc<Metrics>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection from `peer`: refused past its address's share, or at the
    /// cap when no connection can be evicted to make room.
    fn admit(&self, peer: IpAddr) -> Result<Place, Refusal> {
        let address = self.per_address_max.map(|_| address_key(peer));
        let mut places = self.lock();
        if let (Some(max), Some(address)) = (self.per_address_max, address) {
            if places.per_address.get(&address).is_some_and(|&n| n >= max) {
                return Err(Refusal::Address);
            }
        }
        let mut evicted = None;
        if places.conns.len() >= self.connections_max {
            evicted = Some(places.evict_one().ok_or(Refusal::Cap)?);
        }
        let id = places.next_id;
        places.next_id += 1;
        let conn = Arc::new(Conn {
            phase: AtomicU8::new(WAITING_HEAD),
            begun: AtomicU64::new(0),
            evict: Notify::new(),
            address,
        });
        places.conns.insert(id, conn.clone());
        if let Some(address) = address {
            *places.per_address.entry(address).or_default() += 1;
        }
        drop(places);
        if let Some(m) = &self.metrics {
            m.connection_open(true);
        }
        Ok(Place { id, conn, evicted })
    }
}

/// Removes its connection from the registry when the connection's task ends, however.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().forget(self.id);
        if let Some(m) = &self.registry.metrics {
            m.connection_open(false);
        }
    }
}

/// A request's body as the router reads it, telling its connection when it is whole:
/// from then on the request is worked on and its connection is never evicted. If the
/// connection was evicted first, the body ends in an error instead of its last bytes,
/// so the request never begins.
struct Tracked {
    body: Incoming,
    conn: Arc<Conn>,
}

/// The error a body ends in when its connection was evicted before it was whole.
#[derive(Debug)]
struct EvictedError;

impl std::fmt::Display for EvictedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection evicted at the connection cap before the body was whole")
    }
}

impl std::error::Error for EvictedError {}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        let whole = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.body.is_end_stream(),
            _ => false,
        };
        if whole && !this.conn.body_whole() {
            return Poll::Ready(Some(Err(EvictedError.into())));
        }
        polled.map(|frame| frame.map(|f| f.map_err(BoxError::from)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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
    serve_counted(listener, router, settings, None, shutdown).await;
}

/// [`serve`], counting its connections in `metrics` (the API listener's: open, the cap,
/// refused and evicted).
pub async fn serve_counted(
    listener: TcpListener,
    router: Router,
    settings: HttpSettings,
    metrics: Option<Arc<Metrics>>,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut accept_errors = Throttled::new(ACCEPT_LOG_EVERY);
    let mut admission = Admission::new(router, settings, metrics, stop_rx);
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    if let Some(failures) = accept_errors.note() {
                        warn!(error = %e, failures, "accepting a connection failed; going on");
                    }
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
    limits_met: LimitLog,
}

impl Admission {
    fn new(
        router: Router,
        settings: HttpSettings,
        metrics: Option<Arc<Metrics>>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        if let Some(m) = &metrics {
            m.connections_capped(settings.connections_max);
        }
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_timeout)
            .max_buf_size(HEADER_BYTES_MAX);
        Self {
            registry: Arc::new(Registry {
                places: Mutex::default(),
                connections_max: settings.connections_max,
                per_address_max: settings.connections_per_address_max,
                metrics,
            }),
            refusals: Arc::new(tokio::sync::Semaphore::new(REFUSALS_IN_FLIGHT_MAX)),
            router,
            builder,
            settings,
            stop,
            limits_met: LimitLog::new(settings.connections_max),
        }
    }

    /// Serves `stream` on a task of `tasks`, or refuses it: past its address's share, or
    /// at the cap when no connection waiting for its client can make room.
    fn admit(&mut self, tasks: &mut JoinSet<()>, stream: TcpStream, peer: SocketAddr) {
        let metrics = self.registry.metrics.as_deref();
        let place = match self.registry.admit(peer.ip()) {
            Ok(place) => place,
            Err(refusal) => {
                if let Some(m) = metrics {
                    m.connection_refused(refusal.reason());
                }
                self.limits_met.refused(refusal, peer.ip());
                refuse(stream, &self.refusals, refusal.answer());
                return;
            }
        };
        if let Some(reason) = place.evicted {
            if let Some(m) = metrics {
                m.connection_evicted(reason);
            }
            self.limits_met.evicted(reason);
        }
        let _ = stream.set_nodelay(true);
        let registered = Registered {
            registry: self.registry.clone(),
            id: place.id,
        };
        tasks.spawn(connection(
            stream,
            peer,
            place.conn,
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
    // A chunked body past the API's bound is told to its body reader when announced.
    let (io, chunks) = flashsale_api::chunks::watch(Box::pin(io));
    let io = TokioIo::new(io);
    let in_request = conn.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let conn = in_request.clone();
        let alarm = chunks.next_request();
        let answer = conn.begin(!request.body().is_end_stream()).then(|| {
            let mut request = request.map(|body| Tracked {
                body,
                conn: conn.clone(),
            });
            if settings.connect_info {
                request.extensions_mut().insert(ConnectInfo(peer));
            }
            request.extensions_mut().insert(alarm);
            router.clone().call(request)
        });
        async move {
            // Evicted before its head arrived: the connection is closing unanswered.
            let Some(answer) = answer else {
                return Ok(hyper::StatusCode::SERVICE_UNAVAILABLE.into_response());
            };
            let response = answer.await;
            conn.answered();
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
    while !conn.in_request()
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

/// Answers a connection refused as it arrived with `answer` and closes it, without
/// holding up the accept loop; past [`REFUSALS_IN_FLIGHT_MAX`] such answers at once,
/// closes it unanswered.
fn refuse(mut stream: TcpStream, refusals: &Arc<tokio::sync::Semaphore>, answer: &'static [u8]) {
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
            let _ = stream.write_all(answer).await;
            let _ = stream.shutdown().await;
            // Then what it still sends (a body after its head) until it closes: closing
            // with bytes unread would reset the connection, and the client could lose the
            // answer it has not read yet.
            while matches!(tokio::io::AsyncReadExt::read(&mut stream, &mut head).await, Ok(n) if n > 0) {}
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

/// Events counted between log lines at most one `every` apart.
struct Throttled {
    every: Duration,
    last: Option<Instant>,
    since: u64,
}

impl Throttled {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            since: 0,
        }
    }

    /// Counts one event; when a line is due, the events since the last one.
    fn note(&mut self) -> Option<u64> {
        self.since += 1;
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(std::mem::take(&mut self.since))
    }
}

/// The log of the connection limits met (the cap: evictions and refusals; an address's
/// share: refusals), a line at most every [`LIMIT_LOG_EVERY`] with what happened since.
struct LimitLog {
    connections_max: usize,
    line: Throttled,
    evicted_head: u64,
    evicted_body: u64,
    refused_at_cap: u64,
    refused_by_address: u64,
}

impl LimitLog {
    fn new(connections_max: usize) -> Self {
        Self {
            connections_max,
            line: Throttled::new(LIMIT_LOG_EVERY),
            evicted_head: 0,
            evicted_body: 0,
            refused_at_cap: 0,
            refused_by_address: 0,
        }
    }

    fn evicted(&mut self, reason: &'static str) {
        match reason {
            "head" => self.evicted_head += 1,
            _ => self.evicted_body += 1,
        }
        self.log(None);
    }

    fn refused(&mut self, refusal: Refusal, peer: IpAddr) {
        match refusal {
            Refusal::Cap => self.refused_at_cap += 1,
            Refusal::Address => self.refused_by_address += 1,
        }
        self.log(Some(peer));
    }

    fn log(&mut self, peer: Option<IpAddr>) {
        if self.line.note().is_none() {
            return;
        }
        warn!(
            connections_max = self.connections_max,
            evicted_waiting_for_head = std::mem::take(&mut self.evicted_head),
            evicted_waiting_for_body = std::mem::take(&mut self.evicted_body),
            refused_at_cap = std::mem::take(&mut self.refused_at_cap),
            refused_past_address_share = std::mem::take(&mut self.refused_by_address),
            last_refused = ?peer,
            "connection cap or an address's share met: connections waiting for their \
             client evicted, newcomers refused (counts since the last such line)"
        );
    }
}

/// Logs the listener's bounds once at startup.
pub fn announce(settings: &HttpSettings, descriptors: u64) {
    info!(
        connections_max = settings.connections_max,
        connections_per_address_max = ?settings.connections_per_address_max,
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

    // Checks that each refusal's answer is framed by its own length (the cap's once
    // declared 76 bytes and sent 75): its Content-Length equals its body's bytes, the
    // body is the API's JSON error `unavailable`, and it carries Retry-After.
    #[test]
    fn refusals_declare_their_own_length() {
        for refusal in [Refusal::Cap, Refusal::Address] {
            let text = std::str::from_utf8(refusal.answer()).expect("ASCII");
            let (head, body) = text.split_once("\r\n\r\n").expect("head, then body");
            let declared: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .expect("a content-length")
                .parse()
                .expect("a number");
            assert_eq!(declared, body.len(), "{text}");
            let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
            assert_eq!(json["error"], "unavailable", "{text}");
            assert!(head.contains("\r\nretry-after: 1\r\n"), "{text}");
        }
    }

    fn registry(connections_max: usize, per_address_max: Option<usize>) -> Registry {
        Registry {
            places: Mutex::default(),
            connections_max,
            per_address_max,
            metrics: None,
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    // Checks whom a newcomer evicts at the cap, and when it is refused: a connection
    // waiting for a head first (though younger), then the oldest waiting for its body,
    // never one being worked on; with every place worked on the newcomer is refused;
    // an answered request's connection waits for a head again and can go. An evicted
    // connection's request never begins: neither a head arriving nor a body completing
    // moves it on. How: the registry driven through the phases by hand (cap 3).
    #[test]
    fn the_cap_evicts_only_connections_waiting_for_their_client() {
        let places = registry(3, None);
        let admit = |n: &str| places.admit(ip(n)).expect("admitted");
        let working = admit("10.0.0.1");
        assert!(working.conn.begin(false));
        let body = admit("10.0.0.2");
        assert!(body.conn.begin(true));
        let head = admit("10.0.0.3");
        let fourth = admit("10.0.0.4");
        assert_eq!(fourth.evicted, Some("head"));
        assert!(
            !head.conn.begin(false),
            "an evicted connection begins nothing"
        );
        assert!(fourth.conn.begin(false));
        let fifth = admit("10.0.0.5");
        assert_eq!(fifth.evicted, Some("body"));
        assert!(
            !body.conn.body_whole(),
            "its body completing begins nothing"
        );
        assert!(fifth.conn.begin(false));
        assert!(matches!(places.admit(ip("10.0.0.6")), Err(Refusal::Cap)));
        working.conn.answered();
        assert_eq!(admit("10.0.0.6").evicted, Some("head"));
        assert_eq!(working.conn.phase.load(Ordering::Acquire), EVICTED);
    }

    // Checks the share per address: an address past it is refused while the cap has
    // room, an IPv6 client's /64 counts as one address (an IPv4-mapped one as its IPv4
    // address), and a connection that closes gives its place back. How: a registry with
    // a cap of 10 and a share of 2.
    #[test]
    fn an_address_holds_at_most_its_share() {
        let places = registry(10, Some(2));
        for (first, second, third) in [
            ("192.0.2.1", "192.0.2.1", "::ffff:192.0.2.1"),
            ("2001:db8::1", "2001:db8::2", "2001:db8::ffff"),
        ] {
            let kept = places.admit(ip(first)).expect("first");
            places.admit(ip(second)).expect("second");
            assert!(matches!(places.admit(ip(third)), Err(Refusal::Address)));
            places.lock().forget(kept.id);
            places.admit(ip(third)).expect("a place given back");
        }
        places.admit(ip("2001:db8:0:1::1")).expect("another /64");
        assert_eq!(address_share(10_000), 5_000);
        assert_eq!(address_share(1), 1);
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
