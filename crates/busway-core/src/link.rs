//! One link's protocol as a state machine, in the shape of quinn-proto's `Connection`: it is fed
//! bytes and time and hands back what to write, when to wake it, and what happened. It owns the
//! handshake, the rules of what a peer may send after it, heartbeats and liveness, and the
//! negotiation that moves the link's data into a shared-memory ring. It never touches a
//! socket, a clock or a thread.
//!
//! The calling contract (the same order as quinn-proto's):
//!
//! 1. feed input with [`Link::handle_input`] (whole frames at the front of the buffer are taken;
//!    it returns how many bytes it took) and expired timers with [`Link::handle_timeout`];
//! 2. then drain [`Link::poll_event`] (what the driver must act on: deliver, acknowledge,
//!    open a ring, end the link) and [`Link::poll_transmit`] (frames to write);
//! 3. sleep until [`Link::poll_timeout`] or more input.
//!
//! The bytes of messages need not pass through the machine: DATA payloads are reported as
//! places in the caller's buffer (no copy), and a ring's data is read by the application
//! itself, the machine being told only that the link switched.
//!
//! ```text
//!   Handshaking ──HELLO/AUTH──▶ Up { out ring, in ring } ──the peer's CLOSE──▶ Draining
//!        │                          │                                               │
//!        └────── bad handshake ─────┴── bad frame, silence past the heartbeat ──────┴─▶ Closed
//! ```

use crate::body::message_spans;
use crate::channel::Channel;
use crate::control::{decode_token, ping_frame, Close, CloseCode};
use crate::frame::{frame_bytes, Frame, HEADER_LEN};
use crate::frame::{DecodeError, FrameDecoder, FrameKind, HANDSHAKE_BODY_LEN_MAX};
use crate::handshake::Secret;
use crate::handshake::{caps, Established, Handshake, HandshakeError, Hello, NonceCache, Role};
use crate::BusId;
use bytes::Bytes;
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// A moment as the driver sees it: its monotonic clock (heartbeats, round trips, deadlines)
/// and the wall clock (the handshake's timestamps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Microseconds of a monotonic clock.
    pub mono_us: u64,
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
}

/// What a link is set up with.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Which end of the connection this is (part of the handshake's proofs).
    pub role: Role,
    /// The shared secret, if the node has one.
    pub secret: Option<Secret>,
    /// Largest accepted difference between the peer's clock and ours, in ms.
    pub clock_skew_max_ms: u64,
    /// Time the whole handshake may take, in ms.
    pub handshake_timeout_ms: u64,
    /// Largest frame body accepted once the peer is authenticated, in bytes.
    pub frame_body_max: usize,
    /// A PING goes out every this many ms once up.
    pub heartbeat_interval_ms: u64,
    /// The link is dead after this many heartbeat intervals without a byte from the peer.
    pub heartbeat_misses_max: u64,
    /// This node moves a same-host link's data to shared memory (and advertised `shm`).
    pub shm: bool,
    /// The link must carry its data through shared memory (an `shm://` address): a peer that
    /// cannot is refused, and a refused ring ends the link.
    pub ring_required: bool,
    /// The link was dialed to reach this bus id (a relay's hint): another id is refused.
    pub expect_peer: Option<BusId>,
    /// The bus ids the peer's TLS certificate names (a TLS link): the peer's HELLO must state
    /// one of them, and a subtree it registers must lie within one named range.
    pub peer_cert_ids: Option<crate::cert_ids::CertIds>,
    /// A name for the remote end, used in error texts (e.g. `tcp://10.0.0.1:7000`).
    pub remote: String,
}

/// Where a link stands. One value, not a set of flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// HELLO and AUTH are being exchanged.
    Handshaking,
    /// Authenticated; messages flow. `out` is where ours go, `inbound` where the peer's come.
    Up {
        /// What carries our messages to the peer.
        out: Carrier,
        /// What carries the peer's messages to us.
        inbound: Carrier,
    },
    /// The peer sent CLOSE: nothing after it is taken; the driver sends what is queued, then
    /// its own CLOSE (our own closing is the driver's: it writes CLOSE after its queue).
    Draining,
    /// Done; the driver drops the connection.
    Closed,
}

