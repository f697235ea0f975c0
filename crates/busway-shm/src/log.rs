//! A broadcast log: one writer, any number of readers, in shared memory. A group's publisher
//! writes each publish into it once and every reader on the host copies it out at its own
//! pace (iceoryx2's one-copy fan-out), instead of the publisher queueing it once per reader.
//!
//! ```text
//! segment:  [ header, LOG_HEADER_BYTES ][ data, capacity bytes (a power of two) ]
//! header:   magic, capacity | token, writer, reader | tail | head
//!           (tail and head each on their own 64-byte line)
//! record:   u32 len, u32 zero, payload, zero padding to a multiple of 8
//!           len = u32::MAX: padding to the end of the data area (the next record is at 0)
//! ```
//!
//! `tail` counts the bytes written since the log was made and only grows; the writer stores it
//! (Release) after a record's bytes. The writer never waits for a reader: a record that does not
//! fit overwrites the oldest. Before it overwrites anything it stores `head`, the start of the
//! oldest record left whole, and issues a Release fence; a reader copies a range out, issues an
//! Acquire fence and loads `head` again: if `head` moved past where the copy started, the bytes
//! may be torn and the copy is thrown away (a seqlock's check). A reader that fell behind `head`
//! jumps to it and says so ([`Read::overrun`]); what it missed is for its caller to recover (a
//! group member asks its publisher for a repair).
//!
//! Trust: only the writer's process maps the log writable; readers map it read-only
//! ([`crate::Segment::open_read_only_from_process`]), so no reader can change what the others
//! read. The writer is still a peer: `tail`, `head` and every record length are checked before
//! use and a lie is reported ([`Corrupt`]), never followed out of the data area.

use crate::ring::{
    check_binding, check_capacity, check_opened_capacity, Binding, Corrupt, RingError,
    RECORD_HEADER_BYTES,
};
use crate::segment::Segment;
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{fence, AtomicU64};
use std::sync::Arc;

/// Bytes before the data area.
pub const LOG_HEADER_BYTES: usize = 256;
/// Smallest data area, in bytes (a ring's: the same checks apply).
pub const LOG_CAPACITY_MIN: usize = crate::ring::RING_CAPACITY_MIN;
/// Largest data area, in bytes.
pub const LOG_CAPACITY_MAX: usize = crate::ring::RING_CAPACITY_MAX;
/// Times a read starts again after the writer overwrote what it was copying, before it gives
/// up for this call (the caller looks again later).
const TORN_RETRIES: usize = 4;

const MAGIC: u64 = u64::from_le_bytes(*b"BWLOG001");
const PAD_LEN: u32 = u32::MAX;
const RECORD_ALIGN: u64 = 8;

#[repr(C, align(64))]
struct Line<T>(T);

#[repr(C)]
struct Header {
    magic: Line<(AtomicU64, AtomicU64)>,
    binding: Line<(AtomicU64, AtomicU64, AtomicU64)>,
    tail: Line<AtomicU64>,
    head: Line<AtomicU64>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= LOG_HEADER_BYTES);

fn record_size(len: usize) -> usize {
    RECORD_HEADER_BYTES + len.next_multiple_of(RECORD_ALIGN as usize)
}

/// A broadcast log in a segment: made by its writer ([`Log::create`]) or opened by a reader
/// ([`Log::open`]).
pub struct Log {
    segment: Segment,
    data: *mut u8,
    capacity: usize,
}

// SAFETY: the mapping is shared memory accessed through atomics (header) and through copies
// into and out of byte ranges (data); nothing in it is tied to a thread.
unsafe impl Send for Log {}
// SAFETY: as for Send; `&Log` hands out atomics and ranged copies only.
unsafe impl Sync for Log {}

