//! Entry point for the `ring_reader` fuzz target (`fuzz/`), kept here so that a property test
//! runs the very same code on every `cargo test`.
//!
//! The peer on the other end of a link writes the ring we read: it can put any bytes in the
//! data area and any value in `tail`. The consumer must report that as [`crate::Corrupt`] and
//! never read outside the ring, deliver a record longer than the ring allows, or panic.

use crate::ring::Ring;

/// Capacity of the ring the fuzz input is written into, in bytes.
const FUZZ_RING_BYTES: usize = 4096;

/// Reads a ring whose data area holds `data` (from the front, cut to the ring) and whose
/// published end is `tail`: the first input byte picks a checked or unchecked ring, the next
/// eight are `tail`. Returns the records delivered before the first error or the end.
pub fn ring_reader(input: &[u8]) -> Vec<Vec<u8>> {
    let Some((&mode, rest)) = input.split_first() else {
        return Vec::new();
    };
    let Some((tail, data)) = rest.split_first_chunk::<8>() else {
        return Vec::new();
    };
    let ring = if mode & 1 == 0 {
        Ring::create("busway-fuzz", FUZZ_RING_BYTES)
    } else {
        Ring::create_unchecked("busway-fuzz", FUZZ_RING_BYTES)
    }
    .expect("a ring of a valid capacity");
    ring.scribble_for_fuzzing(
        &data[..data.len().min(FUZZ_RING_BYTES)],
        u64::from_le_bytes(*tail),
    );
    let mut consumer = ring.consumer();
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
        let mut input = vec![1u8];
        input.extend_from_slice(&16u64.to_le_bytes());
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(&[0; 4]);
        input.extend_from_slice(b"hi\0\0\0\0\0\0");
        assert_eq!(ring_reader(&input), vec![b"hi".to_vec()]);
        // The same in a checked ring fails its check (zero), and nothing is delivered.
        input[0] = 0;
        assert!(ring_reader(&input).is_empty());
    }

    proptest! {
        #[test]
        fn any_ring_image_is_read_without_panic(input in prop::collection::vec(any::<u8>(), 0..600)) {
            ring_reader(&input);
        }

        #[test]
        fn any_published_end_over_plausible_records_is_read_without_panic(
            tail in 0u64..9000,
            lens in prop::collection::vec(0u32..3000, 0..40),
            unchecked in any::<bool>(),
        ) {
            let mut input = vec![u8::from(unchecked)];
            input.extend_from_slice(&tail.to_le_bytes());
            for len in lens {
                input.extend_from_slice(&len.to_le_bytes());
                input.extend_from_slice(&[0; 4]);
                input.extend(std::iter::repeat_n(7u8, (len as usize % 64).next_multiple_of(8)));
            }
            ring_reader(&input);
        }
    }
}
