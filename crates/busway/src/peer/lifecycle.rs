//! A peer's life as its links come and go: a link attached to its peer (a new peer, or a new
//! incarnation replacing the old), ready for traffic, detached with the peer's deadline
//! armed, and the peer given up on. What each step means to the other parts (registrations,
//! groups, calls, events) is told to them here.

use crate::group::{groups, host};
use crate::link::dial::Dial;
use crate::node::event::{DownReason, Event, Path};
use crate::peer::table::Attached;
use crate::peer::Peer;
use crate::route::registrations;
use crate::shared::Shared;
use busway_core::handshake::{Established, Hello};
use busway_core::BusId;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// busway gave up on `peer` itself (down past its deadline, or restarted): the messages
/// `seqs` held for it are reported, and every call to it fails with `reason` (a reply
/// cannot come, even to a request it had received).
pub(crate) fn give_up_on_peer(
    shared: &Shared,
    peer: BusId,
    seqs: std::ops::Range<u64>,
    reason: String,
    path: Path,
    incarnation: Option<u64>,
) {
    shared.calls.fail_peer(peer, &reason);
    groups::group_peer_gone(shared, peer, path);
    if path == Path::Direct {
        registrations::downstream_gone(shared, peer);
    }
    shared.report_undeliverable(peer, seqs, reason, path, incarnation);
}

/// Where sequence numbers resume with this (not yet authenticated) peer: read only, so an
/// unauthenticated HELLO changes nothing.
pub(crate) fn resume_point(shared: &Shared, hello: &Hello) -> (u64, u64) {
    match shared.peer(hello.bus_id) {
        Some(p) if p.incarnation() == hello.incarnation => p.resume_point(),
        _ => (0, 0),
    }
}

/// Why a link from `hello` (not yet authenticated) would be refused when attached: its bus id
/// is up here from another incarnation. Told in the handshake, before either end counts the
/// link up, so the dialer learns it as a refused handshake (it came up, then closed, before);
/// `attach_peer` checks again under the table's lock. Returns what the peer is told, which
/// says no more than that to a stranger (not which process holds the id, nor from where), and
/// what this node reports, which names both incarnations.
pub(crate) fn id_in_use(shared: &Shared, hello: &Hello) -> Option<(String, String)> {
    let old = shared.peer(hello.bus_id)?;
    let (id, held, claimed) = (hello.bus_id, old.incarnation(), hello.incarnation);
    (old.is_up() && held != claimed).then(|| {
        let told = format!("bus id {id} is already connected from another process");
        let here = format!(
            "bus id {id} is already connected from another incarnation ({held:#x}; this one is {claimed:#x})"
        );
        (told, here)
    })
}

/// Attaches an authenticated link to its peer, creating the peer or replacing a previous
/// incarnation (whose unacknowledged messages are then reported undeliverable). Refuses a
/// second link to an id that is up, naming both incarnations.
pub(crate) fn attach_peer(
    shared: &Shared,
    est: &Established,
    addr: &str,
    link: u64,
    dial: Dial,
) -> Result<Arc<Peer>, String> {
    if shared.is_shutting_down() {
        return Err("this node is shutting down".into());
    }
    let id = est.peer.bus_id;
    if let Some(max) = est
        .peer
        .frame_body_max
        .filter(|&m| m < crate::limits::FRAME_BODY_MIN_BYTES as u64)
    {
        // Every node takes a relayed chunk of small messages; one that says it cannot would
        // make every relayed stream toward it fail.
        return Err(format!(
            "bus id {id} states a frame body limit of {max} bytes, under the {} bytes every node must accept",
            crate::limits::FRAME_BODY_MIN_BYTES
        ));
    }
    let make = || {
        Peer::new(
            est.peer.clone(),
            addr.to_owned(),
            shared.config().send_queue_bytes_max,
            matches!(dial, Dial::Direct(_)),
        )
    };
    let registers = est.peer.downstream_of_you;
    let Attached { peer, replaced } = shared.peers.attach(
        shared.config().id,
        id,
        est.peer.incarnation,
        registers,
        || shared.routes.registered_below(),
        make,
    )?;
    if let Some(old) = replaced {
        shared.routes.forget_registrations(id);
        if shared.upstream_id() == Some(id) {
            registrations::upstream_replaced(shared);
        }
        let seqs = old.fail_all();
        give_up_on_peer(
            shared,
            id,
            seqs,
            format!(
                "bus id {id} restarted (incarnation {:#x} replaced by {:#x})",
                old.incarnation(),
                est.peer.incarnation
            ),
            Path::Direct,
            Some(old.incarnation()),
        );
    }
    let resent = peer.attach(link, est, addr)?;
    shared.counters.msgs_resent.fetch_add(resent, Relaxed);
    Ok(peer)
}

/// A link attached by `attach_peer` is ready for traffic (see `link::run`): it becomes
/// the upstream if dialed so, and waiters for peers hear of it.
pub(crate) fn peer_ready(shared: &Shared, peer: &Peer, dial: Dial) {
    if dial == Dial::Upstream {
        shared.peers.set_upstream(peer.id);
        registrations::upstream_came(shared, peer);
    }
    // A new peer (or a new incarnation) learns what this node wants through it, and the
    // receivers of this node's multicasts behind it where their streams stand.
    shared.group.peer_came(peer.id);
    host::sync_group_adverts(shared);
    host::multicast_link_up(shared, peer.id);
    shared.peers.notify_changed();
}

/// Detaches a link that went down, reports it, and arms the peer's deadline.
pub(crate) fn detach_peer(shared: &Arc<Shared>, peer: &Arc<Peer>, link: u64, reason: DownReason) {
    let Some((epoch, unacked)) = peer.detach(link) else {
        return;
    };
    // A peer that shut down will not come back as this incarnation: nothing to wait for.
    let (deadline, why) = if reason == DownReason::PeerShutDown {
        (Duration::ZERO, format!("bus id {} shut down", peer.id))
    } else {
        let after = shared.config().peer_dead_after_ms;
        let why = format!("bus id {} stayed down for {after} ms", peer.id);
        (Duration::from_millis(after), why)
    };
    tracing::debug!(peer = %peer.id, %reason, unacked, "link down");
    shared.emit(Event::PeerDown {
        peer: peer.id,
        reason,
        unacked,
    });
    shared.peers.notify_changed();
    let node = shared.clone();
    let peer = peer.clone();
    // A link task dropped with its runtime (the node going away) has no runtime to arm a
    // timer on, and needs none: nothing will be sent any more.
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    shared.links.spawn(async move {
        tokio::time::sleep(deadline).await;
        if let Some(seqs) = peer.expire(epoch, node.clock_ms()) {
            give_up_on_peer(
                &node,
                peer.id,
                seqs,
                why,
                Path::Direct,
                Some(peer.incarnation()),
            );
        }
    });
}
