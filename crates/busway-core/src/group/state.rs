//! What a node knows of groups: the groups it joined, which of its peers asked for which
//! group's publishes (INTEREST messages), what it told each peer it wants, the numbers of its
//! own publishes and the recent ones it keeps to repair its members' gaps, and per publisher
//! the last publish it saw (to drop a copy that came by a second path) and, where it is a
//! member, the order of that publisher's stream (`busway_core::group::stream`).
//!
//! Interest follows the tree. A node tells a peer it wants a group when it joined the group
//! itself, or when another peer on a tree link (its upstream, or a downstream registered with
//! it) wants it. Interest a peer states on any other link (a `connect` link, a direct link)
//! counts for that peer alone: passed on from such links, interest could go round a cycle of
//! links and outlive the member that stated it. Publishes go to every peer that asked,
//! whatever its link; a node that sees a publish twice drops the second.

use super::seen_order::SeenOrder;
use super::stream::{HeldBudget, Offer, Skipped, Stream, HELD_ENTRY_OVERHEAD_BYTES};
use super::PublishHead;
use crate::BusId;
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// A group's name (checked: 1 to `GROUP_NAME_BYTES_MAX` bytes of UTF-8).
pub type GroupName = Arc<str>;

/// Groups one peer may ask for, and a relay per node it stands for (see
/// `Shared::interest_quota`); INTEREST past it is ignored and counted.
/// Groups a node may join at once; joining past it fails.
pub const GROUPS_JOINED_MAX: usize = 4_096;
/// Groups one peer may ask for, see below.
pub const GROUPS_PER_PEER_MAX: usize = 4_096;
/// Groups one link may ask for at most, whatever it stands for: a relay's quota grows with
/// the nodes below it up to this (the memory a lying relay can make a node spend on interest
/// is bounded by it, about 100 bytes a group).
pub const GROUPS_PER_LINK_MAX: usize = 65_536;
/// (publisher, group) pairs whose last publish a node remembers; past it, the oldest (first
/// seen) are forgotten, in O(1), those of groups this node is not a member of first (a copy
/// of one of their publishes by a second path may then be passed on twice), then a member's
/// own (what such a stream held behind a gap is dropped with it). Only a peer that may
/// speak for that many publishers (a relay, see `relay::Sources`) can make this many.
pub const PUBLISHERS_SEEN_MAX: usize = 65_536;
/// How long a group stays without a publish before its publisher sends a mark (its last
/// number) along the tree, in milliseconds: a member that lost the end of the stream sees it.
pub const GROUP_TAIL_MARK_MS: u64 = 100;
/// How far behind a publish's time may be, in milliseconds: the runtime stamps publishes with
/// its coarse clock, which moves once per timer tick (100 ms). A tail mark waits this much
/// longer: otherwise a publisher publishing without a pause looked quiet at every tick, and
/// a mark could name a publish numbered but not yet on its links, which a member whose stream
/// it began would then drop as older than its start.
pub const PUBLISH_TIME_SLACK_MS: u64 = 100;

/// What a publisher does when a link toward members of a group stays full (set with
/// `Node::set_group_policy`; see `docs/SEMANTICS.md`, "Groups").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GroupPolicy {
    /// The others keep their rate: a link full for `GROUP_SLOW_MEMBER_WAIT_MS` is skipped
    /// while it stays full; the members behind it ask for copies of what they missed; one
    /// that cannot get them is told how many it lost (`Event::GroupGap`), and cut off
    /// (`Event::GroupCutOff`) if its own application fell behind.
    #[default]
    CutOff,
    /// The group moves at its slowest linked member: `publish` waits for room on every link
    /// to members, however long (relays further on still cut off: see `docs/SEMANTICS.md`).
    Backpressure,
}

/// A publisher's own publishes to one group.
#[derive(Default)]
struct OwnStream {
    /// Number of the last publish.
    number: u64,
    /// The last number a tail mark was sent for.
    marked: u64,
    /// When the last publish was made (node clock, ms).
    at_ms: u64,
    /// The most recent publishes, oldest first, kept to answer members' repairs, within the
    /// table's `retain_bytes` (payload plus `HELD_ENTRY_OVERHEAD_BYTES` each).
    retained: VecDeque<(u64, Bytes)>,
    retained_bytes: usize,
}

/// What this node knows of one publisher's stream to one group.
struct Source {
    incarnation: u64,
    /// Highest number received: a publish at or below it is a copy, not passed on again.
    highest: u64,
    /// Highest mark passed on: each mark crosses each node once.
    marked: u64,
    /// Where this node is a member: the order of what its application gets.
    stream: Option<Stream>,
}

impl Source {
    fn new(incarnation: u64) -> Self {
        Self {
            incarnation,
            highest: 0,
            marked: 0,
            stream: None,
        }
    }
}

#[derive(Default)]
struct State {
    joined: HashSet<GroupName>,
    /// Per group, the peers that asked for its publishes.
    wanted_by: HashMap<GroupName, Vec<BusId>>,
    /// Per peer, how many groups it asked for (its quota, `GROUPS_PER_PEER_MAX`).
    asked_by: HashMap<BusId, usize>,
    /// Groups whose joins or askers changed since [`GroupTable::adverts`] last looked (or
    /// whose advert did not fit a peer's queue): only these are looked at again, so that the
    /// work of a join is proportional to the peers, not to the groups.
    dirty: HashSet<GroupName>,
    /// Peers that came up (or back) since [`GroupTable::adverts`] last saw them: each is to
    /// be told everything this node wants through it.
    new_peers: HashSet<BusId>,
    /// Per peer, the groups this node told it it wants.
    told: HashMap<BusId, HashSet<GroupName>>,
    /// This node's publishes, per group.
    published: HashMap<GroupName, OwnStream>,
    /// Per (publisher, group), what this node saw of its stream; at most
    /// `PUBLISHERS_SEEN_MAX`.
    seen: HashMap<(BusId, GroupName), Source>,
    /// The keys of `seen` in the order first seen, to forget the oldest when it is full.
    seen_order: SeenOrder<(BusId, GroupName)>,
    /// Per group this node publishes to, its policy for members that fall behind.
    policies: HashMap<GroupName, GroupPolicy>,
    /// (peer, group) whose link this publisher found full past `GROUP_SLOW_MEMBER_WAIT_MS`.
    lagging: HashSet<(BusId, GroupName)>,
    /// (peer, publisher, group): a publish or mark this node could not pass on to the peer
    /// (its link was full), or a mark of this node's own that did not fit. The peer is owed a
    /// mark of where that stream stands, sent once it fits, or before that stream's next
    /// publish to it: else a member behind it that lost the end of a stream would never
    /// learn it (see [`GroupState::owed_marks`]). With the first publish dropped, if any: the
    /// mark is a gap mark from it, so that a member whose stream had not begun begins it there.
    owed: HashMap<(BusId, BusId, GroupName), Option<u64>>,
}

