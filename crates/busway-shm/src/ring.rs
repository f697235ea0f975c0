//! A single-producer single-consumer byte ring of records in shared memory.
//!
//! ```text
//! segment:  [ header, RING_HEADER_BYTES ][ data, capacity bytes (a power of two) ]
//! header:   magic, capacity, flags | token, writer, reader | tail | head | reader_waiting |
//!           writer_waiting | closed
//!           (each on its own 64-byte line: the two sides do not share lines they write)
//!           token, writer, reader: the ring's binding (see [`Binding`]), checked on open
//! record:   u32 len, u32 check, payload, zero padding to a multiple of 8
//!           len = u32::MAX: padding to the end of the data area (the next record is at 0)
//!           check = low 32 bits of XXH3-64(payload, seed = the record's position), or 0 in
//!           a ring made unchecked (flag bit 0), whose records carry their own checks (a
//!           link's frames each have an XXH3): lengths are still bounded by the ring
//! ```
//!
//! `tail` and `head` count bytes written and consumed since the ring was made; they only grow.
//! The producer writes records past `tail` and publishes them by storing `tail` (Release); the
//! consumer reads up to the `tail` it loaded (Acquire), then frees the space by storing `head`
//! (Release). A record is visible only once whole, so a writer killed mid-write leaves nothing
//! torn behind: the reader sees the last published record and nothing after it. The check and
//! the bounds of every length are verified anyway, so memory a faulty peer scribbled on is
//! reported ([`Corrupt`]) rather than delivered.
//!
//! Trust: the other side can write every byte of the segment at any time. Every field it
//! writes (the header's `tail` for a consumer, `head` for a producer, every record) is checked
//! before use, on open and at every read; a record is copied out of shared memory first and
//! then checked and handed on, so bytes changed under the reader cannot pass a check and then
//! change (no `&[u8]` into shared memory is ever lent out).
//!
//! Wake-ups: a side that finds nothing to do sets its `*_waiting` word, re-checks, and sleeps on
//! it (futex). The other side, after publishing or freeing, swaps the word to 0 and makes the
//! wake call only if it was 1: no system call while both sides are busy.

use crate::sync::{fence, AtomicU32, AtomicU64};
use crate::wait::Waiter;
use bytes::BufMut;
use std::fmt;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes before the data area.
pub const RING_HEADER_BYTES: usize = 512;
/// Bytes of a record's length and check.
pub const RECORD_HEADER_BYTES: usize = 8;
/// Smallest data area, in bytes.
#[cfg(not(feature = "loom"))]
pub const RING_CAPACITY_MIN: usize = 4096;
/// Smallest data area, in bytes (small under loom, whose models explore every interleaving).
#[cfg(feature = "loom")]
pub const RING_CAPACITY_MIN: usize = 32;
/// Largest data area, in bytes.
pub const RING_CAPACITY_MAX: usize = 256 << 20;
/// Default data area of a link's ring, in bytes.
pub const RING_CAPACITY_DEFAULT: usize = 4 << 20;

/// Spins a waiting consumer makes before it sleeps, by default: a few microseconds, which keeps
/// a round trip at 0.3 us p50 while traffic flows (a futex sleep and wake costs 12-17 us on
/// this project's 2-core VM; see `docs/SHM.md`) and costs an idle reader nothing after that.
pub const SPINS_BEFORE_SLEEP_DEFAULT: u32 = 2_000;

/// Version 2 of the layout: the binding line was added after the magic line.
const MAGIC: u64 = u64::from_le_bytes(*b"BWRING02");
/// Records start at multiples of this, in bytes (`record_size` rounds up to it).
const RECORD_ALIGN: u64 = 8;
const PAD_LEN: u32 = u32::MAX;
/// Header flag: records carry no check of the ring's own.
#[cfg_attr(feature = "loom", allow(dead_code))]
const FLAG_UNCHECKED: u64 = 1;
const CLOSED_BY_PRODUCER: u32 = 1;
const CLOSED_BY_CONSUMER: u32 = 2;

/// Why the ring cannot be made or opened, or a record not written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingError {
    /// The capacity is not a power of two within the limits.
    Capacity(usize),
    /// The segment does not hold a ring (bad magic or sizes); the text says what.
    Invalid(String),
    /// A payload larger than half the ring.
    TooLarge {
        /// The payload's length, in bytes.
        len: usize,
        /// The largest payload the ring takes, in bytes.
        max: usize,
    },
    /// Mapping the segment failed.
    Io(String),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Capacity(c) => write!(
                f,
                "ring capacity {c} must be a power of two in {RING_CAPACITY_MIN}..={RING_CAPACITY_MAX}"
            ),
            Self::Invalid(why) => write!(f, "not a busway ring: {why}"),
            Self::TooLarge { len, max } => {
                write!(f, "record of {len} bytes, over the ring's {max}-byte maximum")
            }
            Self::Io(e) => write!(f, "shared memory: {e}"),
        }
    }
}

impl std::error::Error for RingError {}

/// A record the consumer cannot trust: where it starts and what is wrong. The ring is unusable
/// after it (the consumer stops; the link is closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// Where the record starts, in bytes from the ring's first write.
    pub at: u64,
    /// What is wrong with it.
    pub why: String,
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt ring record at byte {}: {}", self.at, self.why)
    }
}

impl std::error::Error for Corrupt {}

/// Who a ring is for, written in its header by its creator and checked by the side that opens
/// it: a random token that the creator tells only the intended reader (in its offer), and the
/// bus ids of the writer and the reader. A peer cannot make us read a ring meant for someone
/// else, nor our own ring toward it, by naming its descriptor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Binding {
    /// The random token the creator tells only the intended reader.
    pub token: u64,
    /// The writer's bus id.
    pub writer: u64,
    /// The reader's bus id (0: any reader the writer offers it to, as a group log's).
    pub reader: u64,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// There is something to do.
    Ready,
    /// The other side closed the ring.
    Closed,
    /// Nothing happened within the timeout (check that the peer lives).
    TimedOut,
}

