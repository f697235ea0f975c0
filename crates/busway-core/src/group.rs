//! Groups on the wire. Two frames, each one message numbered with the pair's others (held,
//! acknowledged and resent like DATA), and only ever on a direct link: a group's traffic goes
//! hop by hop, each node deciding which of its links lead to members.
//!
//! * INTEREST: `u8 op, u8 name length, name`: the sender now wants (`INTEREST_JOIN`) or no
//!   longer wants (`INTEREST_LEAVE`) the group's publishes, for itself or for nodes behind it.
//! * PUBLISH: `u64 publisher, u64 publisher's incarnation, u64 number, u8 name length, name,
//!   payload`: one publish, which crosses each link once however many members lie behind it.
//!   `number` counts the publisher's publishes to this group from 1 (per incarnation), so that
//!   a node drops a copy that reached it by a second path and sees a gap for what it missed.
//!   `PUBLISH_BACKPRESSURE_BIT` set in `number` asks relays to wait for room toward members
//!   rather than drop it. With `PUBLISH_MARK_BIT` set in `number` it is a *mark*: no payload, it says
//!   only that the publisher's last publish to the group is `number`, so that a member that
//!   lost the end of a stream (a relay died with it) sees the gap without a later publish.
//!   A *gap mark* (a mark with `PUBLISH_BATCH_BIT` too, only toward a peer that advertised
//!   `caps::GAP_MARKS`) carries `u64 from` as its payload, `1 <= from <= number`: publishes
//!   `from..=number` were dropped on the way to the receiver (a relay's or the publisher's
//!   way to it stayed full), so a member whose stream had not begun begins it at `from` and
//!   asks for them, rather than at the next publish, unaware of what it lost.
//!   With `PUBLISH_BATCH_BIT` set (only toward a peer that advertised `caps::PUBLISH_BATCH`)
//!   the payload is one or more entries `u16 length, payload`: publishes numbered `number`,
//!   `number + 1`, ... in a row, one head and one link message for the lot (a relay passes the
//!   whole frame on when it is all new).
//! * REPAIR, end to end (direct or inside ROUTED), one of three ops:
//!   `REPAIR_ASK` (member to publisher): `u64 publisher's incarnation, u64 from, u64 to, u8
//!   name length, name`: send me your publishes to the group numbered `from..to` (one gap);
//!   `REPAIR_COPY` (publisher to member): a PUBLISH body (never a mark), for the member alone;
//!   `REPAIR_LOST` (publisher to member): `u64 incarnation, u64 from, u64 to, u8 name length,
//!   name`: publishes `from..to` are no longer held and will never come;
//!   `REPAIR_UNREACHABLE` (a relay to a multicast's source): `u64 source incarnation, u64
//!   receiver, u64 number, reason` (UTF-8, at most `UNREACHABLE_REASON_BYTES_MAX`): the
//!   relay had no way on toward `receiver` for its multicast `number`, and drops what comes
//!   for it until it has.
//!
//! * GROUP_LOG, on a direct link between two nodes of one host, one of three ops:
//!   `LOG_OFFER` (publisher to a peer that asked for the group): `u64 token, u64 serial, u64
//!   pid << 32 | fd, u64 inode, u64 capacity, u8 name length, name`: from now on my publishes
//!   to the group are also in this log (see `busway_shm::log`), which you may read instead of
//!   having them on this link; `LOG_ACCEPT` / `LOG_DECLINE` (the peer back): `u64 token, u64
//!   serial, u8 name length, name`: I read it from now on (send me the group's publishes
//!   through it alone) / I do not (keep them on the link). The token names the log, the
//!   serial the offer answered.
//!
//! A name is 1 to `GROUP_NAME_BYTES_MAX` bytes of UTF-8. In a REPAIR, the empty name
//! (`MULTICAST_STREAM`) names the stream of the source's multicasts to the member (see the
//! MULTICAST frame): numbered per receiver, asked for, copied and lost like a group's.

pub mod calls;
pub mod forwards;
pub mod host;
pub mod intake;
pub mod locked;
pub mod log_offers;
pub mod log_records;
pub mod node;
pub mod permissions;
pub mod permitted;
pub mod publishes;
pub mod reads;
pub mod repairs;
pub mod seen_order;
pub mod state;
pub mod stream;

use crate::BusId;

