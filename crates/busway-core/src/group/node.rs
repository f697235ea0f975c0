//! What a node does about its group streams' repairs and marks, given its links: a REPAIR
//! answered (an ask queued as a repair job) or applied (a copy, a loss, a refusal), gaps
//! skipped (told as a gap, or a cut-off if the application fell behind), asks made, repair
//! jobs sent as far as the members' ways allow, marks sent, and the timers. The rules are
//! `state`'s, `stream`'s and `repairs`'s; this module decides what goes where, for a
//! [`Host`] (the runtime, or the simulation). The multicast stream's share of REPAIR is
//! `multicast::node`'s.

use super::forwards::Push;
use super::host::{Host, Report, Unsent};
use super::repairs::{AskRefused, RepairJob};
use super::state::{Mark, RepairPlan};
use super::stream::{cuts_off, Offer, Skipped};
use super::MULTICAST_STREAM;
use super::{encode_gap_mark, encode_mark, encode_repair_ask, Repair};
use super::{encode_repair_copy_head, encode_repair_lost};
use crate::body::Span;
use crate::frame::FrameKind;
use crate::multicast;
use crate::BusId;
use bytes::Bytes;
use std::collections::HashSet;

/// `from`'s ask for `range` of `stream` (a group, or `MULTICAST_STREAM`): queued as a repair
/// job, or refused (reported) as `Repairs` says. `plan` reads what this node keeps, only if
/// the ask is not refused at once, and outside the repairs' lock. The one way a publisher or
/// source takes an ask.
pub fn answer_ask<H: Host>(
    host: &mut H,
    from: BusId,
    stream: &str,
    range: (u64, u64),
    now_ms: u64,
    plan: impl FnOnce(&mut H) -> RepairPlan,
) {
    let (_, incarnation) = host.me();
    let answered = if host.repairs(|r| r.asks_too_soon(from, stream, range, now_ms)) {
        Err(AskRefused::TooSoon)
    } else {
        let plan = plan(host);
        host.repairs(|r| r.take_planned(from, stream, range, (incarnation, now_ms), plan))
    };
    if let Err(why) = answered {
        let stream = stream.to_owned();
        host.report(Report::AskRefused { from, stream, why });
    }
}

/// A REPAIR from `from` (end to end), its body `body` at `start` of `chunk`, parsed into
/// `repair`: an ask
/// answered, a copy or a loss applied to this member's stream, a refusal told to the
/// application; the multicast stream's go to `multicast::node`. True if a gap is left to ask
/// for.
pub fn repair_received<H: Host>(
    host: &mut H,
    from: BusId,
    (chunk, start, body): (&Bytes, u32, &Bytes),
    repair: Repair<'_>,
    now_ms: u64,
) -> bool {
    if stream_of(&repair) == MULTICAST_STREAM {
        let at = (chunk, start, body);
        return multicast::node::repair_received(host, from, at, repair, now_ms);
    }
    let (_, my_incarnation) = host.me();
    match repair {
        Repair::Ask {
            incarnation,
            from: first,
            to,
            name,
        } => {
            let range = (first, to);
            answer_ask(host, from, name, range, now_ms, |h| {
                h.groups(
                    |_| false,
                    |s| s.repair(name, incarnation, my_incarnation, range),
                )
            });
            false
        }
        Repair::Copy(head) => {
            let payload = || body.slice(head.payload_at..);
            let got = (head.publisher == from)
                .then(|| host.groups(delivers_copy, |s| s.repaired(&head, now_ms, payload)));
            let at = (chunk, start, body, head.payload_at);
            copy_taken(host, (from, Some(head.name)), at, got.flatten())
        }
        Repair::Lost {
            incarnation,
            from: first,
            to,
            name,
        } => {
            let got = host.groups(Option::is_some, |s| {
                s.lost(from, incarnation, name, (first, to), now_ms)
            });
            match got {
                Some(lost) => {
                    let why = format!(
                        "publisher {from} no longer holds publishes {first}.. (its group_retain_bytes)"
                    );
                    skipped(host, (from, name), lost, (why, true), now_ms);
                }
                None => host.report(Report::RepairRefused),
            }
            false
        }
        // The multicast stream's: sorted out above.
        Repair::Unreachable { .. } => false,
        Repair::Refused {
            publish,
            name,
            reason,
        } => {
            host.report(Report::GroupRefused {
                group: name.to_owned(),
                by: from,
                publish,
                reason: reason.to_owned(),
            });
            false
        }
    }
}

