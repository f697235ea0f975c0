//! Publishes a relay passes on that wait for room toward a peer whose queue was full, in
//! order. While any wait, the links that bring publishes stop reading, so the wait goes back
//! to the publisher through each link's own flow control (`docs/SEMANTICS.md`, "Groups").
//!
//! Under backpressure a publish waits as long as it takes. Under cut-off it waits until a
//! time set when it was queued (the runtime's `group_wait_ms`): past it, every cut-off
//! publish waiting for that peer is dropped, and the peer is *lagging*: later cut-off
//! publishes that do not fit are dropped for it at once, until one fits again. A member that
//! reads keeps its stream whole this way; one that stops reading costs the others one wait,
//! not one per publish. Sans-IO: the caller passes the time in and pushes toward its peers.

use crate::BusId;
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};

/// Bytes of publishes that may wait before even the link of the peer waited for stops
/// reading (it reads on below it: its acknowledgements make the room). Past it, that peer's
/// acknowledgements wait too, until its cut-off publishes' give-up time (bounded memory over a
/// link that both lags as a member and brings publishes for others).
pub const WAITING_BYTES_MAX: usize = 64 << 20;

/// Room, in bytes, a lagging peer's queue must have again for it to be caught up (no longer
/// skipped at once): a whole batch's. A queue that takes only a small frame now and then (a
/// member that stopped reading, whose node acknowledges a little at a time) keeps its peer
/// skipped, rather than making the next publish that does not fit wait for it once more.
pub const CAUGHT_UP_ROOM_BYTES: usize = crate::group::PUBLISH_BATCH_BODY_BYTES_MAX;

/// One publish (or mark) body waiting for room toward `peer`.
struct Waiting {
    peer: BusId,
    body: Bytes,
    /// Under cut-off: when (ms on the node's clock) this publish is dropped for `peer` if
    /// it still does not fit; `None` under backpressure.
    give_up_at_ms: Option<u64>,
}

/// The publishes waiting for room toward peers (see the module's documentation).
#[derive(Default)]
pub struct WaitingForwards {
    /// In arrival order; a peer's publishes stay behind the first one waiting for it.
    queue: VecDeque<Waiting>,
    /// How many of `queue` wait for each peer (a forward looks here, not along the queue).
    per_peer: HashMap<BusId, usize>,
    /// Bytes of the bodies in `queue`.
    bytes: usize,
    /// Peers whose cut-off publishes were dropped for want of room, until one fits again.
    lagging: HashSet<BusId>,
}

/// What a push toward a peer made of a frame (a waiting publish, a mark, a multicast).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Push {
    /// Queued for the peer's link.
    Sent,
    /// No room yet.
    Full,
    /// The peer is gone or cannot take it: dropped (counted by the caller).
    Gone,
}

/// What [`WaitingForwards::push`] left: the first publish still waiting (its peer, length and
/// give-up time), and the cut-off publishes given up on for a peer that stayed full.
#[derive(Default)]
pub struct Pushed {
    /// The peer, body length and give-up time of the first publish that still waits.
    pub waits: Option<(BusId, usize, Option<u64>)>,
    /// (peer, body) of each cut-off publish dropped: its peer is owed a mark.
    pub dropped: Vec<(BusId, Bytes)>,
}

impl WaitingForwards {
    /// Whether no publish waits for room.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a publish waits for room toward `peer` already (later ones go behind it).
    pub fn waits_for(&self, peer: BusId) -> bool {
        self.per_peer.contains_key(&peer)
    }

    /// Whether the publishes waiting hold more than `WAITING_BYTES_MAX`.
    pub fn over_bound(&self) -> bool {
        self.bytes > WAITING_BYTES_MAX
    }

    /// Whether any peer is lagging.
    pub fn any_lagging(&self) -> bool {
        !self.lagging.is_empty()
    }

    /// Whether cut-off publishes toward `peer` are dropped at once while it is full.
    pub fn is_lagging(&self, peer: BusId) -> bool {
        self.lagging.contains(&peer)
    }

    /// A cut-off publish fit toward `peer`: it is not lagging any more.
    pub fn caught_up(&mut self, peer: BusId) {
        self.lagging.remove(&peer);
    }

    /// Queues `body` for `peer` until it fits (`give_up_at_ms`: see [`Waiting`]).
    pub fn wait(&mut self, peer: BusId, body: Bytes, give_up_at_ms: Option<u64>) {
        *self.per_peer.entry(peer).or_default() += 1;
        self.bytes += body.len();
        self.queue.push_back(Waiting {
            peer,
            body,
            give_up_at_ms,
        });
    }

