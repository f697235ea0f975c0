//! Entry points for the `ring_reader` and `log_reader` fuzz targets (`fuzz/`), kept here so
//! that property tests run the very same code on every `cargo test`.
//!
//! The peer on the other end of a link writes the ring we read: it can put any bytes in the
//! data area and any value in `tail`. The consumer must report that as [`crate::Corrupt`] and
//! never read outside the ring, deliver a record longer than the ring allows, or panic. The
//! same holds for a group's log and its readers: its writer is a peer too, and can put any
//! value in `tail`, `head`, the header's fixed words and every record length.

use crate::log::{Log, LOG_CAPACITY_MIN};
use crate::ring::{Binding, Ring, RECORD_HEADER_BYTES};
use crate::Segment;
use bytes::BytesMut;
use std::os::fd::AsRawFd;

/// Capacity of the ring the fuzz input is written into, in bytes.
const FUZZ_RING_BYTES: usize = 4096;
/// The binding the reader expects of the fuzzed ring.
const FUZZ_BINDING: Binding = Binding {
    token: 0x5eed_0ff0_2db1_4d00,
    writer: 2,
    reader: 1,
};

/// Mode bits (the first input byte).
const MODE_UNCHECKED: u8 = 1;
/// The header's fixed words come from the input, and the ring is opened as a peer's is.
const MODE_HEADER: u8 = 2;
/// With `MODE_HEADER`: the magic and capacity words are the right ones (so that most inputs
/// reach the checks behind them).
const MODE_VALID_SHAPE: u8 = 4;
/// With `MODE_HEADER`: the binding words are the ones expected.
const MODE_VALID_BINDING: u8 = 8;

fn take<const N: usize>(input: &mut &[u8]) -> Option<[u8; N]> {
    let (first, rest) = input.split_first_chunk::<N>()?;
    *input = rest;
    Some(*first)
}

/// Reads a ring written by a hostile peer. Input: a mode byte, the reading position `head`
/// and the published end `tail` (8 bytes each, little-endian), with `MODE_HEADER` the six
/// fixed header words (magic, capacity, flags, token, writer, reader; 48 bytes), then the
/// data area (from the front, cut to the ring). With `MODE_HEADER` the ring is opened as a
/// peer's ring is (`Ring::open` with a binding and a capacity limit); the consumer is made
/// from whatever `head` says. Returns the records delivered before the first error or the end.
pub fn ring_reader(input: &[u8]) -> Vec<Vec<u8>> {
    let mut input = input;
    let (Some([mode]), Some(head), Some(tail)) = (
        take::<1>(&mut input),
        take::<8>(&mut input),
        take::<8>(&mut input),
    ) else {
        return Vec::new();
    };
    let made = if mode & MODE_UNCHECKED == 0 {
        Ring::create("busway-fuzz", FUZZ_RING_BYTES)
    } else {
        Ring::create_unchecked("busway-fuzz", FUZZ_RING_BYTES)
    };
    let mut ring = made.expect("a ring of a valid capacity");
    if mode & MODE_HEADER != 0 {
        let Some(raw) = take::<48>(&mut input) else {
            return Vec::new();
        };
        let mut words: [u64; 6] = std::array::from_fn(|i| {
            u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or_default())
        });
        if mode & MODE_VALID_SHAPE != 0 {
            words[0] = Ring::MAGIC_FOR_FUZZING;
            words[1] = FUZZ_RING_BYTES as u64;
        }
        if mode & MODE_VALID_BINDING != 0 {
            words[3] = FUZZ_BINDING.token;
            words[4] = FUZZ_BINDING.writer;
            words[5] = FUZZ_BINDING.reader;
        }
        ring.scribble_header_for_fuzzing(words);
        let opened = ring
            .segment()
            .fd()
            .try_clone_to_owned()
            .and_then(Segment::from_fd)
            .map_err(|e| e.to_string())
            .and_then(|seg| {
                Ring::open(seg, &FUZZ_BINDING, FUZZ_RING_BYTES).map_err(|e| e.to_string())
            });
        match opened {
            Ok(r) => ring = r,
            Err(_) => return Vec::new(),
        }
    }
    ring.scribble_for_fuzzing(
        &input[..input.len().min(FUZZ_RING_BYTES)],
        u64::from_le_bytes(head),
        u64::from_le_bytes(tail),
    );
    let Ok(mut consumer) = ring.consumer() else {
        return Vec::new();
    };
    let mut got = Vec::new();
    // Each good read moves `head` forward; stop at the first error or when nothing is left.
    while let Ok(n) = consumer.read(usize::MAX, |r| {
        assert!(
            r.len() <= ring.payload_max(),
            "a record longer than the ring allows"
        );
        got.push(r.to_vec());
    }) {
        if n == 0 {
            break;
        }
    }
    got
}

