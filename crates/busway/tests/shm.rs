//! Two nodes of one host, linked over TCP or a Unix socket, move their data to shared-memory
//! rings by themselves (in-process channels when they share a process); order and exactly-once
//! hold across the switch and across a cut link.

mod common;

use busway::{BusId, Node};
use common::*;
use std::time::Duration;

fn msg(i: u64) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.resize(8 + (i % 120) as usize, i as u8);
    m
}

async fn stream(a: &Node, to: BusId, range: std::ops::Range<u64>) {
    let mut next = range.start;
    while next < range.end {
        let batch: Vec<Vec<u8>> = (next..(next + 1000).min(range.end)).map(msg).collect();
        a.send_batch(to, &batch).await.unwrap();
        next += batch.len() as u64;
    }
}

async fn expect(inbox: &mut busway::Inbox, from: BusId, range: std::ops::Range<u64>) {
    expect_in_order(inbox, from, range, msg).await;
}

/// Nodes 1 and 2 of this process, with shared memory opened as between processes (no
/// in-process channel).
fn shm_config(id: u64) -> busway::NodeConfig {
    let mut c = config(id);
    c.mem_channels = false;
    c
}

/// Waits until `node` reads a peer's ring (shared memory or in-process).
async fn wait_for_ring(node: &Node) {
    wait_for_rings(node, 1).await;
}

/// Waits until `node` has switched to `n` rings of its peers so far (a link's SWITCH may come
/// after the last message a test waits for).
async fn wait_for_rings(node: &Node, n: u64) {
    let deadline = std::time::Instant::now() + WAIT;
    while node.stats().shm_channels + node.stats().mem_channels < n {
        assert!(
            std::time::Instant::now() < deadline,
            "no switch to ring {n}"
        );
        tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
    }
}