/// What carries one direction of a link's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// The socket, and it stays so (no shared memory on this link, or a ring was refused).
    Socket,
    /// The socket while a ring is offered (by us for `out`; by the peer for `inbound`, while
    /// it is being opened).
    RingOffered,
    /// The receiving side took the ring: for `out`, our writer switches at its next write;
    /// for `inbound`, the peer's SWITCH may come.
    RingAccepted,
    /// The ring: the switch happened.
    Ring,
}

/// Why a link ended from the protocol's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// The handshake failed (bad HELLO or AUTH, wrong secret, replay, version).
    Handshake(HandshakeError),
    /// The handshake did not finish in time.
    HandshakeTimeout {
        /// The time allowed for the handshake, in milliseconds.
        ms: u64,
    },
    /// The handshake succeeded but this link may not go on (wrong id on a hinted dial, a
    /// shared-memory-only link to a peer that cannot share memory).
    Refused(String),
    /// A frame failed to decode (bad kind, over the limit, failed check).
    Frame(DecodeError),
    /// A frame broke the protocol's rules; the text names what and where.
    Protocol(String),
    /// Nothing was received for too long.
    Silent {
        /// How long nothing was received, in milliseconds.
        silent_ms: u64,
        /// The heartbeat interval, in milliseconds.
        interval_ms: u64,
        /// How many heartbeat intervals without a byte end the link.
        misses: u64,
    },
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Handshake(e) => write!(f, "{e}"),
            Self::HandshakeTimeout { ms } => write!(f, "handshake not complete within {ms} ms"),
            Self::Refused(why) => write!(f, "{why}"),
            Self::Frame(e) => write!(f, "{e}"),
            Self::Protocol(what) => write!(f, "{what}"),
            Self::Silent {
                silent_ms,
                interval_ms,
                misses,
            } => write!(
                f,
                "nothing received for {silent_ms} ms ({misses} heartbeat intervals of {interval_ms} ms)"
            ),
        }
    }
}

/// What the driver must act on, in the order it happened.
#[derive(Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// The peer introduced itself (checked). Answer with [`Link::send_auth`], saying where the
    /// numbering resumes for this peer and incarnation; input is held until then.
    PeerHello(Box<Hello>),
    /// The peer is authenticated. If the driver cannot attach it (a duplicate), it calls
    /// [`Link::reject`].
    Established(Box<Established>),
    /// Both ends share a host and memory: create our ring toward the peer and call
    /// [`Link::offer_ring`] (or [`Link::ring_unavailable`]).
    OfferRing,
    /// The peer offers its ring: open it and call [`Link::ring_opened`].
    OpenRing {
        /// The peer's process id, for opening the ring as `/proc/PID/fd/FD`.
        pid: u32,
        /// The ring's file descriptor number in the peer's process.
        fd: u32,
        /// The ring file's inode number, to check on the file opened.
        inode: u64,
        /// How many bytes of data the ring holds.
        capacity: u64,
        /// Must be in the ring's header (with the peer as writer, us as reader).
        token: u64,
    },
    /// The peer mapped our ring: our writer switches to it (then calls [`Link::switched_out`]).
    RingAccepted,
    /// The peer could not map our ring; our messages stay on the socket.
    RingRefused(String),
    /// The peer's last message on the socket was read: read its ring from now on (after the
    /// messages of this input, which came before it).
    SwitchIn,
    /// The peer has every message below this number.
    Acked(u64),
    /// A round trip was measured, in microseconds.
    Rtt(u64),
    /// A ROUTED frame; its body is this range of the buffer given to `handle_input`.
    Routed(Range<usize>),
    /// A REGISTER frame (checked; an ADD outside the peer's TLS certificate was answered
    /// here, refused): apply it, and send back the answer (see [`crate::registry`]).
    Register(crate::registry::RegisterOp),
    /// The peer closed the link with this reason: send what is queued, then our CLOSE.
    PeerClosed(Close),
    /// The link is over: close the connection. A driver that can still write sends what
    /// `poll_transmit` has first (a CLOSE naming the reason, when the machine made one);
    /// busway's runtime does so during the handshake, and drops the socket once up.
    Lost(LinkError),
}

/// Places of the messages that one `handle_input` found in its buffer, each with its kind.
pub type Spans = Vec<crate::body::Span>;

