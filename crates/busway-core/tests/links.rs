//! A simulated cluster of links driven by busway-core's own link state machine ([`Link`]) and
//! outbox ([`Outbox`]): a hub and four leaves, each leaf-hub connection a pair of real `Link`s
//! over in-memory byte lanes, with a virtual clock; no sockets, no threads, no real time.
//!
//! Every node streams numbered messages to each of its neighbors. A seeded schedule cuts
//! connections (what was in flight is lost), delays lanes, freezes nodes (a frozen node reads,
//! writes and times nothing: its peer's heartbeats must declare it silent, and a handshake
//! toward it must time out), and lets same-host pairs move their data to a "ring": a second
//! lane, with the CHANNEL OFFER/ACCEPT/SWITCH turns of the real machine. A lost connection is
//! dialed again, and the handshake resumes the numbering where each side stands. Every
//! schedule must deliver every message exactly once and in order per direction, and end with
//! everything acknowledged; across the schedules, every path (silence, handshake timeout,
//! resume, ring switch) must have been taken.
//! `BUSWAY_SIM_SEEDS=N` runs N schedules (default 100); `BUSWAY_SIM_SEED=S` runs one.

use busway_core::body::message_spans;
use busway_core::control::ack_frame;
use busway_core::frame::{FrameDecoder, HEADER_LEN};
use busway_core::handshake::{caps, local_hello, Role, NONCE_LEN};
use busway_core::link::{Carrier, Link, LinkConfig, LinkError, LinkEvent, LinkState, Now, Spans};
use busway_core::outbox::Outbox;
use busway_core::sim::SimRng;
use busway_core::BusId;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};

const HUB: u64 = 100;
const LEAVES: [u64; 4] = [1, 2, 3, 4];
const HEARTBEAT_MS: u64 = 20;
const HANDSHAKE_TIMEOUT_MS: u64 = 200;
const REDIAL_MS: u64 = 15;
const MSGS_PER_DIRECTION: u64 = 3_000;
const CHAOS_MS: u64 = 6_000;
const STEPS_MAX_MS: u64 = 60_000;
const OUTBOX_BYTES_MAX: usize = 64 << 10;

/// Bytes in flight on one lane, each with the virtual ms it arrives.
#[derive(Default)]
struct Lane {
    in_flight: Vec<(u64, Bytes)>,
}

impl Lane {
    fn send(&mut self, at: u64, bytes: Bytes) {
        if !bytes.is_empty() {
            self.in_flight.push((at, bytes));
        }
    }

    /// What has arrived by `now`, in order (a byte stream never reorders).
    fn arrived(&mut self, now: u64, into: &mut Vec<u8>) {
        let n = self.in_flight.iter().take_while(|(t, _)| *t <= now).count();
        for (_, b) in self.in_flight.drain(..n) {
            into.extend_from_slice(&b);
        }
    }
}

/// One node's end of a connection.
struct End {
    link: Link,
    /// Bytes received on the socket and not yet taken by the machine.
    socket_in: Vec<u8>,
    /// Bytes received in the peer's ring and not yet read.
    ring_in: Vec<u8>,
    ring_dec: FrameDecoder,
    /// The peer's SWITCH was read: its ring is read from now on.
    reading_ring: bool,
    /// Our SWITCH was written: our messages go into the ring.
    writing_ring: bool,
}

/// A connection between a leaf (the dialer) and the hub: both ends and four lanes.
struct Conn {
    leaf: End,
    hub: End,
    to_hub: Lane,
    to_leaf: Lane,
    ring_to_hub: Lane,
    ring_to_leaf: Lane,
}

/// What a node keeps about one neighbor, across connections (the runtime's `Peer`).
struct PeerState {
    outbox: Outbox,
    inbound_expected: u64,
    sent: u64,
    /// The last message number delivered from the neighbor, to check order.
    delivered: u64,
}

impl PeerState {
    fn new() -> Self {
        Self {
            outbox: Outbox::new(OUTBOX_BYTES_MAX, 0),
            inbound_expected: 0,
            sent: 0,
            delivered: 0,
        }
    }
}

/// How often each path was taken over all schedules.
#[derive(Default, Debug)]
struct Seen {
    silent: u64,
    handshake_timeouts: u64,
    resumes: u64,
    switches: u64,
    cuts: u64,
}

struct Sim {
    now: u64,
    rng: SimRng,
    /// Per leaf: the connection, if one is open.
    conns: BTreeMap<u64, Conn>,
    /// Per leaf: when to dial again.
    redial_at: HashMap<u64, u64>,
    /// Per leaf: extra lane delay, ms.
    delay_ms: HashMap<u64, u64>,
    /// Per leaf: whether leaf and hub share a host (their data may move to a ring).
    same_host: HashMap<u64, bool>,
    /// Per node: frozen until this ms.
    frozen_until: HashMap<u64, u64>,
    /// (node, neighbor) -> what `node` keeps about `neighbor`.
    peers: HashMap<(u64, u64), PeerState>,
    failures: Vec<String>,
    seen: Seen,
}

