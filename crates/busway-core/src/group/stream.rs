//! A member's view of one publisher's stream to one group: which publish the application gets
//! next, the publishes that came early (after a gap) and wait for it, and whether the gap is
//! worth asking the publisher to repair.
//!
//! Publishes reach a member hop by hop along the tree; a relay that dies takes what it held
//! with it, and a relay that cannot pass a publish on drops it. The member sees such a gap at
//! the next publish or mark (a publisher's "my last publish is N", see `busway_core::group`)
//! and asks the publisher for copies (REPAIR). Until they come, later publishes wait here, in
//! number order, within `GROUP_HELD_BYTES_MAX`; a gap not repaired within
//! `GROUP_REPAIR_WAIT_MS`, or one that would hold more, is given up on: the member gets what
//! it holds and is told how many publishes it lost (the runtime says so with `GroupGap`, or
//! `GroupCutOff` where its application fell behind). Never a silent gap.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes a member holds for one stream while it waits for a repair (payloads plus
/// `HELD_ENTRY_OVERHEAD_BYTES` each); past it, the gap is given up on.
pub const GROUP_HELD_BYTES_MAX: usize = 64 << 20;
/// Bytes all of a node's streams (groups and multicast) hold together while they wait for
/// repairs; past it, a stream that would hold more gives its gap up as at its own bound. One
/// source that speaks for many publishers (a relay) cannot make a node hold 64 MiB per
/// stream for thousands of streams.
pub const GROUP_HELD_BYTES_NODE_MAX: usize = 128 << 20;
/// What one held publish costs beside its payload, in bytes (map entry and `Bytes` handle).
pub const HELD_ENTRY_OVERHEAD_BYTES: usize = 64;
/// How long a member waits for the repair of a gap before it gives the gap up, in
/// milliseconds (from when it saw the gap, or last made progress on it).
pub const GROUP_REPAIR_WAIT_MS: u64 = 5_000;
/// How long a member waits for an asked repair to make progress before it asks again, in
/// milliseconds: the ask or its copies may have died with a relay. Copies on their way
/// count as progress, so a long repair is not asked for twice.
pub const GROUP_REASK_MS: u64 = 1_000;
const _: () = assert!(GROUP_REASK_MS < GROUP_REPAIR_WAIT_MS);

/// Whether a member whose stream skipped publishes that will never come leaves its group
/// (the runtime's `Event::GroupCutOff`) rather than staying, told of the gap (`GroupGap`):
/// only for a gap given up on (`given_up`: no repair came, its publisher no longer holds
/// them, too much waited) while its own application fell behind: not reading now
/// (`behind_now`), or last behind at `behind_at_ms`, no earlier than `GROUP_REPAIR_WAIT_MS`
/// before the gap opened (`skipped.opened_ms`; `now_ms` if none). So nothing a publisher or
/// a hop does makes a member that keeps up leave; and one whose application stopped reading
/// is cut off whether its loss is told at once (the publisher no longer holds it) or only
/// once the repair wait runs out after it reads again.
pub fn cuts_off(
    given_up: bool,
    behind_now: bool,
    behind_at_ms: Option<u64>,
    skipped: &Skipped,
    now_ms: u64,
) -> bool {
    let from = skipped.opened_ms.unwrap_or(now_ms);
    let behind_lately =
        behind_at_ms.is_some_and(|at| at.saturating_add(GROUP_REPAIR_WAIT_MS) >= from);
    given_up && (behind_now || behind_lately)
}

/// The bytes a node's streams hold together (`GROUP_HELD_BYTES_NODE_MAX`), shared by them.
#[derive(Debug, Default)]
pub struct HeldBudget {
    used: AtomicUsize,
}

