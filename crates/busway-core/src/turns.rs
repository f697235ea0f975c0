//! Deliveries handed over in the order of the turns (tickets) under which they were decided.
//!
//! Several threads decide about a member's streams, each under the lock of the state it
//! changes; a decision that delivers takes the next ticket under that lock, so the tickets of
//! one stream follow its decisions. What each thread then decided is handed over here as a
//! segment of consecutive tickets: a segment whose first ticket is next goes at once, with
//! the segments that waited for it; one whose turn has not come waits. No thread waits for
//! another: the one whose turn it is hands over what others left. Sans-IO: the runtime's
//! `handover` holds a `Turns` behind a lock and hands what comes out to the inbox.

use std::collections::BTreeMap;

/// The next ticket to hand over, and the segments that wait for it.
#[derive(Debug)]
pub struct Turns<T> {
    /// The first ticket not handed over yet.
    next: u64,
    /// By first ticket: the last ticket and the items of a segment that waits. Unbounded by
    /// count: a ticket's holder hands over before it decides anything else, so this holds
    /// what others decided meanwhile (the runtime counts their bytes where its links look).
    waiting: BTreeMap<u64, (u64, Vec<T>)>,
}

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Self {
            next: 0,
            waiting: BTreeMap::new(),
        }
    }
}

impl<T> Turns<T> {
    /// The items decided under tickets `first..=last` are ready: hands to `deliver`, in ticket
    /// order, every item whose turn has come (these, and what waited behind them), or keeps
    /// them for their turn.
    pub fn ready(&mut self, first: u64, last: u64, items: Vec<T>, mut deliver: impl FnMut(T)) {
        if first != self.next {
            // Earlier tickets are still being decided on: their holder hands these over.
            self.waiting.insert(first, (last, items));
            return;
        }
        let (mut last, mut items) = (last, items);
        loop {
            // Moved on first: a `deliver` that panics loses these items, not every later turn.
            self.next = last + 1;
            items.into_iter().for_each(&mut deliver);
            match self.waiting.remove(&self.next) {
                Some((l, i)) => (last, items) = (l, i),
                None => return,
            }
        }
    }

    /// Whether no segment waits for its turn.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(t: &mut Turns<u32>, first: u64, last: u64, items: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        t.ready(first, last, items.to_vec(), |i| out.push(i));
        out
    }

    #[test]
    fn segments_go_in_ticket_order_whoever_is_ready_first() {
        let mut t = Turns::default();
        assert_eq!(
            ready(&mut t, 2, 3, &[20, 30]),
            Vec::<u32>::new(),
            "0 and 1 not yet"
        );
        assert_eq!(ready(&mut t, 1, 1, &[10]), Vec::<u32>::new());
        assert!(!t.is_idle());
        // Ticket 0 decided nothing to deliver: it still lets the others go.
        assert_eq!(ready(&mut t, 0, 0, &[]), vec![10, 20, 30]);
        assert!(t.is_idle());
        assert_eq!(ready(&mut t, 4, 4, &[40]), vec![40]);
        assert_eq!(ready(&mut t, 6, 6, &[60]), Vec::<u32>::new());
        assert_eq!(ready(&mut t, 5, 5, &[50]), vec![50, 60]);
    }

    proptest::proptest! {
        /// Segments of tickets 0..n made ready in any order come out once each, in order.
        #[test]
        fn any_order_of_readiness_delivers_in_ticket_order(
            sizes in proptest::collection::vec(1u64..4, 1..40),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let mut segments = Vec::new();
            let mut first = 0;
            for s in sizes {
                segments.push((first, first + s - 1));
                first += s;
            }
            // A shuffle by the seed (any order a set of threads could be ready in).
            let mut rng = crate::sim::SimRng::new(seed);
            for i in (1..segments.len()).rev() {
                segments.swap(i, rng.below(i as u64 + 1) as usize);
            }
            // A segment starting at a multiple of 3 decided nothing to deliver.
            let items = |f: u64, l: u64| if f % 3 == 0 { Vec::new() } else { (f..=l).collect() };
            let mut t = Turns::default();
            let mut out = Vec::new();
            for &(f, l) in &segments {
                t.ready(f, l, items(f, l), |i| out.push(i));
            }
            segments.sort_unstable();
            let want: Vec<u64> = segments.iter().flat_map(|&(f, l)| items(f, l)).collect();
            proptest::prop_assert_eq!(out, want);
            proptest::prop_assert!(t.is_idle());
        }
    }
}