/// The name a REPAIR gives the stream of a source's multicasts to one receiver (no group is
/// named by the empty string).
pub const MULTICAST_STREAM: &str = "";
/// Longest group name, in bytes.
pub const GROUP_NAME_BYTES_MAX: usize = 128;
/// INTEREST op: the sender wants the group's publishes.
pub const INTEREST_JOIN: u8 = 1;
/// INTEREST op: the sender no longer wants them.
pub const INTEREST_LEAVE: u8 = 0;
/// Bytes of a PUBLISH body before its name: publisher, incarnation, number, name length.
pub const PUBLISH_FIXED_BYTES: usize = 25;
/// Set in a PUBLISH's number: the frame is a mark, with no payload (a publisher never makes
/// 2^62 publishes, so this bit and the next are free).
pub const PUBLISH_MARK_BIT: u64 = 1 << 63;
/// Set in a PUBLISH's number: the group's publisher holds back for its slowest member
/// (`GroupPolicy::Backpressure`), so a relay waits for room toward a member rather than
/// drop the publish for it.
pub const PUBLISH_BACKPRESSURE_BIT: u64 = 1 << 62;
/// Set in a PUBLISH's number: the payload is a batch of publishes in a row (see the module
/// doc). Numbers stay below it: a publisher never makes 2^61 publishes.
pub const PUBLISH_BATCH_BIT: u64 = 1 << 61;
/// Largest body of a PUBLISH batch, head included, in bytes (the size of a DATA_BATCH's, see
/// `outbox::BATCH_BODY_BYTES_MAX`): a longer one is a protocol error, so that what one frame
/// makes a receiver do per publish stays bounded.
pub const PUBLISH_BATCH_BODY_BYTES_MAX: usize = 64 << 10;
/// Most publishes in one PUBLISH batch: 64-byte payloads fill a batch at about 990; a batch
/// of more (a lie, or many empty payloads) is a protocol error.
pub const PUBLISH_BATCH_COUNT_MAX: u64 = 1024;
/// The flag bits of a PUBLISH's number word.
const PUBLISH_FLAG_BITS: u64 = PUBLISH_MARK_BIT | PUBLISH_BACKPRESSURE_BIT | PUBLISH_BATCH_BIT;
/// REPAIR op: a member asks the publisher for a range of its publishes (one gap).
pub const REPAIR_ASK: u8 = 1;
/// REPAIR op: a publisher's copy of one publish, for the asking member alone.
pub const REPAIR_COPY: u8 = 2;
/// REPAIR op: the publisher no longer holds a range of its publishes.
pub const REPAIR_LOST: u8 = 3;
/// REPAIR op: a relay cannot pass a multicast on toward one of its receivers.
pub const REPAIR_UNREACHABLE: u8 = 4;
/// REPAIR op: a node refused this member's join or this publisher's publish to a group (its
/// group permissions), and says why.
pub const REPAIR_REFUSED: u8 = 5;
/// Longest reason a REPAIR unreachable carries, in bytes.
pub const UNREACHABLE_REASON_BYTES_MAX: usize = 256;

/// GROUP_LOG op: a publisher offers its log of a group.
pub const LOG_OFFER: u8 = 1;
/// GROUP_LOG op: the peer reads the log offered from now on.
pub const LOG_ACCEPT: u8 = 2;
/// GROUP_LOG op: the peer does not read it.
pub const LOG_DECLINE: u8 = 3;

/// A GROUP_LOG offer: the sender's publishes to `name` are also in the log that process
/// `pid` holds as descriptor `fd` (file `inode`, `capacity` bytes of data), bound to `token`;
/// `serial` names this offer (an answer echoes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogOffer<'a> {
    /// The group's name.
    pub name: &'a str,
    /// The number the log's header is bound to, which names the log.
    pub token: u64,
    /// Names this offer; the answer echoes it.
    pub serial: u64,
    /// The id of the process that holds the log.
    pub pid: u32,
    /// The log's file descriptor number in that process.
    pub fd: u32,
    /// The log file's inode number, which the reader checks on the file it opened.
    pub inode: u64,
    /// How many bytes of data the log holds.
    pub capacity: u64,
}

/// A decoded GROUP_LOG body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupLog<'a> {
    /// The sender's publishes to a group are also in a log (see [`LogOffer`]).
    Offer(LogOffer<'a>),
    /// The log offered with `token` in offer `serial` is read from now on (`accept`), or it
    /// is not.
    Answer {
        /// The group's name.
        name: &'a str,
        /// The token of the log answered about.
        token: u64,
        /// The serial of the offer answered.
        serial: u64,
        /// The peer reads the log from now on (`LOG_ACCEPT`), or does not (`LOG_DECLINE`).
        accept: bool,
    },
}

/// The body of a GROUP_LOG offer.
pub fn encode_log_offer(o: &LogOffer<'_>) -> Vec<u8> {
    let name = o.name;
    let mut out = Vec::with_capacity(42 + name.len());
    out.push(LOG_OFFER);
    for v in [
        o.token,
        o.serial,
        u64::from(o.pid) << 32 | u64::from(o.fd),
        o.inode,
        o.capacity,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// The body of a GROUP_LOG accept or decline of offer `serial` of the log bound to `token`.
pub fn encode_log_answer(name: &str, token: u64, serial: u64, accept: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + name.len());
    out.push(if accept { LOG_ACCEPT } else { LOG_DECLINE });
    out.extend_from_slice(&token.to_le_bytes());
    out.extend_from_slice(&serial.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes a GROUP_LOG body; the error names what is wrong.
pub fn decode_group_log(body: &[u8]) -> Result<GroupLog<'_>, String> {
    let Some((&op, rest)) = body.split_first() else {
        return Err("GROUP_LOG body of 0 bytes".into());
    };
    match op {
        LOG_OFFER => {
            let ([token, serial, pid_fd, inode, capacity], name) =
                fields_and_name::<5>(rest, "GROUP_LOG offer")?;
            Ok(GroupLog::Offer(LogOffer {
                name,
                token,
                serial,
                pid: (pid_fd >> 32) as u32,
                fd: pid_fd as u32,
                inode,
                capacity,
            }))
        }
        LOG_ACCEPT | LOG_DECLINE => {
            let what = if op == LOG_ACCEPT {
                "GROUP_LOG accept"
            } else {
                "GROUP_LOG decline"
            };
            let ([token, serial], name) = fields_and_name::<2>(rest, what)?;
            Ok(GroupLog::Answer {
                name,
                token,
                serial,
                accept: op == LOG_ACCEPT,
            })
        }
        other => Err(format!("GROUP_LOG op {other} (expected 1 to 3)")),
    }
}

/// A decoded INTEREST body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interest<'a> {
    /// The sender now wants the group's publishes (`INTEREST_JOIN`), or no longer does.
    pub join: bool,
    /// The group's name.
    pub name: &'a str,
}

/// A decoded PUBLISH head; the payload is the body from `payload_at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishHead<'a> {
    /// The publisher's bus id.
    pub publisher: BusId,
    /// The publisher's incarnation.
    pub incarnation: u64,
    /// The publish's number (a batch's first, a mark's last publish), without the flag bits.
    pub number: u64,
    /// The group's name.
    pub name: &'a str,
    /// Where the payload starts in the body, in bytes.
    pub payload_at: usize,
    /// A mark: no payload; the publisher's last publish to the group is `number`.
    pub mark: bool,
    /// Relays wait for room toward members rather than drop it (`PUBLISH_BACKPRESSURE_BIT`).
    pub backpressure: bool,
    /// The payload is a batch of publishes numbered from `number` (`PUBLISH_BATCH_BIT`; see
    /// [`for_each_publish`]), `count` of them.
    pub batch: bool,
    /// How many publishes the body carries: 1, or a batch's entries (0 for a mark).
    pub count: u64,
    /// A gap mark's first publish dropped on the way (see the module doc).
    pub gap_from: Option<u64>,
}

