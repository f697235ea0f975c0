//! Bus ids: the 64-bit address of a node.

use std::fmt;
use std::str::FromStr;

/// The address of a node on the bus. Any u64 is a valid id; ids are unique within one bus by
/// the operator's choice (static config or discovery), not by busway.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BusId(pub u64);

impl fmt::Display for BusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a bus id could not be read from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseBusIdError(String);

impl fmt::Display for ParseBusIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid bus id {:?}: expected a decimal or 0x-prefixed hex u64",
            self.0
        )
    }
}

impl std::error::Error for ParseBusIdError {}

impl FromStr for BusId {
    type Err = ParseBusIdError;

    /// Accepts decimal (`42`) or hex with a `0x` prefix (`0x2a`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => t.parse::<u64>(),
        };
        parsed.map(BusId).map_err(|_| ParseBusIdError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_and_hex() {
        assert_eq!("42".parse::<BusId>().unwrap(), BusId(42));
        assert_eq!("0x2A".parse::<BusId>().unwrap(), BusId(42));
        assert_eq!(
            "18446744073709551615".parse::<BusId>().unwrap(),
            BusId(u64::MAX)
        );
    }

    #[test]
    fn rejects_garbage_with_a_clear_message() {
        let err = "node-1".parse::<BusId>().unwrap_err();
        assert!(err.to_string().contains("node-1"));
        assert!("".parse::<BusId>().is_err());
        assert!("-1".parse::<BusId>().is_err());
    }
}
