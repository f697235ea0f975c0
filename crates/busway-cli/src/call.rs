//! `busway call`: send one request and print its reply.

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
    /// The request's payload (text).
    payload: String,
}

pub(crate) async fn run(args: CallArgs) -> Result<ExitCode, String> {
    if !(args.timeout > 0.0 && args.timeout.is_finite()) {
        return Err(format!(
            "--timeout must be a positive number of seconds, not {}",
            args.timeout
        ));
    }
    let node = args.node.start().await?;
    // Over shared memory a reply is read with the rest of the inbox: keep reading it (what
    // else arrives is dropped; a request among it is answered with "no handler").
    let mut inbox = node.take_inbox().expect("inbox is taken once");
    let reader = tokio::spawn(async move { while inbox.recv_batch().await.is_some() {} });
    if let Err(why) = args.node.wait_reachable(&node, args.to).await {
        node.shutdown().await;
        return Err(why);
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let result = node
        .call(args.to, Bytes::from(args.payload.into_bytes()), timeout)
        .await;
    reader.abort();
    node.shutdown().await;
    let reply = result.map_err(|e| format!("call to bus id {}: {e}", args.to))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&reply.payload)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}
