//! Request bodies read in full, by size and by time, *before* a request takes one of the
//! in-flight slots (which `routes::deadline` takes only for the use case).
//!
//! A client that sends its headers and then its body a byte at a time (or never) would
//! otherwise hold an in-flight slot while the handler waits for the body: 100 such
//! sockets locked a server with `FLASHSALE_IN_FLIGHT_MAX=100` out for everyone. Read
//! first, a stalled body holds only its own connection (the listener bounds how many
//! there are), for at most the request deadline, and the slots go to requests ready to be
//! worked on.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use flashsale_app::Outcome;
use http_body_util::BodyExt;

use crate::chunks::ChunkAlarm;
use crate::error::ApiError;

/// What reading a body ended with, when it did not end with the body.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyFailure {
    /// Longer than the limit (or announced so by its `Content-Length`).
    TooLarge,
    /// Not complete within the request deadline.
    TimedOut,
    /// The framing was broken (malformed chunked encoding) or the connection was cut.
    Unreadable,
}

impl BodyFailure {
    /// The answer: 413, 408 (and the connection closed: what is left of the body is not
    /// worth waiting for), or 400.
    pub(crate) fn error(&self, limit: usize) -> ApiError {
        match self {
            Self::TooLarge => ApiError::new(
                Outcome::PayloadTooLarge,
                format!("request body larger than {limit} bytes"),
            ),
            Self::TimedOut => ApiError::new(
                Outcome::RequestTimeout,
                "the request body did not arrive within the request deadline",
            )
            .closing(),
            Self::Unreadable => ApiError::invalid(
                "request body unreadable: malformed chunked encoding, or cut short",
            ),
        }
    }
}

/// Reads `body` whole: at most `limit` bytes, within `deadline` from the first time it
/// has to wait (a body that came with its headers, nearly every one, arms no timer).
///
/// Frame by frame, keeping a body of one data frame (nearly every one) as that frame's
/// bytes, uncopied. `http_body_util`'s `Limited` and `collect`, which this replaces, boxed
/// the limit's error and queued every frame, about 500 instructions of a purchase's body.
/// Trailers are dropped, as `to_bytes` dropped them.
///
/// `alarm`, the request's [`ChunkAlarm`] where the connection watches its framing: raised
/// when the chunked body announced more than the limit, which is then refused at once,
/// not waited out for bytes a client may never send.
pub(crate) async fn read_whole(
    body: Body,
    limit: usize,
    deadline: Duration,
    alarm: Option<&ChunkAlarm>,
) -> Result<Bytes, BodyFailure> {
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyFailure::TooLarge);
    }
    let whole = lazy_timeout(deadline, collect(body, limit));
    let read = match alarm {
        None => whole.await,
        Some(alarm) => tokio::select! {
            biased;
            read = whole => read,
            () = alarm.wait() => return Err(BodyFailure::TooLarge),
        },
    };
    read.unwrap_or(Err(BodyFailure::TimedOut))
}

/// The data frames of `body` joined, failing past `limit` bytes.
async fn collect(mut body: Body, limit: usize) -> Result<Bytes, BodyFailure> {
    let mut whole: Option<Bytes> = None;
    let mut joined: Option<Vec<u8>> = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| BodyFailure::Unreadable)?.into_data() else {
            continue;
        };
        let len =
            whole.as_ref().map_or(0, Bytes::len) + joined.as_ref().map_or(0, Vec::len) + data.len();
        if len > limit {
            return Err(BodyFailure::TooLarge);
        }
        match (whole.take(), joined.as_mut()) {
            (None, None) => whole = Some(data),
            (Some(first), _) => {
                let mut both = Vec::with_capacity(len);
                both.extend_from_slice(&first);
                both.extend_from_slice(&data);
                joined = Some(both);
            }
            (None, Some(more)) => more.extend_from_slice(&data),
        }
    }
    Ok(joined.map_or_else(|| whole.unwrap_or_default(), Bytes::from))
}

/// `work`'s output, or None when it has not finished `limit` after it first had to wait
/// (a timer is armed only then: work done at its first poll reads no clock).
pub(crate) async fn lazy_timeout<T>(limit: Duration, work: impl Future<Output = T>) -> Option<T> {
    let mut work = pin!(work);
    let mut timer = pin!(None::<tokio::time::Sleep>);
    poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if timer.is_none() {
            timer.set(Some(tokio::time::sleep(limit)));
        }
        match timer.as_mut().as_pin_mut().map(|t| t.poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(None),
            _ => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    // Checks each way a body read ends: whole (returned; several chunks joined in order,
    // exactly the limit included, an empty body empty), over the limit (TooLarge, also
    // when only announced by its size), stalled past the deadline (TimedOut), and broken
    // framing (Unreadable).
    #[test]
    fn a_body_is_read_whole_or_refused_by_kind() {
        let rt = runtime();
        // A read of at most 16 bytes within a second; `late` has a shorter deadline.
        let read = |body: Body| rt.block_on(read_whole(body, 16, Duration::from_secs(1), None));
        let got = read(Body::from("{\"a\":1}"));
        assert_eq!(got, Ok(Bytes::from_static(b"{\"a\":1}")));

        let big = read(Body::from(vec![b'x'; 17]));
        assert_eq!(big, Err(BodyFailure::TooLarge));

        // Chunks whose sum passes the limit, with no size announced.
        let ten = || Ok(Bytes::from_static(b"0123456789"));
        let streamed = read(futures_stream(vec![ten(), ten()]));
        assert_eq!(streamed, Err(BodyFailure::TooLarge));

        // Chunks within the limit are joined in order; exactly the limit still fits.
        let parts = |p: &[&'static [u8]]| {
            futures_stream(p.iter().map(|b| Ok(Bytes::from_static(b))).collect())
        };
        let joined = read(parts(&[b"01", b"", b"2345", b"6"]));
        assert_eq!(joined, Ok(Bytes::from_static(b"0123456")));
        let full = read(parts(&[b"0123456789", b"abcdef"]));
        assert_eq!(full, Ok(Bytes::from_static(b"0123456789abcdef")));
        let empty = read(Body::empty());
        assert_eq!(empty, Ok(Bytes::new()));

        let late = rt.block_on(read_whole(
            stalled_body(),
            16,
            Duration::from_millis(30),
            None,
        ));
        assert_eq!(late, Err(BodyFailure::TimedOut));

        let broken = futures_stream(vec![
            Ok(Bytes::from_static(b"01")),
            Err(std::io::Error::other("bad chunk size")),
        ]);
        let unreadable = read(broken);
        assert_eq!(unreadable, Err(BodyFailure::Unreadable));
    }

    // Checks that a body which was all there at the first poll arms no timer: the
    // runtime below has no time driver, so arming one would panic.
    #[test]
    fn a_body_that_is_there_arms_no_timer() {
        let no_timers = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let got = no_timers.block_on(read_whole(
            Body::from("x"),
            16,
            Duration::from_millis(1),
            None,
        ));
        assert_eq!(got, Ok(Bytes::from_static(b"x")));
    }

    fn futures_stream(items: Vec<Result<Bytes, std::io::Error>>) -> Body {
        Body::from_stream(futures::stream::iter(items))
    }

    /// A body whose first chunk never comes.
    fn stalled_body() -> Body {
        Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
    }
}
