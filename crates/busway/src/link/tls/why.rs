//! What a certificate problem means for an operator: each error rustls and webpki give for the
//! usual mistakes (a certificate with no bus id, for another id, expired, from another
//! authority, an X.509 v1 one) said as what is wrong and what to do, with the library's own
//! name for it in parentheses so that it can still be searched for.

use busway_core::cert_ids::{IDS_NAME_SUFFIX, ID_NAME_SUFFIX};
use rustls::pki_types::UnixTime;
use rustls::{AlertDescription, CertificateError};
use std::io;

/// How to make a certificate busway accepts: the end of the errors a new certificate fixes.
const MAKE_CERT: &str =
    "make one with `busway cert node --id ID` (a relay: `busway cert relay --ids FIRST-LAST`)";

/// The fix for a certificate signed by an authority the other end does not trust.
const SAME_AUTHORITY: &str = "every node needs a certificate from the same authority, and that \
     authority's certificate as its CA file (`busway cert node` signs with the ca.pem and ca.key \
     of its directory)";

/// Whose certificate an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Whose {
    /// This node's own certificate, checked when its TLS configuration is made.
    Own,
    /// The certificate the peer presented in a handshake.
    Peer,
}

impl Whose {
    fn certificate(self) -> &'static str {
        match self {
            Self::Own => "this node's certificate",
            Self::Peer => "the peer's certificate",
        }
    }
}

/// What a certificate that names no bus id needs (both ends check it).
pub(crate) fn names_no_bus_id(whose: Whose) -> String {
    format!(
        "{} names no bus id: it needs a subject alternative name DNS:ID{ID_NAME_SUFFIX} \
         (a relay and its subtree: DNS:FIRST-LAST{IDS_NAME_SUFFIX}); {MAKE_CERT}",
        whose.certificate()
    )
}

/// Why webpki could not read a certificate as an end entity's.
pub(crate) fn unreadable(whose: Whose, e: &webpki::Error) -> String {
    match e {
        webpki::Error::UnsupportedCertVersion => version_1(whose),
        e => format!(
            "{} is not a certificate busway can read ({e:?}); {MAKE_CERT}",
            whose.certificate()
        ),
    }
}

/// An X.509 v1 certificate: what `openssl x509 -req` makes of a request with a subject
/// alternative name unless told to copy it, the mistake this text is for.
fn version_1(whose: Whose) -> String {
    format!(
        "{} is an X.509 v1 certificate (UnsupportedCertVersion): v1 has no extensions, so no \
         subject alternative name to name a bus id (`openssl x509 -req` makes v1 unless given \
         `-copy_extensions copy` or `-extfile`); {MAKE_CERT}",
        whose.certificate()
    )
}

/// What is wrong with a certificate that failed verification, and what to do.
pub(crate) fn certificate(whose: Whose, e: &CertificateError) -> String {
    let cert = whose.certificate();
    match e {
        CertificateError::Expired => {
            format!("{cert} has expired (Expired): {}", make_new(whose))
        }
        CertificateError::ExpiredContext { time, not_after } => format!(
            "{cert} expired at {} (it is {} now) (Expired): {}",
            utc(*not_after),
            utc(*time),
            make_new(whose)
        ),
        CertificateError::NotValidYet => format!(
            "{cert} is not valid yet (NotValidYet): check this host's clock, or {}",
            make_new(whose)
        ),
        CertificateError::NotValidYetContext { time, not_before } => format!(
            "{cert} is valid only from {} (it is {} now) (NotValidYet): check this host's \
             clock, or {}",
            utc(*not_before),
            utc(*time),
            make_new(whose)
        ),
        CertificateError::UnknownIssuer => format!(
            "{cert} is not signed by an authority this node trusts (UnknownIssuer): \
             {SAME_AUTHORITY}"
        ),
        CertificateError::BadSignature => format!(
            "{cert} is not signed by the authority this node trusts under the name it gives \
             (BadSignature): another authority of the same name signed it (or it was altered); \
             {SAME_AUTHORITY}"
        ),
        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
            format!(
                "{cert} is not for both ends of TLS ({e}): a node is a TLS server and client, \
                 so its extended key usage must allow serverAuth and clientAuth (or be absent); \
                 {MAKE_CERT}"
            )
        }
        CertificateError::BadEncoding => {
            format!("{cert} is not a well-formed certificate (BadEncoding); {MAKE_CERT}")
        }
        CertificateError::Other(other) => match other.0.downcast_ref::<webpki::Error>() {
            Some(e) => unreadable(whose, e),
            None => format!("{cert} was refused: {other}"),
        },
        e => format!("{cert} was refused: {e}"),
    }
}

