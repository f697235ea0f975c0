//! Frame layout v2 and the streaming decoder.
//!
//! Every frame is an 8-byte header followed by a body:
//!
//! ```text
//! offset 0  u32 LE  word0 = kind (bits 0..8) | body_len << 8   (body_len < 2^24)
//! offset 4  u32 LE  check = low 32 bits of xxh3_64_with_seed(body, seed = word0)
//! offset 8  body_len bytes of body
//! ```
//!
//! Seeding the hash with `word0` covers the kind and the length without hashing the header
//! separately. ROUTED frames are the one exception: their check covers only the part a relay
//! rewrites (TTL and route), which holds its own check of the rest (see [`routed_prefix_len`]),
//! so that a relay passes a frame on without hashing it again. A DATA frame on a direct link is this header and the payload, nothing else: relay
//! fields live only in the frame kinds that relays use. See `docs/PROTOCOL.md`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::fmt;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 8;
/// The largest body the 24-bit length field can express, in bytes.
pub const BODY_LEN_CEILING: usize = (1 << 24) - 1;
/// Default largest body a node accepts, in bytes (configurable up to [`BODY_LEN_CEILING`]).
pub const DEFAULT_BODY_LEN_MAX: usize = 4 << 20;
/// Largest body accepted before the handshake is complete, in bytes: an unauthenticated peer
/// must not make a node buffer megabytes.
pub const HANDSHAKE_BODY_LEN_MAX: usize = 8 << 10;

const _: () = assert!(DEFAULT_BODY_LEN_MAX <= BODY_LEN_CEILING);
const _: () = assert!(HANDSHAKE_BODY_LEN_MAX <= DEFAULT_BODY_LEN_MAX);

/// What a frame is. Unknown values are an error, never skipped: a peer that sends a kind we do
/// not know speaks a protocol we do not speak.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum FrameKind {
    /// An application message on a direct link; the body is the payload.
    Data = 0x01,
    /// Reserved (capability `relay`): a message with source, destination, sequence and TTL.
    Routed = 0x02,
    /// Reserved (capability `reliable`): cumulative acknowledgements.
    Ack = 0x03,
    /// Heartbeat request; body: u64 token.
    Ping = 0x04,
    /// Heartbeat answer; body: the token of the ping.
    Pong = 0x05,
    /// The sender is closing the link; body: u16 code, UTF-8 reason.
    Close = 0x06,
    /// Many small application messages on a direct link; body: repeated `u16 LE length,
    /// payload`. One header and one check for the lot: what small messages pay per message is
    /// two bytes.
    DataBatch = 0x07,
    /// Reserved (capability `calls`): a request, one application message numbered like any
    /// other; body: u64 call id, payload.
    Call = 0x08,
    /// Reserved (capability `calls`): the answer to a CALL, one message numbered like any
    /// other; body: u64 call id, u8 status (`REPLY_OK` or an error), payload (the error's text
    /// when the status is not OK).
    Reply = 0x09,
    /// A node's interest in a group changed (see [`crate::group`]): one message numbered like
    /// any other, on a direct link only; body: u8 op, u8 name length, name.
    Interest = 0x0A,
    /// One publish to a group, or a batch of them in a row (see [`crate::group`]): one
    /// message numbered like any other, on a direct link only; body: u64 publisher, u64
    /// incarnation, u64 number and flags, u8 name length, name, payload (or a batch's entries).
    Publish = 0x0B,
    /// The end-to-end repair of a group's stream (see [`crate::group`]): one message numbered
    /// like any other, on a direct link or inside ROUTED; body: u8 op, then the op's fields (a
    /// member asks its publisher for what it missed, the publisher sends copies or says what
    /// it no longer holds).
    Repair = 0x0C,
    /// One multicast (see [`crate::multicast`]): one message numbered like any other, on a
    /// direct link only; body: source, incarnation, flags, hops left, the receivers behind
    /// this link with each one's number, payload.
    Multicast = 0x0D,
    /// A group's log on the host (see [`crate::group`]): a publisher offers it, a peer on the
    /// same host accepts or declines it. One message numbered like any other, on a direct
    /// link only; body: u8 op, the op's fields, the group's name.
    GroupLog = 0x0E,
    /// A relay registers with its upstream the ids it serves beyond its HELLO's range, or
    /// the upstream answers (see [`crate::registry`]); a control frame, on the socket only,
    /// never numbered. Body: u8 op, u64 version, then the op's fields.
    Register = 0x0F,
    /// First handshake frame of each side.
    Hello = 0x10,
    /// Second handshake frame of each side: proof of the shared secret.
    Auth = 0x11,
    /// Reserved (capability `shm`): offer of a shared-memory channel.
    Channel = 0x20,
}