impl HeldBudget {
    /// Takes `n` bytes if they fit; false (nothing taken) otherwise.
    fn take(&self, n: usize) -> bool {
        // Relaxed: a count checked against a bound, publishing nothing; the streams' own
        // state is under their tables' locks.
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(n)
                    .filter(|&u| u <= GROUP_HELD_BYTES_NODE_MAX)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken.
    fn give(&self, n: usize) {
        // Relaxed: see `take`.
        self.used.fetch_sub(n, Relaxed);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        // Relaxed: see `take`.
        self.used.load(Relaxed)
    }
}

/// An ask a stream made and waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Asked {
    /// The end (exclusive) of the gap asked for: once `next` reaches it, the gap is filled.
    to: u64,
    /// When it was asked, or when the stream last moved since (node clock, ms).
    at_ms: u64,
}

/// What became of a publish offered to a stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// The next one: hand it to the application, then `then` (publishes that waited for it).
    Deliver {
        /// Publishes that waited for it, in order: hand them over after it.
        then: Vec<Bytes>,
    },
    /// It came early: held until the gap before it closes.
    Held,
    /// It came early, and holding it would pass `GROUP_HELD_BYTES_MAX`: not held; the gap is
    /// given up on at the next look (`Stream::overdue`), and this one counts as missed unless
    /// a repair brings it.
    Dropped,
    /// Delivered already, or from before the member's start: dropped.
    Stale,
}

/// Publishes handed over after a gap was skipped, and how many were skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// How many publishes were skipped: they never come.
    pub missed: u64,
    /// The publishes that waited behind the gap, in order: hand them to the application.
    pub deliver: Vec<Bytes>,
    /// When (node clock, ms) the gap skipped was first seen, or the stream last moved past
    /// the front of a gap before it (never earlier than it opened); `None` if none was open.
    pub opened_ms: Option<u64>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // What it still holds goes with it.
        self.budget.give(self.held_bytes);
    }
}

/// One publisher incarnation's stream to one group, as a member sees it.
#[derive(Debug)]
pub struct Stream {
    /// The publisher's incarnation this stream is of.
    pub incarnation: u64,
    /// The number of the next publish the application gets.
    next: u64,
    /// The first number of the stream: the member gets nothing before it.
    began: u64,
    /// It began at a plain mark (where the stream stood when the member joined, or was told
    /// so): nothing before it was for this member.
    began_at_mark: bool,
    /// The highest number known to exist (received, held, or named by a mark).
    known: u64,
    held: BTreeMap<u64, Bytes>,
    held_bytes: usize,
    /// A publish that came early was not held (the bound): give the gap up now.
    overflowed: bool,
    /// ...because the node's streams together held `GROUP_HELD_BYTES_NODE_MAX`.
    node_full: bool,
    /// What `held_bytes` is taken from.
    budget: Arc<HeldBudget>,
    /// When the current gap was seen or last narrowed (node clock, ms); `None`: no gap.
    gap_since_ms: Option<u64>,
    /// When the current gap was first seen, or the stream last moved past the front of a
    /// gap (node clock, ms); `None`: no gap. Never earlier than the gap now at `next` opened
    /// (which of the gaps held after a first one opened when is not kept): a cut-off decided
    /// by it errs toward telling a member of a gap rather than cutting it off.
    gap_opened_ms: Option<u64>,
    /// The ask under way, if any: no other is made until it is filled or stalls.
    asked: Option<Asked>,
}

impl Stream {
    /// A stream whose first publish seen is `number` (a publish, or a mark that names the
    /// publisher's last: then `number + 1` is the first the member gets).
    pub fn starting_at(incarnation: u64, number: u64) -> Self {
        Self {
            incarnation,
            next: number,
            began: number,
            began_at_mark: false,
            known: number.saturating_sub(1),
            held: BTreeMap::new(),
            held_bytes: 0,
            overflowed: false,
            node_full: false,
            budget: Arc::default(),
            gap_since_ms: None,
            gap_opened_ms: None,
            asked: None,
        }
    }

    /// The stream holds what it holds within `budget` (the node's, shared by its streams).
    pub fn within(mut self, budget: &Arc<HeldBudget>) -> Self {
        self.budget = budget.clone();
        self
    }

    /// The next number the application gets.
    #[cfg(test)]
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Whether a publish is missing before what is known to exist.
    pub fn has_gap(&self) -> bool {
        self.known >= self.next
    }

