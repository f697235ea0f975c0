//! Bad input over a real socket: each case closes only the offending connection with a named
//! reason, bumps a counter and raises an event; the node and its other links keep working.

mod common;

use busway::{BusId, DownReason, Event, Node, Rejection, Stats};
use busway_core::control::CloseCode;
use busway_core::frame::{
    encode_header, frame_bytes, FrameKind, HANDSHAKE_BODY_LEN_MAX, HEADER_LEN,
};
use busway_core::handshake::{local_hello, Handshake, NonceCache, Role, Secret, Step};
use busway_core::FrameDecoder;
use bytes::BytesMut;
use common::*;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "the-shared-secret-of-this-test";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A node under test with a healthy peer linked to it.
struct Fixture {
    node: Node,
    events: busway::Events,
    inbox: busway::Inbox,
    healthy: Node,
    addr: std::net::SocketAddr,
}

async fn fixture() -> Fixture {
    let secret = Secret::new(SECRET).unwrap();
    let node = start(config(1).secret(secret.clone()).listen(listen_addr("tcp4"))).await;
    let busway::Addr::Tcp(addr) = node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let events = node.take_events().unwrap();
    let inbox = node.take_inbox().unwrap();
    let healthy = start(
        config(2)
            .secret(secret)
            .connect(node.listen_addrs()[0].clone()),
    )
    .await;
    assert!(node.wait_for_peer(BusId(2), WAIT).await);
    // Both ends: the healthy node may finish its side of the handshake a moment later.
    assert!(healthy.wait_for_peer(BusId(1), WAIT).await);
    Fixture {
        node,
        events,
        inbox,
        healthy,
        addr,
    }
}

impl Fixture {
    /// The node still exchanges messages with its healthy peer.
    async fn still_works(&mut self) {
        send_and_expect(&self.healthy, BusId(1), &mut self.inbox, b"still here").await;
        assert!(self.node.peers().iter().any(|p| p.id == BusId(2)));
    }

    async fn rejected(&mut self) -> String {
        self.rejected_as().await.1
    }

    /// The next refusal: its kind and text.
    async fn rejected_as(&mut self) -> (Rejection, String) {
        wait_event(&mut self.events, |e| match e {
            Event::Rejected { reason, kind, .. } => Some((*kind, reason.clone())),
            _ => None,
        })
        .await
    }

    async fn down(&mut self, id: u64) -> String {
        protocol_error_of(&mut self.events, id).await
    }

    fn stats(&self) -> Stats {
        self.node.stats()
    }
}

/// Peer 9, authenticated on a socket to `fx`'s node as a node of this host that allows shared
/// memory (so CHANNEL frames are its to send).
async fn same_host_peer(fx: &Fixture) -> TcpStream {
    same_host_peer_with_rest(fx).await.0
}

/// Like `same_host_peer`, with what the node sent after the handshake in the same reads.
async fn same_host_peer_with_rest(fx: &Fixture) -> (TcpStream, BytesMut) {
    use busway_core::handshake::caps;
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let (s, rest) = authenticated_with_rest(fx.addr, 9, Some(SECRET), |h| {
        h.capabilities |= caps::SHM_BOUND;
        h.host_id = boot_id.trim().as_bytes().to_vec();
    })
    .await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    (s, rest)
}

