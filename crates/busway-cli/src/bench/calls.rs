//! The worker side of `busway bench --rpc`: the busway caller, and the bare baselines (a
//! socket with a writer thread keeping the requests out and this thread taking the echoes; two
//! bare rings, one thread pushing and reading, an echoing thread).

use super::report::Report;
use super::round_trips;
use busway::{BusId, Node};
use busway_shm::ring::{Ring, Wait};
use bytes::Bytes;
use std::collections::VecDeque;
use std::io::{Read, Write};
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

/// What one `--rpc` run of a worker does.
pub(crate) struct CallRun {
    /// Calls kept out at once.
    pub(crate) calls: usize,
    /// Seconds measured (after a fifth as long to warm up).
    pub(crate) duration: f64,
    /// Spins of a bare ring's readers before they sleep.
    pub(crate) shm_spins: Option<u32>,
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
pub(crate) async fn bus_caller(node: Node, run: &CallRun, to: BusId) -> Result<Report, String> {
    // Over a ring, replies are read with the rest of the inbox: keep it read.
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let reader = tokio::spawn(async move { while inbox.recv_batch().await.is_some() {} });
    let concurrency = run.calls;
    let clock = std::sync::Arc::new(Clock::new(run.duration));
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
    run: &CallRun,
    shutdown_write: impl FnOnce() + Send + 'static,
) -> Result<Report, String> {
    let concurrency = run.calls;
    let clock = Clock::new(run.duration);
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
pub(crate) fn raw_ring_calls(run: &CallRun) -> Result<(Report, Report), String> {
    let err = |e: busway_shm::ring::RingError| e.to_string();
    let spins = run
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
    let concurrency = run.calls;
    let clock = Clock::new(run.duration);
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