/// Size of the data area of the log the fuzz input is written into, in bytes (the smallest a
/// log may have: the fewer bytes, the more often an input reaches the end and wraps).
const FUZZ_LOG_BYTES: usize = LOG_CAPACITY_MIN;
/// Largest data area the fuzzed log's reader accepts when it opens the log, in bytes: above
/// the segment's, so that a capacity word too large for the segment meets the check that the
/// data area fits in the mapping (the one that keeps reads inside it), not only this limit.
const FUZZ_LOG_OPEN_BYTES_MAX: usize = 4 * FUZZ_LOG_BYTES;
/// The binding the reader expects of the fuzzed log (`reader` 0: any member given the token).
const FUZZ_LOG_BINDING: Binding = Binding {
    token: 0x5eed_0ff0_2db1_4d01,
    writer: 3,
    reader: 0,
};
/// Calls to `read_into` per input: enough to go past a first read, a record cut by the end
/// of a copy and an overrun, few enough that no input runs long.
const FUZZ_LOG_READS: usize = 8;
/// `bytes_max` of each read, in bytes: small, so that a read stops part-way through what is
/// published (the reader still takes one largest record per read) and the next one resumes.
const FUZZ_LOG_READ_BYTES_MAX: usize = 64;
/// Records start at multiples of this many bytes (as the writer lays them out).
const FUZZ_LOG_RECORD_ALIGN: usize = 8;
/// Length word of a record, as the data in `LOG_MODE_RECORDS`, that stands for padding to the
/// end of the data area.
const FUZZ_LOG_PAD: u16 = u16::MAX;

/// Log mode bits (the first input byte).
/// The data bytes are record lengths (u16, little-endian; `FUZZ_LOG_PAD`: padding), written
/// as record headers from `head` on and round the end, as the writer lays records out: most
/// inputs get past the first record header, and a length the writer could not have written
/// is a lie that meets the checks behind it.
const LOG_MODE_RECORDS: u8 = 1;
/// `head` is rounded down to a record's start and `tail` is `head` plus less than twice the
/// log's size, rounded too: most inputs pass the checks of the two words and read records.
const LOG_MODE_NEAR_ENDS: u8 = 2;
/// The header's fixed words come from the input, and the log is read through a second
/// mapping, read-only, opened as a group member opens a log (`Log::open`).
const LOG_MODE_OPEN: u8 = 4;
/// With `LOG_MODE_OPEN`: the magic and capacity words are the right ones.
const LOG_MODE_VALID_SHAPE: u8 = 8;
/// With `LOG_MODE_OPEN`: the binding words are the ones expected.
const LOG_MODE_VALID_BINDING: u8 = 16;