/// A decoded REPAIR body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repair<'a> {
    /// Send me your publishes to `name` numbered `from..to` (if you are still
    /// `incarnation`): one gap, not everything after it, so that a member with several gaps
    /// is not sent what it holds.
    Ask {
        /// The publisher's incarnation the member asks of.
        incarnation: u64,
        /// The first publish asked for.
        from: u64,
        /// The publish after the last one asked for (the range excludes it).
        to: u64,
        /// The group's name, or `MULTICAST_STREAM` for the source's multicasts.
        name: &'a str,
    },
    /// A copy of one publish; its head's `payload_at` counts from the REPAIR body's start.
    Copy(PublishHead<'a>),
    /// Publishes `from..to` of `incarnation` to `name` are no longer held.
    Lost {
        /// The publisher's incarnation whose publishes are lost.
        incarnation: u64,
        /// The first publish lost.
        from: u64,
        /// The publish after the last one lost (the range excludes it).
        to: u64,
        /// The group's name, or `MULTICAST_STREAM` for the source's multicasts.
        name: &'a str,
    },
    /// A relay had no way on toward `receiver` for multicast `number` of the source's
    /// `incarnation`, and says why.
    Unreachable {
        /// The multicast source's incarnation.
        incarnation: u64,
        /// The receiver the relay has no way on toward.
        receiver: BusId,
        /// The multicast's number in the source's stream to that receiver.
        number: u64,
        /// Why, as UTF-8 (at most `UNREACHABLE_REASON_BYTES_MAX` bytes).
        reason: &'a str,
    },
    /// The sender refused this node's join of `name` (`publish` false) or its publishes to
    /// `name` (`publish` true), and says why.
    Refused {
        /// The refusal is of the node's publishes (true) or of its join (false).
        publish: bool,
        /// The group's name.
        name: &'a str,
        /// Why, as UTF-8 (at most `UNREACHABLE_REASON_BYTES_MAX` bytes).
        reason: &'a str,
    },
}

/// Whether `name` may name a group; the error says why not.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > GROUP_NAME_BYTES_MAX {
        return Err(format!(
            "group name of {} bytes (1 to {GROUP_NAME_BYTES_MAX} allowed)",
            name.len()
        ));
    }
    Ok(())
}

/// The name of `len` bytes at the start of `rest`, checked (a group's name, or in a REPAIR
/// also `MULTICAST_STREAM`).
fn name_at<'a>(rest: &'a [u8], len: usize, what: &str) -> Result<&'a str, String> {
    if len == 0 && what.starts_with("REPAIR") {
        return Ok(MULTICAST_STREAM);
    }
    let bytes = rest.get(..len).ok_or_else(|| {
        format!(
            "{what} names a group of {len} bytes but only {} follow",
            rest.len()
        )
    })?;
    let name =
        std::str::from_utf8(bytes).map_err(|_| format!("{what}: group name is not UTF-8"))?;
    check_name(name).map_err(|e| format!("{what}: {e}"))?;
    Ok(name)
}

/// The body of an INTEREST frame.
pub fn encode_interest(join: bool, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + name.len());
    out.push(if join { INTEREST_JOIN } else { INTEREST_LEAVE });
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes an INTEREST body; the error names what is wrong.
pub fn decode_interest(body: &[u8]) -> Result<Interest<'_>, String> {
    let [op, len, rest @ ..] = body else {
        return Err(format!(
            "INTEREST body of {} bytes (at least 3)",
            body.len()
        ));
    };
    let join = match *op {
        INTEREST_JOIN => true,
        INTEREST_LEAVE => false,
        other => return Err(format!("INTEREST op {other} (expected 0 or 1)")),
    };
    if rest.len() != usize::from(*len) {
        return Err(format!(
            "INTEREST names a group of {len} bytes but {} follow",
            rest.len()
        ));
    }
    let name = name_at(rest, usize::from(*len), "INTEREST")?;
    Ok(Interest { join, name })
}

