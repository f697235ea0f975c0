//! Link addresses: `tcp://HOST:PORT`, `tcp://[::1]:PORT`, `unix:///path/to.sock`, and
//! `shm://NAME`: a link that must carry its data through shared memory, whose control socket
//! is the abstract Unix socket `busway/NAME` (no file to leave behind; it vanishes with its
//! process).

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a node listens or dials.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
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
            "invalid address {:?}: {} (expected tcp://IP:PORT, tcp://[IPv6]:PORT, tls://IP:PORT, unix:///PATH or shm://NAME)",
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
            rest.parse::<SocketAddr>()
                .map(Addr::Tcp)
                .map_err(|_| err("not an IP address and port"))
        } else if let Some(rest) = s.strip_prefix("tls://") {
            rest.parse::<SocketAddr>()
                .map(Addr::Tls)
                .map_err(|_| err("not an IP address and port"))
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
        assert!("tcp://localhost:80".parse::<Addr>().is_err());
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
