//! `busway listen`: print or verify what arrives.

use crate::common::{self, NodeArgs};
use crate::say;
use crate::verify::Verifier;
use clap::Args;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct ListenArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Exit after this many messages. Cut off from a `--group` before that (it fell behind,
    /// or lost publishes the publisher no longer holds), it stops at once (exit code 4, or 2
    /// with `--verify`); without `--count` it joins the group again and goes on.
    #[arg(long)]
    count: Option<u64>,
    /// Check the 8-byte little-endian sequence number at the start of each payload instead of
    /// printing each message; end with a summary line (exit code 2 if anything is wrong).
    #[arg(long)]
    verify: bool,
    /// Give up after this many seconds without a message.
    #[arg(long)]
    idle_timeout: Option<f64>,
    /// Answer every request (`busway call`) with its own payload. Without it a request is
    /// printed and answered with "no handler".
    #[arg(long)]
    echo: bool,
    /// Join this group (repeatable): its publishes arrive with the rest (`--verify` checks
    /// them as one stream).
    #[arg(long)]
    group: Vec<String>,
    /// Stop reading once this many messages arrived (at the end of the batch that passes
    /// it), for `--pause-ms`: to see what the bus does with a consumer that falls behind
    /// (its links stop reading; a relay skips it past `GROUP_SLOW_MEMBER_WAIT_MS`, 1 s, and
    /// a member that cannot get back what it missed is cut off its group, told so).
    #[arg(long, requires = "pause_ms")]
    pause_after: Option<u64>,
    /// How long (ms) to stop reading at `--pause-after`.
    #[arg(long, requires = "pause_after")]
    pause_ms: Option<u64>,
}

pub(crate) async fn run(args: ListenArgs) -> Result<ExitCode, String> {
    // Before the node starts: a SIGTERM during the start stops it gracefully too.
    let stop = common::stop_requested();
    let node = args.node.start().await?;
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let mut events = node.take_events().expect("events are taken once");
    common::print_listening(&node);
    for g in &args.group {
        if let Err(e) = node.join(g) {
            node.shutdown().await;
            return Err(format!("--group {g:?}: {e}"));
        }
        println!("joined group {g}");
    }
    let mut verifier = Verifier::default();
    let mut replies = EchoReplies::default();
    let idle = args.idle_timeout.map(Duration::from_secs_f64);
    let mut timed_out = false;
    let mut cut_off = false;
    // Whoever read the output went away (a closed pipe): stop as at a signal, rather than
    // die on the next line with requests in hand.
    let mut output_closed = false;
    let mut pause = args.pause_after.zip(args.pause_ms);
    // Made once: a signal between two reads is not missed.
    tokio::pin!(stop);
    'outer: while args.count.is_none_or(|n| verifier.received() < n) {
        if let Some((_, ms)) = pause.filter(|&(after, _)| verifier.received() >= after) {
            pause = None;
            say::info(format_args!(
                "busway listen: not reading for {ms} ms after {} messages (--pause-after)",
                verifier.received()
            ));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = &mut stop => break,
            }
        }
        let wait = inbox.recv_batch();
        let got = tokio::select! {
            b = async {
                match idle {
                    Some(d) => tokio::time::timeout(d, wait).await.ok(),
                    None => Some(wait.await),
                }
            } => b,
            Some(ev) = events.recv() => {
                say::info(common::describe(&ev));
                let lost = matches!(
                    ev,
                    busway::Event::GroupGap { .. } | busway::Event::GroupCutOff { .. }
                );
                if lost && args.count.is_some() {
                    // The count cannot be reached: the publishes lost will never come.
                    cut_off = true;
                    break;
                }
                if let busway::Event::GroupCutOff { group, .. } = &ev {
                    if let Err(e) = node.join(group) {
                        say::warn(format_args!(
                            "busway listen: joining group {group} again failed: {e}"
                        ));
                    } else {
                        say::info(format_args!("busway listen: joined group {group} again"));
                    }
                }
                continue;
            }
            _ = &mut stop => break,
        };
        let batch = match got {
            None => {
                timed_out = true;
                break;
            }
            Some(None) => break,
            Some(Some(b)) => b,
        };
        for (i, payload) in batch.iter().enumerate() {
            let request = batch.request(i);
            if let (true, Some(r)) = (args.echo, request) {
                // Never waiting here: a caller that does not take its replies holds up
                // its own, no other caller's.
                replies.reply(r.clone(), bytes::Bytes::copy_from_slice(payload));
            }
            let what = match (request.is_some(), batch.group()) {
                (true, _) => " (request)".to_owned(),
                (false, Some(g)) => format!(" (group {g})"),
                (false, None) => String::new(),
            };
            if args.verify {
                verifier.record(payload);
            } else {
                verifier.count_unchecked();
                let mut out = std::io::stdout().lock();
                let printed = match std::str::from_utf8(payload) {
                    Ok(text) => writeln!(out, "{}{what}: {}", batch.src(), text),
                    Err(_) => writeln!(out, "{}{what}: <{} bytes>", batch.src(), payload.len()),
                };
                if printed.is_err() {
                    output_closed = true;
                    break 'outer;
                }
            }
            if args.count.is_some_and(|n| verifier.received() >= n) {
                break 'outer;
            }
        }
    }
    let shm = node.stats().shm_channels;
    node.shutdown().await;
    replies.summary();
    if shm > 0 {
        say::info(format_args!(
            "busway listen: {shm} link(s) moved their data to shared memory"
        ));
    }
    if output_closed {
        say::warn("busway listen: its output was closed; stopped");
    }
    if timed_out {
        say::info(format_args!(
            "busway listen: no message for {:?}; stopping",
            idle.unwrap_or_default()
        ));
    }
    if args.verify {
        let (line, ok) = verifier.summary(args.count);
        println!("{line}");
        if !ok {
            return Ok(ExitCode::from(2));
        }
    }
    if timed_out {
        return Ok(ExitCode::from(3));
    }
    if cut_off {
        say::error(format_args!(
            "busway listen: publishes lost (cut off, or a gap: see above) after {} messages; stopping",
            verifier.received()
        ));
        return Ok(ExitCode::from(4));
    }
    Ok(ExitCode::SUCCESS)
}

