//! The route part's tasks: the pump, which hands relayed messages to their next hops as they
//! pile up, and its periodic work on the node's timer (`node::timer`): writing again what
//! relayed destinations hold, giving up on those unreachable too long, forgetting idle state.

use crate::limits::ROUTED_RESEND_AFTER_MS;
use crate::node::event::Path;
use crate::peer::lifecycle;
use crate::route;
use crate::route::remote::Remote;
use crate::shared::Shared;
use busway_core::e2e::Check;
use busway_core::frame::HEADER_LEN;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Hands what `remote` has unwritten to the next hop, or notes that there is none.
pub(crate) fn pump(shared: &Shared, remote: &Remote) {
    let now = shared.clock_ms();
    let Some(hop) = route::next_hop(shared, remote.id, None) else {
        remote.stall(now);
        return;
    };
    let frames = remote.take_frame_parts(
        shared.config().id,
        shared.incarnation(),
        shared.config().ttl,
        now,
    );
    let body_len = |f: &Vec<Bytes>| f.iter().map(Bytes::len).sum::<usize>() - HEADER_LEN;
    let too_large = hop.frame_body_max().and_then(|max| {
        frames
            .iter()
            .map(body_len)
            .find(|&n| n > max)
            .map(|n| (n, max))
    });
    if let Some((body_len, max)) = too_large {
        // Its first hop would refuse one of them (and close the link over it, and it would
        // come back forever): nothing of this take is sent, all of it is given up here and
        // reported, and later messages go on (the destination is not down).
        let seqs = remote.fail_all();
        remote.revive();
        route::release_if_drained(shared, remote.id);
        shared.report_undeliverable(
            remote.id,
            seqs,
            format!(
                "a relayed frame of {body_len} bytes is over the {max} bytes bus id {} accepts",
                hop.id
            ),
            Path::Relayed,
            remote.incarnation(),
        );
        return;
    }
    for f in frames {
        hop.push_forward(f, None);
    }
}

/// Has the pump task hand `remote`'s new messages on (batched with whatever else comes in
/// before it runs).
pub(crate) fn schedule_pump(shared: &Shared, remote: &Remote) {
    if remote.mark_for_pump() {
        shared.routes.relayed.wake_pump();
    }
}

/// Hands newly queued relayed messages to their next hops, as many at a time as have
/// piled up since the last round.
pub(crate) async fn pump_loop(shared: Arc<Shared>) {
    loop {
        shared.routes.relayed.pump_woken().await;
        if shared.is_shutting_down() {
            return;
        }
        for r in route::remotes_snapshot(&shared) {
            if r.take_pump_mark() {
                pump(&shared, &r);
            }
        }
    }
}

/// A link came up: whatever relayed messages are held may have a path now.
pub(crate) fn relink_remotes(shared: &Shared) {
    for r in route::remotes_snapshot(shared) {
        r.revive();
        route::count_resent(shared, r.rewind());
        pump(shared, &r);
    }
}

/// Writes again what relayed destinations hold when paths may have lost it, and gives up
/// on destinations that stayed unreachable past `peer_dead_after_ms` (periodic work of the
/// node's timer, every tick).
pub(crate) fn retry_remotes(shared: &Shared, now: u64) {
    let dead_after_ms = shared.config().peer_dead_after_ms;
    for r in route::remotes_snapshot(shared) {
        match r.check(now, ROUTED_RESEND_AFTER_MS, dead_after_ms) {
            Check::Idle => {}
            Check::Retry => {
                route::count_resent(shared, r.rewind());
                pump(shared, &r);
            }
            Check::Expire => {
                let seqs = r.fail_all();
                route::release_if_drained(shared, r.id);
                let why = format!("no path to bus id {} for {dead_after_ms} ms", r.id);
                lifecycle::give_up_on_peer(shared, r.id, seqs, why, Path::Relayed, r.incarnation());
            }
        }
    }
}

/// Forgets state nobody needs any more (issue #11: every map shrinks): peers dead for
/// `forget_after_ms`, relayed sources silent that long, relayed destinations that hold
/// nothing and were not sent to for twice that.
pub(crate) fn forget_idle(shared: &Shared, now: u64) {
    let window = shared.config().forget_after_ms;
    let c = &shared.counters;
    let n = shared.peers.forget_dead(now, window) as u64;
    c.forgotten_peers.fetch_add(n, Relaxed);
    let n = shared.routes.relayed.forget_sources(now, window) as u64;
    c.forgotten_sources.fetch_add(n, Relaxed);
    let n = shared
        .routes
        .relayed
        .forget_destinations(now, window.saturating_mul(2)) as u64;
    c.forgotten_destinations.fetch_add(n, Relaxed);
}
