//! What a node knows of groups: the groups it joined, which of its peers asked for which
//! group's publishes (INTEREST messages), what it told each peer it wants, the numbers of its
//! own publishes, and the last publish it saw from each publisher (to drop a copy that came by
//! a second path and to see a gap).
//!
//! Interest follows the tree. A node tells a peer it wants a group when it joined the group
//! itself, or when another peer on a tree link (its upstream, or a downstream registered with
//! it) wants it. Interest a peer states on any other link (a `connect` link, a direct link)
//! counts for that peer alone: passed on from such links, interest could go round a cycle of
//! links and outlive the member that stated it. Publishes go to every peer that asked,
//! whatever its link; a node that sees a publish twice drops the second.

use crate::limits::GROUPS_JOINED_MAX;
use busway_core::group::PublishHead;
use busway_core::BusId;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// A group's name (checked: 1 to `GROUP_NAME_BYTES_MAX` bytes of UTF-8).
pub(crate) type GroupName = Arc<str>;

/// Groups one peer may ask for; INTEREST past it is ignored and counted.
pub(crate) const GROUPS_PER_PEER_MAX: usize = 4_096;
/// (publisher, group) pairs whose last publish a node remembers; past it, the oldest
/// publishers' entries of groups this node is not a member of are forgotten first (a copy
/// of one of their publishes by a second path may then be delivered twice).
pub(crate) const PUBLISHERS_SEEN_MAX: usize = 65_536;

#[derive(Default)]
struct State {
    joined: HashSet<GroupName>,
    /// Per group, the peers that asked for its publishes.
    wanted_by: HashMap<GroupName, Vec<BusId>>,
    /// Per peer, the groups this node told it it wants.
    told: HashMap<BusId, HashSet<GroupName>>,
    /// Number of this node's last publish to each group.
    published: HashMap<GroupName, u64>,
    /// Per (publisher, group): its incarnation and the number of its last publish seen.
    seen: HashMap<(BusId, GroupName), (u64, u64)>,
}

/// What to do with a publish received from a peer (see [`GroupTable::received`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Fresh {
    /// This node is a member: hand it to the application.
    pub(crate) deliver: bool,
    /// Peers to pass it on to.
    pub(crate) forward_to: Vec<BusId>,
    /// Publishes of this publisher to this group that never reached this node, before it.
    pub(crate) missed: u64,
}

/// One change of what this node tells a peer it wants.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Advert {
    pub(crate) peer: BusId,
    pub(crate) join: bool,
    pub(crate) name: GroupName,
}

/// A node's group state.
#[derive(Default)]
pub(crate) struct GroupTable {
    state: Mutex<State>,
}

