//! What a node knows of multicasts: as a source, the number of its last multicast to each
//! receiver and the recent multicasts it keeps to repair receivers' gaps; as a receiver, the
//! order of each source's multicasts to it (`group::stream::Stream`, as for a group member).
//!
//! A source numbers its multicasts per receiver, from 1 per source incarnation, so that each
//! receiver's numbers run without holes and a hole is a loss (a relay died with it, or dropped
//! it for a full link). A receiver's stream starts at the first number it sees from a source
//! (it may have started after the source), or at 1 for a source it saw restart.

use crate::group::seen_order::SeenOrder;
use crate::group::state::{Ask, GroupName, RepairPlan};
use crate::group::stream::{HeldBudget, Offer, Skipped, Stream, HELD_ENTRY_OVERHEAD_BYTES};
use crate::group::MULTICAST_STREAM;
use crate::BusId;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Receivers a source remembers numbers for; past it, those it multicast to least recently
/// are forgotten (a later multicast to one starts again at 1, which that receiver sees as old
/// and drops until its stream is forgotten too: keep receivers under this bound).
pub const MULTICAST_RECEIVERS_KNOWN_MAX: usize = 65_536;
/// Sources a receiver keeps a stream for; past it, the oldest (first seen) are forgotten in
/// O(1), those without a gap first (then what one held behind its gap is dropped with it).
pub const MULTICAST_SOURCES_MAX: usize = 65_536;
/// How long a source waits after its last multicast to a receiver before it sends that
/// receiver a mark (its last number), in milliseconds: a lost tail is seen.
pub const MULTICAST_TAIL_MARK_MS: u64 = 100;
/// How often the mark is sent again while the receiver stays quiet, in milliseconds: a
/// receiver behind a relay that restarted is reachable again only once it registered with
/// it anew, which the source does not see (no receiver tells it what it got).
pub const MULTICAST_MARK_REPEAT_MS: u64 = 1_000;
/// How long after its last multicast to a receiver the source keeps sending it marks, in
/// milliseconds; a receiver cut off from the source for longer sees its lost tail only at
/// the next multicast to it.
pub const MULTICAST_MARK_UNTIL_MS: u64 = 10_000;

/// How often a relay tells a source that one receiver is unreachable, in milliseconds.
pub const MULTICAST_UNREACHABLE_REPORT_MS: u64 = 1_000;
/// (source, receiver) pairs a relay remembers reporting; past it, the memory starts afresh.
const UNREACHABLE_REPORTS_MAX: usize = 4_096;

/// A source's multicasts to one receiver.
#[derive(Clone, Copy, Default)]
struct ToReceiver {
    /// Number of the last multicast to it.
    number: u64,
    /// When the last mark was sent (node clock, ms); `None` since the last multicast.
    marked_ms: Option<u64>,
    /// When the last multicast to it was made (node clock, ms).
    at_ms: u64,
    /// Numbers below this are no longer held.
    held_from: u64,
}

/// One multicast kept for repairs: its payload and the number each receiver got it as.
struct Kept {
    payload: Bytes,
    to: Vec<(BusId, u64)>,
}

#[derive(Default)]
struct State {
    receivers: HashMap<BusId, ToReceiver>,
    kept: VecDeque<Kept>,
    kept_bytes: usize,
    /// Per source, its incarnation and this node's stream of its multicasts.
    streams: HashMap<BusId, Stream>,
    /// The keys of `streams` in the order first seen, to forget the oldest when it is full.
    streams_order: SeenOrder<BusId>,
    /// As a relay: when this node last told a source that a receiver is unreachable.
    reported: HashMap<(BusId, BusId), u64>,
}

/// What became of a multicast (or mark) received for this node.
#[derive(Debug, Default)]
pub struct Arrived {
    /// What became of the multicast in the source's stream to this node; `None` for a mark.
    pub offer: Option<Offer>,
    /// The source restarted: what its previous stream still held, and what it never got.
    pub ended: Option<Skipped>,
    /// The stream has a gap: ask the source (see [`MulticastState::asks`]).
    pub gap: bool,
}