#[repr(C, align(64))]
struct Line<T>(T);

#[repr(C)]
struct Header {
    magic: Line<(AtomicU64, AtomicU64, AtomicU64)>,
    binding: Line<(AtomicU64, AtomicU64, AtomicU64)>,
    tail: Line<AtomicU64>,
    head: Line<AtomicU64>,
    reader_waiting: Line<AtomicU32>,
    writer_waiting: Line<AtomicU32>,
    closed: Line<AtomicU32>,
}

#[cfg(not(feature = "loom"))]
const _: () = assert!(std::mem::size_of::<Header>() <= RING_HEADER_BYTES);

fn check(payload: &[u8], at: u64) -> u32 {
    xxhash_rust::xxh3::xxh3_64_with_seed(payload, at) as u32
}

/// [`check`] of the bytes of `parts` one after another.
fn check_parts(parts: &[&[u8]], at: u64) -> u32 {
    match parts {
        [one] => check(one, at),
        _ => {
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(at);
            for part in parts {
                h.update(part);
            }
            h.digest() as u32
        }
    }
}

fn record_size(len: usize) -> usize {
    RECORD_HEADER_BYTES + len.next_multiple_of(8)
}

#[cfg(not(feature = "loom"))]
mod memory {
    use super::{Header, RING_HEADER_BYTES};
    use crate::segment::Segment;

    /// A ring's header and data area inside a mapped segment.
    pub(super) struct Memory {
        segment: Segment,
        data: *mut u8,
        capacity: usize,
    }

    // SAFETY: the mapping is shared memory accessed through atomics (header) and through
    // copies into and out of byte ranges that the ring protocol gives to one side at a time;
    // nothing in it is tied to a thread.
    unsafe impl Send for Memory {}
    // SAFETY: as for Send; `&Memory` only hands out atomics and ranged copies.
    unsafe impl Sync for Memory {}

    impl Memory {
        /// `segment` must be at least `RING_HEADER_BYTES + capacity` bytes (checked by the
        /// caller).
        pub(super) fn new(segment: Segment, capacity: usize) -> Self {
            assert!(segment.len() >= RING_HEADER_BYTES + capacity);
            // SAFETY: RING_HEADER_BYTES + capacity <= segment.len() (asserted above), so the
            // data area lies inside the mapping.
            let data = unsafe { segment.as_ptr().add(RING_HEADER_BYTES) };
            Self {
                segment,
                data,
                capacity,
            }
        }

        pub(super) fn header(&self) -> &Header {
            // SAFETY: the mapping starts page-aligned (more than Header's 64-byte alignment),
            // holds at least RING_HEADER_BYTES >= size_of::<Header>() bytes, lives as long as
            // `self`, and every field is an atomic integer, valid for any bit pattern.
            unsafe { &*(self.segment.as_ptr() as *const Header) }
        }

        pub(super) fn segment(&self) -> &Segment {
            &self.segment
        }

        pub(super) fn into_segment(self) -> Segment {
            self.segment
        }

        pub(super) fn write(&self, at: usize, src: &[u8]) {
            assert!(at + src.len() <= self.capacity);
            // SAFETY: the range is inside the data area (asserted), and the ring protocol gives
            // it to the producer alone until it publishes it (the consumer has freed it: `head`
            // was loaded with Acquire after the consumer's Release store).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), src.len()) }
        }

        /// Appends `len` bytes at `at` to `out`. The peer may write them meanwhile: they are
        /// only copied here (never lent out as a slice), and the copy is what gets checked.
        pub(super) fn copy_to<B: bytes::BufMut>(&self, at: usize, len: usize, out: &mut B) {
            assert!(at + len <= self.capacity);
            // SAFETY: the range is inside the data area (asserted), which stays mapped for as
            // long as `self` lives (the segment is sealed against shrinking). The slice does
            // not outlive this call: it is copied into `out` at once. The producer does not
            // write a published range again until the consumer stores a `head` past it; a
            // faulty peer that writes it anyway changes only the bytes of the copy.
            out.put_slice(unsafe { std::slice::from_raw_parts(self.data.add(at), len) });
        }

        /// Copies `dst.len()` bytes at `at` into `dst` (see `copy_to`).
        pub(super) fn copy_out(&self, at: usize, dst: &mut [u8]) {
            assert!(at + dst.len() <= self.capacity);
            // SAFETY: the range is inside the data area (asserted) and `dst` is our own memory,
            // which cannot overlap the mapping.
            unsafe { std::ptr::copy_nonoverlapping(self.data.add(at), dst.as_mut_ptr(), dst.len()) }
        }
    }
}

#[cfg(feature = "loom")]
mod memory {
    use super::Header;
    use loom::cell::UnsafeCell;

    /// Under loom: the header on the heap and a data area of tracked cells, so that the models
    /// catch a read of bytes the producer has not published.
    pub(super) struct Memory {
        header: Header,
        data: Vec<UnsafeCell<u8>>,
    }

    // SAFETY: the cells are only accessed through loom's `with`/`with_mut`, which report any
    // access that races with another; the header is atomics.
    unsafe impl Sync for Memory {}

    impl Memory {
        pub(super) fn new(header: Header, capacity: usize) -> Self {
            Self {
                header,
                data: (0..capacity).map(|_| UnsafeCell::new(0)).collect(),
            }
        }

        pub(super) fn header(&self) -> &Header {
            &self.header
        }

