//! Message sizes drawn uniformly from a range, the same sequence for busway and the raw
//! baseline (a fixed-seed xorshift, no allocation per draw).

pub(crate) struct Sizes {
    state: u64,
    min: usize,
    span: u64,
}

impl Sizes {
    pub(crate) fn new(min: usize, max: usize) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15,
            min,
            span: (max - min + 1) as u64,
        }
    }

    /// The next `n` sizes.
    pub(crate) fn pool(mut self, n: usize) -> Vec<usize> {
        (0..n).map(|_| self.next_size()).collect()
    }

    pub(crate) fn next_size(&mut self) -> usize {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        // Multiply-shift instead of `%`: a division per draw would cost more than a message.
        self.min + (((self.state >> 32) * self.span) >> 32) as usize
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn stays_in_range_and_covers_it() {
        let mut s = super::Sizes::new(8, 128);
        let v: Vec<usize> = (0..10_000).map(|_| s.next_size()).collect();
        assert!(v.iter().all(|&x| (8..=128).contains(&x)));
        assert!(v.contains(&8) && v.contains(&128));
    }
}
