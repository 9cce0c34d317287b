//! A chunked body refused the moment it announces more than the body bound.
//!
//! A body with a `Content-Length` over the bound is refused before a byte of it is read
//! (`body::read_whole`, by its size hint). A chunked body announces its size a chunk at a
//! time, and hyper hands the body reader a chunk's bytes as they arrive, never the size
//! its line announced: a client that sent `4001` (16,385 bytes) and then one byte held its
//! connection until the request deadline and got 408, where the same body with a length
//! gets 413 at once.
//!
//! [`watch`] wraps a connection's stream and reads the request framing along with hyper
//! (request heads, `Content-Length` bodies skipped, chunk-size lines added up). When a
//! chunked body's announced chunks pass [`BODY_BYTES_MAX`] it marks that request (the
//! n-th of the connection), and the body reader, holding that request's [`ChunkAlarm`]
//! (the connection's service gives each request the next one), answers 413 at once.
//!
//! It only ever hastens a refusal that the body reader would make anyway once the bytes
//! arrived: a request is marked only when the chunk sizes it announced add up past the
//! bound. Framing it cannot follow (a head over [`HEAD_BYTES_MAX`], an upgrade, bytes that
//! are not HTTP/1.1) turns it off for the rest of the connection, and hyper, which
//! refuses such framing itself, stays the judge.

use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Largest request body accepted: every valid body is a few hundred bytes.
pub const BODY_BYTES_MAX: usize = 16 * 1024;
/// Longest request head followed: the listener's own cap on a head (hyper answers 431
/// past it, and closes the connection).
const HEAD_BYTES_MAX: usize = 16 * 1024;
/// Longest chunk-size line followed (hex digits, then extensions): hyper refuses a size
/// of more than 16 hex digits, and extensions are not worth following further.
const SIZE_LINE_BYTES_MAX: usize = 1024;

/// What one connection's watch shares with its requests' alarms.
#[derive(Default)]
struct Shared {
    /// 1 + the index of the first request whose chunks passed the bound; 0: none.
    oversized: AtomicU64,
    /// Told when `oversized` is set.
    raised: Notify,
    /// The index the next request handed to the service gets.
    next_request: AtomicU64,
}

/// A connection's side of the watch: hands each request, in order, its alarm.
pub struct ChunkWatch(Arc<Shared>);

impl ChunkWatch {
    /// The alarm of the connection's next request. Call once per request, in the order
    /// the connection's requests come (as hyper hands them to the service).
    pub fn next_request(&self) -> ChunkAlarm {
        ChunkAlarm {
            shared: self.0.clone(),
            request: self.0.next_request.fetch_add(1, Ordering::Relaxed),
        }
    }
}

/// One request's alarm: raised when its chunked body announced more than the bound.
#[derive(Clone)]
pub struct ChunkAlarm {
    shared: Arc<Shared>,
    request: u64,
}

impl ChunkAlarm {
    fn raised(&self) -> bool {
        self.shared.oversized.load(Ordering::Acquire) == self.request + 1
    }

    /// Returns once the alarm is raised (never, for a request within the bound).
    pub(crate) async fn wait(&self) {
        loop {
            let mut notified = pin!(self.shared.raised.notified());
            notified.as_mut().enable();
            if self.raised() {
                return;
            }
            notified.await;
        }
    }
}

/// Wraps `stream` (a connection's, before hyper reads it) to watch its request framing.
pub fn watch<S>(stream: S) -> (Watched<S>, ChunkWatch) {
    let shared = Arc::new(Shared::default());
    let watched = Watched {
        inner: stream,
        framing: Framing::default(),
        shared: shared.clone(),
    };
    (watched, ChunkWatch(shared))
}

