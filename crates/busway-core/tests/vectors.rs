//! Byte-exact test vectors of protocol v2 (`testdata/protocol-v2/`), so that an implementation
//! in another language can be checked against the same bytes. Each vector is built here from
//! its documented fields and compared with the file; `BUSWAY_BLESS=1 cargo test` rewrites the
//! files (review the diff: a change here is a change of the wire format).

use busway_core::control::{ping_frame, Close, CloseCode};
use busway_core::frame::{frame_bytes, FrameKind};
use busway_core::handshake::{
    caps, local_hello, Auth, Handshake, Hello, NonceCache, Role, Secret, Step,
};
use busway_core::{BusId, FrameDecoder};
use bytes::{Bytes, BytesMut};
use std::path::PathBuf;

const SECRET: &str = "busway-test-vector-secret";
const NOW_MS: u64 = 1_700_000_000_000;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/protocol-v2")
}

fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        for b in chunk {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out.push('\n');
    out
}

fn from_hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn check(name: &str, bytes: &[u8]) {
    let path = dir().join(format!("{name}.hex"));
    if std::env::var_os("BUSWAY_BLESS").is_some() {
        std::fs::write(&path, to_hex(bytes)).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        from_hex(&want),
        bytes,
        "vector {name} differs from {}",
        path.display()
    );
}

fn dialer_hello() -> Hello {
    let mut h = local_hello(
        BusId(1),
        0x1111_2222_3333_4444,
        NOW_MS,
        *b"0123456789abcdef",
        vec!["tcp://127.0.0.1:7000".into()],
    );
    h.auth = true;
    h
}

fn listener_hello() -> Hello {
    let mut h = local_hello(
        BusId(0x2a),
        0x5555_6666_7777_8888,
        NOW_MS + 5,
        *b"fedcba9876543210",
        vec![
            "unix:///run/busway/b.sock".into(),
            "tcp://[::1]:7001".into(),
        ],
    );
    h.auth = true;
    h.host_id = b"host-b".to_vec();
    h.capabilities = caps::RELAY;
    h
}

fn decode_one(bytes: &[u8]) -> busway_core::Frame {
    let mut buf = BytesMut::from(bytes);
    let f = FrameDecoder::new(1 << 20)
        .decode(&mut buf)
        .unwrap()
        .unwrap();
    assert!(buf.is_empty());
    f
}

#[test]
fn data_frames() {
    let hello = frame_bytes(FrameKind::Data, b"hello");
    check("data-hello", &hello);
    assert_eq!(decode_one(&hello).body.as_ref(), b"hello");
    check("data-empty", &frame_bytes(FrameKind::Data, b""));
    let mut body = Vec::new();
    for m in [&b"a"[..], b"bc", b""] {
        body.extend_from_slice(&(m.len() as u16).to_le_bytes());
        body.extend_from_slice(m);
    }
    let batch = frame_bytes(FrameKind::DataBatch, &body);
    check("data-batch-a-bc-empty", &batch);
    let f = decode_one(&batch);
    let mut got = Vec::new();
    busway_core::frame::for_each_batch_entry(&f.body, |s, l| got.push(f.body[s..s + l].to_vec()))
        .unwrap();
    assert_eq!(got, vec![b"a".to_vec(), b"bc".to_vec(), vec![]]);
}

#[test]
fn control_frames() {
    check(
        "ping-0102030405060708",
        &ping_frame(FrameKind::Ping, 0x0102_0304_0506_0708),
    );
    check(
        "pong-0102030405060708",
        &ping_frame(FrameKind::Pong, 0x0102_0304_0506_0708),
    );
    let close = Close::frame(CloseCode::ProtocolError, "bad frame");
    check("close-protocol-error", &close);
    let c = Close::decode(&decode_one(&close).body);
    assert_eq!(
        (c.code, c.reason.as_str()),
        (CloseCode::ProtocolError, "bad frame")
    );
}

