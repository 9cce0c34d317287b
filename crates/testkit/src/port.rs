use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

/// Lowest port of the fallback range used when the OS cannot hand out a port.
///
/// It lies below Linux's default ephemeral range (32768-60999), so it does not
/// collide with source ports of outgoing connections.
const FALLBACK_PORT_LOW: u16 = 20_000;
/// Number of ports in the fallback range.
const FALLBACK_PORT_SPAN: u16 = 10_000;
/// Ports asked of the OS before giving up on one this process never handed out.
const FRESH_PORT_ATTEMPTS: usize = 64;

/// Every port this process handed out: a private server a test killed keeps its port
/// for its restart, and the OS would gladly give that port, free meanwhile, to another
/// test's new server. Two tests on one port see each other's server (a test that killed
/// its Redis found another test's answering, and sold as if its own were back).
fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// Records `port` as handed out (a listener this process bound to it); false when it
/// was handed out before, and must not be used.
pub(crate) fn claim(port: u16) -> bool {
    handed_out()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(port)
}

/// Returns a TCP port on 127.0.0.1 that was free a moment ago.
///
/// Why: private servers (`redis-server`, `mariadbd`, `nats-server`) take their
/// port on the command line, so a test has to pick one that nothing else uses
/// before starting them. The port is found by binding `127.0.0.1:0` and
/// closing the socket again; another process could take it in between, so
/// callers that start a server should retry with a new port if the bind
/// fails (the private servers of this crate do).
///
/// A port is never handed out twice in one process (unless 64 asks in a row come back
/// with ports already handed out), so a server a test stopped keeps its port for its
/// restart.
///
/// If even binding port 0 fails (for example the process is out of file
/// descriptors), a random port from 20000-29999 is returned instead and a
/// warning is logged: the caller's own bind will then report the real error.
pub fn free_port() -> u16 {
    let mut ports = handed_out().lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..FRESH_PORT_ATTEMPTS {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
            // Never the same port twice in one process (see `handed_out`).
            Ok(addr) if ports.insert(addr.port()) => return addr.port(),
            Ok(_) => continue,
            Err(_) => break,
        }
    }
    drop(ports);
    match TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).and_then(|l| l.local_addr()) {
        Ok(addr) => addr.port(),
        Err(e) => {
            let port = FALLBACK_PORT_LOW + rand::random_range(0..FALLBACK_PORT_SPAN);
            tracing::warn!(error = %e, port, "could not ask the OS for a free port; guessing one");
            port
        }
    }
}
