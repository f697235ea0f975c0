//! Group logs (`NodeConfig::group_logs`): a publisher writes each publish once into a log in
//! shared memory and its members on the host read it themselves, each at its own pace, rather
//! than getting one PUBLISH per link. Every member still gets every publish once and in
//! order; a member that falls behind the log repairs the gap from the publisher; a member that
//! does not take the log gets everything by its link.

mod common;

use busway::{BusId, Inbox, Node, NodeConfig};
use bytes::Bytes;
use common::*;

const GROUP: &str = "world";

fn numbered(i: u64) -> Bytes {
    Bytes::from(i.to_le_bytes().to_vec())
}

/// A publisher (1) listening on `transport` (`shm`: rings through `/proc`; `mem`: in-process
/// rings) and members 10.. linked to it, each joined, with `tweak` applied to member `i`'s
/// config; returns once the publisher sends the group to all of them.
async fn star(
    transport: &str,
    members: u64,
    tweak: impl Fn(u64, &mut NodeConfig),
) -> (Node, Vec<(Node, Inbox)>) {
    star_with(transport, members, |_| {}, tweak).await
}

/// `star`, with `tweak_publisher` applied to the publisher's config too.
async fn star_with(
    transport: &str,
    members: u64,
    tweak_publisher: impl Fn(&mut NodeConfig),
    tweak: impl Fn(u64, &mut NodeConfig),
) -> (Node, Vec<(Node, Inbox)>) {
    let mut pc = config(1).listen(listen_addr(transport));
    pc.mem_channels = transport == "mem";
    tweak_publisher(&mut pc);
    let publisher = start(pc).await;
    let mut out = Vec::new();
    for i in 0..members {
        let mut c = config(10 + i).connect(publisher.listen_addrs()[0].clone());
        c.mem_channels = transport == "mem";
        tweak(i, &mut c);
        let m = start(c).await;
        m.join(GROUP).unwrap();
        let inbox = m.take_inbox().unwrap();
        out.push((m, inbox));
    }
    let want: Vec<BusId> = (0..members).map(|i| BusId(10 + i)).collect();
    until("the publisher sends the group to every member", || {
        publisher.group_links(GROUP) == want
    })
    .await;
    (publisher, out)
}

/// Takes what `inbox` holds now (without waiting), checking that publishes of 1 come in
/// order from `*next` on, each once.
fn take_ready(inbox: &mut Inbox, next: &mut u64, what: &str) {
    while let Some(batch) = inbox.try_recv_batch() {
        check(&batch, next, what);
    }
}

fn check(batch: &busway::MessageBatch, next: &mut u64, what: &str) {
    assert_eq!(batch.group(), Some(GROUP), "{what}");
    assert_eq!(batch.src(), BusId(1), "{what}");
    for p in batch.iter() {
        let i = u64::from_le_bytes(p.try_into().unwrap());
        assert_eq!(i, *next, "{what}: in order, each once");
        *next += 1;
    }
}

/// Reads until publishes up to `n` (excluded) came, in order.
async fn read_up_to(inbox: &mut Inbox, next: &mut u64, n: u64, what: &str) {
    while *next < n {
        let batch = tokio::time::timeout(WAIT, inbox.recv_batch())
            .await
            .unwrap_or_else(|_| panic!("{what}: stalled at {next}"))
            .expect("inbox open");
        check(&batch, next, what);
    }
}

