//! The publishes a relay passes on that wait for room toward a full peer
//! (`busway_core::group::publishes::forward_publish` queues them): pushed as room comes, and
//! waited for by the links that bring publishes (they stop reading meanwhile).

use crate::group::host;
use crate::limits::TIMER_TICK_MS;
use crate::route::registrations;
use crate::shared::Shared;
use busway_core::group::decode_publish;
use busway_core::group::forwards::Push;
use busway_core::group::publishes;
use busway_core::BusId;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// Passes on the publishes that wait for room, in order, as far as the queues allow
/// (cut-off ones past their time are dropped instead, see `forward_publish`); returns the
/// first that still waits: its peer, length and give-up time.
pub(crate) fn push_blocked_forwards(
    shared: &Shared,
) -> Option<(Arc<crate::peer::Peer>, usize, Option<u64>)> {
    let now_ms = shared.clock.coarse_ms();
    let upstream = shared.upstream_id();
    let push = |id: BusId, body: &Bytes| {
        let Ok(head) = decode_publish(body) else {
            forwards_dropped(shared, body);
            return Push::Gone;
        };
        // A forward that waited may no longer go up: its publisher's range was taken back
        // meanwhile (see `forward_publish`).
        if Some(id) == upstream && !registrations::may_pass_to(shared, id, head.publisher) {
            forwards_dropped(shared, body);
            return Push::Gone;
        }
        // The gap mark owed to that peer of its stream first (`push_paying`).
        let pushed = host::with_group_host(shared, |h| publishes::push_paying(h, id, body, &head));
        if pushed == Push::Gone {
            // Gone: that peer will not hear it.
            forwards_dropped(shared, body);
        }
        pushed
    };
    let given_up = |id, body: &Bytes| {
        host::with_group_host(shared, |h| publishes::given_up(h, id, body));
    };
    let pushed = shared.group.table.waiting.push(now_ms, push, given_up);
    if !pushed.dropped.is_empty() {
        host::with_group_host(shared, |h| publishes::forwards_given_up(h, &pushed.dropped));
        tracing::debug!(
            dropped = pushed.dropped.len(),
            "a link to members stayed full: its cut-off publishes are dropped until it has room"
        );
    }
    let (id, len, give_up_at) = pushed.waits?;
    match shared.peer(id) {
        Some(p) => Some((p, len, give_up_at)),
        None => push_blocked_forwards(shared),
    }
}

/// Waits until every publish that waited for room is passed on, or (cut-off) given up
/// on (the caller's link, to `link_peer`, stops reading meanwhile). Not while the first
/// waits for `link_peer` itself: the room toward it comes with the acknowledgements
/// that link reads (unless `WAITING_BYTES_MAX` wait already).
pub(crate) async fn wait_blocked_forwards(shared: &Shared, link_peer: BusId) {
    while let Some((peer, len, give_up_at)) = push_blocked_forwards(shared) {
        if peer.id == link_peer && !shared.group.table.waiting.over_bound() {
            return;
        }
        match give_up_at {
            None => peer.wait_for_room(len).await,
            Some(at) => {
                let now = shared.clock.coarse_ms();
                // The coarse clock moves every `TIMER_TICK_MS`: one more
                // interval and the give-up time is surely past on it.
                let left = at.saturating_sub(now) + TIMER_TICK_MS;
                let _ = tokio::time::timeout(Duration::from_millis(left), peer.wait_for_room(len))
                    .await;
            }
        }
    }
}

/// The publishes of a PUBLISH `body` (a batch's each) could not be passed on: counted.
fn forwards_dropped(shared: &Shared, body: &[u8]) {
    shared.counters.group_forwards_dropped.fetch_add(
        publishes::publishes_in(body),
        std::sync::atomic::Ordering::Relaxed,
    );
}
