//! Registrations along the tree (rules in `busway_core::registry`): what this node's
//! downstreams registered with it, and what it registered with its upstream in their name.
//!
//! A node with an upstream registers there every range its live downstreams stand for (each
//! one's HELLO range and what each registered in turn) that its own HELLO range does not
//! hold, as they come and go, with REGISTER control frames. A frame goes up in the name of an
//! id only once the upstream answered that id's range ([`gate_up`]); a downstream's
//! link is read only once the upstream answered its range, or `REGISTER_WAIT_MS` passed. A
//! refused registration is logged with its reason, counted, retried after
//! `REGISTER_RETRY_MS`, and closes no link.

use crate::limits::{FORWARD_WAIT_MS, REGISTER_WAIT_MS};
use crate::node::stats::bump;
use crate::peer::Peer;
use crate::shared::Shared;
use busway_core::frame::{frame_bytes, FrameKind};
use busway_core::handshake::caps;
use busway_core::registry::{Answered, Gate, IdRange, RegisterOp};
use busway_core::BusId;
use std::time::Duration;

/// Why downstream `asker` (its HELLO range `own`) may not ADD `op`'s range here, as far as
/// the neighbors go (see `Registry::add` for the rest): it overlaps its own HELLO range or
/// another live neighbor's, or holds this node's upstream (which no downstream serves).
/// (Like a HELLO range, it may hold the id of a plain neighbor: a member below a relay may
/// also have a direct link here, dialed on a hint.)
fn clash(
    op: &RegisterOp,
    own: IdRange,
    asker: BusId,
    neighbors: &[busway_core::relay::Neighbor],
    upstream: Option<BusId>,
) -> Option<String> {
    let RegisterOp::Add { range, .. } = *op else {
        return None;
    };
    let overlaps = |r: IdRange| r.0 <= range.1 && range.0 <= r.1;
    let what = format!("bus id {asker} registers bus ids {}..={}", range.0, range.1);
    if overlaps(own) {
        return Some(format!(
            "{what}, which overlaps its own HELLO range {}..={}",
            own.0, own.1
        ));
    }
    if let Some(up) = upstream.filter(|&up| overlaps((up, up))) {
        return Some(format!("{what}, which holds this node's upstream {up}"));
    }
    neighbors.iter().filter(|n| n.id != asker).find_map(|n| {
        let r = n.serves.filter(|&r| overlaps(r))?;
        Some(format!(
            "{what}, which overlaps bus ids {}..={} bus id {} declared",
            r.0, r.1, n.id
        ))
    })
}

fn register_frame(op: &RegisterOp) -> bytes::Bytes {
    frame_bytes(FrameKind::Register, &op.encode())
}

/// The range this node's own HELLO declares to its upstream.
fn own_range(shared: &Shared) -> IdRange {
    let me = shared.config().id;
    shared.config().subtree.unwrap_or((me, me))
}

/// Whether a frame in the name of `id` may go to the upstream now (see
/// `Upward::gate`): this node's own ids pass, others once registered there.
pub(crate) fn gate_up(shared: &Shared, id: BusId) -> Gate {
    let (lo, hi) = own_range(shared);
    if id == shared.config().id || (lo <= id && id <= hi) {
        return Gate::Pass;
    }
    let st = shared.routes.registrations.up();
    if !st.upstream_registers {
        return Gate::Refused(
            "the upstream takes no registrations (an older busway): only this node's own ids go up"
                .into(),
        );
    }
    st.upward.gate(id)
}

/// Whether a frame of `speaker` (a publisher, a multicast source) may go to the peer
/// `to`: anywhere but up, and up only once the upstream holds its range for us.
pub(crate) fn may_pass_to(shared: &Shared, to: BusId, speaker: BusId) -> bool {
    shared.upstream_id() != Some(to) || gate_up(shared, speaker) == Gate::Pass
}

/// Like [`gate_up`], waiting up to `FORWARD_WAIT_MS` (a relay's wait for room)
/// for an answer on its way; the error says why the frame may not go up.
pub(crate) async fn wait_gate_up(shared: &Shared, id: BusId) -> Result<(), String> {
    match gate_up_within(shared, id, Duration::from_millis(FORWARD_WAIT_MS)).await {
        Gate::Pass => Ok(()),
        Gate::Refused(why) => Err(why),
        Gate::Wait => Err(format!(
            "the registration of bus id {id} with the upstream is not answered yet"
        )),
    }
}

/// [`gate_up`] once it is not `Wait`, or after `wait`.
async fn gate_up_within(shared: &Shared, id: BusId, wait: Duration) -> Gate {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let notified = shared.routes.registrations.answered.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let gate = gate_up(shared, id);
        if gate != Gate::Wait || tokio::time::timeout_at(deadline, notified).await.is_err() {
            return gate;
        }
    }
}

