//! What a node does with the publishes it receives, for a [`Host`]: a PUBLISH (one publish, a
//! batch or a mark) is taken only from a link that may speak for its publisher and only as
//! permitted, handed to the group state (`intake`), passed on to each peer that asked
//! (waiting for room toward a full peer as its policy says, skipped past its wait:
//! `forwards`), and what the member's stream holds next is handed over in order.

use super::forwards::Push;
use super::host::{Host, Report};
use super::intake::{Handed, Intake};
use super::log_records::decode_log_records;
use super::node::{ask_repairs, mark_toward, pump_repairs, skipped};
use super::permitted::publish_permitted;
use super::state::{GroupPolicy, Published};
use super::stream::Skipped;
use super::{as_plain_mark, decode_publish};
use super::{split_publish_batch, PublishHead};
use crate::body::Span;
use crate::frame::FrameKind;
use crate::BusId;
use bytes::Bytes;

/// A PUBLISH from the direct peer `from`, its body `body` at `start` of `chunk` and its head
/// parsed from it: refused if
/// `from` may not speak for its publisher (the link is closed), dropped if not permitted,
/// else passed on and, for this node's application if a member, handed over in order. True
/// if a gap is open.
pub fn publish_received<H: Host>(
    host: &mut H,
    from: BusId,
    (chunk, start, body): (&Bytes, u32, &Bytes),
    head: PublishHead<'_>,
    now_ms: u64,
) -> bool {
    let what = if head.mark { "PUBLISH mark" } else { "PUBLISH" };
    if let Err(why) = host.may_speak_for(from, head.publisher, what) {
        host.report(Report::PublishLie { from, why });
        return false;
    }
    if !publish_permitted(host, head.publisher, head.name, head.count, now_ms) {
        return false;
    }
    let (me, _) = host.me();
    let intake = host.groups(Intake::delivers, |s| {
        s.take_publish(me, from, body, &head, now_ms)
    });
    let stream = (head.publisher, head.name);
    act_on_intake(host, (chunk, start as usize), stream, intake, now_ms)
}

/// Acts on what the group state made of publishes of `stream` (publisher, group) whose body
/// starts at `base` of `chunk` (see `intake`): passes them on, tells of a restarted stream,
/// hands over what is next, reports copies and publishes nobody wants. True if a gap is open.
pub fn act_on_intake<H: Host>(
    host: &mut H,
    (chunk, base): (&Bytes, usize),
    (publisher, group): (BusId, &str),
    intake: Intake,
    now_ms: u64,
) -> bool {
    if intake.copies > 0 {
        host.report(Report::CopiesDropped(intake.copies));
    }
    if intake.unwanted > 0 {
        host.report(Report::Unwanted {
            publisher,
            group: group.to_owned(),
            n: intake.unwanted,
        });
    }
    for onward in intake.onward {
        // Made or checked by the group state: it decodes (else counted, not sent).
        let Ok(head) = decode_publish(&onward.body) else {
            for _ in &onward.to {
                forwards_dropped(host, &onward.body);
            }
            continue;
        };
        for peer in onward.to {
            forward_publish(host, peer, &onward.body, &head, now_ms);
        }
    }
    if intake.lost_before > 0 {
        let lost = Skipped {
            missed: intake.lost_before,
            ..Skipped::default()
        };
        let why = "publishes dropped on the way to this member (a full link) before a later one began its stream".to_owned();
        skipped(host, (publisher, group), lost, (why, false), now_ms);
    }
    if let Some(ended) = intake.ended {
        let why = format!(
            "publisher {publisher} restarted before they came (a new incarnation's stream starts afresh)"
        );
        skipped(host, (publisher, group), ended, (why, false), now_ms);
    }
    let at = |(start, len): (usize, usize)| Span::data((base + start) as u32, len as u32);
    for handed in intake.handed {
        match handed {
            Handed::Spans(spans) if spans.len() == 1 => {
                host.deliver_span(publisher, Some(group), chunk, at(spans[0]));
            }
            Handed::Spans(spans) => {
                let spans = spans.into_iter().map(at).collect();
                host.deliver_run(publisher, group, chunk, spans);
            }
            Handed::Waited(payloads) => host.deliver(publisher, Some(group), payloads),
        }
    }
    intake.gap
}

