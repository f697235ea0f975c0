//! The v1 handshake: HELLO then AUTH from each side, sans-IO.
//!
//! Both sides send HELLO as soon as the connection is open. On the peer's HELLO each side checks
//! version, ids and (with a shared secret) timestamp and nonce, then sends AUTH carrying its proof:
//! HMAC-SHA256 keyed by the secret over a label, its role, its own HELLO body and the peer's
//! HELLO body, and the resume sequence numbers. Binding both HELLO bodies binds both nonces, both
//! ids, both incarnations and both timestamps, so a proof cannot be replayed on another
//! connection. On the peer's AUTH each side checks the proof; the link is then up.
//! Layouts are in `docs/PROTOCOL.md`.

use crate::frame::{frame_bytes, Frame, FrameKind};
use crate::id::BusId;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{HashSet, VecDeque};
use std::fmt;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 2;
/// First bytes of every HELLO body, so a stray client is recognised at once.
pub const HELLO_MAGIC: [u8; 4] = *b"BWAY";
/// Bytes of the random nonce in HELLO.
pub const NONCE_LEN: usize = 16;
/// Bytes of the fixed part of a HELLO body, before its TLV fields.
pub const HELLO_FIXED_LEN: usize = 50;
/// Most listen addresses a HELLO may carry.
pub const LISTEN_ADDRS_MAX: usize = 16;
/// Longest listen address in a HELLO, in bytes.
pub const ADDR_LEN_MAX: usize = 512;
/// Longest host identity in a HELLO, in bytes.
pub const HOST_ID_LEN_MAX: usize = 64;
/// Shortest accepted shared secret, in bytes.
pub const SECRET_LEN_MIN: usize = 16;
/// Bytes of an AUTH proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Default largest difference between the peer's HELLO timestamp and our clock, in milliseconds.
pub const DEFAULT_CLOCK_SKEW_MAX_MS: u64 = 30_000;
/// Most nonces the replay cache remembers; past it, new handshakes are refused until old entries
/// expire (failing closed, not forgetting).
pub const NONCE_CACHE_LEN_MAX: usize = 65_536;

const AUTH_LABEL: &[u8] = b"busway/v1/auth";

/// HELLO TLV tags. Unknown tags are skipped, so later versions can add fields.
mod tag {
    pub(crate) const LISTEN_ADDR: u8 = 1;
    pub(crate) const HOST_ID: u8 = 2;
    pub(crate) const CAPABILITIES: u8 = 3;
    pub(crate) const DOWNSTREAM_OF_YOU: u8 = 4;
    pub(crate) const FRAME_BODY_MAX: u8 = 5;
}

/// Capability bits a node advertises in HELLO. A node sends a reserved frame kind only to a
/// peer that advertised the matching capability.
pub mod caps {
    /// Understands ROUTED frames and relays them.
    pub const RELAY: u64 = 1 << 0;
    /// Understands ACK frames and end-to-end sequence numbers.
    pub const RELIABLE: u64 = 1 << 1;
    /// Moved its data to shared-memory rings with an OFFER of 24 bytes and rings that anyone
    /// who named them could read. No longer advertised nor honoured: a peer with only this
    /// bit keeps its data on the socket.
    pub const SHM: u64 = 1 << 2;
    /// Accepts direct links from nodes that learned its addresses from a relay (HINT).
    pub const DIRECT: u64 = 1 << 3;
    /// Can move its data to shared-memory rings bound to their reader (CHANNEL frames whose
    /// OFFER carries a token; see `channel`).
    pub const SHM_BOUND: u64 = 1 << 4;
    /// Understands GROUP_LOG frames (a publisher's offer of its log of a group, see
    /// `group`): it answers them, accepting or declining. A publisher offers its logs only
    /// to peers with this bit (an older peer would close the link on the frame).
    pub const GROUP_LOGS: u64 = 1 << 5;
    /// Understands REGISTER frames (see `registry`): a relay registers its downstreams'
    /// ids with an upstream that has this bit (an older one would close the link on it).
    pub const REGISTER: u64 = 1 << 6;
    /// Understands PUBLISH frames with `group::PUBLISH_BATCH_BIT` (many publishes in a row
    /// in one frame): publishers and relays send batches only to peers with this bit.
    pub const PUBLISH_BATCH: u64 = 1 << 7;
    /// Understands PUBLISH gap marks (a mark with `group::PUBLISH_BATCH_BIT`, carrying the
    /// first publish dropped on the way): sent only to peers with this bit, others get a
    /// plain mark.
    pub const GAP_MARKS: u64 = 1 << 8;
}

