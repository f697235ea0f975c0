//! `busway bench --rpc`: calls per second and their latency (p50/p99/p99.9) at 1, 100 and
//! 10,000 concurrent calls from async tasks, 64-byte payloads, per transport; beside the same
//! round trips with no bus and as many in flight: a bare socket (a writer thread keeping that
//! many requests out, a reader thread taking the echoes) or two bare rings (one thread pushing
//! and reading, an echoing thread).

use super::worker::{Report, WorkerArgs};
use super::{finish, round_trips, sysinfo, BenchArgs, Pair, Spec, WORKER_GRACE_SECS};
use super::{in_one_process, listen_addr, ready, receiver_then_sender, worker_with};
use busway::{BusId, Node};
use busway_shm::ring::{Ring, Wait};
use bytes::Bytes;
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bytes of every request and reply.
pub(crate) const RPC_PAYLOAD_BYTES: usize = 64;
/// The share of a run before the clock counts (links settle, rings switch), as 1/N.
const WARMUP_FRACTION: u32 = 5;
/// Longest wait for one call's reply before the run fails.
const CALL_WAIT: Duration = Duration::from_secs(10);
/// Bytes of each bare ring of the baseline.
const RAW_RING_BYTES: usize = 4 << 20;
/// Records the bare ring's echo or caller takes per read.
const RAW_RING_READ_RECORDS: usize = 256;

/// One row of the `--rpc` table.
#[derive(Serialize, Debug)]
struct RpcRow {
    workload: &'static str,
    transport: String,
    concurrency: usize,
    size: usize,
    calls_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// The same round trips with no bus, as many in flight (see the module's note).
    raw_calls_per_sec: f64,
    raw_p50_us: f64,
}

