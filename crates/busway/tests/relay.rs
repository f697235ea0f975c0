//! Messages between nodes with no direct link travel through their upstream: in order, each
//! once, across a relay that goes away and comes back; failures come back to the sender fast.

mod common;

use busway::{Addr, BusId, Event, Node, NodeConfig};
use common::*;
use std::time::Duration;

const RELAY: BusId = BusId(100);

async fn relay_at(addr: Addr) -> Node {
    start(config(RELAY.0).listen(addr)).await
}

/// A relay that reports unknown ids at once (no grace after its start).
async fn strict_relay() -> Node {
    let mut c = config(RELAY.0).listen(listen_addr("tcp4"));
    c.relay_grace_ms = 0;
    start(c).await
}

/// A new relay at the address of one that just went away (whose socket may take a moment to
/// close).
async fn relay_again(addr: &Addr) -> Node {
    for _ in 0..200 {
        if let Ok(n) = busway::Node::start(config(RELAY.0).listen(addr.clone())).await {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("could not listen on {addr} again");
}

/// A node registered below `relay`: up at both ends, so that the relay routes to it. (The node
/// sees its link up when it has checked the relay's proof, which can be before the relay has
/// checked its own: a strict relay would answer a message sent in between "unknown".)
async fn below(id: u64, relay: &Node, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut c = config(id).upstream(relay.listen_addrs()[0].clone());
    c.dial_backoff_min_ms = 5;
    tweak(&mut c);
    let n = start(c).await;
    assert!(
        n.wait_for_peer(RELAY, WAIT).await,
        "{id} registered with the relay"
    );
    assert!(
        relay.wait_for_peer(BusId(id), WAIT).await,
        "{id} known to the relay"
    );
    n
}

fn msg(i: u64) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.resize(8 + (i % 50) as usize, 7);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_cross_a_relay_in_order_and_a_restarted_relay_loses_nothing() {
    let r = relay_at(listen_addr("tcp4")).await;
    let addr = r.listen_addrs()[0].clone();
    let a = below(1, &r, |_| {}).await;
    let b = below(2, &r, |_| {}).await;
    assert_eq!(a.upstream_id(), Some(RELAY));
    let mut inbox = b.take_inbox().unwrap();
    let total = 60_000u64;
    let sender = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut next = 0;
            while next < total {
                let batch: Vec<Vec<u8>> = (next..(next + 500).min(total)).map(msg).collect();
                next = a.send_batch(BusId(2), &batch).await.unwrap().end;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    // Take the relay away twice mid-stream and bring a new one up at the same address.
    let mut relay = Some(r);
    let mut expected = 0u64;
    let mut restarts = 0;
    let received = tokio::time::timeout(Duration::from_secs(60), async {
        while expected < total {
            let batch = inbox.recv_batch().await.unwrap();
            assert_eq!(batch.src(), BusId(1));
            for p in batch.iter() {
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                assert_eq!(seq, expected, "in order, each once");
                assert_eq!(p, msg(seq).as_slice());
                expected += 1;
            }
            if restarts < 4 && expected > (restarts + 1) * total / 5 {
                let old = relay.take().unwrap();
                if restarts % 2 == 0 {
                    // Abruptly, as a crash would: its loops stop, queued frames are lost.
                    drop(old);
                } else {
                    old.shutdown().await;
                }
                relay = Some(relay_again(&addr).await);
                restarts += 1;
            }
        }
    })
    .await;
    assert!(received.is_ok(), "stream stalled at {expected}");
    sender.await.unwrap();
    assert_eq!(restarts, 4);
    assert_eq!(
        a.upstream_id(),
        Some(RELAY),
        "the same id after its restarts"
    );
    assert!(
        a.peers().iter().all(|p| p.id == RELAY),
        "no direct link between 1 and 2"
    );
    let routed = a.relayed_peers();
    assert_eq!(routed[0].id, BusId(2));
    assert_eq!(routed[0].incarnation, Some(b.incarnation()));
    nothing_more_from(&a, &mut inbox, BusId(2)).await;
    for n in [a, b, relay.unwrap()] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_fails_fast_with_the_relay_named() {
    let r = strict_relay().await;
    let a = below(1, &r, |_| {}).await;
    let mut events = a.take_events().unwrap();
    let seq = a
        .send(BusId(77), bytes::Bytes::from_static(b"anyone?"))
        .await
        .unwrap();
    let (seqs, reason, path) = wait_event(&mut events, |e| match e {
        Event::Undeliverable {
            peer,
            seqs,
            reason,
            path,
            ..
        } if *peer == BusId(77) => Some((seqs.clone(), reason.clone(), *path)),
        _ => None,
    })
    .await;
    assert_eq!(seqs, seq..seq + 1);
    assert_eq!(path, busway::Path::Relayed);
    assert!(
        reason.contains("no route to bus id 77 at relay 100"),
        "{reason}"
    );
    a.shutdown().await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_past_its_ttl_is_dropped_and_reported() {
    let r = strict_relay().await;
    let a = below(1, &r, |c| c.ttl = 0).await;
    let _b = below(2, &r, |_| {}).await;
    let mut events = a.take_events().unwrap();
    a.send(BusId(2), bytes::Bytes::from_static(b"too far"))
        .await
        .unwrap();
    let reason = wait_event(&mut events, |e| match e {
        Event::Undeliverable { reason, .. } => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert!(reason.contains("TTL exceeded at relay 100"), "{reason}");
    a.shutdown().await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_upstream_an_unknown_id_has_no_route() {
    let a = start(config(1).listen(listen_addr("tcp4"))).await;
    assert_eq!(
        a.try_send(BusId(2), bytes::Bytes::new()),
        Err(busway::SendError::NoRoute(BusId(2)))
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_receiver_killed_for_good_is_reported_at_the_deadline() {
    let r = strict_relay().await;
    let a = below(1, &r, |c| c.peer_dead_after_ms = 300).await;
    let b = below(2, &r, |_| {}).await;
    let mut ib = b.take_inbox().unwrap();
    let mut events = a.take_events().unwrap();
    a.send(BusId(2), bytes::Bytes::from_static(b"first"))
        .await
        .unwrap();
    assert_eq!(next_message(&mut ib).await.payload.as_ref(), b"first");
    assert!(
        a.flush(WAIT).await,
        "the first message is acknowledged end to end"
    );
    drop(ib);
    drop(b);
    // The relay sees 2 gone before 1 sends again.
    let gone = tokio::time::timeout(WAIT, async {
        while r.peers().iter().any(|p| p.id == BusId(2) && p.up) {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    });
    assert!(gone.await.is_ok(), "the relay saw 2 go");
    for i in 0..10u8 {
        a.send(BusId(2), bytes::Bytes::from(vec![i])).await.unwrap();
    }
    let (seqs, reason, path) = wait_event(&mut events, |e| match e {
        Event::Undeliverable {
            peer,
            seqs,
            reason,
            path,
            ..
        } if *peer == BusId(2) => Some((seqs.clone(), reason.clone(), *path)),
        _ => None,
    })
    .await;
    assert_eq!(seqs, 1..11, "exactly the ten unacknowledged messages");
    assert_eq!(path, busway::Path::Relayed);
    assert!(
        reason.contains("300 ms") || reason.contains("down"),
        "{reason}"
    );
    a.shutdown().await;
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_behind_a_mid_tier_relay_whose_link_is_down_waits_rather_than_fails() {
    // 1 below the top relay 100; 7 below the mid-tier relay 50, which serves 5..=9 for 100.
    let top = strict_relay().await;
    let top_addr = top.listen_addrs()[0].clone();
    let mut mc = config(50)
        .listen(listen_addr("tcp4"))
        .upstream(top_addr.clone());
    mc.subtree = Some((BusId(5), BusId(9)));
    // It comes back late: messages for 7 reach the top while its way down is cut.
    mc.dial_backoff_min_ms = 300;
    let mid = start(mc).await;
    assert!(mid.wait_for_peer(RELAY, WAIT).await);
    let a = below(1, &top, |_| {}).await;
    let mut b = config(7).upstream(mid.listen_addrs()[0].clone());
    b.direct_links = false;
    let b = start(b).await;
    assert!(b.wait_for_peer(BusId(50), WAIT).await);
    let mut inbox = b.take_inbox().unwrap();
    let mut events = a.take_events().unwrap();
    a.send(BusId(7), bytes::Bytes::from_static(b"before"))
        .await
        .unwrap();
    let before = tokio::time::timeout(WAIT, inbox.recv()).await;
    assert_eq!(
        before
            .expect("delivered through both relays")
            .unwrap()
            .payload
            .as_ref(),
        b"before"
    );
    // Cut 50's link to the top and wait until the top sees it down.
    assert!(mid.disconnect(RELAY));
    let down = tokio::time::timeout(WAIT, async {
        while top.peers().iter().any(|p| p.id == BusId(50) && p.up) {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    });
    assert!(down.await.is_ok(), "the top relay saw 50 go");
    a.send(BusId(7), bytes::Bytes::from_static(b"while cut"))
        .await
        .unwrap();
    let got = tokio::time::timeout(WAIT, inbox.recv()).await;
    assert_eq!(
        got.expect("delivered once 50 is back")
            .unwrap()
            .payload
            .as_ref(),
        b"while cut"
    );
    assert!(a.flush(WAIT).await, "acknowledged end to end");
    while let Ok(Some(e)) = tokio::time::timeout(Duration::ZERO, events.recv()).await {
        assert!(
            !matches!(e, Event::Undeliverable { .. }),
            "nothing given up: {e:?}"
        );
    }
    for n in [a, b, mid, top] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_the_next_hop_accepts_is_refused_with_a_report_not_a_broken_link() {
    let small = busway::limits::FRAME_BODY_MIN_BYTES;
    let r = strict_relay().await;
    let s = below(1, &r, |c| c.direct_links = false).await;
    let d = below(4, &r, |c| {
        c.frame_body_max = small;
        c.inbox_bytes_max = small;
    })
    .await;
    let mut inbox = d.take_inbox().unwrap();
    let mut events = s.take_events().unwrap();
    // Over bus id 4's limit, under the source's and the relay's: the relay says so.
    let big = bytes::Bytes::from(vec![7u8; 2 << 20]);
    let seq = s.send(BusId(4), big).await.unwrap();
    let (seqs, reason) = wait_event(&mut events, |e| match e {
        Event::Undeliverable {
            peer: BusId(4),
            seqs,
            reason,
            ..
        } => Some((seqs.clone(), reason.clone())),
        _ => None,
    })
    .await;
    assert_eq!(seqs, seq..seq + 1);
    assert!(
        reason.contains(&format!("is over the {small} bytes bus id 4 accepts")),
        "{reason}"
    );
    // The link to 4 never carried it: nothing to refuse, and what fits still goes.
    send_and_expect(&s, BusId(4), &mut inbox, b"this fits").await;
    assert_eq!(d.stats().protocol_errors, 0);
    assert_eq!(r.stats().protocol_errors, 0);
    for n in [s, d, r] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_peer_is_sent_nothing_larger_than_it_states() {
    let small = busway::limits::FRAME_BODY_MIN_BYTES;
    let mut ca = config(1);
    ca.frame_body_max = small;
    ca.inbox_bytes_max = small;
    let (a, b) = pair("tcp4", ca, config(2)).await;
    let mut inbox = a.take_inbox().unwrap();
    // Under the sender's own limit (4 MiB), over the one node 1 stated in its HELLO.
    let big = bytes::Bytes::from(vec![7u8; 2 << 20]);
    assert_eq!(
        b.send(BusId(1), big).await,
        Err(busway::SendError::TooLarge {
            len: 2 << 20,
            max: small
        })
    );
    send_and_expect(&b, BusId(1), &mut inbox, b"this fits").await;
    assert_eq!(a.stats().protocol_errors, 0);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_that_never_reads_holds_up_no_other_destination_behind_the_same_relay() {
    const TO_F: u64 = 1_000_000;
    let r = strict_relay().await;
    // Traffic stays relayed: the sender dials no direct link. Its queue per destination holds
    // far more than the relay's queue toward one (4 MiB) and the sockets on the way.
    let s = below(1, &r, |c| {
        c.direct_links = false;
        c.send_queue_bytes_max = 64 << 20;
    })
    .await;
    let f = below(2, &r, |_| {}).await;
    let x = below(3, &r, |c| {
        c.frame_body_max = busway::limits::FRAME_BODY_MIN_BYTES;
        c.inbox_bytes_max = c.frame_body_max;
    })
    .await;
    // X's application takes its inbox and never reads it.
    let _stuck = x.take_inbox().unwrap();
    let mut inbox_f = f.take_inbox().unwrap();
    let to_x = {
        let s = s.clone();
        tokio::spawn(async move {
            let payloads = vec![vec![0x58u8; 1024]; 64];
            loop {
                if s.send_batch(BusId(3), &payloads).await.is_err() {
                    return;
                }
            }
        })
    };
    // Meanwhile a stream to F, through the same relay and the same link to it.
    let to_f = {
        let s = s.clone();
        tokio::spawn(async move {
            let mut next = 0u64;
            while next < TO_F {
                let batch: Vec<Vec<u8>> = (next..(next + 256).min(TO_F)).map(msg).collect();
                next = s.send_batch(BusId(2), &batch).await.unwrap().end;
            }
        })
    };
    let mut expected = 0u64;
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        while expected < TO_F {
            let batch = inbox_f.recv_batch().await.unwrap();
            for p in batch.iter() {
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                assert_eq!(seq, expected, "in order, each once");
                expected += 1;
            }
        }
    })
    .await;
    assert!(
        all.is_ok(),
        "F's stream stalled at {expected} behind a destination that does not read: relay {:?}",
        r.stats()
    );
    to_f.await.unwrap();
    assert!(
        !to_x.is_finished(),
        "X's sender waits: nothing was dropped for it"
    );
    // X's messages wait at its sender (the window), not in the relay: nothing was refused for
    // want of room, nothing sent twice.
    assert_eq!(r.stats().relay_congested, 0, "{:?}", r.stats());
    assert_eq!(s.stats().msgs_resent, 0, "{:?}", s.stats());
    to_x.abort();
    // Dropped, not shut down: X's link would linger, full, until its deadline.
    drop((s, f, x, r));
}
