//! A publisher's repairs under way: what it still has to send the members (or multicast
//! receivers) that asked it for copies, oldest first, within `GROUP_REPAIRS_PENDING_MAX`; one
//! job per member and stream, so a member that never makes room holds up no other's.

use super::state::{GroupName, RepairPlan};
use super::stream::{GROUP_REASK_MS, GROUP_REPAIR_WAIT_MS};
use crate::BusId;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

/// A repair on its way to the member that asked: sent as far as its queue allowed, the rest
/// waits for room (see [`Repairs::take`]).
#[derive(Debug)]
pub struct RepairJob {
    /// The member that asked.
    pub to: BusId,
    /// The stream: a group, or `MULTICAST_STREAM`.
    pub group: GroupName,
    /// This publisher's incarnation, named in what it sends.
    pub incarnation: u64,
    /// Numbers no longer held (`from..to`), told first; `None` once told.
    pub lost: Option<(u64, u64)>,
    /// Copies still to send, in number order.
    pub copies: VecDeque<(u64, Bytes)>,
    /// When the member asked for it (node clock, ms).
    pub asked_ms: u64,
}

/// Repairs a publisher has under way at once; an ask past it is refused (counted), and the
/// member gives its gap up when its wait runs out.
pub const GROUP_REPAIRS_PENDING_MAX: usize = 256;
/// Repairs under way for one member at once (one per stream); an ask past it is refused as
/// past `GROUP_REPAIRS_PENDING_MAX`: a member that asks for many streams and never makes
/// room cannot take the room of the others.
pub const REPAIR_JOBS_PER_MEMBER_MAX: usize = 16;
/// An ask from a member whose repair of the same stream is still under way and was asked
/// less than this long ago (ms) is refused, counted, before any plan is made: an honest
/// member asks again only once its gap is filled (its repair sent by then) or after
/// `GROUP_REASK_MS` without progress, so only a member that asks in a loop is refused, and
/// one that does costs the publisher one plan per this long and stream, not one per ask.
pub const REPAIR_ASK_GAP_MIN_MS: u64 = GROUP_REASK_MS / 2;
/// Members whose last ask of each stream a publisher remembers (for
/// `REPAIR_ASK_GAP_MIN_MS` after it was planned, done or not): an ask overlapping the one
/// before within that time is refused, so a member that asks in a loop gets one plan per
/// that long however fast its repairs are sent. Past it, the member remembered first is
/// forgotten (in O(1)): that weakens only the loop bound for it, and refuses no ask. Only
/// asks of a stream this node has are remembered: made-up names cost no memory.
pub const REPAIR_ASKERS_REMEMBERED_MAX: usize = 4_096;
/// Streams per member whose last ask is remembered; past it, its oldest is forgotten.
pub const REPAIR_ASKS_PER_MEMBER_MAX: usize = 16;

/// Why a publisher refused an ask (the caller counts it; the member gives its gap up when
/// its wait runs out, or asks again later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AskRefused {
    /// Too soon after the same member's last ask of the stream (see
    /// [`Repairs::asks_too_soon`]).
    TooSoon,
    /// `GROUP_REPAIRS_PENDING_MAX` repairs are under way, or `REPAIR_JOBS_PER_MEMBER_MAX`
    /// for this member.
    TooMany,
}

/// The repairs under way (see the module's documentation).
#[derive(Debug, Default)]
pub struct Repairs {
    /// Oldest first; at most `GROUP_REPAIRS_PENDING_MAX`.
    jobs: VecDeque<RepairJob>,
    /// Per member, its last ask planned of each stream, oldest first (at most
    /// `REPAIR_ASKS_PER_MEMBER_MAX`); at most `REPAIR_ASKERS_REMEMBERED_MAX` members.
    asked: HashMap<BusId, VecDeque<Asked>>,
    /// The members of `asked`, in the order first remembered: the first goes when it is full.
    askers: VecDeque<BusId>,
}

/// A member's ask remembered (see `REPAIR_ASKERS_REMEMBERED_MAX`).
#[derive(Debug)]
struct Asked {
    stream: GroupName,
    range: (u64, u64),
    /// When it was planned (node clock, ms).
    at_ms: u64,
}

impl Repairs {
    /// `member` asks this publisher (now `incarnation`) for `range` of `stream` (a group, or
    /// `MULTICAST_STREAM`) at `now_ms`: refused if it comes too soon, else planned by `plan`
    /// (what is kept of the range, and what is lost) and queued, unless too many repairs are
    /// under way. The one way a publisher takes an ask, for groups and multicast alike (a
    /// caller that must not plan under its lock of this calls [`Repairs::asks_too_soon`],
    /// plans, then [`Repairs::take_planned`]).
    pub fn answer(
        &mut self,
        member: BusId,
        stream: &str,
        range: (u64, u64),
        (incarnation, now_ms): (u64, u64),
        plan: impl FnOnce() -> RepairPlan,
    ) -> Result<(), AskRefused> {
        if self.asks_too_soon(member, stream, range, now_ms) {
            return Err(AskRefused::TooSoon);
        }
        self.take_planned(member, stream, range, (incarnation, now_ms), plan())
    }

