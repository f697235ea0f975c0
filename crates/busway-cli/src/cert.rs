//! `busway cert`: the certificates of `tls://` links, made as busway checks them. A cluster's
//! authority (`ca.pem`, `ca.key`), then a certificate per node (`ID.pem`, `ID.key`) or relay
//! (`FIRST-LAST.pem`) signed by it, whose subject alternative name names the node's bus id as
//! busway reads it (`ID.id.busway`, `FIRST-LAST.ids.busway`: [`busway_core::cert_ids`]).
//!
//! Made with rcgen; each new certificate is checked against the authority's certificate as a
//! peer will check it before anything is written, so that a `ca.pem` that `ca.key` did not
//! make is named here rather than at the first handshake.

use busway::BusId;
use busway_core::cert_ids::{IDS_NAME_SUFFIX, ID_NAME_SUFFIX};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

/// How long an authority is valid, in days (10 years, as `--days`'s help says): renewing it
/// means a new certificate for every node, so it is rare.
pub(crate) const CA_VALID_DAYS: u32 = 3_650;
/// How long a node's or relay's certificate is valid, in days (1 year, as `--days`'s help
/// says): busway has no revocation, so a key that leaked stops opening links within a year.
pub(crate) const NODE_VALID_DAYS: u32 = 365;
/// Most days `--days` may give (100 years): beyond, a typo rather than a choice.
const VALID_DAYS_MAX: u32 = 36_525;
/// How long before now a certificate's validity starts, in seconds: a host whose clock is
/// behind the one that made it (by less than this) still accepts it at once.
const NOT_BEFORE_MARGIN_SECS: u64 = 3_600;
/// Seconds per day, for `--days`.
const SECS_PER_DAY: u64 = 86_400;
/// Mode of a private key file: read and written by its owner only (it proves a node's identity,
/// or, for the authority's, every node's).
const KEY_FILE_MODE: u32 = 0o600;
/// Mode of a certificate file: readable by all (a certificate is public).
const CERT_FILE_MODE: u32 = 0o644;
/// The authority's certificate file, in the directory of `--dir`.
const CA_CERT_FILE: &str = "ca.pem";
/// The authority's private key file, beside it.
const CA_KEY_FILE: &str = "ca.key";
/// The start of an authority's name; the rest comes from its key (see `authority_params`).
const CA_NAME_PREFIX: &str = "busway CA";

/// `busway cert`'s subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum CertCmd {
    /// Make a cluster's certificate authority: ca.pem (every node's --tls-ca) and ca.key (keep it
    /// secret, on the host that makes certificates: it signs what every node trusts).
    Ca {
        /// Days the authority's certificate is valid from now: 10 years by default (a new
        /// authority means a new certificate for every node, so it is long).
        #[arg(long, default_value_t = CA_VALID_DAYS, value_parser = days())]
        days: u32,
        #[command(flatten)]
        out: Out,
    },
    /// Make node ID's certificate, ID.pem (--tls-cert) and its key ID.key (--tls-key), signed
    /// by the authority of ca.pem and ca.key in the same directory; it names the bus id as the
    /// DNS name ID.id.busway.
    Node {
        /// The node's bus id (decimal or 0x hex).
        #[arg(long)]
        id: BusId,
        /// Days the certificate is valid from now: 1 year by default (busway has no
        /// revocation: a short life bounds what a leaked key can do).
        #[arg(long, default_value_t = NODE_VALID_DAYS, value_parser = days())]
        days: u32,
        #[command(flatten)]
        out: Out,
    },
    /// Make a relay's certificate for bus ids FIRST to LAST, FIRST-LAST.pem and FIRST-LAST.key,
    /// signed like a node's: it names the DNS name FIRST-LAST.ids.busway, which lets the relay
    /// register that range (its subtree) with its upstream; the relay's own id must lie in it.
    Relay {
        /// The ids the relay serves, its own included: FIRST-LAST (e.g. 100-199).
        #[arg(long, value_parser = parse_range, value_name = "FIRST-LAST")]
        ids: IdRange,
        /// Days the certificate is valid from now: 1 year by default, as a node's.
        #[arg(long, default_value_t = NODE_VALID_DAYS, value_parser = days())]
        days: u32,
        #[command(flatten)]
        out: Out,
    },
}