        pub(super) fn write(&self, at: usize, src: &[u8]) {
            for (i, b) in src.iter().enumerate() {
                // SAFETY: loom checks that no other access to this cell races with this one.
                self.data[at + i].with_mut(|p| unsafe { *p = *b });
            }
        }

        pub(super) fn copy_to<B: bytes::BufMut>(&self, at: usize, len: usize, out: &mut B) {
            for i in at..at + len {
                // SAFETY: loom checks that no write races with this read.
                out.put_u8(self.data[i].with(|p| unsafe { *p }));
            }
        }

        pub(super) fn copy_out(&self, at: usize, dst: &mut [u8]) {
            for (i, d) in dst.iter_mut().enumerate() {
                // SAFETY: loom checks that no write races with this read.
                *d = self.data[at + i].with(|p| unsafe { *p });
            }
        }
    }
}

use memory::Memory;

/// A ring shared by one producer and one consumer (in this process or another).
pub struct Ring {
    memory: Memory,
    capacity: usize,
    /// Records carry the ring's own check (see the module's layout).
    checked: bool,
    waiter: Waiter,
}

/// Whether `found` (the binding in a segment's header) is the one `expected` names; the error
/// says which field differs (never the token's value), for a `what` ("ring", "log").
pub(crate) fn check_binding(
    found: &Binding,
    expected: &Binding,
    what: &str,
) -> Result<(), RingError> {
    let why = if found.token != expected.token {
        "its token is not the one offered".to_string()
    } else if found.writer != expected.writer {
        format!(
            "it is written by bus id {}, not by {}",
            found.writer, expected.writer
        )
    } else if found.reader != expected.reader {
        format!(
            "it is meant for bus id {}, not for {}",
            found.reader, expected.reader
        )
    } else {
        return Ok(());
    };
    Err(RingError::Invalid(format!("not the {what} offered: {why}")))
}

/// The checks of a capacity read from the header of a segment a peer handed over: a valid
/// one, no more than this side accepts (`capacity_max`), and fitting the segment after its
/// `header_bytes`.
#[cfg_attr(feature = "loom", allow(dead_code))]
pub(crate) fn check_opened_capacity(
    capacity: usize,
    capacity_max: usize,
    header_bytes: usize,
    segment_len: usize,
) -> Result<(), RingError> {
    check_capacity(capacity)?;
    if capacity > capacity_max {
        return Err(RingError::Invalid(format!(
            "capacity {capacity} is over the {capacity_max} bytes this side accepts"
        )));
    }
    if header_bytes + capacity > segment_len {
        return Err(RingError::Invalid(format!(
            "capacity {capacity} does not fit a segment of {segment_len} bytes"
        )));
    }
    Ok(())
}

pub(crate) fn check_capacity(capacity: usize) -> Result<(), RingError> {
    if !capacity.is_power_of_two() || !(RING_CAPACITY_MIN..=RING_CAPACITY_MAX).contains(&capacity) {
        return Err(RingError::Capacity(capacity));
    }
    Ok(())
}

impl Ring {
    fn header(&self) -> &Header {
        self.memory.header()
    }

    /// A new ring with `capacity` bytes of data in a new segment; every record is checked.
    #[cfg(not(feature = "loom"))]
    pub fn create(name: &str, capacity: usize) -> Result<Arc<Self>, RingError> {
        Self::create_with(name, capacity, true, Binding::default())
    }

    /// Like [`Ring::create`], for records that carry their own integrity check (a link's
    /// frames): the ring checks only their lengths, and nobody hashes the bytes twice.
    #[cfg(not(feature = "loom"))]
    pub fn create_unchecked(name: &str, capacity: usize) -> Result<Arc<Self>, RingError> {
        Self::create_with(name, capacity, false, Binding::default())
    }

    /// Like [`Ring::create_unchecked`], bound to one reader (see [`Binding`]).
    #[cfg(not(feature = "loom"))]
    pub fn create_bound(
        name: &str,
        capacity: usize,
        binding: Binding,
    ) -> Result<Arc<Self>, RingError> {
        Self::create_with(name, capacity, false, binding)
    }

    #[cfg(not(feature = "loom"))]
    fn create_with(
        name: &str,
        capacity: usize,
        checked: bool,
        binding: Binding,
    ) -> Result<Arc<Self>, RingError> {
        check_capacity(capacity)?;
        let segment = crate::Segment::create(name, RING_HEADER_BYTES + capacity)
            .map_err(|e| RingError::Io(e.to_string()))?;
        let memory = Memory::new(segment, capacity);
        let h = memory.header();
        // The segment is fresh (zeroed) and not shared yet: plain stores are enough; the peer
        // sees them through the descriptor passing, a system call (a full barrier).
        h.magic.0 .1.store(capacity as u64, Relaxed);
        h.binding.0 .0.store(binding.token, Relaxed);
        h.binding.0 .1.store(binding.writer, Relaxed);
        h.binding.0 .2.store(binding.reader, Relaxed);
        h.magic
            .0
             .2
            .store(if checked { 0 } else { FLAG_UNCHECKED }, Relaxed);
        h.magic.0 .0.store(MAGIC, Relaxed);
        Ok(Arc::new(Self {
            memory,
            capacity,
            checked,
            waiter: Waiter::new(),
        }))
    }

