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
//!
//! A name is 1 to `GROUP_NAME_BYTES_MAX` bytes of UTF-8.

use crate::BusId;

/// Longest group name, in bytes.
pub const GROUP_NAME_BYTES_MAX: usize = 128;
/// INTEREST op: the sender wants the group's publishes.
pub const INTEREST_JOIN: u8 = 1;
/// INTEREST op: the sender no longer wants them.
pub const INTEREST_LEAVE: u8 = 0;
/// Bytes of a PUBLISH body before its name: publisher, incarnation, number, name length.
pub const PUBLISH_FIXED_BYTES: usize = 25;

/// A decoded INTEREST body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interest<'a> {
    pub join: bool,
    pub name: &'a str,
}

/// A decoded PUBLISH head; the payload is the body from `payload_at` on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishHead<'a> {
    pub publisher: BusId,
    pub incarnation: u64,
    pub number: u64,
    pub name: &'a str,
    pub payload_at: usize,
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

/// The name of `len` bytes at the start of `rest`, checked.
fn name_at<'a>(rest: &'a [u8], len: usize, what: &str) -> Result<&'a str, String> {
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
    if body.len() < PUBLISH_FIXED_BYTES {
        return Err(format!(
            "PUBLISH body of {} bytes (its head alone is at least {})",
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
    let number = u64_at(16);
    if number == 0 {
        return Err("PUBLISH numbered 0 (publishes count from 1)".into());
    }
    let len = usize::from(body[PUBLISH_FIXED_BYTES - 1]);
    let rest = &body[PUBLISH_FIXED_BYTES..];
    let name = name_at(rest, len, "PUBLISH")?;
    Ok(PublishHead {
        publisher,
        incarnation,
        number,
        name,
        payload_at: PUBLISH_FIXED_BYTES + len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            number in 1u64..,
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
        fn no_byte_string_panics_the_decoders(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_publish(&body);
            let _ = decode_interest(&body);
        }
    }
}
