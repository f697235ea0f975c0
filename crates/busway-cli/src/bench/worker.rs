//! One side of one benchmark run, in its own process so that its CPU time and memory are its
//! own. The receiver prints `ready ADDR` once it listens; both print one JSON report at the end.

pub(crate) use super::report::Report;
use super::round_trips;
use super::sizes::Sizes;
use super::sysinfo;
use busway::{Addr, BusId, Event, IoThreads, Node, NodeConfig};
use busway_core::frame::{encode_frame, FrameKind, HEADER_LEN};
use bytes::{Bytes, BytesMut};
use clap::{Args, ValueEnum};
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Bytes of pre-framed messages the raw sender writes per call.
const RAW_BATCH_BYTES: usize = 256 << 10;
/// Bytes the raw receiver asks for per read.
const RAW_READ_BYTES: usize = 256 << 10;
/// Messages a busway sender hands over per `send_batch` call (and between looks at the clock).
const SEND_BATCH_MSGS: usize = 256;
/// Message sizes drawn ahead of a run and cycled through (a multiple of the batch).
const SIZE_POOL_LEN: usize = 4096;
/// Bytes a busway sender queues before it lets the link's writer run.
const YIELD_EVERY_BYTES: usize = 1024 << 10;
/// How long a sender waits for its link to come up.
const CONNECT_WAIT: Duration = Duration::from_secs(10);
const SENDER_ID: BusId = BusId(1);
const RELAY_ID: BusId = BusId(100);
const RECEIVER_ID: BusId = BusId(2);
/// The destination that never reads (the `relay4-stuck` row).
const STUCK_ID: BusId = BusId(3);
/// How long a sender beside a stuck destination waits for the measured receiver's last
/// acknowledgement.
const RECEIVER_FLUSH_WAIT: Duration = Duration::from_secs(60);
/// How often that wait looks (it happens once per run, after the clock stopped).
const RECEIVER_FLUSH_POLL: Duration = Duration::from_millis(5);

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum Role {
    Send,
    Recv,
    /// The relay between the two (with `--via-relay` on both).
    Relay,
    /// Receiver and sender in this one process, on two threads (the `mem` row): prints the
    /// sender's report, then the receiver's.
    Pair,
    /// A destination behind the relay that never reads its inbox (the `relay4-stuck` row):
    /// runs until it is killed.
    Stuck,
}

#[derive(Args, Debug)]
pub(crate) struct WorkerArgs {
    #[arg(value_enum)]
    role: Role,
    /// Move pre-framed bytes over a bare socket instead of running a busway node.
    #[arg(long)]
    raw: bool,
    /// Listen address (recv) or address to dial (send).
    #[arg(long)]
    addr: Addr,
    #[arg(long, default_value_t = 8)]
    size_min: usize,
    #[arg(long, default_value_t = 128)]
    size_max: usize,
    /// Seconds the sender sends.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Run the node's links on the worker's own thread (current) or on a dedicated I/O thread.
    #[arg(long, default_value = "current")]
    io: String,
    /// Sender and receiver both dial `addr`, a relay, and the messages go through it.
    #[arg(long)]
    via_relay: bool,
    /// `batch`: `send_batch` of 256 messages; `single`: one `send` per message.
    #[arg(long, default_value = "batch")]
    api: String,
    /// The link's data moves to shared memory (bus); a bare shared-memory ring (raw).
    #[arg(long)]
    shm: bool,
    /// Spins of the shared-memory reader before it sleeps (bus, with `--shm`).
    #[arg(long)]
    shm_spins: Option<u32>,
    /// Calls instead of one-way messages (`bench --rpc`): the sender keeps this many calls
    /// out from as many tasks; the receiver answers each with its payload.
    #[arg(long)]
    calls: Option<usize>,
    /// Round trips instead of throughput: the sender sends one message of `--size-min` bytes
    /// and waits for its echo, this many times; the receiver echoes.
    #[arg(long)]
    round_trips: Option<usize>,
    /// Sender: also stream to the destination that never reads (`Stuck`), from a task of its
    /// own, while the measured stream goes to the receiver.
    #[arg(long)]
    stuck_to: bool,
    /// The directory with this run's TLS certificates (the tls4 row).
    #[arg(long)]
    tls_dir: Option<std::path::PathBuf>,
    /// Relay: how many peers come and go before it reports.
    #[arg(long, default_value_t = 2)]
    peers: usize,
    /// Ping-pong instead of one-way messages (`bench --pingpong`): this many sessions, each
    /// one message of `--size-min` bytes in flight, echoed by both sides.
    #[arg(long)]
    sessions: Option<usize>,
    /// Event loops: the node's dedicated I/O threads (0: its links on this thread; overrides
    /// `--io`), or the raw ping-pong's epoll threads on each side (at least one).
    #[arg(long)]
    io_threads: Option<usize>,
}