/// The fix for a certificate out of its validity period.
fn make_new(whose: Whose) -> String {
    match whose {
        Whose::Own => format!("this node needs a new one: {MAKE_CERT}"),
        Whose::Peer => format!("the peer needs a new one: {MAKE_CERT}"),
    }
}

/// What a TLS error means: a certificate problem said as one, others as rustls says them.
pub(crate) fn tls(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(e) => certificate(Whose::Peer, e),
        rustls::Error::AlertReceived(alert) => refused_by_peer(*alert)
            .unwrap_or_else(|| format!("the peer ended the handshake (alert {alert:?})")),
        rustls::Error::NoCertificatesPresented => {
            format!("the peer presented no certificate; {MAKE_CERT}")
        }
        e => e.to_string(),
    }
}

/// What the peer's alert says of this node's certificate, if it is about it (the peer's log
/// names the problem itself).
fn refused_by_peer(alert: AlertDescription) -> Option<String> {
    let why = match alert {
        AlertDescription::UnknownCA => format!(
            "the peer does not trust the authority that signed this node's certificate \
             (alert UnknownCA): {SAME_AUTHORITY}"
        ),
        AlertDescription::CertificateExpired => format!(
            "the peer refused this node's certificate as expired or not valid yet (alert \
             CertificateExpired): check its dates and both hosts' clocks; {MAKE_CERT}"
        ),
        AlertDescription::BadCertificate
        | AlertDescription::UnsupportedCertificate
        | AlertDescription::CertificateUnknown
        | AlertDescription::DecryptError
        | AlertDescription::CertificateRevoked => format!(
            "the peer refused this node's certificate (alert {alert:?}; its log says why); \
             {MAKE_CERT}"
        ),
        _ => return None,
    };
    Some(why)
}

/// Whether a socket error is TLS's own (a certificate refused, an alert), not the socket's.
pub(crate) fn is_tls(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|e| e.is::<rustls::Error>())
}

/// An I/O error of a TLS stream, a TLS error in it said as [`tls`] says it.
pub(crate) fn io(e: &io::Error) -> String {
    match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
        Some(e) => tls(e),
        None => e.to_string(),
    }
}

/// Seconds per day, for the dates of a certificate's validity.
const SECS_PER_DAY: u64 = 86_400;

/// A time as `YYYY-MM-DD HH:MM:SS UTC` (a certificate's dates are read by a person).
fn utc(t: UnixTime) -> String {
    let secs = t.as_secs();
    let (y, m, d) = civil_from_days(secs / SECS_PER_DAY);
    let s = secs % SECS_PER_DAY;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// The date of a day counted from 1970-01-01 (Howard Hinnant's `civil_from_days`, for days
/// after the epoch: no date library is needed for one line of an error).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shifted to start 0000-03-01: a leap day is then the last day of its year.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_written_as_a_person_reads_them() {
        let at = |secs| {
            utc(UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                secs,
            )))
        };
        assert_eq!(at(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(at(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(at(1_767_225_599), "2025-12-31 23:59:59 UTC");
        assert_eq!(at(4_102_444_800), "2100-01-01 00:00:00 UTC");
    }
}