/// A REGISTER frame came over the link to `peer`.
pub(crate) fn register_received(shared: &Shared, peer: &Peer, op: RegisterOp) {
    if let RegisterOp::Answer { version, refused } = op {
        if shared.upstream_id() == Some(peer.id) {
            upward_answered(shared, version, refused);
        }
        // An answer from anyone else answers nothing this node asked: ignored.
        return;
    }
    let me = shared.config().id;
    let declared = peer.neighbor().serves;
    let upstream = shared.upstream_id();
    let (RegisterOp::Add { version, .. } | RegisterOp::Remove { version, .. }) = op else {
        unreachable!("answers returned above")
    };
    let refuse = |why: String| RegisterOp::Answer {
        version,
        refused: Some(why),
    };
    let answer = match declared {
        _ if upstream == Some(peer.id) => refuse(format!(
            "bus id {} is the upstream of bus id {me}, not a downstream",
            peer.id
        )),
        None => refuse(format!(
            "bus id {} is not a downstream of bus id {me} (it declared no range in its HELLO)",
            peer.id
        )),
        Some(own) => {
            // Checked and applied under the peer table's lock, which a HELLO's range is
            // checked under too: the two cannot both take the same ids.
            let (answer, changed) = shared.peers.with_neighbors(|neighbors| {
                let clash = match op {
                    RegisterOp::Add { .. } => clash(&op, own, peer.id, neighbors, upstream),
                    _ => None,
                };
                match clash {
                    Some(why) => (refuse(why), false),
                    None => shared
                        .routes
                        .registrations
                        .change_below(|r| r.apply(me, peer.id, &op, None)),
                }
            });
            if changed {
                sync_upward(shared);
            }
            answer
        }
    };
    if let RegisterOp::Answer {
        refused: Some(why), ..
    } = &answer
    {
        bump(&shared.counters.registrations_refused);
        tracing::debug!(peer = %peer.id, %why, "registration refused");
    }
    peer.push_control(register_frame(&answer));
}

fn upward_answered(shared: &Shared, version: u64, refused: Option<String>) {
    let now = shared.clock_ms();
    let answered = shared
        .routes
        .registrations
        .up()
        .upward
        .answered(version, refused, now);
    if let Answered::Refused((lo, hi), why) = answered {
        bump(&shared.counters.registrations_refused_upstream);
        tracing::warn!(%lo, %hi, %why, "the upstream refused a registration; frames in the name of those ids do not go up");
    }
    shared.routes.registrations.answered.notify_waiters();
}

/// Brings what this node asked of its upstream in line with what its downstreams stand
/// for now, and sends the REMOVEs whose earlier messages were acknowledged.
pub(crate) fn sync_upward(shared: &Shared) {
    let Some(up_id) = shared.config().upstream.as_ref().and(shared.upstream_id()) else {
        return;
    };
    let Some(upstream) = shared.peer(up_id) else {
        return;
    };
    let own = own_range(shared);
    let below = shared.routes.registrations.below();
    let mut wanted = Vec::new();
    for p in shared.peers_snapshot() {
        if p.id == up_id {
            continue;
        }
        let Some(declared) = p.neighbor().serves else {
            continue;
        };
        for r in std::iter::once(declared).chain(below.ranges_of(p.id)) {
            if !(own.0 <= r.0 && r.1 <= own.1) {
                wanted.push(r);
            }
        }
    }
    drop(below);
    let (acked, queued) = upstream.sent_point();
    let now = shared.clock_ms();
    let mut st = shared.routes.registrations.up();
    if !st.upstream_registers {
        // An upstream that would close the link on a REGISTER: nothing is asked, and
        // nothing goes up in a downstream's name (`gate_up`).
        return;
    }
    let mut ops = st.upward.sync(wanted, queued, now);
    ops.extend(st.upward.removals_due(acked));
    // Queued under the lock: ops reach the link in the order they are numbered in (the
    // upstream answers in that order, and applies them in it).
    for op in &ops {
        upstream.push_control(register_frame(op));
    }
}

/// A link to the upstream came up, before anything is written on it: a new incarnation
/// holds nothing of ours (ask it all again); the same one gets first the ops not
/// answered yet and an ADD of every range held (it may have given this node up and
/// forgotten them meanwhile), ahead of anything else on the link.
pub(crate) fn upstream_came(shared: &Shared, upstream: &Peer) {
    let this = (upstream.id, upstream.incarnation());
    let registers = upstream.lock().intro.capabilities & caps::REGISTER != 0;
    {
        let mut st = shared.routes.registrations.up();
        st.upstream_registers = registers;
        if st.asked_of != Some(this) {
            st.upward.reset();
            st.asked_of = Some(this);
        }
        if registers {
            for op in &st.upward.relink() {
                upstream.push_control(register_frame(op));
            }
        }
    }
    sync_upward(shared);
    shared.routes.registrations.answered.notify_waiters();
}

/// The upstream came back as another incarnation: nothing goes up in a downstream's name
/// until the new one answered (from before its link is attached, see `attach_peer`).
pub(crate) fn upstream_replaced(shared: &Shared) {
    let mut st = shared.routes.registrations.up();
    st.upward.reset();
    st.asked_of = None;
}

/// A downstream's link came up: its range is registered upward, and its link waits (at
/// most `REGISTER_WAIT_MS`) until the upstream answered, so that what it sends first
/// can go up.
pub(crate) async fn downstream_came(shared: &Shared, peer: &Peer) {
    let Some((lo, _)) = peer.neighbor().serves else {
        return;
    };
    if shared.upstream_id().is_none_or(|u| u == peer.id) {
        return;
    }
    sync_upward(shared);
    gate_up_within(shared, lo, Duration::from_millis(REGISTER_WAIT_MS)).await;
}

/// A downstream was given up, or came back as another incarnation: what it registered
/// is forgotten, and taken back upstream.
pub(crate) fn downstream_gone(shared: &Shared, id: BusId) {
    shared.routes.registrations.forget(id);
    sync_upward(shared);
}

/// Whether the registrations have timed work (removals waiting for acknowledgements,
/// refused ranges to ask again): `sync_upward` on the tick then.
pub(crate) fn registrations_tick(shared: &Shared) {
    if shared.routes.registrations.up().upward.has_timed_work() {
        sync_upward(shared);
    }
}
