//! `tls://` links (issue #11, item 8): encrypted, mutually authenticated, and a node may claim
//! only the bus ids its certificate names. Certificates are made here (rcgen), for loopback.

mod common;

use busway::{BusId, Event, Node, Rejection, TlsConfig};
use busway_core::handshake::{local_hello, Handshake, Hello, NonceCache, Role, Step};
use bytes::BytesMut;
use common::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate authority of a test cluster.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new() -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A node certificate with these DNS names, and its key, as PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.cert, &self.key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn tls(&self, names: &[&str]) -> TlsConfig {
        let (cert, key) = self.issue(names);
        TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), self.cert.pem().as_bytes()).unwrap()
    }
}

fn tls_node(id: u64, tls: TlsConfig) -> busway::NodeConfig {
    let mut c = config(id).tls(tls);
    c.shm_channels = false;
    c
}

fn msg(n: u64) -> Vec<u8> {
    let mut m = n.to_le_bytes().to_vec();
    m.resize(8 + (n % 200) as usize, n as u8);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_link_carries_a_stream_in_order() {
    let ca = Ca::new();
    let a =
        start(tls_node(1, ca.tls(&["1.id.busway"])).listen("tls://127.0.0.1:0".parse().unwrap()))
            .await;
    let addr = a.listen_addrs()[0].clone();
    assert!(addr.to_string().starts_with("tls://127.0.0.1:"), "{addr}");
    let b = start(tls_node(2, ca.tls(&["2.id.busway"])).connect(addr)).await;
    assert!(b.wait_for_peer(BusId(1), WAIT).await, "link up");
    let mut inbox = a.take_inbox().unwrap();
    let n = 20_000;
    let payloads: Vec<Vec<u8>> = (0..n).map(msg).collect();
    b.send_batch(BusId(1), &payloads).await.unwrap();
    expect_in_order(&mut inbox, BusId(2), 0..n, msg).await;
    nothing_more_from(&b, &mut inbox, BusId(1)).await;
    assert_eq!(a.peers()[0].addr.split("://").next(), Some("tls"));
}

/// A TLS client of the test's own: presents a certificate naming `names`, then runs the busway
/// handshake as `id` (with `tweak` applied to its HELLO), and reads until the node closes.
async fn claim(
    addr: std::net::SocketAddr,
    ca: &Ca,
    names: &[&str],
    id: u64,
    tweak: impl FnOnce(&mut Hello),
) {
    let (cert, key) = ca.issue(names);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert.pem().as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The listener's certificate names "1.id.busway": the name this client checks.
    let name = ServerName::try_from("1.id.busway").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake with a certificate of the cluster's authority");
    let mut hello = local_hello(BusId(id), id, now_ms(), [id as u8; 16], vec![]);
    tweak(&mut hello);
    let mut hs = Handshake::new(Role::Dialer, hello, None);
    s.write_all(&hs.hello_frame()).await.unwrap();
    s.flush().await.unwrap();
    let mut dec = busway_core::FrameDecoder::new(busway_core::frame::HANDSHAKE_BODY_LEN_MAX);
    let mut buf = BytesMut::new();
    let mut nonces = NonceCache::default();
    let talk = async {
        loop {
            while let Ok(Some(f)) = dec.decode(&mut buf) {
                if let Ok(Step::PeerHello(_)) = hs.handle_frame(&f, now_ms(), &mut nonces) {
                    s.write_all(&hs.auth_frame(0, 0)).await.unwrap();
                    s.flush().await.unwrap();
                }
            }
            match s.read_buf(&mut buf).await {
                Ok(n) if n > 0 => {}
                _ => return,
            }
        }
    };
    tokio::time::timeout(WAIT, talk)
        .await
        .expect("the node closes the link");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn tls_addr(node: &Node) -> std::net::SocketAddr {
    match node.listen_addrs()[0].clone() {
        busway::Addr::Tls(a) => a,
        other => panic!("not tls: {other}"),
    }
}

async fn rejected(events: &mut busway::Events, needle: &str) -> String {
    rejected_as(events, needle).await.1
}

/// The next refusal whose text holds `needle`: its kind and text.
async fn rejected_as(events: &mut busway::Events, needle: &str) -> (Rejection, String) {
    wait_event(events, |e| match e {
        Event::Rejected { reason, kind, .. } if reason.contains(needle) => {
            Some((*kind, reason.clone()))
        }
        _ => None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_claim_an_id_its_certificate_does_not_name() {
    let ca = Ca::new();
    let a =
        start(tls_node(1, ca.tls(&["1.id.busway"])).listen("tls://127.0.0.1:0".parse().unwrap()))
            .await;
    let mut events = a.take_events().unwrap();
    let addr = tls_addr(&a);
    // A member whose certificate names 2 says it is 3.
    claim(addr, &ca, &["2.id.busway"], 3, |_| {}).await;
    let why = rejected(&mut events, "claims bus id 3").await;
    assert!(why.contains("its TLS certificate names 2"), "{why}");
    // A relay named for 7 registers 5..=9 for its subtree.
    claim(addr, &ca, &["7.id.busway"], 7, |h| {
        h.downstream_of_you = Some((BusId(5), BusId(9)));
    })
    .await;
    let why = rejected(&mut events, "registers bus ids 5..=9").await;
    assert!(why.contains("names 7"), "{why}");
    // Neither got in; an honest node does.
    assert!(a.peers().is_empty(), "{:?}", a.peers());
    let b = start(tls_node(2, ca.tls(&["2.id.busway"])).connect(a.listen_addrs()[0].clone())).await;
    assert!(b.wait_for_peer(BusId(1), WAIT).await);
    send_and_expect(&b, BusId(1), &mut a.take_inbox().unwrap(), b"honest").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_and_plain_tcp_are_refused_and_the_node_keeps_serving() {
    let ca = Ca::new();
    let mut ac = tls_node(1, ca.tls(&["1.id.busway"])).listen("tls://127.0.0.1:0".parse().unwrap());
    ac.handshake_timeout_ms = 300;
    let a = start(ac).await;
    let mut events = a.take_events().unwrap();
    let addr = a.listen_addrs()[0].clone();
    // A node whose certificate another authority signed.
    let other = Ca::new();
    let (cert, key) = other.issue(&["2.id.busway"]);
    let stranger =
        TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), other.cert.pem().as_bytes()).unwrap();
    let s = start(tls_node(2, stranger).connect(addr.clone())).await;
    let (kind, why) = rejected_as(&mut events, "TLS handshake failed").await;
    assert_eq!(kind, Rejection::Tls, "{why}");
    s.shutdown().await;
    // A busway peer that speaks no TLS.
    let mut plain = tokio::net::TcpStream::connect(tls_addr(&a)).await.unwrap();
    let _ = plain.write_all(b"not a TLS client hello").await;
    let (kind, why) = rejected_as(&mut events, "TLS handshake failed").await;
    assert_eq!(kind, Rejection::Tls, "{why}");
    // A connection that says nothing is let go at the handshake's deadline.
    let _silent = tokio::net::TcpStream::connect(tls_addr(&a)).await.unwrap();
    rejected(&mut events, "TLS handshake took more than 300 ms").await;
    // The node still serves its members.
    let b = start(tls_node(3, ca.tls(&["3.id.busway"])).connect(addr)).await;
    assert!(b.wait_for_peer(BusId(1), WAIT).await);
}

#[test]
fn configuration_mistakes_are_named() {
    let ca = Ca::new();
    let e = TlsConfig::from_pem(b"", b"", b"").unwrap_err();
    assert_eq!(
        (e.setting(), e.kind()),
        (Some("tls"), busway::ErrorKind::Config)
    );
    let e = e.to_string();
    assert!(e.contains("certificate chain"), "{e}");
    let (cert, key) = ca.issue(&["1.id.busway"]);
    let e = TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), b"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("certificate authorities"), "{e}");
    let tls = ca.tls(&["1.id.busway"]);
    let c = busway::NodeConfig::new(BusId(9)).tls(tls);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("names bus ids 1 but not its own id 9"), "{e}");
    let c = busway::NodeConfig::new(BusId(9)).listen("tls://127.0.0.1:0".parse().unwrap());
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("tls://127.0.0.1:0 needs TLS"), "{e}");
}