/// Where a subcommand writes its files.
#[derive(Args, Debug)]
pub(crate) struct Out {
    /// Directory of the files: written there, and the authority read from there.
    #[arg(long, value_name = "DIR", default_value = ".")]
    dir: PathBuf,
    /// Replace files that exist (by default an existing file is left as it is, and nothing
    /// is written). Replacing ca.pem and ca.key makes every certificate they signed untrusted.
    #[arg(long)]
    force: bool,
}

/// `--days`: from 1 to `VALID_DAYS_MAX`.
fn days() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(1..=i64::from(VALID_DAYS_MAX))
}

/// A range of bus ids, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdRange {
    first: u64,
    last: u64,
}

/// `--ids FIRST-LAST`, each a bus id (decimal or 0x hex).
fn parse_range(text: &str) -> Result<IdRange, String> {
    let bad = || format!("{text:?} is not FIRST-LAST (two bus ids, e.g. 100-199)");
    let (first, last) = text.split_once('-').ok_or_else(bad)?;
    let first: BusId = first.parse().map_err(|_| bad())?;
    let last: BusId = last.parse().map_err(|_| bad())?;
    if first > last {
        return Err(format!("{text:?}: FIRST is above LAST"));
    }
    Ok(IdRange {
        first: first.0,
        last: last.0,
    })
}

/// Whom a certificate is for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Subject {
    /// A node: one bus id.
    Node(u64),
    /// A relay and the subtree it serves: a range of bus ids.
    Relay(IdRange),
}

impl Subject {
    /// The DNS name that gives the ids, as busway reads it.
    fn dns_name(self) -> String {
        match self {
            Self::Node(id) => format!("{id}{ID_NAME_SUFFIX}"),
            Self::Relay(r) => format!("{}-{}{IDS_NAME_SUFFIX}", r.first, r.last),
        }
    }

    /// The name of its files, without `.pem` or `.key`.
    fn file_stem(self) -> String {
        match self {
            Self::Node(id) => id.to_string(),
            Self::Relay(r) => format!("{}-{}", r.first, r.last),
        }
    }

    /// The certificate's subject name, for a person (busway reads only the DNS name).
    fn common_name(self) -> String {
        match self {
            Self::Node(id) => format!("busway node {id}"),
            Self::Relay(r) => format!("busway relay {}-{}", r.first, r.last),
        }
    }

    /// What it names, for a person.
    fn describe(self) -> String {
        match self {
            Self::Node(id) => format!("bus id {id}"),
            Self::Relay(r) => format!("bus ids {}-{}", r.first, r.last),
        }
    }
}

/// A certificate and its key, as PEM, and the last day it is valid.
pub(crate) struct Issued {
    pub(crate) cert_pem: String,
    pub(crate) key_pem: String,
    until: time::Date,
}

