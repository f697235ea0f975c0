//! On-demand direct links. A relay that passes a source's data to a destination it has a link
//! to hints the source where the destination listens (ROUTED HINT); the source dials it, and
//! later traffic goes direct. Order holds across the switch: when the direct link comes up,
//! messages queued on it wait until everything sent through relays before is acknowledged
//! (`Remote::supersede`, `Peer::hold`).
//!
//! Hints are ROUTED traffic: a relay sends them and a source takes them in `route`; the link
//! part's `connector::direct_dial_loop` dials, and this module switches. The dialer owns the link: it redials it with backoff while the
//! peer is not given up, and once the peer stays down past `peer_dead_after_ms`, traffic to it
//! goes back through relays (a later hint may bring the direct link back).

use crate::peer::Peer;
use crate::route;
use crate::shared::Shared;

/// A direct link to `id` is being attached: later sends go to it, and its messages wait
/// until what went through relays before is acknowledged.
pub(crate) fn switch_to_direct(shared: &Shared, peer: &Peer) {
    if let Some(r) = route::remote_of(shared, peer.id) {
        if r.supersede() > 0 {
            peer.hold();
            // The last acknowledgement may have come between the count and the hold.
            route::release_if_drained(shared, peer.id);
        }
    }
}