/// Everything that can be wrong with a handshake. The display text says what and why.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum HandshakeError {
    /// A HELLO or AUTH body that cannot be read; the text says what is wrong.
    Malformed(String),
    /// A frame the handshake does not expect in its current state.
    UnexpectedFrame {
        /// The frame's kind.
        kind: FrameKind,
        /// What the handshake was doing, e.g. "waiting for AUTH".
        state: &'static str,
    },
    /// The two sides' protocol version ranges do not overlap.
    VersionMismatch {
        /// The oldest and newest versions this side speaks.
        ours: (u16, u16),
        /// The oldest and newest versions the peer speaks.
        theirs: (u16, u16),
    },
    /// The node connected to itself (same bus id and incarnation).
    SelfConnection,
    /// Another node (another incarnation) claims this node's own bus id.
    SameBusId(BusId),
    /// The peer requires a shared secret but this node has none configured.
    PeerRequiresSecret,
    /// This node requires a shared secret but the peer has none configured.
    PeerHasNoSecret,
    /// The peer's HELLO timestamp is too far from this node's clock.
    StaleTimestamp {
        /// The peer's timestamp minus this node's clock, in milliseconds.
        skew_ms: i128,
        /// The largest difference allowed, in milliseconds.
        max_ms: u64,
    },
    /// The peer's nonce was seen in a proven handshake still within its lifetime, or is
    /// this side's own.
    ReplayedNonce,
    /// The replay cache holds [`NONCE_CACHE_LEN_MAX`] nonces: new handshakes are refused
    /// until old entries expire.
    ReplayCacheFull,
    /// The peer's AUTH proof is missing or does not match the shared secret.
    BadProof,
    /// The peer sent CLOSE during the handshake: its code (what a program can act on) and
    /// reason.
    ClosedByPeer(crate::control::Close),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(what) => write!(f, "malformed handshake frame: {what}"),
            Self::UnexpectedFrame { kind, state } => {
                write!(f, "unexpected {kind:?} frame while {state}")
            }
            Self::VersionMismatch { ours, theirs } => write!(
                f,
                "no common protocol version: we speak {}..={}, the peer {}..={}",
                ours.0, ours.1, theirs.0, theirs.1
            ),
            Self::SelfConnection => write!(f, "connected to itself"),
            Self::SameBusId(id) => write!(f, "the peer claims this node's own bus id {id}"),
            Self::PeerRequiresSecret => write!(
                f,
                "the peer requires a shared secret but this node has none configured"
            ),
            Self::PeerHasNoSecret => write!(
                f,
                "this node requires a shared secret but the peer has none configured"
            ),
            Self::StaleTimestamp { skew_ms, max_ms } => write!(
                f,
                "stale handshake: the peer's clock differs by {skew_ms} ms (at most {max_ms} ms allowed)"
            ),
            Self::ReplayedNonce => write!(f, "replayed handshake nonce"),
            Self::ReplayCacheFull => write!(f, "too many handshakes in the replay window"),
            Self::BadProof => write!(
                f,
                "authentication failed: the peer's proof does not match the shared secret"
            ),
            Self::ClosedByPeer(reason) => write!(f, "the peer closed the handshake: {reason}"),
        }
    }
}

impl std::error::Error for HandshakeError {}

fn malformed(what: impl Into<String>) -> HandshakeError {
    HandshakeError::Malformed(what.into())
}

/// A node's introduction. Sent once per side per connection.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    /// The oldest protocol version the sender speaks.
    pub version_min: u16,
    /// The newest protocol version the sender speaks.
    pub version_max: u16,
    /// The sender has a shared secret and requires proofs.
    pub auth: bool,
    /// The sender's bus id.
    pub bus_id: BusId,
    /// Random per process start: tells a restarted node from the one before.
    pub incarnation: u64,
    /// The sender's wall clock, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Random per handshake, so that a proof cannot be replayed on another connection.
    pub nonce: [u8; NONCE_LEN],
    /// Addresses where the sender accepts connections (at most [`LISTEN_ADDRS_MAX`]).
    pub listen_addrs: Vec<String>,
    /// Identity of the sender's host (for the shared-memory channel); empty if unknown.
    pub host_id: Vec<u8>,
    /// The [`caps`] bits the sender advertises.
    pub capabilities: u64,
    /// Set when the sender registers as the receiver's downstream: the first and last bus id
    /// of the ids it serves (its own and those of its own downstreams).
    pub downstream_of_you: Option<(BusId, BusId)>,
    /// The largest frame body the sender accepts, in bytes; a peer sends it nothing larger
    /// (`None`: not stated; the peer's own limit is assumed).
    pub frame_body_max: Option<u64>,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], HandshakeError> {
        if self.buf.len() < n {
            return Err(malformed(format!(
                "{what}: needs {n} bytes, {} left",
                self.buf.len()
            )));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> Result<u8, HandshakeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, HandshakeError> {
        Ok(u16::from_le_bytes(
            self.take(2, what)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self, what: &str) -> Result<u64, HandshakeError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().unwrap_or_default(),
        ))
    }
}