fn now_at(ms: u64) -> Now {
    Now {
        mono_us: ms * 1_000,
        wall_ms: 1_700_000_000_000 + ms,
    }
}

fn link_config(role: Role) -> LinkConfig {
    LinkConfig {
        role,
        secret: None,
        clock_skew_max_ms: 30_000,
        handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS,
        frame_body_max: 1 << 20,
        heartbeat_interval_ms: HEARTBEAT_MS,
        heartbeat_misses_max: 3,
        shm: true,
        ring_required: false,
        expect_peer: None,
        peer_cert_ids: None,
        remote: "sim".into(),
    }
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = SimRng::new(seed);
        let mut peers = HashMap::new();
        let mut same_host = HashMap::new();
        for leaf in LEAVES {
            peers.insert((leaf, HUB), PeerState::new());
            peers.insert((HUB, leaf), PeerState::new());
            same_host.insert(leaf, rng.chance(50));
        }
        Self {
            now: 0,
            rng,
            conns: BTreeMap::new(),
            redial_at: LEAVES.iter().map(|&l| (l, 0)).collect(),
            delay_ms: LEAVES.iter().map(|&l| (l, 0)).collect(),
            same_host,
            frozen_until: HashMap::new(),
            peers,
            failures: Vec::new(),
            seen: Seen::default(),
        }
    }

    fn frozen(&self, node: u64) -> bool {
        self.frozen_until.get(&node).is_some_and(|&t| t > self.now)
    }

    fn hello(&self, node: u64, leaf: u64) -> busway_core::handshake::Hello {
        let mut h = local_hello(
            BusId(node),
            node,
            1_700_000_000_000 + self.now,
            [(node as u8) ^ (self.now as u8); NONCE_LEN],
            vec![],
        );
        h.capabilities = caps::RELIABLE | caps::SHM_BOUND;
        h.host_id = if self.same_host[&leaf] {
            b"one-host".to_vec()
        } else {
            format!("host-{node}").into_bytes()
        };
        h
    }

    fn dial(&mut self, leaf: u64) {
        let now = now_at(self.now);
        let end = |link| End {
            link,
            socket_in: Vec::new(),
            ring_in: Vec::new(),
            ring_dec: FrameDecoder::new(1 << 20).skip_checks(),
            reading_ring: false,
            writing_ring: false,
        };
        let leaf_link = Link::new(
            link_config(Role::Dialer),
            self.hello(leaf, leaf),
            Default::default(),
            now,
        );
        let hub_link = Link::new(
            link_config(Role::Listener),
            self.hello(HUB, leaf),
            Default::default(),
            now,
        );
        self.conns.insert(
            leaf,
            Conn {
                leaf: end(leaf_link),
                hub: end(hub_link),
                to_hub: Lane::default(),
                to_leaf: Lane::default(),
                ring_to_hub: Lane::default(),
                ring_to_leaf: Lane::default(),
            },
        );
    }

    /// The connection of `leaf` closes (a cut, or one end ended it): both ends see it gone.
    fn close(&mut self, leaf: u64) {
        if self.conns.remove(&leaf).is_some() {
            for key in [(leaf, HUB), (HUB, leaf)] {
                // The ring lives and dies with its link: checks again for the next one.
                self.peers.get_mut(&key).unwrap().outbox.set_checks(true);
            }
            self.redial_at.insert(leaf, self.now + REDIAL_MS);
        }
    }

    /// One ms for one end: read, act, time, write. Returns false if the connection must close.
    fn step_end(&mut self, leaf: u64, at_hub: bool) -> bool {
        let (me, them) = if at_hub { (HUB, leaf) } else { (leaf, HUB) };
        if self.frozen(me) {
            return true;
        }
        let now = self.now;
        let delay = 1 + self.delay_ms[&leaf];
        let conn = self.conns.get_mut(&leaf).unwrap();
        let (end, socket_out, ring_out, socket_in, ring_in) = if at_hub {
            (
                &mut conn.hub,
                &mut conn.to_leaf,
                &mut conn.ring_to_leaf,
                &mut conn.to_hub,
                &mut conn.ring_to_hub,
            )
        } else {
            (
                &mut conn.leaf,
                &mut conn.to_hub,
                &mut conn.ring_to_hub,
                &mut conn.to_leaf,
                &mut conn.ring_to_leaf,
            )
        };
        let peer = self.peers.get_mut(&(me, them)).unwrap();
        socket_in.arrived(now, &mut end.socket_in);
        ring_in.arrived(now, &mut end.ring_in);
        // The socket: the machine takes whole frames; messages are delivered.
        let mut open = true;
        loop {
            let mut spans = Spans::new();
            let n = end
                .link
                .handle_input(&end.socket_in, now_at(now), &mut spans);
            deliver(&mut self.failures, me, them, peer, &end.socket_in, &spans);
            end.socket_in.drain(..n);
            let mut again = false;
            while let Some(e) = end.link.poll_event() {
                match e {
                    LinkEvent::PeerHello(_) => {
                        end.link
                            .send_auth(peer.outbox.acked(), peer.inbound_expected);
                        again = true;
                    }
                    LinkEvent::Established(est) => {
                        if let Err(e) = peer.outbox.resume(est.peer_auth.next_expected_seq) {
                            self.failures
                                .push(format!("{me}->{them}: cannot resume: {e}"));
                        }
                        if est.peer_auth.next_expected_seq > 0 {
                            self.seen.resumes += 1;
                        }
                        peer.inbound_expected =
                            peer.inbound_expected.max(est.peer_auth.next_send_seq);
                    }
                    LinkEvent::Acked(next) => {
                        if let Err(e) = peer.outbox.ack(next) {
                            self.failures.push(format!("{me}->{them}: bad ACK: {e}"));
                        }
                    }
                    LinkEvent::OfferRing => end.link.offer_ring(me as u32, 3, 4, 4096, 5),
                    LinkEvent::OpenRing { .. } => end.link.ring_opened(Ok(())),
                    LinkEvent::SwitchIn => end.reading_ring = true,
                    LinkEvent::Lost(e) => {
                        let context = format!("{me}->{them}: link lost");
                        note_lost(&mut self.seen, &mut self.failures, e, context);
                        open = false;
                    }
                    LinkEvent::PeerClosed(c) => {
                        self.failures
                            .push(format!("{me}->{them}: unexpected close: {c}"));
                        open = false;
                    }
                    LinkEvent::RingAccepted
                    | LinkEvent::RingRefused(_)
                    | LinkEvent::Rtt(_)
                    | LinkEvent::Routed(_)
                    | LinkEvent::Register(_) => {}
                }
            }
            if !again || !open {
                break;
            }
        }
        // The ring, once the peer switched: read as the application's ring reader does.
        if end.reading_ring && open {
            let mut spans = Spans::new();
            let mut pos = 0;
            while let Ok(Some((kind, len))) = end.ring_dec.peek(&end.ring_in[pos..]) {
                let body = &end.ring_in[pos + HEADER_LEN..pos + len];
                if message_spans(kind, body, pos + HEADER_LEN, &mut spans).is_err() {
                    self.failures.push(format!("{me}<-{them}: bad ring frame"));
                }
                pos += len;
            }
            deliver(&mut self.failures, me, them, peer, &end.ring_in, &spans);
            end.ring_in.drain(..pos);
        }
        if !open {
            return false;
        }
        end.link.handle_timeout(now_at(now));
        while let Some(e) = end.link.poll_event() {
            if let LinkEvent::Lost(e) = e {
                note_lost(
                    &mut self.seen,
                    &mut self.failures,
                    e,
                    format!("{me}: timer"),
                );
                return false;
            }
        }
        // The application sends a few more messages.
        let want = self.rng.below(4).min(MSGS_PER_DIRECTION - peer.sent);
        for _ in 0..want {
            let n = peer.sent + 1;
            if peer.outbox.push_copies(&[n.to_le_bytes()]) == 0 {
                break;
            }
            peer.sent = n;
        }
        // The writer: control frames and, once up, messages; after the peer accepted our
        // ring, SWITCH on the socket and messages into the ring from then on.
        let state = end.link.state();
        let mut out = Vec::new();
        while let Some(f) = end.link.poll_transmit() {
            match state {
                LinkState::Handshaking | LinkState::Closed => out.push(f),
                _ => peer.outbox.push_control(f),
            }
        }
        if let LinkState::Up {
            out: carrier,
            inbound,
        } = state
        {
            if inbound == Carrier::Ring && !end.reading_ring {
                self.failures
                    .push(format!("{me}: ring state without SWITCH"));
            }
            if carrier == Carrier::RingAccepted && !end.writing_ring {
                peer.outbox.take_unwritten(&mut out);
                out.push(busway_core::channel::Channel::Switch.frame());
                end.link.switched_out();
                end.writing_ring = true;
                peer.outbox.set_checks(false);
                self.seen.switches += 1;
            }
            if end.writing_ring {
                peer.outbox.take_control(&mut out);
                let mut ring = Vec::new();
                peer.outbox.take_messages(&mut ring);
                for b in ring {
                    ring_out.send(now + delay, b);
                }
            } else {
                peer.outbox.take_unwritten(&mut out);
            }
        }
        for b in out {
            socket_out.send(now + delay, b);
        }
        true
    }

    fn step(&mut self, chaos: bool) {
        if chaos {
            let leaf = LEAVES[self.rng.below(4) as usize];
            if self.rng.chance(1) && self.conns.contains_key(&leaf) {
                self.seen.cuts += 1;
                self.close(leaf);
            }
            if self.rng.chance(1) {
                self.delay_ms.insert(leaf, self.rng.below(15));
            }
            if self.rng.below(1000) < 2 {
                let node = if self.rng.chance(30) { HUB } else { leaf };
                let until = self.now + 20 + self.rng.below(300);
                self.frozen_until.insert(node, until);
            }
        }
        for leaf in LEAVES {
            if !self.conns.contains_key(&leaf) {
                if self.redial_at[&leaf] <= self.now && !self.frozen(leaf) {
                    self.dial(leaf);
                }
                continue;
            }
            let open = self.step_end(leaf, false) && self.step_end(leaf, true);
            if !open {
                self.close(leaf);
            }
        }
        self.now += 1;
    }

    fn done(&self) -> bool {
        self.peers.iter().all(|((node, nb), p)| {
            p.sent == MSGS_PER_DIRECTION
                && p.outbox.unacked() == 0
                && self.peers[&(*nb, *node)].delivered == MSGS_PER_DIRECTION
        })
    }
}