    /// `n` of the publishes waiting for `peer` left the queue.
    fn taken(&mut self, peer: BusId, n: usize) {
        if let Some(left) = self.per_peer.get_mut(&peer) {
            *left -= n;
            if *left == 0 {
                self.per_peer.remove(&peer);
            }
        }
    }

    /// Pushes the waiting publishes in order with `push` until one finds no room; a cut-off
    /// publish whose time is up (at `now_ms`) is dropped instead, with every other cut-off
    /// one waiting for the same peer, and that peer becomes lagging.
    pub fn push(&mut self, now_ms: u64, mut push: impl FnMut(BusId, &Bytes) -> Push) -> Pushed {
        let mut out = Pushed::default();
        while let Some(w) = self.queue.front() {
            match push(w.peer, &w.body) {
                Push::Sent | Push::Gone => {
                    let (peer, len) = (w.peer, w.body.len());
                    self.queue.pop_front();
                    self.taken(peer, 1);
                    self.bytes -= len;
                }
                Push::Full if w.give_up_at_ms.is_some_and(|t| t <= now_ms) => {
                    let peer = w.peer;
                    let before = out.dropped.len();
                    self.queue.retain(|w| {
                        let drop = w.peer == peer && w.give_up_at_ms.is_some();
                        if drop {
                            out.dropped.push((peer, w.body.clone()));
                        }
                        !drop
                    });
                    let dropped = out.dropped.len() - before;
                    self.taken(peer, dropped);
                    self.bytes -= out.dropped[before..]
                        .iter()
                        .map(|(_, b)| b.len())
                        .sum::<usize>();
                    self.lagging.insert(peer);
                }
                Push::Full => {
                    out.waits = Some((w.peer, w.body.len(), w.give_up_at_ms));
                    return out;
                }
            }
        }
        out
    }

    /// `peer` is gone: nothing waits for it any more.
    pub fn peer_gone(&mut self, peer: BusId) {
        self.queue.retain(|w| w.peer != peer);
        self.bytes = self.queue.iter().map(|w| w.body.len()).sum();
        self.per_peer.remove(&peer);
        self.lagging.remove(&peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn publishes_go_in_order_as_room_comes() {
        let mut f = WaitingForwards::default();
        f.wait(BusId(1), body(1), None);
        f.wait(BusId(1), body(2), Some(10));
        assert!(f.waits_for(BusId(1)) && !f.waits_for(BusId(2)));
        let mut sent = Vec::new();
        let out = f.push(0, |_, b| {
            sent.push(b[0]);
            Push::Sent
        });
        assert_eq!(sent, vec![1, 2]);
        assert!(out.waits.is_none() && out.dropped.is_empty() && f.is_empty());
    }

    #[test]
    fn a_cut_off_publish_past_its_time_is_dropped_with_the_others_for_that_peer_only() {
        let mut f = WaitingForwards::default();
        f.wait(BusId(1), body(1), Some(10));
        f.wait(BusId(2), body(2), Some(10));
        f.wait(BusId(1), body(3), None);
        f.wait(BusId(1), body(4), Some(12));
        let full_1 = |p: BusId, _: &Bytes| {
            if p == BusId(1) {
                Push::Full
            } else {
                Push::Sent
            }
        };
        let out = f.push(9, full_1);
        assert_eq!(out.waits, Some((BusId(1), 1, Some(10))), "not yet");
        assert!(!f.is_lagging(BusId(1)));
        let out = f.push(10, full_1);
        let dropped: Vec<_> = out.dropped.iter().map(|(p, b)| (p.0, b[0])).collect();
        assert_eq!(dropped, vec![(1, 1), (1, 4)]);
        assert!(f.is_lagging(BusId(1)) && !f.is_lagging(BusId(2)));
        // The backpressure publish for peer 1 still waits, after 2 went.
        assert_eq!(out.waits, Some((BusId(1), 1, None)));
        f.caught_up(BusId(1));
        assert!(!f.is_lagging(BusId(1)) && !f.any_lagging());
        f.peer_gone(BusId(1));
        assert!(f.is_empty());
        assert!(!f.over_bound());
        f.wait(
            BusId(3),
            Bytes::from(vec![0; WAITING_BYTES_MAX + 1]),
            Some(20),
        );
        assert!(f.over_bound(), "the bytes are counted");
        let out = f.push(20, |_, _| Push::Full);
        assert_eq!(out.dropped.len(), 1);
        assert!(!f.over_bound(), "and given back when dropped");
    }
}
