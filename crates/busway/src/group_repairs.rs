//! A member's and a publisher's repairs: REPAIR messages answered (asks queued as repair
//! jobs, copies and losses applied to the member's stream), gaps skipped (a `GroupGap`, or a
//! cut-off if the application fell behind), asks made, jobs sent as far as the members' queues
//! allow, and the groups' timers on the retry tick (see `busway_core::group::repairs` and
//! `busway_core::group::stream` for the rules).

use crate::event::Event;
use crate::handover::Delivered;
use crate::multicast::MulticastHost;
use crate::node::SendError;
use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::group::repairs::{AskRefused, RepairJob};
use busway_core::group::stream::{cuts_off, Offer, Skipped};
use busway_core::group::{decode_repair, encode_mark, Repair, MULTICAST_STREAM};
use busway_core::group::{encode_repair_ask, encode_repair_copy_head, encode_repair_lost};
use busway_core::multicast;
use busway_core::BusId;
use bytes::Bytes;

impl Shared {
    /// A REPAIR from `from` (end to end), its body at `start` of `chunk`: an ask answered,
    /// a copy or a loss applied to this member's stream; true if a gap is left to ask for.
    pub(crate) fn repair_received(
        &self,
        from: BusId,
        chunk: &Bytes,
        start: u32,
        body: &Bytes,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        // Checked by `message_spans`.
        let Ok(repair) = decode_repair(body) else {
            return false;
        };
        if repair_names(&repair) == MULTICAST_STREAM {
            let mut link = None;
            let host = &mut MulticastHost::new(self, out, &mut link);
            let at = (chunk, start, body);
            return multicast::node::repair_received(host, from, at, repair, now_ms);
        }
        match repair {
            Repair::Ask {
                incarnation,
                from: first,
                to,
                name,
            } => {
                self.answer_repair_ask(from, name, (first, to), now_ms, || {
                    self.groups
                        .repair(name, incarnation, self.incarnation, (first, to))
                });
                false
            }
            Repair::Copy(head) => {
                if head.publisher != from {
                    tracing::warn!(peer = %from, publisher = %head.publisher, group = head.name, "REPAIR copy of another node's publish: dropped");
                    bump(&self.counters.group_repairs_refused);
                    return false;
                }
                let payload = || body.slice(head.payload_at..);
                match self.groups.repaired(&head, now_ms, payload, out) {
                    None => {
                        bump(&self.counters.group_repairs_refused);
                        false
                    }
                    Some((offer, gap)) => {
                        if let Offer::Deliver { then } = offer {
                            let at = head.payload_at as u32;
                            let span = (start + at, body.len() as u32 - at);
                            out.span(head.publisher, Some(head.name), chunk, span);
                            out.payloads(head.publisher, Some(head.name), then);
                        }
                        gap
                    }
                }
            }
            Repair::Lost {
                incarnation,
                from: first,
                to,
                name,
            } => {
                match self
                    .groups
                    .lost(from, incarnation, name, (first, to), now_ms, out)
                {
                    Some(skipped) => {
                        let why = format!(
                            "publisher {from} no longer holds publishes {first}.. (its group_retain_bytes)"
                        );
                        self.skipped(from, name, skipped, (why, true), out)
                    }
                    None => bump(&self.counters.group_repairs_refused),
                }
                false
            }
            // Sorted out to the multicast machine above.
            Repair::Unreachable { .. } => false,
            Repair::Refused {
                publish,
                name,
                reason,
            } => {
                tracing::warn!(by = %from, group = name, publish, reason, "group refused");
                self.emit(crate::event::Event::GroupRefused {
                    group: name.to_owned(),
                    by: from,
                    publish,
                    reason: reason.to_owned(),
                });
                false
            }
        }
    }

    /// `from`'s ask for `range` of `stream` (a group, or `MULTICAST_STREAM`), planned by
    /// `plan`: queued, or refused (counted, and logged with why) as `Repairs::answer` says.
    /// The one way this publisher takes an ask, for groups and multicast alike.
    pub(crate) fn answer_repair_ask(
        &self,
        from: BusId,
        stream: &str,
        range: (u64, u64),
        now_ms: u64,
        plan: impl FnOnce() -> busway_core::group::state::RepairPlan,
    ) {
        let answered =
            self.groups
                .answer_ask(from, stream, range, (self.incarnation, now_ms), plan);
        if let Err(why) = answered {
            self.ask_refused(from, stream, why);
        }
    }