/// Publishes read from the log of `group` that the direct peer `from` offered (their bodies
/// at `spans` of `chunk`): each must be a publish (not a mark) of `from` itself to `group`,
/// else the error names the first that is not and none is taken. Then as if they came by the
/// link, taken in one go (one look at the group state for the lot), if permitted: passed on,
/// handed over in order, gaps asked for, repairs pumped.
pub fn log_read<H: Host>(
    host: &mut H,
    (from, group): (BusId, &str),
    chunk: &Bytes,
    spans: &[(u32, u32)],
    now_ms: u64,
) -> Result<(), String> {
    let heads = decode_log_records(chunk, spans, from, group)?;
    if !publish_permitted(host, from, group, heads.len() as u64, now_ms) {
        // Its publishes to the group are not taken here, by the log or otherwise.
        return Ok(());
    }
    let payloads = heads
        .iter()
        .zip(spans)
        .map(|(h, &(start, len))| (start as usize + h.payload_at, len as usize - h.payload_at))
        .collect();
    let (me, _) = host.me();
    let intake = host.groups(Intake::delivers, |s| {
        s.take_run(me, from, &heads, chunk, payloads, now_ms)
    });
    if act_on_intake(host, (chunk, 0), (from, group), intake, now_ms) {
        ask_repairs(host, now_ms);
    }
    pump_repairs(host, now_ms);
    Ok(())
}

/// How many publishes a PUBLISH `body` stands for (a batch's count; one for a single
/// publish, a mark, or a body that does not decode).
pub fn publishes_in(body: &[u8]) -> u64 {
    decode_publish(body).map_or(1, |h| h.count.max(1))
}

/// The publishes of a PUBLISH `body` (a batch's each) could not be passed on: reported.
pub fn forwards_dropped<H: Host>(host: &mut H, body: &[u8]) {
    host.report(Report::ForwardsDropped(publishes_in(body)));
}

/// Cut-off publishes a relay gave up on toward peers whose ways stayed full (`dropped`, as
/// `WaitingForwards::push` left them: a peer's together, each owed its gap mark already by
/// [`given_up`]): each such peer is reported skipped once, the publishes dropped.
pub fn forwards_given_up<H: Host>(host: &mut H, dropped: &[(BusId, Bytes)]) {
    for (i, (peer, body)) in dropped.iter().enumerate() {
        if i == 0 || dropped[i - 1].0 != *peer {
            host.report(Report::LinkSkipped);
        }
        forwards_dropped(host, body);
    }
}

/// Pushes a publish or mark `body` (of `head`) to `peer`, the mark owed to `peer` of its
/// stream first, if one is: a peer that publishes were dropped toward learns where the drop
/// began before it sees the next (a member whose stream had not begun would begin it after
/// them, unaware); one owed a plain mark has it in `head` itself. `Full` if either finds no
/// room (the gap mark is owed again; the caller drops or queues the publish).
pub fn push_paying<H: Host>(
    host: &mut H,
    peer: BusId,
    body: &Bytes,
    head: &PublishHead<'_>,
) -> Push {
    if host.owes_marks() {
        // Up to the publish before this one (a mark passed on says its own number).
        let last = head.number - u64::from(!head.mark);
        let stream = (head.publisher, head.incarnation, head.name);
        let paid = pay_owed(host, peer, stream, last);
        if paid != Push::Sent {
            return paid;
        }
    }
    host.push(peer, FrameKind::Publish, &[], body)
}

/// Sends `peer` the mark owed to it of the stream `(publisher, incarnation, name)`, if one
/// is, up to `last` (a gap mark from the first publish dropped, see [`mark_toward`]).
/// `Sent` if nothing was owed or it went, else what its push found (it is owed again).
fn pay_owed<H: Host>(
    host: &mut H,
    peer: BusId,
    (publisher, incarnation, name): (BusId, u64, &str),
    last: u64,
) -> Push {
    let first = host.groups(|_| false, |s| s.take_owed(peer, publisher, name));
    let Some(from) = first.flatten().filter(|&f| f <= last) else {
        // Nothing owed, or a plain mark: the publish that follows says as much.
        return Push::Sent;
    };
    let mark = mark_toward(
        host,
        peer,
        (publisher, incarnation, name),
        (Some(from), last),
    );
    let pushed = host.push(peer, FrameKind::Publish, &mark, &Bytes::new());
    if pushed != Push::Sent {
        host.groups(|_| false, |s| s.owe_mark(peer, publisher, name, Some(from)));
    }
    pushed
}

