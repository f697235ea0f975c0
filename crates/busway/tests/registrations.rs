//! Trees without hand-kept ranges: a relay started with only `upstream` registers its
//! downstreams with its upstream as they come and go, so traffic crosses it both ways; a
//! registration that clashes is refused at the relay that asked, with the reason, and no link
//! closes over it.

mod common;

use busway::{BusId, Event, Node, NodeConfig};
use common::*;
use std::time::Duration;

const TOP: u64 = 100;
const MID: u64 = 200;

/// A node below the relay `above`, its link up.
async fn below(id: u64, above: &Node, tweak: impl FnOnce(&mut NodeConfig)) -> Node {
    let mut c = config(id)
        .listen(listen_addr("tcp4"))
        .upstream(above.listen_addrs()[0].clone());
    tweak(&mut c);
    let n = start(c).await;
    assert!(n.wait_for_peer(above.id(), WAIT).await, "{id} is up");
    n
}

fn msg(i: u64) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.resize(16, 1);
    m
}

/// Sends `count` numbered messages from `from` to `to` at full speed (each waits for room).
fn send_all(from: &Node, to: u64, count: u64) -> tokio::task::JoinHandle<()> {
    let from = from.clone();
    tokio::spawn(async move {
        for i in 0..count {
            from.send(BusId(to), msg(i).into()).await.unwrap();
        }
    })
}