/// The head of a PUBLISH body (the payload follows it).
pub fn encode_publish_head(publisher: BusId, incarnation: u64, number: u64, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(PUBLISH_FIXED_BYTES + name.len());
    out.extend_from_slice(&publisher.0.to_le_bytes());
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.extend_from_slice(&number.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes the head of a PUBLISH body; the error names what is wrong.
pub fn decode_publish(body: &[u8]) -> Result<PublishHead<'_>, String> {
    decode_publish_as(body, "PUBLISH")
}

/// [`decode_publish`], its errors named `what` (a REPAIR copy may name `MULTICAST_STREAM`).
fn decode_publish_as<'a>(body: &'a [u8], what: &str) -> Result<PublishHead<'a>, String> {
    if body.len() < PUBLISH_FIXED_BYTES {
        return Err(format!(
            "{what} body of {} bytes (its head alone is at least {})",
            body.len(),
            PUBLISH_FIXED_BYTES + 1
        ));
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let publisher = BusId(u64_at(0));
    let incarnation = u64_at(8);
    let word = u64_at(16);
    let mark = word & PUBLISH_MARK_BIT != 0;
    let backpressure = word & PUBLISH_BACKPRESSURE_BIT != 0;
    let batch = word & PUBLISH_BATCH_BIT != 0;
    let number = word & !PUBLISH_FLAG_BITS;
    if number == 0 {
        return Err(format!("{what} numbered 0 (publishes count from 1)"));
    }
    let len = usize::from(body[PUBLISH_FIXED_BYTES - 1]);
    let rest = &body[PUBLISH_FIXED_BYTES..];
    let name = name_at(rest, len, what)?;
    let payload_at = PUBLISH_FIXED_BYTES + len;
    let gap_from = if mark && batch {
        Some(gap_mark_from(body, payload_at, number, what)?)
    } else {
        None
    };
    if mark && !batch && body.len() != payload_at {
        return Err(format!(
            "{what} mark with {} bytes of payload (a mark has none)",
            body.len() - payload_at
        ));
    }
    let count = if mark {
        0
    } else if batch {
        batch_count(body, payload_at, number, what)?
    } else {
        1
    };
    Ok(PublishHead {
        publisher,
        incarnation,
        number,
        name,
        payload_at,
        mark,
        backpressure,
        batch: batch && !mark,
        count,
        gap_from,
    })
}

/// The first number a batched gap mark numbered `number` covers (the 8 bytes after its name,
/// the whole payload), from 1 to `number`.
fn gap_mark_from(body: &[u8], payload_at: usize, number: u64, what: &str) -> Result<u64, String> {
    let from = body
        .get(payload_at..)
        .and_then(|p| <[u8; 8]>::try_from(p).ok())
        .map(u64::from_le_bytes);
    match from {
        Some(from) if (1..=number).contains(&from) => Ok(from),
        Some(from) => Err(format!(
            "{what} gap mark {number} from {from} (from 1 to the mark's number)"
        )),
        None => Err(format!(
            "{what} gap mark with {} bytes of payload (its first number, 8)",
            body.len() - payload_at
        )),
    }
}

/// How many publishes a batch numbered from `number` carries in its entries from `payload_at`:
/// within `PUBLISH_BATCH_BODY_BYTES_MAX` and `PUBLISH_BATCH_COUNT_MAX`, and its numbers below
/// the flag bits.
fn batch_count(body: &[u8], payload_at: usize, number: u64, what: &str) -> Result<u64, String> {
    if body.len() > PUBLISH_BATCH_BODY_BYTES_MAX {
        return Err(format!(
            "{what} batch of {} bytes (at most {PUBLISH_BATCH_BODY_BYTES_MAX})",
            body.len()
        ));
    }
    let mut count = 0u64;
    crate::entries::for_each_entry(&body[payload_at..], what, |_, _| count += 1)?;
    if count == 0 || count > PUBLISH_BATCH_COUNT_MAX {
        return Err(format!(
            "{what} batch {number} of {count} publishes (1 to {PUBLISH_BATCH_COUNT_MAX})"
        ));
    }
    // Below the flag bits whatever the count: a batch cannot wrap a stream's numbers.
    if number + count > PUBLISH_BATCH_BIT {
        return Err(format!(
            "{what} batch of {count} from number {number} runs past the largest number ({})",
            PUBLISH_BATCH_BIT - 1
        ));
    }
    Ok(count)
}

/// Calls `f(number, start, len)` for each publish of a PUBLISH `body` whose head is `head`
/// (decoded from it, not a mark): its number and where its payload is in `body`. Once for a
/// single publish, once per entry of a batch.
pub fn for_each_publish(body: &[u8], head: &PublishHead, mut f: impl FnMut(u64, usize, usize)) {
    if !head.batch {
        f(head.number, head.payload_at, body.len() - head.payload_at);
        return;
    }
    let mut number = head.number;
    // Checked by `decode_publish`.
    let _ = crate::entries::for_each_entry(&body[head.payload_at..], "PUBLISH", |start, len| {
        f(number, head.payload_at + start, len);
        number += 1;
    });
}

/// The single PUBLISH bodies of a batch `body` (its head `head`), one per publish, for a
/// peer that takes no batches or for the publishes of a batch that go on alone.
pub fn split_publish_batch(body: &[u8], head: &PublishHead) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(head.count as usize);
    for_each_publish(body, head, |number, start, len| {
        let one = PublishHead { number, ..*head };
        out.push(encode_publish_body(&one, &[&body[start..start + len]]));
    });
    out
}

/// The PUBLISH body of `payloads`, publishes in a row from `first`'s number (its publisher,
/// incarnation, group and backpressure flag): a single PUBLISH for one, a batch for more.
pub fn encode_publish_body(first: &PublishHead, payloads: &[&[u8]]) -> Vec<u8> {
    let backpressure = if first.backpressure {
        PUBLISH_BACKPRESSURE_BIT
    } else {
        0
    };
    let batch = if payloads.len() > 1 {
        PUBLISH_BATCH_BIT
    } else {
        0
    };
    let word = first.number | backpressure | batch;
    let mut body = encode_publish_head(first.publisher, first.incarnation, word, first.name);
    for p in payloads {
        if batch != 0 {
            body.extend_from_slice(&(p.len() as u16).to_le_bytes());
        }
        body.extend_from_slice(p);
    }
    body
}