impl Arrived {
    /// Whether it hands the application anything, or tells it of an ended stream: only then
    /// does its order among other deliveries matter.
    pub fn delivers(&self) -> bool {
        matches!(self.offer, Some(Offer::Deliver { .. })) || self.ended.is_some()
    }
}

/// A node's multicast state. Sans-IO: the caller passes the time in and sends what it is
/// told to.
pub struct MulticastState {
    st: State,
    /// What the receivers' streams hold while they wait for repairs, shared with the node's
    /// group streams (`GROUP_HELD_BYTES_NODE_MAX`).
    held: Arc<HeldBudget>,
    /// Bytes of recent multicasts kept for repairs (payloads, receiver lists and
    /// `HELD_ENTRY_OVERHEAD_BYTES` each); past it, the oldest are dropped.
    retain_bytes: usize,
}

impl MulticastState {
    /// A table that keeps up to `retain_bytes` of recent multicasts for repairs.
    pub fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            held,
            st: State::default(),
            retain_bytes,
        }
    }

    /// Whether there is nothing to time: no multicast made, no stream received.
    pub fn is_idle(&self) -> bool {
        let st = &self.st;
        st.receivers.is_empty() && st.streams.is_empty()
    }

    /// Whether this node made a multicast (and may be asked for copies of it).
    pub fn made_any(&self) -> bool {
        !self.st.receivers.is_empty()
    }

    /// Numbers one multicast of `payload` to `to` (distinct, not this node) and keeps it.
    pub fn number(&mut self, to: &[BusId], payload: &Bytes, now_ms: u64) -> Vec<(BusId, u64)> {
        let st = &mut self.st;
        if st.receivers.len() + to.len() > MULTICAST_RECEIVERS_KNOWN_MAX {
            forget_oldest_receivers(&mut st.receivers, to.len());
        }
        let numbered: Vec<(BusId, u64)> = to
            .iter()
            .map(|&id| {
                let r = st.receivers.entry(id).or_insert(ToReceiver {
                    held_from: 1,
                    ..ToReceiver::default()
                });
                r.number += 1;
                r.at_ms = now_ms;
                r.marked_ms = None;
                (id, r.number)
            })
            .collect();
        st.kept_bytes += kept_cost(payload.len(), numbered.len());
        st.kept.push_back(Kept {
            payload: payload.clone(),
            to: numbered.clone(),
        });
        while st.kept_bytes > self.retain_bytes {
            let Some(old) = st.kept.pop_front() else {
                break;
            };
            st.kept_bytes -= kept_cost(old.payload.len(), old.to.len());
            for (id, n) in old.to {
                if let Some(r) = st.receivers.get_mut(&id) {
                    r.held_from = r.held_from.max(n + 1);
                }
            }
        }
        numbered
    }

    /// (receiver, last number) of each receiver whose multicasts went quiet: a mark
    /// `MULTICAST_TAIL_MARK_MS` after the last multicast, then every
    /// `MULTICAST_MARK_REPEAT_MS` up to `MULTICAST_MARK_UNTIL_MS` after it.
    pub fn tail_marks(&mut self, now_ms: u64) -> Vec<(BusId, u64)> {
        let st = &mut self.st;
        let mut out = Vec::new();
        for (&id, r) in st.receivers.iter_mut() {
            let quiet = now_ms.saturating_sub(r.at_ms);
            let due = match r.marked_ms {
                None => quiet >= MULTICAST_TAIL_MARK_MS,
                Some(at) => {
                    quiet <= MULTICAST_MARK_UNTIL_MS
                        && now_ms.saturating_sub(at) >= MULTICAST_MARK_REPEAT_MS
                }
            };
            if due {
                r.marked_ms = Some(now_ms);
                out.push((id, r.number));
            }
        }
        out
    }

    /// A mark for `receiver` did not fit its link's queue: it is marked again on a later
    /// call of [`MulticastState::tail_marks`].
    pub fn unmark(&mut self, receiver: BusId) {
        if let Some(r) = self.st.receivers.get_mut(&receiver) {
            r.marked_ms = None;
        }
    }

    /// As a relay: whether to tell `source` now that `receiver` is unreachable (at most once
    /// per `MULTICAST_UNREACHABLE_REPORT_MS` per pair).
    pub fn report_unreachable(&mut self, source: BusId, receiver: BusId, now_ms: u64) -> bool {
        let st = &mut self.st;
        if st.reported.len() >= UNREACHABLE_REPORTS_MAX {
            st.reported.clear();
        }
        match st.reported.get(&(source, receiver)) {
            Some(&at) if now_ms.saturating_sub(at) < MULTICAST_UNREACHABLE_REPORT_MS => false,
            _ => {
                st.reported.insert((source, receiver), now_ms);
                true
            }
        }
    }

    /// (receiver, last number) of every receiver this source multicast to: marks for the
    /// receivers behind a link that came up (a relay that restarted lost what it held).
    pub fn all_marks(&self) -> Vec<(BusId, u64)> {
        let st = &self.st;
        st.receivers.iter().map(|(&id, r)| (id, r.number)).collect()
    }

    /// How this source (now `incarnation`) answers `receiver`'s ask for its multicasts
    /// `from..to`, made of `asked_incarnation`.
    pub fn repair(
        &self,
        receiver: BusId,
        asked_incarnation: u64,
        incarnation: u64,
        (from, to): (u64, u64),
    ) -> RepairPlan {
        let st = &self.st;
        let everything_lost = RepairPlan {
            lost: Some((from, u64::MAX)),
            copies: Vec::new(),
        };
        let Some(r) = st.receivers.get(&receiver) else {
            return everything_lost;
        };
        if asked_incarnation != incarnation {
            // Asked of an earlier life of this node: nothing of it is left.
            return everything_lost;
        }
        let lost = (from < r.held_from).then_some((from, r.held_from.min(to)));
        let mut copies = Vec::new();
        if r.number >= from.max(r.held_from) {
            for k in st.kept.iter() {
                if let Some(&(_, n)) = k.to.iter().find(|(id, _)| *id == receiver) {
                    if n >= to {
                        // Kept in the order made: the receiver's numbers only grow.
                        break;
                    }
                    if n >= from {
                        copies.push((n, k.payload.clone()));
                    }
                }
            }
        }
        RepairPlan { lost, copies }
    }

    /// A multicast (or a mark: `payload` unused) numbered `number` from `source`
    /// (`incarnation`) for this node, at `now_ms`; the payload is made only if it must wait.
    pub fn received(
        &mut self,
        source: BusId,
        incarnation: u64,
        number: u64,
        mark: bool,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
    ) -> Arrived {
        let st = &mut self.st;
        if !st.streams.contains_key(&source) {
            let State {
                streams,
                streams_order,
                ..
            } = st;
            if streams.len() >= MULTICAST_SOURCES_MAX {
                // The oldest without a gap first: forgotten, it only lets a late copy in twice.
                let present = |k: &BusId| streams.contains_key(k);
                let has_gap = |k: &BusId| streams.get(k).is_some_and(Stream::has_gap);
                if let Some(old) = streams_order.oldest(present, has_gap) {
                    streams.remove(&old);
                }
            }
            streams_order.push(source, streams.len(), |k| streams.contains_key(k));
        }
        let mut out = Arrived::default();
        let start = match st.streams.get(&source) {
            Some(s) if s.incarnation == incarnation => None,
            Some(_) => {
                // The source restarted: its old stream ends, the new one counts from 1.
                out.ended = st.streams.remove(&source).map(Stream::close);
                Some(1)
            }
            None if mark => Some(number + 1),
            None => Some(number),
        };
        let stream = st.streams.entry(source).or_insert_with(|| {
            Stream::starting_at(incarnation, start.unwrap_or(1)).within(&self.held)
        });
        if mark {
            stream.mark(number, now_ms);
        } else {
            out.offer = Some(stream.offer(number, now_ms, payload));
        }
        out.gap = stream.has_gap();
        out
    }

    /// A copy `source` sent (REPAIR) of its multicast `number`: what becomes of it, and
    /// whether a gap is left; `None` if there is no such stream (another incarnation).
    pub fn repaired(
        &mut self,
        source: BusId,
        incarnation: u64,
        number: u64,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
    ) -> Option<(Offer, bool)> {
        let st = &mut self.st;
        let stream = st
            .streams
            .get_mut(&source)
            .filter(|s| s.incarnation == incarnation)?;
        let offer = stream.offer_copy(number, now_ms, payload);
        Some((offer, stream.has_gap()))
    }

    /// `source` no longer holds its multicasts `from..to` to this node: what is skipped.
    pub fn lost(
        &mut self,
        source: BusId,
        incarnation: u64,
        (from, to): (u64, u64),
        now_ms: u64,
    ) -> Option<Skipped> {
        let st = &mut self.st;
        let stream = st
            .streams
            .get_mut(&source)
            .filter(|s| s.incarnation == incarnation)?;
        Some(stream.lost(from, to, now_ms))
    }

    /// The repairs to ask for at `now_ms`: each stream's first gap (see
    /// `Stream::ask`).
    pub fn asks(&mut self, now_ms: u64) -> Vec<Ask> {
        let st = &mut self.st;
        let name: GroupName = Arc::from(MULTICAST_STREAM);
        st.streams
            .iter_mut()
            .filter_map(|(&source, s)| {
                s.ask(now_ms).map(|(from, to)| Ask {
                    publisher: source,
                    incarnation: s.incarnation,
                    group: name.clone(),
                    from,
                    to,
                })
            })
            .collect()
    }

    /// `ask` could not be sent: asked again on a later call of [`MulticastState::asks`].
    pub fn unask(&mut self, ask: &Ask) {
        if let Some(s) = self.st.streams.get_mut(&ask.publisher) {
            s.unask();
        }
    }

    /// Gaps waited on too long (or holding too much): skipped, per source, and why.
    pub fn overdue(&mut self, now_ms: u64) -> Vec<(BusId, Skipped, String)> {
        let st = &mut self.st;
        st.streams
            .iter_mut()
            .filter_map(|(&source, s)| s.overdue(now_ms).map(|(sk, why)| (source, sk, why)))
            .collect()
    }
}

