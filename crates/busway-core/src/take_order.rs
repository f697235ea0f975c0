//! The order in which an application takes what arrived for it: batches handed over through
//! one channel (everything a socket link read, relayed messages included) and batches it reads
//! itself from its peers' shared-memory rings.
//!
//! A peer's messages can come both ways: through the channel (relayed to this node, or written
//! again over a link's socket around a switch to a direct link) and through its ring. The peer
//! writes into its ring only what must come after messages this node acknowledged, and a
//! batch from the channel is acknowledged once it is in the channel, not once the application
//! took it. So when a ring batch is read, every channel batch it must follow is in the channel
//! already; [`TakeOrder`] takes those first. Without that, an application that alternates
//! between rings and channel (so that neither starves the other) could take a peer's later
//! messages from its ring ahead of its earlier ones still waiting in the channel.
//!
//! Sans-IO: the caller says how to look at its channel and rings ([`Sources`]); the runtime's
//! inbox and the simulated cluster (`tests/cluster.rs`) both take their batches through it.

use std::collections::VecDeque;

/// Where an application's batches come from.
pub trait Sources {
    /// What the channel carries: batches, and anything else the caller keeps there (rings
    /// handed over, wake-ups).
    type Delivery;
    /// What the application takes.
    type Batch;

    /// The channel's next delivery, if one is there now (never waits).
    fn try_channel(&mut self) -> Option<Self::Delivery>;
    /// Takes a delivery from the channel: the batch it carries, if it is one.
    fn accept(&mut self, delivery: Self::Delivery) -> Option<Self::Batch>;
    /// A batch read from the rings now, if one is ready (the caller picks which ring).
    fn poll_rings(&mut self) -> Option<Self::Batch>;
}

/// What an application has taken out of its sources and not yet returned (see the module
/// doc), and which of them goes first on the next look.
#[derive(Debug)]
pub struct TakeOrder<D, B> {
    /// What the channel held when a ring batch was read, to be taken before it.
    ahead: VecDeque<D>,
    /// The ring batch waiting behind `ahead`.
    behind: Option<B>,
    /// Whether rings go before the channel on the next look (neither starves the other).
    rings_first: bool,
}

impl<D, B> Default for TakeOrder<D, B> {
    fn default() -> Self {
        Self {
            ahead: VecDeque::new(),
            behind: None,
            rings_first: false,
        }
    }
}

impl<D, B> TakeOrder<D, B> {
    /// The next batch that is ready now, in order (see the module doc), or `None`.
    pub fn next<S>(&mut self, sources: &mut S) -> Option<B>
    where
        S: Sources<Delivery = D, Batch = B>,
    {
        if let Some(b) = self.take_ahead(sources) {
            return Some(b);
        }
        self.rings_first = !self.rings_first;
        if self.rings_first {
            if let Some(b) = self.from_rings(sources) {
                return Some(b);
            }
        }
        while let Some(d) = sources.try_channel() {
            if let Some(b) = sources.accept(d) {
                return Some(b);
            }
        }
        self.from_rings(sources)
    }

    /// A batch from the rings, behind whatever the channel holds now.
    pub fn from_rings<S>(&mut self, sources: &mut S) -> Option<B>
    where
        S: Sources<Delivery = D, Batch = B>,
    {
        let b = sources.poll_rings()?;
        // Drained to its end once, now: what arrives later need not go first, and must not
        // hold the ring batch back without bound.
        while let Some(d) = sources.try_channel() {
            self.ahead.push_back(d);
        }
        if self.ahead.is_empty() {
            return Some(b);
        }
        self.behind = Some(b);
        self.take_ahead(sources)
    }

    /// What was put ahead of a ring batch, then that batch.
    fn take_ahead<S>(&mut self, sources: &mut S) -> Option<B>
    where
        S: Sources<Delivery = D, Batch = B>,
    {
        while let Some(d) = self.ahead.pop_front() {
            if let Some(b) = sources.accept(d) {
                return Some(b);
            }
        }
        self.behind.take()
    }

    /// Everything taken from the channel and not returned yet (when the application goes).
    pub fn drain_ahead(&mut self) -> impl Iterator<Item = D> + '_ {
        self.ahead.drain(..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel of (source, number) batches, and one ring.
    #[derive(Default)]
    struct Fake {
        channel: VecDeque<(char, u32)>,
        ring: VecDeque<(char, u32)>,
    }

    impl Sources for Fake {
        type Delivery = (char, u32);
        type Batch = (char, u32);
        fn try_channel(&mut self) -> Option<(char, u32)> {
            self.channel.pop_front()
        }
        fn accept(&mut self, d: (char, u32)) -> Option<(char, u32)> {
            // 'w' stands for a wake-up: no batch.
            (d.0 != 'w').then_some(d)
        }
        fn poll_rings(&mut self) -> Option<(char, u32)> {
            self.ring.pop_front()
        }
    }

    #[test]
    fn a_ring_batch_goes_behind_what_the_channel_held_when_it_was_read() {
        let mut order = TakeOrder::default();
        let mut s = Fake::default();
        s.channel.extend([('a', 1), ('w', 0), ('a', 2)]);
        s.ring.push_back(('a', 3));
        // Rings are looked at first on the first look.
        assert_eq!(order.next(&mut s), Some(('a', 1)));
        // Arrived after the ring batch was read: behind it.
        s.channel.push_back(('a', 4));
        assert_eq!(order.next(&mut s), Some(('a', 2)));
        assert_eq!(order.next(&mut s), Some(('a', 3)));
        assert_eq!(order.next(&mut s), Some(('a', 4)));
        assert_eq!(order.next(&mut s), None);
    }

    #[test]
    fn rings_and_channel_take_turns_when_both_have_batches() {
        let mut order = TakeOrder::default();
        let mut s = Fake::default();
        s.ring.extend([('r', 1), ('r', 2)]);
        assert_eq!(order.next(&mut s), Some(('r', 1)));
        s.channel.push_back(('c', 1));
        assert_eq!(order.next(&mut s), Some(('c', 1)), "the channel's turn");
        assert_eq!(order.next(&mut s), Some(('r', 2)));
    }
}