pub(crate) fn run(args: WorkerArgs) -> Result<ExitCode, String> {
    let born = Instant::now();
    if args.role == Role::Pair {
        let (mut send, mut recv) = if args.raw && args.calls.is_some() {
            super::calls::raw_ring_calls(&args.call_run())?
        } else if args.raw && args.round_trips.is_some() {
            raw_ring_round_trips(&args)?
        } else if args.raw {
            raw_mem_pair(&args)?
        } else {
            bus_pair(&args)?
        };
        for r in [&mut send, &mut recv] {
            r.cpu_secs = sysinfo::cpu_seconds();
            r.wall_secs = born.elapsed().as_secs_f64();
            r.peak_rss_kib = sysinfo::peak_rss_kib();
        }
        for r in [send, recv] {
            println!("{}", serde_json::to_string(&r).map_err(|e| e.to_string())?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut report = match (args.raw, args.role) {
        (true, Role::Send) if args.sessions.is_some() => {
            super::pingpong_raw::client(&args.addr, &args.pingpong_run())?
        }
        (true, Role::Recv) if args.sessions.is_some() => {
            super::pingpong_raw::server(&args.addr, &args.pingpong_run(), |a| announce(&a))?
        }
        (true, Role::Send) if args.calls.is_some() => raw_calls(&args)?,
        (true, Role::Send) if args.round_trips.is_some() => raw_ping(&args)?,
        (true, Role::Recv) if args.round_trips.is_some() || args.calls.is_some() => {
            raw_echo(&args)?
        }
        (true, Role::Send) if args.shm => raw_ring_send(&args)?,
        (true, Role::Recv) if args.shm => raw_ring_recv()?,
        (true, Role::Send) => raw_send(&args)?,
        (true, Role::Recv) => raw_recv(&args)?,
        (true, Role::Relay) => raw_relay(&args)?,
        (true, Role::Stuck) => return Err("a stuck destination is a busway node only".into()),
        (true, Role::Pair) => unreachable!("handled above"),
        (false, role) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                match role {
                    Role::Send if args.sessions.is_some() => {
                        let node = dialing_node(&args, SENDER_ID).await?;
                        super::pingpong_bus::client(node, RECEIVER_ID, &args.pingpong_run()).await
                    }
                    Role::Recv if args.sessions.is_some() => {
                        let node = receiving_node(&args, |a| announce(&a)).await?;
                        super::pingpong_bus::server(node).await
                    }
                    Role::Send if args.calls.is_some() => {
                        let node = dialing_node(&args, SENDER_ID).await?;
                        super::calls::bus_caller(node, &args.call_run(), RECEIVER_ID).await
                    }
                    Role::Send if args.round_trips.is_some() => bus_ping(&args).await,
                    Role::Recv if args.round_trips.is_some() || args.calls.is_some() => {
                        bus_echo(&args, |a| announce(&a)).await
                    }
                    Role::Send => bus_send(&args).await,
                    Role::Recv => bus_recv(&args, |a| announce(&a)).await,
                    Role::Relay => bus_relay(&args).await,
                    Role::Stuck => bus_stuck(&args).await,
                    Role::Pair => unreachable!("handled above"),
                }
            })?
        }
    };
    report.cpu_secs = sysinfo::cpu_seconds();
    report.wall_secs = born.elapsed().as_secs_f64();
    report.peak_rss_kib = sysinfo::peak_rss_kib();
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| e.to_string())?
    );
    Ok(ExitCode::SUCCESS)
}

fn node_config(args: &WorkerArgs, id: BusId) -> NodeConfig {
    let mut c = NodeConfig::new(id);
    if let Some(dir) = &args.tls_dir {
        // A worker without its certificate cannot run the row: Node::start says why.
        c.tls = super::tls::node_tls(dir, id.0).ok();
    }
    c.io_threads = match args.io_threads {
        Some(0) => IoThreads::Current,
        Some(n) => IoThreads::Dedicated(n),
        None if args.io == "dedicated" => IoThreads::Dedicated(1),
        None => IoThreads::Current,
    };
    if args.sessions.is_some() {
        // Every session's message may sit in one queue: an echo must never wait for room
        // while the other side waits for it.
        let in_flight = args.pingpong_run().in_flight_bytes();
        c.send_queue_bytes_max = c.send_queue_bytes_max.max(in_flight);
        c.inbox_bytes_max = c.inbox_bytes_max.max(in_flight);
    }
    c.linger_ms = 10_000;
    // The socket rows measure the sockets: no shared-memory ring may replace them.
    c.shm_channels = args.shm;
    if let Some(spins) = args.shm_spins {
        c.shm_spins = spins;
    }
    c
}

