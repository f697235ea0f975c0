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
                    if crate::frame::message_spans(f.kind, &f.body, 0, &mut spans).is_ok() {
                        for (start, len) in spans {
                            assert!((start + len) as usize <= f.body.len());
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

/// Feeds arbitrary bytes, cut into frames, to a listener-side handshake (with a secret when the
/// first byte is odd). Must never panic and never establish without a valid proof.
pub fn handshake(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let secret = (mode & 1 == 1).then(|| Secret::new("fuzzing-secret-0123456789").unwrap());
    let with_secret = secret.is_some();
    let hello = local_hello(BusId(1), 1, 1_000_000, [7; NONCE_LEN], vec![]);
    let mut hs = Handshake::new(Role::Listener, hello, secret);
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let mut buf = BytesMut::from(rest);
    let mut nonces = NonceCache::default();
    while let Ok(Some(frame)) = dec.decode(&mut buf) {
        match hs.handle_frame(&frame, 1_000_000, &mut nonces) {
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

/// Feeds arbitrary bytes as the bodies an established peer can send beyond DATA: the first
/// byte picks a ROUTED body (header, then its DATA inner frames, FAIL or HINT) or a CHANNEL
/// body. Must never panic; whatever decodes must encode back to what it decoded from.
pub fn peer_bodies(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
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
    let mut again = BytesMut::new();
    header.encode(&mut again);
    // Byte 3 is reserved: ignored when read, written as 0.
    assert_eq!(
        again[..3],
        body[..3],
        "a ROUTED header re-encodes to its bytes"
    );
    assert_eq!(
        again[4..],
        body[4..at],
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

#[cfg(test)]
mod tests {
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
        fn handshake_never_panics(data in prop::collection::vec(any::<u8>(), 0..512)) {
            super::handshake(&data);
        }
    }
}