/// Reads until the node closes the socket; returns the CLOSE code it sent, if any.
async fn closed_by_node(s: &mut TcpStream) -> Option<CloseCode> {
    let mut buf = BytesMut::new();
    let read_all = async { while s.read_buf(&mut buf).await.unwrap_or(0) > 0 {} };
    tokio::time::timeout(WAIT, read_all)
        .await
        .expect("node closes the connection");
    let mut dec = FrameDecoder::new(1 << 20);
    let mut code = None;
    while let Ok(Some(f)) = dec.decode(&mut buf) {
        if f.kind == FrameKind::Close {
            code = Some(busway_core::control::Close::decode(&f.body).code);
        }
    }
    code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_a_handshake() {
    let mut fx = fixture().await;
    let mut s = TcpStream::connect(fx.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(closed_by_node(&mut s).await, Some(CloseCode::ProtocolError));
    let (kind, reason) = fx.rejected_as().await;
    assert!(reason.contains("unknown frame kind"), "{reason}");
    assert_eq!(kind, Rejection::Other);
    assert!(fx.stats().handshake_failures >= 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_without_the_secret() {
    let mut fx = fixture().await;
    let mut s = TcpStream::connect(fx.addr).await.unwrap();
    let hs = Handshake::new(
        Role::Dialer,
        local_hello(BusId(7), 7, now_ms(), [7; 16], vec![]),
        None,
    );
    s.write_all(&hs.hello_frame()).await.unwrap();
    closed_by_node(&mut s).await;
    let (kind, reason) = fx.rejected_as().await;
    assert!(reason.contains("requires a shared secret"), "{reason}");
    assert_eq!(kind, Rejection::Authentication);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_proof() {
    let mut fx = fixture().await;
    let mut s = TcpStream::connect(fx.addr).await.unwrap();
    let wrong = Secret::new("not-the-secret-at-all-000").unwrap();
    let mut hs = Handshake::new(
        Role::Dialer,
        local_hello(BusId(7), 7, now_ms(), [8; 16], vec![]),
        Some(wrong),
    );
    s.write_all(&hs.hello_frame()).await.unwrap();
    // Answer the node's HELLO with an AUTH whose proof uses the wrong secret.
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let auth = loop {
        if let Some(f) = dec.decode(&mut buf).unwrap() {
            if let Ok(Step::PeerHello(_)) =
                hs.handle_frame(&f, now_ms(), &mut NonceCache::default())
            {
                break hs.auth_frame(0, 0);
            }
        } else {
            assert!(s.read_buf(&mut buf).await.unwrap() > 0);
        }
    };
    s.write_all(&auth).await.unwrap();
    closed_by_node(&mut s).await;
    let (kind, reason) = fx.rejected_as().await;
    assert!(reason.contains("authentication failed"), "{reason}");
    assert_eq!(kind, Rejection::Authentication);
    assert!(fx.stats().auth_failures >= 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_timestamp() {
    let mut fx = fixture().await;
    let mut s = TcpStream::connect(fx.addr).await.unwrap();
    let old = local_hello(BusId(7), 7, now_ms() - 3_600_000, [9; 16], vec![]);
    let hs = Handshake::new(Role::Dialer, old, Some(Secret::new(SECRET).unwrap()));
    s.write_all(&hs.hello_frame()).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.rejected().await;
    assert!(reason.contains("stale handshake"), "{reason}");
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_frame_kind_after_the_handshake() {
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    s.write_all(&[0x7e, 0, 0, 0, 0, 0, 0, 0]).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(reason.contains("unknown frame kind 0x7e"), "{reason}");
    assert!(fx.stats().protocol_errors >= 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_checksum() {
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    let good = frame_bytes(FrameKind::Data, b"fine");
    let mut bad = frame_bytes(FrameKind::Data, b"flipped").to_vec();
    *bad.last_mut().unwrap() ^= 1;
    s.write_all(&good).await.unwrap();
    s.write_all(&bad).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(
        reason.contains("checksum mismatch") && reason.contains("at stream offset"),
        "{reason}"
    );
    assert!(fx.stats().checksum_failures >= 1);
    // The good frame before the bad one was delivered, nothing after it.
    let m = next_message(&mut fx.inbox).await;
    assert_eq!((m.src, m.payload.as_ref()), (BusId(9), &b"fine"[..]));
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_frame_is_refused_from_its_header() {
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    // Only the header of a 16 MiB frame: the node must refuse it without waiting for the body.
    let word0 = (FrameKind::Data as u32) | (((16 << 20) - 1) << 8);
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&word0.to_le_bytes());
    s.write_all(&header).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(reason.contains("over the 4194304-byte limit"), "{reason}");
    assert!(fx.stats().oversize_frames >= 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_batch_and_a_second_hello() {
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    // An entry declares 200 bytes where 3 follow: checksum fine, content wrong.
    let body = [200u8, 0, 1, 2, 3];
    let mut frame = encode_header(FrameKind::DataBatch, &body).to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(
        reason.contains("DATA_BATCH entry 0") && reason.contains("200 bytes declared"),
        "{reason}"
    );

    let mut s = authenticated(fx.addr, 10, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(10), WAIT).await);
    let hs = Handshake::new(
        Role::Dialer,
        local_hello(BusId(10), 10, now_ms(), [3; 16], vec![]),
        None,
    );
    s.write_all(&hs.hello_frame()).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(10).await;
    assert!(
        reason.contains("Hello frame after the handshake"),
        "{reason}"
    );
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_times_out_in_the_handshake() {
    let secret = Secret::new(SECRET).unwrap();
    let mut c = config(1).secret(secret).listen(listen_addr("tcp4"));
    c.handshake_timeout_ms = 200;
    let node = start(c).await;
    let mut events = node.take_events().unwrap();
    let busway::Addr::Tcp(addr) = node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let mut s = TcpStream::connect(addr).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = wait_event(&mut events, |e| match e {
        Event::Rejected { reason, .. } => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert!(
        reason.contains("handshake not complete within 200 ms"),
        "{reason}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_frame_from_a_peer_that_did_not_advertise_shared_memory() {
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    s.write_all(&busway_core::channel::Channel::Switch.frame())
        .await
        .unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(reason.contains("did not advertise"), "{reason}");
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bogus_shared_memory_offer_is_refused_with_its_reason_and_the_link_stays() {
    use busway_core::channel::Channel;
    let mut fx = fixture().await;
    let mut s = same_host_peer(&fx).await;
    let offer = Channel::Offer {
        pid: std::process::id(),
        fd: 999_999,
        inode: 1,
        capacity: 4096,
        token: 1,
    };
    s.write_all(&offer.frame()).await.unwrap();
    // The node answers REFUSE with the reason, among its other frames (its own OFFER, PINGs).
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(1 << 20);
    let refusal = tokio::time::timeout(WAIT, async {
        loop {
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                if f.kind == FrameKind::Channel {
                    if let Ok(Channel::Refuse(why)) = Channel::decode(&f.body) {
                        return why;
                    }
                }
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "link closed");
        }
    })
    .await
    .expect("a REFUSE");
    assert!(
        refusal.contains("/proc/") && refusal.contains("999999"),
        "{refusal}"
    );
    assert!(
        fx.node.peers().iter().any(|p| p.id == BusId(9) && p.up),
        "the link stays, on its socket"
    );
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_to_a_ring_never_offered_closes_only_that_link() {
    let mut fx = fixture().await;
    let mut s = same_host_peer(&fx).await;
    s.write_all(&busway_core::channel::Channel::Switch.frame())
        .await
        .unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(reason.contains("CHANNEL SWITCH out of turn"), "{reason}");
    assert_eq!(fx.stats().protocol_errors, 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_on_the_socket_after_a_switch_close_only_that_link() {
    let mut fx = fixture().await;
    let (mut s, _ring) = peer_writing_a_ring(&fx).await;
    s.write_all(&frame_bytes(FrameKind::Data, b"not in the ring"))
        .await
        .unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(reason.contains("after the peer switched"), "{reason}");
    fx.still_works().await;
}

/// A ring of peer 9 toward node 1, bound with `token`.
fn evil_binding(token: u64) -> busway_shm::ring::Binding {
    busway_shm::ring::Binding {
        token,
        writer: 9,
        reader: 1,
    }
}

/// The OFFER that names `ring`, with `token`.
fn offer_of(ring: &busway_shm::Ring, token: u64) -> busway_core::channel::Channel {
    use std::os::fd::AsRawFd;
    busway_core::channel::Channel::Offer {
        pid: std::process::id(),
        fd: ring.segment().fd().as_raw_fd() as u32,
        inode: ring.segment().inode().unwrap(),
        capacity: ring.capacity() as u64,
        token,
    }
}

/// Reads the node's frames on `s` until a CHANNEL frame that `pick` takes, answering its
/// PINGs meanwhile (a live peer, however slow the machine).
async fn channel_from_node<T>(
    s: &mut TcpStream,
    buf: &mut BytesMut,
    mut pick: impl FnMut(busway_core::channel::Channel) -> Option<T>,
) -> T {
    use busway_core::channel::Channel;
    let mut dec = FrameDecoder::new(1 << 20);
    tokio::time::timeout(WAIT, async {
        loop {
            while let Some(f) = dec.decode(buf).unwrap() {
                if f.kind == FrameKind::Ping {
                    let token = busway_core::control::decode_token(&f.body).unwrap();
                    let pong = busway_core::control::ping_frame(FrameKind::Pong, token);
                    s.write_all(&pong).await.unwrap();
                }
                if f.kind == FrameKind::Channel {
                    if let Some(t) = Channel::decode(&f.body).ok().and_then(&mut pick) {
                        return t;
                    }
                }
            }
            assert!(s.read_buf(buf).await.unwrap() > 0, "link closed");
        }
    })
    .await
    .expect("the CHANNEL frame")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_make_the_node_read_a_ring_not_offered_to_it_or_too_large() {
    use busway_core::channel::Channel;
    use busway_shm::ring::{Ring, RING_CAPACITY_DEFAULT};
    let mut fx = fixture().await;
    // What the node sends right after the handshake (its OFFER among it) is kept.
    let (mut s, mut buf) = same_host_peer_with_rest(&fx).await;
    let refused = |c: Channel| match c {
        Channel::Refuse(why) => Some(why),
        _ => None,
    };
    // The node offers its own ring toward us; we name that very ring back (a peer on any
    // host can, declaring this host's boot id): the node would read its own messages.
    let own = channel_from_node(&mut s, &mut buf, |c| match c {
        o @ Channel::Offer { .. } => Some(o),
        _ => None,
    })
    .await;
    s.write_all(&own.frame()).await.unwrap();
    let why = channel_from_node(&mut s, &mut buf, refused).await;
    assert!(why.contains("written by bus id 1, not by 9"), "{why}");
    // A ring of ours with another token than the one offered (as a ring of a third node
    // would be: its token went only to its own peer).
    let other = Ring::create_bound("evil-peer", 4096, evil_binding(7)).unwrap();
    s.write_all(&offer_of(&other, 8).frame()).await.unwrap();
    let why = channel_from_node(&mut s, &mut buf, refused).await;
    assert!(why.contains("token is not the one offered"), "{why}");
    // A ring larger than the node accepts (its shm_ring_bytes, by default the ring size).
    let large =
        Ring::create_bound("evil-peer", 2 * RING_CAPACITY_DEFAULT, evil_binding(7)).unwrap();
    s.write_all(&offer_of(&large, 7).frame()).await.unwrap();
    let why = channel_from_node(&mut s, &mut buf, refused).await;
    assert!(
        why.contains("over the 4194304 bytes this node accepts"),
        "{why}"
    );
    assert!(
        fx.node.peers().iter().any(|p| p.id == BusId(9) && p.up),
        "the link stays, on its socket"
    );
    fx.still_works().await;
}

/// Peer 9 on the same host, authenticated on a socket to `fx`'s node, whose data moved to a
/// real ring of ours (offered as a peer would; the node opened it and read SWITCH): whatever we
/// write in the ring, the node's application reads.
async fn peer_writing_a_ring(fx: &Fixture) -> (TcpStream, std::sync::Arc<busway_shm::Ring>) {
    use busway_core::channel::Channel;
    use busway_shm::ring::{Ring, RING_CAPACITY_MIN};
    let mut s = same_host_peer(fx).await;
    let ring = Ring::create_bound("evil-peer", RING_CAPACITY_MIN, evil_binding(7)).unwrap();
    let offer = offer_of(&ring, 7);
    s.write_all(&offer.frame()).await.unwrap();
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(1 << 20);
    tokio::time::timeout(WAIT, async {
        loop {
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                if f.kind == FrameKind::Channel && Channel::decode(&f.body) == Ok(Channel::Accept) {
                    return;
                }
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "link closed");
        }
    })
    .await
    .expect("an ACCEPT");
    s.write_all(&Channel::Switch.frame()).await.unwrap();
    (s, ring)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_holding_something_else_than_messages_closes_only_that_link() {
    let mut fx = fixture().await;
    let (_s, ring) = peer_writing_a_ring(&fx).await;
    // A PING where only messages may be.
    let mut p = ring.producer();
    assert!(p.try_push(&frame_bytes(FrameKind::Ping, &[0; 8])).unwrap());
    p.publish();
    // The application reads the ring; that is where the bad frame is found.
    let Fixture { events, inbox, .. } = &mut fx;
    let reading = async {
        loop {
            let _ = inbox.recv().await;
        }
    };
    let reason = tokio::select! {
        r = wait_event(events, |e| match e {
            Event::PeerDown { peer, reason: DownReason::ProtocolError(r), .. } if peer.0 == 9 => {
                Some(r.clone())
            }
            _ => None,
        }) => r,
        _ = reading => unreachable!(),
    };
    assert!(
        reason.contains("shared-memory ring from bus id 9")
            && reason.contains("Ping frame where only messages may be")
            && reason.contains("ring stream offset 0"),
        "{reason}"
    );
    assert_eq!(fx.stats().protocol_errors, 1);
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_frame_without_messages_hands_the_application_nothing() {
    let mut fx = fixture().await;
    let (_s, ring) = peer_writing_a_ring(&fx).await;
    // An empty DATA_BATCH (well formed, no message), then a message.
    let mut p = ring.producer();
    assert!(p.try_push(&frame_bytes(FrameKind::DataBatch, &[])).unwrap());
    p.publish();
    let early = tokio::time::timeout(Duration::from_millis(300), fx.inbox.recv_batch()).await;
    assert!(early.is_err(), "nothing to hand over yet");
    assert!(p.try_push(&frame_bytes(FrameKind::Data, b"after")).unwrap());
    p.publish();
    let batch = tokio::time::timeout(WAIT, fx.inbox.recv_batch())
        .await
        .expect("a batch")
        .expect("the inbox is open");
    let got: Vec<&[u8]> = batch.iter().collect();
    assert_eq!(got, vec![&b"after"[..]], "no empty batch first");
    assert_eq!(fx.stats().protocol_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_hint_closes_only_that_link() {
    use busway_core::routed::{routed_frame, RoutedHeader, RoutedType};
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    let h = RoutedHeader {
        kind: RoutedType::Hint,
        ttl: 16,
        src: BusId(9),
        src_incarnation: 9,
        dst: BusId(1),
        seq: 0,
        settled: false,
        route: vec![],
    };
    s.write_all(&routed_frame(&h, &[1, 2, 3])).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(
        reason.contains("ROUTED HINT shorter than 9 bytes"),
        "{reason}"
    );
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_send_routed_frames_as_another_node() {
    use busway_core::routed::{routed_frame, RoutedHeader, RoutedType};
    let mut fx = fixture().await;
    let mut s = authenticated(fx.addr, 9, Some(SECRET)).await;
    assert!(fx.node.wait_for_peer(BusId(9), WAIT).await);
    // An end-to-end ACK as if from bus id 2 (it would free what node 1 holds for 2 by relays).
    let forged = RoutedHeader {
        kind: RoutedType::Ack,
        ttl: 16,
        src: BusId(2),
        src_incarnation: 2,
        dst: BusId(1),
        seq: 1_000,
        settled: false,
        route: vec![],
    };
    s.write_all(&routed_frame(&forged, &[])).await.unwrap();
    closed_by_node(&mut s).await;
    let reason = fx.down(9).await;
    assert!(
        reason.contains("ROUTED frame from bus id 2 on the link to bus id 9")
            && reason.contains("may not send for others"),
        "{reason}"
    );
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_of_ids_it_may_not_serve_is_refused() {
    let mut fx = fixture().await;
    let busway::Addr::Tcp(addr) = fx.node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    // Every id, the relay's own included: refused with the reason, before anything is taken.
    let all = async {
        authenticated_as(addr, 9, Some(SECRET), |h| {
            h.downstream_of_you = Some((BusId(0), BusId(u64::MAX)));
        })
        .await
    };
    let mut s = all.await;
    closed_by_node(&mut s).await;
    let reason = fx.rejected().await;
    assert!(reason.contains("holds this relay's own id 1"), "{reason}");
    // A subtree, then another that overlaps it while the first is live.
    let _first = authenticated_as(addr, 10, Some(SECRET), |h| {
        h.downstream_of_you = Some((BusId(10), BusId(20)));
    })
    .await;
    assert!(fx.node.wait_for_peer(BusId(10), WAIT).await);
    let mut s = authenticated_as(addr, 15, Some(SECRET), |h| {
        h.downstream_of_you = Some((BusId(15), BusId(30)));
    })
    .await;
    closed_by_node(&mut s).await;
    let reason = fx.rejected().await;
    assert!(
        reason.contains("overlaps bus ids 10..=20 registered by bus id 10"),
        "{reason}"
    );
    fx.still_works().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_limit_under_what_every_node_takes_is_refused() {
    let mut fx = fixture().await;
    let busway::Addr::Tcp(addr) = fx.node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let mut s = authenticated_as(addr, 9, Some(SECRET), |h| h.frame_body_max = Some(1_000)).await;
    closed_by_node(&mut s).await;
    let reason = fx.rejected().await;
    assert!(
        reason.contains("states a frame body limit of 1000 bytes, under the"),
        "{reason}"
    );
    fx.still_works().await;
}