impl Log {
    /// A new log of `capacity` bytes of data in a new segment, bound as `binding` says (the
    /// token its offers carry, the writer's id; `reader` 0: anyone given the token reads),
    /// and its one writer.
    pub fn create(
        name: &str,
        capacity: usize,
        binding: Binding,
    ) -> Result<(Arc<Self>, LogWriter), RingError> {
        check_capacity(capacity)?;
        let segment = Segment::create(name, LOG_HEADER_BYTES + capacity)
            .map_err(|e| RingError::Io(e.to_string()))?;
        let log = Arc::new(Self::in_segment(segment, capacity));
        let h = log.header();
        // The segment is fresh (zeroed) and not shared yet: plain stores are enough; a reader
        // gets it through a system call (a full barrier) or this process's own registry.
        h.magic.0 .1.store(capacity as u64, Relaxed);
        h.binding.0 .0.store(binding.token, Relaxed);
        h.binding.0 .1.store(binding.writer, Relaxed);
        h.binding.0 .2.store(binding.reader, Relaxed);
        h.magic.0 .0.store(MAGIC, Relaxed);
        let writer = LogWriter {
            log: log.clone(),
            tail: 0,
            head: 0,
            starts: VecDeque::new(),
        };
        Ok((log, writer))
    }

    /// The log in a segment received from its writer, if it is the one `expected` names and
    /// holds at most `capacity_max` bytes of data; errors name what does not fit.
    pub fn open(
        segment: Segment,
        expected: &Binding,
        capacity_max: usize,
    ) -> Result<Arc<Self>, RingError> {
        if segment.len() < LOG_HEADER_BYTES + LOG_CAPACITY_MIN {
            return Err(RingError::Invalid(format!(
                "segment of {} bytes is smaller than the smallest log",
                segment.len()
            )));
        }
        // No data area until the header's capacity is checked.
        let log = Self::in_segment(segment, 0);
        let h = log.header();
        if h.magic.0 .0.load(Relaxed) != MAGIC {
            return Err(RingError::Invalid("bad magic (not a group log)".into()));
        }
        let capacity = h.magic.0 .1.load(Relaxed) as usize;
        check_opened_capacity(capacity, capacity_max, LOG_HEADER_BYTES, log.segment.len())?;
        let log = Self::in_segment(log.segment, capacity);
        check_binding(&log.binding(), expected, "log")?;
        Ok(Arc::new(log))
    }

