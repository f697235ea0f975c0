//! Deliveries handed over in the order of the turns (tickets) under which they were decided.
//!
//! Several threads decide about a member's streams, each under the lock of the state it
//! changes; a decision that delivers takes the next ticket under that lock, so the tickets of
//! one stream follow its decisions. What each thread then decided is handed over here as a
//! segment of consecutive tickets: a segment whose first ticket is next goes at once, with
//! the segments that waited for it; one whose turn has not come waits. No thread waits for
//! another: the one whose turn it is hands over what others left.
//!
//! [`Handover`] gives the tickets and holds the `Turns` behind a lock held only to pass
//! finished batches to the host's [`Sink`] (the runtime's inbox), never while a thread
//! decides; [`InTurn`] holds a state whose calls take their ticket under its lock; a read's
//! [`Delivered`] collects what it decided and hands it over when it ends. Batches that wait
//! for their turn count in the sink from the moment they wait ([`Sink::reserve`]), so a host
//! that stops reading for a backlog stops for them too.

use crate::body::Span;
use crate::BusId;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

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
    fn of_spans(src: BusId, group: Option<&str>, chunk: &Bytes, spans: Vec<Span>) -> Self;
    /// One message from `src` to `group` that waited (a buffer of its own).
    fn of_payload(src: BusId, group: Option<&str>, payload: Bytes) -> Self;
    /// Whether the batch holds messages of `src` to `group`.
    fn is_of(&self, src: BusId, group: Option<&str>) -> bool;
    /// Appends the message at `span` of the batch's buffer.
    fn push_span(&mut self, span: Span);
    /// The bytes it holds the host to, as its sink counts them ([`Sink::reserve`]).
    fn footprint(&self) -> usize;
}

/// Where handed-over batches go (the runtime's inbox).
pub trait Sink<B> {
    /// Counts `bytes` (batches' footprints) as the application's to read from now, handed
    /// over or waiting for their turn: they hold the host's links back alike.
    fn reserve(&self, bytes: usize);
    /// Hands `batch`, its footprint reserved, to the application now; false if it is gone.
    fn deliver_reserved(&self, batch: B) -> bool;
}

/// The tickets given, and the deliveries that wait for an earlier ticket.
pub struct Handover<B> {
    /// The next ticket to give.
    tickets: AtomicU64,
    pending: Mutex<Turns<B>>,
}

impl<B> Default for Handover<B> {
    fn default() -> Self {
        Self {
            tickets: AtomicU64::new(0),
            pending: Mutex::default(),
        }
    }
}

/// `m`'s guard, poisoned or not.
pub(crate) fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A state behind its lock (the groups' and the multicasts'): each call takes the lock for
/// itself alone, and one that delivers takes its turn to hand over under it (see
/// [`Delivered::take_turn`]).
pub struct InTurn<T> {
    state: Mutex<T>,
}

impl<T> InTurn<T> {
    /// `state` behind its lock.
    pub fn new(state: T) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    /// The state, for a call that delivers nothing.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        locked(&self.state)
    }

    /// Runs `f` on the state under its lock; if `delivers` holds for its answer, takes the
    /// turn to hand over under it. `after` looks at the state before the lock goes.
    pub fn with<R, B: Batch>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut T) -> R,
        out: &mut Delivered<'_, B>,
        after: impl FnOnce(&T),
    ) -> R {
        let mut state = self.lock();
        let got = f(&mut state);
        if delivers(&got) {
            out.take_turn();
        }
        after(&state);
        got
    }
}

/// What one read (or one timer tick) delivers to the application, in order (see
/// [`Decided`]). Handed over when it is finished or dropped, so a ticket taken is never lost,
/// even on a panic.
pub struct Delivered<'a, B: Batch> {
    handover: &'a Handover<B>,
    sink: &'a dyn Sink<B>,
    /// The deliveries decided, by ticket.
    pub decided: Decided<B>,
    /// This node was cut off from a group (it left): its peers must be told.
    pub left: bool,
}

impl<'a, B: Batch> Delivered<'a, B> {
    /// Nothing yet, to be handed to `sink` in `handover`'s order.
    pub fn new(handover: &'a Handover<B>, sink: &'a dyn Sink<B>) -> Self {
        Self {
            handover,
            sink,
            decided: Decided::default(),
            left: false,
        }
    }

    /// Takes the next ticket: what is added from now on goes to the application after what
    /// was decided under earlier tickets. Called under the lock of the state whose decision
    /// delivers ([`InTurn::with`]), so one stream's tickets follow its decisions.
    pub fn take_turn(&mut self) {
        // Relaxed: the state's lock around this call orders the tickets of its decisions
        // (its release and acquire pair with the next decision's); tickets of different
        // states order no stream together.
        let ticket = self.handover.tickets.fetch_add(1, Relaxed);
        self.decided.turn(ticket);
    }