    /// The ring in a segment received from the peer, if it is the one `expected` names and
    /// holds at most `capacity_max` bytes of data; errors name what does not fit. Its reading
    /// position is checked again by [`Ring::consumer`].
    #[cfg(not(feature = "loom"))]
    pub fn open(
        segment: crate::Segment,
        expected: &Binding,
        capacity_max: usize,
    ) -> Result<Arc<Self>, RingError> {
        if segment.len() < RING_HEADER_BYTES + RING_CAPACITY_MIN {
            return Err(RingError::Invalid(format!(
                "segment of {} bytes is smaller than the smallest ring",
                segment.len()
            )));
        }
        // No data area until the header's capacity is checked.
        let memory = Memory::new(segment, 0);
        let h = memory.header();
        if h.magic.0 .0.load(Relaxed) != MAGIC {
            return Err(RingError::Invalid("bad magic".into()));
        }
        let capacity = h.magic.0 .1.load(Relaxed) as usize;
        let checked = h.magic.0 .2.load(Relaxed) & FLAG_UNCHECKED == 0;
        check_opened_capacity(
            capacity,
            capacity_max,
            RING_HEADER_BYTES,
            memory.segment().len(),
        )?;
        let ring = Arc::new(Self {
            memory: Memory::new(memory.into_segment(), capacity),
            capacity,
            checked,
            waiter: Waiter::new(),
        });
        ring.check_binding(expected)?;
        Ok(ring)
    }

    /// The binding its creator wrote in the header.
    pub fn binding(&self) -> Binding {
        let b = &self.header().binding.0;
        Binding {
            token: b.0.load(Relaxed),
            writer: b.1.load(Relaxed),
            reader: b.2.load(Relaxed),
        }
    }

    /// Whether this is the ring `expected` names; the error says which field differs (never
    /// the token's value).
    pub fn check_binding(&self, expected: &Binding) -> Result<(), RingError> {
        check_binding(&self.binding(), expected, "ring")
    }

    /// A ring in process memory, for the loom models.
    #[cfg(feature = "loom")]
    pub fn in_heap(capacity: usize) -> Result<Arc<Self>, RingError> {
        check_capacity(capacity)?;
        let header = Header {
            magic: Line((
                AtomicU64::new(MAGIC),
                AtomicU64::new(capacity as u64),
                AtomicU64::new(0),
            )),
            binding: Line((AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0))),
            tail: Line(AtomicU64::new(0)),
            head: Line(AtomicU64::new(0)),
            reader_waiting: Line(AtomicU32::new(0)),
            writer_waiting: Line(AtomicU32::new(0)),
            closed: Line(AtomicU32::new(0)),
        };
        Ok(Arc::new(Self {
            memory: Memory::new(header, capacity),
            capacity,
            checked: true,
            waiter: Waiter::new(),
        }))
    }

    /// The segment, to pass its descriptor to the peer.
    #[cfg(not(feature = "loom"))]
    pub fn segment(&self) -> &crate::Segment {
        self.memory.segment()
    }

    /// Bytes of records the ring holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Largest payload a record may carry: half the ring less a record header, so that a
    /// record always fits once the ring is empty, even after padding to the end.
    pub fn payload_max(&self) -> usize {
        self.capacity / 2 - RECORD_HEADER_BYTES
    }

    /// The writing side. A new producer resumes at the last published record (a writer that
    /// died left nothing half-visible).
    pub fn producer(self: &Arc<Self>) -> Producer {
        // Acquire pairs with the consumer's Release store of `head`.
        let head = self.header().head.0.load(Acquire);
        let tail = self.header().tail.0.load(Relaxed);
        Producer {
            ring: self.clone(),
            tail,
            published: tail,
            head,
        }
    }

    /// Writes `data` at the start of the data area, `head` as the reading position and `tail`
    /// as the published end, as a faulty or hostile peer could (for the `ring_reader` fuzz
    /// target).
    #[cfg(not(feature = "loom"))]
    pub(crate) fn scribble_for_fuzzing(&self, data: &[u8], head: u64, tail: u64) {
        self.memory.write(0, data);
        self.header().head.0.store(head, Relaxed);
        // Release pairs with the consumer's Acquire load of `tail`, as in `publish`.
        self.header().tail.0.store(tail, Release);
    }

    /// Writes the header's fixed words (magic, capacity, flags, then the binding's token,
    /// writer and reader) as a hostile creator could (for the `ring_reader` fuzz target).
    #[cfg(not(feature = "loom"))]
    pub(crate) fn scribble_header_for_fuzzing(&self, words: [u64; 6]) {
        let h = self.header();
        h.magic.0 .0.store(words[0], Relaxed);
        h.magic.0 .1.store(words[1], Relaxed);
        h.magic.0 .2.store(words[2], Relaxed);
        h.binding.0 .0.store(words[3], Relaxed);
        h.binding.0 .1.store(words[4], Relaxed);
        h.binding.0 .2.store(words[5], Relaxed);
    }

    /// The header's magic word of this layout (for the fuzz target, which writes it on purpose
    /// to reach the checks behind it).
    #[cfg(not(feature = "loom"))]
    pub(crate) const MAGIC_FOR_FUZZING: u64 = MAGIC;

    /// The reading side, from the last record consumed. The position in the header is the
    /// other side's to write too: one that is not at a record's start (a multiple of 8) is
    /// refused, as reading from it could run past the end of the data area.
    pub fn consumer(self: &Arc<Self>) -> Result<Consumer, RingError> {
        let head = self.header().head.0.load(Relaxed);
        if head % RECORD_ALIGN != 0 {
            return Err(RingError::Invalid(format!(
                "reading position {head} is not at a record's start"
            )));
        }
        Ok(Consumer {
            ring: self.clone(),
            head,
            scratch: Vec::new(),
        })
    }

    fn closed(&self) -> u32 {
        self.header().closed.0.load(Acquire)
    }

    fn close(&self, by: u32) {
        let h = self.header();
        // Release pairs with the Acquire load in `closed`: what was published before is seen.
        h.closed.0.fetch_or(by, Release);
        // As in `Producer::publish`: a sleeper either sees the flag or is woken here.
        fence(SeqCst);
        for word in [&h.reader_waiting.0, &h.writer_waiting.0] {
            self.wake_sleeper(word);
        }
    }

    /// Wakes whoever sleeps on `word` (see `sleep`), skipping the system call if nobody does.
    /// The caller has made its change visible and issued a SeqCst fence.
    fn wake_sleeper(&self, word: &AtomicU32) {
        if word.swap(0, Relaxed) == 1 {
            self.waiter.wake(word);
        }
    }

    /// Wakes the consumer if it sleeps, for something it reads besides this ring (a group's
    /// log) that the caller has just made visible: it sleeps with
    /// [`ReadWaiter::wait_readable_or`] and that something in its check. No system call, and
    /// no write to the consumer's line, unless it sleeps.
    pub fn wake_reader(&self) {
        let word = &self.header().reader_waiting.0;
        // Pairs with the fence in `Ring::sleep` between the consumer's store of its waiting
        // word and its re-check: either it sees what the caller published, or we see its word.
        fence(SeqCst);
        if word.load(Relaxed) == 1 {
            self.wake_sleeper(word);
        }
    }

    /// Sleeps on `word` until `ready()` or the other side closes, at most `timeout`. Sets the
    /// word first and re-checks (the SeqCst fence pairs with the other side's fence between
    /// its store of its index and its swap of the word), so that a wake-up is never missed.
    fn sleep(
        &self,
        word: &AtomicU32,
        other_side: u32,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Wait {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Wait::Ready;
            }
            if self.closed() & other_side != 0 {
                return Wait::Closed;
            }
            let now = Instant::now();
            if now >= deadline {
                return Wait::TimedOut;
            }
            // Every change of the word is a swap (a read-modify-write), so its changes form one
            // chain that both sides see in the same order.
            word.swap(1, Relaxed);
            fence(SeqCst);
            if ready() || self.closed() & other_side != 0 {
                word.swap(0, Relaxed);
                continue;
            }
            self.waiter.wait(word, 1, deadline - now);
            word.swap(0, Relaxed);
        }
    }
}