/// The body of a PUBLISH mark: `publisher`'s last publish to `name` is `number`.
pub fn encode_mark(publisher: BusId, incarnation: u64, number: u64, name: &str) -> Vec<u8> {
    encode_publish_head(publisher, incarnation, number | PUBLISH_MARK_BIT, name)
}

/// The body of a PUBLISH gap mark: `publisher`'s publishes to `name` `from..=number` were
/// dropped on the way (see the module doc).
pub fn encode_gap_mark(
    publisher: BusId,
    incarnation: u64,
    (from, number): (u64, u64),
    name: &str,
) -> Vec<u8> {
    let word = number | PUBLISH_MARK_BIT | PUBLISH_BATCH_BIT;
    let mut body = encode_publish_head(publisher, incarnation, word, name);
    body.extend_from_slice(&from.to_le_bytes());
    body
}

/// A gap mark as a plain mark of its number, for a peer that does not read gap marks.
pub fn as_plain_mark(head: &PublishHead) -> Vec<u8> {
    encode_mark(head.publisher, head.incarnation, head.number, head.name)
}

/// The body of a REPAIR ask: send me `publisher incarnation`'s publishes to `name`
/// numbered `from..to`.
pub fn encode_repair_ask(incarnation: u64, from: u64, to: u64, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(26 + name.len());
    out.push(REPAIR_ASK);
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&to.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// The head of a REPAIR copy (the payload follows it).
pub fn encode_repair_copy_head(
    publisher: BusId,
    incarnation: u64,
    number: u64,
    name: &str,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + PUBLISH_FIXED_BYTES + name.len());
    out.push(REPAIR_COPY);
    out.extend_from_slice(&encode_publish_head(publisher, incarnation, number, name));
    out
}

/// The body of a REPAIR lost: publishes `from..to` are no longer held.
pub fn encode_repair_lost(incarnation: u64, from: u64, to: u64, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(26 + name.len());
    out.push(REPAIR_LOST);
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.extend_from_slice(&from.to_le_bytes());
    out.extend_from_slice(&to.to_le_bytes());
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out
}

/// `reason` cut to `UNREACHABLE_REASON_BYTES_MAX` bytes, at a character boundary.
fn cut_reason(reason: &str) -> &str {
    let mut end = reason.len().min(UNREACHABLE_REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

/// The reason that ends a REPAIR `what` body, checked: UTF-8, within
/// `UNREACHABLE_REASON_BYTES_MAX`.
fn reason_at<'a>(reason: &'a [u8], what: &str) -> Result<&'a str, String> {
    if reason.len() > UNREACHABLE_REASON_BYTES_MAX {
        return Err(format!(
            "REPAIR {what} with a reason of {} bytes (at most {UNREACHABLE_REASON_BYTES_MAX})",
            reason.len()
        ));
    }
    std::str::from_utf8(reason).map_err(|_| format!("REPAIR {what}: the reason is not UTF-8"))
}

/// The body of a REPAIR unreachable (`reason` cut to `UNREACHABLE_REASON_BYTES_MAX` bytes at a
/// character boundary).
pub fn encode_repair_unreachable(
    incarnation: u64,
    receiver: BusId,
    number: u64,
    reason: &str,
) -> Vec<u8> {
    let reason = cut_reason(reason);
    let mut out = Vec::with_capacity(25 + reason.len());
    out.push(REPAIR_UNREACHABLE);
    out.extend_from_slice(&incarnation.to_le_bytes());
    out.extend_from_slice(&receiver.0.to_le_bytes());
    out.extend_from_slice(&number.to_le_bytes());
    out.extend_from_slice(reason.as_bytes());
    out
}

/// The body of a REPAIR refused (`reason` cut to `UNREACHABLE_REASON_BYTES_MAX` bytes at a
/// character boundary): u8 what (0 a join, 1 a publish), u8 name length, name, reason.
pub fn encode_repair_refused(publish: bool, name: &str, reason: &str) -> Vec<u8> {
    let reason = cut_reason(reason);
    let mut out = Vec::with_capacity(3 + name.len() + reason.len());
    out.push(REPAIR_REFUSED);
    out.push(u8::from(publish));
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(reason.as_bytes());
    out
}

/// The `u64`s at the start of `body` and the name after them (its length byte first), the
/// name filling the rest of the body exactly.
fn fields_and_name<'a, const N: usize>(
    body: &'a [u8],
    what: &str,
) -> Result<([u64; N], &'a str), String> {
    let fixed = 8 * N + 1;
    if body.len() < fixed {
        return Err(format!(
            "{what} body of {} bytes (at least {fixed})",
            body.len()
        ));
    }
    let mut fields = [0u64; N];
    for (i, f) in fields.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[8 * i..8 * i + 8]);
        *f = u64::from_le_bytes(b);
    }
    let len = usize::from(body[8 * N]);
    let rest = &body[fixed..];
    if rest.len() != len {
        return Err(format!(
            "{what} names a group of {len} bytes but {} follow",
            rest.len()
        ));
    }
    Ok((fields, name_at(rest, len, what)?))
}

