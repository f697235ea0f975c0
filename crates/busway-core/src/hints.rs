//! On-demand direct links, sans-IO: when a relay hints a source where a destination listens
//! (ROUTED HINT), and what a source does with hints. The switch itself, in order, is
//! [`crate::e2e::Departures::supersede`]'s.

use crate::id::BusId;
use std::collections::{HashMap, HashSet};

/// Most (source, destination) pairs a relay remembers hinting; past it, it forgets them all
/// (and may hint each once more).
pub const HINTS_TRACKED_MAX: usize = 4_096;
/// A relay hints one pair at most this often, in ms.
pub const HINT_INTERVAL_MS: u64 = 1_000;
/// Most direct links a source dials or keeps at once (hints past it are dropped; later ones
/// come again).
pub const DIRECT_DIALS_MAX: usize = 256;

/// Source side, per destination reached through relays: which relays may hint it. A HINT
/// redirects a destination's traffic to whoever listens at the addresses it names, so only the
/// relay that passes our traffic to the destination may send one: a relay on the route of the
/// destination's own acknowledgements. A hint from another relay is held (the latest one) until
/// an acknowledgement shows that relay on the way, and dropped otherwise.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HintGate {
    /// The relays on the route of the last acknowledgement from the destination.
    route: Vec<BusId>,
    /// The latest hint from a relay not (yet) seen on that route.
    held: Option<(BusId, Vec<String>)>,
}

impl HintGate {
    /// `relay` hints that the destination listens at `addrs`: the addresses to dial now, or
    /// `None` (held until an acknowledgement comes through `relay`).
    pub fn on_hint(&mut self, relay: BusId, addrs: Vec<String>) -> Option<Vec<String>> {
        if self.route.contains(&relay) {
            return Some(addrs);
        }
        self.held = Some((relay, addrs));
        None
    }

    /// An acknowledgement from the destination came through the relays `route`: a held hint
    /// from one of them is now to be dialed.
    pub fn on_ack(&mut self, route: &[BusId]) -> Option<Vec<String>> {
        if self.route != route {
            self.route = route.to_vec();
        }
        match self.held.take() {
            Some((relay, addrs)) if route.contains(&relay) => Some(addrs),
            held => {
                self.held = held;
                None
            }
        }
    }
}

/// A node's bookkeeping of direct links: hints given (relay side), hints taken and dials
/// running (source side). Bounded by the limits above.
#[derive(Debug, Default)]
pub struct HintBook {
    /// Relay side: when each (source, destination) pair was last hinted, in ms.
    hinted: HashMap<(BusId, BusId), u64>,
    /// Source side: hints waiting to be dialed.
    pending: Vec<(BusId, Vec<String>)>,
    /// Destinations being dialed (or whose direct link a dial keeps up).
    dialing: HashSet<BusId>,
}

impl HintBook {
    /// Relay side: a DATA frame from `src` reaches its destination `dst` through this relay.
    /// Whether to hint `src` now (at most every [`HINT_INTERVAL_MS`] per pair; `dst` must
    /// accept direct links, which the caller checks); if so, it counts as hinted.
    pub fn due(&mut self, src: BusId, dst: BusId, now_ms: u64) -> bool {
        if self.hinted.len() >= HINTS_TRACKED_MAX {
            self.hinted.clear();
        }
        let last = self.hinted.entry((src, dst)).or_insert(0);
        if *last != 0 && now_ms.saturating_sub(*last) < HINT_INTERVAL_MS {
            return false;
        }
        *last = now_ms.max(1);
        true
    }

    /// Source side: a relay says `dst` listens at `addrs`. Kept for dialing unless `dst` is
    /// dialed already or [`DIRECT_DIALS_MAX`] dials run or wait; true if kept.
    pub fn take_hint(&mut self, dst: BusId, addrs: Vec<String>) -> bool {
        if addrs.is_empty()
            || self.dialing.contains(&dst)
            || self.pending.iter().any(|(d, _)| *d == dst)
            || self.dialing.len() + self.pending.len() >= DIRECT_DIALS_MAX
        {
            return false;
        }
        self.pending.push((dst, addrs));
        true
    }

    /// The hints to dial now; each becomes a running dial.
    pub fn dials_to_start(&mut self) -> Vec<(BusId, Vec<String>)> {
        let hints = std::mem::take(&mut self.pending);
        hints
            .into_iter()
            .filter(|(dst, _)| self.dialing.insert(*dst))
            .collect()
    }

    /// The dial of `dst` ended (the link was given up, or never came up).
    pub fn dial_ended(&mut self, dst: BusId) {
        self.dialing.remove(&dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_hinted_once_a_second() {
        let mut b = HintBook::default();
        assert!(b.due(BusId(1), BusId(2), 10));
        assert!(!b.due(BusId(1), BusId(2), 500));
        assert!(b.due(BusId(3), BusId(2), 500), "another pair");
        assert!(b.due(BusId(1), BusId(2), 10 + HINT_INTERVAL_MS));
    }

    #[test]
    fn a_destination_is_dialed_once_and_dials_are_bounded() {
        let mut b = HintBook::default();
        assert!(b.take_hint(BusId(2), vec!["tcp://a".into()]));
        assert!(
            !b.take_hint(BusId(2), vec!["tcp://b".into()]),
            "waiting already"
        );
        assert!(!b.take_hint(BusId(3), vec![]), "nowhere to dial");
        assert_eq!(b.dials_to_start().len(), 1);
        assert!(
            !b.take_hint(BusId(2), vec!["tcp://a".into()]),
            "dialing already"
        );
        b.dial_ended(BusId(2));
        assert!(b.take_hint(BusId(2), vec!["tcp://a".into()]));
        for i in 0..DIRECT_DIALS_MAX as u64 {
            b.take_hint(BusId(100 + i), vec!["tcp://x".into()]);
        }
        assert_eq!(b.dials_to_start().len(), DIRECT_DIALS_MAX);
    }

    #[test]
    fn only_a_relay_on_the_way_of_the_acknowledgements_may_hint() {
        let mut g = HintGate::default();
        let at = |p: &str| vec![p.to_string()];
        // Before any acknowledgement, a hint waits.
        assert_eq!(g.on_hint(BusId(100), at("tcp://h:1")), None);
        // An acknowledgement through 100 lets it go.
        assert_eq!(g.on_ack(&[BusId(100), BusId(50)]), Some(at("tcp://h:1")));
        assert_eq!(g.on_hint(BusId(50), at("tcp://h:2")), Some(at("tcp://h:2")));
        // A member that never carried the traffic is held, and never dialed while the
        // acknowledgements come another way.
        assert_eq!(g.on_hint(BusId(66), at("tcp://evil:1")), None);
        assert_eq!(g.on_ack(&[BusId(100)]), None);
        assert_eq!(g.on_ack(&[BusId(100)]), None);
    }
}