/// Round trips: sends one message, waits for its echo, `--round-trips` times; reports the
/// p50/p99/p99.9 of the round trips in microseconds.
async fn bus_ping(args: &WorkerArgs) -> Result<Report, String> {
    let node = dialing_node(args, SENDER_ID).await?;
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let n = args.round_trips.unwrap_or(0);
    let payload = Bytes::from(vec![0x5Au8; args.size_min]);
    // Until the link settled (on shm: switched to the ring), then measured.
    let warmup = round_trips::warmup(n);
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..warmup + n {
        let t = Instant::now();
        node.send(RECEIVER_ID, payload.clone())
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::timeout(CONNECT_WAIT, inbox.recv())
            .await
            .map_err(|_| "no echo within the wait".to_string())?
            .ok_or("the inbox closed")?;
        if i >= warmup {
            samples.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    node.shutdown().await;
    Ok(Report {
        msgs: n as u64,
        secs,
        rtt_us: round_trips::percentiles(&mut samples),
        ..Report::default()
    })
}

/// Echoes every message back to its source until the link goes down; `ready` gets the address
/// it listens on.
async fn bus_echo(args: &WorkerArgs, ready: impl FnOnce(String)) -> Result<Report, String> {
    let node = receiving_node(args, ready).await?;
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let mut events = node.take_events().expect("events are taken once");
    let mut msgs = 0u64;
    loop {
        tokio::select! {
            m = inbox.recv() => match m {
                Some(m) => {
                    msgs += 1;
                    if m.request.is_some() {
                        m.reply(m.payload.clone()).await.map_err(|e| e.to_string())?;
                    } else if m.payload.is_empty() {
                        // The caller's last word (a relayed caller's going is not seen here).
                        break;
                    } else {
                        node.send(m.src, m.payload).await.map_err(|e| e.to_string())?;
                    }
                }
                None => break,
            },
            ev = events.recv() => match ev {
                Some(Event::PeerDown { .. }) | None => break,
                Some(_) => {}
            },
        }
    }
    node.shutdown().await;
    Ok(Report {
        msgs,
        ..Report::default()
    })
}

/// A node of the benchmark: dialing `addr` directly, or registered below the relay at `addr`.
async fn dialing_node(args: &WorkerArgs, id: BusId) -> Result<Node, String> {
    let config = if args.via_relay {
        let mut c = node_config(args, id).upstream(args.addr.clone());
        // The relayed row measures the relay: no direct link may replace it.
        c.direct_links = false;
        c
    } else {
        node_config(args, id).connect(args.addr.clone())
    };
    let node = Node::start(config).await.map_err(|e| e.to_string())?;
    let up = if args.via_relay {
        node.wait_for_any_link(CONNECT_WAIT).await
    } else {
        node.wait_for_peer(RECEIVER_ID, CONNECT_WAIT).await
    };
    if !up {
        return Err(format!("no link came up to {}", args.addr));
    }
    Ok(node)
}

async fn bus_send(args: &WorkerArgs) -> Result<Report, String> {
    let node = dialing_node(args, SENDER_ID).await?;
    let base = Bytes::from(vec![0x5Au8; args.size_max]);
    // Sizes are drawn before the clock starts, as the raw baseline's are: the generator is not
    // part of what is measured.
    // The messages are slices of one buffer, built before the clock starts as the raw
    // baseline's frames are: neither side pays for making up messages while it is timed.
    let sizes = Sizes::new(args.size_min, args.size_max).pool(SIZE_POOL_LEN);
    let slices: Vec<&[u8]> = sizes.iter().map(|&n| &base[..n]).collect();
    let windows: Vec<(&[&[u8]], usize)> = slices
        .chunks(SEND_BATCH_MSGS)
        .map(|w| (w, w.iter().map(|p| p.len()).sum()))
        .collect();
    if args.stuck_to {
        // Its own task: its sends wait once the stuck destination's window is full, and the
        // measured stream must not wait with them.
        let stuck = node.clone();
        let batch: Vec<Bytes> = slices[..SEND_BATCH_MSGS]
            .iter()
            .map(|p| base.slice_ref(p))
            .collect();
        tokio::spawn(async move { while stuck.send_batch(STUCK_ID, &batch[..]).await.is_ok() {} });
        tokio::task::yield_now().await;
    }
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let mut since_yield = 0usize;
    let start = Instant::now();
    let until = Duration::from_secs_f64(args.duration);
    'run: loop {
        for &(batch, batch_bytes) in &windows {
            if start.elapsed() >= until {
                break 'run;
            }
            if args.api == "batch" {
                node.send_batch(RECEIVER_ID, batch)
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                for p in batch {
                    node.send(RECEIVER_ID, base.slice_ref(p))
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            msgs += batch.len() as u64;
            bytes += batch_bytes as u64;
            since_yield += batch_bytes;
            // On a shared loop the writer runs only when the application yields: hand it the
            // queued bytes in cache-sized pieces.
            if since_yield >= YIELD_EVERY_BYTES {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    if args.via_relay {
        // The receiver has no link to this node to see close: an empty message ends the run.
        node.send(RECEIVER_ID, Bytes::new())
            .await
            .map_err(|e| e.to_string())?;
        if !receiver_acknowledged(&node).await {
            return Err("the receiver did not acknowledge everything".into());
        }
    }
    node.shutdown().await;
    Ok(Report {
        msgs,
        bytes,
        secs,
        ..Report::default()
    })
}

/// Whether the receiver acknowledged everything sent to it (whatever waits for the stuck
/// destination), within `RECEIVER_FLUSH_WAIT`.
async fn receiver_acknowledged(node: &Node) -> bool {
    let settled = || {
        node.relayed_peers()
            .iter()
            .all(|r| r.id != RECEIVER_ID || r.unacked_msgs == 0)
    };
    let wait = async {
        // Polled: once per run, after the clock stopped.
        while !settled() {
            tokio::time::sleep(RECEIVER_FLUSH_POLL).await;
        }
    };
    tokio::time::timeout(RECEIVER_FLUSH_WAIT, wait)
        .await
        .is_ok()
}

/// A destination that registers behind the relay and never reads: what it is sent piles up
/// until its sender's window is full. Runs until killed.
async fn bus_stuck(args: &WorkerArgs) -> Result<Report, String> {
    let node = dialing_node(args, STUCK_ID).await?;
    announce("registered");
    std::future::pending::<()>().await;
    drop(node);
    Ok(Report::default())
}

/// The relay between sender and receiver: runs until both (and any other, `--peers`) have
/// come and gone.
async fn bus_relay(args: &WorkerArgs) -> Result<Report, String> {
    let node = Node::start(node_config(args, RELAY_ID).listen(args.addr.clone()))
        .await
        .map_err(|e| e.to_string())?;
    let mut events = node.take_events().expect("events are taken once");
    announce(&node.listen_addrs()[0].to_string());
    let mut gone = 0;
    while gone < args.peers {
        match events.recv().await {
            Some(Event::PeerDown { .. }) => gone += 1,
            Some(_) => {}
            None => break,
        }
    }
    let relayed = node.stats().relayed;
    node.shutdown().await;
    Ok(Report {
        msgs: relayed,
        ..Report::default()
    })
}

/// The receiving node, listening at `addr` or registered below the relay there; `ready` gets
/// the address it listens on (or "registered").
async fn receiving_node(args: &WorkerArgs, ready: impl FnOnce(String)) -> Result<Node, String> {
    if args.via_relay {
        let node = dialing_node(args, RECEIVER_ID).await?;
        ready("registered".into());
        return Ok(node);
    }
    let node = Node::start(node_config(args, RECEIVER_ID).listen(args.addr.clone()))
        .await
        .map_err(|e| e.to_string())?;
    ready(node.listen_addrs()[0].to_string());
    Ok(node)
}

/// The receiving node; `ready` gets its address once it listens (or "registered").
async fn bus_recv(args: &WorkerArgs, ready: impl FnOnce(String)) -> Result<Report, String> {
    let node = receiving_node(args, ready).await?;
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let mut events = node.take_events().expect("events are taken once");

    let (mut msgs, mut bytes) = (0u64, 0u64);
    let (mut first, mut last) = (None, Instant::now());
    // Counts a batch; true if it holds the empty message that ends a relayed run.
    let mut count = |batch: &busway::MessageBatch| {
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        let mut ended = false;
        for p in batch.iter() {
            if p.is_empty() {
                ended = true;
            } else {
                msgs += 1;
                bytes += p.len() as u64;
            }
        }
        ended
    };
    loop {
        tokio::select! {
            biased;
            batch = inbox.recv_batch() => match batch {
                Some(b) => {
                    if count(&b) {
                        break;
                    }
                }
                None => break,
            },
            ev = events.recv() => match ev {
                Some(Event::PeerDown { .. }) | None if !args.via_relay => {
                    while let Some(b) = inbox.try_recv_batch() {
                        count(&b);
                    }
                    break;
                }
                None => break,
                Some(_) => {}
            },
        }
    }
    node.shutdown().await;
    let secs = first.map_or(0.0, |f| (last - f).as_secs_f64());
    Ok(Report {
        msgs,
        bytes,
        secs,
        ..Report::default()
    })
}

/// Both nodes in this process, each on a thread and runtime of its own (as two parts of one
/// server would be): the receiver listens on `addr`, the sender dials it, and their link moves
/// to an in-process channel by itself. With `--round-trips`, the receiver echoes and the sender
/// measures round trips.
fn bus_pair(args: &WorkerArgs) -> Result<(Report, Report), String> {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    };
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let recv_args = WorkerArgs {
        addr: args.addr.clone(),
        api: args.api.clone(),
        io: args.io.clone(),
        tls_dir: args.tls_dir.clone(),
        ..*args
    };
    let receiver = std::thread::spawn(move || {
        let ready = move |a| {
            let _ = addr_tx.send(a);
        };
        if recv_args.round_trips.is_some() || recv_args.calls.is_some() {
            runtime()?.block_on(bus_echo(&recv_args, ready))
        } else {
            runtime()?.block_on(bus_recv(&recv_args, ready))
        }
    });
    let addr: Addr = addr_rx
        .recv()
        .map_err(|_| "the receiving node did not start".to_string())?
        .parse()
        .map_err(|e: busway::ParseAddrError| e.to_string())?;
    let send_args = WorkerArgs {
        addr,
        api: args.api.clone(),
        io: args.io.clone(),
        tls_dir: args.tls_dir.clone(),
        ..*args
    };
    let sent = if send_args.calls.is_some() {
        runtime()?.block_on(async {
            let node = dialing_node(&send_args, SENDER_ID).await?;
            super::calls::bus_caller(node, &send_args.call_run(), RECEIVER_ID).await
        })?
    } else if send_args.round_trips.is_some() {
        runtime()?.block_on(bus_ping(&send_args))?
    } else {
        runtime()?.block_on(bus_send(&send_args))?
    };
    let received = receiver
        .join()
        .map_err(|_| "the receiving thread panicked".to_string())??;
    Ok((sent, received))
}

/// The round-trip baseline of the shm and mem rows: two bare rings between two threads of
/// this process, readers spinning as the bus's reader does (`--shm-spins`). The futex calls
/// that wake a sleeping reader are the same between two processes.
fn raw_ring_round_trips(args: &WorkerArgs) -> Result<(Report, Report), String> {
    let n = args.round_trips.unwrap_or(0);
    let spins = args
        .shm_spins
        .unwrap_or(busway_shm::ring::SPINS_BEFORE_SLEEP_DEFAULT);
    let start = Instant::now();
    let rtt_us = round_trips::over_rings(n, args.size_min, spins)?;
    let sent = Report {
        msgs: n as u64,
        secs: start.elapsed().as_secs_f64(),
        rtt_us,
        ..Report::default()
    };
    Ok((sent.clone(), sent))
}

/// The round-trip baseline of a socket row: a blocking socket, one `write` out and `read`s
/// until the echo is whole.
fn raw_ping(args: &WorkerArgs) -> Result<Report, String> {
    let mut stream = RawStream::connect_within(&args.addr, CONNECT_WAIT)?;
    let n = args.round_trips.unwrap_or(0);
    let start = Instant::now();
    let rtt_us = round_trips::ping(&mut stream, n, args.size_min)?;
    Ok(Report {
        msgs: n as u64,
        secs: start.elapsed().as_secs_f64(),
        rtt_us,
        ..Report::default()
    })
}

impl WorkerArgs {
    /// What a `--pingpong` run of this worker does.
    fn pingpong_run(&self) -> super::pingpong_bus::PingpongRun {
        super::pingpong_bus::PingpongRun {
            sessions: self.sessions.unwrap_or(1).max(1),
            size: self.size_min,
            duration: self.duration,
            loops: self.io_threads.unwrap_or(1).max(1),
        }
    }

    /// What a `--rpc` run of this worker does.
    fn call_run(&self) -> super::calls::CallRun {
        super::calls::CallRun {
            calls: self.calls.unwrap_or(1).max(1),
            duration: self.duration,
            shm_spins: self.shm_spins,
        }
    }
}

/// The socket baseline of `--rpc`: `--calls` requests kept out over one bare socket.
fn raw_calls(args: &WorkerArgs) -> Result<Report, String> {
    let stream = RawStream::connect_within(&args.addr, CONNECT_WAIT)?;
    let reader = stream.try_clone().map_err(|e| e.to_string())?;
    let closer = stream.try_clone().map_err(|e| e.to_string())?;
    super::calls::raw_socket_calls(stream, reader, &args.call_run(), move || {
        let _ = closer.shutdown_write();
    })
}

/// The other end of [`raw_ping`]: echoes until the pinger closes.
fn raw_echo(args: &WorkerArgs) -> Result<Report, String> {
    let mut stream = RawStream::accept_one(&args.addr).map_err(|e| e.to_string())?;
    let msgs = round_trips::echo(&mut stream, args.size_min)?;
    Ok(Report {
        msgs,
        ..Report::default()
    })
}

/// The bare ring between two threads of this process: the same pre-framed batches as
/// `raw_ring_send`, read as `raw_ring_recv` reads them.
fn raw_mem_pair(args: &WorkerArgs) -> Result<(Report, Report), String> {
    use busway_shm::ring::{Ring, RING_CAPACITY_DEFAULT};
    let ring =
        Ring::create_unchecked("busway-bench", RING_CAPACITY_DEFAULT).map_err(|e| e.to_string())?;
    let c = ring.consumer().map_err(|e| e.to_string())?;
    let receiver = std::thread::spawn(move || ring_recv_loop(c));
    let sent = ring_send_loop(ring.producer(), args)?;
    let received = receiver
        .join()
        .map_err(|_| "the receiving thread panicked".to_string())??;
    Ok((sent, received))
}

fn announce(addr: &str) {
    println!("ready {addr}");
    let _ = std::io::stdout().flush();
}

/// A connected std socket of either kind.
enum RawStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

fn not_a_socket(addr: &Addr) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{addr}: the raw baselines run over tcp:// or unix://"),
    )
}

impl RawStream {
    fn connect(addr: &Addr) -> std::io::Result<Self> {
        match addr {
            Addr::Tcp(a) => {
                let s = std::net::TcpStream::connect(a)?;
                s.set_nodelay(true)?;
                Ok(RawStream::Tcp(s))
            }
            Addr::Unix(p) => Ok(RawStream::Unix(std::os::unix::net::UnixStream::connect(p)?)),
            _ => Err(not_a_socket(addr)),
        }
    }

    /// Connects, trying again every few milliseconds until `wait` has passed (the other side
    /// may not listen yet).
    fn connect_within(addr: &Addr, wait: Duration) -> Result<Self, String> {
        let deadline = Instant::now() + wait;
        loop {
            match RawStream::connect(addr) {
                Ok(s) => return Ok(s),
                Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}: {e}")),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    fn accept_one(addr: &Addr) -> std::io::Result<Self> {
        match addr {
            Addr::Tcp(a) => {
                let l = std::net::TcpListener::bind(a)?;
                announce(&Addr::Tcp(l.local_addr()?).to_string());
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(RawStream::Tcp(s))
            }
            Addr::Unix(p) => {
                let _ = std::fs::remove_file(p);
                let l = std::os::unix::net::UnixListener::bind(p)?;
                announce(&addr.to_string());
                let (s, _) = l.accept()?;
                let _ = std::fs::remove_file(p);
                Ok(RawStream::Unix(s))
            }
            _ => Err(not_a_socket(addr)),
        }
    }

    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(match self {
            RawStream::Tcp(s) => RawStream::Tcp(s.try_clone()?),
            RawStream::Unix(s) => RawStream::Unix(s.try_clone()?),
        })
    }

    fn shutdown_write(&self) -> std::io::Result<()> {
        match self {
            RawStream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            RawStream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        }
    }
}

impl Read for RawStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            RawStream::Tcp(s) => s.read(buf),
            RawStream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for RawStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            RawStream::Tcp(s) => s.write(buf),
            RawStream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The raw baseline's sender: the same frames busway would send (header, checksum, payload),
/// built once, then written batch after batch with one call each. No queue, no bus.
fn raw_send(args: &WorkerArgs) -> Result<Report, String> {
    let mut stream = RawStream::connect_within(&args.addr, CONNECT_WAIT)?;
    let (batch, per_batch_msgs, per_batch_bytes) = prebuilt_batch(args);
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let until = Duration::from_secs_f64(args.duration);
    while start.elapsed() < until {
        stream.write_all(&batch).map_err(|e| e.to_string())?;
        msgs += per_batch_msgs;
        bytes += per_batch_bytes;
    }
    let secs = start.elapsed().as_secs_f64();
    stream.shutdown_write().map_err(|e| e.to_string())?;
    // Wait for the receiver to read everything and close.
    let mut sink = [0u8; 64];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
    Ok(Report {
        msgs,
        bytes,
        secs,
        ..Report::default()
    })
}

/// The raw baseline's relay: accepts the receiver, then the sender, and copies bytes from one
/// to the other with large calls (what any relay must at least do).
fn raw_relay(args: &WorkerArgs) -> Result<Report, String> {
    let Addr::Tcp(addr) = &args.addr else {
        return Err("the relay benchmark runs over tcp".into());
    };
    let l = std::net::TcpListener::bind(addr).map_err(|e| e.to_string())?;
    announce(&Addr::Tcp(l.local_addr().map_err(|e| e.to_string())?).to_string());
    let (mut to_recv, _) = l.accept().map_err(|e| e.to_string())?;
    let (mut from_send, _) = l.accept().map_err(|e| e.to_string())?;
    to_recv.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; RAW_READ_BYTES];
    let mut bytes = 0u64;
    loop {
        let n = from_send.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        to_recv.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        bytes += n as u64;
    }
    to_recv
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| e.to_string())?;
    let mut sink = [0u8; 64];
    while matches!(to_recv.read(&mut sink), Ok(n) if n > 0) {}
    Ok(Report {
        bytes,
        ..Report::default()
    })
}

/// The raw baseline's receiver: reads with large calls and walks the frame headers to count
/// messages (no checksum, no copy, no delivery).
fn raw_recv(args: &WorkerArgs) -> Result<Report, String> {
    let mut stream = if args.via_relay {
        let s = RawStream::connect(&args.addr).map_err(|e| e.to_string())?;
        announce("registered");
        s
    } else {
        RawStream::accept_one(&args.addr).map_err(|e| e.to_string())?
    };
    let mut buf = vec![0u8; RAW_READ_BYTES];
    let mut walker = FrameWalker::default();
    let (mut first, mut last) = (None, Instant::now());
    loop {
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        walker.walk(&buf[..n]);
    }
    Ok(Report {
        msgs: walker.frames,
        bytes: walker.payload_bytes,
        secs: first.map_or(0.0, |f| (last - f).as_secs_f64()),
        ..Report::default()
    })
}

/// The same frames as `raw_send`, built once, as one batch; returns (batch, messages, payload
/// bytes in it).
fn prebuilt_batch(args: &WorkerArgs) -> (BytesMut, u64, u64) {
    let payload = vec![0x5Au8; args.size_max];
    let mut sizes = Sizes::new(args.size_min, args.size_max);
    let mut batch = BytesMut::with_capacity(RAW_BATCH_BYTES + HEADER_LEN + args.size_max);
    let (mut msgs, mut bytes) = (0u64, 0u64);
    while batch.len() < RAW_BATCH_BYTES {
        let n = sizes.next_size();
        encode_frame(FrameKind::Data, &payload[..n], &mut batch);
        msgs += 1;
        bytes += n as u64;
    }
    (batch, msgs, bytes)
}

/// The bare ring's sender: opens the receiver's ring (`/proc/PID/fd/FD`) and writes the
/// pre-framed batch into it in records of the size the bus uses, publishing once per batch.
fn raw_ring_send(args: &WorkerArgs) -> Result<Report, String> {
    use busway_shm::ring::Ring;
    let Addr::Unix(path) = &args.addr else {
        return Err("the bare ring is named by /proc/PID/fd/FD".into());
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let seg = busway_shm::Segment::from_fd(file.into()).map_err(|e| e.to_string())?;
    let ring = Ring::open(seg, &Default::default(), usize::MAX).map_err(|e| e.to_string())?;
    ring_send_loop(ring.producer(), args)
}

/// Writes the pre-framed batch into the ring in records of the size the bus uses, publishing
/// once per batch, for `--duration`; then closes the ring.
fn ring_send_loop(mut p: busway_shm::Producer, args: &WorkerArgs) -> Result<Report, String> {
    use busway_shm::ring::Wait;
    let (batch, per_batch_msgs, per_batch_bytes) = prebuilt_batch(args);
    let (mut msgs, mut bytes) = (0u64, 0u64);
    let start = Instant::now();
    let until = Duration::from_secs_f64(args.duration);
    while start.elapsed() < until {
        for piece in batch.chunks(busway::limits::RING_RECORD_BYTES_MAX) {
            while !p.try_push(piece).map_err(|e| e.to_string())? {
                p.publish();
                if p.wait_for_room(piece.len(), CONNECT_WAIT) != Wait::Ready {
                    return Err("the bare ring's reader went away".into());
                }
            }
        }
        p.publish();
        msgs += per_batch_msgs;
        bytes += per_batch_bytes;
    }
    let secs = start.elapsed().as_secs_f64();
    p.close();
    Ok(Report {
        msgs,
        bytes,
        secs,
        ..Report::default()
    })
}

/// The bare ring's receiver: creates the ring, names it for the sender, and walks the frame
/// headers of every record to count messages until the sender closes.
fn raw_ring_recv() -> Result<Report, String> {
    use busway_shm::ring::{Ring, RING_CAPACITY_DEFAULT};
    use std::os::fd::AsRawFd;
    let ring =
        Ring::create_unchecked("busway-bench", RING_CAPACITY_DEFAULT).map_err(|e| e.to_string())?;
    announce(&format!(
        "unix:///proc/{}/fd/{}",
        std::process::id(),
        ring.segment().fd().as_raw_fd()
    ));
    ring_recv_loop(ring.consumer().map_err(|e| e.to_string())?)
}

/// Copies every record out and walks its frame headers to count messages, until the producer
/// closes.
fn ring_recv_loop(mut c: busway_shm::Consumer) -> Result<Report, String> {
    use busway_shm::ring::{Wait, SPINS_BEFORE_SLEEP_DEFAULT};
    let mut walker = FrameWalker::default();
    let (mut first, mut last) = (None, Instant::now());
    // `Consumer::read` copies each record into the receiver's own buffer before handing it
    // over, as a socket's `read` copies into the raw socket receiver's buffer: a receiver has
    // the bytes in its own memory, as the bus's receiver has them in the batch it hands the
    // application.
    let mut take = |m: &[u8]| walker.walk(m);
    loop {
        let n = c.read(usize::MAX, &mut take).map_err(|e| e.to_string())?;
        if n > 0 {
            let now = Instant::now();
            first.get_or_insert(now);
            last = now;
            continue;
        }
        if c.wait_readable(SPINS_BEFORE_SLEEP_DEFAULT, CONNECT_WAIT) == Wait::Closed {
            c.read(usize::MAX, &mut take).map_err(|e| e.to_string())?;
            break;
        }
    }
    Ok(Report {
        msgs: walker.frames,
        bytes: walker.payload_bytes,
        secs: first.map_or(0.0, |f| (last - f).as_secs_f64()),
        ..Report::default()
    })
}

/// Counts frames in a byte stream by their length fields alone.
#[derive(Default)]
struct FrameWalker {
    header: [u8; HEADER_LEN],
    header_fill: usize,
    body_left: usize,
    frames: u64,
    payload_bytes: u64,
}

impl FrameWalker {
    fn walk(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(data.len());
                self.body_left -= n;
                data = &data[n..];
                continue;
            }
            let n = (HEADER_LEN - self.header_fill).min(data.len());
            self.header[self.header_fill..self.header_fill + n].copy_from_slice(&data[..n]);
            self.header_fill += n;
            data = &data[n..];
            if self.header_fill == HEADER_LEN {
                let word0 = u32::from_le_bytes([
                    self.header[0],
                    self.header[1],
                    self.header[2],
                    self.header[3],
                ]);
                self.body_left = (word0 >> 8) as usize;
                self.payload_bytes += self.body_left as u64;
                self.frames += 1;
                self.header_fill = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walker_counts_frames_across_any_split() {
        let mut wire = BytesMut::new();
        for n in [0usize, 1, 100, 7] {
            encode_frame(FrameKind::Data, &vec![1u8; n], &mut wire);
        }
        for cut in 1..wire.len() {
            let mut w = FrameWalker::default();
            for piece in wire.chunks(cut) {
                w.walk(piece);
            }
            assert_eq!((w.frames, w.payload_bytes), (4, 108), "cut {cut}");
        }
    }
}
