//! `busway send`: one text message, or N sequenced messages.

use crate::common::NodeArgs;
use crate::verify::SEQ_LEN;
use busway::BusId;
use bytes::{BufMut, Bytes, BytesMut};
use clap::Args;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `send` waits for the destination to acknowledge everything (and, for a group or
/// multicast, for members to have asked for what they lost: `Node::drain`), in seconds.
const FLUSH_WAIT_SECS: u64 = 60;
/// How long `send` waits for each event still on its way once the node is shut down.
const EVENTS_DRAIN_WAIT: Duration = Duration::from_millis(100);
#[derive(Args, Debug)]
pub(crate) struct SendArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The destination bus id.
    #[arg(
        long,
        required_unless_present_any = ["group", "multicast"],
        conflicts_with_all = ["group", "multicast"]
    )]
    to: Option<BusId>,
    /// Multicast to these bus ids instead (comma-separated, `--multicast 5,9`: each gets every
    /// message, one frame per link whatever the number of receivers behind it). One value per
    /// flag, so that the text after it stays the text.
    #[arg(long, value_delimiter = ',', conflicts_with = "group")]
    multicast: Vec<BusId>,
    /// Publish to this group instead (every member gets each message; waits until a member
    /// is known).
    #[arg(long)]
    group: Option<String>,
    /// With --group: wait until this many of this node's links lead to members first.
    #[arg(long, default_value_t = 1)]
    group_links: usize,
    /// Send this many messages, each starting with its 8-byte little-endian sequence number.
    #[arg(long)]
    count: Option<u64>,
    /// Size of each sequenced message in bytes (at least 8).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// The text to send (without --count).
    text: Option<String>,
}

pub(crate) async fn run(args: SendArgs) -> Result<ExitCode, String> {
    if args.count.is_none() && args.text.is_none() {
        return Err("give a TEXT to send or --count N".into());
    }
    if args.count.is_some() && args.size < SEQ_LEN {
        return Err(format!(
            "--size must be at least {SEQ_LEN} bytes (the sequence number)"
        ));
    }
    if args.count.is_some() {
        args.node.check_message_size("--size", args.size)?;
    }
    let node = args.node.start().await?;
    // A sender reads nothing: what others send it is acknowledged and discarded.
    drop(node.take_inbox());
    let mut events = node.take_events().expect("events are taken once");
    let target = match (&args.group, args.to) {
        (Some(g), _) => Target::Group(g.clone()),
        (None, Some(to)) => Target::Node(to),
        (None, None) if !args.multicast.is_empty() => Target::Multicast(args.multicast.clone()),
        (None, None) => return Err("give --to ID, --group NAME or --multicast ID,ID..".into()),
    };
    let ready = match &target {
        Target::Node(to) => args.node.wait_reachable(&node, &mut events, *to).await,
        Target::Group(g) => args.node.wait_for_group(&node, g, args.group_links).await,
        Target::Multicast(ids) => {
            let mut ready = Ok(());
            for &id in ids {
                ready = args.node.wait_reachable(&node, &mut events, id).await;
                if ready.is_err() {
                    break;
                }
            }
            ready
        }
    };
    if let Err(why) = ready {
        node.shutdown().await;
        return Err(why);
    }
    let start = Instant::now();
    let mut sent = 0u64;
    let mut bytes = 0u64;
    let result = match args.count {
        None => {
            let text = Bytes::from(args.text.unwrap_or_default());
            bytes += text.len() as u64;
            sent += 1;
            target.send(&node, text).await
        }
        Some(n) => {
            let filler = vec![0xA5u8; args.size - SEQ_LEN];
            let mut buf = BytesMut::with_capacity(64 << 10);
            let mut result = Ok(());
            for seq in 0..n {
                buf.reserve(args.size);
                buf.put_u64_le(seq);
                buf.put_slice(&filler);
                if let Err(e) = target.send(&node, buf.split().freeze()).await {
                    result = Err(e);
                    break;
                }
                sent += 1;
                bytes += args.size as u64;
            }
            result
        }
    };
    // Exit only once the destination has everything (a relay may die meanwhile: what it lost
    // is written again), and members had the time to ask for what they lost.
    let flushed = result.is_ok() && node.drain(Duration::from_secs(FLUSH_WAIT_SECS)).await;
    let copies = node.stats().group_copies_sent;
    node.shutdown().await;
    // "Acknowledged" includes given up: say which messages were, and why.
    let mut undeliverable = 0;
    let mut unreachable = 0;
    while let Ok(Some(ev)) = tokio::time::timeout(EVENTS_DRAIN_WAIT, events.recv()).await {
        match &ev {
            busway::Event::Undeliverable { peer, seqs, .. } if target.counts_loss_to(*peer) => {
                undeliverable += seqs.end - seqs.start;
                crate::say::info(crate::common::describe(&ev));
            }
            // A relay had no way on toward a receiver: it will not get what follows either.
            busway::Event::MulticastUnreachable { .. } => {
                unreachable += 1;
                crate::say::info(crate::common::describe(&ev));
            }
            _ => {}
        }
    }
    result.map_err(|e| format!("after {sent} messages: {e}"))?;
    if undeliverable > 0 {
        return Err(format!(
            "{undeliverable} of {sent} messages to {target} were not confirmed (given up: some may have arrived, see above)"
        ));
    }
    if unreachable > 0 {
        return Err(format!(
            "the multicast to {target} did not reach every receiver ({unreachable} report(s) of a relay with no way on)"
        ));
    }
    if !flushed {
        return Err(format!(
            "{sent} messages queued, but not all were acknowledged within {FLUSH_WAIT_SECS} s"
        ));
    }
    if copies > 0 {
        crate::say::info(format_args!(
            "sent {copies} copies to members that lost publishes with a link or relay"
        ));
    }
    let secs = start.elapsed().as_secs_f64();
    crate::say::info(format_args!(
        "sent {sent} messages ({bytes} bytes) in {secs:.3} s ({:.0} msg/s)",
        sent as f64 / secs.max(1e-9)
    ));
    Ok(ExitCode::SUCCESS)
}

/// Where `send` sends.
enum Target {
    Node(BusId),
    Group(String),
    Multicast(Vec<BusId>),
}

impl Target {
    async fn send(&self, node: &busway::Node, payload: Bytes) -> Result<(), String> {
        match self {
            Target::Node(to) => node
                .send(*to, payload)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Target::Group(g) => node
                .publish(g, payload)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
            Target::Multicast(ids) => node
                .multicast(ids, payload)
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }

    /// Whether messages given up on toward `peer` are this send's loss: none for a group or
    /// a multicast (a member or receiver asks the source for what a dead link or relay lost,
    /// and reports what it cannot get back, `listen --verify` included).
    fn counts_loss_to(&self, peer: BusId) -> bool {
        match self {
            Target::Node(to) => *to == peer,
            Target::Group(_) | Target::Multicast(_) => false,
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Node(to) => write!(f, "bus id {to}"),
            Target::Group(g) => write!(f, "group {g}"),
            Target::Multicast(ids) => {
                let ids: Vec<String> = ids.iter().map(BusId::to_string).collect();
                write!(f, "bus ids {}", ids.join(","))
            }
        }
    }
}
