//! The runtime as the host of the core's group and multicast machines
//! (`busway_core::group::node`, `busway_core::multicast::node`): their state under this
//! node's locks, their frames on its links, their deliveries handed over in the order
//! decided (`busway_core::turns`), and what they report turned into counters, logs and
//! events. Also the calls the rest of the runtime makes into those machines (a REPAIR read, a
//! link up, the timers).

use crate::group::Delivered;
use crate::node::event::Event;
use crate::node::stats::bump;
use crate::peer::{Peer, PushError};
use crate::route::outgoing::{Blocked, Outgoing};
use crate::route::Hops;
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::group::forwards::{Push, WaitingForwards};
use busway_core::group::host::{Host, Report, Routes, Unsent};
use busway_core::group::permissions::GroupPermissions;
use busway_core::group::repairs::{AskRefused, Repairs};
use busway_core::group::state::GroupState;
use busway_core::multicast::state::MulticastState;
use busway_core::{group, multicast, BusId};
use bytes::Bytes;
use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// One read's or one timer's view of the node, for the core's machines; its deliveries go
/// into `out`.
pub(crate) struct GroupHost<'s, 'b, 'd> {
    shared: &'s Shared,
    out: &'b mut Delivered<'d>,
    /// Who the link being read may speak for, looked up once per read (see `may_speak_for`).
    link: &'b mut Option<busway_core::relay::Sources>,
    /// Whether this node dialed the link being read on a hint, looked up once per read.
    hinted: Option<bool>,
    /// The peer the caller holds already (a publish's, one per link): not looked up again.
    at_hand: Option<&'b Arc<Peer>>,
}

impl GroupHost<'_, '_, '_> {
    /// The peer `id`: the one at hand, or looked up.
    fn peer(&self, id: BusId) -> Option<Cow<'_, Arc<Peer>>> {
        match self.at_hand {
            Some(p) if p.id == id => Some(Cow::Borrowed(p)),
            _ => self.shared.peer(id).map(Cow::Owned),
        }
    }
}

impl Routes for Shared {
    type Hops = Hops;

    fn hops(&self) -> Hops {
        Shared::hops(self)
    }

    fn hop(&self, hops: &Hops, dst: BusId, except: Option<BusId>) -> Option<BusId> {
        if let Some(p) = self.peer(dst) {
            if !(p.discovered && p.is_dead()) && Some(p.id) != except {
                return Some(p.id);
            }
        }
        hops.next(dst, except).map(|p| p.id)
    }
}

