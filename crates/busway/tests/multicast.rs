//! Multicast (`Node::multicast`): each receiver gets the source's multicasts once and in
//! order over every transport, through one and two levels of relays that split the list,
//! across relays killed mid-stream; one frame per link; a bad call gets a clear error; false
//! MULTICAST frames close only the link that sent them.

mod common;

use busway::{BusId, Event, Inbox, MulticastError, Node};
use bytes::Bytes;
use common::*;

fn numbered(i: u64) -> Bytes {
    Bytes::from(i.to_le_bytes().to_vec())
}

/// Receives multicasts 0..n of `source`, in order, each once, as plain messages.
async fn expect_multicasts(inbox: &mut Inbox, source: BusId, n: u64, what: &str) {
    let mut next = 0;
    while next < n {
        let batch = tokio::time::timeout(std::time::Duration::from_secs(30), inbox.recv_batch())
            .await
            .unwrap_or_else(|_| panic!("{what}: stalled at {next}"))
            .expect("inbox open");
        assert_eq!(
            (batch.group(), batch.src()),
            (None, source),
            "{what}: a message from the source"
        );
        for p in batch.iter() {
            assert_eq!(p, &next.to_le_bytes()[..], "{what}: in order, each once");
            next += 1;
        }
    }
}

/// A node registered below the relay at `addr`, with no direct links of its own.
async fn below(id: u64, addr: &busway::Addr) -> Node {
    let mut c = config(id).upstream(addr.clone());
    c.direct_links = false;
    start(c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multicasts_reach_each_receiver_over_every_transport_once_in_order() {
    for t in transports() {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut inbox = b.take_inbox().unwrap();
        let mut own = a.take_inbox().unwrap();
        for i in 0..1_000 {
            // The peer, and the source itself; a duplicate counts once.
            let to = [BusId(2), BusId(1), BusId(2)];
            assert_eq!(a.multicast(&to, numbered(i)).await.unwrap(), 2, "over {t}");
        }
        expect_multicasts(&mut inbox, BusId(1), 1_000, t).await;
        expect_multicasts(&mut own, BusId(1), 1_000, t).await;
        // Nothing twice: the next message from the source is a plain one.
        nothing_more_from(&a, &mut inbox, BusId(2)).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_split_the_list_one_frame_per_link_two_levels_deep() {
    // top (100) <- mid (101) <- deep receiver 104; receivers 2 and 3 and a bystander 5 below
    // top; the source 1 below top too.
    let top = start(config(100).listen(listen_addr("tcp4"))).await;
    let top_addr = top.listen_addrs()[0].clone();
    let mut mid_config = config(101).upstream(top_addr.clone());
    mid_config.direct_links = false;
    mid_config.subtree = Some((BusId(101), BusId(199)));
    let mid = start(mid_config.listen(listen_addr("tcp4"))).await;
    let mid_addr = mid.listen_addrs()[0].clone();
    let source = below(1, &top_addr).await;
    let (r2, r3, bystander) = (
        below(2, &top_addr).await,
        below(3, &top_addr).await,
        below(5, &top_addr).await,
    );
    let deep = below(104, &mid_addr).await;
    assert!(mid.wait_for_peer(BusId(104), WAIT).await);
    for id in [1, 2, 3, 5, 101] {
        assert!(top.wait_for_peer(BusId(id), WAIT).await);
    }
    // The source's own side of its link too: its byte count is read below.
    assert!(source.wait_for_peer(BusId(100), WAIT).await);
    let mut inboxes: Vec<(Inbox, &str)> = Vec::new();
    for (n, what) in [
        (&r2, "receiver 2"),
        (&r3, "receiver 3"),
        (&deep, "receiver 104"),
    ] {
        inboxes.push((n.take_inbox().unwrap(), what));
    }
    let mut bystander_inbox = bystander.take_inbox().unwrap();
    let n = 2_000u64;
    let payload_len = 8u64;
    let to = [BusId(2), BusId(3), BusId(104)];
    let sent_before = source.peers()[0].bytes_sent;
    for i in 0..n {
        // One link, to the top relay, carries all three.
        assert_eq!(source.multicast(&to, numbered(i)).await.unwrap(), 1);
    }
    for (inbox, what) in &mut inboxes {
        expect_multicasts(inbox, BusId(1), n, what).await;
    }
    // One frame per link: the source wrote each multicast once, to the top relay: the
    // payload, the frame's header (8) and the MULTICAST head naming three receivers (20 + 3 ×
    // 16), and a little for acknowledgements and heartbeats; three unicasts would be more
    // than twice that.
    assert_eq!(source.peers().len(), 1);
    let per = (source.peers()[0].bytes_sent - sent_before) / n;
    assert!(
        per <= payload_len + 8 + 20 + 3 * 16 + 8,
        "{per} bytes per multicast on the source's one link"
    );
    // The bystander got none of them: the next thing it reads is a plain message.
    send_and_expect(&source, BusId(5), &mut bystander_inbox, b"only this").await;
    for n in [source, r2, r3, bystander, deep, mid, top] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_no_relay_knows_is_reported_to_the_source_and_the_others_get_it() {
    let top = start(config(100).listen(listen_addr("tcp4"))).await;
    let top_addr = top.listen_addrs()[0].clone();
    let source = below(1, &top_addr).await;
    let r2 = below(2, &top_addr).await;
    for id in [1, 2] {
        assert!(top.wait_for_peer(BusId(id), WAIT).await);
    }
    // The source's own side of its link too: the relay may see it up first, and a multicast
    // over a link not up yet at the source goes to no place now (`multicast` returns 0).
    assert!(source.wait_for_peer(BusId(100), WAIT).await);
    let mut events = source.take_events().unwrap();
    let mut inbox = r2.take_inbox().unwrap();
    // 77 is nowhere: the source routes it up (it has an upstream), the relay knows no way on.
    for i in 0..3 {
        let to = [BusId(2), BusId(77)];
        assert_eq!(source.multicast(&to, numbered(i)).await.unwrap(), 1);
    }
    expect_multicasts(&mut inbox, BusId(1), 3, "receiver 2").await;
    let (receiver, number, relay, reason) = wait_event(&mut events, |e| match e {
        Event::MulticastUnreachable {
            receiver,
            number,
            relay,
            reason,
        } => Some((*receiver, *number, *relay, reason.clone())),
        _ => None,
    })
    .await;
    assert_eq!((receiver, number, relay), (BusId(77), 1, BusId(100)));
    assert!(
        reason.contains("no route at relay 100 for bus id 77"),
        "{reason}"
    );
    // The three, and the marks that follow them (the source cannot know 77 is nowhere).
    assert!(top.stats().multicast_forwards_dropped >= 3);
    for n in [source, r2, top] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_multicast_is_refused_with_the_reason_and_sends_nothing() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let mut inbox = b.take_inbox().unwrap();
    assert_eq!(
        a.multicast(&[], numbered(0)).await,
        Err(MulticastError::NoReceivers)
    );
    let many: Vec<BusId> = (10..10 + 1_025).map(BusId).collect();
    assert_eq!(
        a.multicast(&many, numbered(0)).await,
        Err(MulticastError::TooMany {
            count: 1_025,
            max: 1_024
        })
    );
    let err = a
        .multicast(&[BusId(2), BusId(77)], numbered(0))
        .await
        .unwrap_err();
    assert_eq!(err, MulticastError::NoRoute(vec![BusId(77)]));
    assert!(err.to_string().contains("no route to bus ids 77"), "{err}");
    let huge = Bytes::from(vec![0u8; busway_core::frame::DEFAULT_BODY_LEN_MAX]);
    assert!(matches!(
        a.multicast(&[BusId(2)], huge).await,
        Err(MulticastError::TooLarge { .. })
    ));
    // None of them sent anything to 2: the next message it gets is a plain one.
    send_and_expect(&a, BusId(2), &mut inbox, b"only this").await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_killed_mid_stream_lose_no_multicast() {
    // top (100) <- mid (101) <- deep receiver 104; receiver 2 and the source 1 below top;
    // receiver 3 linked to the source directly over a unix socket (moved to shared memory).
    // The mid relay and the top relay are each killed (dropped: their queues die with them)
    // and started again mid-stream; every receiver must still get every multicast once, in
    // order, with no gap reported: what died with a relay comes back as the source's copies.
    let mut tree = KillTree::start().await;
    let mut receivers = Vec::new();
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let total = 40_000u64;
    for (n, what) in [
        (&tree.r2, "receiver 2"),
        (&tree.r3, "receiver 3"),
        (&tree.deep, "receiver 104"),
    ] {
        let mut inbox = n.take_inbox().unwrap();
        let mut events = n.take_events().unwrap();
        let progress = (what == "receiver 104").then(|| progress.clone());
        receivers.push(tokio::spawn(async move {
            let mut next = 0u64;
            while next < total {
                let batch =
                    tokio::time::timeout(std::time::Duration::from_secs(30), inbox.recv_batch())
                        .await
                        .unwrap_or_else(|_| panic!("{what}: stalled at {next}"))
                        .expect("inbox open");
                assert_eq!((batch.group(), batch.src()), (None, BusId(1)), "{what}");
                for p in batch.iter() {
                    assert_eq!(p, &next.to_le_bytes()[..], "{what}: in order, each once");
                    next += 1;
                }
                if let Some(progress) = &progress {
                    progress.store(next, std::sync::atomic::Ordering::Relaxed);
                }
            }
            while let Ok(Some(e)) =
                tokio::time::timeout(std::time::Duration::ZERO, events.recv()).await
            {
                assert!(!matches!(e, Event::MulticastGap { .. }), "{what}: {e:?}");
            }
        }));
    }
    let sending = {
        let source = tree.source.clone();
        tokio::spawn(async move {
            let to = [BusId(2), BusId(3), BusId(104)];
            for i in 0..total {
                source.multicast(&to, numbered(i)).await.unwrap();
                if i % 200 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        })
    };
    for (step, kill_top) in [(1, false), (2, true), (3, false), (4, true)] {
        until("the deep receiver got further into the stream", || {
            progress.load(std::sync::atomic::Ordering::Relaxed) > step * total / 5
        })
        .await;
        tree.kill_and_restart(kill_top).await;
    }
    sending.await.unwrap();
    for r in receivers {
        tokio::time::timeout(std::time::Duration::from_secs(60), r)
            .await
            .expect("every receiver got the whole stream")
            .unwrap();
    }
    assert!(
        tree.source.stats().group_copies_sent > 0,
        "the relays died with multicasts that the source sent again"
    );
    tree.shutdown().await;
}

mod lies {
    //! MULTICAST frames a peer may not send: a malformed one closes only that peer's link,
    //! with the reason; one that speaks for another source is refused and counted.

    use super::*;
    use busway_core::frame::{frame_bytes, FrameKind};
    use busway_core::multicast::encode_multicast_head;
    use tokio::io::AsyncWriteExt;

    async fn raw_peer(node: &Node, id: u64) -> tokio::net::TcpStream {
        let busway::Addr::Tcp(addr) = node.listen_addrs()[0].clone() else {
            unreachable!()
        };
        let s = authenticated(addr, id, None).await;
        assert!(node.wait_for_peer(BusId(id), WAIT).await);
        s
    }

    fn multicast(source: u64, to: &[(u64, u64)], payload: &[u8]) -> Vec<u8> {
        let list: Vec<(BusId, u64)> = to.iter().map(|&(r, n)| (BusId(r), n)).collect();
        let mut body = encode_multicast_head(BusId(source), 1, false, 16, &list);
        body.extend_from_slice(payload);
        body
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn false_multicasts_close_only_their_link_and_a_forged_source_is_refused() {
        let (node, healthy) = pair("tcp4", config(1), config(2)).await;
        let mut events = node.take_events().unwrap();
        let mut inbox = node.take_inbox().unwrap();

        // A receiver list cut short.
        let mut short = multicast(9, &[(1, 1), (3, 1)], b"");
        short.truncate(short.len() - 4);
        let mut s = raw_peer(&node, 9).await;
        s.write_all(&frame_bytes(FrameKind::Multicast, &short))
            .await
            .unwrap();
        let why = protocol_error_of(&mut events, 9).await;
        drop(s);
        assert!(
            why.contains("MULTICAST names 2 receivers (32 bytes) but only 28 bytes follow"),
            "{why}"
        );

        // No receiver at all.
        let mut none = multicast(10, &[(1, 1)], b"x");
        none[18] = 0;
        let mut s = raw_peer(&node, 10).await;
        s.write_all(&frame_bytes(FrameKind::Multicast, &none))
            .await
            .unwrap();
        let why = protocol_error_of(&mut events, 10).await;
        drop(s);
        assert!(why.contains("MULTICAST names 0 receivers"), "{why}");

        // A multicast inside a ROUTED frame: multicasts go hop by hop only.
        let inner = frame_bytes(FrameKind::Multicast, &multicast(12, &[(1, 1)], b"x"));
        let mut s = raw_peer(&node, 12).await;
        s.write_all(&routed_data(12, 1, &inner)).await.unwrap();
        let why = protocol_error_of(&mut events, 12).await;
        drop(s);
        assert!(why.contains("travel on direct links only"), "{why}");

        // A well-formed multicast from the peer itself is delivered (the checks let true
        // frames through); one that claims another node as its source is refused, counted,
        // and closes its link.
        let mut s = raw_peer(&node, 13).await;
        s.write_all(&frame_bytes(
            FrameKind::Multicast,
            &multicast(13, &[(1, 1)], b"true"),
        ))
        .await
        .unwrap();
        let m = tokio::time::timeout(WAIT, inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((m.src, m.payload.as_ref()), (BusId(13), &b"true"[..]));
        s.write_all(&frame_bytes(
            FrameKind::Multicast,
            &multicast(2, &[(1, 1)], b"forged"),
        ))
        .await
        .unwrap();
        let why = protocol_error_of(&mut events, 13).await;
        assert!(
            why.contains(
                "MULTICAST from bus id 2 on the link to bus id 13 (which registered no subtree): \
                 a peer may not send for others"
            ),
            "{why}"
        );
        assert_eq!(node.stats().multicasts_refused, 1);
        drop(s);

        // A number past the highest a multicast may carry (it would wrap the stream).
        let mut s = raw_peer(&node, 14).await;
        s.write_all(&frame_bytes(
            FrameKind::Multicast,
            &multicast(14, &[(1, u64::MAX)], b"wraps"),
        ))
        .await
        .unwrap();
        let why = protocol_error_of(&mut events, 14).await;
        assert!(why.contains("past the highest number"), "{why}");
        drop(s);

        // The node and its healthy link are untouched: a multicast still arrives, the first
        // from 2 (the forged one was not taken as 2's).
        healthy.multicast(&[BusId(1)], numbered(0)).await.unwrap();
        expect_multicasts(&mut inbox, BusId(2), 1, "after the lies").await;
        assert!(node.stats().protocol_errors >= 5);
        node.shutdown().await;
        healthy.shutdown().await;
    }
}