/// A cut-off publish (or mark) `body` that waited for room toward `peer` was given up on:
/// the peer is owed a gap mark from it. The host calls this before any later publish of
/// that stream may go to the peer (the runtime: under the lock of the publishes waiting).
pub fn given_up<H: Host>(host: &mut H, peer: BusId, body: &[u8]) {
    if let Ok(head) = decode_publish(body) {
        owe_mark(host, peer, &head);
    }
}

/// `peer` is owed a mark of the stream of a publish, batch or mark (`head`) that could not
/// go to it: a gap mark from the first publish dropped.
fn owe_mark<H: Host>(host: &mut H, peer: BusId, head: &PublishHead<'_>) {
    let first = if head.mark {
        head.gap_from
    } else {
        Some(head.number)
    };
    host.groups(
        |_| false,
        |s| s.owe_mark(peer, head.publisher, head.name, first),
    );
}

/// Passes a publish (or mark) `body` on to the peer `peer`, behind any that wait for it. One
/// that does not fit waits (the host's links that bring publishes stop reading meanwhile):
/// under backpressure as long as it takes, under cut-off at most the host's `wait_ms` for
/// that peer, then it is dropped for that peer, which is owed a mark and skipped at once
/// while it stays full (it lags). Never a frame in the name of a publisher the upstream does
/// not hold registered for this node (it would close the link).
pub fn forward_publish<H: Host>(
    host: &mut H,
    peer: BusId,
    body: &Bytes,
    head: &PublishHead<'_>,
    now_ms: u64,
) {
    if head.gap_from.is_some() && !host.takes_gap_marks(peer) {
        let plain = Bytes::from(as_plain_mark(head));
        if let Ok(h) = decode_publish(&plain) {
            forward_publish(host, peer, &plain, &h, now_ms);
        }
        return;
    }
    if head.batch && !host.takes_batches(peer) {
        // A peer that does not read batches has them publish by publish.
        for one in split_publish_batch(body, head) {
            let one = Bytes::from(one);
            if let Ok(h) = decode_publish(&one) {
                forward_publish(host, peer, &one, &h, now_ms);
            }
        }
        return;
    }
    // Not one past the peer's frame limit (even to wait: it would close the link once it
    // fits the queue), nor one the upstream does not take in this name.
    if !host.fits(peer, body.len()) || !host.may_pass_to(peer, head.publisher) {
        forwards_dropped(host, body);
        return;
    }
    let lagging = !head.backpressure && host.forwards_lagging(peer);
    // A lagging peer's cut-off publishes go past what waits for it (only backpressure
    // publishes do: its cut-off ones were dropped), a mark never does: it may be of one of
    // those streams (a mark does not say its stream's policy), and ahead of them it would
    // show a gap that is not there.
    // A gap mark goes with them: drops happen under cut-off only, so it is of a cut-off
    // stream, whose publishes waiting for this peer were dropped with the one it tells of.
    let passes = !head.mark || head.gap_from.is_some();
    if !host.forwards_wait_for(peer) || (lagging && passes) {
        match push_paying(host, peer, body, head) {
            Push::Sent => {
                // A look at the way only if it lags.
                if lagging && host.has_caught_up(peer) {
                    host.forwards(|w| w.caught_up(peer));
                }
                return;
            }
            Push::Full => {}
            Push::Gone => {
                forwards_dropped(host, body);
                return;
            }
        }
    }
    if lagging {
        // Its members ask the publisher for what they missed, or are told they lost it. It
        // is owed a mark, in case this was the end of the stream.
        owe_mark(host, peer, head);
        forwards_dropped(host, body);
        return;
    }
    let give_up_at = (!head.backpressure).then(|| now_ms + host.wait_ms(peer));
    host.forwards(|w| w.wait(peer, body.clone(), give_up_at));
}

