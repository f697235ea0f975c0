//! The ROUTED frame: a message, an acknowledgement or a failure report that travels through
//! relays between two nodes that have no direct link.
//!
//! ```text
//! offset  size  field
//! 0       1     ttl: relays it may still pass
//! 1       1     route_len (n): relays it has passed
//! 2       2     reserved, 0
//! 4       4     content check: low 32 bits of XXH3-64(bytes 8+8n.., seed 0)
//! 8       8*n   route        bus ids of the relays passed, in order
//! 8+8n    1     type: 0 DATA, 1 ACK, 2 FAIL, 3 HINT
//! 9+8n    1     flags: bit 0 settled (DATA: every number below `seq` is acknowledged or
//!               given up at the source); other bits 0, ignored when read
//! 10+8n   8     src          the node that sent it
//! 18+8n   8     src_incarnation
//! 26+8n   8     dst          the node it is for
//! 34+8n   8     seq          DATA: number of its first message; ACK: next number expected;
//!                            FAIL: first number of the messages concerned
//! 42+8n   ...   inner        DATA: DATA/DATA_BATCH frames; ACK: empty;
//!                            FAIL: u8 reason, u64 bus id the failed messages were for,
//!                            UTF-8 text;
//!                            HINT: u64 bus id, u8 n, n x (u16 len, UTF-8 address)
//! ```
//!
//! The frame's own check covers the route prefix (bytes 0..8+8n), which holds the check of the
//! content after it. A relay checks the TTL and the route (no loops), writes a new prefix with
//! itself added to the route, and passes the content on as it came, shared and not hashed
//! again ([`forwarded_parts`]); it keeps no state about the frame. Only relays and the two ends pay
//! for these fields.

use crate::frame::{
    encode_routed_header, routed_prefix_len, FrameKind, HEADER_LEN, ROUTED_PREFIX_FIXED_LEN,
};
use crate::handshake::{ADDR_LEN_MAX, LISTEN_ADDRS_MAX};
use crate::id::BusId;
use bytes::{BufMut, Bytes, BytesMut};
use std::fmt;
use xxhash_rust::xxh3::Xxh3;

/// Bytes of the fixed fields of a ROUTED content (type, flags, src, incarnation, dst, seq).
const CONTENT_FIXED_LEN: usize = 34;
/// Bytes of the fixed part of a ROUTED body (route prefix and content fields; the route and
/// the inner part come on top).
pub const ROUTED_FIXED_LEN: usize = ROUTED_PREFIX_FIXED_LEN + CONTENT_FIXED_LEN;
/// Default number of relays a message may pass.
pub const DEFAULT_TTL: u8 = 16;
/// Most relays a route may list.
pub const ROUTE_LEN_MAX: usize = 64;
/// Longest failure text, in bytes.
pub const FAIL_TEXT_LEN_MAX: usize = 256;

/// What a ROUTED frame carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum RoutedType {
    /// Messages from the source: DATA or DATA_BATCH frames, numbered from `seq`.
    Data = 0,
    /// The destination has every message below `seq`; no inner part.
    Ack = 1,
    /// A relay or the destination could not take messages from `seq` on: a reason, the bus id
    /// they were for and a text.
    Fail = 2,
    /// From a relay to a source: the destination it relays to can be dialed directly here.
    Hint = 3,
}

/// Why a relay could not pass a message on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum FailReason {
    /// No node on the way knows the destination.
    UnknownId = 1,
    /// The TTL ran out.
    TtlExceeded = 2,
    /// The route came back to a relay it had passed.
    Loop = 3,
    /// The destination is known but its link is down (retry later).
    PeerDown = 4,
    /// A relay's queue toward the destination was full (retry later).
    Congested = 5,
    /// The destination saw a gap in the numbers (resend from `seq`).
    Gap = 6,
    /// A frame was larger than the next hop accepts (the limit each side states in HELLO).
    TooLarge = 7,
}

impl FailReason {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::UnknownId,
            2 => Self::TtlExceeded,
            3 => Self::Loop,
            4 => Self::PeerDown,
            5 => Self::Congested,
            6 => Self::Gap,
            7 => Self::TooLarge,
            _ => return None,
        })
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::PeerDown | Self::Congested | Self::Gap)
    }
}

impl fmt::Display for FailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnknownId => "unknown bus id",
            Self::TtlExceeded => "TTL exceeded",
            Self::Loop => "routing loop",
            Self::PeerDown => "destination down",
            Self::Congested => "relay congested",
            Self::Gap => "gap in sequence numbers",
            Self::TooLarge => "frame too large for the next hop",
        })
    }
}