    /// `from`'s ask of `stream` was refused (`why`): counted, and logged.
    pub(crate) fn ask_refused(&self, from: BusId, stream: &str, why: AskRefused) {
        match why {
            AskRefused::TooMany => {
                tracing::warn!(member = %from, stream, "repair refused: too many under way");
            }
            AskRefused::TooSoon => {
                tracing::debug!(member = %from, stream, "repair refused: asked again too soon");
            }
        }
        bump(&self.counters.group_repairs_refused);
    }

    /// Publishes of `publisher` to `group` that will never come were skipped: the member
    /// gets what waited behind them, then is told how many and `why`. A gap given up on
    /// (`given_up`: no repair came, the publisher no longer holds them, too much waited) cuts
    /// the member off only if its own application fell behind (the core's `cuts_off`): it leaves
    /// the group (`GroupCutOff`; the caller tells the peers, see `Delivered::left`). Else
    /// (they were lost on the way, or the publisher restarted) it stays, told by `GroupGap`:
    /// nothing a publisher or a hop does can make a member that keeps up leave its group.
    pub(crate) fn skipped(
        &self,
        publisher: BusId,
        group: &str,
        mut skipped: Skipped,
        (why, given_up): (String, bool),
        out: &mut Delivered<'_>,
    ) {
        out.payloads(publisher, Some(group), std::mem::take(&mut skipped.deliver));
        if skipped.missed == 0 {
            return;
        }
        let missed = skipped.missed;
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let behind_now = self.inbox.group_backlogged();
        let behind_at = self.groups.app_behind_at();
        if cuts_off(given_up, behind_now, behind_at, &skipped, now_ms) {
            tracing::warn!(%publisher, group, missed, reason = %why, "cut off from the group: its application fell behind");
            out.left |= self.groups.leave(group);
            self.emit(Event::GroupCutOff {
                group: group.to_owned(),
                publisher,
                missed,
                reason: why,
            });
        } else {
            tracing::warn!(%publisher, group, missed, reason = %why, "publishes lost");
            self.emit(Event::GroupGap {
                group: group.to_owned(),
                publisher,
                missed,
                reason: why,
            });
        }
    }

    /// Sends `peer`, which newly asked for `group`, a mark per publisher this node knows:
    /// a member behind it that lost the end of a stream (its relay died) sees the gap.
    pub(crate) fn send_marks(&self, peer: BusId, group: &str) {
        let Some(p) = self.peer(peer) else {
            return;
        };
        for (publisher, incarnation, number) in
            self.groups
                .marks_for(group, self.config.id, self.incarnation)
        {
            // Never a mark up in a name the upstream does not hold for us (a publisher above
            // is the upstream's own business): it would close the link.
            if !self.may_pass_to(peer, publisher) {
                continue;
            }
            // A mark that does not fit is sent on a later tick.
            if !push_mark(&p, &encode_mark(publisher, incarnation, number, group)) {
                self.groups.owe_mark(peer, publisher, group);
            }
        }
    }

    /// Asks the publishers of streams with a gap for copies; an ask that cannot be sent now
    /// is made again on the next tick.
    pub(crate) fn ask_repairs(&self) {
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let asks = self.groups.asks(now_ms).into_iter();
        for ask in asks.chain(self.multicasts.asks(now_ms)) {
            let body = encode_repair_ask(ask.incarnation, ask.from, ask.to, &ask.group);
            match self.try_send_framed(ask.publisher, FrameKind::Repair, &body, &Bytes::new()) {
                Ok(_) => bump(&self.counters.group_repairs_asked),
                Err(e) => {
                    tracing::debug!(publisher = %ask.publisher, group = %ask.group, error = %e, "repair ask not sent yet");
                    if &*ask.group == MULTICAST_STREAM {
                        self.multicasts.unask(&ask);
                    } else {
                        self.groups.unask(&ask);
                    }
                }
            }
        }
    }