/// Whether a copy was taken to be delivered (it takes its turn to hand over).
pub(crate) fn delivers_copy(got: &Option<(Offer, bool)>) -> bool {
    matches!(got, Some((Offer::Deliver { .. }, _)))
}

/// What became of a copy `from` sent of its publish to `group` (`None`: a multicast), its
/// REPAIR `body` at `start` of `chunk` and its payload from `payload_at` of the body: handed
/// over with what waited behind it, or refused (`None`: no such stream here, or a copy in
/// another's name, which is not taken: `from` may be nodes away, no link to close for it).
/// True if a gap is left.
pub(crate) fn copy_taken<H: Host>(
    host: &mut H,
    (from, group): (BusId, Option<&str>),
    (chunk, start, body, payload_at): (&Bytes, u32, &Bytes, usize),
    got: Option<(Offer, bool)>,
) -> bool {
    let Some((offer, gap)) = got else {
        host.report(Report::RepairRefused);
        return false;
    };
    if let Offer::Deliver { then } = offer {
        let at = payload_at as u32;
        host.deliver_span(
            from,
            group,
            chunk,
            Span::data(start + at, body.len() as u32 - at),
        );
        host.deliver(from, group, then);
    }
    gap
}

/// The name a REPAIR carries (a group's, or `MULTICAST_STREAM`).
fn stream_of<'a>(repair: &Repair<'a>) -> &'a str {
    match *repair {
        Repair::Ask { name, .. } | Repair::Lost { name, .. } => name,
        Repair::Copy(head) => head.name,
        Repair::Unreachable { .. } => MULTICAST_STREAM,
        Repair::Refused { name, .. } => name,
    }
}

/// Publishes of `publisher` to `group` that will never come were skipped: the member gets
/// what waited behind them, then is told how many and `why`. A gap given up on (`given_up`:
/// no repair came, the publisher no longer holds them, too much waited) cuts the member off
/// only if its own application fell behind (`stream::cuts_off`): it leaves the group. Else
/// (they were lost on the way, or the publisher restarted) it stays, told of the gap:
/// nothing a publisher or a hop does can make a member that keeps up leave its group.
pub fn skipped<H: Host>(
    host: &mut H,
    (publisher, group): (BusId, &str),
    mut skipped: Skipped,
    (reason, given_up): (String, bool),
    now_ms: u64,
) {
    host.deliver(publisher, Some(group), std::mem::take(&mut skipped.deliver));
    if skipped.missed == 0 {
        return;
    }
    let (behind_now, behind_at) = host.app_behind();
    let cut_off = cuts_off(given_up, behind_now, behind_at, &skipped, now_ms);
    let left = cut_off && host.groups(|_| false, |s| s.leave(group));
    host.report(Report::GroupGap {
        group: group.to_owned(),
        publisher,
        missed: skipped.missed,
        reason,
        cut_off,
        left,
    });
}

/// Sends `peer`, which newly asked for `group`, a mark per publisher this node knows: a
/// member behind it that lost the end of a stream (its relay died) sees the gap. A mark that
/// does not fit is owed, and sent on a later tick. `marks` are
/// `GroupState::marks_for`'s, read when the peer's interest was taken.
pub fn send_marks<H: Host>(host: &mut H, peer: BusId, group: &str, marks: Vec<Mark>) {
    for (publisher, incarnation, number) in marks {
        // Never a mark up in a name the upstream does not hold for us (a publisher above
        // is the upstream's own business), nor to the publisher itself (one that joins its
        // own group): either would close the link.
        if publisher == peer || !host.may_pass_to(peer, publisher) {
            continue;
        }
        // One owed a gap mark of that stream has it first (on a tick).
        if host.groups(|_| false, |s| s.owes(peer, publisher, group)) {
            continue;
        }
        let body = encode_mark(publisher, incarnation, number, group);
        if push_mark(host, peer, &body) == Push::Full {
            host.groups(|_| false, |s| s.owe_mark(peer, publisher, group, None));
        }
    }
}

