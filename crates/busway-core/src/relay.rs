//! Routing decisions, sans-IO: which neighbor takes a frame for a destination, and what a relay
//! does to a ROUTED header before passing it on. The runtime and the simulated cluster in the
//! tests both decide with these functions.

use crate::id::BusId;
pub use crate::registry::Registry;
use crate::routed::{FailReason, RoutedHeader, ROUTE_LEN_MAX};

/// What routing needs to know about one neighbor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbor {
    /// The neighbor's bus id.
    pub id: BusId,
    /// Whether a link to it is up now.
    pub up: bool,
    /// The ids it registered as its subtree (it is our downstream), if any.
    pub serves: Option<(BusId, BusId)>,
}

impl Neighbor {
    fn serves(&self, dst: BusId) -> bool {
        self.serves.is_some_and(|(lo, hi)| lo <= dst && dst <= hi)
    }
}

/// The neighbor that takes a frame for `dst`, in order: `dst` itself; a downstream whose
/// subtree holds `dst` (declared in its HELLO, or registered since: `registered_by`, the
/// neighbor the node's [`Registry`] names for `dst`); the upstream. Only neighbors whose link
/// is up count, and never `except` (the neighbor the frame came from). A destination in the
/// subtree of a downstream whose link is down has no hop for now: the upstream would only
/// send it back down here. A registration by a neighbor given up (one that no longer serves
/// its declared range either) counts for nothing.
pub fn next_hop(
    dst: BusId,
    neighbors: &[Neighbor],
    upstream: Option<BusId>,
    except: Option<BusId>,
    registered_by: Option<BusId>,
) -> Option<BusId> {
    let usable = |n: &&Neighbor| n.up && Some(n.id) != except;
    let mut candidates = neighbors.iter().filter(usable);
    if let Some(n) = candidates.clone().find(|n| n.id == dst) {
        return Some(n.id);
    }
    let below = |n: &Neighbor| n.serves(dst) || (Some(n.id) == registered_by && n.serves.is_some());
    if let Some(n) = candidates.clone().find(|n| below(n)) {
        return Some(n.id);
    }
    if neighbors
        .iter()
        .any(|n| !n.up && Some(n.id) != except && below(n))
    {
        return None;
    }
    let up = upstream?;
    candidates.find(|n| n.id == up).map(|n| n.id)
}

/// Which sources a link may carry ROUTED frames from: a member may not speak for others. Over
/// the link to the upstream comes whatever the rest of the bus sends; over a link to a
/// registered downstream, frames of the downstream and of the ids it registered as its
/// subtree; over any other link, the peer's own frames only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sources {
    /// The link's peer.
    pub peer: BusId,
    /// The subtree it registered with us (it is our downstream), if any.
    pub serves: Option<(BusId, BusId)>,
    /// The peer is our upstream.
    pub upstream: bool,
}

impl Sources {
    /// Whether a ROUTED frame from `src` may come over this link; the error names the lie.
    /// `registered_by` looks up who registered an id since (see [`Registry::lookup`]); it is
    /// asked only when the link's fixed rule does not let `src` through.
    pub fn check(
        &self,
        src: BusId,
        registered_by: impl FnOnce(BusId) -> Option<BusId>,
    ) -> Result<(), String> {
        self.check_frame(src, "ROUTED frame", registered_by)
    }

    /// Whether `what` (a kind of frame) of `src` (its source, or a group's publisher) may come
    /// over this link, by the rule ROUTED frames follow; the error names the lie.
    pub fn check_frame(
        &self,
        src: BusId,
        what: &str,
        registered_by: impl FnOnce(BusId) -> Option<BusId>,
    ) -> Result<(), String> {
        let served = self.serves.is_some_and(|(lo, hi)| lo <= src && src <= hi);
        if src == self.peer || self.upstream || served {
            return Ok(());
        }
        // A downstream's later registrations (a relay's own downstreams).
        if self.serves.is_some() && registered_by(src) == Some(self.peer) {
            return Ok(());
        }
        let registered = match self.serves {
            Some((lo, hi)) => {
                format!("which declared bus ids {lo}..={hi} and registered no more that holds it")
            }
            None => "which registered no subtree".to_string(),
        };
        Err(format!(
            "{what} from bus id {src} on the link to bus id {} ({registered}): a peer may not send for others",
            self.peer
        ))
    }
}

