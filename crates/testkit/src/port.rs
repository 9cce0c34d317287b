use std::net::{Ipv4Addr, TcpListener};

/// Lowest port of the fallback range used when the OS cannot hand out a port.
///
/// It lies below Linux's default ephemeral range (32768-60999), so it does not
/// collide with source ports of outgoing connections.
const FALLBACK_PORT_LOW: u16 = 20_000;
/// Number of ports in the fallback range.
const FALLBACK_PORT_SPAN: u16 = 10_000;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// Why: private servers (`redis-server`, `mariadbd`, `nats-server`) take their
/// port on the command line, so a test has to pick one that nothing else uses
/// before starting them. The port is found by binding `127.0.0.1:0` and
/// closing the socket again; another process could take it in between, so
/// callers that start a server should retry with a new port if the bind
/// fails (the private servers of this crate do).
///
/// If even binding port 0 fails (for example the process is out of file
/// descriptors), a random port from 20000-29999 is returned instead and a
/// warning is logged: the caller's own bind will then report the real error.
pub fn free_port() -> u16 {
    match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => {
            let port = FALLBACK_PORT_LOW + rand::random_range(0..FALLBACK_PORT_SPAN);
            tracing::warn!(error = %e, port, "could not ask the OS for a free port; guessing one");
            port
        }
    }
}
