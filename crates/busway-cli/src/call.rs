//! `busway call`: send a request and print its reply, or (`--count`) many, several at once,
//! and print how fast they were answered.

use crate::common::NodeArgs;
use busway::BusId;
use bytes::Bytes;
use clap::Args;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The destination bus id.
    #[arg(long)]
    to: BusId,
    /// Longest wait for the reply, in seconds.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
    /// Make this many calls, up to `CALLS_AT_ONCE` (64) at a time, and print a summary line
    /// (calls answered, per second, the slowest answer) instead of the replies; exit code 1
    /// if any failed.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Pad the payload with zeros to this many bytes.
    #[arg(long)]
    size: Option<usize>,
    /// The request's payload (text).
    payload: String,
}

/// Calls `busway call --count` keeps under way at once.
const CALLS_AT_ONCE: usize = 64;

pub(crate) async fn run(args: CallArgs) -> Result<ExitCode, String> {
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        return Err(format!(
            "--timeout must be a positive number of seconds, not {}",
            args.timeout
        ));
    }
    if let Some(size) = args.size {
        args.node.check_message_size("--size", size)?;
    }
    let node = args.node.start().await?;
    // Over shared memory a reply is read with the rest of the inbox: keep reading it (what
    // else arrives is dropped; a request among it is answered with "no handler").
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let reader = tokio::spawn(async move { while inbox.recv_batch().await.is_some() {} });
    let mut events = node.take_events().expect("events are taken once");
    if let Err(why) = args.node.wait_reachable(&node, &mut events, args.to).await {
        node.shutdown().await;
        return Err(why);
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut payload = args.payload.into_bytes();
    if let Some(size) = args.size {
        payload.resize(size.max(payload.len()), 0);
    }
    let payload = Bytes::from(payload);
    if args.count != 1 {
        let summary = many_calls(&node, args.to, payload, args.count, timeout).await;
        reader.abort();
        node.shutdown().await;
        println!("{}", summary?);
        return Ok(ExitCode::SUCCESS);
    }
    let result = node.call(args.to, payload, timeout).await;
    reader.abort();
    node.shutdown().await;
    let reply = result.map_err(|e| format!("call to bus id {}: {e}", args.to))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&reply.payload)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}

/// `count` calls of `payload` to `to`, `CALLS_AT_ONCE` under way at a time: the summary line,
/// or the first failure and how many failed.
async fn many_calls(
    node: &busway::Node,
    to: BusId,
    payload: Bytes,
    count: u64,
    timeout: Duration,
) -> Result<String, String> {
    // A call's time, or why it failed (a task that panicked counts as a failure too).
    let outcome = |joined: Result<Result<Duration, String>, tokio::task::JoinError>| {
        joined.map_err(|e| e.to_string()).and_then(|r| r)
    };
    let start = std::time::Instant::now();
    let mut under_way = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    for _ in 0..count {
        if under_way.len() >= CALLS_AT_ONCE {
            results.extend(under_way.join_next().await.map(outcome));
        }
        let (node, payload) = (node.clone(), payload.clone());
        under_way.spawn(async move {
            let t = std::time::Instant::now();
            let answered = node.call(to, payload, timeout).await;
            answered.map(|_| t.elapsed()).map_err(|e| e.to_string())
        });
    }
    while let Some(joined) = under_way.join_next().await {
        results.push(outcome(joined));
    }
    let secs = start.elapsed().as_secs_f64();
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    if let Some(first) = failed.first() {
        return Err(format!(
            "{} of {count} calls to bus id {to} failed; the first: {first}",
            failed.len()
        ));
    }
    let slowest = results.iter().flatten().max().copied().unwrap_or_default();
    Ok(format!(
        "{count} calls answered in {secs:.3} s ({:.0} calls/s, slowest {:.1} ms)",
        count as f64 / secs.max(1e-9),
        slowest.as_secs_f64() * 1e3
    ))
}
