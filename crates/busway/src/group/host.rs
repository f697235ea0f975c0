//! The runtime as the host of the core's group and multicast machines
//! (`busway_core::group::node`, `busway_core::multicast::node`): their state under this
//! node's locks, their frames on its links, their deliveries handed over in the order
//! decided (`busway_core::turns`), and what they report turned into counters, logs and
//! events. Also the calls the rest of the runtime makes into those machines (a REPAIR read, a
//! link up, the timers).

use crate::group::permissions;
use crate::group::Delivered;
use crate::limits::{GROUP_HOP_WAIT_MS, GROUP_SLOW_MEMBER_WAIT_MS};
use crate::node::event::Event;
use crate::node::stats::bump;
use crate::peer::{Peer, PushError};
use crate::route;
use crate::route::outgoing;
use crate::route::outgoing::{Blocked, Outgoing};
use crate::route::registrations;
use crate::route::Hops;
use crate::shared::Shared;
use busway_core::body::Span;
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
    /// The node's routes as the machines see them.
    routes: NodeRoutes<'s>,
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

/// The node's routes as the core's machines see them ([`Routes`]).
pub(crate) struct NodeRoutes<'s>(pub(crate) &'s Shared);

impl Routes for NodeRoutes<'_> {
    type Hops = Hops;

    fn hops(&self) -> Hops {
        crate::route::hops(self.0)
    }

    fn hop(&self, hops: &Hops, dst: BusId, except: Option<BusId>) -> Option<BusId> {
        if let Some(p) = self.0.peer(dst) {
            if !(p.discovered && p.is_dead()) && Some(p.id) != except {
                return Some(p.id);
            }
        }
        hops.next(dst, except).map(|p| p.id)
    }
}

impl<'s> Host for GroupHost<'s, '_, '_> {
    type Routes = NodeRoutes<'s>;