    /// Sends the repairs under way as far as the queues toward their members allow.
    pub(crate) fn pump_repairs(&self) {
        // Each job under way is taken once per call, oldest first. One whose way is full
        // goes behind the others, and the member's other jobs are not tried again in this
        // call: a member that makes no room holds up no one else's repair (issue #26, item
        // 3), and costs a call at most its `REPAIR_JOBS_PER_MEMBER_MAX` jobs.
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let mut full: std::collections::HashSet<BusId> = std::collections::HashSet::new();
        for _ in 0..self.groups.repairs_len() {
            let Some(mut job) = self.groups.take_repair(now_ms) else {
                break;
            };
            if full.contains(&job.to) {
                self.groups.requeue_repair(job);
                continue;
            }
            match self.send_repair(&mut job) {
                Ok(()) => {}
                Err(SendError::Full(_)) => {
                    full.insert(job.to);
                    self.groups.requeue_repair(job);
                }
                Err(e) => {
                    tracing::debug!(member = %job.to, group = %job.group, error = %e, "repair dropped");
                }
            }
        }
    }

    /// Sends what fits of one repair: the loss first, then the copies in order.
    fn send_repair(&self, job: &mut RepairJob) -> Result<(), SendError> {
        if let Some((first, to)) = job.lost {
            let body = encode_repair_lost(job.incarnation, first, to, &job.group);
            self.try_send_framed(job.to, FrameKind::Repair, &body, &Bytes::new())?;
            job.lost = None;
        }
        while let Some((number, payload)) = job.copies.front() {
            let head =
                encode_repair_copy_head(self.config.id, job.incarnation, *number, &job.group);
            self.try_send_framed(job.to, FrameKind::Repair, &head, payload)?;
            bump(&self.counters.group_copies_sent);
            job.copies.pop_front();
        }
        Ok(())
    }

    /// The groups' timers, on the retry tick: tail marks of publishes gone quiet and to
    /// lagging links, asks not sent yet, repairs waiting for room, and gaps given up on (what
    /// waited behind them goes to the inbox).
    pub(crate) fn group_tick(&self, now_ms: u64) {
        for (group, number, to) in self.groups.tail_marks(now_ms) {
            let body = encode_mark(self.config.id, self.incarnation, number, &group);
            for p in to.into_iter().filter_map(|id| self.peer(id)) {
                if !push_mark(&p, &body) {
                    // Sent again, on later ticks, once it fits (the owed marks below).
                    self.groups.owe_mark(p.id, self.config.id, &group);
                }
            }
        }
        let owed = self.groups.owed_marks(self.config.id, self.incarnation);
        for (peer, publisher, incarnation, number, group) in owed {
            if self.groups.waiting.waits_for(peer) {
                // Behind the publishes that wait for that peer, on a later tick.
                continue;
            }
            let body = encode_mark(publisher, incarnation, number, &group);
            // Paid without a word where it may not go (see `send_marks`).
            if !self.may_pass_to(peer, publisher)
                || self.peer(peer).is_none_or(|p| push_mark(&p, &body))
            {
                self.groups.mark_paid(peer, publisher, &group);
            }
        }
        for (group, number, id) in self.groups.lagging() {
            let body = encode_mark(self.config.id, self.incarnation, number, &group);
            // Room again (for more than the mark): the next publish goes to it.
            if self
                .peer(id)
                .is_some_and(|p| p.has_caught_up() && push_mark(&p, &body))
            {
                self.groups.set_lagging(&group, id, false);
            }
        }
        // Forwards waiting for room, and cut-off ones past their time (a ring's reader
        // retries them itself; a socket's link waits for them).
        self.push_blocked_forwards();
        self.ask_repairs();
        self.pump_repairs();
        let mut out = self.delivered();
        for (publisher, group, skipped, why) in self.groups.overdue(now_ms, &mut out) {
            self.skipped(publisher, &group, skipped, (why, true), &mut out);
        }
        let (_, left) = out.finish();
        if left {
            self.sync_group_adverts();
        }
    }
}

/// Queues a mark (`encode_mark`'s body) for `peer`; false if its queue had no room.
fn push_mark(peer: &crate::peer::Peer, body: &[u8]) -> bool {
    peer.push_framed(FrameKind::Publish, body, &Bytes::new())
        .is_ok()
}

/// The name a REPAIR carries (a group's, or `MULTICAST_STREAM`).
fn repair_names<'a>(repair: &Repair<'a>) -> &'a str {
    match *repair {
        Repair::Ask { name, .. } | Repair::Lost { name, .. } => name,
        Repair::Copy(head) => head.name,
        Repair::Unreachable { .. } => MULTICAST_STREAM,
        Repair::Refused { name, .. } => name,
    }
}