    /// Publish `number` arrived from its publisher (its payload made by `payload` only if it
    /// must wait). One that is next narrows a gap behind it but does not restart the gap's
    /// wait: only a repair does (see [`Stream::offer_copy`]), so a source that sends the
    /// numbers it left out one at a time, itself, cannot keep its gap open past
    /// `GROUP_REPAIR_WAIT_MS`.
    pub fn offer(&mut self, number: u64, now_ms: u64, payload: impl FnOnce() -> Bytes) -> Offer {
        self.take(number, now_ms, payload, false)
    }

    /// A repair's copy of publish `number` arrived: as [`Stream::offer`], and one that is
    /// next restarts the wait of the gap it narrows (a long repair goes on while it moves).
    pub fn offer_copy(
        &mut self,
        number: u64,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
    ) -> Offer {
        self.take(number, now_ms, payload, true)
    }

    fn take(
        &mut self,
        number: u64,
        now_ms: u64,
        payload: impl FnOnce() -> Bytes,
        copy: bool,
    ) -> Offer {
        if number < self.next || self.held.contains_key(&number) {
            return Offer::Stale;
        }
        self.known = self.known.max(number);
        if number == self.next {
            self.next += 1;
            let then = self.drain();
            if copy {
                self.progressed(now_ms);
            } else {
                self.moved_on(now_ms);
            }
            return Offer::Deliver { then };
        }
        self.gap_since_ms.get_or_insert(now_ms);
        self.gap_opened_ms.get_or_insert(now_ms);
        let p = payload();
        let cost = p.len() + HELD_ENTRY_OVERHEAD_BYTES;
        // Checked here, not only on the tick: a source that keeps its own gap open cannot
        // make the member hold more than the bound between two looks.
        if self.held_bytes + cost > GROUP_HELD_BYTES_MAX {
            self.overflowed = true;
            return Offer::Dropped;
        }
        if !self.budget.take(cost) {
            self.overflowed = true;
            self.node_full = true;
            return Offer::Dropped;
        }
        self.held_bytes += cost;
        // A copy: the payload is a slice of the read it came in, and holding the slice would
        // keep that whole read alive (a 1-byte publish pinning 64 KiB) while counting 65
        // bytes. Only publishes that came early are copied.
        self.held.insert(number, Bytes::copy_from_slice(&p));
        Offer::Held
    }

    /// Publishes `first..first + count` arrived in a row with nothing held: all of them are
    /// next, handed to the application at once (true); else nothing is done (false: offer
    /// them one by one).
    pub fn take_run(&mut self, first: u64, count: u64, now_ms: u64) -> bool {
        if count == 0 || first != self.next || !self.held.is_empty() {
            return false;
        }
        self.next += count;
        self.known = self.known.max(self.next - 1);
        self.moved_on(now_ms);
        true
    }

    /// The stream began at a plain mark (see `began_at_mark`).
    pub fn begun_at_mark(mut self) -> Self {
        self.began_at_mark = true;
        self
    }

    /// A gap mark says publishes `from..=last` were dropped on the way to this member: those
    /// before where the stream began can no longer come in order (a later publish began it
    /// first). How many: they count as missed, once (the stream's start moves back to
    /// `from`). None if the stream began at a plain mark: what came before it was not for
    /// this member (it joined there).
    pub fn dropped_before(&mut self, from: u64, last: u64) -> u64 {
        if self.began_at_mark || from >= self.began {
            return 0;
        }
        let missed = self.began.min(last.saturating_add(1)).saturating_sub(from);
        self.began = from;
        missed
    }

    /// A mark: the publisher's last publish is `number`.
    pub fn mark(&mut self, number: u64, now_ms: u64) {
        if number > self.known {
            self.known = number;
        }
        if self.has_gap() {
            self.gap_since_ms.get_or_insert(now_ms);
            self.gap_opened_ms.get_or_insert(now_ms);
        }
    }

