//! Helpers shared by the integration tests: nodes on loopback, bounded waits.

#![allow(dead_code, unreachable_pub)]

use busway::{Addr, BusId, Event, Events, IoThreads, Node, NodeConfig};
use std::time::Duration;

/// Longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(10);
/// How often a test looks at a node's state while it waits for that state (always bounded by
/// `WAIT`), in ms.
pub const POLL_MS: u64 = 2;

/// The transports every conformance test runs over; tcp6 is left out where the machine has no
/// IPv6 loopback. `shm` is a Unix link whose data moves to shared-memory rings, opened through
/// `/proc` as between processes; `mem` is the same link between nodes of one process, whose
/// rings are taken in-process; the others keep their data on the socket.
pub fn transports() -> Vec<&'static str> {
    let mut t = vec!["tcp4", "unix", "shm", "mem"];
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        t.push("tcp6");
    }
    t
}

/// A fresh listen address of the given transport.
pub fn listen_addr(transport: &str) -> Addr {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    match transport {
        "tcp4" => "tcp://127.0.0.1:0".parse().unwrap(),
        "tcp6" => "tcp://[::1]:0".parse().unwrap(),
        _ => format!(
            "unix://{}/busway-test-{}-{}.sock",
            std::env::temp_dir().display(),
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
        .parse()
        .unwrap(),
    }
}

pub fn config(id: u64) -> NodeConfig {
    NodeConfig::new(BusId(id)).io_threads(IoThreads::Dedicated(1))
}

pub async fn start(config: NodeConfig) -> Node {
    Node::start(config).await.expect("node starts")
}

/// A listening node and a node dialing it, with the link up.
pub async fn pair(transport: &str, mut a: NodeConfig, mut b: NodeConfig) -> (Node, Node) {
    match transport {
        "shm" => {
            a.mem_channels = false;
            b.mem_channels = false;
        }
        "mem" => {}
        _ => {
            a.shm_channels = false;
            b.shm_channels = false;
        }
    }
    let a = start(a.listen(listen_addr(transport))).await;
    let addr = a.listen_addrs()[0].clone();
    let b = start(b.connect(addr)).await;
    assert!(
        b.wait_for_peer(a.id(), WAIT).await,
        "link up over {transport}"
    );
    assert!(
        a.wait_for_peer(b.id(), WAIT).await,
        "link up over {transport}"
    );
    (a, b)
}

/// Waits for the first event that `pick` accepts; panics after `WAIT`.
pub async fn wait_event<T>(events: &mut Events, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let ev = events.recv().await.expect("events stream open");
            if let Some(t) = pick(&ev) {
                return t;
            }
        }
    })
    .await;
    found.expect("the expected event within the wait")
}