/// Reads a group's log written by a hostile writer. Input: a mode byte, the published end
/// `tail` and the oldest whole record `head` (8 bytes each, little-endian), with
/// `LOG_MODE_OPEN` the five fixed header words (magic, capacity, token, writer, reader; 40
/// bytes), then the data area (from the front, cut to the log), or with `LOG_MODE_RECORDS`
/// the record lengths to lay out in it. The reader is made on the fresh log (at position 0)
/// before the writer's words are scribbled, as a member's reader is made before the writer
/// goes on; with `LOG_MODE_OPEN` it reads a second, read-only mapping opened with a binding
/// and a capacity limit. Returns the records delivered before the first error or after
/// `FUZZ_LOG_READS` reads.
pub fn log_reader(input: &[u8]) -> Vec<Vec<u8>> {
    let mut input = input;
    let (Some([mode]), Some(tail), Some(head)) = (
        take::<1>(&mut input),
        take::<8>(&mut input),
        take::<8>(&mut input),
    ) else {
        return Vec::new();
    };
    let (mut tail, mut head) = (u64::from_le_bytes(tail), u64::from_le_bytes(head));
    if mode & LOG_MODE_NEAR_ENDS != 0 {
        let align = FUZZ_LOG_RECORD_ALIGN as u64;
        head -= head % align;
        let ahead = tail % (2 * FUZZ_LOG_BYTES as u64);
        tail = head.wrapping_add(ahead - ahead % align);
    }
    let (log, _writer) = Log::create("busway-fuzz-log", FUZZ_LOG_BYTES, FUZZ_LOG_BINDING)
        .expect("a log of a valid capacity");
    let read_log = if mode & LOG_MODE_OPEN != 0 {
        let Some(raw) = take::<40>(&mut input) else {
            return Vec::new();
        };
        let mut words: [u64; 5] = std::array::from_fn(|i| {
            u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or_default())
        });
        if mode & LOG_MODE_VALID_SHAPE != 0 {
            words[0] = Log::MAGIC_FOR_FUZZING;
            words[1] = FUZZ_LOG_BYTES as u64;
        }
        if mode & LOG_MODE_VALID_BINDING != 0 {
            words[2] = FUZZ_LOG_BINDING.token;
            words[3] = FUZZ_LOG_BINDING.writer;
            words[4] = FUZZ_LOG_BINDING.reader;
        }
        log.scribble_header_for_fuzzing(words);
        let segment = log.segment();
        let opened = segment
            .inode()
            .and_then(|inode| {
                let fd = segment.fd().as_raw_fd() as u32;
                Segment::open_read_only_from_process(std::process::id(), fd, inode)
            })
            .map_err(|e| e.to_string())
            .and_then(|seg| {
                Log::open(seg, &FUZZ_LOG_BINDING, FUZZ_LOG_OPEN_BYTES_MAX)
                    .map_err(|e| e.to_string())
            });
        match opened {
            Ok(l) => l,
            Err(_) => return Vec::new(),
        }
    } else {
        log.clone()
    };
    let Ok(mut reader) = read_log.reader() else {
        return Vec::new();
    };
    if mode & LOG_MODE_RECORDS != 0 {
        log.scribble_for_fuzzing(&log_records_image(input, head), head, tail);
    } else {
        log.scribble_for_fuzzing(&input[..input.len().min(FUZZ_LOG_BYTES)], head, tail);
    }
    let record_max = read_log.record_max();
    // Kept across reads, as a caller that batches reads keeps them: spans are offsets into
    // `out` after what earlier reads left there.
    let (mut out, mut spans) = (BytesMut::new(), Vec::new());
    let mut got = Vec::new();
    for _ in 0..FUZZ_LOG_READS {
        let spans_before = spans.len();
        let Ok(read) = reader.read_into(FUZZ_LOG_READ_BYTES_MAX, &mut out, &mut spans) else {
            break;
        };
        assert_eq!(
            read.records,
            spans.len() - spans_before,
            "records counted are not the spans given"
        );
        for &(start, len) in &spans[spans_before..] {
            let (start, len) = (start as usize, len as usize);
            assert!(len <= record_max, "a record longer than the log allows");
            assert!(
                start + len <= out.len(),
                "a record outside the bytes read ({start} + {len} > {})",
                out.len()
            );
            got.push(out[start..start + len].to_vec());
        }
    }
    got
}