    /// The second half of [`Repairs::answer`]: `plan`, made for an ask not refused as too
    /// soon, is queued (and the ask remembered), unless too many repairs are under way.
    pub fn take_planned(
        &mut self,
        member: BusId,
        stream: &str,
        range: (u64, u64),
        (incarnation, now_ms): (u64, u64),
        plan: RepairPlan,
    ) -> Result<(), AskRefused> {
        // Nothing of it: no stream of that name (or of that incarnation) here.
        let unknown = plan.copies.is_empty() && plan.lost.is_some_and(|(_, to)| to == u64::MAX);
        if !unknown {
            self.remember(member, stream, range, now_ms);
        }
        let job = RepairJob {
            to: member,
            group: stream.into(),
            incarnation,
            lost: plan.lost,
            copies: plan.copies.into(),
            asked_ms: now_ms,
        };
        if self.queue(job) {
            Ok(())
        } else {
            Err(AskRefused::TooMany)
        }
    }

    /// Queues a repair to send; false (and dropped) past `GROUP_REPAIRS_PENDING_MAX`, or past
    /// `REPAIR_JOBS_PER_MEMBER_MAX` for its member. A
    /// repair still under way for the same member and stream is replaced: the member asks
    /// again only when that one stalled, from where it stands now.
    pub fn queue(&mut self, job: RepairJob) -> bool {
        let q = &mut self.jobs;
        if let Some(old) = q
            .iter_mut()
            .find(|j| j.to == job.to && j.group == job.group)
        {
            *old = job;
            return true;
        }
        if q.len() >= GROUP_REPAIRS_PENDING_MAX
            || q.iter().filter(|j| j.to == job.to).count() >= REPAIR_JOBS_PER_MEMBER_MAX
        {
            return false;
        }
        q.push_back(job);
        true
    }

    /// Whether `member`'s ask for `from..to` of `group` at `now_ms` comes too soon, and is
    /// refused: its repair of the stream is still under way and was asked less than
    /// `REPAIR_ASK_GAP_MIN_MS` ago, or its last ask of the stream remembered overlaps this
    /// one and came less than that long ago.
    pub fn asks_too_soon(
        &self,
        member: BusId,
        group: &str,
        (from, to): (u64, u64),
        now_ms: u64,
    ) -> bool {
        let recent = |at: u64| now_ms.saturating_sub(at) < REPAIR_ASK_GAP_MIN_MS;
        let pending = self
            .jobs
            .iter()
            .any(|j| j.to == member && &*j.group == group && recent(j.asked_ms));
        let overlaps = self.asked.get(&member).is_some_and(|asks| {
            asks.iter().any(|a| {
                &*a.stream == group && recent(a.at_ms) && from < a.range.1 && a.range.0 < to
            })
        });
        pending || overlaps
    }

    /// Remembers `member`'s ask of `range` of `stream` planned at `now_ms`, within the bounds.
    fn remember(&mut self, member: BusId, stream: &str, range: (u64, u64), now_ms: u64) {
        if !self.asked.contains_key(&member) {
            if self.asked.len() >= REPAIR_ASKERS_REMEMBERED_MAX {
                if let Some(first) = self.askers.pop_front() {
                    self.asked.remove(&first);
                }
            }
            self.askers.push_back(member);
        }
        let asks = self.asked.entry(member).or_default();
        asks.retain(|a| &*a.stream != stream);
        if asks.len() >= REPAIR_ASKS_PER_MEMBER_MAX {
            asks.pop_front();
        }
        asks.push_back(Asked {
            stream: stream.into(),
            range,
            at_ms: now_ms,
        });
    }

    /// The oldest repair under way at `now_ms`, to send as much of as fits; give it back
    /// with [`Repairs::requeue`] if some is left. One asked `GROUP_REPAIR_WAIT_MS` ago or more
    /// is dropped on the way: its member has given the gap up by then.
    pub fn take(&mut self, now_ms: u64) -> Option<RepairJob> {
        while let Some(job) = self.jobs.pop_front() {
            if now_ms.saturating_sub(job.asked_ms) < GROUP_REPAIR_WAIT_MS {
                return Some(job);
            }
        }
        None
    }

    /// A repair taken and not finished (its way was full): behind the others, so that a
    /// member that makes no room holds up no one else's. Dropped if a newer ask of the same
    /// member for the same stream came meanwhile (it replaces this).
    pub fn requeue(&mut self, job: RepairJob) {
        let q = &mut self.jobs;
        if !q.iter().any(|j| j.to == job.to && j.group == job.group) {
            q.push_back(job);
        }
    }

    /// How many repairs are under way (at most `GROUP_REPAIRS_PENDING_MAX`).
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no repair is under way.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan of `n` copies (a stream this node has).
    fn copies(n: u64) -> RepairPlan {
        RepairPlan {
            lost: None,
            copies: (1..=n).map(|i| (i, Bytes::new())).collect(),
        }
    }