/// Waits for `id`'s link to go down for a protocol error; returns the reason.
pub async fn protocol_error_of(events: &mut Events, id: u64) -> String {
    wait_event(events, |e| match e {
        Event::PeerDown {
            peer,
            reason: busway::DownReason::ProtocolError(r),
            ..
        } if peer.0 == id => Some(r.clone()),
        _ => None,
    })
    .await
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Completes a real handshake by hand as bus id `id`; returns the socket, ready for frames.
pub async fn authenticated(
    addr: std::net::SocketAddr,
    id: u64,
    secret: Option<&str>,
) -> tokio::net::TcpStream {
    authenticated_as(addr, id, secret, |_| {}).await
}

/// Like `authenticated`, with the HELLO changed by `tweak` first (capabilities, host id).
pub async fn authenticated_as(
    addr: std::net::SocketAddr,
    id: u64,
    secret: Option<&str>,
    tweak: impl FnOnce(&mut busway_core::handshake::Hello),
) -> tokio::net::TcpStream {
    authenticated_with_rest(addr, id, secret, tweak).await.0
}

/// Like `authenticated_as`, also returning what the node sent after its side of the
/// handshake in the same reads (its first frames on the link, e.g. a CHANNEL OFFER).
pub async fn authenticated_with_rest(
    addr: std::net::SocketAddr,
    id: u64,
    secret: Option<&str>,
    tweak: impl FnOnce(&mut busway_core::handshake::Hello),
) -> (tokio::net::TcpStream, bytes::BytesMut) {
    use busway_core::frame::HANDSHAKE_BODY_LEN_MAX;
    use busway_core::handshake::{local_hello, Handshake, NonceCache, Role, Secret, Step};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut hello = local_hello(BusId(id), id, now_ms(), [id as u8; 16], vec![]);
    tweak(&mut hello);
    let mut hs = Handshake::new(Role::Dialer, hello, secret.map(|s| Secret::new(s).unwrap()));
    s.write_all(&hs.hello_frame()).await.unwrap();
    let mut dec = busway_core::FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let mut buf = bytes::BytesMut::new();
    let mut nonces = NonceCache::default();
    loop {
        while let Some(f) = dec.decode(&mut buf).unwrap() {
            match hs.handle_frame(&f, now_ms(), &mut nonces).unwrap() {
                Step::PeerHello(_) => s.write_all(&hs.auth_frame(0, 0)).await.unwrap(),
                Step::Established(_) => return (s, buf),
            }
        }
        assert!(
            s.read_buf(&mut buf).await.unwrap() > 0,
            "node closed the handshake"
        );
    }
}

/// Receives the messages numbered `range` from `from`, in order, each once, each equal to
/// `msg(number)` (whose first 8 bytes are the number, little-endian); panics if the stream
/// stalls for 30 s.
pub async fn expect_in_order(
    inbox: &mut busway::Inbox,
    from: BusId,
    range: std::ops::Range<u64>,
    msg: fn(u64) -> Vec<u8>,
) {
    expect_in_order_and(inbox, from, range, msg, |_| {}).await;
}

/// Like `expect_in_order`, calling `progress` with the next number expected after each batch
/// (to act while the stream flows, e.g. cut the link once part of it is in).
pub async fn expect_in_order_and(
    inbox: &mut busway::Inbox,
    from: BusId,
    range: std::ops::Range<u64>,
    msg: fn(u64) -> Vec<u8>,
    mut progress: impl FnMut(u64),
) {
    let mut expected = range.start;
    let done = tokio::time::timeout(Duration::from_secs(30), async {
        while expected < range.end {
            let batch = inbox.recv_batch().await.unwrap();
            assert_eq!(batch.src(), from);
            for p in batch.iter() {
                let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                assert_eq!(seq, expected, "in order, each once");
                assert_eq!(p, msg(seq).as_slice());
                expected += 1;
            }
            progress(expected);
        }
    })
    .await;
    assert!(done.is_ok(), "stream stalled at {expected}");
}

/// The marker `nothing_more_from` sends: no numbered message of the tests looks like it.
const END_MARKER: &[u8] = b"end of the stream: nothing after this";

/// Asserts that `inbox` holds nothing more from `from` (no duplicate after the end of a
/// stream): `from` sends a marker, and the next message must be it. No quiet period to wait
/// out: messages of a pair arrive in the order sent, so a duplicate would come first.
pub async fn nothing_more_from(from: &busway::Node, inbox: &mut busway::Inbox, to: BusId) {
    send_and_expect(from, to, inbox, END_MARKER).await;
}

/// `from` sends `payload` to `to`, and it must be the next message in `inbox` (`to`'s), within
/// `WAIT`.
pub async fn send_and_expect(
    from: &busway::Node,
    to: BusId,
    inbox: &mut busway::Inbox,
    payload: &'static [u8],
) {
    from.send(to, bytes::Bytes::from_static(payload))
        .await
        .unwrap();
    let next = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .expect("the message arrives")
        .expect("the inbox is open");
    assert_eq!(
        (next.src, next.payload.as_ref()),
        (from.id(), payload),
        "the next message is the one sent"
    );
}

/// The next message in `inbox`, within `WAIT`: a message that never comes fails the test
/// rather than hanging it.
pub async fn next_message(inbox: &mut busway::Inbox) -> busway::Message {
    tokio::time::timeout(WAIT, inbox.recv())
        .await
        .expect("the next message within the wait")
        .expect("the inbox is open")
}

/// The next batch in `inbox`, within `WAIT` (see `next_message`).
pub async fn next_batch(inbox: &mut busway::Inbox) -> busway::MessageBatch {
    tokio::time::timeout(WAIT, inbox.recv_batch())
        .await
        .expect("the next batch within the wait")
        .expect("the inbox is open")
}

/// Waits until `cond` holds, looking every `POLL_MS`; panics after `WAIT` naming `what`.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let ok = tokio::time::timeout(WAIT, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "{what} within {WAIT:?}");
}

/// A node's config for a test in virtual time (`#[tokio::test(start_paused = true)]`): its
/// tasks run on the test's runtime, whose clock moves only to the next timer when nothing
/// else is to do, so the node's timers run at their default lengths in no real time. Its
/// links keep their data on the socket: a ring's reader is woken by a thread of its own,
/// which the paused clock cannot see (it would move on while that thread is about to wake).
pub fn virtual_config(id: u64) -> NodeConfig {
    let mut c = NodeConfig::new(BusId(id)).io_threads(IoThreads::Current);
    c.shm_channels = false;
    c.mem_channels = false;
    c
}