    fn routes(&self) -> &NodeRoutes<'s> {
        &self.routes
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
        registrations::may_pass_to(self.shared, peer, speaker)
    }

    fn may_speak_for(&mut self, from: BusId, speaker: BusId, what: &str) -> Result<(), String> {
        route::may_speak_for(self.shared, from, speaker, what, self.link)
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
        match push_own_publish(self.shared, &p, head, payload) {
            Ok(()) => Push::Sent,
            Err(PushError::Full) => Push::Full,
            // Closed or given up: that peer will not hear it (and forgets its interest).
            Err(_) => Push::Gone,
        }
    }

    fn send_repair(&mut self, to: BusId, head: &[u8], payload: &Bytes) -> Result<(), Unsent> {
        if let Err(e) = outgoing::check_size(self.shared, head.len() + payload.len()) {
            return Err(Unsent::Failed(e.to_string()));
        }
        let repair = Outgoing::framed(FrameKind::Repair, head, payload);
        match outgoing::try_enqueue(self.shared, to, None, &repair) {
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
        self.peer(peer)
            .map_or(0, |p| group_wait_ms(self.shared, &p))
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
            .is_some_and(|p| permissions::passes_groups_on(self.shared, &p))
    }

    fn hinted(&mut self, peer: BusId) -> bool {
        if self.hinted.is_none() {
            self.hinted = Some(self.peer(peer).is_some_and(|p| p.discovered));
        }
        self.hinted == Some(true)
    }

    fn interest_quota(&self, from: BusId) -> usize {
        permissions::interest_quota(self.shared, from)
    }

    fn left_log(&mut self, from: BusId, group: &str) {
        self.shared.group.logs.forget(group, from);
    }

    fn app_behind(&self) -> (bool, Option<u64>) {
        let shared = self.shared;
        (
            shared.app.inbox().group_backlogged(),
            shared.group.table.app_behind_at(),
        )
    }

    fn deliver_span(&mut self, from: BusId, group: Option<&str>, chunk: &Bytes, span: Span) {
        self.out.decided.span(from, group, chunk, span);
    }

    fn deliver_run(&mut self, from: BusId, group: &str, chunk: &Bytes, spans: Vec<Span>) {
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
            route::refuse_link(shared, from, why);
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
            route::refuse_link(shared, from, why);
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

/// Runs `f` with the core's machines on this node for one call (a read, a timer, a call
/// of the application's; about `at_hand`, a peer the caller holds already): what it
/// delivers is handed over when it ends. Returns `f`'s answer, whether it delivered (or
/// left deliveries waiting for their turn), and whether the node left a group by it (its
/// peers are to be told: `sync_group_adverts`).
pub(crate) fn group_decide<R>(
    shared: &Shared,
    at_hand: Option<&Arc<Peer>>,
    f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R,
) -> (R, bool, bool) {
    let (mut out, mut link) = (delivered(shared), None);
    let got = f(&mut GroupHost {
        shared,
        routes: NodeRoutes(shared),
        out: &mut out,
        link: &mut link,
        hinted: None,
        at_hand,
    });
    let (handed, left) = out.finish();
    (got, handed, left)
}

/// [`group_decide`], the peers told at once if the node left a group.
pub(crate) fn group_call<R>(
    shared: &Shared,
    at_hand: Option<&Arc<Peer>>,
    f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R,
) -> (R, bool) {
    let (got, handed, left) = group_decide(shared, at_hand, f);
    if left {
        sync_group_adverts(shared);
    }
    (got, handed)
}

/// [`group_call`] about no peer in particular, for its answer alone.
pub(crate) fn with_group_host<R>(
    shared: &Shared,
    f: impl FnOnce(&mut GroupHost<'_, '_, '_>) -> R,
) -> R {
    group_call(shared, None, f).0
}

/// Queues this node's own publish (`head`, then `payload`) for `peer` (see
/// `Peer::push_publish`), and notes the peer when its ring publication waits.
pub(crate) fn push_own_publish(
    shared: &Shared,
    peer: &Arc<Peer>,
    head: &[u8],
    payload: &Bytes,
) -> Result<(), PushError> {
    let (_, note) = peer.push_publish(head, payload, shared.peers.deferred().looks())?;
    if note {
        shared.peers.deferred().note(peer);
    }
    Ok(())
}

/// A link to `peer` came up: the receivers this node multicast to behind it get a mark
/// (see `multicast::node::link_up`).
pub(crate) fn multicast_link_up(shared: &Shared, peer: BusId) {
    with_group_host(shared, |h| multicast::node::link_up(h, peer));
}

/// Tells each peer what this node now wants through it (see
/// `busway_core::group::reads::sync_adverts`); a change that does not fit a peer's queue
/// is told on a later call (the node's timer calls this).
pub(crate) fn sync_group_adverts(shared: &Shared) {
    let _turn = shared.group.table.adverts_turn();
    let upstream = shared.upstream_id();
    // A link dialed on a relay's hint carries no group traffic: the two ends reach each
    // other through the tree already, and publishes by a second path would start a
    // member's stream wherever the faster path's first publish or mark falls, skipping
    // what the tree still carries (see `group::reads::read_groups`).
    let peers: Vec<(BusId, bool)> = shared
        .peers_snapshot()
        .iter()
        .filter(|p| !p.discovered)
        .map(|p| {
            (
                p.id,
                Some(p.id) == upstream || p.neighbor().serves.is_some(),
            )
        })
        .collect();
    // Not `group_call`: a call that left a group would come back here, under the turn.
    let (_, _, left) = group_decide(shared, None, |h| group::reads::sync_adverts(h, &peers));
    debug_assert!(!left, "telling the peers leaves no group");
}

/// Deliveries to this node's application about to be decided, handed over in the order
/// decided (see `busway_core::turns`).
pub(crate) fn delivered(shared: &Shared) -> Delivered<'_> {
    Delivered::new(&shared.group.handover, shared.app.inbox())
}

/// A link stops reading because the application left `GROUP_INBOX_BYTES_MAX` of group
/// publishes unread: a member cut off then fell behind (see `busway_core::group::node::skipped`).
pub(crate) fn note_app_behind(shared: &Shared) {
    let now_ms = shared.clock.coarse_ms();
    shared.group.table.note_app_behind(now_ms);
}

/// How long a cut-off publish waits for room toward `peer`: `GROUP_HOP_WAIT_MS` if it
/// passes groups on, `GROUP_SLOW_MEMBER_WAIT_MS` otherwise.
pub(crate) fn group_wait_ms(shared: &Shared, peer: &crate::peer::Peer) -> u64 {
    if permissions::passes_groups_on(shared, peer) {
        GROUP_HOP_WAIT_MS
    } else {
        GROUP_SLOW_MEMBER_WAIT_MS
    }
}
