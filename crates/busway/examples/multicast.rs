//! A multicast: a hub (relay) with three battle rooms registered below it, and a lobby that
//! tells two of them (not the third) that a match starts. The lobby writes one frame to the
//! hub naming both rooms; the hub splits it, one frame to each room.
//! `cargo run --release -p busway --example multicast`

use busway::{BusId, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hub = Node::start(NodeConfig::new(BusId(100)).listen("tcp://127.0.0.1:0".parse()?)).await?;
    let hub_addr = hub.listen_addrs()[0].clone();
    let mut rooms = Vec::new();
    for id in [1, 2, 3] {
        rooms.push(Node::start(NodeConfig::new(BusId(id)).upstream(hub_addr.clone())).await?);
    }
    let lobby = Node::start(NodeConfig::new(BusId(10)).upstream(hub_addr)).await?;
    for id in [1, 2, 3, 10] {
        if !hub.wait_for_peer(BusId(id), WAIT).await {
            return Err(format!("node {id} did not register with the hub").into());
        }
    }
    let links = lobby
        .multicast(&[BusId(1), BusId(2)], Bytes::from("match 7 starts"))
        .await?;
    println!("multicast to rooms 1 and 2 on {links} link(s)");
    for room in &rooms[..2] {
        let mut inbox = room.take_inbox().expect("taken once");
        let m = tokio::time::timeout(WAIT, inbox.recv())
            .await?
            .ok_or("inbox closed")?;
        println!(
            "room {} got {:?} from {}",
            room.id(),
            std::str::from_utf8(&m.payload)?,
            m.src
        );
    }
    // Without an upstream to ask, an id this node never linked to is refused before
    // anything is sent.
    let alone = Node::start(NodeConfig::new(BusId(20))).await?;
    let unknown = alone.multicast(&[BusId(999)], Bytes::from("x")).await;
    println!(
        "to an unknown id: {}",
        unknown.err().ok_or("sent to nobody")?
    );
    alone.shutdown().await;
    for n in rooms.into_iter().chain([lobby, hub]) {
        n.shutdown().await;
    }
    Ok(())
}
