//! One process of a `busway bench --broadcast` run (this binary's hidden
//! `bench-broadcast-worker`): the publisher, the members (every member node of the row in this
//! one process, on one thread), the relay between them, or publisher and members together (the
//! `mem` row, linked by in-process channels).
//!
//! A run has two phases on the same nodes and links: the publisher publishes to the group
//! (`group`), then sends each message to every member with one unicast `send` each
//! (`unicast`, the baseline). Each message carries an 8-byte tag: its number in the phase
//! (from 1) and its kind (data, probe, end). Before a phase the publisher sends probes until
//! every member has seen one (so every member's interest or route is in place); it keeps at
//! most a window of messages ahead of the slowest member, which reports its progress (the
//! member completing a milestone tells the publisher); it ends the phase with an END naming
//! how many it sent. Every member checks that it got each message once, in order, and all of
//! them: anything else fails the run. The publisher reads the bytes queued on each of its
//! links (`PeerInfo::bytes_sent`), and on each of the relay's (a call to the relay), and
//! what it wrote into its group log (`Stats::group_log_bytes`: the members on its host read
//! the log, one record per publish for all of them), at the start and end of each phase.

use super::sysinfo;
use busway::{Addr, BusId, IoThreads, MessageBatch, Node, NodeConfig};
use bytes::{BufMut, Bytes, BytesMut};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The group of the benchmark.
pub(crate) const GROUP: &str = "bench";
const PUBLISHER_ID: BusId = BusId(1);
const RELAY_ID: BusId = BusId(100);
/// The first member's id; members are numbered up from it.
const MEMBER_ID_FIRST: u64 = 1000;
/// Bytes of the tag at the start of every payload (see the module doc).
pub(crate) const TAG_BYTES: usize = 8;
/// The tag's kind, in its top byte; its number is in the low 56 bits.
const KIND_SHIFT: u32 = 56;
const NUMBER_MASK: u64 = (1 << KIND_SHIFT) - 1;
const KIND_DATA: u64 = 0;
const KIND_PROBE: u64 = 1;
const KIND_END: u64 = 2;
/// What members tell the publisher (first 8 bytes of a 16-byte message; the phase or the
/// number reached follows).
const SAY_READY: u64 = 1;
const SAY_CREDIT: u64 = 2;
const SAY_DONE: u64 = 3;
/// The phases of a run: publishes to the group, then as many unicast sends.
const PHASES: usize = 2;
const PHASE_GROUP: usize = 0;
const PHASE_UNICAST: usize = 1;
/// Bytes of messages (payload and about 64 bytes of framing each) the publisher keeps ahead
/// of the slowest member: far below a relay's queue toward one member
/// (`NodeConfig::send_queue_bytes_max`), which never waits and would drop past it.
const WINDOW_BYTES: usize = 256 << 10;
/// Framing counted per message when the window is sized, in bytes.
const WINDOW_FRAMING_BYTES: usize = 64;
/// Fewest and most messages in the window.
const WINDOW_MSGS_MIN: u64 = 16;
const WINDOW_MSGS_MAX: u64 = 4096;
/// Milestones per window: a member reports progress every window/this messages.
const MILESTONES_PER_WINDOW: u64 = 4;
/// Counters of milestones in use at once (more than the milestones in a window, so a slot is
/// free again before it is reused).
const MILESTONE_SLOTS: usize = 8;
const _: () = assert!(MILESTONE_SLOTS as u64 > MILESTONES_PER_WINDOW);
/// Bytes of payloads the publisher writes into one buffer before it takes a fresh one.
const PAYLOAD_ARENA_BYTES: usize = 1 << 20;
/// Bytes the publisher queues (over all links) before it lets its links' writers run.
const YIELD_EVERY_BYTES: usize = 256 << 10;
/// Each shared-memory ring's size for this bench, in bytes: a thousand members' rings fit
/// in memory (two per link).
const SHM_RING_BYTES: usize = 256 << 10;
/// Member nodes started at once (each then waits for its link).
const START_BATCH: usize = 50;
/// How long a member waits for its link to come up.
const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// How long the publisher waits for every member to have seen a probe.
const READY_WAIT: Duration = Duration::from_secs(120);
/// Interval between probes while the publisher waits, in milliseconds.
const PROBE_EVERY_MS: u64 = 20;
/// How long the publisher waits for the slowest member's progress, or for the end of a
/// phase, before the run fails.
const STALL_WAIT: Duration = Duration::from_secs(30);
/// How long a call to the relay (for its links' byte counts) may take.
const CALL_WAIT: Duration = Duration::from_secs(10);
/// How long the member that sent the last word waits for it to be acknowledged.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum Role {
    Publisher,
    Members,
    Relay,
    /// Publisher and members in this one process, on two threads (the `mem` row).
    All,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct BroadcastWorkerArgs {
    #[arg(value_enum)]
    role: Role,
    /// Where the publisher (or the relay) listens; where members (and, via a relay, the
    /// publisher) dial.
    #[arg(long)]
    addr: Addr,
    /// Members of the group.
    #[arg(long, default_value_t = 1)]
    receivers: usize,
    /// Bytes of each payload (at least the tag's 8).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Seconds the publisher publishes, per phase.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Links move to shared-memory rings (or in-process channels).
    #[arg(long)]
    shm: bool,
    /// Publisher and members register below the relay at `addr`.
    #[arg(long)]
    via_relay: bool,
    /// Group logs off: members get publishes by their links.
    #[arg(long)]
    no_group_logs: bool,
}