/// An authority: its certificate (what peers trust), and what signs with its key.
pub(crate) struct Authority {
    /// Its certificate, as PEM: what nodes are given as --tls-ca.
    cert_pem: String,
    /// A certificate of the same name and key, which rcgen signs with (rcgen 0.13 cannot read
    /// the name of a certificate from PEM without x509-parser: see `authority_params`).
    signer: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    /// A new authority, valid for `days` from now.
    pub(crate) fn generate(days: u32) -> Result<(Self, time::Date), String> {
        let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
        let mut params = authority_params(&key);
        let until = validity(&mut params, days);
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("cannot make the authority's certificate: {e}"))?;
        let authority = Self {
            cert_pem: cert.pem(),
            signer: cert,
            key,
        };
        Ok((authority, until))
    }

    /// The authority of `cert` and `key` (PEM files `busway cert ca` wrote); an error names
    /// the file and what failed.
    pub(crate) fn load(cert: &Path, key: &Path) -> Result<Self, String> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|e| {
                format!(
                    "cannot read {} (the authority that signs certificates): {e}; make it first \
                     with `busway cert ca` (in that directory, or give --dir)",
                    path.display()
                )
            })
        };
        let cert_pem = read(cert)?;
        let key = KeyPair::from_pem(&read(key)?).map_err(|e| {
            format!(
                "{}: not a private key busway can sign with (PKCS#8 PEM, as `busway cert ca` \
                 writes): {e}",
                key.display()
            )
        })?;
        CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("{}: not a PEM certificate: {e}", cert.display()))?;
        let signer = authority_params(&key)
            .self_signed(&key)
            .map_err(|e| format!("cannot sign with {}: {e}", cert.display()))?;
        Ok(Self {
            cert_pem,
            signer,
            key,
        })
    }

    /// Its certificate, as PEM.
    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Its private key, as PEM.
    fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for `subject`, valid for `days` from now, and its new key; checked
    /// against this authority's certificate as a peer will check it.
    pub(crate) fn issue(&self, subject: Subject, days: u32) -> Result<Issued, String> {
        let key = KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
        let mut params = CertificateParams::new(vec![subject.dns_name()])
            .map_err(|e| format!("{}: {e}", subject.dns_name()))?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, subject.common_name());
        params.distinguished_name = name;
        // A node is the server of the links it accepts and the client of those it dials.
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // Lets other tools (`openssl verify`) find the issuer by key, not only by name.
        params.use_authority_key_identifier_extension = true;
        let until = validity(&mut params, days);
        let cert = params
            .signed_by(&key, &self.signer, &self.key)
            .map_err(|e| format!("cannot sign the certificate: {e}"))?;
        self.check(cert.der())?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            until,
        })
    }

    /// Whether `cert` verifies against this authority's certificate, as a TLS server's and a
    /// client's: not if the certificate was not made from this key, or by `busway cert ca`.
    fn check(&self, cert: &CertificateDer<'_>) -> Result<(), String> {
        let mistake = |e: webpki::Error| {
            format!(
                "the certificate made does not verify against the authority's certificate \
                 ({e:?}): it was not made by `busway cert ca`, or its key is not the authority's \
                 key (`busway cert` signs only with an authority it made)"
            )
        };
        let ca = CertificateDer::from_pem_slice(self.cert_pem.as_bytes())
            .map_err(|e| format!("the authority's certificate: {e}"))?;
        let anchor = webpki::anchor_from_trusted_cert(&ca).map_err(mistake)?;
        let cert = webpki::EndEntityCert::try_from(cert).map_err(mistake)?;
        for usage in [
            webpki::KeyUsage::server_auth(),
            webpki::KeyUsage::client_auth(),
        ] {
            cert.verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                std::slice::from_ref(&anchor),
                &[],
                UnixTime::now(),
                usage,
                None,
                None,
            )
            .map_err(mistake)?;
        }
        Ok(())
    }
}

/// What an authority is made from, all of it derived from its key so that `Authority::load`
/// makes the same name again from `ca.key` alone: a name of its own (two authorities of one
/// name make peers report a bad signature rather than an unknown authority), allowed to sign
/// certificates but not other authorities (busway needs no intermediates).
fn authority_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    let id = fnv1a(&key.public_key_der());
    name.push(DnType::CommonName, format!("{CA_NAME_PREFIX} {id:016x}"));
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// FNV-1a, 64 bits: a stable digest of a public key for an authority's name (std's hasher
/// may change between Rust releases, and the name must be made again the same).
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Sets the validity of `params`: from `NOT_BEFORE_MARGIN_SECS` ago to `days` from now; the
/// last day.
fn validity(params: &mut CertificateParams, days: u32) -> time::Date {
    let now = SystemTime::now();
    let from = now - Duration::from_secs(NOT_BEFORE_MARGIN_SECS);
    let until = now + Duration::from_secs(u64::from(days) * SECS_PER_DAY);
    params.not_before = time::OffsetDateTime::from(from);
    params.not_after = time::OffsetDateTime::from(until);
    params.not_after.date()
}