/// A data area holding records as the writer lays them out, the first at `head`'s place and
/// going round the end: one per u16 (little-endian) of `lengths`, its header (the length, or
/// the padding word for `FUZZ_LOG_PAD`: padding to the end of the data area) then its
/// payload. Lengths are taken as they come, so that one too long for the log is written as
/// a writer that lies would write it.
fn log_records_image(lengths: &[u8], head: u64) -> Vec<u8> {
    let mut image = vec![0u8; FUZZ_LOG_BYTES];
    let mask = FUZZ_LOG_BYTES - 1;
    let mut at = (head as usize) & mask & !(FUZZ_LOG_RECORD_ALIGN - 1);
    // Bytes laid out so far: once the data area is full, more records would only overwrite.
    let mut laid = 0;
    for (n, len) in lengths.chunks_exact(2).enumerate() {
        if laid >= FUZZ_LOG_BYTES {
            break;
        }
        let len = u16::from_le_bytes([len[0], len[1]]);
        // `at` is a record's start (a multiple of 8) inside the data area: its header fits.
        image[at + 4..at + RECORD_HEADER_BYTES].fill(0);
        let size = if len == FUZZ_LOG_PAD {
            // The writer writes the padding's length word only; the rest is left as it was.
            image[at..at + 4].copy_from_slice(&Log::PAD_LEN_FOR_FUZZING.to_le_bytes());
            FUZZ_LOG_BYTES - at
        } else {
            image[at..at + 4].copy_from_slice(&u32::from(len).to_le_bytes());
            let size =
                RECORD_HEADER_BYTES + usize::from(len).next_multiple_of(FUZZ_LOG_RECORD_ALIGN);
            // Its number's low byte, so that records read back can be told apart; a length
            // longer than the log overwrites what came before, as it would in the log.
            for i in RECORD_HEADER_BYTES..size.min(FUZZ_LOG_BYTES) {
                image[(at + i) & mask] = n as u8;
            }
            size
        };
        at = (at + size) & mask;
        laid += size;
    }
    image
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_well_formed_ring_image_reads_back() {
        // One unchecked record "hi" (length 2, padded to 8) and a published end after it.
        let mut input = vec![MODE_UNCHECKED];
        input.extend_from_slice(&0u64.to_le_bytes());
        input.extend_from_slice(&16u64.to_le_bytes());
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(&[0; 4]);
        input.extend_from_slice(b"hi\0\0\0\0\0\0");
        assert_eq!(ring_reader(&input), vec![b"hi".to_vec()]);
        // The same in a checked ring fails its check (zero), and nothing is delivered.
        input[0] = 0;
        assert!(ring_reader(&input).is_empty());
    }

    /// A ring image holding the unchecked record "hi" at the data area's start, read from
    /// `head` (the data area repeats every FUZZ_RING_BYTES) up to 16 bytes after it.
    fn hi_at(mode: u8, head: u64, words: Option<[u64; 6]>) -> Vec<u8> {
        let mut input = vec![mode | MODE_UNCHECKED];
        input.extend_from_slice(&head.to_le_bytes());
        input.extend_from_slice(&head.wrapping_add(16).to_le_bytes());
        for w in words.into_iter().flatten() {
            input.extend_from_slice(&w.to_le_bytes());
        }
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(&[0; 4]);
        input.extend_from_slice(b"hi\0\0\0\0\0\0");
        input
    }

    #[test]
    fn a_reading_position_anywhere_in_the_stream_reads_its_record() {
        let head = 7 * FUZZ_RING_BYTES as u64;
        assert_eq!(ring_reader(&hi_at(0, head, None)), vec![b"hi".to_vec()]);
    }

    #[test]
    fn a_reading_position_off_a_record_start_is_refused() {
        // 4 bytes before the end of the data area: a record header read there would run past
        // the end (it did: the reader panicked inside the application's `recv`).
        let head = FUZZ_RING_BYTES as u64 - 4;
        assert!(ring_reader(&hi_at(0, head, None)).is_empty());
    }

    #[test]
    fn an_opened_ring_must_be_the_one_offered_and_within_the_limit() {
        let good = [
            Ring::MAGIC_FOR_FUZZING,
            FUZZ_RING_BYTES as u64,
            1,
            FUZZ_BINDING.token,
            FUZZ_BINDING.writer,
            FUZZ_BINDING.reader,
        ];
        let read = |words: [u64; 6]| ring_reader(&hi_at(MODE_HEADER, 0, Some(words)));
        assert_eq!(read(good), vec![b"hi".to_vec()]);
        for (i, lie) in [
            (0, 1),
            (1, 2 * FUZZ_RING_BYTES as u64),
            (3, 9),
            (4, 1),
            (5, 2),
        ] {
            let mut words = good;
            words[i] = lie;
            assert!(read(words).is_empty(), "header word {i} = {lie} was taken");
        }
        let err = |binding: Binding| {
            let ring = Ring::create_bound("busway-test", FUZZ_RING_BYTES, binding).unwrap();
            let seg = Segment::from_fd(ring.segment().fd().try_clone_to_owned().unwrap()).unwrap();
            Ring::open(seg, &FUZZ_BINDING, FUZZ_RING_BYTES)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(err(FUZZ_BINDING), None);
        let ours = Binding {
            writer: FUZZ_BINDING.reader,
            reader: FUZZ_BINDING.writer,
            ..FUZZ_BINDING
        };
        assert!(err(ours).unwrap().contains("written by bus id 1, not by 2"));
        let other = Binding {
            token: 1,
            ..FUZZ_BINDING
        };
        assert!(err(other).unwrap().contains("token is not the one offered"));
    }

    /// A `log_reader` input: the mode, the published end `tail`, the oldest whole record
    /// `head`, the header words (with `LOG_MODE_OPEN`), then the data area.
    fn log_input(mode: u8, tail: u64, head: u64, words: Option<[u64; 5]>, data: &[u8]) -> Vec<u8> {
        let mut input = vec![mode];
        input.extend_from_slice(&tail.to_le_bytes());
        input.extend_from_slice(&head.to_le_bytes());
        for w in words.into_iter().flatten() {
            input.extend_from_slice(&w.to_le_bytes());
        }
        input.extend_from_slice(data);
        input
    }

    /// A record as the writer lays it out: its length, a zero word, the payload, zero padding
    /// to a record's start.
    fn log_record(payload: &[u8]) -> Vec<u8> {
        let mut rec = (payload.len() as u32).to_le_bytes().to_vec();
        rec.extend_from_slice(&[0; 4]);
        rec.extend_from_slice(payload);
        rec.resize(rec.len().next_multiple_of(FUZZ_LOG_RECORD_ALIGN), 0);
        rec
    }

    /// Two records, "hello" then "abc", at the data area's start.
    fn hello_abc() -> Vec<u8> {
        [log_record(b"hello"), log_record(b"abc")].concat()
    }

    /// The header words of the log as its writer makes it: opened, it is the one offered.
    const LOG_GOOD_WORDS: [u64; 5] = [
        Log::MAGIC_FOR_FUZZING,
        FUZZ_LOG_BYTES as u64,
        FUZZ_LOG_BINDING.token,
        FUZZ_LOG_BINDING.writer,
        FUZZ_LOG_BINDING.reader,
    ];

    #[test]
    fn a_well_formed_log_image_reads_back() {
        let data = hello_abc();
        let both = vec![b"hello".to_vec(), b"abc".to_vec()];
        assert_eq!(log_reader(&log_input(0, 32, 0, None, &data)), both);
        // Published up to the first record only: the second is not read.
        assert_eq!(
            log_reader(&log_input(0, 16, 0, None, &data)),
            vec![b"hello".to_vec()]
        );
        // The same laid out from lengths, anywhere in the stream.
        let lengths = [5u16.to_le_bytes(), 3u16.to_le_bytes()].concat();
        let far = 1000 * FUZZ_LOG_BYTES as u64;
        let got = log_reader(&log_input(LOG_MODE_RECORDS, far + 32, far, None, &lengths));
        assert_eq!(got, vec![vec![0u8; 5], vec![1u8; 3]]);
        // Through a read-only mapping opened as a member opens it.
        let open = log_input(LOG_MODE_OPEN, 32, 0, Some(LOG_GOOD_WORDS), &data);
        assert_eq!(log_reader(&open), both);
    }

    #[test]
    fn a_log_image_reads_across_the_padding_at_the_end() {
        // "hi" at the data area's start, the padding before it 16 bytes before the end; the
        // reader starts at the padding (where `head` says the oldest record is).
        let mut data = vec![0u8; FUZZ_LOG_BYTES];
        data[..16].copy_from_slice(&log_record(b"hi"));
        data[FUZZ_LOG_BYTES - 16..][..4].copy_from_slice(&Log::PAD_LEN_FOR_FUZZING.to_le_bytes());
        let end = FUZZ_LOG_BYTES as u64;
        let got = log_reader(&log_input(0, end + 16, end - 16, None, &data));
        assert_eq!(got, vec![b"hi".to_vec()]);
        // The same laid out from lengths.
        let lengths = [FUZZ_LOG_PAD.to_le_bytes(), 2u16.to_le_bytes()].concat();
        let got = log_reader(&log_input(
            LOG_MODE_RECORDS,
            end + 16,
            end - 16,
            None,
            &lengths,
        ));
        assert_eq!(got, vec![vec![1u8; 2]]);
    }

    #[test]
    fn each_lie_in_the_log_is_refused_not_followed() {
        let data = hello_abc();
        let read =
            |tail: u64, head: u64, data: &[u8]| log_reader(&log_input(0, tail, head, None, data));
        // The published end is not at a record's start.
        assert!(read(13, 0, &data).is_empty());
        // The oldest record is past the published end and the log's size.
        assert!(read(16, 16 + 2 * FUZZ_LOG_BYTES as u64, &data).is_empty());
        // A record length past the published end (1000 bytes, 16 published).
        let long = [&1000u32.to_le_bytes()[..], &[0; 12]].concat();
        assert!(read(16, 0, &long).is_empty());
        // A record length past what the log allows, inside what is published.
        let huge = [&(FUZZ_LOG_BYTES as u32).to_le_bytes()[..], &[0; 4]].concat();
        assert!(read(FUZZ_LOG_BYTES as u64, 0, &huge).is_empty());
        // Padding to the end of the data area, 16 bytes published.
        let pad = [&Log::PAD_LEN_FOR_FUZZING.to_le_bytes()[..], &[0; 12]].concat();
        assert!(read(16, 0, &pad).is_empty());
        // The oldest record is not at a record's start.
        assert!(read(32, 4, &data).is_empty());
        // The oldest record is where the writer says, but what is there is payload: "hell"
        // read as a length.
        assert!(read(16, 8, &data).is_empty());
        // A first read takes a record that fills its copy (half the log); the lie after it is
        // found by the second: the result is short, not empty.
        let first = log_record(&vec![7u8; FUZZ_LOG_BYTES / 2 - RECORD_HEADER_BYTES]);
        let data = [first, long].concat();
        let got = read(FUZZ_LOG_BYTES as u64 / 2 + 16, 0, &data);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), FUZZ_LOG_BYTES / 2 - RECORD_HEADER_BYTES);
    }

    /// The position `back` bytes before 2^64.
    fn below_2_64(back: u64) -> u64 {
        u64::MAX - back + 1
    }

    /// `log_reader` on records of `lengths` laid out from `head`, published up to `tail`.
    fn read_lengths(tail: u64, head: u64, lengths: &[u16]) -> Vec<Vec<u8>> {
        let lengths: Vec<u8> = lengths.iter().flat_map(|l| l.to_le_bytes()).collect();
        log_reader(&log_input(LOG_MODE_RECORDS, tail, head, None, &lengths))
    }

    #[test]
    fn a_read_whose_copy_would_end_past_2_64_reads_what_is_published() {
        // Found by the fuzz target: the end of a read's copy (its start plus half the log)
        // was a sum that wrapped; the reader panicked (overflow checks) or, without them,
        // read nothing, ever.
        let head = below_2_64(1024);
        assert_eq!(read_lengths(head + 16, head, &[2]), vec![vec![0u8; 2]]);
    }

    #[test]
    fn a_record_or_padding_that_would_end_at_2_64_is_refused_not_followed() {
        // One record of 2032 bytes from 2056 bytes below 2^64 to 16 below, published up to 8
        // below: what follows it, padding or a record, would end at 2^64. The sum wrapped to
        // 0, passed the checks, and the reader indexed its copy at 0 - start: out of bounds.
        let (head, tail) = (below_2_64(2056), below_2_64(8));
        assert!(read_lengths(tail, head, &[2032, FUZZ_LOG_PAD]).is_empty());
        assert!(read_lengths(tail, head, &[2032, 8]).is_empty());
        // Published up to the end of the first record, it is read.
        let tail = below_2_64(16);
        assert_eq!(read_lengths(tail, head, &[2032, 8]), vec![vec![0u8; 2032]]);
    }

    #[test]
    fn an_opened_log_must_be_the_one_offered_and_fit_its_segment() {
        let data = hello_abc();
        let read =
            |words: [u64; 5]| log_reader(&log_input(LOG_MODE_OPEN, 32, 0, Some(words), &data));
        assert_eq!(read(LOG_GOOD_WORDS).len(), 2);
        for (i, lie) in [
            (0, 1),
            // A power of two under the reader's limit, too large for the segment.
            (1, 2 * FUZZ_LOG_BYTES as u64),
            // Over the reader's limit.
            (1, 8 * FUZZ_LOG_BYTES as u64),
            (1, FUZZ_LOG_BYTES as u64 + 8),
            (1, 0),
            (2, 9),
            (3, 1),
        ] {
            let mut words = LOG_GOOD_WORDS;
            words[i] = lie;
            assert!(read(words).is_empty(), "header word {i} = {lie} was taken");
        }
    }

    proptest! {
        #[test]
        fn any_log_image_is_read_without_panic(input in prop::collection::vec(any::<u8>(), 0..600)) {
            log_reader(&input);
        }

        #[test]
        fn any_record_lengths_near_the_ends_are_read_without_panic(
            mode in any::<u8>(),
            tail in any::<u64>(),
            head in any::<u64>(),
            lengths in prop::collection::vec(any::<u16>(), 0..40),
        ) {
            let mode = (mode | LOG_MODE_RECORDS | LOG_MODE_NEAR_ENDS) & !LOG_MODE_OPEN;
            let lengths: Vec<u8> = lengths
                .iter()
                // Mostly lengths the writer could write, some lies, some padding.
                .map(|&l| match l % 16 {
                    0 => l,
                    1 => FUZZ_LOG_PAD,
                    _ => l % (FUZZ_LOG_BYTES as u16 / 2),
                })
                .flat_map(u16::to_le_bytes)
                .collect();
            log_reader(&log_input(mode, tail, head, None, &lengths));
        }

        #[test]
        fn any_log_header_is_opened_or_refused_without_panic(
            mode in any::<u8>(),
            tail in 0u64..9000,
            head in 0u64..9000,
            words in prop::array::uniform5(any::<u64>()),
            data in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            log_reader(&log_input(mode | LOG_MODE_OPEN, tail, head, Some(words), &data));
        }

        #[test]
        fn any_ring_image_is_read_without_panic(input in prop::collection::vec(any::<u8>(), 0..600)) {
            ring_reader(&input);
        }

        #[test]
        fn any_published_end_over_plausible_records_is_read_without_panic(
            head in any::<u64>(),
            ahead in 0u64..9000,
            lens in prop::collection::vec(0u32..3000, 0..40),
            unchecked in any::<bool>(),
        ) {
            let mut input = vec![u8::from(unchecked)];
            input.extend_from_slice(&head.to_le_bytes());
            input.extend_from_slice(&head.wrapping_add(ahead).to_le_bytes());
            for len in lens {
                input.extend_from_slice(&len.to_le_bytes());
                input.extend_from_slice(&[0; 4]);
                input.extend(std::iter::repeat_n(7u8, (len as usize % 64).next_multiple_of(8)));
            }
            ring_reader(&input);
        }

        #[test]
        fn any_header_is_opened_or_refused_without_panic(
            mode in any::<u8>(),
            head in any::<u64>(),
            ahead in 0u64..9000,
            words in prop::array::uniform6(any::<u64>()),
            data in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut input = vec![mode | MODE_HEADER];
            input.extend_from_slice(&head.to_le_bytes());
            input.extend_from_slice(&head.wrapping_add(ahead).to_le_bytes());
            for w in words {
                input.extend_from_slice(&w.to_le_bytes());
            }
            input.extend_from_slice(&data);
            ring_reader(&input);
        }
    }
}
