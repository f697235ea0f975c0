//! Every limit of the runtime, with its unit. Limits a user may change are defaults of
//! [`crate::NodeConfig`] (`DEFAULT_*`); the public ones besides are those the API's contract
//! names (the smallest frame limit a config may set, the calls a node keeps pending, the events
//! it queues, the handshakes it takes at once, the drain's quiet period, the waits of a publish
//! for a slow member). The rest is internal tuning, crate-private, and may change in any
//! release.

/// Default bytes one peer's send queue may hold (frames waiting plus frames being written). A
/// full queue makes `try_send` return `Full` and `send` wait.
pub const DEFAULT_SEND_QUEUE_BYTES_MAX: usize = 8 << 20;
/// Default bytes of received messages waiting for the application. When it is full, links stop
/// reading (the kernel's flow control then slows the senders); nothing is dropped.
pub const DEFAULT_INBOX_BYTES_MAX: usize = 32 << 20;
/// Smallest room a reader offers to one `read` call once its link was busy, in bytes (libevent
/// lost 70% reading 4 KiB).
pub(crate) const READ_CHUNK_MIN_BYTES: usize = 64 << 10;
/// Room a new link's reader offers to its first reads, in bytes: enough for a handshake and
/// heartbeats, so an idle connection holds no large buffer; reads that come back full double it
/// toward `READ_CHUNK_MAX_BYTES` (a busy link gets there within a few reads).
pub(crate) const READ_CHUNK_FIRST_BYTES: usize = 2 << 10;
/// Largest room a reader offers to one `read` call, in bytes: reads grow toward it while they
/// come back full (a busy link), and shrink back when they do not.
pub(crate) const READ_CHUNK_MAX_BYTES: usize = 1 << 20;
/// A read under this many bytes that drained the socket marks a link as idle or trading small
/// messages: it waits for its next bytes holding no buffer (a fresh one takes them).
pub(crate) const IDLE_READ_BYTES: usize = 256;
/// Parts a link's writer keeps room for while it waits for more to write; a list grown
/// larger by a burst is given back.
pub(crate) const WRITE_BATCH_IDLE_PARTS: usize = 4;
pub use busway_core::outbox::COPY_PAYLOAD_BYTES_MAX;
/// Most buffers handed to one `writev` call.
pub(crate) const WRITEV_SEGMENTS_MAX: usize = 64;
/// Default time a handshake may take, in milliseconds.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// Default time a closing link waits for the peer to finish, in milliseconds.
pub const DEFAULT_LINGER_MS: u64 = 30_000;
/// How long `Node::drain` waits with no member asking a publisher for copies (and the links
/// to members as they were) before it calls the publisher's work done, in milliseconds: a
/// member that lost publishes with a relay learns it from the next publish or from the tail
/// mark that follows the last (`GROUP_TAIL_MARK_MS`), and asks at once.
pub const DRAIN_QUIET_MS: u64 = 2_000;
/// How long `Node::drain` waits at most for links to members to come back (a relay that
/// restarts, an upstream redialed) before its quiet period, in milliseconds: only once such
/// a link is back can the members behind it learn what they lost.
pub const DRAIN_LINKS_BACK_MS: u64 = 10_000;
/// How often `Node::drain` looks at the links to members while it waits for them, in
/// milliseconds.
pub(crate) const DRAIN_LINKS_POLL_MS: u64 = 10;
/// Default first delay between two dial attempts, in milliseconds.
pub const DIAL_BACKOFF_MIN_MS: u64 = 50;
/// Default largest delay between two dial attempts, in milliseconds.
pub const DIAL_BACKOFF_MAX_MS: u64 = 5_000;
/// Default interval between two PINGs on an idle or busy link, in milliseconds.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 1_000;
/// Heartbeat intervals without any byte from the peer before its link is declared down.
pub const HEARTBEAT_MISSES_MAX: u64 = 3;
/// Default time a peer may stay down before busway gives up on the messages it holds for it,
/// in milliseconds.
pub const DEFAULT_PEER_DEAD_AFTER_MS: u64 = 30_000;
/// Default `NodeConfig::forget_after_ms`: how long a node keeps a dead peer or a silent relayed
/// source (and twice that an idle relayed destination) before it forgets it, in milliseconds.
pub const DEFAULT_FORGET_AFTER_MS: u64 = 600_000;
/// How often a node looks for state to forget, in milliseconds.
pub(crate) const FORGET_SWEEP_INTERVAL_MS: u64 = 1_000;
/// How often the node's timer runs its periodic work (relayed destinations looked at,
/// registrations, group and multicast timers; `node::timer`), in milliseconds.
pub(crate) const TIMER_TICK_MS: u64 = 100;
/// Time without an end-to-end acknowledgement after which relayed messages held are written
/// again, in milliseconds.
pub(crate) const ROUTED_RESEND_AFTER_MS: u64 = 1_000;
/// Bytes of ROUTED frames a node queues toward one neighbor on behalf of others; past it, it
/// reports the destination congested to the source (which retries) instead of queueing more.
pub(crate) const FORWARD_QUEUE_BYTES_MAX: usize = 4 << 20;
/// Most bytes a node writes toward one destination it reaches through relays ahead of that
/// destination's acknowledgements: what a destination that does not read can hold on its way
/// (half a relay's queue toward it), so that it fills no relay's queue and slows no other
/// destination on the same path; its sender's `send` waits instead.
pub(crate) const RELAYED_WINDOW_BYTES: usize = FORWARD_QUEUE_BYTES_MAX / 2;
/// Longest a relay waits for room toward the next hop before it reports congestion, in
/// milliseconds; meanwhile it does not read from the link the frame came from (TCP then slows
/// the sender), which keeps relayed traffic lossless in the common case.
pub(crate) const FORWARD_WAIT_MS: u64 = 200;
/// Longest a downstream's new link waits, before it is read, for the upstream to answer the
/// registration of its range, in milliseconds (see `registrations`); past it the link is
/// read, and what it sends up in the meantime waits or is reported, as for a range refused.
pub(crate) const REGISTER_WAIT_MS: u64 = 1_000;
/// Room a relayed message leaves in a frame for the ROUTED header and a full route, in bytes.
pub(crate) const ROUTED_OVERHEAD_BYTES_MAX: usize = 1024;
/// Smallest `NodeConfig::frame_body_max`, in bytes: a relayed chunk of small messages (up to
/// `CHUNK_OF_COPIES_BYTES_MAX`) travels as one ROUTED frame, and every node must take one, so
/// that only single messages larger than a node accepts are refused on their way.
pub const FRAME_BODY_MIN_BYTES: usize =
    busway_core::outbox::CHUNK_OF_COPIES_BYTES_MAX + ROUTED_OVERHEAD_BYTES_MAX;
