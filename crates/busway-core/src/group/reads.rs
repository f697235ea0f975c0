//! One read's group frames, for a [`Host`]: INTEREST recorded (as permitted, within the
//! link's quota; a peer that newly asks is sent a mark per publisher known), PUBLISH, MULTICAST
//! and REPAIR handed to their machines (`publishes`, `multicast::node`, `node`), then the gaps
//! asked for and the repairs under way pumped. GROUP_LOG frames are the host's (a log is
//! shared memory). Also what each peer is told this node wants ([`sync_adverts`]).

use super::forwards::Push;
use super::host::{Host, Report};
use super::node::{ask_repairs, pump_repairs, repair_received, send_marks};
use super::publishes::publish_received;
use super::{decode_interest, encode_interest};
use crate::frame::{FrameKind, SPAN_GROUP_LOG, SPAN_INTEREST, SPAN_LEN_MASK, SPAN_MULTICAST};
use crate::frame::{SPAN_PUBLISH, SPAN_REPAIR, SPAN_TAG_MASK};
use crate::group::{decode_group_log, GroupLog};
use crate::multicast;
use crate::BusId;
use bytes::Bytes;

/// Whether a span's tag is a group frame's (this module's, or GROUP_LOG).
pub fn is_group_span(tagged: u32) -> bool {
    matches!(
        tagged & SPAN_TAG_MASK,
        SPAN_INTEREST | SPAN_PUBLISH | SPAN_REPAIR | SPAN_MULTICAST | SPAN_GROUP_LOG
    )
}

/// Takes the INTEREST, PUBLISH, MULTICAST and REPAIR messages out of `spans` (messages from
/// `from` in `chunk`: a direct peer, or for REPAIR the source end to end; GROUP_LOG ones
/// stay for the host) and acts on them in order; then a peer that newly asked for a group is
/// sent its marks, gaps are asked for and repairs pumped. True if a peer's interest changed
/// (the host tells the others what it now wants through them: [`sync_adverts`]).
pub fn read<H: Host>(
    host: &mut H,
    from: BusId,
    chunk: &Bytes,
    spans: &mut Vec<(u32, u32)>,
    now_ms: u64,
) -> bool {
    let mut interest_changed = false;
    let mut newly_asked: Vec<String> = Vec::new();
    let mut gaps = false;
    spans.retain(|&(start, tagged)| {
        let tag = tagged & SPAN_TAG_MASK;
        if !is_group_span(tagged) || tag == SPAN_GROUP_LOG {
            return true;
        }
        let len = tagged & SPAN_LEN_MASK;
        let body = chunk.slice(start as usize..(start + len) as usize);
        match tag {
            SPAN_INTEREST => match interest(host, from, &body) {
                None => {}
                Some(None) => interest_changed = true,
                Some(Some(name)) => {
                    interest_changed = true;
                    newly_asked.push(name);
                }
            },
            SPAN_PUBLISH => gaps |= publish_received(host, from, (chunk, start, &body), now_ms),
            SPAN_MULTICAST => {
                gaps |= multicast::node::received(host, from, chunk, (start, len), now_ms)
            }
            _ => gaps |= repair_received(host, from, (chunk, start, &body), now_ms),
        }
        false
    });
    for name in newly_asked {
        send_marks(host, from, &name);
    }
    if gaps {
        ask_repairs(host, now_ms);
    }
    pump_repairs(host, now_ms);
    interest_changed
}

/// An INTEREST from `from`: `None` if it changed nothing (not taken on a link this node
/// dialed on a hint, not permitted, refused past the quota, or not well formed), else
/// `Some` of the group's name if `from` newly asks for it.
fn interest<H: Host>(host: &mut H, from: BusId, body: &[u8]) -> Option<Option<String>> {
    // A link dialed on a hint carries no group traffic: the peer hears publishes by the tree
    // (see `sync_adverts`).
    if host.hinted(from) {
        return None;
    }
    // Checked by the frame's reader.
    let i = decode_interest(body).ok()?;
    if i.join && !super::permitted::join_permitted(host, from, i.name) {
        return None;
    }
    if !i.join {
        host.left_log(from, i.name);
    }
    let quota = host.interest_quota(from);
    match host.groups(|_| false, |s| s.interest(from, i.join, i.name, quota)) {
        None => {
            host.report(Report::InterestRefused);
            None
        }
        Some(new) => Some(new.then(|| i.name.to_owned())),
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
/// Takes the GROUP_LOG frames that `take` wants out of a read's `spans` (their bodies in
/// `chunk`); the others stay, as does one that does not decode (the reader checked it).
pub fn take_log_frames<'a>(
    chunk: &'a [u8],
    spans: &mut Vec<(u32, u32)>,
    mut take: impl FnMut(GroupLog<'a>) -> bool,
) {
    spans.retain(|&(start, tagged)| {
        if tagged & SPAN_TAG_MASK != SPAN_GROUP_LOG {
            return true;
        }
        let body = &chunk[start as usize..(start + (tagged & SPAN_LEN_MASK)) as usize];
        decode_group_log(body).map_or(true, |frame| !take(frame))
    });
}