impl FrameKind {
    /// The kind for a wire byte, if it is one v1 defines.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => Self::Data,
            0x02 => Self::Routed,
            0x03 => Self::Ack,
            0x04 => Self::Ping,
            0x05 => Self::Pong,
            0x06 => Self::Close,
            0x07 => Self::DataBatch,
            0x08 => Self::Call,
            0x09 => Self::Reply,
            0x0A => Self::Interest,
            0x0B => Self::Publish,
            0x0C => Self::Repair,
            0x0D => Self::Multicast,
            0x0E => Self::GroupLog,
            0x0F => Self::Register,
            0x10 => Self::Hello,
            0x11 => Self::Auth,
            0x20 => Self::Channel,
            _ => return None,
        })
    }
}

/// A whole, checked frame. `body` shares the receive buffer: no copy was made.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Frame {
    /// What the frame is.
    pub kind: FrameKind,
    /// The body after the 8-byte header, checked.
    pub body: Bytes,
}

/// Why the byte stream is not a valid sequence of frames. Every variant names the byte offset in
/// the stream where the bad frame starts; after any of them the stream cannot be resynchronised
/// and the connection must be closed.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DecodeError {
    /// The header names a kind this version does not define.
    UnknownKind {
        /// The kind byte the header carries.
        kind: u8,
        /// Where the frame starts, in bytes from the start of the stream.
        offset: u64,
    },
    /// The header declares a body longer than this decoder accepts.
    BodyTooLong {
        /// The kind byte the header carries.
        kind: u8,
        /// The body length the header declares, in bytes.
        len: usize,
        /// The longest body this decoder accepts, in bytes.
        max: usize,
        /// Where the frame starts, in bytes from the start of the stream.
        offset: u64,
    },
    /// The body does not hash to the check the header holds.
    ChecksumMismatch {
        /// The kind byte the header carries.
        kind: u8,
        /// The check the header holds.
        expected: u32,
        /// The check the body hashes to.
        actual: u32,
        /// Where the frame starts, in bytes from the start of the stream.
        offset: u64,
    },
    /// A ROUTED frame's content (everything after its route) does not match the check its
    /// route prefix holds.
    ContentCheckMismatch {
        /// The check the route prefix holds.
        expected: u32,
        /// The check the content hashes to.
        actual: u32,
        /// Where the frame starts, in bytes from the start of the stream.
        offset: u64,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownKind { kind, offset } => {
                write!(f, "unknown frame kind 0x{kind:02x} at stream offset {offset}")
            }
            Self::BodyTooLong {
                kind,
                len,
                max,
                offset,
            } => write!(
                f,
                "frame of kind 0x{kind:02x} at stream offset {offset} declares a {len}-byte body, over the {max}-byte limit"
            ),
            Self::ChecksumMismatch {
                kind,
                expected,
                actual,
                offset,
            } => write!(
                f,
                "checksum mismatch in frame of kind 0x{kind:02x} at stream offset {offset}: header says 0x{expected:08x}, body hashes to 0x{actual:08x}"
            ),
            Self::ContentCheckMismatch {
                expected,
                actual,
                offset,
            } => write!(
                f,
                "content check mismatch in ROUTED frame at stream offset {offset}: its route prefix says 0x{expected:08x}, its content hashes to 0x{actual:08x}"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

#[inline]
fn checksum(word0: u32, body: &[u8]) -> u32 {
    xxh3_64_with_seed(body, u64::from(word0)) as u32
}

/// Bytes of a ROUTED body before its route: ttl, route_len, two reserved bytes and the content
/// check.
pub const ROUTED_PREFIX_FIXED_LEN: usize = 8;

/// Bytes of a ROUTED body's route prefix, the part its frame check covers: the fixed 8 bytes
/// and the route (8 bytes per relay, `route_len` at byte 1), clamped to the body (a body too
/// short for its route is refused when it is read, not here).
///
/// ```text
/// 0  1  ttl
/// 1  1  route_len
/// 2  2  reserved, 0
/// 4  4  content check: low 32 bits of XXH3-64(everything after the route, seed 0)
/// 8  8n route
/// ```
#[inline]
pub fn routed_prefix_len(body: &[u8]) -> usize {
    match body.get(1) {
        Some(&n) => (ROUTED_PREFIX_FIXED_LEN + 8 * usize::from(n)).min(body.len()),
        None => body.len(),
    }
}

/// The check of a ROUTED frame's content (the bytes after its route), as its route prefix
/// holds it.
#[inline]
pub fn routed_content_check(content: &[u8]) -> u32 {
    xxh3_64_with_seed(content, 0) as u32
}

/// The check a frame's header holds: of the whole body, or of a ROUTED body's route prefix.
#[inline]
fn frame_check(kind: FrameKind, word0: u32, body: &[u8]) -> u32 {
    if kind == FrameKind::Routed {
        checksum(word0, &body[..routed_prefix_len(body)])
    } else {
        checksum(word0, body)
    }
}

/// The header of a ROUTED frame whose body is `body_len` bytes and starts with `prefix` (its
/// route prefix, see [`routed_prefix_len`]), without the rest of the body at hand: what a relay
/// writes when it passes a frame on with a new route.
pub fn encode_routed_header(body_len: usize, prefix: &[u8]) -> [u8; HEADER_LEN] {
    assert!(body_len <= BODY_LEN_CEILING, "frame body over the ceiling");
    let word0 = (FrameKind::Routed as u32) | ((body_len as u32) << 8);
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&word0.to_le_bytes());
    h[4..].copy_from_slice(&checksum(word0, prefix).to_le_bytes());
    h
}

/// Writes the content check of a ROUTED body into its route prefix (bytes 4..8), from the
/// content after its route. Does nothing to a body shorter than the fixed prefix.
pub fn seal_routed_content(body: &mut [u8]) {
    if body.len() < ROUTED_PREFIX_FIXED_LEN {
        return;
    }
    let at = routed_prefix_len(body);
    let check = routed_content_check(&body[at..]);
    body[4..8].copy_from_slice(&check.to_le_bytes());
}

/// The header of a frame of `kind` carrying `body` (a ROUTED body must hold its content check
/// already: see [`seal_routed_content`]).
///
/// # Panics
/// If `body` is longer than [`BODY_LEN_CEILING`]: callers check payload sizes against the
/// configured limit before they encode.
#[inline]
pub fn encode_header(kind: FrameKind, body: &[u8]) -> [u8; HEADER_LEN] {
    assert!(
        body.len() <= BODY_LEN_CEILING,
        "frame body over the ceiling"
    );
    let word0 = (kind as u32) | ((body.len() as u32) << 8);
    let check = frame_check(kind, word0, body);
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&word0.to_le_bytes());
    h[4..].copy_from_slice(&check.to_le_bytes());
    h
}

