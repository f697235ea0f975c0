//! What one message of a read is: a [`Span`] says where its body lies in the read's buffer
//! and of which [`BodyKind`] it is; [`Span::parse`] makes the typed [`Body`] its consumer
//! takes (a call's id, a publish's head, a log offer, ...).
//!
//! A read's reader checks every body once as it cuts the frames ([`message_spans`]
//! runs [`Body::parse`], so a lie closes its link with where it was, before anything is
//! acknowledged) and keeps only spans: 8 bytes a message, so a read of a thousand small data
//! messages is one small vector, and a data message is never parsed at all. The receive
//! dispatcher then sorts spans by [`Span::kind`] and parses each other body once more into
//! the value its consumer acts on; no consumer reads a body's bytes by itself.

use crate::frame::{FrameKind, BODY_LEN_CEILING, CALL_HEADER_LEN, REPLY_HEADER_LEN};
use crate::group::{GroupLog, Interest, PublishHead, Repair};
use crate::multicast::MulticastHead;
use std::ops::Range;

/// The bits of [`Span`]'s second word that hold the body's length (lengths are under
/// `BODY_LEN_CEILING + 1` = 2^24 bytes); the bits above hold its kind.
const LEN_MASK: u32 = BODY_LEN_CEILING as u32;
/// Where the kind sits in a span's second word.
const KIND_SHIFT: u32 = 24;

/// What kind of message a span's body is: the frame kind it came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BodyKind {
    /// An application message (a DATA frame, or one entry of a DATA_BATCH).
    Data = 0,
    /// A request (CALL): the call id, then the payload.
    Call = 1,
    /// A reply (REPLY): the call id, the status, then the payload.
    Reply = 2,
    /// A group's INTEREST.
    Interest = 3,
    /// A group's PUBLISH.
    Publish = 4,
    /// A group's REPAIR (ask, copy or gap).
    Repair = 5,
    /// A MULTICAST.
    Multicast = 6,
    /// A GROUP_LOG offer or answer.
    GroupLog = 7,
}

impl BodyKind {
    /// The kind of a span's body for a frame of `kind` (`None`: a frame that carries no
    /// message, or a DATA_BATCH, whose entries are spans of their own).
    pub fn of_frame(kind: FrameKind) -> Option<Self> {
        Some(match kind {
            FrameKind::Data => Self::Data,
            FrameKind::Call => Self::Call,
            FrameKind::Reply => Self::Reply,
            FrameKind::Interest => Self::Interest,
            FrameKind::Publish => Self::Publish,
            FrameKind::Repair => Self::Repair,
            FrameKind::Multicast => Self::Multicast,
            FrameKind::GroupLog => Self::GroupLog,
            _ => return None,
        })
    }

    /// Whether a message of this kind is a group's (INTEREST, PUBLISH, REPAIR, MULTICAST;
    /// not GROUP_LOG, which the reader of a ring attaches).
    pub fn is_group(self) -> bool {
        matches!(
            self,
            Self::Interest | Self::Publish | Self::Repair | Self::Multicast
        )
    }

    fn from_bits(bits: u32) -> Self {
        match bits {
            0 => Self::Data,
            1 => Self::Call,
            2 => Self::Reply,
            3 => Self::Interest,
            4 => Self::Publish,
            5 => Self::Repair,
            6 => Self::Multicast,
            // `Span::new` writes no other value.
            _ => Self::GroupLog,
        }
    }
}

/// Where one message lies in a read's buffer, and its kind: 8 bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Span {
    start: u32,
    /// The body's length, its kind in the top bits.
    tagged: u32,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}@{}+{}", self.kind(), self.start, self.len())
    }
}

impl Span {
    /// The span of a `kind` body of `len` bytes at `start`. `len` is at most the frame
    /// body ceiling (2^24 - 1 bytes), which every frame's reader enforces.
    pub fn new(start: u32, len: u32, kind: BodyKind) -> Self {
        debug_assert!(len <= LEN_MASK, "a body of {len} bytes");
        Self {
            start,
            tagged: (len & LEN_MASK) | (kind as u32) << KIND_SHIFT,
        }
    }

