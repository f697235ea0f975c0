//! A publisher's repairs under way: what it still has to send the members (or multicast
//! receivers) that asked it for copies, oldest first, within `GROUP_REPAIRS_PENDING_MAX`; one
//! job per member and stream, so a member that never makes room holds up no other's.

use super::state::GroupName;
use super::stream::GROUP_REASK_MS;
use crate::BusId;
use bytes::Bytes;
use std::collections::VecDeque;

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

/// The repairs under way (see the module's documentation).
#[derive(Debug, Default)]
pub struct Repairs {
    /// Oldest first; at most `GROUP_REPAIRS_PENDING_MAX`.
    jobs: VecDeque<RepairJob>,
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

    /// Whether `member` asks for a repair of `group` too soon after its last ask, whose
    /// repair is still under way (see `REPAIR_ASK_GAP_MIN_MS`).
    pub fn asks_too_soon(&self, member: BusId, group: &str, now_ms: u64) -> bool {
        self.jobs.iter().any(|j| {
            j.to == member
                && &*j.group == group
                && now_ms.saturating_sub(j.asked_ms) < REPAIR_ASK_GAP_MIN_MS
        })
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

    /// Whether repairs are under way.
    pub fn any(&self) -> bool {
        !self.jobs.is_empty()
    }
}