/// Like `common::pair`, with shared memory allowed on a link of `transport`.
async fn shm_pair(transport: &str) -> (Node, Node) {
    let a = start(shm_config(1).listen(listen_addr(transport))).await;
    let b = start(shm_config(2).connect(a.listen_addrs()[0].clone())).await;
    assert!(b.wait_for_peer(a.id(), WAIT).await);
    assert!(a.wait_for_peer(b.id(), WAIT).await);
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_links_move_their_data_to_shared_memory_by_themselves() {
    for transport in ["tcp4", "unix"] {
        let (a, b) = shm_pair(transport).await;
        let mut inbox = a.take_inbox().unwrap();
        let sender = {
            let b = b.clone();
            tokio::spawn(async move { stream(&b, BusId(1), 0..200_000).await })
        };
        expect(&mut inbox, BusId(2), 0..200_000).await;
        sender.await.unwrap();
        wait_for_ring(&a).await;
        wait_for_ring(&b).await;
        assert_eq!(a.stats().shm_channels, 1, "{transport}: 1 reads 2's ring");
        assert_eq!(b.stats().shm_channels, 1, "{transport}: 2 reads 1's ring");
        // A cut link: the next link switches again and nothing is lost or repeated.
        let sender = {
            let b = b.clone();
            tokio::spawn(async move { stream(&b, BusId(1), 200_000..300_000).await })
        };
        // Cut once part of the stream is in, while the rest flows.
        let mut cut = false;
        expect_in_order_and(&mut inbox, BusId(2), 200_000..300_000, msg, |next| {
            if next >= 210_000 && !std::mem::replace(&mut cut, true) {
                assert!(b.disconnect(BusId(1)), "{transport}: a link to cut");
            }
        })
        .await;
        sender.await.unwrap();
        assert!(b.flush(WAIT).await, "{transport}: all acknowledged");
        nothing_more_from(&b, &mut inbox, BusId(1)).await;
        wait_for_rings(&a, 2).await;
        assert_eq!(a.stats().shm_channels, 2, "{transport}: switched again");
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dropped_its_inbox_acknowledges_and_discards_ring_messages() {
    for (transport, drop_after_switch) in [("shm", true), ("mem", true), ("shm", false)] {
        let what = format!("{transport}, inbox dropped after the switch: {drop_after_switch}");
        let (a, b) = pair(transport, config(1), config(2)).await;
        let mut inbox = a.take_inbox();
        if !drop_after_switch {
            drop(inbox.take());
        }
        wait_for_ring(&a).await;
        // A pure relay: it reads nothing. Dropped after the switch, the inbox held the ring
        // already; the messages fit in the ring, so no writer waits for room.
        drop(inbox);
        stream(&b, BusId(1), 0..10_000).await;
        assert!(b.flush(WAIT).await, "{what}: all acknowledged");
        assert_eq!(a.stats().msgs_in, 10_000, "{what}");
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_dropped_mid_way_loses_no_ring_message() {
    let (a, b) = pair("shm", config(1), config(2)).await;
    let mut inbox = a.take_inbox().unwrap();
    let sender = {
        let b = b.clone();
        tokio::spawn(async move { stream(&b, BusId(1), 0..300_000).await })
    };
    // Every receive gets one poll and is dropped if it did not finish there, as a `select!`
    // or a `timeout` drops it: batches read (and acknowledged) must not go with it.
    let mut next = 0u64;
    let deadline = std::time::Instant::now() + WAIT;
    while next < 300_000 {
        assert!(std::time::Instant::now() < deadline, "stalled at {next}");
        match tokio::time::timeout(Duration::ZERO, inbox.recv_batch()).await {
            Ok(Some(batch)) => {
                for m in batch.iter() {
                    assert_eq!(m, &msg(next)[..], "message {next}");
                    next += 1;
                }
            }
            Ok(None) => panic!("inbox closed at {next}"),
            Err(_) => tokio::task::yield_now().await,
        }
    }
    sender.await.unwrap();
    assert!(a.stats().shm_channels >= 1, "through a ring");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_node_ends_its_inbox_even_while_reading_a_ring() {
    for transport in ["shm", "mem"] {
        let (a, b) = pair(transport, config(1), config(2)).await;
        let mut inbox = a.take_inbox().unwrap();
        wait_for_ring(&a).await;
        stream(&b, BusId(1), 0..1000).await;
        expect(&mut inbox, BusId(2), 0..1000).await;
        // The node goes without a shutdown; its peer stays.
        drop(a);
        let end = tokio::time::timeout(WAIT, inbox.recv()).await;
        assert!(
            matches!(end, Ok(None)),
            "{transport}: the inbox ends, got {end:?}"
        );
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_one_process_take_in_process_channels_by_themselves() {
    let a = start(config(1).listen(listen_addr("tcp4"))).await;
    let b = start(config(2).connect(a.listen_addrs()[0].clone())).await;
    assert!(b.wait_for_peer(a.id(), WAIT).await);
    let mut inbox = a.take_inbox().unwrap();
    stream(&b, BusId(1), 0..100_000).await;
    expect(&mut inbox, BusId(2), 0..100_000).await;
    // The SWITCH may come after the last of these messages on a fast machine.
    wait_for_ring(&a).await;
    wait_for_ring(&b).await;
    assert_eq!((a.stats().mem_channels, a.stats().shm_channels), (1, 0));
    assert_eq!((b.stats().mem_channels, b.stats().shm_channels), (1, 0));
    // A cut link: the next link takes new in-process channels; nothing lost or repeated.
    let sender = {
        let b = b.clone();
        tokio::spawn(async move { stream(&b, BusId(1), 100_000..200_000).await })
    };
    // Cut once part of the stream is in, while the rest flows.
    let mut cut = false;
    expect_in_order_and(&mut inbox, BusId(2), 100_000..200_000, msg, |next| {
        if next >= 110_000 && !std::mem::replace(&mut cut, true) {
            assert!(b.disconnect(BusId(1)), "a link to cut");
        }
    })
    .await;
    sender.await.unwrap();
    assert!(b.flush(WAIT).await, "all acknowledged");
    nothing_more_from(&b, &mut inbox, BusId(1)).await;
    wait_for_rings(&a, 2).await;
    assert_eq!(a.stats().mem_channels, 2, "switched again");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_forbids_shared_memory_stays_on_the_socket() {
    let mut c = config(2);
    c.shm_channels = false;
    let a = start(config(1).listen(listen_addr("unix"))).await;
    let b = start(c.connect(a.listen_addrs()[0].clone())).await;
    assert!(b.wait_for_peer(a.id(), WAIT).await);
    let mut inbox = a.take_inbox().unwrap();
    stream(&b, BusId(1), 0..10_000).await;
    expect(&mut inbox, BusId(2), 0..10_000).await;
    assert_eq!(a.stats().shm_channels + a.stats().mem_channels, 0);
    assert_eq!(b.stats().shm_channels + b.stats().mem_channels, 0);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_dies_mid_stream_leaves_the_writer_a_peer_down_not_a_hang() {
    let a = start(shm_config(1).listen(listen_addr("unix"))).await;
    let mut cb = shm_config(2).connect(a.listen_addrs()[0].clone());
    cb.peer_dead_after_ms = 300;
    cb.dial_backoff_min_ms = 50;
    let b = start(cb).await;
    assert!(b.wait_for_peer(a.id(), WAIT).await);
    let mut events = b.take_events().unwrap();
    let mut inbox = a.take_inbox().unwrap();
    let sender = {
        let b = b.clone();
        tokio::spawn(async move {
            let batch: Vec<Vec<u8>> = (0..1000).map(msg).collect();
            loop {
                if let Err(e) = b.send_batch(BusId(1), &batch).await {
                    return e;
                }
            }
        })
    };
    // Let data flow through the ring, then the reader dies abruptly (no CLOSE).
    let mut got = 0;
    while got < 10_000 {
        got += tokio::time::timeout(WAIT, inbox.recv_batch())
            .await
            .expect("data flows")
            .unwrap()
            .len();
    }
    // 1 reads 2's ring (its SWITCH may trail the first messages, sent on the socket).
    let switched = tokio::time::timeout(WAIT, async {
        while a.stats().shm_channels == 0 {
            let _ = inbox.recv_batch().await;
        }
    })
    .await;
    assert!(switched.is_ok(), "the data moved to shared memory");
    drop(inbox);
    drop(a);
    wait_event(&mut events, |e| match e {
        busway::Event::PeerDown { peer, .. } if *peer == BusId(1) => Some(()),
        _ => None,
    })
    .await;
    wait_event(&mut events, |e| match e {
        busway::Event::Undeliverable { peer, .. } if *peer == BusId(1) => Some(()),
        _ => None,
    })
    .await;
    let err = tokio::time::timeout(WAIT, sender)
        .await
        .expect("the writer does not hang")
        .unwrap();
    assert_eq!(err, busway::SendError::PeerDown(BusId(1)));
    b.shutdown().await;
}

fn shm_name(tag: &str) -> busway::Addr {
    format!("shm://busway-test-{}-{tag}", std::process::id())
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_shm_address_links_two_nodes_through_shared_memory() {
    let addr = shm_name("link");
    let a = start(shm_config(1).listen(addr.clone())).await;
    assert_eq!(a.listen_addrs(), vec![addr.clone()]);
    let taken = Node::start(config(3).listen(addr.clone()))
        .await
        .err()
        .unwrap();
    assert!(
        taken.to_string().contains("taken by another node"),
        "{taken}"
    );
    let b = start(shm_config(2).connect(addr.clone())).await;
    assert!(b.wait_for_peer(a.id(), WAIT).await);
    let mut inbox = a.take_inbox().unwrap();
    stream(&b, BusId(1), 0..50_000).await;
    expect(&mut inbox, BusId(2), 0..50_000).await;
    // The stream may all pass before the rings' handshake ends (a busy machine): the switch
    // is waited for, not assumed done.
    until("both ends moved to shared memory", || {
        a.stats().shm_channels == 1 && b.stats().shm_channels == 1
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_shm_address_refuses_a_peer_that_cannot_share_memory() {
    let addr = shm_name("refuse");
    let a = start(config(1).listen(addr.clone())).await;
    let mut c = config(2).connect(addr);
    c.shm_channels = false;
    let b = start(c).await;
    let mut events = b.take_events().unwrap();
    let reason = wait_event(&mut events, |e| match e {
        busway::Event::Rejected { reason, .. } => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert!(
        reason.contains("only through shared memory") && reason.contains("turned off"),
        "{reason}"
    );
    assert!(
        a.peers().is_empty() && b.peers().is_empty(),
        "no link came up"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_close_carries_the_last_acknowledgement_every_time() {
    // The README's pair on one host: the receiver reads everything and shuts down at once; the
    // sender's flush must not wait for a peer that is gone (its ring messages are acknowledged
    // on a timer, and the close used to leave before it fired).
    for (round, transport) in ["tcp4", "unix"].iter().cycle().take(20).enumerate() {
        let (a, b) = shm_pair(transport).await;
        let mut inbox = a.take_inbox().unwrap();
        stream(&b, BusId(1), 0..20_000).await;
        expect(&mut inbox, BusId(2), 0..20_000).await;
        drop(inbox);
        a.shutdown().await;
        assert!(
            b.flush(Duration::from_secs(2)).await,
            "round {round} over {transport}: the closed peer acknowledged all it read: {:?}",
            b.peers()
        );
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_sends_over_a_ring_are_published_in_bursts_in_order_and_none_waits_for_good() {
    for mem in [false, true] {
        let (a, b) = if mem {
            pair("mem", config(1), config(2)).await
        } else {
            shm_pair("unix").await
        };
        let mut inbox = a.take_inbox().unwrap();
        let mut b_inbox = b.take_inbox().unwrap();
        // Single sends, try_send, and batches mixed: one numbering, in order.
        let mut next = 0u64;
        for round in 0..50u64 {
            for _ in 0..2_000 {
                b.send(a.id(), bytes::Bytes::from(msg(next))).await.unwrap();
                next += 1;
            }
            loop {
                match b.try_send(a.id(), bytes::Bytes::from(msg(next))) {
                    Ok(_) => break,
                    Err(busway::SendError::Full(_)) => tokio::task::yield_now().await,
                    Err(e) => panic!("{e}"),
                }
            }
            next += 1;
            let batch: Vec<Vec<u8>> = (next..next + round).map(msg).collect();
            b.send_batch(a.id(), &batch).await.unwrap();
            next += round;
        }
        expect(&mut inbox, b.id(), 0..next).await;
        // A lone single send with nothing after it arrives: the sender's next look at its own
        // inbox publishes it (its link's writer would too).
        b.send(a.id(), bytes::Bytes::from(msg(next))).await.unwrap();
        assert!(b_inbox.try_recv_batch().is_none());
        expect(&mut inbox, b.id(), next..next + 1).await;
        // And with no look at all, the link's writer publishes it.
        b.send(a.id(), bytes::Bytes::from(msg(next + 1)))
            .await
            .unwrap();
        expect(&mut inbox, b.id(), next + 1..next + 2).await;
        assert!(b.stats().shm_channels + b.stats().mem_channels > 0);
        b.shutdown().await;
        a.shutdown().await;
    }
}
