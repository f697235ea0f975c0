//! An application that stops reading is backpressure, not a dead link: while its inbox (or the
//! peer's ring) is full, heartbeats still flow both ways, the sender waits, and nothing is
//! written twice; everything arrives once the application reads again (issue #11, item 1).

mod common;

use busway::{BusId, Event, Events, Node};
use common::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Heartbeat interval of both nodes, in ms: a peer silent for 3 of them (300 ms) is down.
const HEARTBEAT_MS: u64 = 100;
/// How long the receiving application stops reading, in ms: five times the silence that
/// declares a peer down. This is the condition under test, not a wait for something.
const STALL_MS: u64 = 1_500;
/// Messages in the stream: far more than the inbox, the socket buffers, the ring and the send
/// queue hold together, so the sender must still be waiting when the stall ends.
const MESSAGES: u64 = 600_000;
/// Largest frame body of both nodes, in bytes: the smallest allowed, so that the inbox may be
/// as small.
const FRAME_BODY_MAX: usize = busway::limits::FRAME_BODY_MIN_BYTES;
/// Bytes of each message (its number, then filler).
const MESSAGE_BYTES: usize = 64;

fn msg(i: u64) -> Vec<u8> {
    let mut m = i.to_le_bytes().to_vec();
    m.resize(MESSAGE_BYTES, (i % 251) as u8);
    m
}

/// Every event a node reported so far, without waiting.
fn drain(events: &mut Events) -> Vec<Event> {
    std::iter::from_fn(|| events.try_recv()).collect()
}

/// Reads messages from node 2 until `expected` reaches `until` (or passes it, within the last
/// batch), checking that each comes once, in order, intact.
async fn read_in_order(inbox: &mut busway::Inbox, expected: &mut u64, until: u64, transport: &str) {
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        while *expected < until {
            let batch = inbox.recv_batch().await.unwrap();
            assert_eq!(batch.src(), BusId(2));
            for p in batch.iter() {
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                assert_eq!(seq, *expected, "over {transport}: in order, each once");
                assert_eq!(p, msg(seq).as_slice());
                *expected += 1;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "over {transport}: stream stalled at {expected}"
    );
}

async fn a_stalled_application_keeps_its_links(transport: &str) {
    let mut ca = config(1);
    ca.heartbeat_interval_ms = HEARTBEAT_MS;
    ca.frame_body_max = FRAME_BODY_MAX;
    ca.inbox_bytes_max = FRAME_BODY_MAX;
    let mut cb = config(2);
    cb.heartbeat_interval_ms = HEARTBEAT_MS;
    cb.frame_body_max = FRAME_BODY_MAX;
    // The default send queue (8 MiB) holds more than a ring (4 MiB): over shared memory the
    // sender's writer then waits for room in a full ring, not only for acknowledgements.
    let (a, b) = pair(transport, ca, cb).await;
    let mut ea = a.take_events().unwrap();
    let mut eb = b.take_events().unwrap();
    let mut inbox = a.take_inbox().unwrap();

    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let (b, sent): (Node, _) = (b.clone(), sent.clone());
        tokio::spawn(async move {
            let mut next = 0u64;
            while next < MESSAGES {
                let batch: Vec<Vec<u8>> = (next..(next + 100).min(MESSAGES)).map(msg).collect();
                next = b.send_batch(BusId(1), &batch).await.unwrap().end;
                sent.store(next, Relaxed);
            }
        })
    };
    // The stream flows...
    let mut expected = 0;
    read_in_order(&mut inbox, &mut expected, 1_000, transport).await;
    // ...then the application stops reading.
    tokio::time::sleep(Duration::from_millis(STALL_MS)).await;
    let sent_in_stall = sent.load(Relaxed);
    assert!(
        sent_in_stall < MESSAGES,
        "over {transport}: the sender finished while the receiver did not read: nothing was full"
    );
    // Everything after the stall, in order, once each.
    read_in_order(&mut inbox, &mut expected, MESSAGES, transport).await;
    sender.await.unwrap();
    nothing_more_from(&b, &mut inbox, BusId(1)).await;

    for (node, events) in [(&a, &mut ea), (&b, &mut eb)] {
        let downs: Vec<_> = drain(events)
            .into_iter()
            .filter(|e| matches!(e, Event::PeerDown { .. }))
            .collect();
        assert!(
            downs.is_empty(),
            "over {transport}: node {} saw its peer go down: {downs:?}",
            node.id()
        );
        let s = node.stats();
        assert_eq!(s.heartbeat_timeouts, 0, "over {transport}: {s:?}");
        assert_eq!(
            s.msgs_resent, 0,
            "over {transport}: nothing sent twice: {s:?}"
        );
        assert_eq!(
            s.connections, 1,
            "over {transport}: one link all along: {s:?}"
        );
        let rings = u64::from(transport == "shm");
        assert_eq!(s.shm_channels, rings, "over {transport}: {s:?}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_application_keeps_its_tcp_link() {
    a_stalled_application_keeps_its_links("tcp4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_application_keeps_its_unix_link() {
    a_stalled_application_keeps_its_links("unix").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_application_keeps_its_shared_memory_link() {
    a_stalled_application_keeps_its_links("shm").await;
}