/// What keeping one multicast of `len` bytes to `receivers` costs, in bytes.
fn kept_cost(len: usize, receivers: usize) -> usize {
    len + HELD_ENTRY_OVERHEAD_BYTES + std::mem::size_of::<(BusId, u64)>() * receivers
}

/// Forgets the receivers multicast to least recently, so that `room` more fit the bound.
fn forget_oldest_receivers(receivers: &mut HashMap<BusId, ToReceiver>, room: usize) {
    let excess = (receivers.len() + room).saturating_sub(MULTICAST_RECEIVERS_KNOWN_MAX);
    let mut by_age: Vec<(u64, BusId)> = receivers.iter().map(|(&id, r)| (r.at_ms, id)).collect();
    by_age.sort_unstable();
    for (_, id) in by_age.into_iter().take(excess) {
        receivers.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    #[test]
    fn the_streams_kept_stay_within_their_bound_forgetting_the_oldest_without_a_gap_first() {
        let mut t = MulticastState::new(1 << 20, Default::default());
        // Source 1 has a gap (3 came after 1); every other source is in order.
        t.received(BusId(1), 1, 1, false, 0, || p(1));
        t.received(BusId(1), 1, 3, false, 0, || p(3));
        for s in 0..MULTICAST_SOURCES_MAX as u64 + 100 {
            t.received(BusId(1_000 + s), 1, 1, false, 0, || p(1));
        }
        let st = &t.st;
        assert_eq!(st.streams.len(), MULTICAST_SOURCES_MAX);
        assert!(
            st.streams.contains_key(&BusId(1)),
            "the stream with a gap stays"
        );
        assert!(!st.streams.contains_key(&BusId(1_000)));
    }

    #[test]
    fn each_receiver_gets_its_own_numbers_and_a_mark_when_quiet() {
        let mut t = MulticastState::new(1 << 20, Default::default());
        let (a, b) = (BusId(1), BusId(2));
        assert_eq!(t.number(&[a, b], &p(1), 0), vec![(a, 1), (b, 1)]);
        assert_eq!(t.number(&[b], &p(2), 0), vec![(b, 2)]);
        assert_eq!(t.number(&[a, b], &p(3), 50), vec![(a, 2), (b, 3)]);
        assert!(t.tail_marks(100).is_empty(), "not quiet long enough");
        let mut marks = t.tail_marks(150);
        marks.sort();
        assert_eq!(marks, vec![(a, 2), (b, 3)]);
        assert!(t.tail_marks(500).is_empty(), "not again so soon");
        assert_eq!(t.tail_marks(1_150).len(), 2, "again while quiet");
        assert_eq!(t.tail_marks(9_000).len(), 2);
        assert!(t.tail_marks(20_000).is_empty(), "not for ever");
        t.number(&[a], &p(4), 20_000);
        assert_eq!(
            t.tail_marks(20_100),
            vec![(a, 3)],
            "a new multicast, a new mark"
        );
    }

    #[test]
    fn a_repair_copies_what_is_kept_and_names_what_is_not() {
        // Room for about two multicasts of 100 bytes.
        let mut t = MulticastState::new(kept_cost(100, 1) + kept_cost(100, 2), Default::default());
        let (a, b) = (BusId(1), BusId(2));
        let big = |n: u8| Bytes::from(vec![n; 100]);
        t.number(&[a], &big(1), 0);
        t.number(&[a, b], &big(2), 0);
        t.number(&[b], &big(3), 0);
        let plan = t.repair(a, 7, 7, (1, 3));
        assert_eq!(plan.lost, Some((1, 2)), "a's first is gone");
        assert_eq!(plan.copies, vec![(2, big(2))]);
        let plan = t.repair(b, 7, 7, (1, 3));
        assert_eq!((plan.lost, plan.copies.len()), (None, 2));
        let plan = t.repair(b, 7, 7, (2, 3));
        assert_eq!(plan.copies, vec![(2, big(3))], "the gap asked for alone");
        assert_eq!(
            t.repair(b, 6, 7, (1, 2)).lost,
            Some((1, u64::MAX)),
            "another life"
        );
        assert_eq!(t.repair(BusId(9), 7, 7, (1, 2)).lost, Some((1, u64::MAX)));
    }

    #[test]
    fn a_receiver_holds_after_a_gap_and_starts_again_when_the_source_restarts() {
        let mut t = MulticastState::new(1 << 20, Default::default());
        let s = BusId(5);
        let got = t.received(s, 1, 4, false, 0, || p(4));
        assert!(
            matches!(got.offer, Some(Offer::Deliver { .. })),
            "starts at the first seen"
        );
        let got = t.received(s, 1, 6, false, 0, || p(6));
        assert_eq!((got.offer, got.gap), (Some(Offer::Held), true));
        let asks = t.asks(0);
        assert_eq!(
            (asks.len(), asks[0].from, asks[0].to, &*asks[0].group),
            (1, 5, 6, "")
        );
        let (offer, gap) = t.repaired(s, 1, 5, 0, || p(5)).unwrap();
        assert_eq!(offer, Offer::Deliver { then: vec![p(6)] });
        assert!(!gap);
        // A mark past what came opens a gap without a later multicast.
        assert!(t.received(s, 1, 8, true, 0, Bytes::new).gap);
        // The source restarted: its new stream counts from 1; the old one's missing end is
        // counted.
        let got = t.received(s, 2, 2, false, 0, || p(2));
        assert_eq!(got.ended.map(|e| e.missed), Some(2));
        assert_eq!((got.offer, got.gap), (Some(Offer::Held), true));
        assert!(t.repaired(s, 1, 1, 0, || p(1)).is_none(), "old life");
        let skipped = t.lost(s, 2, (1, 2), 0).unwrap();
        assert_eq!((skipped.missed, skipped.deliver), (1, vec![p(2)]));
    }
}