    /// Hands the deliveries over (see `Drop`); returns whether there were any (in the sink
    /// now, or counted there while they wait for an earlier turn), and whether this node
    /// left a group meanwhile (`left`).
    pub fn finish(self) -> (bool, bool) {
        (self.decided.any(), self.left)
    }
}

impl<B: Batch> Drop for Delivered<'_, B> {
    fn drop(&mut self) {
        if !self.decided.has_turn() {
            return;
        }
        let mut pending = locked(&self.handover.pending);
        for s in self.decided.take() {
            self.sink.reserve(s.batches.iter().map(B::footprint).sum());
            pending.ready(s.first, s.last, s.batches, |batch| {
                // False: the application dropped its inbox, nobody is left to read them.
                let _ = self.sink.deliver_reserved(batch);
            });
        }
    }
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
            // No one took a ticket since this read's last: one segment, and its last batch
            // may grow.
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
    pub fn span(&mut self, src: BusId, group: Option<&str>, chunk: &Bytes, span: Span) {
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
    pub fn run(&mut self, src: BusId, group: &str, chunk: &Bytes, spans: Vec<Span>) {
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
        fn of_spans(src: BusId, _: Option<&str>, _: &Bytes, spans: Vec<Span>) -> Self {
            Numbers(src, spans.iter().map(|s| s.start()).collect())
        }
        fn of_payload(src: BusId, _: Option<&str>, p: Bytes) -> Self {
            Numbers(src, vec![p[0] as u32])
        }
        fn is_of(&self, src: BusId, _: Option<&str>) -> bool {
            self.0 == src
        }
        fn push_span(&mut self, span: Span) {
            self.1.push(span.start());
        }
        fn footprint(&self) -> usize {
            self.1.len()
        }
    }

    /// A sink that keeps what it is handed, and counts what is reserved.
    #[derive(Default)]
    struct Kept {
        reserved: AtomicU64,
        got: Mutex<Vec<u32>>,
    }

    impl Sink<Numbers> for Kept {
        fn reserve(&self, bytes: usize) {
            self.reserved.fetch_add(bytes as u64, Relaxed);
        }
        fn deliver_reserved(&self, batch: Numbers) -> bool {
            locked(&self.got).extend(batch.1);
            true
        }
    }

    impl Kept {
        fn take(&self) -> Vec<u32> {
            std::mem::take(&mut locked(&self.got))
        }
    }

    #[test]
    fn later_tickets_wait_for_an_earlier_one_and_go_with_it() {
        let (sink, handover) = (Kept::default(), Handover::default());
        let one = |n: u8| vec![Bytes::copy_from_slice(&[n])];
        let mut first = Delivered::new(&handover, &sink);
        first.take_turn();
        let mut second = Delivered::new(&handover, &sink);
        second.take_turn();
        second.decided.payloads(BusId(1), Some("g"), one(2));
        assert_eq!(second.finish(), (true, false));
        assert!(sink.take().is_empty(), "ticket 0 is still being decided on");
        assert_eq!(
            sink.reserved.load(Relaxed),
            1,
            "what waits counts in the sink as what it holds"
        );
        // A turn that delivers nothing still lets the others go.
        let mut empty = Delivered::new(&handover, &sink);
        empty.take_turn();
        drop(empty);
        first.decided.payloads(BusId(1), Some("g"), one(1));
        assert_eq!(first.finish(), (true, false));
        assert_eq!(sink.take(), [1, 2]);
        assert!(locked(&handover.pending).is_idle());
    }

    /// Threads decide about one stream in turn under its lock and hand over on their own:
    /// the sink gets the stream in the order decided.
    #[test]
    fn a_stream_decided_on_many_threads_is_delivered_in_order() {
        const THREADS: u32 = 4;
        const EACH: u32 = 500;
        let (sink, handover) = (Kept::default(), Handover::default());
        let stream = InTurn::new(0u32);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..EACH {
                        let mut out = Delivered::new(&handover, &sink);
                        let next = |n: &mut u32| {
                            *n += 1;
                            *n
                        };
                        let n = stream.with(|_| true, next, &mut out, |_| {});
                        let spans = vec![Span::data(n, 0)];
                        out.decided.run(BusId(1), "g", &Bytes::new(), spans);
                    }
                });
            }
        });
        let want: Vec<u32> = (1..=THREADS * EACH).collect();
        assert_eq!(sink.take(), want);
        assert!(locked(&handover.pending).is_idle());
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
        d.span(src, Some("g"), &chunk, Span::data(1, 4));
        d.turn(1);
        d.span(src, Some("g"), &chunk, Span::data(2, 4));
        d.payloads(src, Some("g"), vec![Bytes::from_static(&[3])]);
        d.span(src, Some("g"), &chunk, Span::data(4, 4));
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
        a.span(src, None, &chunk, Span::data(0, 4));
        b.turn(1);
        b.span(src, None, &chunk, Span::data(1, 4));
        a.turn(2);
        a.span(src, None, &chunk, Span::data(2, 4));
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
