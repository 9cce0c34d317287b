use std::collections::HashSet;
use std::io;
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

/// What Redis Cluster adds to a node's client port to get its cluster bus port (fixed
/// by Redis unless `cluster-port` is set, which the testkit does not do).
pub(crate) const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Ports of one Galera node, consecutive from its SQL port `N`: `N` SQL, `N+1` Galera
/// (group communication), `N+2` IST (Galera's convention: its port + 1), `N+3` rsync
/// SST.
pub(crate) const GALERA_PORTS_PER_NODE: u16 = 4;
/// What a Galera node adds to its SQL port to get its Galera port (see
/// [`GALERA_PORTS_PER_NODE`]).
pub(crate) const GALERA_PORT_OFFSET: u16 = 1;
/// What a Galera node adds to its SQL port to get its IST port.
pub(crate) const GALERA_IST_OFFSET: u16 = 2;
/// What a Galera node adds to its SQL port to get its SST port.
pub(crate) const GALERA_SST_OFFSET: u16 = 3;

/// Lowest client port [`cluster_port`] hands out.
///
/// The OS's own pick (`127.0.0.1:0`) does not do for a cluster node: it comes from the
/// ephemeral range (32768-60999 here), often above 55535, where `N + 10000` does not
/// exist and redis-server refuses to start or the cluster never forms.
const CLUSTER_PORT_LOW: u16 = 20_000;
/// One past the highest client port [`cluster_port`] hands out: with it, both `N` and
/// the bus port `N + 10000` (30000-32767) stay below Linux's default ephemeral range
/// (32768-60999), so no outgoing connection's source port takes either between the
/// check and redis-server's bind.
const CLUSTER_PORT_END: u16 = 22_768;
/// Random candidates tried by [`cluster_port`] before it gives up: with ~2,800
/// candidates and a few dozen in use at most, running out means the range is taken by
/// something else.
const CLUSTER_PORT_ATTEMPTS: usize = 200;
/// Lowest SQL port [`galera_ports`] hands out: right above [`cluster_port`]'s range.
/// Not the OS's pick (`127.0.0.1:0`): that comes from the ephemeral range
/// (32768-60999), where any outgoing connection may take a node's IST or SST port as
/// its source port, and those are bound only when a node rejoins, maybe minutes after
/// they were picked. This range lies below it and between the Redis Cluster ranges
/// (client ports 20000-22767, bus ports 30000-32767).
const GALERA_PORT_LOW: u16 = 22_768;
/// One past the highest SQL port [`galera_ports`] hands out: its SST port (`+3`) stays
/// below 30000.
const GALERA_PORT_END: u16 = 29_997;
/// Random blocks tried by [`galera_ports`] before it gives up: with ~7,000 candidates
/// and a few dozen ports in use at most, running out means the range is taken by
/// something else.
const GALERA_PORT_ATTEMPTS: usize = 200;

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

/// Returns a port `N` of 127.0.0.1, from 20000-22767, such that both `N` and its
/// cluster bus port `N + 10000` were free a moment ago and neither was handed out by
/// this process before (by this function or [`free_port`]); both are recorded as
/// handed out.
///
/// Why: a Redis Cluster node listens on two ports, and the bus port must exist and be
/// free too (see [`CLUSTER_PORT_LOW`] and [`CLUSTER_PORT_END`] for why the range is
/// fixed rather than asked of the OS). As with [`free_port`], another process can take
/// either port before redis-server binds it, so callers retry with a new port when the
/// server exits at start.
pub(crate) fn cluster_port() -> io::Result<u16> {
    let mut ports = handed_out().lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..CLUSTER_PORT_ATTEMPTS {
        let port = rand::random_range(CLUSTER_PORT_LOW..CLUSTER_PORT_END);
        let bus = port + CLUSTER_BUS_OFFSET;
        if ports.contains(&port) || ports.contains(&bus) {
            continue;
        }
        // Both bound at once: the port is good only if both are free together.
        let both = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .and_then(|a| TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).map(|b| (a, b)));
        if both.is_ok() {
            ports.insert(port);
            ports.insert(bus);
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!(
            "no free pair of ports N, N+{CLUSTER_BUS_OFFSET} with N in \
             {CLUSTER_PORT_LOW}-{} after {CLUSTER_PORT_ATTEMPTS} tries",
            CLUSTER_PORT_END - 1
        ),
    ))
}

/// A SQL port `N` of a Galera node, from [`GALERA_PORT_LOW`]..[`GALERA_PORT_END`], such
/// that `N` and the three ports after it were free together a moment ago and none was
/// handed out by this process before; all four are recorded as handed out, so no other
/// test of this process gets them, not even while the node is down.
///
/// As with every free port, another process may take one before mariadbd binds it;
/// [`GaleraCluster::start`](crate::GaleraCluster::start) then tries new ports.
pub(crate) fn galera_ports() -> io::Result<u16> {
    for _ in 0..GALERA_PORT_ATTEMPTS {
        let port = rand::random_range(GALERA_PORT_LOW..GALERA_PORT_END);
        let block = port..port + GALERA_PORTS_PER_NODE;
        // All bound at once: the block is good only if all four are free together.
        let free = block
            .clone()
            .map(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)))
            .collect::<io::Result<Vec<_>>>()
            .is_ok();
        // Claimed one by one: a port claimed before stays claimed even when a later
        // one of the block was taken (it is only wasted).
        if free && block.clone().all(claim) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!(
            "no {GALERA_PORTS_PER_NODE} free consecutive ports from {GALERA_PORT_LOW}-{} \
             after {GALERA_PORT_ATTEMPTS} tries",
            GALERA_PORT_END - 1
        ),
    ))
}

/// `127.0.0.1:N1,127.0.0.1:N2,…`: the addresses of `ports` on 127.0.0.1, in order.
///
/// Why: how a cluster's nodes are named to the service (`FLASHSALE_DATABASE_NODES`,
/// `FLASHSALE_REDIS_CLUSTER_NODES`) and to Galera (`gcomm://`).
pub(crate) fn addr_list(ports: impl IntoIterator<Item = u16>) -> String {
    ports
        .into_iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks what cluster_port promises: twelve calls give ports in 20000-22767, no
    // port or bus port twice, each recorded as handed out (claiming it again fails, so
    // neither cluster_port nor free_port gives it again in this process). Whether a port
    // is still free after it was handed out is not checked: another process may take it
    // in between, as the function says (re-binding them here failed one clean-clone CI
    // run with AddrInUse); that both were free together at the check is what the
    // function's own binds test.
    #[test]
    fn cluster_ports_are_distinct_in_range_and_recorded() {
        let mut seen = HashSet::new();
        for _ in 0..12 {
            let port = cluster_port().expect("a free pair in the range");
            assert!((CLUSTER_PORT_LOW..CLUSTER_PORT_END).contains(&port));
            let bus = port + CLUSTER_BUS_OFFSET;
            assert!(
                seen.insert(port) && seen.insert(bus),
                "{port} handed out twice"
            );
            assert!(!claim(port), "{port} not recorded as handed out");
            assert!(!claim(bus), "{bus} not recorded as handed out");
        }
    }
}