    /// Whether to ask the publisher for its first gap now, and which numbers (`from..to`: up
    /// to the first publish held after it, or past the last known); counts as asked (see
    /// [`Stream::unask`] when the ask could not be sent). Not while an ask is under way: only
    /// once its gap is filled, or after `GROUP_REASK_MS` without progress.
    pub fn ask(&mut self, now_ms: u64) -> Option<(u64, u64)> {
        if !self.has_gap() {
            return None;
        }
        if let Some(a) = self.asked {
            if self.next < a.to && now_ms.saturating_sub(a.at_ms) < GROUP_REASK_MS {
                return None;
            }
        }
        let to = self
            .held
            .keys()
            .next()
            .copied()
            .unwrap_or(self.known.saturating_add(1));
        self.asked = Some(Asked { to, at_ms: now_ms });
        Some((self.next, to))
    }

    /// The ask [`Stream::ask`] returned was not sent: ask again later.
    pub fn unask(&mut self) {
        self.asked = None;
    }

    /// The publisher no longer holds `from..to`: those not here are skipped.
    /// `to` past the last number known means up to it (an earlier life of the publisher
    /// cannot say where its stream ended).
    pub fn lost(&mut self, from: u64, to: u64, now_ms: u64) -> Skipped {
        let to = to.min(self.known + 1);
        if from > self.next || to <= self.next {
            return Skipped::default();
        }
        let out = self.skip_to(to);
        self.progressed(now_ms);
        out
    }

    /// Gives the gap up if it waited `GROUP_REPAIR_WAIT_MS` since it last narrowed or holds
    /// more than `GROUP_HELD_BYTES_MAX`: skips to the first publish held (or past the last
    /// known).
    /// Also returns why.
    pub fn overdue(&mut self, now_ms: u64) -> Option<(Skipped, String)> {
        let since = self.gap_since_ms?;
        let why = if self.node_full {
            format!(
                "the node's streams together held {GROUP_HELD_BYTES_NODE_MAX} bytes of later publishes waiting for repairs (GROUP_HELD_BYTES_NODE_MAX)"
            )
        } else if self.overflowed || self.held_bytes > GROUP_HELD_BYTES_MAX {
            format!(
                "{} bytes of later publishes waited for a repair, and the next would pass \
                 {GROUP_HELD_BYTES_MAX} (GROUP_HELD_BYTES_MAX)",
                self.held_bytes
            )
        } else if now_ms.saturating_sub(since) >= GROUP_REPAIR_WAIT_MS {
            format!("no repair came within {GROUP_REPAIR_WAIT_MS} ms (GROUP_REPAIR_WAIT_MS)")
        } else {
            return None;
        };
        let to = self.held.keys().next().copied().unwrap_or(self.known + 1);
        let out = self.skip_to(to);
        self.progressed(now_ms);
        Some((out, why))
    }

    /// Everything held, in order, with the count of what is missing before and between: the
    /// stream ends (its publisher restarted, or the member left).
    pub fn close(mut self) -> Skipped {
        let to = self.known + 1;
        self.skip_to(to)
    }