impl Hello {
    /// The HELLO body. Fields over their limits are the caller's bug and are cut (addresses past
    /// [`LISTEN_ADDRS_MAX`] or longer than [`ADDR_LEN_MAX`] are left out).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_FIXED_LEN + 64);
        b.extend_from_slice(&HELLO_MAGIC);
        b.extend_from_slice(&self.version_min.to_le_bytes());
        b.extend_from_slice(&self.version_max.to_le_bytes());
        b.push(u8::from(self.auth));
        b.push(0);
        b.extend_from_slice(&self.bus_id.0.to_le_bytes());
        b.extend_from_slice(&self.incarnation.to_le_bytes());
        b.extend_from_slice(&self.timestamp_ms.to_le_bytes());
        b.extend_from_slice(&self.nonce);
        let mut tlv = |tag: u8, value: &[u8]| {
            b.push(tag);
            b.extend_from_slice(&(value.len() as u16).to_le_bytes());
            b.extend_from_slice(value);
        };
        for addr in self
            .listen_addrs
            .iter()
            .filter(|a| a.len() <= ADDR_LEN_MAX)
            .take(LISTEN_ADDRS_MAX)
        {
            tlv(tag::LISTEN_ADDR, addr.as_bytes());
        }
        if !self.host_id.is_empty() && self.host_id.len() <= HOST_ID_LEN_MAX {
            tlv(tag::HOST_ID, &self.host_id);
        }
        tlv(tag::CAPABILITIES, &self.capabilities.to_le_bytes());
        if let Some((lo, hi)) = self.downstream_of_you {
            let mut range = [0u8; 16];
            range[..8].copy_from_slice(&lo.0.to_le_bytes());
            range[8..].copy_from_slice(&hi.0.to_le_bytes());
            tlv(tag::DOWNSTREAM_OF_YOU, &range);
        }
        if let Some(max) = self.frame_body_max {
            tlv(tag::FRAME_BODY_MAX, &max.to_le_bytes());
        }
        b
    }

    /// Reads a HELLO body, checking every length against its limit.
    pub fn decode(body: &[u8]) -> Result<Self, HandshakeError> {
        let mut r = Reader { buf: body };
        if r.take(4, "magic")? != HELLO_MAGIC {
            return Err(malformed("bad magic (not a busway peer?)"));
        }
        let version_min = r.u16("version_min")?;
        let version_max = r.u16("version_max")?;
        let flags = r.u8("flags")?;
        let _reserved = r.u8("reserved")?;
        let bus_id = BusId(r.u64("bus_id")?);
        let incarnation = r.u64("incarnation")?;
        let timestamp_ms = r.u64("timestamp")?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(r.take(NONCE_LEN, "nonce")?);
        let mut hello = Hello {
            version_min,
            version_max,
            auth: flags & 1 != 0,
            bus_id,
            incarnation,
            timestamp_ms,
            nonce,
            listen_addrs: Vec::new(),
            host_id: Vec::new(),
            capabilities: 0,
            downstream_of_you: None,
            frame_body_max: None,
        };
        while !r.buf.is_empty() {
            let t = r.u8("field tag")?;
            let len = r.u16("field length")? as usize;
            let value = r.take(len, "field value")?;
            hello.take_field(t, value)?;
        }
        Ok(hello)
    }

    /// Takes one tagged field of a HELLO, checked against its limit; a field from a later
    /// version is skipped on purpose.
    fn take_field(&mut self, t: u8, value: &[u8]) -> Result<(), HandshakeError> {
        let len = value.len();
        match t {
            tag::LISTEN_ADDR => {
                if self.listen_addrs.len() >= LISTEN_ADDRS_MAX {
                    return Err(malformed(format!(
                        "more than {LISTEN_ADDRS_MAX} listen addresses"
                    )));
                }
                if len > ADDR_LEN_MAX {
                    return Err(malformed(format!(
                        "listen address of {len} bytes, over {ADDR_LEN_MAX}"
                    )));
                }
                let addr = std::str::from_utf8(value)
                    .map_err(|_| malformed("listen address is not UTF-8"))?;
                self.listen_addrs.push(addr.to_owned());
            }
            tag::HOST_ID => {
                if len > HOST_ID_LEN_MAX {
                    return Err(malformed(format!(
                        "host id of {len} bytes, over {HOST_ID_LEN_MAX}"
                    )));
                }
                self.host_id = value.to_vec();
            }
            tag::CAPABILITIES => {
                let bits: [u8; 8] = value
                    .try_into()
                    .map_err(|_| malformed("capabilities field is not 8 bytes"))?;
                self.capabilities = u64::from_le_bytes(bits);
            }
            tag::DOWNSTREAM_OF_YOU => {
                let range: [u8; 16] = value
                    .try_into()
                    .map_err(|_| malformed("downstream range is not 16 bytes"))?;
                let lo = u64::from_le_bytes(range[..8].try_into().unwrap_or_default());
                let hi = u64::from_le_bytes(range[8..].try_into().unwrap_or_default());
                if lo > hi {
                    return Err(malformed(format!("downstream range {lo}..={hi} is empty")));
                }
                self.downstream_of_you = Some((BusId(lo), BusId(hi)));
            }
            tag::FRAME_BODY_MAX => {
                let bits: [u8; 8] = value
                    .try_into()
                    .map_err(|_| malformed("frame body limit is not 8 bytes"))?;
                let max = u64::from_le_bytes(bits);
                if max == 0 {
                    return Err(malformed("a frame body limit of 0 bytes"));
                }
                self.frame_body_max = Some(max);
            }
            _ => {}
        }
        Ok(())
    }
}