const _: () = assert!(FRAME_BODY_MIN_BYTES <= busway_core::frame::DEFAULT_BODY_LEN_MAX);
const _: () = assert!(
    busway_core::routed::ROUTED_FIXED_LEN + 8 * busway_core::routed::ROUTE_LEN_MAX + 2 * 8
        <= ROUTED_OVERHEAD_BYTES_MAX
);
/// Default time after its start during which a relay treats unknown ids as not registered
/// yet, in milliseconds: the longest redial delay, and a second for the handshake.
pub const DEFAULT_RELAY_GRACE_MS: u64 = DIAL_BACKOFF_MAX_MS + 1_000;
/// Default most connections a node keeps open (accepted and dialed); past it, accepted ones
/// are refused at once with a CLOSE that says why.
pub const DEFAULT_CONNECTIONS_MAX: usize = 16_384;
/// Most accepted connections in their handshake at once; past it, new ones are refused at once
/// (a flood of strangers cannot hold the node's memory while honest peers wait).
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 256;
/// Events that may wait for the application; past it events are dropped and counted in
/// `Stats::events_dropped` (the node never blocks on a slow event reader).
pub const EVENT_QUEUE_LEN_MAX: usize = 4_096;

const _: () = assert!(READ_CHUNK_MIN_BYTES <= READ_CHUNK_MAX_BYTES);
const _: () = assert!(READ_CHUNK_FIRST_BYTES <= READ_CHUNK_MIN_BYTES);
const _: () = assert!(DIAL_BACKOFF_MIN_MS <= DIAL_BACKOFF_MAX_MS);
const _: () = assert!(busway_core::frame::DEFAULT_BODY_LEN_MAX <= DEFAULT_SEND_QUEUE_BYTES_MAX);
const _: () = assert!(busway_core::frame::DEFAULT_BODY_LEN_MAX <= DEFAULT_INBOX_BYTES_MAX);

/// Times `try_send` routes again when the route changes under it (a direct link replacing
/// relays) before it reports `Full`.
pub(crate) const REROUTES_MAX: u32 = 4;