/// What became of this node's own publish toward one peer (see [`push_own`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnPush {
    /// Queued on the peer's link.
    Sent,
    /// Not for that peer: its link lags, or stayed full past its wait (its members repair
    /// the gap), or its frame limit is smaller.
    Skipped,
    /// The peer is gone (it forgets its interest).
    Gone,
    /// The link is full: wait for room for `len` bytes, at most `ms` milliseconds (`None`:
    /// as long as it takes, under backpressure), then call again.
    Wait {
        /// Bytes of room to wait for.
        len: usize,
        /// Most milliseconds to wait; `None` waits as long as it takes.
        ms: Option<u64>,
    },
}

/// Whether this node's publish, numbered as `published` says, may go to `peer` by a plain
/// push with nothing to decide first: no mark owed to the peer, its link not lagging, the
/// frame within its limit (`fits`). The host's fast path: a plain push that does not go, and
/// every other case, is [`push_own`]'s.
pub fn plain_push(published: &Published, peer: BusId, fits: bool) -> bool {
    fits && !published.lagging.contains(&peer) && published.owed.binary_search(&peer).is_err()
}

/// Pushes this node's publish `(head, payload)` of `group`, numbered as `published` says, to
/// `peer`, one that asked for the group. A full link is waited for (the caller waits, then
/// calls again, `timed_out` saying whether the room came): under backpressure as long as
/// it takes; under cut-off at most the host's `wait_ms` for that peer, then the peer is
/// skipped, and marked lagging so that later publishes skip it at once while it stays full.
/// A lagging peer with room again is sent publishes again.
pub fn push_own<H: Host>(
    host: &mut H,
    (group, peer): (&str, BusId),
    (head, payload): (&[u8], &Bytes),
    published: &Published,
    timed_out: bool,
) -> OwnPush {
    let len = head.len() + payload.len();
    if !host.fits(peer, len) {
        // The peer closes a link over a frame past its stated limit: it cannot have it.
        host.report(Report::ForwardsDropped(1));
        return OwnPush::Skipped;
    }
    let lagging = published.lagging.contains(&peer);
    let (me, incarnation) = host.me();
    let number = published.number;
    // What was skipped toward it before goes first (see `GroupState::publish`).
    if published.owed.binary_search(&peer).is_ok()
        && pay_owed(host, peer, (me, incarnation, group), number - 1) != Push::Sent
    {
        return skip(host, (group, peer), number, lagging);
    }
    match host.push_own_publish(peer, head, payload) {
        Push::Sent => {
            if lagging && host.has_caught_up(peer) {
                host.groups(|_| false, |s| s.set_lagging(group, peer, false));
            }
            OwnPush::Sent
        }
        Push::Gone => OwnPush::Gone,
        Push::Full if published.policy == GroupPolicy::Backpressure => {
            OwnPush::Wait { len, ms: None }
        }
        Push::Full if !lagging && !timed_out => OwnPush::Wait {
            len,
            ms: Some(host.wait_ms(peer)),
        },
        Push::Full => skip(host, (group, peer), number, lagging),
    }
}