/// Runs `--rpc`: one row per transport and concurrency.
pub(super) fn run(args: &BenchArgs, specs: &[Spec]) -> Result<ExitCode, String> {
    let mut transports: Vec<&str> = specs.iter().map(|s| s.transport.as_str()).collect();
    transports.dedup();
    let mut rows = Vec::new();
    for (i, t) in transports.into_iter().enumerate() {
        if matches!(t, "relay4-stuck" | "tls4") {
            continue;
        }
        for (j, &c) in args.concurrency.iter().enumerate() {
            let spec = Spec {
                transport: t.to_owned(),
                size_min: RPC_PAYLOAD_BYTES,
                size_max: RPC_PAYLOAD_BYTES,
            };
            let calls = c.to_string();
            let extra = ["--calls", calls.as_str()];
            let limit = Duration::from_secs_f64(args.duration * 2.0 + WORKER_GRACE_SECS);
            let n = 2000 + i * 64 + j * 2;
            let (bus, _) = match t {
                "mem" => in_one_process(args, &spec, false, &listen_addr(t, n), &extra, limit)?,
                "relay4" => relayed(args, &spec, &listen_addr(t, n), &extra, limit)?,
                _ => receiver_then_sender(args, &spec, false, &listen_addr(t, n), &extra, limit)?,
            };
            // The baseline of a relayed call is the bare socket between the two ends.
            let raw_t = if t == "relay4" { "tcp4" } else { t };
            let raw_addr = listen_addr(raw_t, n + 1);
            let (raw, _) = if matches!(raw_t, "shm" | "mem") {
                in_one_process(args, &spec, true, &raw_addr, &extra, limit)?
            } else {
                receiver_then_sender(args, &spec, true, &raw_addr, &extra, limit)?
            };
            let row = RpcRow {
                workload: "rpc",
                transport: t.to_owned(),
                concurrency: c,
                size: RPC_PAYLOAD_BYTES,
                calls_per_sec: bus.msgs as f64 / bus.secs.max(1e-9),
                p50_us: bus.rtt_us[0],
                p99_us: bus.rtt_us[1],
                p999_us: bus.rtt_us[2],
                raw_calls_per_sec: raw.msgs as f64 / raw.secs.max(1e-9),
                raw_p50_us: raw.rtt_us[0],
            };
            if args.json {
                println!("{}", serde_json::to_string(&row).unwrap_or_default());
            } else {
                eprintln!("{t} x{c}: {:.0} calls/s", row.calls_per_sec);
            }
            rows.push(row);
        }
    }
    if !args.json {
        print_table(&rows);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &[RpcRow]) {
    println!(
        "busway bench --rpc: {RPC_PAYLOAD_BYTES}-byte calls from concurrent async tasks, each answered with its payload; latency in microseconds; raw: the same round trips with as many in flight over a bare socket (relay4: the bare tcp4 socket between its two ends) or two bare rings (shm, mem)"
    );
    println!("machine: {}", sysinfo::machine());
    println!(
        "{:<7} {:>7} {:>11} {:>9} {:>9} {:>9} {:>11} {:>9} {:>6}",
        "link", "calls", "calls/s", "p50", "p99", "p99.9", "raw calls/s", "raw p50", "ratio"
    );
    for r in rows {
        println!(
            "{:<7} {:>7} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>11.0} {:>9.1} {:>6.2}",
            r.transport,
            r.concurrency,
            r.calls_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.raw_calls_per_sec,
            r.raw_p50_us,
            r.calls_per_sec / r.raw_calls_per_sec.max(1e-9)
        );
    }
}

/// Caller -> relay -> answering node, three processes.
fn relayed(
    args: &BenchArgs,
    spec: &Spec,
    addr: &str,
    extra: &[&str],
    limit: Duration,
) -> Result<Pair, String> {
    let mut relay = worker_with(args, spec, "relay", false, addr, false, extra)?;
    let (mut relay_lines, relay_addr) = ready(&mut relay, "relay")?;
    let mut recv = worker_with(args, spec, "recv", false, &relay_addr, true, extra)?;
    let (mut recv_lines, _) = ready(&mut recv, "receiver")?;
    let mut send = worker_with(args, spec, "send", false, &relay_addr, true, extra)?;
    let send_lines = send.0.stdout.take().ok_or("worker has no stdout")?;
    let mut send_lines = BufReader::new(send_lines).lines().map_while(Result::ok);
    let s = finish(send, &mut send_lines, limit)?;
    let r = finish(recv, &mut recv_lines, limit)?;
    finish(relay, &mut relay_lines, limit)?;
    Ok((s, r))
}

/// Where a run stands: calls before `measured_from` warm up, none start after `end`.
struct Clock {
    measured_from: Instant,
    end: Instant,
}

impl Clock {
    fn new(duration: f64) -> Self {
        let now = Instant::now();
        let d = Duration::from_secs_f64(duration);
        Self {
            measured_from: now + d / WARMUP_FRACTION,
            end: now + d / WARMUP_FRACTION + d,
        }
    }
}

/// The caller: `--calls` tasks, each calling the receiver with 64 bytes until the run ends;
/// reports the calls made after the warm-up and their latency.
pub(crate) async fn bus_caller(node: Node, args: &WorkerArgs, to: BusId) -> Result<Report, String> {
    // Over a ring, replies are read with the rest of the inbox: keep it read.
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let reader = tokio::spawn(async move { while inbox.recv_batch().await.is_some() {} });
    let concurrency = args.calls.unwrap_or(1).max(1);
    let clock = std::sync::Arc::new(Clock::new(args.duration));
    let payload = Bytes::from(vec![0x5Au8; RPC_PAYLOAD_BYTES]);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (node, clock, payload) = (node.clone(), clock.clone(), payload.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let t = Instant::now();
                    if t >= clock.end {
                        return Ok::<_, String>(samples);
                    }
                    node.call(to, payload.clone(), CALL_WAIT)
                        .await
                        .map_err(|e| e.to_string())?;
                    if t >= clock.measured_from {
                        samples.push(t.elapsed().as_nanos() as f64 / 1000.0);
                    }
                }
            })
        })
        .collect();
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await.map_err(|e| e.to_string())??);
    }
    let secs = (clock.end - clock.measured_from).as_secs_f64();
    // The end, for an answering node that cannot see this one go (behind a relay).
    node.send(to, Bytes::new())
        .await
        .map_err(|e| e.to_string())?;
    node.flush(CALL_WAIT).await;
    reader.abort();
    node.shutdown().await;
    Ok(Report {
        msgs: samples.len() as u64,
        secs,
        rtt_us: round_trips::percentiles(&mut samples),
        ..Report::default()
    })
}

