//! What an application's multicast is refused for before anything is sent, and its receivers
//! as the source numbers them.

use super::{MULTICAST_FIXED_BYTES, MULTICAST_RECEIVERS_MAX, MULTICAST_RECEIVER_BYTES};
use crate::BusId;

/// Why a multicast failed; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MulticastError {
    /// The list of receivers is empty.
    NoReceivers,
    /// More receivers than `MULTICAST_RECEIVERS_MAX` (after duplicates are removed).
    TooMany {
        /// Receivers asked for.
        count: usize,
        /// Receivers allowed.
        max: usize,
    },
    /// The payload and a frame's head naming every receiver do not fit one frame.
    TooLarge {
        /// The payload's length, in bytes.
        len: usize,
        /// The longest payload a multicast to this many receivers may carry, in bytes.
        max: usize,
    },
    /// This node has no route to these receivers (never linked, no relay to ask).
    NoRoute(Vec<BusId>),
    /// The node is shutting down.
    Closed,
}

impl std::fmt::Display for MulticastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoReceivers => write!(f, "a multicast needs at least one receiver"),
            Self::TooMany { count, max } => {
                write!(f, "a multicast to {count} receivers (at most {max})")
            }
            Self::TooLarge { len, max } => write!(
                f,
                "a multicast of {len} bytes to this many receivers does not fit a frame (at most {max})"
            ),
            Self::NoRoute(ids) => {
                let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
                write!(f, "no route to bus ids {}", ids.join(", "))
            }
            Self::Closed => write!(f, "the node is shutting down"),
        }
    }
}

impl std::error::Error for MulticastError {}

impl MulticastError {
    /// What kind of failure this is.
    pub fn kind(&self) -> crate::error_kind::ErrorKind {
        use crate::error_kind::ErrorKind;
        match self {
            Self::NoReceivers | Self::TooMany { .. } => ErrorKind::BadArgument,
            Self::TooLarge { .. } => ErrorKind::TooLarge,
            Self::NoRoute(_) => ErrorKind::NoRoute,
            Self::Closed => ErrorKind::Closed,
        }
    }
}

/// The receivers of a multicast by `me` to `to` of `payload_len` bytes, checked against a
/// frame body of at most `frame_max` bytes: the others, sorted, each once; and whether `me`
/// is one of them (its own inbox gets it).
pub fn receivers(
    to: &[BusId],
    me: BusId,
    payload_len: usize,
    frame_max: usize,
) -> Result<(Vec<BusId>, bool), MulticastError> {
    let mut receivers = to.to_vec();
    receivers.sort_unstable();
    receivers.dedup();
    if receivers.is_empty() {
        return Err(MulticastError::NoReceivers);
    }
    if receivers.len() > MULTICAST_RECEIVERS_MAX {
        return Err(MulticastError::TooMany {
            count: receivers.len(),
            max: MULTICAST_RECEIVERS_MAX,
        });
    }
    let to_me = receivers.binary_search(&me).is_ok();
    receivers.retain(|&id| id != me);
    let head_max = MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES * receivers.len();
    if head_max + payload_len > frame_max {
        return Err(MulticastError::TooLarge {
            len: payload_len,
            max: frame_max.saturating_sub(head_max),
        });
    }
    Ok((receivers, to_me))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receivers_are_sorted_once_each_without_the_source() {
        let ids = [BusId(9), BusId(1), BusId(9), BusId(5)];
        let got = receivers(&ids, BusId(5), 10, 1 << 20);
        assert_eq!(got, Ok((vec![BusId(1), BusId(9)], true)));
        assert_eq!(
            receivers(&[], BusId(5), 0, 100),
            Err(MulticastError::NoReceivers)
        );
        let many: Vec<BusId> = (0..=MULTICAST_RECEIVERS_MAX as u64).map(BusId).collect();
        let err = receivers(&many, BusId(u64::MAX), 0, usize::MAX).unwrap_err();
        assert!(matches!(err, MulticastError::TooMany { count, .. } if count == many.len()));
        let head = MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES;
        assert_eq!(
            receivers(&[BusId(1)], BusId(5), 101 - head, 100),
            Err(MulticastError::TooLarge {
                len: 101 - head,
                max: 100 - head
            })
        );
    }
}
