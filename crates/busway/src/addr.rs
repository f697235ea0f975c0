//! Link addresses: `tcp://IP:PORT`, `tcp://[::1]:PORT`, `tcp://NAME:PORT` (a host name,
//! resolved at each dial), the same with `tls://`, `unix:///path/to.sock`, and `shm://NAME`: a
//! link that must carry its data through shared memory, whose control socket is the abstract
//! Unix socket `busway/NAME` (no file to leave behind; it vanishes with its process).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a node listens or dials.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Addr {
    /// A TCP address (`tcp://HOST:PORT`).
    Tcp(SocketAddr),
    /// A Unix socket's path (`unix:///PATH`).
    Unix(PathBuf),
    /// A shared-memory link to the node of this host listening under this name.
    Shm(String),
    /// TCP with TLS (`tls://IP:PORT`): encrypted, and each end proves a certificate that names
    /// its bus id (see `TlsConfig`).
    Tls(SocketAddr),
    /// TCP to a host name (`tcp://NAME:PORT`): resolved at each dial, so a host that moved is
    /// found again, and every address it resolves to is tried in turn (`localhost` reaches a
    /// listener on 127.0.0.1 or on ::1); a listener binds the first address that binds.
    TcpHost(HostPort),
    /// TCP with TLS to a host name (`tls://NAME:PORT`), resolved as `TcpHost` is.
    TlsHost(HostPort),
}

/// A host name and a port (`NAME:PORT`); the name is checked to be a DNS name (letters,
/// digits, '-' and '.', labels of 1 to 63 bytes), nothing is resolved until it is used.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct HostPort {
    host: String,
    port: u16,
}

/// Longest host name, in bytes (DNS's limit for a name written as text).
const HOST_NAME_BYTES_MAX: usize = 253;
/// Longest label of a host name (between dots), in bytes (DNS's limit).
const HOST_LABEL_BYTES_MAX: usize = 63;

impl HostPort {
    /// The host name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `NAME:PORT` with a valid DNS name, or why not.
    fn parse(text: &str) -> Result<Self, &'static str> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or("no port (NAME:PORT or IP:PORT)")?;
        let port = port
            .parse()
            .map_err(|_| "the port is not a number from 0 to 65535")?;
        let label_ok = |l: &str| {
            (1..=HOST_LABEL_BYTES_MAX).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        let name = host.strip_suffix('.').unwrap_or(host);
        if host.len() > HOST_NAME_BYTES_MAX || !name.split('.').all(label_ok) {
            return Err("not an IP address or a host name");
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Longest name in `shm://NAME`, in bytes (the abstract socket name is `busway/` + NAME, well
/// inside the 107 bytes a Unix socket name may have).
pub(crate) const SHM_NAME_BYTES_MAX: usize = 64;

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "tcp://{a}"),
            Addr::Unix(p) => write!(f, "unix://{}", p.display()),
            Addr::Shm(name) => write!(f, "shm://{name}"),
            Addr::Tls(a) => write!(f, "tls://{a}"),
            Addr::TcpHost(a) => write!(f, "tcp://{a}"),
            Addr::TlsHost(a) => write!(f, "tls://{a}"),
        }
    }
}

/// Why text is not an address; the message names the text and the expected forms.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ParseAddrError {
    text: String,
    why: &'static str,
}

impl fmt::Display for ParseAddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid address {:?}: {} (expected tcp://HOST:PORT, tcp://[IPv6]:PORT, tls://HOST:PORT, unix:///PATH or shm://NAME)",
            self.text, self.why
        )
    }
}

impl std::error::Error for ParseAddrError {}

impl FromStr for Addr {
    type Err = ParseAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |why| ParseAddrError {
            text: s.to_owned(),
            why,
        };
        if let Some(rest) = s.strip_prefix("tcp://") {
            match rest.parse::<SocketAddr>() {
                Ok(sa) => Ok(Addr::Tcp(sa)),
                Err(_) => HostPort::parse(rest).map(Addr::TcpHost).map_err(err),
            }
        } else if let Some(rest) = s.strip_prefix("tls://") {
            match rest.parse::<SocketAddr>() {
                Ok(sa) => Ok(Addr::Tls(sa)),
                Err(_) => HostPort::parse(rest).map(Addr::TlsHost).map_err(err),
            }
        } else if let Some(rest) = s.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(err("empty socket path"));
            }
            Ok(Addr::Unix(PathBuf::from(rest)))
        } else if let Some(name) = s.strip_prefix("shm://") {
            if name.is_empty() || name.len() > SHM_NAME_BYTES_MAX {
                return Err(err("the name must be 1 to 64 bytes"));
            }
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(err(
                    "the name may hold only letters, digits, '-', '_' and '.'",
                ));
            }
            Ok(Addr::Shm(name.to_owned()))
        } else {
            Err(err("unknown scheme"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_form() {
        for text in [
            "tcp://127.0.0.1:7000",
            "tcp://[::1]:7000",
            "tls://10.0.0.1:7000",
            "tcp://localhost:7000",
            "tls://node-1.eu.example:7443",
            "tcp://localhost.:0",
            "unix:///run/busway/a.sock",
            "shm://lobby-1.eu_west",
        ] {
            assert_eq!(text.parse::<Addr>().unwrap().to_string(), text);
        }
    }

    #[test]
    fn rejects_with_a_message_naming_the_input() {
        let e = "udp://1.2.3.4:5".parse::<Addr>().unwrap_err().to_string();
        assert!(
            e.contains("udp://1.2.3.4:5") && e.contains("unknown scheme"),
            "{e}"
        );
        assert!(matches!(
            "tcp://localhost:80".parse::<Addr>(),
            Ok(Addr::TcpHost(hp)) if hp.host() == "localhost" && hp.port() == 80
        ));
        for (bad, why) in [
            ("tcp://localhost", "no port"),
            ("tcp://localhost:http", "port"),
            ("tcp://localhost:70000", "port"),
            ("tls://under_score:1", "host name"),
            ("tcp://-lead.example:1", "host name"),
            ("tcp://a..b:1", "host name"),
            ("tcp://[::1:1", "host name"),
            ("tcp://:1", "host name"),
        ] {
            let e = bad.parse::<Addr>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains(why), "{bad}: {e}");
        }
        let long = format!("tcp://{}:1", "a".repeat(64));
        assert!(long.parse::<Addr>().is_err());
        assert!("unix://".parse::<Addr>().is_err());
        for bad in [
            "shm://",
            "shm://a/b",
            "shm://with space",
            &format!("shm://{}", "x".repeat(65)),
        ] {
            let e = bad.parse::<Addr>().unwrap_err().to_string();
            assert!(e.contains("shm://") && e.contains("name"), "{e}");
        }
    }
}
