//! One read's group frames, for a [`Host`]: INTEREST recorded (as permitted, within the
//! link's quota; a peer that newly asks is sent a mark per publisher known), PUBLISH, MULTICAST
//! and REPAIR handed to their machines (`publishes`, `multicast::node`, `node`), then the gaps
//! asked for and the repairs under way pumped. The runtime's receive dispatcher sorts them
//! out of a read by their [`Span`]s' kinds; GROUP_LOG frames are the host's (a log is shared
//! memory). Also what each peer is told this node wants ([`sync_adverts`]).

use super::forwards::Push;
use super::host::{Host, Report};
use super::node::{ask_repairs, pump_repairs, repair_received, send_marks};
use super::publishes::publish_received;
use super::state::Mark;
use super::{encode_interest, Interest};
use crate::body::{Body, BodyKind, Span};
use crate::frame::FrameKind;
use crate::multicast;
use crate::BusId;
use bytes::Bytes;

/// Acts on a read's INTEREST, PUBLISH, MULTICAST and REPAIR messages, in order (`spans`, of
/// kinds that [`BodyKind::is_group`]; from `from` in `chunk`: a direct peer, or for REPAIR
/// the source end to end), each body parsed here once; then a peer that newly asked for a
/// group is sent its marks, gaps are asked for and repairs pumped. A body that does not parse
/// (its reader checked it: only a host that did not) is refused as a lie of its kind. True if
/// a peer's interest changed (the host tells the others what it now wants through them:
/// [`sync_adverts`]).
pub fn read<H: Host>(
    host: &mut H,
    from: BusId,
    chunk: &Bytes,
    spans: &[Span],
    now_ms: u64,
) -> bool {
    let mut interest_changed = false;
    let mut newly_asked: Vec<(String, Vec<Mark>)> = Vec::new();
    let mut gaps = false;
    for &span in spans {
        let body = chunk.slice(span.range());
        let parsed = Body::parse(span.kind(), &body);
        match parsed {
            Ok(Body::Interest(i)) => match interest(host, from, i) {
                None => {}
                Some(None) => interest_changed = true,
                Some(Some(asked)) => {
                    interest_changed = true;
                    newly_asked.push(asked);
                }
            },
            Ok(Body::Publish(head)) => {
                gaps |= publish_received(host, from, (chunk, span.start(), &body), head, now_ms)
            }
            Ok(Body::Multicast(head)) => {
                gaps |= multicast::node::received(host, from, (chunk, span, &body), head, now_ms)
            }
            Ok(Body::Repair(repair)) => {
                gaps |= repair_received(host, from, (chunk, span.start(), &body), repair, now_ms)
            }
            Ok(_) => debug_assert!(false, "{span:?} is no group message"),
            Err(why) => refuse(host, from, span.kind(), why),
        }
    }
    for (name, marks) in newly_asked {
        send_marks(host, from, &name, marks);
    }
    if gaps {
        ask_repairs(host, now_ms);
    }
    pump_repairs(host, now_ms);
    interest_changed
}

/// A group message of `kind` from `from` that does not parse: a PUBLISH or MULTICAST closes
/// the link (`from` lies), a REPAIR is counted refused, an INTEREST changes nothing.
fn refuse<H: Host>(host: &mut H, from: BusId, kind: BodyKind, why: String) {
    match kind {
        BodyKind::Publish => host.report(Report::PublishLie { from, why }),
        BodyKind::Multicast => host.report(Report::MulticastLie { from, why }),
        BodyKind::Repair => host.report(Report::RepairRefused),
        _ => {}
    }
}

/// An INTEREST from `from`: `None` if it changed nothing (not taken on a link this node
/// dialed on a hint, not permitted, refused past the quota, or not well formed), else
/// `Some` of the group's name and the marks to send `from` if it newly asks for it.
fn interest<H: Host>(
    host: &mut H,
    from: BusId,
    i: Interest<'_>,
) -> Option<Option<(String, Vec<Mark>)>> {
    // A link dialed on a hint carries no group traffic: the peer hears publishes by the tree
    // (see `sync_adverts`).
    if host.hinted(from) {
        return None;
    }
    if i.join && !super::permitted::join_permitted(host, from, i.name) {
        return None;
    }
    if !i.join {
        host.left_log(from, i.name);
    }
    let quota = host.interest_quota(from);
    let (me, incarnation) = host.me();
    // The marks are read in the same hold of the group state as the interest is taken: a
    // publish numbered after it goes to `from` and has a higher number than its mark; one
    // numbered between the two (another thread's) would be marked as before `from`'s
    // stream and yet sent to it, and `from` would drop it as older than its start.
    let taken = host.groups(
        |_| false,
        |s| {
            let new = s.interest(from, i.join, i.name, quota)?;
            Some(new.then(|| s.marks_for(i.name, me, incarnation)))
        },
    );
    match taken {
        None => {
            host.report(Report::InterestRefused);
            None
        }
        Some(marks) => Some(marks.map(|m| (i.name.to_owned(), m))),
    }
}

/// Tells each of `peers` (id, and whether it passes groups on) what this node now wants
/// through it; a change that does not fit a peer's queue is told on a later call.
pub fn sync_adverts<H: Host>(host: &mut H, peers: &[(BusId, bool)]) {
    for advert in host.groups(|_| false, |s| s.adverts(peers)) {
        let body = encode_interest(advert.join, &advert.name);
        match host.push(advert.peer, FrameKind::Interest, &body, &Bytes::new()) {
            Push::Sent => host.groups(|_| false, |s| s.told(&advert)),
            Push::Full => host.groups(|_| false, |s| s.advert_not_sent(&advert)),
            // Gone: what it wanted is forgotten with it.
            Push::Gone => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BodyKind;
    use crate::group::decode_publish;
    use crate::group::host::fake::FakeHost;

    /// The lost first publish of `ffi_test self`: a publisher numbered a publish between
    /// the look that took a peer's interest and the look that read its marks, so the peer's
    /// mark named that publish and the peer dropped it as older than its stream's start.
    #[test]
    fn a_publish_numbered_beside_a_new_interest_is_newer_than_the_mark_the_peer_gets() {
        let mut host = FakeHost::new(1, &[7]);
        host.groups.publish("g", &Bytes::from_static(b"before"), 0);
        host.interleave = Some("g".into());
        let chunk = Bytes::from(encode_interest(true, "g"));
        let span = Span::new(0, chunk.len() as u32, BodyKind::Interest);
        assert!(read(&mut host, BusId(7), &chunk, &[span], 0));
        let marks: Vec<u64> = host
            .pushed
            .iter()
            .filter(|(to, kind, _)| *to == BusId(7) && *kind == FrameKind::Publish)
            .map(|(_, _, body)| decode_publish(body).unwrap())
            .filter(|h| h.mark && h.publisher == BusId(1))
            .map(|h| h.number)
            .collect();
        assert_eq!(marks.len(), 1, "one mark of 1's stream");
        let to_7: Vec<u64> = host
            .interleaved
            .iter()
            .filter(|(_, to)| to.contains(&BusId(7)))
            .map(|&(n, _)| n)
            .collect();
        assert!(!to_7.is_empty(), "the test interleaves after the interest");
        assert!(
            to_7.iter().all(|&n| n > marks[0]),
            "publishes {to_7:?} go to 7, which was marked up to {}",
            marks[0]
        );
    }
}
