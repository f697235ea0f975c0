//! A node from a configuration file: the same TOML that `busway node -c FILE` reads
//! (`docs/busway.toml` has every setting, commented). A key the node does not know, a value
//! of the wrong type or a bad address is an error that names the key and its line.
//! `cargo run --release -p busway --example config_file`

use busway::{Node, NodeConfig};

const FILE: &str = r#"
id = 7
listen = ["tcp://127.0.0.1:0"]
heartbeat_interval_ms = 500
group_retain_bytes = 1048576
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = NodeConfig::from_toml(FILE)?;
    let node = Node::start(config).await?;
    println!("node {} listening on {}", node.id(), node.listen_addrs()[0]);
    node.shutdown().await;
    // What a typo looks like.
    let typo = NodeConfig::from_toml("id = 7\nheartbeat_intervl_ms = 500\n").unwrap_err();
    let first = typo
        .to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    println!("a typo at line {:?}: {first}", typo.line());
    Ok(())
}
