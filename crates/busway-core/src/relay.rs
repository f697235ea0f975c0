//! Routing decisions, sans-IO: which neighbor takes a frame for a destination, and what a relay
//! does to a ROUTED header before passing it on. The runtime and the simulated cluster in the
//! tests both decide with these functions.

use crate::id::BusId;
use crate::routed::{FailReason, RoutedHeader, ROUTE_LEN_MAX};

/// What routing needs to know about one neighbor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbor {
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
/// subtree holds `dst`; the upstream. Only neighbors whose link is up count, and never
/// `except` (the neighbor the frame came from).
pub fn next_hop(
    dst: BusId,
    neighbors: &[Neighbor],
    upstream: Option<BusId>,
    except: Option<BusId>,
) -> Option<BusId> {
    let usable = |n: &&Neighbor| n.up && Some(n.id) != except;
    let mut candidates = neighbors.iter().filter(usable);
    if let Some(n) = candidates.clone().find(|n| n.id == dst) {
        return Some(n.id);
    }
    if let Some(n) = candidates.clone().find(|n| n.serves(dst)) {
        return Some(n.id);
    }
    let up = upstream?;
    candidates.find(|n| n.id == up).map(|n| n.id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routed::RoutedType;

    fn n(id: u64, up: bool, serves: Option<(u64, u64)>) -> Neighbor {
        Neighbor {
            id: BusId(id),
            up,
            serves: serves.map(|(a, b)| (BusId(a), BusId(b))),
        }
    }

    #[test]
    fn direct_then_subtree_then_upstream() {
        let ns = [
            n(1, true, None),
            n(2, true, Some((10, 19))),
            n(3, true, None),
        ];
        let up = Some(BusId(3));
        assert_eq!(next_hop(BusId(1), &ns, up, None), Some(BusId(1)));
        assert_eq!(next_hop(BusId(15), &ns, up, None), Some(BusId(2)));
        assert_eq!(next_hop(BusId(99), &ns, up, None), Some(BusId(3)));
        assert_eq!(next_hop(BusId(99), &ns, None, None), None);
        // Never back where it came from, and never over a link that is down.
        assert_eq!(next_hop(BusId(99), &ns, up, Some(BusId(3))), None);
        let down = [n(1, false, None), n(3, true, None)];
        assert_eq!(next_hop(BusId(1), &down, up, None), Some(BusId(3)));
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
