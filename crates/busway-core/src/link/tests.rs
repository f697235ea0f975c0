//! A pair of links driven against each other over in-memory pipes with a virtual clock (the
//! shape of quinn-proto's `tests/util.rs` `Pair`): every rule of the machine, no sockets.

use super::*;
use crate::control::ack_frame;
use crate::frame::frame_bytes;
use crate::handshake::{local_hello, NONCE_LEN};

const WALL_MS: u64 = 1_700_000_000_000;
const HEARTBEAT_MS: u64 = 100;

fn config(role: Role, secret: Option<&str>) -> LinkConfig {
    LinkConfig {
        role,
        secret: secret.map(|s| Secret::new(s).unwrap()),
        clock_skew_max_ms: 30_000,
        handshake_timeout_ms: 1_000,
        frame_body_max: 1 << 20,
        heartbeat_interval_ms: HEARTBEAT_MS,
        heartbeat_misses_max: 3,
        shm: true,
        ring_required: false,
        expect_peer: None,
        peer_cert_ids: None,
        remote: "test://peer".into(),
    }
}

fn hello(id: u64, host: &str) -> Hello {
    let mut h = local_hello(BusId(id), id * 1000, WALL_MS, [id as u8; NONCE_LEN], vec![]);
    h.capabilities = caps::RELIABLE | caps::SHM_BOUND;
    h.host_id = host.as_bytes().to_vec();
    h
}

/// One end: its machine, the bytes it has not taken yet, and what it reported.
struct End {
    link: Link,
    inbox: Vec<u8>,
    events: Vec<LinkEvent>,
    messages: Vec<Vec<u8>>,
}

struct Pair {
    now_us: u64,
    a: End,
    b: End,
}

impl Pair {
    fn new(a_cfg: LinkConfig, a_hello: Hello, b_cfg: LinkConfig, b_hello: Hello) -> Self {
        let now = Now {
            mono_us: 0,
            wall_ms: WALL_MS,
        };
        let end = |cfg, hello| End {
            link: Link::new(cfg, hello, Arc::default(), now),
            inbox: Vec::new(),
            events: Vec::new(),
            messages: Vec::new(),
        };
        Self {
            now_us: 0,
            a: end(a_cfg, a_hello),
            b: end(b_cfg, b_hello),
        }
    }

    fn plain() -> Self {
        Self::new(
            config(Role::Dialer, None),
            hello(1, "host-a"),
            config(Role::Listener, None),
            hello(2, "host-b"),
        )
    }

    fn now(&self) -> Now {
        Now {
            mono_us: self.now_us,
            wall_ms: WALL_MS + self.now_us / 1_000,
        }
    }

    /// Moves bytes both ways and answers what the driver must answer, until quiet.
    fn drive(&mut self) {
        for _ in 0..100 {
            let moved = Self::step(self.now(), &mut self.a, &mut self.b)
                | Self::step(self.now(), &mut self.b, &mut self.a);
            if !moved {
                return;
            }
        }
        panic!("the pair never went quiet");
    }

    /// `from` writes what it has into `to`'s pipe; `to` takes its input. True if anything moved.
    fn step(now: Now, from: &mut End, to: &mut End) -> bool {
        let mut moved = false;
        while let Some(frame) = from.link.poll_transmit() {
            to.inbox.extend_from_slice(&frame);
            moved = true;
        }
        loop {
            let mut spans = Spans::new();
            let n = to.link.handle_input(&to.inbox, now, &mut spans);
            for span in &spans {
                to.messages.push(to.inbox[span.range()].to_vec());
            }
            to.inbox.drain(..n);
            let mut answered = false;
            while let Some(e) = to.link.poll_event() {
                match &e {
                    LinkEvent::PeerHello(_) => {
                        to.link.send_auth(0, 0);
                        answered = true;
                    }
                    LinkEvent::OfferRing => to.link.offer_ring(7, 8, 9, 4096, 10),
                    LinkEvent::OpenRing { .. } => to.link.ring_opened(Ok(())),
                    _ => {}
                }
                to.events.push(e);
            }
            moved |= n > 0;
            if !answered {
                return moved;
            }
        }
    }

    fn advance_ms(&mut self, ms: u64) {
        self.now_us += ms * 1_000;
        let now = self.now();
        self.a.link.handle_timeout(now);
        self.b.link.handle_timeout(now);
    }
}

fn lost(events: &[LinkEvent]) -> Option<&LinkError> {
    events.iter().find_map(|e| match e {
        LinkEvent::Lost(err) => Some(err),
        _ => None,
    })
}

fn established(events: &[LinkEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, LinkEvent::Established(_)))
}