    fn in_segment(segment: Segment, capacity: usize) -> Self {
        assert!(segment.len() >= LOG_HEADER_BYTES + capacity);
        // SAFETY: LOG_HEADER_BYTES + capacity <= segment.len() (asserted above), so the data
        // area lies inside the mapping.
        let data = unsafe { segment.as_ptr().add(LOG_HEADER_BYTES) };
        Self {
            segment,
            data,
            capacity,
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts page-aligned (more than Header's 64-byte alignment),
        // holds at least LOG_HEADER_BYTES >= size_of::<Header>() bytes, lives as long as
        // `self`, and every field is an atomic integer, valid for any bit pattern. A
        // read-only mapping is only ever loaded from (only the writer stores).
        unsafe { &*(self.segment.as_ptr() as *const Header) }
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

    /// The segment, to announce its descriptor to readers.
    pub fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Bytes of records the log holds at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Largest record: half the log less a record header, so that a record always fits,
    /// even after padding to the end.
    pub fn record_max(&self) -> usize {
        self.capacity / 2 - RECORD_HEADER_BYTES
    }

    /// A reader from the end of what is published now (it sees what is written after).
    pub fn reader(self: &Arc<Self>) -> Result<LogReader, Corrupt> {
        // Acquire pairs with the writer's Release store of `tail`.
        let tail = self.header().tail.0.load(Acquire);
        if tail % RECORD_ALIGN != 0 {
            return Err(Corrupt {
                at: tail,
                why: "the log's published end is not at a record's start".into(),
            });
        }
        Ok(LogReader {
            log: self.clone(),
            at: Arc::new(AtomicU64::new(tail)),
            seen_tail: tail,
        })
    }

    /// Writes `data` at the start of the data area, `head` as the oldest whole record and
    /// `tail` as the published end, as a faulty or hostile writer could (for the `log_reader`
    /// fuzz target).
    pub(crate) fn scribble_for_fuzzing(&self, data: &[u8], head: u64, tail: u64) {
        self.write(0, &data[..data.len().min(self.capacity)]);
        self.header().head.0.store(head, Relaxed);
        // Release pairs with the readers' Acquire load of `tail`, as in `LogWriter::publish`.
        self.header().tail.0.store(tail, Release);
    }

    /// Writes the header's fixed words (magic, capacity, then the binding's token, writer and
    /// reader) as a hostile creator could, before a reader opens the log (for the
    /// `log_reader` fuzz target).
    pub(crate) fn scribble_header_for_fuzzing(&self, words: [u64; 5]) {
        let h = self.header();
        h.magic.0 .0.store(words[0], Relaxed);
        h.magic.0 .1.store(words[1], Relaxed);
        h.binding.0 .0.store(words[2], Relaxed);
        h.binding.0 .1.store(words[3], Relaxed);
        h.binding.0 .2.store(words[4], Relaxed);
    }

    /// The header's magic word of this layout (for the fuzz target, which writes it on purpose
    /// to reach the checks behind it).
    pub(crate) const MAGIC_FOR_FUZZING: u64 = MAGIC;

    /// The padding record's length word (for the fuzz target, which writes well-formed
    /// records on purpose to reach the checks behind them).
    pub(crate) const PAD_LEN_FOR_FUZZING: u32 = PAD_LEN;

    fn write(&self, at: usize, src: &[u8]) {
        assert!(at + src.len() <= self.capacity);
        // SAFETY: the range is inside the data area (asserted), mapped writable: only the
        // writer's process, which created the segment, writes (through its one `LogWriter`).
        // Readers may be copying these bytes right now; they find out through `head`, which
        // was stored (and fenced) before this write, and drop their copy.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.data.add(at), src.len()) }
    }

    fn copy_to(&self, at: usize, len: usize, out: &mut BytesMut) {
        assert!(at + len <= self.capacity);
        // SAFETY: the range is inside the data area (asserted), which stays mapped for as long
        // as `self` lives (the segment is sealed against shrinking). The slice does not outlive
        // this call: it is copied into `out` at once, and the copy is what gets checked (the
        // writer may be overwriting these bytes: `LogReader::read_into` sees it in `head`
        // afterwards and throws the copy away). Bytes written by another thread during the
        // copy are a race Rust's model does not describe (as for any memory a peer process
        // writes, and in a seqlock); the copy is plain bytes, never trusted before the check.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(self.data.add(at), len) });
    }
}

/// The one writer of a log. Never waits: the oldest records make room.
pub struct LogWriter {
    log: Arc<Log>,
    tail: u64,
    /// `head` as last stored.
    head: u64,
    /// Where each record still whole starts (padding included), oldest first: the writer's
    /// own account, not read back from the shared bytes.
    starts: VecDeque<u64>,
}

impl LogWriter {
    /// Writes one record whose payload is `parts` one after another, overwriting the oldest
    /// records if need be. Not visible until [`LogWriter::publish`].
    pub fn push_parts(&mut self, parts: &[&[u8]]) -> Result<(), RingError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let max = self.log.record_max();
        if len > max {
            return Err(RingError::TooLarge { len, max });
        }
        let cap = self.log.capacity;
        let size = record_size(len);
        let idx = (self.tail as usize) & (cap - 1);
        let pad = if cap - idx < size { cap - idx } else { 0 };
        let end = self.tail + (pad + size) as u64;
        // The bytes about to be written held the positions before `end - cap`: records that
        // start there are overwritten (in part at least).
        let keep_from = end.saturating_sub(cap as u64);
        while self.starts.front().is_some_and(|&s| s < keep_from) {
            self.starts.pop_front();
        }
        let head = self.starts.front().copied().unwrap_or(self.tail);
        if head != self.head {
            self.head = head;
            let h = self.log.header();
            h.head.0.store(head, Relaxed);
            // Orders the store of `head` before the writes below: a reader whose copy saw any
            // of them sees this `head` after its Acquire fence (in `LogReader::read_into`).
            fence(Release);
        }
        if pad > 0 {
            self.log.write(idx, &PAD_LEN.to_le_bytes());
            self.starts.push_back(self.tail);
            self.tail += pad as u64;
        }
        let idx = (self.tail as usize) & (cap - 1);
        let mut head_bytes = [0u8; RECORD_HEADER_BYTES];
        head_bytes[..4].copy_from_slice(&(len as u32).to_le_bytes());
        self.log.write(idx, &head_bytes);
        let mut at = idx + RECORD_HEADER_BYTES;
        for part in parts {
            self.log.write(at, part);
            at += part.len();
        }
        self.starts.push_back(self.tail);
        self.tail += size as u64;
        Ok(())
    }

    /// Makes every record written so far visible to readers (who are woken by the caller).
    pub fn publish(&mut self) {
        // Release pairs with the readers' Acquire load of `tail`: the records' bytes are
        // visible before the new tail is.
        self.log.header().tail.0.store(self.tail, Release);
    }

    /// The log it writes or reads.
    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }
}

/// What one read found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Records appended.
    pub records: usize,
    /// The writer overwrote records this reader had not read: it skipped to the oldest left.
    pub overrun: bool,
}

