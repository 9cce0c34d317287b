//! The load's HTTP/1.1 client: hyper's connection API with nothing on top — keep-alive
//! connections in a bounded pool of idle ones, each request's connection driven by the
//! task that sends it (no connection task to hand the request to and back), the target's
//! address and paths parsed once.
//!
//! Why not reqwest: on this 2-core box the generator shares the CPU with the server, Redis
//! and MariaDB, and reqwest spent about 65,000 instructions on each `GET /healthz` — its
//! URL parsed for every request (twice: again by the redirect policy), the pool, the
//! redirect and retry layers — three times what the server spends answering it. Every
//! strategy, the ceilings included, is driven by this same client.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::Mutex;
use std::task::Poll;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::http::uri::Authority;
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Largest answer body read: every flashsale answer is well under a kilobyte; a larger
/// one is not an answer of ours and counts as none.
const ANSWER_BYTES_MAX: usize = 64 * 1024;

type Conn = (
    SendRequest<Full<Bytes>>,
    Connection<TokioIo<TcpStream>, Full<Bytes>>,
);

/// An HTTP/1.1 client of one `http://host:port` server.
pub struct Client {
    /// `host:port`, resolved at each connect.
    authority: String,
    host: HeaderValue,
    /// The pool: at most `idle_max` connections waiting for their next request.
    idle: Mutex<Vec<Conn>>,
    idle_max: usize,
    connect_timeout: Duration,
    exchange_timeout: Duration,
}

/// What one exchange brought back.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Bytes,
}

/// Why an exchange brought back no answer (the load counts any of them as no answer;
/// the details are for a reader of `Debug`).
#[derive(Debug)]
pub enum Failure {
    Connect(String),
    Timeout,
    /// The connection closed or failed before the whole answer arrived.
    Transport(String),
    /// The answer's body exceeded `ANSWER_BYTES_MAX`.
    TooLarge,
}

impl Client {
    /// A client of `base_url` (`http://host:port`, no path), keeping at most `idle_max`
    /// idle connections (the load's concurrency: every connection in use goes back).
    pub fn new(
        base_url: &str,
        idle_max: usize,
        connect_timeout: Duration,
        exchange_timeout: Duration,
    ) -> Result<Self, String> {
        let authority = root_authority(base_url)?;
        let port = authority.port_u16().unwrap_or(80);
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|e| format!("base URL {base_url:?}: {e}"))?;
        Ok(Client {
            authority: format!("{}:{port}", authority.host()),
            host,
            idle: Mutex::new(Vec::new()),
            idle_max,
            connect_timeout,
            exchange_timeout,
        })
    }

    /// Sends one request (`body`, if any, as JSON; `authorization`, if any, as the
    /// buyer's credentials) and reads the whole answer, on an idle connection or a new
    /// one. A connection that failed, timed out or was told to close is dropped, never
    /// reused.
    pub async fn send(
        &self,
        method: Method,
        path: &Uri,
        body: Option<Bytes>,
        authorization: Option<&HeaderValue>,
    ) -> Result<Answer, Failure> {
        let mut conn = match self.take_idle() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        let json = body.is_some();
        let mut request = Request::new(Full::new(body.unwrap_or_default()));
        *request.method_mut() = method;
        *request.uri_mut() = path.clone();
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        if json {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(value) = authorization {
            headers.insert(AUTHORIZATION, value.clone());
        }
        let answer = tokio::time::timeout(self.exchange_timeout, exchange(&mut conn, request))
            .await
            .map_err(|_| Failure::Timeout)??;
        if conn.0.is_ready() {
            self.put_idle(conn);
        }
        Ok(answer)
    }

    fn take_idle(&self) -> Option<Conn> {
        // A task that panicked holding the lock left a valid list.
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded by the pool's size: connections the server closed meanwhile are dropped.
        while let Some(conn) = idle.pop() {
            if !conn.0.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    fn put_idle(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < self.idle_max {
            idle.push(conn);
        }
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        let stream =
            tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.authority))
                .await
                .map_err(|_| Failure::Connect(format!("{}: timed out", self.authority)))?
                .map_err(|e| Failure::Connect(format!("{}: {e}", self.authority)))?;
        // Small requests answered at once: Nagle would hold each one back.
        stream
            .set_nodelay(true)
            .map_err(|e| Failure::Connect(e.to_string()))?;
        http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::Connect(e.to_string()))
    }
}

/// Checks `base_url` names a server's root over plain HTTP (`http://host[:port]`, a
/// trailing `/` allowed) and returns it without the slash: the form the reports print
/// and in which two URLs naming the same server compare equal.
pub fn parse_base_url(base_url: &str) -> Result<String, String> {
    root_authority(base_url).map(|authority| format!("http://{authority}"))
}

/// The `host[:port]` of a server's root URL, or why `base_url` is not one.
fn root_authority(base_url: &str) -> Result<Authority, String> {
    if base_url.is_empty() {
        return Err("empty base URL: give a server's root, http://host:port".into());
    }
    let uri: Uri = base_url
        .parse()
        .map_err(|e| format!("base URL {base_url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "base URL {base_url:?}: the load generator speaks plain http:// only"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("base URL {base_url:?}: no host"))?;
    if authority.host().is_empty() {
        return Err(format!("base URL {base_url:?}: no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!(
            "base URL {base_url:?}: give the server's root (http://host:port), no path"
        ));
    }
    Ok(authority.clone())
}

/// One request and its whole answer on `conn`, the connection driven meanwhile by this
/// task.
async fn exchange(conn: &mut Conn, request: Request<Full<Bytes>>) -> Result<Answer, Failure> {
    let (sender, connection) = conn;
    driven(connection, poll_fn(|cx| sender.poll_ready(cx)))
        .await?
        .map_err(|e| Failure::Transport(e.to_string()))?;
    let response = driven(connection, sender.send_request(request))
        .await?
        .map_err(|e| Failure::Transport(e.to_string()))?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = driven(
        connection,
        Limited::new(response.into_body(), ANSWER_BYTES_MAX).collect(),
    )
    .await?
    .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
        Ok(_) => Failure::TooLarge,
        Err(e) => Failure::Transport(e.to_string()),
    })?
    .to_bytes();
    Ok(Answer {
        status,
        retry_after,
        body,
    })
}

