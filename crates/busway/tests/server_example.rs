//! `examples/server.rs` as a user runs it: the example's binary in a process of its own, and a
//! node of this test that calls it, publishes to its group and sends it a message, each seen
//! in what the server prints; then SIGTERM stops it cleanly, exit code 0.
//!
//! The binary is the one `cargo test --release -p busway` builds with the other examples
//! (`target/release/examples/server`). Cargo builds examples for a run of every test, not
//! for `--test server_example` alone: then build it first with
//! `cargo build --release -p busway --example server`.

mod common;

use busway::{BusId, DownReason, Event};
use bytes::Bytes;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tokio::sync::mpsc;

/// The example's binary: `examples/` beside `deps/`, where this test's binary is.
fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/PROFILE/deps");
    let bin = dir.join("examples").join("server");
    assert!(
        bin.exists(),
        "{} is not built: `cargo build --release -p busway --example server` first \
         (a run of every test builds it)",
        bin.display()
    );
    // A binary older than its source would test what the example was, not what it is.
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/server.rs");
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    assert!(
        modified(&bin) >= modified(&source),
        "{} is older than examples/server.rs: `cargo build --release -p busway --example server`",
        bin.display()
    );
    bin
}

/// The server's process, killed when the test ends, pass or fail, and its stdout's lines.
struct Server {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Server {
    fn start(addr: &str) -> Self {
        let mut child = Command::new(server_binary())
            .arg(addr)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the example starts");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let (tx, lines) = mpsc::unbounded_channel();
        // A thread of its own: the reads block.
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Reads lines until one that `pick` accepts; panics after `WAIT`, or if stdout ends first.
    async fn line<T>(&mut self, mut pick: impl FnMut(&str) -> Option<T>) -> T {
        let mut seen = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            while let Some(line) = self.lines.recv().await {
                if let Some(t) = pick(&line) {
                    return Some(t);
                }
                seen.push(line);
            }
            None
        })
        .await;
        match found {
            Ok(Some(t)) => t,
            Ok(None) => panic!("the server's stdout ended; it printed {seen:#?}"),
            Err(_) => panic!("not printed within {WAIT:?}; it printed {seen:#?}"),
        }
    }

    /// Waits for `line`, exactly.
    async fn printed(&mut self, line: &str) {
        self.line(|l| (l == line).then_some(())).await;
    }

    /// The exit code, once the process has exited (its stdout ended), at most `WAIT` after
    /// the last line read.
    async fn exit_code(&mut self) -> Option<i32> {
        let ended = tokio::time::timeout(WAIT, async {
            while let Some(line) = self.lines.recv().await {
                println!("the server went on: {line}");
            }
        });
        ended.await.expect("the server exits within the wait");
        self.child.wait().expect("the server's status").code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_example_serves_then_stops_on_sigterm() {
    // Port 0: the server prints the port it got, so no other test can take it meanwhile.
    let mut server = Server::start("tcp://127.0.0.1:0");
    let addr = server
        .line(|l| l.strip_prefix("listening on ").map(str::to_owned))
        .await;
    let client = start(config(2).connect(addr.parse().expect("an address"))).await;
    let mut events = client.take_events().expect("taken once");
    // This node reads only replies, which do not go through the inbox on a TCP link.
    drop(client.take_inbox());
    assert!(client.wait_for_peer(BusId(1), WAIT).await, "link up");
    // Its events: the link, from its side.
    server
        .line(|l| l.starts_with("peer 2 up").then_some(()))
        .await;

    // A request, answered.
    let reply = client
        .call(BusId(1), Bytes::from_static(b"2+2?"), WAIT)
        .await
        .expect("a reply");
    assert_eq!(&reply.payload[..], br#"lobby got "2+2?""#);
    server.printed("request from 2: 2+2?").await;

    // A publish to its group, once the server's interest in it has reached this node
    // (interest travels as messages, not events: looked at until it is there).
    tokio::time::timeout(WAIT, async {
        while client.group_links("lobby").is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(POLL_MS)).await;
        }
    })
    .await
    .expect("the server's interest in \"lobby\" within the wait");
    client
        .publish("lobby", Bytes::from_static(b"dragon spawned"))
        .await
        .expect("published");
    server.printed("group lobby from 2: dragon spawned").await;

    // A plain message.
    client
        .send(BusId(1), Bytes::from_static(b"hello"))
        .await
        .expect("sent");
    server.printed("from 2: hello").await;

    // SIGTERM: it stops reading, settles, closes its links with CLOSE and exits 0.
    let pid = server.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(kill.expect("kill runs").success(), "SIGTERM sent");
    server.printed("stopping").await;
    server.printed("stopped").await;
    assert_eq!(server.exit_code().await, Some(0));
    // The CLOSE said it shut down: this node gave up on it at once.
    wait_event(&mut events, |e| match e {
        Event::PeerDown {
            peer: BusId(1),
            reason: DownReason::PeerShutDown,
            ..
        } => Some(()),
        _ => None,
    })
    .await;
    client.shutdown().await;
}