/// The fixed fields and route of a ROUTED frame.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RoutedHeader {
    /// What the frame carries.
    pub kind: RoutedType,
    /// How many more relays it may pass.
    pub ttl: u8,
    /// The node that sent it.
    pub src: BusId,
    /// The sender's incarnation.
    pub src_incarnation: u64,
    /// The node it is for.
    pub dst: BusId,
    /// DATA: the number of its first message; ACK: the next number expected; FAIL: the first
    /// number of the messages concerned.
    pub seq: u64,
    /// DATA: every message numbered below `seq` is settled at the source (acknowledged, or
    /// given up and reported there): a destination that lacks some takes this frame on rather
    /// than report a gap the source could never fill.
    pub settled: bool,
    /// The bus ids of the relays it passed, in order (at most [`ROUTE_LEN_MAX`]).
    pub route: Vec<BusId>,
}

/// Bit of the flags byte: [`RoutedHeader::settled`].
const FLAG_SETTLED: u8 = 1;

impl RoutedHeader {
    /// Bytes of this header on the wire (route prefix and content fields).
    pub fn len(&self) -> usize {
        ROUTED_FIXED_LEN + 8 * self.route.len()
    }

    /// How many messages the ROUTED frame of this header, whose whole body is `body`, carries:
    /// [`messages_in`] its inner frames if it is DATA, else none.
    pub fn data_messages(&self, body: &[u8]) -> u64 {
        match self.kind {
            RoutedType::Data => body.get(self.len()..).map_or(0, messages_in),
            _ => 0,
        }
    }

    /// Always false: a header always has its fixed fields (the pair of [`RoutedHeader::len`]).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The route prefix: ttl, route length, `content_check` and the route.
    fn put_prefix(&self, content_check: u32, out: &mut BytesMut) {
        out.put_u8(self.ttl);
        out.put_u8(self.route.len() as u8);
        out.put_u16_le(0);
        out.put_u32_le(content_check);
        for hop in &self.route {
            out.put_u64_le(hop.0);
        }
    }