/// A link ended: silence and handshake timeouts are paths the schedules must take (counted);
/// anything else is a failure, named with `context`.
fn note_lost(seen: &mut Seen, failures: &mut Vec<String>, error: LinkError, context: String) {
    match error {
        LinkError::Silent { .. } => seen.silent += 1,
        LinkError::HandshakeTimeout { .. } => seen.handshake_timeouts += 1,
        other => failures.push(format!("{context}: {other}")),
    }
}

/// Hands the messages at `spans` of `buf` from `them` to `me`'s application: each must be the
/// next number, once.
fn deliver(
    failures: &mut Vec<String>,
    me: u64,
    them: u64,
    peer: &mut PeerState,
    buf: &[u8],
    spans: &[busway_core::body::Span],
) {
    for span in spans {
        let n = u64::from_le_bytes(buf[span.range()].try_into().unwrap());
        if n != peer.delivered + 1 && failures.len() < 10 {
            failures.push(format!(
                "{them}->{me}: message {n} delivered after {} ({})",
                peer.delivered,
                if n <= peer.delivered {
                    "a duplicate"
                } else {
                    "a gap"
                }
            ));
        }
        peer.delivered = peer.delivered.max(n);
        peer.inbound_expected += 1;
    }
    if !spans.is_empty() {
        // One ACK per read, as the runtime's reader sends.
        peer.outbox.push_control(ack_frame(peer.inbound_expected));
    }
}