/// Publishes from `*sent` on, the members reading as they go, until each member for which
/// `reads_log(i)` holds has read a publish from the publisher's log.
async fn publish_until_logs_read(
    publisher: &Node,
    members: &mut [(Node, Inbox)],
    nexts: &mut [u64],
    sent: &mut u64,
    reads_log: impl Fn(usize) -> bool,
) {
    let ok = tokio::time::timeout(WAIT, async {
        loop {
            let readers = (0..members.len()).filter(|&i| reads_log(i)).count() as u64;
            let all = members
                .iter()
                .enumerate()
                .all(|(i, (m, _))| !reads_log(i) || m.stats().group_log_reads > 0);
            // And the publisher took every accept: from here on it writes to the log alone.
            if all && publisher.stats().group_logs_accepted >= readers {
                return;
            }
            publisher.publish(GROUP, numbered(*sent)).await.unwrap();
            *sent += 1;
            for (i, (_, inbox)) in members.iter_mut().enumerate() {
                take_ready(inbox, &mut nexts[i], "while the logs are offered");
            }
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "the members did not take the publisher's log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_on_the_host_read_each_publish_from_one_log_once_in_order() {
    for t in ["shm", "mem"] {
        let (publisher, mut members) = star(t, 3, |_, _| {}).await;
        let mut nexts = vec![0u64; members.len()];
        let mut sent = 0;
        publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
        let link_bytes = |p: &Node| -> Vec<u64> {
            let mut v: Vec<(BusId, u64)> = p.peers().iter().map(|x| (x.id, x.bytes_sent)).collect();
            v.sort();
            v.into_iter().map(|x| x.1).collect()
        };
        let before = link_bytes(&publisher);
        const N: u64 = 20_000;
        let end = sent + N;
        let readers: Vec<_> = members
            .drain(..)
            .zip(nexts.iter().copied())
            .map(|((m, mut inbox), mut next)| {
                tokio::spawn(async move {
                    read_up_to(&mut inbox, &mut next, end, "a member").await;
                    (m, next)
                })
            })
            .collect();
        for i in sent..end {
            // The three members, all through the log.
            assert_eq!(
                publisher.publish(GROUP, numbered(i)).await.unwrap(),
                3,
                "over {t}"
            );
        }
        for r in readers {
            let (m, next) = r.await.unwrap();
            assert_eq!(next, end, "over {t}");
            assert!(
                m.stats().group_log_reads >= N,
                "over {t}: read from the log"
            );
            m.shutdown().await;
        }
        // One copy in the log, not one PUBLISH per link: each link carried far less than
        // the publishes' payloads (acknowledgements and marks only).
        for (b, a) in before.iter().zip(link_bytes(&publisher)) {
            assert!(
                a - b < N * 8,
                "over {t}: {} bytes went by a member's link ({:?})",
                a - b,
                publisher.stats()
            );
        }
        publisher.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_logs_off_declines_and_gets_every_publish_by_its_link() {
    let (publisher, mut members) = star("shm", 2, |i, c| c.group_logs = i == 0).await;
    let mut nexts = vec![0u64; members.len()];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |i| i == 0).await;
    let end = sent + 5_000;
    for i in sent..end {
        publisher.publish(GROUP, numbered(i)).await.unwrap();
    }
    for (i, (m, inbox)) in members.iter_mut().enumerate() {
        read_up_to(inbox, &mut nexts[i], end, "a member").await;
        let reads = m.stats().group_log_reads;
        assert_eq!(reads > 0, i == 0, "member {i} read {reads} from the log");
    }
    for (m, _) in members {
        m.shutdown().await;
    }
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_falls_behind_the_log_repairs_the_gap_and_misses_nothing() {
    use busway::limits::FRAME_BODY_MIN_BYTES;
    // A small log (and small rings), and a member whose inbox holds little: while it does not
    // read, the publisher goes round the log past it.
    let mut pc = config(1).listen(listen_addr("shm"));
    pc.mem_channels = false;
    pc.shm_ring_bytes = 4096;
    let publisher = start(pc).await;
    let mut c = config(10).connect(publisher.listen_addrs()[0].clone());
    c.mem_channels = false;
    c.shm_ring_bytes = 4096;
    c.inbox_bytes_max = FRAME_BODY_MIN_BYTES;
    c.frame_body_max = FRAME_BODY_MIN_BYTES;
    let m = start(c).await;
    m.join(GROUP).unwrap();
    let inbox = m.take_inbox().unwrap();
    let mut members = vec![(m, inbox)];
    until("the publisher sends the group to the member", || {
        publisher.group_links(GROUP) == vec![BusId(10)]
    })
    .await;
    let mut nexts = vec![0u64];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
    // 5,000 publishes (about 240 KB in the log of 4 KiB) while the member reads nothing.
    let end = sent + 5_000;
    for i in sent..end {
        publisher.publish(GROUP, numbered(i)).await.unwrap();
    }
    let (m, inbox) = &mut members[0];
    read_up_to(inbox, &mut nexts[0], end, "the member that fell behind").await;
    let s = m.stats();
    assert!(
        s.group_log_overruns > 0,
        "the member never fell behind: {s:?}"
    );
    assert!(s.group_repairs_asked > 0, "{s:?}");
    assert!(publisher.stats().group_copies_sent > 0);
    for (m, _) in members {
        m.shutdown().await;
    }
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_and_joins_again_reads_the_log_again() {
    let (publisher, mut members) = star("mem", 2, |_, _| {}).await;
    let mut nexts = vec![0u64; 2];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
    members[1].0.leave(GROUP);
    until(
        "the publisher stops sending to the member that left",
        || publisher.group_links(GROUP) == vec![BusId(10)],
    )
    .await;
    // Member 11 got what came before its leave was read, and nothing after.
    for i in sent..sent + 1_000 {
        assert_eq!(publisher.publish(GROUP, numbered(i)).await.unwrap(), 1);
    }
    sent += 1_000;
    read_up_to(
        &mut members[0].1,
        &mut nexts[0],
        sent,
        "the member that stayed",
    )
    .await;
    let reads_before = members[1].0.stats().group_log_reads;
    while let Some(b) = members[1].1.try_recv_batch() {
        for p in b.iter() {
            let i = u64::from_le_bytes(p.try_into().unwrap());
            assert!(
                i < sent - 1_000,
                "publish {i} reached the member after it left"
            );
        }
    }
    members[1].0.join(GROUP).unwrap();
    until("the publisher sends to the member again", || {
        publisher.group_links(GROUP) == vec![BusId(10), BusId(11)]
    })
    .await;
    // From its join on it gets every publish in order, from the log again.
    let first = sent;
    let mut next: Option<u64> = None;
    let reads_log = tokio::time::timeout(WAIT, async {
        loop {
            publisher.publish(GROUP, numbered(sent)).await.unwrap();
            sent += 1;
            take_ready(&mut members[0].1, &mut nexts[0], "the member that stayed");
            while let Some(b) = members[1].1.try_recv_batch() {
                let n = next
                    .get_or_insert_with(|| u64::from_le_bytes(b.payload(0).try_into().unwrap()));
                assert!(
                    *n >= first,
                    "publish {n} from before the join came after it"
                );
                check(&b, n, "the member that joined again");
            }
            if members[1].0.stats().group_log_reads > reads_before {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    })
    .await;
    assert!(
        reads_log.is_ok(),
        "the member that joined again reads the log again"
    );
    let mut again = next.unwrap_or(first);
    read_up_to(
        &mut members[1].1,
        &mut again,
        sent,
        "the member that joined again",
    )
    .await;
    for (m, _) in members {
        m.shutdown().await;
    }
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_too_large_for_the_log_reach_its_readers_by_their_links_in_order() {
    // A log of 256 KiB holds records of at most 128 KiB less 8 bytes: every third publish is
    // larger. (Rings under 128 KiB cannot carry the link's 64 KiB records at all.)
    let small = |c: &mut NodeConfig| c.shm_ring_bytes = 256 << 10;
    let (publisher, mut members) = star_with("shm", 2, small, |_, c| small(c)).await;
    let mut nexts = vec![0u64; 2];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
    let sized = |i: u64| {
        let mut v = vec![0u8; if i % 3 == 0 { 200 << 10 } else { 8 }];
        v[..8].copy_from_slice(&i.to_le_bytes());
        Bytes::from(v)
    };
    let end = sent + 60;
    let readers: Vec<_> = members
        .drain(..)
        .zip(nexts.iter().copied())
        .map(|((m, mut inbox), mut next)| {
            tokio::spawn(async move {
                while next < end {
                    let b = tokio::time::timeout(WAIT, inbox.recv_batch())
                        .await
                        .unwrap_or_else(|_| panic!("stalled at {next}"))
                        .expect("inbox open");
                    for p in b.iter() {
                        let i = u64::from_le_bytes(p[..8].try_into().unwrap());
                        assert_eq!(i, next, "in order, each once");
                        next += 1;
                    }
                }
                m
            })
        })
        .collect();
    for i in sent..end {
        assert_eq!(publisher.publish(GROUP, sized(i)).await.unwrap(), 2);
    }
    for r in readers {
        let m = r.await.unwrap();
        assert!(m.stats().group_log_reads > 0);
        m.shutdown().await;
    }
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_link_drops_gets_every_publish_and_the_log_again_on_its_new_ring() {
    let (publisher, mut members) = star("shm", 1, |_, _| {}).await;
    let mut nexts = vec![0u64];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
    let (member, mut inbox) = members.pop().unwrap();
    let mut next = nexts[0];
    // Publishing goes on while the link is cut and comes back (the member dials again): its
    // reader of the log dies with the ring; what it missed meanwhile comes by the link or by
    // repair, and a new offer on the new ring is accepted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publishing = {
        let (publisher, stop) = (publisher.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = sent;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                publisher.publish(GROUP, numbered(i)).await.unwrap();
                i += 1;
                if i % 64 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            i
        })
    };
    read_up_to(&mut inbox, &mut next, sent + 2_000, "before the cut").await;
    assert!(publisher.disconnect(member.id()), "a link to cut");
    let again = tokio::time::timeout(WAIT, async {
        loop {
            take_ready(&mut inbox, &mut next, "across the cut");
            if publisher.stats().group_logs_accepted >= 2 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    })
    .await;
    assert!(
        again.is_ok(),
        "the log was not accepted again on the new ring"
    );
    let reads = member.stats().group_log_reads;
    let target = next + 2_000;
    read_up_to(&mut inbox, &mut next, target, "after the cut").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let end = publishing.await.unwrap();
    read_up_to(&mut inbox, &mut next, end, "to the end").await;
    assert!(
        member.stats().group_log_reads > reads,
        "read from the log again"
    );
    member.shutdown().await;
    publisher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_nobody_wants_any_more_goes_and_a_new_one_serves_the_next_member() {
    let (publisher, mut members) = star("shm", 1, |_, _| {}).await;
    let mut nexts = vec![0u64];
    let mut sent = 0;
    publish_until_logs_read(&publisher, &mut members, &mut nexts, &mut sent, |_| true).await;
    members[0].0.leave(GROUP);
    until(
        "the publisher stops sending to the member that left",
        || publisher.group_links(GROUP).is_empty(),
    )
    .await;
    // Nobody asks: a publish goes nowhere.
    assert_eq!(publisher.publish(GROUP, numbered(sent)).await.unwrap(), 0);
    sent += 1;
    let reads = members[0].0.stats().group_log_reads;
    members[0].0.join(GROUP).unwrap();
    until("the publisher sends to the member again", || {
        publisher.group_links(GROUP) == vec![BusId(10)]
    })
    .await;
    // A new log (the old one went with its last peer), offered and accepted.
    let first = sent;
    let mut next: Option<u64> = None;
    let served = tokio::time::timeout(WAIT, async {
        loop {
            publisher.publish(GROUP, numbered(sent)).await.unwrap();
            sent += 1;
            while let Some(b) = members[0].1.try_recv_batch() {
                let start = u64::from_le_bytes(b.payload(0).try_into().unwrap());
                if next.is_none() && start < first {
                    // Sent while it was still a member, read late (a busy machine): not a
                    // publish from before the join coming after the stream it joined.
                    continue;
                }
                let n = next.get_or_insert(start);
                assert!(
                    *n >= first,
                    "publish {n} from before the join came after it"
                );
                check(&b, n, "the member that joined again");
            }
            let s = publisher.stats();
            if s.group_logs_accepted >= 2 && members[0].0.stats().group_log_reads > reads {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    })
    .await;
    assert!(served.is_ok(), "the member did not read a new log");
    for (m, _) in members {
        m.shutdown().await;
    }
    publisher.shutdown().await;
}
