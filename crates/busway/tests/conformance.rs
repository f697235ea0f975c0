//! The contract every transport keeps, run against each of them (tcp4, tcp6, unix): the same
//! node-level behaviour whatever carries the bytes.

mod common;

use busway::{BusId, DownReason, Event, Node, Path, SendError};
use bytes::Bytes;
use common::*;

async fn for_each_transport<F, Fut>(test: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for t in transports() {
        tokio::time::timeout(WAIT * 3, test(t))
            .await
            .unwrap_or_else(|_| panic!("{t}: test timed out"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_arrive_in_order_both_ways_with_their_source() {
    for_each_transport(|t| async move {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut ia = a.take_inbox().unwrap();
        let mut ib = b.take_inbox().unwrap();
        let n = 20_000u32;
        for i in 0..n {
            b.send(BusId(1), Bytes::from(i.to_le_bytes().to_vec()))
                .await
                .unwrap();
        }
        let batch: Vec<Vec<u8>> = (0..n).map(|i| i.to_le_bytes().to_vec()).collect();
        a.send_batch(BusId(2), &batch).await.unwrap();
        for i in 0..n {
            let m = next_message(&mut ia).await;
            assert_eq!(m.src, BusId(2), "{t}");
            assert_eq!(m.payload.as_ref(), &i.to_le_bytes(), "{t}: message {i}");
        }
        let mut next = 0u32;
        while next < n {
            let batch = next_batch(&mut ib).await;
            assert_eq!(batch.src(), BusId(1));
            for p in batch.iter() {
                assert_eq!(p, &next.to_le_bytes(), "{t}");
                next += 1;
            }
        }
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_empty_payloads_arrive_whole() {
    for_each_transport(|t| async move {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut ia = a.take_inbox().unwrap();
        let sizes = [0usize, 1, 2048, 2049, 65_535, 65_536, 1 << 20, 4 << 20];
        for (i, &n) in sizes.iter().enumerate() {
            b.send(BusId(1), Bytes::from(vec![i as u8; n]))
                .await
                .unwrap();
        }
        for (i, &n) in sizes.iter().enumerate() {
            let m = next_message(&mut ia).await;
            assert_eq!(m.payload.len(), n, "{t}");
            assert!(m.payload.iter().all(|&x| x == i as u8), "{t}");
        }
        let too_big = Bytes::from(vec![0u8; (4 << 20) + 1]);
        assert!(matches!(
            b.send(BusId(1), too_big).await,
            Err(SendError::TooLarge { .. })
        ));
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_shuts_down_is_given_up_on_at_once() {
    for_each_transport(|t| async move {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut ea = a.take_events().unwrap();
        b.shutdown().await;
        let reason = wait_event(&mut ea, |e| match e {
            Event::PeerDown { peer, reason, .. } if *peer == BusId(2) => Some(reason.clone()),
            _ => None,
        })
        .await;
        assert_eq!(reason, DownReason::PeerShutDown, "{t}");
        // Not held for the default 30 s: that incarnation will not come back.
        until("sends to the peer that shut down fail", || {
            a.try_send(BusId(2), Bytes::from_static(b"x")) == Err(SendError::PeerDown(BusId(2)))
        })
        .await;
        a.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_connection_ends_without_close_is_held_for_until_the_deadline() {
    let mut ca = config(1);
    ca.peer_dead_after_ms = 300;
    let a = start(ca.listen(listen_addr("tcp4"))).await;
    let mut ea = a.take_events().unwrap();
    let busway::Addr::Tcp(addr) = a.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let s = authenticated(addr, 2, None).await;
    assert!(a.wait_for_peer(BusId(2), WAIT).await);
    drop(s);
    let reason = wait_event(&mut ea, |e| match e {
        Event::PeerDown { peer, reason, .. } if *peer == BusId(2) => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert!(matches!(reason, DownReason::ClosedByPeer(_)), "{reason}");
    // Held for the peer while it may come back...
    assert_eq!(a.try_send(BusId(2), Bytes::from_static(b"x")), Ok(0));
    let info = &a.peers()[0];
    assert_eq!((info.up, info.unacked_msgs), (false, 1));
    // ...and reported, by number, when it stays away past the deadline.
    let (seqs, why, path, incarnation) = wait_event(&mut ea, |e| match e {
        Event::Undeliverable {
            peer,
            seqs,
            reason,
            path,
            incarnation,
        } if *peer == BusId(2) => Some((seqs.clone(), reason.clone(), *path, *incarnation)),
        _ => None,
    })
    .await;
    assert_eq!(seqs, 0..1);
    // The hand-made peer's incarnation is its id (see `common::authenticated`).
    assert_eq!((path, incarnation), (Path::Direct, Some(2)));
    assert!(why.contains("stayed down for 300 ms"), "{why}");
    assert_eq!(
        a.try_send(BusId(2), Bytes::from_static(b"y")),
        Err(SendError::PeerDown(BusId(2)))
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_is_refused_and_the_right_one_admitted() {
    for_each_transport(|t| async move {
        let secret = |s: &str| busway::Secret::new(s).unwrap();
        let a = start(
            config(1)
                .secret(secret("right-secret-0123456789"))
                .listen(listen_addr(t)),
        )
        .await;
        let mut ea = a.take_events().unwrap();
        let addr = a.listen_addrs()[0].clone();
        let bad = start(
            config(2)
                .secret(secret("wrong-secret-0123456789"))
                .connect(addr.clone()),
        )
        .await;
        let reason = wait_event(&mut ea, |e| match e {
            Event::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .await;
        assert!(reason.contains("authentication failed"), "{t}: {reason}");
        assert!(a.stats().auth_failures >= 1);
        assert!(a.peers().is_empty());
        bad.shutdown().await;
        let good = start(
            config(3)
                .secret(secret("right-secret-0123456789"))
                .connect(addr),
        )
        .await;
        assert!(a.wait_for_peer(BusId(3), WAIT).await, "{t}");
        good.shutdown().await;
        a.shutdown().await;
    })
    .await;
}

/// Node 1 listening and node 2 dialing it over `t`, with the smallest queues that hold one
/// largest frame (2's send queue, 1's inbox): they fill after a few messages.
async fn small_queues(t: &'static str) -> (Node, Node) {
    let mut cb = config(2);
    cb.frame_body_max = busway::limits::FRAME_BODY_MIN_BYTES;
    cb.send_queue_bytes_max = 2 * cb.frame_body_max;
    let mut ca = config(1);
    ca.frame_body_max = busway::limits::FRAME_BODY_MIN_BYTES;
    ca.inbox_bytes_max = ca.frame_body_max;
    pair(t, ca, cb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_send_reports_full_and_send_waits_for_room() {
    for_each_transport(|t| async move {
        let (a, b) = small_queues(t).await;
        let mut ia = a.take_inbox().unwrap();
        // Nobody reads: the inbox, the sockets and then the queue fill up.
        let payload = Bytes::from(vec![1u8; 16 << 10]);
        let mut sent = 0u64;
        loop {
            match b.try_send(BusId(1), payload.clone()) {
                Ok(seq) => {
                    assert_eq!(seq, sent, "{t}: numbers follow the send order");
                    sent += 1;
                }
                Err(SendError::Full(id)) => {
                    assert_eq!(id, BusId(1));
                    break;
                }
                Err(e) => panic!("{t}: {e}"),
            }
            if sent % 64 == 0 {
                tokio::task::yield_now().await;
            }
            assert!(sent < 1_000_000, "{t}: the queue never filled");
        }
        // A waiting send completes once the application reads.
        let b2 = b.clone();
        let p2 = payload.clone();
        let waiter = tokio::spawn(async move { b2.send(BusId(1), p2).await });
        for _ in 0..=sent {
            next_message(&mut ia).await;
        }
        waiter.await.unwrap().unwrap();
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

/// `try_send_batch` (what the C ABI and Python send with: the caller's bytes copied straight into
/// the link's buffer) queues copies in order and numbers them as sends do, queues as many as fit
/// when the queue fills, says `Full` when none fit, and delivers to the node itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_send_batch_queues_copies_in_order_then_says_full() {
    for_each_transport(|t| async move {
        let (a, b) = small_queues(t).await;
        let mut ia = a.take_inbox().unwrap();
        let first = b.try_send_batch(BusId(1), &[&b"one"[..], b"two"]).unwrap();
        assert_eq!(first, 0..2, "{t}");
        assert_eq!(
            b.try_send(BusId(1), Bytes::from_static(b"three")).unwrap(),
            2
        );
        for want in [&b"one"[..], b"two", b"three"] {
            assert_eq!(&next_message(&mut ia).await.payload[..], want, "{t}");
        }
        // Nobody reads now: a batch larger than the room is cut where the queue fills.
        let big = vec![7u8; 16 << 10];
        let mut queued = 3u64;
        loop {
            match b.try_send_batch(BusId(1), &[&big[..]; 8]) {
                Ok(seqs) => {
                    assert_eq!(seqs.start, queued, "{t}: numbers follow on");
                    assert!(
                        !seqs.is_empty() && seqs.end - seqs.start <= 8,
                        "{t}: {seqs:?}"
                    );
                    queued = seqs.end;
                }
                Err(SendError::Full(id)) => {
                    assert_eq!(id, BusId(1), "{t}");
                    break;
                }
                Err(e) => panic!("{t}: {e}"),
            }
            tokio::task::yield_now().await;
            assert!(queued < 1_000_000, "{t}: the queue never filled");
        }
        for i in 3..queued {
            assert_eq!(
                next_message(&mut ia).await.payload.len(),
                big.len(),
                "{t}: message {i}"
            );
        }
        // Too large is refused before anything is queued; to itself it goes to the inbox.
        let huge = vec![0u8; busway::limits::FRAME_BODY_MIN_BYTES + 1];
        assert!(matches!(
            b.try_send_batch(BusId(1), &[&b"x"[..], &huge[..]]),
            Err(SendError::TooLarge { .. })
        ));
        let to_self = a.try_send_batch(BusId(1), &[&b"me"[..]]).unwrap();
        assert_eq!(to_self.end - to_self.start, 1, "{t}");
        assert_eq!(&next_message(&mut ia).await.payload[..], b"me", "{t}");
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_incarnation_of_a_connected_id_is_reported_not_swapped_in() {
    for_each_transport(|t| async move {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut ea = a.take_events().unwrap();
        let twin = start(config(2).connect(a.listen_addrs()[0].clone())).await;
        let reason = wait_event(&mut ea, |e| match e {
            Event::Rejected { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .await;
        assert!(reason.contains("another incarnation"), "{t}: {reason}");
        let up = a.peers();
        assert_eq!(up.len(), 1);
        assert_eq!(
            up[0].incarnation,
            b.incarnation(),
            "{t}: the first link stays"
        );
        twin.shutdown().await;
        a.shutdown().await;
        b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_fail_fast_and_self_sends_are_delivered() {
    let a = start(config(1).listen(listen_addr("tcp4"))).await;
    let mut ia = a.take_inbox().unwrap();
    assert_eq!(
        a.try_send(BusId(99), Bytes::new()),
        Err(SendError::NoRoute(BusId(99)))
    );
    assert_eq!(
        a.send(BusId(99), Bytes::new()).await,
        Err(SendError::NoRoute(BusId(99)))
    );
    a.send(BusId(1), Bytes::from_static(b"me")).await.unwrap();
    let m = next_message(&mut ia).await;
    assert_eq!((m.src, m.payload.as_ref()), (BusId(1), &b"me"[..]));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialer_keeps_retrying_until_the_listener_appears() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let b = start(config(2).connect(format!("tcp://{addr}").parse().unwrap())).await;
    let mut eb = b.take_events().unwrap();
    wait_event(&mut eb, |e| {
        matches!(e, Event::DialFailed { .. }).then_some(())
    })
    .await;
    let a = start(config(1).listen(format!("tcp://{addr}").parse().unwrap())).await;
    assert!(b.wait_for_peer(BusId(1), WAIT).await);
    a.shutdown().await;
    b.shutdown().await;
}

// The one send path (`route::outgoing`: `try_enqueue`, `enqueue`) and the one receive
// dispatcher (`node::dispatch`) over a socket, a ring and a relay: `try_send`, `send`,
// `send_batch`, a call and its reply go the same way, numbered one after another in the
// pair's sequence, sorted the same way on arrival (plain messages and the request to the
// inbox, the reply to its call) and delivered in that order.

/// A and B linked over `way`: "tcp4" (a socket), "shm" (a ring), or "relay" (both below a
/// hub that does not hint them to each other).
async fn linked(way: &str) -> (Node, Node, Vec<Node>) {
    if way != "relay" {
        let (a, b) = pair(way, config(1), config(2)).await;
        return (a, b, Vec::new());
    }
    let hub = start(config(100).listen(listen_addr("tcp4"))).await;
    let below = |id| {
        let mut c = config(id).upstream(hub.listen_addrs()[0].clone());
        c.direct_links = false;
        c
    };
    let a = start(below(1)).await;
    let b = start(below(2)).await;
    for id in [1, 2] {
        assert!(hub.wait_for_peer(BusId(id), WAIT).await);
    }
    for n in [&a, &b] {
        assert!(n.wait_for_peer(BusId(100), WAIT).await);
    }
    (a, b, vec![hub])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_send_takes_the_same_path_in_one_numbering() {
    for way in ["tcp4", "shm", "relay"] {
        let (a, b, others) = linked(way).await;
        let mut inbox = b.take_inbox().unwrap();
        // The caller reads its inbox, as an application does: over a ring, replies come in it.
        let mut caller_inbox = a.take_inbox().unwrap();
        let reader = tokio::spawn(async move { while caller_inbox.recv().await.is_some() {} });
        let first = a
            .try_send(BusId(2), Bytes::from_static(b"try_send"))
            .unwrap();
        let second = a.send(BusId(2), Bytes::from_static(b"send")).await.unwrap();
        let batch = a
            .send_batch(BusId(2), &[b"batch 0", b"batch 1", b"batch 2"])
            .await
            .unwrap();
        assert_eq!(second, first + 1, "{way}");
        assert_eq!(batch, first + 2..first + 5, "{way}");
        let call = {
            let a = a.clone();
            tokio::spawn(async move { a.call(BusId(2), Bytes::from_static(b"ask"), WAIT).await })
        };
        for expected in [
            &b"try_send"[..],
            b"send",
            b"batch 0",
            b"batch 1",
            b"batch 2",
        ] {
            let m = next_message(&mut inbox).await;
            assert_eq!((m.src, &m.payload[..]), (BusId(1), expected), "{way}");
        }
        let request = next_message(&mut inbox).await;
        assert_eq!(
            &request.payload[..],
            b"ask",
            "{way}: the call comes after, in order"
        );
        request.reply(Bytes::from_static(b"answer")).await.unwrap();
        let reply = call.await.unwrap().unwrap();
        assert_eq!(&reply.payload[..], b"answer", "{way}");
        let path = a.peers().iter().any(|p| p.id == BusId(2));
        assert_eq!(path, way != "relay", "{way}: direct only where linked");
        assert!(a.flush(WAIT).await, "{way}: everything acknowledged");
        let relayed = a.relayed_peers();
        if way == "relay" {
            assert_eq!(relayed.len(), 1, "{way}: B is reached through the hub");
            assert_eq!(relayed[0].unacked_msgs, 0);
        }
        for n in [a, b].into_iter().chain(others) {
            n.shutdown().await;
        }
        reader.abort();
    }
}