/// A stream whose inbound bytes are followed as HTTP/1.1 requests; reads and writes pass
/// through unchanged.
pub struct Watched<S> {
    inner: S,
    framing: Framing,
    shared: Arc<Shared>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let this = &mut *self;
            if let Some(request) = this.framing.feed(&buf.filled()[before..]) {
                // The first one only: the connection closes after that request's 413.
                let marked = this.shared.oversized.compare_exchange(
                    0,
                    request + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if marked.is_ok() {
                    this.shared.raised.notify_waiters();
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where the inbound bytes are in the request framing.
#[derive(Debug, Default, PartialEq, Eq)]
enum State {
    /// A request head: its current line's bytes so far.
    #[default]
    Head,
    /// A `Content-Length` body: bytes left to pass over.
    Length(u64),
    /// A chunk-size line: the size read so far, and whether its digits have ended
    /// (extensions or spaces follow).
    Size {
        size: u64,
        ended: bool,
    },
    /// A chunk's data: bytes left, then its CRLF.
    Data(u64),
    DataEnd,
    /// The trailers after the last chunk, up to an empty line.
    Trailers,
    /// Framing that is not followed: the rest of the connection is hyper's alone.
    Off,
}

/// The request framing of one connection's inbound bytes, followed byte by byte.
#[derive(Debug, Default)]
struct Framing {
    state: State,
    /// The current line (a head's or a trailer's), without its line ending.
    line: Vec<u8>,
    /// The current head's bytes so far, and whether its request line came.
    head_bytes: usize,
    started: bool,
    /// The current head's body framing, as its headers say.
    chunked: bool,
    length: Option<u64>,
    /// The chunked body's sizes announced so far.
    announced: u64,
    /// Requests whose head ended: the current one's index is `heads - 1`.
    heads: u64,
}

impl Framing {
    /// Follows `bytes`; returns the index of a request whose chunks just passed the
    /// bound, if one did.
    fn feed(&mut self, bytes: &[u8]) -> Option<u64> {
        let mut i = 0;
        let mut oversized = None;
        while i < bytes.len() {
            match self.state {
                State::Off => return oversized,
                // Bytes passed over whole: a length body's, a chunk's data.
                State::Length(left) | State::Data(left) => {
                    let take = left.min((bytes.len() - i) as u64);
                    i += take as usize;
                    let length = matches!(self.state, State::Length(_));
                    self.state = match (length, left - take) {
                        (true, 0) => State::Head,
                        (true, rest) => State::Length(rest),
                        (false, 0) => State::DataEnd,
                        (false, rest) => State::Data(rest),
                    };
                }
                _ => {
                    if self.byte(bytes[i]) {
                        oversized = Some(self.heads - 1);
                    }
                    i += 1;
                }
            }
        }
        oversized
    }

    /// Follows one byte of a line-based state; true when it ended a chunk-size line that
    /// took the body past the bound.
    fn byte(&mut self, b: u8) -> bool {
        match self.state {
            State::Head => {
                self.head_bytes += 1;
                if self.head_bytes > HEAD_BYTES_MAX {
                    self.state = State::Off;
                } else if b == b'\n' {
                    self.head_line();
                } else if b != b'\r' {
                    self.line.push(b);
                }
                false
            }
            State::Size { size, ended } => self.size_byte(b, size, ended),
            State::DataEnd => {
                // The CRLF after a chunk's data (hyper refuses anything else there).
                if b == b'\n' {
                    self.state = State::Size {
                        size: 0,
                        ended: false,
                    };
                }
                false
            }
            State::Trailers => {
                if b == b'\n' {
                    if self.line.is_empty() {
                        self.state = State::Head;
                    }
                    self.line.clear();
                } else if b != b'\r' {
                    self.line.push(b);
                }
                false
            }
            State::Length(_) | State::Data(_) | State::Off => false,
        }
    }

    /// A chunk-size line's byte: hex digits, then extensions or spaces, then LF.
    fn size_byte(&mut self, b: u8, size: u64, ended: bool) -> bool {
        let digit = (b as char).to_digit(16).filter(|_| !ended);
        self.line.push(b);
        if self.line.len() > SIZE_LINE_BYTES_MAX {
            self.state = State::Off;
            return false;
        }
        match (digit, b) {
            (Some(d), _) => match size.checked_mul(16) {
                Some(s) => {
                    self.state = State::Size {
                        size: s + u64::from(d),
                        ended,
                    };
                    false
                }
                // More than hyper takes: it refuses the body itself.
                None => {
                    self.state = State::Off;
                    false
                }
            },
            (None, b'\n') => {
                self.line.clear();
                self.announced = self.announced.saturating_add(size);
                self.state = match size {
                    0 => State::Trailers,
                    n => State::Data(n),
                };
                self.announced > BODY_BYTES_MAX as u64
            }
            _ => {
                self.state = State::Size { size, ended: true };
                false
            }
        }
    }

    /// A head's line ended (in `self.line`): the request line, a header, or the empty
    /// line that ends the head and starts its body.
    fn head_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            // Empty lines before a request line are passed over, as hyper does.
            if self.started {
                self.head_ended();
            }
            return;
        }
        if !self.started {
            self.started = true;
            return;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The last coding decides: hyper reads the body as chunked only then.
            let last = value.rsplit(|&b| b == b',').next().map(trim);
            self.chunked = last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"content-length") {
            self.length = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            self.state = State::Off;
        }
    }

    /// The head is whole: the body that follows, as its headers framed it.
    fn head_ended(&mut self) {
        self.heads += 1;
        self.announced = 0;
        self.state = match (self.chunked, self.length) {
            (true, _) => State::Size {
                size: 0,
                ended: false,
            },
            (false, Some(n)) if n > 0 => State::Length(n),
            _ => State::Head,
        };
        self.started = false;
        self.head_bytes = 0;
        self.chunked = false;
        self.length = None;
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(framing: &str) -> String {
        format!("POST /v1/purchases HTTP/1.1\r\nHost: x\r\n{framing}\r\n")
    }

    // Checks which requests are marked, fed whole and a byte at a time: a chunk announced
    // past the bound, and small chunks adding up past it, mark their request as soon as
    // the size line ends (no data needed); bodies within the bound, framed by length or
    // in chunks with extensions and trailers, and a length body holding text that looks
    // like a chunk line, mark none; the second request of a connection is told apart
    // from the first; an upgrade turns the watch off.
    #[test]
    fn a_chunked_body_past_the_bound_is_marked_when_announced() {
        let chunked = head("Transfer-Encoding: chunked\r\n");
        let cases: Vec<(String, Option<u64>)> = vec![
            (format!("{chunked}4001\r\nx"), Some(0)),
            (format!("{chunked}4000\r\n"), None),
            (
                format!("{chunked}2000\r\n{}\r\n2001\r\n", "a".repeat(0x2000)),
                Some(0),
            ),
            (
                format!("{chunked}5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n"),
                None,
            ),
            (format!("{}4001\r\n", head("Content-Length: 6\r\n")), None),
            (
                format!(
                    "{}{{}}\r\n{chunked}FFFFFF\r\n",
                    head("Content-Length: 4\r\n")
                ),
                Some(1),
            ),
            (
                format!("{chunked}3\r\nabc\r\n0\r\n\r\n{chunked}10000\r\n"),
                Some(1),
            ),
            (
                format!(
                    "{}4001\r\n",
                    head("Upgrade: websocket\r\nTransfer-Encoding: chunked\r\n")
                ),
                None,
            ),
            (
                format!("{}4001\r\n", head("Transfer-Encoding: gzip, chunked\r\n")),
                Some(0),
            ),
        ];
        for (input, want) in cases {
            let mut whole = Framing::default();
            assert_eq!(whole.feed(input.as_bytes()), want, "{input:?}");
            let mut bytewise = Framing::default();
            let got = input
                .as_bytes()
                .iter()
                .find_map(|b| bytewise.feed(std::slice::from_ref(b)));
            assert_eq!(got, want, "byte by byte: {input:?}");
        }
    }

    // Checks the watch on a stream read as hyper reads it: two requests on one
    // connection, the second's chunk announced past the bound; only the second request's
    // alarm is raised, and its waiter, already waiting, is woken; the bytes pass through
    // unchanged.
    #[test]
    fn only_the_marked_request_is_woken() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let chunked = head("Transfer-Encoding: chunked\r\n");
        let request = format!("{chunked}3\r\nabc\r\n0\r\n\r\n{chunked}4001\r\n");
        rt.block_on(async {
            let (mut client, server) = tokio::io::duplex(64 * 1024);
            let (mut watched, watch) = watch(server);
            let (first, second) = (watch.next_request(), watch.next_request());
            let waiting = tokio::spawn({
                let second = second.clone();
                async move { second.wait().await }
            });
            tokio::task::yield_now().await;
            client.write_all(request.as_bytes()).await.expect("send");
            drop(client);
            let mut read = Vec::new();
            watched.read_to_end(&mut read).await.expect("read");
            assert_eq!(read, request.as_bytes());
            tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
                .await
                .expect("woken")
                .expect("joined");
            assert!(second.raised() && !first.raised());
        });
    }
}