/// What only the handshake needs: boxed in [`Phase::Handshaking`] and gone once the link is
/// up (an idle link's memory is what its task and machine keep).
struct HandshakeState {
    hs: Handshake,
    config: LinkConfig,
    /// This host's identity, as this node's HELLO states it (what a ring needs to match).
    local_host_id: Vec<u8>,
}

/// What an up link needs of its configuration.
struct UpConfig {
    heartbeat_interval_ms: u64,
    heartbeat_misses_max: u64,
    ring_required: bool,
    /// The ids the peer's TLS certificate names: a range it registers must lie within one.
    peer_cert_ids: Option<crate::cert_ids::CertIds>,
}

enum Phase {
    Handshaking {
        state: Box<HandshakeState>,
        deadline_us: u64,
        /// A PeerHello was reported and `send_auth` not called yet: input waits.
        awaiting_auth: bool,
    },
    Up {
        out: Carrier,
        inbound: Carrier,
        /// The peer and we share a host and both allow shared memory.
        rings: bool,
    },
    /// The peer sent CLOSE: nothing may follow it.
    Draining,
    Closed,
}

/// One link's protocol state. Owned by the one task that drives the link.
pub struct Link {
    up: UpConfig,
    nonces: Arc<Mutex<NonceCache>>,
    phase: Phase,
    dec: FrameDecoder,
    last_rx_us: u64,
    /// The driver stopped reading the peer because its own side is full (the application's
    /// inbox, a relay's queue onward): the peer's bytes wait in the kernel, so its silence is
    /// not judged meanwhile (see [`Link::input_blocked`]).
    input_blocked: bool,
    next_ping_us: u64,
    events: VecDeque<LinkEvent>,
    transmits: VecDeque<Bytes>,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("state", &self.state())
            .finish()
    }
}

fn ms(us: u64) -> u64 {
    us / 1_000
}

