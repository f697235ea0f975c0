//! Checks the sequence numbers that `busway send --count` puts at the start of each payload.

/// Bytes of the little-endian sequence number at the start of a sequenced payload.
pub(crate) const SEQ_LEN: usize = 8;

/// Counts what arrived against what was sent: 0, 1, 2, ... with no gap, repeat or reordering.
#[derive(Default, Debug)]
pub(crate) struct Verifier {
    /// One bit per sequence number seen.
    seen: Vec<u64>,
    distinct: u64,
    received: u64,
    duplicates: u64,
    out_of_order: u64,
    too_short: u64,
    /// One past the highest sequence number seen.
    high: u64,
}

/// Largest sequence number tracked (the bitmap would otherwise grow without bound): 2^32.
const SEQ_TRACKED_MAX: u64 = 1 << 32;

impl Verifier {
    pub(crate) fn record(&mut self, payload: &[u8]) {
        self.received += 1;
        let Some(head) = payload.get(..SEQ_LEN) else {
            self.too_short += 1;
            return;
        };
        let seq = u64::from_le_bytes(head.try_into().unwrap_or_default());
        if seq >= SEQ_TRACKED_MAX {
            self.too_short += 1;
            return;
        }
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if self.seen.len() <= word {
            self.seen.resize(word + 1, 0);
        }
        if self.seen[word] & (1 << bit) != 0 {
            self.duplicates += 1;
            return;
        }
        self.seen[word] |= 1 << bit;
        self.distinct += 1;
        if seq + 1 < self.high {
            self.out_of_order += 1;
        }
        self.high = self.high.max(seq + 1);
    }

    /// Counts a message without reading a sequence number from it.
    pub(crate) fn count_unchecked(&mut self) {
        self.received += 1;
    }

    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// The summary line, and whether everything `expected` (or everything up to the highest
    /// number seen) arrived once, in order.
    pub(crate) fn summary(&self, expected: Option<u64>) -> (String, bool) {
        let total = expected.unwrap_or(0).max(self.high);
        let missing = total - self.distinct;
        let line = format!(
            "received {}, missing {}, duplicates {}, out-of-order {}{}",
            self.received,
            missing,
            self.duplicates,
            self.out_of_order,
            if self.too_short > 0 {
                format!(", unreadable {}", self.too_short)
            } else {
                String::new()
            }
        );
        let ok =
            missing == 0 && self.duplicates == 0 && self.out_of_order == 0 && self.too_short == 0;
        (line, ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seqs: &[u64], expected: Option<u64>) -> (String, bool) {
        let mut v = Verifier::default();
        for s in seqs {
            v.record(&s.to_le_bytes());
        }
        v.summary(expected)
    }

    #[test]
    fn counts_gaps_repeats_and_reordering() {
        assert_eq!(
            run(&[0, 1, 2], Some(3)),
            (
                "received 3, missing 0, duplicates 0, out-of-order 0".into(),
                true
            )
        );
        assert_eq!(
            run(&[0, 2], None).0,
            "received 2, missing 1, duplicates 0, out-of-order 0"
        );
        assert_eq!(
            run(&[0, 1, 1], None).0,
            "received 3, missing 0, duplicates 1, out-of-order 0"
        );
        assert_eq!(
            run(&[1, 0], None).0,
            "received 2, missing 0, duplicates 0, out-of-order 1"
        );
        assert!(!run(&[0, 1], Some(3)).1, "a missing tail is a failure");
    }
}
