//! Entry point for the `ring_reader` fuzz target (`fuzz/`), kept here so that a property test
//! runs the very same code on every `cargo test`.
//!
//! The peer on the other end of a link writes the ring we read: it can put any bytes in the
//! data area and any value in `tail`. The consumer must report that as [`crate::Corrupt`] and
//! never read outside the ring, deliver a record longer than the ring allows, or panic.

use crate::ring::{Binding, Ring};
use crate::Segment;

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

    proptest! {
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