/// Largest record the writer puts in a shared-memory ring, in bytes: frames are cut into
/// records of at most this (the reader reassembles the byte stream).
pub const RING_RECORD_BYTES_MAX: usize = 64 << 10;
/// Pieces (frame headers, payloads, chunks of frames) gathered into one ring record at most:
/// bounds the gather list, which lives on the stack.
pub(crate) const RING_RECORD_PARTS_MAX: usize = 64;
/// Records the application reads from a ring into one batch (each at most
/// `RING_RECORD_BYTES_MAX`): bounds a batch at 1 MiB.
pub(crate) const RING_READ_RECORDS_MAX: usize = 16;
/// Bytes one read of a peer's group log copies out at most (at least one record of any size
/// is read): the publishes of one batch for the node. Small enough that the read's copy, its
/// record heads and its spans stay in the core's caches: at 256 KiB a member that fell behind
/// copied and decoded a quarter of a MiB per read, and 100 members on one thread delivered
/// 20-35 % fewer publishes per second (`bench --broadcast`, docs/BENCHMARKS.md).
pub(crate) const GROUP_LOG_READ_BYTES_MAX: usize = 32 << 10;
/// Bytes of ring messages delivered after which the receiver acknowledges at once; below it,
/// it acknowledges `RING_ACK_DELAY_MS` after the first unacknowledged read. Well below the
/// default send queue, so a sender never waits on a late acknowledgement.
pub(crate) const RING_ACK_EVERY_BYTES: usize = 1 << 20;
/// Longest a receiver delays the acknowledgement of ring messages, in milliseconds (one ACK per
/// delay rather than one per read keeps the link's I/O thread asleep in a round trip).
pub(crate) const RING_ACK_DELAY_MS: u64 = 1;
/// Longest a ring's waiter thread sleeps before it looks whether its ring is still wanted, in
/// milliseconds (the futex wake-up does not depend on it).
pub(crate) const RING_WAIT_POLL_MS: u64 = 100;
/// How often a link with a ring, while this node has calls pending, looks whether the
/// application left the ring unread (then the link takes the replies out itself), in ms.
pub(crate) const RING_REPLY_WATCH_MS: u64 = 1;
/// How often a link with a ring, while this node has no call pending and no part in a group,
/// looks whether the application left the ring unread (a group message from the peer is then
/// acted on by the link), in ms.
pub(crate) const RING_IDLE_WATCH_MS: u64 = 100;
/// Bytes of other messages a link may hold for the application while it takes replies out of
/// a ring the application does not read; past it, it stops (the peer's writer then waits,
/// and calls wait for the application or their timeout).
pub(crate) const RING_STASH_BYTES_MAX: usize = 4 << 20;
/// Milliseconds a link's writer holding only an acknowledgement (no message of its own) waits,
/// at most, for the application's next look at its inbox, so that the application's answer
/// goes in the same write (see `link::write`). An application that looks at its inbox in the
/// meantime, as one waiting for messages does, ends the wait at once.
pub(crate) const ACK_WAIT_MS_MAX: u64 = 1;
/// Turns of the runtime (`yield_now`, a few microseconds each) that wait comes in first, with
/// no timer armed: an application on the link's own thread looks in one.
pub(crate) const ACK_WAIT_TURNS: usize = 2;
/// Bytes of single sends (`Node::send`, `try_send`) to a peer reached through a ring that may
/// wait unpublished for the sender's next look at its inbox, a flush, or the link's writer;
/// the send that reaches it publishes them all at once.
pub(crate) const RING_DEFER_BYTES_MAX: usize = 64 << 10;
/// How often a link whose peer closed looks whether the application read its ring out, in
/// milliseconds (before it answers the CLOSE).
pub(crate) const RING_DRAIN_POLL_MS: u64 = 5;
const _: () = assert!(RING_ACK_EVERY_BYTES < DEFAULT_SEND_QUEUE_BYTES_MAX / 4);
/// Calls one node may have pending at once (`Node::call`): past it a call waits for one to
/// end, or fails at once with `CallError::TooManyPending` if its caller chose so.
pub const CALLS_PENDING_MAX: usize = 65_536;

/// Groups a node may join at once; `Node::join` past it fails.
pub use busway_core::group::state::GROUPS_JOINED_MAX;
/// Default `NodeConfig::group_retain_bytes`: bytes of recent publishes a publisher keeps per
/// group for members' repairs (four send queues' worth: what a relay or two can die with).
pub const DEFAULT_GROUP_RETAIN_BYTES: usize = 4 * DEFAULT_SEND_QUEUE_BYTES_MAX;
/// How long a publish waits for room on a link to members of a group under
/// `GroupPolicy::CutOff` before it skips that link (and later publishes skip it at once
/// while it stays full), in milliseconds.
pub const GROUP_SLOW_MEMBER_WAIT_MS: u64 = 1_000;
/// The same wait toward a hop that passes the group on (this node's upstream, or a
/// downstream that registered ids besides its own), in milliseconds: longer than a member's,
/// so that the hop nearest a slow member gives up on it first and the hops above see that
/// hop catch up, rather than each cutting the whole subtree below it.
pub const GROUP_HOP_WAIT_MS: u64 = 3 * GROUP_SLOW_MEMBER_WAIT_MS;