/// The AUTH body: where each side resumes its sequence numbers, and the proof (absent without
/// a shared secret).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Auth {
    /// Sequence number of the first DATA frame this side will send on the link.
    pub next_send_seq: u64,
    /// Sequence number this side expects next from the peer (a cumulative acknowledgement).
    pub next_expected_seq: u64,
    /// HMAC-SHA256 proof of the shared secret over both HELLO bodies and these sequence
    /// numbers; `None` without a shared secret.
    pub proof: Option<[u8; PROOF_LEN]>,
}

impl Auth {
    /// The AUTH body: both sequence numbers, then the proof's length and the proof.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(17 + PROOF_LEN);
        b.extend_from_slice(&self.next_send_seq.to_le_bytes());
        b.extend_from_slice(&self.next_expected_seq.to_le_bytes());
        match &self.proof {
            Some(p) => {
                b.push(PROOF_LEN as u8);
                b.extend_from_slice(p);
            }
            None => b.push(0),
        }
        b
    }

    /// Reads an AUTH body; the error says what is wrong.
    pub fn decode(body: &[u8]) -> Result<Self, HandshakeError> {
        let mut r = Reader { buf: body };
        let next_send_seq = r.u64("next_send_seq")?;
        let next_expected_seq = r.u64("next_expected_seq")?;
        let proof = match r.u8("proof length")? as usize {
            0 => None,
            PROOF_LEN => {
                let mut p = [0u8; PROOF_LEN];
                p.copy_from_slice(r.take(PROOF_LEN, "proof")?);
                Some(p)
            }
            n => {
                return Err(malformed(format!(
                    "proof of {n} bytes, expected {PROOF_LEN}"
                )))
            }
        };
        if !r.buf.is_empty() {
            return Err(malformed(format!(
                "{} trailing bytes after AUTH",
                r.buf.len()
            )));
        }
        Ok(Self {
            next_send_seq,
            next_expected_seq,
            proof,
        })
    }
}

/// A shared secret. Its bytes never appear in `Debug` output.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret of at least [`SECRET_LEN_MIN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, String> {
        let bytes = bytes.into();
        if bytes.len() < SECRET_LEN_MIN {
            return Err(format!(
                "shared secret is {} bytes; at least {SECRET_LEN_MIN} are required",
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }

    fn mac(&self, role: Role, first: &[u8], second: &[u8], auth: &Auth) -> Hmac<Sha256> {
        // HMAC accepts keys of any length, so this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(AUTH_LABEL);
        mac.update(&[role.label()]);
        mac.update(&(first.len() as u32).to_le_bytes());
        mac.update(first);
        mac.update(&(second.len() as u32).to_le_bytes());
        mac.update(second);
        mac.update(&auth.next_send_seq.to_le_bytes());
        mac.update(&auth.next_expected_seq.to_le_bytes());
        mac
    }
}

/// Which end of the connection this side is; part of the proof so that a proof cannot be
/// reflected back to its sender.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// This side opened the connection.
    Dialer,
    /// This side accepted the connection.
    Listener,
}

impl Role {
    fn label(self) -> u8 {
        match self {
            Role::Dialer => b'D',
            Role::Listener => b'L',
        }
    }
    fn other(self) -> Self {
        match self {
            Role::Dialer => Role::Listener,
            Role::Listener => Role::Dialer,
        }
    }
}

