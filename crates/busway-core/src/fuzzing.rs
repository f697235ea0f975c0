//! Entry points for the fuzz targets (`fuzz/`), kept here so the property tests run the very
//! same code on every `cargo test`.

use crate::frame::{FrameDecoder, DEFAULT_BODY_LEN_MAX, HANDSHAKE_BODY_LEN_MAX};
use crate::handshake::{local_hello, Handshake, NonceCache, Role, Secret, Step, NONCE_LEN};
use crate::id::BusId;
use bytes::BytesMut;

/// Feeds arbitrary bytes to the frame decoder in chunks chosen by the first byte (its top bit:
/// a shared-memory ring's stream, whose checks are not verified, so that any bytes reach the
/// message walk). Must never panic; every frame it returns must re-encode to the bytes it came
/// from, and the messages found in it must lie inside its body.
pub fn frame_decoder(data: &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(first & 0x7f).max(1);
    let mut dec = FrameDecoder::new(DEFAULT_BODY_LEN_MAX);
    if first & 0x80 != 0 {
        dec = dec.skip_checks();
    }
    let mut buf = BytesMut::new();
    for piece in rest.chunks(chunk) {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(f)) => {
                    let again = crate::frame::frame_bytes(f.kind, &f.body);
                    assert_eq!(again.len(), f.body.len() + crate::frame::HEADER_LEN);
                    let mut spans = Vec::new();
                    if crate::body::message_spans(f.kind, &f.body, 0, &mut spans).is_ok() {
                        for span in spans {
                            // What the reader checked parses again, typed, within the body.
                            assert!(span.range().end <= f.body.len());
                            assert!(span.parse(&f.body).is_ok(), "{span:?}");
                        }
                    } else {
                        assert!(spans.is_empty(), "nothing kept from a bad frame");
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

/// Appends frames made from `input` to `stream`, each with a valid check so that it reaches the
/// code behind the decoder: each is a kind byte, a u16 LE body length and the body, taken from
/// the input. Most kind bytes pick a valid kind; 0xf0 and above send the body as raw bytes
/// (whatever the reader makes of them as a header).
fn frames_with_valid_checks(mut input: &[u8], stream: &mut Vec<u8>) {
    const KINDS: [u8; 18] = [
        0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F,
        0x10, 0x11, 0x20,
    ];
    while input.len() >= 3 {
        let kind = input[0];
        let len = usize::from(u16::from_le_bytes([input[1], input[2]])).min(input.len() - 3);
        let body = &input[3..3 + len];
        input = &input[3 + len..];
        match crate::frame::FrameKind::from_u8(KINDS[usize::from(kind) % KINDS.len()]) {
            Some(k) if kind < 0xf0 => stream.extend_from_slice(&crate::frame::frame_bytes(k, body)),
            _ => stream.extend_from_slice(body),
        }
    }
}

/// The handshake fuzz target's clock, in ms since the epoch.
const HANDSHAKE_NOW_MS: u64 = 1_000_000;

/// Feeds a peer's frames to a listener-side handshake. The first byte is a mode: bit 0, the
/// listener has a secret; bit 1, a well-formed HELLO comes first (its bus id, incarnation,
/// clock offset and nonce taken from the next 34 input bytes), so that what follows meets the
/// AUTH step; bit 2, the rest is raw bytes rather than frames with valid checks (see
/// `frames_with_valid_checks`). Must never panic, and never establish with a secret (the
/// fuzzer cannot make the proof).
pub fn handshake(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let secret = (mode & 1 == 1).then(|| Secret::new("fuzzing-secret-0123456789").unwrap());
    let with_secret = secret.is_some();
    let hello = local_hello(BusId(1), 1, HANDSHAKE_NOW_MS, [7; NONCE_LEN], vec![]);
    let mut hs = Handshake::new(Role::Listener, hello, secret);
    let mut stream = Vec::new();
    if mode & 2 != 0 {
        let Some((fields, after)) = rest.split_first_chunk::<34>() else {
            return;
        };
        rest = after;
        let u64_at = |i: usize| u64::from_le_bytes(fields[i..i + 8].try_into().unwrap_or_default());
        let offset_ms = i16::from_le_bytes([fields[16], fields[17]]);
        let nonce: [u8; NONCE_LEN] = fields[18..34].try_into().unwrap_or_default();
        let at = HANDSHAKE_NOW_MS.saturating_add_signed(i64::from(offset_ms) * 100);
        let peer = local_hello(BusId(u64_at(0)), u64_at(8), at, nonce, vec![]);
        stream.extend_from_slice(&Handshake::new(Role::Dialer, peer, None).hello_frame());
    }
    if mode & 4 != 0 {
        stream.extend_from_slice(rest);
    } else {
        frames_with_valid_checks(rest, &mut stream);
    }
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let mut buf = BytesMut::from(&stream[..]);
    let mut nonces = NonceCache::default();
    while let Ok(Some(frame)) = dec.decode(&mut buf) {
        match hs.handle_frame(&frame, HANDSHAKE_NOW_MS, &mut nonces) {
            Ok(Step::PeerHello(_)) => {
                let _ = hs.auth_frame(0, 0);
            }
            Ok(Step::Established(_)) => {
                assert!(!with_secret, "established without knowing the secret");
                return;
            }
            Err(_) => return,
        }
    }
}

/// A REGISTER body as a downstream sends it: decoded, it encodes to the same bytes, and
/// applied to a registry it leaves every lookup naming the one peer that holds the id.
fn register_body(body: &[u8]) {
    use crate::registry::{RegisterOp, Registry};
    let Ok(op) = RegisterOp::decode(body) else {
        return;
    };
    assert_eq!(op.encode(), body, "a REGISTER body re-encodes to its bytes");
    let mut reg = Registry::default();
    let me = crate::BusId(1 << 40);
    let _ = reg.add(
        me,
        crate::BusId(2),
        (crate::BusId(10), crate::BusId(20)),
        None,
    );
    let (answer, changed) = reg.apply(me, crate::BusId(3), &op, None);
    assert!(matches!(answer, RegisterOp::Answer { .. }));
    if let RegisterOp::Add { range, .. } = op {
        assert_eq!(changed, reg.lookup(range.0) == Some(crate::BusId(3)));
    }
    assert!(
        reg.lookup(me).is_none(),
        "the relay's own id is never registered"
    );
}

/// Feeds arbitrary bytes as the bodies an established peer can send beyond DATA: the first
/// byte picks a ROUTED body (header, then its DATA inner frames, FAIL or HINT), a CHANNEL
/// body or a REGISTER body (see `register_body`). Must never panic; whatever decodes must encode back to what it decoded from.
pub fn peer_bodies(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 3 == 2 {
        return register_body(body);
    }
    if which & 1 == 0 {
        if let Ok(msg) = crate::channel::Channel::decode(body) {
            if matches!(msg, crate::channel::Channel::Refuse(_)) {
                // A refusal's text is read leniently (lossy UTF-8) and cut when written.
                return;
            }
            let again = msg.frame();
            let back = crate::channel::Channel::decode(&again[crate::frame::HEADER_LEN..]);
            assert_eq!(back.as_ref(), Ok(&msg));
        }
        return;
    }
    let Ok((header, at)) = crate::routed::RoutedHeader::decode(body) else {
        return;
    };
    // Written again from what was read, the same bytes but for what is not read: the
    // reserved bytes, the content check (the frame check covered it) and the flags' other bits.
    let again = crate::routed::routed_frame(&header, &body[at..]);
    let again = &again[crate::frame::HEADER_LEN..];
    assert_eq!(
        again.len(),
        body.len(),
        "a ROUTED frame re-encodes to its length"
    );
    let flags = at - 33;
    let read = |b: &[u8]| {
        let mut b = b.to_vec();
        b[2..8].fill(0);
        b[flags] &= 1;
        b
    };
    assert_eq!(
        read(again),
        read(body),
        "a ROUTED header re-encodes to its bytes"
    );
    let inner = &body[at..];
    let _ = crate::routed::decode_fail(inner);
    let _ = crate::routed::decode_hint(inner);
    let mut dec = FrameDecoder::new(DEFAULT_BODY_LEN_MAX);
    let mut rest = inner;
    while let Ok(Some((kind, len))) = dec.peek(rest) {
        if kind == crate::frame::FrameKind::DataBatch {
            let body = &rest[crate::frame::HEADER_LEN..len];
            let _ = crate::frame::for_each_batch_entry(body, |s, n| {
                assert!(s + n <= body.len());
            });
        }
        rest = &rest[len..];
    }
}

/// One end of the fuzzed link: bus id `id`, on the same host as its peer when `mode` is odd
/// (id 1 always says host "h").
fn fuzzed_link_end(role: Role, id: u64, mode: u8, now: crate::link::Now) -> crate::link::Link {
    use crate::handshake::caps;
    use crate::link::{Link, LinkConfig};
    let config = LinkConfig {
        role,
        secret: None,
        clock_skew_max_ms: 30_000,
        handshake_timeout_ms: 1_000,
        frame_body_max: 1 << 16,
        heartbeat_interval_ms: 100,
        heartbeat_misses_max: 3,
        shm: true,
        ring_required: false,
        expect_peer: None,
        peer_cert_ids: None,
        remote: "fuzz://peer".into(),
    };
    let mut hello = local_hello(BusId(id), id, 1_000_000, [id as u8; NONCE_LEN], vec![]);
    hello.capabilities = caps::SHM_BOUND;
    hello.host_id = if mode & 1 == 1 || id == 1 {
        b"h".to_vec()
    } else {
        b"other".to_vec()
    };
    Link::new(config, hello, Default::default(), now)
}

/// Feeds arbitrary frames, each with a valid check so that it reaches the rules behind it, to
/// an up link's state machine (sharing a host with its peer when the first byte is odd, so that
/// CHANNEL frames are allowed). Each frame is a kind byte, a u16 LE body length and the body,
/// taken from the data (a kind byte of 0xf0 or more sends the body as raw bytes). Must never
/// panic; message places must lie inside the input; nothing
/// is taken once the link is lost or the peer closed it.
pub fn link(data: &[u8]) {
    use crate::link::{LinkEvent, Now, Spans};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let now = Now {
        mono_us: 0,
        wall_ms: 1_000_000,
    };
    let (mut a, mut b) = (
        fuzzed_link_end(Role::Dialer, 1, mode, now),
        fuzzed_link_end(Role::Listener, 2, mode, now),
    );
    // The handshake, over two in-memory pipes.
    let (mut to_a, mut to_b) = (Vec::new(), Vec::new());
    let mut spans = Spans::new();
    for _ in 0..8 {
        while let Some(f) = a.poll_transmit() {
            to_b.extend_from_slice(&f);
        }
        while let Some(f) = b.poll_transmit() {
            to_a.extend_from_slice(&f);
        }
        for (link, pipe) in [(&mut a, &mut to_a), (&mut b, &mut to_b)] {
            let n = link.handle_input(pipe, now, &mut spans);
            pipe.drain(..n);
            while let Some(e) = link.poll_event() {
                if let LinkEvent::PeerHello(_) = e {
                    link.send_auth(0, 0);
                }
            }
        }
    }
    assert!(b.uses_rings() || mode & 1 == 0 || b.is_closed());
    let mut stream = Vec::new();
    frames_with_valid_checks(rest, &mut stream);
    let mut pos = 0;
    while pos < stream.len() {
        spans.clear();
        let n = b.handle_input(&stream[pos..], now, &mut spans);
        for span in &spans {
            assert!(
                span.range().end <= stream.len() - pos,
                "a message outside the input"
            );
        }
        let mut over = false;
        while let Some(e) = b.poll_event() {
            match e {
                LinkEvent::OpenRing { fd, .. } => b.ring_opened(if fd % 2 == 0 {
                    Ok(())
                } else {
                    Err("odd".into())
                }),
                LinkEvent::Lost(_) | LinkEvent::PeerClosed(_) => over = true,
                _ => {}
            }
        }
        if over || n == 0 {
            assert_eq!(b.handle_input(&stream[pos + n..], now, &mut spans), 0);
            return;
        }
        pos += n;
    }
}

/// The publishes of a PUBLISH `body` with head `head` (number, payload offset, length), each
/// checked to lie inside the body and numbered on from the head's; a batch's single PUBLISH
/// bodies checked to decode to the same publishes.
fn publishes_checked(body: &[u8], head: &crate::group::PublishHead) -> Vec<(u64, usize, usize)> {
    use crate::group::{decode_publish, for_each_publish, split_publish_batch};
    let mut parts = Vec::new();
    if !head.mark {
        for_each_publish(body, head, |number, at, len| {
            assert!(at + len <= body.len(), "a payload outside the body");
            parts.push((number, at, len));
        });
        assert_eq!(
            parts.len() as u64,
            head.count,
            "as many publishes as it says"
        );
        assert!(parts.iter().zip(head.number..).all(|(p, n)| p.0 == n));
    }
    if head.batch {
        let singles = split_publish_batch(body, head);
        assert_eq!(singles.len(), parts.len());
        for (one, &(number, at, len)) in singles.iter().zip(&parts) {
            let h = decode_publish(one).expect("a part of a batch decodes");
            assert_eq!(
                (h.number, h.batch, h.publisher),
                (number, false, head.publisher)
            );
            assert_eq!(&one[h.payload_at..], &body[at..at + len]);
        }
    }
    parts
}

/// What a peer can send of groups, the first byte saying which: an INTEREST, REPAIR or
/// PUBLISH body (one publish, a batch or a mark), or a read of its group log. Must never panic. A PUBLISH that decodes is
/// read publish by publish (each inside the body, numbered on from the head's, as many as it
/// says), a batch split into single PUBLISH bodies that decode to the same publishes, and then
/// the logic behind takes it: a member's and a relay's group state, as it came and a second
/// time (a copy).
pub fn group_bodies(data: &[u8]) {
    use crate::group::{decode_interest, decode_publish, decode_repair, state::GroupState};
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => {
            let _ = decode_interest(body);
            return;
        }
        3 => {
            // As one read of a group log: records cut where the body says.
            let spans = [
                (0, body.len() as u32 / 2),
                (
                    body.len() as u32 / 2,
                    body.len() as u32 - body.len() as u32 / 2,
                ),
            ];
            let _ = crate::group::log_records::decode_log_records(body, &spans, BusId(9), "g");
            return;
        }
        1 => {
            let _ = decode_repair(body);
            return;
        }
        _ => {}
    }
    let Ok(head) = decode_publish(body) else {
        return;
    };
    let parts = publishes_checked(body, &head);
    let heads: Vec<_> = parts
        .iter()
        .map(|&(number, at, _)| crate::group::PublishHead {
            number,
            payload_at: at,
            batch: false,
            count: 1,
            ..head
        })
        .collect();
    let payload = |i: usize| {
        let (_, at, len) = parts[i];
        bytes::Bytes::copy_from_slice(&body[at..at + len])
    };
    let (me, from) = (BusId(1), BusId(2));
    let mut member = GroupState::new(1 << 20, Default::default());
    member.join(head.name).expect("a name that decoded");
    let mut relay = GroupState::new(1 << 20, Default::default());
    relay.interest(BusId(3), true, head.name, 16);
    for state in [&mut member, &mut relay] {
        for _copy in 0..2 {
            if head.batch {
                let _ = state.received_run(me, from, &heads, 0, payload, false);
            } else {
                let _ = state.received(me, from, &head, 0, || payload(0));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::id::BusId;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn frame_decoder_never_panics(data in prop::collection::vec(any::<u8>(), 0..2048)) {
            super::frame_decoder(&data);
        }

        #[test]
        fn peer_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            super::peer_bodies(&data);
        }

        #[test]
        fn link_never_panics(data in prop::collection::vec(any::<u8>(), 0..2048)) {
            super::link(&data);
        }

        #[test]
        fn group_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            super::group_bodies(&data);
        }

        #[test]
        fn group_bodies_take_batches_and_marks(
            which in 0u8..3,
            word in prop_oneof![Just(1u64), Just((1u64 << 61) - 3), 1u64..1_000],
            flags in 0u64..8,
            entries in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 0..8),
        ) {
            // Valid heads most of the time, so that the logic behind them is reached.
            let mut body = crate::group::encode_publish_head(BusId(9), 4, word | (flags << 61), "g");
            for e in &entries {
                body.extend_from_slice(&(e.len() as u16).to_le_bytes());
                body.extend_from_slice(e);
            }
            let mut data = vec![which];
            data.extend_from_slice(&body);
            super::group_bodies(&data);
        }

        #[test]
        fn handshake_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
            super::handshake(&data);
        }
    }
}