/// The header of a frame of `kind` whose body is `parts` one after the other: the same bytes
/// as [`encode_header`] of their concatenation, without concatenating them (a relay or a
/// source gathers a frame from buffers it shares rather than copies). Not for ROUTED frames,
/// whose check covers their route prefix only ([`encode_routed_header`]).
///
/// # Panics
/// If the parts add up to more than [`BODY_LEN_CEILING`].
pub fn encode_header_gathered(kind: FrameKind, parts: &[&[u8]]) -> [u8; HEADER_LEN] {
    debug_assert!(
        kind != FrameKind::Routed,
        "ROUTED headers: encode_routed_header"
    );
    let len: usize = parts.iter().map(|p| p.len()).sum();
    assert!(len <= BODY_LEN_CEILING, "frame body over the ceiling");
    let word0 = (kind as u32) | ((len as u32) << 8);
    let mut hasher = Xxh3::with_seed(u64::from(word0));
    for p in parts {
        hasher.update(p);
    }
    let check = hasher.digest() as u32;
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&word0.to_le_bytes());
    h[4..].copy_from_slice(&check.to_le_bytes());
    h
}

/// Appends a whole frame (header and body) to `out`. A ROUTED body gets its content check
/// written (bytes 4..8 of the body, whatever they held), so the frame is whole and valid.
#[inline]
pub fn encode_frame(kind: FrameKind, body: &[u8], out: &mut BytesMut) {
    out.reserve(HEADER_LEN + body.len());
    if kind == FrameKind::Routed {
        let at = out.len();
        out.put_bytes(0, HEADER_LEN);
        out.put_slice(body);
        seal_routed_content(&mut out[at + HEADER_LEN..]);
        let header = encode_header(kind, &out[at + HEADER_LEN..]);
        out[at..at + HEADER_LEN].copy_from_slice(&header);
        return;
    }
    out.put_slice(&encode_header(kind, body));
    out.put_slice(body);
}