/// Remembers the nonces of recent *proven* handshakes, so that a recorded HELLO is refused at
/// once. Entries expire after twice the clock-skew window; bounded by [`NONCE_CACHE_LEN_MAX`].
///
/// Only a handshake whose proof checked out is remembered: a HELLO alone proves nothing (anyone
/// can send one), so a flood of HELLOs without the secret must not fill the cache and lock out
/// honest nodes. Replay is impossible either way: each side's proof covers both nonces, and
/// ours is fresh for every connection, so a recorded AUTH never proves a new handshake; the
/// cache only turns a replayed HELLO away before any work is spent on it.
#[derive(Debug, Default)]
pub struct NonceCache {
    seen: HashSet<[u8; NONCE_LEN]>,
    by_expiry: VecDeque<(u64, [u8; NONCE_LEN])>,
}

impl NonceCache {
    /// An error if `nonce` belongs to a proven handshake still within its lifetime.
    pub fn check(&mut self, nonce: [u8; NONCE_LEN], now_ms: u64) -> Result<(), HandshakeError> {
        self.expire(now_ms);
        if self.seen.contains(&nonce) {
            return Err(HandshakeError::ReplayedNonce);
        }
        Ok(())
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(&(expiry, old)) = self.by_expiry.front() {
            if expiry > now_ms {
                break;
            }
            self.by_expiry.pop_front();
            self.seen.remove(&old);
        }
    }

    /// Records the nonce of a proven handshake; an error if it was seen within its lifetime or
    /// the cache is full.
    pub fn check_and_insert(
        &mut self,
        nonce: [u8; NONCE_LEN],
        now_ms: u64,
        lifetime_ms: u64,
    ) -> Result<(), HandshakeError> {
        self.expire(now_ms);
        if self.seen.contains(&nonce) {
            return Err(HandshakeError::ReplayedNonce);
        }
        if self.seen.len() >= NONCE_CACHE_LEN_MAX {
            return Err(HandshakeError::ReplayCacheFull);
        }
        self.seen.insert(nonce);
        self.by_expiry.push_back((now_ms + lifetime_ms, nonce));
        Ok(())
    }
}

/// What the caller must do after feeding a frame to [`Handshake::handle_frame`].
#[derive(Debug)]
pub enum Step {
    /// The peer introduced itself (checked). Decide where the sequence numbers resume for this
    /// peer and incarnation, send [`Handshake::auth_frame`], then keep feeding frames.
    PeerHello(Box<Hello>),
    /// The peer is authenticated.
    Established(Box<Established>),
}

/// The result of a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Established {
    /// The peer's HELLO, checked.
    pub peer: Hello,
    /// The peer's AUTH, its proof verified: where the peer resumes its sequence numbers.
    pub peer_auth: Auth,
    /// What this side announced.
    pub own_auth: Auth,
}

#[derive(Debug)]
enum State {
    AwaitHello,
    AwaitAuth { peer: Hello, peer_body: Vec<u8> },
    Done,
}

/// One side of one handshake. Feed it every frame the peer sends until it returns
/// [`Step::Established`] or an error; it never touches a socket or a clock.
#[derive(Debug)]
pub struct Handshake {
    role: Role,
    local: Hello,
    local_body: Vec<u8>,
    secret: Option<Secret>,
    clock_skew_max_ms: u64,
    /// The AUTH this side sent, once sent.
    own_auth: Option<Auth>,
    state: State,
}

impl Handshake {
    /// `local.auth` is set from whether `secret` is given.
    pub fn new(role: Role, mut local: Hello, secret: Option<Secret>) -> Self {
        local.auth = secret.is_some();
        let local_body = local.encode();
        Self {
            role,
            local,
            local_body,
            secret,
            clock_skew_max_ms: DEFAULT_CLOCK_SKEW_MAX_MS,
            own_auth: None,
            state: State::AwaitHello,
        }
    }

    /// Largest accepted difference between the peer's clock and ours.
    pub fn set_clock_skew_max_ms(&mut self, ms: u64) {
        self.clock_skew_max_ms = ms;
    }

    /// The AUTH frame to send after [`Step::PeerHello`]: where this side resumes its sequence
    /// numbers (see [`Auth`]) and, with a secret, its proof.
    ///
    /// # Panics
    /// If called before the peer's HELLO was accepted.
    pub fn auth_frame(&mut self, next_send_seq: u64, next_expected_seq: u64) -> Bytes {
        let State::AwaitAuth { peer_body, .. } = &self.state else {
            panic!("auth_frame before the peer's HELLO");
        };
        let mut auth = Auth {
            next_send_seq,
            next_expected_seq,
            proof: None,
        };
        if let Some(secret) = &self.secret {
            let mac = secret.mac(self.role, &self.local_body, peer_body, &auth);
            auth.proof = Some(mac.finalize().into_bytes().into());
        }
        let frame = frame_bytes(FrameKind::Auth, &auth.encode());
        self.own_auth = Some(auth);
        frame
    }

