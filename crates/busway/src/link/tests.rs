//! The link task's last line of defence: a panic in it (injected here; there should be none)
//! still brings its peer down, and the peer comes back and gets its messages.

use crate::{BusId, Event, IoThreads, Node, NodeConfig};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

/// The bus id whose link's next read panics (0: none). SeqCst: a test flag, read once per read.
static PANIC_READING_FROM: AtomicU64 = AtomicU64::new(0);

/// Panics if a test asked the link reading from `peer` to (once).
pub(super) fn panic_if_told(peer: BusId) {
    if PANIC_READING_FROM
        .compare_exchange(peer.0, 0, SeqCst, SeqCst)
        .is_ok()
    {
        panic!("a panic injected by a test into the link reading from bus id {peer}");
    }
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_task_that_panics_still_brings_its_peer_down_and_back() {
    let config = |id| {
        let mut c = NodeConfig::new(BusId(id)).io_threads(IoThreads::Dedicated(1));
        c.shm_channels = false;
        c.dial_backoff_min_ms = 5;
        c
    };
    let a = Node::start(config(1).listen("tcp://127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mut events = a.take_events().unwrap();
    let mut inbox = a.take_inbox().unwrap();
    let b = Node::start(config(2).connect(a.listen_addrs()[0].clone()))
        .await
        .unwrap();
    assert!(a.wait_for_peer(BusId(2), WAIT).await);
    assert!(b.wait_for_peer(BusId(1), WAIT).await);
    PANIC_READING_FROM.store(2, SeqCst);
    b.send(BusId(1), bytes::Bytes::from_static(b"after the panic"))
        .await
        .unwrap();
    let down = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(Event::PeerDown { peer, reason, .. }) = events.recv().await {
                if peer == BusId(2) {
                    return reason.to_string();
                }
            }
        }
    })
    .await
    .expect("the peer goes down");
    assert!(down.contains("the link's task panicked"), "{down}");
    // B dials again; the message it wrote on the link that died is written again, once.
    let m = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .expect("the message arrives on the next link")
        .unwrap();
    assert_eq!(
        (m.src, m.payload.as_ref()),
        (BusId(2), &b"after the panic"[..])
    );
    assert!(a.wait_for_peer(BusId(2), WAIT).await);
    b.send(BusId(1), bytes::Bytes::from_static(b"next"))
        .await
        .unwrap();
    let m = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.payload.as_ref(), b"next", "nothing twice in between");
}
