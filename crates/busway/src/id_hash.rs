//! A hasher for tables keyed by bus id, looked up on every send: one folded multiply instead
//! of SipHash. Keyed per table from the standard library's random state, so that ids
//! chosen to collide cannot be predicted (an authenticated peer chooses its id).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Builds [`IdHasher`]s with a random key.
#[derive(Clone)]
pub(crate) struct IdHashState {
    key: u64,
}

impl Default for IdHashState {
    fn default() -> Self {
        Self {
            key: RandomState::new().hash_one(0x6275_7377_6179u64),
        }
    }
}

impl BuildHasher for IdHashState {
    type Hasher = IdHasher;

    fn build_hasher(&self) -> IdHasher {
        IdHasher {
            key: self.key,
            hash: 0,
        }
    }
}

/// See the module's note; anything but a `u64` is folded in byte by byte.
pub(crate) struct IdHasher {
    key: u64,
    hash: u64,
}

/// An odd constant with bits spread evenly (2^64 / the golden ratio).
const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.hash.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        // A folded multiply (as wyhash and ahash do): the high half of the 128-bit product
        // depends on every bit of the id and goes into the low bits that pick a bucket.
        let m = u128::from(x ^ self.key) * u128::from(MULTIPLIER);
        self.hash = (m as u64) ^ ((m >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_that_differ_only_in_high_bits_spread_over_buckets() {
        let state = IdHashState::default();
        // Zone in the high half, server in the low: low bits of the hash must still differ.
        let low_bits: HashSet<u64> = (0..1024u64)
            .map(|zone| state.hash_one(busway_core::BusId(zone << 32 | 7)) & 0x3ff)
            .collect();
        assert!(
            low_bits.len() > 500,
            "{} distinct buckets of 1024",
            low_bits.len()
        );
        assert_ne!(
            IdHashState::default().hash_one(1u64),
            IdHashState::default().hash_one(1u64),
            "keyed per table"
        );
    }
}