    /// The HELLO frame to send first.
    pub fn hello_frame(&self) -> Bytes {
        frame_bytes(FrameKind::Hello, &self.local_body)
    }

    /// Feeds one frame from the peer. `now_ms` is the wall clock (ms since the Unix epoch).
    pub fn handle_frame(
        &mut self,
        frame: &Frame,
        now_ms: u64,
        nonces: &mut NonceCache,
    ) -> Result<Step, HandshakeError> {
        match (&self.state, frame.kind) {
            (_, FrameKind::Close) => Err(HandshakeError::ClosedByPeer(
                crate::control::Close::decode(&frame.body),
            )),
            (State::AwaitHello, FrameKind::Hello) => {
                let peer = Hello::decode(&frame.body)?;
                self.check_hello(&peer, now_ms, nonces)?;
                self.state = State::AwaitAuth {
                    peer: peer.clone(),
                    peer_body: frame.body.to_vec(),
                };
                Ok(Step::PeerHello(Box::new(peer)))
            }
            (State::AwaitAuth { .. }, FrameKind::Auth) if self.own_auth.is_some() => {
                let peer_auth = Auth::decode(&frame.body)?;
                let State::AwaitAuth { peer, peer_body } =
                    std::mem::replace(&mut self.state, State::Done)
                else {
                    unreachable!("matched above")
                };
                if let Some(secret) = &self.secret {
                    let proof = peer_auth.proof.ok_or(HandshakeError::BadProof)?;
                    secret
                        .mac(self.role.other(), &peer_body, &self.local_body, &peer_auth)
                        .verify_slice(&proof)
                        .map_err(|_| HandshakeError::BadProof)?;
                    // Proven: now its nonce may take a place in the replay cache.
                    nonces.check_and_insert(peer.nonce, now_ms, 2 * self.clock_skew_max_ms)?;
                }
                let own_auth = self.own_auth.clone().expect("guarded above");
                Ok(Step::Established(Box::new(Established {
                    peer,
                    peer_auth,
                    own_auth,
                })))
            }
            (state, kind) => Err(HandshakeError::UnexpectedFrame {
                kind,
                state: match state {
                    State::AwaitHello => "waiting for HELLO",
                    State::AwaitAuth { .. } => "waiting for AUTH",
                    State::Done => "the handshake is already complete",
                },
            }),
        }
    }

    fn check_hello(
        &self,
        peer: &Hello,
        now_ms: u64,
        nonces: &mut NonceCache,
    ) -> Result<(), HandshakeError> {
        let ours = (self.local.version_min, self.local.version_max);
        if peer.version_max < ours.0 || peer.version_min > ours.1 {
            return Err(HandshakeError::VersionMismatch {
                ours,
                theirs: (peer.version_min, peer.version_max),
            });
        }
        if peer.bus_id == self.local.bus_id {
            return Err(if peer.incarnation == self.local.incarnation {
                HandshakeError::SelfConnection
            } else {
                HandshakeError::SameBusId(peer.bus_id)
            });
        }
        match (self.secret.is_some(), peer.auth) {
            (true, false) => return Err(HandshakeError::PeerHasNoSecret),
            (false, true) => return Err(HandshakeError::PeerRequiresSecret),
            _ => {}
        }
        if self.secret.is_some() {
            let skew = i128::from(peer.timestamp_ms) - i128::from(now_ms);
            if skew.unsigned_abs() > u128::from(self.clock_skew_max_ms) {
                return Err(HandshakeError::StaleTimestamp {
                    skew_ms: skew,
                    max_ms: self.clock_skew_max_ms,
                });
            }
            if peer.nonce == self.local.nonce {
                return Err(HandshakeError::ReplayedNonce);
            }
            // Remembered only once proven (see `NonceCache`).
            nonces.check(peer.nonce, now_ms)?;
        }
        Ok(())
    }
}

