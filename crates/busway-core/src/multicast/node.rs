//! What a node does with multicasts, given its links: a MULTICAST delivered here if this node
//! is named and passed on toward the others one frame per link, a REPAIR about the multicast
//! stream answered or applied, marks sent, and the timers. The numbers, order, gaps and what
//! is kept are [`MulticastState`]'s rules; this module decides what goes where. The [`Host`]
//! (the runtime, or the simulation) keeps the state under whatever lock it needs, owns the
//! links and the application's inbox, and is told what happened ([`Report`]).

use super::state::{Arrived, MulticastState};
use super::{decode_multicast, encode_multicast_head, MulticastHead};
use super::{MULTICAST_HOPS_MAX, MULTICAST_RECEIVERS_MAX};
use crate::group::repairs::AskRefused;
use crate::group::state::RepairPlan;
use crate::group::stream::{Offer, Skipped};
use crate::group::{encode_repair_unreachable, Repair, MULTICAST_STREAM};
use crate::BusId;
use bytes::Bytes;
use std::collections::BTreeMap;

/// Receivers of a multicast with their numbers.
pub type Numbered = Vec<(BusId, u64)>;

/// What happened, for the host's counters, logs and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// `n` receivers' copies could not be passed on (no hop left, no route, a full link, a
    /// frame past the link's limit, a name the upstream does not hold for this node): those
    /// receivers see a gap and ask the source.
    ForwardsDropped(u64),
    /// A second copy of a multicast was dropped.
    CopyDropped,
    /// A frame from `from` that only a liar sends (`why`): the host closes that link.
    Lie { from: BusId, why: String },
    /// A REPAIR taken for nothing (a copy in another's name, a loss or a report of another
    /// incarnation).
    RepairRefused,
    /// An ask for copies refused (counted; the receiver asks again or gives up).
    AskRefused { from: BusId, why: AskRefused },
    /// `missed` multicasts of `source` never come (`reason`): the application is told.
    Gap {
        source: BusId,
        missed: u64,
        reason: String,
    },
    /// `relay` could not pass a multicast on to `receiver`: the application is told.
    Unreachable {
        receiver: BusId,
        number: u64,
        relay: BusId,
        reason: String,
    },
}

/// Where a node's links lead.
pub trait Routes {
    /// A look at the routes, taken once for many receivers (see [`Routes::hop`]).
    type Hops;

    /// A look at the routes now.
    fn hops(&self) -> Self::Hops;
    /// The link a frame to `dst` takes: a direct link to it (even while it is down: its
    /// queue is resent when it is back), else the unicast next hop; never `except`.
    fn hop(&self, hops: &Self::Hops, dst: BusId, except: Option<BusId>) -> Option<BusId>;
}

/// The node the multicast rules run in.
pub trait Host {
    /// Where its links lead.
    type Routes: Routes;

    /// This node's routes.
    fn routes(&self) -> &Self::Routes;
    /// This node's id and incarnation.
    fn me(&self) -> (BusId, u64);
    /// Runs `f` on this node's multicast state, under the host's lock; if `delivers` holds
    /// for its answer, the host takes its turn to hand deliveries over before the lock goes,
    /// so that they reach the application in the order decided.
    fn state<R>(&mut self, delivers: fn(&R) -> bool, f: impl FnOnce(&mut MulticastState) -> R)
        -> R;
    /// Takes `from`'s ask for `range` of `stream` (the repairs are shared with the groups);
    /// `plan` reads what this node keeps, only if the ask is not refused at once.
    fn answer_ask(
        &mut self,
        from: BusId,
        stream: &str,
        range: (u64, u64),
        now_ms: u64,
        plan: impl FnOnce(&mut Self) -> RepairPlan,
    ) -> Result<(), AskRefused>;
    /// Whether a frame in `source`'s name may cross the link to `peer` (the upstream closes
    /// a link that speaks for a node it does not hold registered there).
    fn may_pass_to(&self, peer: BusId, source: BusId) -> bool;
    /// Whether the link `from` may speak for `source` (its own peer, or an id it registered,
    /// or the relay on the route toward it); the error says why not.
    fn may_speak_for(&mut self, from: BusId, source: BusId) -> Result<(), String>;
    /// Queues a MULTICAST (`head`, then `payload`) on the link to `peer`, never waiting;
    /// false if it did not go (no room, past the peer's frame limit, the peer gone).
    fn push(&mut self, peer: BusId, head: &[u8], payload: &Bytes) -> bool;
    /// Sends a REPAIR `body` to `to` end to end, never waiting; false if it did not go.
    fn send_repair(&mut self, to: BusId, body: &[u8]) -> bool;
    /// Hands `source`'s multicast at `span` (start, length) of `chunk` to the application.
    fn deliver_span(&mut self, source: BusId, chunk: &Bytes, span: (u32, u32));
    /// Hands `source`'s multicasts `payloads` (that waited for a gap) to the application.
    fn deliver(&mut self, source: BusId, payloads: Vec<Bytes>);
    /// Tells the host what happened.
    fn report(&mut self, report: Report);
}

