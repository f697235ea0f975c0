//! TLS on `tls://` links (rustls, ring): encryption between hosts, and each node's identity
//! proved by a certificate that names its bus ids (see [`busway_core::cert_ids`]).
//!
//! Both ends present a certificate signed by one of the configured authorities (mutual
//! authentication). A dialer does not know which node listens at an address, so it checks the
//! listener's chain but not a host name; what binds a certificate to a node is the bus id: the
//! link machine accepts the peer's HELLO only for an id its certificate names.
//!
//! Certificate problems are said as what is wrong and what to do ([`why`]); this node's own
//! certificate is checked when its configuration is made, so that a mistake every peer would
//! refuse is named at the start rather than at each handshake.

pub(crate) mod why;

#[cfg(test)]
mod tests;

use crate::node::config_error::ConfigError;
use busway_core::cert_ids::CertIds;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use why::Whose;

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
    /// key, and the authorities' certificates. An error says which part is wrong and why; this
    /// node's certificate is refused if its peers would refuse it whatever their authorities:
    /// unreadable (an X.509 v1 certificate), naming no bus id, out of its validity period, or
    /// not for both ends of TLS. One from an authority this node does not trust itself is
    /// accepted: its peers may trust others.
    pub fn from_pem(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, ConfigError> {
        Self::from_pem_text(cert_chain, key, ca).map_err(|e| {
            let message = format!("{}: {}", e.part.name(), e.why);
            ConfigError::new(Some("tls"), None, message)
        })
    }

    /// [`TlsConfig::from_pem`], its error as the part at fault and why.
    fn from_pem_text(cert_chain: &[u8], key: &[u8], ca: &[u8]) -> Result<Self, PemError> {
        use Part::*;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_chain)
            .collect::<Result<_, _>>()
            .map_err(|e| Chain.error(e))?;
        let Some(own) = chain.first() else {
            return Err(Chain.error("no certificate in it"));
        };
        let own_ids = cert_ids(own, Whose::Own).map_err(|e| Chain.error(e))?;
        if own_ids.is_empty() {
            return Err(Chain.error(why::names_no_bus_id(Whose::Own)));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Key.error(e))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca) {
            let ca = ca.map_err(|e| Authorities.error(e))?;
            roots.add(ca).map_err(|e| Authorities.error(e))?;
        }
        if roots.is_empty() {
            return Err(Authorities.error("no certificate in them"));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| Authorities.error(e))?;
        let servers = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| Authorities.error(e))?;
        let servers = Arc::new(ChainOnly(servers));
        check_own(&chain, clients.as_ref(), servers.as_ref()).map_err(|e| Chain.error(e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Pair.error(e))?
            .with_client_cert_verifier(clients)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| Pair.error(e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Pair.error(e))?
            .dangerous()
            .with_custom_certificate_verifier(servers)
            .with_client_auth_cert(chain, key)
            .map_err(|e| Pair.error(e))?;
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            own_ids,
        })
    }

    /// From PEM files (see [`TlsConfig::from_pem`]); an error names the file at fault.
    pub fn from_pem_files(cert_chain: &Path, key: &Path, ca: &Path) -> Result<Self, ConfigError> {
        let read = |p: &Path| {
            std::fs::read(p)
                .map_err(|e| ConfigError::new(Some("tls"), None, format!("{}: {e}", p.display())))
        };
        Self::from_pem_text(&read(cert_chain)?, &read(key)?, &read(ca)?).map_err(|e| {
            let file = match e.part {
                Part::Chain => cert_chain.display().to_string(),
                Part::Key => key.display().to_string(),
                Part::Authorities => ca.display().to_string(),
                Part::Pair => format!("{} and {}", cert_chain.display(), key.display()),
            };
            let message = format!("{} {file}: {}", e.part.name(), e.why);
            ConfigError::new(Some("tls"), None, message)
        })
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
            .map_err(|e| format!("TLS handshake failed: {}", why::io(&e)))?;
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
            .map_err(|e| format!("TLS handshake failed: {}", why::io(&e)))?;
        let ids = peer_ids(s.get_ref().1.peer_certificates())?;
        Ok((s.into(), ids))
    }
}

/// A TLS connection, either side.
pub(crate) type TlsStream = tokio_rustls::TlsStream<TcpStream>;

/// The part of a TLS configuration an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// This node's certificate chain.
    Chain,
    /// Its private key.
    Key,
    /// The authorities' certificates.
    Authorities,
    /// The certificate and the key together (a key that is not the certificate's).
    Pair,
}

impl Part {
    fn name(self) -> &'static str {
        match self {
            Self::Chain => "certificate chain",
            Self::Key => "private key",
            Self::Authorities => "certificate authorities",
            Self::Pair => "certificate and key",
        }
    }

    fn error(self, why: impl fmt::Display) -> PemError {
        PemError {
            part: self,
            why: why.to_string(),
        }
    }
}

/// Why a TLS configuration could not be made: the part at fault, and why.
#[derive(Debug)]
struct PemError {
    part: Part,
    why: String,
}

/// Checks this node's own certificate as its peers will, as a client's and as a server's
/// (a node is both): an error says what every peer would refuse. An issuer this node does
/// not trust is not one (unknown, or another of the same name): its authorities need not be
/// those its peers trust.
fn check_own(
    chain: &[CertificateDer<'static>],
    clients: &dyn ClientCertVerifier,
    servers: &ChainOnly,
) -> Result<(), String> {
    let (own, intermediates) = chain.split_first().ok_or("no certificate in it")?;
    let now = UnixTime::now();
    let name = ServerName::try_from(DIAL_SERVER_NAME).map_err(|e| e.to_string())?;
    let as_client = clients
        .verify_client_cert(own, intermediates, now)
        .map(drop);
    let as_server = servers
        .verify_server_cert(own, intermediates, &name, &[], now)
        .map(drop);
    for checked in [as_client, as_server] {
        match checked {
            Ok(())
            | Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer | CertificateError::BadSignature,
            )) => {}
            Err(rustls::Error::InvalidCertificate(e)) => {
                return Err(why::certificate(Whose::Own, &e))
            }
            Err(e) => return Err(format!("this node's certificate was refused: {e}")),
        }
    }
    Ok(())
}

/// The ids the peer's (verified) certificate names; an error if it names none.
fn peer_ids(certs: Option<&[CertificateDer<'_>]>) -> Result<CertIds, String> {
    let cert = certs
        .and_then(|c| c.first())
        .ok_or("the peer presented no TLS certificate")?;
    let ids = cert_ids(cert, Whose::Peer)?;
    if ids.is_empty() {
        return Err(why::names_no_bus_id(Whose::Peer));
    }
    Ok(ids)
}

/// The bus ids a certificate's DNS names give.
fn cert_ids(cert: &CertificateDer<'_>, whose: Whose) -> Result<CertIds, String> {
    let parsed = webpki::EndEntityCert::try_from(cert).map_err(|e| why::unreadable(whose, &e))?;
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
