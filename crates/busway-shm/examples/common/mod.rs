//! What the ring examples share: their arguments and the record sizes they send.

/// `MIN MAX [SECONDS]` from the command line: record sizes in bytes (8-128 by default) and
/// seconds per row (`default_secs`).
pub(crate) fn size_args(default_secs: u64) -> (u64, u64, u64) {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments are MIN MAX [SECONDS]"))
        .collect();
    (
        args.first().copied().unwrap_or(8),
        args.get(1).copied().unwrap_or(128),
        args.get(2).copied().unwrap_or(default_secs),
    )
}

/// 4096 record sizes uniform in `min..=max` (xorshift from `seed`), drawn before the clock
/// starts.
pub(crate) fn sizes(min: u64, max: u64, seed: u64) -> Vec<usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (min + x % (max - min + 1)) as usize
        })
        .collect()
}