#[test]
fn handshake_frames() {
    let d = frame_bytes(FrameKind::Hello, &dialer_hello().encode());
    let l = frame_bytes(FrameKind::Hello, &listener_hello().encode());
    check("hello-dialer", &d);
    check("hello-listener", &l);
    assert_eq!(
        Hello::decode(&decode_one(&l).body).unwrap(),
        listener_hello()
    );

    // AUTH of each side over the two HELLOs above, with the shared secret.
    let secret = Secret::new(SECRET).unwrap();
    let mut dialer = Handshake::new(Role::Dialer, dialer_hello(), Some(secret.clone()));
    let mut listener = Handshake::new(Role::Listener, listener_hello(), Some(secret));
    // Handshake::new draws nothing at random: the HELLO frames are the vectors above.
    assert_eq!(dialer.hello_frame(), d);
    let auth_of = |hs: &mut Handshake, peer: &Bytes| match hs
        .handle_frame(&decode_one(peer), NOW_MS, &mut NonceCache::default())
        .unwrap()
    {
        Step::PeerHello(_) => hs.auth_frame(0, 0),
        other => panic!("{other:?}"),
    };
    let auth_d = auth_of(&mut dialer, &l);
    let auth_l = auth_of(&mut listener, &d);
    check("auth-dialer", &auth_d);
    check("auth-listener", &auth_l);
    let parsed = Auth::decode(&decode_one(&auth_d).body).unwrap();
    assert_eq!((parsed.next_send_seq, parsed.next_expected_seq), (0, 0));
    assert!(matches!(
        dialer.handle_frame(&decode_one(&auth_l), NOW_MS, &mut NonceCache::default()),
        Ok(Step::Established(_))
    ));
}

#[test]
fn routed_frames() {
    use busway_core::routed::{
        decode_hint, encode_fail, encode_hint, routed_frame, FailReason, RoutedHeader, RoutedType,
    };
    let header = |kind, src: u64, dst: u64, seq| RoutedHeader {
        kind,
        ttl: 15,
        src: BusId(src),
        src_incarnation: 0x1111_2222_3333_4444,
        dst: BusId(dst),
        seq,
        settled: false,
        route: vec![BusId(100)],
    };
    // Messages 5 and 6 ("hi", "there") from 1 to 2, passed by relay 100.
    let mut inner = Vec::new();
    for m in [&b"hi"[..], b"there"] {
        inner.extend_from_slice(&frame_bytes(FrameKind::Data, m));
    }
    let data = routed_frame(&header(RoutedType::Data, 1, 2, 5), &inner);
    check("routed-data-1-to-2", &data);
    let (h, at) = RoutedHeader::decode(&decode_one(&data).body).unwrap();
    assert_eq!((h.seq, h.route.clone(), at), (5, vec![BusId(100)], 50));
    check(
        "routed-ack-2-to-1",
        &routed_frame(&header(RoutedType::Ack, 2, 1, 7), &[]),
    );
    check(
        "routed-fail-unknown-id",
        &encode_fail(
            &header(RoutedType::Fail, 100, 1, 5),
            FailReason::UnknownId,
            BusId(2),
            "no route to bus id 2 at relay 100",
        ),
    );
    let hint = encode_hint(
        &header(RoutedType::Hint, 100, 1, 0),
        BusId(2),
        &["tcp://127.0.0.1:7002".to_string()],
    );
    check("routed-hint-2-at-7002", &hint);
    let body = decode_one(&hint).body;
    let (_, at) = RoutedHeader::decode(&body).unwrap();
    assert_eq!(
        decode_hint(&body[at..]).unwrap(),
        (BusId(2), vec!["tcp://127.0.0.1:7002".to_string()])
    );
}

#[test]
fn channel_frames() {
    use busway_core::channel::Channel;
    let offer = Channel::Offer {
        pid: 4242,
        fd: 7,
        inode: 0x0102_0304,
        capacity: 4 << 20,
        token: 0x0807_0605_0403_0201,
    };
    check("channel-offer", &offer.frame());
    assert_eq!(
        Channel::decode(&decode_one(&offer.frame()).body).unwrap(),
        offer
    );
    check("channel-switch", &Channel::Switch.frame());
}