/// Receivers split by the link that leads to each (`except` never), in chunks of at most
/// `MULTICAST_RECEIVERS_MAX`, and the receivers without a link now.
pub fn split_by_hop(
    routes: &impl Routes,
    receivers: impl Iterator<Item = (BusId, u64)>,
    except: Option<BusId>,
) -> (Vec<(BusId, Numbered)>, Numbered) {
    let hops = routes.hops();
    let mut by_hop: BTreeMap<BusId, Numbered> = BTreeMap::new();
    let mut unrouted = Vec::new();
    for (id, number) in receivers {
        match routes.hop(&hops, id, except) {
            Some(peer) => by_hop.entry(peer).or_default().push((id, number)),
            None => unrouted.push((id, number)),
        }
    }
    let mut split = Vec::with_capacity(by_hop.len());
    for (peer, list) in by_hop {
        split.extend(
            list.chunks(MULTICAST_RECEIVERS_MAX)
                .map(|c| (peer, c.to_vec())),
        );
    }
    (split, unrouted)
}

/// A MULTICAST (or mark) from the direct peer `from`, its body at `start..start + len` of
/// `chunk`: refused if `from` may not speak for its source (the link is closed), delivered
/// here if this node is named, passed on toward the others; true if this node's stream has
/// a gap to ask for.
pub fn received<H: Host>(
    host: &mut H,
    from: BusId,
    chunk: &Bytes,
    (start, len): (u32, u32),
    now_ms: u64,
) -> bool {
    let body = chunk.slice(start as usize..(start + len) as usize);
    let head = match decode_multicast(&body) {
        Ok(head) => head,
        Err(why) => {
            host.report(Report::Lie { from, why });
            return false;
        }
    };
    if let Err(why) = host.may_speak_for(from, head.source) {
        host.report(Report::Lie { from, why });
        return false;
    }
    let (me, _) = host.me();
    let mut gap = false;
    let mut onward = Vec::new();
    for (id, number) in head.receivers() {
        if id != me {
            onward.push((id, number));
            continue;
        }
        let payload = || body.slice(head.payload_at..);
        let got = host.state(Arrived::delivers, |s| {
            s.received(
                head.source,
                head.incarnation,
                number,
                head.mark,
                now_ms,
                payload,
            )
        });
        if let Some(ended) = got.ended {
            let why = format!("source {} restarted before they came", head.source);
            skipped(host, head.source, ended, why);
        }
        match got.offer {
            Some(Offer::Deliver { then }) => {
                let at = head.payload_at as u32;
                host.deliver_span(head.source, chunk, (start + at, len - at));
                host.deliver(head.source, then);
            }
            Some(Offer::Stale) => host.report(Report::CopyDropped),
            _ => {}
        }
        gap |= got.gap;
    }
    if !onward.is_empty() {
        pass_on(host, from, &head, &body, onward, now_ms);
    }
    gap
}

/// Passes a multicast on toward `onward` (receivers other than this node), one frame per
/// link, with one hop less; what cannot go is dropped and reported, and those receivers ask
/// the source for copies. A relay never waits for one receiver's link.
fn pass_on<H: Host>(
    host: &mut H,
    from: BusId,
    head: &MulticastHead<'_>,
    body: &Bytes,
    onward: Numbered,
    now_ms: u64,
) {
    let (me, _) = host.me();
    if head.hops_left <= 1 {
        let why = format!("out of hops (MULTICAST_HOPS_MAX) at relay {me}");
        return unreachable(host, head, &onward, &why, now_ms);
    }
    let payload = body.slice(head.payload_at..);
    let (split, unrouted) = split_by_hop(host.routes(), onward.into_iter(), Some(from));
    if !unrouted.is_empty() {
        unreachable(
            host,
            head,
            &unrouted,
            &format!("no route at relay {me}"),
            now_ms,
        );
    }
    for (peer, list) in split {
        let new_head = encode_multicast_head(
            head.source,
            head.incarnation,
            head.mark,
            head.hops_left - 1,
            &list,
        );
        if !host.may_pass_to(peer, head.source) || !host.push(peer, &new_head, &payload) {
            host.report(Report::ForwardsDropped(list.len() as u64));
        }
    }
}

/// Receivers of a multicast this relay cannot pass it on to: dropped and reported, and the
/// source is told (REPAIR unreachable, at most once a second per receiver); the receivers'
/// own gap, if they exist, is theirs to repair once a way is back.
fn unreachable<H: Host>(
    host: &mut H,
    head: &MulticastHead<'_>,
    receivers: &Numbered,
    why: &str,
    now_ms: u64,
) {
    host.report(Report::ForwardsDropped(receivers.len() as u64));
    for &(receiver, number) in receivers {
        if !host.state(
            |_| false,
            |s| s.report_unreachable(head.source, receiver, now_ms),
        ) {
            continue;
        }
        let text = format!("{why} for bus id {receiver}");
        let body = encode_repair_unreachable(head.incarnation, receiver, number, &text);
        // Best effort: a report that does not go now is made at a later multicast.
        host.send_repair(head.source, &body);
    }
}