/// The writing side of a ring. Records written become visible together at [`Producer::publish`].
pub struct Producer {
    ring: Arc<Ring>,
    /// End of what this side wrote.
    tail: u64,
    /// End of what the consumer may read.
    published: u64,
    /// The consumer's `head` when last looked at.
    head: u64,
}

impl Producer {
    fn room(&self) -> u64 {
        self.ring.capacity as u64 - (self.tail - self.head)
    }

    /// Bytes a record of `len` takes at the current position, with padding to the end.
    fn need(&self, len: usize) -> (usize, usize) {
        let size = record_size(len);
        let idx = (self.tail as usize) & (self.ring.capacity - 1);
        let to_end = self.ring.capacity - idx;
        let pad = if to_end < size { to_end } else { 0 };
        (pad, size)
    }

    /// Writes one record if it fits; `Ok(false)` if the ring is full. Not visible until
    /// [`Producer::publish`].
    pub fn try_push(&mut self, payload: &[u8]) -> Result<bool, RingError> {
        self.try_push_parts(std::slice::from_ref(&payload))
    }

    /// Writes one record whose payload is `parts` one after another (gathered: no copy into
    /// a buffer first), if it fits; `Ok(false)` if the ring is full. Not visible until
    /// [`Producer::publish`].
    pub fn try_push_parts(&mut self, parts: &[&[u8]]) -> Result<bool, RingError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let max = self.ring.payload_max();
        if len > max {
            return Err(RingError::TooLarge { len, max });
        }
        let (pad, size) = self.need(len);
        if ((pad + size) as u64) > self.room() {
            // Acquire pairs with the consumer's Release store of `head`: it has finished
            // reading the bytes we are about to overwrite.
            let head = self.ring.header().head.0.load(Acquire);
            // The consumer's position only grows and never passes what we wrote.
            if head < self.head || head > self.tail {
                return Err(RingError::Invalid(format!(
                    "the reader's position {head} is outside {}..={} (it went back or past what was written)",
                    self.head, self.tail
                )));
            }
            self.head = head;
            if ((pad + size) as u64) > self.room() {
                return Ok(false);
            }
        }
        let mem = &self.ring.memory;
        if pad > 0 {
            let idx = (self.tail as usize) & (self.ring.capacity - 1);
            mem.write(idx, &PAD_LEN.to_le_bytes());
            self.tail += pad as u64;
        }
        let idx = (self.tail as usize) & (self.ring.capacity - 1);
        let mut head = [0u8; RECORD_HEADER_BYTES];
        head[..4].copy_from_slice(&(len as u32).to_le_bytes());
        if self.ring.checked {
            head[4..].copy_from_slice(&check_parts(parts, self.tail).to_le_bytes());
        }
        mem.write(idx, &head);
        let mut at = idx + RECORD_HEADER_BYTES;
        for part in parts {
            mem.write(at, part);
            at += part.len();
        }
        self.tail += size as u64;
        Ok(true)
    }

    /// Whether records were written and not yet published.
    pub fn has_unpublished(&self) -> bool {
        self.tail != self.published
    }

    /// Makes every record written so far visible to the consumer, and wakes it if it sleeps.
    pub fn publish(&mut self) {
        if self.tail == self.published {
            return;
        }
        let h = self.ring.header();
        // Release pairs with the consumer's Acquire load of `tail`: the records' bytes are
        // visible before the new tail is.
        h.tail.0.store(self.tail, Release);
        self.published = self.tail;
        // Pairs with the fence in `Ring::sleep` between the consumer's store of its waiting
        // word and its re-check of `tail`: either it sees our tail, or we see its word.
        fence(SeqCst);
        self.ring.wake_sleeper(&h.reader_waiting.0);
    }

    /// Waits until a record of `len` bytes fits, the consumer closes, or `timeout` passes.
    pub fn wait_for_room(&mut self, len: usize, timeout: Duration) -> Wait {
        let (pad, size) = self.need(len);
        let need = (pad + size) as u64;
        let ring = self.ring.clone();
        let h = ring.header();
        let capacity = ring.capacity as u64;
        let tail = self.tail;
        ring.sleep(&h.writer_waiting.0, CLOSED_BY_CONSUMER, timeout, || {
            // Acquire pairs with the consumer's Release store of `head`. A position past what
            // was written is a lie: wake, and the next push reports it.
            let head = h.head.0.load(Acquire);
            head > tail || capacity.saturating_sub(tail - head) >= need
        })
    }

    /// A handle another thread can sleep on until a record of `len` bytes fits after what this
    /// producer wrote so far (or the consumer closes), while the producer stays usable.
    pub fn room_waiter(&self, len: usize) -> RoomWaiter {
        let (pad, size) = self.need(len);
        RoomWaiter {
            ring: self.ring.clone(),
            head_at_least: (self.tail + (pad + size) as u64)
                .saturating_sub(self.ring.capacity as u64),
        }
    }

    /// Tells the consumer that nothing more comes (after what is published).
    pub fn close(&mut self) {
        self.publish();
        self.ring.close(CLOSED_BY_PRODUCER);
    }

    /// The ring it writes or reads.
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }
}