/// What to do with a publish or mark received from a peer (see [`GroupTable::received`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Fresh {
    /// Peers to pass it on to.
    pub forward_to: Vec<BusId>,
    /// This node is a member and it is a publish: what becomes of it.
    pub offer: Option<Offer>,
    /// The stream restarted (a new incarnation of its publisher): what the old one still
    /// held, and what it never got.
    pub ended: Option<Skipped>,
    /// The member's stream has a gap: ask the publisher (see [`GroupTable::asks`]).
    pub gap: bool,
    /// Nobody here wants it (no member, nobody to pass it on to).
    pub unwanted: bool,
    /// A gap mark named publishes dropped on the way before where the member's stream
    /// began: this many can no longer come (see `Stream::dropped_before`).
    pub lost_before: u64,
}

/// What became of publishes received in a row (see [`GroupState::received_run`]).
pub enum Run {
    /// All of them are new here and, for a member, next in its stream: pass them on to
    /// `forward_to` as they came, hand them to the application as they are if `delivered`.
    /// `gap`: one is known to be missing after them. `unwanted`: nobody here wants them.
    Whole {
        /// Peers to pass them on to, as they came.
        forward_to: Vec<BusId>,
        /// This node is a member: hand them to the application as they are.
        delivered: bool,
        /// One is known to be missing after them: ask the publisher.
        gap: bool,
        /// Nobody here wants them (no member, nobody to pass them on to).
        unwanted: bool,
    },
    /// What became of each, in order.
    Each(Vec<Option<Fresh>>),
}

/// One publish of this node, numbered (see [`GroupTable::publish`]).
pub struct Published {
    /// The publish's number in this node's stream to the group.
    pub number: u64,
    /// The peers that asked for the group, sorted.
    pub to: Vec<BusId>,
    /// What this node does when a link toward members stays full.
    pub policy: GroupPolicy,
    /// Those of `to` whose link fell behind (skipped while full under `CutOff`).
    pub lagging: Vec<BusId>,
    /// This node is a member: its own inbox gets the publish too.
    pub member: bool,
    /// Peers that may be owed a mark of this group (a gap mark of this node's publishes
    /// skipped toward them goes before this one: see `publishes::push_own`), sorted.
    pub owed: Vec<BusId>,
}

/// A member's ask for a repair: `publisher` (its `incarnation`), `group`, one gap
/// `from..to`.
#[derive(Debug, PartialEq, Eq)]
pub struct Ask {
    /// The publisher to ask.
    pub publisher: BusId,
    /// The publisher's incarnation the gap is in.
    pub incarnation: u64,
    /// The group's name.
    pub group: GroupName,
    /// The gap asked for: `from..to`.
    pub from: u64,
    /// The publish after the gap's last (the range excludes it).
    pub to: u64,
}

/// How a publisher answers an ask: what it no longer holds, then copies of the rest.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RepairPlan {
    /// The publishes `(from, to)`, `to` excluded, no longer held (to report as lost), if any.
    pub lost: Option<(u64, u64)>,
    /// The publishes still held, as (number, payload), oldest first: to send as copies.
    pub copies: Vec<(u64, Bytes)>,
}

/// Marks a relay owes peers at once (see `State::owed`); past it a dropped publish is not
/// followed by a mark, and the members behind that peer learn of the gap at the stream's next
/// publish or mark.
pub const OWED_MARKS_MAX: usize = 4_096;

/// A mark owed to a peer (see [`GroupState::owed_marks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwedMark {
    /// The peer owed the mark.
    pub peer: BusId,
    /// The stream's publisher (this node, for its own publishes).
    pub publisher: BusId,
    /// The publisher's incarnation.
    pub incarnation: u64,
    /// The last number this node saw of the stream (publish or mark), or published.
    pub number: u64,
    /// The group's name.
    pub group: GroupName,
    /// The first publish dropped on the way to the peer, if any (a gap mark from it).
    pub from: Option<u64>,
}

/// One change of what this node tells a peer it wants.
#[derive(Debug, PartialEq, Eq)]
pub struct Advert {
    /// The peer to tell.
    pub peer: BusId,
    /// This node now wants the group's publishes through the peer, or no longer does.
    pub join: bool,
    /// The group's name.
    pub name: GroupName,
}

/// A mark a peer that newly asked for a group is sent: (publisher, its incarnation, its last
/// number).
pub type Mark = (BusId, u64, u64);

/// A node's group state: what it joined, who asked it for what, its own publishes and what
/// it keeps of them, and the streams it sees (see the module's documentation). Sans-IO: the
/// caller passes the time in and sends what it is told to.
pub struct GroupState {
    /// What its members' streams hold while they wait for repairs, shared with the node's
    /// multicast streams (`GROUP_HELD_BYTES_NODE_MAX`).
    held: Arc<HeldBudget>,
    /// Bytes of recent publishes kept per group for repairs.
    retain_bytes: usize,
    st: State,
    /// When each publisher refused here was last told so.
    pub refusals: super::permissions::RefusalReports,
}