/// What the publisher measured in one phase.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct PublisherPhase {
    /// Data messages published (or sent to each member).
    pub(crate) publishes: u64,
    pub(crate) secs: f64,
    /// The most bytes queued on any one link during the phase (the publisher's, and the
    /// relay's), and which (`from->to`).
    pub(crate) link_bytes_max: u64,
    pub(crate) busiest_link: String,
}

/// What the members measured in one phase.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct MembersPhase {
    /// Data messages received, over all members.
    pub(crate) deliveries: u64,
    /// From the first delivery at any member to the last at any member.
    pub(crate) secs: f64,
}

/// A broadcast worker's report (one JSON line on its stdout).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct BroadcastReport {
    pub(crate) publisher: Option<[PublisherPhase; PHASES]>,
    pub(crate) members: Option<[MembersPhase; PHASES]>,
    pub(crate) cpu_secs: f64,
    pub(crate) peak_rss_kib: u64,
}

pub(crate) fn run(args: BroadcastWorkerArgs) -> Result<ExitCode, String> {
    if args.size < TAG_BYTES || args.receivers == 0 {
        return Err(format!(
            "--size must be at least {TAG_BYTES} and --receivers at least 1"
        ));
    }
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    let mut report = match args.role {
        Role::Publisher => BroadcastReport {
            publisher: Some(runtime()?.block_on(publisher(&args, announce))?),
            ..Default::default()
        },
        Role::Members => BroadcastReport {
            members: Some(runtime()?.block_on(members(&args, || announce("members".into())))?),
            ..Default::default()
        },
        Role::Relay => {
            runtime()?.block_on(relay(&args))?;
            return Ok(ExitCode::SUCCESS);
        }
        Role::All => {
            let (addr_tx, addr_rx) = std::sync::mpsc::channel::<String>();
            let pub_args = args.clone();
            let publishing = std::thread::spawn(move || {
                runtime()?.block_on(publisher(&pub_args, move |a| {
                    let _ = addr_tx.send(a);
                }))
            });
            let addr = addr_rx
                .recv()
                .map_err(|_| "the publisher did not start".to_string())?;
            let member_args = BroadcastWorkerArgs {
                addr: addr
                    .parse()
                    .map_err(|e: busway::ParseAddrError| e.to_string())?,
                ..args.clone()
            };
            let got = runtime()?.block_on(members(&member_args, || {}))?;
            let sent = publishing
                .join()
                .map_err(|_| "the publishing thread panicked".to_string())??;
            BroadcastReport {
                publisher: Some(sent),
                members: Some(got),
                ..Default::default()
            }
        }
    };
    report.cpu_secs = sysinfo::cpu_seconds();
    report.peak_rss_kib = sysinfo::peak_rss_kib();
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

fn announce(addr: String) {
    println!("ready {addr}");
    let _ = std::io::stdout().flush();
}

fn config(args: &BroadcastWorkerArgs, id: BusId) -> NodeConfig {
    let mut c = NodeConfig::new(id);
    c.io_threads = IoThreads::Current;
    c.shm_channels = args.shm;
    c.shm_ring_bytes = SHM_RING_BYTES;
    c.group_logs = !args.no_group_logs;
    // Many readers share one thread: none may spin on its rings while others wait.
    c.shm_spins = 0;
    if args.via_relay && id != RELAY_ID {
        // The relayed row measures the relay: no direct link may replace it.
        c.direct_links = false;
        c = c.upstream(args.addr.clone());
    }
    c
}

/// Messages kept ahead of the slowest member.
fn window(size: usize) -> u64 {
    ((WINDOW_BYTES / (size + WINDOW_FRAMING_BYTES)) as u64).clamp(WINDOW_MSGS_MIN, WINDOW_MSGS_MAX)
}

/// Messages between two progress reports of the members.
fn milestone(size: usize) -> u64 {
    (window(size) / MILESTONES_PER_WINDOW).max(1)
}

fn tag(kind: u64, number: u64) -> u64 {
    kind << KIND_SHIFT | number
}

fn word(p: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(p.get(at..at + 8)?.try_into().ok()?))
}