/// The reading side of a ring.
pub struct Consumer {
    ring: Arc<Ring>,
    /// Start of the next record.
    head: u64,
    /// Where `read` copies a record before it is checked and handed to the caller.
    scratch: Vec<u8>,
}

impl Consumer {
    /// Calls `f` with each published record's payload, at most `max` of them, then frees their
    /// space (and wakes the producer if it waits for room). Returns how many were read. `f`
    /// sees a private copy, checked after it was copied.
    pub fn read(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> Result<usize, Corrupt> {
        let mut copy = std::mem::take(&mut self.scratch);
        copy.clear();
        let read = self.read_records(max, &mut copy, |copy, _| {
            f(copy);
            copy.clear();
        });
        self.scratch = copy;
        read
    }

    /// Appends each published record's payload to `out`, at most `max` of them, then frees
    /// their space (and wakes the producer if it waits for room). Returns how many were read.
    /// Each payload is copied out of shared memory first and checked in `out`. After an error,
    /// `out` may end with the bytes of the bad record.
    pub fn read_into<B: BufMut + AsRef<[u8]>>(
        &mut self,
        max: usize,
        out: &mut B,
    ) -> Result<usize, Corrupt> {
        self.read_records(max, out, |_, _| {})
    }

    /// The loop of `read` and `read_into`: each record is appended to `out`, checked there,
    /// then `done(out, start)` is called with where it starts in `out`.
    fn read_records<B: BufMut + AsRef<[u8]>>(
        &mut self,
        max: usize,
        out: &mut B,
        mut done: impl FnMut(&mut B, usize),
    ) -> Result<usize, Corrupt> {
        let ring = &*self.ring;
        let h = ring.header();
        let mask = ring.capacity - 1;
        // Acquire pairs with the producer's Release store of `tail` in `publish`.
        let tail = h.tail.0.load(Acquire);
        let start = self.head;
        let mut n = 0;
        let corrupt = |at: u64, why: String| Corrupt { at, why };
        if tail < self.head || tail - self.head > ring.capacity as u64 {
            return Err(corrupt(
                self.head,
                format!("published end {tail} is outside the ring"),
            ));
        }
        while self.head < tail && n < max {
            let at = self.head;
            // `head` starts at a multiple of RECORD_ALIGN (checked in `Ring::consumer`) and
            // moves by multiples of it, and the capacity is one too: a record header never
            // runs past the end of the data area.
            let idx = (at as usize) & mask;
            let avail = tail - at;
            if avail < RECORD_HEADER_BYTES as u64 {
                return Err(corrupt(
                    at,
                    format!("{avail} bytes left for a record header"),
                ));
            }
            let mut header = [0u8; RECORD_HEADER_BYTES];
            ring.memory.copy_out(idx, &mut header);
            let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            let sum = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            if len == PAD_LEN {
                let skip = (ring.capacity - idx) as u64;
                if skip > avail {
                    return Err(corrupt(at, "padding past the published end".into()));
                }
                self.head += skip;
                continue;
            }
            let len = len as usize;
            let size = record_size(len);
            if len > ring.payload_max() || size as u64 > avail || idx + size > ring.capacity {
                return Err(corrupt(
                    at,
                    format!("length {len} does not fit ({avail} bytes published from here)"),
                ));
            }
            let from = out.as_ref().len();
            ring.memory.copy_to(idx + RECORD_HEADER_BYTES, len, out);
            if ring.checked && check(&out.as_ref()[from..], at) != sum {
                return Err(corrupt(at, format!("check mismatch on {len} bytes")));
            }
            done(out, from);
            self.head += size as u64;
            n += 1;
        }
        if self.head != start {
            // Release pairs with the producer's Acquire load of `head`: we are done with the
            // bytes before it.
            h.head.0.store(self.head, Release);
            // Pairs with the fence in `Ring::sleep` on the producer's side.
            fence(SeqCst);
            ring.wake_sleeper(&h.writer_waiting.0);
        }
        Ok(n)
    }

    /// Whether a published record waits.
    pub fn is_readable(&self) -> bool {
        // Acquire pairs with the producer's Release store of `tail`.
        self.ring.header().tail.0.load(Acquire) != self.head
    }

    /// Waits until a record is published, the producer closes, or `timeout` passes; spins
    /// `spins` times first (latency mode) before it sleeps.
    pub fn wait_readable(&self, spins: u32, timeout: Duration) -> Wait {
        for _ in 0..spins {
            if self.is_readable() {
                return Wait::Ready;
            }
            std::hint::spin_loop();
        }
        let h = self.ring.header();
        self.ring
            .sleep(&h.reader_waiting.0, CLOSED_BY_PRODUCER, timeout, || {
                self.is_readable()
            })
    }

    /// Whether the producer closed the ring (what it published before stays readable).
    pub fn is_closed(&self) -> bool {
        self.ring.closed() & CLOSED_BY_PRODUCER != 0
    }

    /// Tells the producer that nothing more is read: its waits end.
    pub fn close(&mut self) {
        self.ring.close(CLOSED_BY_CONSUMER);
    }

    /// The ring it writes or reads.
    pub fn ring(&self) -> &Arc<Ring> {
        &self.ring
    }

    /// A handle another thread can sleep on until this consumer has something to read, while
    /// the consumer itself stays with whoever reads (it never sleeps in a system call).
    pub fn waiter(&self) -> ReadWaiter {
        ReadWaiter {
            ring: self.ring.clone(),
        }
    }
}

/// Waits, on a thread of its own, until the consumer has freed enough of the ring for the
/// record a producer could not write (see [`Producer::room_waiter`]).
pub struct RoomWaiter {
    ring: Arc<Ring>,
    /// Room exists once the consumer's `head` reaches this.
    head_at_least: u64,
}

impl RoomWaiter {
    /// Waits until the room exists, the consumer closes, or `timeout` passes.
    pub fn wait(&self, timeout: Duration) -> Wait {
        let h = self.ring.header();
        self.ring
            .sleep(&h.writer_waiting.0, CLOSED_BY_CONSUMER, timeout, || {
                // Acquire pairs with the consumer's Release store of `head` in `Consumer::read`.
                h.head.0.load(Acquire) >= self.head_at_least
            })
    }
}

/// Waits, on a thread of its own, until the ring's consumer has a record to read (see
/// [`Consumer::waiter`]). It reads the consumer's position from the ring's header, which the
/// consumer stores after every read.
pub struct ReadWaiter {
    ring: Arc<Ring>,
}

impl ReadWaiter {
    /// Whether a published record waits for the consumer.
    pub fn is_readable(&self) -> bool {
        let h = self.ring.header();
        // Acquire pairs with the consumer's Release store of `head` in `Consumer::read`
        // (freshest position) and with the producer's Release store of `tail` in `publish`.
        h.tail.0.load(Acquire) != h.head.0.load(Acquire)
    }

