//! Deliveries handed over in the order of the turns (tickets) under which they were decided.
//!
//! Several threads decide about a member's streams, each under the lock of the state it
//! changes; a decision that delivers takes the next ticket under that lock, so the tickets of
//! one stream follow its decisions. What each thread then decided is handed over here as a
//! segment of consecutive tickets: a segment whose first ticket is next goes at once, with
//! the segments that waited for it; one whose turn has not come waits. No thread waits for
//! another: the one whose turn it is hands over what others left. Sans-IO: the runtime's
//! `handover` gives the tickets, builds each read's [`Decided`] and holds a `Turns` behind a
//! lock, handing what comes out to the inbox.

use crate::BusId;
use bytes::Bytes;
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

/// A batch of deliveries to an application: messages of one source, and of one group (`None`
/// for multicasts), in their stream's order. The host's own type (the runtime's
/// `MessageBatch`).
pub trait Batch: Sized {
    /// The messages at `spans` of `chunk`, from `src` to `group`.
    fn of_spans(src: BusId, group: Option<&str>, chunk: &Bytes, spans: Vec<(u32, u32)>) -> Self;
    /// One message from `src` to `group` that waited (a buffer of its own).
    fn of_payload(src: BusId, group: Option<&str>, payload: Bytes) -> Self;
    /// Whether the batch holds messages of `src` to `group`.
    fn is_of(&self, src: BusId, group: Option<&str>) -> bool;
    /// Appends the message at `span` of the batch's buffer.
    fn push_span(&mut self, span: (u32, u32));
}

/// Batches decided under tickets `first..=last`, handed over together.
#[derive(Debug)]
pub struct Segment<B> {
    /// The first ticket.
    pub first: u64,
    /// The last ticket.
    pub last: u64,
    /// What was decided under them, in order.
    pub batches: Vec<B>,
}

/// What one read (or one timer tick) decides to deliver, in order, by segments of
/// consecutive tickets: runs of spans in the chunk at hand share its buffer; messages that
/// waited are batches of their own.
#[derive(Debug)]
pub struct Decided<B> {
    segments: Vec<Segment<B>>,
    /// Whether the last batch holds spans of the chunk at hand (only then may it grow).
    last_is_span: bool,
}

impl<B> Default for Decided<B> {
    fn default() -> Self {
        Self {
            segments: Vec::new(),
            last_is_span: false,
        }
    }
}

impl<B: Batch> Decided<B> {
    /// What is added from now on was decided under `ticket` (the next one the host gave).
    pub fn turn(&mut self, ticket: u64) {
        match self.segments.last_mut() {
            // No one took a ticket since this read's last: one segment, and its last batch may grow.
            Some(s) if s.last + 1 == ticket => s.last = ticket,
            _ => {
                self.segments.push(Segment {
                    first: ticket,
                    last: ticket,
                    batches: Vec::new(),
                });
                self.last_is_span = false;
            }
        }
    }

    /// Whether the read decided under a ticket.
    pub fn has_turn(&self) -> bool {
        !self.segments.is_empty()
    }

    fn batches(&mut self) -> &mut Vec<B> {
        &mut self
            .segments
            .last_mut()
            .expect("a delivery decided under a turn")
            .batches
    }

    /// The message at `span` of `chunk`, from `src` to `group`, next in its stream.
    pub fn span(&mut self, src: BusId, group: Option<&str>, chunk: &Bytes, span: (u32, u32)) {
        let grows = self.last_is_span;
        let batches = self.batches();
        match batches.last_mut() {
            Some(b) if grows && b.is_of(src, group) => b.push_span(span),
            _ => batches.push(B::of_spans(src, group, chunk, vec![span])),
        }
        self.last_is_span = true;
    }

    /// Publishes of `src` to `group` at `spans` of `chunk`, next in their stream, as one
    /// batch.
    pub fn run(&mut self, src: BusId, group: &str, chunk: &Bytes, spans: Vec<(u32, u32)>) {
        let batch = B::of_spans(src, Some(group), chunk, spans);
        self.batches().push(batch);
        self.last_is_span = false;
    }

    /// Messages of `src` to `group` that waited, each a batch of its own.
    pub fn payloads(&mut self, src: BusId, group: Option<&str>, payloads: Vec<Bytes>) {
        if payloads.is_empty() {
            return;
        }
        let batches = self.batches();
        batches.extend(payloads.into_iter().map(|p| B::of_payload(src, group, p)));
        self.last_is_span = false;
    }

    /// Whether anything is to be delivered.
    pub fn any(&self) -> bool {
        self.segments.iter().any(|s| !s.batches.is_empty())
    }

    /// The segments decided, to hand over (see [`Turns::ready`]).
    pub fn take(&mut self) -> Vec<Segment<B>> {
        std::mem::take(&mut self.segments)
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

    /// A batch of (source, numbers) for the tests: a span's start is its number.
    #[derive(Debug, PartialEq)]
    struct Numbers(BusId, Vec<u32>);

    impl Batch for Numbers {
        fn of_spans(src: BusId, _: Option<&str>, _: &Bytes, spans: Vec<(u32, u32)>) -> Self {
            Numbers(src, spans.iter().map(|s| s.0).collect())
        }
        fn of_payload(src: BusId, _: Option<&str>, p: Bytes) -> Self {
            Numbers(src, vec![p[0] as u32])
        }
        fn is_of(&self, src: BusId, _: Option<&str>) -> bool {
            self.0 == src
        }
        fn push_span(&mut self, span: (u32, u32)) {
            self.1.push(span.0);
        }
    }

    fn handed(turns: &mut Turns<Numbers>, decided: &mut Decided<Numbers>) -> Vec<Numbers> {
        let mut out = Vec::new();
        for s in decided.take() {
            turns.ready(s.first, s.last, s.batches, |b| out.push(b));
        }
        out
    }

    #[test]
    fn one_read_s_consecutive_tickets_share_a_batch() {
        let (chunk, src) = (Bytes::new(), BusId(1));
        let mut d = Decided::default();
        d.turn(0);
        d.span(src, Some("g"), &chunk, (1, 4));
        d.turn(1);
        d.span(src, Some("g"), &chunk, (2, 4));
        d.payloads(src, Some("g"), vec![Bytes::from_static(&[3])]);
        d.span(src, Some("g"), &chunk, (4, 4));
        assert!(d.any());
        let got = handed(&mut Turns::default(), &mut d);
        let want = [
            Numbers(src, vec![1, 2]),
            Numbers(src, vec![3]),
            Numbers(src, vec![4]),
        ];
        assert_eq!(got, want, "a span after a waited payload starts a batch");
    }

    /// One read's tickets on both sides of another's: each goes in its place, the later
    /// one's own segment handed over when the other's drains to it.
    #[test]
    fn a_read_s_tickets_around_another_s_go_in_their_places() {
        let (chunk, src) = (Bytes::new(), BusId(1));
        let (mut a, mut b) = (Decided::default(), Decided::default());
        let mut turns = Turns::default();
        a.turn(0);
        a.span(src, None, &chunk, (0, 4));
        b.turn(1);
        b.span(src, None, &chunk, (1, 4));
        a.turn(2);
        a.span(src, None, &chunk, (2, 4));
        assert_eq!(a.segments.len(), 2, "not merged across another's ticket");
        assert!(handed(&mut turns, &mut b).is_empty());
        let got = handed(&mut turns, &mut a);
        let want = [0, 1, 2].map(|n| Numbers(src, vec![n]));
        assert_eq!(got, want);
        assert!(turns.is_idle());
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