/// What the members told the publisher.
#[derive(Default)]
struct Heard {
    ready: [AtomicBool; PHASES],
    done: [AtomicBool; PHASES],
    /// Every member got every message up to this number (per phase).
    credited: [AtomicU64; PHASES],
    changed: Notify,
}

impl Heard {
    fn take(&self, p: &[u8]) {
        let (Some(say), Some(value)) = (word(p, 0), word(p, 8)) else {
            return;
        };
        match say {
            SAY_READY if (value as usize) < PHASES => {
                self.ready[value as usize].store(true, Relaxed)
            }
            SAY_DONE if (value as usize) < PHASES => self.done[value as usize].store(true, Relaxed),
            SAY_CREDIT => {
                let phase = (value >> KIND_SHIFT) as usize;
                if phase < PHASES {
                    self.credited[phase].fetch_max(value & NUMBER_MASK, Relaxed);
                }
            }
            _ => {}
        }
        self.changed.notify_waiters();
    }

    /// Waits until `cond` holds, at most `wait`; true if it does.
    async fn until(&self, wait: Duration, cond: impl Fn() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if cond() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return cond();
            }
        }
    }
}

/// Payloads of `size` bytes with their tag, cut from a shared buffer.
struct Payloads {
    arena: BytesMut,
    size: usize,
}

impl Payloads {
    fn next(&mut self, tag: u64) -> Bytes {
        if self.arena.capacity() < self.size {
            self.arena = BytesMut::with_capacity(PAYLOAD_ARENA_BYTES.max(self.size));
        }
        self.arena.put_u64_le(tag);
        self.arena.put_bytes(0x5A, self.size - TAG_BYTES);
        self.arena.split().freeze()
    }
}

/// The publisher: listens (or registers below the relay), runs both phases, reports.
async fn publisher(
    args: &BroadcastWorkerArgs,
    ready: impl FnOnce(String),
) -> Result<[PublisherPhase; PHASES], String> {
    let mut c = config(args, PUBLISHER_ID);
    if !args.via_relay {
        c = c.listen(args.addr.clone());
    }
    let node = Node::start(c).await.map_err(|e| e.to_string())?;
    if args.via_relay {
        if !node.wait_for_peer(RELAY_ID, CONNECT_WAIT).await {
            return Err(format!("no link came up to the relay at {}", args.addr));
        }
        ready("registered".into());
    } else {
        ready(node.listen_addrs()[0].to_string());
    }
    let heard = Arc::new(Heard::default());
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let listening = heard.clone();
    let reader = tokio::spawn(async move {
        while let Some(b) = inbox.recv_batch().await {
            b.iter().for_each(|p| listening.take(p));
        }
    });
    let members: Vec<BusId> = (0..args.receivers as u64)
        .map(|i| BusId(MEMBER_ID_FIRST + i))
        .collect();
    let mut out: [PublisherPhase; PHASES] = Default::default();
    let result = async {
        for (phase, figures) in out.iter_mut().enumerate() {
            *figures = publish_phase(args, &node, &heard, &members, phase).await?;
        }
        Ok::<(), String>(())
    }
    .await;
    reader.abort();
    node.shutdown().await;
    result.map(|()| out)
}