impl GroupTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins `name`; false if already a member. Errors past `GROUPS_JOINED_MAX`.
    pub(crate) fn join(&self, name: &str) -> Result<bool, String> {
        let mut st = self.lock();
        if st.joined.contains(name) {
            return Ok(false);
        }
        if st.joined.len() >= GROUPS_JOINED_MAX {
            return Err(format!(
                "this node is a member of {GROUPS_JOINED_MAX} groups already (GROUPS_JOINED_MAX)"
            ));
        }
        st.joined.insert(name.into());
        Ok(true)
    }

    /// Leaves `name`; false if not a member.
    pub(crate) fn leave(&self, name: &str) -> bool {
        let mut st = self.lock();
        let was = st.joined.remove(name);
        if was {
            st.seen.retain(|(_, g), _| &**g != name);
        }
        was
    }

    /// Whether this node neither joined a group nor knows of a peer that did.
    pub(crate) fn is_idle(&self) -> bool {
        let st = self.lock();
        st.joined.is_empty() && st.wanted_by.is_empty() && st.told.values().all(|t| t.is_empty())
    }

    pub(crate) fn is_member(&self, name: &str) -> bool {
        self.lock().joined.contains(name)
    }

    /// The groups this node joined, sorted.
    pub(crate) fn joined(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().joined.iter().map(|g| g.to_string()).collect();
        v.sort();
        v
    }

    /// The peers that asked for `name`'s publishes, sorted.
    pub(crate) fn wanted_by(&self, name: &str) -> Vec<BusId> {
        let mut v = self.lock().wanted_by.get(name).cloned().unwrap_or_default();
        v.sort();
        v
    }

    /// A publish of this node to `name`: its number, and the peers that asked for the group.
    pub(crate) fn publish(&self, name: &str) -> (u64, Vec<BusId>) {
        let mut st = self.lock();
        let number = match st.published.get_mut(name) {
            Some(n) => {
                *n += 1;
                *n
            }
            None => {
                st.published.insert(name.into(), 1);
                1
            }
        };
        let to = st.wanted_by.get(name).cloned().unwrap_or_default();
        (number, to)
    }

    /// `from` asked for (`join`) or gave up `name`'s publishes; false if ignored (the peer
    /// asked for `GROUPS_PER_PEER_MAX` groups already).
    pub(crate) fn interest(&self, from: BusId, join: bool, name: &str) -> bool {
        let mut st = self.lock();
        if !join {
            if let Some(v) = st.wanted_by.get_mut(name) {
                v.retain(|&p| p != from);
                if v.is_empty() {
                    st.wanted_by.remove(name);
                }
            }
            return true;
        }
        if st.wanted_by.get(name).is_some_and(|v| v.contains(&from)) {
            return true;
        }
        let asked = st.wanted_by.values().filter(|v| v.contains(&from)).count();
        if asked >= GROUPS_PER_PEER_MAX {
            return false;
        }
        st.wanted_by.entry(name.into()).or_default().push(from);
        true
    }

    /// A publish `head` received from `from` (this node is `me`): `None` for a copy already
    /// seen (or this node's own publish come back), else what to do with it.
    pub(crate) fn received(&self, me: BusId, from: BusId, head: &PublishHead) -> Option<Fresh> {
        if head.publisher == me {
            return None;
        }
        let mut st = self.lock();
        let key: (BusId, GroupName) = (head.publisher, head.name.into());
        let missed = match st.seen.get(&key) {
            Some(&(inc, last)) if inc == head.incarnation => {
                if head.number <= last {
                    return None;
                }
                head.number - last - 1
            }
            // The first publish seen from this publisher (or from a new incarnation of it).
            _ => 0,
        };
        if st.seen.len() >= PUBLISHERS_SEEN_MAX && !st.seen.contains_key(&key) {
            let State { seen, joined, .. } = &mut *st;
            seen.retain(|(_, g), _| joined.contains(g));
        }
        st.seen.insert(key, (head.incarnation, head.number));
        let deliver = st.joined.contains(head.name);
        let forward_to = st
            .wanted_by
            .get(head.name)
            .map(|v| v.iter().copied().filter(|&p| p != from).collect())
            .unwrap_or_default();
        Some(Fresh {
            deliver,
            forward_to,
            missed: if deliver { missed } else { 0 },
        })
    }

    /// `peer` is gone (given up on, or replaced by a new incarnation): what it asked for and
    /// what it was told are forgotten.
    pub(crate) fn peer_gone(&self, peer: BusId) {
        let mut st = self.lock();
        st.wanted_by.retain(|_, v| {
            v.retain(|&p| p != peer);
            !v.is_empty()
        });
        st.told.remove(&peer);
    }

    /// What this node must tell each of `peers` (id, and whether its link is a tree link) so
    /// that what each was told matches what this node wants through it (see the module's
    /// note). Call [`GroupTable::told`] for each change once it is queued.
    pub(crate) fn adverts(&self, peers: &[(BusId, bool)]) -> Vec<Advert> {
        let st = self.lock();
        let mut out = Vec::new();
        for &(peer, _) in peers {
            let mut want: HashSet<&GroupName> = st.joined.iter().collect();
            for (g, by) in &st.wanted_by {
                let via_tree = by
                    .iter()
                    .any(|&q| q != peer && peers.iter().any(|&(id, tree)| id == q && tree));
                if via_tree {
                    want.insert(g);
                }
            }
            let told = st.told.get(&peer);
            for g in &want {
                if !told.is_some_and(|t| t.contains(*g)) {
                    out.push(Advert {
                        peer,
                        join: true,
                        name: (*g).clone(),
                    });
                }
            }
            for g in told.into_iter().flatten() {
                if !want.contains(g) {
                    out.push(Advert {
                        peer,
                        join: false,
                        name: g.clone(),
                    });
                }
            }
        }
        out
    }

    /// `advert` was queued for its peer.
    pub(crate) fn told(&self, advert: &Advert) {
        let mut st = self.lock();
        let set = st.told.entry(advert.peer).or_default();
        if advert.join {
            set.insert(advert.name.clone());
        } else {
            set.remove(&advert.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(publisher: u64, incarnation: u64, number: u64) -> PublishHead<'static> {
        PublishHead {
            publisher: BusId(publisher),
            incarnation,
            number,
            name: "g",
            payload_at: 0,
        }
    }

    fn apply(t: &GroupTable, peers: &[(BusId, bool)]) -> Vec<(u64, bool, String)> {
        let ads = t.adverts(peers);
        for a in &ads {
            t.told(a);
        }
        let mut v: Vec<_> = ads
            .into_iter()
            .map(|a| (a.peer.0, a.join, a.name.to_string()))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_member_tells_every_peer_and_takes_it_back_on_leave() {
        let t = GroupTable::default();
        let peers = [(BusId(1), true), (BusId(2), false)];
        assert!(t.join("g").unwrap());
        assert!(!t.join("g").unwrap());
        assert_eq!(
            apply(&t, &peers),
            vec![(1, true, "g".into()), (2, true, "g".into())]
        );
        assert_eq!(apply(&t, &peers), vec![], "told once");
        assert!(t.leave("g"));
        assert_eq!(
            apply(&t, &peers),
            vec![(1, false, "g".into()), (2, false, "g".into())]
        );
    }

    #[test]
    fn interest_from_a_tree_link_is_passed_on_and_from_other_links_is_not() {
        let t = GroupTable::default();
        // 1: the upstream, 2: a downstream (tree links); 3: a connect link.
        let peers = [(BusId(1), true), (BusId(2), true), (BusId(3), false)];
        assert!(t.interest(BusId(2), true, "g"));
        assert_eq!(
            apply(&t, &peers),
            vec![(1, true, "g".into()), (3, true, "g".into())],
            "a downstream's interest goes up and to the connect peer, never back to it"
        );
        assert!(t.interest(BusId(3), true, "h"));
        assert_eq!(
            apply(&t, &peers),
            vec![],
            "a connect peer's interest stays here"
        );
        assert_eq!(t.publish("h"), (1, vec![BusId(3)]), "but it is served");
        assert!(t.interest(BusId(2), false, "g"));
        assert_eq!(
            apply(&t, &peers),
            vec![(1, false, "g".into()), (3, false, "g".into())]
        );
    }

    #[test]
    fn copies_are_dropped_gaps_are_counted_and_a_new_incarnation_starts_afresh() {
        let t = GroupTable::default();
        t.join("g").unwrap();
        t.interest(BusId(5), true, "g");
        let me = BusId(9);
        let first = t.received(me, BusId(1), &head(7, 1, 1)).unwrap();
        assert_eq!(
            first,
            Fresh {
                deliver: true,
                forward_to: vec![BusId(5)],
                missed: 0
            }
        );
        assert_eq!(t.received(me, BusId(2), &head(7, 1, 1)), None, "a copy");
        let after_gap = t.received(me, BusId(1), &head(7, 1, 5)).unwrap();
        assert_eq!(after_gap.missed, 3);
        assert_eq!(t.received(me, BusId(1), &head(7, 1, 4)), None, "behind");
        let restarted = t.received(me, BusId(1), &head(7, 2, 1)).unwrap();
        assert_eq!(restarted.missed, 0);
        assert_eq!(
            t.received(me, BusId(5), &head(7, 2, 2)).unwrap().forward_to,
            vec![]
        );
        assert_eq!(t.received(me, BusId(1), &head(9, 1, 1)), None, "its own");
    }

    #[test]
    fn a_peer_gone_is_forgotten_and_a_peer_cannot_ask_without_bound() {
        let t = GroupTable::default();
        for i in 0..GROUPS_PER_PEER_MAX {
            assert!(t.interest(BusId(4), true, &format!("g{i}")));
        }
        assert!(!t.interest(BusId(4), true, "one-more"));
        assert!(
            t.interest(BusId(4), true, "g0"),
            "asking again is no new group"
        );
        t.peer_gone(BusId(4));
        assert_eq!(t.publish("g0"), (1, vec![]));
        assert!(t.interest(BusId(4), true, "one-more"));
    }
}
