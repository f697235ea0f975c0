//! On-demand direct links: traffic that starts through a relay moves to a direct link the relay
//! hinted, in order and each message once, and stays through relays when a node forbids it.

mod common;

use busway::{BusId, Node, NodeConfig};
use common::*;
use std::time::Duration;

const RELAY: BusId = BusId(100);

/// A node registered below the relay at `relay`, listening on loopback (so it can be dialed).
async fn below(id: u64, relay: &Node, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut c = config(id)
        .upstream(relay.listen_addrs()[0].clone())
        .listen(listen_addr("tcp4"));
    c.dial_backoff_min_ms = 5;
    tweak(&mut c);
    let n = start(c).await;
    assert!(n.wait_for_peer(RELAY, WAIT).await, "{id} registered");
    n
}

fn msg(i: u64) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.resize(8 + (i % 40) as usize, 3);
    m
}

/// Sends `range` from `a` to bus id 2 in batches, pausing between them.
fn stream(a: &Node, range: std::ops::Range<u64>) -> tokio::task::JoinHandle<()> {
    let a = a.clone();
    tokio::spawn(async move {
        let mut next = range.start;
        while next < range.end {
            let batch: Vec<Vec<u8>> = (next..(next + 200).min(range.end)).map(msg).collect();
            a.send_batch(BusId(2), &batch).await.unwrap();
            next += batch.len() as u64;
            // Pacing: the stream lasts long enough for the switch to happen while it flows.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

/// Receives `range` from bus id 1 in order, each once.
async fn expect(inbox: &mut busway::Inbox, range: std::ops::Range<u64>) {
    expect_in_order(inbox, BusId(1), range, msg).await;
}

fn direct_up(a: &Node, id: BusId) -> bool {
    a.peers().iter().any(|p| p.id == id && p.up)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_traffic_moves_to_a_direct_link_in_order() {
    let r = start(config(RELAY.0).listen(listen_addr("tcp4"))).await;
    let a = below(1, &r, |_| {}).await;
    let b = below(2, &r, |_| {}).await;
    let mut inbox = b.take_inbox().unwrap();
    // The stream starts through the relay and switches while it flows.
    let first = 50_000;
    let sender = stream(&a, 0..first);
    expect(&mut inbox, 0..first).await;
    sender.await.unwrap();
    assert!(direct_up(&a, BusId(2)), "1 dialed 2 on the relay's hint");
    assert!(direct_up(&b, BusId(1)), "2 sees the direct link from 1");
    // Later traffic does not touch the relay, across cuts of the direct link.
    let relayed_before = r.stats().relayed;
    let sender = stream(&a, first..first + 30_000);
    let cutter = {
        let a = a.clone();
        tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                a.disconnect(BusId(2));
            }
        })
    };
    expect(&mut inbox, first..first + 30_000).await;
    sender.await.unwrap();
    cutter.await.unwrap();
    assert!(a.flush(WAIT).await, "everything acknowledged");
    let relayed = r.stats().relayed - relayed_before;
    // Only what was in flight at a cut may have gone around: a few frames at most.
    assert!(
        relayed < 50,
        "{relayed} frames still went through the relay"
    );
    nothing_more_from(&a, &mut inbox, BusId(2)).await;
    for n in [a, b, r] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_forbids_direct_links_is_reached_through_relays_only() {
    let r = start(config(RELAY.0).listen(listen_addr("tcp4"))).await;
    let a = below(1, &r, |_| {}).await;
    let b = below(2, &r, |c| c.direct_links = false).await;
    let mut inbox = b.take_inbox().unwrap();
    let sender = stream(&a, 0..5_000);
    expect(&mut inbox, 0..5_000).await;
    sender.await.unwrap();
    // A negative check, not a synchronization: a hint would have come with the relayed
    // traffic already acknowledged, and a dial on it would be up within this quiet period.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !direct_up(&a, BusId(2)),
        "no direct link to a node that forbids it"
    );
    assert!(a.peers().iter().all(|p| p.id == RELAY));
    for n in [a, b, r] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_to_an_address_where_another_node_listens_is_refused_with_both_ids() {
    use busway_core::routed::{encode_hint, RoutedHeader, RoutedType};
    use tokio::io::AsyncWriteExt;
    let a = start(config(1).listen(listen_addr("tcp4"))).await;
    let other = start(config(3).listen(listen_addr("tcp4"))).await;
    let mut events = a.take_events().unwrap();
    let busway::Addr::Tcp(at) = a.listen_addrs()[0].clone() else {
        unreachable!()
    };
    // A "relay" serving bus ids 9..=50 carries node 1's traffic to 50 (an acknowledgement from
    // 50 comes through it: only such a relay may hint), then says 50 listens where 3 does.
    let mut relay = authenticated_as(at, 9, None, |h| {
        h.downstream_of_you = Some((BusId(9), BusId(50)));
    })
    .await;
    assert!(a.wait_for_peer(BusId(9), WAIT).await);
    a.send(BusId(50), bytes::Bytes::from_static(b"to 50"))
        .await
        .unwrap();
    let ack = RoutedHeader {
        kind: RoutedType::Ack,
        ttl: 16,
        src: BusId(50),
        src_incarnation: 50,
        dst: BusId(1),
        seq: 1,
        settled: false,
        route: vec![BusId(9)],
    };
    relay
        .write_all(&busway_core::routed::routed_frame(&ack, &[]))
        .await
        .unwrap();
    let h = RoutedHeader {
        kind: RoutedType::Hint,
        ttl: 16,
        src: BusId(9),
        src_incarnation: 9,
        dst: BusId(1),
        seq: 0,
        settled: false,
        route: vec![],
    };
    let addr = other.listen_addrs()[0].to_string();
    relay
        .write_all(&encode_hint(&h, BusId(50), &[addr]))
        .await
        .unwrap();
    let reason = wait_event(&mut events, |e| match e {
        busway::Event::Rejected { reason, .. } if reason.contains("to reach bus id 50") => {
            Some(reason.clone())
        }
        _ => None,
    })
    .await;
    assert!(reason.contains("found bus id 3"), "{reason}");
    assert!(!direct_up(&a, BusId(3)), "no link kept to the wrong node");
    // The hand-made "relay" does not answer a CLOSE: let it go before shutting down.
    drop(relay);
    a.shutdown().await;
    other.shutdown().await;
}