#[test]
fn two_links_shake_hands_and_come_up_on_the_socket() {
    let mut p = Pair::plain();
    assert_eq!(p.a.link.state(), LinkState::Handshaking);
    p.drive();
    assert!(established(&p.a.events) && established(&p.b.events));
    let up = LinkState::Up {
        out: Carrier::Socket,
        inbound: Carrier::Socket,
    };
    assert_eq!((p.a.link.state(), p.b.link.state()), (up, up));
    assert!(!p.a.events.contains(&LinkEvent::OfferRing), "hosts differ");
}

#[test]
fn a_wrong_secret_fails_both_ends_with_a_reason() {
    let mut p = Pair::new(
        config(Role::Dialer, Some("a secret of sixteen+")),
        hello(1, "h"),
        config(Role::Listener, Some("another secret, 16+")),
        hello(2, "h"),
    );
    p.drive();
    let a = lost(&p.a.events).expect("a ends");
    let b = lost(&p.b.events).expect("b ends");
    for e in [a, b] {
        assert!(
            e.to_string().contains("authentication failed") || e.to_string().contains("closed"),
            "{e}"
        );
    }
    assert!(p.a.link.is_closed() && p.b.link.is_closed());
}

#[test]
fn input_after_hello_waits_for_the_auth_answer() {
    let mut p = Pair::plain();
    // Both HELLOs cross; b's HELLO and AUTH land in one read of a.
    let a_hello = p.a.link.poll_transmit().unwrap();
    let b_hello = p.b.link.poll_transmit().unwrap();
    let now = p.now();
    let mut spans = Spans::new();
    p.b.link.handle_input(&a_hello, now, &mut spans);
    assert!(matches!(
        p.b.link.poll_event(),
        Some(LinkEvent::PeerHello(_))
    ));
    p.b.link.send_auth(0, 0);
    let b_auth = p.b.link.poll_transmit().unwrap();
    let both = [&b_hello[..], &b_auth[..]].concat();
    let n = p.a.link.handle_input(&both, now, &mut spans);
    assert_eq!(n, b_hello.len(), "the AUTH waits for a's answer");
    assert!(matches!(
        p.a.link.poll_event(),
        Some(LinkEvent::PeerHello(_))
    ));
    p.a.link.send_auth(0, 0);
    let n = p.a.link.handle_input(&both[n..], now, &mut spans);
    assert_eq!(n, b_auth.len());
    assert!(matches!(
        p.a.link.poll_event(),
        Some(LinkEvent::Established(_))
    ));
}

#[test]
fn a_handshake_that_never_ends_times_out_with_a_close() {
    let mut p = Pair::plain();
    p.a.link.poll_transmit();
    assert_eq!(p.a.link.poll_timeout(), Some(1_000_000));
    p.now_us = 999_999;
    p.a.link.handle_timeout(p.now());
    assert!(!p.a.link.is_closed());
    p.now_us = 1_000_000;
    p.a.link.handle_timeout(p.now());
    assert_eq!(
        p.a.link.poll_event(),
        Some(LinkEvent::Lost(LinkError::HandshakeTimeout { ms: 1_000 }))
    );
    let close = p.a.link.poll_transmit().expect("a CLOSE says why");
    assert_eq!(close[0], FrameKind::Close as u8);
}

#[test]
fn heartbeats_keep_a_quiet_link_up_and_measure_the_round_trip() {
    let mut p = Pair::plain();
    p.drive();
    for _ in 0..20 {
        p.advance_ms(HEARTBEAT_MS);
        p.drive();
    }
    assert!(lost(&p.a.events).is_none() && lost(&p.b.events).is_none());
    assert!(p.a.events.iter().any(|e| matches!(e, LinkEvent::Rtt(_))));
}

#[test]
fn an_idle_link_gives_back_its_queues_and_still_works() {
    let mut p = Pair::plain();
    p.drive();
    p.advance_ms(HEARTBEAT_MS);
    p.drive();
    assert!(p.a.link.events.capacity() > 0 || p.a.link.transmits.capacity() > 0);
    p.a.link.release_idle_memory();
    assert_eq!(
        (p.a.link.events.capacity(), p.a.link.transmits.capacity()),
        (0, 0)
    );
    // Heartbeats still flow and measure after the queues were given back.
    let rtts = |e: &End| {
        e.events
            .iter()
            .filter(|e| matches!(e, LinkEvent::Rtt(_)))
            .count()
    };
    let before = rtts(&p.a);
    p.advance_ms(HEARTBEAT_MS);
    p.drive();
    assert!(rtts(&p.a) > before);
    assert!(lost(&p.a.events).is_none() && lost(&p.b.events).is_none());
}