impl GroupState {
    /// A state that keeps up to `retain_bytes` of recent publishes per group for repairs and
    /// holds its members' early publishes within `held`.
    pub fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            held,
            retain_bytes,
            st: State::default(),
            refusals: Default::default(),
        }
    }

    /// Joins `name`; false if already a member. Errors past `GROUPS_JOINED_MAX`.
    pub fn join(&mut self, name: &str) -> Result<bool, String> {
        let st = &mut self.st;
        if st.joined.contains(name) {
            return Ok(false);
        }
        if st.joined.len() >= GROUPS_JOINED_MAX {
            return Err(format!(
                "this node is a member of {GROUPS_JOINED_MAX} groups already (GROUPS_JOINED_MAX)"
            ));
        }
        let name: GroupName = name.into();
        st.dirty.insert(name.clone());
        st.joined.insert(name);
        Ok(true)
    }

    /// Leaves `name`; false if not a member. What its streams held is dropped.
    pub fn leave(&mut self, name: &str) -> bool {
        let st = &mut self.st;
        let was = st.joined.remove(name);
        if was {
            st.seen.retain(|(_, g), _| &**g != name);
            st.dirty.insert(name.into());
        }
        was
    }

    /// Whether this node neither joined a group nor knows of a peer that did, nor published.
    pub fn is_idle(&self) -> bool {
        let st = &self.st;
        st.joined.is_empty()
            && st.wanted_by.is_empty()
            && st.published.is_empty()
            && st.told.values().all(|t| t.is_empty())
    }

    /// The groups this node joined, sorted.
    pub fn joined(&self) -> Vec<String> {
        let mut v: Vec<String> = self.st.joined.iter().map(|g| g.to_string()).collect();
        v.sort();
        v
    }

    /// The groups this node published to, sorted.
    pub fn published_groups(&self) -> Vec<String> {
        let mut v: Vec<String> = self.st.published.keys().map(|g| g.to_string()).collect();
        v.sort();
        v
    }

    /// The peers that asked for `name`'s publishes, sorted.
    pub fn wanted_by(&self, name: &str) -> Vec<BusId> {
        let mut v = self.st.wanted_by.get(name).cloned().unwrap_or_default();
        v.sort();
        v
    }

    /// A publish of this node to `name` at `now_ms`, kept for repairs: its number, the peers
    /// that asked for the group, and how to treat those of them that fall behind.
    pub fn publish(&mut self, name: &str, payload: &Bytes, now_ms: u64) -> Published {
        let st = &mut self.st;
        if !st.published.contains_key(name) {
            st.published.insert(name.into(), OwnStream::default());
        }
        let p = st.published.get_mut(name).expect("inserted above");
        p.number += 1;
        p.at_ms = now_ms;
        p.retained.push_back((p.number, payload.clone()));
        p.retained_bytes += payload.len() + HELD_ENTRY_OVERHEAD_BYTES;
        while p.retained_bytes > self.retain_bytes {
            let Some((_, old)) = p.retained.pop_front() else {
                break;
            };
            p.retained_bytes -= old.len() + HELD_ENTRY_OVERHEAD_BYTES;
        }
        let number = p.number;
        let policy = st.policies.get(name).copied().unwrap_or_default();
        let to = st.wanted_by.get(name).cloned().unwrap_or_default();
        let lagging = if st.lagging.is_empty() {
            Vec::new()
        } else {
            st.lagging
                .iter()
                .filter(|(_, g)| &**g == name)
                .map(|(peer, _)| *peer)
                .collect()
        };
        let mut owed: Vec<BusId> = st
            .owed
            .keys()
            .filter(|(_, _, g)| &**g == name)
            .map(|k| k.0)
            .collect();
        owed.sort_unstable();
        owed.dedup();
        Published {
            number,
            to,
            policy,
            lagging,
            member: st.joined.contains(name),
            owed,
        }
    }

    /// `from` asked for (`join`) or gave up `name`'s publishes: `Some(true)` if it newly
    /// asked, `None` if ignored (the peer asked for `quota` groups already).
    pub fn interest(&mut self, from: BusId, join: bool, name: &str, quota: usize) -> Option<bool> {
        let st = &mut self.st;
        if !join {
            if let Some(v) = st.wanted_by.get_mut(name) {
                if let Ok(at) = v.binary_search(&from) {
                    v.remove(at);
                    if let Some(n) = st.asked_by.get_mut(&from) {
                        *n -= 1;
                    }
                    st.dirty.insert(name.into());
                }
                if v.is_empty() {
                    st.wanted_by.remove(name);
                }
            }
            // Nothing of the group is owed to a peer that no longer wants it: a gap mark
            // paid after it asks again would tell its new stream of a loss from the old.
            if !st.owed.is_empty() {
                st.owed.retain(|(p, _, g), _| !(*p == from && &**g == name));
            }
            return Some(false);
        }
        if st
            .wanted_by
            .get(name)
            .is_some_and(|v| v.binary_search(&from).is_ok())
        {
            return Some(false);
        }
        let asked = st.asked_by.entry(from).or_default();
        if *asked >= quota {
            return None;
        }
        *asked += 1;
        let name: GroupName = name.into();
        st.dirty.insert(name.clone());
        // Sorted: a publish walks it beside the sorted readers of the group's log.
        let askers = st.wanted_by.entry(name).or_default();
        let at = askers.partition_point(|&p| p < from);
        askers.insert(at, from);
        Some(true)
    }

    /// The marks a peer that newly asked for `name` is sent: per publisher this node knows
    /// (itself, `me` of `incarnation`, included), its incarnation and last number. The peer
    /// passes them on, so a member behind it that lost publishes (a relay died) sees its gap.
    pub fn marks_for(&self, name: &str, me: BusId, incarnation: u64) -> Vec<Mark> {
        let st = &self.st;
        let mut out: Vec<Mark> = st
            .seen
            .iter()
            .filter(|((_, g), s)| &**g == name && s.highest.max(s.marked) > 0)
            .map(|((p, _), s)| (*p, s.incarnation, s.highest.max(s.marked)))
            .collect();
        if let Some(p) = st.published.get(name) {
            out.push((me, incarnation, p.number));
        }
        out
    }

    /// Groups whose last publish is `GROUP_TAIL_MARK_MS` old (`PUBLISH_TIME_SLACK_MS` more:
    /// its time may be that stale) and not marked yet: the tail mark to send (group, number)
    /// and the peers to send it to.
    pub fn tail_marks(&mut self, now_ms: u64) -> Vec<(GroupName, u64, Vec<BusId>)> {
        let st = &mut self.st;
        let mut out = Vec::new();
        let quiet_ms = GROUP_TAIL_MARK_MS + PUBLISH_TIME_SLACK_MS;
        for (g, p) in st.published.iter_mut() {
            if p.number > p.marked && now_ms.saturating_sub(p.at_ms) >= quiet_ms {
                p.marked = p.number;
                if let Some(to) = st.wanted_by.get(g) {
                    out.push((g.clone(), p.number, to.clone()));
                }
            }
        }
        out
    }

    /// `publisher`'s stream to `name` in the table of streams seen (made if new, room made
    /// for it), and whether this node is a member of `name`. The name as this node already
    /// holds it (joined, or asked for by a peer): a reference count, not an allocation per
    /// publish received. One look-up of the name and one of the stream, whatever is new: this
    /// runs for every publish a node receives.
    fn source_of<'a>(
        st: &'a mut State,
        publisher: BusId,
        name: &str,
        incarnation: u64,
    ) -> (&'a mut Source, bool) {
        let State {
            seen,
            joined,
            wanted_by,
            seen_order,
            ..
        } = st;
        let held = joined.get(name);
        let member = held.is_some();
        let name = held
            .or_else(|| wanted_by.get_key_value(name).map(|(k, _)| k))
            .cloned()
            .unwrap_or_else(|| name.into());
        let key: (BusId, GroupName) = (publisher, name);
        if seen.len() >= PUBLISHERS_SEEN_MAX && !seen.contains_key(&key) {
            let present = |k: &(BusId, GroupName)| seen.contains_key(k);
            if let Some(old) = seen_order.oldest(present, |k| joined.contains(&k.1)) {
                seen.remove(&old);
            }
        }
        seen_order.tidy(seen.len(), |k| seen.contains_key(k));
        let source = match seen.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                seen_order.push_new(v.key().clone());
                v.insert(Source::new(incarnation))
            }
        };
        (source, member)
    }

    /// A publish or mark `head` received from `from` (this node is `me`) at `now_ms`; the
    /// payload, made by `payload`, only if it must wait. `None` for a copy already seen (or
    /// this node's own publish come back).
    pub fn received(
        &mut self,
        me: BusId,
        from: BusId,
        head: &PublishHead,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
    ) -> Option<Fresh> {
        if head.publisher == me {
            return None;
        }
        let st = &mut self.st;
        let (source, member) = Self::source_of(st, head.publisher, head.name, head.incarnation);
        let mut ended = None;
        if source.incarnation != head.incarnation {
            // The publisher restarted: its old stream ends here.
            ended = source.stream.take().map(Stream::close);
            *source = Source::new(head.incarnation);
        }
        let last = if head.mark {
            &mut source.marked
        } else {
            &mut source.highest
        };
        let pass_on = *last < head.number;
        *last = (*last).max(head.number);
        let mut offer = None;
        let mut gap = false;
        let mut lost_before = 0;
        if member {
            // A gap mark: publishes from `gap_from` on were dropped on the way here.
            let start = match (head.mark, head.gap_from) {
                (true, Some(from)) => from,
                (true, None) => head.number + 1,
                (false, _) => head.number,
            };
            let stream = source.stream.get_or_insert_with(|| {
                let new = Stream::starting_at(head.incarnation, start).within(&self.held);
                match (head.mark, head.gap_from) {
                    (true, None) => new.begun_at_mark(),
                    _ => new,
                }
            });
            if head.mark {
                stream.mark(head.number, now_ms);
                let dropped = |from| stream.dropped_before(from, head.number);
                lost_before = head.gap_from.map_or(0, dropped);
            } else {
                offer = Some(stream.offer(head.number, now_ms, payload));
            }
            gap = stream.has_gap();
        }
        let forward_to: Vec<BusId> = if pass_on {
            st.wanted_by
                .get(head.name)
                .map(|v| v.iter().copied().filter(|&p| p != from).collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let useful = matches!(
            offer,
            Some(Offer::Deliver { .. } | Offer::Held | Offer::Dropped)
        );
        // A mark for a member, a restart or a publish that moved anything on is news.
        let news = pass_on || useful || ended.is_some() || (head.mark && member);
        if !news {
            return None;
        }
        Some(Fresh {
            unwanted: pass_on && !head.mark && !member && forward_to.is_empty(),
            forward_to,
            offer,
            ended,
            gap,
            lost_before,
        })
    }

    /// [`GroupState::received`] for publishes of one publisher to one group, not marks (a
    /// PUBLISH batch, or a group log's records; the caller checked that): one look-up of the
    /// stream for the lot, and in the common case (all new, and next for a member) one answer
    /// for the lot. `payload(i)` makes the payload of `heads[i]` if it must wait. Records of
    /// a group log (`from_log`) never begin a member's stream: they can overtake the
    /// publishes its publisher queued on the link before them (see `group_log_out` in the
    /// runtime), so the stream begins at what comes by link, and what the log brought before
    /// that is a gap it asks for.
    pub fn received_run(
        &mut self,
        me: BusId,
        from: BusId,
        heads: &[PublishHead],
        now_ms: u64,
        payload: impl Fn(usize) -> Bytes,
        from_log: bool,
    ) -> Run {
        let Some(first) = heads.first() else {
            return Run::Each(Vec::new());
        };
        if first.publisher == me {
            return Run::Each(heads.iter().map(|_| None).collect());
        }
        let st = &mut self.st;
        let forward_all: Vec<BusId> = st
            .wanted_by
            .get(first.name)
            .map(|v| v.iter().copied().filter(|&p| p != from).collect())
            .unwrap_or_default();
        let (source, member) = Self::source_of(st, first.publisher, first.name, first.incarnation);
        let in_a_row = heads
            .windows(2)
            .all(|w| w[1].incarnation == first.incarnation && w[1].number == w[0].number + 1);
        let last = heads[heads.len() - 1].number;
        let all_new = source.highest < first.number;
        // The common case: the whole run is new (passed on as it came) and next in a
        // member's stream; or a member that passes nothing on takes copies it still needs.
        if in_a_row
            && source.incarnation == first.incarnation
            && (all_new || (member && forward_all.is_empty()))
        {
            let whole = if member {
                source.stream.as_mut().and_then(|s| {
                    s.take_run(first.number, heads.len() as u64, now_ms)
                        .then(|| s.has_gap())
                })
            } else {
                Some(false)
            };
            if let Some(gap) = whole {
                source.highest = source.highest.max(last);
                return Run::Whole {
                    unwanted: all_new && !member && forward_all.is_empty(),
                    forward_to: if all_new { forward_all } else { Vec::new() },
                    delivered: member,
                    gap,
                };
            }
        }
        let run = EachOfRun {
            heads,
            member,
            from_log,
            forward_all: &forward_all,
            now_ms,
        };
        Run::Each(run.received(source, &self.held, payload))
    }

    /// A copy of publish `head` its publisher sent this member (REPAIR): what becomes of it;
    /// `None` if this node has no such stream (not a member, or of another incarnation).
    pub fn repaired(
        &mut self,
        head: &PublishHead,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
    ) -> Option<(Offer, bool)> {
        let st = &mut self.st;
        let key: (BusId, GroupName) = (head.publisher, head.name.into());
        let stream = st.seen.get_mut(&key)?.stream.as_mut()?;
        if stream.incarnation != head.incarnation {
            return None;
        }
        let offer = stream.offer_copy(head.number, now_ms, payload);
        Some((offer, stream.has_gap()))
    }

    /// The publisher of this member's stream no longer holds `from..to`: what is skipped.
    pub fn lost(
        &mut self,
        publisher: BusId,
        incarnation: u64,
        name: &str,
        (from, to): (u64, u64),
        now_ms: u64,
    ) -> Option<Skipped> {
        let st = &mut self.st;
        let key: (BusId, GroupName) = (publisher, name.into());
        let stream = st.seen.get_mut(&key)?.stream.as_mut()?;
        (stream.incarnation == incarnation).then(|| stream.lost(from, to, now_ms))
    }

    /// The repairs this member should ask for at `now_ms` (each stream's first gap, see
    /// [`Stream::ask`] and [`GroupState::unask`]).
    pub fn asks(&mut self, now_ms: u64) -> Vec<Ask> {
        let st = &mut self.st;
        let mut out = Vec::new();
        for ((publisher, group), source) in st.seen.iter_mut() {
            if let Some(stream) = source.stream.as_mut() {
                if let Some((from, to)) = stream.ask(now_ms) {
                    out.push(Ask {
                        publisher: *publisher,
                        incarnation: stream.incarnation,
                        group: group.clone(),
                        from,
                        to,
                    });
                }
            }
        }
        out
    }

    /// `ask` could not be sent: it is asked again on a later call of [`GroupState::asks`].
    pub fn unask(&mut self, ask: &Ask) {
        let st = &mut self.st;
        let key = (ask.publisher, ask.group.clone());
        if let Some(stream) = st.seen.get_mut(&key).and_then(|s| s.stream.as_mut()) {
            stream.unask();
        }
    }

    /// Gaps waited on too long (or holding too much): skipped, per (publisher, group), and
    /// why.
    pub fn overdue(&mut self, now_ms: u64) -> Vec<(BusId, GroupName, Skipped, String)> {
        let st = &mut self.st;
        let mut out = Vec::new();
        for ((publisher, group), source) in st.seen.iter_mut() {
            if let Some((skipped, why)) = source.stream.as_mut().and_then(|s| s.overdue(now_ms)) {
                out.push((*publisher, group.clone(), skipped, why));
            }
        }
        out
    }

    /// Sets [`GroupState::policy`].
    pub fn set_policy(&mut self, name: &str, policy: GroupPolicy) {
        self.st.policies.insert(name.into(), policy);
    }

    /// The (group, its last number, peer) of every lagging link: a mark is sent to each until
    /// one fits, so that the members behind it learn what they missed even if nothing more
    /// is published.
    pub fn lagging(&self) -> Vec<(GroupName, u64, BusId)> {
        let st = &self.st;
        st.lagging
            .iter()
            .filter_map(|(peer, g)| st.published.get(g).map(|p| (g.clone(), p.number, *peer)))
            .collect()
    }

    /// Marks or clears that this publisher's link to `peer` fell behind on `name` (its queue
    /// stayed full for `GROUP_SLOW_MEMBER_WAIT_MS`): later publishes skip it while it is full
    /// (see [`Published::lagging`]).
    pub fn set_lagging(&mut self, name: &str, peer: BusId, lagging: bool) {
        let st = &mut self.st;
        let key = (peer, GroupName::from(name));
        if lagging {
            st.lagging.insert(key);
        } else if !st.lagging.is_empty() {
            st.lagging.remove(&key);
        }
    }

    /// How this publisher (now `incarnation`) answers an ask for `name`'s publishes
    /// `from..to` made of `asked_incarnation`.
    pub fn repair(
        &self,
        name: &str,
        asked_incarnation: u64,
        incarnation: u64,
        (from, to): (u64, u64),
    ) -> RepairPlan {
        let st = &self.st;
        let Some(p) = st.published.get(name) else {
            return RepairPlan {
                lost: Some((from, u64::MAX)),
                copies: Vec::new(),
            };
        };
        if asked_incarnation != incarnation {
            // Asked of an earlier life of this node: nothing of it is left.
            return RepairPlan {
                lost: Some((from, u64::MAX)),
                copies: Vec::new(),
            };
        }
        let oldest = p.retained.front().map_or(p.number + 1, |&(n, _)| n);
        let lost = (from < oldest).then_some((from, oldest.min(to)));
        let at = p.retained.partition_point(|&(n, _)| n < from);
        let end = p.retained.partition_point(|&(n, _)| n < to);
        let copies = p.retained.range(at..end.max(at)).cloned().collect();
        RepairPlan { lost, copies }
    }

    /// A publish or mark of `publisher` to `name` could not be passed on to `peer` (its link
    /// was full), `first` the publish dropped (the earliest counts; `None`: a mark): `peer`
    /// is owed a mark (within `OWED_MARKS_MAX`).
    pub fn owe_mark(&mut self, peer: BusId, publisher: BusId, name: &str, first: Option<u64>) {
        let st = &mut self.st;
        let key = (peer, publisher, GroupName::from(name));
        if let Some(owed) = st.owed.get_mut(&key) {
            *owed = match (*owed, first) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        } else if st.owed.len() < OWED_MARKS_MAX {
            st.owed.insert(key, first);
        }
    }

    /// Whether no mark is owed to anyone.
    pub fn owes_none(&self) -> bool {
        self.st.owed.is_empty()
    }

    /// Whether a mark is owed to `peer` of `publisher`'s stream to `name`.
    pub fn owes(&self, peer: BusId, publisher: BusId, name: &str) -> bool {
        !self.st.owed.is_empty() && self.st.owed.contains_key(&(peer, publisher, name.into()))
    }

    /// Takes the mark owed to `peer` of `publisher`'s stream to `name`, if one is: its first
    /// publish dropped, if any (the caller sends it before the stream's next publish).
    pub fn take_owed(&mut self, peer: BusId, publisher: BusId, name: &str) -> Option<Option<u64>> {
        if self.st.owed.is_empty() {
            return None;
        }
        self.st.owed.remove(&(peer, publisher, name.into()))
    }

    /// The marks owed (see [`GroupState::owe_mark`]; this node `me`, now `incarnation`, may
    /// owe marks of its own publishes too). Call [`GroupState::mark_paid`] for each one sent.
    pub fn owed_marks(&mut self, me: BusId, incarnation: u64) -> Vec<OwedMark> {
        let st = &mut self.st;
        if st.owed.is_empty() {
            return Vec::new();
        }
        let (seen, published) = (&st.seen, &st.published);
        let stands = |publisher: BusId, g: &GroupName| -> Option<(u64, u64)> {
            if publisher == me {
                return published.get(g).map(|p| (incarnation, p.number));
            }
            seen.get(&(publisher, g.clone()))
                .map(|s| (s.incarnation, s.highest.max(s.marked)))
        };
        // A stream forgotten meanwhile has nothing to mark.
        st.owed
            .retain(|(_, publisher, g), _| stands(*publisher, g).is_some());
        st.owed
            .iter()
            .filter_map(|((peer, publisher, g), from)| {
                let (incarnation, number) = stands(*publisher, g)?;
                Some(OwedMark {
                    peer: *peer,
                    publisher: *publisher,
                    incarnation,
                    number,
                    group: g.clone(),
                    from: from.filter(|&f| f <= number),
                })
            })
            .collect()
    }

    /// An owed mark was sent.
    pub fn mark_paid(&mut self, peer: BusId, publisher: BusId, name: &GroupName) {
        self.st.owed.remove(&(peer, publisher, name.clone()));
    }

    /// `peer` is gone (given up on, or replaced by a new incarnation): what it asked for and
    /// what it was told are forgotten.
    pub fn peer_gone(&mut self, peer: BusId) {
        let st = &mut self.st;
        st.owed.retain(|(p, _, _), _| *p != peer);
        // What others were told because of its interest is looked at again.
        let dirty = &mut st.dirty;
        st.wanted_by.retain(|g, v| {
            if let Ok(at) = v.binary_search(&peer) {
                v.remove(at);
                dirty.insert(g.clone());
            }
            !v.is_empty()
        });
        st.told.remove(&peer);
        st.asked_by.remove(&peer);
        st.new_peers.remove(&peer);
        st.lagging.retain(|(p, _)| *p != peer);
    }

    /// `peer` came up (or back): the next [`GroupState::adverts`] tells it everything this
    /// node wants through it, and looks again at what others are told of the groups it asked
    /// for (it may be a tree link now: the upstream).
    pub fn peer_came(&mut self, peer: BusId) {
        let st = &mut self.st;
        st.new_peers.insert(peer);
        for (g, by) in &st.wanted_by {
            if by.binary_search(&peer).is_ok() {
                st.dirty.insert(g.clone());
            }
        }
    }

    /// `advert` did not fit its peer's queue: looked at again by the next
    /// [`GroupState::adverts`].
    pub fn advert_not_sent(&mut self, advert: &Advert) {
        self.st.dirty.insert(advert.name.clone());
    }

    /// `name` as this node holds it (joined, or asked for), or a new one.
    pub fn name_of(&self, name: &str) -> GroupName {
        let st = &self.st;
        st.joined
            .get(name)
            .or_else(|| st.wanted_by.get_key_value(name).map(|(k, _)| k))
            .cloned()
            .unwrap_or_else(|| name.into())
    }

    /// Whether this node wants `name`'s publishes: it joined, or a peer asked for them.
    pub fn wants(&self, name: &str) -> bool {
        let st = &self.st;
        st.joined.contains(name) || st.wanted_by.contains_key(name)
    }

    /// Whether a peer other than `from` asked for `name`'s publishes: this node passes what
    /// `from` sends of the group on.
    pub fn passes_on_from(&self, name: &str, from: BusId) -> bool {
        (self.st.wanted_by.get(name)).is_some_and(|v| v.iter().any(|&p| p != from))
    }

    /// What this node must tell each of `peers` (id, and whether its link is a tree link) so
    /// that what each was told matches what this node wants through it (see the module's
    /// note), for the groups that changed since the last call, and everything for a peer
    /// that came ([`GroupState::peer_came`]): peers times changed groups. Call
    /// [`GroupState::told`] for each change once it is queued, else
    /// [`GroupState::advert_not_sent`].
    pub fn adverts(&mut self, peers: &[(BusId, bool)]) -> Vec<Advert> {
        let st = &mut self.st;
        // Per group looked at, the peers it is looked at for (`None`: all of them).
        let mut look: HashMap<GroupName, Option<Vec<BusId>>> =
            st.dirty.drain().map(|g| (g, None)).collect();
        for &(peer, _) in peers {
            if !st.new_peers.remove(&peer) {
                continue;
            }
            let told = st.told.get(&peer).into_iter().flatten();
            for g in st.joined.iter().chain(st.wanted_by.keys()).chain(told) {
                if let Some(Some(for_peers)) = look.get_mut(g).map(Option::as_mut) {
                    for_peers.push(peer);
                } else if !look.contains_key(g) {
                    look.insert(g.clone(), Some(vec![peer]));
                }
            }
        }
        let mut out = Vec::new();
        if look.is_empty() {
            return out;
        }
        let tree: HashSet<BusId> = peers.iter().filter(|p| p.1).map(|p| p.0).collect();
        let all: Vec<BusId> = peers.iter().map(|p| p.0).collect();
        for (g, for_peers) in look {
            // Its first asker on a tree link, and whether there is another.
            let (first, second) = st.wanted_by.get(&g).map_or((None, false), |by| {
                let mut on_tree = by.iter().filter(|q| tree.contains(q));
                (on_tree.next().copied(), on_tree.next().is_some())
            });
            let joined = st.joined.contains(&g);
            for &peer in for_peers.as_deref().unwrap_or(&all) {
                // Wanted through a tree link other than this peer's own.
                let want = joined || second || first.is_some_and(|q| q != peer);
                let told = st.told.get(&peer).is_some_and(|t| t.contains(&g));
                if want != told {
                    out.push(Advert {
                        peer,
                        join: want,
                        name: g.clone(),
                    });
                }
            }
        }
        out
    }

    /// `advert` was queued for its peer.
    pub fn told(&mut self, advert: &Advert) {
        let st = &mut self.st;
        let set = st.told.entry(advert.peer).or_default();
        if advert.join {
            set.insert(advert.name.clone());
        } else {
            set.remove(&advert.name);
        }
    }
}

/// A run of publishes taken one by one (`GroupState::received_run` off its common case).
struct EachOfRun<'a, 'h> {
    heads: &'a [PublishHead<'h>],
    member: bool,
    from_log: bool,
    /// The peers that want the group, but the one it came from.
    forward_all: &'a [BusId],
    now_ms: u64,
}

