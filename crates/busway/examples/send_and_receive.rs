//! Two nodes of one process: one listens, one dials it; messages one way, in order.
//! `cargo run --release -p busway --example send_and_receive`

use busway::{BusId, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Node::start(NodeConfig::new(BusId(1)).listen("tcp://127.0.0.1:0".parse()?)).await?;
    let b = Node::start(NodeConfig::new(BusId(2)).connect(a.listen_addrs()[0].clone())).await?;
    let mut inbox = a.take_inbox().expect("taken once");
    if !b.wait_for_peer(BusId(1), Duration::from_secs(5)).await {
        return Err("no link came up".into());
    }
    b.send(BusId(1), Bytes::from_static(b"hello")).await?;
    b.send_batch(BusId(1), &[&b"many"[..], b"small", b"ones"])
        .await?;
    for _ in 0..4 {
        let m = inbox.recv().await.ok_or("node gone")?;
        println!("from {}: {}", m.src, String::from_utf8_lossy(&m.payload));
    }
    b.shutdown().await;
    a.shutdown().await;
    Ok(())
}
