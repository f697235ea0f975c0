//! Every map shrinks (issue #11, item 3): a node forgets a peer dead past its deadline, a relayed
//! source it has not heard from and a relayed destination it no longer sends to, after
//! `forget_after_ms`; and forgetting loses nothing: a stream that starts again after both
//! ends forgot each other arrives whole, in order.
//!
//! In virtual time (`virtual_config`): the default deadline (30 s) and window (10 min) pass in
//! no real time, and the tests check when, by the nodes' own clock, each thing is forgotten.

mod common;

use busway::limits::{DEFAULT_FORGET_AFTER_MS, DEFAULT_PEER_DEAD_AFTER_MS};
use busway::{BusId, Node, NodeConfig};
use bytes::Bytes;
use common::*;
use std::time::Duration;

/// How late after its window a node may forget: its sweep runs every second, on the timer.
const SWEEP_SLACK: Duration = Duration::from_secs(2);
/// A tick of the node's timer, by which its coarse clock (hot-path stamps) lags.
const TICK: Duration = Duration::from_millis(VIRTUAL_POLL_MS);
/// The longest a test waits for something to be forgotten, in virtual time.
const FORGET_WAIT: Duration = Duration::from_millis(4 * DEFAULT_FORGET_AFTER_MS);

/// Relayed traffic stays relayed (no direct link on a hint); deadlines are the defaults.
fn forgetful(mut c: NodeConfig) -> NodeConfig {
    c.direct_links = false;
    c
}

fn forget_after() -> Duration {
    Duration::from_millis(DEFAULT_FORGET_AFTER_MS)
}

fn msg(n: u64) -> Vec<u8> {
    let mut m = n.to_le_bytes().to_vec();
    m.resize(8 + (n % 50) as usize, 7);
    m
}

/// A forgetful relay that reports unknown ids at once.
async fn strict_relay() -> Node {
    let mut c = forgetful(virtual_config(100).listen(listen_addr("tcp4")));
    c.relay_grace_ms = 0;
    start(c).await
}

async fn below(id: u64, relay: &Node) -> Node {
    let n = start(forgetful(
        virtual_config(id).upstream(relay.listen_addrs()[0].clone()),
    ))
    .await;
    assert!(n.wait_for_peer(relay.id(), WAIT).await, "{id} registered");
    // The relay knows it too (it reports unknown ids at once).
    assert!(
        relay.wait_for_peer(BusId(id), WAIT).await,
        "{id} known to the relay"
    );
    n
}

#[tokio::test(start_paused = true)]
async fn a_relayed_stream_starts_again_whole_after_both_ends_forgot_each_other() {
    let relay = strict_relay().await;
    let a = below(1, &relay).await;
    let b = below(2, &relay).await;
    let mut inbox = b.take_inbox().unwrap();
    let first: Vec<Vec<u8>> = (0..500).map(msg).collect();
    let sending = tokio::time::Instant::now();
    a.send_batch(BusId(2), &first).await.unwrap();
    expect_in_order(&mut inbox, BusId(1), 0..500, msg).await;
    assert!(a.flush(WAIT).await, "acknowledged end to end");
    assert_eq!(a.relayed_peers().len(), 1);
    // Stamped between `sending` and now: forgotten no sooner than a window after the first
    // (less a tick of the coarse clock that stamps it), no later than a window and a sweep
    // after the second.
    let took = until_virtual("the destination forgets the source", FORGET_WAIT, || {
        b.stats().forgotten_sources >= 1
    })
    .await;
    let since_sent = sending.elapsed();
    assert!(
        since_sent + TICK >= forget_after(),
        "forgotten {since_sent:?} after the send"
    );
    assert!(
        took <= forget_after() + SWEEP_SLACK,
        "forgotten after {took:?}"
    );
    // A destination held nothing and was not sent to for twice the window.
    let took = took
        + until_virtual("the source forgets the destination", FORGET_WAIT, || {
            a.stats().forgotten_destinations >= 1
        })
        .await;
    let since_sent = sending.elapsed();
    assert!(
        since_sent + TICK >= 2 * forget_after(),
        "forgotten {since_sent:?} after the send"
    );
    assert!(
        took <= 2 * forget_after() + SWEEP_SLACK,
        "forgotten after {took:?}"
    );
    assert!(a.relayed_peers().is_empty(), "{:?}", a.relayed_peers());
    // Numbered from 0 again at the source; the destination, which forgot, takes them all.
    let again: Vec<Vec<u8>> = (500..1_000).map(msg).collect();
    a.send_batch(BusId(2), &again).await.unwrap();
    expect_in_order(&mut inbox, BusId(1), 500..1_000, msg).await;
    nothing_more_from(&a, &mut inbox, BusId(2)).await;
}

#[tokio::test(start_paused = true)]
async fn a_peer_dead_past_its_deadline_is_forgotten_and_may_come_back() {
    let a = start(forgetful(virtual_config(1).listen(listen_addr("tcp4")))).await;
    let addr = a.listen_addrs()[0].clone();
    let c = start(forgetful(virtual_config(3).connect(addr.clone()))).await;
    assert!(a.wait_for_peer(BusId(3), WAIT).await);
    // Killed: its links drop without a CLOSE, so it is dead only past its deadline.
    drop(c);
    let took = until_virtual("the dead peer is forgotten", FORGET_WAIT, || {
        a.stats().forgotten_peers >= 1
    })
    .await;
    let dead_then_forgotten = Duration::from_millis(DEFAULT_PEER_DEAD_AFTER_MS) + forget_after();
    assert!(took >= dead_then_forgotten, "forgotten after {took:?}");
    assert!(
        took <= dead_then_forgotten + SWEEP_SLACK,
        "forgotten after {took:?}"
    );
    assert!(
        a.peers().iter().all(|p| p.id != BusId(3)),
        "{:?}",
        a.peers()
    );
    let c = start(forgetful(virtual_config(3).connect(addr))).await;
    assert!(c.wait_for_peer(BusId(1), WAIT).await);
    let mut inbox = a.take_inbox().unwrap();
    send_and_expect(&c, BusId(1), &mut inbox, b"back").await;
}

#[tokio::test(start_paused = true)]
async fn sends_to_many_unknown_ids_leave_no_state_behind() {
    let relay = strict_relay().await;
    let a = below(1, &relay).await;
    for id in 1_000..1_200u64 {
        a.send(BusId(id), Bytes::from_static(b"to nobody"))
            .await
            .unwrap();
    }
    until_virtual("every unknown destination reported", WAIT, || {
        a.relayed_peers().iter().all(|r| r.unacked_msgs == 0)
    })
    .await;
    until_virtual("every unknown destination forgotten", FORGET_WAIT, || {
        a.stats().forgotten_destinations == 200
    })
    .await;
    assert!(a.relayed_peers().is_empty(), "{:?}", a.relayed_peers());
}

#[test]
fn a_window_shorter_than_twice_the_deadline_is_refused() {
    let mut c = NodeConfig::new(BusId(1));
    c.peer_dead_after_ms = 1_000;
    c.forget_after_ms = 1_999;
    let e = c.validate().unwrap_err();
    assert_eq!(e.setting(), Some("forget_after_ms"), "the setting is named");
    let e = e.to_string();
    assert!(
        e.contains("forget_after_ms (1999) must be at least twice peer_dead_after_ms (1000)"),
        "{e}"
    );
}
