//! The busway side of `busway bench --pingpong`: N sessions between two nodes, each one message
//! of S bytes in flight. The client sends one message per session, then both nodes send back
//! every message they receive (sharing its bytes, no copy); the client counts what it receives
//! while the clock runs. The sessions share the nodes' one link, which batches them.

use super::report::Report;
use busway::{BusId, Event, Node, SendError};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// The share of a run before the clock counts (links settle, windows open), as 1/N.
const WARMUP_FRACTION: u32 = 5;
/// How long the echoing node waits for a message before it decides the client is gone.
const ECHO_IDLE_WAIT: Duration = Duration::from_secs(10);
/// How long the client waits for its last message (the end of the run) to be acknowledged.
const END_FLUSH_WAIT: Duration = Duration::from_secs(10);

/// What one ping-pong run of a worker does.
pub(crate) struct PingpongRun {
    /// Messages in flight (sessions).
    pub(crate) sessions: usize,
    /// Bytes of each message.
    pub(crate) size: usize,
    /// Seconds measured (after a fifth as long to warm up).
    pub(crate) duration: f64,
    /// Event loops (threads) of the raw baseline on each side.
    pub(crate) loops: usize,
}

impl PingpongRun {
    /// When the count starts and when the run ends, from now.
    pub(crate) fn clock(&self) -> (Instant, Instant) {
        let now = Instant::now();
        let d = Duration::from_secs_f64(self.duration);
        (now + d / WARMUP_FRACTION, now + d / WARMUP_FRACTION + d)
    }

    /// Bytes that may be queued toward one peer or waiting in one inbox at once: every
    /// session's message, twice over (one each way), so that an echo never waits for room
    /// while the other side waits for it.
    pub(crate) fn in_flight_bytes(&self) -> usize {
        2 * self.sessions * self.size
    }
}

/// The client: one message per session to `to`, then every message received goes back, until
/// the run ends; reports the bytes received after the warm-up.
pub(crate) async fn client(node: Node, to: BusId, run: &PingpongRun) -> Result<Report, String> {
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let block = Bytes::from(vec![0x5Au8; run.size]);
    let (measured_from, end) = run.clock();
    for _ in 0..run.sessions {
        node.send(to, block.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut bytes = 0u64;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let batch = match tokio::time::timeout(end - now, inbox.recv_batch()).await {
            Ok(Some(b)) => b,
            Ok(None) => return Err("the node stopped".into()),
            Err(_) => break,
        };
        if Instant::now() >= measured_from {
            bytes += batch.iter().map(|p| p.len() as u64).sum::<u64>();
        }
        for i in 0..batch.len() {
            node.send(batch.src(), batch.message(i).payload)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    // The end, for an echoing node that cannot see this one go (behind a relay).
    node.send(to, Bytes::new())
        .await
        .map_err(|e| e.to_string())?;
    node.flush(END_FLUSH_WAIT).await;
    node.shutdown().await;
    let secs = (end - measured_from).as_secs_f64();
    Ok(Report {
        msgs: bytes / run.size.max(1) as u64,
        bytes,
        secs,
        ..Report::default()
    })
}

/// The echoing node: sends back every message it receives until the client's empty message,
/// its link going down, or `ECHO_IDLE_WAIT` without a message.
pub(crate) async fn server(node: Node) -> Result<Report, String> {
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let mut events = node.take_events().expect("events are taken once");
    let mut msgs = 0u64;
    'run: loop {
        tokio::select! {
            b = tokio::time::timeout(ECHO_IDLE_WAIT, inbox.recv_batch()) => match b {
                Ok(Some(batch)) => {
                    for i in 0..batch.len() {
                        let payload = batch.message(i).payload;
                        if payload.is_empty() {
                            break 'run;
                        }
                        msgs += 1;
                        match node.send(batch.src(), payload).await {
                            Ok(_) => {}
                            // The client shut down before this echo of one of its last messages
                            // (behind a relay its end can overtake what the echo read): the end.
                            Err(SendError::PeerDown(_)) => break 'run,
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
                Ok(None) => break,
                Err(_) => return Err("the ping-pong client went quiet".into()),
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