/// Lines `listen --echo` prints about requests it could not answer, one per caller, before
/// it only counts them (a caller that stopped reading may send thousands).
const UNANSWERED_LINES_MAX: usize = 16;
/// Bytes of replies `listen --echo` keeps for one caller whose send queue is full, waiting
/// for room in order; past it that caller's replies are dropped (it is not reading).
const REPLY_BYTES_WAITING_PER_CALLER_MAX: usize = 16 << 20;
/// Callers that may have replies waiting at once; past it, a reply that finds its caller's
/// queue full is dropped.
const CALLERS_WAITING_MAX: usize = 1_024;

/// One caller's replies waiting for room in its send queue, sent in order by a task of
/// their own.
struct Waiting {
    tx: tokio::sync::mpsc::UnboundedSender<(busway::Request, bytes::Bytes)>,
    /// Bytes queued in `tx` and not sent yet.
    bytes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// How `listen --echo` answers: at once where the caller's queue has room, else behind that
/// caller's other replies waiting (within `REPLY_BYTES_WAITING_PER_CALLER_MAX`), else not
/// at all, with a line per caller and a count.
#[derive(Default)]
struct EchoReplies {
    waiting: std::collections::HashMap<busway::BusId, Waiting>,
    callers: Vec<busway::BusId>,
    total: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl EchoReplies {
    fn reply(&mut self, request: busway::Request, payload: bytes::Bytes) {
        use std::sync::atomic::Ordering::Relaxed;
        let caller = request.from();
        if !self.waiting.contains_key(&caller) {
            match request.try_reply(payload.clone()) {
                Ok(()) => return,
                Err(busway::ReplyError::Full(_)) if self.waiting.len() < CALLERS_WAITING_MAX => {}
                Err(e) => return self.note(caller, &e.to_string()),
            }
            self.waiting.insert(caller, self.spawn_waiting());
        }
        let w = &self.waiting[&caller];
        // Relaxed: a count of bytes, read here and decremented by the task; no other data
        // depends on it.
        if w.bytes.load(Relaxed) + payload.len() > REPLY_BYTES_WAITING_PER_CALLER_MAX {
            return self.note(
                caller,
                &format!(
                    "its send queue is full and {REPLY_BYTES_WAITING_PER_CALLER_MAX} bytes of replies wait for it (it is not reading)"
                ),
            );
        }
        w.bytes.fetch_add(payload.len(), Relaxed);
        let _ = w.tx.send((request, payload));
    }

    /// A task that sends one caller's replies in order, each as room comes.
    fn spawn_waiting(&self) -> Waiting {
        let (tx, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(busway::Request, bytes::Bytes)>();
        let bytes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (left, total) = (bytes.clone(), self.total.clone());
        tokio::spawn(async move {
            use std::sync::atomic::Ordering::Relaxed;
            let mut said = false;
            while let Some((request, payload)) = rx.recv().await {
                let len = payload.len();
                if let Err(e) = request.reply(payload).await {
                    total.fetch_add(1, Relaxed);
                    if !std::mem::replace(&mut said, true) {
                        say::warn(format_args!(
                            "busway listen: no reply to {}: {e}",
                            request.from()
                        ));
                    }
                }
                left.fetch_sub(len, Relaxed);
            }
        });
        Waiting { tx, bytes }
    }

    fn note(&mut self, caller: busway::BusId, why: &str) {
        self.total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.callers.len() < UNANSWERED_LINES_MAX && !self.callers.contains(&caller) {
            self.callers.push(caller);
            say::warn(format_args!("busway listen: no reply to {caller}: {why}"));
        }
    }

    fn summary(&self) {
        let total = self.total.load(std::sync::atomic::Ordering::Relaxed);
        if total > 0 {
            say::warn(format_args!(
                "busway listen: {total} request(s) left unanswered (the caller stopped reading, or was gone)"
            ));
        }
    }
}
