//! What the three parts of a link task (handshake and timers, reader, writer) share: the lock
//! around the link's state machine, and how its verdicts become a `DownReason`; and the task
//! that runs the machine's timers once the link is up.

use crate::node::event::DownReason;
use crate::node::stats::bump;
use crate::peer::Peer;
use crate::shared::Shared;
use busway_core::link::{Link, LinkError, LinkEvent};
use busway_core::{BusId, DecodeError};
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

/// The machine, for one short step (never held across an await).
pub(super) fn lock(link: &Mutex<Link>) -> MutexGuard<'_, Link> {
    // A panic while holding this lock leaves the machine as it was; keep going.
    link.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a link went down, from what its machine reported; counts it.
pub(super) fn down_reason(shared: &Shared, peer: BusId, e: LinkError) -> DownReason {
    let c = &shared.counters;
    match e {
        LinkError::Silent { .. } => {
            bump(&c.heartbeat_timeouts);
            DownReason::Timeout(e.to_string())
        }
        LinkError::Frame(d) => {
            bump(&c.protocol_errors);
            match d {
                DecodeError::ChecksumMismatch { .. } | DecodeError::ContentCheckMismatch { .. } => {
                    bump(&c.checksum_failures)
                }
                DecodeError::BodyTooLong { .. } => bump(&c.oversize_frames),
                DecodeError::UnknownKind { .. } => {}
            }
            tracing::warn!(%peer, error = %d, "closing link: bad frame");
            DownReason::ProtocolError(d.to_string())
        }
        other => {
            bump(&c.protocol_errors);
            let what = other.to_string();
            tracing::warn!(%peer, %what, "closing link: protocol error");
            DownReason::ProtocolError(what)
        }
    }
}

/// Runs the machine's timers (a PING each heartbeat interval, the end of a silent peer);
/// returns why the link must end.
#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
pub(super) fn timers<'a>(
    shared: &'a Shared,
    peer: &'a Peer,
    machine: &'a Mutex<Link>,
) -> impl Future<Output = DownReason> + 'a {
    async move {
        loop {
            let Some(at_us) = lock(machine).poll_timeout() else {
                return std::future::pending().await;
            };
            tokio::time::sleep_until(shared.instant_at(at_us)).await;
            let mut m = lock(machine);
            m.handle_timeout(shared.now());
            while let Some(frame) = m.poll_transmit() {
                peer.push_control(frame);
            }
            // A timeout makes no event but `Lost`; events the reader has yet to take (one left
            // from the handshake, e.g. `OfferRing`) stay for it unless the link is over.
            if m.is_closed() {
                while let Some(e) = m.poll_event() {
                    if let LinkEvent::Lost(error) = e {
                        return down_reason(shared, peer.id, error);
                    }
                }
            }
        }
    }
}
