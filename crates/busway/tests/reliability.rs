//! Nothing is lost or repeated across dropped links: the outbox writes again what the peer
//! lacks, and the peer's numbering drops nothing and delivers nothing twice.

mod common;

use busway::limits::{
    DEFAULT_HEARTBEAT_INTERVAL_MS, DEFAULT_PEER_DEAD_AFTER_MS, HEARTBEAT_MISSES_MAX,
};
use busway::{BusId, Event, IoThreads, Rejection};
use bytes::Bytes;
use common::*;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Messages in the stream; each carries its number in its first 8 bytes.
const MESSAGES: u64 = 300_000;
/// Times the link is cut while the stream runs.
const CUTS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_a_thousand_times_loses_and_repeats_nothing() {
    let mut ca = config(1);
    ca.heartbeat_interval_ms = 60_000;
    let mut cb = config(2);
    cb.dial_backoff_min_ms = 0;
    let (a, b) = pair("tcp4", ca, cb).await;
    let mut inbox = a.take_inbox().unwrap();

    // Progress of the sender and the cutter, shown if the stream stalls.
    let sent = Arc::new(AtomicU64::new(0));
    let cut = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (b, sent) = (b.clone(), sent.clone());
        tokio::spawn(async move {
            let mut next = 0u64;
            while next < MESSAGES {
                let batch: Vec<Vec<u8>> = (next..(next + 100).min(MESSAGES))
                    .map(|i| {
                        let mut m = i.to_le_bytes().to_vec();
                        m.resize(8 + (i % 120) as usize, 0xAB);
                        m
                    })
                    .collect();
                let seqs = b.send_batch(BusId(1), &batch).await.unwrap();
                assert_eq!(seqs, next..next + batch.len() as u64);
                next = seqs.end;
                sent.store(next, Relaxed);
                if next % 1000 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let cutter = {
        let (a, b, cut) = (a.clone(), b.clone(), cut.clone());
        tokio::spawn(async move {
            let mut cuts = 0;
            while cuts < CUTS {
                cut.store(cuts, Relaxed);
                // Cut from either end, after a varying little while of traffic.
                let node = if cuts % 2 == 0 { &a } else { &b };
                let peer = if cuts % 2 == 0 { BusId(2) } else { BusId(1) };
                tokio::time::sleep(Duration::from_micros(50 * (cuts % 7) as u64)).await;
                if node.disconnect(peer) {
                    cuts += 1;
                }
                assert!(
                    b.wait_for_peer(BusId(1), WAIT).await,
                    "link back after cut {cuts}"
                );
                assert!(
                    a.wait_for_peer(BusId(2), WAIT).await,
                    "link back after cut {cuts}"
                );
            }
            cuts
        })
    };

    let mut expected = 0u64;
    let received = tokio::time::timeout(Duration::from_secs(120), async {
        while expected < MESSAGES {
            let batch = inbox.recv_batch().await.unwrap();
            for p in batch.iter() {
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                assert_eq!(seq, expected, "message {expected}: got {seq}");
                assert_eq!(p.len(), 8 + (seq % 120) as usize);
                expected += 1;
            }
        }
    })
    .await;
    assert!(
        received.is_ok(),
        "stream stalled at {expected}: sent {}, cuts {}; receiver {:?} {:?}; sender {:?} {:?}",
        sent.load(Relaxed),
        cut.load(Relaxed),
        a.stats(),
        a.peers(),
        b.stats(),
        b.peers()
    );
    let cuts = cutter.await.unwrap();
    sender.await.unwrap();
    assert_eq!(cuts, CUTS);
    // Nothing more arrives: no duplicate after the last message.
    nothing_more_from(&b, &mut inbox, BusId(1)).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// In virtual time: the node's tasks run on the test's runtime, whose clock is paused and
/// moves only to the next timer when nothing else is to do. The default heartbeat is
/// measured exactly, in no real time, however busy the machine.
#[tokio::test(start_paused = true)]
async fn a_silent_peer_is_declared_down_within_three_heartbeats() {
    let a = start(
        config(1)
            .io_threads(IoThreads::Current)
            .listen(listen_addr("tcp4")),
    )
    .await;
    let mut ea = a.take_events().unwrap();
    let busway::Addr::Tcp(addr) = a.listen_addrs()[0] else {
        unreachable!()
    };
    // A real peer that completes the handshake, then answers nothing.
    let _silent = authenticated(addr, 9, None).await;
    let started = tokio::time::Instant::now();
    let reason = wait_event(&mut ea, |e| match e {
        Event::PeerDown { peer, reason, .. } if *peer == BusId(9) => Some(reason.clone()),
        _ => None,
    })
    .await;
    let elapsed = started.elapsed();
    let interval = Duration::from_millis(DEFAULT_HEARTBEAT_INTERVAL_MS);
    assert!(
        reason.to_string().contains(&format!(
            "3 heartbeat intervals of {DEFAULT_HEARTBEAT_INTERVAL_MS} ms"
        )),
        "{reason}"
    );
    // Down once three intervals passed without a frame from the peer (it last spoke in the
    // handshake), checked on the interval: never before the second, never after the fourth.
    let misses = HEARTBEAT_MISSES_MAX as u32;
    assert!(
        elapsed >= interval * (misses - 1) && elapsed <= interval * (misses + 1),
        "declared down after {elapsed:?} of virtual time"
    );
    assert!(a.stats().heartbeat_timeouts >= 1);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_are_measured() {
    let mut ca = config(1);
    ca.heartbeat_interval_ms = 20;
    let (a, b) = pair("tcp4", ca, config(2)).await;
    let measured = tokio::time::timeout(WAIT, async {
        loop {
            if a.peers()[0].rtt_us > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(measured.is_ok(), "an RTT within the wait");
    a.shutdown().await;
    b.shutdown().await;
}

/// The sender's outbox in `a_receiver_killed_for_good_...`: small, but holding one largest frame.
const OUTBOX_BYTES: usize = 2 << 20;

/// In virtual time, with the default deadline (`peer_dead_after_ms`, 30 s).
#[tokio::test(start_paused = true)]
async fn a_receiver_killed_for_good_gets_exactly_the_unacknowledged_messages_reported() {
    let mut ca = virtual_config(1);
    ca.send_queue_bytes_max = OUTBOX_BYTES;
    ca.frame_body_max = busway::limits::FRAME_BODY_MIN_BYTES;
    let (a, b) = pair("tcp4", ca, virtual_config(2)).await;
    let mut ea = a.take_events().unwrap();
    let mut ib = b.take_inbox().unwrap();
    // Some messages get through and are read...
    for i in 0..1000u64 {
        a.send(BusId(2), bytes::Bytes::from(i.to_le_bytes().to_vec()))
            .await
            .unwrap();
    }
    let mut read = 0u64;
    while read < 1000 {
        read += next_batch(&mut ib).await.len() as u64;
    }
    // ...then the receiver dies at once (its loops stop; nothing is closed cleanly).
    drop(ib);
    drop(b);
    let died = tokio::time::Instant::now();
    // The sender keeps sending: its memory stays bounded (Full), nothing blocks.
    let mut sent = 1000u64;
    let full = tokio::time::timeout(WAIT, async {
        loop {
            match a.try_send(BusId(2), bytes::Bytes::from(vec![0u8; 100])) {
                Ok(seq) => {
                    assert_eq!(seq, sent);
                    sent += 1;
                }
                Err(busway::SendError::Full(_)) => return,
                Err(busway::SendError::PeerDown(_)) => return,
                Err(e) => panic!("{e}"),
            }
            if sent % 256 == 0 {
                tokio::task::yield_now().await;
            }
        }
    })
    .await;
    assert!(
        full.is_ok(),
        "the outbox filled up or the peer was declared dead"
    );
    assert!(
        sent - 1000 <= OUTBOX_BYTES as u64 / 100,
        "bounded by the outbox limit: {sent}"
    );
    let deadline = Duration::from_millis(DEFAULT_PEER_DEAD_AFTER_MS);
    let seqs = tokio::time::timeout(2 * deadline, async {
        loop {
            if let Event::Undeliverable {
                peer: BusId(2),
                seqs,
                ..
            } = ea.recv().await.expect("events open")
            {
                return seqs;
            }
        }
    })
    .await
    .expect("reported within twice the deadline");
    let waited = died.elapsed();
    assert!(
        waited >= deadline && waited <= deadline + WAIT,
        "reported {waited:?} after the receiver died, not past its deadline of {deadline:?}"
    );
    // Exactly what was not acknowledged: everything after what the receiver acknowledged
    // (at most the 1000 it read), up to the last message accepted.
    assert_eq!(seqs.end, sent);
    assert!(seqs.start <= 1000, "{seqs:?}");
    assert_eq!(
        a.peers()[0].unacked_msgs,
        0,
        "nothing is held after the report"
    );
    a.shutdown().await;
}

/// A message to this node itself that finds the node's own inbox full (defaults: the
/// application took nothing) says so, naming the inbox, not a send queue; `try_send` and a
/// call fail at once, nothing else is lost, and room taken lets them through again.
#[tokio::test]
async fn a_full_inbox_refuses_a_message_to_oneself_by_name() {
    let node = start(config(1)).await;
    let me = node.id();
    let big = Bytes::from(vec![7u8; 1 << 20]);
    let mut sent = 0;
    let err = loop {
        match node.try_send(me, big.clone()) {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent <= 64, "a 32 MiB inbox took {sent} MiB");
    };
    assert_eq!(err, busway::SendError::InboxFull(me));
    assert_eq!(err.kind(), busway::ErrorKind::Full);
    let text = err.to_string();
    assert!(text.contains("its own inbox is full"), "{text}");
    assert!(!text.contains("send queue"), "{text}");
    let call = node.call(me, Bytes::from_static(b"?"), WAIT).await;
    match call {
        Err(busway::CallError::Send(busway::SendError::InboxFull(id))) => assert_eq!(id, me),
        other => panic!("a call to itself with its inbox full: {other:?}"),
    }
    let mut inbox = node.take_inbox().unwrap();
    for _ in 0..sent {
        assert_eq!(next_message(&mut inbox).await.payload.len(), big.len());
    }
    assert_eq!(node.try_send(me, big).unwrap(), sent);
    node.shutdown().await;
}

/// A message to this node's own id is numbered in its own sequence from 0, as a message to a
/// peer is in that pair's: `send`, `try_send` and `send_batch` go on from each other.
#[tokio::test]
async fn messages_to_oneself_are_numbered_as_messages_to_a_peer() {
    let node = start(config(1)).await;
    let mut inbox = node.take_inbox().unwrap();
    let me = node.id();
    assert_eq!(node.send(me, Bytes::from_static(b"a")).await.unwrap(), 0);
    assert_eq!(node.try_send(me, Bytes::from_static(b"b")).unwrap(), 1);
    let batch = node.send_batch(me, &[&b"c"[..], b"d"]).await.unwrap();
    assert_eq!(batch, 2..4);
    assert_eq!(node.send(me, Bytes::from_static(b"e")).await.unwrap(), 4);
    for want in [b"a", b"b", b"c", b"d", b"e"] {
        let m = next_message(&mut inbox).await;
        assert_eq!((m.src, &m.payload[..]), (me, &want[..]));
    }
    node.shutdown().await;
}

/// A node whose bus id is already connected at its upstream is refused there in the
/// handshake and told why (`Event::Rejected` once per try; never up, so no `PeerUp`); it
/// redials with its growing backoff (its link came up and was closed at once before, which
/// reset the backoff: ~17 tries a second for ever, issue #28), and the first holder of the id
/// keeps its link. In virtual time: the count of tries in 3 s is the backoff's, however busy
/// the machine.
#[tokio::test(start_paused = true)]
async fn a_second_node_with_an_id_in_use_is_refused_with_backoff() {
    let relay = start(virtual_config(100).listen(listen_addr("tcp4"))).await;
    let addr = relay.listen_addrs()[0].clone();
    let first = start(virtual_config(2).upstream(addr.clone())).await;
    assert!(first.wait_for_peer(BusId(100), WAIT).await);
    let holder = first.incarnation();
    let second = start(virtual_config(2).upstream(addr)).await;
    let mut events = second.take_events().unwrap();
    let window = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut refusals = 0;
    while let Ok(Some(ev)) = tokio::time::timeout_at(window, events.recv()).await {
        match ev {
            Event::Rejected { reason, kind, .. } => {
                assert!(reason.contains("already connected"), "{reason}");
                assert_eq!(kind, Rejection::IdInUse, "{reason}");
                refusals += 1;
            }
            Event::PeerUp { .. } | Event::PeerDown { .. } => panic!("{ev:?}: never up"),
            _ => {}
        }
    }
    // 50 ms doubling, with up to a quarter of jitter: 5 or 6 tries in 3 s.
    assert!((3..=8).contains(&refusals), "{refusals} refusals in 3 s");
    let at_relay = relay.peers().into_iter().find(|p| p.id == BusId(2));
    assert_eq!(
        at_relay.map(|p| p.incarnation),
        Some(holder),
        "the first holder kept id 2"
    );
    for n in [second, first, relay] {
        n.shutdown().await;
    }
}