    /// The span of a data message of `len` bytes at `start`.
    pub fn data(start: u32, len: u32) -> Self {
        Self::new(start, len, BodyKind::Data)
    }

    /// What kind of message it is.
    pub fn kind(self) -> BodyKind {
        BodyKind::from_bits(self.tagged >> KIND_SHIFT)
    }

    /// Whether it is a data message (the common case, one comparison).
    pub fn is_data(self) -> bool {
        self.tagged >> KIND_SHIFT == 0
    }

    /// Where the body starts in its buffer, in bytes.
    pub fn start(self) -> u32 {
        self.start
    }

    /// The body's length in bytes.
    pub fn len(self) -> u32 {
        self.tagged & LEN_MASK
    }

    /// Whether the body is empty (an empty data message).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Where the body lies in its buffer.
    pub fn range(self) -> Range<usize> {
        self.start as usize..(self.start + self.len()) as usize
    }

    /// Where the application's payload lies in the buffer: a request's starts after its call
    /// id, a reply's after its call id and status; any other message's is its body.
    pub fn payload_range(self) -> Range<usize> {
        let skip = match self.kind() {
            BodyKind::Call => CALL_HEADER_LEN,
            BodyKind::Reply => REPLY_HEADER_LEN,
            _ => 0,
        };
        self.start as usize + skip..(self.start + self.len()) as usize
    }

    /// The same span `by` bytes further into its buffer (a relayed message's spans are
    /// found inside the ROUTED body, then placed in the read's buffer).
    pub fn shifted(self, by: u32) -> Self {
        Self {
            start: self.start + by,
            tagged: self.tagged,
        }
    }

    /// The body, typed, from `buf` (the buffer the span was made for); an error names what
    /// is false in it (none for a span its reader made: it checked the body).
    pub fn parse(self, buf: &[u8]) -> Result<Body<'_>, String> {
        let body = buf
            .get(self.range())
            .ok_or_else(|| format!("{self:?} past the end of a read of {} bytes", buf.len()))?;
        Body::parse(self.kind(), body)
    }
}

/// Appends the [`Span`] of each message of a DATA, DATA_BATCH, CALL, REPLY, INTEREST,
/// PUBLISH, REPAIR, MULTICAST or GROUP_LOG frame whose body starts at `base` in the caller's
/// buffer, each body checked ([`Body::parse`]): a DATA_BATCH gives one data span per entry,
/// any other kind one span over its whole body. Any other kind, a batch whose entries do not
/// tile its body, or a body that does not parse is an error naming what was found (and
/// nothing is appended).
pub fn message_spans(
    kind: FrameKind,
    body: &[u8],
    base: usize,
    spans: &mut Vec<Span>,
) -> Result<(), String> {
    if kind == FrameKind::DataBatch {
        let before = spans.len();
        return crate::frame::for_each_batch_entry(body, |start, len| {
            spans.push(Span::data((base + start) as u32, len as u32));
        })
        .inspect_err(|_| spans.truncate(before));
    }
    let Some(body_kind) = BodyKind::of_frame(kind) else {
        return Err(format!("{kind:?} frame where only messages may be"));
    };
    if body_kind != BodyKind::Data {
        Body::parse(body_kind, body)?;
    }
    spans.push(Span::new(base as u32, body.len() as u32, body_kind));
    Ok(())
}