/// A HELLO for this process with the current protocol version; `nonce` and `incarnation` come
/// from the caller's random source.
pub fn local_hello(
    bus_id: BusId,
    incarnation: u64,
    timestamp_ms: u64,
    nonce: [u8; NONCE_LEN],
    listen_addrs: Vec<String>,
) -> Hello {
    Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        auth: false,
        bus_id,
        incarnation,
        timestamp_ms,
        nonce,
        listen_addrs,
        host_id: Vec::new(),
        capabilities: 0,
        downstream_of_you: None,
        frame_body_max: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{FrameDecoder, HANDSHAKE_BODY_LEN_MAX};
    use bytes::BytesMut;

    const NOW: u64 = 1_700_000_000_000;

    fn frame(bytes: &Bytes) -> Frame {
        let mut buf = BytesMut::from(&bytes[..]);
        FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX)
            .decode(&mut buf)
            .unwrap()
            .unwrap()
    }

    fn side(role: Role, id: u64, secret: Option<&str>) -> Handshake {
        let hello = local_hello(
            BusId(id),
            id * 1000,
            NOW,
            [id as u8; NONCE_LEN],
            vec![format!("tcp://127.0.0.1:{id}")],
        );
        Handshake::new(role, hello, secret.map(|s| Secret::new(s).unwrap()))
    }

    /// Runs both sides to completion; returns what each side concluded.
    fn run(
        mut a: Handshake,
        mut b: Handshake,
    ) -> (
        Result<Established, HandshakeError>,
        Result<Established, HandshakeError>,
    ) {
        let (mut na, mut nb) = (NonceCache::default(), NonceCache::default());
        let (ha, hb) = (a.hello_frame(), b.hello_frame());
        let ra = a.handle_frame(&frame(&hb), NOW, &mut na);
        let rb = b.handle_frame(&frame(&ha), NOW, &mut nb);
        let (auth_a, auth_b) = match (ra, rb) {
            (Ok(Step::PeerHello(_)), Ok(Step::PeerHello(_))) => {
                (a.auth_frame(0, 0), b.auth_frame(0, 0))
            }
            (ra, rb) => {
                let err = |r: Result<Step, HandshakeError>| match r {
                    Err(e) => e,
                    Ok(_) => HandshakeError::ClosedByPeer(crate::control::Close {
                        code: crate::control::CloseCode::Other,
                        reason: "the other side failed".into(),
                    }),
                };
                return (Err(err(ra)), Err(err(rb)));
            }
        };
        let fin = |r: Result<Step, HandshakeError>| match r {
            Ok(Step::Established(e)) => Ok(*e),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => Err(e),
        };
        (
            fin(a.handle_frame(&frame(&auth_b), NOW, &mut na)),
            fin(b.handle_frame(&frame(&auth_a), NOW, &mut nb)),
        )
    }

    #[test]
    fn hello_round_trips() {
        let mut h = local_hello(BusId(7), 9, NOW, [3; NONCE_LEN], vec!["unix:///x".into()]);
        h.host_id = b"host".to_vec();
        h.capabilities = caps::RELAY | caps::SHM_BOUND;
        h.downstream_of_you = Some((BusId(7), BusId(9)));
        h.frame_body_max = Some(1 << 20);
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        h.frame_body_max = Some(0);
        let zero = Hello::decode(&h.encode()).unwrap_err().to_string();
        assert!(zero.contains("frame body limit of 0"), "{zero}");
    }

    #[test]
    fn both_sides_agree_with_and_without_a_secret() {
        let (a, b) = run(side(Role::Dialer, 1, None), side(Role::Listener, 2, None));
        assert_eq!(a.unwrap().peer.bus_id, BusId(2));
        assert_eq!(b.unwrap().peer.bus_id, BusId(1));
        let s = Some("0123456789abcdef-secret");
        let (a, b) = run(side(Role::Dialer, 1, s), side(Role::Listener, 2, s));
        assert_eq!(a.unwrap().peer.incarnation, 2000);
        assert_eq!(b.unwrap().peer.incarnation, 1000);
    }

    #[test]
    fn a_wrong_secret_fails_on_both_sides() {
        let (a, b) = run(
            side(Role::Dialer, 1, Some("0123456789abcdef-one")),
            side(Role::Listener, 2, Some("0123456789abcdef-two")),
        );
        assert_eq!(a.unwrap_err(), HandshakeError::BadProof);
        assert_eq!(b.unwrap_err(), HandshakeError::BadProof);
    }

    #[test]
    fn a_missing_secret_is_named() {
        let (a, b) = run(
            side(Role::Dialer, 1, None),
            side(Role::Listener, 2, Some("0123456789abcdef")),
        );
        assert_eq!(a.unwrap_err(), HandshakeError::PeerRequiresSecret);
        assert_eq!(b.unwrap_err(), HandshakeError::PeerHasNoSecret);
    }

    #[test]
    fn stale_timestamps_and_replayed_nonces_are_refused() {
        let secret = Secret::new("0123456789abcdef").unwrap();
        let mut b = side(Role::Listener, 2, Some("0123456789abcdef"));
        let mut old = local_hello(BusId(1), 1, NOW - 60_000, [9; NONCE_LEN], vec![]);
        old.auth = true;
        let err = b
            .handle_frame(
                &frame(&frame_bytes(FrameKind::Hello, &old.encode())),
                NOW,
                &mut NonceCache::default(),
            )
            .unwrap_err();
        assert!(
            matches!(err, HandshakeError::StaleTimestamp { .. }),
            "{err}"
        );

        let mut cache = NonceCache::default();
        let a = Handshake::new(
            Role::Dialer,
            local_hello(BusId(1), 1, NOW, [5; NONCE_LEN], vec![]),
            Some(secret),
        );
        let hello = frame(&a.hello_frame());
        let mut a = a;
        let mut b1 = side(Role::Listener, 2, Some("0123456789abcdef"));
        assert!(b1.handle_frame(&hello, NOW, &mut cache).is_ok());
        // Only a proven handshake is remembered: b1 completes it.
        assert!(a
            .handle_frame(&frame(&b1.hello_frame()), NOW, &mut NonceCache::default())
            .is_ok());
        let auth = frame(&a.auth_frame(0, 0));
        b1.auth_frame(0, 0);
        assert!(matches!(
            b1.handle_frame(&auth, NOW, &mut cache),
            Ok(Step::Established(_))
        ));
        let mut b2 = side(Role::Listener, 2, Some("0123456789abcdef"));
        assert_eq!(
            b2.handle_frame(&hello, NOW + 10, &mut cache).unwrap_err(),
            HandshakeError::ReplayedNonce
        );
    }

    #[test]
    fn hellos_without_the_secret_do_not_fill_the_replay_cache() {
        // A flood of HELLOs claiming a secret, none proven (each on a connection of its own),
        // then an honest handshake: it goes through.
        let mut cache = NonceCache::default();
        for i in 0..(NONCE_CACHE_LEN_MAX as u64 + 100) {
            let mut nonce = [0u8; NONCE_LEN];
            nonce[..8].copy_from_slice(&i.to_le_bytes());
            let mut h = local_hello(BusId(66), i, NOW, nonce, vec![]);
            h.auth = true;
            let mut b = side(Role::Listener, 2, Some("0123456789abcdef"));
            let hello = frame(&frame_bytes(FrameKind::Hello, &h.encode()));
            assert!(b.handle_frame(&hello, NOW, &mut cache).is_ok());
        }
        let secret = Some("0123456789abcdef");
        let mut a = side(Role::Dialer, 1, secret);
        let mut b = side(Role::Listener, 2, secret);
        let mut a_cache = NonceCache::default();
        assert!(a
            .handle_frame(&frame(&b.hello_frame()), NOW, &mut a_cache)
            .is_ok());
        assert!(b
            .handle_frame(&frame(&a.hello_frame()), NOW, &mut cache)
            .is_ok());
        let (auth_a, auth_b) = (frame(&a.auth_frame(0, 0)), frame(&b.auth_frame(0, 0)));
        assert!(matches!(
            b.handle_frame(&auth_a, NOW, &mut cache),
            Ok(Step::Established(_))
        ));
        assert!(matches!(
            a.handle_frame(&auth_b, NOW, &mut a_cache),
            Ok(Step::Established(_))
        ));
    }

    #[test]
    fn self_connection_and_version_mismatch_are_refused() {
        let (a, _) = run(side(Role::Dialer, 1, None), side(Role::Listener, 1, None));
        assert_eq!(a.unwrap_err(), HandshakeError::SelfConnection);
        let twin = Handshake::new(
            Role::Listener,
            local_hello(BusId(1), 77, NOW, [8; NONCE_LEN], vec![]),
            None,
        );
        let (a, _) = run(side(Role::Dialer, 1, None), twin);
        assert_eq!(a.unwrap_err(), HandshakeError::SameBusId(BusId(1)));
        let mut b = side(Role::Listener, 2, None);
        let mut h = local_hello(BusId(1), 1, NOW, [1; NONCE_LEN], vec![]);
        // A node of protocol v1 (before ROUTED frames were checked in two parts).
        h.version_min = 1;
        h.version_max = 1;
        let err = b
            .handle_frame(
                &frame(&frame_bytes(FrameKind::Hello, &h.encode())),
                NOW,
                &mut NonceCache::default(),
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "no common protocol version: we speak 2..=2, the peer 1..=1"
        );
    }

    #[test]
    fn out_of_order_frames_are_refused() {
        let mut b = side(Role::Listener, 2, None);
        let auth = frame_bytes(FrameKind::Auth, &[0; 17]);
        let err = b
            .handle_frame(&frame(&auth), NOW, &mut NonceCache::default())
            .unwrap_err();
        assert!(matches!(err, HandshakeError::UnexpectedFrame { .. }));
    }

    #[test]
    fn truncated_hellos_are_malformed_not_panics() {
        let body = local_hello(BusId(1), 1, NOW, [1; NONCE_LEN], vec!["tcp://x".into()]).encode();
        for cut in 0..body.len() {
            let _ = Hello::decode(&body[..cut]);
        }
        assert!(Hello::decode(&body[..10]).is_err());
    }

    #[test]
    fn short_secrets_are_refused() {
        assert!(Secret::new("short").unwrap_err().contains("at least 16"));
    }
}