    /// Skips to `to` (exclusive), handing over what is held before it and after it in a run.
    fn skip_to(&mut self, to: u64) -> Skipped {
        self.overflowed = false;
        self.node_full = false;
        let mut deliver = Vec::new();
        let mut have = 0u64;
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() >= to {
                break;
            }
            let p = entry.remove();
            self.held_bytes -= p.len() + HELD_ENTRY_OVERHEAD_BYTES;
            self.budget.give(p.len() + HELD_ENTRY_OVERHEAD_BYTES);
            deliver.push(p);
            have += 1;
        }
        let missed = to.saturating_sub(self.next) - have;
        self.next = self.next.max(to);
        deliver.extend(self.drain());
        Skipped {
            missed,
            deliver,
            opened_ms: self.gap_opened_ms,
        }
    }

    /// Takes the held publishes that now follow in a run.
    fn drain(&mut self) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Some(p) = self.held.remove(&self.next) {
            self.held_bytes -= p.len() + HELD_ENTRY_OVERHEAD_BYTES;
            self.budget.give(p.len() + HELD_ENTRY_OVERHEAD_BYTES);
            out.push(p);
            self.next += 1;
        }
        out
    }

    /// Publishes from the publisher moved the stream on: a gap closed is forgotten; one still
    /// open keeps its wait (see [`Stream::offer`]), and is taken as opened now (see
    /// `gap_opened_ms`).
    fn moved_on(&mut self, now_ms: u64) {
        if !self.has_gap() {
            self.gap_since_ms = None;
        }
        self.gap_opened_ms = self.has_gap().then_some(now_ms);
    }

    /// The stream moved on: a gap left, and the ask under way, are timed from now.
    fn progressed(&mut self, now_ms: u64) {
        self.gap_since_ms = self.has_gap().then_some(now_ms);
        self.gap_opened_ms = self.gap_since_ms;
        if let Some(a) = self.asked.as_mut() {
            a.at_ms = now_ms;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #26, item 4: the streams of a node together hold at most
    /// `GROUP_HELD_BYTES_NODE_MAX`; one that would pass it gives its gap up, naming the bound,
    /// and what a stream held is given back when it hands it over or goes.
    #[test]
    fn the_streams_of_a_node_hold_within_one_budget() {
        let budget = Arc::new(HeldBudget::default());
        let chunk = GROUP_HELD_BYTES_MAX / 2 - HELD_ENTRY_OVERHEAD_BYTES;
        let payload = Bytes::from(vec![0u8; chunk]);
        let mut streams: Vec<Stream> = (0..3)
            .map(|_| Stream::starting_at(1, 1).within(&budget))
            .collect();
        for s in &mut streams[..2] {
            assert_eq!(s.offer(3, 0, || payload.clone()), Offer::Held);
            assert_eq!(s.offer(4, 0, || payload.clone()), Offer::Held);
        }
        assert!(budget.used() <= GROUP_HELD_BYTES_NODE_MAX);
        assert_eq!(streams[2].offer(3, 0, || payload.clone()), Offer::Dropped);
        let (_, why) = streams[2].overdue(0).expect("given up at once");
        assert!(why.contains("GROUP_HELD_BYTES_NODE_MAX"), "{why}");
        let before = budget.used();
        streams.remove(0);
        assert!(budget.used() < before, "a stream that goes gives back");
        let (k, _) = streams[0].overdue(GROUP_REPAIR_WAIT_MS).expect("overdue");
        assert_eq!(k.deliver.len(), 2);
        assert_eq!(budget.used(), 0, "handed over, given back");
    }

    /// Issue #26, item 4: a source that leaves a number out and then sends what it left out
    /// one at a time, itself, narrows its gap without restarting its wait: the member gives
    /// it up `GROUP_REPAIR_WAIT_MS` after it opened. A repair's copy does restart it.
    #[test]
    fn a_gap_its_own_source_narrows_is_given_up_after_the_wait_and_a_repair_restarts_it() {
        let b = || Bytes::from_static(b"x");
        let mut s = Stream::starting_at(1, 1);
        assert!(matches!(s.offer(1, 0, b), Offer::Deliver { .. }));
        assert_eq!(s.offer(5, 0, b), Offer::Held);
        for (n, at) in [(2, 2_000), (3, 4_000)] {
            assert!(matches!(s.offer(n, at, b), Offer::Deliver { .. }));
        }
        assert!(s.overdue(GROUP_REPAIR_WAIT_MS - 1).is_none());
        let (skipped, why) = s.overdue(GROUP_REPAIR_WAIT_MS).expect("given up");
        assert_eq!(skipped.missed, 1, "{why}");
        let mut r = Stream::starting_at(1, 1);
        assert_eq!(r.offer(5, 0, b), Offer::Held);
        assert!(matches!(r.offer_copy(1, 4_000, b), Offer::Deliver { .. }));
        assert!(
            r.overdue(GROUP_REPAIR_WAIT_MS).is_none(),
            "the repair moves"
        );
    }

    fn p(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    fn deliver(s: &mut Stream, n: u8) -> Offer {
        s.offer(u64::from(n), 0, || p(n))
    }

    #[test]
    fn in_order_publishes_pass_and_copies_are_stale() {
        let mut s = Stream::starting_at(1, 5);
        assert_eq!(deliver(&mut s, 5), Offer::Deliver { then: vec![] });
        assert_eq!(deliver(&mut s, 6), Offer::Deliver { then: vec![] });
        assert_eq!(deliver(&mut s, 6), Offer::Stale);
        assert_eq!(deliver(&mut s, 4), Offer::Stale, "before the start");
        assert!(!s.has_gap());
        assert_eq!(s.ask(0), None);
    }

    #[test]
    fn a_gap_holds_later_publishes_until_the_repair_fills_it() {
        let mut s = Stream::starting_at(1, 1);
        assert_eq!(deliver(&mut s, 1), Offer::Deliver { then: vec![] });
        assert_eq!(deliver(&mut s, 4), Offer::Held);
        assert_eq!(deliver(&mut s, 5), Offer::Held);
        assert_eq!(deliver(&mut s, 5), Offer::Stale, "held already");
        assert_eq!(s.ask(0), Some((2, 4)), "the gap, not what is held after it");
        assert_eq!(s.ask(0), None, "asked once while it is under way");
        assert_eq!(deliver(&mut s, 2), Offer::Deliver { then: vec![] });
        assert_eq!(s.ask(0), None, "its copies are coming: not asked again");
        assert_eq!(
            deliver(&mut s, 3),
            Offer::Deliver {
                then: vec![p(4), p(5)]
            }
        );
        assert!(!s.has_gap());
        assert_eq!(s.next(), 6);
    }

    #[test]
    fn a_mark_reveals_a_lost_tail() {
        let mut s = Stream::starting_at(1, 1);
        deliver(&mut s, 1);
        s.mark(1, 0);
        assert!(!s.has_gap(), "nothing after 1");
        s.mark(3, 0);
        assert_eq!(s.ask(0), Some((2, 4)));
        deliver(&mut s, 2);
        deliver(&mut s, 3);
        assert!(!s.has_gap());
    }

    #[test]
    fn each_gap_is_asked_once_and_again_only_when_its_repair_stalls() {
        let mut s = Stream::starting_at(1, 1);
        deliver(&mut s, 1);
        s.offer(4, 0, || p(4));
        s.offer(8, 0, || p(8));
        assert_eq!(s.ask(0), Some((2, 4)));
        // A copy comes: progress, so the stall is timed from it.
        s.offer_copy(2, 600, || p(2));
        assert_eq!(s.ask(600 + GROUP_REASK_MS - 1), None);
        assert_eq!(
            s.ask(600 + GROUP_REASK_MS),
            Some((3, 4)),
            "stalled: the rest of the gap is asked again"
        );
        s.offer_copy(3, 2_000, || p(3));
        assert_eq!(
            s.ask(2_000),
            Some((5, 8)),
            "filled: the next gap is asked at once"
        );
        s.mark(9, 2_000);
        s.offer_copy(5, 2_000, || p(5));
        s.offer_copy(6, 2_000, || p(6));
        s.offer_copy(7, 2_000, || p(7));
        assert_eq!(s.ask(2_000), Some((9, 10)), "the tail a mark revealed");
        s.unask();
        assert_eq!(s.ask(2_000), Some((9, 10)), "not sent: asked again");
    }

    #[test]
    fn lost_ranges_are_skipped_and_counted_keeping_what_is_here() {
        let mut s = Stream::starting_at(1, 1);
        deliver(&mut s, 1);
        assert_eq!(deliver(&mut s, 3), Offer::Held);
        assert_eq!(deliver(&mut s, 6), Offer::Held);
        // The publisher holds nothing before 5: 2 and 4 are lost, 3 is here.
        let skipped = s.lost(2, 5, 0);
        assert_eq!(
            skipped,
            Skipped {
                missed: 2,
                deliver: vec![p(3)],
                opened_ms: Some(0),
            }
        );
        assert_eq!(s.next(), 5);
        assert_eq!(deliver(&mut s, 5), Offer::Deliver { then: vec![p(6)] });
        assert_eq!(s.lost(1, 3, 0), Skipped::default(), "old news");
    }

    #[test]
    fn a_gap_is_given_up_after_the_wait_or_past_the_bound() {
        let mut s = Stream::starting_at(1, 1);
        deliver(&mut s, 1);
        s.offer(4, 100, || p(4));
        assert_eq!(s.overdue(100 + GROUP_REPAIR_WAIT_MS - 1), None);
        let (skipped, why) = s.overdue(100 + GROUP_REPAIR_WAIT_MS).unwrap();
        assert!(why.contains("no repair came"), "{why}");
        assert_eq!(
            skipped,
            Skipped {
                missed: 2,
                deliver: vec![p(4)],
                opened_ms: Some(100),
            }
        );
        assert_eq!(s.overdue(u64::MAX), None, "no gap left");

        let mut big = Stream::starting_at(1, 1);
        let payload = Bytes::from(vec![0u8; GROUP_HELD_BYTES_MAX]);
        assert_eq!(big.offer(2, 0, || payload), Offer::Dropped, "never held");
        assert_eq!(big.held_bytes, 0);
        let (skipped, why) = big.overdue(0).unwrap();
        assert_eq!(
            skipped.missed, 2,
            "past the bound at once: 1 and 2 are lost"
        );
        assert!(why.contains("GROUP_HELD_BYTES_MAX"), "{why}");
    }

    #[test]
    fn a_held_publish_pins_only_its_own_bytes_and_the_bound_holds_on_insert() {
        // One 64 KiB read holding a 1-byte publish that came early.
        let read = Bytes::from(vec![7u8; 64 << 10]);
        let mut s = Stream::starting_at(1, 1);
        assert_eq!(s.offer(3, 0, || read.slice(100..101)), Offer::Held);
        let held = &s.held[&3];
        let inside = read.as_ptr_range();
        assert!(
            !inside.contains(&held.as_ptr()),
            "held as a copy, not as a slice that keeps the read alive"
        );
        assert_eq!(s.held_bytes, 1 + HELD_ENTRY_OVERHEAD_BYTES);

        // A source that keeps its gap open and sends on: the member holds no more than the
        // bound, whatever comes before the next look.
        let chunk = Bytes::from(vec![1u8; 1 << 20]);
        let mut dropped = 0;
        for n in 4..200 {
            if s.offer(n, 0, || chunk.clone()) == Offer::Dropped {
                dropped += 1;
            }
            assert!(s.held_bytes <= GROUP_HELD_BYTES_MAX);
        }
        assert!(dropped > 0);
        let (skipped, why) = s
            .overdue(1)
            .expect("given up at the next look, not after the wait");
        assert!(why.contains("GROUP_HELD_BYTES_MAX"), "{why}");
        assert_eq!(skipped.missed, 2, "1 and 2 never came");
        assert_eq!(s.held_bytes, 0, "what was held is handed over");
    }

    #[test]
    fn only_a_gap_given_up_while_the_application_fell_behind_cuts_off() {
        let wait = GROUP_REPAIR_WAIT_MS;
        let none = Skipped::default();
        let opened_at = |at| Skipped {
            opened_ms: Some(at),
            ..Skipped::default()
        };
        assert!(cuts_off(true, true, None, &none, 0), "behind now");
        assert!(
            cuts_off(true, false, Some(1_000), &none, 1_000 + wait),
            "behind lately"
        );
        assert!(
            !cuts_off(true, false, Some(1_000), &none, 1_001 + wait),
            "long ago"
        );
        // Behind just before the gap opened, given up a wait after it did.
        let opened = opened_at(1_500);
        assert!(cuts_off(
            true,
            false,
            Some(1_000),
            &opened,
            1_500 + wait + 100
        ));
        assert!(!cuts_off(
            true,
            false,
            Some(1_000),
            &opened_at(wait + 1_001),
            2 * wait + 2_000
        ));
        assert!(!cuts_off(true, false, None, &opened, 0), "never behind");
        assert!(
            !cuts_off(false, true, Some(0), &none, 0),
            "not given up: lost on the way"
        );
    }

    #[test]
    fn a_gap_left_after_the_first_closed_is_timed_from_then() {
        let mut s = Stream::starting_at(1, 1);
        assert_eq!(
            s.offer(3, 0, || p(3)),
            Offer::Held,
            "1 and 2 missing from 0"
        );
        assert_eq!(s.offer(8, 8_000, || p(8)), Offer::Held, "4 to 7 too");
        s.offer_copy(1, 9_000, || p(1));
        s.offer_copy(2, 9_000, || p(2));
        let (skipped, _) = s.overdue(9_000 + GROUP_REPAIR_WAIT_MS).unwrap();
        assert_eq!(skipped.missed, 4);
        assert_eq!(skipped.opened_ms, Some(9_000), "not the first gap's 0");
        let mut t = Stream::starting_at(1, 1);
        deliver(&mut t, 1);
        t.offer(3, 100, || p(3));
        t.offer(5, 200, || p(5));
        // The publisher's own 2 moves the stream past the first gap at 250: 4 is timed
        // from then.
        let two = t.offer(2, 250, || p(2));
        assert_eq!(two, Offer::Deliver { then: vec![p(3)] });
        assert_eq!(t.lost(4, 5, 300).opened_ms, Some(250));
    }

    #[test]
    fn a_closed_stream_hands_over_what_it_held() {
        let mut s = Stream::starting_at(1, 1);
        s.offer(3, 0, || p(3));
        s.mark(4, 0);
        assert_eq!(
            s.close(),
            Skipped {
                missed: 3,
                deliver: vec![p(3)],
                opened_ms: Some(0),
            }
        );
    }

    /// One thing that can happen to a stream.
    #[derive(Clone, Debug)]
    enum Step {
        Offer(u8),
        Mark(u8),
        Lost(u8, u8),
        Overdue,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1u8..60).prop_map(Step::Offer),
            1 => (1u8..60).prop_map(Step::Mark),
            1 => (1u8..60, 1u8..60).prop_map(|(a, b)| Step::Lost(a, b)),
            1 => Just(Step::Overdue),
        ]
    }

    proptest::proptest! {
        /// Whatever arrives, in whatever order, with whatever marks and losses: the
        /// application gets numbers strictly increasing, each once, and every number it
        /// did not get below the last it got was counted as missed.
        #[test]
        fn a_stream_hands_over_in_order_once_and_counts_what_it_skips(
            steps in proptest::collection::vec(step(), 0..200)
        ) {
            let mut s = Stream::starting_at(1, 1);
            let mut got: Vec<u64> = Vec::new();
            let mut missed = 0u64;
            let mut now = 0;
            let num = |b: &Bytes| u64::from(b[0]);
            for st in steps {
                now += GROUP_REPAIR_WAIT_MS / 3;
                match st {
                    Step::Offer(n) => {
                        if let Offer::Deliver { then } = s.offer(u64::from(n), now, || p(n)) {
                            got.push(u64::from(n));
                            got.extend(then.iter().map(num));
                        }
                    }
                    Step::Mark(n) => s.mark(u64::from(n), now),
                    Step::Lost(a, b) => {
                        let (a, b) = (u64::from(a.min(b)), u64::from(a.max(b)) + 1);
                        let k = s.lost(a, b, now);
                        missed += k.missed;
                        got.extend(k.deliver.iter().map(num));
                    }
                    Step::Overdue => {
                        if let Some((k, _)) = s.overdue(now) {
                            missed += k.missed;
                            got.extend(k.deliver.iter().map(num));
                        }
                    }
                }
                proptest::prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
            }
            // The numbers from 1 to the last one handed over that were not handed over.
            let absent = got.last().map_or(0, |&last| last - got.len() as u64);
            proptest::prop_assert!(missed >= absent, "missed {missed}, absent {absent}: {got:?}");
        }
    }
}
