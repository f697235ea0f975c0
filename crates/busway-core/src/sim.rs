//! Helpers for the simulations (the end-to-end path in `e2e`'s tests and the cluster in
//! `tests/cluster.rs`): a seeded random source and the messages inside a ROUTED DATA frame.
//! Test support, not protocol: nothing in busway uses it at run time.

use crate::frame::{for_each_batch_entry, FrameDecoder, BODY_LEN_CEILING, HEADER_LEN};
use crate::FrameKind;

/// xorshift64*: a deterministic sequence per seed.
pub struct SimRng(u64);

impl SimRng {
    /// A generator whose sequence is fixed by `seed` (any seed, 0 included).
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next number of the sequence, uniform over all `u64`s.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// The payloads of the DATA and DATA_BATCH frames in a ROUTED DATA frame's inner part.
/// Panics on a malformed part: the simulations only feed it what busway-core wrote.
pub fn inner_messages(inner: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // As a destination reads them: the ROUTED frame's content check covered these bytes, and
    // sources write them without checks of their own.
    let mut dec = FrameDecoder::new(BODY_LEN_CEILING).skip_checks();
    let mut rest = inner;
    while let Some((kind, len)) = dec.peek(rest).expect("inner frames are valid") {
        let body = &rest[HEADER_LEN..len];
        if kind == FrameKind::DataBatch {
            for_each_batch_entry(body, |s, n| out.push(body[s..s + n].to_vec()))
                .expect("batch entries are valid");
        } else {
            out.push(body.to_vec());
        }
        rest = &rest[len..];
    }
    out
}
