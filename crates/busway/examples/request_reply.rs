//! Request/reply between two nodes: a server task answers every request from its inbox, and
//! a hundred client tasks call it at once; then a call that nobody answers in time.
//! `cargo run --release -p busway --example request_reply`

use busway::{BusId, CallError, Node, NodeConfig};
use bytes::Bytes;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server =
        Node::start(NodeConfig::new(BusId(1)).listen("tcp://127.0.0.1:0".parse()?)).await?;
    let client =
        Node::start(NodeConfig::new(BusId(2)).connect(server.listen_addrs()[0].clone())).await?;
    if !client.wait_for_peer(BusId(1), Duration::from_secs(5)).await {
        return Err("no link came up".into());
    }
    let mut inbox = server.take_inbox().expect("taken once");
    tokio::spawn(async move {
        while let Some(m) = inbox.recv().await {
            // "slow" is held past its caller's timeout; everything else is answered at once.
            if &m.payload[..] == b"slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let answer = format!("{} bytes", m.payload.len());
            let _ = m.reply(Bytes::from(answer)).await;
        }
    });
    let calls: Vec<_> = (0..100)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let payload = Bytes::from(vec![b'x'; i]);
                client.call(BusId(1), payload, Duration::from_secs(5)).await
            })
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let reply = c.await??;
        assert_eq!(reply.payload, format!("{i} bytes"));
    }
    println!("100 calls answered");
    let late = client
        .call(
            BusId(1),
            Bytes::from_static(b"slow"),
            Duration::from_millis(100),
        )
        .await;
    assert_eq!(late, Err(CallError::Timeout { after_ms: 100 }));
    println!("the slow one: {}", late.unwrap_err());
    client.shutdown().await;
    server.shutdown().await;
    Ok(())
}