pub use crate::entries::BATCH_ENTRY_HEADER_LEN;
/// Largest message a DATA_BATCH entry can carry, in bytes.
pub const BATCH_ENTRY_LEN_MAX: usize = u16::MAX as usize;

/// Writes the header of a frame whose body already follows it in `frame[HEADER_LEN..]` (for a
/// sender that appends a body in place and closes the frame later).
pub fn seal_in_place(kind: FrameKind, frame: &mut [u8]) {
    let header = encode_header(kind, &frame[HEADER_LEN..]);
    frame[..HEADER_LEN].copy_from_slice(&header);
}

/// The header of a frame of `kind` with a body of `body_len` bytes and a check of 0: for frames
/// that go only where checks are not verified (a shared-memory ring, see `docs/PROTOCOL.md`).
pub fn encode_header_unchecked(kind: FrameKind, body_len: usize) -> [u8; HEADER_LEN] {
    assert!(body_len <= BODY_LEN_CEILING, "frame body over the ceiling");
    let word0 = (kind as u32) | ((body_len as u32) << 8);
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&word0.to_le_bytes());
    h
}

/// Like [`seal_in_place`], with a check of 0 (see [`encode_header_unchecked`]).
pub fn seal_in_place_unchecked(kind: FrameKind, frame: &mut [u8]) {
    let header = encode_header_unchecked(kind, frame.len() - HEADER_LEN);
    frame[..HEADER_LEN].copy_from_slice(&header);
}

/// Computes the check of every frame in `frames` (whole frames, one after another, as a
/// sender built them), in place.
pub fn seal_frames_in_place(frames: &mut [u8]) {
    let mut at = 0;
    while at + HEADER_LEN <= frames.len() {
        let word0 =
            u32::from_le_bytes([frames[at], frames[at + 1], frames[at + 2], frames[at + 3]]);
        let end = (at + HEADER_LEN + (word0 >> 8) as usize).min(frames.len());
        let check = checksum(word0, &frames[at + HEADER_LEN..end]);
        frames[at + 4..at + HEADER_LEN].copy_from_slice(&check.to_le_bytes());
        at = end;
    }
}

/// Calls `f(start, len)` for each message of a DATA_BATCH body, in order (`start` relative to
/// the body); an error names the entry and its offset in the body if the entries do not tile
/// the body exactly.
pub fn for_each_batch_entry(body: &[u8], f: impl FnMut(usize, usize)) -> Result<(), String> {
    crate::entries::for_each_entry(body, "DATA_BATCH", f)
}

/// Bytes of a CALL body before its payload: the call id.
pub const CALL_HEADER_LEN: usize = 8;
/// Bytes of a REPLY body before its payload: the call id and the status.
pub const REPLY_HEADER_LEN: usize = 9;
/// A REPLY's status: the handler answered; the payload is its answer.
pub const REPLY_OK: u8 = 0;
/// A REPLY's status: the request reached the node but nothing answered it (the application
/// dropped it unanswered, or had no inbox); the payload says why.
pub const REPLY_NO_HANDLER: u8 = 1;

/// A whole frame as one buffer.
pub fn frame_bytes(kind: FrameKind, body: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + body.len());
    encode_frame(kind, body, &mut out);
    out.freeze()
}

/// Cuts frames out of a byte stream. A small state machine: it waits for a header, checks kind
/// and length as soon as the header is in (so an oversize frame is refused before its body
/// arrives), then waits for the body and checks it.
#[derive(Debug)]
pub struct FrameDecoder {
    body_len_max: usize,
    /// Bytes of the stream consumed so far, to name where an error is.
    offset: u64,
    /// Whether checks are verified (off only for a shared-memory ring's stream).
    verify_checks: bool,
}

impl FrameDecoder {
    /// A decoder that refuses bodies longer than `body_len_max` bytes (clamped to the ceiling).
    pub fn new(body_len_max: usize) -> Self {
        Self {
            body_len_max: body_len_max.min(BODY_LEN_CEILING),
            offset: 0,
            verify_checks: true,
        }
    }

    /// Stops verifying checks: for a stream whose frames cannot be torn or altered in transit
    /// (a shared-memory ring, written by the peer alone and published whole). Kinds, lengths
    /// and everything inside bodies are still checked.
    pub fn skip_checks(mut self) -> Self {
        self.verify_checks = false;
        self
    }

