//! A publisher's repairs under way: what it still has to send the members (or multicast
//! receivers) that asked it for copies, oldest first, within `GROUP_REPAIRS_PENDING_MAX`; one
//! job per member and stream, so a member that never makes room holds up no other's.

use super::state::GroupName;
use super::stream::GROUP_REASK_MS;
use crate::BusId;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

/// A repair on its way to the member that asked: sent as far as its queue allowed, the rest
/// waits for room (see [`Repairs::take`]).
#[derive(Debug)]
pub struct RepairJob {
    pub to: BusId,
    pub group: GroupName,
    pub incarnation: u64,
    pub lost: Option<(u64, u64)>,
    pub copies: VecDeque<(u64, Bytes)>,
    /// When the member asked for it (node clock, ms).
    pub asked_ms: u64,
}

/// Repairs a publisher has under way at once; an ask past it is refused (counted), and the
/// member gives its gap up when its wait runs out.
pub const GROUP_REPAIRS_PENDING_MAX: usize = 256;
/// An ask from a member whose repair of the same stream is still under way and was asked
/// less than this long ago (ms) is refused, counted, before any plan is made: an honest
/// member asks again only once its gap is filled (its repair sent by then) or after
/// `GROUP_REASK_MS` without progress, so only a member that asks in a loop is refused, and
/// one that does costs the publisher one plan per this long and stream, not one per ask.
pub const REPAIR_ASK_GAP_MIN_MS: u64 = GROUP_REASK_MS / 2;
/// (member, stream) pairs whose last ask a publisher remembers for `REPAIR_ASK_GAP_MIN_MS`
/// after it was planned, done or not: an ask overlapping the one before within that time is
/// refused, so a member that asks in a loop gets one plan per that long however fast its
/// repairs are sent. Past it (that many asks within `REPAIR_ASK_GAP_MIN_MS`), further asks
/// are refused until some are old enough to forget; an honest member asks again a
/// `GROUP_REASK_MS` later.
pub const REPAIR_ASKS_REMEMBERED_MAX: usize = 4_096;

/// The repairs under way (see the module's documentation).
#[derive(Debug, Default)]
pub struct Repairs {
    /// Oldest first; at most `GROUP_REPAIRS_PENDING_MAX`.
    jobs: VecDeque<RepairJob>,
    /// Per (member, stream), the range of its last ask planned and when (node clock, ms);
    /// at most `REPAIR_ASKS_REMEMBERED_MAX`.
    asked: HashMap<(BusId, GroupName), ((u64, u64), u64)>,
}

impl Repairs {
    /// Queues a repair to send; false (and dropped) past `GROUP_REPAIRS_PENDING_MAX`. A
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
        if q.len() >= GROUP_REPAIRS_PENDING_MAX {
            return false;
        }
        q.push_back(job);
        true
    }

    /// Whether `member`'s ask for `from..to` of `group` at `now_ms` comes too soon, and is
    /// refused: its repair of the stream is still under way and was asked less than
    /// `REPAIR_ASK_GAP_MIN_MS` ago, or its last ask of the stream overlaps this one and came
    /// less than that long ago. An ask let through is remembered.
    pub fn asks_too_soon(
        &mut self,
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
        let key: (BusId, GroupName) = (member, group.into());
        let overlaps = self
            .asked
            .get(&key)
            .is_some_and(|&((f, t), at)| recent(at) && from < t && f < to);
        if pending || overlaps {
            return true;
        }
        if self.asked.len() >= REPAIR_ASKS_REMEMBERED_MAX && !self.asked.contains_key(&key) {
            self.asked.retain(|_, &mut (_, at)| recent(at));
            if self.asked.len() >= REPAIR_ASKS_REMEMBERED_MAX {
                return true;
            }
        }
        self.asked.insert(key, ((from, to), now_ms));
        false
    }

    /// The oldest repair under way, to send as much of as fits; give it back with
    /// [`Repairs::resume`] if some is left.
    pub fn take(&mut self) -> Option<RepairJob> {
        self.jobs.pop_front()
    }

    /// A repair taken and not finished: first again next time.
    pub fn resume(&mut self, job: RepairJob) {
        let q = &mut self.jobs;
        // A newer ask of the same member for the same stream came meanwhile: it replaces this.
        if !q.iter().any(|j| j.to == job.to && j.group == job.group) {
            q.push_front(job);
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

    fn job(to: u64, asked_ms: u64) -> RepairJob {
        RepairJob {
            to: BusId(to),
            group: "g".into(),
            incarnation: 1,
            lost: None,
            copies: VecDeque::new(),
            asked_ms,
        }
    }

    /// Issue #26, item 3: a member that asks in a loop gets one plan per
    /// `REPAIR_ASK_GAP_MIN_MS` even when each repair is sent before its next ask; an honest
    /// member's next gap (after the last) or its re-ask after `GROUP_REASK_MS` is let through.
    #[test]
    fn an_ask_overlapping_the_last_within_the_gap_is_refused_even_once_its_repair_was_sent() {
        let mut r = Repairs::default();
        let m = BusId(7);
        assert!(!r.asks_too_soon(m, "g", (1, 1 << 62), 0));
        assert!(r.queue(job(7, 0)));
        assert!(r.take().is_some(), "its copies were sent");
        assert!(r.asks_too_soon(m, "g", (1, 1 << 62), 100), "a loop");
        assert!(r.asks_too_soon(m, "g", (5, 6), REPAIR_ASK_GAP_MIN_MS - 1));
        assert!(
            !r.asks_too_soon(m, "h", (1, 1 << 62), 100),
            "another stream"
        );
        assert!(
            !r.asks_too_soon(BusId(8), "g", (1, 1 << 62), 100),
            "another member"
        );
        assert!(
            !r.asks_too_soon(m, "g", (1, 1 << 62), GROUP_REASK_MS),
            "a re-ask"
        );
        assert!(
            !r.asks_too_soon(m, "g", (1 << 62, (1 << 62) + 5), GROUP_REASK_MS + 1),
            "the next gap, after the last"
        );
    }

    #[test]
    fn an_ask_while_its_repair_is_under_way_is_refused_and_the_memory_is_bounded() {
        let mut r = Repairs::default();
        assert!(!r.asks_too_soon(BusId(7), "g", (1, 5), 0));
        assert!(r.queue(job(7, 0)));
        assert!(r.asks_too_soon(BusId(7), "g", (5, 9), 10), "under way");
        for m in 0..REPAIR_ASKS_REMEMBERED_MAX as u64 {
            r.asks_too_soon(BusId(1_000 + m), "g", (1, 2), 20);
        }
        assert!(r.asked.len() <= REPAIR_ASKS_REMEMBERED_MAX);
        assert!(
            r.asks_too_soon(BusId(99), "g", (1, 2), 30),
            "full of recent asks: refused"
        );
        assert!(!r.asks_too_soon(BusId(99), "g", (1, 2), 20 + REPAIR_ASK_GAP_MIN_MS));
        assert!(r.asked.len() <= REPAIR_ASKS_REMEMBERED_MAX);
    }
}