impl Host for GroupHost<'_, '_, '_> {
    type Routes = Shared;

    fn routes(&self) -> &Shared {
        self.shared
    }

    fn me(&self) -> (BusId, u64) {
        (self.shared.config().id, self.shared.incarnation())
    }

    fn groups<R>(&mut self, delivers: fn(&R) -> bool, f: impl FnOnce(&mut GroupState) -> R) -> R {
        self.shared.group.table.with(delivers, f, self.out)
    }

    fn multicasts<R>(
        &mut self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut MulticastState) -> R,
    ) -> R {
        self.shared
            .group
            .multicasts
            .with(delivers, f, self.out, |_| {})
    }

    fn repairs<R>(&mut self, f: impl FnOnce(&mut Repairs) -> R) -> R {
        self.shared.group.table.repairs_with(f)
    }

    fn may_pass_to(&self, peer: BusId, speaker: BusId) -> bool {
        self.shared.may_pass_to(peer, speaker)
    }

    fn may_speak_for(&mut self, from: BusId, speaker: BusId, what: &str) -> Result<(), String> {
        self.shared.may_speak_for(from, speaker, what, self.link)
    }

    fn push(&mut self, peer: BusId, kind: FrameKind, head: &[u8], payload: &Bytes) -> Push {
        let Some(p) = self.peer(peer) else {
            return Push::Gone;
        };
        // The peer closes a link over a frame past its stated limit.
        if p.frame_body_max()
            .is_some_and(|m| head.len() + payload.len() > m)
        {
            return Push::Gone;
        }
        match p.push_framed(kind, head, payload) {
            Ok(_) => Push::Sent,
            Err(PushError::Full) => Push::Full,
            Err(_) => Push::Gone,
        }
    }

    fn push_own_publish(&mut self, peer: BusId, head: &[u8], payload: &Bytes) -> Push {
        let Some(p) = self.peer(peer) else {
            return Push::Gone;
        };
        match self.shared.push_own_publish(&p, head, payload) {
            Ok(()) => Push::Sent,
            Err(PushError::Full) => Push::Full,
            // Closed or given up: that peer will not hear it (and forgets its interest).
            Err(_) => Push::Gone,
        }
    }

    fn send_repair(&mut self, to: BusId, head: &[u8], payload: &Bytes) -> Result<(), Unsent> {
        if let Err(e) = self.shared.check_size(head.len() + payload.len()) {
            return Err(Unsent::Failed(e.to_string()));
        }
        let repair = Outgoing::framed(FrameKind::Repair, head, payload);
        match self.shared.try_enqueue(to, None, &repair) {
            Ok(_) => Ok(()),
            Err(Blocked::Full(_)) => Err(Unsent::Full),
            Err(Blocked::Failed(e)) => Err(Unsent::Failed(e.to_string())),
        }
    }

    fn has_caught_up(&self, peer: BusId) -> bool {
        self.peer(peer).is_some_and(|p| p.has_caught_up())
    }

    fn forwards_wait_for(&self, peer: BusId) -> bool {
        self.shared.group.table.waiting.waits_for(peer)
    }

    fn forwards_lagging(&self, peer: BusId) -> bool {
        self.shared.group.table.waiting.is_lagging(peer)
    }

    fn forwards<R>(&mut self, f: impl FnOnce(&mut WaitingForwards) -> R) -> R {
        self.shared.group.table.waiting.with(f)
    }

    fn wait_ms(&self, peer: BusId) -> u64 {
        self.peer(peer).map_or(0, |p| self.shared.group_wait_ms(&p))
    }

    fn fits(&self, peer: BusId, len: usize) -> bool {
        self.peer(peer)
            .is_some_and(|p| p.frame_body_max().is_none_or(|m| len <= m))
    }

    fn takes_batches(&self, peer: BusId) -> bool {
        let cap = busway_core::handshake::caps::PUBLISH_BATCH;
        self.peer(peer).is_some_and(|p| p.has_cap(cap))
    }

    fn takes_gap_marks(&self, peer: BusId) -> bool {
        let cap = busway_core::handshake::caps::GAP_MARKS;
        self.peer(peer).is_some_and(|p| p.has_cap(cap))
    }

    fn owes_marks(&self) -> bool {
        self.shared.group.table.owes_marks()
    }

    fn permissions(&self) -> Option<&GroupPermissions> {
        self.shared.config().group_permissions.as_ref()
    }

    fn passes_on(&self, peer: BusId) -> bool {
        self.peer(peer)
            .is_some_and(|p| self.shared.passes_groups_on(&p))
    }

    fn hinted(&mut self, peer: BusId) -> bool {
        if self.hinted.is_none() {
            self.hinted = Some(self.peer(peer).is_some_and(|p| p.discovered));
        }
        self.hinted == Some(true)
    }

    fn interest_quota(&self, from: BusId) -> usize {
        self.shared.interest_quota(from)
    }

    fn left_log(&mut self, from: BusId, group: &str) {
        self.shared.group.logs.forget(group, from);
    }

    fn app_behind(&self) -> (bool, Option<u64>) {
        let shared = self.shared;
        (
            shared.app.inbox.group_backlogged(),
            shared.group.table.app_behind_at(),
        )
    }

    fn deliver_span(&mut self, from: BusId, group: Option<&str>, chunk: &Bytes, span: (u32, u32)) {
        self.out.decided.span(from, group, chunk, span);
    }

    fn deliver_run(&mut self, from: BusId, group: &str, chunk: &Bytes, spans: Vec<(u32, u32)>) {
        self.out.decided.run(from, group, chunk, spans);
    }

    fn deliver(&mut self, from: BusId, group: Option<&str>, payloads: Vec<Bytes>) {
        self.out.decided.payloads(from, group, payloads);
    }

    fn report(&mut self, report: Report) {
        match report {
            Report::GroupRefused { .. }
            | Report::GroupGap { .. }
            | Report::MulticastGap { .. }
            | Report::Unreachable { .. } => self.report_to_application(report),
            counted => count_report(self.shared, counted),
        }
    }
}