    /// Like [`Consumer::wait_readable`], from another thread than the consumer's.
    pub fn wait_readable(&self, timeout: Duration) -> Wait {
        self.wait_readable_or(timeout, || false)
    }

    /// Like [`ReadWaiter::wait_readable`], also ending once `also()` is true: what the
    /// consumer reads besides the ring, whose writer calls [`Ring::wake_reader`] after it
    /// made it visible.
    pub fn wait_readable_or(&self, timeout: Duration, mut also: impl FnMut() -> bool) -> Wait {
        let h = self.ring.header();
        self.ring
            .sleep(&h.reader_waiting.0, CLOSED_BY_PRODUCER, timeout, || {
                self.is_readable() || also()
            })
    }

    /// Whether the producer closed the ring.
    pub fn is_closed(&self) -> bool {
        self.ring.closed() & CLOSED_BY_PRODUCER != 0
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ring(capacity: usize) -> Arc<Ring> {
        Ring::create("busway-test", capacity).unwrap()
    }

    #[test]
    fn records_cross_in_order_and_wrap() {
        let r = ring(4096);
        let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
        let mut got = Vec::new();
        for round in 0..100u32 {
            let msgs: Vec<Vec<u8>> = (0..7)
                .map(|i| vec![(round * 7 + i) as u8; ((round * 31 + i * 17) % 300) as usize])
                .collect();
            for m in &msgs {
                assert!(p.try_push(m).unwrap());
            }
            assert_eq!(c.read(100, |_| {}).unwrap(), 0, "nothing before publish");
            p.publish();
            c.read(100, |m| got.push(m.to_vec())).unwrap();
            assert_eq!(got, msgs);
            got.clear();
        }
    }

    #[test]
    fn a_reader_position_that_goes_back_or_past_the_writes_is_an_error() {
        let r = ring(4096);
        let mut p = r.producer();
        let rec = [7u8; 1000];
        while p.try_push(&rec).unwrap() {}
        p.publish();
        let written = r.header().tail.0.load(Relaxed);
        for lie in [written + 8, u64::MAX] {
            r.header().head.0.store(lie, Relaxed);
            let err = p.try_push(&rec).unwrap_err().to_string();
            assert!(err.contains("outside"), "{err}");
            // A waiter for room wakes rather than sleeps on the lie (the push reports it).
            assert_eq!(
                p.wait_for_room(rec.len(), Duration::from_secs(5)),
                Wait::Ready
            );
        }
        r.header().head.0.store(0, Relaxed);
        let mut c = r.consumer().unwrap();
        assert_eq!(c.read(1, |_| {}).unwrap(), 1);
        assert!(p.try_push(&rec).unwrap(), "room for one after one was read");
        r.header().head.0.store(0, Relaxed);
        let err = p.try_push(&rec).unwrap_err().to_string();
        assert!(err.contains("went back"), "{err}");
    }

    #[test]
    fn a_gathered_record_reads_back_whole_and_passes_its_check() {
        let r = ring(4096);
        let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
        let (a, b, e) = (vec![1u8; 13], vec![2u8; 700], Vec::<u8>::new());
        for _ in 0..20 {
            // Twenty rounds wrap the ring: the gathered record may follow a pad.
            assert!(p.try_push_parts(&[&a, &e, &b]).unwrap());
            p.publish();
            let mut got = Vec::new();
            c.read(10, |m| got.push(m.to_vec())).unwrap();
            assert_eq!(got, vec![[a.clone(), b.clone()].concat()]);
        }
        assert_eq!(
            p.try_push_parts(&[&[0; 2000], &[0; 100]]),
            Err(RingError::TooLarge {
                len: 2100,
                max: 2040
            })
        );
    }

    #[test]
    fn a_full_ring_refuses_until_read() {
        let r = ring(4096);
        let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
        let mut n = 0;
        while p.try_push(&[1; 100]).unwrap() {
            n += 1;
        }
        assert_eq!(n, 4096 / 112);
        p.publish();
        assert_eq!(p.wait_for_room(100, Duration::ZERO), Wait::TimedOut);
        assert_eq!(c.read(1, |_| {}).unwrap(), 1);
        assert!(p.try_push(&[1; 100]).unwrap());
        assert_eq!(
            p.try_push(&[0; 4096]),
            Err(RingError::TooLarge {
                len: 4096,
                max: 2040
            })
        );
    }

    #[test]
    fn scribbled_memory_is_reported_not_delivered() {
        let r = ring(4096);
        let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
        p.try_push(b"hello").unwrap();
        p.publish();
        // A faulty peer flips a payload byte.
        r.memory.write(RECORD_HEADER_BYTES, b"j");
        let err = c.read(10, |_| panic!("delivered")).unwrap_err();
        assert_eq!(err.at, 0);
        assert!(err.to_string().contains("check mismatch"), "{err}");
        // A lying length.
        let r = ring(4096);
        let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
        p.try_push(b"hello").unwrap();
        p.publish();
        r.memory.write(0, &5000u32.to_le_bytes());
        let err = c.read(10, |_| panic!("delivered")).unwrap_err();
        assert!(err.to_string().contains("length 5000"), "{err}");
    }

    #[test]
    fn an_unchecked_ring_bounds_lengths_but_leaves_checks_to_its_records() {
        let r = Ring::create_unchecked("busway-test", 4096).unwrap();
        let fd = r.segment().fd().try_clone_to_owned().unwrap();
        let far = Ring::open(
            crate::Segment::from_fd(fd).unwrap(),
            &Default::default(),
            usize::MAX,
        )
        .unwrap();
        let (mut p, mut c) = (r.producer(), far.consumer().unwrap());
        p.try_push(b"hello").unwrap();
        p.publish();
        r.memory.write(RECORD_HEADER_BYTES, b"j");
        let mut got = Vec::new();
        c.read(10, |m| got = m.to_vec()).unwrap();
        assert_eq!(got, b"jello", "the opener learned the ring is unchecked");
        p.try_push(b"x").unwrap();
        p.publish();
        r.memory.write(16, &5000u32.to_le_bytes());
        let err = c.read(10, |_| panic!("delivered")).unwrap_err();
        assert!(err.to_string().contains("length 5000"), "{err}");
    }

    #[test]
    fn a_ring_opens_from_its_descriptor_and_bad_segments_are_named() {
        let r = ring(8192);
        let fd = r.segment().fd().try_clone_to_owned().unwrap();
        let other = Ring::open(
            crate::Segment::from_fd(fd).unwrap(),
            &Default::default(),
            usize::MAX,
        )
        .unwrap();
        assert_eq!(other.capacity(), 8192);
        let mut p = r.producer();
        p.try_push(b"across").unwrap();
        p.publish();
        let mut got = Vec::new();
        other
            .consumer()
            .unwrap()
            .read(1, |m| got = m.to_vec())
            .unwrap();
        assert_eq!(got, b"across");
        let blank = crate::Segment::create("blank", 8192).unwrap();
        let err = Ring::open(blank, &Default::default(), usize::MAX)
            .err()
            .unwrap();
        assert!(err.to_string().contains("bad magic"), "{err}");
        assert_eq!(
            Ring::create("x", 1000).err().unwrap(),
            RingError::Capacity(1000)
        );
    }

    #[test]
    fn a_sleeping_consumer_is_woken_and_a_closed_ring_ends_waits() {
        let r = ring(4096);
        let mut p = r.producer();
        let c = r.consumer().unwrap();
        let t = std::thread::spawn(move || {
            let w = c.wait_readable(0, Duration::from_secs(10));
            (w, c)
        });
        std::thread::sleep(Duration::from_millis(50));
        p.try_push(b"wake").unwrap();
        p.publish();
        let (w, mut c) = t.join().unwrap();
        assert_eq!(w, Wait::Ready);
        assert_eq!(c.read(10, |_| {}).unwrap(), 1);
        p.close();
        assert_eq!(c.wait_readable(0, Duration::from_secs(10)), Wait::Closed);
    }

    proptest! {
        #[test]
        fn any_sizes_round_trip(sizes in prop::collection::vec(0usize..1500, 1..200)) {
            let r = ring(4096);
            let (mut p, mut c) = (r.producer(), r.consumer().unwrap());
            let mut got = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let m = vec![i as u8; n];
                while !p.try_push(&m).unwrap() {
                    p.publish();
                    c.read(usize::MAX, |x| got.push(x.to_vec())).unwrap();
                }
            }
            p.publish();
            c.read(usize::MAX, |x| got.push(x.to_vec())).unwrap();
            let want: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect();
            prop_assert_eq!(got, want);
        }
    }
}