/// Decodes a REPAIR body; the error names what is wrong.
pub fn decode_repair(body: &[u8]) -> Result<Repair<'_>, String> {
    let Some((&op, rest)) = body.split_first() else {
        return Err("REPAIR body of 0 bytes".into());
    };
    match op {
        REPAIR_ASK => {
            let ([incarnation, from, to], name) = fields_and_name::<3>(rest, "REPAIR ask")?;
            if from == 0 || to <= from {
                return Err(format!(
                    "REPAIR ask for numbers {from}..{to} (an empty range, or from 0)"
                ));
            }
            Ok(Repair::Ask {
                incarnation,
                from,
                to,
                name,
            })
        }
        REPAIR_COPY => {
            let mut head = decode_publish_as(rest, "REPAIR copy")?;
            if head.mark || head.batch {
                return Err("REPAIR copy of a mark or a batch (a copy carries one publish)".into());
            }
            head.payload_at += 1;
            Ok(Repair::Copy(head))
        }
        REPAIR_LOST => {
            let ([incarnation, from, to], name) = fields_and_name::<3>(rest, "REPAIR lost")?;
            if from == 0 || to <= from {
                return Err(format!(
                    "REPAIR lost of numbers {from}..{to} (an empty range, or from 0)"
                ));
            }
            Ok(Repair::Lost {
                incarnation,
                from,
                to,
                name,
            })
        }
        REPAIR_UNREACHABLE => decode_unreachable(rest),
        REPAIR_REFUSED => decode_refused(rest),
        other => Err(format!("REPAIR op {other} (expected 1 to 5)")),
    }
}

/// Decodes the body of a REPAIR unreachable after its op byte.
fn decode_unreachable(rest: &[u8]) -> Result<Repair<'_>, String> {
    if rest.len() < 24 {
        return Err(format!(
            "REPAIR unreachable body of {} bytes (at least 25)",
            rest.len() + 1
        ));
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rest[i..i + 8]);
        u64::from_le_bytes(b)
    };
    let reason = reason_at(&rest[24..], "unreachable")?;
    let number = u64_at(16);
    if number == 0 {
        return Err("REPAIR unreachable of number 0 (multicasts count from 1)".into());
    }
    Ok(Repair::Unreachable {
        incarnation: u64_at(0),
        receiver: BusId(u64_at(8)),
        number,
        reason,
    })
}

