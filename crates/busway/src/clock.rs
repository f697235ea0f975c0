//! The node's monotonic clock: heartbeats, round trips, deadlines and the time stamps of the
//! hot path all read it, so a test has one place to look for where a node's time comes from.
//!
//! A node whose tasks run on the caller's runtime (`IoThreads::Current`) reads that runtime's
//! clock (`tokio::time::Instant`), as its timers do: under a test's paused time
//! (`start_paused`) it lives in that virtual time, its timers and its clock alike. A node on
//! threads of its own reads the system's monotonic clock, as its threads' timers do, whatever
//! the runtime that started it. Only the handshake's wall clock (`now_ms`) is always real.

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
    /// Start of the node's monotonic clock, on the system's clock.
    epoch: std::time::Instant,
    /// The same on the caller's runtime's clock, for a node whose tasks run there.
    runtime_epoch: Option<Instant>,
    /// The clock in ms as of the node timer's last tick (every `TIMER_TICK_MS`):
    /// for stamps on a hot path that need no more precision (when a relayed destination was
    /// last sent to). Relaxed: a time stamp, publishing nothing.
    coarse_ms: AtomicU64,
}

impl Clock {
    /// A clock that starts now: on the runtime's clock if the node's tasks run on the
    /// runtime that starts it (`follows_runtime`), else on the system's.
    pub(crate) fn start(follows_runtime: bool) -> Clock {
        Clock {
            epoch: std::time::Instant::now(),
            runtime_epoch: follows_runtime.then(Instant::now),
            coarse_ms: AtomicU64::new(0),
        }
    }

    /// Time since the node started.
    fn elapsed(&self) -> Duration {
        match self.runtime_epoch {
            Some(e) => e.elapsed(),
            None => self.epoch.elapsed(),
        }
    }

    /// Milliseconds since the node started.
    pub(crate) fn ms(&self) -> u64 {
        self.elapsed().as_millis() as u64
    }

    /// Now, as the link state machines see it.
    pub(crate) fn now(&self) -> Now {
        Now {
            mono_us: self.elapsed().as_micros() as u64,
            wall_ms: now_ms(),
        }
    }

    /// The instant of this clock at `mono_us` (a state machine's timeout), for the timers of
    /// the node's tasks.
    pub(crate) fn instant_at(&self, mono_us: u64) -> Instant {
        let at = Duration::from_micros(mono_us);
        match self.runtime_epoch {
            Some(e) => e + at,
            None => Instant::from_std(self.epoch + at),
        }
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
