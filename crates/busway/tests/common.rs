//! Helpers shared by the integration tests: nodes on loopback, bounded waits.

#![allow(dead_code, unreachable_pub)]

use busway::{Addr, BusId, Event, Events, IoThreads, Node, NodeConfig};
use std::time::Duration;

/// Longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(10);

/// The transports every conformance test runs over; tcp6 is left out where the machine has no
/// IPv6 loopback.
pub fn transports() -> Vec<&'static str> {
    let mut t = vec!["tcp4", "unix"];
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        t.push("tcp6");
    }
    t
}

/// A fresh listen address of the given transport.
pub fn listen_addr(transport: &str) -> Addr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    match transport {
        "tcp4" => "tcp://127.0.0.1:0".parse().unwrap(),
        "tcp6" => "tcp://[::1]:0".parse().unwrap(),
        _ => format!(
            "unix://{}/busway-test-{}-{}.sock",
            std::env::temp_dir().display(),
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
        .parse()
        .unwrap(),
    }
}

pub fn config(id: u64) -> NodeConfig {
    NodeConfig::new(BusId(id)).io_threads(IoThreads::Dedicated(1))
}

pub async fn start(config: NodeConfig) -> Node {
    Node::start(config).await.expect("node starts")
}

/// A listening node and a node dialing it, with the link up.
pub async fn pair(transport: &str, a: NodeConfig, b: NodeConfig) -> (Node, Node) {
    let a = start(a.listen(listen_addr(transport))).await;
    let addr = a.listen_addrs()[0].clone();
    let b = start(b.connect(addr)).await;
    assert!(
        b.wait_for_peer(a.id(), WAIT).await,
        "link up over {transport}"
    );
    assert!(
        a.wait_for_peer(b.id(), WAIT).await,
        "link up over {transport}"
    );
    (a, b)
}

/// Waits for the first event that `pick` accepts; panics after `WAIT`.
pub async fn wait_event<T>(events: &mut Events, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let ev = events.recv().await.expect("events stream open");
            if let Some(t) = pick(&ev) {
                return t;
            }
        }
    })
    .await;
    found.expect("the expected event within the wait")
}
