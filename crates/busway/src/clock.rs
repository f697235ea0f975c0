//! The node's monotonic clock: heartbeats, round trips, deadlines and the time stamps of the
//! hot path all read it, so a test has one place to look for where a node's time comes from.
//!
//! It is tokio's clock (`tokio::time::Instant`), as are all the runtime's timers: a node whose
//! tasks run on a runtime with paused time (`IoThreads::Current` on a test's
//! `start_paused` runtime) lives in that virtual time, its timers and its clock alike. Only
//! the handshake's wall clock (`now_ms`) stays real.

use busway_core::link::Now;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Milliseconds since the Unix epoch (the handshake's clock).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One node's clock: milliseconds and microseconds since the node started.
pub(crate) struct Clock {
    /// Start of the node's monotonic clock.
    epoch: Instant,
    /// The clock in ms as of the node timer's last tick (every `TIMER_TICK_MS`):
    /// for stamps on a hot path that need no more precision (when a relayed destination was
    /// last sent to). Relaxed: a time stamp, publishing nothing.
    coarse_ms: AtomicU64,
}

impl Clock {
    /// A clock that starts now.
    pub(crate) fn start() -> Clock {
        Clock {
            epoch: Instant::now(),
            coarse_ms: AtomicU64::new(0),
        }
    }

    /// Milliseconds since the node started.
    pub(crate) fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Now, as the link state machines see it.
    pub(crate) fn now(&self) -> Now {
        Now {
            mono_us: self.epoch.elapsed().as_micros() as u64,
            wall_ms: now_ms(),
        }
    }

    /// The instant of this clock at `mono_us` (a state machine's timeout).
    pub(crate) fn instant_at(&self, mono_us: u64) -> Instant {
        self.epoch + Duration::from_micros(mono_us)
    }

    /// The clock as of the last [`Clock::tick`], without reading the system's clock.
    pub(crate) fn coarse_ms(&self) -> u64 {
        self.coarse_ms.load(Relaxed)
    }

    /// Brings the coarse clock up to now; returns now in ms.
    pub(crate) fn tick(&self) -> u64 {
        let now = self.ms();
        self.coarse_ms.store(now, Relaxed);
        now
    }
}
