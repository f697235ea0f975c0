//! The bus ids a TLS certificate names, so that a peer cannot claim an id its certificate does
//! not give it.
//!
//! A node's certificate names its ids as DNS names in its subject alternative names (what every
//! certificate tool writes and every TLS library reads):
//!
//! ```text
//! 42.id.busway        the bus id 42
//! 5-9.ids.busway      the bus ids 5 to 9, both included (a relay and the subtree it serves)
//! ```
//!
//! Other names are ignored (a certificate may also name the host). A link whose peer proved
//! such a certificate accepts the peer's HELLO only for an id it names, and a downstream
//! registration only within a range it names.

use crate::id::BusId;
use std::fmt;

/// Suffix of a name that gives one bus id.
pub const ID_NAME_SUFFIX: &str = ".id.busway";
/// Suffix of a name that gives a range of bus ids.
pub const IDS_NAME_SUFFIX: &str = ".ids.busway";
/// Most ranges one certificate may name (more are a mistake, not a configuration).
pub const CERT_ID_RANGES_MAX: usize = 64;

/// The ranges of bus ids a certificate names (inclusive).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct CertIds {
    ranges: Vec<(u64, u64)>,
}

impl CertIds {
    /// The ids named by `names` (a certificate's DNS names); names of other forms are skipped.
    /// An error names a name that has a busway suffix but no valid id or range, or too many.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut ranges = Vec::new();
        for name in names {
            let name = name.to_ascii_lowercase();
            let range = if let Some(id) = name.strip_suffix(ID_NAME_SUFFIX) {
                let id: u64 = id
                    .parse()
                    .map_err(|_| format!("certificate name {name:?}: {id:?} is not a bus id"))?;
                (id, id)
            } else if let Some(range) = name.strip_suffix(IDS_NAME_SUFFIX) {
                let bad = || format!("certificate name {name:?}: {range:?} is not FIRST-LAST");
                let (a, b) = range.split_once('-').ok_or_else(bad)?;
                let (a, b): (u64, u64) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                (a, b)
            } else {
                continue;
            };
            ranges.push(range);
            if ranges.len() > CERT_ID_RANGES_MAX {
                return Err(format!(
                    "the certificate names more than {CERT_ID_RANGES_MAX} bus id ranges"
                ));
            }
        }
        Ok(Self { ranges })
    }

    /// Whether no id is named.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Whether `id` is named.
    pub fn contains(&self, id: BusId) -> bool {
        self.ranges.iter().any(|&(a, b)| (a..=b).contains(&id.0))
    }

    /// Whether every id of `first..=last` lies within one named range.
    pub fn covers(&self, first: BusId, last: BusId) -> bool {
        self.ranges
            .iter()
            .any(|&(a, b)| a <= first.0 && last.0 <= b)
    }
}

impl fmt::Display for CertIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ranges.is_empty() {
            return f.write_str("no bus id");
        }
        for (i, &(a, b)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_ids_and_ranges_and_others_are_skipped() {
        let ids =
            CertIds::from_names(["host-a.example", "42.id.busway", "5-9.IDS.busway"]).unwrap();
        assert!(ids.contains(BusId(42)) && ids.contains(BusId(5)) && ids.contains(BusId(9)));
        assert!(!ids.contains(BusId(10)) && !ids.contains(BusId(41)));
        assert!(ids.covers(BusId(6), BusId(9)));
        assert!(!ids.covers(BusId(6), BusId(10)));
        assert!(
            !ids.covers(BusId(9), BusId(42)),
            "within one range, not across two"
        );
        assert_eq!(ids.to_string(), "42, 5-9");
        assert!(CertIds::from_names(["example.com"]).unwrap().is_empty());
    }

    #[test]
    fn a_bad_busway_name_is_named() {
        for bad in [
            "x.id.busway",
            "9-5.ids.busway",
            "5.ids.busway",
            "-1.id.busway",
        ] {
            let e = CertIds::from_names([bad]).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
        let many: Vec<String> = (0..=CERT_ID_RANGES_MAX)
            .map(|i| format!("{i}.id.busway"))
            .collect();
        assert!(CertIds::from_names(many.iter().map(String::as_str))
            .unwrap_err()
            .contains("more than"));
    }
}
