//! Group permissions: a hub that lets lobbies (ids 1 to 9) join "world" and only the game
//! server (id 10) publish to it. A cheat (id 66) that publishes to "world" is refused, and
//! its application hears why (`Event::GroupRefused`); the lobby gets the game server's
//! publishes only.
//! `cargo run --release -p busway --example group_permissions`

use busway::{BusId, Event, GroupPermissions, GroupRule, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = NodeConfig::new(BusId(100)).listen("tcp://127.0.0.1:0".parse()?);
    config.group_permissions = Some(GroupPermissions {
        rules: vec![
            GroupRule {
                ids: (BusId(1), BusId(9)),
                join: vec!["world".into()],
                publish: vec![],
            },
            GroupRule {
                ids: (BusId(10), BusId(10)),
                join: vec![],
                publish: vec!["world".into()],
            },
        ],
    });
    let hub = Node::start(config).await?;
    let hub_addr = hub.listen_addrs()[0].clone();
    let lobby = Node::start(NodeConfig::new(BusId(1)).upstream(hub_addr.clone())).await?;
    lobby.join("world")?;
    let game = Node::start(NodeConfig::new(BusId(10)).upstream(hub_addr.clone())).await?;
    let cheat = Node::start(NodeConfig::new(BusId(66)).upstream(hub_addr)).await?;
    let mut cheat_events = cheat.take_events().expect("taken once");
    // Interest travels as messages: wait until the hub told both publishers.
    let deadline = tokio::time::Instant::now() + WAIT;
    while game.group_links("world").is_empty() || cheat.group_links("world").is_empty() {
        if tokio::time::Instant::now() > deadline {
            return Err("the lobby's interest did not arrive".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cheat.publish("world", Bytes::from("free gold")).await?;
    let why = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(Event::GroupRefused { reason, .. }) = cheat_events.recv().await {
                return reason;
            }
        }
    })
    .await?;
    println!("the cheat was refused: {why}");
    game.publish("world", Bytes::from("dragon spawned")).await?;
    let mut inbox = lobby.take_inbox().expect("taken once");
    let m = tokio::time::timeout(WAIT, inbox.recv())
        .await?
        .ok_or("inbox closed")?;
    println!(
        "lobby got {:?} from {}",
        std::str::from_utf8(&m.payload)?,
        m.src
    );
    for n in [lobby, game, cheat, hub] {
        n.shutdown().await;
    }
    Ok(())
}
