//! A group: a hub (relay) with two lobbies registered below it that join "world", and a
//! game server that publishes world events through the hub. Each publish crosses the game
//! server's one link once; the hub passes it on to both lobbies.
//! `cargo run --release -p busway --example groups`

use busway::{BusId, GroupPolicy, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hub = Node::start(NodeConfig::new(BusId(100)).listen("tcp://127.0.0.1:0".parse()?)).await?;
    let hub_addr = hub.listen_addrs()[0].clone();
    let mut lobbies = Vec::new();
    for id in [1, 2] {
        let lobby = Node::start(NodeConfig::new(BusId(id)).upstream(hub_addr.clone())).await?;
        lobby.join("world")?;
        lobbies.push(lobby);
    }
    let game = Node::start(NodeConfig::new(BusId(10)).upstream(hub_addr)).await?;
    // The default: a lobby that falls too far behind is cut off (it gets
    // `Event::GroupCutOff` and leaves) while the other keeps its rate; `Backpressure` would
    // make the game server wait for the slowest lobby instead.
    game.set_group_policy("world", GroupPolicy::CutOff);
    // Interest travels as messages: wait until the hub told the game server it wants "world".
    let deadline = tokio::time::Instant::now() + WAIT;
    while game.group_links("world").is_empty() || hub.group_links("world").len() < 2 {
        if tokio::time::Instant::now() > deadline {
            return Err("the lobbies' interest did not arrive".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for event in ["dragon spawned", "season ends in 1 h"] {
        let links = game.publish("world", Bytes::from(event)).await?;
        println!("published {event:?} on {links} link(s)");
    }
    for lobby in &lobbies {
        let mut inbox = lobby.take_inbox().expect("taken once");
        for _ in 0..2 {
            let m = tokio::time::timeout(WAIT, inbox.recv())
                .await?
                .ok_or("inbox closed")?;
            println!(
                "lobby {} got {:?} from {} in group {}",
                lobby.id(),
                std::str::from_utf8(&m.payload)?,
                m.src,
                m.group.as_deref().unwrap_or("-")
            );
        }
    }
    // Before the game server goes: its publishes acknowledged, and the lobbies given the time
    // to ask for any a relay lost (`Node::drain`, `DRAIN_QUIET_MS`).
    if !game.drain(Duration::from_secs(10)).await {
        return Err("the game server's publishes did not settle".into());
    }
    for n in lobbies.into_iter().chain([game, hub]) {
        n.shutdown().await;
    }
    Ok(())
}