/// No link of `events`' node to `peer` went down so far.
fn no_link_down(events: &mut busway::Events, peer: u64) {
    while let Some(e) = events.try_recv() {
        if let Event::PeerDown {
            peer: p, reason, ..
        } = e
        {
            assert_ne!(p.0, peer, "the link to {peer} went down: {reason}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_with_only_an_upstream_carries_traffic_both_ways_and_no_link_closes() {
    let top = start(config(TOP).listen(listen_addr("tcp4"))).await;
    let mid = below(MID, &top, |_| {}).await;
    let mut mid_events = mid.take_events().unwrap();
    // One member below the middle relay, one below the top: on one host, so their links to
    // the relays move to shared memory (frames and their registration then travel apart).
    let deep = below(31, &mid, |_| {}).await;
    let high = below(5, &top, |_| {}).await;
    let mut deep_inbox = deep.take_inbox().unwrap();
    let mut high_inbox = high.take_inbox().unwrap();
    let count = 20_000;
    let up = send_all(&deep, 5, count);
    let down = send_all(&high, 31, count);
    expect_in_order(&mut high_inbox, BusId(31), 0..count, msg).await;
    expect_in_order(&mut deep_inbox, BusId(5), 0..count, msg).await;
    up.await.unwrap();
    down.await.unwrap();
    // A publisher deep below, a member high above: its publishes go up in its name.
    high.join("scores").unwrap();
    until("the interest reached the deep publisher", || {
        !deep.group_links("scores").is_empty()
    })
    .await;
    for i in 0..1_000u64 {
        deep.publish("scores", msg(i).into()).await.unwrap();
    }
    let mut got = 0u64;
    tokio::time::timeout(WAIT, async {
        while got < 1_000 {
            let b = high_inbox.recv_batch().await.unwrap();
            assert_eq!(b.src(), BusId(31));
            for m in b.iter() {
                assert_eq!(&m[..8], &got.to_le_bytes());
                got += 1;
            }
        }
    })
    .await
    .expect("every publish reached the member above");
    no_link_down(&mut mid_events, TOP);
    let s = top.stats();
    assert_eq!(
        (s.protocol_errors, s.registrations_refused),
        (0, 0),
        "nothing was refused at the top"
    );
    // The member goes away for good and comes back below the top: the middle relay took
    // its range back, so the top's check of the new HELLO finds no clash.
    deep.shutdown().await;
    let moved = below(31, &top, |_| {}).await;
    assert_eq!(moved.upstream_id(), Some(BusId(TOP)));
    no_link_down(&mut mid_events, TOP);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clashing_registration_is_refused_at_the_relay_that_asked_and_no_link_closes() {
    let top = start(config(TOP).listen(listen_addr("tcp4"))).await;
    // Another relay declares 30..=39 in its HELLO: 31 below the middle relay clashes.
    let other = below(300, &top, |c| c.subtree = Some((BusId(30), BusId(39)))).await;
    let mid = below(MID, &top, |_| {}).await;
    let mut mid_events = mid.take_events().unwrap();
    let deep = below(31, &mid, |_| {}).await;
    until("the top refused the clash", || {
        top.stats().registrations_refused >= 1
    })
    .await;
    until("the middle relay heard why", || {
        mid.stats().registrations_refused_upstream >= 1
    })
    .await;
    // Below the middle relay all still works, and nothing of 31 reached the top.
    let sibling = below(32, &mid, |_| {}).await;
    let mut inbox = sibling.take_inbox().unwrap();
    deep.send(BusId(32), bytes::Bytes::from_static(b"next door"))
        .await
        .unwrap();
    let got = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got.payload[..], b"next door");
    deep.send(BusId(5), bytes::Bytes::from_static(b"up there"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    no_link_down(&mut mid_events, TOP);
    assert_eq!(top.stats().protocol_errors, 0, "no lie was seen at the top");
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_registrations_are_answered_refused_and_keep_the_link() {
    use busway_core::frame::{frame_bytes, FrameKind};
    use busway_core::registry::RegisterOp;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let top = start(config(TOP).listen(listen_addr("tcp4"))).await;
    let addr = match &top.listen_addrs()[0] {
        busway::Addr::Tcp(a) => *a,
        other => panic!("{other}"),
    };
    // A plain peer (it declared no range) and a downstream asking for the relay's own id.
    let plain = authenticated(addr, 7, None).await;
    let downstream = authenticated_as(addr, 8, None, |h| {
        h.downstream_of_you = Some((BusId(8), BusId(8)))
    })
    .await;
    let add = |lo, hi| {
        frame_bytes(
            FrameKind::Register,
            &RegisterOp::Add {
                version: 1,
                range: (BusId(lo), BusId(hi)),
            }
            .encode(),
        )
    };
    let cases = [
        (plain, add(40, 49), "not a downstream"),
        (downstream, add(90, 110), "own id 100"),
    ];
    for (mut s, frame, why) in cases {
        s.write_all(&frame).await.unwrap();
        let answer = tokio::time::timeout(WAIT, async {
            let mut dec = busway_core::FrameDecoder::new(1 << 20);
            let mut buf = bytes::BytesMut::new();
            loop {
                while let Some(f) = dec.decode(&mut buf).unwrap() {
                    if f.kind == FrameKind::Register {
                        return RegisterOp::decode(&f.body).unwrap();
                    }
                }
                assert!(s.read_buf(&mut buf).await.unwrap() > 0, "link closed");
            }
        })
        .await
        .expect("an answer");
        let RegisterOp::Answer {
            version: 1,
            refused: Some(text),
        } = answer
        else {
            panic!("{answer:?}")
        };
        assert!(text.contains(why), "{text}");
    }
    assert_eq!(top.stats().registrations_refused, 2);
    assert_eq!(top.stats().protocol_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_pass_up_a_tree_three_relays_deep() {
    let top = start(config(TOP).listen(listen_addr("tcp4"))).await;
    let mid = below(MID, &top, |_| {}).await;
    let low = below(300, &mid, |_| {}).await;
    let mut mid_events = mid.take_events().unwrap();
    let mut low_events = low.take_events().unwrap();
    let deep = below(41, &low, |_| {}).await;
    let high = below(5, &top, |_| {}).await;
    let mut deep_inbox = deep.take_inbox().unwrap();
    let mut high_inbox = high.take_inbox().unwrap();
    let count = 5_000;
    let up = send_all(&deep, 5, count);
    let down = send_all(&high, 41, count);
    expect_in_order(&mut high_inbox, BusId(41), 0..count, msg).await;
    expect_in_order(&mut deep_inbox, BusId(5), 0..count, msg).await;
    up.await.unwrap();
    down.await.unwrap();
    no_link_down(&mut mid_events, TOP);
    no_link_down(&mut low_events, MID);
    for n in [&top, &mid, &low] {
        let s = n.stats();
        assert_eq!((s.protocol_errors, s.registrations_refused), (0, 0));
    }
}

/// Issue #26, item 4: a relay's quota of groups at its upstream grows with the nodes below
/// it, so one downstream that asks for its whole quota leaves room for the others. (Before,
/// the quota was 4,096 per link: the greedy downstream used up the relay's at its upstream,
/// and an honest member below the same relay got none of its group's publishes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_fills_its_group_quota_leaves_room_for_the_others() {
    use busway_core::frame::{frame_bytes, FrameKind};
    use busway_core::group::encode_interest;
    use tokio::io::AsyncWriteExt;
    const GROUPS: usize = 4_096;
    let top = start(config(TOP).listen(listen_addr("tcp4"))).await;
    let mid = below(MID, &top, |_| {}).await;
    let publisher = below(5, &top, |_| {}).await;
    let busway::Addr::Tcp(mid_sock) = mid.listen_addrs()[0] else {
        unreachable!()
    };
    let mut greedy = authenticated_as(mid_sock, 40, None, |h| {
        h.downstream_of_you = Some((BusId(40), BusId(40)))
    })
    .await;
    let joins: Vec<u8> = (0..GROUPS + 100)
        .flat_map(|g| {
            frame_bytes(
                FrameKind::Interest,
                &encode_interest(true, &format!("h{g}")),
            )
        })
        .collect();
    greedy.write_all(&joins).await.unwrap();
    until(
        "the greedy downstream's whole quota reached the top",
        || top.group_links(&format!("h{}", GROUPS - 1)) == [BusId(MID)],
    )
    .await;
    let member = below(31, &mid, |_| {}).await;
    let mut inbox = member.take_inbox().unwrap();
    member.join("news").unwrap();
    until("the member's interest reached the publisher", || {
        !publisher.group_links("news").is_empty()
    })
    .await;
    for i in 0..1_000u64 {
        publisher.publish("news", msg(i).into()).await.unwrap();
    }
    let mut got = 0u64;
    tokio::time::timeout(WAIT, async {
        while got < 1_000 {
            let b = inbox.recv_batch().await.unwrap();
            for m in b.iter() {
                assert_eq!(&m[..8], &got.to_le_bytes());
                got += 1;
            }
        }
    })
    .await
    .expect("every publish reached the honest member");
    assert_eq!(top.stats().group_interest_refused, 0);
    assert!(
        mid.stats().group_interest_refused >= 100,
        "the greedy one's excess"
    );
    drop(greedy);
}

/// An upstream that gave a relay up (its link stayed down past the upstream's deadline)
/// forgot what the relay registered; the relay comes back as the same incarnation and asks
/// for it all again before anything else on the new link, so a member below it still gets
/// through, and no link closes over a frame in its name. (`peer_dead_after_ms` and the
/// relay's redial backoff are set to make the upstream give the relay up between the cut and
/// the redial, and the members take no direct link, to keep their traffic on the relays.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_given_up_by_its_upstream_registers_again_when_it_comes_back() {
    let mut c = config(TOP).listen(listen_addr("tcp4"));
    c.peer_dead_after_ms = 10;
    let top = start(c).await;
    let mid = below(MID, &top, |c| c.dial_backoff_min_ms = 2_000).await;
    let mut mid_events = mid.take_events().unwrap();
    // No direct link between the two members: their traffic stays on the relays.
    let deep = below(31, &mid, |c| c.direct_links = false).await;
    let high = below(5, &top, |c| c.direct_links = false).await;
    let mut inbox = high.take_inbox().unwrap();
    let first = send_all(&deep, 5, 1_000);
    expect_in_order(&mut inbox, BusId(31), 0..1_000, msg).await;
    first.await.unwrap();
    assert!(top.disconnect(BusId(MID)));
    wait_event(&mut mid_events, |e| {
        matches!(e, Event::PeerDown { peer, .. } if peer.0 == TOP).then_some(())
    })
    .await;
    wait_event(&mut mid_events, |e| {
        matches!(e, Event::PeerUp { peer, .. } if peer.0 == TOP).then_some(())
    })
    .await;
    let deep2 = deep.clone();
    let second = tokio::spawn(async move {
        for i in 1_000..2_000 {
            deep2.send(BusId(5), msg(i).into()).await.unwrap();
        }
    });
    expect_in_order(&mut inbox, BusId(31), 1_000..2_000, msg).await;
    second.await.unwrap();
    no_link_down(&mut mid_events, TOP);
    assert_eq!(top.stats().protocol_errors, 0);
}