impl GroupHost<'_, '_, '_> {
    /// A report the application hears of: logged, and an event.
    fn report_to_application(&mut self, report: Report) {
        let shared = self.shared;
        match report {
            Report::GroupRefused {
                group,
                by,
                publish,
                reason,
            } => {
                tracing::warn!(%by, group, publish, reason, "group refused");
                shared.emit(Event::GroupRefused {
                    group,
                    by,
                    publish,
                    reason,
                });
            }
            Report::GroupGap {
                group,
                publisher,
                missed,
                reason,
                cut_off,
                left,
            } => {
                self.out.left |= left;
                shared.emit(if cut_off {
                    tracing::warn!(%publisher, group, missed, %reason, "cut off from the group: its application fell behind");
                    Event::GroupCutOff {
                        group,
                        publisher,
                        missed,
                        reason,
                    }
                } else {
                    tracing::warn!(%publisher, group, missed, %reason, "publishes lost");
                    Event::GroupGap {
                        group,
                        publisher,
                        missed,
                        reason,
                    }
                });
            }
            Report::MulticastGap {
                source,
                missed,
                reason,
            } => {
                tracing::warn!(%source, missed, %reason, "multicasts lost");
                shared.emit(Event::MulticastGap {
                    source,
                    missed,
                    reason,
                });
            }
            Report::Unreachable {
                receiver,
                number,
                relay,
                reason,
            } => {
                tracing::warn!(%relay, %receiver, number, reason, "multicast receiver unreachable");
                shared.emit(Event::MulticastUnreachable {
                    receiver,
                    number,
                    relay,
                    reason,
                });
            }
            // Counted by `count_report`.
            _ => {}
        }
    }
}

/// A report that is counted (and perhaps logged, or the link refused), not told to the
/// application.
fn count_report(shared: &Shared, report: Report) {
    let counters = &shared.counters;
    match report {
        Report::MulticastForwardsDropped(n) => {
            counters.multicast_forwards_dropped.fetch_add(n, Relaxed);
        }
        Report::InterestRefused => bump(&counters.group_interest_refused),
        Report::CopiesDropped(n) => {
            counters.group_copies_dropped.fetch_add(n, Relaxed);
        }
        Report::PublishLie { from, why } => {
            bump(&counters.publishes_refused);
            shared.refuse_link(from, why);
        }
        Report::Unwanted {
            publisher,
            group,
            n,
        } => {
            tracing::debug!(%publisher, group, "publishes for a group nobody here wants");
            counters.publishes_unwanted.fetch_add(n, Relaxed);
        }
        Report::ForwardsDropped(n) => {
            counters.group_forwards_dropped.fetch_add(n, Relaxed);
        }
        Report::LinkSkipped => bump(&counters.group_links_skipped),
        Report::MulticastLie { from, why } => {
            bump(&counters.multicasts_refused);
            shared.refuse_link(from, why);
        }
        Report::JoinRefused { member, group, why } => {
            bump(&counters.group_joins_refused);
            tracing::debug!(%member, group, %why, "join refused");
        }
        Report::PublishesDenied {
            publisher,
            group,
            n,
            why,
        } => {
            counters.publishes_denied.fetch_add(n, Relaxed);
            tracing::debug!(%publisher, group, %why, "publishes refused");
        }
        Report::RepairRefused => bump(&counters.group_repairs_refused),
        Report::AskRefused { from, stream, why } => {
            match why {
                AskRefused::TooMany => {
                    tracing::warn!(member = %from, stream, "repair refused: too many under way");
                }
                AskRefused::TooSoon => {
                    tracing::debug!(member = %from, stream, "repair refused: asked again too soon");
                }
            }
            bump(&counters.group_repairs_refused);
        }
        Report::RepairAsked => bump(&counters.group_repairs_asked),
        Report::CopySent { .. } => bump(&counters.group_copies_sent),
        Report::RepairDropped {
            member,
            stream,
            why,
        } => tracing::debug!(%member, stream, error = %why, "repair dropped"),
        // Told by `report_to_application`; listed, so that a new report is placed.
        Report::GroupRefused { .. }
        | Report::GroupGap { .. }
        | Report::MulticastGap { .. }
        | Report::Unreachable { .. } => {}
    }
}