#[test]
fn a_silent_peer_is_lost_after_the_heartbeat_misses() {
    let mut p = Pair::plain();
    p.drive();
    // b stops answering: nothing reaches a any more.
    for i in 1..3 {
        p.advance_ms(HEARTBEAT_MS);
        while p.a.link.poll_transmit().is_some() {}
        assert!(lost(&p.a.events).is_none(), "alive after {i} intervals");
        while let Some(e) = p.a.link.poll_event() {
            p.a.events.push(e);
        }
    }
    p.advance_ms(HEARTBEAT_MS);
    let e = p.a.link.poll_event();
    assert!(
        matches!(
            e,
            Some(LinkEvent::Lost(LinkError::Silent { silent_ms: 300, .. }))
        ),
        "{e:?}"
    );
}

#[test]
fn a_driver_that_stops_reading_keeps_the_link_and_its_heartbeats() {
    let mut p = Pair::plain();
    p.drive();
    // a's application is full: a reads nothing for ten silences' worth, b's bytes pile up.
    p.a.link.input_blocked();
    let mut pings = 0;
    for _ in 0..30 {
        p.advance_ms(HEARTBEAT_MS);
        while let Some(f) = p.a.link.poll_transmit() {
            pings += usize::from(f[..] == ping_frame(FrameKind::Ping, p.now_us)[..]);
        }
        while p.b.link.poll_transmit().is_some() {}
    }
    assert!(p.a.link.poll_event().is_none(), "not lost while blocked");
    assert_eq!(pings, 30, "a heartbeat every interval while blocked");
    // Reading again: silence counts from now, so the peer is not lost at once...
    p.a.link.input_unblocked(p.now());
    p.advance_ms(HEARTBEAT_MS);
    assert!(p.a.link.poll_event().is_none(), "not lost on resuming");
    // ...but a peer that stays silent after that is.
    for _ in 0..2 {
        p.advance_ms(HEARTBEAT_MS);
    }
    let e = p.a.link.poll_event();
    assert!(
        matches!(
            e,
            Some(LinkEvent::Lost(LinkError::Silent { silent_ms: 300, .. }))
        ),
        "{e:?}"
    );
}

#[test]
fn data_acks_and_routed_frames_are_reported_in_place() {
    let mut p = Pair::plain();
    p.drive();
    p.a.link
        .transmits
        .push_back(frame_bytes(FrameKind::Data, b"one"));
    p.a.link.transmits.push_back(ack_frame(5));
    p.a.link
        .transmits
        .push_back(frame_bytes(FrameKind::Routed, b"routed body"));
    p.drive();
    assert_eq!(p.b.messages, vec![b"one".to_vec()]);
    assert!(p.b.events.contains(&LinkEvent::Acked(5)));
    assert!(p
        .b
        .events
        .iter()
        .any(|e| matches!(e, LinkEvent::Routed(r) if r.len() == 11)));
}

/// A frame `a` should never send, fed to `b` once up; `b` must end with a reason naming it.
fn lie_to_b(frame: Bytes, same_host: bool) -> LinkError {
    let host_b = if same_host { "host-a" } else { "host-b" };
    let mut p = Pair::new(
        config(Role::Dialer, None),
        hello(1, "host-a"),
        config(Role::Listener, None),
        hello(2, host_b),
    );
    p.drive();
    p.a.link.transmits.push_back(frame);
    p.drive();
    lost(&p.b.events).cloned().expect("b ends the link")
}

#[test]
fn frames_out_of_turn_end_the_link_with_their_name() {
    let hello_again = frame_bytes(FrameKind::Hello, b"x");
    assert!(lie_to_b(hello_again, false)
        .to_string()
        .contains("Hello frame after the handshake"));
    let short_ack = frame_bytes(FrameKind::Ack, b"123");
    assert!(lie_to_b(short_ack, false)
        .to_string()
        .contains("expected 8"));
    let channel_off_host = Channel::Switch.frame();
    assert!(lie_to_b(channel_off_host, false)
        .to_string()
        .contains("did not advertise"));
    let accept_unasked = Channel::Accept.frame();
    let e = lie_to_b(accept_unasked, true).to_string();
    assert!(e.contains("CHANNEL ACCEPT out of turn"), "{e}");
    let mut bad_check = frame_bytes(FrameKind::Data, b"payload").to_vec();
    bad_check[9] ^= 1;
    assert!(matches!(
        lie_to_b(Bytes::from(bad_check), false),
        LinkError::Frame(DecodeError::ChecksumMismatch { .. })
    ));
}