/// Decodes the body of a REPAIR refused after its op byte.
fn decode_refused(rest: &[u8]) -> Result<Repair<'_>, String> {
    let [what, len, ..] = *rest else {
        return Err(format!(
            "REPAIR refused body of {} bytes (at least 3)",
            rest.len() + 1
        ));
    };
    if what > 1 {
        return Err(format!(
            "REPAIR refused of kind {what} (0 a join, 1 a publish)"
        ));
    }
    let len = usize::from(len);
    let after = &rest[2..];
    if after.len() < len {
        return Err(format!(
            "REPAIR refused names a group of {len} bytes but {} follow",
            after.len()
        ));
    }
    let name = name_at(after, len, "the group of a REPAIR refused")?;
    let reason = reason_at(&after[len..], "refused")?;
    Ok(Repair::Refused {
        publish: what == 1,
        name,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn group_log_round_trips_and_lies_are_named() {
        let o = LogOffer {
            name: "lobby",
            token: 9,
            serial: 3,
            pid: 1234,
            fd: 17,
            inode: 555,
            capacity: 4096,
        };
        let offer = encode_log_offer(&o);
        assert_eq!(decode_group_log(&offer), Ok(GroupLog::Offer(o)));
        for accept in [true, false] {
            let a = encode_log_answer("lobby", 9, 3, accept);
            assert_eq!(
                decode_group_log(&a),
                Ok(GroupLog::Answer {
                    name: "lobby",
                    token: 9,
                    serial: 3,
                    accept
                })
            );
        }
        assert!(decode_group_log(&[]).unwrap_err().contains("0 bytes"));
        assert!(decode_group_log(&[9, 0]).unwrap_err().contains("op 9"));
        assert!(decode_group_log(&offer[..20])
            .unwrap_err()
            .contains("at least 41"));
        assert!(decode_group_log(&offer[..offer.len() - 1])
            .unwrap_err()
            .contains("5 bytes but 4 follow"));
        let mut empty = encode_log_answer("x", 1, 1, true);
        empty.truncate(17);
        empty.push(0);
        assert!(decode_group_log(&empty)
            .unwrap_err()
            .contains("group name of 0 bytes"));
    }

    #[test]
    fn interest_round_trips_and_lies_are_named() {
        let body = encode_interest(true, "lobby");
        assert_eq!(
            decode_interest(&body),
            Ok(Interest {
                join: true,
                name: "lobby"
            })
        );
        let leave = encode_interest(false, "lobby");
        assert!(!decode_interest(&leave).unwrap().join);
        let mut bad_op = body.clone();
        bad_op[0] = 7;
        assert!(decode_interest(&bad_op).unwrap_err().contains("op 7"));
        let mut long = body.clone();
        long[1] = 9;
        assert!(decode_interest(&long).unwrap_err().contains("9 bytes"));
        assert!(decode_interest(&[1]).unwrap_err().contains("at least 3"));
        assert!(decode_interest(&[1, 0]).unwrap_err().contains("0 bytes"));
        assert!(decode_interest(&[1, 1, 0xff])
            .unwrap_err()
            .contains("not UTF-8"));
    }

    #[test]
    fn publish_round_trips_and_lies_are_named() {
        let mut body = encode_publish_head(BusId(7), 9, 3, "world");
        body.extend_from_slice(b"payload");
        let h = decode_publish(&body).unwrap();
        assert_eq!(
            (h.publisher, h.incarnation, h.number, h.name),
            (BusId(7), 9, 3, "world")
        );
        assert_eq!(&body[h.payload_at..], b"payload");
        let zero = encode_publish_head(BusId(7), 9, 0, "world");
        assert!(decode_publish(&zero).unwrap_err().contains("numbered 0"));
        let mut short = encode_publish_head(BusId(7), 9, 1, "world");
        short.truncate(PUBLISH_FIXED_BYTES + 2);
        assert!(decode_publish(&short)
            .unwrap_err()
            .contains("only 2 follow"));
        let empty = encode_publish_head(BusId(7), 9, 1, "");
        assert!(decode_publish(&empty).unwrap_err().contains("0 bytes"));
        assert!(decode_publish(&[0; 5]).unwrap_err().contains("5 bytes"));
    }

    #[test]
    fn gap_marks_carry_their_first_number_and_lies_about_it_are_named() {
        let body = encode_gap_mark(BusId(7), 9, (2, 5), "g");
        let h = decode_publish(&body).unwrap();
        assert!(h.mark && !h.batch && h.count == 0);
        assert_eq!((h.number, h.gap_from), (5, Some(2)));
        let plain = encode_mark(BusId(7), 9, 5, "g");
        assert_eq!(decode_publish(&plain).unwrap().gap_from, None);
        assert_eq!(as_plain_mark(&h), encode_mark(BusId(7), 9, 5, "g"));
        for (from, why) in [(0, "from 0"), (6, "gap mark 5 from 6")] {
            let lie = encode_gap_mark(BusId(7), 9, (from, 5), "g");
            assert!(decode_publish(&lie).unwrap_err().contains(why), "{from}");
        }
        let mut short = body.clone();
        short.pop();
        assert!(decode_publish(&short)
            .unwrap_err()
            .contains("7 bytes of payload"));
    }

    #[test]
    fn marks_round_trip_and_carry_no_payload() {
        let body = encode_mark(BusId(7), 9, 3, "world");
        let h = decode_publish(&body).unwrap();
        assert!(h.mark);
        assert_eq!((h.number, h.name, h.payload_at), (3, "world", body.len()));
        let mut with_payload = body.clone();
        with_payload.push(1);
        assert!(decode_publish(&with_payload)
            .unwrap_err()
            .contains("a mark has none"));
        let plain = encode_publish_head(BusId(7), 9, 3, "world");
        assert!(!decode_publish(&plain).unwrap().mark);
        let held = encode_publish_head(BusId(7), 9, 3 | PUBLISH_BACKPRESSURE_BIT, "world");
        let h = decode_publish(&held).unwrap();
        assert_eq!((h.number, h.backpressure, h.mark), (3, true, false));
    }

    #[test]
    fn repairs_round_trip_and_lies_are_named() {
        let ask = encode_repair_ask(9, 4, 7, "g");
        assert_eq!(
            decode_repair(&ask),
            Ok(Repair::Ask {
                incarnation: 9,
                from: 4,
                to: 7,
                name: "g"
            })
        );
        let mut copy = encode_repair_copy_head(BusId(7), 9, 4, "g");
        copy.extend_from_slice(b"xyz");
        let Ok(Repair::Copy(h)) = decode_repair(&copy) else {
            panic!("{:?}", decode_repair(&copy));
        };
        assert_eq!(
            (h.publisher, h.number, &copy[h.payload_at..]),
            (BusId(7), 4, &b"xyz"[..])
        );
        let lost = encode_repair_lost(9, 4, 10, "g");
        assert_eq!(
            decode_repair(&lost),
            Ok(Repair::Lost {
                incarnation: 9,
                from: 4,
                to: 10,
                name: "g"
            })
        );
        assert!(decode_repair(&[]).unwrap_err().contains("0 bytes"));
        assert!(decode_repair(&[9, 0]).unwrap_err().contains("op 9"));
        let far = encode_repair_unreachable(9, BusId(77), 5, "no route to 77 here");
        assert_eq!(
            decode_repair(&far),
            Ok(Repair::Unreachable {
                incarnation: 9,
                receiver: BusId(77),
                number: 5,
                reason: "no route to 77 here"
            })
        );
        let refused = encode_repair_refused(true, "scores", "bus id 30 may not publish");
        assert_eq!(
            decode_repair(&refused),
            Ok(Repair::Refused {
                publish: true,
                name: "scores",
                reason: "bus id 30 may not publish"
            })
        );
        assert!(decode_repair(&[REPAIR_REFUSED, 2, 1, b'g'])
            .unwrap_err()
            .contains("kind 2"));
        assert!(
            decode_repair(&[REPAIR_REFUSED, 0, 0])
                .unwrap_err()
                .contains("group"),
            "a refusal names its group"
        );
        assert!(decode_repair(&[REPAIR_REFUSED, 0, 5, b'g'])
            .unwrap_err()
            .contains("5 bytes"));
        let long = encode_repair_unreachable(9, BusId(77), 5, &"é".repeat(200));
        assert!(decode_repair(&long).is_ok(), "cut at a character boundary");
        assert!(decode_repair(&far[..20])
            .unwrap_err()
            .contains("at least 25"));
        assert!(
            decode_repair(&encode_repair_unreachable(9, BusId(77), 0, "x"))
                .unwrap_err()
                .contains("number 0")
        );
        let mut not_utf8 = encode_repair_unreachable(9, BusId(77), 5, "");
        not_utf8.push(0xff);
        assert!(decode_repair(&not_utf8).unwrap_err().contains("not UTF-8"));
        assert!(decode_repair(&encode_repair_ask(9, 0, 3, "g"))
            .unwrap_err()
            .contains("from 0"));
        assert!(decode_repair(&encode_repair_ask(9, 4, 4, "g"))
            .unwrap_err()
            .contains("empty range"));
        assert!(decode_repair(&encode_repair_lost(9, 5, 5, "g"))
            .unwrap_err()
            .contains("empty range"));
        let mut long_name = encode_repair_ask(9, 4, 7, "g");
        long_name[25] = 3;
        assert!(decode_repair(&long_name)
            .unwrap_err()
            .contains("3 bytes but 1 follow"));
        assert!(decode_repair(&ask[..5]).unwrap_err().contains("at least"));
        let mut mark_copy = vec![REPAIR_COPY];
        mark_copy.extend_from_slice(&encode_mark(BusId(7), 9, 4, "g"));
        assert!(decode_repair(&mark_copy).unwrap_err().contains("of a mark"));
    }

    /// A PUBLISH batch body: `word` (number and flags, the batch bit added), then `payloads`.
    fn batch_body(
        publisher: u64,
        incarnation: u64,
        word: u64,
        name: &str,
        payloads: &[Vec<u8>],
    ) -> Vec<u8> {
        let mut body = encode_publish_head(
            BusId(publisher),
            incarnation,
            word | PUBLISH_BATCH_BIT,
            name,
        );
        for p in payloads {
            body.extend_from_slice(&(p.len() as u16).to_le_bytes());
            body.extend_from_slice(p);
        }
        body
    }

    #[test]
    fn a_batch_that_cannot_be_is_refused_with_the_reason() {
        let two = [vec![1u8], vec![2u8]];
        let err = |body: Vec<u8>| decode_publish(&body).unwrap_err();
        assert!(err(batch_body(7, 1, 5, "g", &[])).contains("of 0 publishes (1 to 1024)"));
        let empties = vec![Vec::new(); PUBLISH_BATCH_COUNT_MAX as usize + 1];
        assert!(err(batch_body(7, 1, 5, "g", &empties)).contains("of 1025 publishes"));
        let big = vec![vec![0u8; 60_000], vec![0u8; 6_000]];
        assert!(err(batch_body(7, 1, 5, "g", &big)).contains("(at most 65536)"));
        let last = PUBLISH_BATCH_BIT - 1;
        assert!(decode_publish(&batch_body(7, 1, last, "g", &two[..1])).is_ok());
        assert!(err(batch_body(7, 1, last, "g", &two)).contains("runs past the largest number"));
        assert!(err(batch_body(7, 1, 5 | PUBLISH_MARK_BIT, "g", &[])).contains("mark"));
        let mut cut = batch_body(7, 1, 5, "g", &two);
        cut.pop();
        assert!(err(cut).contains("PUBLISH entry 1"));
        let mut copy = vec![REPAIR_COPY];
        copy.extend_from_slice(&batch_body(7, 1, 5, "g", &two));
        assert!(decode_repair(&copy).unwrap_err().contains("a batch"));
    }

    #[test]
    fn names_are_bounded() {
        assert!(check_name("a").is_ok());
        assert!(check_name(&"a".repeat(GROUP_NAME_BYTES_MAX)).is_ok());
        assert!(check_name(&"a".repeat(GROUP_NAME_BYTES_MAX + 1)).is_err());
        assert!(check_name("").is_err());
    }

    proptest! {
        #[test]
        fn any_publish_round_trips(
            publisher: u64,
            incarnation: u64,
            number in 1u64..PUBLISH_BATCH_BIT,
            name in "[a-z0-9./-]{1,128}",
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut body = encode_publish_head(BusId(publisher), incarnation, number, &name);
            body.extend_from_slice(&payload);
            let h = decode_publish(&body).unwrap();
            prop_assert_eq!(
                (h.publisher, h.incarnation, h.number, h.name),
                (BusId(publisher), incarnation, number, name.as_str())
            );
            prop_assert_eq!(&body[h.payload_at..], &payload[..]);
        }

        #[test]
        fn any_batch_round_trips_and_splits_into_its_publishes(
            publisher: u64,
            incarnation: u64,
            number in 1u64..PUBLISH_BATCH_BIT - 100,
            backpressure: bool,
            name in "[a-z0-9./-]{1,16}",
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..50),
        ) {
            let flags = if backpressure { PUBLISH_BACKPRESSURE_BIT } else { 0 };
            let body = batch_body(publisher, incarnation, number | flags, &name, &payloads);
            let h = decode_publish(&body).unwrap();
            prop_assert!(h.batch && !h.mark);
            prop_assert_eq!(h.backpressure, backpressure);
            prop_assert_eq!(h.count, payloads.len() as u64);
            let mut seen = Vec::new();
            for_each_publish(&body, &h, |n, at, len| seen.push((n, body[at..at + len].to_vec())));
            let want: Vec<(u64, Vec<u8>)> =
                (number..).zip(payloads.iter().cloned()).collect();
            prop_assert_eq!(&seen, &want);
            let singles: Vec<(u64, bool, Vec<u8>)> = split_publish_batch(&body, &h)
                .iter()
                .map(|one| {
                    let s = decode_publish(one).unwrap();
                    assert!(!s.batch && s.count == 1 && s.publisher == h.publisher && s.name == h.name);
                    (s.number, s.backpressure, one[s.payload_at..].to_vec())
                })
                .collect();
            let want: Vec<(u64, bool, Vec<u8>)> =
                want.into_iter().map(|(n, p)| (n, backpressure, p)).collect();
            prop_assert_eq!(singles, want);
        }

        #[test]
        fn no_byte_string_panics_the_decoders(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_publish(&body);
            let _ = decode_interest(&body);
            let _ = decode_repair(&body);
        }

        #[test]
        fn any_repair_round_trips(
            incarnation: u64,
            from in 1u64..u64::MAX,
            span in 1u64..1_000,
            name in "[a-z0-9./-]{1,128}",
        ) {
            let to = from.saturating_add(span);
            let ask = encode_repair_ask(incarnation, from, to, &name);
            prop_assert_eq!(
                decode_repair(&ask),
                Ok(Repair::Ask { incarnation, from, to, name: name.as_str() })
            );
            let lost = encode_repair_lost(incarnation, from, to, &name);
            prop_assert_eq!(
                decode_repair(&lost),
                Ok(Repair::Lost { incarnation, from, to, name: name.as_str() })
            );
        }
    }
}
