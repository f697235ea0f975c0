//! Link addresses: `tcp://HOST:PORT`, `tcp://[::1]:PORT`, `unix:///path/to.sock`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a node listens or dials.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Addr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "tcp://{a}"),
            Addr::Unix(p) => write!(f, "unix://{}", p.display()),
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
            "invalid address {:?}: {} (expected tcp://IP:PORT, tcp://[IPv6]:PORT or unix:///PATH)",
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
        } else if let Some(rest) = s.strip_prefix("unix://") {
            if rest.is_empty() {
                return Err(err("empty socket path"));
            }
            Ok(Addr::Unix(PathBuf::from(rest)))
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
            "unix:///run/busway/a.sock",
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
    }
}