fn run(seed: u64) -> Result<Seen, String> {
    let mut sim = Sim::new(seed);
    while sim.now < STEPS_MAX_MS {
        let chaos = sim.now < CHAOS_MS;
        sim.step(chaos);
        if !sim.failures.is_empty() {
            return Err(format!("seed {seed} at {} ms: {:?}", sim.now, sim.failures));
        }
        if !chaos && sim.done() {
            return Ok(sim.seen);
        }
    }
    let stuck: Vec<String> = sim
        .peers
        .iter()
        .filter(|(_, p)| p.sent < MSGS_PER_DIRECTION || p.outbox.unacked() > 0)
        .map(|((a, b), p)| {
            format!(
                "{a}->{b}: sent {}, unacked {}, peer delivered {}",
                p.sent,
                p.outbox.unacked(),
                sim.peers[&(*b, *a)].delivered
            )
        })
        .collect();
    Err(format!(
        "seed {seed}: not done after {STEPS_MAX_MS} ms: {stuck:?}"
    ))
}

#[test]
fn every_schedule_delivers_every_message_once_in_order_over_real_link_machines() {
    let seeds: Vec<u64> = match std::env::var("BUSWAY_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("BUSWAY_SIM_SEED is a number")],
        Err(_) => {
            let n = std::env::var("BUSWAY_SIM_SEEDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(100);
            (0..n).collect()
        }
    };
    let mut total = Seen::default();
    for seed in &seeds {
        let seen = run(*seed).unwrap_or_else(|e| panic!("{e}"));
        total.silent += seen.silent;
        total.handshake_timeouts += seen.handshake_timeouts;
        total.resumes += seen.resumes;
        total.switches += seen.switches;
        total.cuts += seen.cuts;
    }
    eprintln!("{} schedules: {total:?}", seeds.len());
    if seeds.len() >= 20 {
        assert!(
            total.silent > 0
                && total.handshake_timeouts > 0
                && total.resumes > 0
                && total.switches > 0
                && total.cuts > 0,
            "every path is taken: {total:?}"
        );
    }
}
