//! Multicast on the wire: one MULTICAST frame per link carries one payload to the receivers
//! that lie behind that link, each with its own number.
//!
//! MULTICAST (one message numbered with the pair's others, held, acknowledged and resent like
//! DATA, on a direct link only):
//!
//! ```text
//! offset      size  field
//! 0           8     source (the node that multicast it)
//! 8           8     source's incarnation
//! 16          1     flags: bit 0 mark (no payload: each number is the source's last to that
//!                   receiver); other bits must be 0
//! 17          1     hops left: links it may still cross; a relay passes it on with one less
//! 18          2     n, receivers that follow: 1 to MULTICAST_RECEIVERS_MAX
//! 20          16n   n × (u64 receiver, u64 number)
//! 20+16n      ..    payload
//! ```
//!
//! `number` counts the source's multicasts to that receiver from 1 (per source incarnation),
//! so that the receiver delivers them in order, drops a second copy and sees a gap for what a
//! relay lost; it asks the source for copies with REPAIR (see [`crate::group`], the stream
//! named `MULTICAST_STREAM`). All numbers are little-endian.

pub mod calls;
pub mod node;
pub mod state;

use crate::BusId;

/// Bytes of a MULTICAST body before its receivers.
pub const MULTICAST_FIXED_BYTES: usize = 20;
/// Bytes of one receiver entry (bus id, number).
pub const MULTICAST_RECEIVER_BYTES: usize = 16;
/// Most receivers one MULTICAST names (and one `Node::multicast` takes).
pub const MULTICAST_RECEIVERS_MAX: usize = 1_024;
/// Links a multicast may cross from its source: a relay passes it on with one less, and drops
/// it (counted) at zero, so that routes that disagree for a moment cannot pass it round a
/// cycle for ever.
pub const MULTICAST_HOPS_MAX: u8 = 16;
/// Flag: the frame is a mark.
pub const MULTICAST_FLAG_MARK: u8 = 1;
/// The highest number a multicast may carry, as a PUBLISH's (2^62 - 1; a source sending a
/// billion a second to one receiver reaches it in 146 years): a number past it is a protocol
/// error, so that nothing on a receiver's stream (next number, the end of a gap) can wrap.
pub const MULTICAST_NUMBER_MAX: u64 = (1 << 62) - 1;

/// A decoded MULTICAST head; the payload is the body from `payload_at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MulticastHead<'a> {
    /// The source's bus id.
    pub source: BusId,
    /// The source's incarnation.
    pub incarnation: u64,
    /// A mark: no payload; each receiver's number is the source's last multicast to it.
    pub mark: bool,
    /// How many more links it may cross (at most [`MULTICAST_HOPS_MAX`]).
    pub hops_left: u8,
    receivers: &'a [u8],
    /// Where the payload starts in the body, in bytes.
    pub payload_at: usize,
}

impl<'a> MulticastHead<'a> {
    /// The (receiver, number) entries, in frame order.
    pub fn receivers(&self) -> impl ExactSizeIterator<Item = (BusId, u64)> + 'a {
        self.receivers
            .chunks_exact(MULTICAST_RECEIVER_BYTES)
            .map(|e| (BusId(u64_at(e, 0)), u64_at(e, 8)))
    }
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    let mut out = [0u8; 8];
    out.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(out)
}

/// The head of a MULTICAST body (the payload follows it, none for a mark). `receivers` holds
/// 1 to `MULTICAST_RECEIVERS_MAX` entries.
pub fn encode_multicast_head(
    source: BusId,
    incarnation: u64,
    mark: bool,
    hops_left: u8,
    receivers: &[(BusId, u64)],
) -> Vec<u8> {
    debug_assert!(!receivers.is_empty() && receivers.len() <= MULTICAST_RECEIVERS_MAX);
    let mut out =
        Vec::with_capacity(MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES * receivers.len());
    out.extend_from_slice(&source.0.to_le_bytes());
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.push(if mark { MULTICAST_FLAG_MARK } else { 0 });
    out.push(hops_left);
    out.extend_from_slice(&(receivers.len() as u16).to_le_bytes());
    for (id, number) in receivers {
        out.extend_from_slice(&id.0.to_le_bytes());
        out.extend_from_slice(&number.to_le_bytes());
    }
    out
}

