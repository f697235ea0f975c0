//! Reports of messages given up are never lost (issue #11, item 2): not under a flood of other
//! events the application does not read, and not when the node goes away holding messages.

mod common;

use busway::{BusId, Event, Path};
use bytes::Bytes;
use common::*;
use tokio::io::AsyncWriteExt;

/// Refused connections thrown at the node: more events than its queue keeps.
const GARBAGE_CONNECTIONS: usize = busway::limits::EVENT_QUEUE_LEN_MAX + 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_report_survives_a_flood_of_events_nobody_reads() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let mut events = a.take_events().unwrap();
    let b_incarnation = b.incarnation();
    // Messages that peer 2 will never acknowledge: it is gone before they are written
    // (dropped, as a crash ends it: a node that shuts down is given up on at once).
    drop(b);
    until("node 1 sees node 2 down", || {
        a.peers().iter().all(|p| !p.up)
    })
    .await;
    for i in 0..3u8 {
        a.send(BusId(2), Bytes::from(vec![i])).await.unwrap();
    }
    // A flood of refused connections fills the event queue, unread.
    let addr = match a.listen_addrs()[0].clone() {
        busway::Addr::Tcp(addr) => addr,
        other => panic!("not tcp: {other}"),
    };
    for _ in 0..GARBAGE_CONNECTIONS {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(b"not a busway peer, not a frame at all").await;
    }
    until("the event queue overflows", || a.stats().events_dropped > 0).await;
    // Bus id 2 comes back as a new process: the three messages meant for the old one are
    // given up now, with the queue full, and reported all the same.
    let mut c2 = config(2).connect(a.listen_addrs()[0].clone());
    c2.shm_channels = false;
    let b2 = start(c2).await;
    assert!(a.wait_for_peer(BusId(2), WAIT).await);
    let report = std::iter::from_fn(|| events.try_recv()).find_map(|e| match e {
        Event::Undeliverable {
            peer: BusId(2),
            seqs,
            path,
            incarnation,
            reason,
        } => Some((seqs, path, incarnation, reason)),
        _ => None,
    });
    let (seqs, path, incarnation, reason) = report.expect("the report, after the flood");
    assert_eq!(
        (seqs, path, incarnation),
        (0..3, Path::Direct, Some(b_incarnation))
    );
    assert!(reason.contains("restarted"), "{reason}");
    b2.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_goes_away_reports_what_it_still_held() {
    let (a, b) = pair("unix", config(1), config(2)).await;
    let mut events = a.take_events().unwrap();
    // Dropped, as a crash ends it: a node that shuts down is given up on at once.
    drop(b);
    until("node 1 sees node 2 down", || {
        a.peers().iter().all(|p| !p.up)
    })
    .await;
    for i in 0..5u8 {
        a.send(BusId(2), Bytes::from(vec![i])).await.unwrap();
    }
    // Dropped, not shut down: held for a peer that may come back (the deadline is 30 s).
    drop(a);
    let mut held = Vec::new();
    let read_out = tokio::time::timeout(WAIT, async {
        while let Some(e) = events.recv().await {
            if let Event::Undeliverable {
                peer, seqs, reason, ..
            } = e
            {
                held.push((peer, seqs, reason));
            }
        }
    })
    .await;
    assert!(read_out.is_ok(), "the stream ends once the node is gone");
    assert_eq!(held.len(), 1, "{held:?}");
    let (peer, seqs, reason) = &held[0];
    assert_eq!((*peer, seqs.clone()), (BusId(2), 0..5));
    assert!(
        reason.contains("bus id 1 shut down before bus id 2 acknowledged them"),
        "{reason}"
    );
}