/// A REPAIR about the multicast stream (`MULTICAST_STREAM`) from `from`, end to end, its
/// body (`repair`, decoded from `body`) at `start` of `chunk`: an ask answered from what this source keeps, a copy or a
/// loss applied to this receiver's stream, a relay's report of an unreachable receiver
/// passed to the application; true if a gap is left to ask for.
pub fn repair_received<H: Host>(
    host: &mut H,
    from: BusId,
    (chunk, start, body): (&Bytes, u32, &Bytes),
    repair: Repair<'_>,
    now_ms: u64,
) -> bool {
    let (_, my_incarnation) = host.me();
    match repair {
        Repair::Ask {
            incarnation,
            from: first,
            to,
            ..
        } => {
            let range = (first, to);
            let asked = host.answer_ask(from, MULTICAST_STREAM, range, now_ms, |h| {
                h.state(
                    |_| false,
                    |s| s.repair(from, incarnation, my_incarnation, range),
                )
            });
            if let Err(why) = asked {
                host.report(Report::AskRefused { from, why });
            }
            false
        }
        Repair::Copy(head) => {
            // A copy in another's name is not taken (`from` may be nodes away: no link to
            // close for it).
            if head.publisher != from {
                host.report(Report::RepairRefused);
                return false;
            }
            let payload = || body.slice(head.payload_at..);
            let got = host.state(
                |got: &Option<(Offer, bool)>| matches!(got, Some((Offer::Deliver { .. }, _))),
                |s| s.repaired(from, head.incarnation, head.number, now_ms, payload),
            );
            let Some((offer, gap)) = got else {
                host.report(Report::RepairRefused);
                return false;
            };
            if let Offer::Deliver { then } = offer {
                let at = head.payload_at as u32;
                host.deliver_span(from, chunk, (start + at, body.len() as u32 - at));
                host.deliver(from, then);
            }
            gap
        }
        Repair::Lost {
            incarnation,
            from: first,
            to,
            ..
        } => {
            let got = host.state(Option::is_some, |s| {
                s.lost(from, incarnation, (first, to), now_ms)
            });
            match got {
                Some(lost) => {
                    let why = format!(
                        "source {from} no longer holds multicasts {first}.. (its group_retain_bytes)"
                    );
                    skipped(host, from, lost, why);
                }
                None => host.report(Report::RepairRefused),
            }
            false
        }
        // About a group, never the multicast stream (a refusal names its group).
        Repair::Refused { .. } => false,
        Repair::Unreachable {
            incarnation,
            receiver,
            number,
            reason,
        } => {
            if incarnation == my_incarnation {
                host.report(Report::Unreachable {
                    receiver,
                    number,
                    relay: from,
                    reason: reason.to_owned(),
                });
            } else {
                host.report(Report::RepairRefused);
            }
            false
        }
    }
}

/// Sends marks (this source's last number) to `marks` (receiver, number), one frame per
/// link; returns those that did not go.
pub fn send_marks<H: Host>(host: &mut H, marks: Numbered) -> Numbered {
    let (me, incarnation) = host.me();
    let (split, mut unsent) = split_by_hop(host.routes(), marks.into_iter(), None);
    for (peer, list) in split {
        let head = encode_multicast_head(me, incarnation, true, MULTICAST_HOPS_MAX, &list);
        if !host.push(peer, &head, &Bytes::new()) {
            unsent.extend(list);
        }
    }
    unsent
}

/// A link to `peer` came up: the receivers this node multicast to behind it get a mark, so
/// that one behind a relay that restarted (and lost what it held) sees its gap.
pub fn link_up<H: Host>(host: &mut H, peer: BusId) {
    let marks = host.state(|_| false, |s| s.all_marks());
    if marks.is_empty() {
        // Every link that comes up passes here: a node that never multicast is done.
        return;
    }
    let routes = host.routes();
    let hops = routes.hops();
    let behind: Numbered = marks
        .into_iter()
        .filter(|&(id, _)| routes.hop(&hops, id, None) == Some(peer))
        .collect();
    if !behind.is_empty() {
        send_marks(host, behind);
    }
}

/// The timers, at `now_ms`: tail marks to receivers gone quiet (one whose link was full is
/// marked again later), and gaps given up on (what waited behind them is delivered).
pub fn tick<H: Host>(host: &mut H, now_ms: u64) {
    if host.state(|_| false, |s| s.is_idle()) {
        return;
    }
    let marks = host.state(|_| false, |s| s.tail_marks(now_ms));
    if !marks.is_empty() {
        for (id, _) in send_marks(host, marks) {
            host.state(|_| false, |s| s.unmark(id));
        }
    }
    let overdue = host.state(|v: &Vec<_>| !v.is_empty(), |s| s.overdue(now_ms));
    for (source, lost, why) in overdue {
        skipped(host, source, lost, why);
    }
}

/// Multicasts of `source` that will never come were skipped: what waited behind them is
/// delivered, then the application is told how many (a receiver is never cut off).
pub fn skipped<H: Host>(host: &mut H, source: BusId, skipped: Skipped, reason: String) {
    host.deliver(source, skipped.deliver);
    if skipped.missed > 0 {
        host.report(Report::Gap {
            source,
            missed: skipped.missed,
            reason,
        });
    }
}
