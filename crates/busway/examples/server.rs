//! A server: one node (bus id 1) that answers requests, is a member of the group "lobby",
//! prints the other messages sent to it and logs its links, all from one `tokio::select!`
//! loop, until Ctrl-C or SIGTERM stops it cleanly (its replies acknowledged, CLOSE sent to
//! every peer, exit code 0; a second signal while it stops exits at once, with 1).
//! `cargo run --release -p busway --example server [tcp://127.0.0.1:7000]`
//! then, from another shell, with the `busway` binary (`cargo build --release -p busway-cli`):
//! `busway call --id 2 --connect tcp://127.0.0.1:7000 --to 1 "2+2?"` prints the reply,
//! `busway send --id 3 --connect tcp://127.0.0.1:7000 --group lobby "dragon spawned"` and
//! `busway send --id 4 --connect tcp://127.0.0.1:7000 --to 1 hello` are printed by the server,
//! with a line for each peer up and down.

use busway::{BusId, Event, MessageBatch, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// Longest wait, once stopped, for the replies sent to be acknowledged.
const DRAIN: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1);
    let addr = addr.as_deref().unwrap_or("tcp://127.0.0.1:7000").parse()?;
    // Before the node starts, so that a signal during the start stops it cleanly too rather
    // than kill the process (the signals' default).
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let node = Node::start(NodeConfig::new(BusId(1)).listen(addr)).await?;
    let mut inbox = node.take_inbox().expect("taken once");
    let mut events = node.take_events().expect("taken once");
    node.join("lobby")?;
    // The bound address: with port 0, the one the system picked.
    println!("listening on {}", node.listen_addrs()[0]);
    loop {
        // `select!` drops the branches that lose: neither `recv` loses a message or event so.
        tokio::select! {
            // `recv_batch` rather than `recv`: one wake-up for all that one sender's read
            // brought, read in place from one buffer, not one `Message` per message.
            batch = inbox.recv_batch() => match batch {
                Some(batch) => serve(&batch),
                None => break, // the node is gone
            },
            event = events.recv() => match event {
                Some(event) => log(&event),
                None => break,
            },
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    println!("stopping");
    // Stop reading: what comes now is discarded, and a request among it is answered at once
    // with an error instead of waiting out its caller's timeout.
    drop(inbox);
    tokio::select! {
        () = stop(node) => println!("stopped"),
        _ = interrupt.recv() => std::process::exit(1),
        _ = terminate.recv() => std::process::exit(1),
    }
    Ok(())
}

/// Answers the requests of `batch` and prints the rest. A batch is from one sender, in the
/// order sent, and either all publishes to one group or none.
fn serve(batch: &MessageBatch) {
    let from = batch.src();
    for (i, payload) in batch.iter().enumerate() {
        let text = String::from_utf8_lossy(payload);
        if let Some(request) = batch.request(i) {
            // `try_reply`, not `reply().await`: a caller that does not read its replies keeps
            // its queue full, and an awaited reply would hold this loop, and every other
            // caller, with it. This way only that caller goes without its answer.
            let answer = Bytes::from(format!("lobby got {text:?}"));
            match request.try_reply(answer) {
                Ok(()) => println!("request from {from}: {text}"),
                Err(e) => println!("request from {from}: {text} (not answered: {e})"),
            }
        } else if let Some(group) = batch.group() {
            println!("group {group} from {from}: {text}");
        } else {
            println!("from {from}: {text}");
        }
    }
}

fn log(event: &Event) {
    match event {
        Event::PeerUp { peer, addr, .. } => println!("peer {peer} up ({addr})"),
        // Its unacknowledged messages are kept for its next link, or reported undeliverable.
        Event::PeerDown { peer, reason, .. } => println!("peer {peer} down: {reason}"),
        Event::Undeliverable {
            peer, seqs, reason, ..
        } => println!("gave up on messages {seqs:?} to {peer}: {reason}"),
        // `Event` is non-exhaustive: a later busway may add kinds.
        other => println!("event: {other:?}"),
    }
}

/// Stops the node cleanly: what it sent settled first (`drain`: the replies acknowledged,
/// and, had it published, its groups' members given the time to ask for what they lost),
/// then every link closed with CLOSE, so that peers give up on it at once.
async fn stop(node: Node) {
    if !node.drain(DRAIN).await {
        eprintln!("not all replies were acknowledged within {DRAIN:?}");
    }
    node.shutdown().await;
}