/// Decodes the head of a MULTICAST body; the error names what is wrong (and where, for a
/// receiver entry).
pub fn decode_multicast(body: &[u8]) -> Result<MulticastHead<'_>, String> {
    if body.len() < MULTICAST_FIXED_BYTES {
        return Err(format!(
            "MULTICAST body of {} bytes (its head alone is at least {})",
            body.len(),
            MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES
        ));
    }
    let source = BusId(u64_at(body, 0));
    let incarnation = u64_at(body, 8);
    let flags = body[16];
    if flags & !MULTICAST_FLAG_MARK != 0 {
        return Err(format!(
            "MULTICAST flags {flags:#04x} (only bit 0, mark, is defined)"
        ));
    }
    let hops_left = body[17];
    let n = usize::from(u16::from_le_bytes([body[18], body[19]]));
    if n == 0 || n > MULTICAST_RECEIVERS_MAX {
        return Err(format!(
            "MULTICAST names {n} receivers (1 to {MULTICAST_RECEIVERS_MAX} allowed)"
        ));
    }
    let payload_at = MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES * n;
    if body.len() < payload_at {
        return Err(format!(
            "MULTICAST names {n} receivers ({} bytes) but only {} bytes follow its head",
            MULTICAST_RECEIVER_BYTES * n,
            body.len() - MULTICAST_FIXED_BYTES
        ));
    }
    let receivers = &body[MULTICAST_FIXED_BYTES..payload_at];
    for (i, e) in receivers.chunks_exact(MULTICAST_RECEIVER_BYTES).enumerate() {
        let (id, number) = (u64_at(e, 0), u64_at(e, 8));
        if number == 0 {
            return Err(format!(
                "MULTICAST receiver {i} ({id}) numbered 0 (multicasts count from 1)"
            ));
        }
        if number > MULTICAST_NUMBER_MAX {
            return Err(format!(
                "MULTICAST receiver {i} ({id}) numbered {number}, past the highest number \
                 {MULTICAST_NUMBER_MAX}"
            ));
        }
        if id == source.0 {
            return Err(format!("MULTICAST receiver {i} is its own source {source}"));
        }
    }
    let mark = flags & MULTICAST_FLAG_MARK != 0;
    if mark && body.len() != payload_at {
        return Err(format!(
            "MULTICAST mark with {} bytes of payload (a mark has none)",
            body.len() - payload_at
        ));
    }
    Ok(MulticastHead {
        source,
        incarnation,
        mark,
        hops_left,
        receivers,
        payload_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body(receivers: &[(BusId, u64)], payload: &[u8]) -> Vec<u8> {
        let mut b = encode_multicast_head(BusId(7), 9, false, 3, receivers);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn a_multicast_round_trips() {
        let b = body(&[(BusId(1), 4), (BusId(2), 1)], b"payload");
        let h = decode_multicast(&b).unwrap();
        assert_eq!(
            (h.source, h.incarnation, h.mark, h.hops_left),
            (BusId(7), 9, false, 3)
        );
        assert_eq!(
            h.receivers().collect::<Vec<_>>(),
            vec![(BusId(1), 4), (BusId(2), 1)]
        );
        assert_eq!(&b[h.payload_at..], b"payload");
        let m = encode_multicast_head(BusId(7), 9, true, 3, &[(BusId(1), 4)]);
        let h = decode_multicast(&m).unwrap();
        assert!(h.mark);
        assert_eq!(h.payload_at, m.len());
    }

    #[test]
    fn lies_in_the_receiver_list_are_named() {
        let err = |b: &[u8]| decode_multicast(b).unwrap_err();
        assert!(err(&[0; 5]).contains("5 bytes"));
        let mut none = body(&[(BusId(1), 1)], b"");
        none[18] = 0;
        assert!(err(&none).contains("0 receivers"));
        let mut too_many = body(&[(BusId(1), 1)], b"");
        too_many[18..20].copy_from_slice(&((MULTICAST_RECEIVERS_MAX + 1) as u16).to_le_bytes());
        assert!(err(&too_many).contains("1025 receivers"));
        let mut truncated = body(&[(BusId(1), 1), (BusId(2), 1)], b"");
        truncated.truncate(MULTICAST_FIXED_BYTES + 20);
        assert!(err(&truncated).contains("only 20 bytes follow"));
        assert!(
            err(&body(&[(BusId(1), 1), (BusId(2), 0)], b"")).contains("receiver 1 (2) numbered 0")
        );
        assert!(err(&body(&[(BusId(7), 1)], b"")).contains("its own source"));
        let wraps = body(&[(BusId(1), MULTICAST_NUMBER_MAX + 1)], b"");
        assert!(err(&wraps).contains("past the highest number"));
        assert!(decode_multicast(&body(&[(BusId(1), MULTICAST_NUMBER_MAX)], b"")).is_ok());
        let mut flags = body(&[(BusId(1), 1)], b"");
        flags[16] = 0x82;
        assert!(err(&flags).contains("flags 0x82"));
        let mut mark = encode_multicast_head(BusId(7), 9, true, 3, &[(BusId(1), 4)]);
        mark.push(0);
        assert!(err(&mark).contains("a mark has none"));
    }

    proptest! {
        #[test]
        fn any_multicast_round_trips(
            source in 1u64..1_000,
            incarnation: u64,
            hops: u8,
            receivers in proptest::collection::vec((1_000u64.., 1u64..=MULTICAST_NUMBER_MAX), 1..40),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let list: Vec<(BusId, u64)> = receivers.iter().map(|&(r, n)| (BusId(r), n)).collect();
            let mut b = encode_multicast_head(BusId(source), incarnation, false, hops, &list);
            b.extend_from_slice(&payload);
            let h = decode_multicast(&b).unwrap();
            prop_assert_eq!((h.source, h.incarnation, h.hops_left), (BusId(source), incarnation, hops));
            prop_assert_eq!(h.receivers().collect::<Vec<_>>(), list);
            prop_assert_eq!(&b[h.payload_at..], &payload[..]);
        }

        #[test]
        fn no_byte_string_panics_the_decoder(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_multicast(&body);
        }
    }
}
