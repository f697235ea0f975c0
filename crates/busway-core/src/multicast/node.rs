//! What a node does with multicasts, given its links: a MULTICAST delivered here if this node
//! is named and passed on toward the others one frame per link, a REPAIR about the multicast
//! stream answered or applied, marks sent, and the timers. The numbers, order, gaps and what
//! is kept are `MulticastState`'s rules; this module decides what goes where, for a [`Host`]
//! (the runtime, or the simulation).

use super::state::Arrived;
use super::{encode_multicast_head, MulticastHead};
use super::{MULTICAST_HOPS_MAX, MULTICAST_RECEIVERS_MAX};
use crate::body::Span;
use crate::frame::FrameKind;
use crate::group::forwards::Push;
use crate::group::host::{Host, Report, Routes};
use crate::group::node::{answer_ask, copy_taken, delivers_copy};
use crate::group::stream::{Offer, Skipped};
use crate::group::{encode_repair_unreachable, Repair, MULTICAST_STREAM};
use crate::BusId;
use bytes::Bytes;
use std::collections::BTreeMap;

/// Receivers of a multicast with their numbers.
pub type Numbered = Vec<(BusId, u64)>;

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

/// A MULTICAST (or mark) from the direct peer `from`, its body `body` at `span` of `chunk`
/// and its head parsed from it: refused if `from` may not speak for its source (the link is closed), delivered
/// here if this node is named, passed on toward the others; true if this node's stream has
/// a gap to ask for.
pub fn received<H: Host>(
    host: &mut H,
    from: BusId,
    (chunk, span, body): (&Bytes, Span, &Bytes),
    head: MulticastHead<'_>,
    now_ms: u64,
) -> bool {
    let (start, len) = (span.start(), span.len());
    if let Err(why) = host.may_speak_for(from, head.source, "MULTICAST") {
        host.report(Report::MulticastLie { from, why });
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
        let got = host.multicasts(Arrived::delivers, |s| {
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
                host.deliver_span(head.source, None, chunk, Span::data(start + at, len - at));
                host.deliver(head.source, None, then);
            }
            Some(Offer::Stale) => host.report(Report::CopiesDropped(1)),
            _ => {}
        }
        gap |= got.gap;
    }
    if !onward.is_empty() {
        pass_on(host, from, &head, body, onward, now_ms);
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
        if !host.may_pass_to(peer, head.source)
            || host.push(peer, FrameKind::Multicast, &new_head, &payload) != Push::Sent
        {
            host.report(Report::MulticastForwardsDropped(list.len() as u64));
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
    host.report(Report::MulticastForwardsDropped(receivers.len() as u64));
    for &(receiver, number) in receivers {
        if !host.multicasts(
            |_| false,
            |s| s.report_unreachable(head.source, receiver, now_ms),
        ) {
            continue;
        }
        let text = format!("{why} for bus id {receiver}");
        let body = encode_repair_unreachable(head.incarnation, receiver, number, &text);
        // Best effort: a report that does not go now is made at a later multicast.
        let _ = host.send_repair(head.source, &body, &Bytes::new());
    }
}

/// A REPAIR about the multicast stream (`MULTICAST_STREAM`) from `from`, end to end, its
/// body (`repair`, decoded from `body`) at `start` of `chunk`: an ask answered from what
/// this source keeps, a copy or a loss applied to this receiver's stream, a relay's report
/// of an unreachable receiver passed to the application; true if a gap is left to ask for.
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
            answer_ask(host, from, MULTICAST_STREAM, range, now_ms, |h| {
                h.multicasts(
                    |_| false,
                    |s| s.repair(from, incarnation, my_incarnation, range),
                )
            });
            false
        }
        Repair::Copy(head) => {
            let payload = || body.slice(head.payload_at..);
            let got = (head.publisher == from).then(|| {
                host.multicasts(delivers_copy, |s| {
                    s.repaired(from, head.incarnation, head.number, now_ms, payload)
                })
            });
            let at = (chunk, start, body, head.payload_at);
            copy_taken(host, (from, None), at, got.flatten())
        }
        Repair::Lost {
            incarnation,
            from: first,
            to,
            ..
        } => {
            let got = host.multicasts(Option::is_some, |s| {
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
    // A receiver with no route now is marked again once it has one (see `link_up`).
    let (split, _) = split_by_hop(host.routes(), marks.into_iter(), None);
    let mut unsent = Vec::new();
    for (peer, list) in split {
        let head = encode_multicast_head(me, incarnation, true, MULTICAST_HOPS_MAX, &list);
        if host.push(peer, FrameKind::Multicast, &head, &Bytes::new()) != Push::Sent {
            unsent.extend(list);
        }
    }
    unsent
}

/// A link to `peer` came up: the receivers this node multicast to behind it get a mark, so
/// that one behind a relay that restarted (and lost what it held) sees its gap.
pub fn link_up<H: Host>(host: &mut H, peer: BusId) {
    let marks = host.multicasts(|_| false, |s| s.all_marks());
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
    if host.multicasts(|_| false, |s| s.is_idle()) {
        return;
    }
    let marks = host.multicasts(|_| false, |s| s.tail_marks(now_ms));
    if !marks.is_empty() {
        for (id, _) in send_marks(host, marks) {
            host.multicasts(|_| false, |s| s.unmark(id));
        }
    }
    let overdue = host.multicasts(|v: &Vec<_>| !v.is_empty(), |s| s.overdue(now_ms));
    for (source, lost, why) in overdue {
        skipped(host, source, lost, why);
    }
}

/// Multicasts of `source` that will never come were skipped: what waited behind them is
/// delivered, then the application is told how many (a receiver is never cut off).
pub fn skipped<H: Host>(host: &mut H, source: BusId, skipped: Skipped, reason: String) {
    host.deliver(source, None, skipped.deliver);
    if skipped.missed > 0 {
        host.report(Report::MulticastGap {
            source,
            missed: skipped.missed,
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::host::fake::FakeHost;
    use crate::group::{decode_repair, Repair};

    #[test]
    fn a_multicast_out_of_hops_is_dropped_and_its_source_told_once_a_second() {
        let mut host = FakeHost::new(1, &[5, 8]);
        let mut body = encode_multicast_head(BusId(5), 1, false, 1, &[(BusId(8), 1)]);
        body.extend_from_slice(b"payload");
        let chunk = Bytes::from(body);
        let span = Span::new(0, chunk.len() as u32, crate::body::BodyKind::Multicast);
        let head = crate::multicast::decode_multicast(&chunk).unwrap();
        received(&mut host, BusId(5), (&chunk, span, &chunk), head, 0);
        assert!(host.pushed.is_empty(), "not passed on without a hop left");
        assert_eq!(host.reports, [Report::MulticastForwardsDropped(1)]);
        let [(to, report)] = &host.repairs_sent[..] else {
            panic!("one report to the source: {:?}", host.repairs_sent);
        };
        assert_eq!(*to, BusId(5));
        assert!(matches!(
            decode_repair(report),
            Ok(Repair::Unreachable {
                receiver: BusId(8),
                ..
            })
        ));
        received(&mut host, BusId(5), (&chunk, span, &chunk), head, 10);
        assert_eq!(host.repairs_sent.len(), 1, "told once a second at most");
    }

    #[test]
    fn tail_marks_do_not_count_a_receiver_with_no_route_as_unsent() {
        // 9 has no route: it is marked once it has one (`link_up`), not on every tick.
        let mut host = FakeHost::new(1, &[5]);
        let marks = vec![(BusId(5), 3), (BusId(9), 4)];
        assert!(send_marks(&mut host, marks).is_empty());
        assert_eq!(host.pushed.len(), 1);
    }
}