    fn ask(r: &mut Repairs, member: u64, stream: &str, range: (u64, u64), now: u64) -> bool {
        r.answer(BusId(member), stream, range, (1, now), || copies(3))
            .is_ok()
    }

    /// Issue #26, item 3: a member that asks in a loop gets one plan per
    /// `REPAIR_ASK_GAP_MIN_MS` even when each repair is sent before its next ask; an honest
    /// member's next gap (after the last) or its re-ask after `GROUP_REASK_MS` is let through.
    #[test]
    fn an_ask_overlapping_the_last_within_the_gap_is_refused_even_once_its_repair_was_sent() {
        let mut r = Repairs::default();
        assert!(ask(&mut r, 7, "g", (1, 1 << 62), 0));
        assert!(r.take(0).is_some(), "its copies were sent");
        assert!(!ask(&mut r, 7, "g", (1, 1 << 62), 100), "a loop");
        assert!(!ask(&mut r, 7, "g", (5, 6), REPAIR_ASK_GAP_MIN_MS - 1));
        assert!(ask(&mut r, 7, "h", (1, 1 << 62), 100), "another stream");
        assert!(ask(&mut r, 8, "g", (1, 1 << 62), 100), "another member");
        r.take(0);
        r.take(0);
        assert!(
            ask(&mut r, 7, "g", (1, 1 << 62), GROUP_REASK_MS),
            "a re-ask"
        );
        r.take(0);
        assert!(
            ask(&mut r, 7, "g", (1 << 62, (1 << 62) + 5), GROUP_REASK_MS + 1),
            "the next gap, after the last"
        );
    }

    /// The review of issue #26: asks under made-up names cost no memory, and a full memory
    /// forgets its first member in O(1) rather than refusing anyone.
    #[test]
    fn an_ask_while_its_repair_is_under_way_is_refused_and_the_memory_is_bounded() {
        let mut r = Repairs::default();
        assert!(ask(&mut r, 7, "g", (1, 5), 0));
        assert_eq!(
            r.answer(BusId(7), "g", (5, 9), (1, 10), || copies(1)),
            Err(AskRefused::TooSoon),
            "under way"
        );
        let nothing = || RepairPlan {
            lost: Some((1, u64::MAX)),
            copies: Vec::new(),
        };
        for i in 0..100u64 {
            let _ = r.answer(BusId(9), &format!("made-up {i}"), (1, 2), (1, 20), nothing);
        }
        assert!(
            !r.asked.contains_key(&BusId(9)),
            "nothing remembered of made-up names"
        );
        while r.take(0).is_some() {}
        for m in 0..REPAIR_ASKERS_REMEMBERED_MAX as u64 + 10 {
            assert!(
                ask(&mut r, 1_000 + m, "g", (1, 2), 30),
                "never refused for room"
            );
            r.take(0);
        }
        assert_eq!(r.asked.len(), REPAIR_ASKERS_REMEMBERED_MAX);
        assert_eq!(r.askers.len(), REPAIR_ASKERS_REMEMBERED_MAX);
        assert!(
            !r.asked.contains_key(&BusId(7)),
            "the first remembered went first"
        );
        for i in 0..REPAIR_ASKS_PER_MEMBER_MAX + 5 {
            assert!(ask(&mut r, 5, &format!("s{i}"), (1, 2), 40));
            r.take(0);
        }
        assert_eq!(r.asked[&BusId(5)].len(), REPAIR_ASKS_PER_MEMBER_MAX);
    }

    /// The review of issue #26: a member that asks for many streams and never makes room
    /// holds at most `REPAIR_JOBS_PER_MEMBER_MAX` jobs, a job whose way is full goes behind
    /// the others, and a job its member has given up on (`GROUP_REPAIR_WAIT_MS`) is dropped.
    #[test]
    fn one_member_cannot_fill_the_queue_or_hold_it_up() {
        let mut r = Repairs::default();
        for i in 0..REPAIR_JOBS_PER_MEMBER_MAX + 5 {
            let _ = ask(&mut r, 66, &format!("s{i}"), (1, 2), 0);
        }
        assert_eq!(
            r.len(),
            REPAIR_JOBS_PER_MEMBER_MAX,
            "the liar's own share only"
        );
        assert!(
            ask(&mut r, 7, "g", (1, 2), 0),
            "an honest member finds room"
        );
        let first = r.take(1).expect("a job");
        assert_eq!(first.to, BusId(66));
        r.requeue(first);
        let order: Vec<u64> = std::iter::from_fn(|| r.take(1)).map(|j| j.to.0).collect();
        assert_eq!(order.len(), REPAIR_JOBS_PER_MEMBER_MAX + 1);
        assert_eq!(
            order[order.len() - 2],
            7,
            "the honest job before the requeued one"
        );
        assert_eq!(order[order.len() - 1], 66);
        assert!(ask(&mut r, 8, "g", (1, 2), 0));
        assert!(
            r.take(GROUP_REPAIR_WAIT_MS).is_none(),
            "given up by its member: dropped"
        );
    }
}