/// This node's publish `number` to `group` is not for `peer`, whose link stayed full: the
/// others keep their rate; the members behind that link ask for what they missed, or are
/// told they lost it. The link lags from now on, and is owed a gap mark from its first
/// publish skipped, sent before the next that goes to it (or on a tick).
fn skip<H: Host>(
    host: &mut H,
    (group, peer): (&str, BusId),
    number: u64,
    lagging: bool,
) -> OwnPush {
    let (me, _) = host.me();
    host.groups(
        |_| false,
        |s| {
            s.set_lagging(group, peer, true);
            s.owe_mark(peer, me, group, Some(number));
        },
    );
    if !lagging {
        host.report(Report::LinkSkipped);
    }
    host.report(Report::ForwardsDropped(1));
    OwnPush::Skipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::host::fake::FakeHost;
    use crate::group::{encode_gap_mark, encode_publish_head};

    #[test]
    fn a_forward_past_the_peers_frame_limit_is_dropped_not_left_to_wait() {
        // A publish already waits for 3: the next would wait behind it, but one past 3's
        // frame limit would close the link once it fits the queue.
        let mut host = FakeHost::new(1, &[3]);
        host.frame_max = 100;
        host.waiting
            .wait(BusId(3), Bytes::from_static(b"first"), Some(1_000));
        let mut body = encode_publish_head(BusId(7), 1, 2, "g");
        body.extend_from_slice(&[0; 200]);
        let body = Bytes::from(body);
        let head = decode_publish(&body).unwrap();
        forward_publish(&mut host, BusId(3), &body, &head, 0);
        assert_eq!(host.reports, [Report::ForwardsDropped(1)]);
        let pushed = host.waiting.push(0, |_, _| Push::Sent);
        assert_eq!(pushed.waits, None, "only the first waited");
    }

    fn published(policy: GroupPolicy, lagging: &[u64]) -> Published {
        Published {
            number: 1,
            to: vec![BusId(3)],
            policy,
            lagging: lagging.iter().map(|&p| BusId(p)).collect(),
            member: false,
            owed: Vec::new(),
        }
    }

    #[test]
    fn an_own_publish_waits_for_a_full_link_then_skips_it_until_it_has_room() {
        let mut host = FakeHost::new(1, &[3]);
        host.full.push(BusId(3));
        let (head, payload) = (&b"head"[..], Bytes::from_static(b"payload"));
        let at = ("g", BusId(3));
        let cut_off = published(GroupPolicy::CutOff, &[]);
        let wait = push_own(&mut host, at, (head, &payload), &cut_off, false);
        assert_eq!(
            wait,
            OwnPush::Wait {
                len: 11,
                ms: Some(1_000)
            }
        );
        let skipped = push_own(&mut host, at, (head, &payload), &cut_off, true);
        assert_eq!(skipped, OwnPush::Skipped);
        assert_eq!(
            host.reports,
            [Report::LinkSkipped, Report::ForwardsDropped(1)]
        );
        // The next publish finds it lagging: skipped at once, not skipped twice.
        let lagging = host.groups.publish("g", &payload, 0);
        assert_eq!(lagging.lagging, [BusId(3)], "marked lagging");
        let next = push_own(&mut host, at, (head, &payload), &lagging, false);
        assert_eq!(next, OwnPush::Skipped);
        assert_eq!(host.reports.len(), 3);
        // Under backpressure it waits as long as it takes.
        let bp = published(GroupPolicy::Backpressure, &[3]);
        let wait = push_own(&mut host, at, (head, &payload), &bp, true);
        assert_eq!(wait, OwnPush::Wait { len: 11, ms: None });
        // With room again it is sent to, and lags no more.
        host.full.clear();
        let sent = push_own(&mut host, at, (head, &payload), &lagging, false);
        assert_eq!(sent, OwnPush::Sent);
        assert!(host.groups.publish("g", &payload, 0).lagging.is_empty());
        // One past the peer's frame limit never goes.
        host.frame_max = 8;
        let big = push_own(&mut host, at, (head, &payload), &cut_off, false);
        assert_eq!(big, OwnPush::Skipped);
    }

    #[test]
    fn a_peer_owed_a_gap_mark_has_it_before_the_stream_s_next_publish() {
        let mut host = FakeHost::new(1, &[3]);
        host.groups.interest(BusId(3), true, "g", 16);
        let body = |n: u64| {
            let mut b = encode_publish_head(BusId(7), 1, n, "g");
            b.push(n as u8);
            Bytes::from(b)
        };
        // 1 and 2 dropped toward 3 (its way full and lagging).
        host.waiting.wait(BusId(3), body(1), Some(0));
        let pushed = host.waiting.push(0, |_, _| Push::Full);
        for (peer, body) in &pushed.dropped {
            given_up(&mut host, *peer, body);
        }
        forwards_given_up(&mut host, &pushed.dropped);
        host.full.push(BusId(3));
        let two = body(2);
        forward_publish(&mut host, BusId(3), &two, &decode_publish(&two).unwrap(), 0);
        host.full.clear();
        assert!(host.groups.owes(BusId(3), BusId(7), "g"));
        let three = body(3);
        forward_publish(
            &mut host,
            BusId(3),
            &three,
            &decode_publish(&three).unwrap(),
            0,
        );
        let sent: Vec<_> = host.pushed.iter().map(|(_, _, b)| b.clone()).collect();
        assert_eq!(sent.len(), 2, "the gap mark, then 3");
        let mark = decode_publish(&sent[0]).unwrap();
        assert_eq!(
            (mark.gap_from, mark.number),
            (Some(1), 2),
            "from the first dropped"
        );
        assert_eq!(sent[1], three);
        assert!(host.groups.owes_none(), "paid");
    }

    #[test]
    fn an_own_publish_skipped_is_told_by_a_gap_mark_before_the_next_that_goes() {
        let mut host = FakeHost::new(1, &[3]);
        host.groups.interest(BusId(3), true, "g", 16);
        let payload = Bytes::from_static(b"p");
        let push = |host: &mut FakeHost, timed_out: bool| {
            let published = host.groups.publish("g", &payload, 0);
            let head = encode_publish_head(BusId(1), 1, published.number, "g");
            push_own(
                host,
                ("g", BusId(3)),
                (&head, &payload),
                &published,
                timed_out,
            )
        };
        host.full.push(BusId(3));
        assert_eq!(push(&mut host, true), OwnPush::Skipped);
        assert_eq!(push(&mut host, false), OwnPush::Skipped, "lagging");
        host.full.clear();
        assert_eq!(push(&mut host, false), OwnPush::Sent);
        let mark = decode_publish(&host.pushed[0].2).unwrap();
        assert_eq!((mark.gap_from, mark.number), (Some(1), 2));
        assert_eq!(decode_publish(&host.pushed[1].2).unwrap().number, 3);
        // A peer that does not read gap marks gets a plain mark in its place.
        host.gap_marks = false;
        host.full.push(BusId(3));
        assert_eq!(push(&mut host, true), OwnPush::Skipped);
        host.full.clear();
        host.pushed.clear();
        assert_eq!(push(&mut host, false), OwnPush::Sent);
        let mark = decode_publish(&host.pushed[0].2).unwrap();
        assert_eq!((mark.mark, mark.gap_from, mark.number), (true, None, 4));
    }

    #[test]
    fn a_gap_mark_that_comes_after_a_later_publish_began_the_stream_is_told_as_a_loss() {
        let mut host = FakeHost::new(1, &[3]);
        host.groups.join("g").unwrap();
        let take = |host: &mut FakeHost, body: Vec<u8>| {
            let body = Bytes::from(body);
            let head = decode_publish(&body).unwrap();
            publish_received(host, BusId(3), (&body, 0, &body), head, 0)
        };
        let mut five = encode_publish_head(BusId(3), 1, 5, "g");
        five.push(5);
        take(&mut host, five);
        assert_eq!(host.delivered.len(), 1, "5 began the stream");
        // 3 and 4 were dropped on the way, and the gap mark telling so came after 5.
        take(&mut host, encode_gap_mark(BusId(3), 1, (3, 4), "g"));
        let gaps: Vec<u64> = host
            .reports
            .iter()
            .filter_map(|r| match r {
                Report::GroupGap {
                    missed,
                    cut_off: false,
                    ..
                } => Some(*missed),
                _ => None,
            })
            .collect();
        assert_eq!(gaps, [2], "told, not cut off");
        take(&mut host, encode_gap_mark(BusId(3), 1, (3, 5), "g"));
        assert_eq!(host.reports.len(), 1, "once");
        // A stream begun at a plain mark (where it stood when this member joined) lost
        // nothing before it: a late gap mark from an earlier membership tells nothing.
        host.groups.join("h").unwrap();
        take(&mut host, crate::group::encode_mark(BusId(3), 1, 10, "h"));
        take(&mut host, encode_gap_mark(BusId(3), 1, (3, 9), "h"));
        assert_eq!(host.reports.len(), 1);
    }
}