/// Asks the publishers and sources of streams with a gap for copies; an ask that cannot be
/// sent now is made again later.
pub fn ask_repairs<H: Host>(host: &mut H, now_ms: u64) {
    let asks = host.groups(|_| false, |s| s.asks(now_ms));
    let multicast_asks = host.multicasts(|_| false, |s| s.asks(now_ms));
    for ask in asks.into_iter().chain(multicast_asks) {
        let body = encode_repair_ask(ask.incarnation, ask.from, ask.to, &ask.group);
        if host
            .send_repair(ask.publisher, &body, &Bytes::new())
            .is_ok()
        {
            host.report(Report::RepairAsked);
        } else if &*ask.group == MULTICAST_STREAM {
            host.multicasts(|_| false, |s| s.unask(&ask));
        } else {
            host.groups(|_| false, |s| s.unask(&ask));
        }
    }
}

/// Sends the repairs under way as far as the ways toward their members allow. Each job is
/// taken once per call, oldest first; one whose way is full goes behind the others, and that
/// member's other jobs are not tried again in this call: a member that makes no room holds up
/// no one else's repair, and costs a call at most its `REPAIR_JOBS_PER_MEMBER_MAX` jobs.
pub fn pump_repairs<H: Host>(host: &mut H, now_ms: u64) {
    let mut full: HashSet<BusId> = HashSet::new();
    for _ in 0..host.repairs(|r| r.len()) {
        let Some(mut job) = host.repairs(|r| r.take(now_ms)) else {
            break;
        };
        if full.contains(&job.to) {
            host.repairs(|r| r.requeue(job));
            continue;
        }
        match send_repair(host, &mut job) {
            Ok(()) => {}
            Err(Unsent::Full) => {
                full.insert(job.to);
                host.repairs(|r| r.requeue(job));
            }
            Err(Unsent::Failed(why)) => host.report(Report::RepairDropped {
                member: job.to,
                stream: job.group.to_string(),
                why,
            }),
        }
    }
}

/// Sends what fits of one repair: the loss first, then the copies in order.
fn send_repair<H: Host>(host: &mut H, job: &mut RepairJob) -> Result<(), Unsent> {
    let (me, _) = host.me();
    if let Some((first, to)) = job.lost {
        let body = encode_repair_lost(job.incarnation, first, to, &job.group);
        host.send_repair(job.to, &body, &Bytes::new())?;
        job.lost = None;
    }
    while let Some((number, payload)) = job.copies.front() {
        let head = encode_repair_copy_head(me, job.incarnation, *number, &job.group);
        host.send_repair(job.to, &head, payload)?;
        host.report(Report::CopySent { to: job.to });
        job.copies.pop_front();
    }
    Ok(())
}

