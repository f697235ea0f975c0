//! A member's side of a publisher's group log (see `group::log_out`): opening the log a peer
//! offers, and reading it beside that peer's ring (the ring's reader in `ring_rx` holds the
//! logs it accepted and reads them after the ring, handing their publishes to the node as if
//! they had come by the ring).

use crate::group::log_out::LOCAL_LOGS;
use busway_core::group::state::GroupName;
use busway_core::group::LogOffer;
use busway_core::BusId;
use busway_shm::announce::Announced;
use busway_shm::log::{Log, LogReader};
use busway_shm::ring::Binding;
use busway_shm::Segment;
use std::sync::Arc;

/// A log a ring's reader reads: the group and the publisher's log of it.
pub(crate) struct AttachedLog {
    pub(crate) group: GroupName,
    pub(crate) token: u64,
    /// The offer it came with (a decline names it).
    pub(crate) serial: u64,
    pub(crate) reader: LogReader,
}

/// Opens the log `from` offered, if it is the log offered (its token and its writer, `from`)
/// and no larger than `limit` bytes (`NodeConfig::shm_ring_bytes`): taken from this
/// process's own logs when the publisher runs here, else mapped read-only through
/// `/proc/PID/fd/FD`. `group` is the offer's group as the node holds it. The error says why
/// not (the caller declines, and the publishes keep coming by the link).
pub(crate) fn open(
    from: BusId,
    offer: &LogOffer<'_>,
    group: GroupName,
    limit: usize,
) -> Result<AttachedLog, String> {
    if offer.capacity > limit as u64 {
        return Err(format!(
            "log of {} bytes offered, over the {limit} bytes this node accepts (shm_ring_bytes)",
            offer.capacity
        ));
    }
    let expected = Binding {
        token: offer.token,
        writer: from.0,
        reader: 0,
    };
    let at = Announced {
        pid: offer.pid,
        fd: offer.fd,
        inode: offer.inode,
    };
    let log = match LOCAL_LOGS.find(&at, |l| l.binding() == expected, false) {
        Some(log) => log,
        // Not this process's, or not the log offered: `Log::open` says which.
        None => Segment::open_read_only_from_process(offer.pid, offer.fd, offer.inode)
            .map_err(|e| e.to_string())
            .and_then(|s| Log::open(s, &expected, limit).map_err(|e| e.to_string()))?,
    };
    if log.capacity() as u64 != offer.capacity {
        return Err(format!(
            "log of {} bytes, {} announced",
            log.capacity(),
            offer.capacity
        ));
    }
    let reader = log.reader().map_err(|e| e.to_string())?;
    Ok(AttachedLog {
        group,
        token: offer.token,
        serial: offer.serial,
        reader,
    })
}

/// A log attached to a ring's reader, as `Arc` for the reader's waiter thread.
pub(crate) type LogWatches = Arc<std::sync::Mutex<Vec<busway_shm::log::LogWatch>>>;