/// One message's body, typed.
#[derive(Debug)]
pub enum Body<'a> {
    /// An application message: its payload.
    Data(&'a [u8]),
    /// A request.
    Call {
        /// The caller's id for the call.
        id: u64,
        /// The request's payload.
        payload: &'a [u8],
    },
    /// A reply.
    Reply {
        /// The id of the call it answers.
        id: u64,
        /// `frame::REPLY_OK`, or why there is no answer.
        status: u8,
        /// The answer, or what went wrong.
        payload: &'a [u8],
    },
    /// A group's INTEREST.
    Interest(Interest<'a>),
    /// A group's PUBLISH (or a mark: see [`PublishHead`]).
    Publish(PublishHead<'a>),
    /// A group's REPAIR.
    Repair(Repair<'a>),
    /// A MULTICAST.
    Multicast(MulticastHead<'a>),
    /// A GROUP_LOG offer or answer.
    GroupLog(GroupLog<'a>),
}

impl<'a> Body<'a> {
    /// Parses `body`, a message of `kind`; an error names what is false in it.
    pub fn parse(kind: BodyKind, body: &'a [u8]) -> Result<Self, String> {
        Ok(match kind {
            BodyKind::Data => Self::Data(body),
            BodyKind::Call => {
                let (id, payload) = call_head(body, "Call", CALL_HEADER_LEN)?;
                Self::Call { id, payload }
            }
            BodyKind::Reply => {
                let (id, rest) = call_head(body, "Reply", REPLY_HEADER_LEN)?;
                Self::Reply {
                    id,
                    status: rest[0],
                    payload: &rest[1..],
                }
            }
            BodyKind::Interest => Self::Interest(crate::group::decode_interest(body)?),
            BodyKind::Publish => Self::Publish(crate::group::decode_publish(body)?),
            BodyKind::Repair => Self::Repair(crate::group::decode_repair(body)?),
            BodyKind::Multicast => Self::Multicast(crate::multicast::decode_multicast(body)?),
            BodyKind::GroupLog => Self::GroupLog(crate::group::decode_group_log(body)?),
        })
    }
}

/// A CALL or REPLY body's call id and what follows it, if its header (`need` bytes) is there.
fn call_head<'a>(body: &'a [u8], what: &str, need: usize) -> Result<(u64, &'a [u8]), String> {
    if body.len() < need {
        return Err(format!(
            "{what} body of {} bytes (its header alone is {need})",
            body.len()
        ));
    }
    let (id, rest) = body.split_at(CALL_HEADER_LEN);
    Ok((u64::from_le_bytes(id.try_into().expect("8 bytes")), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_keeps_its_start_length_and_kind() {
        for kind in [
            BodyKind::Data,
            BodyKind::Call,
            BodyKind::Reply,
            BodyKind::Interest,
            BodyKind::Publish,
            BodyKind::Repair,
            BodyKind::Multicast,
            BodyKind::GroupLog,
        ] {
            let s = Span::new(7, LEN_MASK, kind);
            assert_eq!((s.start(), s.len(), s.kind()), (7, LEN_MASK, kind));
            assert_eq!(s.is_data(), kind == BodyKind::Data);
            assert_eq!(s.shifted(3).range(), 10..10 + LEN_MASK as usize);
        }
        assert_eq!(std::mem::size_of::<Span>(), 8);
    }

    #[test]
    fn a_payload_skips_a_calls_header() {
        let call = Span::new(4, 10, BodyKind::Call);
        assert_eq!(call.payload_range(), 4 + CALL_HEADER_LEN..14);
        let reply = Span::new(0, 9, BodyKind::Reply);
        assert!(reply.payload_range().is_empty());
        assert_eq!(Span::data(2, 3).payload_range(), 2..5);
    }

    #[test]
    fn a_call_is_parsed_into_its_id_and_payload() {
        let mut body = 42u64.to_le_bytes().to_vec();
        body.extend_from_slice(b"hi");
        let span = Span::new(0, body.len() as u32, BodyKind::Call);
        match span.parse(&body).unwrap() {
            Body::Call { id, payload } => assert_eq!((id, payload), (42, &b"hi"[..])),
            other => panic!("{other:?}"),
        }
        let Body::Reply {
            id: 42,
            status: b'h',
            payload: b"i",
        } = Span::new(0, body.len() as u32, BodyKind::Reply)
            .parse(&body)
            .unwrap()
        else {
            panic!("a reply");
        };
    }

    #[test]
    fn a_short_or_outlying_body_is_named() {
        let err = Span::new(0, 3, BodyKind::Reply).parse(b"abc").unwrap_err();
        assert_eq!(err, "Reply body of 3 bytes (its header alone is 9)");
        let err = Span::data(2, 5).parse(b"abc").unwrap_err();
        assert!(err.contains("past the end of a read of 3 bytes"), "{err}");
    }
}