/// Runs `work` while polling the connection that serves it (HTTP/1's reads and writes
/// happen in the connection's future). If the connection ends first, `work` gets one more
/// poll (its answer may have come with the end) and otherwise fails.
async fn driven<F: Future>(
    connection: &mut Connection<TokioIo<TcpStream>, Full<Bytes>>,
    work: F,
) -> Result<F::Output, Failure> {
    let mut work = pin!(work);
    poll_fn(|cx| {
        if let Poll::Ready(out) = work.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match Pin::new(&mut *connection).poll(cx) {
            Poll::Pending => Poll::Pending,
            ended => match work.as_mut().poll(cx) {
                Poll::Ready(out) => Poll::Ready(Ok(out)),
                Poll::Pending => Poll::Ready(Err(Failure::Transport(match ended {
                    Poll::Ready(Err(e)) => e.to_string(),
                    _ => "connection closed".into(),
                }))),
            },
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    // What: the client's parsing of the base URL (only a plain http:// root is taken) and
    // an exchange against a real listener on loopback — a keep-alive connection reused for
    // the next request, a connection the server closes replaced, a body past the limit
    // refused. How: a tiny hand-written HTTP/1.1 server on 127.0.0.1:0.
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn takes_only_a_plain_http_root() {
        assert!(Client::new("http://127.0.0.1:8080", 4, SECOND, SECOND).is_ok());
        assert!(Client::new("http://localhost:8080/", 4, SECOND, SECOND).is_ok());
        for bad in [
            "https://127.0.0.1:8080",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080/?a=1",
            "127.0.0.1:8080",
            "not a url",
        ] {
            assert!(
                Client::new(bad, 4, SECOND, SECOND).is_err(),
                "{bad} was taken"
            );
        }
        let c = Client::new("http://localhost", 4, SECOND, SECOND).unwrap();
        assert_eq!(c.authority, "localhost:80");
        assert_eq!(
            parse_base_url("http://127.0.0.1:8080/").as_deref(),
            Ok("http://127.0.0.1:8080")
        );
        for bad in ["", "http://", "http:///", "https://127.0.0.1:8080"] {
            assert!(parse_base_url(bad).is_err(), "{bad:?} was taken");
        }
    }

    /// Serves `answers` on one accepted connection after another: for each connection, a
    /// list of raw answers, one per request read; the connection is closed after its list.
    /// Returns the address and a count of connections accepted.
    async fn server(per_connection: Vec<Vec<String>>) -> (String, tokio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let mut accepted = 0;
            for answers in per_connection {
                let (mut socket, _) = listener.accept().await.unwrap();
                accepted += 1;
                for answer in answers {
                    // Each test request fits in one read.
                    let mut buf = vec![0u8; 4096];
                    let n = socket.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client closed early");
                    socket.write_all(answer.as_bytes()).await.unwrap();
                }
            }
            accepted
        });
        (format!("http://{addr}"), task)
    }

    fn ok(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn reuses_a_kept_alive_connection_and_replaces_a_closed_one() {
        let closing = "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}".to_string();
        let (url, accepted) =
            server(vec![vec![ok("one"), ok("two"), closing], vec![ok("four")]]).await;
        let client = Client::new(&url, 4, SECOND, SECOND).unwrap();
        let path: Uri = "/healthz".parse().unwrap();
        let a = client.send(Method::GET, &path, None, None).await.unwrap();
        assert_eq!((a.status, &a.body[..]), (200, &b"one"[..]));
        let b = client
            .send(Method::POST, &path, Some(Bytes::from_static(b"{}")), None)
            .await
            .unwrap();
        assert_eq!((b.status, &b.body[..]), (200, &b"two"[..]));
        let c = client.send(Method::GET, &path, None, None).await.unwrap();
        assert_eq!(c.status, 503);
        assert_eq!(c.retry_after, Some(SECOND));
        // The server said close: the next request needs a second connection.
        let d = client.send(Method::GET, &path, None, None).await.unwrap();
        assert_eq!((d.status, &d.body[..]), (200, &b"four"[..]));
        assert_eq!(accepted.await.unwrap(), 2);
    }

    #[tokio::test]
    async fn refuses_an_answer_past_the_limit_and_reports_a_cut_connection() {
        let huge = ok(&"x".repeat(ANSWER_BYTES_MAX + 1));
        let cut = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort".to_string();
        let (url, _accepted) = server(vec![vec![huge], vec![cut]]).await;
        let client = Client::new(&url, 4, SECOND, SECOND).unwrap();
        let path: Uri = "/".parse().unwrap();
        assert!(matches!(
            client.send(Method::GET, &path, None, None).await,
            Err(Failure::TooLarge)
        ));
        assert!(matches!(
            client.send(Method::GET, &path, None, None).await,
            Err(Failure::Transport(_))
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure() {
        // A port just freed: nothing listens there.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let client = Client::new(&format!("http://{addr}"), 4, SECOND, SECOND).unwrap();
        let path: Uri = "/".parse().unwrap();
        assert!(matches!(
            client.send(Method::GET, &path, None, None).await,
            Err(Failure::Connect(_))
        ));
    }
}