/// A file to write.
struct File {
    path: PathBuf,
    text: String,
    mode: u32,
    /// What it is, for the line that says it was written.
    what: String,
}

/// Writes `files`, created with their modes; none if one exists and `force` is not given
/// (the error names it). A file written before one that fails is removed: no certificate is
/// left without its key.
fn write_all(dir: &Path, files: &[File], force: bool) -> Result<(), String> {
    if !force {
        if let Some(f) = files.iter().find(|f| f.path.symlink_metadata().is_ok()) {
            return Err(format!(
                "refusing to overwrite {}: it exists (pass --force to replace it)",
                f.path.display()
            ));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot make the directory {}: {e}", dir.display()))?;
    for (i, f) in files.iter().enumerate() {
        if let Err(e) = write_one(f, force) {
            for written in &files[..i] {
                let _ = std::fs::remove_file(&written.path);
            }
            return Err(e);
        }
    }
    for f in files {
        println!("wrote {}: {}", f.path.display(), f.what);
    }
    Ok(())
}

/// Writes one file, created with its mode (never a file that exists: one being replaced is
/// removed first, so that a key never lands in a file others can read).
fn write_one(f: &File, force: bool) -> Result<(), String> {
    let path = f.path.display();
    if force {
        match std::fs::remove_file(&f.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot replace {path}: {e}")),
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(f.mode)
        .open(&f.path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => {
                format!("refusing to overwrite {path}: it exists (pass --force to replace it)")
            }
            _ => format!("cannot create {path}: {e}"),
        })?;
    file.write_all(f.text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {path}: {e}"))
}

/// Runs `busway cert ...`.
pub(crate) fn run(cmd: CertCmd) -> Result<ExitCode, String> {
    match cmd {
        CertCmd::Ca { days, out } => {
            let (ca, until) = Authority::generate(days)?;
            let files = [
                File {
                    path: out.dir.join(CA_CERT_FILE),
                    text: ca.cert_pem().to_owned(),
                    mode: CERT_FILE_MODE,
                    what: format!(
                        "certificate authority, valid until {until} ({days} days); every node's --tls-ca"
                    ),
                },
                File {
                    path: out.dir.join(CA_KEY_FILE),
                    text: ca.key_pem(),
                    mode: KEY_FILE_MODE,
                    what: "its private key (owner only: it signs what every node trusts)".into(),
                },
            ];
            write_all(&out.dir, &files, out.force)?;
        }
        CertCmd::Node { id, days, out } => issue(Subject::Node(id.0), days, &out)?,
        CertCmd::Relay { ids, days, out } => issue(Subject::Relay(ids), days, &out)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `subject`'s certificate and key, signed by the authority in `out.dir`.
fn issue(subject: Subject, days: u32, out: &Out) -> Result<(), String> {
    let ca_cert = out.dir.join(CA_CERT_FILE);
    let ca = Authority::load(&ca_cert, &out.dir.join(CA_KEY_FILE))?;
    let issued = ca.issue(subject, days)?;
    let stem = subject.file_stem();
    let files = [
        File {
            path: out.dir.join(format!("{stem}.pem")),
            text: issued.cert_pem,
            mode: CERT_FILE_MODE,
            what: format!(
                "certificate of {} (DNS:{}), signed by {}, valid until {} ({days} days); --tls-cert",
                subject.describe(),
                subject.dns_name(),
                ca_cert.display(),
                issued.until
            ),
        },
        File {
            path: out.dir.join(format!("{stem}.key")),
            text: issued.key_pem,
            mode: KEY_FILE_MODE,
            what: "its private key (owner only); --tls-key".into(),
        },
    ];
    write_all(&out.dir, &files, out.force)
}
