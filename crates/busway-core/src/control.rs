//! Bodies of the small control frames: CLOSE, PING and PONG.

use crate::frame::{frame_bytes, FrameKind};
use bytes::Bytes;
use std::fmt;

/// Longest reason text a CLOSE frame carries, in bytes; longer reasons are cut at a char boundary.
pub const CLOSE_REASON_LEN_MAX: usize = 256;

/// Why a link is being closed, as carried by a CLOSE frame.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u16)]
pub enum CloseCode {
    /// The link ends, and the node may come back (the answer to a peer's CLOSE).
    Normal = 0,
    /// The peer sent something this node could not accept (bad frame, bad handshake).
    ProtocolError = 1,
    /// The handshake failed authentication.
    AuthFailed = 2,
    /// The bus id is already connected (from this or another incarnation).
    Duplicate = 3,
    /// The node is shutting down: this incarnation will not come back, so its peers give up
    /// on it at once.
    Shutdown = 4,
    /// Any code this version does not know.
    Other = 0xffff,
}

impl CloseCode {
    fn from_u16(v: u16) -> Self {
        match v {
            0 => Self::Normal,
            1 => Self::ProtocolError,
            2 => Self::AuthFailed,
            3 => Self::Duplicate,
            4 => Self::Shutdown,
            _ => Self::Other,
        }
    }
}

/// The body of a CLOSE frame: `u16 LE code`, then the reason as UTF-8.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Close {
    /// Why the link is being closed.
    pub code: CloseCode,
    /// Free text for the peer's log, at most [`CLOSE_REASON_LEN_MAX`] bytes on the wire.
    pub reason: String,
}

impl fmt::Display for Close {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.reason)
    }
}

impl Close {
    /// A whole CLOSE frame.
    pub fn frame(code: CloseCode, reason: &str) -> Bytes {
        let mut cut = reason.len().min(CLOSE_REASON_LEN_MAX);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut body = Vec::with_capacity(2 + cut);
        body.extend_from_slice(&(code as u16).to_le_bytes());
        body.extend_from_slice(&reason.as_bytes()[..cut]);
        frame_bytes(FrameKind::Close, &body)
    }

    /// Reads a CLOSE body; a body that is too short or not UTF-8 still closes the link, with a
    /// reason that says so.
    pub fn decode(body: &[u8]) -> Self {
        if body.len() < 2 {
            return Self {
                code: CloseCode::Other,
                reason: "malformed CLOSE frame (body shorter than 2 bytes)".into(),
            };
        }
        let code = CloseCode::from_u16(u16::from_le_bytes([body[0], body[1]]));
        let reason = String::from_utf8_lossy(&body[2..]).into_owned();
        Self { code, reason }
    }
}

/// The body of PING and PONG: an opaque u64 token that the PONG echoes.
pub fn ping_frame(kind: FrameKind, token: u64) -> Bytes {
    frame_bytes(kind, &token.to_le_bytes())
}

/// An ACK frame: the receiver has every message below `next_expected` (cumulative).
pub fn ack_frame(next_expected: u64) -> Bytes {
    frame_bytes(FrameKind::Ack, &next_expected.to_le_bytes())
}

/// Reads a PING or PONG token, or an ACK's number.
pub fn decode_token(body: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(body.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameDecoder, DEFAULT_BODY_LEN_MAX};
    use bytes::BytesMut;

    #[test]
    fn close_round_trips_and_cuts_long_reasons_on_a_char_boundary() {
        let long = "é".repeat(300);
        let mut buf = BytesMut::from(&Close::frame(CloseCode::AuthFailed, &long)[..]);
        let f = FrameDecoder::new(DEFAULT_BODY_LEN_MAX)
            .decode(&mut buf)
            .unwrap()
            .unwrap();
        let c = Close::decode(&f.body);
        assert_eq!(c.code, CloseCode::AuthFailed);
        assert!(c.reason.len() <= CLOSE_REASON_LEN_MAX);
        assert!(c.reason.chars().all(|ch| ch == 'é'));
        assert_eq!(Close::decode(&[1]).code, CloseCode::Other);
    }

    #[test]
    fn tokens_need_exactly_eight_bytes() {
        assert_eq!(decode_token(&7u64.to_le_bytes()), Some(7));
        assert_eq!(decode_token(&[1, 2, 3]), None);
    }
}