    /// Changes the body limit, e.g. from the handshake limit to the node's limit once the peer
    /// is authenticated.
    pub fn set_body_len_max(&mut self, body_len_max: usize) {
        self.body_len_max = body_len_max.min(BODY_LEN_CEILING);
    }

    /// Bytes of the stream consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many bytes `buf` must hold before the next call can return a frame (at least one
    /// header). A reader uses it to reserve room for a large frame in one go.
    pub fn bytes_needed(&self, buf: &[u8]) -> usize {
        if buf.len() < HEADER_LEN {
            return HEADER_LEN;
        }
        let word0 = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        HEADER_LEN + ((word0 >> 8) as usize).min(self.body_len_max)
    }

    /// Checks the next whole frame at the start of `buf` without taking it: its kind, and the
    /// length of the whole frame (header included); the body is `buf[HEADER_LEN..len]`.
    /// `Ok(None)` means more bytes are needed. A reader walks a buffer with this and cuts it
    /// once for many frames, instead of once per frame.
    pub fn peek(&mut self, buf: &[u8]) -> Result<Option<(FrameKind, usize)>, DecodeError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let word0 = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let expected = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        let kind_byte = (word0 & 0xff) as u8;
        let len = (word0 >> 8) as usize;
        let Some(kind) = FrameKind::from_u8(kind_byte) else {
            return Err(DecodeError::UnknownKind {
                kind: kind_byte,
                offset: self.offset,
            });
        };
        if len > self.body_len_max {
            return Err(DecodeError::BodyTooLong {
                kind: kind_byte,
                len,
                max: self.body_len_max,
                offset: self.offset,
            });
        }
        let frame_len = HEADER_LEN + len;
        let Some(body) = buf.get(HEADER_LEN..frame_len) else {
            return Ok(None);
        };
        if self.verify_checks {
            let actual = frame_check(kind, word0, body);
            if actual != expected {
                return Err(DecodeError::ChecksumMismatch {
                    kind: kind_byte,
                    expected,
                    actual,
                    offset: self.offset,
                });
            }
            if kind == FrameKind::Routed && body.len() >= ROUTED_PREFIX_FIXED_LEN {
                // The route prefix (checked above) holds the check of the rest: one pass over
                // the content, as for any other frame.
                let expected = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
                let actual = routed_content_check(&body[routed_prefix_len(body)..]);
                if actual != expected {
                    return Err(DecodeError::ContentCheckMismatch {
                        expected,
                        actual,
                        offset: self.offset,
                    });
                }
            }
        }
        self.offset += frame_len as u64;
        Ok(Some((kind, frame_len)))
    }

    /// Takes the next whole frame off the front of `buf`, if it is all there. `Ok(None)` means
    /// more bytes are needed; an error means the stream is bad from here on.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        let Some((kind, frame_len)) = self.peek(buf)? else {
            return Ok(None);
        };
        let mut frame = buf.split_to(frame_len);
        frame.advance(HEADER_LEN);
        Ok(Some(Frame {
            kind,
            body: frame.freeze(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn stream(frames: &[(FrameKind, Vec<u8>)]) -> BytesMut {
        let mut out = BytesMut::new();
        for (k, b) in frames {
            encode_frame(*k, b, &mut out);
        }
        out
    }

    proptest! {
        #[test]
        fn a_gathered_header_is_the_header_of_the_whole(
            body in prop::collection::vec(any::<u8>(), 0..5000),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(body.len() + 1)).collect();
            at.sort_unstable();
            let mut parts = Vec::new();
            let mut from = 0;
            for &c in &at {
                parts.push(&body[from..c]);
                from = c;
            }
            parts.push(&body[from..]);
            prop_assert_eq!(
                encode_header_gathered(FrameKind::Ack, &parts),
                encode_header(FrameKind::Ack, &body)
            );
        }
    }

    #[test]
    fn header_layout_is_the_documented_one() {
        let h = encode_header(FrameKind::Data, b"hi");
        assert_eq!(&h[..4], &[0x01, 0x02, 0x00, 0x00]);
        let check = xxh3_64_with_seed(b"hi", 0x0201) as u32;
        assert_eq!(&h[4..], &check.to_le_bytes());
    }

    #[test]
    fn waits_for_whole_frames() {
        let full = stream(&[(FrameKind::Data, b"hello".to_vec())]);
        let mut dec = FrameDecoder::new(DEFAULT_BODY_LEN_MAX);
        for cut in 0..full.len() {
            let mut part = BytesMut::from(&full[..cut]);
            assert_eq!(dec.decode(&mut part).unwrap(), None, "cut at {cut}");
        }
        let mut all = full.clone();
        let f = dec.decode(&mut all).unwrap().unwrap();
        assert_eq!(f.body.as_ref(), b"hello");
        assert!(all.is_empty());
        assert_eq!(dec.offset(), full.len() as u64);
    }

    #[test]
    fn refuses_oversize_before_the_body_arrives() {
        let mut dec = FrameDecoder::new(16);
        let mut buf = BytesMut::from(&encode_header(FrameKind::Data, &[0u8; 17])[..]);
        let err = dec.decode(&mut buf).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::BodyTooLong {
                len: 17,
                max: 16,
                ..
            }
        ));
        assert!(err.to_string().contains("over the 16-byte limit"));
    }

    #[test]
    fn refuses_unknown_kind_and_bad_checksum_naming_the_offset() {
        let mut buf = stream(&[(FrameKind::Data, b"ok".to_vec())]);
        buf.extend_from_slice(&[0x7f, 0, 0, 0, 0, 0, 0, 0]);
        let mut dec = FrameDecoder::new(DEFAULT_BODY_LEN_MAX);
        dec.decode(&mut buf).unwrap().unwrap();
        let err = dec.decode(&mut buf).unwrap_err();
        assert_eq!(
            err,
            DecodeError::UnknownKind {
                kind: 0x7f,
                offset: 10
            }
        );

        let mut bad = stream(&[(FrameKind::Data, b"payload".to_vec())]);
        let last = bad.len() - 1;
        bad[last] ^= 0x40;
        let err = FrameDecoder::new(64).decode(&mut bad).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::ChecksumMismatch { offset: 0, .. }
        ));
        assert!(err.to_string().contains("checksum mismatch"));
    }

    fn kind_strategy() -> impl Strategy<Value = FrameKind> {
        prop::sample::select(vec![
            FrameKind::Data,
            FrameKind::Routed,
            FrameKind::Ack,
            FrameKind::Ping,
            FrameKind::Pong,
            FrameKind::Close,
            FrameKind::DataBatch,
            FrameKind::Hello,
            FrameKind::Auth,
            FrameKind::Channel,
        ])
    }

    proptest! {
        /// Any sequence of frames, delivered in any chunking, decodes to itself.
        #[test]
        fn frames_round_trip_through_any_chunking(
            frames in prop::collection::vec((kind_strategy(), prop::collection::vec(any::<u8>(), 0..600)), 0..20),
            chunk in 1usize..700,
        ) {
            let wire = stream(&frames);
            let mut dec = FrameDecoder::new(1024);
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            for piece in wire.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(f) = dec.decode(&mut buf).unwrap() {
                    out.push((f.kind, f.body.to_vec()));
                }
            }
            prop_assert!(buf.is_empty());
            // A ROUTED body goes out with its content check written in.
            let sealed: Vec<(FrameKind, Vec<u8>)> = frames
                .into_iter()
                .map(|(k, mut b)| {
                    if k == FrameKind::Routed {
                        seal_routed_content(&mut b);
                    }
                    (k, b)
                })
                .collect();
            prop_assert_eq!(out, sealed);
        }

        /// A single flipped bit anywhere in a frame is caught (never a wrong frame delivered).
        #[test]
        fn a_flipped_bit_never_yields_a_wrong_frame(
            kind in prop::sample::select(vec![FrameKind::Data, FrameKind::Routed]),
            mut body in prop::collection::vec(any::<u8>(), 0..200),
            route_len in 0u8..4,
            bit in any::<prop::sample::Index>(),
        ) {
            if kind == FrameKind::Routed && body.len() > 1 {
                // A route that fits, so that both checks (prefix and content) are in play.
                body[1] = route_len;
            }
            let mut wire = stream(&[(kind, body)]);
            let i = bit.index(wire.len() * 8);
            wire[i / 8] ^= 1 << (i % 8);
            let mut dec = FrameDecoder::new(1024);
            let decoded = dec.decode(&mut wire);
            prop_assert!(!matches!(decoded, Ok(Some(_))), "a corrupted frame was accepted: {:?}", decoded);
        }
    }
}