    /// The fixed fields of the content (what no relay changes).
    fn content_fields(&self) -> [u8; CONTENT_FIXED_LEN] {
        let mut b = [0u8; CONTENT_FIXED_LEN];
        b[0] = self.kind as u8;
        b[1] = if self.settled { FLAG_SETTLED } else { 0 };
        b[2..10].copy_from_slice(&self.src.0.to_le_bytes());
        b[10..18].copy_from_slice(&self.src_incarnation.to_le_bytes());
        b[18..26].copy_from_slice(&self.dst.0.to_le_bytes());
        b[26..34].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Reads a ROUTED body: the header and where the inner part starts. The checks were
    /// verified when the frame was cut from its stream.
    pub fn decode(body: &[u8]) -> Result<(Self, usize), String> {
        if body.len() < ROUTED_FIXED_LEN {
            return Err(format!(
                "ROUTED body of {} bytes, shorter than its {ROUTED_FIXED_LEN}-byte header",
                body.len()
            ));
        }
        let route_len = usize::from(body[1]);
        if route_len > ROUTE_LEN_MAX {
            return Err(format!(
                "ROUTED route of {route_len} relays, over {ROUTE_LEN_MAX}"
            ));
        }
        let content = ROUTED_PREFIX_FIXED_LEN + 8 * route_len;
        let inner = content + CONTENT_FIXED_LEN;
        if body.len() < inner {
            return Err(format!(
                "ROUTED body of {} bytes cannot hold its route of {route_len} relays",
                body.len()
            ));
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().unwrap_or_default());
        let kind = match body[content] {
            0 => RoutedType::Data,
            1 => RoutedType::Ack,
            2 => RoutedType::Fail,
            3 => RoutedType::Hint,
            t => return Err(format!("ROUTED type {t} unknown")),
        };
        let route = (0..route_len)
            .map(|i| BusId(u64_at(ROUTED_PREFIX_FIXED_LEN + 8 * i)))
            .collect();
        Ok((
            Self {
                kind,
                ttl: body[0],
                settled: body[content + 1] & FLAG_SETTLED != 0,
                src: BusId(u64_at(content + 2)),
                src_incarnation: u64_at(content + 10),
                dst: BusId(u64_at(content + 18)),
                seq: u64_at(content + 26),
                route,
            },
            inner,
        ))
    }
}

/// A FAIL report: `header` (type FAIL, addressed to the sender of the failed messages), the
/// reason, the bus id the messages were for, and text.
pub fn encode_fail(header: &RoutedHeader, reason: FailReason, about: BusId, text: &str) -> Bytes {
    let mut cut = text.len().min(FAIL_TEXT_LEN_MAX);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut inner = BytesMut::with_capacity(9 + cut);
    inner.put_u8(reason as u8);
    inner.put_u64_le(about.0);
    inner.put_slice(&text.as_bytes()[..cut]);
    routed_frame(header, &inner)
}

/// Reads the inner part of a FAIL report: reason, the bus id the messages were for, text.
pub fn decode_fail(inner: &[u8]) -> Result<(FailReason, BusId, String), String> {
    if inner.len() < 9 {
        return Err("ROUTED FAIL shorter than 9 bytes".into());
    }
    let reason = FailReason::from_u8(inner[0])
        .ok_or_else(|| format!("ROUTED FAIL reason {} unknown", inner[0]))?;
    let about = BusId(u64::from_le_bytes(
        inner[1..9].try_into().unwrap_or_default(),
    ));
    Ok((
        reason,
        about,
        String::from_utf8_lossy(&inner[9..]).into_owned(),
    ))
}

/// A HINT: `header` (type HINT, addressed to a source), the bus id `about` and the addresses
/// it listens on (at most `LISTEN_ADDRS_MAX`, each at most `ADDR_LEN_MAX` bytes; more are cut).
pub fn encode_hint(header: &RoutedHeader, about: BusId, addrs: &[String]) -> Bytes {
    let mut body = BytesMut::new();
    body.put_u64_le(about.0);
    let addrs: Vec<&String> = addrs
        .iter()
        .filter(|a| a.len() <= ADDR_LEN_MAX)
        .take(LISTEN_ADDRS_MAX)
        .collect();
    body.put_u8(addrs.len() as u8);
    for a in addrs {
        body.put_u16_le(a.len() as u16);
        body.put_slice(a.as_bytes());
    }
    routed_frame(header, &body)
}

/// Reads the inner part of a HINT: the bus id and its addresses; an error names what is wrong.
pub fn decode_hint(inner: &[u8]) -> Result<(BusId, Vec<String>), String> {
    if inner.len() < 9 {
        return Err("ROUTED HINT shorter than 9 bytes".into());
    }
    let about = BusId(u64::from_le_bytes(
        inner[..8].try_into().unwrap_or_default(),
    ));
    let n = usize::from(inner[8]);
    if n > LISTEN_ADDRS_MAX {
        return Err(format!(
            "ROUTED HINT with {n} addresses, over {LISTEN_ADDRS_MAX}"
        ));
    }
    let mut rest = &inner[9..];
    let mut addrs = Vec::with_capacity(n);
    for i in 0..n {
        if rest.len() < 2 {
            return Err(format!("ROUTED HINT truncated at address {i}"));
        }
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        if len > ADDR_LEN_MAX || rest.len() < 2 + len {
            return Err(format!(
                "ROUTED HINT address {i} of {len} bytes is over {ADDR_LEN_MAX} or truncated"
            ));
        }
        let a = std::str::from_utf8(&rest[2..2 + len])
            .map_err(|_| format!("ROUTED HINT address {i} is not UTF-8"))?;
        addrs.push(a.to_owned());
        rest = &rest[2 + len..];
    }
    Ok((about, addrs))
}

/// A ROUTED frame as the buffers it is written from, in order: one small buffer with the frame
/// header and `header`, then `inner`'s buffers, shared, not copied (what a source sends from
/// its outbox). The content check is gathered over them: the one pass over these bytes.
pub fn routed_frame_parts(header: &RoutedHeader, inner: &[Bytes]) -> Vec<Bytes> {
    let fields = header.content_fields();
    let mut hasher = Xxh3::with_seed(0);
    hasher.update(&fields);
    for part in inner {
        hasher.update(part);
    }
    let content_check = hasher.digest() as u32;
    let body_len = header.len() + inner.iter().map(Bytes::len).sum::<usize>();
    let mut head = BytesMut::with_capacity(HEADER_LEN + header.len());
    head.put_bytes(0, HEADER_LEN);
    header.put_prefix(content_check, &mut head);
    let frame_header = encode_routed_header(body_len, &head[HEADER_LEN..]);
    head[..HEADER_LEN].copy_from_slice(&frame_header);
    head.put_slice(&fields);
    let mut parts = Vec::with_capacity(1 + inner.len());
    parts.push(head.freeze());
    parts.extend(inner.iter().filter(|b| !b.is_empty()).cloned());
    parts
}

/// A whole ROUTED frame: `header`, then `inner`.
pub fn routed_frame(header: &RoutedHeader, inner: &[u8]) -> Bytes {
    let mut body = BytesMut::with_capacity(HEADER_LEN + header.len() + inner.len());
    body.put_bytes(0, HEADER_LEN);
    header.put_prefix(0, &mut body);
    body.put_slice(&header.content_fields());
    body.put_slice(inner);
    crate::frame::seal_routed_content(&mut body[HEADER_LEN..]);
    let frame_header = crate::frame::encode_header(FrameKind::Routed, &body[HEADER_LEN..]);
    body[..HEADER_LEN].copy_from_slice(&frame_header);
    body.freeze()
}

/// What a relay writes to pass on the ROUTED frame whose body is `body`, with `header` (read
/// from it, then given the relay's TTL and route): a new frame header and route prefix, then
/// the content as it came (shared with `body`, not copied, not hashed: the content check in
/// the prefix goes along unchanged).
pub fn forwarded_parts(header: &RoutedHeader, body: &Bytes) -> Vec<Bytes> {
    let content = body.slice(routed_prefix_len(body)..);
    let content_check = u32::from_le_bytes(body[4..8].try_into().unwrap_or_default());
    let prefix_len = ROUTED_PREFIX_FIXED_LEN + 8 * header.route.len();
    let mut head = BytesMut::with_capacity(HEADER_LEN + prefix_len);
    head.put_bytes(0, HEADER_LEN);
    header.put_prefix(content_check, &mut head);
    let frame_header = encode_routed_header(prefix_len + content.len(), &head[HEADER_LEN..]);
    head[..HEADER_LEN].copy_from_slice(&frame_header);
    vec![head.freeze(), content]
}

/// How many messages the inner frames of a ROUTED DATA frame hold: a DATA, CALL or REPLY
/// frame one, a DATA_BATCH frame one per entry. What a relay counts as it passes a frame on:
/// it reads the inner frames' headers and a batch's entry lengths only (no check, no payload).
/// Counting stops at the first piece that does not fit and counts what came before: judging
/// the frame is the destination's job (it refuses the whole frame), not the relay's.
pub fn messages_in(inner: &[u8]) -> u64 {
    let mut n = 0u64;
    let mut at = 0;
    while let Some(head) = inner.get(at..at + HEADER_LEN) {
        let word0 = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let body_start = at + HEADER_LEN;
        let Some(body) = inner.get(body_start..body_start + (word0 >> 8) as usize) else {
            break;
        };
        match FrameKind::from_u8(word0 as u8) {
            Some(FrameKind::DataBatch) => {
                let mut entries = 0;
                let whole = crate::entries::for_each_entry(body, "DATA_BATCH", |_, _| entries += 1);
                n += entries;
                if whole.is_err() {
                    break;
                }
            }
            Some(FrameKind::Data | FrameKind::Call | FrameKind::Reply | FrameKind::Repair) => {
                n += 1
            }
            _ => break,
        }
        at = body_start + body.len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameDecoder;
    use proptest::prelude::*;

    /// The body of the one whole, checked frame in `wire`.
    fn decode_one(wire: &[u8]) -> Bytes {
        let mut buf = BytesMut::from(wire);
        let f = FrameDecoder::new(crate::frame::DEFAULT_BODY_LEN_MAX)
            .decode(&mut buf)
            .expect("checks hold")
            .expect("a whole frame");
        assert!(buf.is_empty());
        f.body
    }

    #[test]
    fn a_relay_counts_the_messages_inside_and_stops_at_what_does_not_fit() {
        let mut inner = BytesMut::new();
        crate::frame::encode_frame(FrameKind::Data, b"one", &mut inner);
        let batch: Vec<u8> = [&[2u8, 0, b'a', b'b'][..], &[1, 0, b'c'], &[0, 0]].concat();
        crate::frame::encode_frame(FrameKind::DataBatch, &batch, &mut inner);
        crate::frame::encode_frame(FrameKind::Call, &[0; 9], &mut inner);
        assert_eq!(messages_in(&inner), 5);
        // Cut anywhere inside the last frame: the first two count, the cut one does not.
        assert_eq!(messages_in(&inner[..inner.len() - 1]), 4);
        // A batch whose entries do not tile its body: the entries that fit count, then stop.
        let mut bad = BytesMut::new();
        crate::frame::encode_frame(FrameKind::DataBatch, &[1, 0, b'x', 9, 0], &mut bad);
        crate::frame::encode_frame(FrameKind::Data, b"after", &mut bad);
        assert_eq!(messages_in(&bad), 1);
        // A kind that has no place inside ROUTED stops the count.
        let mut odd = BytesMut::new();
        crate::frame::encode_frame(FrameKind::Ping, &[], &mut odd);
        crate::frame::encode_frame(FrameKind::Data, b"x", &mut odd);
        assert_eq!(messages_in(&odd), 0);
        assert_eq!(messages_in(&[]), 0);
    }

    proptest! {
        #[test]
        fn headers_round_trip(
            kind in 0u8..4, ttl: u8, src: u64, inc: u64, dst: u64, seq: u64,
            route in prop::collection::vec(any::<u64>(), 0..ROUTE_LEN_MAX),
            inner in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let h = RoutedHeader {
                kind: [RoutedType::Data, RoutedType::Ack, RoutedType::Fail, RoutedType::Hint][kind as usize],
                ttl, src: BusId(src), src_incarnation: inc, dst: BusId(dst), seq,
                settled: false,
                route: route.into_iter().map(BusId).collect(),
            };
            let frame = routed_frame(&h, &inner);
            let body = decode_one(&frame);
            let (back, at) = RoutedHeader::decode(&body).unwrap();
            prop_assert_eq!(back, h.clone());
            prop_assert_eq!(&body[at..], &inner[..]);
            // Gathered from parts, the same bytes.
            let parts = routed_frame_parts(&h, &[Bytes::from(inner.clone())]);
            prop_assert_eq!(parts.concat(), frame.to_vec());
        }

        /// A relay's frame is the one the source would have written with the relay's route,
        /// without the relay hashing the content.
        #[test]
        fn a_frame_passed_on_is_the_frame_with_the_new_route(
            route in prop::collection::vec(any::<u64>(), 0..8),
            relay: u64,
            inner in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut h = RoutedHeader {
                kind: RoutedType::Data, ttl: 9, src: BusId(1), src_incarnation: 2,
                dst: BusId(3), seq: 4, settled: true,
                route: route.into_iter().map(BusId).collect(),
            };
            let body = decode_one(&routed_frame(&h, &inner));
            h.ttl -= 1;
            h.route.push(BusId(relay));
            let passed = forwarded_parts(&h, &body).concat();
            prop_assert_eq!(&passed[..], &routed_frame(&h, &inner)[..]);
            prop_assert_eq!(decode_one(&passed), decode_one(&routed_frame(&h, &inner)));
        }

        #[test]
        fn decoding_garbage_never_panics(body in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((_, at)) = RoutedHeader::decode(&body) {
                let _ = decode_fail(&body[at..]);
                let _ = decode_hint(&body[at..]);
            }
        }
    }

    #[test]
    fn hints_round_trip_and_bad_ones_are_named() {
        let h = RoutedHeader {
            kind: RoutedType::Hint,
            ttl: 16,
            src: BusId(1),
            src_incarnation: 2,
            dst: BusId(3),
            seq: 0,
            settled: false,
            route: vec![],
        };
        let addrs = vec!["tcp://127.0.0.1:7000".to_string(), "unix:///tmp/x".into()];
        let f = encode_hint(&h, BusId(9), &addrs);
        let body = &f[crate::frame::HEADER_LEN..];
        let (back, at) = RoutedHeader::decode(body).unwrap();
        assert_eq!(back, h);
        assert_eq!(decode_hint(&body[at..]).unwrap(), (BusId(9), addrs));
        assert!(decode_hint(&[0; 8]).unwrap_err().contains("shorter"));
        let mut lying = vec![0u8; 9];
        lying[8] = 1;
        assert!(decode_hint(&lying).unwrap_err().contains("truncated"));
        lying[8] = 200;
        assert!(decode_hint(&lying).unwrap_err().contains("over"));
    }

    #[test]
    fn short_or_lying_bodies_are_named() {
        assert!(RoutedHeader::decode(&[0; 10])
            .unwrap_err()
            .contains("shorter"));
        let mut b = vec![0u8; ROUTED_FIXED_LEN];
        b[1] = 3;
        assert!(RoutedHeader::decode(&b)
            .unwrap_err()
            .contains("cannot hold its route"));
        assert!(decode_fail(&[99, 0, 0, 0, 0, 0, 0, 0, 0])
            .unwrap_err()
            .contains("99"));
    }
}
