//! Issue #26, item 4: what a node holds behind gaps is bounded by what it really pins,
//! whatever a source sends. A peer publishes to eight groups the node joined, leaving a
//! number out every 1,000 and never repairing it, its publishes mixing 60 KiB payloads with
//! 1-byte ones (each of which, held as a slice of its read, would pin the whole read), and
//! multicasts to the node in the same pattern, until
//! 1 GiB went in. Then, in a group of its own, only 1-byte publishes after a gap, each in a
//! write of its own with 60 KiB of in-order publishes to another group: held as slices of
//! their reads, each would pin a whole read (1 GiB over the bound); held as copies, each
//! costs 65 bytes. The node's peak RSS must stay within `RSS_BOUND_BYTES`: 128 MiB held behind
//! gaps at most (`GROUP_HELD_BYTES_NODE_MAX`), plus the inbox, the reads and the queues.
//!
//! Its own test binary: the process's peak RSS (`VmHWM`) is this node's and this test's alone.

mod common;

use busway::BusId;
use busway_core::frame::{frame_bytes, FrameKind};
use busway_core::group::encode_publish_head;
use busway_core::multicast::encode_multicast_head;
use common::*;
use tokio::io::AsyncWriteExt;

/// The node's peak RSS the issue allows, in bytes, whatever the source sends.
const RSS_BOUND_BYTES: u64 = 256 << 20;
/// Bytes the source sends: four times the bound.
const SENT_BYTES: u64 = 1 << 30;
/// Groups the source publishes to, one stream each.
const GROUPS: u64 = 8;
/// Every this many publishes of a stream, one number is left out and never repaired.
const GAP_EVERY: u64 = 1_000;
/// The large payload, in bytes.
const LARGE_BYTES: usize = 60 << 10;

/// A line of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`: kB there).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("a number of kB");
    kb << 10
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_keeps_gaps_open_cannot_make_a_node_hold_past_its_bound() {
    let node = start(config(1).listen(listen_addr("tcp4"))).await;
    for g in 0..GROUPS {
        node.join(&format!("g{g}")).unwrap();
    }
    let mut inbox = node.take_inbox().unwrap();
    let mut events = node.take_events().unwrap();
    // The application reads at once: what the node holds is what waits behind gaps.
    let reading = tokio::spawn(async move {
        let mut got = 0u64;
        while let Some(batch) = inbox.recv_batch().await {
            got += batch.iter().count() as u64;
        }
        got
    });
    let busway::Addr::Tcp(addr) = node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let mut source = authenticated(addr, 9, None).await;
    assert!(node.wait_for_peer(BusId(9), WAIT).await);
    let before = status_bytes("VmRSS:");
    let large = vec![7u8; LARGE_BYTES];
    let mut sent = 0u64;
    let mut number = 0u64;
    let mut writes = Vec::with_capacity(1 << 20);
    // Bounded by the bytes, not by time: the node reads what it is sent.
    while sent < SENT_BYTES {
        number += 1;
        if number % GAP_EVERY == 2 {
            continue;
        }
        let payload: &[u8] = if number % 2 == 0 { &large } else { &[1u8] };
        for g in 0..GROUPS {
            let mut body = encode_publish_head(BusId(9), 1, number, &format!("g{g}"));
            body.extend_from_slice(payload);
            writes.extend_from_slice(&frame_bytes(FrameKind::Publish, &body));
        }
        // And its multicasts to the node: the same budget holds both.
        let mut body = encode_multicast_head(BusId(9), 1, false, 1, &[(BusId(1), number)]);
        body.extend_from_slice(payload);
        writes.extend_from_slice(&frame_bytes(FrameKind::Multicast, &body));
        if writes.len() >= 1 << 20 {
            source.write_all(&writes).await.unwrap();
            sent += writes.len() as u64;
            writes.clear();
        }
    }
    // The second phase: a 1-byte publish that waits behind a gap, per read.
    node.join("pinned").unwrap();
    node.join("filler").unwrap();
    let mut pin_sent = 0u64;
    let mut filler_number = 0u64;
    let mut write = Vec::with_capacity(LARGE_BYTES + 1024);
    // 1 starts the stream; 2 never comes, so everything after it waits.
    for pinned_number in std::iter::once(1).chain(3..) {
        if pin_sent >= SENT_BYTES {
            break;
        }
        let mut body = encode_publish_head(BusId(9), 1, pinned_number, "pinned");
        body.push(1);
        write.extend_from_slice(&frame_bytes(FrameKind::Publish, &body));
        for _ in 0..15 {
            filler_number += 1;
            let mut body = encode_publish_head(BusId(9), 1, filler_number, "filler");
            body.extend_from_slice(&large[..4 << 10]);
            write.extend_from_slice(&frame_bytes(FrameKind::Publish, &body));
        }
        source.write_all(&write).await.unwrap();
        pin_sent += write.len() as u64;
        write.clear();
    }
    let peak = status_bytes("VmHWM:");
    let stats = node.stats();
    eprintln!(
        "RSS before {} MiB, peak {} MiB after {} MiB and {} MiB sent",
        before >> 20,
        peak >> 20,
        sent >> 20,
        pin_sent >> 20
    );
    assert!(
        peak <= RSS_BOUND_BYTES,
        "peak RSS {} MiB past {} MiB",
        peak >> 20,
        RSS_BOUND_BYTES >> 20
    );
    assert_eq!(stats.protocol_errors, 0);
    // The gaps were held behind, up to the bounds, and given up on with the bound's name.
    let reason = wait_event(&mut events, |e| match e {
        busway::Event::GroupGap { reason, .. } if reason.contains("GROUP_HELD_BYTES") => {
            Some(reason.clone())
        }
        _ => None,
    })
    .await;
    eprintln!("{reason}");
    drop(source);
    node.shutdown().await;
    let got = reading.await.unwrap();
    assert!(got > 0, "the application got publishes");
}
