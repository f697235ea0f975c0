//! TLS on `tls://` links (rustls, ring): encryption between hosts, and each node's identity
//! proved by a certificate that names its bus ids (see [`busway_core::cert_ids`]).
//!
//! Both ends present a certificate signed by one of the configured authorities (mutual
//! authentication). A dialer does not know which node listens at an address, so it checks the
//! listener's chain but not a host name; what binds a certificate to a node is the bus id: the
//! link machine accepts the peer's HELLO only for an id its certificate names.

use crate::node::config_error::ConfigError;
use busway_core::cert_ids::CertIds;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;

/// The server name a dialer states (TLS requires one); certificates need not name it.
const DIAL_SERVER_NAME: &str = "busway";

/// TLS for a node's `tls://` links: its certificate chain and key, and the certificate
/// authorities its peers' certificates must come from. Build it with [`TlsConfig::from_pem`]
/// or [`TlsConfig::from_pem_files`].
#[derive(Clone)]
pub struct TlsConfig {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    own_ids: CertIds,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("own_ids", &self.own_ids.to_string())
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// From PEM text: this node's certificate chain (its own certificate first), its private
    /// key, and the authorities' certificates. An error says which part is wrong and why.
    pub fn from_pem(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, ConfigError> {
        Self::from_pem_text(cert_chain, key, ca)
            .map_err(|why| ConfigError::new(Some("tls"), None, why))
    }

    /// [`TlsConfig::from_pem`], its error as text.
    fn from_pem_text(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("certificate chain: {e}"))?;
        let Some(own) = chain.first() else {
            return Err("certificate chain: no certificate in it".into());
        };
        let own_ids = cert_ids(own).map_err(|e| format!("certificate chain: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("private key: {e}"))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca) {
            let ca = ca.map_err(|e| format!("certificate authorities: {e}"))?;
            roots
                .add(ca)
                .map_err(|e| format!("certificate authorities: {e}"))?;
        }
        if roots.is_empty() {
            return Err("certificate authorities: no certificate in them".into());
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| format!("certificate authorities: {e}"))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("certificate and key: {e}"))?;
        let servers = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| format!("certificate authorities: {e}"))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(servers)))
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("certificate and key: {e}"))?;
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            own_ids,
        })
    }

    /// From PEM files (see [`TlsConfig::from_pem`]); an error names the file.
    pub fn from_pem_files(cert_chain: &Path, key: &Path, ca: &Path) -> Result<Self, ConfigError> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| ConfigError::new(Some("tls"), None, format!("{}: {e}", p.display())))
        };
        Self::from_pem(&read(cert_chain)?, &read(key)?, &read(ca)?)
    }

    /// Whether this node's own certificate names `id` (a node whose certificate does not name
    /// it would be refused by every peer).
    pub(crate) fn names(&self, id: busway_core::BusId) -> bool {
        self.own_ids.contains(id)
    }

    /// The ids this node's own certificate names.
    pub(crate) fn own_ids(&self) -> &CertIds {
        &self.own_ids
    }

    /// The server side of a TLS handshake on an accepted connection; the stream and the ids
    /// the client's certificate names.
    pub(crate) async fn accept(&self, tcp: TcpStream) -> Result<(TlsStream, CertIds), String> {
        let s = self
            .acceptor
            .accept(tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        let ids = peer_ids(s.get_ref().1.peer_certificates())?;
        Ok((s.into(), ids))
    }

    /// The client side of a TLS handshake on a dialed connection; the stream and the ids the
    /// server's certificate names.
    pub(crate) async fn connect(&self, tcp: TcpStream) -> Result<(TlsStream, CertIds), String> {
        let name = ServerName::try_from(DIAL_SERVER_NAME).map_err(|e| e.to_string())?;
        let s = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        let ids = peer_ids(s.get_ref().1.peer_certificates())?;
        Ok((s.into(), ids))
    }
}

/// A TLS connection, either side.
pub(crate) type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The ids the peer's (verified) certificate names; an error if it names none.
fn peer_ids(certs: Option<&[CertificateDer<'_>]>) -> Result<CertIds, String> {
    let cert = certs
        .and_then(|c| c.first())
        .ok_or("the peer presented no TLS certificate")?;
    let ids = cert_ids(cert)?;
    if ids.is_empty() {
        return Err(format!(
            "the peer's TLS certificate names no bus id (a DNS name ID{} or FIRST-LAST{})",
            busway_core::cert_ids::ID_NAME_SUFFIX,
            busway_core::cert_ids::IDS_NAME_SUFFIX
        ));
    }
    Ok(ids)
}

/// The bus ids a certificate's DNS names give.
fn cert_ids(cert: &CertificateDer<'_>) -> Result<CertIds, String> {
    let parsed = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| format!("unreadable certificate: {e}"))?;
    CertIds::from_names(parsed.valid_dns_names())
}

/// A server verifier that checks the chain, the validity period and the handshake signatures,
/// but not a host name: the bus id the certificate names is checked at the busway handshake.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // The name is checked after the chain: a wrong name means the chain was good.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