/// How often `until_virtual` looks, in virtual ms: the node's timer runs no more often.
pub const VIRTUAL_POLL_MS: u64 = 100;

/// Waits until `cond` holds, in virtual time, at most `limit` of it; returns how much virtual
/// time that took.
pub async fn until_virtual(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Duration {
    let started = tokio::time::Instant::now();
    let ok = tokio::time::timeout(limit, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(VIRTUAL_POLL_MS)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "{what} within {limit:?} of virtual time");
    started.elapsed()
}

/// Starts a node again with the config it had (its old listening socket may linger a moment).
pub async fn start_again(config: NodeConfig) -> Node {
    for _ in 0..200 {
        if let Ok(n) = Node::start(config.clone()).await {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("could not start node {} again", config.id);
}

/// The tree of the relay-kill tests: top relay (100) <- mid relay (101, subtree 101..199) <-
/// node 104; node 2 and the source 1 below top; node 3 linked to the source directly over a
/// unix socket (moved to shared memory). Either relay can be killed (dropped: its queues die
/// with it) and started again at its old addresses.
pub struct KillTree {
    pub source: Node,
    pub r2: Node,
    pub r3: Node,
    pub deep: Node,
    top: Option<Node>,
    top_config: NodeConfig,
    mid: Option<Node>,
    mid_config: NodeConfig,
}

impl KillTree {
    pub async fn start() -> Self {
        let top_config = config(100).listen(listen_addr("tcp4"));
        let top = start(top_config.clone()).await;
        let top_config = NodeConfig {
            listen: top.listen_addrs(),
            ..top_config
        };
        let top_addr = top.listen_addrs()[0].clone();
        let mut mid_config = config(101)
            .upstream(top_addr.clone())
            .listen(listen_addr("tcp4"));
        mid_config.direct_links = false;
        mid_config.dial_backoff_min_ms = 5;
        mid_config.subtree = Some((BusId(101), BusId(199)));
        let mid = start(mid_config.clone()).await;
        let mid_config = NodeConfig {
            listen: mid.listen_addrs(),
            ..mid_config
        };
        let mid_addr = mid.listen_addrs()[0].clone();
        let fast = |mut c: NodeConfig| {
            c.direct_links = false;
            c.dial_backoff_min_ms = 5;
            c
        };
        let source = start(fast(
            config(1)
                .upstream(top_addr.clone())
                .listen(listen_addr("unix")),
        ))
        .await;
        let r2 = start(fast(config(2).upstream(top_addr.clone()))).await;
        let r3 = start(fast(config(3).connect(source.listen_addrs()[0].clone()))).await;
        let deep = start(fast(config(104).upstream(mid_addr))).await;
        assert!(source.wait_for_peer(BusId(3), WAIT).await);
        assert!(mid.wait_for_peer(BusId(104), WAIT).await);
        for id in [1, 2, 101] {
            assert!(top.wait_for_peer(BusId(id), WAIT).await);
        }
        Self {
            source,
            r2,
            r3,
            deep,
            top: Some(top),
            top_config,
            mid: Some(mid),
            mid_config,
        }
    }

    pub fn top(&self) -> &Node {
        self.top.as_ref().expect("running")
    }

    /// Kills the top relay (else the mid one) and starts it again.
    pub async fn kill_and_restart(&mut self, top: bool) {
        if top {
            drop(self.top.take());
            self.top = Some(start_again(self.top_config.clone()).await);
        } else {
            drop(self.mid.take());
            self.mid = Some(start_again(self.mid_config.clone()).await);
        }
    }

    pub async fn shutdown(self) {
        let relays = [self.mid, self.top].into_iter().flatten();
        for n in [self.source, self.r2, self.r3, self.deep]
            .into_iter()
            .chain(relays)
        {
            n.shutdown().await;
        }
    }
}

/// A ROUTED DATA frame from `src` (incarnation `src`) to `dst`, first of its pair, carrying
/// the whole frame `inner`: what a peer may not put inside one is tested with it.
pub fn routed_data(src: u64, dst: u64, inner: &[u8]) -> bytes::Bytes {
    use busway_core::routed::{routed_frame, RoutedHeader, RoutedType};
    let h = RoutedHeader {
        kind: RoutedType::Data,
        ttl: 16,
        src: BusId(src),
        src_incarnation: src,
        dst: BusId(dst),
        seq: 0,
        settled: false,
        route: vec![],
    };
    routed_frame(&h, inner)
}