impl Link {
    /// A link that starts its handshake now: its HELLO is the first transmit. `local` is this
    /// node's HELLO; `nonces` the node's replay cache (shared by its links).
    pub fn new(config: LinkConfig, local: Hello, nonces: Arc<Mutex<NonceCache>>, now: Now) -> Self {
        let host_id = local.host_id.clone();
        let mut hs = Handshake::new(config.role, local, config.secret.clone());
        hs.set_clock_skew_max_ms(config.clock_skew_max_ms);
        let hello = hs.hello_frame();
        let deadline_us = now.mono_us + config.handshake_timeout_ms * 1_000;
        Self {
            up: UpConfig {
                heartbeat_interval_ms: config.heartbeat_interval_ms,
                heartbeat_misses_max: config.heartbeat_misses_max,
                ring_required: config.ring_required,
                peer_cert_ids: config.peer_cert_ids.clone(),
            },
            nonces,
            phase: Phase::Handshaking {
                state: Box::new(HandshakeState {
                    hs,
                    config,
                    local_host_id: host_id,
                }),
                deadline_us,
                awaiting_auth: false,
            },
            dec: FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX),
            last_rx_us: now.mono_us,
            input_blocked: false,
            next_ping_us: 0,
            events: VecDeque::new(),
            transmits: VecDeque::from([hello]),
        }
    }

    /// Where the link stands.
    pub fn state(&self) -> LinkState {
        match &self.phase {
            Phase::Handshaking { .. } => LinkState::Handshaking,
            Phase::Up { out, inbound, .. } => LinkState::Up {
                out: *out,
                inbound: *inbound,
            },
            Phase::Draining => LinkState::Draining,
            Phase::Closed => LinkState::Closed,
        }
    }

    /// Whether this up link moves its data to shared memory (both ends share a host and
    /// allow it): the driver prepares for [`LinkEvent::OfferRing`] and [`LinkEvent::OpenRing`].
    pub fn uses_rings(&self) -> bool {
        matches!(self.phase, Phase::Up { rings: true, .. })
    }

    /// Whether the link is over.
    pub fn is_closed(&self) -> bool {
        matches!(self.phase, Phase::Closed)
    }

    /// Bytes of the stream taken so far (where an error is, for messages).
    pub fn offset(&self) -> u64 {
        self.dec.offset()
    }

    /// How many bytes the buffer must hold before the next frame is whole.
    pub fn bytes_needed(&self, buf: &[u8]) -> usize {
        self.dec.bytes_needed(buf)
    }

    /// The next frame to write, if any.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.transmits.pop_front()
    }

    /// The next thing the driver must act on, if any.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.pop_front()
    }

    /// Gives back the room of the event and transmit queues when both are empty: called by a
    /// driver whose link goes idle, so an idle link keeps no queue it used once (a busy link
    /// calls it rarely, and then pays one small allocation at its next event).
    pub fn release_idle_memory(&mut self) {
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
        if self.transmits.is_empty() {
            self.transmits = VecDeque::new();
        }
    }

    /// When [`Link::handle_timeout`] must be called next (monotonic µs); `None` when closed.
    pub fn poll_timeout(&self) -> Option<u64> {
        match &self.phase {
            Phase::Handshaking { deadline_us, .. } => Some(*deadline_us),
            Phase::Up { .. } | Phase::Draining => Some(self.next_ping_us),
            Phase::Closed => None,
        }
    }

    /// Timers: the handshake's deadline; once up, a PING each heartbeat interval, and the end
    /// of a peer silent for `heartbeat_misses_max` intervals.
    pub fn handle_timeout(&mut self, now: Now) {
        match &self.phase {
            Phase::Handshaking {
                deadline_us, state, ..
            } if now.mono_us >= *deadline_us => {
                let ms = state.config.handshake_timeout_ms;
                self.lose_with_close(LinkError::HandshakeTimeout { ms });
            }
            Phase::Up { .. } | Phase::Draining if now.mono_us >= self.next_ping_us => {
                let interval_ms = self.up.heartbeat_interval_ms;
                let misses = self.up.heartbeat_misses_max;
                let silent_ms = ms(now.mono_us.saturating_sub(self.last_rx_us));
                if silent_ms >= misses * interval_ms && !self.input_blocked {
                    self.lose(LinkError::Silent {
                        silent_ms,
                        interval_ms,
                        misses,
                    });
                    return;
                }
                self.transmits
                    .push_back(ping_frame(FrameKind::Ping, now.mono_us));
                self.next_ping_us = now.mono_us + interval_ms * 1_000;
            }
            _ => {}
        }
    }

    /// The driver stops reading the peer for now because its own side is full (backpressure:
    /// the application is not reading, or a relay's queue onward is full). Heartbeats keep
    /// going out, but the peer's silence is not held against it: what it sent waits unread in
    /// the kernel, PONGs and ACKs included.
    pub fn input_blocked(&mut self) {
        self.input_blocked = true;
    }

    /// The driver reads the peer again: its silence counts from now (the time spent not
    /// reading was ours, not the peer's).
    pub fn input_unblocked(&mut self, now: Now) {
        if std::mem::take(&mut self.input_blocked) {
            self.last_rx_us = self.last_rx_us.max(now.mono_us);
        }
    }

    /// Takes the whole frames at the front of `buf`; returns how many bytes it took (the
    /// driver drops them once it acted on the events, which may point into them). DATA
    /// messages are appended to `spans`, as places in `buf`. Stops early after the peer's
    /// HELLO (until [`Link::send_auth`]), and at an error (reported as [`LinkEvent::Lost`];
    /// frames before it count). Nothing after the peer's CLOSE is taken.
    pub fn handle_input(&mut self, buf: &[u8], now: Now, spans: &mut Spans) -> usize {
        if !buf.is_empty() {
            self.last_rx_us = now.mono_us;
        }
        match self.phase {
            Phase::Handshaking { .. } => self.handshake_input(buf, now),
            Phase::Up { .. } => self.up_input(buf, spans),
            Phase::Draining | Phase::Closed => 0,
        }
    }

    fn handshake_input(&mut self, buf: &[u8], now: Now) -> usize {
        let mut pos = 0;
        loop {
            let Phase::Handshaking {
                state,
                awaiting_auth,
                ..
            } = &mut self.phase
            else {
                return pos;
            };
            if *awaiting_auth {
                return pos;
            }
            let (kind, len) = match self.dec.peek(&buf[pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => return pos,
                Err(e) => {
                    let e = HandshakeError::Malformed(format!("bad frame: {e}"));
                    self.lose_with_close(LinkError::Handshake(e));
                    return pos;
                }
            };
            let frame = Frame {
                kind,
                body: Bytes::copy_from_slice(&buf[pos + HEADER_LEN..pos + len]),
            };
            pos += len;
            let step = {
                let mut nonces = self.nonces.lock().unwrap_or_else(|p| p.into_inner());
                state.hs.handle_frame(&frame, now.wall_ms, &mut nonces)
            };
            match step {
                Ok(crate::handshake::Step::PeerHello(hello)) => {
                    *awaiting_auth = true;
                    self.events.push_back(LinkEvent::PeerHello(hello));
                }
                Ok(crate::handshake::Step::Established(est)) => {
                    self.established(est, now);
                    return pos;
                }
                Err(e) => {
                    // A peer that closed needs no CLOSE back.
                    if matches!(e, HandshakeError::ClosedByPeer(_)) {
                        self.lose(LinkError::Handshake(e));
                    } else {
                        self.lose_with_close(LinkError::Handshake(e));
                    }
                    return pos;
                }
            }
        }
    }

    /// Answers the peer's HELLO: where this side's numbering resumes with it.
    pub fn send_auth(&mut self, next_send_seq: u64, next_expected_seq: u64) {
        if let Phase::Handshaking {
            state,
            awaiting_auth,
            ..
        } = &mut self.phase
        {
            if std::mem::take(awaiting_auth) {
                let frame = state.hs.auth_frame(next_send_seq, next_expected_seq);
                self.transmits.push_back(frame);
            }
        }
    }

    fn established(&mut self, est: Box<Established>, now: Now) {
        // The handshake's state goes here, whatever the outcome (`lose` closes the link).
        let Phase::Handshaking { state, .. } = std::mem::replace(&mut self.phase, Phase::Closed)
        else {
            return;
        };
        let HandshakeState {
            config,
            local_host_id,
            ..
        } = *state;
        let peer = &est.peer;
        if let Some(ids) = &config.peer_cert_ids {
            let why = if !ids.contains(peer.bus_id) {
                Some(format!(
                    "{} claims bus id {} but its TLS certificate names {ids}",
                    config.remote, peer.bus_id
                ))
            } else {
                peer.downstream_of_you
                    .filter(|&(first, last)| !ids.covers(first, last))
                    .map(|(first, last)| {
                        format!(
                            "{} (bus id {}) registers bus ids {first}..={last} but its TLS certificate names {ids}",
                            config.remote, peer.bus_id
                        )
                    })
            };
            if let Some(why) = why {
                return self.lose_with_close(LinkError::Refused(why));
            }
        }
        if let Some(expected) = config.expect_peer {
            if peer.bus_id != expected {
                let why = format!(
                    "dialed {} to reach bus id {expected}, found bus id {}",
                    config.remote, peer.bus_id
                );
                return self.lose_with_close(LinkError::Refused(why));
            }
        }
        let rings = config.shm
            && peer.capabilities & caps::SHM_BOUND != 0
            && !local_host_id.is_empty()
            && peer.host_id == local_host_id;
        if self.up.ring_required && !rings {
            let why = if !config.shm {
                "this node has shared memory turned off"
            } else if peer.capabilities & caps::SHM_BOUND == 0 {
                "the peer does not allow shared memory"
            } else {
                "the peer runs on another host"
            };
            let why = format!(
                "{} carries its data only through shared memory, and {why} (bus id {})",
                config.remote, peer.bus_id
            );
            return self.lose_with_close(LinkError::Refused(why));
        }
        self.dec.set_body_len_max(config.frame_body_max);
        self.next_ping_us = now.mono_us + config.heartbeat_interval_ms * 1_000;
        self.phase = Phase::Up {
            out: Carrier::Socket,
            inbound: Carrier::Socket,
            rings,
        };
        self.events.push_back(LinkEvent::Established(est));
        if rings {
            self.events.push_back(LinkEvent::OfferRing);
        }
    }

    /// The driver could not attach the authenticated peer (e.g. its id is connected already):
    /// the link ends with a CLOSE naming why.
    pub fn reject(&mut self, code: CloseCode, why: &str) {
        self.transmits.push_back(Close::frame(code, why));
        self.phase = Phase::Closed;
    }

    /// Our ring toward the peer exists: offer it. `token` is the random number in its header
    /// (see [`Channel::Offer`]).
    pub fn offer_ring(&mut self, pid: u32, fd: u32, inode: u64, capacity: u64, token: u64) {
        if let Phase::Up {
            out: out @ Carrier::Socket,
            rings: true,
            ..
        } = &mut self.phase
        {
            *out = Carrier::RingOffered;
            let offer = Channel::Offer {
                pid,
                fd,
                inode,
                capacity,
                token,
            };
            self.transmits.push_back(offer.frame());
        }
    }

    /// Our ring could not be made: the messages stay on the socket, unless the link must use
    /// shared memory (then it ends).
    pub fn ring_unavailable(&mut self, why: &str) {
        if self.up.ring_required {
            self.lose(LinkError::Refused(format!("cannot make a ring: {why}")));
        }
    }

    /// The peer's offered ring was opened (or not, with why): answers ACCEPT or REFUSE.
    pub fn ring_opened(&mut self, result: Result<(), String>) {
        let Phase::Up {
            inbound: inbound @ Carrier::RingOffered,
            ..
        } = &mut self.phase
        else {
            return;
        };
        match result {
            Ok(()) => {
                *inbound = Carrier::RingAccepted;
                self.transmits.push_back(Channel::Accept.frame());
            }
            Err(why) => {
                *inbound = Carrier::Socket;
                self.transmits
                    .push_back(Channel::Refuse(why.clone()).frame());
                if self.up.ring_required {
                    self.lose(LinkError::Refused(format!(
                        "shm:// link: cannot open the peer's ring: {why}"
                    )));
                }
            }
        }
    }

    /// Our writer wrote SWITCH: our messages go into the ring from here on.
    pub fn switched_out(&mut self) {
        if let Phase::Up {
            out: out @ Carrier::RingAccepted,
            ..
        } = &mut self.phase
        {
            *out = Carrier::Ring;
        }
    }

    /// The link ends now for a reason outside the protocol (a failed ring, a cut): later input
    /// is ignored.
    pub fn fail(&mut self, error: LinkError) {
        if !self.is_closed() {
            self.lose(error);
        }
    }

    fn lose(&mut self, error: LinkError) {
        self.phase = Phase::Closed;
        self.events.push_back(LinkEvent::Lost(error));
    }

    /// Ends the link and tells the peer why.
    fn lose_with_close(&mut self, error: LinkError) {
        let code = match &error {
            LinkError::Handshake(HandshakeError::BadProof) => CloseCode::AuthFailed,
            _ => CloseCode::ProtocolError,
        };
        self.transmits
            .push_back(Close::frame(code, &error.to_string()));
        self.lose(error);
    }

    fn protocol_error(&mut self, what: String) {
        self.lose(LinkError::Protocol(what));
    }

    fn up_input(&mut self, buf: &[u8], spans: &mut Spans) -> usize {
        let mut pos = 0;
        while !self.is_closed() {
            let (kind, len) = match self.dec.peek(&buf[pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    self.lose(LinkError::Frame(e));
                    break;
                }
            };
            let at = self.dec.offset() - len as u64;
            let body_at = pos + HEADER_LEN;
            pos += len;
            if !self.up_frame(kind, &buf[body_at..pos], body_at, at, spans) {
                break;
            }
        }
        pos
    }

    /// One frame of an up link; false if walking must stop (a CLOSE, an error).
    fn up_frame(
        &mut self,
        kind: FrameKind,
        body: &[u8],
        body_at: usize,
        at: u64,
        spans: &mut Spans,
    ) -> bool {
        match kind {
            FrameKind::Data
            | FrameKind::DataBatch
            | FrameKind::Call
            | FrameKind::Reply
            | FrameKind::Interest
            | FrameKind::Publish
            | FrameKind::Repair
            | FrameKind::Multicast
            | FrameKind::GroupLog => {
                if let Phase::Up {
                    inbound: Carrier::Ring,
                    ..
                } = self.phase
                {
                    self.protocol_error(format!(
                        "{kind:?} frame on the socket after the peer switched to its ring, at stream offset {at}"
                    ));
                    return false;
                }
                if let Err(what) = message_spans(kind, body, body_at, spans) {
                    self.protocol_error(format!("{what} (frame at stream offset {at})"));
                    return false;
                }
            }
            FrameKind::Ping | FrameKind::Pong | FrameKind::Ack => {
                let Some(value) = decode_token(body) else {
                    self.protocol_error(format!(
                        "{kind:?} body of {} bytes (expected 8) at stream offset {at}",
                        body.len()
                    ));
                    return false;
                };
                let event = match kind {
                    FrameKind::Ping => {
                        self.transmits.push_back(ping_frame(FrameKind::Pong, value));
                        return true;
                    }
                    // The token is our clock when the PING left; one from the future is a lie,
                    // measured as the shortest trip.
                    FrameKind::Pong => LinkEvent::Rtt(self.last_rx_us.saturating_sub(value).max(1)),
                    _ => LinkEvent::Acked(value),
                };
                self.events.push_back(event);
            }
            FrameKind::Close => {
                self.phase = Phase::Draining;
                self.events
                    .push_back(LinkEvent::PeerClosed(Close::decode(body)));
                return false;
            }
            FrameKind::Hello | FrameKind::Auth => {
                self.protocol_error(format!(
                    "{kind:?} frame after the handshake, at stream offset {at}"
                ));
                return false;
            }
            FrameKind::Routed => self
                .events
                .push_back(LinkEvent::Routed(body_at..body_at + body.len())),
            FrameKind::Register => return self.register_frame(body, at),
            FrameKind::Channel => return self.channel_frame(body, at),
        }
        true
    }

    fn register_frame(&mut self, body: &[u8], at: u64) -> bool {
        use crate::registry::RegisterOp;
        let op = match RegisterOp::decode(body) {
            Ok(op) => op,
            Err(what) => {
                self.protocol_error(format!("{what} (at stream offset {at})"));
                return false;
            }
        };
        if let (RegisterOp::Add { version, range }, Some(ids)) = (&op, &self.up.peer_cert_ids) {
            if !ids.covers(range.0, range.1) {
                let refused = Some(format!(
                    "bus ids {}..={} are not all named by the TLS certificate, which names {ids}",
                    range.0, range.1
                ));
                let answer = RegisterOp::Answer {
                    version: *version,
                    refused,
                };
                self.transmits
                    .push_back(frame_bytes(FrameKind::Register, &answer.encode()));
                return true;
            }
        }
        self.events.push_back(LinkEvent::Register(op));
        true
    }

    fn channel_frame(&mut self, body: &[u8], at: u64) -> bool {
        let Phase::Up {
            out,
            inbound,
            rings: true,
        } = &mut self.phase
        else {
            self.protocol_error(format!(
                "CHANNEL frame, a capability this node did not advertise or not on this stream, at stream offset {at}"
            ));
            return false;
        };
        let msg = match Channel::decode(body) {
            Ok(m) => m,
            Err(what) => {
                self.protocol_error(format!("{what} (at stream offset {at})"));
                return false;
            }
        };
        let event = match (msg, *out, *inbound) {
            (
                Channel::Offer {
                    pid,
                    fd,
                    inode,
                    capacity,
                    token,
                },
                _,
                Carrier::Socket,
            ) => {
                *inbound = Carrier::RingOffered;
                LinkEvent::OpenRing {
                    pid,
                    fd,
                    inode,
                    capacity,
                    token,
                }
            }
            (Channel::Accept, Carrier::RingOffered, _) => {
                *out = Carrier::RingAccepted;
                LinkEvent::RingAccepted
            }
            (Channel::Refuse(why), Carrier::RingOffered, _) => {
                *out = Carrier::Socket;
                if self.up.ring_required {
                    self.lose(LinkError::Refused(format!(
                        "shm:// link: the peer refused our ring: {why}"
                    )));
                    return false;
                }
                LinkEvent::RingRefused(why)
            }
            (Channel::Switch, _, Carrier::RingAccepted) => {
                *inbound = Carrier::Ring;
                LinkEvent::SwitchIn
            }
            (msg, out, inbound) => {
                let op = match msg {
                    Channel::Offer { .. } => "OFFER",
                    Channel::Accept => "ACCEPT",
                    Channel::Refuse(_) => "REFUSE",
                    Channel::Switch => "SWITCH",
                };
                self.protocol_error(format!(
                    "CHANNEL {op} out of turn (our ring: {out:?}, the peer's: {inbound:?}) at stream offset {at}"
                ));
                return false;
            }
        };
        self.events.push_back(event);
        true
    }
}

#[cfg(test)]
mod tests;