/// The groups' timers, at `now_ms`: marks owed, tail marks of publishes gone quiet and to
/// lagging links, asks not sent yet, repairs waiting for room, and gaps given up on
/// (what waited behind them is delivered). The multicasts' are `multicast::node::tick`.
pub fn tick<H: Host>(host: &mut H, now_ms: u64) {
    let (me, incarnation) = host.me();
    let owed = host.groups(|_| false, |s| s.owed_marks(me, incarnation));
    for o in owed {
        if host.forwards_wait_for(o.peer) {
            // Behind the publishes that wait for that peer, on a later tick.
            continue;
        }
        let stream = (o.publisher, o.incarnation, &*o.group);
        let body = mark_toward(host, o.peer, stream, (o.from, o.number));
        // Paid without a word where it may not go (see `send_marks`).
        if !host.may_pass_to(o.peer, o.publisher) || push_mark(host, o.peer, &body) != Push::Full {
            host.groups(|_| false, |s| s.mark_paid(o.peer, o.publisher, &o.group));
        }
    }
    for (group, number, to) in host.groups(|_| false, |s| s.tail_marks(now_ms)) {
        let body = encode_mark(me, incarnation, number, &group);
        for peer in to {
            // A peer owed a gap mark of this stream has it first (above, or on a later tick):
            // a plain mark ahead of it would begin a new stream after what was dropped.
            if host.groups(|_| false, |s| s.owes(peer, me, &group)) {
                continue;
            }
            if push_mark(host, peer, &body) == Push::Full {
                // Sent again, on later ticks, once it fits (the owed marks above).
                host.groups(|_| false, |s| s.owe_mark(peer, me, &group, None));
            }
        }
    }
    for (group, number, peer) in host.groups(|_| false, |s| s.lagging()) {
        if host.groups(|_| false, |s| s.owes(peer, me, &group)) {
            // Its gap mark goes first (above, on a later tick).
            continue;
        }
        let body = encode_mark(me, incarnation, number, &group);
        // Room again (for more than the mark): the next publish goes to it.
        if host.has_caught_up(peer) && push_mark(host, peer, &body) == Push::Sent {
            host.groups(|_| false, |s| s.set_lagging(&group, peer, false));
        }
    }
    ask_repairs(host, now_ms);
    pump_repairs(host, now_ms);
    let overdue = host.groups(|v: &Vec<_>| !v.is_empty(), |s| s.overdue(now_ms));
    for (publisher, group, lost, why) in overdue {
        skipped(host, (publisher, &group), lost, (why, true), now_ms);
    }
}

/// The mark for `peer` of the stream `(publisher, incarnation, name)` up to `last`: a gap
/// mark from `from` if publishes were dropped toward it and it reads gap marks, else a
/// plain mark.
pub(crate) fn mark_toward<H: Host>(
    host: &H,
    peer: BusId,
    (publisher, incarnation, name): (BusId, u64, &str),
    (from, last): (Option<u64>, u64),
) -> Vec<u8> {
    match from {
        Some(from) if host.takes_gap_marks(peer) => {
            encode_gap_mark(publisher, incarnation, (from, last), name)
        }
        _ => encode_mark(publisher, incarnation, last, name),
    }
}

/// Queues a mark (`encode_mark`'s body) for `peer`.
fn push_mark<H: Host>(host: &mut H, peer: BusId, body: &[u8]) -> Push {
    host.push(peer, FrameKind::Publish, body, &Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::decode_publish;
    use crate::group::encode_publish_head;
    use crate::group::host::fake::FakeHost;

    #[test]
    fn a_peer_that_newly_asks_is_marked_every_stream_known_but_its_own() {
        // Node 1 publishes to g itself and has seen 7's stream; 7 then asks for g.
        let mut host = FakeHost::new(1, &[3, 7]);
        host.groups.publish("g", &Bytes::from_static(b"own"), 0);
        let mut body = encode_publish_head(BusId(7), 1, 5, "g");
        body.extend_from_slice(b"x");
        let body = Bytes::from(body);
        let head = decode_publish(&body).unwrap();
        host.groups
            .take_publish(BusId(1), BusId(7), &body, &head, 0);
        let marks = host.groups.marks_for("g", BusId(1), 1);
        send_marks(&mut host, BusId(7), "g", marks.clone());
        let marked: Vec<BusId> = host
            .pushed
            .iter()
            .map(|(_, _, b)| decode_publish(b).unwrap().publisher)
            .collect();
        assert_eq!(marked, [BusId(1)], "never 7 in its own name");
        send_marks(&mut host, BusId(3), "g", marks);
        assert_eq!(host.pushed.len(), 3, "3 is marked both streams");
    }
}
