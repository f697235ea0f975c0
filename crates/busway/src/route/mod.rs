//! The route part: where a message for a bus id goes, and the traffic through relays.
//!
//! **Owns**: the relayed destinations and sources (`relayed_table`, `remote`), the queuing of
//! a message on its way (`outgoing`), the registrations along the tree (`registrations`,
//! `registration_table`), and the on-demand direct links (`hints`, `direct`), all in
//! `state::RouteTables`; the pump task and the resends on the node's timer (`tasks`).
//!
//! **Runs on**: the application's threads (sends), the links' I/O loops (relayed frames,
//! end-to-end control), the pump task on an I/O loop, and the node's timer.
//!
//! **May call**: the peer part's queues and table (and `peer::lifecycle` to give up on a
//! relayed destination), the discovery part's look-up of an id with no route, and the node's
//! events and counters. Direct links on hints are dialed by the link part
//! (`link::connector::direct_dial_loop`), which reads the hints here.
//! The rules (next hop, TTL, end-to-end numbering, when to hint) are busway-core's.
//!
//! # Routing
//!
//! Routes through relays: which neighbor takes a message for a destination, what a relay does
//! with a ROUTED frame that is not for it, and the end-to-end numbering of relayed messages.
//!
//! Routing for a destination, in order: a direct link to it; a downstream whose registered
//! range holds it; the upstream. A relay adds itself to the route, drops what passed its TTL or
//! loops, and reports failures to the source; it keeps no state about what it passed. HINTs
//! are ROUTED traffic too: a relay sends them here, and a source queues what it hears for
//! `direct`, which dials (and calls back into nothing here but `release_if_drained`).

pub(crate) mod direct;
pub(crate) mod hints;
pub(crate) mod outgoing;
pub(crate) mod registration_table;
pub(crate) mod registrations;
pub(crate) mod relayed_table;
pub(crate) mod remote;
pub(crate) mod state;
pub(crate) mod tasks;