impl EachOfRun<'_, '_> {
    /// What becomes of each publish of the run in `source`'s stream (`None`: nothing new).
    fn received(
        self,
        source: &mut Source,
        held: &Arc<HeldBudget>,
        payload: impl Fn(usize) -> Bytes,
    ) -> Vec<Option<Fresh>> {
        let EachOfRun {
            heads,
            member,
            from_log,
            forward_all,
            now_ms,
        } = self;
        let mut out = Vec::with_capacity(heads.len());
        for (i, head) in heads.iter().enumerate() {
            let mut ended = None;
            if source.incarnation != head.incarnation {
                ended = source.stream.take().map(Stream::close);
                *source = Source::new(head.incarnation);
            }
            let pass_on = source.highest < head.number;
            source.highest = source.highest.max(head.number);
            let mut offer = None;
            let mut gap = false;
            if member && !(from_log && source.stream.is_none()) {
                let stream = source.stream.get_or_insert_with(|| {
                    Stream::starting_at(head.incarnation, head.number).within(held)
                });
                offer = Some(stream.offer(head.number, now_ms, || payload(i)));
                gap = stream.has_gap();
            }
            let forward_to = if pass_on {
                forward_all.to_vec()
            } else {
                Vec::new()
            };
            let useful = matches!(
                offer,
                Some(Offer::Deliver { .. } | Offer::Held | Offer::Dropped)
            );
            let news = pass_on || useful || ended.is_some();
            out.push(news.then(|| Fresh {
                unwanted: pass_on && !member && forward_to.is_empty(),
                forward_to,
                offer,
                ended,
                gap,
                lost_before: 0,
            }));
        }
        out
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
            mark: false,
            backpressure: false,
            batch: false,
            count: 1,
            gap_from: None,
        }
    }

    fn mark(publisher: u64, incarnation: u64, number: u64) -> PublishHead<'static> {
        PublishHead {
            mark: true,
            count: 0,
            ..head(publisher, incarnation, number)
        }
    }

    fn table() -> GroupState {
        GroupState::new(1 << 20, Default::default())
    }

    fn got(t: &mut GroupState, from: u64, h: &PublishHead) -> Option<Fresh> {
        t.received(BusId(9), BusId(from), h, 0, || Bytes::from_static(b"p"))
    }

    fn apply(t: &mut GroupState, peers: &[(BusId, bool)]) -> Vec<(u64, bool, String)> {
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
        let mut t = table();
        let peers = [(BusId(1), true), (BusId(2), false)];
        assert!(t.join("g").unwrap());
        assert!(!t.join("g").unwrap());
        assert_eq!(
            apply(&mut t, &peers),
            vec![(1, true, "g".into()), (2, true, "g".into())]
        );
        assert_eq!(apply(&mut t, &peers), vec![], "told once");
        assert!(t.leave("g"));
        assert_eq!(
            apply(&mut t, &peers),
            vec![(1, false, "g".into()), (2, false, "g".into())]
        );
    }

    #[test]
    fn interest_from_a_tree_link_is_passed_on_and_from_other_links_is_not() {
        let mut t = table();
        // 1: the upstream, 2: a downstream (tree links); 3: a connect link.
        let peers = [(BusId(1), true), (BusId(2), true), (BusId(3), false)];
        assert_eq!(
            t.interest(BusId(2), true, "g", GROUPS_PER_PEER_MAX),
            Some(true)
        );
        assert_eq!(
            t.interest(BusId(2), true, "g", GROUPS_PER_PEER_MAX),
            Some(false),
            "asked already"
        );
        assert_eq!(
            apply(&mut t, &peers),
            vec![(1, true, "g".into()), (3, true, "g".into())],
            "a downstream's interest goes up and to the connect peer, never back to it"
        );
        assert_eq!(
            t.interest(BusId(3), true, "h", GROUPS_PER_PEER_MAX),
            Some(true)
        );
        assert_eq!(
            apply(&mut t, &peers),
            vec![],
            "a connect peer's interest stays here"
        );
        let p = Bytes::from_static(b"p");
        let published = t.publish("h", &p, 0);
        assert_eq!(
            (published.number, published.to),
            (1, vec![BusId(3)]),
            "but it is served"
        );
        assert_eq!(
            t.interest(BusId(2), false, "g", GROUPS_PER_PEER_MAX),
            Some(false)
        );
        assert_eq!(
            apply(&mut t, &peers),
            vec![(1, false, "g".into()), (3, false, "g".into())]
        );
    }

    #[test]
    fn the_streams_seen_stay_within_their_bound_forgetting_the_oldest_passed_on_first() {
        let mut t = table();
        t.join("g").unwrap();
        t.interest(BusId(5), true, "h", GROUPS_PER_PEER_MAX);
        // One stream of "h" (passed on, not a member), then made-up publishers of "g".
        let mut h = head(7, 1, 1);
        h.name = "h";
        got(&mut t, 1, &h).unwrap();
        for p in 0..PUBLISHERS_SEEN_MAX as u64 + 100 {
            got(&mut t, 1, &head(1_000 + p, 1, 1)).unwrap();
        }
        let st = &t.st;
        assert_eq!(st.seen.len(), PUBLISHERS_SEEN_MAX);
        assert!(
            !st.seen.contains_key(&(BusId(7), "h".into())),
            "the stream passed on went first"
        );
        assert!(!st.seen.contains_key(&(BusId(1_000), "g".into())));
        assert!(st
            .seen
            .contains_key(&(BusId(1_000 + PUBLISHERS_SEEN_MAX as u64 + 99), "g".into())));
    }

    #[test]
    fn adverts_look_at_changed_groups_only_and_again_at_one_that_did_not_fit() {
        let mut t = table();
        let peers = [(BusId(1), true), (BusId(2), true)];
        for g in 0..100 {
            t.interest(BusId(2), true, &format!("g{g}"), GROUPS_PER_PEER_MAX);
        }
        assert_eq!(apply(&mut t, &peers).len(), 100, "each goes up to 1");
        assert_eq!(t.st.dirty.len(), 0);
        t.interest(BusId(2), true, "new", GROUPS_PER_PEER_MAX);
        let ads = t.adverts(&peers);
        assert_eq!(ads.len(), 1, "only the group that changed: {:?}", ads.len());
        // It did not fit 1's queue: looked at again, and told then.
        t.advert_not_sent(&ads[0]);
        assert_eq!(apply(&mut t, &peers), vec![(1, true, "new".into())]);
        assert_eq!(apply(&mut t, &peers), vec![], "told, nothing left");
        // A peer that comes is told everything.
        t.peer_came(BusId(3));
        let more = [(BusId(1), true), (BusId(2), true), (BusId(3), false)];
        assert_eq!(apply(&mut t, &more).len(), 101);
        // The quota counts each peer's groups, a leave gives one back.
        t.peer_gone(BusId(3));
        assert_eq!(t.st.asked_by.get(&BusId(2)), Some(&101));
        t.interest(BusId(2), false, "new", GROUPS_PER_PEER_MAX);
        assert_eq!(t.st.asked_by.get(&BusId(2)), Some(&100));
    }

    #[test]
    fn copies_are_dropped_gaps_are_held_and_a_new_incarnation_starts_afresh() {
        let mut t = table();
        t.join("g").unwrap();
        t.interest(BusId(5), true, "g", GROUPS_PER_PEER_MAX);
        let first = got(&mut t, 1, &head(7, 1, 1)).unwrap();
        assert_eq!(
            first,
            Fresh {
                forward_to: vec![BusId(5)],
                offer: Some(Offer::Deliver { then: vec![] }),
                ended: None,
                gap: false,
                unwanted: false,
                lost_before: 0,
            }
        );
        assert_eq!(got(&mut t, 2, &head(7, 1, 1)), None, "a copy");
        let after_gap = got(&mut t, 1, &head(7, 1, 5)).unwrap();
        assert_eq!(after_gap.offer, Some(Offer::Held));
        assert!(after_gap.gap);
        assert_eq!(
            t.asks(0),
            vec![Ask {
                publisher: BusId(7),
                incarnation: 1,
                group: "g".into(),
                from: 2,
                to: 5,
            }]
        );
        assert_eq!(t.asks(0), vec![], "asked once");
        // A copy by a second path fills the gap for this member, and is not passed on.
        let filler = got(&mut t, 2, &head(7, 1, 2)).unwrap();
        assert_eq!(filler.forward_to, vec![]);
        assert_eq!(filler.offer, Some(Offer::Deliver { then: vec![] }));
        let restarted = got(&mut t, 1, &head(7, 2, 1)).unwrap();
        assert_eq!(
            restarted.ended,
            Some(Skipped {
                missed: 2,
                deliver: vec![Bytes::from_static(b"p")],
                opened_ms: Some(0),
            }),
            "3 and 4 never came; 5 is handed over as the old stream ends"
        );
        assert_eq!(restarted.offer, Some(Offer::Deliver { then: vec![] }));
        assert_eq!(got(&mut t, 5, &head(7, 2, 2)).unwrap().forward_to, vec![]);
        assert_eq!(got(&mut t, 1, &head(9, 1, 1)), None, "its own");
    }

    #[test]
    fn a_gap_mark_begins_a_new_stream_at_the_first_publish_dropped_on_the_way() {
        let mut t = table();
        t.join("g").unwrap();
        let gap = PublishHead {
            gap_from: Some(1),
            ..mark(7, 1, 3)
        };
        assert!(got(&mut t, 1, &gap).unwrap().gap, "1 to 3 are missing");
        let asks = t.asks(0);
        assert_eq!((asks[0].from, asks[0].to), (1, 4), "from the first dropped");
        // A plain mark begins a new stream after it: nothing before it was for this member.
        got(&mut t, 1, &mark(8, 1, 3)).unwrap();
        assert!(t.asks(0).iter().all(|a| a.publisher != BusId(8)));
        // On a stream begun, a gap mark is a mark: what it holds stays.
        let (repaired, _) = t.repaired(&head(7, 1, 1), 0, Bytes::new).unwrap();
        assert_eq!(repaired, Offer::Deliver { then: vec![] });
        let again = PublishHead {
            gap_from: Some(1),
            ..mark(7, 1, 3)
        };
        assert!(got(&mut t, 1, &again).unwrap().gap);
        let asks = t.asks(super::super::stream::GROUP_REASK_MS);
        assert_eq!((asks[0].from, asks[0].to), (2, 4), "1 is here");
    }

    #[test]
    fn marks_pass_each_node_once_and_reveal_a_lost_tail() {
        let mut t = table();
        t.join("g").unwrap();
        t.interest(BusId(5), true, "g", GROUPS_PER_PEER_MAX);
        got(&mut t, 1, &head(7, 1, 1)).unwrap();
        let m = got(&mut t, 1, &mark(7, 1, 3)).unwrap();
        assert_eq!(m.forward_to, vec![BusId(5)]);
        assert!(m.gap, "2 and 3 are missing");
        assert_eq!(
            got(&mut t, 1, &mark(7, 1, 3)).unwrap().forward_to,
            vec![],
            "once"
        );
        let asks = t.asks(0);
        assert_eq!((asks[0].from, asks[0].to), (2, 4), "up to the mark");
        assert_eq!(
            t.marks_for("g", BusId(9), 4),
            vec![(BusId(7), 1, 3)],
            "a peer that asks now learns where 7's stream stands"
        );
        let (repaired, gap) = t.repaired(&head(7, 1, 2), 0, Bytes::new).unwrap();
        assert_eq!(repaired, Offer::Deliver { then: vec![] });
        assert!(gap);
        let (_, gap) = t.repaired(&head(7, 1, 3), 0, Bytes::new).unwrap();
        assert!(!gap);
        assert_eq!(
            t.repaired(&head(7, 2, 3), 0, Bytes::new),
            None,
            "not this life"
        );
    }

    #[test]
    fn a_peer_a_publish_could_not_be_passed_on_to_is_owed_a_mark_until_paid() {
        let mut t = table();
        t.interest(BusId(5), true, "g", GROUPS_PER_PEER_MAX);
        got(&mut t, 1, &head(7, 1, 3)).unwrap();
        t.owe_mark(BusId(5), BusId(7), "g", None);
        got(&mut t, 1, &mark(7, 1, 4)).unwrap();
        let owed = |publisher: u64, number: u64, from: Option<u64>| OwedMark {
            peer: BusId(5),
            publisher: BusId(publisher),
            incarnation: 1,
            number,
            group: "g".into(),
            from,
        };
        assert_eq!(
            t.owed_marks(BusId(9), 1),
            vec![owed(7, 4, None)],
            "where the stream stands now"
        );
        t.owe_mark(BusId(5), BusId(7), "g", Some(4));
        t.owe_mark(BusId(5), BusId(7), "g", Some(2));
        t.owe_mark(BusId(5), BusId(7), "g", None);
        assert_eq!(
            t.owed_marks(BusId(9), 1),
            vec![owed(7, 4, Some(2))],
            "a gap mark from the first publish dropped"
        );
        assert!(t.owes(BusId(5), BusId(7), "g"));
        assert_eq!(t.take_owed(BusId(5), BusId(7), "g"), Some(Some(2)));
        assert!(!t.owes(BusId(5), BusId(7), "g"));
        t.owe_mark(BusId(5), BusId(7), "g", None);
        t.mark_paid(BusId(5), BusId(7), &"g".into());
        assert_eq!(t.owed_marks(BusId(9), 1), vec![]);
        t.owe_mark(BusId(5), BusId(7), "g", None);
        t.peer_gone(BusId(5));
        assert_eq!(
            t.owed_marks(BusId(9), 1),
            vec![],
            "a peer gone is owed nothing"
        );
        t.owe_mark(BusId(5), BusId(8), "g", Some(1));
        assert_eq!(
            t.owed_marks(BusId(9), 1),
            vec![],
            "a stream never seen has nothing to mark"
        );
        t.publish("g", &Bytes::from_static(b"p"), 0);
        t.owe_mark(BusId(5), BusId(9), "g", None);
        assert_eq!(
            t.owed_marks(BusId(9), 1),
            vec![owed(9, 1, None)],
            "its own tail mark that did not fit"
        );
    }

    #[test]
    fn a_relay_that_is_not_a_member_passes_on_and_counts_what_nobody_wants() {
        let mut t = table();
        let lonely = got(&mut t, 1, &head(7, 1, 1)).unwrap();
        assert!(lonely.unwanted);
        t.interest(BusId(5), true, "g", GROUPS_PER_PEER_MAX);
        let passed = got(&mut t, 1, &head(7, 1, 2)).unwrap();
        assert_eq!(
            (passed.forward_to, passed.offer, passed.unwanted),
            (vec![BusId(5)], None, false)
        );
    }

    #[test]
    fn a_publisher_keeps_recent_publishes_within_its_bound_and_says_what_it_lost() {
        let mut t = GroupState::new(3 * (1 + HELD_ENTRY_OVERHEAD_BYTES), Default::default());
        for i in 1..=5u8 {
            t.publish("g", &Bytes::from(vec![i]), u64::from(i));
        }
        let plan = t.repair("g", 1, 1, (2, 6));
        assert_eq!(plan.lost, Some((2, 3)), "1 and 2 fell out of the bound");
        let numbers: Vec<u64> = plan.copies.iter().map(|c| c.0).collect();
        assert_eq!(numbers, vec![3, 4, 5]);
        let gap = t.repair("g", 1, 1, (3, 5));
        let numbers: Vec<u64> = gap.copies.iter().map(|c| c.0).collect();
        assert_eq!((gap.lost, numbers), (None, vec![3, 4]), "the gap alone");
        assert_eq!(t.repair("g", 1, 1, (1, 2)).lost, Some((1, 2)), "all lost");
        assert_eq!(t.repair("g", 1, 1, (5, u64::MAX)).copies.len(), 1);
        assert_eq!(
            t.repair("g", 1, 1, (6, 9)),
            RepairPlan::default(),
            "nothing after the last"
        );
        assert_eq!(
            t.repair("g", 0, 1, (2, 3)).lost,
            Some((2, u64::MAX)),
            "an earlier life"
        );
        assert_eq!(t.repair("other", 1, 1, (2, 3)).lost, Some((2, u64::MAX)));
        let quiet = GROUP_TAIL_MARK_MS + PUBLISH_TIME_SLACK_MS;
        assert_eq!(t.tail_marks(5 + quiet - 1), vec![]);
        t.interest(BusId(4), true, "g", GROUPS_PER_PEER_MAX);
        assert_eq!(
            t.tail_marks(5 + quiet),
            vec![("g".into(), 5, vec![BusId(4)])]
        );
        assert_eq!(t.tail_marks(u64::MAX), vec![], "marked once");
    }

    /// The runtime stamps publishes with a clock that moves once per tick (100 ms): a stream
    /// published without a pause carries the last tick's time. No tail mark while it goes
    /// on (one could name a publish numbered but not yet on its links); one once a whole
    /// tick passed with none.
    #[test]
    fn a_stream_without_a_pause_is_not_tail_marked_at_every_tick() {
        let mut t = table();
        t.interest(BusId(4), true, "g", GROUPS_PER_PEER_MAX);
        let tick = PUBLISH_TIME_SLACK_MS;
        let payload = Bytes::from_static(b"p");
        for at in [0, tick, 2 * tick, 3 * tick] {
            t.publish("g", &payload, at);
            assert_eq!(t.tail_marks(at + tick), vec![], "published at {at}");
        }
        assert_eq!(
            t.tail_marks(3 * tick + GROUP_TAIL_MARK_MS + tick - 1),
            vec![]
        );
        assert_eq!(
            t.tail_marks(3 * tick + GROUP_TAIL_MARK_MS + tick),
            vec![("g".into(), 4, vec![BusId(4)])]
        );
    }

    #[test]
    fn a_peer_gone_is_forgotten_and_a_peer_cannot_ask_without_bound() {
        let mut t = table();
        for i in 0..GROUPS_PER_PEER_MAX {
            assert_eq!(
                t.interest(BusId(4), true, &format!("g{i}"), GROUPS_PER_PEER_MAX),
                Some(true)
            );
        }
        assert_eq!(
            t.interest(BusId(4), true, "one-more", GROUPS_PER_PEER_MAX),
            None
        );
        assert_eq!(
            t.interest(BusId(4), true, "g0", GROUPS_PER_PEER_MAX),
            Some(false),
            "asking again is no new group"
        );
        t.peer_gone(BusId(4));
        let published = t.publish("g0", &Bytes::new(), 0);
        assert_eq!((published.number, published.to), (1, vec![]));
        assert_eq!(
            t.interest(BusId(4), true, "one-more", GROUPS_PER_PEER_MAX),
            Some(true)
        );
    }
}