/// Sends one message of `phase`: a publish to the group, or one send to each member.
/// Returns the bytes queued (at least the payload's, per link).
async fn send_one(
    node: &Node,
    phase: usize,
    members: &[BusId],
    payload: Bytes,
) -> Result<usize, String> {
    if phase == PHASE_GROUP {
        let links = node
            .publish(GROUP, payload.clone())
            .await
            .map_err(|e| e.to_string())?;
        return Ok(links * payload.len());
    }
    for &m in members {
        node.send(m, payload.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(members.len() * payload.len())
}

/// Bytes queued so far on each link the publisher sees: its own (`from` the publisher) and,
/// through a relay, the relay's.
async fn link_bytes(node: &Node, via_relay: bool) -> Result<HashMap<String, u64>, String> {
    let mut out: HashMap<String, u64> = node
        .peers()
        .iter()
        .map(|p| (format!("{PUBLISHER_ID}->{}", p.id), p.bytes_sent))
        .collect();
    // The publisher's group logs: one record per publish read by every member on its host,
    // counted as one more link.
    out.insert(format!("{PUBLISHER_ID}->log"), node.stats().group_log_bytes);
    if via_relay {
        let reply = node
            .call(RELAY_ID, Bytes::from_static(b"bytes"), CALL_WAIT)
            .await
            .map_err(|e| format!("asking the relay for its byte counts: {e}"))?;
        let theirs: Vec<(u64, u64)> = serde_json::from_slice(&reply.payload)
            .map_err(|e| format!("the relay's byte counts: {e}"))?;
        out.extend(
            theirs
                .into_iter()
                .map(|(id, n)| (format!("{RELAY_ID}->{id}"), n)),
        );
    }
    Ok(out)
}

async fn publish_phase(
    args: &BroadcastWorkerArgs,
    node: &Node,
    heard: &Heard,
    members: &[BusId],
    phase: usize,
) -> Result<PublisherPhase, String> {
    let mut payloads = Payloads {
        arena: BytesMut::new(),
        size: args.size,
    };
    // Probes until every member saw one: from then on each is reached.
    let probing = async {
        while !heard.ready[phase].load(Relaxed) {
            // A member not yet linked (or not yet known to the relay) misses it: fine.
            let _ = send_one(node, phase, members, payloads.next(tag(KIND_PROBE, 0))).await;
            heard
                .until(Duration::from_millis(PROBE_EVERY_MS), || {
                    heard.ready[phase].load(Relaxed)
                })
                .await;
        }
    };
    if tokio::time::timeout(READY_WAIT, probing).await.is_err() {
        return Err(format!(
            "not every member saw a probe within {READY_WAIT:?} (phase {phase})"
        ));
    }
    let before = link_bytes(node, args.via_relay).await?;
    let window = window(args.size);
    let until = Duration::from_secs_f64(args.duration);
    let (mut number, mut since_yield) = (0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < until {
        if number - heard.credited[phase].load(Relaxed) >= window {
            let caught_up = heard
                .until(STALL_WAIT, || {
                    number - heard.credited[phase].load(Relaxed) < window
                })
                .await;
            if !caught_up {
                return Err(format!(
                    "the members fell {window} messages behind for {STALL_WAIT:?} (phase {phase})"
                ));
            }
        }
        number += 1;
        since_yield +=
            send_one(node, phase, members, payloads.next(tag(KIND_DATA, number))).await?;
        if since_yield >= YIELD_EVERY_BYTES {
            since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
    send_one(node, phase, members, payloads.next(tag(KIND_END, number))).await?;
    if !heard
        .until(STALL_WAIT, || heard.done[phase].load(Relaxed))
        .await
    {
        return Err(format!(
            "the members did not all get the end of phase {phase} within {STALL_WAIT:?}"
        ));
    }
    let secs = start.elapsed().as_secs_f64();
    let after = link_bytes(node, args.via_relay).await?;
    let (busiest_link, link_bytes_max) = after
        .iter()
        .map(|(link, n)| (link.clone(), n - before.get(link).copied().unwrap_or(0)))
        .max_by_key(|(_, n)| *n)
        .unwrap_or_default();
    Ok(PublisherPhase {
        publishes: number,
        secs,
        link_bytes_max,
        busiest_link,
    })
}

/// The relay between publisher and members: answers the publisher's calls with the bytes
/// queued on each of its links; runs until killed.
async fn relay(args: &BroadcastWorkerArgs) -> Result<(), String> {
    let node = Node::start(config(args, RELAY_ID).listen(args.addr.clone()))
        .await
        .map_err(|e| e.to_string())?;
    announce(node.listen_addrs()[0].to_string());
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    while let Some(m) = inbox.recv().await {
        if m.request.is_some() {
            let counts: Vec<(u64, u64)> = node
                .peers()
                .iter()
                .map(|p| (p.id.0, p.bytes_sent))
                .collect();
            let body = serde_json::to_vec(&counts).map_err(|e| e.to_string())?;
            m.reply(Bytes::from(body))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// What the members share: who saw a probe, who reached which milestone, who got the end.
struct Tally {
    members: usize,
    milestone: u64,
    ready: [AtomicUsize; PHASES],
    done: [AtomicUsize; PHASES],
    /// Members that reached milestone m of the current phase, in slot m % MILESTONE_SLOTS.
    reached: [AtomicUsize; MILESTONE_SLOTS],
}

impl Tally {
    /// One more member got there; true for the last one (who tells the publisher).
    fn arrive(counter: &AtomicUsize, members: usize) -> bool {
        counter.fetch_add(1, Relaxed) + 1 == members
    }
}

/// What one member saw of one phase.
#[derive(Default, Clone, Copy)]
struct Seen {
    last: u64,
    probed: bool,
    done: bool,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

/// One member: reads its inbox until both phases ended, checking every message.
async fn member(node: Node, tally: Arc<Tally>) -> Result<[Seen; PHASES], String> {
    let id = node.id();
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let mut seen = [Seen::default(); PHASES];
    let say = |what: u64, value: u64| {
        let mut b = BytesMut::with_capacity(16);
        b.put_u64_le(what);
        b.put_u64_le(value);
        b.freeze()
    };
    while !seen.iter().all(|s| s.done) {
        let Some(batch) = inbox.recv_batch().await else {
            return Err(format!("member {id}: the node closed"));
        };
        let phase = if batch.group().is_some() {
            PHASE_GROUP
        } else {
            PHASE_UNICAST
        };
        let mut words = Vec::new();
        check_batch(&batch, &mut seen[phase], &tally, phase, &mut words)
            .map_err(|e| format!("member {id}, phase {phase}: {e}"))?;
        for (what, value) in words {
            node.send(PUBLISHER_ID, say(what, value))
                .await
                .map_err(|e| format!("member {id}: {e}"))?;
            if what == SAY_DONE && !node.flush(FLUSH_WAIT).await {
                return Err(format!("member {id}: its last word was not acknowledged"));
            }
        }
    }
    Ok(seen)
}

/// Checks a batch of one phase's messages; `words` gets what this member must tell the
/// publisher.
fn check_batch(
    batch: &MessageBatch,
    seen: &mut Seen,
    tally: &Tally,
    phase: usize,
    words: &mut Vec<(u64, u64)>,
) -> Result<(), String> {
    if batch.src() != PUBLISHER_ID {
        return Err(format!("a message from {}", batch.src()));
    }
    let mut data = false;
    for p in batch.iter() {
        let t = word(p, 0).ok_or("a message shorter than its tag")?;
        let (kind, number) = (t >> KIND_SHIFT, t & NUMBER_MASK);
        if seen.done {
            return Err(format!(
                "a message after the end (kind {kind}, number {number})"
            ));
        }
        match kind {
            KIND_PROBE => {
                if seen.last > 0 {
                    return Err("a probe after the data".into());
                }
                if !std::mem::replace(&mut seen.probed, true)
                    && Tally::arrive(&tally.ready[phase], tally.members)
                {
                    words.push((SAY_READY, phase as u64));
                }
            }
            KIND_DATA => {
                if number != seen.last + 1 {
                    return Err(format!(
                        "message {number} after {} (lost, repeated or out of order)",
                        seen.last
                    ));
                }
                seen.last = number;
                data = true;
                if number % tally.milestone == 0 {
                    let slot =
                        &tally.reached[(number / tally.milestone) as usize % MILESTONE_SLOTS];
                    if Tally::arrive(slot, tally.members) {
                        // Every member is past it: the slot is free for a later milestone.
                        slot.store(0, Relaxed);
                        words.push((SAY_CREDIT, (phase as u64) << KIND_SHIFT | number));
                    }
                }
            }
            KIND_END => {
                if number != seen.last {
                    return Err(format!(
                        "the end says {number} were sent, {} arrived",
                        seen.last
                    ));
                }
                seen.done = true;
                if Tally::arrive(&tally.done[phase], tally.members) {
                    words.push((SAY_DONE, phase as u64));
                }
            }
            _ => return Err(format!("a message of unknown kind {kind}")),
        }
    }
    if data {
        let now = Instant::now();
        seen.first_at.get_or_insert(now);
        seen.last_at = Some(now);
    }
    Ok(())
}

/// The members: `--receivers` nodes linked to the publisher (or below the relay), each a
/// member of the group, on this thread; `ready` is called once all are linked and joined.
async fn members(
    args: &BroadcastWorkerArgs,
    ready: impl FnOnce(),
) -> Result<[MembersPhase; PHASES], String> {
    let tally = Arc::new(Tally {
        members: args.receivers,
        milestone: milestone(args.size),
        ready: Default::default(),
        done: Default::default(),
        reached: Default::default(),
    });
    let ids: Vec<BusId> = (0..args.receivers as u64)
        .map(|i| BusId(MEMBER_ID_FIRST + i))
        .collect();
    // Each member reads its inbox from the moment it is up: a node left unread makes its
    // link tasks look at its rings for it.
    let mut running = tokio::task::JoinSet::new();
    for batch in ids.chunks(START_BATCH) {
        let mut starting = tokio::task::JoinSet::new();
        for &id in batch {
            let mut c = config(args, id);
            if !args.via_relay {
                c = c.connect(args.addr.clone());
            }
            let via_relay = args.via_relay;
            starting.spawn(async move {
                let node = Node::start(c).await.map_err(|e| e.to_string())?;
                let up = if via_relay {
                    node.wait_for_any_link(CONNECT_WAIT).await
                } else {
                    node.wait_for_peer(PUBLISHER_ID, CONNECT_WAIT).await
                };
                if !up {
                    return Err(format!("member {id}: no link came up"));
                }
                node.join(GROUP).map_err(|e| e.to_string())?;
                Ok::<Node, String>(node)
            });
        }
        while let Some(r) = starting.join_next().await {
            running.spawn(member(r.map_err(|e| e.to_string())??, tally.clone()));
        }
    }
    ready();
    let mut out: [MembersPhase; PHASES] = Default::default();
    let mut spans: [(Option<Instant>, Option<Instant>); PHASES] = Default::default();
    while let Some(r) = running.join_next().await {
        // The first failure ends the run (the others would wait for ever).
        let seen = r.map_err(|e| e.to_string())??;
        for phase in 0..PHASES {
            let s = &seen[phase];
            out[phase].deliveries += s.last;
            let (first, last) = &mut spans[phase];
            if let Some(f) = s.first_at {
                *first = Some(first.map_or(f, |x: Instant| x.min(f)));
            }
            if let Some(l) = s.last_at {
                *last = Some(last.map_or(l, |x: Instant| x.max(l)));
            }
        }
    }
    for (o, (first, last)) in out.iter_mut().zip(spans) {
        if let (Some(f), Some(l)) = (first, last) {
            o.secs = (l - f).as_secs_f64();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_stays_within_its_bounds_and_a_relay_queue() {
        for size in [TAG_BYTES, 64, 1024, 16 << 10, 64 << 10] {
            let w = window(size);
            assert!(
                (WINDOW_MSGS_MIN..=WINDOW_MSGS_MAX).contains(&w),
                "{size}: {w}"
            );
            let bytes = w as usize * (size + WINDOW_FRAMING_BYTES);
            assert!(
                bytes <= busway::limits::DEFAULT_SEND_QUEUE_BYTES_MAX / 2,
                "{size}: {bytes}"
            );
            // A milestone slot is free again before a member can reach its next use.
            assert!(milestone(size) * MILESTONE_SLOTS as u64 > w, "{size}");
        }
    }

    #[test]
    fn tags_carry_kind_and_number() {
        let t = tag(KIND_END, 12345);
        assert_eq!((t >> KIND_SHIFT, t & NUMBER_MASK), (KIND_END, 12345));
        let mut p = Payloads {
            arena: BytesMut::new(),
            size: 64,
        };
        let a = p.next(tag(KIND_DATA, 7));
        assert_eq!((a.len(), word(&a, 0)), (64, Some(7)));
    }
}