/// The socket baseline's caller: a writer thread keeps `--calls` requests out (a new one per
/// echo taken), this thread reads the echoes (in order: one stream) and times each.
pub(crate) fn raw_socket_calls(
    stream: impl Read + Write + Send + 'static,
    mut reader: impl Read,
    args: &WorkerArgs,
    shutdown_write: impl FnOnce() + Send + 'static,
) -> Result<Report, String> {
    let concurrency = args.calls.unwrap_or(1).max(1);
    let clock = Clock::new(args.duration);
    let (end, measured_from) = (clock.end, clock.measured_from);
    let (token_tx, token_rx) = mpsc::channel::<()>();
    let (sent_tx, sent_rx) = mpsc::channel::<Instant>();
    for _ in 0..concurrency {
        let _ = token_tx.send(());
    }
    let writer = std::thread::spawn(move || -> Result<(), String> {
        let mut stream = stream;
        let msg = [0x5Au8; RPC_PAYLOAD_BYTES];
        while token_rx.recv().is_ok() && Instant::now() < end {
            let _ = sent_tx.send(Instant::now());
            stream.write_all(&msg).map_err(|e| e.to_string())?;
        }
        // No more requests: the echo ends once it answered the last one.
        shutdown_write();
        Ok(())
    });
    let mut got = [0u8; RPC_PAYLOAD_BYTES];
    let mut samples = Vec::new();
    while let Ok(sent_at) = sent_rx.recv() {
        reader.read_exact(&mut got).map_err(|e| e.to_string())?;
        if sent_at >= measured_from {
            samples.push(sent_at.elapsed().as_nanos() as f64 / 1000.0);
        }
        let _ = token_tx.send(());
    }
    writer
        .join()
        .map_err(|_| "the writer thread panicked".to_string())??;
    Ok(Report {
        msgs: samples.len() as u64,
        secs: (end - measured_from).as_secs_f64(),
        rtt_us: round_trips::percentiles(&mut samples),
        ..Report::default()
    })
}

/// The ring baseline: two bare rings between this thread, which keeps `--calls` requests out
/// and reads the echoes, and an echoing thread (readers spinning as the bus's do).
pub(crate) fn raw_ring_calls(args: &WorkerArgs) -> Result<(Report, Report), String> {
    let err = |e: busway_shm::ring::RingError| e.to_string();
    let spins = args
        .shm_spins
        .unwrap_or(busway_shm::ring::SPINS_BEFORE_SLEEP_DEFAULT);
    let there = Ring::create_unchecked("busway-bench-rpc", RAW_RING_BYTES).map_err(err)?;
    let back = Ring::create_unchecked("busway-bench-rpc", RAW_RING_BYTES).map_err(err)?;
    let (mut tx, mut far_rx) = (there.producer(), there.consumer().map_err(err)?);
    let (mut far_tx, mut rx) = (back.producer(), back.consumer().map_err(err)?);
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let mut got = Vec::new();
        loop {
            got.clear();
            let n = far_rx
                .read_into(RAW_RING_READ_RECORDS, &mut got)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                match far_rx.wait_readable(spins, CALL_WAIT) {
                    Wait::Ready => continue,
                    Wait::Closed => return Ok(()),
                    Wait::TimedOut => return Err("the bare ring's caller went quiet".into()),
                }
            }
            for record in got.chunks(RPC_PAYLOAD_BYTES) {
                // The caller keeps at most `--calls` out and reads as it goes: room comes.
                while !far_tx.try_push(record).map_err(|e| e.to_string())? {
                    std::hint::spin_loop();
                }
            }
            far_tx.publish();
        }
    });
    let concurrency = args.calls.unwrap_or(1).max(1);
    let clock = Clock::new(args.duration);
    let msg = [0x5Au8; RPC_PAYLOAD_BYTES];
    let mut out: VecDeque<Instant> = VecDeque::with_capacity(concurrency);
    let mut got = Vec::new();
    let mut samples = Vec::new();
    loop {
        let now = Instant::now();
        let mut pushed = false;
        while now < clock.end && out.len() < concurrency {
            if !tx.try_push(&msg).map_err(err)? {
                break;
            }
            out.push_back(Instant::now());
            pushed = true;
        }
        if pushed {
            tx.publish();
        }
        if out.is_empty() {
            break;
        }
        got.clear();
        let n = rx
            .read_into(RAW_RING_READ_RECORDS, &mut got)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            if rx.wait_readable(spins, CALL_WAIT) != Wait::Ready {
                return Err("no echo over the bare ring".into());
            }
            continue;
        }
        for _ in 0..n {
            let sent_at = out.pop_front().ok_or("an echo nobody asked for")?;
            if sent_at >= clock.measured_from {
                samples.push(sent_at.elapsed().as_nanos() as f64 / 1000.0);
            }
        }
    }
    tx.close();
    echo.join()
        .map_err(|_| "the bare ring's echo thread panicked".to_string())??;
    let report = Report {
        msgs: samples.len() as u64,
        secs: (clock.end - clock.measured_from).as_secs_f64(),
        rtt_us: round_trips::percentiles(&mut samples),
        ..Report::default()
    };
    Ok((report.clone(), report))
}