use crate::addr::Addr;
use crate::limits::{FORWARD_QUEUE_BYTES_MAX, FORWARD_WAIT_MS};
use crate::node::event::Path;
use crate::peer::lifecycle;
use crate::peer::Peer;
use crate::route::remote::Remote;
use crate::shared::Shared;
use busway_core::body::Span;
use busway_core::e2e::{FailOutcome, Verdict};
use busway_core::frame::{FrameDecoder, FrameKind, BODY_LEN_CEILING, HEADER_LEN};
use busway_core::registry::Registry;
use busway_core::relay::{self, Neighbor};
use busway_core::routed::{
    decode_fail, decode_hint, encode_fail, encode_hint, forwarded_parts, routed_frame, FailReason,
    RoutedHeader, RoutedType,
};
use busway_core::BusId;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Looks [`route`] takes at a destination whose direct link changes under it (comes
/// up, or is given up, between its looks at the peer table and the relayed entry); a change
/// takes a handshake or a deadline, so a second look almost always settles it.
const ROUTE_LOOKS_MAX: usize = 3;

/// Where a message for a destination goes.
pub(crate) enum Route {
    Direct(Arc<Peer>),
    Relayed(Arc<Remote>),
}

/// The peers and their links at one moment, to route many destinations against (a multicast
/// to a thousand receivers takes one snapshot, not a thousand).
pub(crate) struct Hops {
    peers: Vec<Arc<Peer>>,
    neighbors: Vec<Neighbor>,
    upstream: Option<BusId>,
    registry: Arc<Registry>,
}

impl Hops {
    /// The neighbor whose link is up that takes a frame for `dst`, never `except`.
    pub(crate) fn next(&self, dst: BusId, except: Option<BusId>) -> Option<Arc<Peer>> {
        let by = self.registry.lookup(dst);
        let hop = relay::next_hop(dst, &self.neighbors, self.upstream, except, by)?;
        self.peers.iter().find(|p| p.id == hop).cloned()
    }

    /// Whether a downstream registered `dst` (as its own id or in its subtree).
    fn registered_below(&self, dst: BusId) -> bool {
        let by = self.registry.lookup(dst);
        relay::next_hop(dst, &self.neighbors, None, Some(dst), by).is_some()
    }
}

/// A snapshot of the peers to route against.
pub(crate) fn hops(shared: &Shared) -> Hops {
    let peers = shared.peers_snapshot();
    let neighbors = peers.iter().map(|p| p.neighbor()).collect();
    Hops {
        peers,
        neighbors,
        upstream: shared.upstream_id(),
        registry: shared.routes.registrations.below(),
    }
}

/// The neighbor whose link is up that takes a frame for `dst` now, never `except`.
pub(crate) fn next_hop(shared: &Shared, dst: BusId, except: Option<BusId>) -> Option<Arc<Peer>> {
    hops(shared).next(dst, except)
}

/// Whether `dst` is reached through relays: a downstream registered it, or there is an
/// upstream to ask.
fn relayable(shared: &Shared, dst: BusId) -> bool {
    shared.config().upstream.is_some() || hops(shared).registered_below(dst)
}

/// Whether [`route`] has a way to `dst`, without its side effects (no relayed
/// destination made or woken), against the snapshot `hops`.
pub(crate) fn has_route(shared: &Shared, dst: BusId, hops: &Hops) -> bool {
    if shared
        .peer(dst)
        .is_some_and(|p| !(p.discovered && p.is_dead()))
    {
        return true;
    }
    remote_of(shared, dst).is_some()
        || shared.config().upstream.is_some()
        || hops.registered_below(dst)
}

/// How to send to `dst`, or `None` if nobody could know it.
///
/// A direct link that comes up is put in the peer table first and supersedes the relayed
/// entry after (`switch_to_direct`); a send here looks at the relayed entry first and the
/// peer table after. So a send that chose the relays either queued before the switch
/// (counted: the direct link holds its messages until these are acknowledged) or sees the
/// direct link and goes there: never through relays behind the switch.
pub(crate) fn route(shared: &Shared, dst: BusId) -> Option<Route> {
    // A direct link given up while we looked makes a second look go to the relays.
    for _ in 0..ROUTE_LOOKS_MAX {
        if let Some(p) = direct_in_use(shared, dst) {
            return Some(Route::Direct(p));
        }
        let r = match remote_of(shared, dst) {
            Some(r) => r,
            None if !relayable(shared, dst) => return None,
            None => {
                let r = shared.routes.relayed.get_or_insert(dst, || {
                    Remote::new(dst, shared.config().send_queue_bytes_max, shared.clock_ms())
                });
                // A switch that looked for the entry before it was made superseded
                // nothing: its link is in the peer table already, and goes first.
                if let Some(p) = direct_in_use(shared, dst) {
                    return Some(Route::Direct(p));
                }
                r
            }
        };
        // The direct link looked at again under `r`'s lock (see above): it may have come
        // up since the first look.
        if r.open_for_send(|| direct_in_use(shared, dst).is_some()) {
            r.touch(shared.clock.coarse_ms());
            return Some(Route::Relayed(r));
        }
    }
    direct_in_use(shared, dst).map(Route::Direct)
}

/// Whether `what` (a PUBLISH, mark or MULTICAST) of `speaker` (its publisher or source)
/// may come over the link to `from`, by the rule ROUTED frames follow (`relay::Sources`):
/// over the upstream link from anywhere, over a registered downstream's from its subtree,
/// over any other link from the peer alone; and never in this node's own name. The error
/// names the lie. `link` keeps what was looked up of the link for the rest of its read
/// (a publish from the link's own peer looks nothing up).
pub(crate) fn may_speak_for(
    shared: &Shared,
    from: BusId,
    speaker: BusId,
    what: &str,
    link: &mut Option<relay::Sources>,
) -> Result<(), String> {
    if speaker == shared.config().id {
        return Err(format!(
            "{what} from peer {from} names this node ({speaker}) as its sender"
        ));
    }
    if speaker == from {
        return Ok(());
    }
    link.get_or_insert_with(|| relay::Sources {
        peer: from,
        serves: shared.peer(from).and_then(|p| p.neighbor().serves),
        upstream: shared.upstream_id() == Some(from),
    })
    .check_frame(speaker, what, |id| {
        shared.routes.registrations.registered_by(id)
    })
}

/// A lie came over the link to `from` (`why` names it): it changes nothing here, and the
/// link closes as for a protocol error (counted, logged, `PeerDown` with the reason); the
/// node and its other links go on.
pub(crate) fn refuse_link(shared: &Shared, from: BusId, why: String) {
    if let Some(p) = shared.peer(from) {
        p.refuse_link(why);
    }
}

/// The peer `dst` if a link to it carries its traffic: not a direct link dialed on a hint
/// and given up (traffic to it goes back through relays).
fn direct_in_use(shared: &Shared, dst: BusId) -> Option<Arc<Peer>> {
    shared.peer(dst).filter(|p| !(p.discovered && p.is_dead()))
}

pub(crate) fn remote_of(shared: &Shared, dst: BusId) -> Option<Arc<Remote>> {
    shared.routes.relayed.get(dst)
}

pub(crate) fn remotes_snapshot(shared: &Shared) -> Vec<Arc<Remote>> {
    shared.routes.relayed.snapshot()
}

/// Sends an end-to-end ACK or FAIL frame toward `dst`, best effort (they are regenerated).
pub(crate) fn send_routed_control(shared: &Shared, dst: BusId, frame: Bytes) {
    if let Some(hop) = next_hop(shared, dst, None) {
        hop.push_forward(vec![frame], Some(FORWARD_QUEUE_BYTES_MAX));
    }
}

pub(crate) fn control_header(
    shared: &Shared,
    kind: RoutedType,
    dst: BusId,
    seq: u64,
) -> RoutedHeader {
    RoutedHeader {
        kind,
        ttl: shared.config().ttl,
        src: shared.config().id,
        src_incarnation: shared.incarnation(),
        dst,
        seq,
        settled: false,
        route: Vec::new(),
    }
}

pub(crate) fn send_routed_ack(shared: &Shared, dst: BusId, next_expected: u64) {
    let h = control_header(shared, RoutedType::Ack, dst, next_expected);
    send_routed_control(shared, dst, routed_frame(&h, &[]));
}

fn send_fail(shared: &Shared, to: BusId, seq: u64, reason: FailReason, about: BusId, text: &str) {
    let h = control_header(shared, RoutedType::Fail, to, seq);
    send_routed_control(shared, to, encode_fail(&h, reason, about, text));
}

/// A ROUTED frame for another node, whose body is `body`, arrived from neighbor `from`:
/// pass it on (a new route prefix, its content shared with the read it came in, neither
/// copied nor hashed again), or report why not to its source.
pub(crate) async fn forward(
    shared: &Shared,
    from_peer: &Peer,
    mut header: RoutedHeader,
    body: Bytes,
    msgs: u64,
) {
    let from = from_peer.id;
    let me = shared.config().id;
    let peers = shared.peers_snapshot();
    let neighbors: Vec<Neighbor> = peers.iter().map(|p| p.neighbor()).collect();
    let upstream = shared.upstream_id();
    // The registry snapshot goes before any wait: held, it would make each change of
    // registrations copy the registry.
    let decided = {
        let registry = shared.routes.registrations.below();
        let view = relay::RelayView {
            me,
            neighbors: &neighbors,
            upstream,
            uptime_ms: shared.clock_ms(),
            grace_ms: shared.config().relay_grace_ms,
            registry: &registry,
        };
        relay::forward(&mut header, from, &view)
    };
    let hop = match decided {
        Ok(id) => peers.into_iter().find(|p| p.id == id),
        Err(refusal) => {
            if refusal.report {
                let (src, seq, dst) = (header.src, header.seq, header.dst);
                send_fail(shared, src, seq, refusal.reason, dst, &refusal.text);
            }
            return;
        }
    };
    let Some(hop) = hop else {
        return;
    };
    if Some(hop.id) == upstream {
        if let Err(why) = registrations::wait_gate_up(shared, header.src).await {
            // Up there it would close our link: the source hears why, and sends again.
            fail_data(shared, &header, FailReason::PeerDown, || {
                format!("relay {me}: {why}")
            });
            return;
        }
    }
    if hop.id == header.dst && header.kind == RoutedType::Data {
        maybe_hint(shared, header.src, &hop);
    }
    let frame = forwarded_parts(&header, &body);
    let body_len = frame.iter().map(Bytes::len).sum::<usize>() - HEADER_LEN;
    if let Some(max) = hop.frame_body_max().filter(|&max| body_len > max) {
        // The next hop would close the link over it (and the source send it again): the
        // source hears why instead.
        fail_data(shared, &header, FailReason::TooLarge, || {
            format!(
                "relay {me}: a frame of {body_len} bytes is over the {max} bytes bus id {} accepts",
                hop.id
            )
        });
        return;
    }
    let wait = Duration::from_millis(FORWARD_WAIT_MS);
    if !hop
        .push_forward_wait(frame, FORWARD_QUEUE_BYTES_MAX, wait)
        .await
    {
        bumped_congestion(shared);
        fail_data(shared, &header, FailReason::Congested, || {
            format!("relay {me}: queue toward {} is full", hop.id)
        });
        return;
    }
    // Counted once passed on: a frame refused above (no route, TTL, full queue) is not.
    from_peer.traffic.relayed_from.fetch_add(msgs, Relaxed);
    hop.traffic.relayed_to.fetch_add(msgs, Relaxed);
    shared.counters.relayed_msgs.fetch_add(msgs, Relaxed);
}

/// Tells the source of a relayed DATA frame that it was not passed on, and why (`text`,
/// made only then); control frames are not answered.
fn fail_data(
    shared: &Shared,
    header: &RoutedHeader,
    reason: FailReason,
    text: impl FnOnce() -> String,
) {
    if header.kind == RoutedType::Data {
        send_fail(shared, header.src, header.seq, reason, header.dst, &text());
    }
}

/// Where a ROUTED DATA frame from `src` stands against what was delivered: the number of
/// its messages to skip (already delivered), or `Err(expected)` if it leaves a gap.
/// `pending` is what this read already accepted from `src`.
pub(crate) fn check_routed(
    shared: &Shared,
    h: &RoutedHeader,
    pending: Option<u64>,
) -> Result<u64, u64> {
    shared.routes.relayed.check_arrival(h, pending)
}

/// A gap in what `src` sent: tell it where to resume.
pub(crate) fn report_gap(shared: &Shared, src: BusId, expected: u64) {
    let me = shared.config().id;
    send_fail(
        shared,
        src,
        expected,
        FailReason::Gap,
        me,
        &format!("bus id {me} expects message {expected} next"),
    );
}

/// An end-to-end ACK or FAIL for this node.
pub(crate) fn routed_control(
    shared: &Shared,
    header: &RoutedHeader,
    inner: &[u8],
) -> Result<(), String> {
    match header.kind {
        RoutedType::Ack => {
            if let Some(r) = remote_of(shared, header.src) {
                let v = r.ack(header.src_incarnation, header.seq, shared.clock_ms());
                report_verdict(shared, &r, v);
                release_if_drained(shared, r.id);
                if let Some(addrs) = r.acked_through(&header.route) {
                    dial_hinted(shared, r.id, addrs);
                }
                // The window moved: what it held back may go now.
                if r.has_unwritten() {
                    tasks::schedule_pump(shared, &r);
                }
            }
        }
        RoutedType::Hint => {
            let (about, addrs) = decode_hint(inner)?;
            hint_received(shared, header.src, about, addrs);
        }
        RoutedType::Fail => {
            let (reason, about, text) = decode_fail(inner)?;
            let Some(r) = remote_of(shared, about) else {
                return Ok(());
            };
            match r.on_fail(
                reason,
                header.src_incarnation,
                header.seq,
                shared.clock_ms(),
            ) {
                FailOutcome::Resend(v) => {
                    report_verdict(shared, &r, v);
                    tasks::pump(shared, &r);
                }
                FailOutcome::Stalled => {}
                FailOutcome::GaveUp(seqs) => {
                    if reason == FailReason::TooLarge {
                        // That message could not pass; the destination is not down:
                        // later ones go on (their first frame says the gap is settled).
                        // Before the report, so that a send it prompts is taken.
                        r.revive();
                    }
                    release_if_drained(shared, about);
                    shared.report_undeliverable(
                        about,
                        seqs,
                        format!("{reason}: {text}"),
                        Path::Relayed,
                        r.incarnation(),
                    );
                }
            }
        }
        RoutedType::Data => unreachable!("data is delivered by the reader"),
    }
    Ok(())
}

/// Relay side: data from `src` is being passed to `dst_peer`, its final hop. Hints `src`
/// (at most every `busway_core::hints::HINT_INTERVAL_MS`) if the destination accepts direct links.
fn maybe_hint(shared: &Shared, src: BusId, dst_peer: &Peer) {
    if !dst_peer.accepts_direct() {
        return;
    }
    if !shared.routes.hints.due(src, dst_peer.id, shared.clock_ms()) {
        return;
    }
    let snap = dst_peer.snapshot();
    let addrs: Vec<String> = snap
        .intro
        .listen_addrs
        .iter()
        .filter_map(|a| dialable(a, &snap.addr))
        .collect();
    let h = control_header(shared, RoutedType::Hint, src, 0);
    send_routed_control(shared, src, encode_hint(&h, dst_peer.id, &addrs));
}

/// Source side: relay `relay` says `dst` listens at `addrs`. Taken only from a relay that
/// carries our traffic to `dst` (held until one of its acknowledgements shows that), and
/// only for a destination we send to through relays.
fn hint_received(shared: &Shared, relay: BusId, dst: BusId, addrs: Vec<String>) {
    if !shared.config().direct_links || dst == shared.config().id || addrs.is_empty() {
        return;
    }
    let Some(r) = remote_of(shared, dst) else {
        return;
    };
    if let Some(addrs) = r.hint(relay, addrs) {
        dial_hinted(shared, dst, addrs);
    }
}

/// Dials `dst` at `addrs`, a hint that checked out, unless a link to it is up already.
fn dial_hinted(shared: &Shared, dst: BusId, addrs: Vec<String>) {
    if !shared.config().direct_links || addrs.is_empty() {
        return;
    }
    if shared.peer(dst).is_some_and(|p| !p.is_dead()) {
        return;
    }
    shared.routes.queue_dial(dst, addrs);
}

/// Relayed messages written again (after a path may have lost them) count as resent.
fn count_resent(shared: &Shared, n: u64) {
    shared.counters.msgs_resent.fetch_add(n, Relaxed);
}

/// Lets a held direct link go once nothing sent to `id` through relays is unacknowledged.
pub(crate) fn release_if_drained(shared: &Shared, id: BusId) {
    let drained = remote_of(shared, id).is_none_or(|r| r.unacked() == 0);
    if drained {
        if let Some(p) = shared.peer(id) {
            p.release();
        }
    }
}

fn report_verdict(shared: &Shared, r: &Remote, v: Verdict) {
    if let Verdict::Restarted(seqs, old) = v {
        lifecycle::give_up_on_peer(
            shared,
            r.id,
            seqs,
            format!("bus id {} restarted (incarnation {old:#x} replaced)", r.id),
            Path::Relayed,
            Some(old),
        );
    }
}

/// `addr` with an unspecified IP (0.0.0.0, [::]) replaced by the IP the relay sees the peer at
/// (`seen_at`, the remote address of its link), so that others can dial it.
fn dialable(addr: &str, seen_at: &str) -> Option<String> {
    let parsed: Addr = addr.parse().ok()?;
    let seen_ip = || match seen_at.parse().ok()? {
        Addr::Tcp(seen) | Addr::Tls(seen) => Some(seen.ip()),
        _ => None,
    };
    match parsed {
        Addr::Tcp(mut sa) if sa.ip().is_unspecified() => {
            sa.set_ip(seen_ip()?);
            Some(Addr::Tcp(sa).to_string())
        }
        Addr::Tls(mut sa) if sa.ip().is_unspecified() => {
            sa.set_ip(seen_ip()?);
            Some(Addr::Tls(sa).to_string())
        }
        _ => Some(addr.to_owned()),
    }
}

fn bumped_congestion(shared: &Shared) {
    crate::node::stats::bump(&shared.counters.relay_congested);
}

/// The messages inside a ROUTED DATA frame's inner part, their spans from the inner part's
/// start, as `message_spans` gives them; an error names what is wrong.
pub(crate) fn inner_spans(inner: &[u8]) -> Result<Vec<Span>, String> {
    let mut spans = Vec::new();
    // The ROUTED frame's own check covered these bytes on every hop: the inner checks need no
    // second look (kinds, lengths and batch entries still do).
    let mut dec = FrameDecoder::new(BODY_LEN_CEILING).skip_checks();
    let mut pos = 0;
    while pos < inner.len() {
        let (kind, len) = match dec.peek(&inner[pos..]) {
            Ok(Some(f)) => f,
            Ok(None) => return Err(format!("ROUTED DATA: truncated inner frame at {pos}")),
            Err(e) => return Err(format!("ROUTED DATA: bad inner frame: {e}")),
        };
        let body_at = pos + HEADER_LEN;
        let body = &inner[body_at..pos + len];
        if matches!(
            kind,
            FrameKind::Interest | FrameKind::Publish | FrameKind::Multicast | FrameKind::GroupLog
        ) {
            // A group's traffic goes hop by hop, each hop choosing its links: never end to end.
            return Err(format!(
                "ROUTED DATA: a {kind:?} frame inside, at {pos} (group frames travel on direct links only, as do multicasts)"
            ));
        }
        busway_core::body::message_spans(kind, body, body_at, &mut spans)
            .map_err(|what| format!("ROUTED DATA: {what}"))?;
        pos += len;
    }
    Ok(spans)
}

#[cfg(test)]
mod tests {
    use super::dialable;

    #[test]
    fn unspecified_hosts_become_the_address_the_relay_sees() {
        assert_eq!(
            dialable("tcp://0.0.0.0:7000", "tcp://10.1.2.3:5555").as_deref(),
            Some("tcp://10.1.2.3:7000")
        );
        assert_eq!(
            dialable("tcp://127.0.0.1:7000", "tcp://10.1.2.3:5555").as_deref(),
            Some("tcp://127.0.0.1:7000")
        );
        assert_eq!(
            dialable("unix:///tmp/a.sock", "unix://").as_deref(),
            Some("unix:///tmp/a.sock")
        );
        assert_eq!(dialable("tcp://[::]:7000", "unix://x"), None);
    }
}