/// Checks a subtree that `peer` registers with relay `me` (HELLO's downstream-of-you):
/// `(lo, hi)` in order, not holding `me`, and overlapping no subtree registered by
/// another neighbor that is not given up (`others`; a neighbor given up serves nothing, see
/// `Neighbor::serves`). The error names the conflict.
pub fn check_registration(
    me: BusId,
    peer: BusId,
    (lo, hi): (BusId, BusId),
    others: &[Neighbor],
    registry: &Registry,
) -> Result<(), String> {
    let what = format!("bus id {peer} registers bus ids {lo}..={hi}");
    if lo > hi {
        return Err(format!("{what}: an empty range"));
    }
    if lo <= me && me <= hi {
        return Err(format!("{what}, which holds this relay's own id {me}"));
    }
    for n in others.iter().filter(|n| n.id != peer) {
        if let Some((l, h)) = n.serves {
            if lo <= h && l <= hi {
                return Err(format!(
                    "{what}, which overlaps bus ids {l}..={h} registered by bus id {}",
                    n.id
                ));
            }
        }
    }
    if let Some(((l, h), other)) = registry.overlapping((lo, hi), peer) {
        return Err(format!(
            "{what}, which overlaps bus ids {l}..={h} registered by bus id {other}"
        ));
    }
    Ok(())
}

/// A relay `me` takes a ROUTED frame for another node: checks its TTL and route, then
/// decrements the TTL and appends `me` to the route. An error gives the reason and a text that
/// names the relay, for a FAIL to the source.
pub fn pass_on(header: &mut RoutedHeader, me: BusId) -> Result<(), (FailReason, String)> {
    if header.ttl == 0 {
        return Err((
            FailReason::TtlExceeded,
            format!(
                "TTL exceeded at relay {me} after {} relays",
                header.route.len()
            ),
        ));
    }
    if header.route.contains(&me) || header.route.len() >= ROUTE_LEN_MAX {
        return Err((
            FailReason::Loop,
            format!(
                "routing loop: relay {me} is already on the route {:?}",
                header.route
            ),
        ));
    }
    header.ttl -= 1;
    header.route.push(me);
    Ok(())
}

/// What a relay knows when it decides about a frame for another node.
#[derive(Clone, Copy, Debug)]
pub struct RelayView<'a> {
    /// This relay.
    pub me: BusId,
    /// Its neighbors and their links.
    pub neighbors: &'a [Neighbor],
    /// Its upstream, once a link to it was up.
    pub upstream: Option<BusId>,
    /// Milliseconds since the relay started, and how long after its start it still calls an
    /// unknown destination down rather than unknown (its downstreams may not have registered
    /// again yet).
    pub uptime_ms: u64,
    /// How long after its start, in milliseconds, an unknown destination is called down.
    pub grace_ms: u64,
    /// What its downstreams registered beyond their HELLO's ranges.
    pub registry: &'a Registry,
}

/// Why a relay does not pass a frame on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Why, as the FAIL frame's reason code.
    pub reason: FailReason,
    /// Names the relay and the destination, for the FAIL's text.
    pub text: String,
    /// Whether the source is told (a FAIL for DATA; a lost ACK, FAIL or HINT is regenerated by
    /// its ends, and a FAIL about a FAIL could loop).
    pub report: bool,
}

