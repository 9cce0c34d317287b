//! What the gate asks a Redis Cluster about itself: which primaries are healthy, and
//! the stamp (`lua/stamp.lua`) each serves under. `Layout::adopt` uses it to tell a slot
//! migrated live (its entries' writer is still a healthy primary, stamp unchanged) from
//! state lost with a failover or a restart (the writer is gone, demoted, or restarted).

use flashsale_app::ports::ErrorKind;
use flashsale_app::GateError;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;

/// Most nodes read from `CLUSTER NODES`: Redis Cluster is meant for up to about 1,000
/// nodes, so a longer answer is not one to trust.
const NODES_MAX: usize = 1_000;

/// A node of `CLUSTER NODES` that serves as a healthy primary, other than the node that
/// answered.
#[derive(Debug, PartialEq, Eq)]
struct Peer {
    host: String,
    port: u16,
}

/// The healthy primaries of a `CLUSTER NODES` answer, but the one that answered: flagged
/// `master`, not `myself`, not failing (`fail`, `fail?`), not joining (`handshake`,
/// `noaddr`), and connected. `None` when the answer does not parse.
fn healthy_primaries(nodes: &str) -> Option<Vec<Peer>> {
    let mut peers = Vec::new();
    for (i, line) in nodes.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        if i >= NODES_MAX {
            return None;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_id, address, flags, _primary, _ping, _pong, _epoch, link, ..] = fields.as_slice()
        else {
            return None;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        let unhealthy = ["myself", "fail", "fail?", "handshake", "noaddr"];
        if !flags.contains(&"master")
            || flags.iter().any(|f| unhealthy.contains(f))
            || *link != "connected"
        {
            continue;
        }
        // `ip:port@cport[,hostname]`
        let endpoint = address.split(['@', ',']).next()?;
        let (host, port) = endpoint.rsplit_once(':')?;
        peers.push(Peer {
            host: host.to_owned(),
            port: port.parse().ok()?,
        });
    }
    Some(peers)
}

/// A primary's stamp from its `INFO server replication`: `run_id:master_replid`, as
/// `stamp.lua` makes it; `None` if the node is not a primary or the answer lacks either.
fn stamp_of(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if field("role")? != "master" {
        return None;
    }
    Some(format!("{}:{}", field("run_id")?, field("master_replid")?))
}

fn text(value: Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

/// The stamps of the healthy primaries other than the one holding key `at`, as that
/// primary sees the cluster. A primary that does not answer is left out: its entries
/// are then rebuilt rather than adopted, which is always safe.
pub(crate) async fn peer_stamps(
    mut conn: ClusterConnection,
    at: &str,
) -> Result<Vec<String>, GateError> {
    let holder = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        at,
        SlotAddr::Master,
    )));
    let mut nodes = redis::cmd("CLUSTER");
    nodes.arg("NODES");
    let answer = conn
        .route_command(nodes, holder)
        .await
        .map_err(|e| GateError::caused(ErrorKind::Unreachable, "redis: CLUSTER NODES", e))?;
    let peers = text(answer)
        .as_deref()
        .and_then(healthy_primaries)
        .ok_or_else(|| GateError::corrupt("redis: CLUSTER NODES did not parse"))?;
    let asks = peers.into_iter().map(|peer| {
        let mut conn = conn.clone();
        async move {
            let mut info = redis::cmd("INFO");
            info.arg("server").arg("replication");
            let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: peer.host,
                port: peer.port,
            });
            let answer = conn.route_command(info, node).await.ok()?;
            stamp_of(&text(answer)?)
        }
    });
    Ok(futures::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks which lines of a real `CLUSTER NODES` answer (Redis 7, taken mid-failover)
    // count as healthy primaries: only connected masters that are neither the answering
    // node nor failing nor joining, with their client port, not the bus port.
    #[test]
    fn only_healthy_primaries_but_the_answering_one() {
        let nodes = "\
a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:30002@40002 master - 0 1700000000000 2 connected 5461-10922
c3 127.0.0.1:30003@40003,host-c master,fail - 1 1700000000000 3 disconnected
d4 127.0.0.1:30004@40004 slave a1 0 1700000000000 1 connected
e5 127.0.0.1:30005@40005 master,fail? - 0 1700000000000 5 connected 10923-16383
f6 127.0.0.1:30006@40006 master - 0 1700000000000 6 connected
g7 :0@0 master,noaddr - 0 0 0 disconnected
";
        assert_eq!(
            healthy_primaries(nodes),
            Some(vec![
                Peer {
                    host: "127.0.0.1".into(),
                    port: 30002
                },
                Peer {
                    host: "127.0.0.1".into(),
                    port: 30006
                },
            ])
        );
        assert_eq!(healthy_primaries("a1 127.0.0.1:1@2 master"), None);
        assert_eq!(healthy_primaries(""), Some(Vec::new()));
    }

    // Checks that a stamp is made as stamp.lua makes it, only for a primary, and never
    // from a partial answer.
    #[test]
    fn a_stamp_is_run_id_and_replication_id_of_a_primary() {
        let info = "# Server\r\nrun_id:abc123\r\n\r\n# Replication\r\nrole:master\r\nmaster_replid:def456\r\nmaster_replid2:0000\r\n";
        assert_eq!(stamp_of(info).as_deref(), Some("abc123:def456"));
        assert_eq!(stamp_of(&info.replace("role:master", "role:slave")), None);
        assert_eq!(stamp_of("# Server\r\nrun_id:abc\r\nrole:master\r\n"), None);
    }
}
