//! The delay before a redial: exponential from a minimum to `DIAL_BACKOFF_MAX_MS`, reset after a
//! link was up, plus up to a quarter of jitter from a seed (the node id and incarnation), so that
//! many nodes that lost the same peer do not dial it in step.

use crate::limits::DIAL_BACKOFF_MAX_MS;
use std::time::Duration;

pub(crate) struct Backoff {
    min_ms: u64,
    next_ms: u64,
    /// xorshift64 state: never 0.
    jitter: u64,
}

impl Backoff {
    pub(crate) fn new(min_ms: u64, seed: u64) -> Self {
        Self {
            min_ms,
            next_ms: min_ms,
            jitter: seed | 1,
        }
    }

    /// A link was up: the next delay starts from the minimum again.
    pub(crate) fn reset(&mut self) {
        self.next_ms = self.min_ms;
    }

    /// The delay to wait now; the one after it doubles (up to the maximum).
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let delay = self.next_ms + self.jitter % (self.next_ms / 4 + 1);
        self.next_ms = (self.next_ms * 2).min(DIAL_BACKOFF_MAX_MS);
        Duration::from_millis(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_maximum_with_a_quarter_of_jitter_and_resets() {
        let mut b = Backoff::new(50, 7);
        let mut base = 50;
        for _ in 0..12 {
            let d = b.next_delay().as_millis() as u64;
            assert!((base..=base + base / 4).contains(&d), "{d} for {base}");
            base = (base * 2).min(DIAL_BACKOFF_MAX_MS);
        }
        b.reset();
        assert!(b.next_delay().as_millis() as u64 <= 50 + 12);
    }
}
