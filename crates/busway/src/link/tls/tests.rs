//! The texts of certificate mistakes, at both ends: this node's own certificate refused when
//! its configuration is made, and a peer's refused in the handshake (the peer here a bare
//! rustls client presenting what a busway node would refuse to present).

use super::*;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Longest a handshake of these tests may take before the test fails.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// The certificates `testdata/tls-openssl-v1/make.sh` made with `openssl x509 -req`.
const OPENSSL_V1_CERT: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/tls-openssl-v1/1.pem"
));
const OPENSSL_V1_KEY: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/tls-openssl-v1/1.key"
));
const OPENSSL_V1_CA: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/tls-openssl-v1/ca.pem"
));

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    /// An authority of a name of its own (as `busway cert ca` makes them).
    fn new() -> Self {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self::named(&format!("test CA {n}"))
    }

    fn named(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Self { cert, key }
    }

    /// A certificate with these DNS names, changed by `tweak`, and its key, as PEM.
    fn issue(
        &self,
        names: &[&str],
        tweak: impl FnOnce(&mut CertificateParams),
    ) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = CertificateParams::new(names).unwrap();
        tweak(&mut p);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// Valid in 2000 only.
fn expired(p: &mut CertificateParams) {
    p.not_before = rcgen::date_time_ymd(2000, 1, 1);
    p.not_after = rcgen::date_time_ymd(2001, 1, 1);
}

fn own_error(cert: &[u8], key: &[u8], ca: &[u8]) -> String {
    TlsConfig::from_pem(cert, key, ca).unwrap_err().to_string()
}

/// Node 1 of `ca` listens; a bare rustls client presents `cert` and `key`. The listener's
/// error, and the client's (its handshake, or its first read: TLS 1.3 ends the client's
/// handshake before the listener checked the client's certificate).
async fn present(ca: &Ca, cert: &[u8], key: &[u8]) -> (String, String) {
    let (own, own_key) = ca.issue(&["1.id.busway"], |_| {});
    let listener = TlsConfig::from_pem(own.as_bytes(), own_key.as_bytes(), ca.pem().as_bytes())
        .expect("the listener's certificate is good");
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key).unwrap();
    let key = rustls::crypto::ring::sign::any_supported_type(&key).unwrap();
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let presented = Presented(Arc::new(rustls::sign::CertifiedKey::new(chain, key)));
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(presented));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let server = async {
        let (s, _) = tcp.accept().await.unwrap();
        listener
            .accept(s)
            .await
            .expect_err("the listener refuses it")
    };
    let client = async {
        let s = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("1.id.busway").unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let e = match connector.connect(name, s).await {
            Ok(mut s) => s.read(&mut [0; 16]).await.err(),
            Err(e) => Some(e),
        };
        e.map_or("the client saw no error".into(), |e| why::io(&e))
    };
    let both = async { tokio::join!(server, client) };
    tokio::time::timeout(HANDSHAKE_LIMIT, both)
        .await
        .expect("the handshake ends in time")
}

/// A client's certificate, presented as it is (`with_client_auth_cert` would refuse to present
/// one it cannot read, as a v1 certificate, which other TLS libraries present).
#[derive(Debug)]
struct Presented(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Presented {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn a_certificate_naming_no_bus_id_is_named_at_both_ends() {
    let ca = Ca::new();
    // A host name, but no bus id; then no subject alternative name at all.
    for names in [&["host-a.example"][..], &[]] {
        let (cert, key) = ca.issue(names, |_| {});
        let e = own_error(cert.as_bytes(), key.as_bytes(), ca.pem().as_bytes());
        assert!(
            e.contains("this node's certificate names no bus id")
                && e.contains("DNS:ID.id.busway")
                && e.contains("busway cert node --id ID"),
            "{e}"
        );
        let (listener, _) = present(&ca, cert.as_bytes(), key.as_bytes()).await;
        assert!(
            listener.contains("the peer's certificate names no bus id")
                && listener.contains("busway cert node --id ID"),
            "{listener}"
        );
    }
}

#[tokio::test]
async fn an_expired_certificate_is_named_with_its_date_at_both_ends() {
    let ca = Ca::new();
    let (cert, key) = ca.issue(&["2.id.busway"], expired);
    let e = own_error(cert.as_bytes(), key.as_bytes(), ca.pem().as_bytes());
    assert!(
        e.contains("this node's certificate expired at 2001-01-01 00:00:00 UTC")
            && e.contains("this node needs a new one: make one with `busway cert node --id ID`"),
        "{e}"
    );
    let (listener, client) = present(&ca, cert.as_bytes(), key.as_bytes()).await;
    assert!(
        listener.contains("the peer's certificate expired at 2001-01-01 00:00:00 UTC")
            && listener.contains("the peer needs a new one"),
        "{listener}"
    );
    assert!(
        client.contains("the peer refused this node's certificate as expired")
            && client.contains("busway cert node"),
        "{client}"
    );
}

#[tokio::test]
async fn an_x509_v1_certificate_of_openssl_x509_req_is_named_with_the_fix() {
    let e = own_error(OPENSSL_V1_CERT, OPENSSL_V1_KEY, OPENSSL_V1_CA);
    assert!(
        e.contains("this node's certificate is an X.509 v1 certificate")
            && e.contains("-copy_extensions copy")
            && e.contains("busway cert node --id ID"),
        "{e}"
    );
    let (listener, client) = present(&Ca::new(), OPENSSL_V1_CERT, OPENSSL_V1_KEY).await;
    assert!(
        listener.contains("the peer's certificate is an X.509 v1 certificate"),
        "{listener}"
    );
    assert!(
        client.contains("the peer refused this node's certificate"),
        "{client}"
    );
}

#[tokio::test]
async fn a_certificate_of_another_authority_is_named_at_both_ends() {
    let (cert, key) = Ca::new().issue(&["2.id.busway"], |_| {});
    let ca = Ca::new();
    // Accepted as this node's own beside another CA file: its peers may trust the authority
    // that signed it (a cluster may give dialers and listeners authorities of their own).
    TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), ca.pem().as_bytes()).unwrap();
    // Refused by a node that does not trust it.
    let (listener, client) = present(&ca, cert.as_bytes(), key.as_bytes()).await;
    assert!(
        listener.contains(
            "the peer's certificate is not signed by an authority this node trusts (UnknownIssuer)"
        ),
        "{listener}"
    );
    assert!(
        client.contains("the peer does not trust the authority that signed this node's certificate (alert UnknownCA)"),
        "{client}"
    );
}

#[test]
fn a_certificate_only_for_servers_is_refused_when_made() {
    let ca = Ca::new();
    let (cert, key) = ca.issue(&["1.id.busway"], |p| {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    });
    let e = own_error(cert.as_bytes(), key.as_bytes(), ca.pem().as_bytes());
    assert!(
        e.contains("this node's certificate is not for both ends of TLS")
            && e.contains("clientAuth"),
        "{e}"
    );
}

#[tokio::test]
async fn a_certificate_of_another_authority_of_the_same_name_is_named() {
    // Two authorities made alike (the same name), as two runs of a tool with a fixed name.
    let (cert, key) = Ca::named("same").issue(&["2.id.busway"], |_| {});
    let ca = Ca::named("same");
    TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), ca.pem().as_bytes()).unwrap();
    let (listener, _) = present(&ca, cert.as_bytes(), key.as_bytes()).await;
    assert!(
        listener.contains("(BadSignature)")
            && listener.contains("another authority of the same name"),
        "{listener}"
    );
}
