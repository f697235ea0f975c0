//! The records of a publisher's group log as a reader takes them (see `busway_shm::log`):
//! PUBLISH bodies, each one of the publisher's own publishes to that group under the cut-off
//! policy, all of one incarnation. Checked as bytes against what the reader holds (no UTF-8
//! check of the name per record); anything else is named in the error, and none is taken.

use super::{decode_publish, PublishHead, PUBLISH_FIXED_BYTES};
use super::{PUBLISH_BACKPRESSURE_BIT, PUBLISH_BATCH_BIT, PUBLISH_MARK_BIT};
use crate::BusId;

/// The heads of the records at `spans` (start, length) of `buf`, read from the log of `group`
/// that `from` offered; an error names the first record that is not what such a record must
/// be (a mark, a batch, a publish under backpressure, of another publisher or group, or of
/// another incarnation than the first).
pub fn decode_log_records<'a>(
    buf: &'a [u8],
    spans: &[(u32, u32)],
    from: BusId,
    group: &'a str,
) -> Result<Vec<PublishHead<'a>>, String> {
    let mut heads: Vec<PublishHead<'a>> = Vec::with_capacity(spans.len());
    for &(start, len) in spans {
        let body = &buf[start as usize..(start + len) as usize];
        let head = match log_record(body, from, group) {
            Some(head) => head,
            // Not what a record of this log must be: the full decoding says what it is.
            None => {
                let head = decode_publish(body)?;
                if head.mark
                    || head.batch
                    || head.publisher != from
                    || head.name != group
                    || head.backpressure
                {
                    return Err(format!(
                        "a {} of bus id {} to group {:?} in bus id {from}'s log of group {group:?} (it holds its own publishes to the group only, one by one, under the cut-off policy)",
                        if head.mark { "mark" } else if head.batch { "batch" } else { "publish" },
                        head.publisher,
                        head.name
                    ));
                }
                PublishHead {
                    name: group,
                    ..head
                }
            }
        };
        // A restarted publisher makes a new log.
        if let Some(first) = heads.first().filter(|f| f.incarnation != head.incarnation) {
            return Err(format!(
                "records of incarnations {:#x} and {:#x} in one read of bus id {from}'s log of group {group:?} (a log holds one incarnation's publishes)",
                first.incarnation, head.incarnation
            ));
        }
        heads.push(head);
    }
    Ok(heads)
}

/// The head of a record of `from`'s log of `group` if it is what such a record must be (see
/// the module doc), compared as bytes; `None` for anything else.
fn log_record<'a>(body: &[u8], from: BusId, group: &'a str) -> Option<PublishHead<'a>> {
    let at = PUBLISH_FIXED_BYTES + group.len();
    let word = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
    if body.len() < at
        || usize::from(body[24]) != group.len()
        || &body[PUBLISH_FIXED_BYTES..at] != group.as_bytes()
        || word(0) != from.0
    {
        return None;
    }
    let number = word(16);
    if number == 0
        || number & (PUBLISH_MARK_BIT | PUBLISH_BACKPRESSURE_BIT | PUBLISH_BATCH_BIT) != 0
    {
        return None;
    }
    Some(PublishHead {
        publisher: from,
        incarnation: word(8),
        number,
        name: group,
        payload_at: at,
        mark: false,
        backpressure: false,
        batch: false,
        count: 1,
        gap_from: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{encode_mark, encode_publish_head};

    /// `records` one after another, and their spans.
    fn read(records: &[Vec<u8>]) -> (Vec<u8>, Vec<(u32, u32)>) {
        let mut buf = Vec::new();
        let mut spans = Vec::new();
        for r in records {
            spans.push((buf.len() as u32, r.len() as u32));
            buf.extend_from_slice(r);
        }
        (buf, spans)
    }

    fn record(publisher: u64, incarnation: u64, word: u64, group: &str) -> Vec<u8> {
        let mut r = encode_publish_head(BusId(publisher), incarnation, word, group);
        r.extend_from_slice(&word.to_le_bytes());
        r
    }

    #[test]
    fn a_logs_own_publishes_are_taken_in_order() {
        let (buf, spans) = read(&[record(7, 1, 5, "g"), record(7, 1, 6, "g")]);
        let heads = decode_log_records(&buf, &spans, BusId(7), "g").unwrap();
        let got: Vec<(u64, usize)> = heads.iter().map(|h| (h.number, h.payload_at)).collect();
        assert_eq!(got, vec![(5, 26), (6, 26)]);
    }

    #[test]
    fn anything_else_in_a_log_is_named_and_nothing_is_taken() {
        let err = |records: &[Vec<u8>]| {
            let (buf, spans) = read(records);
            decode_log_records(&buf, &spans, BusId(7), "g").unwrap_err()
        };
        let good = record(7, 1, 5, "g");
        let cases = [
            (encode_mark(BusId(7), 1, 5, "g"), "a mark of bus id 7"),
            (record(8, 1, 6, "g"), "a publish of bus id 8"),
            (record(7, 1, 6, "h"), "to group \"h\""),
            (
                record(7, 1, 6 | PUBLISH_BACKPRESSURE_BIT, "g"),
                "a publish of bus id 7",
            ),
            (
                record(7, 1, 6 | PUBLISH_BATCH_BIT, "g"),
                "a batch of bus id 7",
            ),
            (record(7, 2, 6, "g"), "records of incarnations 0x1 and 0x2"),
        ];
        for (bad, why) in cases {
            let e = err(&[good.clone(), bad]);
            assert!(e.contains(why), "{e} (want {why:?})");
        }
    }
}
