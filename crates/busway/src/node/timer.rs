//! The node's one timer. Every `TIMER_TICK_MS` it brings the node's coarse clock up to date
//! and runs the periodic work each part registered when the node started ([`Periodic`]), in
//! the order registered. A part's timers are its own; the timer calls none of them by name.

use crate::limits::TIMER_TICK_MS;
use crate::shared::Shared;
use std::sync::Arc;
use std::time::Duration;

/// One part's periodic work: `run(node, now_ms)`, every `every_ms` (at most once a tick).
pub(crate) struct Periodic {
    /// What the work is, for the reader of a list of them.
    pub(crate) name: &'static str,
    /// How often, in milliseconds (0: every tick).
    pub(crate) every_ms: u64,
    /// The work, given the node and the clock's time of this tick in ms.
    pub(crate) run: fn(&Shared, u64),
}

/// Runs `work` on the node's timer until the node shuts down.
pub(crate) async fn run(shared: Arc<Shared>, work: Vec<Periodic>) {
    let mut tick = tokio::time::interval(Duration::from_millis(TIMER_TICK_MS));
    // A tick late (a busy machine) is not made up for in a burst.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due_ms = vec![0; work.len()];
    loop {
        tick.tick().await;
        if shared.is_shutting_down() {
            return;
        }
        // The coarse clock is read by sends (a clock read per send would cost more than the
        // send's own work).
        let now = shared.clock.tick();
        for (w, due) in work.iter().zip(&mut due_ms) {
            if now >= *due {
                *due = now + w.every_ms;
                tracing::trace!(work = w.name, now, "timer");
                (w.run)(&shared, now);
            }
        }
    }
}