#[test]
fn same_host_links_offer_accept_and_switch_rings_in_turn() {
    let mut p = Pair::new(
        config(Role::Dialer, None),
        hello(1, "one-host"),
        config(Role::Listener, None),
        hello(2, "one-host"),
    );
    p.drive();
    for end in [&p.a, &p.b] {
        assert!(end.events.contains(&LinkEvent::RingAccepted));
        assert_eq!(
            end.link.state(),
            LinkState::Up {
                out: Carrier::RingAccepted,
                inbound: Carrier::RingAccepted
            }
        );
    }
    // a's writer switches: a message it wrote before SWITCH, then SWITCH.
    p.a.link
        .transmits
        .push_back(frame_bytes(FrameKind::Data, b"last on the socket"));
    p.a.link.transmits.push_back(Channel::Switch.frame());
    p.a.link.switched_out();
    p.drive();
    assert_eq!(p.b.messages, vec![b"last on the socket".to_vec()]);
    assert_eq!(p.b.events.last(), Some(&LinkEvent::SwitchIn));
    assert_eq!(
        p.b.link.state(),
        LinkState::Up {
            out: Carrier::RingAccepted,
            inbound: Carrier::Ring
        }
    );
    // Messages on the socket after the switch are a lie.
    p.a.link
        .transmits
        .push_back(frame_bytes(FrameKind::Data, b"late"));
    p.drive();
    assert!(lost(&p.b.events)
        .unwrap()
        .to_string()
        .contains("after the peer switched"));
}

#[test]
fn a_second_offer_is_refused_as_out_of_turn() {
    let offer = Channel::Offer {
        pid: 1,
        fd: 2,
        inode: 3,
        capacity: 4,
        token: 5,
    }
    .frame();
    assert!(lie_to_b(offer, true)
        .to_string()
        .contains("CHANNEL OFFER out of turn"));
}

#[test]
fn a_ring_only_link_refuses_a_peer_on_another_host() {
    let mut cfg = config(Role::Dialer, None);
    cfg.ring_required = true;
    let mut p = Pair::new(
        cfg,
        hello(1, "host-a"),
        config(Role::Listener, None),
        hello(2, "host-b"),
    );
    p.drive();
    let e = lost(&p.a.events).expect("refused").to_string();
    assert!(
        e.contains("only through shared memory") && e.contains("another host"),
        "{e}"
    );
    let heard = p.b.events.iter().any(
        |e| matches!(e, LinkEvent::PeerClosed(c) if c.reason.contains("only through shared memory")),
    );
    assert!(heard, "the peer hears why: {:?}", p.b.events);
}

#[test]
fn a_hinted_dial_refuses_another_id() {
    let mut cfg = config(Role::Dialer, None);
    cfg.expect_peer = Some(BusId(9));
    let mut p = Pair::new(
        cfg,
        hello(1, "h"),
        config(Role::Listener, None),
        hello(2, "h"),
    );
    p.drive();
    let e = lost(&p.a.events).expect("refused").to_string();
    assert!(e.contains("to reach bus id 9, found bus id 2"), "{e}");
}

#[test]
fn a_tls_peer_may_claim_only_the_ids_its_certificate_names() {
    use crate::cert_ids::CertIds;
    // The listener's certificate names 3 and 5-9; it says it is 2.
    let mut cfg = config(Role::Dialer, None);
    cfg.peer_cert_ids = Some(CertIds::from_names(["3.id.busway", "5-9.ids.busway"]).unwrap());
    let mut p = Pair::new(
        cfg.clone(),
        hello(1, "h"),
        config(Role::Listener, None),
        hello(2, "h"),
    );
    p.drive();
    let e = lost(&p.a.events).expect("refused").to_string();
    assert!(
        e.contains("claims bus id 2 but its TLS certificate names 3, 5-9"),
        "{e}"
    );
    // Named: up. Registering 5..=9 fits; 5..=10 does not.
    let mut p = Pair::new(
        cfg.clone(),
        hello(1, "h"),
        config(Role::Listener, None),
        hello(7, "h"),
    );
    p.drive();
    assert!(lost(&p.a.events).is_none(), "{:?}", p.a.events);
    for (range, ok) in [((5, 9), true), ((5, 10), false)] {
        let mut relay = hello(7, "h");
        relay.downstream_of_you = Some((BusId(range.0), BusId(range.1)));
        let mut p = Pair::new(
            cfg.clone(),
            hello(1, "h"),
            config(Role::Listener, None),
            relay,
        );
        p.drive();
        match lost(&p.a.events) {
            None => assert!(ok, "{range:?} was taken"),
            Some(e) => {
                assert!(!ok, "{range:?} was refused: {e}");
                assert!(e.to_string().contains("registers bus ids 5..=10"), "{e}");
            }
        }
    }
}

#[test]
fn a_close_drains_and_stops_the_walk() {
    let mut p = Pair::plain();
    p.drive();
    p.a.link
        .transmits
        .push_back(Close::frame(CloseCode::Normal, "bye"));
    p.a.link
        .transmits
        .push_back(frame_bytes(FrameKind::Data, b"after close"));
    p.drive();
    assert_eq!(p.b.link.state(), LinkState::Draining);
    assert!(p
        .b
        .events
        .iter()
        .any(|e| matches!(e, LinkEvent::PeerClosed(c) if c.reason == "bye")));
    assert!(p.b.messages.is_empty(), "nothing after the CLOSE is taken");
}
