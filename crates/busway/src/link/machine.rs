//! What the three parts of a link task (handshake and timers, reader, writer) share: the lock
//! around the link's state machine, and how its verdicts become a `DownReason`.

use crate::node::event::DownReason;
use crate::node::stats::bump;
use crate::shared::Shared;
use busway_core::link::{Link, LinkError};
use busway_core::{BusId, DecodeError};
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