/// One reader of a log, from its own position.
pub struct LogReader {
    log: Arc<Log>,
    /// Start of the next record (shared with [`LogWatch`]).
    at: Arc<AtomicU64>,
    /// The largest `tail` seen: it never goes back.
    seen_tail: u64,
}

/// Whether a reader has something to read, for a thread that sleeps for it while the reader
/// stays with whoever reads.
#[derive(Clone)]
pub struct LogWatch {
    log: Arc<Log>,
    at: Arc<AtomicU64>,
}

impl LogWatch {
    /// Whether a record was published past the reader's position.
    pub fn is_readable(&self) -> bool {
        // Acquire pairs with the writer's Release store of `tail`.
        self.log.header().tail.0.load(Acquire) > self.at.load(Relaxed)
    }
}

impl LogReader {
    /// A handle that says whether this reader has something to read.
    pub fn watch(&self) -> LogWatch {
        LogWatch {
            log: self.log.clone(),
            at: self.at.clone(),
        }
    }

    /// Whether a record was published past this reader's position.
    pub fn is_readable(&self) -> bool {
        // Acquire pairs with the writer's Release store of `tail`.
        self.log.header().tail.0.load(Acquire) > self.at.load(Relaxed)
    }

    /// The log it writes or reads.
    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// Appends the published records after this reader's position to `out`, about
    /// `bytes_max` bytes of them at most (at least one record when any waits), and the
    /// (start in `out`, length) of each payload to `spans`. The bytes are copied out first and
    /// checked in `out`. A lie of the writer's (a position outside the log, a length that does
    /// not fit) is an error and the reader is unusable after it.
    pub fn read_into(
        &mut self,
        bytes_max: usize,
        out: &mut BytesMut,
        spans: &mut Vec<(u32, u32)>,
    ) -> Result<Read, Corrupt> {
        let log = &*self.log;
        let h = log.header();
        let cap = log.capacity as u64;
        let mask = log.capacity - 1;
        let mut read = Read::default();
        let mut at = self.at.load(Relaxed);
        let corrupt = |at: u64, why: String| Corrupt { at, why };
        let mut lapped = 0;
        for _ in 0..TORN_RETRIES {
            // `head` first: the writer stores it before it writes the record it makes room
            // for and `tail` after, so a `tail` loaded later is at most the log's size behind
            // it, whatever ran in between.
            let head = h.head.0.load(Acquire);
            // Acquire pairs with the writer's Release store of `tail` in `publish`.
            let tail = h.tail.0.load(Acquire);
            if tail < self.seen_tail || tail % RECORD_ALIGN != 0 {
                return Err(corrupt(
                    tail,
                    format!(
                        "the log's published end {tail} went back (from {}) or is not at a record's start",
                        self.seen_tail
                    ),
                ));
            }
            self.seen_tail = tail;
            if head % RECORD_ALIGN != 0 || head > tail.saturating_add(cap) {
                return Err(corrupt(
                    head,
                    format!("the log's oldest record {head} is past {tail} + the log's size or not at a record's start"),
                ));
            }
            if at < head {
                at = head;
                read.overrun = true;
            }
            if at >= tail {
                // Past what is published (see above): read once it is.
                break;
            }
            if tail - at > cap {
                // The writer went round the log between the two loads: look at `head` again.
                // Every time, and `head` never moves: a lie (an honest writer stores `head`
                // past `tail - capacity` before it publishes `tail`).
                read.overrun = true;
                lapped += 1;
                if lapped == TORN_RETRIES {
                    return Err(corrupt(
                        head,
                        format!("the log's published end {tail} stays more than its size past its oldest record {head}"),
                    ));
                }
                continue;
            }
            // One record of the largest size fits whatever `bytes_max` says: a read always
            // moves on. Saturating: the writer's `tail` (and so `at`) may lie near u64::MAX.
            let want = (bytes_max as u64).max((log.capacity / 2) as u64);
            let end = tail.min(at.saturating_add(want));
            let base = out.len();
            let idx = (at as usize) & mask;
            let first = ((end - at) as usize).min(log.capacity - idx);
            log.copy_to(idx, first, out);
            if first < (end - at) as usize {
                log.copy_to(0, (end - at) as usize - first, out);
            }
            // Pairs with the writer's Release fence after its store of `head`: if the copy saw
            // any byte written after that store, this load sees that `head` (or a later one).
            fence(Acquire);
            let head_after = h.head.0.load(Relaxed);
            if head_after > at {
                // Overwritten under the copy: throw it away and start at the oldest left.
                out.truncate(base);
                if head_after % RECORD_ALIGN != 0 {
                    return Err(corrupt(
                        head_after,
                        "the log's oldest record is not at a record's start".into(),
                    ));
                }
                at = head_after;
                read.overrun = true;
                continue;
            }
            let spans_before = spans.len();
            let mut pos = at;
            // Positions are compared as distances (`end - pos`, `tail - pos`), never as sums:
            // `pos` can be anywhere up to a lying `tail` near u64::MAX, where a sum wraps.
            while pos < end && end - pos >= RECORD_HEADER_BYTES as u64 {
                let o = base + (pos - at) as usize;
                let len = u32::from_le_bytes([out[o], out[o + 1], out[o + 2], out[o + 3]]);
                let idx = (pos as usize) & mask;
                if len == PAD_LEN {
                    let skip = (log.capacity - idx) as u64;
                    if skip > tail - pos {
                        spans.truncate(spans_before);
                        return Err(corrupt(pos, "padding past the published end".into()));
                    }
                    pos += skip;
                    continue;
                }
                let len = len as usize;
                let size = record_size(len) as u64;
                if len > log.record_max() || idx + size as usize > log.capacity || size > tail - pos
                {
                    spans.truncate(spans_before);
                    return Err(corrupt(
                        pos,
                        format!(
                            "record length {len} does not fit ({} bytes published from here)",
                            tail - pos
                        ),
                    ));
                }
                if size > end - pos {
                    // Whole in the log, not in this copy: the next read takes it.
                    break;
                }
                spans.push(((o + RECORD_HEADER_BYTES) as u32, len as u32));
                read.records += 1;
                pos += size;
            }
            if pos < end && end - pos < RECORD_HEADER_BYTES as u64 && end == tail {
                spans.truncate(spans_before);
                return Err(corrupt(
                    pos,
                    format!("{} bytes left for a record header", end - pos),
                ));
            }
            // What was copied past the last whole record is read again next time.
            out.truncate(base + (pos.min(end) - at) as usize);
            at = pos;
            break;
        }
        self.at.store(at, Relaxed);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(capacity: usize) -> (Arc<Log>, LogWriter) {
        Log::create("busway-test-log", capacity, Binding::default()).unwrap()
    }

    fn read_all(r: &mut LogReader) -> (Vec<Vec<u8>>, Read) {
        let (mut out, mut spans) = (BytesMut::new(), Vec::new());
        let mut total = Read::default();
        loop {
            let read = r.read_into(1 << 20, &mut out, &mut spans).unwrap();
            total.overrun |= read.overrun;
            total.records += read.records;
            if read.records == 0 {
                break;
            }
        }
        let got = spans
            .iter()
            .map(|&(s, l)| out[s as usize..(s + l) as usize].to_vec())
            .collect();
        (got, total)
    }

    #[test]
    fn every_reader_gets_every_record_in_order_across_wraps() {
        let (l, mut w) = log(4096);
        let mut readers: Vec<LogReader> = (0..3).map(|_| l.reader().unwrap()).collect();
        for round in 0..50u32 {
            let msgs: Vec<Vec<u8>> = (0..5)
                .map(|i| vec![(round * 5 + i) as u8; ((round * 37 + i * 11) % 200) as usize])
                .collect();
            for m in &msgs {
                w.push_parts(&[m]).unwrap();
            }
            assert!(!readers[0].is_readable(), "nothing before publish");
            w.publish();
            for r in &mut readers {
                assert!(r.is_readable());
                let (got, read) = read_all(r);
                assert_eq!(got, msgs);
                assert!(!read.overrun);
            }
        }
    }

    #[test]
    fn a_reader_that_falls_behind_skips_to_the_oldest_whole_record_and_says_so() {
        let (l, mut w) = log(4096);
        let mut slow = l.reader().unwrap();
        for i in 0..200u32 {
            w.push_parts(&[&i.to_le_bytes(), &[7u8; 60]]).unwrap();
        }
        w.publish();
        let (got, read) = read_all(&mut slow);
        assert!(read.overrun);
        assert!(!got.is_empty() && got.len() < 200);
        // What it got is the newest records, whole and in order, up to the last.
        let numbers: Vec<u32> = got
            .iter()
            .map(|r| u32::from_le_bytes([r[0], r[1], r[2], r[3]]))
            .collect();
        assert_eq!(*numbers.last().unwrap(), 199);
        assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(got
            .iter()
            .all(|r| r.len() == 64 && r[4..].iter().all(|&b| b == 7)));
    }

    #[test]
    fn a_record_too_large_is_refused_and_a_small_read_limit_still_moves_on() {
        let (l, mut w) = log(4096);
        assert!(matches!(
            w.push_parts(&[&vec![0u8; 4096]]),
            Err(RingError::TooLarge { .. })
        ));
        let mut r = l.reader().unwrap();
        w.push_parts(&[&vec![1u8; 1500]]).unwrap();
        w.publish();
        let (mut out, mut spans) = (BytesMut::new(), Vec::new());
        let read = r.read_into(1, &mut out, &mut spans).unwrap();
        assert_eq!(read.records, 1);
        assert_eq!(spans, vec![(8, 1500)]);
    }

    #[test]
    fn lies_in_the_header_are_errors_not_reads_out_of_bounds() {
        let lie = |tell: &dyn Fn(&Log), expect: &str| {
            let (l, mut w) = log(4096);
            let mut r = l.reader().unwrap();
            w.push_parts(&[b"hello"]).unwrap();
            w.publish();
            tell(&l);
            let (mut out, mut spans) = (BytesMut::new(), Vec::new());
            let e = r.read_into(4096, &mut out, &mut spans).unwrap_err();
            assert!(e.why.contains(expect), "{e}");
            assert!(spans.is_empty());
        };
        lie(&|l| l.header().tail.0.store(13, Release), "record's start");
        lie(
            &|l| l.header().head.0.store(12, Release),
            "oldest record 12",
        );
        lie(&|l| l.header().head.0.store(1 << 20, Release), "past 16");
        lie(&|l| l.write(0, &1000u32.to_le_bytes()), "does not fit");
        lie(&|l| l.write(0, &PAD_LEN.to_le_bytes()), "padding past");
        // A published end far past the reader while the oldest record stays behind it.
        lie(
            &|l| l.header().tail.0.store(16 + 8192, Release),
            "stays more than its size",
        );
        // A published end that goes back, after a first read.
        let (l, mut w) = log(4096);
        let mut r = l.reader().unwrap();
        w.push_parts(&[b"hello"]).unwrap();
        w.publish();
        let (mut out, mut spans) = (BytesMut::new(), Vec::new());
        assert_eq!(r.read_into(4096, &mut out, &mut spans).unwrap().records, 1);
        l.header().tail.0.store(8, Release);
        let e = r.read_into(4096, &mut out, &mut spans).unwrap_err();
        assert!(e.why.contains("went back"), "{e}");
    }

    #[test]
    fn a_log_opens_read_only_from_its_descriptor_and_checks_its_binding() {
        use std::os::fd::AsRawFd;
        let binding = Binding {
            token: 77,
            writer: 5,
            reader: 0,
        };
        let (l, mut w) = Log::create("busway-test-log", 8192, binding).unwrap();
        let seg = l.segment();
        let (pid, fd, inode) = (
            std::process::id(),
            seg.fd().as_raw_fd() as u32,
            seg.inode().unwrap(),
        );
        let open = |b: &Binding, max| {
            Log::open(
                Segment::open_read_only_from_process(pid, fd, inode).unwrap(),
                b,
                max,
            )
        };
        let other = Binding {
            token: 78,
            ..binding
        };
        assert!(open(&other, 8192)
            .err()
            .unwrap()
            .to_string()
            .contains("token"));
        let liar = Binding {
            writer: 6,
            ..binding
        };
        assert!(open(&liar, 8192)
            .err()
            .unwrap()
            .to_string()
            .contains("written by bus id 5"));
        assert!(open(&binding, 4096)
            .err()
            .unwrap()
            .to_string()
            .contains("over the 4096"));
        let opened = open(&binding, 8192).unwrap();
        let mut r = opened.reader().unwrap();
        w.push_parts(&[b"one copy"]).unwrap();
        w.publish();
        let (got, _) = read_all(&mut r);
        assert_eq!(got, vec![b"one copy".to_vec()]);
    }

    #[test]
    fn readers_on_other_threads_never_see_a_torn_record() {
        let (l, mut w) = log(4096);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (mut r, done) = (l.reader().unwrap(), done.clone());
                std::thread::spawn(move || {
                    let (mut out, mut spans) = (BytesMut::new(), Vec::new());
                    let (mut last, mut got) = (None::<u32>, 0u64);
                    while !done.load(Relaxed) || r.is_readable() {
                        out.clear();
                        spans.clear();
                        r.read_into(1024, &mut out, &mut spans).unwrap();
                        for &(s, l) in &spans {
                            let rec = &out[s as usize..(s + l) as usize];
                            let n = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
                            // Whole: every byte after the number is the number's low byte.
                            assert!(rec[4..].iter().all(|&b| b == n as u8), "torn record {n}");
                            assert!(last.is_none_or(|x| n > x), "{n} after {last:?}");
                            last = Some(n);
                            got += 1;
                        }
                    }
                    got
                })
            })
            .collect();
        for n in 0..200_000u32 {
            let body = vec![n as u8; 4 + (n % 90) as usize];
            w.push_parts(&[&n.to_le_bytes(), &body[4..]]).unwrap();
            w.publish();
        }
        done.store(true, Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    }
}
