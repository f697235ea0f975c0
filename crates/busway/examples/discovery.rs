//! Discovery through etcd: a lobby and a battle room that know only etcd's address. The room
//! registers where it listens; the lobby sends to the room's bus id, finds it in etcd and
//! dials it. Needs a running etcd (`apt-get install etcd-server`, then `etcd`); its URL from
//! BUSWAY_ETCD, default http://127.0.0.1:2379.
//! `cargo run --release -p busway --example discovery`

use busway::{BusId, EtcdConfig, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("BUSWAY_ETCD").unwrap_or_else(|_| "http://127.0.0.1:2379".into());
    let with_etcd = |id| {
        let mut c = NodeConfig::new(BusId(id));
        c.etcd = Some(EtcdConfig::new(vec![url.clone()]));
        c
    };
    let room = Node::start(with_etcd(2).listen("tcp://127.0.0.1:0".parse()?)).await?;
    let lobby = Node::start(with_etcd(1)).await?;
    // Registrations come from etcd's watch: wait until the lobby's directory names the room.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let info = lobby.discovery().ok_or("etcd is configured")?;
        if info.nodes.iter().any(|n| n.id == BusId(2)) {
            println!("the lobby found room 2 at {:?}", info.nodes[0].addrs);
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let why = info
                .last_error
                .unwrap_or_else(|| "no registration yet".into());
            return Err(format!("room 2 not found in etcd at {url}: {why}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lobby.send(BusId(2), Bytes::from("match 7 starts")).await?;
    let mut inbox = room.take_inbox().expect("taken once");
    let m = tokio::time::timeout(WAIT, inbox.recv())
        .await?
        .ok_or("inbox closed")?;
    println!(
        "room 2 got {:?} from {}",
        std::str::from_utf8(&m.payload)?,
        m.src
    );
    lobby.shutdown().await;
    room.shutdown().await;
    Ok(())
}