/// A relay takes a ROUTED frame for another node from neighbor `from`: updates its header
/// ([`pass_on`]) and returns the neighbor to pass it to, or why not. The whole decision of a
/// relay, for the runtime and the simulated cluster alike.
pub fn forward(
    header: &mut RoutedHeader,
    from: BusId,
    view: &RelayView<'_>,
) -> Result<BusId, Refusal> {
    let me = view.me;
    let report = header.kind == crate::routed::RoutedType::Data;
    pass_on(header, me).map_err(|(reason, text)| Refusal {
        reason,
        text,
        report,
    })?;
    let dst = header.dst;
    let registered_by = view.registry.lookup(dst);
    if let Some(hop) = next_hop(
        dst,
        view.neighbors,
        view.upstream,
        Some(from),
        registered_by,
    ) {
        return Ok(hop);
    }
    let down = |id: BusId| view.neighbors.iter().all(|n| n.id != id || !n.up);
    // The upstream takes what nobody below serves, unless that is where the frame came from.
    let upstream_down = view.upstream.filter(|&u| u != from && down(u));
    // The neighbor the frame came from does not count: it sent the frame up for want of a
    // route itself.
    let others = || view.neighbors.iter().filter(|n| n.id != from);
    let (reason, text) = if others().any(|n| n.id == dst) {
        (
            FailReason::PeerDown,
            format!("bus id {dst} is down (at relay {me})"),
        )
    } else if let Some(n) = others()
        .find(|n| !n.up && (n.serves(dst) || (Some(n.id) == registered_by && n.serves.is_some())))
    {
        (
            FailReason::PeerDown,
            format!(
                "bus id {dst} is behind relay {}, whose link to relay {me} is down",
                n.id
            ),
        )
    } else if let Some(up) = upstream_down {
        (
            FailReason::PeerDown,
            format!("no path to bus id {dst} at relay {me} now: its upstream {up} is down"),
        )
    } else if view.uptime_ms < view.grace_ms {
        (
            FailReason::PeerDown,
            format!(
                "bus id {dst} is not registered (yet) at relay {me}, which started {} ms ago",
                view.uptime_ms
            ),
        )
    } else {
        (
            FailReason::UnknownId,
            format!("no route to bus id {dst} at relay {me}"),
        )
    };
    Err(Refusal {
        reason,
        text,
        report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routed::RoutedType;

    fn data_for(dst: u64) -> RoutedHeader {
        RoutedHeader {
            kind: RoutedType::Data,
            ttl: 4,
            src: BusId(1),
            src_incarnation: 9,
            dst: BusId(dst),
            seq: 0,
            settled: false,
            route: vec![],
        }
    }

    #[test]
    fn a_destination_below_a_cut_downstream_is_not_looked_for_above() {
        let neighbors = [n(9, true, None), n(5, false, Some((7, 9)))];
        assert_eq!(
            next_hop(BusId(8), &neighbors, Some(BusId(9)), None, None),
            None
        );
        assert_eq!(
            next_hop(BusId(3), &neighbors, Some(BusId(9)), None, None),
            Some(BusId(9)),
            "an id nobody below serves goes up"
        );
    }

    #[test]
    fn a_relay_forwards_or_names_why_not() {
        let neighbors = [n(2, true, None), n(3, false, None), n(1, true, None)];
        let none = Registry::default();
        let view = |uptime_ms| RelayView {
            me: BusId(100),
            neighbors: &neighbors,
            upstream: None,
            uptime_ms,
            grace_ms: 1_000,
            registry: &none,
        };
        let mut h = data_for(2);
        assert_eq!(forward(&mut h, BusId(1), &view(5_000)), Ok(BusId(2)));
        assert_eq!((h.ttl, h.route.clone()), (3, vec![BusId(100)]));
        let down = forward(&mut data_for(3), BusId(1), &view(5_000)).unwrap_err();
        assert_eq!(down.reason, FailReason::PeerDown);
        assert!(down.report && down.text.contains("bus id 3 is down"));
        let early = forward(&mut data_for(7), BusId(1), &view(10)).unwrap_err();
        assert_eq!(early.reason, FailReason::PeerDown);
        assert!(early.text.contains("not registered (yet)"));
        let unknown = forward(&mut data_for(7), BusId(1), &view(5_000)).unwrap_err();
        assert_eq!(unknown.reason, FailReason::UnknownId);
        // Behind a downstream whose link is down, or with the upstream down: for now only.
        let below = [
            n(2, true, None),
            n(5, false, Some((7, 9))),
            n(1, true, None),
        ];
        let mut v = view(5_000);
        v.neighbors = &below;
        let behind = forward(&mut data_for(8), BusId(1), &v).unwrap_err();
        assert_eq!(behind.reason, FailReason::PeerDown);
        assert!(behind.text.contains("behind relay 5"), "{}", behind.text);
        v.neighbors = &neighbors;
        v.upstream = Some(BusId(3));
        let cut_off = forward(&mut data_for(8), BusId(1), &v).unwrap_err();
        assert_eq!(cut_off.reason, FailReason::PeerDown);
        assert!(
            cut_off.text.contains("its upstream 3 is down"),
            "{}",
            cut_off.text
        );
        let from_above = forward(&mut data_for(8), BusId(3), &v).unwrap_err();
        assert_eq!(from_above.reason, FailReason::UnknownId, "not sent back up");
        // A downstream that serves the id but sent the frame up (the id never came): unknown.
        let serving = [n(5, true, Some((7, 9)))];
        let v = RelayView {
            neighbors: &serving,
            ..view(5_000)
        };
        let e = forward(&mut data_for(8), BusId(5), &v).unwrap_err();
        assert_eq!(e.reason, FailReason::UnknownId, "{}", e.text);
        let mut ack = data_for(7);
        ack.kind = RoutedType::Ack;
        assert!(
            !forward(&mut ack, BusId(1), &view(5_000))
                .unwrap_err()
                .report
        );
        let mut spent = data_for(2);
        spent.ttl = 0;
        let e = forward(&mut spent, BusId(1), &view(5_000)).unwrap_err();
        assert_eq!(e.reason, FailReason::TtlExceeded);
    }

    fn n(id: u64, up: bool, serves: Option<(u64, u64)>) -> Neighbor {
        Neighbor {
            id: BusId(id),
            up,
            serves: serves.map(|(a, b)| (BusId(a), BusId(b))),
        }
    }

    #[test]
    fn a_registered_id_is_routed_to_and_accepted_from_its_live_downstream_only() {
        let me = BusId(100);
        let mut reg = Registry::default();
        reg.add(me, BusId(2), (BusId(31), BusId(32)), None).unwrap();
        let by = reg.lookup(BusId(31));
        let ns = [n(2, true, Some((2, 2))), n(3, true, None)];
        let up = Some(BusId(3));
        assert_eq!(next_hop(BusId(31), &ns, up, None, by), Some(BusId(2)));
        let cut = [n(2, false, Some((2, 2))), n(3, true, None)];
        assert_eq!(
            next_hop(BusId(31), &cut, up, None, by),
            None,
            "down for now"
        );
        let given_up = [n(2, false, None), n(3, true, None)];
        assert_eq!(
            next_hop(BusId(31), &given_up, up, None, by),
            Some(BusId(3)),
            "a downstream given up serves nothing"
        );
        let link = Sources {
            peer: BusId(2),
            serves: Some((BusId(2), BusId(2))),
            upstream: false,
        };
        assert!(link.check(BusId(31), |id| reg.lookup(id)).is_ok());
        assert!(link.check(BusId(33), |id| reg.lookup(id)).is_err());
        let other = Sources {
            peer: BusId(4),
            ..link
        };
        assert!(
            other.check(BusId(31), |id| reg.lookup(id)).is_err(),
            "only the link that registered it"
        );
        let clash = check_registration(me, BusId(5), (BusId(30), BusId(31)), &[], &reg);
        assert!(clash.unwrap_err().contains("registered by bus id 2"));
    }

    #[test]
    fn direct_then_subtree_then_upstream() {
        let ns = [
            n(1, true, None),
            n(2, true, Some((10, 19))),
            n(3, true, None),
        ];
        let up = Some(BusId(3));
        assert_eq!(next_hop(BusId(1), &ns, up, None, None), Some(BusId(1)));
        assert_eq!(next_hop(BusId(15), &ns, up, None, None), Some(BusId(2)));
        assert_eq!(next_hop(BusId(99), &ns, up, None, None), Some(BusId(3)));
        assert_eq!(next_hop(BusId(99), &ns, None, None, None), None);
        // Never back where it came from, and never over a link that is down.
        assert_eq!(next_hop(BusId(99), &ns, up, Some(BusId(3)), None), None);
        let down = [n(1, false, None), n(3, true, None)];
        assert_eq!(next_hop(BusId(1), &down, up, None, None), Some(BusId(3)));
    }

    #[test]
    fn a_link_carries_frames_only_from_the_sources_it_may_speak_for() {
        let plain = Sources {
            peer: BusId(9),
            serves: None,
            upstream: false,
        };
        assert!(plain.check(BusId(9), |_| None).is_ok());
        let lie = plain.check(BusId(2), |_| None).unwrap_err();
        assert!(
            lie.contains("from bus id 2 on the link to bus id 9"),
            "{lie}"
        );
        let below = Sources {
            serves: Some((BusId(9), BusId(20))),
            ..plain
        };
        assert!(below.check(BusId(15), |_| None).is_ok());
        assert!(below.check(BusId(21), |_| None).is_err());
        let above = Sources {
            upstream: true,
            ..plain
        };
        assert!(above.check(BusId(12_345), |_| None).is_ok());
    }

    #[test]
    fn a_registration_must_hold_its_peer_not_the_relay_and_overlap_nothing_live() {
        let me = BusId(100);
        let reg = |peer, lo, hi, others: &[Neighbor]| {
            check_registration(
                me,
                BusId(peer),
                (BusId(lo), BusId(hi)),
                others,
                &Registry::default(),
            )
        };
        assert!(reg(9, 9, 20, &[]).is_ok());
        assert!(reg(9, 20, 9, &[]).unwrap_err().contains("empty"));
        assert!(
            reg(9, 10, 20, &[]).is_ok(),
            "a relay may serve ids other than its own"
        );
        let all = reg(9, 0, u64::MAX, &[]).unwrap_err();
        assert!(all.contains("relay's own id 100"), "{all}");
        let live = [n(15, true, Some((15, 30)))];
        let overlap = reg(9, 9, 20, &live).unwrap_err();
        assert!(overlap.contains("registered by bus id 15"), "{overlap}");
        let down = [n(15, false, Some((15, 30)))];
        assert!(
            reg(9, 9, 20, &down).is_err(),
            "down for now still holds its ids"
        );
        let gone = [n(15, false, None)];
        assert!(
            reg(9, 9, 20, &gone).is_ok(),
            "a neighbor given up holds nothing"
        );
    }

    #[test]
    fn ttl_and_loops_are_refused_with_the_relay_named() {
        let mut h = RoutedHeader {
            kind: RoutedType::Data,
            ttl: 1,
            src: BusId(1),
            src_incarnation: 0,
            dst: BusId(2),
            seq: 0,
            settled: false,
            route: vec![],
        };
        pass_on(&mut h, BusId(7)).unwrap();
        assert_eq!((h.ttl, h.route.clone()), (0, vec![BusId(7)]));
        let (r, text) = pass_on(&mut h, BusId(8)).unwrap_err();
        assert_eq!(r, FailReason::TtlExceeded);
        assert!(text.contains("relay 8"), "{text}");
        h.ttl = 5;
        let (r, _) = pass_on(&mut h, BusId(7)).unwrap_err();
        assert_eq!(r, FailReason::Loop);
    }
}