impl Shared {
    /// Runs `f` with the core's machines on this node for one call (a read, a timer, a call
    /// of the application's; about `at_hand`, a peer the caller holds already): what it
    /// delivers is handed over when it ends. Returns `f`'s answer, whether it delivered (or
    /// left deliveries waiting for their turn), and whether the node left a group by it (its
    /// peers are to be told: `sync_group_adverts`).
    pub(crate) fn group_decide<R>(
        &self,
        at_hand: Option<&Arc<Peer>>,
        f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R,
    ) -> (R, bool, bool) {
        let (mut out, mut link) = (self.delivered(), None);
        let got = f(&mut GroupHost {
            shared: self,
            out: &mut out,
            link: &mut link,
            hinted: None,
            at_hand,
        });
        let (handed, left) = out.finish();
        (got, handed, left)
    }

    /// [`Shared::group_decide`], the peers told at once if the node left a group.
    pub(crate) fn group_call<R>(
        &self,
        at_hand: Option<&Arc<Peer>>,
        f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R,
    ) -> (R, bool) {
        let (got, handed, left) = self.group_decide(at_hand, f);
        if left {
            self.sync_group_adverts();
        }
        (got, handed)
    }

    /// [`Shared::group_call`] about no peer in particular, for its answer alone.
    pub(crate) fn with_group_host<R>(&self, f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R) -> R {
        self.group_call(None, f).0
    }

    /// Queues this node's own publish (`head`, then `payload`) for `peer` (see
    /// `Peer::push_publish`), and notes the peer when its ring publication waits.
    pub(crate) fn push_own_publish(
        &self,
        peer: &Arc<Peer>,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(), PushError> {
        let (_, note) = peer.push_publish(head, payload, self.peers.deferred.looks())?;
        if note {
            self.peers.deferred.note(peer);
        }
        Ok(())
    }

    /// The groups' and multicasts' timers, on the retry tick: first the publishes that wait
    /// for room (a ring's reader retries them itself; a socket's link waits for them), then
    /// the machines' own (see `group::node::tick` and `multicast::node::tick`).
    pub(crate) fn group_tick(&self, now_ms: u64) {
        self.push_blocked_forwards();
        self.with_group_host(|h| group::node::tick(h, now_ms));
    }

    /// The multicasts' timers, on the retry tick (see `multicast::node::tick`).
    pub(crate) fn multicast_tick(&self, now_ms: u64) {
        self.with_group_host(|h| multicast::node::tick(h, now_ms));
    }

    /// A link to `peer` came up: the receivers this node multicast to behind it get a mark
    /// (see `multicast::node::link_up`).
    pub(crate) fn multicast_link_up(&self, peer: BusId) {
        self.with_group_host(|h| multicast::node::link_up(h, peer));
    }
}
